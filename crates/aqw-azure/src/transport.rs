//! How aqw's HTTP requests reach the wire (storage requests, and the `http`
//! handler's POSTs, the binary's `handlers::http`): hyper's pooled HTTP/1.1 client
//! (hyper-util's, TLS by hyper-rustls on the process's one rustls
//! configuration, `crate::tls`), or reqwest when the environment names a
//! proxy. Neither path follows a redirect: storage never sends one, and a
//! job POSTed to a handler must not be re-sent to a URL nobody configured.
//!
//! Why not reqwest for everything, as before: reqwest is a layer over the
//! same hyper-util client, and on every request it re-parsed the URL
//! (`url::Parser`, ~2–4 % of `aqw run`'s instructions, bench/profile.md),
//! cloned the header map for its redirect handling (which storage must not
//! follow anyway), merged default headers and boxed a timeout and a URL per
//! response. The pipeline already hands us a finished request (method, URL,
//! headers, bytes), so the direct path converts it once and sends it.
//!
//! Why reqwest stays for proxies: `HTTPS_PROXY` / `HTTP_PROXY` /
//! `ALL_PROXY` with `NO_PROXY` (CONNECT tunnels, proxy authorization) is
//! reqwest's, tested there; writing it again here would be a second, less
//! tried implementation of the same thing.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use std::time::Duration;

/// How long a client waits, and how long it keeps an idle connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub connect: Duration,
    /// The whole exchange, response body included.
    pub request: Duration,
    pub pool_idle: Duration,
}

/// Storage requests: 5 s to connect, 30 s for the exchange; idle
/// connections kept 4 s, below Node's 5 s keep-alive (Azurite), so a pooled
/// connection is never reused just as the server closes it (a request lost
/// as "connection closed before message completed").
pub const STORAGE: Limits = Limits {
    connect: Duration::from_secs(5),
    request: Duration::from_secs(30),
    pool_idle: Duration::from_secs(4),
};
const POOL_MAX_IDLE_PER_HOST: usize = 64;

/// A request as the pipeline finished it.
pub struct Outgoing<'a> {
    pub method: http::Method,
    pub url: &'a str,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

/// A whole response: storage answers are small (at most 32 messages of
/// 64 KiB), so the body is read here, where a read error is still I/O.
pub struct Incoming {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

/// Why a request got no response. The text never names the URL (a SAS
/// lives in its query).
#[derive(Debug)]
pub enum SendError {
    /// No connection: DNS, refused, TLS handshake, connect timeout.
    Connect(String),
    /// The connection failed mid-request.
    Io(String),
    /// No complete response within the exchange's time limit.
    TimedOut(Duration),
    /// The request could not be built (a header the pipeline produced is
    /// not valid HTTP).
    Invalid(String),
}

/// The pooled client.
#[derive(Debug)]
pub struct Transport {
    wire: Wire,
    limits: Limits,
}

#[derive(Debug)]
enum Wire {
    Direct(Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>),
    Proxied(reqwest::Client),
}

impl Transport {
    /// Direct unless a proxy variable is set (and not empty).
    pub fn from_env(limits: Limits) -> Result<Self, String> {
        let wire = if proxy_configured(|name| std::env::var_os(name)) {
            Wire::Proxied(proxied(limits)?)
        } else {
            Wire::Direct(direct(limits))
        };
        Ok(Self { wire, limits })
    }

    pub async fn send(&self, req: Outgoing<'_>) -> Result<Incoming, SendError> {
        self.send_bounded(req, None).await
    }

