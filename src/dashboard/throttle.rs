//! Back-off on token guessing: wrong sign-ins and wrong bearers.
//!
//! Per client (the peer address): [`FREE_FAILURES`] wrong tokens are free,
//! then each further one blocks that client for twice as long as the last
//! (1 s, 2 s, 4 s, … at most [`MAX_BLOCK`]), and a block is not lengthened
//! by the requests refused during it, so an attacker sharing an address with
//! the operator cannot lock them out for more than [`MAX_BLOCK`] at a time.
//! Globally (many addresses): more than [`GLOBAL_FAILURES`] wrong tokens in
//! one [`GLOBAL_WINDOW`] block every token check until that window ends.
//! While blocked, a token is not even checked: the answer is 429 with
//! `Retry-After`, so the right token does not work either.
//!
//! Every failure is logged (`aqw.dashboard.auth_failed`: client, kind,
//! failures so far, never what was presented), at most one line a second;
//! the lines held back are counted in the next one.

use super::error::DashboardError;
use axum::http::{header, HeaderValue, Method, Request, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const FREE_FAILURES: u32 = 5;
pub const MAX_BLOCK: Duration = Duration::from_secs(300);
pub const GLOBAL_FAILURES: u32 = 100;
pub const GLOBAL_WINDOW: Duration = Duration::from_secs(60);
/// A client's failures are forgotten this long after its last one.
const FORGET_AFTER: Duration = Duration::from_secs(15 * 60);
/// Clients remembered; beyond it new ones share one entry.
const MAX_CLIENTS: usize = 10_000;
const LOG_EVERY: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Client {
    failures: u32,
    last: Option<Instant>,
    blocked_until: Option<Instant>,
}

struct State {
    clients: HashMap<IpAddr, Client>,
    window_start: Instant,
    window_failures: u32,
    last_log: Option<Instant>,
    held_back: u64,
}

/// The failure counters of a running dashboard.
pub struct Throttle {
    state: Mutex<State>,
}

impl Default for Throttle {
    fn default() -> Self {
        Throttle {
            state: Mutex::new(State {
                clients: HashMap::new(),
                window_start: Instant::now(),
                window_failures: 0,
                last_log: None,
                held_back: 0,
            }),
        }
    }
}

/// What a failed request tried.
#[derive(Debug, Clone, Copy)]
pub enum Attempt {
    SignIn,
    Bearer,
}

impl Attempt {
    fn as_str(self) -> &'static str {
        match self {
            Attempt::SignIn => "sign-in",
            Attempt::Bearer => "bearer",
        }
    }
}

/// Requests without a peer address (in-process tests) count as one client.
fn client_key(peer: Option<IpAddr>) -> IpAddr {
    peer.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
}

impl Throttle {
    /// How long `peer` must wait before its token is checked again.
    pub fn blocked(&self, peer: Option<IpAddr>) -> Option<Duration> {
        let now = Instant::now();
        let s = self.state.lock().expect("throttle");
        let global = (s.window_failures > GLOBAL_FAILURES)
            .then(|| (s.window_start + GLOBAL_WINDOW).saturating_duration_since(now))
            .filter(|d| !d.is_zero());
        let client = s
            .clients
            .get(&client_key(peer))
            .and_then(|c| c.blocked_until)
            .map(|t| t.saturating_duration_since(now))
            .filter(|d| !d.is_zero());
        global.max(client)
    }

    /// Count a wrong token from `peer`, and log it (rate-limited).
    pub fn failed(&self, peer: Option<IpAddr>, attempt: Attempt) {
        let now = Instant::now();
        let mut s = self.state.lock().expect("throttle");
        if now.duration_since(s.window_start) >= GLOBAL_WINDOW {
            s.window_start = now;
            s.window_failures = 0;
        }
        s.window_failures = s.window_failures.saturating_add(1);
        if s.clients.len() >= MAX_CLIENTS {
            s.clients
                .retain(|_, c| c.last.is_some_and(|t| now.duration_since(t) < FORGET_AFTER));
        }
        let key = if s.clients.len() >= MAX_CLIENTS && !s.clients.contains_key(&client_key(peer)) {
            client_key(None)
        } else {
            client_key(peer)
        };
        let c = s.clients.entry(key).or_default();
        if c.last
            .is_some_and(|t| now.duration_since(t) >= FORGET_AFTER)
        {
            *c = Client::default();
        }
        c.failures = c.failures.saturating_add(1);
        c.last = Some(now);
        if c.failures > FREE_FAILURES {
            let doublings = (c.failures - FREE_FAILURES - 1).min(16);
            let block = Duration::from_secs(1u64 << doublings).min(MAX_BLOCK);
            c.blocked_until = Some(now + block);
        }
        let failures = c.failures;
        let client = peer.map(|p| p.to_string()).unwrap_or_else(|| "-".into());
        s.log(now, |held_back| {
            tracing::warn!(
                event = "aqw.dashboard.auth_failed",
                client = %client,
                kind = attempt.as_str(),
                failures,
                held_back,
                "dashboard: wrong token (the presented value is never logged)"
            );
        });
    }

