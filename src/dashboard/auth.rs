//! Who is asking, and whether a POST is theirs.
//!
//! Three ways to be someone, in this order:
//! 1. `Authorization: Bearer <AQW_DASHBOARD_TOKEN>` (scripts);
//! 2. the session cookie that `POST /login` with that token sets (browsers):
//!    `v1.<session id>.<issued at>.<HMAC>`, signed with a key made at start-up,
//!    HttpOnly and SameSite=Strict, valid for [`SESSION_TTL_SECS`] and only
//!    while its id is in the server's session table: sign-out removes it, and
//!    a restart (the only way to rotate the token) empties the table and
//!    makes a new key, so every session ends;
//! 3. with `AQW_DASHBOARD_TRUST_PRINCIPAL=1` only, the
//!    `X-MS-CLIENT-PRINCIPAL-NAME` header that App Service / Container Apps
//!    authentication sets (and strips from client requests). The guard
//!    (`guard.rs`) removes those headers first from every request that did
//!    not prove it came through that front end, so here they are believed.
//!
//! Which wins: a bearer, when presented, always decides (a wrong one is
//! nobody, whatever else the request carries); then a live session cookie;
//! principal headers are read only when neither identifies the request.
//!
//! The token's name is the principal (`AQW_DASHBOARD_USER`, default
//! `dashboard`), the platform's user name the other: actions record it as
//! "by"; no form field ever does.
//!
//! CSRF: every form carries `csrf` = HMAC(key, "csrf" | binding), where the
//! binding is the session id, `bearer`, or the platform principal. A POST is
//! accepted only when that field verifies (constant-time, `Mac::verify_slice`)
//! against the binding of whoever sends it. The login form is bound the same
//! way to a random pre-login cookie.

use axum::http::HeaderMap;
use hmac::{Hmac, Mac};
use rand::RngCore as _;
use sha2::Sha256;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

pub use super::settings::AuthConfig;

type HmacSha256 = Hmac<Sha256>;

/// A browser session lasts a working day.
pub const SESSION_TTL_SECS: u64 = 12 * 3600;
pub const SESSION_COOKIE: &str = "aqw_session";
pub const LOGIN_COOKIE: &str = "aqw_login";
/// Live sessions the server remembers; beyond it the oldest ends.
pub const MAX_SESSIONS: usize = 1000;
/// Principal names are cut to this many characters.
const MAX_NAME_CHARS: usize = 200;

/// How a principal authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    Bearer,
    Session,
    Platform,
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// Recorded as "by" on every action.
    pub name: String,
    pub via: Via,
    /// What its CSRF token is bound to.
    binding: String,
}

/// The authentication state of a running dashboard.
pub struct Auth {
    config: AuthConfig,
    key: [u8; 32],
    /// Live sessions: id → issued at (seconds).
    sessions: Mutex<HashMap<String, u64>>,
}

impl Auth {
    pub fn new(config: AuthConfig) -> Self {
        let mut key = [0u8; 32];
        rand::thread_rng().fill_bytes(&mut key);
        Auth {
            config,
            key,
            sessions: Mutex::new(HashMap::new()),
        }
    }

    pub fn config(&self) -> &AuthConfig {
        &self.config
    }

    fn mac(&self, parts: &[&str]) -> HmacSha256 {
        let mut m = HmacSha256::new_from_slice(&self.key).expect("any key length");
        for p in parts {
            m.update(p.as_bytes());
            m.update(b"\x1f");
        }
        m
    }

    fn sign(&self, parts: &[&str]) -> String {
        hex::encode(self.mac(parts).finalize().into_bytes())
    }

    fn verify(&self, parts: &[&str], hex_mac: &str) -> bool {
        match hex::decode(hex_mac) {
            Ok(bytes) => self.mac(parts).verify_slice(&bytes).is_ok(),
            Err(_) => false,
        }
    }

    /// Constant-time check of a presented token against the configured one.
    fn token_ok(&self, presented: &str) -> bool {
        let Some(token) = &self.config.token else {
            return false;
        };
        let expected = self.mac(&["token", token]).finalize().into_bytes();
        self.mac(&["token", presented])
            .verify_slice(&expected)
            .is_ok()
    }

