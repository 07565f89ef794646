//! The operator's procedure: status, list, show,
//! replay, discard, fix, enqueue and `keys show`, one file each. Each command
//! returns data; the binary renders it and decides the exit code.
//!
//! This file holds what the commands share: [`QueueOps`] (the storage
//! handles of one source queue, the poison-queue scan), [`Filter`] and
//! [`OpsError`].
//!
//! Poison records live in the record table (no 32-message peek limit). Raw
//! copies written to `<queue>-poison` by the Functions host itself are found
//! by a scan of the poison queue and imported as records (origin `host`), so
//! they are listed and replayed like aqw's own.

mod discard;
mod enqueue;
mod fix;
mod keys;
mod list;
mod replay;
mod show;
mod status;

pub use discard::discard;
pub use enqueue::{enqueue, prepare_enqueue, with_trace_context, Enqueued, PreparedEnqueue};
pub use fix::{fix, FixAction, FixReport};
pub use keys::key_record;
pub use list::list;
pub use replay::{
    replay, ReplayAction, ReplayItem, ReplayOptions, ReplayReport, DEFAULT_REPLAY_CONCURRENCY,
};
pub use show::{show, ShowReport};
pub use status::{status, QueueStatus};

use crate::config::{AppConfig, FunctionConfig};
use crate::idempotency::{fmt_time, IdempotencyKey, KeyRecord, KeyStore};
use crate::message::{ErrorInfo, ErrorKind, PoisonEnvelope};
use crate::poison::{PoisonRecord, RecordStatus};
use crate::storage::{Entity, Etag, QueueStore, Storage, StorageError, TableStore};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Errors of the operator commands, mapped to exit codes by the binary.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// Bad arguments or config (exit 2).
    #[error("{0}")]
    Usage(String),
    /// Storage failed (exit 3).
    #[error(transparent)]
    Storage(#[from] StorageError),
}

pub type OpsResult<T> = Result<T, OpsError>;

/// Storage handles for one source queue.
pub struct QueueOps {
    pub app: Arc<AppConfig>,
    pub function: Option<FunctionConfig>,
    pub queue: String,
    pub source: Arc<dyn QueueStore>,
    pub poison_queue: Arc<dyn QueueStore>,
    pub records: Arc<dyn TableStore>,
    pub keys: KeyStore,
}

impl QueueOps {
    pub fn new(app: Arc<AppConfig>, queue: &str, storage: &dyn Storage) -> Self {
        Self {
            function: app.function_for_queue(queue).cloned(),
            queue: queue.to_string(),
            source: storage.queue(queue),
            poison_queue: storage.queue(&crate::message::poison_queue_name(queue)),
            records: storage.table(&app.poison_table),
            keys: KeyStore::new(storage.table(&app.keys_table)),
            app,
        }
    }

    /// All records of this queue (after importing what a scan finds).
    pub async fn records(&self) -> OpsResult<Vec<PoisonRecord>> {
        Ok(self
            .versioned_records()
            .await?
            .into_iter()
            .map(|(r, _)| r)
            .collect())
    }

    /// All records of this queue with their ETags, so a command can update
    /// one without reading it again (a 412 tells it someone else did).
    pub async fn versioned_records(&self) -> OpsResult<Vec<(PoisonRecord, Option<Etag>)>> {
        match self.records.query_rows(Some(&self.queue)).await {
            Ok(rows) => Ok(rows
                .into_iter()
                .map(|r| (PoisonRecord::from_entity(&r.entity), r.etag))
                .collect()),
            Err(StorageError::NotFound) => Ok(vec![]),
            Err(e) => Err(e.into()),
        }
    }

