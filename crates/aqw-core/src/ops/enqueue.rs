//! `aqw enqueue`: put a job on a queue, refusing what the worker would poison
//! at once (no key derivable) unless forced.

use super::{OpsError, OpsResult};
use crate::config::{AppConfig, Connection, MessageEncoding};
use crate::idempotency::derive_key;
use crate::idempotency::IdempotencyKey;
use crate::storage::{Storage, Ttl};

/// A job checked and encoded, ready to put.
#[derive(Debug, Clone)]
pub struct PreparedEnqueue {
    /// The queue to put it on.
    pub queue: String,
    /// The connection of the function that consumes the queue.
    pub connection: Connection,
    /// The message text, encoded per the app's messageEncoding.
    pub text: String,
    /// The key the worker will derive (`None`: a keyless function, or forced).
    pub key: Option<IdempotencyKey>,
    /// The app's message encoding.
    pub encoding: MessageEncoding,
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
    let text =
        crate::message::encode_checked(payload, app.message_encoding).map_err(OpsError::Usage)?;
    Ok(PreparedEnqueue {
        queue: queue.to_string(),
        connection: f.connection.clone(),
        text,
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

/// Put a prepared job on its queue (creating the queue if missing).
pub async fn enqueue(job: PreparedEnqueue, storage: &dyn Storage) -> OpsResult<Enqueued> {
    let queue = storage.queue(&job.queue);
    let receipt = crate::poison::put_creating(queue.as_ref(), &job.text, Ttl::Default).await?;
    Ok(Enqueued {
        queue: job.queue,
        message_id: receipt.id,
        key: job.key,
        encoding: job.encoding,
    })
}
