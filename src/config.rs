//! The app folder (`host.json` + `<Function>/function.json`) and the environment,
//! parsed into raw shapes and then validated into a ready [`AppConfig`].
//!
//! Every error here happens before any network access and names the file and
//! the field (`host.json: aqw.functions.SendReceipt.key: ...`). Connection
//! strings are read from the environment but never echoed back: errors name
//! the setting, not its value.

use crate::idempotency::KeyTemplate;
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A configuration error: which file, which field, what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {field}: {message}")]
pub struct ConfigError {
    pub file: String,
    pub field: String,
    pub message: String,
}

impl ConfigError {
    pub fn new(
        file: impl Into<String>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            file: file.into(),
            field: field.into(),
            message: message.into(),
        }
    }
}

pub use crate::message::MessageEncoding;
pub use crate::retry::RetryStrategy;

pub use crate::idempotency::KeySpec;

pub use crate::handlers::HandlerSpec;
pub use crate::storage::{Connection, Credentials, Secret};

/// One function: a queue, a key rule and a handler.
#[derive(Debug, Clone)]
pub struct FunctionConfig {
    pub name: String,
    pub queue: String,
    pub connection: Connection,
    pub key: KeySpec,
    pub handler: HandlerSpec,
    /// The binding name in function.json (the custom-handler `Data` key).
    pub binding_name: String,
    /// function.json `dataType` is `binary`: the host passes the message
    /// bytes base64-encoded in `Data` and merges no payload fields into
    /// `Metadata` (see src/serve.rs).
    pub binary_data: bool,
}

impl FunctionConfig {
    pub fn poison_queue(&self) -> String {
        crate::poison::poison_queue_name(&self.queue)
    }
}

/// The validated, ready configuration of one app folder.
#[derive(Debug, Clone)]
pub struct AppConfig {
    pub app_dir: PathBuf,
    pub max_dequeue_count: u32,
    pub batch_size: u32,
    pub new_batch_threshold: u32,
    pub max_polling_interval: Duration,
    pub message_encoding: MessageEncoding,
    pub function_timeout: Option<Duration>,
    /// Lease on a received message (visibility while it runs).
    pub lease: Duration,
    pub retry: RetryStrategy,
    pub keys_table: String,
    pub poison_table: String,
    /// TTL of poison queue messages; `None` = never expires.
    pub poison_ttl: Option<Duration>,
    pub alert_webhook: Option<url::Url>,
    pub alert_window: Duration,
    pub http_port: Option<u16>,
    /// `aqw.tracing.parent`: where a JSON payload carries its producer's
    /// trace context (RFC 6901 pointer). Queue messages have no headers, so
    /// nothing is read or written there unless this is set.
    pub trace_parent: Option<String>,
    pub shutdown_timeout: Duration,
    pub functions: Vec<FunctionConfig>,
    /// Function folders aqw does not run: disabled, or not a queue trigger.
    /// `aqw run` warns about each; `aqw serve` answers their invocations 404.
    pub skipped: Vec<SkippedFunction>,
}

/// A function of the app folder that aqw leaves alone, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedFunction {
    pub name: String,
    pub reason: String,
}

impl AppConfig {
    pub fn function(&self, name: &str) -> Option<&FunctionConfig> {
        self.functions.iter().find(|f| f.name == name)
    }

    /// Functions consuming `queue` (the source queue of a poison record).
    pub fn function_for_queue(&self, queue: &str) -> Option<&FunctionConfig> {
        self.functions.iter().find(|f| f.queue == queue)
    }
}

// ---------------------------------------------------------------------------
// Raw shapes (what users write)
// ---------------------------------------------------------------------------

