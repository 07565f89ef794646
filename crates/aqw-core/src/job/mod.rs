//! The pipeline for one message, shared by `aqw run` ([`crate::worker`]) and
//! `aqw serve` (the `aqw` crate's `serve`): decode, derive the key, look at the key's
//! record, claim, run the handler, and settle by what [`crate::decide`]
//! chose; then one outcome line and its counters.
//!
//! - `mod.rs`: [`process`], gathering the facts for each stage;
//! - `settle.rs`: [`Settle`] ([`QueueSettle`] for the queue) and carrying
//!   each choice out, with the single poison exit;
//! - `handler.rs`: running the handler (lease renewal, `functionTimeout`,
//!   hard stop);
//! - `outcome.rs`: [`Outcome`] and [`record_outcome`].

mod handler;
mod later;
mod outcome;
mod settle;

pub use outcome::{record_outcome, Outcome};
pub use settle::{QueueSettle, Settle};

use crate::breaker::{Admission, Attempt as BreakerAttempt};
use crate::config::KeySpec;
use crate::decide::{
    dequeue_bound, fate, next_step, AttemptResult, Facts, KeyState, NextStep, Policy,
    WithoutRunning,
};
use crate::failpoint;
use crate::handler::HandlerError;
use crate::idempotency::store::settles_copy;
use crate::idempotency::{derive_key, IdempotencyKey, KeyRecord};
use crate::message::{ErrorKind, Payload};
use crate::runtime::FunctionRuntime;
use crate::storage::{ReceivedMessage, StorageError};
use crate::traces::JobTrace;
use handler::HandlerRun;
use outcome::abandoned;
use settle::Settling;
use tokio_util::sync::CancellationToken;

/// Decide and carry out one message's fate. The only way into the poison
/// queue. The decisions are [`crate::decide`]'s; this function gathers the
/// facts for each stage (decoding, the key, the key's record, the handler's
/// result) and has them carried out.
pub async fn process(
    rt: &FunctionRuntime,
    msg: &ReceivedMessage,
    delivered: &Payload,
    settle: &dyn Settle,
    trace: &JobTrace,
    hard_stop: &CancellationToken,
) -> Outcome {
    let policy = Policy {
        host_poisons_failed_last_attempt: settle.poisons_failed_last_attempt(),
        ..rt.policy
    };
    // Decode (fetching a claim-checked body), then the key: over the cap its record decides.
    let (decoded, claim_failure) = match body_of(rt, delivered).await {
        Ok(body) => body,
        Err(e) => return abandoned(e),
    };
    let (key, key_error) = key_of(&rt.function.key, &decoded);
    let mut facts = Facts {
        dequeue_count: msg.dequeue_count,
        attempt: None,
        payload: decoded.as_deref().map_err(String::as_str),
        key_error: key_error.as_deref(),
    };
    if let Some(k) = &key {
        tracing::Span::current().record("key", k.as_str());
    }
    let mut ctx = Settling::new(rt, msg, settle, key.as_ref(), trace);
    if let Some(case) = claim_failure {
        return ctx.without_running(WithoutRunning::Poison(case)).await;
    }
    // Held until the job settles: its slot under the per-key limit.
    let _key_slot = match admit(rt, settle, &decoded).await {
        Ok(slot) => slot,
        Err(after) => return ctx.park_unless_settled(key.as_ref(), after).await,
    };
    let over_cap_record = match over_cap_record(rt, key.as_ref(), msg, &policy, &mut facts).await {
        Ok(rec) => rec,
        Err(e) => return abandoned(e),
    };
    let mut state = initial_key_state(&mut ctx, &policy, over_cap_record.as_ref());
    // A claim finds the key claimed, settled or held, never unclaimed: the
    // second answer is a run or a settlement.
    let payload = loop {
        match next_step(&facts, &state, &policy) {
            NextStep::Claim => match claim_counted(&mut ctx, &mut facts, &policy).await {
                Ok(claimed) => state = claimed,
                Err(outcome) => return outcome,
            },
            NextStep::Run { payload } => break payload,
            NextStep::Settle(how) => return ctx.without_running(how).await,
        }
    };
    failpoint::hit("claim.after");
    run_and_settle(&mut ctx, payload.to_string(), &facts, &policy, hard_stop).await
}

