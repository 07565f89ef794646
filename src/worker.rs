//! The worker: one function ([`process`]) decides every message's fate, and a
//! poll loop per function feeds it (permits before receiving, lease renewal,
//! timeouts, retry delays, graceful drain).

use crate::app::{ensure_resources, runtimes, FunctionRuntime};
use crate::config::{AppConfig, KeySpec};
use crate::decide::{decide, Action, AttemptResult, Facts, KeyState, Policy};
use crate::failpoint;
use crate::handlers::{HandlerError, Job, Registry, Success};
use crate::http::Health;
use crate::idempotency::{derive_key, ClaimedKey, FinishError, IdempotencyKey, NextAction};
use crate::message::{decode, ErrorInfo, ErrorKind};
use crate::retry::polling_delay;
use crate::storage::{QueueStore, ReceivedMessage, StorageError, StorageResult};
use crate::telemetry::Alerts;
use crate::traces::JobTrace;
use async_trait::async_trait;
use rand::Rng;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use time::OffsetDateTime;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn, Instrument};

/// What happened to one message.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The handler succeeded; key done, message deleted.
    Completed,
    /// The key was already done; message deleted without running.
    Duplicate,
    /// Another worker holds the key's lease; message hidden until it ends.
    Deferred { until: OffsetDateTime },
    /// Retryable failure below the cap; message visible again after `after`.
    Retried { after: Duration },
    /// Copied to `<queue>-poison` with its record, then deleted.
    Poisoned { reason: String },
    /// Shutdown interrupted the handler; message made visible at once.
    Released,
    /// Storage failed mid-way; the message reappears when its lease ends.
    Abandoned { error: String },
}

impl Outcome {
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::Duplicate => "duplicate",
            Outcome::Deferred { .. } => "deferred",
            Outcome::Retried { .. } => "retried",
            Outcome::Poisoned { .. } => "poisoned",
            Outcome::Released => "released",
            Outcome::Abandoned { .. } => "abandoned",
        }
    }
}

