//! The dashboard's authentication settings, from the environment, checked
//! at start-up (exit 2 naming the setting): the token and the proxy secret
//! must be hard to guess ([`check_secret`]: estimated guesses, zxcvbn), and
//! a trusted-proxy list must name front ends, not the internet
//! ([`trusted_proxies`]).

pub use super::guard::IpRange;

/// Shorter tokens are refused at start-up.
pub const MIN_TOKEN_LEN: usize = 16;
/// Tokens that zxcvbn estimates fewer than 10^this guesses would find are
/// refused at start-up: at 10^4 online guesses a second (far beyond what
/// the back-off allows) that is over three years; a random 16-character
/// hex token is about 10^16.
pub const MIN_TOKEN_GUESSES_LOG10: f64 = 12.0;

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
    /// `AQW_DASHBOARD_ALLOW_WIDE_TRUSTED_PROXIES=1` (or
    /// `--allow-wide-trusted-proxies`): accept trusted-proxy ranges wider
    /// than /8 (IPv4) or /32 (IPv6).
    pub allow_wide_trusted_proxies: bool,
}

/// The setting that lets `AQW_DASHBOARD_TRUSTED_PROXIES` hold a wide range.
pub const ALLOW_WIDE_SETTING: &str = "AQW_DASHBOARD_ALLOW_WIDE_TRUSTED_PROXIES";

/// A `1`/`0` setting (`true`/`false` too; unset or empty is off).
fn flag(env: &impl Fn(&str) -> Option<String>, name: &str) -> Result<bool, String> {
    match env(name).as_deref() {
        None | Some("") | Some("0") | Some("false") => Ok(false),
        Some("1") | Some("true") => Ok(true),
        Some(other) => Err(format!("{name} must be 1 or 0, not {other:?}")),
    }
}

/// `AQW_DASHBOARD_TRUSTED_PROXIES`: comma-separated addresses or CIDR
/// ranges. A `/0` is refused always (trusting every address is trusting no
/// front end); a range wider than [`IpRange::is_wide`] allows only with
/// [`ALLOW_WIDE_SETTING`] (issue 48: `0.0.0.0/1,128.0.0.0/1` is every
/// IPv4 address in two halves).
pub fn trusted_proxies(setting: &str, allow_wide: bool) -> Result<Vec<IpRange>, String> {
    let name = "AQW_DASHBOARD_TRUSTED_PROXIES";
    let mut ranges = vec![];
    for s in setting.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let range = IpRange::parse(s)
            .ok_or_else(|| format!("{name}: {s:?} is not an IP address or CIDR range"))?;
        if range.covers_everything() {
            return Err(format!(
                "{name}: {s:?} covers every address, so anyone could send principal headers; name the front end's addresses"
            ));
        }
        if range.is_wide() && !allow_wide {
            return Err(format!(
                "{name}: {s:?} is wider than /8 (IPv4) or /32 (IPv6), so far more than a front end could send principal headers; \
                 name the front end's addresses, or set {ALLOW_WIDE_SETTING}=1 (--allow-wide-trusted-proxies) if that range really is yours"
            ));
        }
        ranges.push(range);
    }
    Ok(ranges)
}

impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthConfig")
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("user", &self.user)
            .field("trust_principal", &self.trust_principal)
            .field("proxy_secret", &self.proxy_secret.as_ref().map(|_| "***"))
            .field("trusted_proxies", &self.trusted_proxies)
            .field(
                "allow_wide_trusted_proxies",
                &self.allow_wide_trusted_proxies,
            )
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
        let allow_wide_trusted_proxies = flag(&env, ALLOW_WIDE_SETTING)?;
        let trusted_proxies = trusted_proxies(
            &env("AQW_DASHBOARD_TRUSTED_PROXIES").unwrap_or_default(),
            allow_wide_trusted_proxies,
        )?;
        let trust_principal = flag(&env, "AQW_DASHBOARD_TRUST_PRINCIPAL")?;
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
            allow_wide_trusted_proxies,
        })
    }

    /// The trusted-proxy ranges wider than [`IpRange::is_wide`] allows,
    /// present only by the override.
    pub fn wide_trusted_proxies(&self) -> Vec<IpRange> {
        self.trusted_proxies
            .iter()
            .copied()
            .filter(IpRange::is_wide)
            .collect()
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

/// Refuse a secret that is short or guessable, saying why (never the
/// secret itself): its strength is the number of guesses zxcvbn estimates
/// a cracker needs, knowing dictionaries, sequences (`abcdefgh…`,
/// `0123…`, `9876…`), keyboard walks (`qwertyuiop…`), repeats
/// (`abcabc…`) and dates (issue 48: word lists and an ascending-run rule
/// let each of those through).
fn check_secret(name: &str, secret: &str) -> Result<(), String> {
    let hint = "e.g. openssl rand -hex 24";
    if secret.chars().count() < MIN_TOKEN_LEN {
        return Err(format!(
            "{name} is too short: use at least {MIN_TOKEN_LEN} characters ({hint})"
        ));
    }
    let estimate = zxcvbn::zxcvbn(secret, &[]);
    if estimate.guesses_log10() < MIN_TOKEN_GUESSES_LOG10 {
        let why = estimate
            .feedback()
            .and_then(|f| f.warning())
            .map(|w| format!(" ({w})"))
            .unwrap_or_default();
        return Err(format!(
            "{name} is guessable: about 10^{:.0} guesses would find it, at least 10^{MIN_TOKEN_GUESSES_LOG10} are needed{why}; use a random one ({hint})",
            estimate.guesses_log10().floor()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dashboard::auth::random_hex;

    #[test]
    fn guessable_secrets_are_refused_saying_why_and_random_ones_pass() {
        // Issue 40 and 48: repeats, runs up and down, keyboard walks,
        // repeated blocks and common words, however long.
        for weak in [
            "ab".repeat(12).as_str(),
            "abcdefghabcdefgh",
            "01234567890123456789",
            "98765432109876543210",
            "qwertyuiopasdfghjkl",
            "abcabcabcabcabcabc",
            "0123456789abcdef",
            "password12345678",
        ] {
            let err = check_secret("AQW_DASHBOARD_TOKEN", weak).unwrap_err();
            assert!(err.contains("guessable"), "{weak}: {err}");
            assert!(
                !err.contains(weak),
                "the secret is never in the error: {err}"
            );
        }
        for strong in [
            "9f2k1m0x7zq4w8e6",
            "3b8f0c1e9a7d4265f0e1c2b3",
            &random_hex(24),
        ] {
            assert!(
                check_secret("AQW_DASHBOARD_TOKEN", strong).is_ok(),
                "{strong}"
            );
        }
    }

    #[test]
    fn trusted_proxy_lists_refuse_every_address_and_wide_ranges_without_the_override() {
        let env = |k: &str| {
            (k == "AQW_DASHBOARD_TRUSTED_PROXIES").then(|| "10.0.0.0/8, nope".to_string())
        };
        assert!(AuthConfig::from_env(env).unwrap_err().contains("\"nope\""));
        // Issue 40: a list that trusts every address is no guard.
        for all in ["0.0.0.0/0", "10.0.0.0/8, ::/0"] {
            let err = trusted_proxies(all, true).unwrap_err();
            assert!(err.contains("covers every address"), "{err}");
        }
        // Issue 48: every IPv4 address in two halves, and other wide ranges.
        for wide in ["0.0.0.0/1,128.0.0.0/1", "10.0.0.0/7", "2001:db8::/31"] {
            let err = trusted_proxies(wide, false).unwrap_err();
            assert!(
                err.contains("AQW_DASHBOARD_TRUSTED_PROXIES") && err.contains(ALLOW_WIDE_SETTING),
                "{err}"
            );
            assert!(!trusted_proxies(wide, true).unwrap().is_empty());
        }
        assert_eq!(
            trusted_proxies("10.0.0.0/8, fd00::/32", false)
                .unwrap()
                .len(),
            2
        );
        let env = |k: &str| match k {
            "AQW_DASHBOARD_TRUSTED_PROXIES" => Some("0.0.0.0/1,128.0.0.0/1".to_string()),
            ALLOW_WIDE_SETTING => Some("1".to_string()),
            _ => None,
        };
        let c = AuthConfig::from_env(env).unwrap();
        assert_eq!(c.wide_trusted_proxies().len(), 2);
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
