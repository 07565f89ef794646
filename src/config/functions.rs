//! Function discovery: `<Function>/function.json` folders and
//! `aqw.functions` entries, each made one [`FunctionConfig`] (or skipped,
//! with the reason).

use super::raw::{RawAqw, RawBreaker, RawFunction, RawFunctionJson, RawHandler};
use super::settings::{disabled_by_setting, resolve_app_settings, resolve_connection, truthy, Env};
use super::timespan::opt_timespan;
use super::validate::parse_http_url;
use super::{ConfigError, FunctionConfig, HandlerSpec, KeySpec, SkippedFunction};
use aqw_core::config::{validate_function_name, validate_queue_name};
use aqw_core::idempotency::KeyTemplate;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// Every function: folders with function.json, plus `aqw.functions` entries;
/// disabled and non-queue functions come back as skipped.
pub(super) fn functions(
    app_dir: &Path,
    host_file: &str,
    raw_aqw: &RawAqw,
    env: &dyn Env,
) -> Result<(Vec<FunctionConfig>, Vec<SkippedFunction>), ConfigError> {
    let f = |field: &str, msg: String| ConfigError::new(host_file, field, msg);
    // Functions: folders with function.json, plus aqw.functions entries.
    let (folder_functions, mut skipped) = scan_function_folders(app_dir, env)?;
    let mut names: Vec<String> = folder_functions.keys().cloned().collect();
    for name in raw_aqw.functions.keys() {
        if let Some(s) = skipped
            .iter()
            .find(|s| &s.name == name && !s.reason.starts_with("disabled"))
        {
            return Err(f(
                &format!("aqw.functions.{name}"),
                format!("configures a function aqw cannot run: {}", s.reason),
            ));
        }
        if !names.contains(name) && !skipped.iter().any(|s| &s.name == name) {
            names.push(name.clone());
        }
    }
    names.sort();
    let mut functions = Vec::new();
    let empty = RawFunction::default();
    for name in names {
        if disabled_by_setting(&name, env) {
            skipped.push(SkippedFunction {
                name,
                reason: "disabled by app setting AzureWebJobs.<Function>.Disabled".into(),
            });
            continue;
        }
        let raw = raw_aqw.functions.get(&name).unwrap_or(&empty);
        let folder = folder_functions.get(&name);
        let app_breaker = raw_aqw.breaker.as_ref();
        functions.push(function_config(
            name,
            raw,
            folder,
            (host_file, app_breaker),
            env,
        )?);
    }
    let mut seen = std::collections::BTreeSet::new();
    for func in &functions {
        if !seen.insert(func.queue.clone()) {
            return Err(f(
                &format!("aqw.functions.{}.queue", func.name),
                format!("queue \"{}\" is consumed by two functions", func.queue),
            ));
        }
    }

    Ok((functions, skipped))
}

/// `aqw.functions.<name>.handler`.
fn handler_spec(
    raw: Option<&RawHandler>,
    host_file: &str,
    path: &str,
) -> Result<HandlerSpec, ConfigError> {
    let f = |field: &str, msg: String| ConfigError::new(host_file, field, msg);
    Ok(match raw {
        None => HandlerSpec::Registered,
        Some(RawHandler::Http {
            url,
            timeout,
            replay_header,
            refused_statuses,
            replay_marker,
            lookup,
            idempotent,
            saves_failures,
        }) => {
            let mut answers = provider_answers(replay_header.as_deref(), refused_statuses)
                .map_err(|(field, m)| f(&format!("{path}.handler.{field}"), m))?;
            answers.replay_marker = replay_marker
                .as_ref()
                .map(|m| super::lookup::replay_marker(m, host_file, path))
                .transpose()?;
            answers.lookup = lookup
                .as_ref()
                .map(|l| super::lookup::lookup(l, host_file, path))
                .transpose()?;
            let declared =
                |v, field| declared_bool(v, host_file, &format!("{path}.handler.{field}"));
            answers.idempotent = declared(idempotent, "idempotent")?;
            answers.saves_failures = declared(saves_failures, "savesFailures")?;
            HandlerSpec::Http {
                url: parse_http_url(url).map_err(|m| f(&format!("{path}.handler.url"), m))?,
                timeout: opt_timespan(host_file, &format!("{path}.handler.timeout"), timeout)?
                    .unwrap_or(Duration::from_secs(30)),
                answers,
            }
        }
        Some(RawHandler::Exec { command, timeout }) => {
            if command.is_empty() || command[0].is_empty() {
                return Err(f(
                    &format!("{path}.handler.command"),
                    "must name a program".into(),
                ));
            }
            HandlerSpec::Exec {
                command: command.clone(),
                timeout: opt_timespan(host_file, &format!("{path}.handler.timeout"), timeout)?,
            }
        }
    })
}