/// How a message is settled: on the queue (`aqw run`) or by the Functions
/// host (`aqw serve`), so one [`process`] serves both modes.
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
    /// that in serve mode. [`process`] then writes its own record instead of
    /// deferring at the last attempt.
    fn poisons_failed_last_attempt(&self) -> bool {
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

enum HandlerRun {
    Finished(Result<Success, HandlerError>),
    TimedOut(Duration),
    Interrupted,
}

/// Decide and carry out one message's fate. The only way into the poison
/// queue. The decisions are [`decide`]'s; this function gathers the facts
/// for it (decoding, the key, the key's record, the handler's result) and
/// carries out each [`Action`].
pub async fn process(
    rt: &FunctionRuntime,
    msg: &ReceivedMessage,
    settle: &dyn Settle,
    trace: &JobTrace,
    hard_stop: &CancellationToken,
) -> Outcome {
    let policy = Policy {
        host_poisons_failed_last_attempt: settle.poisons_failed_last_attempt(),
        ..rt.policy
    };
    let dc = msg.dequeue_count;
    // Decode and derive the key first: both are pure, and the key's record
    // carries the last error for the over-the-cap case.
    let payload = decode(&msg.text, rt.app.message_encoding);
    let (key, key_error) = key_of(&rt.function.key, &payload);
    let decode_error = payload.as_ref().err().map(|e| e.to_string());
    let facts = Facts {
        dequeue_count: dc,
        decode_error: decode_error.as_deref(),
        key_error: key_error.as_deref(),
    };
    if let Some(k) = &key {
        tracing::Span::current().record("key", k.as_str());
    }
    let mut ctx = Settling {
        rt,
        msg,
        settle,
        key: key.as_ref(),
        claim: None,
        first_attempt: None,
        trace,
    };
    let jitter = rand::thread_rng().gen();
    // Over the cap, the key's record decides first (see `decide`).
    let over_cap_record = match &key {
        Some(k) if dc > policy.max_dequeue_count => {
            rt.keys.get(&rt.function.name, k).await.ok().flatten()
        }
        _ => None,
    };
    let state = match (&key, &over_cap_record) {
        (None, _) => KeyState::Keyless,
        (Some(_), _) if dc <= policy.max_dequeue_count => KeyState::Unclaimed,
        (Some(_), None) => KeyState::Free { last_error: None },
        (Some(_), Some(rec)) => {
            ctx.first_attempt = rec.first_seen.clone();
            key_state_of(rec)
        }
    };
    let mut action = decide(&facts, &state, &AttemptResult::NotRun, &policy, jitter);
    if action == Action::Claim {
        let claim_span = crate::traces::step_span!(
            "aqw.key.claim",
            otel.status_code = tracing::field::Empty,
            otel.status_message = tracing::field::Empty
        );
        let state = match ctx.claim(policy.lease).instrument(claim_span.clone()).await {
            Ok(state) => state,
            Err(e) => {
                crate::traces::fail_step(&claim_span, &e.to_string());
                return abandoned(e);
            }
        };
        action = decide(&facts, &state, &AttemptResult::NotRun, &policy, jitter);
    }
    if action != Action::Run {
        return ctx.carry_out(action).await;
    }
    failpoint::hit("claim.after");
    let Ok(payload) = payload else {
        unreachable!("decide runs only decoded payloads")
    };
    run_and_settle(&mut ctx, payload, &facts, &policy, jitter, hard_stop).await
}

/// Run the handler, then settle by what it returned.
async fn run_and_settle(
    ctx: &mut Settling<'_>,
    payload: String,
    facts: &Facts<'_>,
    policy: &Policy,
    jitter: f64,
    hard_stop: &CancellationToken,
) -> Outcome {
    let (run, success) = ctx.run(payload, hard_stop).await;
    let timeout_message;
    let attempt = match &run {
        HandlerRun::Finished(Ok(_)) => AttemptResult::Succeeded,
        HandlerRun::Interrupted => AttemptResult::Interrupted,
        HandlerRun::TimedOut(t) => {
            timeout_message = format!("handler exceeded functionTimeout ({t:?})");
            AttemptResult::Failed {
                kind: ErrorKind::Timeout,
                message: &timeout_message,
                retry_after: None,
                // A timeout cut the handler off mid-way: it may have acted.
                uncertain: true,
            }
        }
        HandlerRun::Finished(Err(e)) => failed_attempt(e),
    };
    match decide(facts, &KeyState::Claimed, &attempt, policy, jitter) {
        Action::Complete => ctx.complete(success.unwrap_or_default()).await,
        other => ctx.carry_out(other).await,
    }
}

/// The job's key, or why none could be derived (nothing for an
/// undecodable payload: the decode error is the one that counts).
fn key_of<E>(
    spec: &KeySpec,
    payload: &Result<String, E>,
) -> (Option<IdempotencyKey>, Option<String>) {
    match payload {
        Ok(p) => match derive_key(spec, p) {
            Ok(k) => (k, None),
            Err(e) => (None, Some(e)),
        },
        Err(_) => (None, None),
    }
}

/// What a key record read over the cap says.
fn key_state_of(rec: &crate::idempotency::KeyRecord) -> KeyState<'_> {
    if rec.status.is_settled() {
        KeyState::Settled
    } else if let Some(until) = rec.lease_live(OffsetDateTime::now_utc()) {
        KeyState::Held { until }
    } else {
        KeyState::Free {
            last_error: rec.last_error.as_deref(),
        }
    }
}

fn failed_attempt(e: &HandlerError) -> AttemptResult<'_> {
    match e {
        HandlerError::Retryable {
            message,
            retry_after,
            may_have_taken_effect,
        } => AttemptResult::Failed {
            kind: ErrorKind::Retryable,
            message,
            retry_after: *retry_after,
            uncertain: *may_have_taken_effect,
        },
        HandlerError::Permanent { message } => AttemptResult::Failed {
            kind: ErrorKind::Permanent,
            message,
            retry_after: None,
            uncertain: false,
        },
    }
}

