//! The poison-queue side of [`PoisonStore`]: the copies on `<queue>-poison`.
//! A scan reconciles them with the records (importing raw Functions-host
//! copies, deleting strays); commands delete a closed record's copy and
//! release what they held.

use super::envelope::{host_record_id, PoisonEnvelope, PoisonFormat, ENVELOPE_VERSION};
use super::record::{PoisonRecord, RecordStatus};
use super::store::PoisonStore;
use crate::idempotency::fmt_time;
use crate::message::{ErrorInfo, ErrorKind};
use crate::storage::{PutReceipt, QueueStore, StorageError, StorageResult, Ttl};
use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;
use time::OffsetDateTime;

/// Poison-queue copies a scan received: id → (pop receipt, text). Whatever
/// the command does not delete is released (visible again) at its end.
#[derive(Default)]
pub struct Held(Mutex<BTreeMap<String, (String, String)>>);

/// One message of the poison queue, as a scan saw it.
struct ScannedCopy {
    id: String,
    /// Set when received (held), not when peeked.
    receipt: Option<String>,
    dequeue_count: u32,
    inserted: OffsetDateTime,
    text: String,
}

/// The record a non-envelope poison-queue copy belongs to, if it is not a
/// foreign Functions-host copy: the record that names its id, else a raw
/// (`aqw.poison.format: raw`) record of aqw's own whose message text it is
/// exactly (an open one that names no copy first: a crash came between put
/// and record update). The record is written before its copy is put, so
/// every raw copy aqw made has one.
fn raw_copy_owner(known: &BTreeMap<String, PoisonRecord>, id: &str, text: &str) -> Option<String> {
    if let Some((rk, _)) = known
        .iter()
        .find(|(_, r)| r.poison_message_id.as_deref() == Some(id))
    {
        return Some(rk.clone());
    }
    let mut own: Vec<(&String, &PoisonRecord)> = known
        .iter()
        .filter(|(_, r)| r.origin == "aqw" && r.copy_format == PoisonFormat::Raw)
        .filter(|(_, r)| r.message == text)
        .collect();
    own.sort_by_key(|(_, r)| {
        (
            r.status != RecordStatus::Open,
            r.poison_message_id.is_some(),
        )
    });
    own.first().map(|(rk, _)| (*rk).clone())
}

/// Put on a queue, creating it on first use.
pub async fn put_creating(
    queue: &dyn QueueStore,
    text: &str,
    ttl: Ttl,
) -> StorageResult<PutReceipt> {
    put_creating_after(queue, text, Duration::ZERO, ttl).await
}

/// Put on a queue invisible for `delay` (a delayed job), creating the
/// queue on first use.
pub(crate) async fn put_creating_after(
    queue: &dyn QueueStore,
    text: &str,
    delay: Duration,
    ttl: Ttl,
) -> StorageResult<PutReceipt> {
    match queue.put(text, delay, ttl).await {
        Err(StorageError::NotFound) => {
            queue.create_if_missing().await?;
            queue.put(text, delay, ttl).await
        }
        other => other,
    }
}

impl PoisonStore {
    /// The approximate number of messages on `<queue>-poison` (0 while it
    /// does not exist).
    pub async fn poison_depth(&self) -> StorageResult<u64> {
        match self.poison_queue.approximate_count().await {
            Err(StorageError::NotFound) => Ok(0),
            other => other,
        }
    }

    /// Read the poison queue and reconcile it with the record table: import
    /// raw Functions-host copies (and envelopes whose record is missing) as
    /// records. With `hold`, messages are received (invisible for `hold`) so
    /// the command gets pop receipts to delete copies with; stray copies (a
    /// crash between put and record update) and leftover copies of closed
    /// records are deleted on the way. Without `hold`, only the first 32
    /// visible messages are peeked and nothing changes visibility.
    pub async fn scan(&self, hold: Option<Duration>) -> StorageResult<Held> {
        let mut receipts: BTreeMap<String, (String, String)> = BTreeMap::new();
        let mut known: BTreeMap<String, PoisonRecord> = self
            .list()
            .await?
            .into_iter()
            .map(|(r, _)| (r.row_key(), r))
            .collect();
        let mut seen = HashSet::new();
        loop {
            let Some(batch) = self.scan_batch(hold).await? else {
                return Ok(Held(Mutex::new(receipts)));
            };
            let mut new = 0;
            for copy in batch {
                if !seen.insert(copy.id.clone()) {
                    continue;
                }
                new += 1;
                if let Some(r) = &copy.receipt {
                    receipts.insert(copy.id.clone(), (r.clone(), copy.text.clone()));
                }
                self.reconcile(copy, &mut known, &mut receipts).await?;
            }
            if new == 0 || hold.is_none() {
                break;
            }
        }
        Ok(Held(Mutex::new(receipts)))
    }

