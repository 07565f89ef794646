//! The dashboard's listener: what a connection may hold before anyone knows
//! who is on the other end (issue 48: 100 connections without credentials
//! and with a foreign `Host` held 100 MB of request bodies for 20 s).
//!
//! - Connections are capped in total ([`MAX_CONNECTIONS`]) and per client
//!   ([`MAX_CONNECTIONS_PER_CLIENT`]; an IPv6 client is its /64, which one
//!   host can fill with addresses): one over either cap is answered 503 and
//!   closed at once, before hyper reads a byte of it.
//! - Headers must arrive within [`HEADER_READ_TIMEOUT`], a body within
//!   [`BODY_READ_TIMEOUT`] (issue 40).
//! - A body is read last: [`read_body_in_time`] is the innermost layer, so
//!   the `Host` check, the principal guard and the bearer check answer first
//!   without reading it; and a request that is not authenticated (the
//!   sign-in form, or one about to be refused) may send at most
//!   [`MAX_UNAUTHENTICATED_BODY`]: a larger declared length is refused 413
//!   before a byte of it is read.

use super::error::DashboardError;
use super::Dashboard;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How long a connection may take to send a request's headers (and how
/// long an idle kept-alive connection stays open): a client that trickles
/// its headers, or holds a connection without a request, is cut off.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a request's body may take to arrive.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(20);

/// The largest request body the dashboard reads from an authenticated
/// caller (a fixed payload is at most 64 KiB of queue message, form-encoded).
pub const MAX_BODY: usize = 1 << 20;

/// The largest body it reads from anyone else: the sign-in form (a CSRF
/// token and the token) fits many times over.
pub const MAX_UNAUTHENTICATED_BODY: usize = 4 << 10;

/// Connections served at once, by default (`--max-connections`).
pub const MAX_CONNECTIONS: u32 = 256;

/// Connections served at once from one client address, by default
/// (`--max-connections-per-client`): a browser opens at most 6 per host.
pub const MAX_CONNECTIONS_PER_CLIENT: u32 = 32;

/// How many connections the dashboard serves at once (`aqw dashboard`'s
/// flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::Args)]
pub struct ConnectionLimits {
    /// Connections served at once; one more is answered 503 and closed.
    #[arg(long = "max-connections", default_value_t = MAX_CONNECTIONS, env = "AQW_DASHBOARD_MAX_CONNECTIONS", value_parser = clap::value_parser!(u32).range(1..))]
    pub total: u32,
    /// Connections served at once from one client address (an IPv6 /64).
    #[arg(long = "max-connections-per-client", default_value_t = MAX_CONNECTIONS_PER_CLIENT, env = "AQW_DASHBOARD_MAX_CONNECTIONS_PER_CLIENT", value_parser = clap::value_parser!(u32).range(1..))]
    pub per_client: u32,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            total: MAX_CONNECTIONS,
            per_client: MAX_CONNECTIONS_PER_CLIENT,
        }
    }
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    per_client: HashMap<IpAddr, usize>,
}

/// The connections being served.
pub(super) struct Connections {
    limits: ConnectionLimits,
    counts: Arc<Mutex<Counts>>,
}

/// One admitted connection: counted until dropped.
#[derive(Debug)]
pub(super) struct Slot {
    client: IpAddr,
    counts: Arc<Mutex<Counts>>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.counts.lock().expect("connection counts");
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.per_client.get_mut(&self.client) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.per_client.remove(&self.client);
            }
        }
    }
}

/// The client a connection counts against: an IPv4 address (an
/// IPv4-mapped IPv6 one too), or an IPv6 /64.
fn client_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        },
        v4 => v4,
    }
}

impl Connections {
    pub(super) fn new(limits: ConnectionLimits) -> Self {
        Connections {
            limits,
            counts: Arc::default(),
        }
    }

