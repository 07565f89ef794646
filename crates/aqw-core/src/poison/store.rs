//! [`PoisonStore`]: the one owner of a source queue's poison records (the
//! record table) and of their copies on `<queue>-poison`, as
//! [`crate::idempotency::KeyStore`] owns keys. Callers speak records and
//! ETags; the rows' columns stay in [`super::record`], and the crash-safe
//! write order of [`crate::poison`] is [`PoisonStore::write`].
//!
//! The record-table side is here; the poison-queue side (scan, release,
//! finding and deleting copies) is in [`super::copies`].

use super::record::{self, PoisonRecord, RecordStatus, Replacement, Replayed, WindowOverride};
use crate::failpoint;
use crate::message::MessageEncoding;
use crate::storage::{Entity, Etag, QueueStore, StorageError, StorageResult, TableStore, Ttl};
use std::sync::Arc;

/// The poison records of one source queue and their poison-queue copies.
#[derive(Clone)]
pub struct PoisonStore {
    /// The source queue: the records' PartitionKey.
    pub(super) queue: String,
    /// The function consuming the queue, named on imported host copies.
    pub(super) function: String,
    /// The app's message encoding, kept on imported host copies.
    pub(super) encoding: MessageEncoding,
    pub(super) records: Arc<dyn TableStore>,
    pub(super) poison_queue: Arc<dyn QueueStore>,
}

/// How an attempt to close an open record ended.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Closing {
    /// This call closed it.
    Closed,
    /// It was not open any more (someone else closed it, or it vanished), or
    /// it kept changing: why, for the caller's report.
    AlreadyClosed(String),
}

impl PoisonStore {
    /// The records of source queue `queue` (consumed by `function`) in table
    /// `records`, and their copies on `poison_queue`.
    pub fn new(
        queue: &str,
        function: &str,
        encoding: MessageEncoding,
        records: Arc<dyn TableStore>,
        poison_queue: Arc<dyn QueueStore>,
    ) -> Self {
        Self {
            queue: queue.to_string(),
            function: function.to_string(),
            encoding,
            records,
            poison_queue,
        }
    }

    /// The source queue whose records these are.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// All records of this queue with their ETags, so a command can update
    /// one without reading it again (a 412 tells it someone else did). None
    /// while the record table does not exist.
    pub async fn list(&self) -> StorageResult<Vec<(PoisonRecord, Option<Etag>)>> {
        match self.records.query_rows(Some(&self.queue)).await {
            Ok(rows) => Ok(rows
                .into_iter()
                .map(|r| (PoisonRecord::from_entity(&r.entity), r.etag))
                .collect()),
            Err(StorageError::NotFound) => Ok(vec![]),
            Err(e) => Err(e),
        }
    }

    /// Every record of this queue without its payload (`message` is empty):
    /// what a list view needs, read with `$select` so a page over 10,000
    /// records never pulls their payloads. For views only: an action
    /// re-reads the record it changes.
    pub(crate) async fn list_summaries(&self) -> StorageResult<Vec<PoisonRecord>> {
        let query = crate::storage::TableQuery {
            partition: Some(&self.queue),
            filter: None,
            select: &record::SUMMARY_COLUMNS,
        };
        match self.records.query_where(&query).await {
            Ok(rows) => Ok(rows
                .iter()
                .map(|r| PoisonRecord::from_entity(&r.entity))
                .collect()),
            Err(StorageError::NotFound) => Ok(vec![]),
            Err(e) => Err(e),
        }
    }

    /// The errors of this queue's open records, read with a narrow query
    /// (two columns, open rows only) so a minute's refresh of the gauges
    /// never pulls payloads. Empty while the record table does not exist.
    pub async fn open_errors(&self) -> StorageResult<Vec<crate::message::ErrorInfo>> {
        let (status, open, columns) = record::OPEN_ERRORS_QUERY;
        let query = crate::storage::TableQuery {
            partition: Some(&self.queue),
            filter: Some(crate::storage::Filter::eq(status, open)),
            select: &columns,
        };
        match self.records.query_where(&query).await {
            Ok(rows) => Ok(rows.iter().map(|r| record::error_of(&r.entity)).collect()),
            Err(StorageError::NotFound) => Ok(vec![]),
            Err(e) => Err(e),
        }
    }

    /// The ids of open records written at or after `since`, keys only: a
    /// narrow query a durable replay runs every few seconds to see whether
    /// the jobs it re-put came back poisoned.
    pub(crate) async fn open_ids_since(
        &self,
        since: time::OffsetDateTime,
    ) -> StorageResult<Vec<String>> {
        let (status, open, _) = record::OPEN_ERRORS_QUERY;
        let filter = crate::storage::Filter::eq(status, open)
            .and(crate::storage::Filter::ChangedSince(since));
        let query = crate::storage::TableQuery {
            partition: Some(&self.queue),
            filter: Some(filter),
            select: &[status],
        };
        match self.records.query_where(&query).await {
            Ok(rows) => Ok(rows.into_iter().map(|r| r.row_key).collect()),
            Err(StorageError::NotFound) => Ok(vec![]),
            Err(e) => Err(e),
        }
    }