    /// One batch of poison-queue copies: received for `hold`, or peeked.
    /// `None` when the poison queue does not exist.
    async fn scan_batch(&self, hold: Option<Duration>) -> StorageResult<Option<Vec<ScannedCopy>>> {
        let batch: Vec<ScannedCopy> = match hold {
            Some(h) => match self.poison_queue.receive(32, h).await {
                Ok(b) => b
                    .into_iter()
                    .map(|m| ScannedCopy {
                        id: m.id,
                        receipt: Some(m.pop_receipt),
                        dequeue_count: m.dequeue_count,
                        inserted: m.insertion_time,
                        text: m.text,
                    })
                    .collect(),
                Err(StorageError::NotFound) => return Ok(None),
                Err(e) => return Err(e),
            },
            None => match self.poison_queue.peek(32).await {
                Ok(b) => b
                    .into_iter()
                    .map(|m| ScannedCopy {
                        id: m.id,
                        receipt: None,
                        dequeue_count: m.dequeue_count,
                        inserted: m.insertion_time,
                        text: m.text,
                    })
                    .collect(),
                Err(StorageError::NotFound) => return Ok(None),
                Err(e) => return Err(e),
            },
        };
        Ok(Some(batch))
    }

    /// Reconcile one poison-queue copy with the known records: import it if
    /// it has no record; name it on its record if that names none (a crash
    /// between put and record update); delete it (when held) if it is a
    /// stray copy or its record is closed.
    async fn reconcile(
        &self,
        copy: ScannedCopy,
        known: &mut BTreeMap<String, PoisonRecord>,
        receipts: &mut BTreeMap<String, (String, String)>,
    ) -> StorageResult<()> {
        let (row_key, imported) = match PoisonEnvelope::from_queue_text(&copy.text) {
            Some(env) => (
                env.message_id.clone(),
                PoisonRecord::open(env, "aqw", Some(copy.id.clone())),
            ),
            None => match raw_copy_owner(known, &copy.id, &copy.text) {
                Some(row_key) => (row_key, self.host_record(&copy)),
                None => (host_record_id(&copy.id), self.host_record(&copy)),
            },
        };
        let Some(rec) = known.get_mut(&row_key) else {
            self.import(&row_key, &imported).await?;
            known.insert(row_key, imported);
            return Ok(());
        };
        let open = rec.status == RecordStatus::Open;
        match rec.poison_message_id.as_deref() {
            None if open => {
                self.name_copy(&row_key, &copy.id, copy.receipt.as_deref())
                    .await?;
                rec.poison_message_id = Some(copy.id.clone());
            }
            Some(named) if named == copy.id && open => {}
            // A stray (its record names another copy), or a closed record's leftover.
            _ => {
                if let Some(r) = &copy.receipt {
                    let _ = self.poison_queue.delete(&copy.id, r).await;
                    receipts.remove(&copy.id);
                }
            }
        }
        Ok(())
    }

    /// The record of a raw copy the Functions host put on the poison queue.
    fn host_record(&self, copy: &ScannedCopy) -> PoisonRecord {
        let ScannedCopy {
            id,
            dequeue_count,
            inserted,
            text,
            ..
        } = copy;
        let (dequeue_count, inserted) = (*dequeue_count, *inserted);
        let envelope = PoisonEnvelope {
            aqw: ENVELOPE_VERSION.into(),
            queue: self.queue.clone(),
            function: self.function.clone(),
            message_id: id.to_string(),
            inserted_at: fmt_time(inserted),
            dequeue_count,
            first_attempt_at: String::new(),
            poisoned_at: fmt_time(inserted),
            key: None,
            error: ErrorInfo {
                kind: ErrorKind::Retryable,
                message: "copied to the poison queue by the Functions host (no error kept)".into(),
            },
            message: Some(text.to_string()),
            record: None,
            encoding: self.encoding,
        };
        let mut record = PoisonRecord::open(envelope, "host", Some(id.to_string()));
        // The host writes the raw body: say so on `poison show`.
        record.copy_format = PoisonFormat::Raw;
        record
    }

