//! `aqw enqueue`: put a job on a queue, refusing what the worker would poison
//! at once (no key derivable) unless forced, now or after a delay
//! ([`Delivery`]).

use super::{OpsError, OpsResult};
use crate::config::{AppConfig, MessageEncoding, StorageAccount};
use crate::idempotency::derive_key;
use crate::idempotency::IdempotencyKey;
use crate::storage::{Storage, Ttl, MAX_VISIBILITY_TIMEOUT};
use std::time::Duration;
use time::OffsetDateTime;

/// `d` rounded up to whole seconds, as the service takes it.
fn whole_seconds(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs() + u64::from(d.subsec_nanos() > 0))
}

fn whole_ttl(ttl: Ttl) -> Ttl {
    match ttl {
        Ttl::After(t) => Ttl::After(whole_seconds(t)),
        other => other,
    }
}

/// The time-to-live Queue Storage gives a message put without one.
const SERVICE_DEFAULT_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// When a job becomes visible, and how long it may then wait: `aqw enqueue
/// --delay/--at/--ttl` and [`crate::producer::Producer`].
///
/// The service's rules (Put Message, Queue service REST API): the initial
/// visibility is at most 7 days and shorter than the time-to-live; a
/// time-to-live is at least 1 second, or never (-1). They are checked here,
/// so a bad value is an error naming it rather than a 400 from storage, and
/// a job can never be put to expire before it is delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    delay: Duration,
    ttl: Ttl,
}

impl Default for Delivery {
    /// Visible at once, with the service's 7-day time-to-live.
    fn default() -> Self {
        Self {
            delay: Duration::ZERO,
            ttl: Ttl::Default,
        }
    }
}

/// Why a delay, time or time-to-live of an enqueue is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeliveryError {
    /// A time-to-live under one second.
    #[error("the time-to-live must be at least 1 second (or never)")]
    TtlUnderASecond,
    /// A time-to-live over the 7 days a message is sent with.
    #[error(
        "a time-to-live of {} is over the 7 days a message is sent with here; give never for a job that must not expire",
        crate::span::fmt_span(*.ttl)
    )]
    TtlOverSevenDays {
        /// The time-to-live asked for (whole seconds).
        ttl: Duration,
    },
    /// A delay over the service's 7 days of invisibility.
    #[error(
        "a delay of {} is beyond the 7 days Queue Storage holds a message invisible; \
         keep the job elsewhere and enqueue it later",
        crate::span::fmt_span(*.delay)
    )]
    DelayOverSevenDays {
        /// The delay asked for (whole seconds).
        delay: Duration,
    },
    /// The job would expire before it becomes visible.
    #[error(
        "the job would expire before it is delivered: a delay of {} is not shorter \
         than its time-to-live of {} (give a longer time-to-live, or never)",
        crate::span::fmt_span(*.delay),
        crate::span::fmt_span(*.lifetime)
    )]
    ExpiresFirst {
        /// The delay (whole seconds).
        delay: Duration,
        /// The message's lifetime.
        lifetime: Duration,
    },
    /// A delivery time not after now.
    #[error("{when} is not in the future; leave the time out to enqueue now")]
    NotInTheFuture {
        /// The time asked for.
        when: OffsetDateTime,
    },
}

impl Delivery {
    /// Visible `delay` after the put, expiring per `ttl` (counted from the put).
    pub fn after(delay: Duration, ttl: Ttl) -> Result<Self, DeliveryError> {
        // The service counts whole seconds, rounded up here as the adapters
        // round them, so the checks below compare what is really sent.
        let (delay, ttl) = (whole_seconds(delay), whole_ttl(ttl));
        if let Ttl::After(t) = ttl {
            if t < Duration::from_secs(1) {
                return Err(DeliveryError::TtlUnderASecond);
            }
            if t > SERVICE_DEFAULT_TTL {
                return Err(DeliveryError::TtlOverSevenDays { ttl: t });
            }
        }
        if delay > MAX_VISIBILITY_TIMEOUT {
            return Err(DeliveryError::DelayOverSevenDays { delay });
        }
        let lifetime = match ttl {
            Ttl::Default => Some(SERVICE_DEFAULT_TTL),
            Ttl::Never => None,
            Ttl::After(t) => Some(t),
        };
        if let Some(lifetime) = lifetime.filter(|l| delay >= *l) {
            return Err(DeliveryError::ExpiresFirst { delay, lifetime });
        }
        Ok(Self { delay, ttl })
    }

