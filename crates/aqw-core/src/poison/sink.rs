//! Writing poison: the worker's one call. It builds the record of a message
//! that cannot succeed, has [`PoisonStore::write`] carry out the crash-safe
//! order (see the module doc of [`crate::poison`]), and raises the alert.

use super::envelope::{PoisonEnvelope, PoisonFormat, ENVELOPE_VERSION};
use super::record::PoisonRecord;
use super::store::PoisonStore;
use crate::alert::{Alerts, PoisonAlert};
use crate::idempotency::IdempotencyKey;
use crate::idempotency::{cap_error, fmt_time, now_rfc3339};
use crate::message::ErrorInfo;
use crate::message::MessageEncoding;
use crate::storage::{QueueStore, ReceivedMessage, StorageResult, TableStore, Ttl};
use std::sync::Arc;
use std::time::Duration;

/// Writes poison records and envelopes for one source queue.
#[derive(Clone)]
pub struct PoisonSink {
    /// The source queue.
    pub(crate) source_queue: String,
    /// The function consuming it.
    pub function: String,
    /// The source queue's `<queue>-poison`.
    pub poison_queue: Arc<dyn QueueStore>,
    /// The poison record table.
    pub(crate) records: Arc<dyn TableStore>,
    /// The app's message encoding (of the source and poison messages).
    pub(crate) encoding: MessageEncoding,
    /// TTL of the poison-queue copies; `None` = never expires.
    pub(crate) ttl: Option<Duration>,
    /// What the `<queue>-poison` copy is: the envelope or the raw body.
    pub(crate) format: PoisonFormat,
    /// Where new poison events are raised.
    pub(crate) alerts: Alerts,
}

impl PoisonSink {
    /// The store of this sink's records and poison-queue copies.
    pub fn store(&self) -> PoisonStore {
        PoisonStore::new(
            &self.source_queue,
            &self.function,
            self.encoding,
            self.records.clone(),
            self.poison_queue.clone(),
        )
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
        self.write_counted(msg, key, error, first_attempt_at, trace_parent, 0)
            .await
    }

    /// [`write`](Self::write), saying how many of the job's attempts ended
    /// with their outcome unknown (the record and the alert mark it).
    pub(crate) async fn write_counted(
        &self,
        msg: &ReceivedMessage,
        key: Option<&IdempotencyKey>,
        error: &ErrorInfo,
        first_attempt_at: Option<String>,
        trace_parent: Option<String>,
        uncertain_attempts: u32,
    ) -> StorageResult<bool> {
        let error = ErrorInfo {
            kind: error.kind,
            message: cap_error(&error.message),
        };
        let mut record = self.open_record(msg, key, &error, first_attempt_at);
        record.trace_parent = trace_parent;
        record.uncertain_attempts = uncertain_attempts;
        let ttl = match self.ttl {
            None => Ttl::Never,
            Some(d) => Ttl::After(d),
        };
        if let Some(interrupted) = self.interrupted_of_key(msg, key).await? {
            // The job's poisoning was interrupted after its record (a crash
            // before the copy), and the job came back as another message (a
            // parked or deferred fresh copy): finish that poisoning, one
            // record for the job, rather than leave it without its copy.
            self.store().write(interrupted, ttl).await?;
            return Ok(false);
        }
        let created = self.store().write(record, ttl).await?;
        if created {
            self.alert(&msg.id, key, &error, uncertain_attempts > 0);
        }
        Ok(created)
    }

    /// An open record of `key` for another message that names no copy: a
    /// poisoning of the same job interrupted between its record and its
    /// copy (failpoint `poison.after_record`; seed 214 of the simulation).
    async fn interrupted_of_key(
        &self,
        msg: &ReceivedMessage,
        key: Option<&IdempotencyKey>,
    ) -> StorageResult<Option<super::record::PoisonRecord>> {
        let Some(key) = key else {
            return Ok(None);
        };
        let open = self.store().open_of_key(key.as_str()).await?;
        Ok(open
            .into_iter()
            .map(|(rec, _)| rec)
            .find(|rec| rec.message_id != msg.id && rec.poison_message_id.is_none()))
    }

    /// The open record of `msg`, poisoned now by `error`.
    fn open_record(
        &self,
        msg: &ReceivedMessage,
        key: Option<&IdempotencyKey>,
        error: &ErrorInfo,
        first_attempt_at: Option<String>,
    ) -> PoisonRecord {
        let envelope = PoisonEnvelope {
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
        };
        let mut record = PoisonRecord::open(envelope, "aqw", None);
        record.copy_format = self.format;
        record
    }

    /// The alert of a newly poisoned message (once per message: only the
    /// call that created its record raises it).
    fn alert(
        &self,
        message_id: &str,
        key: Option<&IdempotencyKey>,
        error: &ErrorInfo,
        uncertain: bool,
    ) {
        self.alerts.poisoned(PoisonAlert {
            queue: self.source_queue.clone(),
            poison_queue: self.poison_queue.name().to_string(),
            function: self.function.clone(),
            message_id: message_id.to_string(),
            key: key.map(|k| k.to_string()),
            error_kind: error.kind.as_str().into(),
            error: error.message.clone(),
            poisoned_at: crate::clock::now_utc(),
            uncertain,
        });
    }
}
