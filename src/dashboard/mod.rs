//! `aqw dashboard`: the operator's procedure in a browser — status, the
//! poison list grouped by error cause, one record, and the actions (replay
//! with a dry run first, discard with a reason, fix a payload, close a key),
//! each through the same [`crate::ops`] function as its CLI command.
//!
//! Why its own command, not a `/ui` on the worker's ops port: the ops port
//! (`/healthz`, `/readyz`, `/metrics`) is what the Functions host and the
//! platform probe, binds every interface and may be exposed; the dashboard
//! has write actions, so it gets its own listener (127.0.0.1 by default), its
//! own authentication, and a read-only mode — and an on-call engineer can run
//! it from a laptop against the account without running a worker.
//!
//! Safe by default:
//! - actions need authentication (`auth.rs`): a token from the environment
//!   (bearer header, or a session cookie from the sign-in page), or the
//!   platform's `X-MS-CLIENT-PRINCIPAL` (or `-NAME`) when explicitly trusted; with
//!   actions enabled and neither configured, it refuses to start;
//! - every POST carries a CSRF token bound to its principal;
//! - "by" is the authenticated principal, never a form field;
//! - payloads are attacker-controlled: maud escapes everything, invalid
//!   UTF-8 is shown lossily with a hex dump (`payload.rs`);
//! - no secret renders: errors are scrubbed, the webhook URL and the
//!   connection are never shown;
//! - CSP without inline script or style, `frame-ancestors 'none'`,
//!   `X-Frame-Options: DENY`, `nosniff`, `no-store`.
//!
//! Server-rendered HTML (`views.rs`, maud), one embedded stylesheet; the
//! progress page refreshes itself (meta refresh) until every replayed key is
//! confirmed done, so no script is needed at all.

mod auth;
mod handlers;
mod payload;
mod views;

pub use auth::AuthConfig;
pub use payload::PayloadView;

use crate::config::AppConfig;
use crate::ops::QueueOps;
use axum::http::{header, HeaderValue, Request};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Records per list page.
pub const PAGE_SIZE: usize = 50;
/// Records one replay from the dashboard may select.
pub const MAX_SELECTION: usize = 100;

const CSS: &str = include_str!("assets/dashboard.css");
const CSP: &str = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; \
                   frame-ancestors 'none'; base-uri 'none'";

/// How a dashboard runs.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// No actions: views only.
    pub read_only: bool,
    pub auth: AuthConfig,
}

impl Options {
    /// Refuse a dashboard whose actions anyone who reaches it could use.
    pub fn check(&self) -> Result<(), String> {
        if !self.read_only && !self.auth.configured() {
            return Err(
                "the dashboard's actions need authentication: set AQW_DASHBOARD_TOKEN \
                 (at least 16 characters), or AQW_DASHBOARD_TRUST_PRINCIPAL=1 behind App Service / \
                 Container Apps authentication, or pass --read-only"
                    .into(),
            );
        }
        Ok(())
    }
}

/// A running dashboard's state: the app, one [`QueueOps`] per function's
/// queue, authentication.
pub struct Dashboard {
    app: Arc<AppConfig>,
    queues: Vec<Arc<QueueOps>>,
    auth: auth::Auth,
    read_only: bool,
}

impl Dashboard {
    /// Check `options` and open storage (through [`crate::app::open_storage`],
    /// no I/O yet). Errors are configuration errors.
    pub fn new(app: Arc<AppConfig>, options: Options) -> Result<Self, String> {
        options.check()?;
        let stores = crate::app::open_storage(&app).map_err(|e| format!("environment: {e}"))?;
        let queues = app
            .functions
            .iter()
            .map(|f| {
                let storage = stores[&f.connection.setting].as_ref();
                Arc::new(QueueOps::new(app.clone(), &f.queue, storage))
            })
            .collect();
        Ok(Dashboard {
            app,
            queues,
            auth: auth::Auth::new(options.auth),
            read_only: options.read_only,
        })
    }
}

/// The dashboard's routes, security headers included.
pub fn app(state: Arc<Dashboard>) -> Router {
    Router::new()
        .route("/", get(handlers::status))
        .route("/assets/dashboard.css", get(css))
        .route("/login", get(handlers::login_form).post(handlers::login))
        .route("/logout", post(handlers::logout))
        .route("/q/{queue}", get(handlers::list))
        .route("/q/{queue}/record", get(handlers::record))
        .route("/q/{queue}/progress", get(handlers::progress))
        .route("/q/{queue}/replay", post(handlers::replay))
        .route("/q/{queue}/discard", post(handlers::discard))
        .route("/q/{queue}/fix", post(handlers::fix))
        .layer(axum::middleware::from_fn(security_headers))
        .with_state(state)
}

async fn css() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], CSS)
}

async fn security_headers(req: Request<axum::body::Body>, next: Next) -> Response {
    let mut r = next.run(req).await;
    let h = r.headers_mut();
    let set = |h: &mut axum::http::HeaderMap, k: header::HeaderName, v: &'static str| {
        h.insert(k, HeaderValue::from_static(v));
    };
    set(h, header::CONTENT_SECURITY_POLICY, CSP);
    set(h, header::X_FRAME_OPTIONS, "DENY");
    set(h, header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    set(h, header::REFERRER_POLICY, "no-referrer");
    set(h, header::CACHE_CONTROL, "no-store");
    r
}

/// Serve the dashboard on `listener` until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<Dashboard>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, app(state))
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

/// Whether `addr` only accepts connections from this machine.
pub fn is_loopback(addr: &std::net::SocketAddr) -> bool {
    addr.ip().is_loopback()
}
