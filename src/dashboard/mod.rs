//! `aqw dashboard`: the operator's procedure in a browser — status, the
//! poison list grouped by error cause, one record, and the actions (replay
//! with a dry run first, discard with a reason, fix a payload, close a key),
//! each through the same [`crate::ops`] function as its CLI command; and
//! the same actions on every open record a filter or an error group selects
//! (`bulk.rs`: a dry run or review first, then a durable operation at its
//! rate, carried out off the request: `operations.rs`).
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
//!   (bearer header, or a server-side session from the sign-in page), or the
//!   platform's `X-MS-CLIENT-PRINCIPAL` (or `-NAME`) when explicitly trusted
//!   and guarded (`guard.rs`); with actions enabled and neither configured,
//!   or with unguarded trust on a non-loopback address, it refuses to start;
//! - every request's `Host` must be the listen address or a configured public
//!   name (DNS rebinding, `guard.rs`);
//! - wrong tokens back off per client and globally, 429 (`throttle.rs`);
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
mod bulk;
mod chart;
mod control;
mod guard;
mod handlers;
mod operations;
mod payload;
mod progress;
mod request;
mod selection;
mod throttle;
mod views;

pub use auth::{AuthConfig, IpRange};
pub use guard::{public_hosts, PROXY_SECRET_HEADER};
pub use payload::PayloadView;

use crate::config::AppConfig;
use crate::ops::QueueOps;
use axum::http::{header, HeaderValue, Request};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
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
    /// The address it listens on (`--listen`); loopback when unset.
    pub listen: Option<SocketAddr>,
    /// Host names it also answers to (`AQW_DASHBOARD_PUBLIC_URL`).
    pub public_hosts: Vec<String>,
}

impl Options {
    fn listen_ip(&self) -> IpAddr {
        self.listen
            .map(|a| a.ip())
            .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    /// Refuse a dashboard whose actions anyone who reaches it could use, or
    /// that would believe a principal header anyone could send.
    pub fn check(&self) -> Result<(), String> {
        if !self.read_only && !self.auth.configured() {
            return Err(
                "the dashboard's actions need authentication: set AQW_DASHBOARD_TOKEN \
                 (at least 16 characters), or AQW_DASHBOARD_TRUST_PRINCIPAL=1 behind App Service / \
                 Container Apps authentication, or pass --read-only"
                    .into(),
            );
        }
        let ip = self.listen_ip();
        if self.auth.trust_principal && !self.auth.principal_guarded() && !ip.is_loopback() {
            return Err(format!(
                "AQW_DASHBOARD_TRUST_PRINCIPAL=1 on {ip} (not loopback) would believe an \
                 X-MS-CLIENT-PRINCIPAL header from any client that reaches the port: also set \
                 AQW_DASHBOARD_PROXY_SECRET (a header the front end adds) or \
                 AQW_DASHBOARD_TRUSTED_PROXIES (the front end's addresses)"
            ));
        }
        Ok(())
    }

    /// Which authentication decides, in one word (start-up line, `/healthz`).
    pub fn mode(&self) -> &'static str {
        match (self.auth.token.is_some(), self.auth.trust_principal) {
            _ if self.read_only && !self.auth.configured() => "read-only",
            (true, true) => "token+principal",
            (true, false) => "token",
            (false, true) => "principal",
            (false, false) => "read-only",
        }
    }

    /// What an operator must know about this setup: logged at start-up and
    /// listed by `/healthz`.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        let a = &self.auth;
        if a.trust_principal {
            let guard = match (&a.proxy_secret, a.trusted_proxies.is_empty()) {
                (Some(_), true) => "only on requests carrying X-AQW-Proxy-Secret".to_string(),
                (None, false) => "only on connections from AQW_DASHBOARD_TRUSTED_PROXIES".into(),
                (Some(_), false) => {
                    "on requests carrying X-AQW-Proxy-Secret or from AQW_DASHBOARD_TRUSTED_PROXIES"
                        .into()
                }
                (None, true) => "from any process on this machine (no guard: loopback only)".into(),
            };
            w.push(format!("AQW_DASHBOARD_TRUST_PRINCIPAL=1: X-MS-CLIENT-PRINCIPAL headers are believed {guard}"));
            if a.token.is_some() {
                w.push("a bearer token, when presented, decides, then a live session cookie; principal headers are read only when neither identifies the request".into());
            }
        }
        if !self.listen_ip().is_loopback() && self.public_hosts.is_empty() {
            w.push("not on loopback and no AQW_DASHBOARD_PUBLIC_URL: only requests addressed to an IP literal are answered".into());
        }
        w
    }
}

