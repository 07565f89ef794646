//! What happened to one message, and the one line and counters that say so
//! (the same for `aqw run` and `aqw serve`).

use crate::traces::JobTrace;
use std::time::Duration;
use time::OffsetDateTime;
use tracing::{info, warn};

/// The history's outcome of an "in progress" waited out (no attempt spent).
pub(super) const IN_PROGRESS_OUTCOME: &str = "in_progress";

/// What happened to one message.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The handler succeeded; key done, message deleted.
    Completed,
    /// The key was already done; message deleted without running.
    Duplicate,
    /// Another worker holds the key's lease; message hidden until it ends.
    Deferred {
        /// When the other worker's lease ends.
        until: OffsetDateTime,
    },
    /// Retryable failure below the cap; message visible again after `after`.
    Retried {
        /// How long the message stays invisible.
        after: Duration,
    },
    /// Retryable failure below the cap in `aqw serve`: a fresh copy visible
    /// after `after` replaced the message, and the key carries the attempts
    /// spent (the Functions host would retry after its fixed
    /// `visibilityTimeout` otherwise).
    RetriedAsCopy {
        /// When the fresh copy becomes visible.
        after: Duration,
    },
    /// Copied to `<queue>-poison` with its record, then deleted.
    Poisoned {
        /// The error the record and envelope carry.
        reason: String,
    },
    /// Shutdown interrupted the handler; message made visible at once.
    Released,
    /// Storage failed mid-way; the message reappears when its lease ends.
    Abandoned {
        /// The storage error.
        error: String,
    },
    /// The breaker is open (or, in serve mode, the function is paused): a
    /// fresh copy visible after `after` replaced the message, which did not
    /// count toward the cap.
    Parked {
        /// When the fresh copy becomes visible.
        after: Duration,
    },
}

impl Outcome {
    /// The outcome's name in metrics and logs (`completed`, `retried`, …).
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::Duplicate => "duplicate",
            Outcome::Deferred { .. } => "deferred",
            Outcome::Retried { .. } | Outcome::RetriedAsCopy { .. } => "retried",
            Outcome::Poisoned { .. } => "poisoned",
            Outcome::Released => "released",
            Outcome::Abandoned { .. } => "abandoned",
            Outcome::Parked { .. } => "parked",
        }
    }
}

/// The error a retried attempt's span carries.
const RETRY_NOTE: &str = "attempt failed; will retry";

/// Count and log one outcome: the same counters and the same one line per
/// attempt (`aqw.job.<outcome>`, with `outcome`, `duration_ms`, `trace_id`
/// and `span_id`) for `aqw run` and `aqw serve`; the same facts go on the
/// current `aqw.job` span.
pub fn record_outcome(function: &str, outcome: &Outcome, elapsed: Duration, trace: &JobTrace) {
    metrics::counter!("aqw_messages_total", "function" => function.to_string(), "outcome" => outcome.label()).increment(1);
    let duration_ms = elapsed.as_millis() as u64;
    let label = outcome.label();
    let (trace_id, span_id) = (trace.trace_id.as_str(), trace.span_id.as_str());
    let error = match outcome {
        Outcome::Poisoned { reason } => Some(crate::scrub::scrub(reason)),
        Outcome::Abandoned { error } => Some(crate::scrub::scrub(error)),
        Outcome::Retried { .. } | Outcome::RetriedAsCopy { .. } => Some(RETRY_NOTE.into()),
        _ => None,
    };
    crate::traces::finish_job(
        &tracing::Span::current(),
        label,
        duration_ms,
        error.as_deref(),
    );
    macro_rules! line {
        ($level:ident, $event:literal, $msg:literal $(, $($extra:tt)*)?) => {
            $level!(event = $event, outcome = label, duration_ms, trace_id, span_id, $($($extra)*,)? $msg)
        };
    }
    match outcome {
        Outcome::Completed => line!(info, "aqw.job.completed", "job completed"),
        Outcome::Duplicate => line!(
            info,
            "aqw.job.duplicate",
            "key already done; message deleted without running"
        ),
        Outcome::Deferred { until } => line!(info, "aqw.job.deferred",
            "key held by a live lease (another attempt is running); looking again shortly", lease_until = %until),
        Outcome::Retried { after } | Outcome::RetriedAsCopy { after } => line!(
            info,
            "aqw.job.retried",
            "attempt failed; will retry",
            retry_in_ms = after.as_millis() as u64
        ),
        Outcome::Poisoned { .. } => line!(
            warn,
            "aqw.job.poisoned",
            "job poisoned",
            reason = error.as_deref().unwrap_or_default()
        ),
        Outcome::Released => line!(info, "aqw.job.released", "job released at shutdown"),
        Outcome::Abandoned { .. } => line!(
            warn,
            "aqw.job.abandoned",
            "storage failed mid-way; the message returns when its lease ends",
            error = error.as_deref().unwrap_or_default()
        ),
        Outcome::Parked { after } => line!(
            info,
            "aqw.job.parked",
            "breaker open or function paused; a fresh copy returns later",
            park_ms = after.as_millis() as u64
        ),
    }
    count_by_kind(function, outcome);
}

/// The counters of a duplicate and a poison, beside `aqw_messages_total`.
fn count_by_kind(function: &str, outcome: &Outcome) {
    if matches!(outcome, Outcome::Duplicate) {
        metrics::counter!("aqw_duplicates_total", "function" => function.to_string()).increment(1);
    }
    if matches!(outcome, Outcome::Poisoned { .. }) {
        metrics::counter!("aqw_poisoned_total", "function" => function.to_string()).increment(1);
    }
}

/// Storage failed mid-way: the message reappears when its lease ends.
pub(super) fn abandoned(e: crate::storage::StorageError) -> Outcome {
    Outcome::Abandoned {
        error: e.to_string(),
    }
}