/// One message's context while its [`Action`]s are carried out.
struct Settling<'a> {
    rt: &'a FunctionRuntime,
    msg: &'a ReceivedMessage,
    settle: &'a dyn Settle,
    key: Option<&'a IdempotencyKey>,
    claim: Option<ClaimedKey>,
    first_attempt: Option<String>,
    trace: &'a JobTrace,
}

impl Settling<'_> {
    /// Claim the job's key for this attempt; what the claim found.
    async fn claim(&mut self, lease: Duration) -> StorageResult<KeyState<'static>> {
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

    /// Run the handler under the claim; the success is kept for `complete`.
    async fn run(
        &mut self,
        payload: String,
        hard_stop: &CancellationToken,
    ) -> (HandlerRun, Option<Success>) {
        let rt = self.rt;
        let claim = self.claim.as_ref();
        // The handler call is its own span; its context is what the handler
        // receives (traceparent header, TRACEPARENT), so its spans hang there.
        let span = crate::traces::step_span!("aqw.handler", otel.kind = "client", function = %rt.function.name,
            otel.status_code = tracing::field::Empty, otel.status_message = tracing::field::Empty);
        let job = Job {
            function: rt.function.name.clone(),
            message_id: self.msg.id.clone(),
            dequeue_count: self.msg.dequeue_count,
            payload,
            key: self.key.cloned(),
            provider_key: claim.map(|c| c.provider_key.clone()),
            previously_pending: claim.is_some_and(|c| c.previously_pending),
            key_partition: claim.map(|c| c.partition_key.clone()),
            trace: Some(self.trace.context_within(&span)),
        };
        let started = Instant::now();
        let run = run_handler(rt, &job, self.settle, self.claim.as_mut(), hard_stop)
            .instrument(span.clone())
            .await;
        match &run {
            HandlerRun::Finished(Err(e)) => crate::traces::fail_step(&span, &e.to_string()),
            HandlerRun::TimedOut(_) => crate::traces::fail_step(&span, "functionTimeout exceeded"),
            HandlerRun::Interrupted => crate::traces::fail_step(&span, "interrupted by shutdown"),
            HandlerRun::Finished(Ok(_)) => {}
        }
        metrics::histogram!("aqw_handler_duration_seconds", "function" => rt.function.name.clone())
            .record(started.elapsed().as_secs_f64());
        match run {
            HandlerRun::Finished(Ok(success)) => {
                (HandlerRun::Finished(Ok(Success::done())), Some(success))
            }
            other => (other, None),
        }
    }

    /// The handler succeeded: key done (with its same-store effects), then delete.
    async fn complete(&self, success: Success) -> Outcome {
        failpoint::hit("effect.after");
        if let Some(c) = &self.claim {
            let done = self
                .rt
                .keys
                .complete(c, success.same_store_effects)
                .instrument(crate::traces::step_span!("aqw.key.done"))
                .await;
            if let Err(e) = done {
                return match e {
                    FinishError::Storage(e) => abandoned(e),
                    FinishError::LeaseLost => Outcome::Abandoned {
                        error: "lost the key lease before marking it done".into(),
                    },
                };
            }
        } else if !success.same_store_effects.is_empty() {
            warn!("handler returned same-store effects for a function without keys; they were not written");
        }
        failpoint::hit("done.after");
        match self.settle.delete().instrument(settle_span("delete")).await {
            Ok(()) => Outcome::Completed,
            Err(e) => abandoned(e),
        }
    }

    async fn carry_out(&self, action: Action) -> Outcome {
        let rt = self.rt;
        match action {
            Action::Duplicate => match self.settle.delete().instrument(settle_span("delete")).await
            {
                Ok(()) => Outcome::Duplicate,
                Err(e) => abandoned(e),
            },
            Action::Defer { until } => match self
                .settle
                .retry_after(defer_delay(until))
                .instrument(settle_span("defer"))
                .await
            {
                Ok(()) => Outcome::Deferred { until },
                Err(e) => abandoned(e),
            },
            Action::Release => {
                if let Some(c) = &self.claim {
                    let _ = rt
                        .keys
                        .record_failure_as(c, "released", "interrupted by shutdown", true)
                        .await;
                }
                match self
                    .settle
                    .retry_after(Duration::ZERO)
                    .instrument(settle_span("release"))
                    .await
                {
                    Ok(()) => Outcome::Released,
                    Err(e) => abandoned(e),
                }
            }
            Action::Retry {
                after,
                reason,
                uncertain,
            } => self.retry(after, &reason, uncertain).await,
            Action::Poison {
                kind,
                reason,
                uncertain,
            } => {
                poison(
                    rt,
                    self.msg,
                    self.settle,
                    self.claim.as_ref(),
                    self.key,
                    kind,
                    reason,
                    self.first_attempt.clone(),
                    uncertain,
                    Some(self.trace.context.traceparent()),
                )
                .instrument(settle_span("poison"))
                .await
            }
            Action::Complete => self.complete(Success::done()).await,
            Action::Claim | Action::Run => {
                unreachable!("process claims and runs before carrying out")
            }
        }
    }

    /// A failed attempt below the cap: note it on the key, then hide the
    /// message until `after`.
    async fn retry(&self, after: Duration, message: &str, uncertain: bool) -> Outcome {
        let rt = self.rt;
        if let Some(c) = &self.claim {
            if let Err(FinishError::Storage(e)) =
                rt.keys.record_failure(c, message, uncertain).await
            {
                return abandoned(e);
            }
        }
        warn!(event = "aqw.job.retry", error = %crate::telemetry::scrub(message), retry_in_s = after.as_secs_f64(), "attempt failed; will retry");
        metrics::counter!("aqw_retries_total", "function" => rt.function.name.clone()).increment(1);
        match self
            .settle
            .retry_after(after)
            .instrument(settle_span("retry"))
            .await
        {
            Ok(()) => Outcome::Retried { after },
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
    let remaining = Duration::try_from(until - OffsetDateTime::now_utc()).unwrap_or(Duration::ZERO);
    (remaining + Duration::from_secs(1)).min(Duration::from_secs(3))
}

fn abandoned(e: StorageError) -> Outcome {
    Outcome::Abandoned {
        error: e.to_string(),
    }
}

/// Run the handler, renewing the message and key leases at half-life, under
/// `functionTimeout`, until it finishes or a hard stop interrupts it.
async fn run_handler(
    rt: &FunctionRuntime,
    job: &Job,
    settle: &dyn Settle,
    mut claim: Option<&mut ClaimedKey>,
    hard_stop: &CancellationToken,
) -> HandlerRun {
    let lease = rt.app.lease;
    let half = lease / 2;
    let handler = rt.handler.clone();
    let fut = handler.handle(job);
    tokio::pin!(fut);
    let deadline = rt
        .app
        .function_timeout
        .map(|t| tokio::time::Instant::now() + t);
    let mut renew_at = tokio::time::Instant::now() + half;
    loop {
        let timeout = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = &mut fut => return HandlerRun::Finished(r),
            _ = timeout => return HandlerRun::TimedOut(rt.app.function_timeout.unwrap_or_default()),
            _ = hard_stop.cancelled() => return HandlerRun::Interrupted,
            _ = tokio::time::sleep_until(renew_at) => {
                if let Err(e) = settle.renew(lease).await {
                    warn!(error = %e, "could not renew the message lease");
                }
                if let Some(c) = claim.as_deref_mut() {
                    if let Err(e) = rt.keys.extend(c, lease).await {
                        warn!(error = %e, "could not extend the key lease");
                    }
                }
                renew_at += half;
            }
        }
    }
}

