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
    pub queue: String,
    /// The connection of the function that consumes the queue.
    pub connection: Connection,
    /// The message text, encoded per the app's messageEncoding.
    pub text: String,
    pub key: Option<IdempotencyKey>,
    pub encoding: MessageEncoding,
}

/// What `enqueue` put.
#[derive(Debug, Clone)]
pub struct Enqueued {
    pub queue: String,
    pub message_id: String,
    pub key: Option<IdempotencyKey>,
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