/// The message's payload decoded (or why it cannot be), a claim-checked
/// body fetched from its blob and checked ([`crate::claim`]: the reference
/// first, against the function's own queue, with no storage call when it
/// is invalid); with the poison case when the reference is invalid or the
/// blob missing or corrupt. `Err`: storage failed
/// fetching the blob, and the attempt is abandoned (the message comes back
/// after its lease).
async fn body_of(
    rt: &FunctionRuntime,
    payload: &Payload,
) -> Result<(Result<String, String>, Option<crate::decide::PoisonCase>), StorageError> {
    use crate::claim::FetchError;
    let decoded = payload
        .text()
        .map(str::to_string)
        .map_err(|e| e.to_string());
    let scope = rt.app.claim_check.scope(&rt.function.queue);
    let fetched = match decoded
        .as_ref()
        .ok()
        .and_then(|p| crate::claim::parse(p, scope))
    {
        None => return Ok((decoded, None)),
        Some(Err(e)) => Err(FetchError::Invalid(e)),
        Some(Ok(reference)) => crate::claim::fetch(rt.blobs.as_ref(), &reference).await,
    };
    match fetched {
        Ok(body) => Ok((Ok(body), None)),
        Err(FetchError::Storage(e)) => Err(e),
        Err(e) => {
            let case = claim_poison(e);
            Ok((Err(case.reason.clone()), Some(case)))
        }
    }
}

/// The poison case of an invalid reference or a missing or corrupt
/// claim-check blob.
fn claim_poison(e: crate::claim::FetchError) -> crate::decide::PoisonCase {
    crate::decide::PoisonCase {
        kind: e.poison_kind().unwrap_or(ErrorKind::Permanent),
        reason: e.to_string(),
        uncertain: false,
    }
}

/// [`claim`], then the attempt counted as the key counts it
/// ([`count_attempt`]); the outcome when the job settles here.
async fn claim_counted(
    ctx: &mut Settling<'_>,
    facts: &mut Facts<'_>,
    policy: &Policy,
) -> Result<KeyState<'static>, Outcome> {
    let state = claim(ctx, policy).await?;
    match count_attempt(ctx, facts, policy) {
        Some(over) => Err(ctx.without_running(over).await),
        None => Ok(state),
    }
}

/// A keyed job's attempt number is its key's ([`crate::decide::attempt_of_key`]):
/// in `aqw run` the claims of its current run, so deliveries given back
/// without an attempt spend none; in `aqw serve`, whose retries are fresh
/// copies, the attempts its earlier copies spent plus this copy's
/// DequeueCount. That number goes into the facts, the key's history and
/// the poison record; past the cap the job is poisoned without running,
/// with the key's last error.
fn count_attempt(
    ctx: &mut Settling<'_>,
    facts: &mut Facts<'_>,
    policy: &Policy,
) -> Option<crate::decide::WithoutRunning> {
    let serve = ctx.settle.parks_retries();
    let c = ctx.claim.as_mut()?;
    // The last attempt's own error: an `abandoned` entry (a crash, or a
    // poisoning that storage refused) says only that it did not finish.
    let last_error = c
        .history
        .iter()
        .rev()
        .find(|a| a.outcome != "abandoned")
        .or(c.history.last())
        .and_then(|a| a.error.as_deref());
    let carried = serve.then_some(c.carried_attempts);
    let (n, over) =
        crate::decide::attempt_of_key(c.run_attempts, carried, c.dequeue_count, policy, last_error);
    if serve {
        // The history keeps a copy's attempt as the key's number.
        c.dequeue_count = n;
    }
    facts.attempt = Some(n);
    ctx.attempt = Some(n);
    over
}