    /// The record `id`: a source message id, or the id of a host copy's record.
    pub(crate) async fn find(&self, id: &str) -> StorageResult<Option<(PoisonRecord, Etag)>> {
        for rk in [id.to_string(), super::host_record_id(id)] {
            match self.records.get(&self.queue, &rk).await {
                Ok(Some((e, etag))) => return Ok(Some((PoisonRecord::from_entity(&e), etag))),
                Ok(None) | Err(StorageError::NotFound) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    /// `rec` as it is stored now, with its ETag.
    pub(crate) async fn reread(
        &self,
        rec: &PoisonRecord,
    ) -> StorageResult<Option<(PoisonRecord, Etag)>> {
        Ok(self
            .records
            .get(&self.queue, &rec.row_key())
            .await?
            .map(|(e, etag)| (PoisonRecord::from_entity(&e), etag)))
    }

    /// Close `current` (open, at version `etag`) as replayed by `by`, with
    /// the override of the provider-key window if one was needed.
    pub(crate) async fn close_replayed(
        &self,
        current: &PoisonRecord,
        by: &str,
        how: Replayed<'_>,
        past_window: Option<&WindowOverride<'_>>,
        etag: &mut Etag,
    ) -> StorageResult<Closing> {
        let update = record::replayed_update(by, current.replay_count + 1, how);
        let update = record::with_window_override(update, past_window);
        self.close_open(current, &update, etag).await
    }

    /// Close `rec` (open, at version `etag`) as replaced by a corrected message.
    pub(crate) async fn close_replaced(
        &self,
        rec: &PoisonRecord,
        replacement: &Replacement<'_>,
        past_window: Option<&WindowOverride<'_>>,
        etag: &mut Etag,
    ) -> StorageResult<Closing> {
        let update = record::replaced_update(replacement);
        let update = record::with_window_override(update, past_window);
        self.close_open(rec, &update, etag).await
    }

    /// Close `rec` as discarded, conditional on `etag`: a concurrent change
    /// is an error (412, [`StorageError::PreconditionFailed`]), not retried.
    pub(crate) async fn close_discarded(
        &self,
        rec: &PoisonRecord,
        by: &str,
        reason: &str,
        etag: &Etag,
    ) -> StorageResult<()> {
        let update = record::discarded_update(by, reason);
        self.records
            .merge(&self.queue, &rec.row_key(), &update, Some(etag))
            .await?;
        Ok(())
    }

    /// The open records of `key`, with their ETags (one partition query,
    /// on the rare paths only: a poisoning, a key completing after a crash).
    pub(crate) async fn open_of_key(&self, key: &str) -> StorageResult<Vec<(PoisonRecord, Etag)>> {
        let filter = crate::storage::Filter::eq(record::col::STATUS, RecordStatus::Open.as_str())
            .and(crate::storage::Filter::eq(record::col::KEY, key));
        let query = crate::storage::TableQuery {
            partition: Some(&self.queue),
            filter: Some(filter),
            select: &[],
        };
        let rows = match self.records.query_where(&query).await {
            Ok(rows) => rows,
            Err(StorageError::NotFound) => return Ok(vec![]),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        for row in rows {
            let rec = PoisonRecord::from_entity(&row.entity);
            match row.etag {
                Some(etag) => out.push((rec, etag)),
                None => out.extend(self.reread(&rec).await?),
            }
        }
        Ok(out)
    }

    /// Close the open records of `key` that name no copy (poisonings
    /// interrupted between the record and the copy) as replayed, the key
    /// already done (`by` says which attempt completed it). Returns how
    /// many it closed.
    pub(crate) async fn close_interrupted_of_done_key(
        &self,
        key: &str,
        by: &str,
    ) -> StorageResult<usize> {
        let mut closed = 0;
        for (rec, mut etag) in self.open_of_key(key).await? {
            if rec.poison_message_id.is_some() {
                continue;
            }
            let how = Replayed::KeyAlreadyDone;
            if let Closing::Closed = self.close_replayed(&rec, by, how, None, &mut etag).await? {
                closed += 1;
            }
        }
        Ok(closed)
    }

    /// Set the crash marker of a keyless replay, conditional on `etag`: the
    /// record's new ETag, or `None` when it changed meanwhile (so of two
    /// replays racing for one keyless record only one gets to put it).
    pub(crate) async fn mark_replay_started(
        &self,
        rec: &PoisonRecord,
        etag: &Etag,
    ) -> StorageResult<Option<Etag>> {
        let mark = record::replay_started_update();
        match self
            .records
            .merge(&self.queue, &rec.row_key(), &mark, Some(etag))
            .await
        {
            Ok(e) => Ok(Some(e)),
            Err(StorageError::PreconditionFailed) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Merge `update` into an open record, conditional on `etag`. On a 412 the
    /// record is read again: still open → merge with its new version; closed →
    /// [`Closing::AlreadyClosed`].
    async fn close_open(
        &self,
        rec: &PoisonRecord,
        update: &Entity,
        etag: &mut Etag,
    ) -> StorageResult<Closing> {
        let row_key = rec.row_key();
        for _ in 0..3 {
            match self
                .records
                .merge(&self.queue, &row_key, update, Some(etag))
                .await
            {
                Ok(e) => {
                    *etag = e;
                    return Ok(Closing::Closed);
                }
                Err(StorageError::PreconditionFailed) => {}
                Err(e) => return Err(e),
            }
            match self.records.get(&self.queue, &row_key).await? {
                Some((e, fresh)) => {
                    let now = PoisonRecord::from_entity(&e);
                    if now.status != RecordStatus::Open {
                        let why = format!("already {}", now.status.as_str());
                        return Ok(Closing::AlreadyClosed(why));
                    }
                    *etag = fresh;
                }
                None => return Ok(Closing::AlreadyClosed("record vanished".into())),
            }
        }
        Ok(Closing::AlreadyClosed(
            "the record kept changing; try again".into(),
        ))
    }

    /// Steps 1–3 of the poison path (see the module doc of [`crate::poison`]):
    /// insert `record` (open, origin `aqw`) or reuse the one an earlier run
    /// left, put its envelope on `<queue>-poison` unless the record names a
    /// copy (adopting a copy a crashed run put but did not name), and name
    /// the copy on the record. Returns whether this call created the record.
    pub(crate) async fn write(&self, record: PoisonRecord, ttl: Ttl) -> StorageResult<bool> {
        let row_key = record.message_id.clone();
        let (mut record, etag, created) = self.insert_open(&row_key, record).await?;
        failpoint::hit("poison.after_record");
        // A record without its copy's id, found by a re-run: the copy may have
        // been put just before a crash. Adopt it rather than put a second one.
        if !created && record.poison_message_id.is_none() {
            if let Some(existing) = self.find_copy(&record).await? {
                let update = record::copy_update(&existing, None);
                self.records
                    .merge(&self.queue, &row_key, &update, None)
                    .await?;
                record.poison_message_id = Some(existing);
            }
        }
        if record.poison_message_id.is_none() {
            self.put_copy(&row_key, &record, etag.as_ref(), ttl).await?;
        }
        Ok(created)
    }

    /// Insert the record of a message being poisoned, or read the one a
    /// crashed earlier run left: (record, its ETag, whether this run made it).
    async fn insert_open(
        &self,
        row_key: &str,
        record: PoisonRecord,
    ) -> StorageResult<(PoisonRecord, Option<Etag>, bool)> {
        let pk = self.queue.as_str();
        match self.records.insert(pk, row_key, &record.to_entity()).await {
            Ok(etag) => Ok((record, Some(etag), true)),
            Err(StorageError::Conflict) => match self.records.get(pk, row_key).await? {
                Some((e, etag)) => Ok((PoisonRecord::from_entity(&e), Some(etag), false)),
                None => Err(StorageError::Other(
                    "poison record vanished while being written".into(),
                )),
            },
            Err(StorageError::NotFound) => {
                self.records.create_if_missing().await?;
                self.records
                    .insert(pk, row_key, &record.to_entity())
                    .await?;
                Ok((record, None, true))
            }
            Err(e) => Err(e),
        }
    }

    /// Put the record's envelope on `<queue>-poison` and note the copy's id
    /// on the record.
    async fn put_copy(
        &self,
        row_key: &str,
        record: &PoisonRecord,
        etag: Option<&Etag>,
        ttl: Ttl,
    ) -> StorageResult<()> {
        let pk = self.queue.as_str();
        let text = record.copy_text(self.records.name());
        let receipt = super::put_creating(self.poison_queue.as_ref(), &text, ttl).await?;
        failpoint::hit("poison.after_put");
        let update = record::copy_update(&receipt.id, Some(&receipt.pop_receipt));
        match self.records.merge(pk, row_key, &update, etag).await {
            Ok(_) => {}
            // Someone else updated it: our copy is then a stray (see module doc).
            Err(StorageError::PreconditionFailed) => {
                self.records.merge(pk, row_key, &update, None).await?;
            }
            Err(e) => return Err(e),
        }
        failpoint::hit("poison.after_mark");
        Ok(())
    }

    /// Import a poison-queue copy that has no record (a raw host copy, or an
    /// envelope whose record is missing) as an open record.
    pub(super) async fn import(&self, row_key: &str, record: &PoisonRecord) -> StorageResult<()> {
        self.records.create_if_missing().await?;
        match self
            .records
            .insert(&self.queue, row_key, &record.to_entity())
            .await
        {
            Ok(_) | Err(StorageError::Conflict) => Ok(()),
            Err(e) => Err(e),
        }
    }
}
