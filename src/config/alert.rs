//! `aqw.alert`'s delivery settings: the body format, the dashboard link and
//! the signing secret, which is read from the environment (`%SETTING%`) so
//! it never sits in `host.json`. The webhook URL and the window are
//! validated with the other `aqw` settings in [`super::validate`].

use super::raw::RawAqw;
use super::settings::Env;
use super::validate::parse_http_url;
use super::ConfigError;
use aqw_core::alert::{AlertFormat, SigningSecret};

/// A signing secret shorter than this is refused: HMAC is only as strong
/// as its key, and 16 random characters is the least a guess cannot reach.
const MIN_SECRET_CHARS: usize = 16;

/// `aqw.alert.format`, `aqw.alert.dashboardUrl`, `aqw.alert.runbookUrl`
/// and `aqw.alert.secret`, validated.
pub(super) struct AlertDelivery {
    pub(super) format: AlertFormat,
    pub(super) dashboard_url: Option<url::Url>,
    pub(super) runbook_url: Option<url::Url>,
    pub(super) secret: Option<SigningSecret>,
}

impl AlertDelivery {
    pub(super) fn validate(
        host_file: &str,
        raw_aqw: &RawAqw,
        env: &dyn Env,
    ) -> Result<Self, ConfigError> {
        let Some(a) = &raw_aqw.alert else {
            return Ok(Self {
                format: AlertFormat::Generic,
                dashboard_url: None,
                runbook_url: None,
                secret: None,
            });
        };
        let dashboard_url = match &a.dashboard_url {
            None => None,
            Some(u) => Some(
                parse_http_url(u)
                    .map_err(|m| ConfigError::new(host_file, "aqw.alert.dashboardUrl", m))?,
            ),
        };
        let runbook_url = match &a.runbook_url {
            None => None,
            Some(u) => Some(
                runbook_url(u)
                    .map_err(|m| ConfigError::new(host_file, "aqw.alert.runbookUrl", m))?,
            ),
        };
        let secret = match &a.secret {
            None => None,
            Some(reference) => Some(secret(host_file, reference, env)?),
        };
        Ok(Self {
            format: a.format.unwrap_or_default(),
            dashboard_url,
            runbook_url,
            secret,
        })
    }
}

/// `aqw.alert.runbookUrl`: an https URL with a host and no credentials (it
/// is posted into chat channels and pages people; a link an attacker could
/// swap for plain http, or one carrying a password, is refused).
fn runbook_url(text: &str) -> Result<url::Url, String> {
    let u = url::Url::parse(text.trim()).map_err(|e| format!("not a URL: {e}"))?;
    if u.scheme() != "https" {
        return Err("must be an https URL (the runbook your on-call opens from an alert)".into());
    }
    if u.host_str().is_none_or(str::is_empty) {
        return Err("must name a host".into());
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err("must not carry a user name or password".into());
    }
    Ok(u)
}

/// The secret `reference` names: exactly `%NAME%`, NAME set in the
/// environment (or `local.settings.json`). Errors name the setting, never
/// its value.
fn secret(host_file: &str, reference: &str, env: &dyn Env) -> Result<SigningSecret, ConfigError> {
    let err = |m: String| ConfigError::new(host_file, "aqw.alert.secret", m);
    let name = reference
        .strip_prefix('%')
        .and_then(|r| r.strip_suffix('%'))
        .filter(|n| !n.is_empty() && !n.contains('%'))
        .ok_or_else(|| {
            err("must name an app setting as \"%SETTING%\" (the secret itself never goes in host.json)".into())
        })?;
    let value = env
        .get(name)
        .ok_or_else(|| err(format!("refers to app setting {name}, which is not set")))?;
    if value.chars().count() < MIN_SECRET_CHARS {
        return Err(err(format!(
            "app setting {name} is shorter than {MIN_SECRET_CHARS} characters; use a long random value (for example `openssl rand -hex 32`)"
        )));
    }
    Ok(SigningSecret::new(value))
}

