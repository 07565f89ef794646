//! What every request passes before a handler sees it: the `Host` check
//! (DNS rebinding) and the principal guard (forged `X-MS-CLIENT-PRINCIPAL*`).
//!
//! Host: a web page the operator visits can make its own name resolve to
//! 127.0.0.1 and then read the loopback dashboard as same-origin; the browser
//! still sends that page's name as `Host`. So a request is served only when
//! its `Host` is the listen address, `localhost` (listening on loopback), an
//! IP literal (listening on every interface: rebinding cannot produce one),
//! or a name from `AQW_DASHBOARD_PUBLIC_URL`. A request without `Host`
//! (HTTP/1.0, in-process tests) is not a browser's and passes.
//!
//! Principal: App Service / Container Apps authentication strips client-sent
//! `X-MS-CLIENT-PRINCIPAL*` headers and sets its own ("External requests
//! aren't allowed to set these headers, so they're present only if set by App
//! Service": learn.microsoft.com, app-service/configure-authentication-user-
//! identities). That holds for requests that went through the platform's
//! front end, not for one sent straight to the listener. So principal headers
//! are kept only on requests that prove where they came from: the shared
//! secret `AQW_DASHBOARD_PROXY_SECRET` in `X-AQW-Proxy-Secret` (set by the
//! front end, e.g. a Front Door or Application Gateway header rule), or a
//! connection from `AQW_DASHBOARD_TRUSTED_PROXIES`. Without either guard,
//! trust is only allowed on a loopback listener ([`super::Options::check`]).

use super::Dashboard;
use axum::extract::{ConnectInfo, State};
use axum::http::{header, HeaderMap, Request, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// The header a front end sets to [`super::AuthConfig::proxy_secret`].
pub const PROXY_SECRET_HEADER: &str = "x-aqw-proxy-secret";
const PRINCIPAL_HEADERS: [&str; 4] = [
    "x-ms-client-principal",
    "x-ms-client-principal-name",
    "x-ms-client-principal-id",
    "x-ms-client-principal-idp",
];

/// One address, or a CIDR range (`10.0.0.0/8`, `fd00::/8`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpRange {
    net: IpAddr,
    prefix: u8,
}

impl IpRange {
    pub fn parse(s: &str) -> Option<Self> {
        let (ip, prefix) = match s.split_once('/') {
            Some((ip, p)) => (ip.parse::<IpAddr>().ok()?, Some(p.parse::<u8>().ok()?)),
            None => (s.parse::<IpAddr>().ok()?, None),
        };
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let prefix = prefix.unwrap_or(max);
        (prefix <= max).then_some(IpRange { net: ip, prefix })
    }

    /// A `/0`: every address of its family.
    pub fn covers_everything(&self) -> bool {
        self.prefix == 0
    }

    /// Wider than any one front end's addresses: a prefix shorter than /8
    /// (IPv4: over 16 million addresses) or /32 (IPv6, a whole provider's
    /// allocation). Refused unless the operator overrides it.
    pub fn is_wide(&self) -> bool {
        self.prefix < if self.net.is_ipv4() { 8 } else { 32 }
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let bits = |ip: IpAddr| match ip {
            IpAddr::V4(v4) => (u128::from(u32::from(v4)) << 96, 32u32),
            IpAddr::V6(v6) => (u128::from(v6), 128u32),
        };
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        };
        let ((net, width), (addr, addr_width)) = (bits(self.net), bits(ip));
        if width != addr_width {
            return false;
        }
        let mask = u128::MAX
            .checked_shl(128 - u32::from(self.prefix))
            .unwrap_or(0);
        net & mask == addr & mask
    }
}

impl std::fmt::Display for IpRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.net, self.prefix)
    }
}

/// Which `Host` values a dashboard answers.
#[derive(Debug, Clone)]
pub struct Hosts {
    listen: IpAddr,
    /// Lower-case names from `AQW_DASHBOARD_PUBLIC_URL`.
    public: Vec<String>,
}

impl Hosts {
    pub fn new(listen: IpAddr, public: Vec<String>) -> Self {
        Hosts { listen, public }
    }

    /// Whether a request with this `Host` header value may be served.
    pub fn allows(&self, host: &str) -> bool {
        let name = host_name(host).to_ascii_lowercase();
        let name = name.trim_end_matches('.');
        if let Ok(ip) = name.trim_matches(['[', ']']).parse::<IpAddr>() {
            return self.listen.is_unspecified()
                || ip == self.listen
                || (ip.is_loopback() && self.listen.is_loopback());
        }
        (name == "localhost" && self.listen.is_loopback()) || self.public.iter().any(|p| p == name)
    }
}

