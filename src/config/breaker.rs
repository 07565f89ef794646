//! `aqw.breaker` and `aqw.functions.<Name>.breaker`: on by default with the
//! settings of [`BreakerSettings::default`]; `false` (or `enabled: false`)
//! turns it off; a function's values override the app's one by one. Each
//! value is checked where it is written, so the error names that setting.

use super::raw::{RawBreaker, RawBreakerSettings};
use super::timespan::timespan;
use super::ConfigError;
use aqw_core::breaker::BreakerSettings;
use std::time::Duration;

/// The breaker of function `name`, or None when it is turned off.
pub(super) fn breaker_for(
    host_file: &str,
    app: Option<&RawBreaker>,
    function: Option<&RawBreaker>,
    name: &str,
) -> Result<Option<BreakerSettings>, ConfigError> {
    let mut settings = BreakerSettings::default();
    let mut enabled = true;
    let mut last_path = "aqw.breaker".to_string();
    let layers = [
        (app, "aqw.breaker".to_string()),
        (function, format!("aqw.functions.{name}.breaker")),
    ];
    for (raw, path) in layers {
        match raw {
            None => {}
            Some(RawBreaker::Switch(on)) => enabled = *on,
            Some(RawBreaker::Settings(raw)) => {
                apply(host_file, &path, raw, &mut settings, &mut enabled)?;
                last_path = path;
            }
        }
    }
    if settings.max_cool_down < settings.cool_down {
        return Err(ConfigError::new(
            host_file,
            format!("{last_path}.maxCoolDown"),
            "must be at least coolDown",
        ));
    }
    Ok(enabled.then_some(settings))
}

/// Lay the values `raw` sets over `settings`, each checked.
fn apply(
    host_file: &str,
    path: &str,
    raw: &RawBreakerSettings,
    settings: &mut BreakerSettings,
    enabled: &mut bool,
) -> Result<(), ConfigError> {
    let err = |field: &str, msg: &str| ConfigError::new(host_file, format!("{path}.{field}"), msg);
    if let Some(on) = raw.enabled {
        *enabled = on;
    }
    if let Some(r) = raw.failure_ratio {
        if !(r > 0.0 && r <= 1.0) {
            return Err(err(
                "failureRatio",
                "must be a number above 0 and at most 1",
            ));
        }
        settings.failure_ratio = r;
    }
    let count = |field: &str, v: Option<i64>, range: std::ops::RangeInclusive<u32>, msg: &str| {
        v.map(|n| {
            u32::try_from(n)
                .ok()
                .filter(|n| range.contains(n))
                .ok_or_else(|| err(field, msg))
        })
        .transpose()
    };
    let (min, probes, quiet) = (
        count(
            "minimumAttempts",
            raw.minimum_attempts,
            1..=100_000,
            "must be between 1 and 100000",
        )?,
        count("probes", raw.probes, 1..=32, "must be between 1 and 32")?,
        count(
            "consecutiveFailures",
            raw.consecutive_failures,
            0..=10_000,
            "must be between 0 (the quiet rule off) and 10000",
        )?,
    );
    settings.minimum_attempts = min.unwrap_or(settings.minimum_attempts);
    settings.probes = probes.unwrap_or(settings.probes);
    settings.consecutive_failures = quiet.unwrap_or(settings.consecutive_failures);
    apply_spans(host_file, path, raw, settings)
}

