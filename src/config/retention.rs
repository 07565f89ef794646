//! `aqw.retention`: how long settled keys and closed poison records are
//! kept, and the background sweep that purges them. Validated against the
//! one bound that makes a key purge safe (see [`key_retention_floor`]).

use super::raw::RawRetention;
use super::timespan::timespan;
use super::ConfigError;
use std::time::Duration;

use aqw_core::config::{
    check_key_retention, key_retention_floor, Retention, SweepSettings, DEFAULT_KEYS,
};

fn never_or_span(
    file: &str,
    field: &str,
    s: &Option<String>,
) -> Result<Option<Option<Duration>>, ConfigError> {
    match s.as_deref() {
        None => Ok(None),
        Some("never") => Ok(Some(None)),
        Some(s) => {
            let d = timespan(file, field, s)?;
            if d < Duration::from_secs(1) {
                return Err(ConfigError::new(
                    file,
                    field,
                    "must be at least 00:00:01, or \"never\"",
                ));
            }
            Ok(Some(Some(d)))
        }
    }
}

/// `aqw.retention`, defaulted and checked against [`key_retention_floor`].
pub(super) fn validate(file: &str, raw: Option<&RawRetention>) -> Result<Retention, ConfigError> {
    let mut r = Retention::default();
    let Some(raw) = raw else { return Ok(r) };
    let f = |field: &str, msg: String| ConfigError::new(file, field, msg);
    if let Some(ttl) = never_or_span(
        file,
        "aqw.retention.sourceMessageTtl",
        &raw.source_message_ttl,
    )? {
        r.source_message_ttl = ttl;
    }
    let floor = key_retention_floor(r.source_message_ttl);
    r.keys = match never_or_span(file, "aqw.retention.keys", &raw.keys)? {
        Some(k) => k,
        // Messages that never expire: no key may ever be purged.
        None if floor.is_none() => None,
        None => Some(DEFAULT_KEYS.max(floor.unwrap_or_default())),
    };
    let unsafe_short = raw.unsafe_short_retention.unwrap_or(false);
    r.unsafe_short = unsafe_short;
    if let (Some(k), false) = (r.keys, unsafe_short) {
        check_key_retention(k, r.source_message_ttl)
            .map_err(|m| f("aqw.retention.keys", m.to_string()))?;
    }
    if let Some(c) = never_or_span(file, "aqw.retention.closedRecords", &raw.closed_records)? {
        r.closed_records = c;
    }
    if let Some(s) = &raw.sweep {
        sweep(file, s, &mut r.sweep)?;
    }
    Ok(r)
}

fn sweep(file: &str, raw: &super::raw::RawSweep, s: &mut SweepSettings) -> Result<(), ConfigError> {
    let f = |field: &str, msg: &str| ConfigError::new(file, field, msg);
    s.enabled = raw.enabled.unwrap_or(s.enabled);
    if let Some(rate) = raw.requests_per_second {
        if !(rate.is_finite() && (0.1..=100.0).contains(&rate)) {
            return Err(f(
                "aqw.retention.sweep.requestsPerSecond",
                "must be between 0.1 and 100",
            ));
        }
        s.requests_per_second = rate;
    }
    if let Some(i) = &raw.interval {
        s.interval = timespan(file, "aqw.retention.sweep.interval", i)?;
        if s.interval < Duration::from_secs(1) {
            return Err(f(
                "aqw.retention.sweep.interval",
                "must be at least 00:00:01",
            ));
        }
    }
    if let Some(l) = &raw.lease {
        s.lease = timespan(file, "aqw.retention.sweep.lease", l)?;
        if s.lease < Duration::from_secs(2) || s.lease > Duration::from_secs(3600) {
            return Err(f(
                "aqw.retention.sweep.lease",
                "must be between 00:00:02 and 01:00:00",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::raw::RawSweep;

    fn raw(keys: Option<&str>, ttl: Option<&str>) -> RawRetention {
        RawRetention {
            source_message_ttl: ttl.map(str::to_string),
            keys: keys.map(str::to_string),
            closed_records: None,
            sweep: None,
            unsafe_short_retention: None,
        }
    }

    #[test]
    fn the_defaults_keep_keys_past_the_safety_floor() {
        let r = validate("host.json", None).unwrap();
        assert_eq!(r, Retention::default());
        let floor = key_retention_floor(r.source_message_ttl).unwrap();
        assert_eq!(floor, Duration::from_secs(14 * 86_400));
        assert!(r.keys.unwrap() >= floor);
    }

    #[test]
    fn a_keys_retention_below_ttl_plus_visibility_names_both_numbers() {
        let e = validate("host.json", Some(&raw(Some("10.00:00:00"), None))).unwrap_err();
        assert_eq!(e.field, "aqw.retention.keys");
        assert!(
            e.message.contains("7.00 days") && e.message.contains("14.00 days"),
            "{}",
            e.message
        );
        let ok = validate(
            "host.json",
            Some(&raw(Some("3.00:00:00"), Some("1.00:00:00"))),
        );
        assert!(ok.unwrap_err().message.contains("8.00 days"));
        assert!(validate(
            "host.json",
            Some(&raw(Some("8.00:00:00"), Some("1.00:00:00")))
        )
        .is_ok());
    }

    #[test]
    fn messages_that_never_expire_mean_keys_are_never_purged() {
        let r = validate("host.json", Some(&raw(None, Some("never")))).unwrap();
        assert_eq!((r.source_message_ttl, r.keys), (None, None));
        let e = validate("host.json", Some(&raw(Some("30.00:00:00"), Some("never")))).unwrap_err();
        assert_eq!(e.field, "aqw.retention.keys");
    }

    #[test]
    fn short_values_need_the_unsafe_override_and_bad_sweeps_are_named() {
        let mut r = raw(Some("00:00:02"), None);
        assert!(validate("host.json", Some(&r)).is_err());
        r.unsafe_short_retention = Some(true);
        assert_eq!(
            validate("host.json", Some(&r)).unwrap().keys,
            Some(Duration::from_secs(2))
        );
        r.sweep = Some(RawSweep {
            requests_per_second: Some(0.0),
            ..Default::default()
        });
        let e = validate("host.json", Some(&r)).unwrap_err();
        assert_eq!(e.field, "aqw.retention.sweep.requestsPerSecond");
        let e = validate("host.json", Some(&raw(Some("soon"), None))).unwrap_err();
        assert_eq!(e.field, "aqw.retention.keys");
    }
}