    /// A right token from `peer`: its count starts again.
    pub fn succeeded(&self, peer: Option<IpAddr>) {
        let mut s = self.state.lock().expect("throttle");
        s.clients.remove(&client_key(peer));
    }

    /// Principal headers that did not come through the front end were
    /// dropped: say so (rate-limited like failures), with the peer address
    /// an operator needs for `AQW_DASHBOARD_TRUSTED_PROXIES`.
    pub fn refused_principal(&self, peer: Option<IpAddr>) {
        let mut s = self.state.lock().expect("throttle");
        let client = peer.map(|p| p.to_string()).unwrap_or_else(|| "-".into());
        s.log(Instant::now(), |held_back| {
            tracing::warn!(
                event = "aqw.dashboard.principal_refused",
                client = %client,
                held_back,
                "dashboard: X-MS-CLIENT-PRINCIPAL headers on a request that did not come through the front end were ignored"
            );
        });
    }
}

impl State {
    fn log(&mut self, now: Instant, line: impl FnOnce(u64)) {
        if self
            .last_log
            .is_some_and(|t| now.duration_since(t) < LOG_EVERY)
        {
            self.held_back += 1;
            return;
        }
        self.last_log = Some(now);
        line(std::mem::take(&mut self.held_back));
    }
}

/// What token check this request makes, if any.
fn attempt_of<B>(req: &Request<B>) -> Option<Attempt> {
    if req.method() == Method::POST && req.uri().path() == "/login" {
        return Some(Attempt::SignIn);
    }
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.len() > 7 && v[..7].eq_ignore_ascii_case("bearer "));
    bearer.then_some(Attempt::Bearer)
}

fn too_many(wait: Duration) -> Response {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    let mut r = (
        StatusCode::TOO_MANY_REQUESTS,
        format!("Too many wrong tokens: try again in {secs} s. The token was not checked."),
    )
        .into_response();
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
    r
}

/// Refuse token checks while blocked; count the ones that fail where the
/// credential is rejected: a wrong bearer is answered 401 here, on every
/// route (`/logout` and read-only pages included), before any handler can
/// answer it differently from the right one (a handler's 303 for a wrong
/// bearer and 403 for the right one once told them apart, uncounted); a
/// wrong sign-in token is the sign-in handler's 401.
pub async fn limit(
    axum::extract::State(d): axum::extract::State<std::sync::Arc<super::Dashboard>>,
    req: Request<axum::body::Body>,
    next: Next,
) -> Response {
    let Some(attempt) = attempt_of(&req) else {
        return next.run(req).await;
    };
    let peer = super::guard::peer(&req);
    if let Some(wait) = d.throttle.blocked(peer) {
        return too_many(wait);
    }
    if matches!(attempt, Attempt::Bearer) && d.auth.bearer_rejected(req.headers()) {
        d.throttle.failed(peer, attempt);
        return d.refusal_page(DashboardError::Unauthenticated("Wrong bearer token."));
    }
    let r = next.run(req).await;
    if matches!(attempt, Attempt::SignIn) && r.status() == StatusCode::UNAUTHORIZED {
        d.throttle.failed(peer, attempt);
    } else if matches!(attempt, Attempt::SignIn)
        && (r.status().is_success() || r.status().is_redirection())
    {
        d.throttle.succeeded(peer);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_is_blocked_after_its_free_failures_and_others_are_not() {
        let t = Throttle::default();
        let a = Some("10.0.0.1".parse().unwrap());
        let b = Some("10.0.0.2".parse().unwrap());
        for _ in 0..FREE_FAILURES {
            t.failed(a, Attempt::SignIn);
        }
        assert_eq!(t.blocked(a), None);
        t.failed(a, Attempt::Bearer);
        let wait = t.blocked(a).expect("blocked");
        assert!(wait <= Duration::from_secs(1), "{wait:?}");
        t.failed(a, Attempt::Bearer);
        assert!(t.blocked(a).unwrap() > Duration::from_secs(1));
        assert_eq!(t.blocked(b), None);
        t.succeeded(a);
        assert_eq!(t.blocked(a), None);
    }

    #[test]
    fn blocks_are_bounded_and_many_clients_block_everyone_for_a_window() {
        let t = Throttle::default();
        let a = Some("10.0.0.1".parse().unwrap());
        for _ in 0..40 {
            t.failed(a, Attempt::SignIn);
        }
        assert!(t.blocked(a).unwrap() <= MAX_BLOCK);
        for i in 0..=GLOBAL_FAILURES {
            t.failed(
                Some(IpAddr::V4(Ipv4Addr::from(0x0b00_0000 + i))),
                Attempt::Bearer,
            );
        }
        let other = Some("192.0.2.1".parse().unwrap());
        assert!(t.blocked(other).unwrap() <= GLOBAL_WINDOW);
    }
}