/// Whether the job may run now: how long to park it (a fresh copy, which
/// spends no attempt) when the gate holds it ([`held_by_gate`]) or its
/// key's value is at the function's per-key limit (`perKey`; jitter
/// spreads the parked copies of one busy key); else its per-key slot.
async fn admit(
    rt: &FunctionRuntime,
    settle: &dyn Settle,
    decoded: &Result<String, String>,
) -> Result<Option<crate::flow::Permit>, std::time::Duration> {
    if let Some(after) = held_by_gate(rt, settle) {
        return Err(after);
    }
    // An outage's first wave: the fleet's verdict first (`Breaker::suspects`).
    if rt.gate.wait_while_suspect().await {
        if let Some(after) = held_by_gate(rt, settle) {
            return Err(after);
        }
    }
    // In serve mode the host delivers whatever the adaptive rate says (in
    // run mode the poll loop asked it before receiving): over it, park,
    // spread over up to three times the wait.
    if settle.delivers_while_paused() {
        if let Err(wait) = rt.adaptive.take(1) {
            let spread = crate::entropy::gen_range(1.0..3.0);
            return Err(wait.max(crate::decide::MIN_LATER).mul_f64(spread));
        }
    }
    let (Some(flow), Ok(payload)) = (&rt.flow, decoded) else {
        return Ok(None);
    };
    match flow.admit_key(payload).await {
        crate::flow::KeyAdmission::Run(slot) => Ok(slot),
        crate::flow::KeyAdmission::Park(after) => {
            let jitter = crate::entropy::gen_range(0.5..1.5);
            Err(after.mul_f64(jitter))
        }
    }
}

/// Over its bound (see `decide`) a message's key record decides first:
/// read it. `Err`: storage failed reading it, and the attempt is abandoned
/// (a record unread is no reason to poison). A message that only waited
/// behind another copy of its key ([`waited_behind_another`]) is brought
/// back within the bound in `facts`: its key counts its attempts.
async fn over_cap_record(
    rt: &FunctionRuntime,
    key: Option<&IdempotencyKey>,
    msg: &ReceivedMessage,
    policy: &Policy,
    facts: &mut Facts<'_>,
) -> Result<Option<KeyRecord>, StorageError> {
    let bound = dequeue_bound(policy.max_dequeue_count);
    let rec = match key {
        Some(k) if msg.dequeue_count > bound => rt.keys.get(&rt.function.name, k).await?,
        _ => None,
    };
    if waited_behind_another(rec.as_ref(), msg, policy) {
        facts.dequeue_count = bound;
    }
    Ok(rec)
}

/// Whether a message read over its bound spent its deliveries waiting
/// behind another copy of its key (each deferral raises the DequeueCount),
/// not failing before its claim: the key was last claimed by another
/// message, that holder's lease has lapsed, and the key's current run has
/// attempts left. A producer's duplicate deferred while the original held
/// the key for long is such a copy (seeds 98 and 139 of the simulation):
/// it claims, and its key counts the attempt.
fn waited_behind_another(rec: Option<&KeyRecord>, msg: &ReceivedMessage, policy: &Policy) -> bool {
    rec.is_some_and(|r| {
        !r.status.is_settled()
            && r.lease_live(crate::clock::now_utc()).is_none()
            && r.message_id.as_deref().is_some_and(|id| id != msg.id)
            && r.run_attempts < policy.max_dequeue_count
    })
}

/// What is known of the key before claiming: only over the bound is its
/// record read (and its first attempt kept for a poison record).
fn initial_key_state<'r>(
    ctx: &mut Settling<'_>,
    policy: &Policy,
    over_cap_record: Option<&'r KeyRecord>,
) -> KeyState<'r> {
    match (ctx.key, over_cap_record) {
        (None, _) => KeyState::Keyless,
        (Some(_), _) if ctx.msg.dequeue_count <= dequeue_bound(policy.max_dequeue_count) => {
            KeyState::Unclaimed
        }
        (Some(_), None) => KeyState::Free { last_error: None },
        (Some(_), Some(rec)) => {
            ctx.first_attempt = rec.first_seen.clone();
            key_state_of(rec, ctx.msg.insertion_time)
        }
    }
}

