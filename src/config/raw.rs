//! The raw shapes of `host.json` and `function.json`: what users write,
//! deserialized strictly (unknown keys are errors) and not yet checked.
//! [`super::validate`] turns them into the ready [`super::AppConfig`]: a new
//! setting is a field here and a check there.

use super::{ConfigError, MessageEncoding};
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// `host.json`, read: its path (for errors) and the sections aqw reads.
pub(super) struct RawHost {
    pub(super) file: String,
    pub(super) queues: RawQueues,
    pub(super) aqw: RawAqw,
    pub(super) function_timeout: Option<String>,
    /// `concurrency.dynamicConcurrencyEnabled`, as written (checked in
    /// [`super::queues`]).
    pub(super) dynamic_concurrency: Option<Value>,
}

impl RawHost {
    /// Read `host.json` of `app_dir` into its raw sections.
    pub(super) fn read(app_dir: &Path) -> Result<Self, ConfigError> {
        let (host_file, root) = read_host_json(app_dir)?;
        let queues: RawQueues = match root.get("extensions").and_then(|e| e.get("queues")) {
            Some(v) => typed(&host_file, "extensions.queues", v)?,
            None => RawQueues::default(),
        };
        let aqw: RawAqw = match root.get("aqw") {
            Some(v) => typed(&host_file, "aqw", v)?,
            None => RawAqw::default(),
        };
        let function_timeout = match root.get("functionTimeout") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => {
                return Err(ConfigError::new(
                    &host_file,
                    "functionTimeout",
                    "must be a timespan string hh:mm:ss",
                ))
            }
        };
        let dynamic_concurrency = root
            .get("concurrency")
            .and_then(|c| c.get("dynamicConcurrencyEnabled"))
            .cloned();
        Ok(Self {
            file: host_file,
            queues,
            aqw,
            function_timeout,
            dynamic_concurrency,
        })
    }
}

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
pub(super) struct RawQueues {
    pub(super) max_dequeue_count: Option<i64>,
    pub(super) visibility_timeout: Option<String>,
    pub(super) batch_size: Option<i64>,
    pub(super) new_batch_threshold: Option<i64>,
    pub(super) max_polling_interval: Option<String>,
    pub(super) message_encoding: Option<MessageEncoding>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawAqw {
    #[serde(default)]
    pub(super) functions: BTreeMap<String, RawFunction>,
    pub(super) lease: Option<String>,
    pub(super) retry: Option<RawRetry>,
    #[serde(default)]
    pub(super) tables: RawTables,
    pub(super) poison: Option<RawPoison>,
    pub(super) alert: Option<RawAlert>,
    pub(super) http: Option<RawHttp>,
    pub(super) tracing: Option<RawTracing>,
    pub(super) shutdown_timeout: Option<String>,
    pub(super) max_deferral: Option<String>,
    pub(super) in_progress_timeout: Option<String>,
    pub(super) adaptive_rate: Option<bool>,
    pub(super) breaker: Option<RawBreaker>,
    pub(super) retention: Option<RawRetention>,
    #[serde(default)]
    pub(super) schedules: BTreeMap<String, RawSchedule>,
    pub(super) claim_check: Option<RawClaimCheck>,
}

/// `aqw.claimCheck` (checked in [`super::claim_check`]).
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawClaimCheck {
    pub(super) enabled: Option<bool>,
    pub(super) threshold: Option<u64>,
    pub(super) container: Option<String>,
    pub(super) max_bytes: Option<u64>,
}

/// `aqw.schedules.<Name>` (checked in [`super::schedules`]).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawSchedule {
    pub(super) function: String,
    pub(super) cron: Option<String>,
    pub(super) time_zone: Option<String>,
    pub(super) every: Option<String>,
    pub(super) catch_up: Option<String>,
    pub(super) payload: Option<serde_json::Value>,
}