/// A declaration of the provider (`handler.idempotent`,
/// `handler.savesFailures`): a bool, unset meaning "not promised", so the
/// uncertain gate stays and no saved failure is assumed.
fn declared_bool(v: &Option<Value>, host_file: &str, field: &str) -> Result<bool, ConfigError> {
    match v {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(ConfigError::new(
            host_file,
            field,
            format!("must be true or false, not {other}"),
        )),
    }
}

/// `handler.replayHeader` and `handler.refusedStatuses`, checked: a header
/// name reqwest accepts, and statuses that are errors (400–599).
fn provider_answers(
    replay_header: Option<&str>,
    refused_statuses: &[u16],
) -> Result<aqw_core::handler::ProviderAnswers, (&'static str, String)> {
    if let Some(h) = replay_header.filter(|h| !h.is_empty()) {
        if reqwest::header::HeaderName::from_bytes(h.as_bytes()).is_err() {
            return Err((
                "replayHeader",
                format!("\"{h}\" is not an HTTP header name"),
            ));
        }
    }
    if let Some(s) = refused_statuses.iter().find(|s| !(400..=599).contains(*s)) {
        return Err((
            "refusedStatuses",
            format!("{s} is not an error status (give 400–599)"),
        ));
    }
    Ok(aqw_core::handler::ProviderAnswers {
        // As written: header lookups ignore case. Unset: Stripe's
        // `Idempotent-Replayed`, which the IETF draft's implementations
        // share; `""` switches the reading off.
        replay_header: match replay_header {
            None => Some(aqw_core::handler::DEFAULT_REPLAY_HEADER.to_string()),
            Some("") => None,
            Some(h) => Some(h.to_string()),
        },
        refused_statuses: refused_statuses.to_vec(),
        replay_marker: None,
        lookup: None,
        idempotent: false,
        saves_failures: false,
    })
}

/// One function's config from its `aqw.functions` entry and its folder.
fn function_config(
    name: String,
    raw: &RawFunction,
    folder: Option<&FolderBinding>,
    (host_file, app_breaker): (&str, Option<&RawBreaker>),
    env: &dyn Env,
) -> Result<FunctionConfig, ConfigError> {
    let f = |field: &str, msg: String| ConfigError::new(host_file, field, msg);
    let path = format!("aqw.functions.{name}");
    validate_function_name(&name).map_err(|m| f(&path, m.to_string()))?;
    let binding = queue_binding(&name, raw, folder, host_file, env)?;
    validate_queue_name(&binding.queue).map_err(|m| f(&format!("{path}.queue"), m.to_string()))?;
    let connection_name = raw
        .connection
        .clone()
        .or(binding.connection)
        .unwrap_or_else(|| "AzureWebJobsStorage".into());
    let connection = resolve_connection(&connection_name, env)
        .map_err(|m| ConfigError::new("environment", &connection_name, m))?;
    let key = match raw.key.as_deref() {
        None => KeySpec::PayloadField,
        Some("none") => KeySpec::None,
        Some(t) => KeySpec::Template(
            KeyTemplate::parse(t).map_err(|m| f(&format!("{path}.key"), m.to_string()))?,
        ),
    };
    let handler = handler_spec(raw.handler.as_ref(), host_file, &path)?;
    let provider_key_window = provider_key_window(raw, host_file, &path)?;
    let breaker = super::breaker::breaker_for(host_file, app_breaker, raw.breaker.as_ref(), &name)?;
    let limits = super::limits::limits(raw.limits.as_ref(), host_file, &path)?;
    let expiry = match raw.expiry.as_deref() {
        None | Some("rescue") => aqw_core::config::Expiry::Rescue,
        Some("expected") => aqw_core::config::Expiry::Expected,
        Some(other) => {
            return Err(f(
                &format!("{path}.expiry"),
                format!("must be \"rescue\" or \"expected\", not {other:?}"),
            ))
        }
    };
    let redact = aqw_core::redact::Redaction::parse(raw.redact.as_deref().unwrap_or_default())
        .map_err(|m| f(&format!("{path}.redact"), m.to_string()))?;
    Ok(FunctionConfig {
        name,
        queue: binding.queue,
        connection,
        key,
        handler,
        binding_name: binding.binding_name,
        binary_data: binding.binary_data,
        provider_key_window,
        breaker,
        redact,
        limits,
        expiry,
        // Resolved against the app's queue settings by `super::queues`.
        overrides: Default::default(),
    })
}

