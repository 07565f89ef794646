//! Validation: the raw shapes of [`super::raw`] checked and defaulted into
//! the values [`super::AppConfig`] holds. Every error names the file and the
//! field, and `aqw` exits 2 on it before any I/O.
//!
//! Each section has one validated struct and one `validate` that reads its
//! raw struct: a new setting adds a raw field, a line here and a field there.

use super::raw::{RawAqw, RawQueues, RawRetry};
use super::timespan::{opt_timespan, timespan};
use super::{ConfigError, MessageEncoding, RetryStrategy};
use aqw_core::config::validate_table_name;
use aqw_core::storage::MAX_VISIBILITY_TIMEOUT;
use std::ops::RangeInclusive;
use std::time::Duration;

/// `functionTimeout`: none, or a timespan.
pub(super) fn function_timeout(
    host_file: &str,
    raw: &Option<String>,
) -> Result<Option<Duration>, ConfigError> {
    opt_timespan(host_file, "functionTimeout", raw)
}

/// An optional count in `range`, `default` when absent.
fn count_in(
    host_file: &str,
    field: &str,
    raw: Option<i64>,
    range: RangeInclusive<i64>,
    default: u32,
) -> Result<u32, ConfigError> {
    match raw {
        None => Ok(default),
        Some(n) if range.contains(&n) => Ok(n as u32),
        Some(n) => Err(ConfigError::new(
            host_file,
            field,
            format!("{n} is out of range ({}..={})", range.start(), range.end()),
        )),
    }
}

/// `extensions.queues`, validated.
pub(super) struct QueueSettings {
    pub(super) max_dequeue_count: u32,
    pub(super) batch_size: u32,
    pub(super) new_batch_threshold: u32,
    pub(super) visibility_timeout: Duration,
    pub(super) max_polling_interval: Duration,
    pub(super) message_encoding: MessageEncoding,
}

