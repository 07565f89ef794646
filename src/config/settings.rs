//! Settings: the environment, `local.settings.json` under it, `%name%`
//! references resolved against them, and connection settings.

use super::ConfigError;
use aqw_core::config::StorageAccount;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// Source of environment settings (the process environment, or a map in tests).
pub trait Env {
    fn get(&self, name: &str) -> Option<String>;
}

/// The process environment.
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn get(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.is_empty())
    }
}

impl Env for BTreeMap<String, String> {
    fn get(&self, name: &str) -> Option<String> {
        BTreeMap::get(self, name).cloned()
    }
}

/// The environment first, then `local.settings.json` `Values`: the order in
/// which Core Tools (`func start`) gives a Functions app its settings, so a
/// variable set in the shell overrides the file.
pub(super) struct LayeredEnv<'a> {
    pub(super) env: &'a dyn Env,
    pub(super) local: BTreeMap<String, String>,
}

impl Env for LayeredEnv<'_> {
    fn get(&self, name: &str) -> Option<String> {
        self.env
            .get(name)
            .or_else(|| self.local.get(name).filter(|v| !v.is_empty()).cloned())
    }
}

/// `Values` of `local.settings.json` in the app folder (empty when absent).
pub fn read_local_settings(app_dir: &Path) -> Result<BTreeMap<String, String>, ConfigError> {
    let path = app_dir.join("local.settings.json");
    let file = path.display().to_string();
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => {
            return Err(ConfigError::new(
                &file,
                "(file)",
                format!("cannot read: {e}"),
            ))
        }
    };
    // Core Tools writes a UTF-8 BOM on Windows; serde_json does not skip it.
    let text = text.trim_start_matches('\u{feff}');
    let root: Value = serde_json::from_str(text)
        .map_err(|e| ConfigError::new(&file, "(file)", format!("invalid JSON: {e}")))?;
    if root.get("IsEncrypted").and_then(Value::as_bool) == Some(true) {
        return Err(ConfigError::new(
            &file,
            "IsEncrypted",
            "encrypted settings cannot be read outside Core Tools; run `func settings decrypt`",
        ));
    }
    let mut out = BTreeMap::new();
    match root.get("Values") {
        None | Some(Value::Null) => {}
        Some(Value::Object(values)) => {
            for (k, v) in values {
                let v = match v {
                    Value::String(s) => s.clone(),
                    Value::Bool(b) => b.to_string(),
                    Value::Number(n) => n.to_string(),
                    Value::Null => continue,
                    _ => {
                        return Err(ConfigError::new(
                            &file,
                            format!("Values.{k}"),
                            "must be a string (app settings are strings)",
                        ))
                    }
                };
                out.insert(k.clone(), v);
            }
        }
        Some(_) => return Err(ConfigError::new(&file, "Values", "must be an object")),
    }
    Ok(out)
}

/// Resolve `%AppSetting%` references the way the Functions host's name
/// resolver does: each `%name%` is replaced by that setting's value.
pub fn resolve_app_settings(text: &str, env: &dyn Env) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find('%') {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        let end = after
            .find('%')
            .ok_or_else(|| format!("\"{text}\" has an unmatched '%'"))?;
        let name = &after[..end];
        if name.is_empty() {
            return Err(format!("\"{text}\" has an empty %% reference"));
        }
        let value = env
            .get(name)
            .ok_or_else(|| format!("\"{text}\" refers to app setting {name}, which is not set"))?;
        out.push_str(&value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

pub(super) fn truthy(v: &str) -> bool {
    v.eq_ignore_ascii_case("true") || v == "1"
}

/// `AzureWebJobs.<Function>.Disabled` (the Functions setting; also spelled with
/// `_` because a Linux shell cannot export a name containing dots).
pub(super) fn disabled_by_setting(name: &str, env: &dyn Env) -> bool {
    [
        format!("AzureWebJobs.{name}.Disabled"),
        format!("AzureWebJobs_{name}_Disabled"),
    ]
    .iter()
    .any(|k| env.get(k).is_some_and(|v| truthy(v.trim())))
}

/// Resolve a connection setting from the environment (a connection string,
/// or identity-based `<name>__*` settings) to the engine's account, holding
/// the Azure connection the adapter opens. Errors never include the value.
pub fn resolve_connection(name: &str, env: &dyn Env) -> Result<StorageAccount, String> {
    aqw_azure::resolve_connection(name, &|setting| env.get(setting))
        .map(aqw_azure::Connection::account)
}

#[cfg(test)]
mod tests {
    use super::super::load_with_env;
    use super::super::test_support::{env_of, queue_function, write};
    use super::*;

    #[test]
    fn app_settings_in_percent_signs_resolve_from_the_environment() {
        let env = env_of(&[("QUEUE", "orders"), ("ENV", "prod")]);
        assert_eq!(resolve_app_settings("%QUEUE%", &env).unwrap(), "orders");
        assert_eq!(
            resolve_app_settings("%QUEUE%-%ENV%", &env).unwrap(),
            "orders-prod"
        );
        assert_eq!(resolve_app_settings("plain", &env).unwrap(), "plain");
        assert!(resolve_app_settings("%MISSING%", &env)
            .unwrap_err()
            .contains("MISSING"));
        assert!(resolve_app_settings("%QUEUE", &env).is_err());
    }

    #[test]
    fn unset_settings_and_bad_settings_files_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write(d, "host.json", r#"{"version":"2.0"}"#);
        write(d, "Orders/function.json", &queue_function("%ORDERS_QUEUE%"));
        // An unset %setting% names the file, the field and the setting.
        write(
            d,
            "local.settings.json",
            r#"{"Values": {"AzureWebJobsStorage": "UseDevelopmentStorage=true"}}"#,
        );
        let e = load_with_env(d, &BTreeMap::new()).unwrap_err().to_string();
        assert!(
            e.contains("Orders") && e.contains("queueName") && e.contains("ORDERS_QUEUE"),
            "{e}"
        );
        // Encrypted or malformed settings files are clear errors.
        write(
            d,
            "local.settings.json",
            r#"{"IsEncrypted": true, "Values": {}}"#,
        );
        let e = load_with_env(d, &BTreeMap::new()).unwrap_err().to_string();
        assert!(e.contains("IsEncrypted"), "{e}");
        write(
            d,
            "local.settings.json",
            r#"{"Values": {"X": {"nested": 1}}}"#,
        );
        let e = load_with_env(d, &BTreeMap::new()).unwrap_err().to_string();
        assert!(e.contains("Values.X"), "{e}");
        write(d, "local.settings.json", "not json");
        let e = load_with_env(d, &BTreeMap::new()).unwrap_err().to_string();
        assert!(
            e.contains("local.settings.json") && e.contains("invalid JSON"),
            "{e}"
        );
    }
}
