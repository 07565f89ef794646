//! The operator's procedure (DESIGN.md section 7): status, list, show,
//! replay, discard, and `keys show`.
//!
//! Poison records live in the record table (no 32-message peek limit). Raw
//! copies written to `<queue>-poison` by the Functions host itself are found
//! by a scan of the poison queue and imported as records (origin `host`), so
//! they are listed and replayed like aqw's own.

use crate::config::{AppConfig, FunctionConfig};
use crate::failpoint;
use crate::idempotency::{fmt_time, now_rfc3339, IdempotencyKey, KeyRecord, KeyStore};
use crate::message::{decode, ErrorInfo, ErrorKind, PoisonEnvelope};
use crate::poison::{PoisonRecord, RecordStatus};
use crate::storage::{Entity, Etag, QueueStore, Storage, StorageError, TableStore, Ttl};
use crate::worker::derive_key;
use futures::StreamExt as _;
use serde_json::json;
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
            poison_queue: storage.queue(&format!("{queue}-poison")),
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
        for rk in [id.to_string(), format!("host-{id}")] {
            match self.records.get(&self.queue, &rk).await {
                Ok(Some((e, etag))) => return Ok(Some((PoisonRecord::from_entity(&e), etag))),
                Ok(None) | Err(StorageError::NotFound) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(None)
    }

    fn row_key(r: &PoisonRecord) -> String {
        if r.origin == "host" {
            format!("host-{}", r.message_id)
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
            let batch: Vec<(String, Option<String>, u32, OffsetDateTime, String)> = match hold {
                Some(h) => match self.poison_queue.receive(32, h).await {
                    Ok(b) => b
                        .into_iter()
                        .map(|m| {
                            (
                                m.id,
                                Some(m.pop_receipt),
                                m.dequeue_count,
                                m.insertion_time,
                                m.text,
                            )
                        })
                        .collect(),
                    Err(StorageError::NotFound) => {
                        return Ok(Held(std::sync::Mutex::new(receipts)))
                    }
                    Err(e) => return Err(e.into()),
                },
                None => match self.poison_queue.peek(32).await {
                    Ok(b) => b
                        .into_iter()
                        .map(|m| (m.id, None, m.dequeue_count, m.insertion_time, m.text))
                        .collect(),
                    Err(StorageError::NotFound) => {
                        return Ok(Held(std::sync::Mutex::new(receipts)))
                    }
                    Err(e) => return Err(e.into()),
                },
            };
            let mut new = 0;
            for (id, receipt, dequeue_count, inserted, text) in batch {
                if !seen.insert(id.clone()) {
                    continue;
                }
                new += 1;
                if let Some(r) = &receipt {
                    receipts.insert(id.clone(), (r.clone(), text.clone()));
                }
                let (row_key, imported) = match PoisonEnvelope::from_queue_text(&text) {
                    Some(env) => (env.message_id.clone(), record_from_envelope(&env, &id)),
                    None => (
                        format!("host-{id}"),
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
            }
            if new == 0 || hold.is_none() {
                break;
            }
        }
        Ok(Held(std::sync::Mutex::new(receipts)))
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

/// `aqw poison list`: records matching `filter`, newest first.
pub async fn list(ops: &QueueOps, filter: &Filter) -> OpsResult<Vec<PoisonRecord>> {
    ops.scan(None).await?;
    let mut out: Vec<PoisonRecord> = ops
        .records()
        .await?
        .into_iter()
        .filter(|r| filter.matches(r))
        .collect();
    out.sort_by(|a, b| {
        b.poisoned_at
            .cmp(&a.poisoned_at)
            .then(b.message_id.cmp(&a.message_id))
    });
    Ok(out)
}

/// `aqw poison show`: the record, its key state and the decoded payload.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShowReport {
    pub record: PoisonRecord,
    pub key_record: Option<KeyRecord>,
    pub payload: Option<serde_json::Value>,
    pub payload_text: Option<String>,
    pub decode_error: Option<String>,
}

pub async fn show(ops: &QueueOps, id: &str) -> OpsResult<ShowReport> {
    let (record, _) = match ops.record(id).await? {
        Some(r) => r,
        None => {
            ops.scan(None).await?;
            ops.record(id).await?.ok_or_else(|| {
                OpsError::Usage(format!("no poison record {id} for queue {}", ops.queue))
            })?
        }
    };
    let key_record = ops.key_record(&record).await?;
    let (payload, payload_text, decode_error) = match decode(&record.message, record.encoding) {
        Ok(text) => (serde_json::from_str(&text).ok(), Some(text), None),
        Err(e) => (None, None, Some(e.to_string())),
    };
    Ok(ShowReport {
        record,
        key_record,
        payload,
        payload_text,
        decode_error,
    })
}

/// `aqw poison discard`.
/// Close a record without replaying it. With `close_key`, the job's key is
/// also closed (`cancelled`) first, so a later delivery of the same job (a
/// producer's resend) is settled as a duplicate without running; without
/// it, the key stays `poisoned` and a resend runs.
pub async fn discard(
    ops: &QueueOps,
    id: &str,
    reason: &str,
    by: &str,
    close_key: bool,
) -> OpsResult<PoisonRecord> {
    let (mut rec, etag) = ops
        .record(id)
        .await?
        .ok_or_else(|| OpsError::Usage(format!("no poison record {id} for queue {}", ops.queue)))?;
    if rec.status != RecordStatus::Open {
        return Err(OpsError::Usage(format!(
            "record {id} is already {}",
            rec.status.as_str()
        )));
    }
    if close_key {
        let key = rec
            .key
            .clone()
            .filter(|k| !k.is_empty())
            .ok_or_else(|| {
                OpsError::Usage(format!(
                    "record {id} has no key (keyless job, or its key could not be derived); discard it without --close-key"
                ))
            })
            .and_then(|k| IdempotencyKey::new(k).map_err(OpsError::Usage))?;
        if let Err(refused) = ops.keys.cancel(&rec.function, &key, by, reason).await? {
            return Err(OpsError::Usage(refused));
        }
    }
    let mut u = Entity::new();
    u.insert("Status".into(), json!("discarded"));
    u.insert("DiscardedAt".into(), json!(now_rfc3339()));
    u.insert("DiscardedBy".into(), json!(by));
    u.insert("DiscardReason".into(), json!(reason));
    ops.records
        .merge(&ops.queue, &QueueOps::row_key(&rec), &u, Some(&etag))
        .await?;
    let held = ops.scan(Some(Duration::from_secs(30))).await?;
    let deleted = ops.delete_copy(&rec, &held).await;
    ops.release(held).await;
    deleted?;
    rec.status = RecordStatus::Discarded;
    rec.discarded_by = Some(by.into());
    rec.discard_reason = Some(reason.into());
    Ok(rec)
}

/// What `poison fix` did.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FixReport {
    pub id: String,
    /// `replaced`, or `already-done` (the corrected job's key is done or
    /// cancelled: nothing was put and the record is still open).
    pub action: String,
    pub old_key: Option<String>,
    pub new_key: Option<String>,
    pub new_message_id: Option<String>,
    pub size_diff: i64,
    /// With `--wait`: the new key reached done in time.
    pub confirmed: Option<bool>,
    pub detail: Option<String>,
}

/// `poison fix`: put a corrected payload in place of a poisoned one, and
/// close the old record as `replaced` (by whom, the new message id and key,
/// the size difference). The corrected payload must be one the worker would
/// run: it must derive a key (unless the function is keyless) and fit in a
/// message. If its key is already done, nothing is put: the job happened.
///
/// Order: put first, then close the record, then delete the poison copy. A
/// crash after the put leaves the record open; running the fix again puts a
/// second copy that its key settles as a duplicate.
pub async fn fix(
    ops: &QueueOps,
    id: &str,
    payload: &str,
    by: &str,
    wait: Option<Duration>,
) -> OpsResult<FixReport> {
    let (rec, mut etag) = ops
        .record(id)
        .await?
        .ok_or_else(|| OpsError::Usage(format!("no poison record {id} for queue {}", ops.queue)))?;
    if rec.status != RecordStatus::Open {
        return Err(OpsError::Usage(format!(
            "record {id} is already {}",
            rec.status.as_str()
        )));
    }
    let f = ops.function.clone().ok_or_else(|| {
        OpsError::Usage(format!(
            "queue {} is not consumed by a function of this app",
            ops.queue
        ))
    })?;
    let key = derive_key(&f.key, payload).map_err(|e| {
        OpsError::Usage(format!(
            "the corrected payload would be poisoned at once: {e}"
        ))
    })?;
    let text = crate::message::encode_checked(payload, ops.app.message_encoding)
        .map_err(OpsError::Usage)?;
    let old_len = decode(&rec.message, rec.encoding)
        .map(|p| p.len())
        .unwrap_or(rec.message.len());
    let mut report = FixReport {
        id: id.into(),
        action: String::new(),
        old_key: rec.key.clone(),
        new_key: key.as_ref().map(|k| k.as_str().to_string()),
        new_message_id: None,
        size_diff: payload.len() as i64 - old_len as i64,
        confirmed: None,
        detail: None,
    };
    if let Some(k) = &key {
        if let Some(kr) = ops.keys.get(&f.name, k).await? {
            if kr.status.is_settled() {
                report.action = "already-done".into();
                report.detail = Some(format!(
                    "key {} is already {} ({}); nothing put. If that job is the one this record                      was for, discard the record",
                    k.as_str(),
                    kr.status.as_str(),
                    kr.completed_at.as_deref().unwrap_or("-")
                ));
                return Ok(report);
            }
        }
    }
    let receipt = crate::poison::put_creating(ops.source.as_ref(), &text, Ttl::Default).await?;
    let mut close = Entity::new();
    close.insert("Status".into(), json!("replaced"));
    close.insert("ReplacedAt".into(), json!(now_rfc3339()));
    close.insert("ReplacedBy".into(), json!(by));
    close.insert("ReplacementMessageId".into(), json!(receipt.id));
    close.insert(
        "ReplacementKey".into(),
        json!(report.new_key.clone().unwrap_or_default()),
    );
    close.insert("ReplacementSizeDiff".into(), json!(report.size_diff));
    if let Err(why) = merge_open_record(ops, &QueueOps::row_key(&rec), &close, &mut etag).await? {
        report.action = "skipped".into();
        report.detail = Some(format!(
            "{why} (someone else closed it meanwhile); the corrected message {} was put and              its key settles any duplicate",
            receipt.id
        ));
        report.new_message_id = Some(receipt.id);
        return Ok(report);
    }
    let held = ops.scan(Some(Duration::from_secs(30))).await?;
    let deleted = ops.delete_copy(&rec, &held).await;
    ops.release(held).await;
    deleted?;
    report.action = "replaced".into();
    report.new_message_id = Some(receipt.id);
    if let (Some(wait), Some(k)) = (wait, &key) {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let done = ops
                .keys
                .get(&f.name, k)
                .await?
                .is_some_and(|r| r.status.is_settled());
            if done || tokio::time::Instant::now() >= deadline {
                report.confirmed = Some(done);
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    Ok(report)
}

/// Records replayed at once by default (each is a handful of storage calls).
pub const DEFAULT_REPLAY_CONCURRENCY: usize = 8;

/// Options of `aqw poison replay`.
#[derive(Debug, Clone, Default)]
pub struct ReplayOptions {
    pub filter: Filter,
    pub limit: Option<usize>,
    /// Messages per second.
    pub rate: Option<f64>,
    pub dry_run: bool,
    pub by: String,
    pub wait: Option<Duration>,
    /// Records replayed at once.
    pub concurrency: usize,
}

/// What replay did (or would do) with one record.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplayItem {
    pub id: String,
    pub key: Option<String>,
    /// `replayed`, `already-done`, `would-replay`, `would-close-already-done`, `skipped`, `failed`.
    pub action: String,
    pub new_message_id: Option<String>,
    pub detail: Option<String>,
    /// With --wait: whether the key is done.
    pub confirmed: Option<bool>,
}

#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplayReport {
    pub queue: String,
    pub selected: usize,
    pub replayed: usize,
    pub already_done: usize,
    pub failed: usize,
    pub unconfirmed: usize,
    pub dry_run: bool,
    pub items: Vec<ReplayItem>,
}

impl ReplayReport {
    /// Exit 1 when some selected records were not replayed or not confirmed.
    pub fn needs_a_person(&self) -> bool {
        self.failed > 0 || self.unconfirmed > 0
    }
}

/// `aqw poison replay`: re-put the exact original message text to the source
/// queue, record the replay, remove the poison copy. Safe to interrupt and
/// run again: a record is closed right after its re-put, and a record found
/// mid-replay (re-put possibly done, record not yet closed) is re-put only
/// when the job has a key, which makes a second copy a clean duplicate.
pub async fn replay(
    ops: &QueueOps,
    opts: &ReplayOptions,
    progress: &dyn Fn(usize, usize),
) -> OpsResult<ReplayReport> {
    let receipts = if opts.dry_run {
        Held::default()
    } else {
        ops.scan(Some(Duration::from_secs(120))).await?
    };
    let mut filter = opts.filter.clone();
    filter.status = Some(RecordStatus::Open);
    let mut selected: Vec<(PoisonRecord, Option<Etag>)> = ops
        .versioned_records()
        .await?
        .into_iter()
        .filter(|(r, _)| filter.matches(r))
        .collect();
    selected.sort_by(|(a, _), (b, _)| {
        a.poisoned_at
            .cmp(&b.poisoned_at)
            .then(a.message_id.cmp(&b.message_id))
    });
    for id in &opts.filter.ids {
        if !selected.iter().any(|(r, _)| &r.message_id == id) {
            ops.release(receipts).await;
            return Err(OpsError::Usage(format!(
                "no open poison record {id} for queue {}",
                ops.queue
            )));
        }
    }
    if let Some(l) = opts.limit {
        selected.truncate(l);
    }
    let total = selected.len();
    let mut report = ReplayReport {
        queue: ops.queue.clone(),
        selected: total,
        replayed: 0,
        already_done: 0,
        failed: 0,
        unconfirmed: 0,
        dry_run: opts.dry_run,
        items: vec![],
    };
    let interval = opts
        .rate
        .filter(|r| *r > 0.0)
        .map(|r| Duration::from_secs_f64(1.0 / r));
    // Records are independent: replay a few at a time. With --rate, each
    // record still starts no earlier than its slot.
    let start = tokio::time::Instant::now();
    let receipts_ref = &receipts;
    let mut done = 0;
    let mut results = futures::stream::iter(selected.into_iter().enumerate().map(
        |(i, (rec, etag))| async move {
            if let Some(iv) = interval {
                tokio::time::sleep_until(start + iv * i as u32).await;
            }
            match replay_one(ops, &rec, etag, opts, receipts_ref).await {
                Ok(item) => item,
                Err(e) => ReplayItem {
                    id: rec.message_id.clone(),
                    key: rec.key.clone(),
                    action: "failed".into(),
                    new_message_id: None,
                    detail: Some(e.to_string()),
                    confirmed: None,
                },
            }
        },
    ))
    .buffered(opts.concurrency.max(1));
    while let Some(item) = futures::StreamExt::next(&mut results).await {
        match item.action.as_str() {
            "replayed" => report.replayed += 1,
            "already-done" => report.already_done += 1,
            "failed" | "skipped" => report.failed += 1,
            _ => {}
        }
        report.items.push(item);
        done += 1;
        progress(done, total);
    }
    drop(results);
    ops.release(receipts).await;
    if let (Some(wait), false) = (opts.wait, opts.dry_run) {
        confirm(ops, &mut report, wait).await?;
    }
    Ok(report)
}

/// Replay one record. `listed_etag` is the record's version from the
/// listing: every record update is conditional on it, so a concurrent replay
/// or discard shows up as a 412 (then the record is read again) and the
/// common case needs no read of its own. Per keyed record that is 5 requests:
/// key read, put, record close, copy delete, key ReplayCount (the last
/// alongside the two before it: 4 round trips one after another).
async fn replay_one(
    ops: &QueueOps,
    rec: &PoisonRecord,
    listed_etag: Option<Etag>,
    opts: &ReplayOptions,
    receipts: &Held,
) -> OpsResult<ReplayItem> {
    let mut item = ReplayItem {
        id: rec.message_id.clone(),
        key: rec.key.clone(),
        action: String::new(),
        new_message_id: None,
        detail: None,
        confirmed: None,
    };
    // Re-derive the key from the payload: the same payload gives the same key.
    let function = ops.function.as_ref();
    let key = match (function, decode(&rec.message, rec.encoding)) {
        (Some(f), Ok(p)) => derive_key(&f.key, &p).ok().flatten(),
        _ => rec.key.clone().and_then(|k| IdempotencyKey::new(k).ok()),
    };
    item.key = key.as_ref().map(|k| k.as_str().to_string()).or(item.key);
    let key_state = match (function, &key) {
        (Some(f), Some(k)) => ops
            .keys
            .get_versioned(&f.name, k)
            .await
            .or_else(|e| match e {
                StorageError::NotFound => Ok(None),
                e => Err(e),
            })?,
        _ => None,
    };
    let done = key_state
        .as_ref()
        .is_some_and(|(r, _)| r.status.is_settled());
    if opts.dry_run {
        item.action = if done {
            "would-close-already-done"
        } else {
            "would-replay"
        }
        .into();
        return Ok(item);
    }
    let row_key = QueueOps::row_key(rec);
    let (current, mut etag) = match listed_etag {
        Some(etag) => (rec.clone(), etag),
        None => match ops.records.get(&ops.queue, &row_key).await? {
            Some((e, etag)) => (PoisonRecord::from_entity(&e), etag),
            None => {
                item.action = "failed".into();
                item.detail = Some("record vanished".into());
                return Ok(item);
            }
        },
    };
    if current.status != RecordStatus::Open {
        item.action = "skipped".into();
        item.detail = Some(format!("already {}", current.status.as_str()));
        return Ok(item);
    }
    let mut close = Entity::new();
    close.insert("Status".into(), json!("replayed"));
    close.insert("ReplayedAt".into(), json!(now_rfc3339()));
    close.insert("ReplayedBy".into(), json!(opts.by));
    close.insert("ReplayCount".into(), json!(current.replay_count + 1));
    if done {
        close.insert("ReplayNote".into(), json!("already done"));
        if let Err(why) = merge_open_record(ops, &row_key, &close, &mut etag).await? {
            item.action = "skipped".into();
            item.detail = Some(why);
            return Ok(item);
        }
        ops.delete_copy(rec, receipts).await?;
        item.action = "already-done".into();
        item.detail = Some("key already done; not re-put".into());
        item.confirmed = Some(true);
        return Ok(item);
    }
    let interrupted_before = current.replay_started_at.is_some();
    if interrupted_before && key.is_none() {
        item.action = "skipped".into();
        item.detail = Some(INTERRUPTED_KEYLESS.into());
        return Ok(item);
    }
    // Crash marker, needed only for keyless jobs: a keyed job re-put twice
    // is a clean duplicate, so it saves the round trip. The marker is
    // conditional on the version this replay saw, so of two replays racing
    // for one keyless record only one gets to put it.
    if key.is_none() {
        let mut mark = Entity::new();
        mark.insert("ReplayStartedAt".into(), json!(now_rfc3339()));
        match ops
            .records
            .merge(&ops.queue, &row_key, &mark, Some(&etag))
            .await
        {
            Ok(e) => etag = e,
            Err(StorageError::PreconditionFailed) => {
                item.action = "skipped".into();
                item.detail = Some(
                    "the record changed while this replay ran (another replay or discard?); \
                     run `poison show` and try again"
                        .into(),
                );
                return Ok(item);
            }
            Err(e) => return Err(e.into()),
        }
    }
    let receipt =
        crate::poison::put_creating(ops.source.as_ref(), &rec.message, Ttl::Default).await?;
    failpoint::hit("replay.after_put");
    close.insert("ReplayMessageId".into(), json!(receipt.id));
    // Close the record, then delete the poison copy (that order: a crash in
    // between leaves a closed record whose stray copy the next scan deletes).
    // The key's ReplayCount is informational and independent: counted
    // meanwhile, which saves a round trip per record.
    let close_then_delete = async {
        if let Err(why) = merge_open_record(ops, &row_key, &close, &mut etag).await? {
            return Ok::<_, OpsError>(Some(why));
        }
        failpoint::hit("replay.after_record");
        ops.delete_copy(rec, receipts).await?;
        Ok(None)
    };
    let count_on_key = async {
        if let (Some(f), Some(k)) = (function, &key) {
            let seen = key_state.as_ref().map(|(r, e)| (r, e));
            let _ = ops.keys.note_replay(&f.name, k, seen).await;
        }
    };
    let (closed, ()) = tokio::join!(close_then_delete, count_on_key);
    if let Some(why) = closed? {
        // Someone else closed the record first; the copy just put is keyed
        // (keyless records stop at the marker above), so it is a duplicate.
        item.action = "skipped".into();
        item.detail = Some(format!(
            "{why}; the copy this replay put ({}) is a duplicate its key will drop",
            receipt.id
        ));
        return Ok(item);
    }
    item.action = "replayed".into();
    item.new_message_id = Some(receipt.id);
    Ok(item)
}

const INTERRUPTED_KEYLESS: &str =
    "an earlier replay was interrupted after it may have re-put this keyless job; \
     check the source queue, then discard or replay by hand";

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

/// `--wait`: poll each replayed key until done or the deadline.
async fn confirm(ops: &QueueOps, report: &mut ReplayReport, wait: Duration) -> OpsResult<()> {
    let deadline = tokio::time::Instant::now() + wait;
    let Some(f) = ops.function.clone() else {
        return Ok(());
    };
    loop {
        let mut pending = 0;
        for item in report
            .items
            .iter_mut()
            .filter(|i| i.action == "replayed" && i.confirmed != Some(true))
        {
            let done = match item
                .key
                .as_ref()
                .and_then(|k| IdempotencyKey::new(k.clone()).ok())
            {
                Some(k) => ops
                    .keys
                    .get(&f.name, &k)
                    .await?
                    .is_some_and(|r| r.status.is_settled()),
                None => {
                    // Keyless job: confirmed when its replayed message is no longer in a poison record
                    // and has left the source queue; we can only say "unknown".
                    false
                }
            };
            item.confirmed = Some(done);
            if !done {
                pending += 1;
            }
        }
        if pending == 0 || tokio::time::Instant::now() >= deadline {
            report.unconfirmed = pending;
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// One queue's line in `aqw status`.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueStatus {
    pub function: String,
    pub queue: String,
    pub depth: Option<u64>,
    pub poison_depth: Option<u64>,
    pub open_records: usize,
    pub oldest_open: Option<String>,
}

pub async fn status(ops: &QueueOps) -> OpsResult<QueueStatus> {
    let depth = match ops.source.approximate_count().await {
        Ok(n) => Some(n),
        Err(StorageError::NotFound) => Some(0),
        Err(e) => return Err(e.into()),
    };
    let poison_depth = match ops.poison_queue.approximate_count().await {
        Ok(n) => Some(n),
        Err(StorageError::NotFound) => Some(0),
        Err(e) => return Err(e.into()),
    };
    // Import raw Functions-host copies first (peek: nothing changes visibility).
    ops.scan(None).await?;
    let open: Vec<PoisonRecord> = ops
        .records()
        .await?
        .into_iter()
        .filter(|r| r.status == RecordStatus::Open)
        .collect();
    let oldest_open = open.iter().map(|r| r.poisoned_at.clone()).min();
    Ok(QueueStatus {
        function: ops
            .function
            .as_ref()
            .map(|f| f.name.clone())
            .unwrap_or_default(),
        queue: ops.queue.clone(),
        depth,
        poison_depth,
        open_records: open.len(),
        oldest_open,
    })
}
