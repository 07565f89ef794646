//! The decision core: what happens to one message, as a pure function of
//! what is known about it. [`crate::worker::process`] gathers the facts
//! (decoding, the key, the key's record, the handler's result), asks
//! [`decide`], and carries out the [`Action`]; nothing here does I/O, so
//! every row of the message-life table is a unit test below.

use crate::message::ErrorKind;
use crate::retry::{retry_delay, RetryStrategy};
use std::time::Duration;
use time::OffsetDateTime;

/// The longest visibility delay the service accepts (7 days).
const MAX_RETRY_DELAY: Duration = Duration::from_secs(7 * 24 * 3600);

/// Everything about attempts and retries that config decides, in one value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    /// `extensions.queues.maxDequeueCount`.
    pub max_dequeue_count: u32,
    pub retry: RetryStrategy,
    /// Message visibility and key lease while a handler runs.
    pub lease: Duration,
    /// `functionTimeout`.
    pub timeout: Option<Duration>,
    /// A failed last attempt is poisoned by someone else, with no error (the
    /// Functions host in `aqw serve`): at the cap a deferral becomes a record.
    pub host_poisons_failed_last_attempt: bool,
}

impl Policy {
    pub fn from_config(app: &crate::config::AppConfig) -> Self {
        Self {
            max_dequeue_count: app.max_dequeue_count,
            retry: app.retry,
            lease: app.lease,
            timeout: app.function_timeout,
            host_poisons_failed_last_attempt: false,
        }
    }
}

/// What is known of the message before anything runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Facts<'a> {
    pub dequeue_count: u32,
    /// Why the text could not be decoded (base64, UTF-8), if it could not.
    pub decode_error: Option<&'a str>,
    /// Why no key could be derived (not JSON, a missing field), if so.
    pub key_error: Option<&'a str>,
}

/// What the key's record says, as far as it has been looked at.
#[derive(Debug, Clone, PartialEq)]
pub enum KeyState<'a> {
    /// The job has no key (`key: none`, or none could be derived).
    Keyless,
    /// Keyed, not claimed yet.
    Unclaimed,
    /// This attempt holds the key's lease.
    Claimed,
    /// Done, or closed by an operator: nothing may run again.
    Settled,
    /// Another attempt holds a live lease until then.
    Held { until: OffsetDateTime },
    /// Read over the cap: a record that is neither settled nor held.
    Free { last_error: Option<&'a str> },
}

/// How the handler's attempt ended.
#[derive(Debug, Clone, PartialEq)]
pub enum AttemptResult<'a> {
    NotRun,
    Succeeded,
    /// Shutdown stopped it mid-way.
    Interrupted,
    Failed {
        kind: ErrorKind,
        message: &'a str,
        retry_after: Option<Duration>,
        /// The effect may have happened anyway.
        uncertain: bool,
    },
}

/// What to do next.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Claim the key, then decide again.
    Claim,
    /// Run the handler (key claimed, or keyless).
    Run,
    /// Mark the key done, delete the message.
    Complete,
    /// The key is settled: delete the message without running.
    Duplicate,
    /// Another attempt holds the key: look again after `until`.
    Defer { until: OffsetDateTime },
    /// Note the failure on the key; make the message visible again after `after`.
    Retry {
        after: Duration,
        reason: String,
        uncertain: bool,
    },
    /// Make the message visible again at once (shutdown).
    Release,
    /// Copy to `<queue>-poison` with this error and a record, then delete.
    Poison {
        kind: ErrorKind,
        reason: String,
        uncertain: bool,
    },
}

/// The fate of one message at one stage. `jitter` in [0, 1) spreads retry
/// delays (random in production, fixed in tests).
pub fn decide(
    facts: &Facts,
    key: &KeyState,
    attempt: &AttemptResult,
    policy: &Policy,
    jitter: f64,
) -> Action {
    let (dc, max) = (facts.dequeue_count, policy.max_dequeue_count);
    match attempt {
        AttemptResult::NotRun => before_running(facts, key, policy),
        AttemptResult::Succeeded => Action::Complete,
        AttemptResult::Interrupted => Action::Release,
        AttemptResult::Failed {
            kind,
            message,
            retry_after,
            uncertain,
        } => {
            if *kind != ErrorKind::Permanent && dc < max {
                let after = retry_after
                    .unwrap_or_else(|| retry_delay(&policy.retry, dc, jitter))
                    .min(MAX_RETRY_DELAY);
                Action::Retry {
                    after,
                    reason: message.to_string(),
                    uncertain: *uncertain,
                }
            } else {
                Action::Poison {
                    kind: *kind,
                    reason: message.to_string(),
                    uncertain: *uncertain,
                }
            }
        }
    }
}