    /// Visible at `when` (after `now`), expiring per `ttl`.
    pub fn at(when: OffsetDateTime, now: OffsetDateTime, ttl: Ttl) -> Result<Self, DeliveryError> {
        let ahead = when - now;
        if !ahead.is_positive() {
            return Err(DeliveryError::NotInTheFuture { when });
        }
        Self::after(Duration::try_from(ahead).unwrap_or(Duration::MAX), ttl)
    }

    /// How long after the put the job becomes visible.
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// The message's time-to-live.
    pub fn ttl(&self) -> Ttl {
        self.ttl
    }
}

/// A job checked and encoded, ready to put.
#[derive(Debug, Clone)]
pub struct PreparedEnqueue {
    /// The queue to put it on.
    pub queue: String,
    /// The connection of the function that consumes the queue.
    pub connection: StorageAccount,
    /// The message text, encoded per the app's messageEncoding (empty
    /// while `claim_check` holds the body: the reference is made when the
    /// blob is written).
    pub text: String,
    /// A body over `aqw.claimCheck.threshold`, to be written to this
    /// container before its reference is put ([`crate::claim`]).
    pub(crate) claim_check: Option<ClaimCheckBody>,
    /// The key the worker will derive (`None`: a keyless function, or forced).
    pub key: Option<IdempotencyKey>,
    /// The app's message encoding.
    pub(crate) encoding: MessageEncoding,
}

/// A job body bound for a blob, and its container.
#[derive(Debug, Clone)]
pub(crate) struct ClaimCheckBody {
    /// The container.
    pub(crate) container: String,
    /// The job's payload, exactly.
    pub(crate) body: String,
}

/// What `enqueue` put.
#[derive(Debug, Clone)]
pub struct Enqueued {
    /// The queue it went on.
    pub queue: String,
    /// The new message's id.
    pub message_id: String,
    /// The key the worker will derive, if any.
    pub key: Option<IdempotencyKey>,
    /// How its text is encoded.
    pub encoding: MessageEncoding,
    /// When it becomes visible (`None`: at once).
    pub visible_at: Option<OffsetDateTime>,
    /// The blob its body went to, when it was claim-checked.
    pub blob: Option<String>,
}

/// Check a payload the way the worker will: the queue must be consumed by a
/// function of the app, the payload must derive a key (unless `force`), and
/// the encoded text must fit in a message. Nothing is touched.
pub fn prepare_enqueue(
    app: &AppConfig,
    queue: &str,
    payload: &str,
    force: bool,
) -> OpsResult<PreparedEnqueue> {
    let f = app.function_for_queue(queue).ok_or_else(|| {
        OpsError::Usage(format!(
            "queue \"{queue}\" is not consumed by any function of this app"
        ))
    })?;
    let key = match derive_key(&f.key, payload) {
        Ok(k) => k,
        Err(e) if !force => {
            return Err(OpsError::Usage(format!(
                "the worker would poison this job at once: {e} (use --force to enqueue anyway)"
            )))
        }
        Err(_) => None,
    };
    let (text, claim_check) = if app.claim_check.applies_to(payload, app.message_encoding) {
        app.claim_check.refuse_oversize(payload.len())?;
        let body = ClaimCheckBody {
            container: app.claim_check.container.clone(),
            body: payload.to_string(),
        };
        (String::new(), Some(body))
    } else {
        let text = crate::message::encode_checked(payload, app.message_encoding)?;
        (text, None)
    };
    Ok(PreparedEnqueue {
        queue: queue.to_string(),
        connection: f.connection.clone(),
        text,
        claim_check,
        key,
        encoding: app.message_encoding,
    })
}

/// The payload with the producer's trace context written where
/// `aqw.tracing.parent` points (unchanged when that is unset or a valid
/// context is already there). `span` is the enqueue's producer span; it
/// joins `TRACEPARENT` / `TRACESTATE` from the environment when they hold a
/// valid context. A payload that cannot carry it (not a JSON object) is sent
/// as it is, with a warning.
pub fn with_trace_context(app: &AppConfig, payload: &str, span: &tracing::Span) -> String {
    let Some(pointer) = app.trace_parent.as_deref() else {
        return payload.to_string();
    };
    let env = std::env::var("TRACEPARENT").ok();
    let state = std::env::var("TRACESTATE").ok();
    let parent = env
        .as_deref()
        .and_then(|tp| crate::traces::TraceContext::parse(tp, state.as_deref()));
    let trace = crate::traces::start_job(span, parent.as_ref());
    match crate::traces::put_context_in_payload(pointer, payload, &trace.context) {
        Ok(Some(with)) => with,
        Ok(None) => payload.to_string(),
        Err(e) => {
            tracing::warn!(event = "aqw.enqueue.no_trace_context", error = %e, "the message is sent without a trace context");
            payload.to_string()
        }
    }
}

