//! The poison path: the one exit for every message that cannot succeed, and
//! the records an operator reads, replays and discards.
//!
//! Write order (each step idempotent, so a crash anywhere is repaired by
//! running the path again; the source message is still there until the end):
//! 1. insert the poison record (PK = source queue, RK = source message id),
//!    status `open` (409: it exists, reuse it);
//! 2. unless the record already names its poison-queue copy, put the envelope
//!    on `<queue>-poison` (created on first use);
//! 3. write the copy's id into the record;
//! 4. (caller) delete the source message.
//!
//! A crash between 2 and 3 can leave a stray copy whose id the record does
//! not name; `aqw poison list/replay` recognise and remove such strays, so
//! operators only ever see one copy per message.

use crate::failpoint;
use crate::idempotency::{cap_error, fmt_time, now_rfc3339};
use crate::message::MessageEncoding;
use crate::message::{ErrorInfo, ErrorKind, PoisonEnvelope, ENVELOPE_VERSION};
use crate::storage::{
    Entity, Etag, QueueStore, ReceivedMessage, StorageError, StorageResult, TableStore, Ttl,
};
use crate::telemetry::{Alerts, PoisonAlert};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// Table string properties hold 64 KiB (32 K UTF-16 units): store message
/// text in parts well under that.
const PART_CHARS: usize = 15_000;

/// Lifecycle of a poison record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RecordStatus {
    Open,
    Replayed,
    Discarded,
    /// Closed by `poison fix`: a corrected message was put in its place.
    Replaced,
}

impl RecordStatus {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "open" => Some(RecordStatus::Open),
            "replayed" => Some(RecordStatus::Replayed),
            "discarded" => Some(RecordStatus::Discarded),
            "replaced" => Some(RecordStatus::Replaced),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            RecordStatus::Open => "open",
            RecordStatus::Replayed => "replayed",
            RecordStatus::Discarded => "discarded",
            RecordStatus::Replaced => "replaced",
        }
    }
}

/// One poisoned message, as stored in the record table.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoisonRecord {
    pub queue: String,
    pub function: String,
    /// The source message id (the record id on the CLI).
    pub message_id: String,
    pub inserted_at: String,
    pub dequeue_count: u32,
    pub first_attempt_at: String,
    pub poisoned_at: String,
    pub key: Option<String>,
    pub error: ErrorInfo,
    /// The source message text exactly as received.
    pub message: String,
    pub encoding: MessageEncoding,
    pub status: RecordStatus,
    /// `aqw` for aqw's own envelopes, `host` for raw copies written by the Functions host.
    pub origin: String,
    pub poison_message_id: Option<String>,
    #[serde(skip)]
    pub poison_pop_receipt: Option<String>,
    pub replay_count: u32,
    pub replayed_at: Option<String>,
    pub replayed_by: Option<String>,
    pub replay_message_id: Option<String>,
    pub replay_note: Option<String>,
    /// Set just before a replay re-puts the message (crash detection).
    pub replay_started_at: Option<String>,
    pub discarded_at: Option<String>,
    pub discarded_by: Option<String>,
    pub discard_reason: Option<String>,
    /// `poison fix`: who put the corrected message, when, its id and key,
    /// and how many bytes longer (or shorter) its payload is.
    pub replaced_at: Option<String>,
    pub replaced_by: Option<String>,
    pub replacement_message_id: Option<String>,
    pub replacement_key: Option<String>,
    pub replacement_size_diff: Option<i64>,
}

fn split_parts(text: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut cur = String::new();
    let mut n = 0;
    for c in text.chars() {
        cur.push(c);
        n += 1;
        if n == PART_CHARS {
            parts.push(std::mem::take(&mut cur));
            n = 0;
        }
    }
    if !cur.is_empty() || parts.is_empty() {
        parts.push(cur);
    }
    parts
}

impl PoisonRecord {
    pub fn to_entity(&self) -> Entity {
        let mut e = Entity::new();
        let mut put = |k: &str, v: Value| {
            e.insert(k.to_string(), v);
        };
        put("Queue", json!(self.queue));
        put("Function", json!(self.function));
        put("MessageId", json!(self.message_id));
        put("InsertedAt", json!(self.inserted_at));
        put("DequeueCount", json!(self.dequeue_count));
        put("FirstAttemptAt", json!(self.first_attempt_at));
        put("PoisonedAt", json!(self.poisoned_at));
        put("Key", json!(self.key.clone().unwrap_or_default()));
        put("ErrorKind", json!(self.error.kind.as_str()));
        put("ErrorMessage", json!(self.error.message));
        put("Encoding", json!(self.encoding.as_str()));
        let parts = split_parts(&self.message);
        put("MessageParts", json!(parts.len()));
        for (i, p) in parts.into_iter().enumerate() {
            put(&format!("Message{i}"), json!(p));
        }
        put("Status", json!(self.status.as_str()));
        put("Origin", json!(self.origin));
        put(
            "PoisonMessageId",
            json!(self.poison_message_id.clone().unwrap_or_default()),
        );
        put(
            "PoisonPopReceipt",
            json!(self.poison_pop_receipt.clone().unwrap_or_default()),
        );
        put("ReplayCount", json!(self.replay_count));
        e
    }

