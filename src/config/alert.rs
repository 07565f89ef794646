//! `aqw.alert`'s delivery settings: the body format, the dashboard link and
//! the signing secret, which is read from the environment (`%SETTING%`) so
//! it never sits in `host.json`. The webhook URL and the window are
//! validated with the other `aqw` settings in [`super::validate`].

use super::raw::RawAqw;
use super::settings::Env;
use super::validate::parse_http_url;
use super::ConfigError;
use crate::telemetry::{AlertFormat, SigningSecret};

/// A signing secret shorter than this is refused: HMAC is only as strong
/// as its key, and 16 random characters is the least a guess cannot reach.
const MIN_SECRET_CHARS: usize = 16;

/// `aqw.alert.format`, `aqw.alert.dashboardUrl` and `aqw.alert.secret`, validated.
pub(super) struct AlertDelivery {
    pub(super) format: AlertFormat,
    pub(super) dashboard_url: Option<url::Url>,
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
        let secret = match &a.secret {
            None => None,
            Some(reference) => Some(secret(host_file, reference, env)?),
        };
        Ok(Self {
            format: a.format.unwrap_or_default(),
            dashboard_url,
            secret,
        })
    }
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

    #[test]
    fn delivery_settings_are_read() {
        let key = "0123456789abcdef0123";
        let c = load(
            r#"{"webhook": "https://hooks.example/x", "format": "teams", "dashboardUrl": "https://aqw.example/q/{queue}", "secret": "%ALERT_KEY%"}"#,
            &[("ALERT_KEY", key)],
        )
        .unwrap();
        let target = c.alert_target().unwrap();
        assert_eq!(target.format, crate::telemetry::AlertFormat::Teams);
        assert!(target.secret.is_some());
        assert!(
            !format!("{c:?}").contains(key),
            "Debug never shows the secret"
        );
        let c = load(r#"{"webhook": "https://hooks.example/x"}"#, &[]).unwrap();
        assert_eq!(
            c.alert_target().unwrap().format,
            crate::telemetry::AlertFormat::Generic
        );
    }
}
