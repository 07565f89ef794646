//! Settling one message: how ([`Settle`]: on the queue, or by the Functions
//! host), and carrying out what [`crate::decide`] chose — claim, complete,
//! duplicate, defer, retry, release, and the single poison exit.

use super::outcome::{abandoned, Outcome};
use crate::decide::{Fate, KeyState, PoisonCase, WithoutRunning};
use crate::failpoint;
use crate::handler::Success;
use crate::idempotency::{ClaimedKey, FinishError, IdempotencyKey, NextAction};
use crate::message::{ErrorInfo, ErrorKind};
use crate::runtime::FunctionRuntime;
use crate::storage::{QueueStore, ReceivedMessage, StorageError, StorageResult, Ttl};
use crate::traces::JobTrace;
use async_trait::async_trait;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use time::OffsetDateTime;
use tracing::warn;

/// How a message is settled: on the queue (`aqw run`) or by the Functions
/// host (`aqw serve`), so one [`super::process`] serves both modes.
#[async_trait]
pub trait Settle: Send + Sync {
    /// Extend the message lease while the handler runs.
    async fn renew(&self, lease: Duration) -> StorageResult<()>;
    /// Remove the message (after success, a duplicate or a completed poison copy).
    async fn delete(&self) -> StorageResult<()>;
    /// Make the message visible again after `after`.
    async fn retry_after(&self, after: Duration) -> StorageResult<()>;
    /// True when a failed last attempt (`DequeueCount == maxDequeueCount`) is
    /// poisoned by someone else without an error: the Functions host does
    /// that in serve mode. [`super::process`] then writes its own record instead of
    /// deferring at the last attempt.
    fn poisons_failed_last_attempt(&self) -> bool {
        false
    }
    /// True when messages arrive whatever the pause and the breaker say (the
    /// Functions host in `aqw serve`): [`super::process`] then asks the gate
    /// itself, and parks what it may not run.
    fn delivers_while_paused(&self) -> bool {
        false
    }
    /// True when a retry cannot be delayed on the message itself (the
    /// Functions host in `aqw serve` makes a failed message visible again
    /// after its fixed `visibilityTimeout`): a keyed job's retry is then a
    /// fresh copy visible after the retry delay, and its key counts the
    /// attempts ([`super::process`]).
    fn parks_retries(&self) -> bool {
        false
    }
}

/// Settles a message this worker received from the queue.
pub struct QueueSettle {
    queue: Arc<dyn QueueStore>,
    id: String,
    pop_receipt: Mutex<String>,
    text: String,
}

impl QueueSettle {
    /// Settle `msg`, received from `queue`, with its pop receipt.
    pub fn new(queue: Arc<dyn QueueStore>, msg: &ReceivedMessage) -> Self {
        Self {
            queue,
            id: msg.id.clone(),
            pop_receipt: Mutex::new(msg.pop_receipt.clone()),
            text: msg.text.clone(),
        }
    }
    fn receipt(&self) -> String {
        self.pop_receipt.lock().unwrap().clone()
    }
}