/// Claim the key under its own span; what the claim found, or the outcome
/// when storage failed.
async fn claim(ctx: &mut Settling<'_>, policy: &Policy) -> Result<KeyState<'static>, Outcome> {
    let claim_span = crate::traces::step_span!(
        "aqw.key.claim",
        otel.status_code = tracing::field::Empty,
        otel.status_message = tracing::field::Empty
    );
    match crate::traces::in_step(claim_span.clone(), ctx.claim(policy.lease)).await {
        Ok(state) => Ok(state),
        Err(e) => {
            crate::traces::fail_step(&claim_span, &e.to_string());
            Err(abandoned(e))
        }
    }
}

/// Run the handler, then settle by its fate: a provider's "in progress"
/// under `aqw.inProgressTimeout` and its "later" (a throttle, a refusal
/// with a delay) wait without spending an attempt ([`later`]).
async fn run_and_settle(
    ctx: &mut Settling<'_>,
    payload: String,
    facts: &Facts<'_>,
    policy: &Policy,
    hard_stop: &CancellationToken,
) -> Outcome {
    let jitter = crate::entropy::gen();
    let sent = tokio::time::Instant::now();
    let (run, success) = ctx.run(payload, hard_stop).await;
    later::tell_adaptive_rate(ctx.rt, &run, sent);
    let timeout_message = match &run {
        HandlerRun::TimedOut(t) => format!("handler exceeded functionTimeout ({t:?})"),
        _ => String::new(),
    };
    let first = attempt_of(ctx, &run, &timeout_message, jitter);
    // The same saved failure on every attempt: the provider replays it.
    let replayed_message = replays_its_failure(ctx, &first);
    let spent_message = match in_progress_of(ctx, &first, policy, jitter) {
        Some((later::InProgress::Wait(after), message)) => {
            return ctx.wait_in_progress(after, message).await
        }
        Some((later::InProgress::Spend { lasted }, message)) => Some(format!(
            "{message} (in progress for {})",
            later::for_a_person(lasted)
        )),
        None => None,
    };
    let attempt = reworded(first, replayed_message.as_deref(), spent_message.as_deref());
    // A 429 is a rate limit, not an outage: the adaptive rate answers it
    // (`later::tell_adaptive_rate`), the breaker does not count it (bare
    // 429s to a whole backlog would open it, and its probes would then
    // call in synchronized bursts).
    let throttle = matches!(
        &run,
        HandlerRun::Finished(Err(HandlerError::Throttled { .. }))
    );
    if !throttle {
        // A provider's other "later" (a 503 with Retry-After, a gateway in
        // maintenance) still counts: answered to nearly every call, it is
        // down for the fleet, which then holds instead of calling it at
        // full concurrency.
        tell_breaker(ctx, &attempt);
    }
    if let Some(after) = later_delay(ctx, &attempt, policy) {
        // The provider said "later": it spends no attempt.
        let reason = match &attempt {
            AttemptResult::Failed { message, .. } => message.to_string(),
            _ => String::new(),
        };
        return ctx.defer_later(after, &reason).await;
    }
    let fate = fate(facts, &attempt, policy, jitter);
    ctx.by_fate(fate, success).await
}

/// The attempt as settled: a failure the provider replays becomes a
/// `replayed_failure`; an "in progress" past its timeout keeps its kind
/// with the text saying how long it lasted.
fn reworded<'a>(
    first: AttemptResult<'a>,
    replayed: Option<&'a str>,
    spent_in_progress: Option<&'a str>,
) -> AttemptResult<'a> {
    match (replayed, spent_in_progress, first) {
        (Some(m), _, _) => AttemptResult::Failed {
            kind: ErrorKind::ReplayedFailure,
            message: m,
            retry_after: None,
            uncertain: false,
        },
        (
            None,
            Some(m),
            AttemptResult::Failed {
                kind, uncertain, ..
            },
        ) => AttemptResult::Failed {
            kind,
            message: m,
            retry_after: None,
            uncertain,
        },
        (_, _, first) => first,
    }
}

/// How the handler's run ended, as the decision core reads it; a throttle
/// with aqw's backoff when the provider named no delay.
fn attempt_of<'a>(
    ctx: &Settling<'_>,
    run: &'a HandlerRun,
    timeout_message: &'a str,
    jitter: f64,
) -> AttemptResult<'a> {
    match run {
        HandlerRun::Finished(Ok(_)) => AttemptResult::Succeeded,
        HandlerRun::Interrupted => AttemptResult::Interrupted,
        HandlerRun::TimedOut(_) => AttemptResult::Failed {
            kind: ErrorKind::Timeout,
            message: timeout_message,
            retry_after: None,
            // A timeout cut the handler off mid-way: it may have acted.
            uncertain: true,
        },
        HandlerRun::Finished(Err(HandlerError::Throttled {
            message,
            retry_after,
        })) => later::throttled_attempt(message, *retry_after, || ctx.deferred_for(), jitter),
        HandlerRun::Finished(Err(e)) => failed_attempt(e),
    }
}

