//! The decision core: what happens to one message, as a pure function of
//! what is known about it, in two stages. Before anything runs,
//! `next_step` says claim, run, or settle without running
//! (`WithoutRunning`: a duplicate, a deferral, a poison); after the
//! handler's attempt, `fate` says complete, retry, release or poison
//! (`Fate`). [`crate::job::process`] gathers the facts (decoding, the key,
//! the key's record, the handler's result) and carries the answers out;
//! nothing here does I/O, so every row of the message-life table is a unit
//! test below.

use crate::message::ErrorKind;
use crate::retry::{retry_delay, RetryStrategy, MAX_RETRY_DELAY};
use std::time::Duration;
use time::OffsetDateTime;

/// Everything about attempts and retries that config decides, in one value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    /// `extensions.queues.maxDequeueCount`.
    pub max_dequeue_count: u32,
    /// `aqw.retry`: the delay before a failed message is seen again.
    pub retry: RetryStrategy,
    /// Message visibility and key lease while a handler runs.
    pub(crate) lease: Duration,
    /// `functionTimeout`.
    pub(crate) timeout: Option<Duration>,
    /// A failed last attempt is poisoned by someone else, with no error (the
    /// Functions host in `aqw serve`): at the cap a deferral becomes a record.
    pub(crate) host_poisons_failed_last_attempt: bool,
    /// `aqw.maxDeferral`: how long a provider's "later" may put a job off
    /// without spending an attempt.
    pub(crate) max_deferral: Duration,
    /// `aqw.inProgressTimeout`: how long a provider's "in progress" is
    /// waited out without spending an attempt.
    pub(crate) in_progress_timeout: Duration,
}

/// `aqw.maxDeferral` unless set: a day. A provider that says "later" for
/// longer is down, not busy, and a day is the window in which providers
/// such as Stripe remember an `Idempotency-Key`.
pub const DEFAULT_MAX_DEFERRAL: Duration = Duration::from_secs(24 * 3600);

/// `aqw.inProgressTimeout` unless set: 5 minutes. A 409 "in progress"
/// means the provider is still running the first request with this key;
/// a request that takes longer than a few minutes is past every common
/// gateway's timeout (Azure's load balancers and API Management default
/// to 4 min and 5 min, AWS API Gateway's integration limit is 29 s), so
/// the first request has most likely failed on the provider's side, and
/// each further 409 is counted as an attempt again.
pub const DEFAULT_IN_PROGRESS_TIMEOUT: Duration = Duration::from_secs(300);

/// The shortest wait a "later" gets.
pub(crate) const MIN_LATER: Duration = Duration::from_secs(1);

/// The provider said "later": a refusal that did not apply the request and
/// came with a delay (429 with `Retry-After`, or any declared refusal with
/// one). Such a job waits as a fresh copy after the delay, without spending
/// an attempt, while its key's first attempt is younger than
/// `max_deferral` (`deferred_for`: that age; `None` for a keyless job,
/// which has no record to bound it, and is retried as before). Returns the
/// delay.
pub fn later(
    attempt: &AttemptResult,
    deferred_for: Option<Duration>,
    policy: &Policy,
) -> Option<Duration> {
    match attempt {
        AttemptResult::Failed {
            kind: ErrorKind::Retryable,
            retry_after: Some(after),
            uncertain: false,
            ..
        } => {
            let left = policy
                .max_deferral
                .checked_sub(deferred_for?)
                .filter(|left| !left.is_zero())?;
            // At least a second (a `Retry-After: 0` or a date in the past
            // would make a hot loop), and never past the deferral's end.
            Some((*after).max(MIN_LATER).min(left).min(MAX_RETRY_DELAY))
        }
        _ => None,
    }
}

/// What is known of the message before anything runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Facts<'a> {
    /// The message's DequeueCount (1 on its first delivery).
    pub(crate) dequeue_count: u32,
    /// The job's attempt number as its key's record counts it, this attempt
    /// included, once the key is claimed (`attempt_of_key`); `None`
    /// before the claim and for a keyless job, whose attempt number is its
    /// DequeueCount.
    pub attempt: Option<u32>,
    /// The decoded text, or why it could not be decoded (base64, UTF-8).
    pub payload: Result<&'a str, &'a str>,
    /// Why no key could be derived (not JSON, a missing field), if so.
    pub(crate) key_error: Option<&'a str>,
}