    /// A slot for a connection from `peer`, or which cap it would exceed.
    fn admit(&self, peer: IpAddr) -> Result<Slot, &'static str> {
        let client = client_of(peer);
        let mut c = self.counts.lock().expect("connection counts");
        if c.total >= self.limits.total as usize {
            return Err("the dashboard serves as many connections as it allows");
        }
        let mine = c.per_client.entry(client).or_insert(0);
        if *mine >= self.limits.per_client as usize {
            return Err("too many connections from your address");
        }
        *mine += 1;
        c.total += 1;
        Ok(Slot {
            client,
            counts: self.counts.clone(),
        })
    }
}

/// Answer a connection over a cap with 503 and close it, without waiting
/// on it: what the socket takes at once is written, the rest dropped.
fn turn_away(stream: tokio::net::TcpStream, peer: IpAddr, why: &str) {
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nRetry-After: 1\r\n\
         Content-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n\r\n{why}",
        why.len()
    );
    let _ = stream.try_write(answer.as_bytes());
    tracing::debug!(event = "aqw.dashboard.connection_refused", client = %peer, "{why}");
}

/// Serve the dashboard on `listener` until `shutdown`: HTTP/1.1, within
/// the state's [`ConnectionLimits`], each connection with
/// [`HEADER_READ_TIMEOUT`] and each body with [`BODY_READ_TIMEOUT`] (issue
/// 40: a connection with partial headers or a partial body stayed open for
/// over 40 s). Written on hyper's connection builder because `axum::serve`
/// has no read timeouts and no connection caps.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<Dashboard>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let router = super::app(state.clone());
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
        let slot = match state.connections.admit(peer.ip()) {
            Ok(slot) => slot,
            Err(why) => {
                turn_away(stream, peer.ip(), why);
                continue;
            }
        };
        let service = router
            .clone()
            .layer(axum::Extension(axum::extract::ConnectInfo(peer)));
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            let _slot = slot;
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

fn too_large(limit: usize, signed_in: bool) -> Response {
    let who = if signed_in { "" } else { " before signing in" };
    DashboardError::Unreadable {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        message: format!("request body too large: at most {limit} bytes{who}"),
    }
    .into_response()
}

/// Read the whole body within [`BODY_READ_TIMEOUT`] and the caller's limit
/// ([`MAX_BODY`] authenticated, else [`MAX_UNAUTHENTICATED_BODY`]) before
/// the handler runs: 413 for one too large (at once when its declared
/// length says so), 408 for one that trickles.
pub(super) async fn read_body_in_time(
    State(d): State<Arc<Dashboard>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let signed_in = d.auth.identify(req.headers()).is_some();
    let limit = if signed_in {
        MAX_BODY
    } else {
        MAX_UNAUTHENTICATED_BODY
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return too_large(limit, signed_in);
    }
    let (parts, body) = req.into_parts();
    match tokio::time::timeout(BODY_READ_TIMEOUT, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(bytes)) => {
            next.run(axum::extract::Request::from_parts(parts, bytes.into()))
                .await
        }
        Ok(Err(_)) => too_large(limit, signed_in),
        Err(_) => DashboardError::Unreadable {
            status: StatusCode::REQUEST_TIMEOUT,
            message: "request body not received in time".into(),
        }
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_client_and_the_total_are_capped_and_slots_come_back() {
        let c = Connections::new(ConnectionLimits {
            total: 3,
            per_client: 2,
        });
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let (a1, _a2) = (c.admit(a).unwrap(), c.admit(a).unwrap());
        assert!(c.admit(a).unwrap_err().contains("your address"));
        let _b1 = c.admit(b).unwrap();
        assert!(c.admit(b).unwrap_err().contains("as many"));
        drop(a1);
        assert!(
            c.admit(a).is_ok(),
            "a closed connection's slot is free again"
        );
    }

    #[test]
    fn an_ipv6_client_is_its_slash_64() {
        let one = client_of("2001:db8:1:2::1".parse().unwrap());
        assert_eq!(one, client_of("2001:db8:1:2:ffff::9".parse().unwrap()));
        assert_ne!(one, client_of("2001:db8:1:3::1".parse().unwrap()));
        assert_eq!(
            client_of("::ffff:10.0.0.1".parse().unwrap()),
            "10.0.0.1".parse::<IpAddr>().unwrap()
        );
    }
}
