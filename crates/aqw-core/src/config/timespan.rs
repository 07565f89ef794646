//! Functions timespans (`[d.]hh:mm:ss[.fffffff]`), as host.json writes them.

use std::time::Duration;

/// Why a text is not a Functions timespan.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimespanError {
    /// Not `[d.]hh:mm:ss[.fffffff]`, or a field out of its range.
    #[error("\"{text}\" is not a timespan (hh:mm:ss[.fff])")]
    Malformed {
        /// The text as given.
        text: String,
    },
    /// Hours of 24 or more with no day count (.NET would read days).
    #[error(
        "\"{text}\" is not a timespan (hh:mm:ss[.fff]): hours go up to 23; write {}.{:02}:{minutes}:{seconds} for {hours} hours",
        .hours / 24,
        .hours % 24
    )]
    HoursOver23 {
        /// The text as given.
        text: String,
        /// The hours written.
        hours: u64,
        /// The minutes as written.
        minutes: String,
        /// The seconds (and fraction) as written.
        seconds: String,
    },
}

/// Parse a Functions timespan: `[d.]hh:mm:ss[.fffffff]`.
pub fn parse_timespan(s: &str) -> Result<Duration, TimespanError> {
    let bad = || TimespanError::Malformed {
        text: s.to_string(),
    };
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
    let num = |p: &str, max: u64| -> Result<u64, TimespanError> {
        if p.is_empty() || p.len() > 2 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let n: u64 = p.parse().map_err(|_| bad())?;
        if n > max {
            return Err(bad());
        }
        Ok(n)
    };
    // .NET reads "24:00:00" as 24 days; say so rather than guess either way.
    let hours = num(parts[0], 23).map_err(|e| match parts[0].parse::<u64>() {
        Ok(h) if h >= 24 && days == 0 => TimespanError::HoursOver23 {
            text: s.to_string(),
            hours: h,
            minutes: parts[1].to_string(),
            seconds: parts[2].to_string(),
        },
        _ => e,
    })?;
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
    // A day count too large for seconds in a u64 is an error, not a wrap.
    let secs = days
        .checked_mul(86_400)
        .and_then(|d| d.checked_add(hours * 3600 + minutes * 60 + seconds))
        .ok_or_else(bad)?;
    Ok(Duration::new(secs, nanos))
}

#[cfg(test)]
mod tests {
    use super::{parse_timespan, TimespanError};

    #[test]
    fn hours_past_23_name_the_day_form() {
        let e = parse_timespan("30:00:00").unwrap_err();
        assert!(matches!(e, TimespanError::HoursOver23 { hours: 30, .. }));
        assert_eq!(
            e.to_string(),
            "\"30:00:00\" is not a timespan (hh:mm:ss[.fff]): hours go up to 23; write 1.06:00:00 for 30 hours"
        );
        assert!(matches!(
            parse_timespan("1:2"),
            Err(TimespanError::Malformed { text }) if text == "1:2"
        ));
    }

    #[test]
    fn a_day_count_past_u64_seconds_is_an_error() {
        assert!(parse_timespan("99999999999999999.00:00:00").is_err());
        assert_eq!(parse_timespan("1.00:00:01").unwrap().as_secs(), 86_401);
    }
}