/// The single poison exit: record + envelope, key marked poisoned, source deleted.
#[allow(clippy::too_many_arguments)]
async fn poison(
    rt: &FunctionRuntime,
    msg: &ReceivedMessage,
    settle: &dyn Settle,
    claim: Option<&ClaimedKey>,
    key: Option<&IdempotencyKey>,
    kind: ErrorKind,
    message: String,
    first_attempt_at: Option<String>,
    uncertain: bool,
    trace_parent: Option<String>,
) -> Outcome {
    let info = ErrorInfo { kind, message };
    if let Err(e) = rt
        .poison
        .write(msg, key, &info, first_attempt_at, trace_parent)
        .await
    {
        return abandoned(e);
    }
    if let Some(c) = claim {
        if let Err(e) = rt.keys.mark_poisoned(c, &info.message, uncertain).await {
            warn!(error = %e, "could not mark the key poisoned (it stays pending; a replay still runs)");
        }
    }
    match settle.delete().await {
        Ok(()) => Outcome::Poisoned {
            reason: format!(
                "{}: {}",
                kind.as_str(),
                crate::telemetry::scrub(&info.message)
            ),
        },
        Err(e) => abandoned(e),
    }
}

/// Liveness and readiness, shared with the HTTP endpoints.
/// Poll one function's queue until `shutdown`; in-flight jobs run on `tracker`.
pub async fn poll_loop(
    rt: Arc<FunctionRuntime>,
    shutdown: CancellationToken,
    hard_stop: CancellationToken,
    tracker: TaskTracker,
    health: Arc<Health>,
) {
    let app = rt.app.clone();
    let batch = app.batch_size;
    let permits = Arc::new(Semaphore::new((batch + app.new_batch_threshold) as usize));
    let mut empty_polls = 0u32;
    let mut failures = 0u32;
    let fname = rt.function.name.clone();
    loop {
        // Take the permits before receiving: poll only when in-flight ≤ newBatchThreshold.
        let mut owned = tokio::select! {
            p = permits.clone().acquire_many_owned(batch) => p.expect("semaphore never closed"),
            _ = shutdown.cancelled() => break,
        };
        let received = tokio::select! {
            r = rt.source.receive(batch as u8, app.lease) => r,
            _ = shutdown.cancelled() => break,
        };
        let delay = match received {
            Ok(msgs) => {
                failures = 0;
                health
                    .ready
                    .store(!health.draining.load(Ordering::Relaxed), Ordering::Relaxed);
                health.beat();
                if msgs.is_empty() {
                    empty_polls += 1;
                    polling_delay(
                        empty_polls,
                        app.max_polling_interval,
                        rand::thread_rng().gen(),
                    )
                } else {
                    empty_polls = 0;
                    for msg in msgs {
                        let permit = owned.split(1).expect("one permit per received message");
                        spawn_job(&tracker, rt.clone(), msg, permit, hard_stop.clone());
                    }
                    Duration::ZERO
                }
            }
            Err(StorageError::NotFound) => {
                // The queue does not exist yet: create it and carry on.
                if let Err(e) = rt.source.create_if_missing().await {
                    warn!(function = %fname, error = %e, "cannot create the queue");
                }
                Duration::from_millis(500)
            }
            Err(e) => {
                failures += 1;
                if failures >= 3 {
                    health.ready.store(false, Ordering::Relaxed);
                }
                health.beat();
                let d = polling_delay(
                    failures,
                    app.max_polling_interval.max(Duration::from_secs(5)),
                    rand::thread_rng().gen(),
                );
                warn!(event = "aqw.storage.unavailable", function = %fname, error = %e, retry_in_ms = d.as_millis() as u64, "receive failed; backing off");
                d
            }
        };
        drop(owned);
        if !delay.is_zero() {
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = shutdown.cancelled() => break,
            }
        }
    }
}