/// `aqw.functions.<name>.providerKeyWindow`: a timespan of at least a second.
fn provider_key_window(
    raw: &RawFunction,
    host_file: &str,
    path: &str,
) -> Result<Option<Duration>, ConfigError> {
    let field = format!("{path}.providerKeyWindow");
    let window = opt_timespan(host_file, &field, &raw.provider_key_window)?;
    if window.is_some_and(|w| w < Duration::from_secs(1)) {
        return Err(ConfigError::new(
            host_file,
            &field,
            "must be at least 00:00:01 (how long the provider remembers a key)",
        ));
    }
    Ok(window)
}

/// The function's queue binding: its folder's queueTrigger (which
/// `aqw.functions.<name>.queue` may repeat, not contradict), or the queue
/// `aqw.functions` names for a function without a folder.
fn queue_binding(
    name: &str,
    raw: &RawFunction,
    folder: Option<&FolderBinding>,
    host_file: &str,
    env: &dyn Env,
) -> Result<FolderBinding, ConfigError> {
    let field = format!("aqw.functions.{name}.queue");
    let f = |msg: String| ConfigError::new(host_file, &field, msg);
    let raw_queue = match &raw.queue {
        Some(q) => Some(resolve_app_settings(q, env).map_err(f)?),
        None => None,
    };
    match (folder, raw_queue) {
        (Some(b), Some(q)) if b.queue != q => Err(f(format!(
            "\"{q}\" differs from queueName \"{}\" in {name}/function.json",
            b.queue
        ))),
        (Some(b), _) => Ok(b.clone()),
        (None, Some(q)) => Ok(FolderBinding {
            queue: q,
            connection: None,
            binding_name: "message".to_string(),
            binary_data: false,
        }),
        (None, None) => Err(f(format!(
            "missing: give the queue here or in {name}/function.json"
        ))),
    }
}

#[derive(Clone)]
struct FolderBinding {
    queue: String,
    connection: Option<String>,
    binding_name: String,
    binary_data: bool,
}

/// The function's queueTrigger binding and its index.
fn queue_trigger(bindings: &[Value]) -> Option<(usize, &Value)> {
    bindings.iter().enumerate().find(|(_, b)| {
        b.get("type")
            .and_then(Value::as_str)
            .is_some_and(|t| t.eq_ignore_ascii_case("queueTrigger"))
    })
}

/// The type of a function's other trigger, for the warning that skips it.
fn other_trigger(bindings: &[Value]) -> &str {
    bindings
        .iter()
        .filter_map(|b| b.get("type").and_then(Value::as_str))
        .find(|t| t.to_ascii_lowercase().ends_with("trigger"))
        .unwrap_or("no trigger")
}

/// Read every `<Function>/function.json`. Queue triggers come back resolved
/// (`%AppSetting%` queue names looked up in `env`); a disabled function or one
/// with another trigger is listed as skipped instead of failing the app, as
/// the Functions host loads the rest of an app around such a function.
fn scan_function_folders(
    app_dir: &Path,
    env: &dyn Env,
) -> Result<(BTreeMap<String, FolderBinding>, Vec<SkippedFunction>), ConfigError> {
    let mut out = BTreeMap::new();
    let mut skipped = Vec::new();
    let Ok(entries) = std::fs::read_dir(app_dir) else {
        return Ok((out, skipped));
    };
    for entry in entries.flatten() {
        let fj = entry.path().join("function.json");
        if !fj.is_file() {
            continue;
        }
        let name = entry.file_name().to_string_lossy().to_string();
        let file = fj.display().to_string();
        let raw = read_function_json(&fj, &file)?;
        if disabled_in_file(&raw, env) {
            skipped.push(SkippedFunction {
                name,
                reason: "disabled in function.json".into(),
            });
            continue;
        }
        let Some((i, b)) = queue_trigger(&raw.bindings) else {
            skipped.push(SkippedFunction {
                name,
                reason: format!(
                    "its trigger is {}; aqw runs only queueTrigger functions",
                    other_trigger(&raw.bindings)
                ),
            });
            continue;
        };
        out.insert(name, folder_binding(&file, i, b, env)?);
    }
    skipped.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((out, skipped))
}