fn before_running(facts: &Facts, key: &KeyState, policy: &Policy) -> Action {
    let (dc, max) = (facts.dequeue_count, policy.max_dequeue_count);
    if dc > max {
        // Attempts spent waiting on another holder of the key are not
        // failures: a settled key makes this a duplicate, a live lease a
        // deferral, whatever the dequeue count says.
        return match key {
            KeyState::Settled => Action::Duplicate,
            KeyState::Held { until } => Action::Defer { until: *until },
            KeyState::Free {
                last_error: Some(e),
            } => over_the_cap(dc, max, Some(e)),
            _ => over_the_cap(dc, max, None),
        };
    }
    if let Some(e) = facts.decode_error {
        return poison(ErrorKind::Decode, e);
    }
    if let Some(e) = facts.key_error {
        return poison(ErrorKind::Permanent, e);
    }
    match key {
        KeyState::Unclaimed => Action::Claim,
        KeyState::Keyless | KeyState::Claimed => Action::Run,
        KeyState::Settled => Action::Duplicate,
        // The host would poison this message on a non-2xx, with no error and
        // no record. Keep it as a record instead: a replay is a duplicate if
        // the holder finishes, and runs otherwise.
        KeyState::Held { until } if dc >= max && policy.host_poisons_failed_last_attempt => poison(
            ErrorKind::Retryable,
            &format!(
                "key held by another attempt (lease until {until}) at the last attempt \
                     (maxDequeueCount {max}); the Functions host would poison it without an error"
            ),
        ),
        KeyState::Held { until } => Action::Defer { until: *until },
        KeyState::Free { .. } => Action::Claim,
    }
}

fn over_the_cap(dc: u32, max: u32, last_error: Option<&str>) -> Action {
    let mut reason = format!("dequeued {dc} times without completing (maxDequeueCount {max})");
    if let Some(e) = last_error {
        reason.push_str(&format!("; last error: {e}"));
    }
    poison(ErrorKind::Crashed, &reason)
}