    /// Who sent these headers, if anyone.
    pub fn identify(&self, headers: &HeaderMap) -> Option<Principal> {
        if let Some(t) = bearer(headers) {
            return self.token_ok(t).then(|| Principal {
                name: self.config.user.clone(),
                via: Via::Bearer,
                binding: "bearer".into(),
            });
        }
        if let Some(sid) = self.session_of(headers) {
            return Some(Principal {
                name: self.config.user.clone(),
                via: Via::Session,
                binding: format!("session:{sid}"),
            });
        }
        if self.config.trust_principal {
            let h = |n: &str| headers.get(n).and_then(|v| v.to_str().ok()).map(str::trim);
            let decoded = h("x-ms-client-principal").and_then(principal_name);
            let name = decoded
                .as_deref()
                .or_else(|| h("x-ms-client-principal-name"))
                .filter(|n| !n.is_empty());
            if let Some(name) = name {
                let id = h("x-ms-client-principal-id").unwrap_or("");
                return Some(Principal {
                    name: log_safe(name),
                    via: Via::Platform,
                    binding: format!("platform:{id}:{name}"),
                });
            }
        }
        None
    }

    /// Whether these headers present a bearer token that is not the
    /// configured one (or any bearer, when no token is configured): the one
    /// place a presented bearer is rejected, on every route.
    pub fn bearer_rejected(&self, headers: &HeaderMap) -> bool {
        bearer(headers).is_some_and(|t| !self.token_ok(t))
    }

    /// A new session cookie value, if `token` is the configured one.
    pub fn login(&self, token: &str) -> Option<String> {
        if !self.token_ok(token) {
            return None;
        }
        let sid = random_hex(16);
        let now = now_secs();
        let iat = now.to_string();
        let mac = self.sign(&["session", &sid, &iat]);
        let mut sessions = self.sessions.lock().expect("session table");
        sessions.retain(|_, issued| now.saturating_sub(*issued) <= SESSION_TTL_SECS);
        while sessions.len() >= MAX_SESSIONS {
            let oldest = sessions
                .iter()
                .min_by_key(|(_, issued)| **issued)
                .map(|(s, _)| s.clone());
            oldest.map(|s| sessions.remove(&s));
        }
        sessions.insert(sid.clone(), now);
        Some(format!("v1.{sid}.{iat}.{mac}"))
    }

    /// End `p`'s session, if it signed in with one: its cookie is nobody
    /// from now on, even replayed.
    pub fn logout(&self, p: &Principal) {
        if let Some(sid) = p.binding.strip_prefix("session:") {
            self.sessions.lock().expect("session table").remove(sid);
        }
    }

    /// A session cookie was sent, whether or not it is (still) valid.
    pub fn presents_session(headers: &HeaderMap) -> bool {
        cookie(headers, SESSION_COOKIE).is_some_and(|c| !c.is_empty())
    }

    /// The live session id of the cookie in `headers`, if any.
    fn session_of(&self, headers: &HeaderMap) -> Option<String> {
        let mut it = cookie(headers, SESSION_COOKIE)?.split('.');
        let (v, sid, iat, mac) = (it.next()?, it.next()?, it.next()?, it.next()?);
        let age = now_secs().checked_sub(iat.parse::<u64>().ok()?)?;
        let signed = v == "v1"
            && it.next().is_none()
            && age <= SESSION_TTL_SECS
            && self.verify(&["session", sid, iat], mac);
        let live = signed
            && self
                .sessions
                .lock()
                .expect("session table")
                .contains_key(sid);
        live.then(|| sid.to_string())
    }

    /// The CSRF token of `p`'s forms.
    pub fn csrf_for(&self, p: &Principal) -> String {
        self.sign(&["csrf", &p.binding])
    }

    pub fn csrf_ok(&self, p: &Principal, presented: &str) -> bool {
        self.verify(&["csrf", &p.binding], presented)
    }

    /// The login form's CSRF token, bound to its pre-login cookie `nonce`.
    pub fn login_csrf(&self, nonce: &str) -> String {
        self.sign(&["login", nonce])
    }

    pub fn login_csrf_ok(&self, headers: &HeaderMap, presented: &str) -> bool {
        cookie(headers, LOGIN_COOKIE).is_some_and(|n| self.verify(&["login", n], presented))
    }
}