/// Put a prepared job on its queue now (creating the queue if missing).
pub async fn enqueue(job: PreparedEnqueue, storage: &dyn Storage) -> OpsResult<Enqueued> {
    enqueue_with(job, Delivery::default(), storage).await
}

/// Put a prepared job on its queue per `delivery` (creating the queue if
/// missing).
pub async fn enqueue_with(
    job: PreparedEnqueue,
    delivery: Delivery,
    storage: &dyn Storage,
) -> OpsResult<Enqueued> {
    let (text, blob) = claim_checked_text(&job, delivery, storage).await?;
    let queue = storage.queue(&job.queue);
    let receipt =
        crate::poison::put_creating_after(queue.as_ref(), &text, delivery.delay, delivery.ttl)
            .await?;
    let visible_at = (!delivery.delay.is_zero()).then(|| crate::clock::now_utc() + delivery.delay);
    Ok(Enqueued {
        queue: job.queue,
        message_id: receipt.id,
        key: job.key,
        encoding: job.encoding,
        visible_at,
        blob,
    })
}

/// The text to put: the prepared one, or, for a claim-checked job, its
/// body written to its blob first and the reference encoded. A crash
/// between the two leaves an orphan blob, which retention collects. A
/// claim-checked job must expire (retention deletes its blob once no
/// message can still refer to it), so `Ttl::Never` is refused.
async fn claim_checked_text(
    job: &PreparedEnqueue,
    delivery: Delivery,
    storage: &dyn Storage,
) -> OpsResult<(String, Option<String>)> {
    let Some(c) = &job.claim_check else {
        return Ok((job.text.clone(), None));
    };
    if delivery.ttl == Ttl::Never {
        return Err(OpsError::Usage(format!(
            "a job of {} bytes goes to Blob storage (aqw.claimCheck.threshold), and such a job \
             needs a time-to-live so its blob can be deleted: give one (at most 7 days)",
            c.body.len()
        )));
    }
    let blobs = storage.blobs(&c.container);
    let reference = crate::claim::put_body(blobs.as_ref(), &job.queue, &c.body).await?;
    crate::failpoint::hit("claim_check.after_blob");
    let text = crate::message::encode(&reference.to_payload(), job.encoding);
    Ok((text, Some(reference.blob)))
}

/// Before a poison record's text is put again (replay): a claim-check
/// reference's blob is refreshed ([`crate::claim::refresh_text`]); a blob
/// that is gone refuses the replay, naming it, and an invalid reference
/// refuses it without a storage call.
pub(crate) async fn refresh_claim_check(
    ops: &super::QueueOps,
    text: &str,
    encoding: MessageEncoding,
) -> OpsResult<()> {
    let scope = ops.claim_scope();
    match crate::claim::refresh_text(ops.blobs.as_ref(), text, encoding, scope).await {
        Ok(()) => Ok(()),
        Err(crate::claim::FetchError::Storage(e)) => Err(e.into()),
        Err(e @ crate::claim::FetchError::Invalid(_)) => Err(OpsError::Usage(format!(
            "{e}: replaying it would only poison it again, as claim_check_invalid (discard it, or fix it with the job's body)"
        ))),
        Err(e) => Err(OpsError::Usage(format!(
            "{e}: the job's body is gone, so it cannot be replayed (fix it with a new payload, or discard it)"
        ))),
    }
}

/// A fix's corrected payload as message text: encoded, or, over
/// `aqw.claimCheck.threshold`, written to its blob with the reference
/// encoded.
pub(crate) async fn corrected_text(ops: &super::QueueOps, payload: &str) -> OpsResult<String> {
    let enc = ops.app.message_encoding;
    if ops.app.claim_check.applies_to(payload, enc) {
        let blobs = ops.blobs.as_ref();
        return Ok(crate::claim::put_as_reference(blobs, &ops.queue, payload, enc).await?);
    }
    Ok(crate::message::encode_checked(payload, enc)?)
}