#[cfg(test)]
mod tests {
    use super::super::load_with_env;
    use super::super::test_support::{env_of, write};

    fn load(alert: &str, env: &[(&str, &str)]) -> Result<super::super::AppConfig, String> {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "host.json",
            &format!(r#"{{"aqw": {{"alert": {alert}}}}}"#),
        );
        load_with_env(dir.path(), &env_of(env)).map_err(|e| e.to_string())
    }

    #[test]
    fn bad_delivery_settings_name_the_setting_and_never_the_secret() {
        let e = load(r#"{"format": "discord"}"#, &[]).unwrap_err();
        assert!(e.contains("aqw.alert.format") && e.contains("teams"), "{e}");
        let e = load(r#"{"dashboardUrl": "ftp://x"}"#, &[]).unwrap_err();
        assert!(e.contains("aqw.alert.dashboardUrl"), "{e}");
        let e = load(r#"{"secret": "literal-secret-value-123"}"#, &[]).unwrap_err();
        assert!(
            e.contains("aqw.alert.secret") && !e.contains("literal-secret"),
            "{e}"
        );
        let e = load(r#"{"secret": "%ALERT_KEY%"}"#, &[]).unwrap_err();
        assert!(e.contains("ALERT_KEY") && e.contains("not set"), "{e}");
        let e = load(r#"{"secret": "%ALERT_KEY%"}"#, &[("ALERT_KEY", "short-pw")]).unwrap_err();
        assert!(e.contains("shorter") && !e.contains("short-pw"), "{e}");
    }

    /// Issue 52: `aqw.alert.runbookUrl` is an https URL or absent; absent,
    /// alerts name the runbook embedded in the binary, never someone else's page.
    #[test]
    fn the_runbook_url_is_https_or_absent() {
        for bad in [
            "http://wiki.example/oncall",
            "not a url",
            "https://user:pw@wiki.example/x",
            "javascript:alert(1)",
        ] {
            let e = load(&format!(r#"{{"runbookUrl": "{bad}"}}"#), &[]).unwrap_err();
            assert!(e.contains("aqw.alert.runbookUrl"), "{bad}: {e}");
            assert!(!e.contains("pw@"), "{e}");
        }
        let c = load(
            r#"{"webhook": "https://hooks.example/x", "runbookUrl": "https://wiki.example/aqw/oncall"}"#,
            &[],
        )
        .unwrap();
        let hook = c.alert_target().unwrap();
        let link = aqw_core::alert::runbook_link(hook.runbook_url.as_ref(), Some("outage"));
        assert_eq!(link, "https://wiki.example/aqw/oncall");
        let c = load(r#"{"webhook": "https://hooks.example/x"}"#, &[]).unwrap();
        let hook = c.alert_target().unwrap();
        let link = aqw_core::alert::runbook_link(hook.runbook_url.as_ref(), Some("outage"));
        assert_eq!(link, "aqw oncall outage");
    }

    #[test]
    fn delivery_settings_are_read() {
        let key = "0123456789abcdef0123";
        let c = load(
            r#"{"webhook": "https://hooks.example/x", "format": "teams", "dashboardUrl": "https://aqw.example/q/{queue}", "secret": "%ALERT_KEY%"}"#,
            &[("ALERT_KEY", key)],
        )
        .unwrap();
        let target = c.alert_target().unwrap();
        assert_eq!(target.format, aqw_core::alert::AlertFormat::Teams);
        assert!(target.secret.is_some());
        assert!(
            !format!("{c:?}").contains(key),
            "Debug never shows the secret"
        );
        let c = load(r#"{"webhook": "https://hooks.example/x"}"#, &[]).unwrap();
        assert_eq!(
            c.alert_target().unwrap().format,
            aqw_core::alert::AlertFormat::Generic
        );
    }
}