/// The user's name in `X-MS-CLIENT-PRINCIPAL`: base64 of the JSON that App
/// Service / Container Apps authentication sends (`{"auth_typ", "claims":
/// [{"typ", "val"}], "name_typ", "role_typ"}`: the name is the claim whose
/// `typ` is `name_typ`; MicrosoftDocs azure-docs,
/// articles/app-service/configure-authentication-user-identities.md), or
/// Static Web Apps' `{"userDetails"}`. `None` when it is not that.
fn principal_name(header: &str) -> Option<String> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(header)
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let from_claims = || {
        let name_typ = v.get("name_typ")?.as_str()?;
        v.get("claims")?
            .as_array()?
            .iter()
            .find_map(|c| (c.get("typ")?.as_str()? == name_typ).then(|| c.get("val")?.as_str())?)
    };
    from_claims()
        .or_else(|| v.get("userDetails")?.as_str())
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::to_string)
}

/// A principal name as it may reach logs and records: control characters
/// (newlines that would forge log lines, escapes) written as `\u{…}`, cut
/// to [`MAX_NAME_CHARS`].
pub fn log_safe(name: &str) -> String {
    name.chars()
        .take(MAX_NAME_CHARS)
        .flat_map(|c| {
            let invisible = matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
            let escaped: Vec<char> = if c.is_control() || invisible {
                c.escape_unicode().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect()
}

pub fn random_hex(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    rand::thread_rng().fill_bytes(&mut b);
    hex::encode(b)
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get("authorization")?.to_str().ok()?;
    let (scheme, rest) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
}

/// The value of cookie `name`, if sent.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all("cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// A `Set-Cookie` value: HttpOnly, SameSite=Strict, whole site; `Secure`
/// when the request reached a TLS front end (`X-Forwarded-Proto: https`, as
/// App Service and Container Apps send it).
pub fn set_cookie(headers: &HeaderMap, name: &str, value: &str, max_age: u64) -> String {
    let tls = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|p| p.eq_ignore_ascii_case("https"));
    let secure = if tls { "; Secure" } else { "" };
    format!("{name}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn auth(token: Option<&str>, trust: bool) -> Auth {
        Auth::new(AuthConfig {
            token: token.map(str::to_string),
            user: "oncall".into(),
            trust_principal: trust,
            ..AuthConfig::default()
        })
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn the_platform_principal_header_is_decoded_and_trusted_only_when_configured() {
        use base64::Engine as _;
        let b64 = |j: &str| base64::engine::general_purpose::STANDARD.encode(j);
        let app_service = b64(
            r#"{"auth_typ":"aad","claims":[{"typ":"name","val":"Ada Lovelace"},{"typ":"http://schemas.xmlsoap.org/ws/2005/05/identity/claims/upn","val":"ada@contoso.com"}],"name_typ":"http://schemas.xmlsoap.org/ws/2005/05/identity/claims/upn","role_typ":"roles"}"#,
        );
        let h = headers(&[
            ("x-ms-client-principal", &app_service),
            ("x-ms-client-principal-name", "ignored@x"),
        ]);
        let p = auth(None, true).identify(&h).unwrap();
        assert_eq!((p.name.as_str(), p.via), ("ada@contoso.com", Via::Platform));
        assert!(
            auth(None, false).identify(&h).is_none(),
            "not trusted unless configured"
        );
        let swa =
            b64(r#"{"identityProvider":"aad","userId":"u1","userDetails":"grace@contoso.com"}"#);
        let p = auth(None, true)
            .identify(&headers(&[("x-ms-client-principal", &swa)]))
            .unwrap();
        assert_eq!(p.name, "grace@contoso.com");
        // Not base64 JSON: the name header, if any, is what is left.
        let h = headers(&[
            ("x-ms-client-principal", "%%%"),
            ("x-ms-client-principal-name", "bob@x"),
        ]);
        assert_eq!(auth(None, true).identify(&h).unwrap().name, "bob@x");
        assert!(auth(None, true)
            .identify(&headers(&[("x-ms-client-principal", "%%%")]))
            .is_none());
    }

    #[test]
    fn bearer_and_session_identify_the_token_user() {
        let a = auth(Some("0123456789abcdef"), false);
        let p = a
            .identify(&headers(&[("authorization", "Bearer 0123456789abcdef")]))
            .unwrap();
        assert_eq!((p.name.as_str(), p.via), ("oncall", Via::Bearer));
        assert!(a
            .identify(&headers(&[("authorization", "Bearer 0123456789abcdeX")]))
            .is_none());
        let c = a.login("0123456789abcdef").unwrap();
        assert!(a.login("wrong").is_none());
        let cookie_header = format!("x=1; {SESSION_COOKIE}={c}");
        let s = a.identify(&headers(&[("cookie", &cookie_header)])).unwrap();
        assert_eq!(s.via, Via::Session);
        // Tampered or foreign sessions are nobody.
        let forged = c.replace("v1.", "v1.0");
        let other = auth(Some("0123456789abcdef"), false);
        for bad in [forged, other.login("0123456789abcdef").unwrap()] {
            let h = format!("{SESSION_COOKIE}={bad}");
            assert!(a.identify(&headers(&[("cookie", &h)])).is_none());
        }
    }

    #[test]
    fn platform_principal_only_when_trusted() {
        let h = headers(&[
            ("x-ms-client-principal-name", "alice@example.com"),
            ("x-ms-client-principal-id", "42"),
        ]);
        assert!(auth(None, false).identify(&h).is_none());
        let p = auth(None, true).identify(&h).unwrap();
        assert_eq!(
            (p.name.as_str(), p.via),
            ("alice@example.com", Via::Platform)
        );
    }

    #[test]
    fn csrf_tokens_are_bound_to_their_principal() {
        let a = auth(Some("0123456789abcdef"), true);
        let bearer = a
            .identify(&headers(&[("authorization", "bearer 0123456789abcdef")]))
            .unwrap();
        let alice = a
            .identify(&headers(&[("x-ms-client-principal-name", "alice")]))
            .unwrap();
        let t = a.csrf_for(&bearer);
        assert!(a.csrf_ok(&bearer, &t));
        assert!(!a.csrf_ok(&alice, &t));
        assert!(!a.csrf_ok(&bearer, "00"));
        assert!(!a.csrf_ok(&bearer, "not hex"));
    }

    #[test]
    fn cookies_are_http_only_strict_and_secure_behind_tls() {
        let plain = set_cookie(&HeaderMap::new(), SESSION_COOKIE, "v", 60);
        assert_eq!(
            plain,
            "aqw_session=v; Path=/; HttpOnly; SameSite=Strict; Max-Age=60"
        );
        let tls = set_cookie(
            &headers(&[("x-forwarded-proto", "https")]),
            SESSION_COOKIE,
            "v",
            60,
        );
        assert!(tls.ends_with("; Secure"), "{tls}");
    }

    #[test]
    fn sign_out_ends_the_session_and_a_bearer_beats_principal_headers() {
        let a = auth(Some("0123456789abcdef"), true);
        let c = format!("{SESSION_COOKIE}={}", a.login("0123456789abcdef").unwrap());
        let h = headers(&[("cookie", &c), ("x-ms-client-principal-name", "mallory")]);
        let p = a.identify(&h).unwrap();
        assert_eq!(p.via, Via::Session);
        a.logout(&p);
        // The session is gone; principal headers still name someone, but a
        // request that presents a cookie is refused by the gate (handlers).
        assert_eq!(a.identify(&h).unwrap().via, Via::Platform);
        assert!(a.identify(&headers(&[("cookie", &c)])).is_none());
        let both = headers(&[
            ("authorization", "Bearer 0123456789abcdef"),
            ("x-ms-client-principal-name", "mallory"),
        ]);
        assert_eq!(a.identify(&both).unwrap().name, "oncall");
    }

    #[test]
    fn principal_names_have_their_control_characters_escaped() {
        assert_eq!(log_safe("a\nb\u{1b}[31m"), "a\\u{a}b\\u{1b}[31m");
        assert_eq!(log_safe("ev\u{202e}il"), "ev\\u{202e}il");
        assert_eq!(log_safe(&"x".repeat(500)).len(), MAX_NAME_CHARS);
    }
}
