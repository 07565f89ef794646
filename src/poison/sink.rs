//! Writing poison: the record, then the envelope on `<queue>-poison` (see
//! the module doc of [`crate::poison`] for the crash-safe order).

use super::record::PoisonRecord;
use crate::failpoint;
use crate::idempotency::IdempotencyKey;
use crate::idempotency::{cap_error, fmt_time, now_rfc3339};
use crate::message::MessageEncoding;
use crate::message::{ErrorInfo, PoisonEnvelope, ENVELOPE_VERSION};
use crate::storage::{
    Etag, QueueStore, ReceivedMessage, StorageError, StorageResult, TableStore, Ttl,
};
use crate::telemetry::{Alerts, PoisonAlert};
use std::sync::Arc;
use std::time::Duration;

/// Writes poison records and envelopes for one source queue.
#[derive(Clone)]
pub struct PoisonSink {
    pub source_queue: String,
    pub function: String,
    pub poison_queue: Arc<dyn QueueStore>,
    pub records: Arc<dyn TableStore>,
    pub encoding: MessageEncoding,
    pub ttl: Option<Duration>,
    pub alerts: Alerts,
}

/// Put on a queue, creating it on first use.
pub async fn put_creating(
    queue: &dyn QueueStore,
    text: &str,
    ttl: Ttl,
) -> StorageResult<crate::storage::PutReceipt> {
    match queue.put(text, Duration::ZERO, ttl).await {
        Err(StorageError::NotFound) => {
            queue.create_if_missing().await?;
            queue.put(text, Duration::ZERO, ttl).await
        }
        other => other,
    }
}

impl PoisonSink {
    /// The id of a poison-queue copy of source message `message_id`, if one
    /// is visible. Peeks first (no side effects); a deeper queue is received
    /// in batches with a short hold, and what was held is released at once.
    async fn find_copy(&self, message_id: &str) -> StorageResult<Option<String>> {
        let matches = |text: &str| {
            PoisonEnvelope::from_queue_text(text).is_some_and(|e| e.message_id == message_id)
        };
        let peeked = match self.poison_queue.peek(32).await {
            Ok(p) => p,
            Err(StorageError::NotFound) => return Ok(None),
            Err(e) => return Err(e),
        };
        if let Some(m) = peeked.iter().find(|m| matches(&m.text)) {
            return Ok(Some(m.id.clone()));
        }
        if peeked.len() < 32 {
            return Ok(None);
        }
        let mut held = Vec::new();
        let mut found = None;
        for _ in 0..64 {
            let batch = self
                .poison_queue
                .receive(32, Duration::from_secs(5))
                .await?;
            if batch.is_empty() {
                break;
            }
            for m in batch {
                if found.is_none() && matches(&m.text) {
                    found = Some(m.id.clone());
                }
                held.push(m);
            }
            if found.is_some() {
                break;
            }
        }
        for m in held {
            let _ = self
                .poison_queue
                .update_visibility(&m.id, &m.pop_receipt, &m.text, Duration::ZERO)
                .await;
        }
        Ok(found)
    }

    /// Steps 1–3 of the poison path (see the module doc). Returns whether this
    /// call created the record (false: a previous attempt already had).
    pub async fn write(
        &self,
        msg: &ReceivedMessage,
        key: Option<&IdempotencyKey>,
        error: &ErrorInfo,
        first_attempt_at: Option<String>,
        trace_parent: Option<String>,
    ) -> StorageResult<bool> {
        let error = ErrorInfo {
            kind: error.kind,
            message: cap_error(&error.message),
        };
        let mut record = PoisonRecord::open(
            PoisonEnvelope {
                aqw: ENVELOPE_VERSION.into(),
                queue: self.source_queue.clone(),
                function: self.function.clone(),
                message_id: msg.id.clone(),
                inserted_at: fmt_time(msg.insertion_time),
                dequeue_count: msg.dequeue_count,
                first_attempt_at: first_attempt_at.unwrap_or_else(|| fmt_time(msg.insertion_time)),
                poisoned_at: now_rfc3339(),
                key: key.cloned(),
                error: error.clone(),
                message: Some(msg.text.clone()),
                record: None,
                encoding: self.encoding,
            },
            "aqw",
            None,
        );
        record.trace_parent = trace_parent;
        let (mut record, etag, created) = self.insert_record(&msg.id, record).await?;
        let (pk, rk) = (self.source_queue.as_str(), msg.id.as_str());
        failpoint::hit("poison.after_record");
        // A record without its copy's id, found by a re-run: the copy may have
        // been put just before a crash. Adopt it rather than put a second one.
        if !created && record.poison_message_id.is_none() {
            if let Some(existing) = self.find_copy(&msg.id).await? {
                let update = super::record::copy_update(&existing, None);
                self.records.merge(pk, rk, &update, None).await?;
                record.poison_message_id = Some(existing);
            }
        }
        if record.poison_message_id.is_none() {
            self.put_copy(&record, etag.as_ref()).await?;
        }
        if created {
            self.alerts.poisoned(PoisonAlert {
                queue: self.source_queue.clone(),
                poison_queue: self.poison_queue.name().to_string(),
                function: self.function.clone(),
                message_id: msg.id.clone(),
                key: key.map(|k| k.to_string()),
                error_kind: error.kind.as_str().into(),
                error: error.message.clone(),
                poisoned_at: time::OffsetDateTime::now_utc(),
            });
        }
        Ok(created)
    }

    /// Insert the record of a message being poisoned, or read the one a
    /// crashed earlier run left: (record, its ETag, whether this run made it).
    async fn insert_record(
        &self,
        message_id: &str,
        record: PoisonRecord,
    ) -> StorageResult<(PoisonRecord, Option<Etag>, bool)> {
        let (pk, rk) = (self.source_queue.as_str(), message_id);
        match self.records.insert(pk, rk, &record.to_entity()).await {
            Ok(etag) => Ok((record, Some(etag), true)),
            Err(StorageError::Conflict) => match self.records.get(pk, rk).await? {
                Some((e, etag)) => Ok((PoisonRecord::from_entity(&e), Some(etag), false)),
                None => Err(StorageError::Other(
                    "poison record vanished while being written".into(),
                )),
            },
            Err(StorageError::NotFound) => {
                self.records.create_if_missing().await?;
                self.records.insert(pk, rk, &record.to_entity()).await?;
                Ok((record, None, true))
            }
            Err(e) => Err(e),
        }
    }

    /// Put the record's envelope on `<queue>-poison` and note the copy's id
    /// on the record.
    async fn put_copy(&self, record: &PoisonRecord, etag: Option<&Etag>) -> StorageResult<()> {
        let (pk, rk) = (self.source_queue.as_str(), record.message_id.as_str());
        let text = record.envelope().to_queue_text(self.records.name());
        let ttl = match self.ttl {
            None => Ttl::Never,
            Some(d) => Ttl::After(d),
        };
        let receipt = put_creating(self.poison_queue.as_ref(), &text, ttl).await?;
        failpoint::hit("poison.after_put");
        let update = super::record::copy_update(&receipt.id, Some(&receipt.pop_receipt));
        match self.records.merge(pk, rk, &update, etag).await {
            Ok(_) => {}
            // Someone else updated it: our copy is then a stray (see module doc).
            Err(StorageError::PreconditionFailed) => {
                self.records.merge(pk, rk, &update, None).await?;
            }
            Err(e) => return Err(e),
        }
        failpoint::hit("poison.after_mark");
        Ok(())
    }
}