fn read_function_json(path: &Path, file: &str) -> Result<RawFunctionJson, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new(file, "(file)", format!("cannot read: {e}")))?;
    serde_json::from_str(&text)
        .map_err(|e| ConfigError::new(file, "(file)", format!("invalid JSON: {e}")))
}

/// function.json `disabled`: `true`, or the name of a setting that is true.
fn disabled_in_file(raw: &RawFunctionJson, env: &dyn Env) -> bool {
    raw.disabled.as_ref().is_some_and(|d| match d {
        Value::Bool(b) => *b,
        Value::String(s) => truthy(s) || env.get(s).is_some_and(|v| truthy(&v)),
        _ => false,
    })
}

/// The queueTrigger binding `b` (at `bindings[i]`), its queue name resolved.
fn folder_binding(
    file: &str,
    i: usize,
    b: &Value,
    env: &dyn Env,
) -> Result<FolderBinding, ConfigError> {
    let queue = b
        .get("queueName")
        .and_then(Value::as_str)
        .ok_or_else(|| ConfigError::new(file, format!("bindings[{i}].queueName"), "missing"))?;
    let queue = resolve_app_settings(queue, env)
        .map_err(|m| ConfigError::new(file, format!("bindings[{i}].queueName"), m))?;
    let connection = b
        .get("connection")
        .and_then(Value::as_str)
        .map(str::to_string);
    let binding_name = b
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("message")
        .to_string();
    let binary_data = b
        .get("dataType")
        .and_then(Value::as_str)
        .is_some_and(|t| t.eq_ignore_ascii_case("binary"));
    Ok(FolderBinding {
        queue,
        connection,
        binding_name,
        binary_data,
    })
}

#[cfg(test)]
mod tests {
    use super::super::load_with_env;
    use super::super::test_support::{env_of, queue_function, write};
    use std::collections::BTreeMap;

