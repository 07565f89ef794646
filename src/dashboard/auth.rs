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

pub use super::guard::IpRange;

type HmacSha256 = Hmac<Sha256>;

/// A browser session lasts a working day.
pub const SESSION_TTL_SECS: u64 = 12 * 3600;
pub const SESSION_COOKIE: &str = "aqw_session";
pub const LOGIN_COOKIE: &str = "aqw_login";
/// Shorter tokens are refused at start-up.
pub const MIN_TOKEN_LEN: usize = 16;
/// Tokens made of fewer different characters are refused at start-up
/// (`aaaaaaaaaaaaaaaa`, `1212121212121212`): they are guessable however long.
pub const MIN_TOKEN_DISTINCT: usize = 8;
/// Live sessions the server remembers; beyond it the oldest ends.
pub const MAX_SESSIONS: usize = 1000;
/// Principal names are cut to this many characters.
const MAX_NAME_CHARS: usize = 200;

/// Authentication settings, from the environment.
#[derive(Clone, Default)]
pub struct AuthConfig {
    /// `AQW_DASHBOARD_TOKEN`.
    pub token: Option<String>,
    /// `AQW_DASHBOARD_USER`: the principal the token stands for.
    pub user: String,
    /// `AQW_DASHBOARD_TRUST_PRINCIPAL=1`.
    pub trust_principal: bool,
    /// `AQW_DASHBOARD_PROXY_SECRET`: principal headers are believed only on
    /// requests whose `X-AQW-Proxy-Secret` header carries it.
    pub proxy_secret: Option<String>,
    /// `AQW_DASHBOARD_TRUSTED_PROXIES`: principal headers are believed only
    /// on connections from these addresses.
    pub trusted_proxies: Vec<IpRange>,
}

impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthConfig")
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("user", &self.user)
            .field("trust_principal", &self.trust_principal)
            .field("proxy_secret", &self.proxy_secret.as_ref().map(|_| "***"))
            .field("trusted_proxies", &self.trusted_proxies)
            .finish()
    }
}

impl AuthConfig {
    /// Read `AQW_DASHBOARD_TOKEN`, `AQW_DASHBOARD_USER`,
    /// `AQW_DASHBOARD_TRUST_PRINCIPAL`, `AQW_DASHBOARD_PROXY_SECRET` and
    /// `AQW_DASHBOARD_TRUSTED_PROXIES` through `env`.
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let token = env("AQW_DASHBOARD_TOKEN").filter(|t| !t.is_empty());
        if let Some(t) = &token {
            check_secret("AQW_DASHBOARD_TOKEN", t)?;
        }
        let proxy_secret = env("AQW_DASHBOARD_PROXY_SECRET").filter(|t| !t.is_empty());
        if let Some(s) = &proxy_secret {
            check_secret("AQW_DASHBOARD_PROXY_SECRET", s)?;
        }
        let trusted_proxies = env("AQW_DASHBOARD_TRUSTED_PROXIES")
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                let range = IpRange::parse(s).ok_or_else(|| {
                    format!(
                        "AQW_DASHBOARD_TRUSTED_PROXIES: {s:?} is not an IP address or CIDR range"
                    )
                })?;
                // Trusting every address is trusting no front end at all.
                if range.covers_everything() {
                    return Err(format!(
                        "AQW_DASHBOARD_TRUSTED_PROXIES: {s:?} covers every address, so anyone could send principal headers; name the front end's addresses"
                    ));
                }
                Ok(range)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let trust_principal = match env("AQW_DASHBOARD_TRUST_PRINCIPAL").as_deref() {
            None | Some("") | Some("0") | Some("false") => false,
            Some("1") | Some("true") => true,
            Some(other) => {
                return Err(format!(
                    "AQW_DASHBOARD_TRUST_PRINCIPAL must be 1 or 0, not {other:?}"
                ))
            }
        };
        let user = env("AQW_DASHBOARD_USER")
            .map(|u| u.trim().to_string())
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| "dashboard".into());
        Ok(AuthConfig {
            token,
            user,
            trust_principal,
            proxy_secret,
            trusted_proxies,
        })
    }

    /// Principal headers can be checked to have come through a front end.
    pub fn principal_guarded(&self) -> bool {
        self.proxy_secret.is_some() || !self.trusted_proxies.is_empty()
    }

    /// Some way to authenticate is configured.
    pub fn configured(&self) -> bool {
        self.token.is_some() || self.trust_principal
    }
}

