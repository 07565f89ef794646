//! The queue settings one function may set for itself
//! (`aqw.functions.<Name>.maxDequeueCount`, `.visibilityTimeout`,
//! `.batchSize`, `.retry`), resolved against the app's `extensions.queues`
//! and `aqw.retry`; host.json's `concurrency.dynamicConcurrencyEnabled`;
//! and what `aqw serve` refuses or reports about them, since the Functions
//! host, not aqw, receives the messages there.

use super::raw::{RawAqw, RawFunction};
use super::timespan::opt_timespan;
use super::validate::{retry_at, QueueSettings};
use super::{AppConfig, ConfigError, FunctionConfig, KeySpec, RetryStrategy};
use aqw_core::config::QueueOverrides;
use aqw_core::storage::MAX_VISIBILITY_TIMEOUT;
use serde_json::Value;

/// Resolve each function's overrides (`functions` built from `raw`).
pub(super) fn apply_overrides(
    host_file: &str,
    raw: &RawAqw,
    q: &QueueSettings,
    app_retry: RetryStrategy,
    functions: &mut [FunctionConfig],
) -> Result<(), ConfigError> {
    for f in functions.iter_mut() {
        if let Some(raw_f) = raw.functions.get(&f.name) {
            f.overrides = overrides(host_file, &f.name, raw_f, q, app_retry)?;
        }
    }
    Ok(())
}

fn overrides(
    host_file: &str,
    name: &str,
    raw: &RawFunction,
    q: &QueueSettings,
    app_retry: RetryStrategy,
) -> Result<QueueOverrides, ConfigError> {
    let at = |s: &str| format!("aqw.functions.{name}.{s}");
    let count = |field: &str, n: Option<i64>, max: i64| match n {
        None => Ok(None),
        Some(n) if (1..=max).contains(&n) => Ok(Some(n as u32)),
        Some(n) => Err(ConfigError::new(
            host_file,
            at(field),
            format!("{n} is out of range (1..={max})"),
        )),
    };
    let max_dequeue_count = count("maxDequeueCount", raw.max_dequeue_count, 1000)?;
    let batch_size = count("batchSize", raw.batch_size, 32)?;
    let vt_field = at("visibilityTimeout");
    let visibility_timeout = opt_timespan(host_file, &vt_field, &raw.visibility_timeout)?;
    if visibility_timeout.is_some_and(|v| v > MAX_VISIBILITY_TIMEOUT) {
        return Err(ConfigError::new(
            host_file,
            vt_field,
            "must be at most 7 days",
        ));
    }
    let vt = visibility_timeout.unwrap_or(q.visibility_timeout);
    let retry = match retry_at(host_file, &at("retry"), raw.retry.as_ref(), vt)? {
        Some(r) => Some(r),
        // Its own visibilityTimeout is the delay of the app's fixed retry.
        None => match (app_retry, visibility_timeout) {
            (RetryStrategy::Fixed { .. }, Some(delay)) => Some(RetryStrategy::Fixed { delay }),
            _ => None,
        },
    };
    Ok(QueueOverrides {
        max_dequeue_count,
        visibility_timeout,
        batch_size,
        retry,
    })
}

/// `concurrency.dynamicConcurrencyEnabled`: a boolean, off when absent.
pub(super) fn dynamic_concurrency(
    host_file: &str,
    raw: Option<&Value>,
) -> Result<bool, ConfigError> {
    match raw {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(ConfigError::new(
            host_file,
            "concurrency.dynamicConcurrencyEnabled",
            format!("must be true or false, not {other}"),
        )),
    }
}

/// What `aqw run` says at start-up about settings it does not apply.
pub fn run_notes(app: &AppConfig) -> Vec<String> {
    let mut notes = vec![];
    if app.dynamic_concurrency {
        notes.push(format!(
            "concurrency.dynamicConcurrencyEnabled is true, which aqw run does not support: it \
             keeps a fixed concurrency per function (batchSize {} + newBatchThreshold {}, or \
             aqw.functions.<Name>.batchSize); the Functions host applies it under aqw serve",
            app.batch_size, app.new_batch_threshold
        ));
    }
    notes
}