    /// [`Transport::send`], reading at most `body_limit` + 1 bytes of the
    /// response body (`read_body`).
    pub async fn send_bounded(
        &self,
        req: Outgoing<'_>,
        body_limit: Option<u64>,
    ) -> Result<Incoming, SendError> {
        let timeout = self.limits.request;
        match &self.wire {
            Wire::Direct(client) => send_direct(client, req, timeout, body_limit).await,
            Wire::Proxied(client) => send_proxied(client, req, timeout, body_limit).await,
        }
    }
}

/// reqwest's own list of proxy variables (`reqwest::Proxy::system`).
fn proxy_configured(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> bool {
    [
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "ALL_PROXY",
        "all_proxy",
    ]
    .iter()
    .any(|name| var(name).is_some_and(|v| !v.is_empty()))
}

fn direct(limits: Limits) -> Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(limits.connect));
    // As reqwest did: requests are small and latency-bound.
    http.set_nodelay(true);
    // hyper-rustls sets ALPN itself from the versions enabled (HTTP/1.1).
    let mut tls = crate::tls::client_config();
    tls.alpn_protocols.clear();
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(limits.pool_idle)
        .pool_max_idle_per_host(POOL_MAX_IDLE_PER_HOST)
        .build(https)
}

fn proxied(limits: Limits) -> Result<reqwest::Client, String> {
    crate::tls::client_builder()
        .connect_timeout(limits.connect)
        .timeout(limits.request)
        .pool_idle_timeout(limits.pool_idle)
        .pool_max_idle_per_host(POOL_MAX_IDLE_PER_HOST)
        // As the direct path: a redirect is an answer, not followed. For
        // storage, following one would re-send a signed request to a URL
        // the account did not name.
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| format!("cannot build HTTP client: {e}"))
}

/// The request header by which a client asks for a bounded read of the
/// response body (a blob's bytes are input): the pipeline takes it off the
/// request ([`super::pipeline`]), so it never reaches the wire.
pub const BODY_LIMIT_HEADER: &str = "x-aqw-body-limit";

/// What a bounded read keeps of a response body: a body that declares
/// (`Content-Length`) more than `limit` bytes is not read at all (empty);
/// one that sends more than it declared is read up to the first chunk past
/// `limit`, then the rest is left unread (the connection is dropped, not
/// pooled). Either way the caller sees more than `limit` bytes declared or
/// read, and refuses the body; memory stays within `limit` plus a chunk.
#[derive(Debug, Default)]
struct BoundedBody {
    bytes: Vec<u8>,
}

impl BoundedBody {
    /// Whether the read must go on after this chunk.
    fn push(&mut self, chunk: &[u8], limit: u64) -> bool {
        self.bytes.extend_from_slice(chunk);
        self.bytes.len() as u64 <= limit
    }
}

/// Whether the headers declare a body longer than `limit`.
fn declared_over(headers: &http::HeaderMap, limit: u64) -> bool {
    headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n > limit)
}

/// The body of a direct response, whole or bounded ([`BoundedBody`]).
async fn read_body(
    mut body: hyper::body::Incoming,
    headers: &http::HeaderMap,
    limit: Option<u64>,
) -> Result<Bytes, SendError> {
    let Some(limit) = limit else {
        let whole = body.collect().await;
        return Ok(whole
            .map_err(|e| SendError::Io(error_chain(&e)))?
            .to_bytes());
    };
    let mut kept = BoundedBody::default();
    if declared_over(headers, limit) {
        return Ok(Bytes::new());
    }
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| SendError::Io(error_chain(&e)))?;
        if let Some(data) = frame.data_ref() {
            if !kept.push(data, limit) {
                break;
            }
        }
    }
    Ok(kept.bytes.into())
}

async fn send_direct(
    client: &Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
    req: Outgoing<'_>,
    timeout: Duration,
    body_limit: Option<u64>,
) -> Result<Incoming, SendError> {
    let uri: http::Uri = req
        .url
        .parse()
        .map_err(|e| SendError::Invalid(format!("request URL is not a valid URI: {e}")))?;
    let mut request = http::Request::new(Full::new(req.body));
    *request.method_mut() = req.method;
    *request.uri_mut() = uri;
    *request.headers_mut() = req.headers;
    let exchange = async {
        let rsp = client.request(request).await.map_err(|e| {
            let text = error_chain(&e);
            if e.is_connect() {
                SendError::Connect(text)
            } else {
                SendError::Io(text)
            }
        })?;
        let (parts, body) = rsp.into_parts();
        let body = read_body(body, &parts.headers, body_limit).await?;
        Ok(Incoming {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body,
        })
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(result) => result,
        Err(_) => Err(SendError::TimedOut(timeout)),
    }
}