/// A running dashboard's state: the app, one [`QueueOps`] per function's
/// queue, authentication.
pub struct Dashboard {
    app: Arc<AppConfig>,
    queues: Vec<Arc<QueueOps>>,
    auth: auth::Auth,
    read_only: bool,
    hosts: guard::Hosts,
    throttle: throttle::Throttle,
    mode: &'static str,
    warnings: Vec<String>,
    /// Held by a group action while it runs: one at a time (`bulk.rs`).
    bulk: tokio::sync::Mutex<()>,
    /// The key of the digests a review form carries (`bulk.rs`).
    review: selection::ReviewKey,
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
            hosts: guard::Hosts::new(options.listen_ip(), options.public_hosts.clone()),
            throttle: throttle::Throttle::default(),
            mode: options.mode(),
            warnings: options.warnings(),
            auth: auth::Auth::new(options.auth),
            read_only: options.read_only,
            bulk: tokio::sync::Mutex::new(()),
            review: selection::ReviewKey::new(),
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
        .route("/q/{queue}/progress", get(progress::progress))
        .route("/healthz", get(healthz))
        .route("/q/{queue}/replay", post(handlers::replay))
        .route("/q/{queue}/discard", post(handlers::discard))
        .route("/q/{queue}/fix", post(handlers::fix))
        .route("/q/{queue}/group/replay", post(bulk::replay))
        .route("/q/{queue}/group/discard", post(bulk::discard))
        .route("/q/{queue}/group/fix", post(bulk::fix))
        .route("/ops", get(operations::list))
        .route("/ops/{id}", get(operations::show))
        .route("/ops/{id}/cancel", post(operations::cancel))
        .route("/q/{queue}/pause", post(control::pause))
        .route("/q/{queue}/resume", post(control::resume))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            throttle::limit,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            guard::check,
        ))
        .layer(axum::middleware::from_fn(security_headers))
        .layer(axum::middleware::from_fn(read_body_in_time))
        .with_state(state)
}

/// Liveness, without authentication: the mode and the start-up warnings
/// (which principal headers are believed), never a secret.
async fn healthz(axum::extract::State(d): axum::extract::State<Arc<Dashboard>>) -> Response {
    axum::Json(serde_json::json!({
        "status": "ok",
        "mode": d.mode,
        "read_only": d.read_only,
        "trust_principal": d.auth.config().trust_principal,
        "warnings": d.warnings,
    }))
    .into_response()
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

/// How long a connection may take to send a request's headers (and how
/// long an idle kept-alive connection stays open): a client that trickles
/// its headers, or holds a connection without a request, is cut off.
pub const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a request's body may take to arrive.
pub const BODY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// The largest request body the dashboard reads (a fixed payload is at
/// most 64 KiB of queue message, form-encoded).
pub const MAX_BODY: usize = 1 << 20;

/// Serve the dashboard on `listener` until `shutdown`: HTTP/1.1, each
/// connection with [`HEADER_READ_TIMEOUT`] and each body with
/// [`BODY_READ_TIMEOUT`] (issue 40: a connection with partial headers or a
/// partial body stayed open for over 40 s). Written on hyper's connection
/// builder because `axum::serve` has no read timeouts.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<Dashboard>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let router = app(state);
    let connections = tokio_util::task::TaskTracker::new();
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                // A failed accept (too many open files) is the connection's
                // problem, not the dashboard's.
                Err(_) => continue,
            },
            _ = shutdown.cancelled() => break,
        };
        let service = router
            .clone()
            .layer(axum::Extension(axum::extract::ConnectInfo(peer)));
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT);
            let conn = builder.serve_connection(
                hyper_util::rt::TokioIo::new(stream),
                hyper_util::service::TowerToHyperService::new(service),
            );
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = shutdown.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
    connections.close();
    connections.wait().await;
    Ok(())
}

/// Read the whole body within [`BODY_READ_TIMEOUT`] and [`MAX_BODY`]
/// before any handler runs: 408 for a body that trickles, 413 for one too
/// large.
async fn read_body_in_time(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let (parts, body) = req.into_parts();
    match tokio::time::timeout(BODY_READ_TIMEOUT, axum::body::to_bytes(body, MAX_BODY)).await {
        Ok(Ok(bytes)) => {
            next.run(axum::extract::Request::from_parts(parts, bytes.into()))
                .await
        }
        Ok(Err(_)) => (
            axum::http::StatusCode::PAYLOAD_TOO_LARGE,
            "request body too large",
        )
            .into_response(),
        Err(_) => (
            axum::http::StatusCode::REQUEST_TIMEOUT,
            "request body not received in time",
        )
            .into_response(),
    }
}

/// Whether `addr` only accepts connections from this machine.
pub fn is_loopback(addr: &std::net::SocketAddr) -> bool {
    addr.ip().is_loopback()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unguarded_trust_starts_only_on_loopback_and_is_announced() {
        let trust = AuthConfig {
            trust_principal: true,
            ..AuthConfig::default()
        };
        let on = |addr: &str, auth: AuthConfig| Options {
            auth,
            listen: Some(addr.parse().unwrap()),
            ..Options::default()
        };
        assert!(on("127.0.0.1:8088", trust.clone()).check().is_ok());
        let err = on("0.0.0.0:8088", trust.clone()).check().unwrap_err();
        assert!(err.contains("AQW_DASHBOARD_PROXY_SECRET"), "{err}");
        let guarded = AuthConfig {
            proxy_secret: Some("0123456789abcdef".into()),
            ..trust.clone()
        };
        let o = on("0.0.0.0:8088", guarded);
        assert!(o.check().is_ok());
        assert_eq!(o.mode(), "principal");
        assert!(
            o.warnings()[0].contains("X-AQW-Proxy-Secret"),
            "{:?}",
            o.warnings()
        );
        let both = AuthConfig {
            token: Some("0123456789abcdef".into()),
            ..trust
        };
        let o = on("127.0.0.1:8088", both);
        assert_eq!(o.mode(), "token+principal");
        assert!(o.warnings().iter().any(|w| w.contains("decides")));
    }
}