/// Refuse a secret that is short or made of few different characters,
/// saying why (never the secret itself).
fn check_secret(name: &str, secret: &str) -> Result<(), String> {
    let hint = "e.g. openssl rand -hex 24";
    if secret.chars().count() < MIN_TOKEN_LEN {
        return Err(format!(
            "{name} is too short: use at least {MIN_TOKEN_LEN} characters ({hint})"
        ));
    }
    let distinct = secret
        .chars()
        .collect::<std::collections::HashSet<_>>()
        .len();
    if distinct < MIN_TOKEN_DISTINCT {
        return Err(format!(
            "{name} has only {distinct} different characters (at least {MIN_TOKEN_DISTINCT} needed): \
             it is easy to guess however long; use a random one ({hint})"
        ));
    }
    if let Some(why) = weak_pattern(secret) {
        return Err(format!(
            "{name} {why}: it is among the first guesses; use a random one ({hint})"
        ));
    }
    Ok(())
}

/// Words that open every guessing list.
const WEAK_WORDS: &[&str] = &[
    "password", "passw0rd", "qwerty", "letmein", "changeme", "iloveyou", "admin123", "welcome1",
];

/// Why `secret` follows a pattern guessers try first: a common password
/// word, or mostly one ascending run (`0123456789abcdef`, `abcdefgh…`).
fn weak_pattern(secret: &str) -> Option<String> {
    let lower = secret.to_ascii_lowercase();
    if let Some(w) = WEAK_WORDS.iter().find(|w| lower.contains(*w)) {
        return Some(format!("contains the common password word {w:?}"));
    }
    // The next character of an ascending run: digits then letters, as in hex.
    let next = |c: char| match c {
        '9' => Some('a'),
        c => char::from_u32(c as u32 + 1),
    };
    let chars: Vec<char> = lower.chars().collect();
    let (mut longest, mut run) = (1, 1);
    for pair in chars.windows(2) {
        run = if next(pair[0]) == Some(pair[1]) {
            run + 1
        } else {
            1
        };
        longest = longest.max(run);
    }
    (longest * 4 >= chars.len() * 3).then(|| {
        format!(
            "is mostly one ascending run ({longest} of {} characters)",
            chars.len()
        )
    })
}

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

    #[test]
    fn low_entropy_secrets_are_refused_saying_why() {
        let err = check_secret("AQW_DASHBOARD_TOKEN", &"ab".repeat(12)).unwrap_err();
        assert!(err.contains("only 2 different characters"), "{err}");
        assert!(!err.contains("abab"));
        // Issue 40: the patterns guessers try first.
        for weak in ["0123456789abcdef", "password12345678", "Qwerty-9f2k1m0x7z"] {
            let err = check_secret("AQW_DASHBOARD_TOKEN", weak).unwrap_err();
            assert!(!err.contains(weak), "{err}");
        }
        assert!(check_secret("AQW_DASHBOARD_TOKEN", "test-token-0123456789abcdef").is_ok());
        assert!(check_secret("AQW_DASHBOARD_TOKEN", "9f2k1m0x7zq4w8e6").is_ok());
        let env = |k: &str| {
            (k == "AQW_DASHBOARD_TRUSTED_PROXIES").then(|| "10.0.0.0/8, nope".to_string())
        };
        assert!(AuthConfig::from_env(env).unwrap_err().contains("\"nope\""));
        // Issue 40: a list that trusts every address is no guard.
        for all in ["0.0.0.0/0", "10.0.0.0/8, ::/0"] {
            let env = |k: &str| (k == "AQW_DASHBOARD_TRUSTED_PROXIES").then(|| all.to_string());
            let err = AuthConfig::from_env(env).unwrap_err();
            assert!(err.contains("covers every address"), "{err}");
        }
    }

    #[test]
    fn short_tokens_and_odd_flags_are_config_errors() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert!(AuthConfig::from_env(env(&[("AQW_DASHBOARD_TOKEN", "short")])).is_err());
        assert!(AuthConfig::from_env(env(&[("AQW_DASHBOARD_TRUST_PRINCIPAL", "yes")])).is_err());
        let c = AuthConfig::from_env(env(&[("AQW_DASHBOARD_TOKEN", "9f2k1m0x7zq4w8e6")])).unwrap();
        assert_eq!(c.user, "dashboard");
        assert!(!format!("{c:?}").contains("9f2k1m0x7zq4w8e6"));
    }
}