async fn send_proxied(
    client: &reqwest::Client,
    req: Outgoing<'_>,
    timeout: Duration,
    body_limit: Option<u64>,
) -> Result<Incoming, SendError> {
    // reqwest's error text names the URL: keep the chain without it.
    let failed = |e: reqwest::Error| {
        if e.is_connect() {
            SendError::Connect(error_chain(&e.without_url()))
        } else if e.is_timeout() {
            SendError::TimedOut(timeout)
        } else {
            SendError::Io(error_chain(&e.without_url()))
        }
    };
    let rsp = client
        .request(req.method, req.url)
        .headers(req.headers)
        .body(req.body)
        .send()
        .await
        .map_err(failed)?;
    let status = rsp.status().as_u16();
    let headers = rsp.headers().clone();
    let body = match body_limit {
        None => rsp.bytes().await.map_err(failed)?,
        Some(limit) if declared_over(&headers, limit) => Bytes::new(),
        Some(limit) => {
            let (mut rsp, mut kept) = (rsp, BoundedBody::default());
            while let Some(chunk) = rsp.chunk().await.map_err(failed)? {
                if !kept.push(&chunk, limit) {
                    break;
                }
            }
            kept.bytes.into()
        }
    };
    Ok(Incoming {
        status,
        headers,
        body,
    })
}

