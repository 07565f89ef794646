//! How long a provider asks aqw to wait, read from its answer's headers,
//! first found wins:
//!
//! 1. `Retry-After` (RFC 9110 §10.2.3): delay-seconds or an HTTP-date;
//! 2. the IETF RateLimit fields (draft-ietf-httpapi-ratelimit-headers):
//!    the current drafts' structured field `RateLimit: "default";r=0;t=10`
//!    (`r` the quota units remaining, `t` the seconds until the quota
//!    resets; draft -08 §4 onwards, next to `RateLimit-Policy:
//!    "default";q=100;w=60`, which states the quota and is not a delay),
//!    and the older drafts' (-00 to -07) separate fields
//!    `RateLimit-Remaining: 0` / `RateLimit-Reset: 10` (delta-seconds);
//! 3. the widespread `X-RateLimit-Reset` with `X-RateLimit-Remaining: 0`
//!    (GitHub, Twitter/X and many gateways). Its value is either seconds
//!    from now or a Unix epoch timestamp (GitHub's): told apart by
//!    magnitude. A value above [`EPOCH_FLOOR`] (10⁹, September 2001) is a
//!    timestamp, anything smaller a delta: no delay worth honouring is 31
//!    years long, and no epoch timestamp in use is that small.
//!
//! A RateLimit reset counts only when the quota is spent (`r=0`, or
//! remaining 0): a 429 with quota left names no wait of its own.
//!
//! Everything is input from outside: a header longer than
//! [`MAX_HEADER_LEN`] is ignored, numbers are parsed as unsigned integers
//! (a fraction, a sign or garbage is no delay), and every delay is clamped
//! to [`MAX_DELAY`]; nothing here panics.

use http::HeaderMap;
use std::time::Duration;
use time::OffsetDateTime;

/// A header value longer than this is not read (a structured field with a
/// handful of parameters fits in far less).
pub const MAX_HEADER_LEN: usize = 256;

/// The longest delay a header can ask for: the engine bounds a wait by
/// `aqw.maxDeferral` (at most 7 days) too; this keeps arithmetic finite.
pub const MAX_DELAY: Duration = Duration::from_secs(7 * 24 * 3600);

/// `X-RateLimit-Reset` values above this are Unix epoch seconds, below it
/// seconds from now.
pub const EPOCH_FLOOR: u64 = 1_000_000_000;

/// The delay the provider asked for, by the first of the headers above
/// that names one; `now` is the current time (a parameter for tests).
pub fn provider_delay(headers: &HeaderMap, now: OffsetDateTime) -> Option<Duration> {
    let get = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .filter(|v| v.len() <= MAX_HEADER_LEN)
    };
    if let Some(d) = get("retry-after").and_then(|v| parse_retry_after_at(v, now)) {
        return Some(d);
    }
    if let Some(d) = get("ratelimit").and_then(parse_ratelimit_field) {
        return Some(d);
    }
    let spent = |name: &str| get(name).and_then(uint) == Some(0);
    if spent("ratelimit-remaining") {
        if let Some(secs) = get("ratelimit-reset").and_then(uint) {
            return Some(clamp_secs(secs));
        }
    }
    if spent("x-ratelimit-remaining") {
        if let Some(v) = get("x-ratelimit-reset").and_then(uint) {
            return Some(x_reset(v, now));
        }
    }
    None
}

/// `Retry-After` at `now`: delay-seconds or an HTTP-date (a date in the
/// past is no wait).
pub fn parse_retry_after_at(value: &str, now: OffsetDateTime) -> Option<Duration> {
    let v = value.trim();
    if v.len() > MAX_HEADER_LEN {
        return None;
    }
    if let Some(secs) = uint(v) {
        return Some(clamp_secs(secs));
    }
    let when = OffsetDateTime::parse(v, &time::format_description::well_known::Rfc2822).ok()?;
    Some(until(when, now))
}

/// The current draft's `RateLimit` field: a list of quota items, each a
/// string or token with parameters; the delay is the largest `t` among
/// items whose `r` is 0 (every spent quota must reset before a call
/// passes).
fn parse_ratelimit_field(value: &str) -> Option<Duration> {
    value
        .split(',')
        .filter_map(|item| {
            let mut remaining = None;
            let mut reset = None;
            // The first member is the policy's name; parameters follow `;`.
            for param in item.split(';').skip(1) {
                let (k, v) = param.split_once('=')?;
                match k.trim() {
                    "r" => remaining = uint(v),
                    "t" => reset = uint(v),
                    _ => {}
                }
            }
            (remaining == Some(0)).then_some(reset).flatten()
        })
        .max()
        .map(clamp_secs)
}