/// `aqw.retention` (checked in [`super::retention`]).
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawRetention {
    pub(super) source_message_ttl: Option<String>,
    pub(super) keys: Option<String>,
    pub(super) closed_records: Option<String>,
    pub(super) sweep: Option<RawSweep>,
    /// Testing only: accept a keys retention below the safety floor.
    pub(super) unsafe_short_retention: Option<bool>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawSweep {
    pub(super) enabled: Option<bool>,
    pub(super) requests_per_second: Option<f64>,
    pub(super) interval: Option<String>,
    pub(super) lease: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawTracing {
    /// JSON pointer to the producer's W3C trace context in a JSON payload.
    pub(super) parent: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawTables {
    pub(super) keys: Option<String>,
    pub(super) poison: Option<String>,
    pub(super) control: Option<String>,
    /// The poll heartbeats `aqw status` reads (default `aqwheartbeats`).
    pub(super) heartbeats: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawPoison {
    /// `"never"` or a timespan.
    pub(super) ttl: Option<String>,
    /// What the `<queue>-poison` copy is: aqw's envelope, or the raw body.
    pub(super) format: Option<aqw_core::poison::PoisonFormat>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawAlert {
    pub(super) webhook: Option<String>,
    pub(super) window: Option<String>,
    /// `generic` (aqw's JSON), `slack` or `teams`.
    pub(super) format: Option<aqw_core::alert::AlertFormat>,
    pub(super) dashboard_url: Option<String>,
    /// The runbook link alerts carry (an https URL).
    pub(super) runbook_url: Option<String>,
    /// A `%SETTING%` reference to the HMAC signing secret.
    pub(super) secret: Option<String>,
    /// How long a function may be throttled before an alert (a timespan).
    pub(super) throttled_for: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawHttp {
    pub(super) port: Option<u16>,
    /// How often the health gauges are refreshed (a timespan).
    pub(super) metrics_interval: Option<String>,
}

/// `aqw.breaker` / `aqw.functions.<Name>.breaker`: `false`, `true`, or
/// settings (each one overrides the `aqw.breaker` value of the same name).
#[derive(Debug, Deserialize, Clone)]
#[serde(untagged)]
pub(super) enum RawBreaker {
    Switch(bool),
    Settings(RawBreakerSettings),
}

#[derive(Debug, Deserialize, Default, Clone)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawBreakerSettings {
    pub(super) enabled: Option<bool>,
    pub(super) failure_ratio: Option<f64>,
    pub(super) minimum_attempts: Option<i64>,
    pub(super) window: Option<String>,
    pub(super) cool_down: Option<String>,
    pub(super) max_cool_down: Option<String>,
    pub(super) probes: Option<i64>,
    pub(super) consecutive_failures: Option<i64>,
    pub(super) quiet_window: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum RawRetry {
    Name(String),
    Full(RawRetryObject),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawRetryObject {
    pub(super) strategy: String,
    pub(super) initial_delay: Option<String>,
    pub(super) max_delay: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawFunction {
    pub(super) queue: Option<String>,
    pub(super) connection: Option<String>,
    pub(super) key: Option<String>,
    pub(super) handler: Option<RawHandler>,
    /// How long the provider remembers an idempotency key (a timespan).
    pub(super) provider_key_window: Option<String>,
    pub(super) breaker: Option<RawBreaker>,
    /// JSON pointers whose values are masked wherever a payload is shown.
    pub(super) redact: Option<Vec<String>>,
    /// Fleet-wide flow limits (checked in [`super::limits`]).
    pub(super) limits: Option<RawLimits>,
    /// What the expiry guard does: `rescue` (default) or `expected`.
    pub(super) expiry: Option<String>,
    /// Per-function queue settings (checked in [`super::queues`]).
    pub(super) max_dequeue_count: Option<i64>,
    pub(super) visibility_timeout: Option<String>,
    pub(super) batch_size: Option<i64>,
    pub(super) retry: Option<RawRetry>,
}

/// `aqw.functions.<Name>.limits`.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawLimits {
    pub(super) calls_per_second: Option<f64>,
    pub(super) in_flight: Option<i64>,
    pub(super) per_key: Option<RawPerKey>,
}

/// `aqw.functions.<Name>.limits.perKey`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawPerKey {
    pub(super) key: String,
    pub(super) in_flight: i64,
}

// One per function, read once at load: the `http` variant's size costs
// nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub(super) enum RawHandler {
    Http {
        url: String,
        timeout: Option<String>,
        /// The response header by which the provider says it answered a
        /// replayed request from its idempotency store (`Idempotent-Replayed`).
        #[serde(rename = "replayHeader")]
        replay_header: Option<String>,
        /// Statuses the provider answers only when it did not apply the
        /// request (besides 425, 429 and 503).
        #[serde(rename = "refusedStatuses", default)]
        refused_statuses: Vec<u16>,
        /// The provider's replay signal in its JSON body.
        #[serde(rename = "replayMarker")]
        replay_marker: Option<RawReplayMarker>,
        /// How to ask the provider whether a provider key took effect.
        lookup: Option<RawLookup>,
        /// The provider honours `Idempotency-Key` (applies a key at most
        /// once). A value, checked by name (an internally tagged enum's
        /// type error would not name the field).
        idempotent: Option<Value>,
        /// The provider saves a failure under its key and replays it.
        #[serde(rename = "savesFailures")]
        saves_failures: Option<Value>,
    },
    Exec {
        command: Vec<String>,
        timeout: Option<String>,
    },
}

/// `handler.replayMarker`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReplayMarker {
    pub(super) pointer: String,
    pub(super) value: serde_json::Value,
}

/// `handler.lookup`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLookup {
    pub(super) url: String,
    pub(super) timeout: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(super) struct RawFunctionJson {
    #[serde(default)]
    pub(super) bindings: Vec<Value>,
    /// `true`, or (older apps) the name of a setting that holds `true`.
    #[serde(default)]
    pub(super) disabled: Option<Value>,
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