/// An error and its sources, one line (`a: b: c`), for the messages of
/// storage and handler failures.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        out.push_str(": ");
        out.push_str(&s.to_string());
        src = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    #[test]
    fn a_proxy_variable_selects_reqwest() {
        let none = |_: &str| None::<OsString>;
        assert!(!proxy_configured(none));
        let empty = |_: &str| Some(OsString::new());
        assert!(!proxy_configured(empty), "an empty variable names no proxy");
        for name in ["HTTPS_PROXY", "http_proxy", "ALL_PROXY"] {
            let one = |n: &str| (n == name).then(|| OsString::from("http://proxy:3128"));
            assert!(proxy_configured(one), "{name}");
        }
        let unrelated = |n: &str| (n == "NO_PROXY").then(|| OsString::from("*"));
        assert!(!proxy_configured(unrelated));
    }

    /// A server that accepts and never answers: the direct path gives up
    /// at its timeout instead of hanging (a short one here; `send` uses
    /// its [`Limits`]).
    #[tokio::test]
    async fn a_silent_server_is_a_timeout() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hold = tokio::spawn(async move {
            let (_sock, _) = listener.accept().await.unwrap();
            std::future::pending::<()>().await;
        });
        let url = format!("http://{addr}/acct/q/messages?sig=c2VjcmV0");
        let req = Outgoing {
            method: http::Method::GET,
            url: &url,
            headers: http::HeaderMap::new(),
            body: Bytes::new(),
        };
        let out = send_direct(&direct(STORAGE), req, Duration::from_millis(300), None).await;
        match out {
            Err(SendError::TimedOut(after)) => assert_eq!(after, Duration::from_millis(300)),
            other => panic!("expected a timeout, got {:?}", other.map(|r| r.status)),
        }
        hold.abort();
    }

    /// Both paths carry method, headers and body out, and status, headers
    /// and body back, the same way.
    #[tokio::test]
    async fn both_paths_carry_a_request_and_its_answer() {
        let app = axum::Router::new().route(
            "/acct/q/messages",
            axum::routing::post(|headers: axum::http::HeaderMap, body: Bytes| async move {
                let seen = headers
                    .get("x-ms-version")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("none")
                    .to_string();
                (
                    axum::http::StatusCode::CREATED,
                    [
                        ("x-ms-request-id", "r-1".to_string()),
                        ("x-seen-version", seen),
                    ],
                    [body.as_ref(), b"!"].concat(),
                )
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let url = format!("http://{addr}/acct/q/messages?timeout=30");
        for wire in [
            Wire::Direct(direct(STORAGE)),
            Wire::Proxied(proxied(STORAGE).unwrap()),
        ] {
            let t = Transport {
                wire,
                limits: STORAGE,
            };
            let mut headers = http::HeaderMap::new();
            headers.insert("x-ms-version", http::HeaderValue::from_static("2018-03-28"));
            let rsp = t
                .send(Outgoing {
                    method: http::Method::POST,
                    url: &url,
                    headers,
                    body: Bytes::from_static(b"<QueueMessage/>"),
                })
                .await
                .unwrap_or_else(|e| panic!("{t:?}: {e:?}"));
            assert_eq!(rsp.status, 201);
            assert_eq!(rsp.headers["x-ms-request-id"], "r-1");
            assert_eq!(rsp.headers["x-seen-version"], "2018-03-28");
            assert_eq!(rsp.body.as_ref(), b"<QueueMessage/>!");
        }
    }

    /// A bounded read stops once the bound is passed: a body sent without
    /// a length and without end is read no further than the bound and a
    /// chunk (unbounded, it would run into the exchange's timeout), and one
    /// whose Content-Length is over the bound is not read at all. Both wires.
    #[tokio::test]
    async fn a_bounded_read_stops_past_its_bound() {
        const CHUNK: usize = 16 * 1024;
        let endless = || {
            let chunks = futures::stream::repeat_with(|| {
                Ok::<_, std::io::Error>(Bytes::from(vec![b'x'; CHUNK]))
            });
            axum::body::Body::from_stream(chunks)
        };
        let app = axum::Router::new()
            .route(
                "/c/endless",
                axum::routing::get(move || async move { endless() }),
            )
            .route(
                "/c/declared",
                axum::routing::get(|| async { vec![b'y'; 4 * 1024 * 1024] }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let limit = 100_000u64;
        for wire in [
            Wire::Direct(direct(STORAGE)),
            Wire::Proxied(proxied(STORAGE).unwrap()),
        ] {
            let t = Transport {
                wire,
                limits: STORAGE,
            };
            let get = |path: &str| format!("http://{addr}/c/{path}");
            let send = |url: String| {
                let t = &t;
                async move {
                    let req = Outgoing {
                        method: http::Method::GET,
                        url: &url,
                        headers: http::HeaderMap::new(),
                        body: Bytes::new(),
                    };
                    t.send_bounded(req, Some(limit)).await
                }
            };
            let rsp = send(get("endless")).await.expect("stopped, not timed out");
            let n = rsp.body.len() as u64;
            assert!(n > limit && n <= limit + CHUNK as u64, "{t:?}: {n} bytes");
            let rsp = send(get("declared")).await.unwrap();
            assert_eq!(rsp.headers["content-length"], "4194304");
            assert!(rsp.body.is_empty(), "{t:?}: read a body declared too long");
        }
    }

    #[tokio::test]
    async fn nothing_listening_is_a_connect_error() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let t = Transport {
            wire: Wire::Direct(direct(STORAGE)),
            limits: STORAGE,
        };
        let url = format!("http://127.0.0.1:{port}/acct/q?sig=c2VjcmV0");
        match t
            .send(Outgoing {
                method: http::Method::PUT,
                url: &url,
                headers: http::HeaderMap::new(),
                body: Bytes::new(),
            })
            .await
        {
            Err(SendError::Connect(text)) => assert!(!text.contains("c2VjcmV0"), "{text}"),
            other => panic!(
                "expected a connect error, got {:?}",
                other.map(|r| r.status)
            ),
        }
    }
}