/// `X-RateLimit-Reset`: a Unix timestamp when large, else seconds.
fn x_reset(v: u64, now: OffsetDateTime) -> Duration {
    if v > EPOCH_FLOOR {
        let Ok(secs) = i64::try_from(v) else {
            return MAX_DELAY;
        };
        match OffsetDateTime::from_unix_timestamp(secs) {
            Ok(when) => until(when, now),
            Err(_) => MAX_DELAY,
        }
    } else {
        clamp_secs(v)
    }
}

/// An unsigned decimal integer of at most 19 digits (no sign, no
/// fraction, no spaces inside).
fn uint(v: &str) -> Option<u64> {
    let v = v.trim();
    (!v.is_empty() && v.len() <= 19 && v.bytes().all(|b| b.is_ascii_digit()))
        .then(|| v.parse().ok())
        .flatten()
}

fn clamp_secs(secs: u64) -> Duration {
    Duration::from_secs(secs).min(MAX_DELAY)
}

/// From `now` to `when`, zero if past, at most [`MAX_DELAY`].
fn until(when: OffsetDateTime, now: OffsetDateTime) -> Duration {
    Duration::try_from(when - now)
        .unwrap_or(Duration::ZERO)
        .min(MAX_DELAY)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                http::HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn now() -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap()
    }

    fn delay(pairs: &[(&str, &str)]) -> Option<u64> {
        provider_delay(&headers(pairs), now()).map(|d| d.as_secs())
    }

    #[test]
    fn each_form_gives_its_delay() {
        assert_eq!(delay(&[("retry-after", "7")]), Some(7));
        assert_eq!(
            delay(&[("retry-after", "Fri, 15 Jan 2027 08:00:10 +0000")]),
            Some(10),
            "an HTTP-date 10 s after now"
        );
        assert_eq!(
            delay(&[
                ("ratelimit", r#""default";r=0;t=10"#),
                ("ratelimit-policy", r#""default";q=100;w=60"#)
            ]),
            Some(10)
        );
        assert_eq!(
            delay(&[("ratelimit", r#""burst";r=0;t=3, "day";r=0;t=40"#)]),
            Some(40),
            "every spent quota must reset"
        );
        assert_eq!(
            delay(&[("ratelimit-remaining", "0"), ("ratelimit-reset", "12")]),
            Some(12)
        );
        assert_eq!(
            delay(&[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "30")]),
            Some(30),
            "small: seconds from now"
        );
        assert_eq!(
            delay(&[
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "1800000045")
            ]),
            Some(45),
            "large: a Unix timestamp (GitHub)"
        );
        assert_eq!(
            delay(&[("retry-after", "2"), ("ratelimit", r#""d";r=0;t=10"#)]),
            Some(2),
            "Retry-After first"
        );
    }

    #[test]
    fn a_quota_not_spent_or_a_past_time_names_no_wait_beyond_now() {
        assert_eq!(delay(&[("ratelimit", r#""default";r=5;t=10"#)]), None);
        assert_eq!(
            delay(&[("ratelimit-remaining", "3"), ("ratelimit-reset", "12")]),
            None
        );
        assert_eq!(delay(&[("x-ratelimit-reset", "30")]), None, "no remaining");
        assert_eq!(
            delay(&[
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "1700000000")
            ]),
            Some(0),
            "a reset in the past: now"
        );
        assert_eq!(
            delay(&[("retry-after", "Thu, 01 Jan 1970 00:00:00 +0000")]),
            Some(0)
        );
        assert_eq!(delay(&[]), None);
    }

    #[test]
    fn hostile_values_are_no_delay_or_clamped() {
        let max = MAX_DELAY.as_secs();
        for bad in [
            "-5",
            "1.5",
            "abc",
            "",
            " ",
            "99999999999999999999999",
            "1e9",
            "0x10",
            "+3",
        ] {
            assert_eq!(delay(&[("retry-after", bad)]), None, "Retry-After {bad:?}");
            assert_eq!(
                delay(&[("ratelimit-remaining", "0"), ("ratelimit-reset", bad)]),
                None,
                "RateLimit-Reset {bad:?}"
            );
        }
        assert_eq!(delay(&[("retry-after", "18446744073709551615")]), None);
        assert_eq!(delay(&[("retry-after", "9999999999")]), Some(max));
        assert_eq!(
            delay(&[
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "9223372036854775807")
            ]),
            Some(max),
            "an epoch past the calendar"
        );
        let long = format!("{}1", "0".repeat(MAX_HEADER_LEN));
        assert_eq!(delay(&[("retry-after", &long)]), None, "too long");
        for bad in [
            r#""d";r=0;t=-1"#,
            r#""d";r=0;t"#,
            r#""d";r;t=4"#,
            ";;;,,,==",
            r#""d";r=0;t=1.5"#,
            r#"r=0;t=4"#,
        ] {
            assert_eq!(delay(&[("ratelimit", bad)]), None, "RateLimit {bad:?}");
        }
        assert_eq!(
            delay(&[("ratelimit", r#""d";r=0;t=99999999999"#)]),
            Some(max)
        );
    }
}
