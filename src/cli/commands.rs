//! Dispatch: each command turns its arguments into a call of the library
//! (`aqw_core::ops`, `aqw::worker`, `aqw::serve`), renders the data it returns,
//! and says which exit code that means.

use super::args::{Cli, Command, ConfigCmd, DashboardArgs, EnqueueArgs, PauseArgs, ResumeArgs};
use super::exit::{Exit, Failure};
use super::load::{connect, function_storage, load, queue_ops, read_payload};
use super::output as render;
use super::output::Output;
use aqw::config::{self};
use aqw_core::ops;
use clap::CommandFactory;
use std::path::Path;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub async fn dispatch(cli: Cli) -> Result<Exit, Failure> {
    let output = cli.output;
    match cli.command {
        Command::Run => run(&cli.app).await,
        Command::Serve => serve(&cli.app).await,
        Command::Dashboard(a) => dashboard(&cli.app, a).await,
        Command::Enqueue(a) => enqueue(&cli.app, a, output).await,
        Command::Status => status(&cli.app, output).await,
        Command::Triage(a) => super::triage::run(&cli.app, a, output).await,
        Command::Oncall(a) => super::oncall::run(a, output),
        Command::Poison(cmd) => super::poison::run(&cli.app, cmd, output).await,
        Command::Pause(a) => pause(&cli.app, a, output).await,
        Command::Resume(a) => resume(&cli.app, a, output).await,
        Command::Ops(cmd) => super::ops::run(&cli.app, cmd, output).await,
        Command::Completions { shell } => {
            // Into a buffer, then out as one line: a closed pipe exits
            // quietly (clap_complete panics on a write error).
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "aqw", &mut script);
            outln!("{}", String::from_utf8_lossy(&script).trim_end());
            Ok(Exit::Ok)
        }
        Command::Config(ConfigCmd::Show) => config_show(&cli.app, output),
        Command::Keys(cmd) => super::keys::run(&cli.app, cmd, output).await,
    }
}

async fn run(app_dir: &Path) -> Result<Exit, Failure> {
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

async fn serve(app_dir: &Path) -> Result<Exit, Failure> {
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

async fn dashboard(app_dir: &Path, a: DashboardArgs) -> Result<Exit, Failure> {
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

async fn enqueue(app_dir: &Path, a: EnqueueArgs, output: Output) -> Result<Exit, Failure> {
    let app = load(app_dir)?;
    let payload = read_payload(a.payload, a.file, a.stdin.as_deref())?;
    // The producer span; its context goes into the payload where
    // aqw.tracing.parent says (joining TRACEPARENT from the environment).
    let span = aqw_core::traces::enqueue_span(&a.queue);
    let payload = ops::with_trace_context(&app, &payload, &span);
    let delivery = parse_delivery(a.delay.as_deref(), a.at.as_deref(), a.ttl.as_deref())?;
    let job = ops::prepare_enqueue(&app, &a.queue, &payload, a.force)?;
    let storage = connect(&job.connection)?;
    let done = ops::enqueue_with(job, delivery, storage.as_ref())
        .instrument(span)
        .await?;
    render::enqueued(&done, output);
    Ok(Exit::Ok)
}

async fn status(app_dir: &Path, output: Output) -> Result<Exit, Failure> {
    let app = load(app_dir)?;
    let mut lines = Vec::new();
    for f in &app.functions {
        lines.push(ops::status(&queue_ops(&app, &f.queue)?).await?);
    }
    let open: usize = lines.iter().map(|l| l.open_records).sum();
    let mut schedules = Vec::new();
    for s in &app.schedules {
        let f = app.function(&s.function).ok_or_else(|| {
            Failure::usage(format!(
                "schedule {}: no function named {}",
                s.name, s.function
            ))
        })?;
        let qo = queue_ops(&app, &f.queue)?;
        // One unreadable schedule (a bad row) is shown as such, not the
        // end of the whole status.
        let status = aqw_core::schedule::status(&app, s, qo.control.table().as_ref(), &qo.keys)
            .await
            .unwrap_or_else(|e| {
                let why = aqw_core::scrub::scrub(&e.to_string());
                aqw_core::schedule::ScheduleStatus::unread(s, why)
            });
        schedules.push(status);
    }
    render::status(&lines, &schedules, open, output);
    render::status_control(&lines, output);
    let held = lines.iter().any(|l| l.held());
    Ok(Exit::needs_a_person_if(open > 0 || held))
}

async fn pause(app_dir: &Path, a: PauseArgs, output: Output) -> Result<Exit, Failure> {
    let app = load(app_dir)?;
    let storage = function_storage(&app, &a.function)?;
    let store = ops::control_store(&app, &a.function, storage.as_ref())?;
    let row = ops::pause(&store, &a.function, &a.by, &a.reason).await?;
    render::control(&a.function, &row, output);
    Ok(Exit::Ok)
}

async fn resume(app_dir: &Path, a: ResumeArgs, output: Output) -> Result<Exit, Failure> {
    let app = load(app_dir)?;
    let storage = function_storage(&app, &a.function)?;
    let store = ops::control_store(&app, &a.function, storage.as_ref())?;
    let row = ops::resume(&store, &a.function, &a.by).await?;
    render::control(&a.function, &row, output);
    Ok(Exit::Ok)
}

/// `config show`: the effective configuration, secrets masked.
fn config_show(app_dir: &Path, output: Output) -> Result<Exit, Failure> {
    let app = load(app_dir)?;
    let look = config::show::lookup(app_dir).map_err(|e| Failure::usage(format!("{e:#}")))?;
    render::config_show(&config::show::effective(&app, &look), output);
    Ok(Exit::Ok)
}

/// `enqueue --delay/--at/--ttl` as a [`ops::Delivery`]: each value checked,
/// and the pair against the service's rules, before anything is sent.
fn parse_delivery(
    delay: Option<&str>,
    at: Option<&str>,
    ttl: Option<&str>,
) -> Result<ops::Delivery, Failure> {
    let ttl = match ttl {
        None => aqw_core::storage::Ttl::Default,
        Some("never") => aqw_core::storage::Ttl::Never,
        Some(t) => aqw_core::storage::Ttl::After(
            aqw_core::config::parse_timespan(t)
                .map_err(|e| Failure::usage(format!("--ttl: {e}")))?,
        ),
    };
    let delivery = match (delay, at) {
        (Some(d), _) => {
            let d = aqw_core::config::parse_timespan(d)
                .map_err(|e| Failure::usage(format!("--delay: {e}")))?;
            ops::Delivery::after(d, ttl)
        }
        (None, Some(t)) => {
            let when =
                time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
                    .map_err(|_| {
                        Failure::usage(format!(
                            "--at: \"{t}\" is not an RFC 3339 time (2026-12-24T18:00:00Z)"
                        ))
                    })?;
            ops::Delivery::at(when, aqw_core::clock::now_utc(), ttl)
        }
        (None, None) => ops::Delivery::after(std::time::Duration::ZERO, ttl),
    };
    delivery.map_err(|e| Failure::usage(format!("--delay/--at/--ttl: {e}")))
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
