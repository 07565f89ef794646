//! A duration written as a Functions timespan, `[d.]hh:mm:ss`: one leaf that
//! the configuration, the schedules and the operator's commands all print
//! with (it imports nothing of the engine, so none of them imports another
//! to reach it).

use std::time::Duration;

/// A duration as a Functions timespan, `[d.]hh:mm:ss` (whole seconds).
pub(crate) fn fmt_span(d: Duration) -> String {
    let s = d.as_secs();
    let (days, h, m, sec) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    if days > 0 {
        format!("{days}.{h:02}:{m:02}:{sec:02}")
    } else {
        format!("{h:02}:{m:02}:{sec:02}")
    }
}

#[cfg(test)]
mod tests {
    use super::fmt_span;
    use std::time::Duration;

    #[test]
    fn spans_under_a_day_and_over() {
        assert_eq!(fmt_span(Duration::from_secs(59)), "00:00:59");
        assert_eq!(fmt_span(Duration::from_secs(3 * 3600 + 61)), "03:01:01");
        assert_eq!(fmt_span(Duration::from_secs(86_400 + 2)), "1.00:00:02");
    }
}