    /// Name `copy_id` as the poison-queue copy of record `row_key`.
    async fn name_copy(
        &self,
        row_key: &str,
        copy_id: &str,
        pop_receipt: Option<&str>,
    ) -> StorageResult<()> {
        let update = super::record::copy_update(copy_id, pop_receipt);
        self.records
            .merge(&self.queue, row_key, &update, None)
            .await?;
        Ok(())
    }

    /// Make the copies a scan held but did not delete visible again at once,
    /// 16 at a time (a 10,000-deep poison queue is 10,000 requests: one
    /// after another they took longer than the operation they ended).
    pub(crate) async fn release(&self, held: Held) {
        use futures::StreamExt as _;
        let left: Vec<(String, (String, String))> = held
            .0
            .into_inner()
            .unwrap_or_default()
            .into_iter()
            .collect();
        let queue = &self.poison_queue;
        futures::stream::iter(left.into_iter().map(|(id, (receipt, text))| async move {
            let _ = queue
                .update_visibility(&id, &receipt, &text, Duration::ZERO)
                .await;
        }))
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
    }

    /// Delete the poison-queue copy of a record (already gone is fine): with
    /// the pop receipt a scan got, else the one the record kept. Whether it
    /// is gone: false when no receipt worked (or none names a copy), which
    /// only a scan can settle.
    async fn delete_copy(&self, rec: &PoisonRecord, held: &Held) -> StorageResult<bool> {
        let Some(id) = &rec.poison_message_id else {
            return Ok(false);
        };
        let mut tried = Vec::new();
        if let Some((r, _)) = held.0.lock().unwrap().remove(id) {
            tried.push(r);
        }
        if let Some(r) = &rec.poison_pop_receipt {
            tried.push(r.clone());
        }
        for r in tried {
            match self.poison_queue.delete(id, &r).await {
                Ok(()) | Err(StorageError::NotFound) => return Ok(true),
                Err(StorageError::Http { status: 400, .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(false)
    }

    /// [`Self::delete_copy`] once `rec` is closed: an error leaves the copy
    /// to the next scan (the close stands, so it is no failed replay);
    /// whether it is gone.
    pub(crate) async fn delete_closed_copy(&self, rec: &PoisonRecord, held: &Held) -> bool {
        self.delete_copy(rec, held).await.unwrap_or(false)
    }

    /// Delete `rec`'s copy with the pop receipt its record kept (the one
    /// the put returned: valid until someone receives the copy), without a
    /// scan: true when the copy is gone (deleted now or before), false when
    /// it may still be there (no copy named, no receipt, or one a scan made
    /// stale), which only a scan can settle. One request, whatever the
    /// poison queue's depth.
    pub(crate) async fn delete_copy_by_receipt(&self, rec: &PoisonRecord) -> StorageResult<bool> {
        let (Some(id), Some(receipt)) = (&rec.poison_message_id, &rec.poison_pop_receipt) else {
            return Ok(false);
        };
        if receipt.is_empty() {
            return Ok(false);
        }
        match self.poison_queue.delete(id, receipt).await {
            Ok(()) | Err(StorageError::NotFound) => Ok(true),
            Err(StorageError::Http { status: 400, .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Delete `rec`'s copy once a scan has held the poison queue for `hold`
    /// (so the copy's pop receipt is known), then release what else it held.
    pub(crate) async fn scan_and_delete_copy(
        &self,
        rec: &PoisonRecord,
        hold: Duration,
    ) -> StorageResult<()> {
        let held = self.scan(Some(hold)).await?;
        let deleted = self.delete_copy(rec, &held).await;
        self.release(held).await;
        deleted.map(|_| ())
    }

    /// The id of a poison-queue copy of `record` (an envelope naming its
    /// message id, or for a raw record its exact text), if one
    /// is visible. Peeks first (no side effects); a deeper queue is received
    /// in batches with a short hold, and what was held is released at once.
    pub(super) async fn find_copy(&self, record: &PoisonRecord) -> StorageResult<Option<String>> {
        let matches = |text: &str| record.is_copy_text(text);
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
}