/// Top-level host.json keys owned by the Functions host: accepted, not read.
const FUNCTIONS_HOST_KEYS: &[&str] = &[
    "version",
    "logging",
    "extensionBundle",
    "customHandler",
    "healthMonitor",
    "watchDirectories",
    "watchFiles",
    "aggregator",
    "concurrency",
    "singleton",
    "managedDependency",
    "functions",
    "retry",
    "languageWorkers",
    "telemetryMode",
];

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawQueues {
    max_dequeue_count: Option<i64>,
    visibility_timeout: Option<String>,
    batch_size: Option<i64>,
    new_batch_threshold: Option<i64>,
    max_polling_interval: Option<String>,
    message_encoding: Option<MessageEncoding>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawAqw {
    #[serde(default)]
    functions: BTreeMap<String, RawFunction>,
    lease: Option<String>,
    retry: Option<RawRetry>,
    #[serde(default)]
    tables: RawTables,
    poison: Option<RawPoison>,
    alert: Option<RawAlert>,
    http: Option<RawHttp>,
    tracing: Option<RawTracing>,
    shutdown_timeout: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawTracing {
    /// JSON pointer to the producer's W3C trace context in a JSON payload.
    parent: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawTables {
    keys: Option<String>,
    poison: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawPoison {
    /// `"never"` or a timespan.
    ttl: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawAlert {
    webhook: Option<String>,
    window: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawHttp {
    port: Option<u16>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawRetry {
    Name(String),
    Full(RawRetryObject),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawRetryObject {
    strategy: String,
    initial_delay: Option<String>,
    max_delay: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawFunction {
    queue: Option<String>,
    connection: Option<String>,
    key: Option<String>,
    handler: Option<RawHandler>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
enum RawHandler {
    Http {
        url: String,
        timeout: Option<String>,
    },
    Exec {
        command: Vec<String>,
        timeout: Option<String>,
    },
}

#[derive(Debug, Deserialize)]
struct RawFunctionJson {
    #[serde(default)]
    bindings: Vec<Value>,
    /// `true`, or (older apps) the name of a setting that holds `true`.
    #[serde(default)]
    disabled: Option<Value>,
}

// ---------------------------------------------------------------------------
// Loading and validation
// ---------------------------------------------------------------------------

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
struct LayeredEnv<'a> {
    env: &'a dyn Env,
    local: BTreeMap<String, String>,
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

fn truthy(v: &str) -> bool {
    v.eq_ignore_ascii_case("true") || v == "1"
}

/// `AzureWebJobs.<Function>.Disabled` (the Functions setting; also spelled with
/// `_` because a Linux shell cannot export a name containing dots).
fn disabled_by_setting(name: &str, env: &dyn Env) -> bool {
    [
        format!("AzureWebJobs.{name}.Disabled"),
        format!("AzureWebJobs_{name}_Disabled"),
    ]
    .iter()
    .any(|k| env.get(k).is_some_and(|v| truthy(v.trim())))
}

/// Load and validate the app folder with the process environment.
pub fn load(app_dir: &Path) -> Result<AppConfig, ConfigError> {
    load_with_env(app_dir, &ProcessEnv)
}

/// Load and validate the app folder; `env` wins over `local.settings.json`.
pub fn load_with_env(app_dir: &Path, env: &dyn Env) -> Result<AppConfig, ConfigError> {
    let layered = LayeredEnv {
        env,
        local: read_local_settings(app_dir)?,
    };
    let env: &dyn Env = &layered;
    let (host_file, root) = read_host_json(app_dir)?;
    let raw_queues: RawQueues = match root.get("extensions").and_then(|e| e.get("queues")) {
        Some(v) => typed(&host_file, "extensions.queues", v)?,
        None => RawQueues::default(),
    };
    let raw_aqw: RawAqw = match root.get("aqw") {
        Some(v) => typed(&host_file, "aqw", v)?,
        None => RawAqw::default(),
    };
    let function_timeout = match root.get("functionTimeout") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(timespan(&host_file, "functionTimeout", s)?),
        Some(_) => {
            return Err(ConfigError::new(
                &host_file,
                "functionTimeout",
                "must be a timespan string hh:mm:ss",
            ))
        }
    };

    let q = QueueSettings::validate(&host_file, &raw_queues)?;
    let a = AqwSettings::validate(&host_file, &raw_aqw, q.visibility_timeout)?;
    let (functions, skipped) = functions(app_dir, &host_file, &raw_aqw, env)?;
    Ok(AppConfig {
        app_dir: app_dir.to_path_buf(),
        max_dequeue_count: q.max_dequeue_count,
        batch_size: q.batch_size,
        new_batch_threshold: q.new_batch_threshold,
        max_polling_interval: q.max_polling_interval,
        message_encoding: q.message_encoding,
        function_timeout,
        lease: a.lease,
        retry: a.retry,
        keys_table: a.keys_table,
        poison_table: a.poison_table,
        poison_ttl: a.poison_ttl,
        alert_webhook: a.alert_webhook,
        alert_window: a.alert_window,
        http_port: a.http_port,
        trace_parent: a.trace_parent,
        shutdown_timeout: a.shutdown_timeout,
        functions,
        skipped,
    })
}

/// `host.json` as a JSON object whose top-level keys are all known.
fn read_host_json(app_dir: &Path) -> Result<(String, serde_json::Map<String, Value>), ConfigError> {
    let host_path = app_dir.join("host.json");
    let host_file = host_path.display().to_string();
    let text = std::fs::read_to_string(&host_path)
        .map_err(|e| ConfigError::new(&host_file, "(file)", format!("cannot read: {e}")))?;
    let root: Value = serde_json::from_str(&text)
        .map_err(|e| ConfigError::new(&host_file, "(file)", format!("invalid JSON: {e}")))?;
    let Value::Object(root) = root else {
        return Err(ConfigError::new(
            &host_file,
            "(root)",
            "must be a JSON object",
        ));
    };

    for key in root.keys() {
        if key != "extensions"
            && key != "aqw"
            && key != "functionTimeout"
            && !FUNCTIONS_HOST_KEYS.contains(&key.as_str())
        {
            return Err(ConfigError::new(&host_file, key, "unknown key"));
        }
    }

    Ok((host_file, root))
}

/// `extensions.queues`, validated.
struct QueueSettings {
    max_dequeue_count: u32,
    batch_size: u32,
    new_batch_threshold: u32,
    visibility_timeout: Duration,
    max_polling_interval: Duration,
    message_encoding: MessageEncoding,
}

impl QueueSettings {
    fn validate(host_file: &str, raw_queues: &RawQueues) -> Result<Self, ConfigError> {
        let f = |field: &str, msg: String| ConfigError::new(host_file, field, msg);
        let host_file = host_file.to_string();
        let max_dequeue_count = match raw_queues.max_dequeue_count {
            None => 5,
            Some(n) if (1..=1000).contains(&n) => n as u32,
            Some(n) => {
                return Err(f(
                    "extensions.queues.maxDequeueCount",
                    format!("{n} is out of range (1..=1000)"),
                ))
            }
        };
        let batch_size = match raw_queues.batch_size {
            None => 16,
            Some(n) if (1..=32).contains(&n) => n as u32,
            Some(n) => {
                return Err(f(
                    "extensions.queues.batchSize",
                    format!("{n} is out of range (1..=32)"),
                ))
            }
        };
        let cores = std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1);
        let new_batch_threshold = match raw_queues.new_batch_threshold {
            None => (batch_size / 2) * cores,
            Some(n) if (0..=10_000).contains(&n) => n as u32,
            Some(n) => {
                return Err(f(
                    "extensions.queues.newBatchThreshold",
                    format!("{n} is out of range (0..=10000)"),
                ))
            }
        };
        let visibility_timeout = opt_timespan(
            &host_file,
            "extensions.queues.visibilityTimeout",
            &raw_queues.visibility_timeout,
        )?
        .unwrap_or(Duration::ZERO);
        if visibility_timeout > Duration::from_secs(7 * 24 * 3600) {
            return Err(f(
                "extensions.queues.visibilityTimeout",
                "must be at most 7 days".into(),
            ));
        }
        let max_polling_interval = opt_timespan(
            &host_file,
            "extensions.queues.maxPollingInterval",
            &raw_queues.max_polling_interval,
        )?
        .unwrap_or(Duration::from_secs(60));
        if max_polling_interval < Duration::from_millis(100) {
            return Err(f(
                "extensions.queues.maxPollingInterval",
                "must be at least 00:00:00.100".into(),
            ));
        }
        let message_encoding = raw_queues
            .message_encoding
            .unwrap_or(MessageEncoding::Base64);

        Ok(Self {
            max_dequeue_count,
            batch_size,
            new_batch_threshold,
            visibility_timeout,
            max_polling_interval,
            message_encoding,
        })
    }
}

/// The `aqw` section's settings other than functions, validated.
struct AqwSettings {
    lease: Duration,
    retry: RetryStrategy,
    keys_table: String,
    poison_table: String,
    poison_ttl: Option<Duration>,
    alert_webhook: Option<url::Url>,
    alert_window: Duration,
    http_port: Option<u16>,
    trace_parent: Option<String>,
    shutdown_timeout: Duration,
}

impl AqwSettings {
    fn validate(
        host_file: &str,
        raw_aqw: &RawAqw,
        visibility_timeout: Duration,
    ) -> Result<Self, ConfigError> {
        let f = |field: &str, msg: String| ConfigError::new(host_file, field, msg);
        let host_file = host_file.to_string();
        let lease = opt_timespan(&host_file, "aqw.lease", &raw_aqw.lease)?
            .unwrap_or(Duration::from_secs(30));
        if lease < Duration::from_secs(1) || lease > Duration::from_secs(7 * 24 * 3600) {
            return Err(f("aqw.lease", "must be between 00:00:01 and 7 days".into()));
        }
        let retry = retry_setting(&host_file, raw_aqw, visibility_timeout)?;
        let keys_table = raw_aqw
            .tables
            .keys
            .clone()
            .unwrap_or_else(|| "aqwkeys".into());
        validate_table_name(&keys_table).map_err(|m| f("aqw.tables.keys", m))?;
        let poison_table = raw_aqw
            .tables
            .poison
            .clone()
            .unwrap_or_else(|| "aqwpoison".into());
        validate_table_name(&poison_table).map_err(|m| f("aqw.tables.poison", m))?;
        if keys_table.eq_ignore_ascii_case(&poison_table) {
            return Err(f("aqw.tables", "keys and poison tables must differ".into()));
        }
        let poison_ttl = match raw_aqw.poison.as_ref().and_then(|p| p.ttl.as_deref()) {
            None | Some("never") => None,
            Some(s) => {
                let d = timespan(&host_file, "aqw.poison.ttl", s)?;
                if d < Duration::from_secs(1) {
                    return Err(f(
                        "aqw.poison.ttl",
                        "must be at least 1 second, or \"never\"".into(),
                    ));
                }
                Some(d)
            }
        };
        let (alert_webhook, alert_window) = match &raw_aqw.alert {
            None => (None, Duration::from_secs(300)),
            Some(a) => {
                let url = match &a.webhook {
                    None => None,
                    Some(u) => Some(parse_http_url(u).map_err(|m| f("aqw.alert.webhook", m))?),
                };
                let window = opt_timespan(&host_file, "aqw.alert.window", &a.window)?
                    .unwrap_or(Duration::from_secs(300));
                (url, window)
            }
        };
        let http_port = raw_aqw.http.as_ref().and_then(|h| h.port);
        let trace_parent = raw_aqw.tracing.as_ref().and_then(|t| t.parent.clone());
        if let Some(p) = &trace_parent {
            if !p.starts_with('/') {
                return Err(f(
                    "aqw.tracing.parent",
                    format!("must be a JSON pointer starting with '/' (for example \"/traceparent\"), got {p:?}"),
                ));
            }
        }
        let shutdown_timeout =
            opt_timespan(&host_file, "aqw.shutdownTimeout", &raw_aqw.shutdown_timeout)?
                .unwrap_or(Duration::from_secs(25));

        Ok(Self {
            lease,
            retry,
            keys_table,
            poison_table,
            poison_ttl,
            alert_webhook,
            alert_window,
            http_port,
            trace_parent,
            shutdown_timeout,
        })
    }
}

/// `aqw.retry`: a strategy name, or an object with its delays.
fn retry_setting(
    host_file: &str,
    raw_aqw: &RawAqw,
    visibility_timeout: Duration,
) -> Result<RetryStrategy, ConfigError> {
    let host_file = host_file.to_string();
    let retry = match &raw_aqw.retry {
        None => RetryStrategy::Exponential {
            initial_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(300),
        },
        Some(RawRetry::Name(name)) => {
            retry_strategy(&host_file, name, None, None, visibility_timeout)?
        }
        Some(RawRetry::Full(o)) => {
            let initial = opt_timespan(&host_file, "aqw.retry.initialDelay", &o.initial_delay)?;
            let max = opt_timespan(&host_file, "aqw.retry.maxDelay", &o.max_delay)?;
            retry_strategy(&host_file, &o.strategy, initial, max, visibility_timeout)?
        }
    };
    Ok(retry)
}

/// Every function: folders with function.json, plus `aqw.functions` entries;
/// disabled and non-queue functions come back as skipped.
fn functions(
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
        functions.push(function_config(name, raw, folder, host_file, env)?);
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
        Some(RawHandler::Http { url, timeout }) => HandlerSpec::Http {
            url: parse_http_url(url).map_err(|m| f(&format!("{path}.handler.url"), m))?,
            timeout: opt_timespan(host_file, &format!("{path}.handler.timeout"), timeout)?
                .unwrap_or(Duration::from_secs(30)),
        },
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

/// One function's config from its `aqw.functions` entry and its folder.
fn function_config(
    name: String,
    raw: &RawFunction,
    folder: Option<&FolderBinding>,
    host_file: &str,
    env: &dyn Env,
) -> Result<FunctionConfig, ConfigError> {
    let f = |field: &str, msg: String| ConfigError::new(host_file, field, msg);
    let host_file = host_file.to_string();
    let path = format!("aqw.functions.{name}");
    validate_function_name(&name).map_err(|m| f(&path, m))?;
    let raw_queue = match &raw.queue {
        Some(q) => Some(resolve_app_settings(q, env).map_err(|m| f(&format!("{path}.queue"), m))?),
        None => None,
    };
    let (queue, connection_name, binding_name, binary_data) = match (folder, &raw_queue) {
        (Some(b), Some(q)) if &b.queue != q => {
            return Err(f(
                &format!("{path}.queue"),
                format!(
                    "\"{q}\" differs from queueName \"{}\" in {name}/function.json",
                    b.queue
                ),
            ))
        }
        (Some(b), _) => (
            b.queue.clone(),
            b.connection.clone(),
            b.binding_name.clone(),
            b.binary_data,
        ),
        (None, Some(q)) => (q.clone(), None, "message".to_string(), false),
        (None, None) => {
            return Err(f(
                &format!("{path}.queue"),
                format!("missing: give the queue here or in {name}/function.json"),
            ))
        }
    };
    validate_queue_name(&queue).map_err(|m| f(&format!("{path}.queue"), m))?;
    let connection_name = raw
        .connection
        .clone()
        .or(connection_name)
        .unwrap_or_else(|| "AzureWebJobsStorage".into());
    let connection = resolve_connection(&connection_name, env)
        .map_err(|m| ConfigError::new("environment", &connection_name, m))?;
    let key = match raw.key.as_deref() {
        None => KeySpec::PayloadField,
        Some("none") => KeySpec::None,
        Some(t) => {
            KeySpec::Template(KeyTemplate::parse(t).map_err(|m| f(&format!("{path}.key"), m))?)
        }
    };
    let handler = handler_spec(raw.handler.as_ref(), &host_file, &path)?;
    Ok(FunctionConfig {
        name,
        queue,
        connection,
        key,
        handler,
        binding_name,
        binary_data,
    })
}

fn typed<T: serde::de::DeserializeOwned>(
    file: &str,
    prefix: &str,
    v: &Value,
) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." {
            prefix.to_string()
        } else {
            format!("{prefix}.{path}")
        };
        ConfigError::new(file, field, e.into_inner().to_string())
    })
}

fn retry_strategy(
    file: &str,
    name: &str,
    initial: Option<Duration>,
    max: Option<Duration>,
    visibility_timeout: Duration,
) -> Result<RetryStrategy, ConfigError> {
    match name {
        "exponential" => {
            let initial_delay = initial.unwrap_or(Duration::from_secs(1));
            let max_delay = max.unwrap_or(Duration::from_secs(300));
            if initial_delay > max_delay {
                return Err(ConfigError::new(
                    file,
                    "aqw.retry.initialDelay",
                    "must not exceed maxDelay",
                ));
            }
            if max_delay > Duration::from_secs(7 * 24 * 3600) {
                return Err(ConfigError::new(
                    file,
                    "aqw.retry.maxDelay",
                    "must be at most 7 days",
                ));
            }
            Ok(RetryStrategy::Exponential {
                initial_delay,
                max_delay,
            })
        }
        "fixed" => Ok(RetryStrategy::Fixed {
            delay: initial.unwrap_or(visibility_timeout),
        }),
        other => Err(ConfigError::new(
            file,
            "aqw.retry.strategy",
            format!("\"{other}\" is not one of exponential, fixed"),
        )),
    }
}

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
        let text = std::fs::read_to_string(&fj)
            .map_err(|e| ConfigError::new(&file, "(file)", format!("cannot read: {e}")))?;
        let raw: RawFunctionJson = serde_json::from_str(&text)
            .map_err(|e| ConfigError::new(&file, "(file)", format!("invalid JSON: {e}")))?;
        if raw.disabled.as_ref().is_some_and(|d| match d {
            Value::Bool(b) => *b,
            Value::String(s) => truthy(s) || env.get(s).is_some_and(|v| truthy(&v)),
            _ => false,
        }) {
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
        let queue = b.get("queueName").and_then(Value::as_str).ok_or_else(|| {
            ConfigError::new(&file, format!("bindings[{i}].queueName"), "missing")
        })?;
        let queue = resolve_app_settings(queue, env)
            .map_err(|m| ConfigError::new(&file, format!("bindings[{i}].queueName"), m))?;
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
        out.insert(
            name,
            FolderBinding {
                queue,
                connection,
                binding_name,
                binary_data,
            },
        );
    }
    skipped.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((out, skipped))
}

/// Parse a Functions timespan: `[d.]hh:mm:ss[.fffffff]`.
pub fn parse_timespan(s: &str) -> Result<Duration, String> {
    let bad = || format!("\"{s}\" is not a timespan (hh:mm:ss[.fff])");
    let (days, rest) = match s.split_once('.') {
        Some((d, r)) if r.contains(':') && !d.contains(':') => {
            (d.parse::<u64>().map_err(|_| bad())?, r)
        }
        _ => (0, s),
    };
    let parts: Vec<&str> = rest.split(':').collect();
    if parts.len() != 3 {
        return Err(bad());
    }
    let num = |p: &str, max: u64| -> Result<u64, String> {
        if p.is_empty() || p.len() > 2 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let n: u64 = p.parse().map_err(|_| bad())?;
        if n > max {
            return Err(bad());
        }
        Ok(n)
    };
    let hours = num(parts[0], 23)?;
    let minutes = num(parts[1], 59)?;
    let (secs, frac) = match parts[2].split_once('.') {
        Some((s2, f)) => (s2, Some(f)),
        None => (parts[2], None),
    };
    let seconds = num(secs, 59)?;
    let nanos = match frac {
        None => 0,
        Some(f) if !f.is_empty() && f.len() <= 7 && f.bytes().all(|b| b.is_ascii_digit()) => {
            let padded = format!("{f:0<9}");
            padded.parse::<u32>().map_err(|_| bad())?
        }
        Some(_) => return Err(bad()),
    };
    Ok(Duration::new(
        days * 86400 + hours * 3600 + minutes * 60 + seconds,
        nanos,
    ))
}

fn timespan(file: &str, field: &str, s: &str) -> Result<Duration, ConfigError> {
    parse_timespan(s).map_err(|m| ConfigError::new(file, field, m))
}

fn opt_timespan(
    file: &str,
    field: &str,
    s: &Option<String>,
) -> Result<Option<Duration>, ConfigError> {
    s.as_deref().map(|s| timespan(file, field, s)).transpose()
}

fn parse_http_url(s: &str) -> Result<url::Url, String> {
    let u = url::Url::parse(s).map_err(|e| format!("not a URL: {e}"))?;
    if u.scheme() != "http" && u.scheme() != "https" {
        return Err("must be an http or https URL".into());
    }
    Ok(u)
}

/// Azure queue name rules, plus room for the `-poison` twin.
pub fn validate_queue_name(name: &str) -> Result<(), String> {
    let ok_chars = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if name.len() < 3 || name.len() > 63 || !ok_chars {
        return Err(format!(
            "\"{name}\" is not a valid queue name (3-63 lowercase letters, digits and dashes)"
        ));
    }
    if name.starts_with('-') || name.ends_with('-') || name.contains("--") {
        return Err(format!(
            "\"{name}\" is not a valid queue name (no leading, trailing or double dash)"
        ));
    }
    if name.ends_with(crate::poison::POISON_SUFFIX) {
        return Err(format!("\"{name}\" is a poison queue; replay it with `aqw poison replay` instead of consuming it"));
    }
    if name.len() + crate::poison::POISON_SUFFIX.len() > 63 {
        return Err(format!(
            "\"{name}\" is too long for its -poison twin (at most 56 characters)"
        ));
    }
    Ok(())
}

pub fn validate_table_name(name: &str) -> Result<(), String> {
    let ok = name.len() >= 3
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_alphanumeric())
        && name.as_bytes()[0].is_ascii_alphabetic();
    if ok {
        Ok(())
    } else {
        Err(format!("\"{name}\" is not a valid table name (3-63 letters and digits, starting with a letter)"))
    }
}

fn validate_function_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        && name.as_bytes()[0].is_ascii_alphabetic();
    if ok {
        Ok(())
    } else {
        Err(format!("\"{name}\" is not a valid function name (letters, digits, _ and -, starting with a letter)"))
    }
}

pub use crate::storage::{DEV_ACCOUNT, DEV_KEY};

/// Resolve a connection setting from the environment. Errors never include the value.
pub fn resolve_connection(name: &str, env: &dyn Env) -> Result<Connection, String> {
    if let Some(value) = env.get(name) {
        return parse_connection_string(name, &value);
    }
    // Identity-based connection: <name>__accountName, or __queueServiceUri
    // (alias __serviceUri, as the queue extension reads it) with an optional
    // __tableServiceUri.
    let account = env.get(&format!("{name}__accountName"));
    let queue_uri = env
        .get(&format!("{name}__queueServiceUri"))
        .or_else(|| env.get(&format!("{name}__serviceUri")));
    let table_uri = env.get(&format!("{name}__tableServiceUri"));
    if account.is_none() && queue_uri.is_none() && table_uri.is_none() {
        return Err(format!(
            "not set: give {name} a connection string (UseDevelopmentStorage=true for Azurite) \
             or {name}__accountName / {name}__queueServiceUri for an identity-based connection"
        ));
    }
    let credential = env.get(&format!("{name}__credential"));
    if let Some(c) = &credential {
        if !c.eq_ignore_ascii_case("managedidentity") {
            return Err(format!(
                "{name}__credential: \"{c}\" is not supported (only managedidentity)"
            ));
        }
    }
    let client_id = env.get(&format!("{name}__clientId"));
    let (queue_endpoint, table_endpoint, account) = match (account, queue_uri, table_uri) {
        (_, Some(q), t) => {
            url::Url::parse(&q).map_err(|_| format!("{name}__queueServiceUri is not a URL"))?;
            let t = match t {
                Some(t) => t,
                None => table_endpoint_for(&q).ok_or_else(|| {
                    format!(
                        "{name}__tableServiceUri is not set and cannot be derived from \
                         {name}__queueServiceUri (its host is not <account>.queue.<suffix>); \
                         set {name}__tableServiceUri (aqw keeps its keys and records in Tables)"
                    )
                })?,
            };
            let acct = account_from_uri(&q)
                .ok_or_else(|| format!("{name}__queueServiceUri: no account in the URL"))?;
            (q, t, acct)
        }
        (Some(a), None, t) => (
            format!("https://{a}.queue.core.windows.net"),
            t.unwrap_or_else(|| format!("https://{a}.table.core.windows.net")),
            a,
        ),
        (None, None, _) => {
            return Err(format!(
                "{name}__tableServiceUri alone is not enough: set {name}__queueServiceUri (or {name}__accountName)"
            ))
        }
    };
    Ok(Connection {
        setting: name.to_string(),
        account,
        queue_endpoint: trim_slash(queue_endpoint),
        table_endpoint: trim_slash(table_endpoint),
        credentials: Credentials::Identity { client_id },
    })
}

/// The account name in a service URL: the first label of
/// `<account>.queue.core.windows.net`, or the first path segment of an
/// emulator URL (`http://127.0.0.1:10001/devstoreaccount1`).
fn account_from_uri(uri: &str) -> Option<String> {
    let u = url::Url::parse(uri).ok()?;
    let host = u.host_str()?;
    if is_emulator_host(&u) {
        let seg = u.path_segments()?.find(|s| !s.is_empty())?;
        return Some(seg.to_string());
    }
    Some(host.split('.').next()?.to_string())
}

fn is_emulator_host(u: &url::Url) -> bool {
    matches!(
        u.host(),
        Some(url::Host::Ipv4(_)) | Some(url::Host::Ipv6(_))
    ) || u.host_str() == Some("localhost")
}

/// The Table endpoint of the account a Queue endpoint belongs to:
/// `<account>.queue.<suffix>` → `<account>.table.<suffix>`; an emulator on
/// loopback → the same host with the table port (10001 → 10002, Azurite's
/// defaults). `None` when the URL says neither.
pub fn table_endpoint_for(queue_endpoint: &str) -> Option<String> {
    let mut u = url::Url::parse(queue_endpoint).ok()?;
    let host = u.host_str()?.to_string();
    if is_emulator_host(&u) {
        let port = u.port()?;
        if port != 10001 {
            return None;
        }
        u.set_port(Some(10002)).ok()?;
        return Some(trim_slash(u.to_string()));
    }
    let mut labels: Vec<&str> = host.split('.').collect();
    if labels.len() < 3 || !labels[1].eq_ignore_ascii_case("queue") {
        return None;
    }
    labels[1] = "table";
    u.set_host(Some(&labels.join("."))).ok()?;
    Some(trim_slash(u.to_string()))
}

fn trim_slash(s: String) -> String {
    s.trim_end_matches('/').to_string()
}

/// `UseDevelopmentStorage=true`: Azurite's well-known account on its
/// default ports (of `DevelopmentStorageProxyUri` when given).
fn development_storage(setting: &str, proxy: Option<&str>) -> Connection {
    let proxy = proxy.unwrap_or("http://127.0.0.1").trim_end_matches('/');
    Connection {
        setting: setting.to_string(),
        account: DEV_ACCOUNT.into(),
        queue_endpoint: format!("{proxy}:10001/{DEV_ACCOUNT}"),
        table_endpoint: format!("{proxy}:10002/{DEV_ACCOUNT}"),
        credentials: Credentials::SharedKey {
            account: DEV_ACCOUNT.into(),
            key: Secret::new(DEV_KEY),
        },
    }
}

/// Parse a storage connection string (`k=v;k=v`), expanding `UseDevelopmentStorage=true`.
pub fn parse_connection_string(setting: &str, value: &str) -> Result<Connection, String> {
    let mut kv: BTreeMap<String, String> = BTreeMap::new();
    for part in value.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((k, v)) = part.split_once('=') else {
            return Err(
                "is not a connection string (expected key=value pairs separated by ';')".into(),
            );
        };
        kv.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
    }
    let get = |k: &str| kv.get(&k.to_ascii_lowercase()).cloned();
    if get("UseDevelopmentStorage").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Ok(development_storage(
            setting,
            get("DevelopmentStorageProxyUri").as_deref(),
        ));
    }
    let account = get("AccountName");
    let protocol = get("DefaultEndpointsProtocol").unwrap_or_else(|| "https".into());
    let suffix = get("EndpointSuffix").unwrap_or_else(|| "core.windows.net".into());
    let endpoint = |explicit: Option<String>, service: &str| -> Result<String, String> {
        match (explicit, &account) {
            (Some(e), _) => {
                url::Url::parse(&e)
                    .map_err(|_| format!("{}Endpoint is not a URL", capitalise(service)))?;
                Ok(trim_slash(e))
            }
            (None, Some(a)) => Ok(format!("{protocol}://{a}.{service}.{suffix}")),
            (None, None) => Err(format!(
                "needs AccountName or {}Endpoint",
                capitalise(service)
            )),
        }
    };
    let queue_endpoint = endpoint(get("QueueEndpoint"), "queue")?;
    // A queue-only connection string: the table endpoint of the same account.
    let table_endpoint = match (get("TableEndpoint"), &account) {
        (None, None) => table_endpoint_for(&queue_endpoint).ok_or_else(|| {
            "needs AccountName or TableEndpoint (the table endpoint cannot be derived \
             from QueueEndpoint)"
                .to_string()
        })?,
        (t, _) => endpoint(t, "table")?,
    };
    let credentials = if let Some(key) = get("AccountKey") {
        let Some(account) = account.clone() else {
            return Err("has AccountKey but no AccountName".into());
        };
        use base64::Engine;
        if base64::engine::general_purpose::STANDARD
            .decode(&key)
            .is_err()
        {
            return Err("AccountKey is not valid base64".into());
        }
        Credentials::SharedKey {
            account,
            key: Secret::new(key),
        }
    } else if let Some(sas) = get("SharedAccessSignature") {
        Credentials::Sas {
            token: Secret::new(sas.trim_start_matches('?')),
        }
    } else {
        return Err("has neither AccountKey nor SharedAccessSignature".into());
    };
    let account = account
        .or_else(|| account_from_uri(&queue_endpoint))
        .unwrap_or_else(|| DEV_ACCOUNT.into());
    Ok(Connection {
        setting: setting.to_string(),
        account,
        queue_endpoint,
        table_endpoint,
        credentials,
    })
}

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timespans() {
        assert_eq!(parse_timespan("00:00:02").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_timespan("00:01:00").unwrap(), Duration::from_secs(60));
        assert_eq!(
            parse_timespan("00:00:00.100").unwrap(),
            Duration::from_millis(100)
        );
        assert_eq!(
            parse_timespan("1.02:00:00").unwrap(),
            Duration::from_secs(26 * 3600)
        );
        for bad in [
            "",
            "5",
            "00:00",
            "00:60:00",
            "aa:00:00",
            "00:00:00.",
            "-1:00:00",
            "00:00:00.12345678",
        ] {
            assert!(parse_timespan(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn queue_names() {
        assert!(validate_queue_name("orders").is_ok());
        assert!(validate_queue_name("Orders").is_err());
        assert!(validate_queue_name("ab").is_err());
        assert!(validate_queue_name("a--b").is_err());
        assert!(validate_queue_name("orders-poison").is_err());
        assert!(validate_queue_name(&"a".repeat(56)).is_ok());
        assert!(validate_queue_name(&"a".repeat(57))
            .unwrap_err()
            .contains("-poison"));
    }

    #[test]
    fn dev_storage_expands() {
        let c =
            parse_connection_string("AzureWebJobsStorage", "UseDevelopmentStorage=true").unwrap();
        assert_eq!(c.queue_endpoint, "http://127.0.0.1:10001/devstoreaccount1");
        assert_eq!(c.table_endpoint, "http://127.0.0.1:10002/devstoreaccount1");
    }

    #[test]
    fn full_connection_string_with_endpoints() {
        let s = format!(
            "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={DEV_KEY};\
             QueueEndpoint=http://127.0.0.1:20001/devstoreaccount1;TableEndpoint=http://127.0.0.1:20002/devstoreaccount1;"
        );
        let c = parse_connection_string("X", &s).unwrap();
        assert_eq!(c.queue_endpoint, "http://127.0.0.1:20001/devstoreaccount1");
        assert_eq!(c.account, "devstoreaccount1");
        let c = parse_connection_string("X", &format!("AccountName=acct;AccountKey={DEV_KEY}"))
            .unwrap();
        assert_eq!(c.queue_endpoint, "https://acct.queue.core.windows.net");
    }

    #[test]
    fn connection_errors_never_echo_the_secret() {
        let secret = "c2VjcmV0LWtleS12YWx1ZQ==zz!";
        let e = parse_connection_string("X", &format!("AccountName=a;AccountKey={secret}"))
            .unwrap_err();
        assert!(!e.contains(secret), "{e}");
        let e = parse_connection_string("X", "garbage-with-secret").unwrap_err();
        assert!(!e.contains("garbage-with-secret"), "{e}");
        assert!(!format!("{:?}", Secret::new("abc")).contains("abc"));
    }

    proptest::proptest! {
        // Fuzzing the config parser: any host.json text gives Ok or a
        // ConfigError naming a file, never a panic.
        #[test]
        fn host_json_parser_never_panics(text in "\\PC{0,200}") {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("host.json"), &text).unwrap();
            let _ = load_with_env(dir.path(), &BTreeMap::new());
        }

        #[test]
        fn structured_host_json_never_panics(
            max in proptest::option::of(-5i64..2000),
            batch in proptest::option::of(-5i64..100),
            poll in proptest::option::of("[0-9:.a-z]{0,14}"),
            key in proptest::option::of("[{}/a-zA-Z:]{0,20}"),
            queue in "[a-zA-Z0-9-]{0,70}",
        ) {
            let host = serde_json::json!({
                "extensions": {"queues": {"maxDequeueCount": max, "batchSize": batch, "maxPollingInterval": poll}},
                "aqw": {"functions": {"F": {"queue": queue, "key": key, "handler": {"type": "exec", "command": ["x"]}}}}
            });
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("host.json"), host.to_string()).unwrap();
            let mut env = BTreeMap::new();
            env.insert("AzureWebJobsStorage".to_string(), "UseDevelopmentStorage=true".to_string());
            let _ = load_with_env(dir.path(), &env);
        }

        #[test]
        fn timespan_and_connection_parsers_never_panic(s in "\\PC{0,60}") {
            let _ = parse_timespan(&s);
            let _ = parse_connection_string("X", &s);
        }
    }

    #[test]
    fn identity_connection() {
        let mut env = BTreeMap::new();
        env.insert(
            "AzureWebJobsStorage__accountName".to_string(),
            "acct".to_string(),
        );
        let c = resolve_connection("AzureWebJobsStorage", &env).unwrap();
        assert_eq!(c.queue_endpoint, "https://acct.queue.core.windows.net");
        assert_eq!(c.credentials, Credentials::Identity { client_id: None });
    }

    fn env_of(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn service_uri_alias_and_queue_only_settings_derive_the_table_endpoint() {
        let c = resolve_connection(
            "Conn",
            &env_of(&[("Conn__serviceUri", "https://acct.queue.core.windows.net/")]),
        )
        .unwrap();
        assert_eq!(c.queue_endpoint, "https://acct.queue.core.windows.net");
        assert_eq!(c.table_endpoint, "https://acct.table.core.windows.net");
        assert_eq!(c.account, "acct");
        // Sovereign clouds keep their suffix.
        let c = resolve_connection(
            "Conn",
            &env_of(&[(
                "Conn__queueServiceUri",
                "https://a2.queue.core.chinacloudapi.cn",
            )]),
        )
        .unwrap();
        assert_eq!(c.table_endpoint, "https://a2.table.core.chinacloudapi.cn");
        // An emulator on loopback: the table port.
        let c = resolve_connection(
            "Conn",
            &env_of(&[(
                "Conn__queueServiceUri",
                "http://127.0.0.1:10001/devstoreaccount1",
            )]),
        )
        .unwrap();
        assert_eq!(c.table_endpoint, "http://127.0.0.1:10002/devstoreaccount1");
        assert_eq!(c.account, "devstoreaccount1");
        // A custom domain cannot be derived: a clear error naming the setting.
        let e = resolve_connection(
            "Conn",
            &env_of(&[("Conn__queueServiceUri", "https://queues.example.com")]),
        )
        .unwrap_err();
        assert!(e.contains("Conn__tableServiceUri"), "{e}");
        // A queue-only connection string.
        let c = parse_connection_string(
            "Conn",
            "QueueEndpoint=https://acct.queue.core.windows.net;SharedAccessSignature=sv=1&sig=s",
        )
        .unwrap();
        assert_eq!(c.table_endpoint, "https://acct.table.core.windows.net");
        assert!(parse_connection_string(
            "Conn",
            "QueueEndpoint=https://q.example.com;SharedAccessSignature=sv=1&sig=s"
        )
        .unwrap_err()
        .contains("TableEndpoint"));
    }

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

    fn write(dir: &Path, rel: &str, text: &str) {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    fn queue_function(queue: &str) -> String {
        format!(
            r#"{{"bindings":[{{"name":"job","type":"queueTrigger","direction":"in","queueName":"{queue}"}}]}}"#
        )
    }

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
}