    #[test]
    fn functions_app_conventions() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write(d, "host.json", r#"{"version":"2.0"}"#);
        write(d, "Orders/function.json", &queue_function("%ORDERS_QUEUE%"));
        write(d, "Refunds/function.json", &queue_function("refunds"));
        write(
            d,
            "Old/function.json",
            r#"{"disabled": true, "bindings":[{"type":"queueTrigger","queueName":"old"}]}"#,
        );
        write(
            d,
            "Web/function.json",
            r#"{"bindings":[{"type":"httpTrigger","name":"req"},{"type":"http","direction":"out"}]}"#,
        );
        write(
            d,
            "local.settings.json",
            r#"{"IsEncrypted": false, "Values": {"AzureWebJobsStorage": "UseDevelopmentStorage=true", "ORDERS_QUEUE": "from-file", "AzureWebJobs.Refunds.Disabled": "true"}}"#,
        );
        // The file alone.
        let cfg = load_with_env(d, &BTreeMap::new()).unwrap();
        let names: Vec<&str> = cfg.functions.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["Orders"]);
        assert_eq!(cfg.functions[0].queue, "from-file");
        let skipped: Vec<(&str, &str)> = cfg
            .skipped
            .iter()
            .map(|s| (s.name.as_str(), s.reason.as_str()))
            .collect();
        assert_eq!(skipped.len(), 3, "{skipped:?}");
        assert!(skipped
            .iter()
            .any(|(n, r)| *n == "Old" && r.contains("function.json")));
        assert!(skipped
            .iter()
            .any(|(n, r)| *n == "Refunds" && r.contains("app setting")));
        assert!(skipped
            .iter()
            .any(|(n, r)| *n == "Web" && r.contains("httpTrigger")));
        // The environment wins over the file.
        let env = env_of(&[
            ("ORDERS_QUEUE", "from-env"),
            ("AzureWebJobs.Refunds.Disabled", "false"),
        ]);
        let cfg = load_with_env(d, &env).unwrap();
        assert_eq!(cfg.function("Orders").unwrap().queue, "from-env");
        assert_eq!(cfg.function("Refunds").unwrap().queue, "refunds");
    }

    #[test]
    fn aqw_functions_cannot_configure_a_non_queue_function() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write(
            d,
            "host.json",
            r#"{"version":"2.0","aqw":{"functions":{"Web":{"key":"none"}}}}"#,
        );
        write(
            d,
            "Web/function.json",
            r#"{"bindings":[{"type":"timerTrigger","name":"t"}]}"#,
        );
        let e = load_with_env(
            d,
            &env_of(&[("AzureWebJobsStorage", "UseDevelopmentStorage=true")]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("timerTrigger"), "{e}");
    }

    /// Issue 52: `handler.idempotent` / `handler.savesFailures` are bools,
    /// false unless declared, and anything else exits naming the setting.
    #[test]
    fn idempotent_and_saves_failures_are_declared_bools() {
        let load = |extra: &str| {
            let dir = tempfile::tempdir().unwrap();
            let host = format!(
                r#"{{"version":"2.0","aqw":{{"functions":{{"Pay":{{"queue":"pay","key":"none","handler":{{"type":"http","url":"http://127.0.0.1:1/p"{extra}}}}}}}}}}}"#
            );
            write(dir.path(), "host.json", &host);
            let env = env_of(&[("AzureWebJobsStorage", "UseDevelopmentStorage=true")]);
            load_with_env(dir.path(), &env).map_err(|e| e.to_string())
        };
        let answers = |extra: &str| match &load(extra).unwrap().function("Pay").unwrap().handler {
            super::HandlerSpec::Http { answers, .. } => {
                (answers.idempotent, answers.saves_failures)
            }
            other => panic!("{other:?}"),
        };
        assert_eq!(answers(""), (false, false), "not promised unless declared");
        assert_eq!(
            answers(r#","idempotent":true,"savesFailures":true"#),
            (true, true)
        );
        assert_eq!(answers(r#","savesFailures":true"#), (false, true));
        let e = load(r#","idempotent":"yes""#).unwrap_err();
        assert!(
            e.contains("aqw.functions.Pay.handler.idempotent") && e.contains("true or false"),
            "{e}"
        );
        let e = load(r#","savesFailures":1"#).unwrap_err();
        assert!(e.contains("aqw.functions.Pay.handler.savesFailures"), "{e}");
    }

    #[test]
    fn provider_key_window_and_poison_format_are_validated_by_name() {
        let load = |function: &str, poison: &str| {
            let dir = tempfile::tempdir().unwrap();
            let host = format!(
                r#"{{"version":"2.0","aqw":{{"functions":{{"Pay":{{"queue":"pay","key":"none"{function}}}}}{poison}}}}}"#
            );
            write(dir.path(), "host.json", &host);
            let env = env_of(&[("AzureWebJobsStorage", "UseDevelopmentStorage=true")]);
            load_with_env(dir.path(), &env).map_err(|e| e.to_string())
        };
        let ok = load(
            r#","providerKeyWindow":"1.00:00:00""#,
            r#","poison":{"format":"raw"}"#,
        )
        .unwrap();
        let f = ok.function("Pay").unwrap();
        assert_eq!(
            f.provider_key_window,
            Some(std::time::Duration::from_secs(86_400))
        );
        assert_eq!(ok.poison_format, aqw_core::poison::PoisonFormat::Raw);
        let default = load("", "").unwrap();
        assert_eq!(default.function("Pay").unwrap().provider_key_window, None);
        assert_eq!(
            default.poison_format,
            aqw_core::poison::PoisonFormat::Envelope
        );
        let e = load(r#","providerKeyWindow":"24:00:00""#, "").unwrap_err();
        assert!(
            e.contains("aqw.functions.Pay.providerKeyWindow") && e.contains("1.00:00:00"),
            "{e}"
        );
        let e = load(r#","providerKeyWindow":"00:00:00""#, "").unwrap_err();
        assert!(
            e.contains("providerKeyWindow") && e.contains("at least"),
            "{e}"
        );
        let e = load("", r#","poison":{"format":"plain"}"#).unwrap_err();
        assert!(e.contains("aqw.poison.format"), "{e}");
    }
}