/// The durations of `raw` over `settings`, each between 0.1 s and a day.
fn apply_spans(
    host_file: &str,
    path: &str,
    raw: &RawBreakerSettings,
    settings: &mut BreakerSettings,
) -> Result<(), ConfigError> {
    let err = |field: &str, msg: &str| ConfigError::new(host_file, format!("{path}.{field}"), msg);
    let span = |field: &str, v: &Option<String>| -> Result<Option<Duration>, ConfigError> {
        let Some(s) = v else { return Ok(None) };
        let d = timespan(host_file, &format!("{path}.{field}"), s)?;
        if d < Duration::from_millis(100) || d > Duration::from_secs(24 * 3600) {
            return Err(err(field, "must be between 00:00:00.100 and 1.00:00:00"));
        }
        Ok(Some(d))
    };
    if let Some(d) = span("window", &raw.window)? {
        settings.window = d;
    }
    if let Some(d) = span("coolDown", &raw.cool_down)? {
        settings.cool_down = d;
    }
    if let Some(d) = span("maxCoolDown", &raw.max_cool_down)? {
        settings.max_cool_down = d;
    }
    if let Some(d) = span("quietWindow", &raw.quiet_window)? {
        settings.quiet_window = d;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(v: serde_json::Value) -> RawBreaker {
        serde_json::from_value(v).unwrap()
    }

    fn field_of(app: serde_json::Value, function: serde_json::Value) -> String {
        let (a, f) = (raw(app), raw(function));
        breaker_for("host.json", Some(&a), Some(&f), "Job")
            .unwrap_err()
            .field
    }

    #[test]
    fn on_by_default_and_off_by_false_at_either_level() {
        let d = breaker_for("h", None, None, "Job").unwrap();
        assert_eq!(d, Some(BreakerSettings::default()));
        let off = raw(serde_json::json!(false));
        assert_eq!(breaker_for("h", Some(&off), None, "Job").unwrap(), None);
        assert_eq!(breaker_for("h", None, Some(&off), "Job").unwrap(), None);
        let disabled = raw(serde_json::json!({"enabled": false}));
        assert_eq!(
            breaker_for("h", None, Some(&disabled), "Job").unwrap(),
            None
        );
        let on = raw(serde_json::json!(true));
        assert!(breaker_for("h", Some(&off), Some(&on), "Job")
            .unwrap()
            .is_some());
    }

    #[test]
    fn a_function_overrides_the_app_value_by_value() {
        let a = raw(serde_json::json!({"failureRatio": 0.5, "probes": 3}));
        let f = raw(serde_json::json!({"probes": 1, "coolDown": "00:00:01"}));
        let s = breaker_for("h", Some(&a), Some(&f), "Job")
            .unwrap()
            .unwrap();
        assert_eq!(s.failure_ratio, 0.5);
        assert_eq!(s.probes, 1);
        assert_eq!(s.cool_down, Duration::from_secs(1));
        assert_eq!(s.minimum_attempts, 20);
        let q = raw(serde_json::json!({"consecutiveFailures": 3, "quietWindow": "00:10:00"}));
        let s = breaker_for("h", Some(&q), None, "Job").unwrap().unwrap();
        assert_eq!(
            (s.consecutive_failures, s.quiet_window),
            (3, Duration::from_secs(600))
        );
        let bad = raw(serde_json::json!({"consecutiveFailures": -1}));
        assert_eq!(
            breaker_for("h", Some(&bad), None, "Job").unwrap_err().field,
            "aqw.breaker.consecutiveFailures"
        );
    }

    #[test]
    fn bad_values_name_their_setting() {
        use serde_json::json;
        let none = json!({});
        assert_eq!(
            field_of(json!({"failureRatio": 1.5}), none.clone()),
            "aqw.breaker.failureRatio"
        );
        assert_eq!(
            field_of(json!({"failureRatio": 0}), none.clone()),
            "aqw.breaker.failureRatio"
        );
        assert_eq!(
            field_of(none.clone(), json!({"minimumAttempts": 0})),
            "aqw.functions.Job.breaker.minimumAttempts"
        );
        assert_eq!(
            field_of(json!({"window": "00:00:00"}), none.clone()),
            "aqw.breaker.window"
        );
        assert_eq!(
            field_of(json!({"probes": 0}), none.clone()),
            "aqw.breaker.probes"
        );
        assert_eq!(
            field_of(none, json!({"coolDown": "00:10:00"})),
            "aqw.functions.Job.breaker.maxCoolDown"
        );
    }
}