/// A keyed job's "in progress": wait or spend an attempt
/// ([`later::in_progress`]), measured from the key's first such answer;
/// with the answer's text. `None` for anything else, or a keyless job.
fn in_progress_of<'a>(
    ctx: &Settling<'_>,
    attempt: &AttemptResult<'a>,
    policy: &Policy,
    jitter: f64,
) -> Option<(later::InProgress, &'a str)> {
    let AttemptResult::Failed {
        kind: ErrorKind::InProgress,
        message,
        retry_after,
        ..
    } = attempt
    else {
        return None;
    };
    let claim = ctx.claim.as_ref()?;
    let now = crate::clock::now_utc();
    let first_seen = claim.first_seen.as_deref().and_then(|f| {
        time::OffsetDateTime::parse(f, &time::format_description::well_known::Rfc3339).ok()
    });
    let since = later::in_progress_since(&claim.history, first_seen, now);
    let lasted = std::time::Duration::try_from(now - since).unwrap_or_default();
    let left = ctx
        .deferred_for()
        .and_then(|d| policy.max_deferral.checked_sub(d));
    let fate = later::in_progress(
        lasted,
        policy.in_progress_timeout,
        left,
        *retry_after,
        jitter,
    );
    Some((fate, message))
}

/// How long to wait when the provider said "later" (see
/// [`crate::decide::later`]). Only a refusal with a delay can be one: the
/// key's age is read (a time parse) for those alone, not on every job.
fn later_delay(
    ctx: &Settling<'_>,
    attempt: &AttemptResult<'_>,
    policy: &Policy,
) -> Option<std::time::Duration> {
    let said_later = matches!(
        attempt,
        AttemptResult::Failed {
            retry_after: Some(_),
            ..
        }
    );
    said_later
        .then(|| crate::decide::later(attempt, ctx.deferred_for(), policy))
        .flatten()
}

/// How many attempts in a row a provider with a key window must answer
/// the same HTTP 500 and body before aqw takes it for a replayed failure.
const SAME_FAILURE_ATTEMPTS: usize = 3;

/// Whether this failure is the provider replaying a failure it saved under
/// the provider key (Stripe keeps "the resulting status code and body of
/// the first request … regardless of whether it succeeds or fails", 500s
/// included): the function declares `providerKeyWindow` (its provider
/// remembers keys), the answer is an HTTP 500 with a body, and the last
/// [`SAME_FAILURE_ATTEMPTS`] − 1 attempts of the key ended with exactly
/// the same text, while the breaker does not hold (an outage's answers
/// look alike too). Then the record's text, in plain words.
fn replays_its_failure(ctx: &Settling<'_>, attempt: &AttemptResult<'_>) -> Option<String> {
    let AttemptResult::Failed {
        kind: ErrorKind::Retryable,
        message,
        ..
    } = attempt
    else {
        return None;
    };
    let window = ctx.rt.function.provider_key_window?;
    let history = &ctx.claim.as_ref()?.history;
    if !message.starts_with("HTTP 500: ") || ctx.rt.gate.holds().is_some() {
        return None;
    }
    let short = crate::idempotency::record::short_error(message);
    let earlier = SAME_FAILURE_ATTEMPTS - 1;
    let same = history.len() >= earlier
        && history[history.len() - earlier..]
            .iter()
            .all(|a| a.outcome == "retried" && a.error.as_deref() == Some(short.as_str()));
    same.then(|| {
        format!(
            "{message} (the same answer to {SAME_FAILURE_ATTEMPTS} attempts with one Idempotency-Key: the provider replays the failure it saved; no retry with this key can succeed within its window of {}; see the runbook's cached-failure case)",
            humanize(window)
        )
    })
}

