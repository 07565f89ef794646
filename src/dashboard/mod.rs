//! `aqw dashboard`: the operator's procedure in a browser — status, the
//! poison list grouped by error cause, one record, and the actions (replay
//! with a dry run first, discard with a reason, fix a payload, close a key),
//! each through the same [`aqw_core::ops`] function as its CLI command; and
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
//! - connections are capped per client and in total, and a request body is
//!   read only after the `Host`, principal and bearer checks, at most 4 KiB
//!   before sign-in (`listener.rs`);
//! - every POST carries a CSRF token bound to its principal, checked before
//!   any field of the form is used (`request.rs`'s `Act`);
//! - a refused request is a page saying why with its status, one error type
//!   for every route (`error.rs`); a form or query that cannot be read, or
//!   a field past its bound (`forms.rs`), is a 400 page naming the field;
//! - "by" is the authenticated principal, never a form field;
//! - payloads are attacker-controlled: maud escapes everything, invalid
//!   UTF-8 is shown lossily with a hex dump (`payload.rs`); every other
//!   free-text value renders through one type, `text::Text`, which writes
//!   control and bidi characters as `\u{…}`;
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
mod error;
mod forms;
mod guard;
mod handlers;
mod listener;
mod operations;
mod payload;
mod progress;
mod request;
mod selection;
mod settings;
mod text;
mod throttle;
mod triage;
mod views;

pub use error::DashboardError;
pub use forms::MAX_FIELD_CHARS;
pub use guard::{public_hosts, PROXY_SECRET_HEADER};
pub use listener::{
    serve, ConnectionLimits, BODY_READ_TIMEOUT, HEADER_READ_TIMEOUT, MAX_BODY, MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_CLIENT, MAX_UNAUTHENTICATED_BODY,
};
pub use payload::PayloadView;
pub use settings::{AuthConfig, IpRange, ALLOW_WIDE_SETTING};

use aqw_core::config::AppConfig;
use aqw_core::ops::QueueOps;
use axum::http::{header, HeaderValue, Request};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

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
    /// Connections served at once (`--max-connections`, `--max-connections-per-client`).
    pub limits: ConnectionLimits,
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

    /// Which principal headers are believed, as actually in force: `None`
    /// when they are not trusted at all (`/healthz`, start-up line).
    pub fn principal_guard(&self) -> Option<String> {
        let a = &self.auth;
        if !a.trust_principal {
            return None;
        }
        let proxies = "AQW_DASHBOARD_TRUSTED_PROXIES";
        let mut guard = match (&a.proxy_secret, a.trusted_proxies.is_empty()) {
            (Some(_), true) => "only on requests carrying X-AQW-Proxy-Secret".to_string(),
            (None, false) => format!("only on connections from {proxies}"),
            (Some(_), false) => {
                format!("on requests carrying X-AQW-Proxy-Secret or from {proxies}")
            }
            (None, true) => "from any process on this machine (no guard: loopback only)".into(),
        };
        let wide = a.wide_trusted_proxies();
        if !wide.is_empty() {
            let list: Vec<String> = wide.iter().map(|r| r.to_string()).collect();
            guard.push_str(&format!(
                " — wide trusted-proxy range allowed by override ({}=1): {}",
                settings::ALLOW_WIDE_SETTING,
                list.join(", ")
            ));
        }
        Some(guard)
    }

    /// What an operator must know about this setup: logged at start-up and
    /// listed by `/healthz`.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        if let Some(guard) = self.principal_guard() {
            w.push(format!("AQW_DASHBOARD_TRUST_PRINCIPAL=1: X-MS-CLIENT-PRINCIPAL headers are believed {guard}"));
            if self.auth.token.is_some() {
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
    principal_guard: Option<String>,
    warnings: Vec<String>,
    /// Held by a group action while it runs: one at a time (`bulk.rs`).
    bulk: tokio::sync::Mutex<()>,
    /// The key of the digests a review form carries (`bulk.rs`).
    review: selection::ReviewKey,
    /// The connections being served, per client and in total (`listener.rs`).
    connections: listener::Connections,
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
            principal_guard: options.principal_guard(),
            warnings: options.warnings(),
            auth: auth::Auth::new(options.auth),
            read_only: options.read_only,
            bulk: tokio::sync::Mutex::new(()),
            review: selection::ReviewKey::new(),
            connections: listener::Connections::new(options.limits),
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
        // Innermost first: a body is read only after the `Host` check, the
        // principal guard and the bearer check have passed (issue 48).
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            listener::read_body_in_time,
        ))
        // Every refusal of a route or of the body reader, drawn as a page.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            error::render,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            throttle::limit,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            guard::check,
        ))
        .layer(axum::middleware::from_fn(security_headers))
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
        "principal_guard": d.principal_guard,
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