fn poison(kind: ErrorKind, reason: &str) -> Action {
    Action::Poison {
        kind,
        reason: reason.to_string(),
        uncertain: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy {
            max_dequeue_count: 5,
            retry: RetryStrategy::Fixed {
                delay: Duration::from_secs(2),
            },
            lease: Duration::from_secs(30),
            timeout: None,
            host_poisons_failed_last_attempt: false,
        }
    }

    fn facts(dc: u32) -> Facts<'static> {
        Facts {
            dequeue_count: dc,
            decode_error: None,
            key_error: None,
        }
    }

    fn failed(kind: ErrorKind) -> AttemptResult<'static> {
        AttemptResult::Failed {
            kind,
            message: "HTTP 503",
            retry_after: None,
            uncertain: true,
        }
    }

    fn poisoned(kind: ErrorKind, reason: &str) -> Action {
        Action::Poison {
            kind,
            reason: reason.into(),
            uncertain: false,
        }
    }

    /// The message-life table: one row per case, the stage's inputs and the
    /// action they must give.
    #[test]
    fn the_message_life_table() {
        let until = OffsetDateTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let p = policy();
        let mut serve = policy();
        serve.host_poisons_failed_last_attempt = true;
        let bad_base64 = Facts {
            decode_error: Some("invalid base64"),
            ..facts(1)
        };
        let no_field = Facts {
            key_error: Some("key field /orderId is missing"),
            ..facts(1)
        };
        use AttemptResult as A;
        use KeyState as K;
        #[rustfmt::skip]
        let rows: Vec<(&str, Facts, K, A, &Policy, Action)> = vec![
            ("first attempt, keyed: claim", facts(1), K::Unclaimed, A::NotRun, &p, Action::Claim),
            ("claimed: run", facts(1), K::Claimed, A::NotRun, &p, Action::Run),
            ("keyless: run", facts(1), K::Keyless, A::NotRun, &p, Action::Run),
            ("success: complete", facts(1), K::Claimed, A::Succeeded, &p, Action::Complete),
            ("retryable below the cap: retry", facts(1), K::Claimed, failed(ErrorKind::Retryable), &p,
                Action::Retry { after: Duration::from_secs(2), reason: "HTTP 503".into(), uncertain: true }),
            ("timeout below the cap: retry", facts(4), K::Claimed, failed(ErrorKind::Timeout), &p,
                Action::Retry { after: Duration::from_secs(2), reason: "HTTP 503".into(), uncertain: true }),
            ("retryable at the cap: poison, uncertainty kept", facts(5), K::Claimed, failed(ErrorKind::Retryable), &p,
                Action::Poison { kind: ErrorKind::Retryable, reason: "HTTP 503".into(), uncertain: true }),
            ("permanent on the first attempt: poison", facts(1), K::Claimed, failed(ErrorKind::Permanent), &p,
                Action::Poison { kind: ErrorKind::Permanent, reason: "HTTP 503".into(), uncertain: true }),
            ("undecodable: poison without running", bad_base64, K::Keyless, A::NotRun, &p,
                poisoned(ErrorKind::Decode, "invalid base64")),
            ("no key derivable: poison without running", no_field, K::Keyless, A::NotRun, &p,
                poisoned(ErrorKind::Permanent, "key field /orderId is missing")),
            ("duplicate of a done key", facts(1), K::Settled, A::NotRun, &p, Action::Duplicate),
            ("key held by a live lease: defer", facts(2), K::Held { until }, A::NotRun, &p, Action::Defer { until }),
            ("held at the last attempt, run mode: defer", facts(5), K::Held { until }, A::NotRun, &p, Action::Defer { until }),
            ("shutdown mid-way: release", facts(1), K::Claimed, A::Interrupted, &p, Action::Release),
            ("over the cap, never completed: poison without running", facts(6), K::Free { last_error: Some("HTTP 503") }, A::NotRun, &p,
                poisoned(ErrorKind::Crashed, "dequeued 6 times without completing (maxDequeueCount 5); last error: HTTP 503")),
            ("over the cap, no record: poison", facts(6), K::Keyless, A::NotRun, &p,
                poisoned(ErrorKind::Crashed, "dequeued 6 times without completing (maxDequeueCount 5)")),
            ("over the cap, key done: duplicate", facts(6), K::Settled, A::NotRun, &p, Action::Duplicate),
            ("over the cap, key held: defer", facts(9), K::Held { until }, A::NotRun, &p, Action::Defer { until }),
            ("over the cap beats a decode error", Facts { dequeue_count: 6, ..bad_base64 }, K::Keyless, A::NotRun, &p,
                poisoned(ErrorKind::Crashed, "dequeued 6 times without completing (maxDequeueCount 5)")),
            ("replayed message (count 1 again), key poisoned before: claim", facts(1), K::Free { last_error: None }, A::NotRun, &p, Action::Claim),
            ("replayed message, key done meanwhile: duplicate", facts(1), K::Settled, A::NotRun, &p, Action::Duplicate),
        ];
        for (name, f, key, attempt, policy, want) in rows {
            assert_eq!(decide(&f, &key, &attempt, policy, 0.5), want, "{name}");
        }
        // Serve mode, held at the last attempt: a record, not a silent host poison.
        match decide(&facts(5), &K::Held { until }, &A::NotRun, &serve, 0.5) {
            Action::Poison { kind, reason, .. } => {
                assert_eq!(kind, ErrorKind::Retryable);
                assert!(reason.contains("held by another attempt"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            decide(&facts(4), &K::Held { until }, &A::NotRun, &serve, 0.5),
            Action::Defer { until },
            "below the cap serve mode defers too"
        );
    }

    #[test]
    fn a_retry_after_from_the_handler_wins_but_is_capped_at_seven_days() {
        let p = policy();
        let ask = |after| AttemptResult::Failed {
            kind: ErrorKind::Retryable,
            message: "429",
            retry_after: Some(after),
            uncertain: false,
        };
        assert_eq!(
            decide(
                &facts(1),
                &KeyState::Claimed,
                &ask(Duration::from_secs(90)),
                &p,
                0.0
            ),
            Action::Retry {
                after: Duration::from_secs(90),
                reason: "429".into(),
                uncertain: false
            }
        );
        assert_eq!(
            decide(
                &facts(1),
                &KeyState::Claimed,
                &ask(Duration::from_secs(30 * 24 * 3600)),
                &p,
                0.0
            ),
            Action::Retry {
                after: MAX_RETRY_DELAY,
                reason: "429".into(),
                uncertain: false
            }
        );
    }
}