/// What the key's record says, as far as it has been looked at.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum KeyState<'a> {
    /// The job has no key (`key: none`, or none could be derived).
    Keyless,
    /// Keyed, not claimed yet.
    Unclaimed,
    /// This attempt holds the key's lease.
    Claimed,
    /// Done, or closed by an operator: nothing may run again.
    Settled,
    /// Another attempt holds a live lease until then.
    Held {
        /// When the other attempt's lease ends.
        until: OffsetDateTime,
    },
    /// Read over the cap: a record that is neither settled nor held.
    Free {
        /// The last error noted on the key, if any.
        last_error: Option<&'a str>,
    },
}

/// What to do before the handler runs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum NextStep<'a> {
    /// Claim the key, then ask [`next_step`] again with what the claim found.
    Claim,
    /// Run the handler on this decoded payload (key claimed, or keyless).
    Run {
        /// The decoded message text.
        payload: &'a str,
    },
    /// Settle the message without running the handler.
    Settle(WithoutRunning),
}

/// How a message is settled without running the handler.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum WithoutRunning {
    /// The key is settled: delete the message.
    Duplicate,
    /// Another attempt holds the key: look again after `until`.
    Defer {
        /// When the holder's lease ends.
        until: OffsetDateTime,
    },
    /// Undecodable, no key derivable, over the cap, or held at the last
    /// attempt in serve mode.
    Poison(PoisonCase),
}

/// Why a message goes to `<queue>-poison`: the error its record and
/// envelope carry.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PoisonCase {
    /// The kind of the error that poisoned it.
    pub(crate) kind: ErrorKind,
    /// The error's text.
    pub(crate) reason: String,
    /// The effect may have happened anyway (kept on the key's record).
    pub(crate) uncertain: bool,
}

/// How the handler's attempt ended.
#[derive(Debug, Clone, PartialEq)]
pub enum AttemptResult<'a> {
    /// The handler returned success.
    Succeeded,
    /// Shutdown stopped it mid-way.
    Interrupted,
    /// The handler failed (or timed out).
    Failed {
        /// How it failed (retryable, timeout, permanent, …).
        kind: ErrorKind,
        /// The error's text.
        message: &'a str,
        /// The delay the handler asked for before the next attempt, if any.
        retry_after: Option<Duration>,
        /// The effect may have happened anyway.
        uncertain: bool,
    },
}

/// The fate of a message after the handler's attempt.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Fate {
    /// Mark the key done, delete the message.
    Complete,
    /// Note the failure on the key; make the message visible again after `after`.
    Retry {
        /// How long the message stays invisible before its next attempt.
        after: Duration,
        /// The error's text, noted on the key.
        reason: String,
        /// The attempt's effect may have happened anyway.
        uncertain: bool,
    },
    /// Make the message visible again at once (shutdown).
    Release,
    /// Copy to `<queue>-poison` with this error and a record, then delete.
    Poison(PoisonCase),
}

impl Facts<'_> {
    /// The job's attempt number: its key's count once claimed, else the
    /// message's DequeueCount.
    fn attempt_number(&self) -> u32 {
        self.attempt.unwrap_or(self.dequeue_count)
    }
}

/// The most deliveries a keyed message may take before it is poisoned
/// without an attempt its key counted: three times `maxDequeueCount`.
///
/// A keyed job's attempts are counted by its key's record (a claim is an
/// attempt: [`attempt_of_key`]), so a delivery aqw gave back without
/// running the work (a storage fault before or at the claim, an answer
/// lost, a replica stopped before the claim) spends none of them. The
/// DequeueCount still bounds what the key cannot see: a message that
/// crashes the worker before its claim is written (decoding, a claim-check
/// body) is poisoned as `crashed` past this bound.
pub(crate) fn dequeue_bound(max_dequeue_count: u32) -> u32 {
    max_dequeue_count.saturating_mul(3)
}