/// How long to park a message the gate does not let run, if so: while the
/// breaker is open (a message received before the trip); while paused (a
/// message received in the instant the pause took hold: a pause means no
/// handler call starts once it is visible); in serve mode, where the host
/// delivers regardless, also between probes.
fn held_by_gate(rt: &FunctionRuntime, settle: &dyn Settle) -> Option<std::time::Duration> {
    if !settle.delivers_while_paused() {
        if rt.gate.paused() {
            return Some(RECEIVED_AS_PAUSED_PARK);
        }
        return rt.gate.holds();
    }
    match rt.gate.admit(1) {
        Admission::Receive(_) => None,
        Admission::Wait(_) if rt.gate.paused() => Some(PAUSED_PARK),
        Admission::Wait(_) => Some(rt.gate.holds().unwrap_or(PAUSED_PARK)),
    }
}

/// How long a message the poll loop received just as a pause took hold is
/// parked: the loop receives nothing more while paused, so this only sets
/// how soon after a resume the message runs.
const RECEIVED_AS_PAUSED_PARK: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a message delivered to a paused function in serve mode is
/// parked: long enough that a pause costs one put and one delete per
/// message per minute, short enough that a resume drains within one.
const PAUSED_PARK: std::time::Duration = std::time::Duration::from_secs(60);

/// Count the attempt toward the breaker: successes, and retryable failures
/// (a timeout too), noting whether it was the message's first attempt.
fn tell_breaker(ctx: &Settling<'_>, attempt: &AttemptResult<'_>) {
    // A job is its key, or its message when it has none: the breaker
    // counts distinct jobs, whatever their attempt number.
    let job = match ctx.key {
        Some(k) => crate::breaker::job_id(k.as_str()),
        None => crate::breaker::job_id(&ctx.msg.id),
    };
    match attempt {
        AttemptResult::Succeeded => ctx.rt.gate.record(BreakerAttempt::Succeeded(job), None),
        AttemptResult::Failed {
            kind: ErrorKind::Retryable | ErrorKind::Timeout,
            message,
            ..
        } => ctx
            .rt
            .gate
            .record(BreakerAttempt::FailedRetryable(job), Some(message)),
        _ => {}
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
            Err(e) => (None, Some(e.to_string())),
        },
        Err(_) => (None, None),
    }
}

/// What a key record read over the cap says of a message put at
/// `inserted`. A copy put before its key was poisoned is a leftover of the
/// poisoned run, settled as a duplicate as the claim settles it
/// ([`settles_copy`]): over the bound no claim is made, and
/// without this a copy that waited behind the key's crashed poisoning was
/// poisoned as `crashed`, a second record for one job (seed 8343).
fn key_state_of(rec: &KeyRecord, inserted: time::OffsetDateTime) -> KeyState<'_> {
    if settles_copy(rec, inserted) {
        KeyState::Settled
    } else if let Some(until) = rec.lease_live(crate::clock::now_utc()) {
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
        // The first request may still complete: the provider key holds it.
        HandlerError::InProgress {
            message,
            retry_after,
        } => AttemptResult::Failed {
            kind: ErrorKind::InProgress,
            message,
            retry_after: *retry_after,
            uncertain: true,
        },
        HandlerError::ReplayedFailure { message } => AttemptResult::Failed {
            kind: ErrorKind::ReplayedFailure,
            message,
            retry_after: None,
            uncertain: false,
        },
        // Read by `attempt_of` first (with aqw's backoff); here only for
        // completeness: refused for now, not applied.
        HandlerError::Throttled {
            message,
            retry_after,
        } => AttemptResult::Failed {
            kind: ErrorKind::Retryable,
            message,
            retry_after: *retry_after,
            uncertain: false,
        },
    }
}

/// The producer's trace context, where `aqw.tracing.parent` says a JSON
/// payload carries it (nothing is read otherwise).
pub fn producer_context(
    rt: &FunctionRuntime,
    payload: &Payload,
) -> Option<crate::traces::TraceContext> {
    let pointer = rt.app.trace_parent.as_deref()?;
    crate::traces::context_in_json(pointer, payload.json()?)
}

/// A window for a person: `24h`, `90m`, `45s`.
fn humanize(d: std::time::Duration) -> String {
    let s = d.as_secs();
    match s {
        s if s >= 3600 && s % 3600 == 0 => format!("{}h", s / 3600),
        s if s >= 60 && s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}