impl QueueSettings {
    pub(super) fn validate(host_file: &str, raw_queues: &RawQueues) -> Result<Self, ConfigError> {
        let f = |field: &str, msg: String| ConfigError::new(host_file, field, msg);
        let max_dequeue_count = count_in(
            host_file,
            "extensions.queues.maxDequeueCount",
            raw_queues.max_dequeue_count,
            1..=1000,
            5,
        )?;
        let batch_size = count_in(
            host_file,
            "extensions.queues.batchSize",
            raw_queues.batch_size,
            1..=32,
            16,
        )?;
        let cores = std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1);
        let new_batch_threshold = count_in(
            host_file,
            "extensions.queues.newBatchThreshold",
            raw_queues.new_batch_threshold,
            0..=10_000,
            (batch_size / 2) * cores,
        )?;
        let visibility_timeout = opt_timespan(
            host_file,
            "extensions.queues.visibilityTimeout",
            &raw_queues.visibility_timeout,
        )?
        .unwrap_or(Duration::ZERO);
        if visibility_timeout > MAX_VISIBILITY_TIMEOUT {
            return Err(f(
                "extensions.queues.visibilityTimeout",
                "must be at most 7 days".into(),
            ));
        }
        let max_polling_interval = max_polling_interval(host_file, raw_queues)?;
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

/// `extensions.queues.maxPollingInterval`: at least 100 ms, 1 minute by default.
fn max_polling_interval(host_file: &str, raw_queues: &RawQueues) -> Result<Duration, ConfigError> {
    let max_polling_interval = opt_timespan(
        host_file,
        "extensions.queues.maxPollingInterval",
        &raw_queues.max_polling_interval,
    )?
    .unwrap_or(Duration::from_secs(60));
    if max_polling_interval < Duration::from_millis(100) {
        return Err(ConfigError::new(
            host_file,
            "extensions.queues.maxPollingInterval",
            "must be at least 00:00:00.100",
        ));
    }
    Ok(max_polling_interval)
}

/// The `aqw` section's settings other than functions, validated.
pub(super) struct AqwSettings {
    pub(super) lease: Duration,
    pub(super) retry: RetryStrategy,
    pub(super) keys_table: String,
    pub(super) poison_table: String,
    pub(super) control_table: String,
    pub(super) heartbeat_table: String,
    pub(super) poison_ttl: Option<Duration>,
    pub(super) poison_format: aqw_core::poison::PoisonFormat,
    pub(super) alert_webhook: Option<url::Url>,
    pub(super) alert_window: Duration,
    pub(super) http_port: Option<u16>,
    pub(super) trace_parent: Option<String>,
    pub(super) shutdown_timeout: Duration,
    pub(super) max_deferral: Duration,
    pub(super) in_progress_timeout: Duration,
    pub(super) alert_throttled_for: Duration,
}

impl AqwSettings {
    pub(super) fn validate(
        host_file: &str,
        raw_aqw: &RawAqw,
        visibility_timeout: Duration,
    ) -> Result<Self, ConfigError> {
        let f = |field: &str, msg: String| ConfigError::new(host_file, field, msg);
        let lease = opt_timespan(host_file, "aqw.lease", &raw_aqw.lease)?
            .unwrap_or(Duration::from_secs(30));
        if lease < Duration::from_secs(1) || lease > MAX_VISIBILITY_TIMEOUT {
            return Err(f("aqw.lease", "must be between 00:00:01 and 7 days".into()));
        }
        let retry = retry_setting(host_file, raw_aqw, visibility_timeout)?;
        let (keys_table, poison_table) = tables(host_file, raw_aqw)?;
        let control_table = control_table(host_file, raw_aqw, [&keys_table, &poison_table])?;
        let heartbeat_table = heartbeat_table(host_file, raw_aqw, [&keys_table, &poison_table])?;
        let poison_ttl = poison_ttl(host_file, raw_aqw)?;
        let poison_format = raw_aqw
            .poison
            .as_ref()
            .and_then(|p| p.format)
            .unwrap_or_default();
        let (alert_webhook, alert_window) = alert(host_file, raw_aqw)?;
        let http_port = raw_aqw.http.as_ref().and_then(|h| h.port);
        let trace_parent = trace_parent(host_file, raw_aqw)?;
        let shutdown_timeout =
            opt_timespan(host_file, "aqw.shutdownTimeout", &raw_aqw.shutdown_timeout)?
                .unwrap_or(Duration::from_secs(25));
        let max_deferral = opt_timespan(host_file, "aqw.maxDeferral", &raw_aqw.max_deferral)?
            .unwrap_or(aqw_core::decide::DEFAULT_MAX_DEFERRAL);
        if max_deferral < Duration::from_secs(1) || max_deferral > MAX_VISIBILITY_TIMEOUT {
            return Err(f(
                "aqw.maxDeferral",
                "must be between 00:00:01 and 7 days".into(),
            ));
        }
        let (in_progress_timeout, alert_throttled_for) = later_settings(host_file, raw_aqw)?;
        Ok(Self {
            in_progress_timeout,
            alert_throttled_for,
            lease,
            retry,
            keys_table,
            poison_table,
            control_table,
            heartbeat_table,
            poison_ttl,
            poison_format,
            alert_webhook,
            alert_window,
            http_port,
            trace_parent,
            shutdown_timeout,
            max_deferral,
        })
    }
}

/// `aqw.inProgressTimeout` (1 s to 7 days, 5 minutes unless set) and
/// `aqw.alert.throttledFor` (at least 1 s, 10 minutes unless set).
fn later_settings(host_file: &str, raw_aqw: &RawAqw) -> Result<(Duration, Duration), ConfigError> {
    let f = |field: &str, msg: &str| ConfigError::new(host_file, field, msg.to_string());
    let field = "aqw.inProgressTimeout";
    let in_progress = opt_timespan(host_file, field, &raw_aqw.in_progress_timeout)?
        .unwrap_or(aqw_core::decide::DEFAULT_IN_PROGRESS_TIMEOUT);
    if in_progress < Duration::from_secs(1) || in_progress > MAX_VISIBILITY_TIMEOUT {
        return Err(f(field, "must be between 00:00:01 and 7 days"));
    }
    let field = "aqw.alert.throttledFor";
    let raw = raw_aqw.alert.as_ref().and_then(|a| a.throttled_for.clone());
    let throttled_for = opt_timespan(host_file, field, &raw)?
        .unwrap_or(aqw_core::flow::adaptive::DEFAULT_THROTTLED_FOR);
    if throttled_for < Duration::from_secs(1) {
        return Err(f(field, "must be at least 00:00:01"));
    }
    Ok((in_progress, throttled_for))
}

/// `aqw.tables`: the keys and poison table names, valid and distinct.
fn tables(host_file: &str, raw_aqw: &RawAqw) -> Result<(String, String), ConfigError> {
    let f = |field: &str, msg: String| ConfigError::new(host_file, field, msg);
    let keys_table = raw_aqw
        .tables
        .keys
        .clone()
        .unwrap_or_else(|| "aqwkeys".into());
    validate_table_name(&keys_table).map_err(|m| f("aqw.tables.keys", m.to_string()))?;
    let poison_table = raw_aqw
        .tables
        .poison
        .clone()
        .unwrap_or_else(|| "aqwpoison".into());
    validate_table_name(&poison_table).map_err(|m| f("aqw.tables.poison", m.to_string()))?;
    if keys_table.eq_ignore_ascii_case(&poison_table) {
        return Err(f("aqw.tables", "keys and poison tables must differ".into()));
    }
    Ok((keys_table, poison_table))
}

/// `aqw.tables.control`: the pause and breaker rows (`aqwcontrol`), a
/// table of its own so no key or poison query ever meets them.
fn control_table(
    host_file: &str,
    raw_aqw: &RawAqw,
    others: [&String; 2],
) -> Result<String, ConfigError> {
    let name = raw_aqw
        .tables
        .control
        .clone()
        .unwrap_or_else(|| "aqwcontrol".into());
    let f = |msg: String| ConfigError::new(host_file, "aqw.tables.control", msg);
    validate_table_name(&name).map_err(|m| f(m.to_string()))?;
    if others.iter().any(|o| o.eq_ignore_ascii_case(&name)) {
        return Err(f("must differ from the keys and poison tables".into()));
    }
    Ok(name)
}

/// `aqw.tables.heartbeats`: a valid name, distinct from the other two.
fn heartbeat_table(
    host_file: &str,
    raw_aqw: &RawAqw,
    others: [&str; 2],
) -> Result<String, ConfigError> {
    let f = |msg: String| ConfigError::new(host_file, "aqw.tables.heartbeats", msg);
    let name = raw_aqw
        .tables
        .heartbeats
        .clone()
        .unwrap_or_else(|| "aqwheartbeats".into());
    validate_table_name(&name).map_err(|m| f(m.to_string()))?;
    if others.iter().any(|o| o.eq_ignore_ascii_case(&name)) {
        return Err(f("must differ from the keys and poison tables".into()));
    }
    Ok(name)
}

/// `aqw.poison.ttl`: `"never"` (the default) or at least a second.
fn poison_ttl(host_file: &str, raw_aqw: &RawAqw) -> Result<Option<Duration>, ConfigError> {
    match raw_aqw.poison.as_ref().and_then(|p| p.ttl.as_deref()) {
        None | Some("never") => Ok(None),
        Some(s) => {
            let d = timespan(host_file, "aqw.poison.ttl", s)?;
            if d < Duration::from_secs(1) {
                return Err(ConfigError::new(
                    host_file,
                    "aqw.poison.ttl",
                    "must be at least 1 second, or \"never\"",
                ));
            }
            Ok(Some(d))
        }
    }
}

/// `aqw.alert`: the webhook, if any, and the grouping window (5 minutes).
fn alert(host_file: &str, raw_aqw: &RawAqw) -> Result<(Option<url::Url>, Duration), ConfigError> {
    let default_window = Duration::from_secs(300);
    let Some(a) = &raw_aqw.alert else {
        return Ok((None, default_window));
    };
    let url = match &a.webhook {
        None => None,
        Some(u) => Some(
            parse_http_url(u).map_err(|m| ConfigError::new(host_file, "aqw.alert.webhook", m))?,
        ),
    };
    let window = opt_timespan(host_file, "aqw.alert.window", &a.window)?.unwrap_or(default_window);
    Ok((url, window))
}

/// `aqw.http.metricsInterval`: how often the health gauges (queue depth,
/// oldest message, open poison records) are refreshed; 1 minute by default
/// (each refresh is one peek, 2 metadata calls and one narrow table query per
/// function), at least 1 second.
pub(super) fn metrics_interval(host_file: &str, raw_aqw: &RawAqw) -> Result<Duration, ConfigError> {
    let field = "aqw.http.metricsInterval";
    let raw = raw_aqw
        .http
        .as_ref()
        .and_then(|h| h.metrics_interval.clone());
    let interval = opt_timespan(host_file, field, &raw)?.unwrap_or(Duration::from_secs(60));
    if interval < Duration::from_secs(1) {
        return Err(ConfigError::new(
            host_file,
            field,
            "must be at least 00:00:01",
        ));
    }
    Ok(interval)
}

/// `aqw.tracing.parent`: a JSON pointer, if set.
fn trace_parent(host_file: &str, raw_aqw: &RawAqw) -> Result<Option<String>, ConfigError> {
    let trace_parent = raw_aqw.tracing.as_ref().and_then(|t| t.parent.clone());
    if let Some(p) = &trace_parent {
        if !p.starts_with('/') {
            return Err(ConfigError::new(
                host_file,
                "aqw.tracing.parent",
                format!("must be a JSON pointer starting with '/' (for example \"/traceparent\"), got {p:?}"),
            ));
        }
    }
    Ok(trace_parent)
}

/// `aqw.retry`: a strategy name, or an object with its delays.
fn retry_setting(
    host_file: &str,
    raw_aqw: &RawAqw,
    visibility_timeout: Duration,
) -> Result<RetryStrategy, ConfigError> {
    let retry = retry_at(
        host_file,
        "aqw.retry",
        raw_aqw.retry.as_ref(),
        visibility_timeout,
    )?;
    Ok(retry.unwrap_or(RetryStrategy::Exponential {
        initial_delay: Duration::from_secs(1),
        max_delay: Duration::from_secs(300),
    }))
}

/// A retry setting at `at` (`aqw.retry`, `aqw.functions.<Name>.retry`):
/// `None` when absent.
pub(super) fn retry_at(
    host_file: &str,
    at: &str,
    raw: Option<&RawRetry>,
    visibility_timeout: Duration,
) -> Result<Option<RetryStrategy>, ConfigError> {
    let host_file = host_file.to_string();
    let strategy = match raw {
        None => return Ok(None),
        Some(RawRetry::Name(name)) => {
            retry_strategy(&host_file, at, name, (None, None), visibility_timeout)?
        }
        Some(RawRetry::Full(o)) => {
            let initial =
                opt_timespan(&host_file, &format!("{at}.initialDelay"), &o.initial_delay)?;
            let max = opt_timespan(&host_file, &format!("{at}.maxDelay"), &o.max_delay)?;
            retry_strategy(
                &host_file,
                at,
                &o.strategy,
                (initial, max),
                visibility_timeout,
            )?
        }
    };
    Ok(Some(strategy))
}

fn retry_strategy(
    file: &str,
    at: &str,
    name: &str,
    (initial, max): (Option<Duration>, Option<Duration>),
    visibility_timeout: Duration,
) -> Result<RetryStrategy, ConfigError> {
    match name {
        "exponential" => {
            let initial_delay = initial.unwrap_or(Duration::from_secs(1));
            let max_delay = max.unwrap_or(Duration::from_secs(300));
            if initial_delay > max_delay {
                return Err(ConfigError::new(
                    file,
                    format!("{at}.initialDelay"),
                    "must not exceed maxDelay",
                ));
            }
            if max_delay > MAX_VISIBILITY_TIMEOUT {
                return Err(ConfigError::new(
                    file,
                    format!("{at}.maxDelay"),
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
            format!("{at}.strategy"),
            format!("\"{other}\" is not one of exponential, fixed"),
        )),
    }
}

pub(super) fn parse_http_url(s: &str) -> Result<url::Url, String> {
    let u = url::Url::parse(s).map_err(|e| format!("not a URL: {e}"))?;
    if u.scheme() != "http" && u.scheme() != "https" {
        return Err("must be an http or https URL".into());
    }
    Ok(u)
}

#[cfg(test)]
mod tests {
    use super::super::load_with_env;
    use aqw_core::config::validate_queue_name;
    use std::collections::BTreeMap;

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
            .to_string()
            .contains("-poison"));
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
    }
}