/// A keyed job's attempt number from its key's record after this claim:
/// `claims` (the claims of the job's current run, this one included) in
/// `aqw run`; in `aqw serve`, whose retries are fresh copies, the attempts
/// the earlier copies spent (`carried`) plus this copy's DequeueCount.
/// Past `maxDequeueCount` (a job whose last attempt crashed, or whose
/// poisoning failed on storage), the job is poisoned without running, as
/// `crashed`, with the key's last error.
pub(crate) fn attempt_of_key(
    claims: u32,
    carried: Option<u32>,
    dequeue_count: u32,
    policy: &Policy,
    last_error: Option<&str>,
) -> (u32, Option<WithoutRunning>) {
    let n = match carried {
        Some(c) => c.saturating_add(dequeue_count),
        None => claims,
    };
    let max = policy.max_dequeue_count;
    (n, (n > max).then(|| over_budget(n, max, last_error)))
}

/// What to do before running, from the facts and the key's record so far.
pub(crate) fn next_step<'a>(facts: &Facts<'a>, key: &KeyState, policy: &Policy) -> NextStep<'a> {
    let (dc, max) = (facts.dequeue_count, policy.max_dequeue_count);
    // A keyless job's attempts are its deliveries; a keyed one's are
    // counted by its key, the DequeueCount only bounded (`dequeue_bound`).
    let bound = match key {
        KeyState::Keyless => max,
        _ => dequeue_bound(max),
    };
    if dc > bound {
        // Deliveries spent waiting on another holder of the key are not
        // failures: a settled key makes this a duplicate, a live lease a
        // deferral, whatever the dequeue count says.
        return NextStep::Settle(match key {
            KeyState::Settled => WithoutRunning::Duplicate,
            KeyState::Held { until } => WithoutRunning::Defer { until: *until },
            KeyState::Keyless => over_the_cap(dc, max, None),
            KeyState::Free { last_error } => over_the_bound(dc, bound, *last_error),
            _ => over_the_bound(dc, bound, None),
        });
    }
    let payload = match facts.payload {
        Ok(payload) => payload,
        Err(e) => return NextStep::Settle(poison(ErrorKind::Decode, e)),
    };
    if let Some(e) = facts.key_error {
        return NextStep::Settle(poison(ErrorKind::Permanent, e));
    }
    match key {
        KeyState::Unclaimed | KeyState::Free { .. } => NextStep::Claim,
        KeyState::Keyless | KeyState::Claimed => NextStep::Run { payload },
        KeyState::Settled => NextStep::Settle(WithoutRunning::Duplicate),
        // The host would poison this message on a non-2xx, with no error and
        // no record. Keep it as a record instead: a replay is a duplicate if
        // the holder finishes, and runs otherwise.
        KeyState::Held { until } if dc >= max && policy.host_poisons_failed_last_attempt => {
            NextStep::Settle(poison(
                ErrorKind::Retryable,
                &format!(
                    "key held by another attempt (lease until {until}) at the last attempt \
                     (maxDequeueCount {max}); the Functions host would poison it without an error"
                ),
            ))
        }
        KeyState::Held { until } => NextStep::Settle(WithoutRunning::Defer { until: *until }),
    }
}

/// The fate after the handler's attempt. `jitter` in [0, 1) spreads retry
/// delays (random in production, fixed in tests).
pub(crate) fn fate(facts: &Facts, attempt: &AttemptResult, policy: &Policy, jitter: f64) -> Fate {
    let (dc, max) = (facts.attempt_number(), policy.max_dequeue_count);
    match attempt {
        AttemptResult::Succeeded => Fate::Complete,
        AttemptResult::Interrupted => Fate::Release,
        AttemptResult::Failed {
            kind,
            message,
            retry_after,
            uncertain,
        } => {
            // Permanent and replayed failures cannot pass on a retry.
            let final_now = matches!(kind, ErrorKind::Permanent | ErrorKind::ReplayedFailure);
            if !final_now && dc < max {
                let after = retry_after
                    .unwrap_or_else(|| retry_delay(&policy.retry, dc, jitter))
                    .min(MAX_RETRY_DELAY);
                Fate::Retry {
                    after,
                    reason: message.to_string(),
                    uncertain: *uncertain,
                }
            } else {
                Fate::Poison(PoisonCase {
                    kind: *kind,
                    reason: message.to_string(),
                    uncertain: *uncertain,
                })
            }
        }
    }
}