    pub async fn record(
        &self,
        id: &str,
    ) -> OpsResult<Option<(PoisonRecord, crate::storage::Etag)>> {
        for rk in [id.to_string(), crate::message::host_record_id(id)] {
            match self.records.get(&self.queue, &rk).await {
                Ok(Some((e, etag))) => return Ok(Some((PoisonRecord::from_entity(&e), etag))),
                Ok(None) | Err(StorageError::NotFound) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(None)
    }

    /// The record `id`, which must be open (a usage error otherwise).
    pub async fn open_record(&self, id: &str) -> OpsResult<(PoisonRecord, Etag)> {
        let (rec, etag) = self.record(id).await?.ok_or_else(|| {
            OpsError::Usage(format!("no poison record {id} for queue {}", self.queue))
        })?;
        if rec.status != RecordStatus::Open {
            return Err(OpsError::Usage(format!(
                "record {id} is already {}",
                rec.status.as_str()
            )));
        }
        Ok((rec, etag))
    }

    fn row_key(r: &PoisonRecord) -> String {
        if r.origin == "host" {
            crate::message::host_record_id(&r.message_id)
        } else {
            r.message_id.clone()
        }
    }

    /// Read the poison queue and reconcile it with the record table: import
    /// raw Functions-host copies (and envelopes whose record is missing) as
    /// records. With `hold`, messages are received (invisible for `hold`) so
    /// this command gets pop receipts to delete copies with; stray copies (a
    /// crash between put and record update) and leftover copies of closed
    /// records are deleted on the way. Without `hold`, only the first 32
    /// visible messages are peeked and nothing changes visibility.
    pub async fn scan(&self, hold: Option<Duration>) -> OpsResult<Held> {
        let mut receipts: HashMap<String, (String, String)> = HashMap::new();
        let mut known: HashMap<String, PoisonRecord> = self
            .records()
            .await?
            .into_iter()
            .map(|r| (QueueOps::row_key(&r), r))
            .collect();
        let mut seen = std::collections::HashSet::new();
        loop {
            let Some(batch) = self.scan_batch(hold).await? else {
                return Ok(Held(std::sync::Mutex::new(receipts)));
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
        Ok(Held(std::sync::Mutex::new(receipts)))
    }

    /// One batch of poison-queue copies: received for `hold`, or peeked.
    /// `None` when the poison queue does not exist.
    async fn scan_batch(&self, hold: Option<Duration>) -> OpsResult<Option<Vec<ScannedCopy>>> {
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
                Err(e) => return Err(e.into()),
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
                Err(e) => return Err(e.into()),
            },
        };
        Ok(Some(batch))
    }

    /// Reconcile one poison-queue copy with the known records: import it if
    /// it has no record; delete it (when held) if it is a stray copy or its
    /// record is closed.
    async fn reconcile(
        &self,
        copy: ScannedCopy,
        known: &mut HashMap<String, PoisonRecord>,
        receipts: &mut HashMap<String, (String, String)>,
    ) -> OpsResult<()> {
        let ScannedCopy {
            id,
            receipt,
            dequeue_count,
            inserted,
            text,
        } = copy;
        let (row_key, imported) = match PoisonEnvelope::from_queue_text(&text) {
            Some(env) => (env.message_id.clone(), record_from_envelope(&env, &id)),
            None => (
                crate::message::host_record_id(&id),
                self.host_record(&id, dequeue_count, inserted, &text),
            ),
        };
        match known.get(&row_key) {
            Some(rec) => {
                let stray = rec.poison_message_id.as_deref().is_some_and(|p| p != id);
                if stray || rec.status != RecordStatus::Open {
                    if let Some(r) = &receipt {
                        let _ = self.poison_queue.delete(&id, r).await;
                        receipts.remove(&id);
                    }
                }
            }
            None => {
                self.records.create_if_missing().await?;
                insert_ignoring_conflict(
                    self.records.as_ref(),
                    &self.queue,
                    &row_key,
                    &imported.to_entity(),
                )
                .await?;
                known.insert(row_key, imported);
            }
        }
        Ok(())
    }

    /// Make the copies a scan held but did not delete visible again at once.
    pub async fn release(&self, held: Held) {
        let left: Vec<(String, (String, String))> = held
            .0
            .into_inner()
            .unwrap_or_default()
            .into_iter()
            .collect();
        for (id, (receipt, text)) in left {
            let _ = self
                .poison_queue
                .update_visibility(&id, &receipt, &text, Duration::ZERO)
                .await;
        }
    }

    fn host_record(
        &self,
        id: &str,
        dequeue_count: u32,
        inserted: OffsetDateTime,
        text: &str,
    ) -> PoisonRecord {
        let envelope = PoisonEnvelope {
            aqw: crate::message::ENVELOPE_VERSION.into(),
            queue: self.queue.clone(),
            function: self
                .function
                .as_ref()
                .map(|f| f.name.clone())
                .unwrap_or_default(),
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
            encoding: self.app.message_encoding,
        };
        PoisonRecord::open(envelope, "host", Some(id.to_string()))
    }

    /// Delete the poison-queue copy of a record (already gone is fine).
    async fn delete_copy(&self, rec: &PoisonRecord, receipts: &Held) -> OpsResult<()> {
        let Some(id) = &rec.poison_message_id else {
            return Ok(());
        };
        let mut tried = Vec::new();
        if let Some((r, _)) = receipts.0.lock().unwrap().remove(id) {
            tried.push(r);
        }
        if let Some(r) = &rec.poison_pop_receipt {
            tried.push(r.clone());
        }
        for r in tried {
            match self.poison_queue.delete(id, &r).await {
                Ok(()) | Err(StorageError::NotFound) => return Ok(()),
                Err(StorageError::Http { status: 400, .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// The key state of a record, if its function and key are known.
    pub async fn key_record(&self, rec: &PoisonRecord) -> OpsResult<Option<KeyRecord>> {
        let (Some(f), Some(k)) = (self.function.as_ref(), rec.key.as_ref()) else {
            return Ok(None);
        };
        let key = IdempotencyKey::new(k.clone()).map_err(OpsError::Usage)?;
        match self.keys.get(&f.name, &key).await {
            Ok(r) => Ok(r),
            Err(StorageError::NotFound) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

/// One message of the poison queue, as a scan saw it.
struct ScannedCopy {
    id: String,
    /// Set when received (held), not when peeked.
    receipt: Option<String>,
    dequeue_count: u32,
    inserted: OffsetDateTime,
    text: String,
}

/// Poison-queue copies a scan received: id → (pop receipt, text). Whatever
/// the command does not delete is released (visible again) at its end.
#[derive(Default)]
pub struct Held(std::sync::Mutex<HashMap<String, (String, String)>>);

async fn insert_ignoring_conflict(
    t: &dyn TableStore,
    pk: &str,
    rk: &str,
    e: &Entity,
) -> Result<(), StorageError> {
    match t.insert(pk, rk, e).await {
        Ok(_) | Err(StorageError::Conflict) => Ok(()),
        Err(e) => Err(e),
    }
}

fn record_from_envelope(env: &PoisonEnvelope, poison_id: &str) -> PoisonRecord {
    PoisonRecord::open(env.clone(), "aqw", Some(poison_id.to_string()))
}

/// A time bound of a filter: an RFC 3339 time, or a duration ago
/// (`hh:mm:ss`), as `poison list --since` and the dashboard take it.
pub fn parse_time(s: &str) -> Result<OffsetDateTime, String> {
    if let Ok(t) = OffsetDateTime::parse(s, &Rfc3339) {
        return Ok(t);
    }
    crate::config::parse_timespan(s)
        .map(|d| OffsetDateTime::now_utc() - d)
        .map_err(|_| format!("\"{s}\" is neither an RFC 3339 time nor a duration ago (hh:mm:ss)"))
}

/// Filters of `poison list` and `poison replay`.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub status: Option<RecordStatus>,
    pub since: Option<OffsetDateTime>,
    pub until: Option<OffsetDateTime>,
    pub function: Option<String>,
    pub error: Option<regex::Regex>,
    pub ids: Vec<String>,
}

impl Filter {
    pub fn matches(&self, r: &PoisonRecord) -> bool {
        let at = OffsetDateTime::parse(&r.poisoned_at, &Rfc3339).ok();
        self.status.is_none_or(|s| s == r.status)
            && self.since.is_none_or(|s| at.is_some_and(|t| t >= s))
            && self.until.is_none_or(|u| at.is_some_and(|t| t <= u))
            && self.function.as_ref().is_none_or(|f| f == &r.function)
            && self
                .error
                .as_ref()
                .is_none_or(|re| re.is_match(&r.error.message))
            && (self.ids.is_empty() || self.ids.iter().any(|i| i == &r.message_id))
    }
}

/// Merge `update` into an open record, conditional on `etag`. On a 412 the
/// record is read again: still open → merge with its new version; closed →
/// `Ok(Err(why))`, for the caller to report.
async fn merge_open_record(
    ops: &QueueOps,
    row_key: &str,
    update: &Entity,
    etag: &mut Etag,
) -> OpsResult<Result<(), String>> {
    for _ in 0..3 {
        match ops
            .records
            .merge(&ops.queue, row_key, update, Some(etag))
            .await
        {
            Ok(e) => {
                *etag = e;
                return Ok(Ok(()));
            }
            Err(StorageError::PreconditionFailed) => {}
            Err(e) => return Err(e.into()),
        }
        match ops.records.get(&ops.queue, row_key).await? {
            Some((e, fresh)) => {
                let now = PoisonRecord::from_entity(&e);
                if now.status != RecordStatus::Open {
                    return Ok(Err(format!("already {}", now.status.as_str())));
                }
                *etag = fresh;
            }
            None => return Ok(Err("record vanished".into())),
        }
    }
    Ok(Err("the record kept changing; try again".into()))
}
