//! The long-running commands: `aqw run` (the standalone worker), `aqw
//! serve` (the Functions custom handler) and `aqw dashboard`, each stopped
//! by SIGTERM or SIGINT.

use crate::cli::exit::{Exit, Failure};
use crate::cli::load::load;
use clap::Args;
use std::path::Path;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Run the standalone worker: poll every function's queue until SIGTERM/SIGINT.
#[derive(Args)]
#[command(
    after_help = "Examples:\n  AzureWebJobsStorage=UseDevelopmentStorage=true aqw run --app ./app\n  aqw run --app /app --log-format json"
)]
// No arguments but the global ones; `group(skip)`: no empty argument group.
#[group(skip)]
pub struct RunArgs {}

/// Azure Functions custom handler: serve invocations on FUNCTIONS_CUSTOMHANDLER_PORT.
#[derive(Args)]
#[command(
    after_help = "The Functions host starts it (host.json customHandler → aqw serve).\n\nExample, by hand:\n  FUNCTIONS_CUSTOMHANDLER_PORT=7071 aqw serve --app examples/functions-app"
)]
// No arguments but the global ones; `group(skip)`: no empty argument group.
#[group(skip)]
pub struct ServeArgs {}

/// Serve the poison dashboard (status, records, replay/discard/fix) in a browser.
#[derive(Args)]
#[command(
    after_help = "Actions need AQW_DASHBOARD_TOKEN (sign in with it, or send it as a bearer token), or\nAQW_DASHBOARD_TRUST_PRINCIPAL=1 behind App Service / Container Apps authentication;\nAQW_DASHBOARD_USER names the token's holder on the records (default: dashboard).\nWithout either, only --read-only starts.\n\nExamples:\n  AQW_DASHBOARD_TOKEN=$(openssl rand -hex 24) aqw dashboard --app ./app\n  aqw dashboard --read-only --listen 127.0.0.1:9000"
)]
pub struct DashboardArgs {
    /// Address to listen on; anything but loopback exposes it (put TLS in front).
    #[arg(long, default_value = "127.0.0.1:8088", env = "AQW_DASHBOARD_LISTEN")]
    pub listen: std::net::SocketAddr,
    /// Views only: no replay, discard or fix (and no authentication needed).
    #[arg(long)]
    pub read_only: bool,
    /// Accept trusted-proxy ranges wider than /8 or /32 (AQW_DASHBOARD_ALLOW_WIDE_TRUSTED_PROXIES=1).
    #[arg(long)]
    pub allow_wide_trusted_proxies: bool,
    #[command(flatten)]
    pub limits: aqw::dashboard::ConnectionLimits,
}

pub(super) async fn run(app_dir: &Path, _: RunArgs) -> Result<Exit, Failure> {
    let app = load(app_dir)?;
    let registry = aqw::handlers::Registry::new();
    aqw::app::preflight(&app, &registry).map_err(Failure::usage)?;
    let shutdown = CancellationToken::new();
    spawn_signal_handler(shutdown.clone());
    aqw::worker::run(app, registry, shutdown)
        .await
        .map_err(|e| Failure::runtime(format!("{e:#}")))?;
    Ok(Exit::Ok)
}

pub(super) async fn serve(app_dir: &Path, _: ServeArgs) -> Result<Exit, Failure> {
    let app = load(app_dir)?;
    let registry = aqw::handlers::Registry::new();
    aqw::app::preflight(&app, &registry).map_err(Failure::usage)?;
    aqw::config::queues::serve_refusals(&app).map_err(Failure::usage)?;
    let port = aqw::serve::port_from_env(std::env::var("FUNCTIONS_CUSTOMHANDLER_PORT").ok())
        .map_err(Failure::usage)?;
    let shutdown = CancellationToken::new();
    spawn_signal_handler(shutdown.clone());
    aqw::serve::serve(app, registry, port, shutdown)
        .await
        .map_err(|e| Failure::runtime(format!("{e:#}")))?;
    Ok(Exit::Ok)
}

pub(super) async fn dashboard(app_dir: &Path, a: DashboardArgs) -> Result<Exit, Failure> {
    let wide = aqw::dashboard::ALLOW_WIDE_SETTING;
    let auth = aqw::dashboard::AuthConfig::from_env(|k| match k {
        _ if k == wide && a.allow_wide_trusted_proxies => Some("1".into()),
        _ => std::env::var(k).ok(),
    })
    .map_err(Failure::usage)?;
    let public_hosts = aqw::dashboard::public_hosts(
        &std::env::var("AQW_DASHBOARD_PUBLIC_URL").unwrap_or_default(),
    )
    .map_err(Failure::usage)?;
    let options = aqw::dashboard::Options {
        read_only: a.read_only,
        auth,
        listen: Some(a.listen),
        public_hosts,
        limits: a.limits,
    };
    options.check().map_err(Failure::usage)?;
    for warning in options.warnings() {
        tracing::warn!(
            event = "aqw.dashboard.setup",
            mode = options.mode(),
            "{warning}"
        );
    }
    let app = load(app_dir)?;
    let state = aqw::dashboard::Dashboard::new(app, options).map_err(Failure::usage)?;
    let listener = tokio::net::TcpListener::bind(a.listen)
        .await
        .map_err(|e| Failure::runtime(format!("cannot listen on {} (--listen): {e}", a.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Failure::runtime(format!("{e}")))?;
    if !aqw::dashboard::is_loopback(&addr) {
        tracing::warn!(event = "aqw.dashboard.exposed", listen = %addr, "the dashboard listens beyond this machine: put TLS and authentication in front of it");
    }
    let mode = if a.read_only {
        "read-only"
    } else {
        "actions need authentication"
    };
    outln!("aqw dashboard: http://{addr}/ ({mode})");
    let shutdown = CancellationToken::new();
    spawn_signal_handler(shutdown.clone());
    aqw::dashboard::serve(listener, Arc::new(state), shutdown)
        .await
        .map_err(|e| Failure::runtime(format!("dashboard: {e}")))?;
    Ok(Exit::Ok)
}

fn spawn_signal_handler(shutdown: CancellationToken) {
    tokio::spawn(async move {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let mut term = match signal(SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return,
            };
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!(event = "aqw.worker.signal", "shutdown requested");
        shutdown.cancel();
    });
}