/// The host part of a `Host` value (`[::1]:8088` → `[::1]`, `a:1` → `a`).
fn host_name(host: &str) -> &str {
    if host.starts_with('[') {
        return host.split_inclusive(']').next().unwrap_or(host);
    }
    match host.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    }
}

/// The names `AQW_DASHBOARD_PUBLIC_URL` (comma-separated URLs) allows.
pub fn public_hosts(setting: &str) -> Result<Vec<String>, String> {
    setting
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            let u = url::Url::parse(s).map_err(|e| {
                format!("AQW_DASHBOARD_PUBLIC_URL: {s:?} is not a URL ({e}), e.g. https://ops.example.com")
            })?;
            u.host_str()
                .map(|h| h.trim_end_matches('.').to_ascii_lowercase())
                .ok_or_else(|| format!("AQW_DASHBOARD_PUBLIC_URL: {s:?} has no host"))
        })
        .collect()
}

/// The peer address of a request served with connect info (`None` in
/// in-process tests).
pub fn peer<B>(req: &Request<B>) -> Option<IpAddr> {
    req.extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())
}

impl Dashboard {
    /// Whether this request came through the front end that sets principal
    /// headers.
    fn through_front_end(&self, headers: &HeaderMap, peer: Option<IpAddr>) -> bool {
        let cfg = self.auth.config();
        if !cfg.principal_guarded() {
            // Only reachable on loopback (`Options::check`).
            return true;
        }
        let secret_ok = cfg.proxy_secret.as_deref().is_some_and(|s| {
            headers
                .get(PROXY_SECRET_HEADER)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| constant_time_eq(v.as_bytes(), s.as_bytes()))
        });
        let proxy_ok = peer.is_some_and(|ip| cfg.trusted_proxies.iter().any(|r| r.contains(ip)));
        secret_ok || proxy_ok
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Refuse a foreign `Host`; drop principal headers the front end did not
/// vouch for (and the secret itself, so no handler ever sees it).
pub async fn check(
    State(d): State<Arc<Dashboard>>,
    mut req: Request<axum::body::Body>,
    next: Next,
) -> Response {
    if let Some(host) = req.headers().get(header::HOST) {
        let host = host.to_str().unwrap_or("");
        if !d.hosts.allows(host) {
            let why = "This dashboard does not answer to that host name: open it by its listen \
                       address, or add its public URL to AQW_DASHBOARD_PUBLIC_URL.";
            return (StatusCode::MISDIRECTED_REQUEST, why).into_response();
        }
    }
    let from_front_end = d.through_front_end(req.headers(), peer(&req));
    let headers = req.headers_mut();
    let forged = !from_front_end && PRINCIPAL_HEADERS.iter().any(|h| headers.contains_key(*h));
    if !from_front_end {
        for h in PRINCIPAL_HEADERS {
            headers.remove(h);
        }
    }
    headers.remove(PROXY_SECRET_HEADER);
    if forged {
        d.throttle.refused_principal(peer(&req));
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_contain_their_addresses_only() {
        let r = IpRange::parse("10.1.0.0/16").unwrap();
        assert!(r.contains("10.1.200.3".parse().unwrap()));
        assert!(!r.contains("10.2.0.1".parse().unwrap()));
        assert!(r.contains("::ffff:10.1.0.9".parse().unwrap()));
        let one = IpRange::parse("fd00::1").unwrap();
        assert!(one.contains("fd00::1".parse().unwrap()));
        assert!(!one.contains("fd00::2".parse().unwrap()));
        assert!(IpRange::parse("0.0.0.0/0")
            .unwrap()
            .contains("8.8.8.8".parse().unwrap()));
        for bad in ["10.0.0.0/33", "example.com", "10.0.0.0/x"] {
            assert!(IpRange::parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn hosts_are_the_listen_address_localhost_or_a_public_name() {
        let loopback = Hosts::new("127.0.0.1".parse().unwrap(), vec![]);
        for ok in [
            "127.0.0.1:8088",
            "localhost:8088",
            "LOCALHOST",
            "[::1]:8088",
        ] {
            assert!(loopback.allows(ok), "{ok}");
        }
        for bad in [
            "evil.example:8088",
            "10.0.0.5:8088",
            "localhost.evil.example",
            "",
        ] {
            assert!(!loopback.allows(bad), "{bad}");
        }
        let public = Hosts::new(
            "0.0.0.0".parse().unwrap(),
            public_hosts("https://Ops.Example.com/, http://x.test:8080").unwrap(),
        );
        for ok in [
            "ops.example.com",
            "ops.example.com.:443",
            "x.test:8080",
            "10.0.0.5:8088",
        ] {
            assert!(public.allows(ok), "{ok}");
        }
        assert!(!public.allows("localhost:8088"));
        assert!(!public.allows("evil.example"));
        assert!(public_hosts("not a url").is_err());
    }
}
