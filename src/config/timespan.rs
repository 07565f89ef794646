//! Functions timespans (`[d.]hh:mm:ss[.fffffff]`), as host.json writes them.

use super::ConfigError;
use std::time::Duration;

use aqw_core::config::parse_timespan;

pub(super) fn timespan(file: &str, field: &str, s: &str) -> Result<Duration, ConfigError> {
    parse_timespan(s).map_err(|m| ConfigError::new(file, field, m.to_string()))
}

pub(super) fn opt_timespan(
    file: &str,
    field: &str,
    s: &Option<String>,
) -> Result<Option<Duration>, ConfigError> {
    s.as_deref().map(|s| timespan(file, field, s)).transpose()
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

    proptest::proptest! {
        #[test]
        fn timespan_parser_never_panics(s in "\\PC{0,60}") {
            let _ = parse_timespan(&s);
        }
    }
}