/// The poison of a job attempted `dc` times already, past the cap of
/// `max`: kind `crashed`, with the key's last error when known.
fn over_the_cap(dc: u32, max: u32, last_error: Option<&str>) -> WithoutRunning {
    let mut reason = format!("dequeued {dc} times without completing (maxDequeueCount {max})");
    if let Some(e) = last_error {
        reason.push_str(&format!("; last error: {e}"));
    }
    poison(ErrorKind::Crashed, &reason)
}

/// The poison of a keyed job whose key counts `n` claims, past the cap of
/// `max`: kind `crashed`, with the key's last error when known.
fn over_budget(n: u32, max: u32, last_error: Option<&str>) -> WithoutRunning {
    let made = n.saturating_sub(1);
    let mut reason = format!("attempted {made} times without completing (maxDequeueCount {max})");
    if let Some(e) = last_error {
        reason.push_str(&format!("; last error: {e}"));
    }
    poison(ErrorKind::Crashed, &reason)
}

/// The poison of a keyed message delivered `dc` times, past `bound`
/// ([`dequeue_bound`]), its key free: its deliveries failed before an
/// attempt the key could count.
fn over_the_bound(dc: u32, bound: u32, last_error: Option<&str>) -> WithoutRunning {
    let mut reason = format!(
        "dequeued {dc} times without an attempt its key counted (the bound is {bound}, \
         3 x maxDequeueCount): each delivery failed before its claim (a crash or storage)"
    );
    if let Some(e) = last_error {
        reason.push_str(&format!("; last error: {e}"));
    }
    poison(ErrorKind::Crashed, &reason)
}