/// Settings `aqw serve` cannot honour and refuses (exit 2): a function's
/// `maxDequeueCount` above `extensions.queues.maxDequeueCount`, since the
/// host poisons any message it is answered a non-2xx for at its own count
/// (`QueueProcessor.CompleteProcessingMessageAsync`), whatever aqw's cap.
pub fn serve_refusals(app: &AppConfig) -> Result<(), String> {
    for f in &app.functions {
        match f.overrides.max_dequeue_count {
            Some(n) if n > app.max_dequeue_count => {
                return Err(format!(
                    "host.json: aqw.functions.{}.maxDequeueCount: {n} is above \
                     extensions.queues.maxDequeueCount ({}), which the Functions host applies to \
                     every function: under aqw serve it would poison this function's messages at \
                     {} on any non-2xx answer. Lower it, or raise extensions.queues.maxDequeueCount",
                    f.name, app.max_dequeue_count, app.max_dequeue_count
                ))
            }
            _ => {}
        }
    }
    Ok(())
}

/// What `aqw serve` says at start-up about per-function settings the host
/// applies in its place.
pub fn serve_notes(app: &AppConfig) -> Vec<String> {
    let mut notes = vec![];
    for f in &app.functions {
        let name = &f.name;
        if let Some(b) = f.overrides.batch_size {
            notes.push(format!(
                "aqw.functions.{name}.batchSize ({b}) applies to aqw run only: under aqw serve \
                 the Functions host receives the messages, with extensions.queues.batchSize ({}) \
                 for every function",
                app.batch_size
            ));
        }
        let keyless = matches!(f.key, KeySpec::None);
        if keyless && (f.overrides.retry.is_some() || f.overrides.visibility_timeout.is_some()) {
            notes.push(format!(
                "aqw.functions.{name}.retry / visibilityTimeout do not apply under aqw serve to \
                 this keyless function (key: none): with no key to count its attempts on, its \
                 failures are left to the host, which retries after extensions.queues.visibilityTimeout"
            ));
        }
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::super::load_with_env;
    use super::super::test_support::{env_of, write};
    use std::time::Duration;

    /// Two functions, one with its own queue settings: they reach the
    /// engine's policy and batch where `aqw run` reads them.
    #[test]
    fn overrides_reach_the_policy_and_the_batch() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let host = r#"{"version":"2.0",
            "extensions": {"queues": {"maxDequeueCount": 5, "batchSize": 16, "visibilityTimeout": "00:00:07"}},
            "aqw": {"retry": "fixed", "functions": {
                "Own": {"queue": "own", "key": "none", "maxDequeueCount": 2, "batchSize": 4, "visibilityTimeout": "00:00:30"},
                "Expo": {"queue": "expo", "key": "none", "retry": {"strategy": "exponential", "initialDelay": "00:00:02", "maxDelay": "00:01:00"}},
                "App": {"queue": "app", "key": "none"}}}}"#;
        write(d, "host.json", host);
        let env = env_of(&[("AzureWebJobsStorage", "UseDevelopmentStorage=true")]);
        let app = load_with_env(d, &env).unwrap();
        let f = |n: &str| app.function(n).unwrap();
        let own = app.policy_for(f("Own"));
        assert_eq!(own.max_dequeue_count, 2);
        let fixed = |s| super::RetryStrategy::Fixed {
            delay: Duration::from_secs(s),
        };
        assert_eq!(
            own.retry,
            fixed(30),
            "its visibilityTimeout is its fixed delay"
        );
        assert_eq!(app.batch_for(f("Own")).0, 4);
        let expo = app.policy_for(f("Expo"));
        assert_eq!(expo.max_dequeue_count, 5);
        assert!(matches!(
            expo.retry,
            super::RetryStrategy::Exponential { .. }
        ));
        let plain = app.policy_for(f("App"));
        assert_eq!((plain.max_dequeue_count, plain.retry), (5, fixed(7)));
        assert_eq!(
            app.batch_for(f("App")),
            (app.batch_size, app.new_batch_threshold)
        );
        assert!(!app.dynamic_concurrency);
        assert!(
            super::serve_refusals(&app).is_ok(),
            "2 is below the host's 5"
        );
        let notes = super::serve_notes(&app).join("\n");
        assert!(notes.contains("aqw.functions.Own.batchSize"), "{notes}");
    }
}