/// Process one received message on the tracker, holding its permit until done.
fn spawn_job(
    tracker: &TaskTracker,
    rt: Arc<FunctionRuntime>,
    msg: ReceivedMessage,
    permit: tokio::sync::OwnedSemaphorePermit,
    hard_stop: CancellationToken,
) {
    let span = crate::traces::job_span(
        &rt.function.name,
        &rt.function.queue,
        &msg.id,
        msg.dequeue_count,
    );
    let trace = crate::traces::start_job(&span, producer_context(&rt, &msg).as_ref());
    tracker.spawn(
        async move {
            let settle = QueueSettle::new(rt.source.clone(), &msg);
            let started = Instant::now();
            let outcome = process(&rt, &msg, &settle, &trace, &hard_stop).await;
            record_outcome(&rt.function.name, &outcome, started.elapsed(), &trace);
            drop(permit);
        }
        .instrument(span),
    );
}

/// The producer's trace context, where `aqw.tracing.parent` says a JSON
/// payload carries it (nothing is read otherwise).
pub fn producer_context(
    rt: &FunctionRuntime,
    msg: &ReceivedMessage,
) -> Option<crate::traces::TraceContext> {
    let pointer = rt.app.trace_parent.as_deref()?;
    let payload = decode(&msg.text, rt.app.message_encoding).ok()?;
    crate::traces::context_in_payload(pointer, &payload)
}

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
        Outcome::Poisoned { reason } => Some(crate::telemetry::scrub(reason)),
        Outcome::Abandoned { error } => Some(crate::telemetry::scrub(error)),
        Outcome::Retried { .. } => Some("attempt failed; will retry".to_string()),
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
        Outcome::Retried { after } => line!(
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
    }
    if matches!(outcome, Outcome::Duplicate) {
        metrics::counter!("aqw_duplicates_total", "function" => function.to_string()).increment(1);
    }
    if matches!(outcome, Outcome::Poisoned { .. }) {
        metrics::counter!("aqw_poisoned_total", "function" => function.to_string()).increment(1);
    }
}

