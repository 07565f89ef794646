//! Every "later" is later (issue 49): a provider's throttle (a 429 with or
//! without a delay, a 503 with one) and its "in progress" (a 409 while it
//! still runs the first request with this key) are waited out without
//! spending an attempt, bounded by `aqw.maxDeferral`; an "in progress"
//! also by `aqw.inProgressTimeout`, after which each 409 is one uncertain
//! attempt again. And every answer tells the function's adaptive rate
//! ([`crate::flow::adaptive`]) whether the provider throttled.

use super::handler::HandlerRun;
use super::outcome::IN_PROGRESS_OUTCOME;
use crate::decide::{AttemptResult, MIN_LATER};
use crate::handler::HandlerError;
use crate::idempotency::record::Attempt;
use crate::message::ErrorKind;
use crate::runtime::FunctionRuntime;
use std::time::Duration;
use time::OffsetDateTime;

/// The longest of aqw's own waits after a throttle that named no delay.
pub(super) const MAX_THROTTLE_BACKOFF: Duration = Duration::from_secs(60);

/// aqw's backoff when the provider named no delay: exponential in how long
/// the job has been put off (each wait up to the time waited so far, so
/// the waits double), from [`MIN_LATER`] to `cap`, with full jitter
/// (`jitter` in [0, 1)): the refused jobs of a fleet spread out instead of
/// coming back together.
pub(super) fn backoff(waited: Duration, cap: Duration, jitter: f64) -> Duration {
    let ceiling = waited.clamp(MIN_LATER * 2, cap.max(MIN_LATER * 2));
    let jitter = if jitter.is_nan() {
        0.0
    } else {
        jitter.clamp(0.0, 1.0)
    };
    MIN_LATER + (ceiling - MIN_LATER).mul_f64(jitter)
}

/// Since when the provider has said "in progress" for this key: the first
/// answer of the run of in-progress answers that ends the key's history
/// (waits, and the uncertain attempts after the timeout, which are
/// `retried` entries that may have taken effect); `now` when the history
/// holds none. A run that fills the whole history may have begun earlier
/// than the oldest entry kept: then the key's first attempt (`first_seen`)
/// bounds it, which errs towards stopping the wait sooner.
pub(super) fn in_progress_since(
    history: &[Attempt],
    first_seen: Option<OffsetDateTime>,
    now: OffsetDateTime,
) -> OffsetDateTime {
    let mut since = None;
    let mut run = 0;
    for a in history.iter().rev() {
        match a.outcome.as_str() {
            IN_PROGRESS_OUTCOME => since = parse(&a.at).or(since),
            "retried" if a.may_have_taken_effect => {}
            _ => break,
        }
        run += 1;
    }
    let Some(since) = since else {
        return now;
    };
    if run >= crate::idempotency::record::HISTORY_LEN {
        return first_seen.map_or(since, |f| f.min(since));
    }
    since.min(now)
}

fn parse(at: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339).ok()
}

/// A duration for a person: `8s`, `5m 12s`, `1h 3m`.
pub(super) fn for_a_person(d: Duration) -> String {
    let s = d.as_secs();
    match (s / 3600, (s % 3600) / 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m {s}s"),
        (h, m, _) => format!("{h}h {m}m"),
    }
}

/// What an "in progress" answer comes to for a keyed job.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum InProgress {
    /// Wait this long without spending an attempt.
    Wait(Duration),
    /// Past `aqw.inProgressTimeout` (or `aqw.maxDeferral`): an attempt,
    /// whose error says how long the provider has said "in progress".
    Spend {
        /// Since the first "in progress" for the key.
        lasted: Duration,
    },
}

/// The fate of an "in progress" answered `lasted` after the key's first
/// one, with `left` of the deferral: wait (the provider's `Retry-After`,
/// else backoff over the time waited) while under `timeout`.
pub(super) fn in_progress(
    lasted: Duration,
    timeout: Duration,
    left: Option<Duration>,
    retry_after: Option<Duration>,
    jitter: f64,
) -> InProgress {
    let left = left.unwrap_or(Duration::ZERO);
    if lasted >= timeout || left.is_zero() {
        return InProgress::Spend { lasted };
    }
    let cap = (timeout / 8).clamp(MIN_LATER, MAX_THROTTLE_BACKOFF);
    let wait = retry_after
        .unwrap_or_else(|| backoff(lasted, cap, jitter))
        .max(MIN_LATER)
        .min(timeout - lasted + MIN_LATER)
        .min(left);
    InProgress::Wait(wait)
}