    pub fn from_entity(e: &Entity) -> Self {
        let s = |k: &str| {
            e.get(k)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        };
        let n = |k: &str| e.get(k).and_then(Value::as_u64).unwrap_or(0) as u32;
        let parts = n("MessageParts").max(1);
        let message: String = (0..parts)
            .map(|i| {
                e.get(&format!("Message{i}"))
                    .and_then(Value::as_str)
                    .unwrap_or("")
            })
            .collect();
        PoisonRecord {
            queue: s("Queue").unwrap_or_default(),
            function: s("Function").unwrap_or_default(),
            message_id: s("MessageId").unwrap_or_default(),
            inserted_at: s("InsertedAt").unwrap_or_default(),
            dequeue_count: n("DequeueCount"),
            first_attempt_at: s("FirstAttemptAt").unwrap_or_default(),
            poisoned_at: s("PoisonedAt").unwrap_or_default(),
            key: s("Key"),
            error: ErrorInfo {
                kind: ErrorKind::parse(&s("ErrorKind").unwrap_or_default()),
                message: s("ErrorMessage").unwrap_or_default(),
            },
            message,
            encoding: if s("Encoding").as_deref() == Some("none") {
                MessageEncoding::None
            } else {
                MessageEncoding::Base64
            },
            status: s("Status")
                .and_then(|s| RecordStatus::parse(&s))
                .unwrap_or(RecordStatus::Open),
            origin: s("Origin").unwrap_or_else(|| "aqw".into()),
            poison_message_id: s("PoisonMessageId"),
            poison_pop_receipt: s("PoisonPopReceipt"),
            replay_count: n("ReplayCount"),
            replayed_at: s("ReplayedAt"),
            replayed_by: s("ReplayedBy"),
            replay_message_id: s("ReplayMessageId"),
            replay_note: s("ReplayNote"),
            replay_started_at: s("ReplayStartedAt"),
            discarded_at: s("DiscardedAt"),
            discarded_by: s("DiscardedBy"),
            discard_reason: s("DiscardReason"),
            replaced_at: s("ReplacedAt"),
            replaced_by: s("ReplacedBy"),
            replacement_message_id: s("ReplacementMessageId"),
            replacement_key: s("ReplacementKey"),
            replacement_size_diff: e.get("ReplacementSizeDiff").and_then(Value::as_i64),
        }
    }

    /// A new open record for `envelope` (whose `message` holds the full text).
    pub fn open(envelope: PoisonEnvelope, origin: &str, poison_message_id: Option<String>) -> Self {
        PoisonRecord {
            queue: envelope.queue,
            function: envelope.function,
            message_id: envelope.message_id,
            inserted_at: envelope.inserted_at,
            dequeue_count: envelope.dequeue_count,
            first_attempt_at: envelope.first_attempt_at,
            poisoned_at: envelope.poisoned_at,
            key: envelope.key,
            error: envelope.error,
            message: envelope.message.unwrap_or_default(),
            encoding: envelope.encoding,
            status: RecordStatus::Open,
            origin: origin.to_string(),
            poison_message_id,
            poison_pop_receipt: None,
            replay_count: 0,
            replayed_at: None,
            replayed_by: None,
            replay_message_id: None,
            replay_note: None,
            replay_started_at: None,
            discarded_at: None,
            discarded_by: None,
            discard_reason: None,
            replaced_at: None,
            replaced_by: None,
            replacement_message_id: None,
            replacement_key: None,
            replacement_size_diff: None,
        }
    }

    pub fn envelope(&self) -> PoisonEnvelope {
        PoisonEnvelope {
            aqw: ENVELOPE_VERSION.into(),
            queue: self.queue.clone(),
            function: self.function.clone(),
            message_id: self.message_id.clone(),
            inserted_at: self.inserted_at.clone(),
            dequeue_count: self.dequeue_count,
            first_attempt_at: self.first_attempt_at.clone(),
            poisoned_at: self.poisoned_at.clone(),
            key: self.key.clone(),
            error: self.error.clone(),
            message: Some(self.message.clone()),
            record: None,
            encoding: self.encoding,
        }
    }
}

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
        key: Option<&str>,
        error: &ErrorInfo,
        first_attempt_at: Option<String>,
    ) -> StorageResult<bool> {
        let error = ErrorInfo {
            kind: error.kind,
            message: cap_error(&error.message),
        };
        let record = PoisonRecord::open(
            PoisonEnvelope {
                aqw: ENVELOPE_VERSION.into(),
                queue: self.source_queue.clone(),
                function: self.function.clone(),
                message_id: msg.id.clone(),
                inserted_at: fmt_time(msg.insertion_time),
                dequeue_count: msg.dequeue_count,
                first_attempt_at: first_attempt_at.unwrap_or_else(|| fmt_time(msg.insertion_time)),
                poisoned_at: now_rfc3339(),
                key: key.map(str::to_string),
                error: error.clone(),
                message: Some(msg.text.clone()),
                record: None,
                encoding: self.encoding,
            },
            "aqw",
            None,
        );
        let (mut record, etag, created) = self.insert_record(&msg.id, record).await?;
        let (pk, rk) = (self.source_queue.as_str(), msg.id.as_str());
        failpoint::hit("poison.after_record");
        // A record without its copy's id, found by a re-run: the copy may have
        // been put just before a crash. Adopt it rather than put a second one.
        if !created && record.poison_message_id.is_none() {
            if let Some(existing) = self.find_copy(&msg.id).await? {
                let mut update = Entity::new();
                update.insert("PoisonMessageId".into(), json!(existing));
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
                function: self.function.clone(),
                message_id: msg.id.clone(),
                key: key.map(str::to_string),
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
        let mut update = Entity::new();
        update.insert("PoisonMessageId".into(), json!(receipt.id));
        update.insert("PoisonPopReceipt".into(), json!(receipt.pop_receipt));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_messages_split_and_join_exactly() {
        let text: String = "é😀a".repeat(30_000);
        let parts = split_parts(&text);
        assert!(parts.len() > 1 && parts.iter().all(|p| p.chars().count() <= PART_CHARS));
        assert_eq!(parts.concat(), text);
        assert_eq!(split_parts(""), vec![String::new()]);
    }
}
