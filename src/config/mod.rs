//! The app folder (`host.json` + `<Function>/function.json`) and the environment,
//! parsed into raw shapes and then validated into a ready [`AppConfig`].
//!
//! Every error here happens before any network access and names the file and
//! the field (`host.json: aqw.functions.SendReceipt.key: ...`). Connection
//! strings are read from the environment but never echoed back: errors name
//! the setting, not its value.
//!
//! One file per step, raw shape → validated value:
//!
//! * `raw.rs`: what users write in `host.json` and `function.json` (serde shapes);
//! * `settings.rs`: the environment over `local.settings.json`, `%name%` resolution;
//! * `timespan.rs`: Functions timespans;
//! * `validate.rs`: the raw sections checked and defaulted (exit 2 on error);
//! * `alert.rs`: the alert's format, dashboard link and signing secret;
//! * `functions.rs`: function discovery and each function's config;
//! * `retention.rs`: `aqw.retention`, checked against the key-purge safety floor;
//! * `schedules.rs`: `aqw.schedules`, each checked against its function's key;
//! * `claim_check.rs`: `aqw.claimCheck`, the threshold within what a message holds;
//! * `mod.rs`: the ready types and [`load`], which runs the steps in order.
//!
//! Connection strings are parsed in [`aqw_azure::connection`].

mod alert;
mod breaker;
mod claim_check;
mod functions;
mod limits;
mod lookup;
pub mod queues;
mod raw;
mod retention;
mod schedules;
mod settings;
pub mod show;
mod timespan;
mod validate;

pub use settings::{
    read_local_settings, resolve_app_settings, resolve_connection, Env, ProcessEnv,
};

use raw::RawHost;
use settings::LayeredEnv;
use std::path::Path;
use validate::{AqwSettings, QueueSettings};

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

pub use aqw_azure::{parse_connection_string, table_endpoint_for};
use aqw_core::config::{
    AppConfig, Expiry, FunctionConfig, HandlerSpec, KeySpec, MessageEncoding, RetryStrategy,
    SkippedFunction,
};

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
    let raw = RawHost::read(app_dir)?;
    let host_file = raw.file.as_str();
    let function_timeout = validate::function_timeout(host_file, &raw.function_timeout)?;
    let q = QueueSettings::validate(host_file, &raw.queues)?;
    let a = AqwSettings::validate(host_file, &raw.aqw, q.visibility_timeout)?;
    let retention = retention::validate(host_file, raw.aqw.retention.as_ref())?;
    let delivery = alert::AlertDelivery::validate(host_file, &raw.aqw, env)?;
    let metrics_interval = validate::metrics_interval(host_file, &raw.aqw)?;
    let (mut functions, skipped) = functions::functions(app_dir, host_file, &raw.aqw, env)?;
    queues::apply_overrides(host_file, &raw.aqw, &q, a.retry, &mut functions)?;
    let dynamic_concurrency =
        queues::dynamic_concurrency(host_file, raw.dynamic_concurrency.as_ref())?;
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
        control_table: a.control_table,
        heartbeat_table: a.heartbeat_table,
        poison_ttl: a.poison_ttl,
        poison_format: a.poison_format,
        alert_webhook: a.alert_webhook,
        alert_window: a.alert_window,
        alert_format: delivery.format,
        alert_dashboard_url: delivery.dashboard_url,
        alert_secret: delivery.secret,
        alert_runbook_url: delivery.runbook_url,
        http_port: a.http_port,
        metrics_interval,
        trace_parent: a.trace_parent,
        shutdown_timeout: a.shutdown_timeout,
        max_deferral: a.max_deferral,
        in_progress_timeout: a.in_progress_timeout,
        adaptive_rate: raw.aqw.adaptive_rate.unwrap_or(true),
        alert_throttled_for: a.alert_throttled_for,
        retention,
        schedules: schedules::schedules(host_file, &raw.aqw.schedules, &functions)?,
        claim_check: claim_check::validate(
            host_file,
            raw.aqw.claim_check.as_ref(),
            q.message_encoding,
        )?,
        dynamic_concurrency,
        functions,
        skipped,
    })
}

#[cfg(test)]
pub(crate) mod test_support {
    use std::collections::BTreeMap;
    use std::path::Path;

    pub(crate) fn env_of(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    pub(crate) fn write(dir: &Path, rel: &str, text: &str) {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    pub(crate) fn queue_function(queue: &str) -> String {
        format!(
            r#"{{"bindings":[{{"name":"job","type":"queueTrigger","direction":"in","queueName":"{queue}"}}]}}"#
        )
    }
}