/// Tell the function's adaptive rate how the provider answered the call
/// sent at `sent` (a finished call only), and raise the alert when it has
/// been throttled for `aqw.alert.throttledFor`.
pub(super) fn tell_adaptive_rate(
    rt: &FunctionRuntime,
    run: &HandlerRun,
    sent: tokio::time::Instant,
) {
    let HandlerRun::Finished(result) = run else {
        return;
    };
    // A 429, or a refusal that named a delay (a 503 with `Retry-After`).
    let throttled = matches!(
        result,
        Err(HandlerError::Throttled { .. }
            | HandlerError::Retryable {
                retry_after: Some(_),
                may_have_taken_effect: false,
                ..
            })
    );
    let Some(lasted) = rt
        .adaptive
        .record(throttled, sent, rt.app.alert_throttled_for)
    else {
        return;
    };
    let rate = rt.adaptive.rate().unwrap_or_default();
    let summary = format!(
        "{} has been throttled by its provider for {} (HTTP 429): the adaptive rate is down to {rate:.2} calls/s on this replica; jobs wait without spending attempts, up to aqw.maxDeferral, and the backlog grows while the provider's limit is below the work's arrival rate",
        rt.function.name,
        for_a_person(lasted)
    );
    tracing::warn!(event = "aqw.rate.throttled", function = %rt.function.name, throttled_for_s = lasted.as_secs(), calls_per_second = rate, "{summary}");
    rt.alerts.notice(serde_json::json!({
        "event": "aqw.rate.throttled",
        "severity": "warning",
        "function": rt.function.name,
        "summary": summary,
        "worker": rt.worker_id,
        "runbook": crate::alert::runbook_link(None, Some("outage")),
    }));
}

/// A throttle's attempt: refused for now, not applied, with the
/// provider's delay or aqw's backoff (`waited`: how long the job has been
/// put off, read only for a throttle without a delay).
pub(super) fn throttled_attempt<'a>(
    message: &'a str,
    retry_after: Option<Duration>,
    waited: impl FnOnce() -> Option<Duration>,
    jitter: f64,
) -> AttemptResult<'a> {
    let after = retry_after.unwrap_or_else(|| {
        backoff(
            waited().unwrap_or(Duration::ZERO),
            MAX_THROTTLE_BACKOFF,
            jitter,
        )
    });
    AttemptResult::Failed {
        kind: ErrorKind::Retryable,
        message,
        retry_after: Some(after),
        uncertain: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(outcome: &str, at: i64, uncertain: bool) -> Attempt {
        Attempt {
            at: OffsetDateTime::from_unix_timestamp(at)
                .unwrap()
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap(),
            message_id: "m".into(),
            dequeue_count: 1,
            outcome: outcome.into(),
            error: Some("HTTP 409".into()),
            may_have_taken_effect: uncertain,
            provider: None,
        }
    }

    fn t(s: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(s).unwrap()
    }

    #[test]
    fn backoff_grows_with_the_wait_and_stays_in_bounds() {
        let cap = MAX_THROTTLE_BACKOFF;
        assert_eq!(backoff(Duration::ZERO, cap, 0.0), MIN_LATER);
        assert_eq!(backoff(Duration::ZERO, cap, 1.0), MIN_LATER * 2);
        assert_eq!(
            backoff(Duration::from_secs(10), cap, 1.0),
            Duration::from_secs(10)
        );
        assert_eq!(backoff(Duration::from_secs(3600), cap, 1.0), cap);
        assert_eq!(backoff(Duration::MAX, cap, 7.0), cap, "jitter clamped");
        assert_eq!(backoff(Duration::MAX, cap, f64::NAN), MIN_LATER);
    }

    #[test]
    fn in_progress_is_measured_from_the_first_answer_of_the_run() {
        let now = t(1000);
        assert_eq!(in_progress_since(&[], None, now), now, "the first one");
        let h = vec![
            entry("retried", 100, false),
            entry(IN_PROGRESS_OUTCOME, 500, true),
            entry(IN_PROGRESS_OUTCOME, 600, true),
            entry("retried", 900, true),
        ];
        assert_eq!(
            in_progress_since(&h, Some(t(50)), now),
            t(500),
            "the run includes attempts spent after the timeout"
        );
        let broken = vec![
            entry(IN_PROGRESS_OUTCOME, 500, true),
            entry("released", 600, true),
        ];
        assert_eq!(in_progress_since(&broken, None, now), now);
        let full: Vec<_> = (0..10)
            .map(|i| entry(IN_PROGRESS_OUTCOME, 500 + i, true))
            .collect();
        assert_eq!(
            in_progress_since(&full, Some(t(100)), now),
            t(100),
            "a full history: the key's first attempt bounds it"
        );
        let mut garbage = entry(IN_PROGRESS_OUTCOME, 0, true);
        garbage.at = "not a time".into();
        assert_eq!(in_progress_since(&[garbage], None, now), now);
    }

    #[test]
    fn in_progress_waits_until_the_timeout_then_spends() {
        let (timeout, day) = (Duration::from_secs(300), Some(Duration::from_secs(86400)));
        let s = Duration::from_secs;
        assert_eq!(
            in_progress(s(0), timeout, day, None, 0.0),
            InProgress::Wait(MIN_LATER)
        );
        match in_progress(s(100), timeout, day, None, 1.0) {
            InProgress::Wait(w) => assert!(w <= timeout / 8 && w >= MIN_LATER, "{w:?}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            in_progress(s(0), timeout, day, Some(s(9000)), 0.5),
            InProgress::Wait(s(301)),
            "a Retry-After past the timeout: one look after it"
        );
        assert_eq!(
            in_progress(s(300), timeout, day, None, 0.5),
            InProgress::Spend { lasted: s(300) }
        );
        assert_eq!(
            in_progress(s(10), timeout, None, None, 0.5),
            InProgress::Spend { lasted: s(10) },
            "no deferral left (or keyless)"
        );
        assert_eq!(for_a_person(s(312)), "5m 12s");
        assert_eq!(for_a_person(s(8)), "8s");
        assert_eq!(for_a_person(s(3780)), "1h 3m");
    }
}