#[async_trait]
impl Settle for QueueSettle {
    async fn renew(&self, lease: Duration) -> StorageResult<()> {
        let new = self
            .queue
            .update_visibility(&self.id, &self.receipt(), &self.text, lease)
            .await?;
        *self.pop_receipt.lock().unwrap() = new;
        Ok(())
    }
    async fn delete(&self) -> StorageResult<()> {
        match self.queue.delete(&self.id, &self.receipt()).await {
            // Gone already (a retried delete, or the lease moved on and the
            // next holder will find the key done): nothing is lost.
            Ok(()) | Err(StorageError::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }
    async fn retry_after(&self, after: Duration) -> StorageResult<()> {
        let new = self
            .queue
            .update_visibility(&self.id, &self.receipt(), &self.text, after)
            .await?;
        *self.pop_receipt.lock().unwrap() = new;
        Ok(())
    }
}

/// One message's context while what [`crate::decide`] chose is carried out.
pub(super) struct Settling<'a> {
    pub(super) rt: &'a FunctionRuntime,
    pub(super) msg: &'a ReceivedMessage,
    pub(super) settle: &'a dyn Settle,
    pub(super) key: Option<&'a IdempotencyKey>,
    pub(super) claim: Option<ClaimedKey>,
    pub(super) first_attempt: Option<String>,
    pub(super) trace: &'a JobTrace,
    /// The job's attempt number when it is not the message's DequeueCount
    /// (a retried copy in `aqw serve`: the key's carried attempts + the
    /// copy's DequeueCount); the poison record says this number.
    pub(super) attempt: Option<u32>,
}

impl<'a> Settling<'a> {
    /// The context of `msg`, nothing claimed yet.
    pub(super) fn new(
        rt: &'a FunctionRuntime,
        msg: &'a ReceivedMessage,
        settle: &'a dyn Settle,
        key: Option<&'a IdempotencyKey>,
        trace: &'a JobTrace,
    ) -> Self {
        Self {
            rt,
            msg,
            settle,
            key,
            claim: None,
            first_attempt: None,
            trace,
            attempt: None,
        }
    }
}

impl Settling<'_> {
    /// Claim the job's key for this attempt; what the claim found.
    pub(super) async fn claim(&mut self, lease: Duration) -> StorageResult<KeyState<'static>> {
        let (rt, msg) = (self.rt, self.msg);
        let k = self.key.expect("only a keyed job is claimed");
        let owner = format!("{}/{}/{}", rt.worker_id, msg.id, msg.dequeue_count);
        let next = rt
            .keys
            .claim_attempt(
                &rt.function.name,
                k,
                &owner,
                lease,
                &msg.id,
                msg.dequeue_count,
                msg.insertion_time,
            )
            .await?;
        Ok(match next {
            NextAction::Run(c) => {
                self.first_attempt = c.first_seen.clone();
                self.claim = Some(c);
                KeyState::Claimed
            }
            NextAction::AlreadyDone => KeyState::Settled,
            NextAction::HeldElsewhere { until } => KeyState::Held { until },
        })
    }

    /// Settle a message whose handler did not run.
    pub(super) async fn without_running(&self, how: WithoutRunning) -> Outcome {
        match how {
            WithoutRunning::Duplicate => self.duplicate().await,
            WithoutRunning::Defer { until } => self.defer(until).await,
            WithoutRunning::Poison(case) => self.poison(case).await,
        }
    }

    /// Settle by the fate of the handler's attempt; `success` is what a
    /// successful handler returned.
    pub(super) async fn by_fate(&self, fate: Fate, success: Option<Success>) -> Outcome {
        match fate {
            Fate::Complete => self.complete(success.unwrap_or_default()).await,
            Fate::Retry {
                after,
                reason,
                uncertain,
            } => self.retry(after, &reason, uncertain).await,
            Fate::Release => self.release().await,
            // At the cap while the function's breaker holds (its own, or
            // the fleet's): the provider is down for everyone, which says
            // nothing about this message; it is parked as a fresh copy
            // rather than walked to poison by an outage.
            Fate::Poison(case)
                if matches!(case.kind, ErrorKind::Retryable | ErrorKind::Timeout) =>
            {
                // The hold is read once: a breaker closing meanwhile must not
                // turn this into a plain retry at the cap.
                match self.rt.gate.holds() {
                    Some(cool_down) => {
                        self.park_failure(cool_down, &case.reason, case.uncertain)
                            .await
                    }
                    None => self.poison(case).await,
                }
            }
            Fate::Poison(case) => self.poison(case).await,
        }
    }

    /// The handler succeeded: key done (with its same-store effects), then delete.
    async fn complete(&self, success: Success) -> Outcome {
        failpoint::hit("effect.after");
        if let Some(c) = &self.claim {
            let done = crate::traces::in_step(
                crate::traces::step_span!("aqw.key.done"),
                self.rt
                    .keys
                    .complete_answered(c, success.same_store_effects, success.provider),
            )
            .await;
            if let Err(e) = done {
                return match e {
                    FinishError::Storage(e) => abandoned(e),
                    FinishError::LeaseLost => Outcome::Abandoned {
                        error: "lost the key lease before marking it done".into(),
                    },
                };
            }
            self.close_poisonings_of_done_key(c).await;
        } else if !success.same_store_effects.is_empty() {
            warn!("handler returned same-store effects for a function without keys; they were not written");
        }
        failpoint::hit("done.after");
        match crate::traces::in_step(settle_span("delete"), self.settle.delete()).await {
            Ok(()) => Outcome::Completed,
            Err(e) => abandoned(e),
        }
    }

    /// A key just marked done after an attempt that ended without a result
    /// (`abandoned`: a crash, possibly inside a poisoning): close the key's
    /// open poison records that name no copy, as done. Such a record is a
    /// poisoning interrupted between its record and its copy, whose job
    /// then came back as another message and completed: nothing of the
    /// job is left to act on. A record with its copy is a poisoning that
    /// finished; it stays open for the operator (`poison replay` closes it
    /// as already done). Only such keys pay the query; a failure is logged.
    async fn close_poisonings_of_done_key(&self, c: &ClaimedKey) {
        if !c.history.iter().any(|a| a.outcome == "abandoned") {
            return;
        }
        let by = format!("aqw (key completed by message {})", self.msg.id);
        let store = self.rt.poison.store();
        match store.close_interrupted_of_done_key(c.key.as_str(), &by).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(event = "aqw.poison.closed_done", closed = n, "the key completed: the open poison records its interrupted poisoning left are closed as already done"),
            Err(e) => warn!(error = %e, "could not close the open poison records of a completed key (poison replay closes them as already done)"),
        }
    }

    /// The key is already settled: delete the message without running.
    async fn duplicate(&self) -> Outcome {
        match crate::traces::in_step(settle_span("delete"), self.settle.delete()).await {
            Ok(()) => Outcome::Duplicate,
            Err(e) => abandoned(e),
        }
    }

    /// Another attempt holds the key: hide the message for a short while.
    async fn defer(&self, until: OffsetDateTime) -> Outcome {
        let defer = self.settle.retry_after(defer_delay(until));
        match crate::traces::in_step(settle_span("defer"), defer).await {
            Ok(()) => Outcome::Deferred { until },
            Err(e) => abandoned(e),
        }
    }

    /// Shutdown interrupted the handler: note it on the key, then make the
    /// message visible again at once.
    async fn release(&self) -> Outcome {
        if let Some(c) = &self.claim {
            let _ = self
                .rt
                .keys
                .record_failure_as(c, "released", "interrupted by shutdown", true)
                .await;
        }
        let release = self.settle.retry_after(Duration::ZERO);
        match crate::traces::in_step(settle_span("release"), release).await {
            Ok(()) => Outcome::Released,
            Err(e) => abandoned(e),
        }
    }

    /// How long ago the key's first attempt was (`None` for a keyless job,
    /// or a record without the time).
    pub(super) fn deferred_for(&self) -> Option<Duration> {
        let first = self.first_attempt.as_deref()?;
        let at = time::OffsetDateTime::parse(first, &time::format_description::well_known::Rfc3339)
            .ok()?;
        Duration::try_from(crate::clock::now_utc() - at)
            .ok()
            .or(Some(Duration::ZERO))
    }

    /// A failure while the breaker holds: note it on the key, then park.
    async fn park_failure(&self, cool_down: Duration, message: &str, uncertain: bool) -> Outcome {
        if let Some(c) = &self.claim {
            let noted = self
                .rt
                .keys
                .record_failure_given_back(c, "retried", message, uncertain);
            if let Err(FinishError::Storage(e)) = noted.await {
                return abandoned(e);
            }
        }
        self.park(cool_down).await
    }

    /// The provider said "later": note it on the key (refused, not
    /// applied), then put the job back as a fresh copy visible after
    /// `after`, so the refusal spends no attempt (issue 37).
    pub(super) async fn defer_later(&self, after: Duration, message: &str) -> Outcome {
        if let Some(c) = &self.claim {
            let noted = self
                .rt
                .keys
                .record_failure_given_back(c, "retried", message, false);
            if let Err(FinishError::Storage(e)) = noted.await {
                return abandoned(e);
            }
        }
        tracing::info!(event = "aqw.job.later", error = %crate::scrub::scrub(message), retry_in_s = after.as_secs_f64(), "the provider said later; waiting without spending an attempt");
        metrics::counter!("aqw_deferrals_total", "function" => self.rt.function.name.clone())
            .increment(1);
        self.park(after).await
    }

    /// The provider is still running the first request with this key
    /// (409): note it on the key (outcome `in_progress`, may have taken
    /// effect: that request may complete), then put the job back as a
    /// fresh copy visible after `after`, spending no attempt.
    pub(super) async fn wait_in_progress(&self, after: Duration, message: &str) -> Outcome {
        if let Some(c) = &self.claim {
            let noted = self.rt.keys.record_failure_given_back(
                c,
                super::outcome::IN_PROGRESS_OUTCOME,
                message,
                true,
            );
            if let Err(FinishError::Storage(e)) = noted.await {
                return abandoned(e);
            }
        }
        tracing::info!(event = "aqw.job.in_progress", error = %crate::scrub::scrub(message), retry_in_s = after.as_secs_f64(), "the provider is still processing this key; waiting without spending an attempt");
        metrics::counter!("aqw_deferrals_total", "function" => self.rt.function.name.clone())
            .increment(1);
        self.park(after).await
    }

    /// A failed attempt below the cap: note it on the key, then hide the
    /// message until `after` (or, while the breaker is open, park it).
    async fn retry(&self, after: Duration, message: &str, uncertain: bool) -> Outcome {
        let rt = self.rt;
        if let (true, Some(c), None) = (self.settle.parks_retries(), &self.claim, rt.gate.holds()) {
            return self.retry_as_copy(c, after, message, uncertain).await;
        }
        // The hold is read once: parked, the attempt is given back (the
        // provider is down for everyone, which says nothing of this job).
        let hold = rt.gate.holds();
        if let Some(c) = &self.claim {
            let noted = match hold {
                Some(_) => {
                    rt.keys
                        .record_failure_given_back(c, "retried", message, uncertain)
                        .await
                }
                None => rt.keys.record_failure(c, message, uncertain).await,
            };
            if let Err(FinishError::Storage(e)) = noted {
                return abandoned(e);
            }
        }
        if let Some(cool_down) = hold {
            return self.park(cool_down).await;
        }
        warn!(event = "aqw.job.retry", error = %crate::scrub::scrub(message), retry_in_s = after.as_secs_f64(), "attempt failed; will retry");
        metrics::counter!("aqw_retries_total", "function" => rt.function.name.clone()).increment(1);
        let retry = self.settle.retry_after(after);
        match crate::traces::in_step(settle_span("retry"), retry).await {
            Ok(()) => Outcome::Retried { after },
            Err(e) => abandoned(e),
        }
    }

    /// A failed attempt below the cap whose settler cannot delay the
    /// message (`aqw serve`): a fresh copy visible after `after`, then the
    /// failure and the attempts spent so far on the key, then the message
    /// deleted (the host deletes it on the 200). A failed put falls back to
    /// the host's own retry (the key counts it through the DequeueCount).
    /// A crash after the put leaves two copies, and the key makes one a
    /// duplicate once the other settles: before the key's update, the copy
    /// counts this attempt less (the host's redelivery of the original
    /// counts it); after it, the original counts it twice.
    async fn retry_as_copy(
        &self,
        c: &ClaimedKey,
        after: Duration,
        message: &str,
        uncertain: bool,
    ) -> Outcome {
        let rt = self.rt;
        let span = settle_span("retry");
        if let Err(e) = crate::traces::in_step(span.clone(), self.put_copy(after)).await {
            warn!(event = "aqw.job.retry", error = %crate::scrub::scrub(message), put_error = %crate::scrub::scrub(&e.to_string()), "attempt failed; could not put the retry copy, so the host retries after its visibilityTimeout");
            return match rt.keys.record_failure(c, message, uncertain).await {
                Err(FinishError::Storage(e)) => abandoned(e),
                _ => Outcome::Retried { after },
            };
        }
        let carried = rt
            .keys
            .record_failure_carried(c, message, uncertain, c.dequeue_count)
            .await;
        if let Err(FinishError::Storage(e)) = carried {
            // The copy is on the queue: a 503 now would make the host
            // redeliver the original too (two chains, and the host poisons
            // the original at its cap with no record). Let the copy carry
            // on; the key's lease expires by itself, and the next attempt
            // counts one attempt less.
            warn!(event = "aqw.job.retry", error = %crate::scrub::scrub(&e.to_string()), "the retry copy is on the queue but the key was not updated; the copy goes on");
        }
        warn!(event = "aqw.job.retry", error = %crate::scrub::scrub(message), retry_in_s = after.as_secs_f64(), attempt = c.dequeue_count, "attempt failed; will retry as a fresh copy");
        metrics::counter!("aqw_retries_total", "function" => rt.function.name.clone()).increment(1);
        match crate::traces::in_step(span, self.settle.delete()).await {
            Ok(()) => Outcome::RetriedAsCopy { after },
            Err(e) => abandoned(e),
        }
    }

    /// Put the message's text back as a fresh copy visible after `after`,
    /// a claim-check reference's blob refreshed first.
    async fn put_copy(&self, after: Duration) -> Result<(), StorageError> {
        let rt = self.rt;
        let (text, encoding) = (&self.msg.text, rt.app.message_encoding);
        let scope = rt.app.claim_check.scope(&rt.function.queue);
        crate::claim::refresh_before_reput(rt.blobs.as_ref(), text, encoding, scope).await;
        rt.source.put(text, after, Ttl::Default).await.map(|_| ())
    }

    /// Park a message the gate holds as a fresh copy, unless it is a leftover
    /// of its own poisoning (its record names its copy: a redelivery whose
    /// delete was lost, its key perhaps never marked, seed 9893) or its key's
    /// record already settles it ([`crate::idempotency::store::settles_copy`]): a fresh copy has a new id
    /// and insertion time, so such a leftover came back as a new message and
    /// was poisoned again, a second record for one job (seed 8507). One or two
    /// point reads per park, and parks happen only while the gate holds or a
    /// key is at its limit; a failed read parks as before.
    pub(super) async fn park_unless_settled(
        &self,
        key: Option<&crate::idempotency::IdempotencyKey>,
        after: std::time::Duration,
    ) -> Outcome {
        let rt = self.rt;
        let sink = &rt.poison;
        if let Ok(Some((e, _))) = sink.records.get(&sink.source_queue, &self.msg.id).await {
            if crate::poison::PoisonRecord::from_entity(&e)
                .poison_message_id
                .is_some()
            {
                return self.without_running(WithoutRunning::Duplicate).await;
            }
        }
        if let Some(k) = key {
            if let Ok(Some(rec)) = rt.keys.get(&rt.function.name, k).await {
                if crate::idempotency::store::settles_copy(&rec, self.msg.insertion_time) {
                    return self.without_running(WithoutRunning::Duplicate).await;
                }
            }
        }
        self.park(after).await
    }

    /// Replace the message by a fresh copy visible after `after`, then
    /// delete it: the copy starts at DequeueCount 0, so the receives the
    /// breaker wasted do not count toward `maxDequeueCount`. A crash between
    /// the two leaves both; the key makes the second a duplicate.
    pub(super) async fn park(&self, after: Duration) -> Outcome {
        let span = settle_span("park");
        if let Err(e) = crate::traces::in_step(span.clone(), self.put_copy(after)).await {
            return abandoned(e);
        }
        match crate::traces::in_step(span, self.settle.delete()).await {
            Ok(()) => Outcome::Parked { after },
            Err(e) => abandoned(e),
        }
    }

    /// The single poison exit: record + envelope, key marked poisoned, source
    /// deleted, all under one `poison` settle span.
    async fn poison(&self, case: PoisonCase) -> Outcome {
        crate::traces::in_step(settle_span("poison"), self.write_poison(case)).await
    }

    async fn write_poison(&self, case: PoisonCase) -> Outcome {
        let PoisonCase {
            kind,
            reason,
            uncertain,
        } = case;
        let info = ErrorInfo {
            kind,
            message: reason,
        };
        let (rt, trace_parent) = (self.rt, Some(self.trace.context.traceparent()));
        let first_attempt_at = self.first_attempt.clone();
        // Earlier attempts the key remembers, and this one.
        let uncertain_attempts = self.claim.as_ref().map_or(0, |c| {
            c.history.iter().filter(|a| a.may_have_taken_effect).count()
        }) as u32
            + u32::from(uncertain);
        let counted;
        let msg = match self.attempt {
            Some(n) => {
                counted = ReceivedMessage {
                    dequeue_count: n,
                    ..self.msg.clone()
                };
                &counted
            }
            None => self.msg,
        };
        if let Err(e) = rt
            .poison
            .write_counted(
                msg,
                self.key,
                &info,
                first_attempt_at,
                trace_parent,
                uncertain_attempts,
            )
            .await
        {
            return abandoned(e);
        }
        if let Some(c) = &self.claim {
            if let Err(e) = rt.keys.mark_poisoned(c, &info.message, uncertain).await {
                warn!(error = %e, "could not mark the key poisoned (it stays pending; a replay still runs)");
            }
        }
        match self.settle.delete().await {
            Ok(()) => Outcome::Poisoned {
                reason: format!("{}: {}", kind.as_str(), crate::scrub::scrub(&info.message)),
            },
            Err(e) => abandoned(e),
        }
    }
}

/// The span of carrying out a fate (`delete`, `retry`, `poison`, ...).
fn settle_span(action: &'static str) -> tracing::Span {
    crate::traces::step_span!(
        "aqw.settle",
        action,
        messaging.system = crate::traces::MESSAGING_SYSTEM,
        messaging.operation.type = "settle"
    )
}

/// Look again soon rather than at the lease's end: the holder usually
/// finishes in far less, and then the message is a duplicate.
fn defer_delay(until: OffsetDateTime) -> Duration {
    let remaining = Duration::try_from(until - crate::clock::now_utc()).unwrap_or(Duration::ZERO);
    (remaining + Duration::from_secs(1)).min(Duration::from_secs(3))
}