/// `aqw run`: poll every function until `shutdown`, then drain.
pub async fn run(
    app: Arc<AppConfig>,
    registry: Registry,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let alerts = Alerts::start(app.alert_webhook.clone(), app.alert_window);
    let rts = runtimes(&app, &registry, &alerts)?;
    for s in &app.skipped {
        warn!(event = "aqw.function.skipped", function = %s.name, reason = %s.reason, "function not run");
    }
    let health = Arc::new(Health::default());
    let server = match app.http_port {
        Some(port) => {
            Some(crate::http::serve_ops(port, health.clone(), rts.clone(), shutdown.clone()).await?)
        }
        None => None,
    };
    if !ensure_resources(&rts, &shutdown).await {
        return Ok(());
    }
    health.ready.store(true, Ordering::Relaxed);
    info!(
        event = "aqw.worker.started",
        functions = rts.len(),
        "worker started"
    );
    let tracker = TaskTracker::new();
    let hard_stop = CancellationToken::new();
    let mut loops = Vec::new();
    for rt in &rts {
        loops.push(tokio::spawn(poll_loop(
            rt.clone(),
            shutdown.clone(),
            hard_stop.clone(),
            tracker.clone(),
            health.clone(),
        )));
    }
    shutdown.cancelled().await;
    health.draining.store(true, Ordering::Relaxed);
    health.ready.store(false, Ordering::Relaxed);
    for l in loops {
        let _ = l.await;
    }
    tracker.close();
    info!(
        event = "aqw.worker.draining",
        in_flight = tracker.len(),
        timeout_s = app.shutdown_timeout.as_secs_f64(),
        "draining in-flight jobs"
    );
    if tokio::time::timeout(app.shutdown_timeout, tracker.wait())
        .await
        .is_err()
    {
        warn!(
            event = "aqw.worker.release",
            in_flight = tracker.len(),
            "shutdown timeout reached; releasing unfinished jobs"
        );
        hard_stop.cancel();
        // Releasing is a couple of storage calls per job.
        let _ = tokio::time::timeout(Duration::from_secs(10), tracker.wait()).await;
    }
    if let Some(s) = server {
        s.abort();
    }
    info!(event = "aqw.worker.stopped", "worker stopped");
    Ok(())
}
