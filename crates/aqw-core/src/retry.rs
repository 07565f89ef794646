//! Retry and polling delays as small pure values.

use std::time::Duration;

/// Retry strategy between failed attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryStrategy {
    /// Exponential backoff with jitter, from `initial_delay` capped at `max_delay`.
    Exponential {
        /// The delay after the first failure.
        initial_delay: Duration,
        /// The longest delay.
        max_delay: Duration,
    },
    /// Functions' behaviour: always `visibilityTimeout`.
    Fixed {
        /// The delay after every failure.
        delay: Duration,
    },
}

/// No retry or deferral hides a message for longer than the service's
/// longest visibility timeout (7 days, named once in `storage`).
pub use crate::storage::MAX_VISIBILITY_TIMEOUT as MAX_RETRY_DELAY;

/// Delay before attempt `failed_attempts + 1` after `failed_attempts` failures.
///
/// Exponential: `initial · 2^(n−1)` with ±20 % jitter, capped at `max`. The
/// jitter band never overlaps the next step's, so delays strictly grow until
/// the cap. `jitter` is a number in [0, 1) (random in production, fixed in tests).
pub(crate) fn retry_delay(strategy: &RetryStrategy, failed_attempts: u32, jitter: f64) -> Duration {
    match *strategy {
        RetryStrategy::Fixed { delay } => delay.min(MAX_RETRY_DELAY),
        RetryStrategy::Exponential {
            initial_delay,
            max_delay,
        } => {
            let exp = failed_attempts.saturating_sub(1).min(30);
            let base = initial_delay.as_secs_f64() * 2f64.powi(exp as i32);
            let factor = 0.8 + 0.4 * jitter.clamp(0.0, 1.0);
            let secs = (base * factor).min(max_delay.as_secs_f64());
            Duration::from_secs_f64(secs).min(MAX_RETRY_DELAY)
        }
    }
}

/// The Functions queue listener's delay after `empty_polls` empty polls in a row:
/// 100 ms + random(0.8–1.2) · 2^(n−1) · 100 ms, capped at `max_polling_interval`.
pub fn polling_delay(empty_polls: u32, max_polling_interval: Duration, jitter: f64) -> Duration {
    if empty_polls == 0 {
        return Duration::ZERO;
    }
    let exp = (empty_polls - 1).min(30);
    let factor = 0.8 + 0.4 * jitter.clamp(0.0, 1.0);
    let ms = 100.0 + factor * 2f64.powi(exp as i32) * 100.0;
    Duration::from_secs_f64(ms / 1000.0).min(max_polling_interval)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXP: RetryStrategy = RetryStrategy::Exponential {
        initial_delay: Duration::from_secs(1),
        max_delay: Duration::from_secs(300),
    };

    #[test]
    fn exponential_grows_per_attempt_whatever_the_jitter() {
        for attempt in 1..8 {
            let hi = retry_delay(&EXP, attempt, 0.999);
            let lo_next = retry_delay(&EXP, attempt + 1, 0.0);
            assert!(lo_next > hi, "attempt {attempt}: {lo_next:?} !> {hi:?}");
        }
        assert_eq!(retry_delay(&EXP, 1, 0.5), Duration::from_secs(1));
        assert_eq!(retry_delay(&EXP, 3, 0.5), Duration::from_secs(4));
    }

    #[test]
    fn exponential_is_capped() {
        assert_eq!(retry_delay(&EXP, 20, 0.99), Duration::from_secs(300));
        assert_eq!(retry_delay(&EXP, u32::MAX, 0.99), Duration::from_secs(300));
    }

    #[test]
    fn jitter_stays_within_twenty_percent() {
        let lo = retry_delay(&EXP, 4, 0.0).as_secs_f64();
        let hi = retry_delay(&EXP, 4, 1.0).as_secs_f64();
        assert!(
            (lo - 6.4).abs() < 1e-9 && (hi - 9.6).abs() < 1e-9,
            "{lo} {hi}"
        );
    }

    #[test]
    fn fixed_is_fixed() {
        let f = RetryStrategy::Fixed {
            delay: Duration::from_secs(7),
        };
        assert_eq!(retry_delay(&f, 1, 0.3), retry_delay(&f, 9, 0.9));
    }

    #[test]
    fn polling_backs_off_to_the_cap() {
        let max = Duration::from_secs(60);
        assert_eq!(polling_delay(0, max, 0.5), Duration::ZERO);
        assert_eq!(polling_delay(1, max, 0.5), Duration::from_millis(200));
        assert!(polling_delay(5, max, 0.5) > polling_delay(4, max, 0.5));
        assert_eq!(polling_delay(40, max, 0.5), max);
        assert_eq!(
            polling_delay(40, Duration::from_secs(2), 0.0),
            Duration::from_secs(2)
        );
    }
}