fn poison(kind: ErrorKind, reason: &str) -> WithoutRunning {
    WithoutRunning::Poison(PoisonCase {
        kind,
        reason: reason.to_string(),
        uncertain: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAYLOAD: &str = r#"{"orderId":"A-1"}"#;

    fn policy() -> Policy {
        Policy {
            max_dequeue_count: 5,
            retry: RetryStrategy::Fixed {
                delay: Duration::from_secs(2),
            },
            lease: Duration::from_secs(30),
            timeout: None,
            host_poisons_failed_last_attempt: false,
            max_deferral: DEFAULT_MAX_DEFERRAL,
            in_progress_timeout: DEFAULT_IN_PROGRESS_TIMEOUT,
        }
    }

    fn serve_policy() -> Policy {
        Policy {
            host_poisons_failed_last_attempt: true,
            max_deferral: DEFAULT_MAX_DEFERRAL,
            ..policy()
        }
    }

    fn facts(dc: u32) -> Facts<'static> {
        Facts {
            dequeue_count: dc,
            attempt: None,
            payload: Ok(PAYLOAD),
            key_error: None,
        }
    }

    fn claimed(dc: u32, attempt: u32) -> Facts<'static> {
        Facts {
            attempt: Some(attempt),
            ..facts(dc)
        }
    }

    fn until() -> OffsetDateTime {
        OffsetDateTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
    }

    fn failed(kind: ErrorKind) -> AttemptResult<'static> {
        AttemptResult::Failed {
            kind,
            message: "HTTP 503",
            retry_after: None,
            uncertain: true,
        }
    }

    fn case(kind: ErrorKind, reason: &str, uncertain: bool) -> PoisonCase {
        PoisonCase {
            kind,
            reason: reason.into(),
            uncertain,
        }
    }

    fn poisoned(kind: ErrorKind, reason: &str) -> NextStep<'static> {
        NextStep::Settle(WithoutRunning::Poison(case(kind, reason, false)))
    }

    /// The message-life table before the handler runs: one row per case, the
    /// facts and the key's record, and the step they must give.
    #[test]
    fn the_message_life_table_before_running() {
        let (until, p) = (until(), policy());
        let bad_base64 = Facts {
            payload: Err("invalid base64"),
            ..facts(1)
        };
        let no_field = Facts {
            key_error: Some("key field /orderId is missing"),
            ..facts(1)
        };
        let run = NextStep::Run { payload: PAYLOAD };
        let duplicate = NextStep::Settle(WithoutRunning::Duplicate);
        let defer = NextStep::Settle(WithoutRunning::Defer { until });
        use KeyState as K;
        #[rustfmt::skip]
        let rows: Vec<(&str, Facts, K, NextStep)> = vec![
            ("first attempt, keyed: claim", facts(1), K::Unclaimed, NextStep::Claim),
            ("claimed: run", facts(1), K::Claimed, run.clone()),
            ("keyless: run", facts(1), K::Keyless, run),
            ("undecodable: poison without running", bad_base64, K::Keyless,
                poisoned(ErrorKind::Decode, "invalid base64")),
            ("no key derivable: poison without running", no_field, K::Keyless,
                poisoned(ErrorKind::Permanent, "key field /orderId is missing")),
            ("duplicate of a done key", facts(1), K::Settled, duplicate.clone()),
            ("key held by a live lease: defer", facts(2), K::Held { until }, defer.clone()),
            ("held at the last attempt, run mode: defer", facts(5), K::Held { until }, defer.clone()),
            ("keyed over the cap: its key counts the attempts, claim", facts(6), K::Free { last_error: Some("HTTP 503") },
                NextStep::Claim),
            ("keyed at the bound: claim", facts(15), K::Unclaimed, NextStep::Claim),
            ("keyed over the bound, never completed: poison without running", facts(16), K::Free { last_error: Some("HTTP 503") },
                poisoned(ErrorKind::Crashed, "dequeued 16 times without an attempt its key counted (the bound is 15, 3 x maxDequeueCount): each delivery failed before its claim (a crash or storage); last error: HTTP 503")),
            ("keyless over the cap: poison", facts(6), K::Keyless,
                poisoned(ErrorKind::Crashed, "dequeued 6 times without completing (maxDequeueCount 5)")),
            ("over the bound, key done: duplicate", facts(16), K::Settled, duplicate.clone()),
            ("over the bound, key held: defer", facts(40), K::Held { until }, defer),
            ("over the cap beats a decode error", Facts { dequeue_count: 6, ..bad_base64 }, K::Keyless,
                poisoned(ErrorKind::Crashed, "dequeued 6 times without completing (maxDequeueCount 5)")),
            ("replayed message (count 1 again), key poisoned before: claim", facts(1), K::Free { last_error: None }, NextStep::Claim),
            ("replayed message, key done meanwhile: duplicate", facts(1), K::Settled, duplicate),
        ];
        for (name, f, key, want) in rows {
            assert_eq!(next_step(&f, &key, &p), want, "{name}");
        }
    }

    /// The message-life table after the attempt: one row per case, how the
    /// attempt ended and the fate it must give.
    #[test]
    fn the_message_life_table_after_the_attempt() {
        let p = policy();
        let retry = Fate::Retry {
            after: Duration::from_secs(2),
            reason: "HTTP 503".into(),
            uncertain: true,
        };
        use AttemptResult as A;
        #[rustfmt::skip]
        let rows: Vec<(&str, Facts, A, Fate)> = vec![
            ("success: complete", facts(1), A::Succeeded, Fate::Complete),
            ("retryable below the cap: retry", facts(1), failed(ErrorKind::Retryable), retry.clone()),
            ("timeout below the cap: retry", facts(4), failed(ErrorKind::Timeout), retry),
            ("retryable at the cap: poison, uncertainty kept", facts(5), failed(ErrorKind::Retryable),
                Fate::Poison(case(ErrorKind::Retryable, "HTTP 503", true))),
            ("keyed, dequeued 9 times but its key's 3rd attempt: retry", claimed(9, 3), failed(ErrorKind::Retryable),
                Fate::Retry { after: Duration::from_secs(2), reason: "HTTP 503".into(), uncertain: true }),
            ("keyed, its key's 5th attempt at DequeueCount 2: poison", claimed(2, 5), failed(ErrorKind::Retryable),
                Fate::Poison(case(ErrorKind::Retryable, "HTTP 503", true))),
            ("permanent on the first attempt: poison", facts(1), failed(ErrorKind::Permanent),
                Fate::Poison(case(ErrorKind::Permanent, "HTTP 503", true))),
            ("shutdown mid-way: release", facts(1), A::Interrupted, Fate::Release),
        ];
        for (name, f, attempt, want) in rows {
            assert_eq!(fate(&f, &attempt, &p, 0.5), want, "{name}");
        }
    }

    /// A keyed job's attempt number is its key's count, not the
    /// DequeueCount: deliveries given back without an attempt (a storage
    /// fault at the claim, a deferral) spend none; past the cap the job is
    /// poisoned without running, with the key's last error.
    #[test]
    fn a_keyed_job_counts_the_attempts_its_key_made() {
        let p = policy();
        // Run mode: the key's claims, whatever the DequeueCount.
        assert_eq!(attempt_of_key(3, None, 9, &p, None), (3, None));
        assert_eq!(attempt_of_key(5, None, 1, &p, None), (5, None));
        let (n, over) = attempt_of_key(6, None, 7, &p, Some("HTTP 503"));
        assert_eq!(n, 6);
        assert_eq!(
            over,
            Some(WithoutRunning::Poison(case(
                ErrorKind::Crashed,
                "attempted 5 times without completing (maxDequeueCount 5); last error: HTTP 503",
                false
            )))
        );
        // Serve mode: the earlier copies' attempts plus this copy's count.
        assert_eq!(attempt_of_key(9, Some(2), 3, &p, None), (5, None));
        assert!(attempt_of_key(1, Some(4), 2, &p, None).1.is_some());
        assert_eq!(dequeue_bound(5), 15);
        assert_eq!(dequeue_bound(1), 3);
    }

    #[test]
    fn a_later_waits_at_least_a_second_and_never_past_the_deferral() {
        let p = Policy {
            max_deferral: Duration::from_secs(100),
            ..policy()
        };
        let later_of = |after: u64, age: Option<u64>| {
            let a = AttemptResult::Failed {
                kind: ErrorKind::Retryable,
                message: "HTTP 429",
                retry_after: Some(Duration::from_secs(after)),
                uncertain: false,
            };
            later(&a, age.map(Duration::from_secs), &p)
        };
        assert_eq!(later_of(0, Some(0)), Some(MIN_LATER), "Retry-After: 0");
        assert_eq!(later_of(30, Some(10)), Some(Duration::from_secs(30)));
        assert_eq!(
            later_of(30, Some(90)),
            Some(Duration::from_secs(10)),
            "capped at the end"
        );
        assert_eq!(later_of(30, Some(100)), None, "deferral over: a failure");
        assert_eq!(later_of(30, None), None, "keyless: a failure");
        let uncertain = AttemptResult::Failed {
            kind: ErrorKind::Retryable,
            message: "HTTP 503",
            retry_after: Some(Duration::from_secs(5)),
            uncertain: true,
        };
        assert_eq!(later(&uncertain, Some(Duration::ZERO), &p), None);
    }

    /// Serve mode, held at the last attempt: a record, not a silent host poison.
    #[test]
    fn serve_mode_poisons_a_key_held_at_the_last_attempt_with_a_record() {
        let (until, serve) = (until(), serve_policy());
        let held = KeyState::Held { until };
        match next_step(&facts(5), &held, &serve) {
            NextStep::Settle(WithoutRunning::Poison(PoisonCase { kind, reason, .. })) => {
                assert_eq!(kind, ErrorKind::Retryable);
                assert!(reason.contains("held by another attempt"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            next_step(&facts(4), &held, &serve),
            NextStep::Settle(WithoutRunning::Defer { until }),
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
        let retry = |after| Fate::Retry {
            after,
            reason: "429".into(),
            uncertain: false,
        };
        let ninety = Duration::from_secs(90);
        assert_eq!(fate(&facts(1), &ask(ninety), &p, 0.0), retry(ninety));
        let a_month = Duration::from_secs(30 * 24 * 3600);
        assert_eq!(
            fate(&facts(1), &ask(a_month), &p, 0.0),
            retry(MAX_RETRY_DELAY)
        );
    }
}
