//! `aqw.functions.<Name>.limits`: fleet-wide flow limits
//! ([`aqw_core::flow`]). None by default; each value is checked where it is
//! written, so the error names that setting.

use super::raw::RawLimits;
use super::ConfigError;
use aqw_core::flow::{FlowLimits, PerKeyLimit};
use aqw_core::idempotency::KeyTemplate;

/// The most calls per second a limit may say: beyond it, one table row per
/// function would be written faster than a partition is built for.
const MAX_CALLS_PER_SECOND: f64 = 1_000.0;

/// The most calls in flight a limit may say.
const MAX_IN_FLIGHT: i64 = 10_000;

/// The limits of the function at `path` (`aqw.functions.<Name>`).
pub(super) fn limits(
    raw: Option<&RawLimits>,
    host_file: &str,
    path: &str,
) -> Result<FlowLimits, ConfigError> {
    let Some(raw) = raw else {
        return Ok(FlowLimits::default());
    };
    let err = |field: &str, msg: String| {
        ConfigError::new(host_file, format!("{path}.limits.{field}"), msg)
    };
    let calls_per_second = match raw.calls_per_second {
        None => None,
        Some(r) if (0.001..=MAX_CALLS_PER_SECOND).contains(&r) => Some(r),
        Some(_) => {
            return Err(err(
                "callsPerSecond",
                format!("must be a number from 0.001 to {MAX_CALLS_PER_SECOND}"),
            ))
        }
    };
    let in_flight = |field: &str, n: i64| {
        u32::try_from(n)
            .ok()
            .filter(|n| (1..=MAX_IN_FLIGHT as u32).contains(n))
            .ok_or_else(|| {
                err(
                    field,
                    format!("must be a whole number from 1 to {MAX_IN_FLIGHT}"),
                )
            })
    };
    let per_key = match &raw.per_key {
        None => None,
        Some(p) => Some(PerKeyLimit {
            key: KeyTemplate::parse(&p.key).map_err(|m| err("perKey.key", m.to_string()))?,
            in_flight: in_flight("perKey.inFlight", p.in_flight)?,
        }),
    };
    Ok(FlowLimits {
        calls_per_second,
        in_flight: raw
            .in_flight
            .map(|n| in_flight("inFlight", n))
            .transpose()?,
        per_key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<FlowLimits, String> {
        let raw: RawLimits = serde_json::from_str(json).map_err(|e| e.to_string())?;
        limits(Some(&raw), "host.json", "aqw.functions.Job").map_err(|e| format!("{e:#}"))
    }

    #[test]
    fn limits_are_read_and_each_bad_value_names_its_setting() {
        let l = parse(r#"{"callsPerSecond": 10, "inFlight": 4, "perKey": {"key": "{/accountId}", "inFlight": 2}}"#)
            .unwrap();
        assert_eq!(l.calls_per_second, Some(10.0));
        assert_eq!(l.in_flight, Some(4));
        assert_eq!(l.per_key.unwrap().in_flight, 2);
        for (json, setting) in [
            (
                r#"{"callsPerSecond": 0}"#,
                "aqw.functions.Job.limits.callsPerSecond",
            ),
            (
                r#"{"callsPerSecond": 1e9}"#,
                "aqw.functions.Job.limits.callsPerSecond",
            ),
            (r#"{"inFlight": 0}"#, "aqw.functions.Job.limits.inFlight"),
            (r#"{"inFlight": -3}"#, "aqw.functions.Job.limits.inFlight"),
            (
                r#"{"perKey": {"key": "acct", "inFlight": 2}}"#,
                "aqw.functions.Job.limits.perKey.key",
            ),
            (
                r#"{"perKey": {"key": "{/a}", "inFlight": 100000}}"#,
                "aqw.functions.Job.limits.perKey.inFlight",
            ),
        ] {
            let e = parse(json).unwrap_err();
            assert!(e.contains(setting), "{json}: {e}");
        }
        assert!(
            parse(r#"{"callsPerSecnd": 3}"#).is_err(),
            "unknown fields are refused"
        );
    }
}
