//! `aqw poison replay`.

use super::{window, Filter, OpsError, OpsResult, QueueOps};
use crate::failpoint;
use crate::idempotency::derive_key;
use crate::idempotency::{IdempotencyKey, KeyRecord};
use crate::message::decode;
use crate::poison::{Closing, Held, PoisonRecord, RecordStatus, Replayed, WindowOverride};
use crate::storage::{Etag, StorageError, Ttl};
use futures::StreamExt as _;
use std::collections::HashMap;
use std::time::Duration;
use tracing::Instrument;

/// Records replayed at once by default (each is a handful of storage calls).
pub const DEFAULT_REPLAY_CONCURRENCY: usize = 8;

/// Options of `aqw poison replay`.
#[derive(Debug, Clone, Default)]
pub struct ReplayOptions {
    /// Which open records to replay.
    pub filter: Filter,
    /// At most this many records.
    pub limit: Option<usize>,
    /// Messages per second.
    pub rate: Option<f64>,
    /// Say what would be replayed; change nothing.
    pub dry_run: bool,
    /// Who is replaying, kept on each record.
    pub by: String,
    /// `--wait`: how long to wait for each replayed key to be done.
    pub wait: Option<Duration>,
    /// Records replayed at once.
    pub concurrency: usize,
    /// Replay records whose provider key is older than the function's
    /// `providerKeyWindow` too (`--past-provider-window`); kept on each.
    pub past_provider_window: bool,
    /// The operator checked the provider for the records with an attempt
    /// that may have taken effect (`--uncertain-checked`); without it, and
    /// without an answer in `provider_answers`, such a record is not
    /// replayed (issue 39). Kept on each record it let through.
    pub uncertain_checked: bool,
    /// What the provider's lookup answered, by provider key (`applied` or
    /// `not applied`): a record whose key has an answer needs no flag, and
    /// the answer is kept on it.
    pub provider_answers: HashMap<String, String>,
}

/// What replay did (or would do) with one record. Serialized in kebab-case
/// (`would-close-already-done`), as the JSON output has always shown it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReplayAction {
    /// Re-put to the source queue; the record is closed.
    Replayed,
    /// The key is already done: the record is closed without a re-put.
    AlreadyDone,
    /// Dry run: would be re-put.
    WouldReplay,
    /// Dry run: the key is done, the record would be closed without a re-put.
    WouldCloseAlreadyDone,
    /// Not replayed: the record changed meanwhile, or a keyless replay was
    /// interrupted before.
    Skipped,
    /// Not replayed: an error.
    Failed,
}

impl ReplayAction {
    /// What a dry run reports: the key is done (closed without a re-put) or not.
    fn would(key_done: bool) -> Self {
        if key_done {
            ReplayAction::WouldCloseAlreadyDone
        } else {
            ReplayAction::WouldReplay
        }
    }

    /// The action's name, as the JSON output spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            ReplayAction::Replayed => "replayed",
            ReplayAction::AlreadyDone => "already-done",
            ReplayAction::WouldReplay => "would-replay",
            ReplayAction::WouldCloseAlreadyDone => "would-close-already-done",
            ReplayAction::Skipped => "skipped",
            ReplayAction::Failed => "failed",
        }
    }
}

impl std::fmt::Display for ReplayAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// What replay did (or would do) with one record.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplayItem {
    /// The record id (the source message id).
    pub id: String,
    /// The record's key: re-derived from the payload, else the one kept.
    pub key: Option<IdempotencyKey>,
    /// What replay did with it.
    pub action: ReplayAction,
    /// The id of the message re-put to the source queue.
    pub new_message_id: Option<String>,
    /// Why it was skipped or failed, or a note on what was done.
    pub detail: Option<String>,
    /// With --wait: whether the key is done.
    pub confirmed: Option<bool>,
    /// The key's state when replay looked (`none`: never claimed).
    pub key_state: Option<String>,
    /// With --wait: what the provider answered the attempt that completed
    /// the key (`provider: replayed` proves the effect happened only once).
    pub provider: Option<String>,
    /// The provider key, when an attempt of a key not yet done may have
    /// taken effect: check the provider before replaying (a dry run says so).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uncertain_provider_key: Option<String>,
    /// What the provider's lookup said of that key (set by the caller that
    /// can ask, the CLI or the dashboard).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_check: Option<String>,
    /// The record was closed but its poison-queue copy may still be there
    /// (no receipt deleted it): a scan of the poison queue settles it.
    #[serde(skip)]
    pub copy_left: bool,
}

impl ReplayItem {
    /// Note the key's state as replay found it (and, when it is not done
    /// and an attempt may have taken effect, its provider key); whether
    /// the key is done.
    fn note_key(&mut self, rec: Option<&KeyRecord>) -> bool {
        self.key_state = Some(rec.map_or("none".into(), |r| r.state_summary()));
        let done = rec.is_some_and(|r| r.status.is_settled());
        self.uncertain_provider_key = rec
            .filter(|r| !done && r.history.iter().any(|a| a.may_have_taken_effect))
            .map(|r| r.provider_key.clone());
        done
    }

    fn new(id: &str, key: Option<IdempotencyKey>, action: ReplayAction) -> Self {
        ReplayItem {
            id: id.to_string(),
            key,
            action,
            new_message_id: None,
            detail: None,
            confirmed: None,
            key_state: None,
            uncertain_provider_key: None,
            provider_check: None,
            provider: None,
            copy_left: false,
        }
    }

    fn with(mut self, action: ReplayAction, detail: impl Into<String>) -> Self {
        self.action = action;
        self.detail = Some(detail.into());
        self
    }
}

/// What `aqw poison replay` did (or would do): counts and each record.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplayReport {
    /// The source queue.
    pub queue: String,
    /// How many open records the filter and limit selected.
    pub selected: usize,
    /// How many were re-put.
    pub replayed: usize,
    /// How many were closed without a re-put, their key already done.
    pub already_done: usize,
    /// How many were skipped or failed.
    pub failed: usize,
    /// With `--wait`: how many replayed keys were not done by the deadline.
    pub unconfirmed: usize,
    /// Nothing was changed (`--dry-run`).
    pub dry_run: bool,
    /// `--past-provider-window` was given.
    pub past_provider_window: bool,
    /// The durable operation that carried it out (`--all`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
    /// One item per selected record.
    pub items: Vec<ReplayItem>,
}

impl ReplayReport {
    /// Exit 1 when some selected records were not replayed or not confirmed.
    pub fn needs_a_person(&self) -> bool {
        self.failed > 0 || self.unconfirmed > 0
    }

    pub(crate) fn push(&mut self, item: ReplayItem) {
        match item.action {
            ReplayAction::Replayed => self.replayed += 1,
            ReplayAction::AlreadyDone => self.already_done += 1,
            ReplayAction::Failed | ReplayAction::Skipped => self.failed += 1,
            ReplayAction::WouldReplay | ReplayAction::WouldCloseAlreadyDone => {}
        }
        self.items.push(item);
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
    progress: &(dyn Fn(usize, usize) + Sync),
) -> OpsResult<ReplayReport> {
    let receipts = if opts.dry_run {
        Held::default()
    } else {
        ops.poison.scan(Some(Duration::from_secs(120))).await?
    };
    let mut selected = select(ops, &opts.filter).await?;
    for id in &opts.filter.ids {
        if !selected.iter().any(|(r, _)| &r.message_id == id) {
            ops.poison.release(receipts).await;
            return Err(OpsError::Usage(format!(
                "no open poison record {id} for queue {}",
                ops.queue
            )));
        }
    }
    if let Some(l) = opts.limit {
        selected.truncate(l);
    }
    let overrides = match past_window_overrides(ops, opts, &selected).await {
        Ok(o) => o,
        Err(e) => {
            ops.poison.release(receipts).await;
            return Err(e);
        }
    };
    let mut report = ReplayReport {
        queue: ops.queue.clone(),
        selected: selected.len(),
        replayed: 0,
        already_done: 0,
        failed: 0,
        unconfirmed: 0,
        dry_run: opts.dry_run,
        past_provider_window: opts.past_provider_window,
        operation: None,
        items: vec![],
    };
    let batch = Batch {
        receipts: &receipts,
        overrides: &overrides,
    };
    replay_all(ops, opts, selected, &batch, &mut report, progress).await;
    ops.poison.release(receipts).await;
    if let (Some(wait), false) = (opts.wait, opts.dry_run) {
        confirm(ops, &mut report, wait).await?;
    }
    Ok(report)
}

/// What every record of one replay shares: the poison copies its scan holds,
/// and the notes of the records replayed past the provider's key window.
pub(super) struct Batch<'a> {
    pub(super) receipts: &'a Held,
    pub(super) overrides: &'a HashMap<String, String>,
}

impl<'a> Batch<'a> {
    /// The override `by` makes for `rec`, if it is past the provider's window.
    fn past_window(&self, rec: &PoisonRecord, by: &'a str) -> Option<WindowOverride<'a>> {
        let note = self.overrides.get(&rec.message_id)?;
        Some(WindowOverride { by, note })
    }
}

/// Records past their function's `providerKeyWindow`: refused (nothing
/// touched) unless `--past-provider-window`, then id → the note each keeps.
/// Reads each keyed record's key once more, only when a window is declared.
pub(super) async fn past_window_overrides(
    ops: &QueueOps,
    opts: &ReplayOptions,
    selected: &[(PoisonRecord, Option<Etag>)],
) -> OpsResult<HashMap<String, String>> {
    let declared = ops
        .function
        .as_ref()
        .is_some_and(|f| f.provider_key_window.is_some());
    if !declared {
        return Ok(HashMap::new());
    }
    let mut past = Vec::new();
    for (rec, _) in selected {
        let key = record_key(ops, rec);
        if let Some(w) = window::state(ops, key.as_ref()).await? {
            if w.past {
                past.push((rec.message_id.clone(), w));
            }
        }
    }
    if !past.is_empty() && !opts.past_provider_window {
        return Err(window::refusal(&past));
    }
    Ok(past
        .into_iter()
        .map(|(id, w)| (id, w.override_note()))
        .collect())
}

/// The open records matching `filter`, oldest first, with their ETags.
pub(super) async fn select(
    ops: &QueueOps,
    filter: &Filter,
) -> OpsResult<Vec<(PoisonRecord, Option<Etag>)>> {
    let mut filter = filter.clone();
    filter.status = Some(RecordStatus::Open);
    let mut selected: Vec<(PoisonRecord, Option<Etag>)> = ops
        .poison
        .list()
        .await?
        .into_iter()
        .filter(|(r, _)| filter.matches(r))
        .collect();
    selected.sort_by(|(a, _), (b, _)| {
        a.poisoned_at
            .cmp(&b.poisoned_at)
            .then(a.message_id.cmp(&b.message_id))
    });
    Ok(selected)
}

/// Replay the selected records into `report`. Records are independent:
/// replay a few at a time. With --rate, each record still starts no earlier
/// than its slot.
async fn replay_all(
    ops: &QueueOps,
    opts: &ReplayOptions,
    selected: Vec<(PoisonRecord, Option<Etag>)>,
    batch: &Batch<'_>,
    report: &mut ReplayReport,
    progress: &(dyn Fn(usize, usize) + Sync),
) {
    let total = selected.len();
    let interval = opts.rate.filter(|r| *r > 0.0).map(|r| {
        Duration::try_from_secs_f64(1.0 / r).unwrap_or(crate::storage::MAX_VISIBILITY_TIMEOUT)
    });
    let start = tokio::time::Instant::now();
    let mut done = 0;
    let mut results = futures::stream::iter(selected.into_iter().enumerate().map(
        |(i, (rec, etag))| async move {
            if let Some(iv) = interval {
                tokio::time::sleep_until(start + iv * i as u32).await;
            }
            let span = crate::traces::step_span!("aqw.replay", otel.kind = "producer", queue = %ops.queue,
                poison.id = %rec.message_id, dry_run = opts.dry_run);
            crate::traces::link_to(&span, rec.trace_parent.as_deref());
            match replay_one(ops, &rec, etag, opts, batch)
                .instrument(span)
                .await
            {
                Ok(item) => item,
                Err(e) => ReplayItem::new(&rec.message_id, rec.key.clone(), ReplayAction::Failed)
                    .with(ReplayAction::Failed, e.to_string()),
            }
        },
    ))
    .buffered(opts.concurrency.max(1));
    while let Some(item) = futures::StreamExt::next(&mut results).await {
        report.push(item);
        done += 1;
        progress(done, total);
    }
}

/// The key of a record: re-derived from the payload (the same payload gives
/// the same key), else the one kept on the record.
fn record_key(ops: &QueueOps, rec: &PoisonRecord) -> Option<IdempotencyKey> {
    match (ops.function.as_ref(), decode(&rec.message, rec.encoding)) {
        (Some(f), Ok(p)) => derive_key(&f.key, &p).ok().flatten(),
        _ => rec.key.clone().and_then(|k| IdempotencyKey::new(k).ok()),
    }
}

/// Replay one record. `listed_etag` is the record's version from the
/// listing: every record update is conditional on it, so a concurrent replay
/// or discard shows up as a 412 (then the record is read again) and the
/// common case needs no read of its own. Per keyed record that is 5 requests:
/// key read, put, record close, copy delete, key ReplayCount (the last
/// alongside the two before it: 4 round trips one after another).
pub(super) async fn replay_one(
    ops: &QueueOps,
    rec: &PoisonRecord,
    listed_etag: Option<Etag>,
    opts: &ReplayOptions,
    batch: &Batch<'_>,
) -> OpsResult<ReplayItem> {
    let (receipts, past_window) = (batch.receipts, batch.past_window(rec, &opts.by));
    let key = record_key(ops, rec);
    let item_key = key.clone().or(rec.key.clone());
    let mut item = ReplayItem::new(&rec.message_id, item_key, ReplayAction::Failed);
    let key_state = key_state(ops, key.as_ref()).await?;
    let done = item.note_key(key_state.as_ref().map(|(r, _)| r));
    if opts.dry_run {
        item.action = ReplayAction::would(done);
        return Ok(item);
    }
    let (current, mut etag) = match listed_etag {
        Some(etag) => (rec.clone(), etag),
        None => match ops.poison.reread(rec).await? {
            Some(found) => found,
            None => return Ok(item.with(ReplayAction::Failed, "record vanished")),
        },
    };
    if current.status != RecordStatus::Open {
        let why = format!("already {}", current.status.as_str());
        return Ok(item.with(ReplayAction::Skipped, why));
    }
    let function = ops
        .function
        .as_ref()
        .map_or("FUNCTION", |f| f.name.as_str());
    let checked = match uncertain_gate(&item, opts, function) {
        Ok(note) => note,
        Err(why) => return Ok(item.with(ReplayAction::Skipped, why)),
    };
    if done {
        let how = Replayed::KeyAlreadyDone;
        let past = past_window.as_ref();
        let closing = ops
            .poison
            .close_replayed(&current, &opts.by, how, past, &mut etag);
        if let Closing::AlreadyClosed(why) = closing.await? {
            return Ok(item.with(ReplayAction::Skipped, why));
        }
        let gone = ops.poison.delete_closed_copy(rec, receipts).await;
        item = item.with(ReplayAction::AlreadyDone, "key already done; not re-put");
        (item.confirmed, item.copy_left) = (Some(true), !gone);
        return Ok(item);
    }
    let put = Put {
        rec,
        key: key.as_ref(),
        key_state: key_state.as_ref(),
        receipts,
        past_window,
        checked: checked.as_deref(),
    };
    put.run(ops, &current, &opts.by, etag, item).await
}

/// A record whose key may have taken effect is replayed only once the
/// provider was asked: its lookup answered (`Ok` with the answer, kept on
/// the record), or the operator says it was checked (`Ok` with who did);
/// otherwise `Err` with what to do. `Ok(None)` for every other record.
fn uncertain_gate(
    item: &ReplayItem,
    opts: &ReplayOptions,
    function: &str,
) -> Result<Option<String>, String> {
    let Some(pk) = &item.uncertain_provider_key else {
        return Ok(None);
    };
    if let Some(answer) = opts.provider_answers.get(pk) {
        return Ok(Some(format!(
            "uncertain attempt checked with the provider: {answer}"
        )));
    }
    if opts.uncertain_checked {
        return Ok(Some(format!(
            "uncertain attempt: the provider checked by {} (--uncertain-checked)",
            opts.by
        )));
    }
    let key = item.key.as_ref().map_or("KEY", |k| k.as_str());
    Err(format!(
        "an attempt may have taken effect (provider key {pk}): ask the provider first (aqw keys check {function} {key}), then replay with --uncertain-checked"
    ))
}

/// Now plus `wait`, or a year from now when `wait` is beyond what an
/// instant can hold (a `--wait` typed as a huge span).
pub(super) fn far_or(wait: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(wait)
        .unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600))
}

/// The key record of `key` (of the queue's function) with its ETag, if any.
async fn key_state(
    ops: &QueueOps,
    key: Option<&IdempotencyKey>,
) -> OpsResult<Option<(KeyRecord, Etag)>> {
    let (Some(f), Some(k)) = (ops.function.as_ref(), key) else {
        return Ok(None);
    };
    match ops.keys.get_versioned(&f.name, k).await {
        Ok(state) => Ok(state),
        Err(StorageError::NotFound) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The re-put of one open record whose key is not done.
struct Put<'a> {
    rec: &'a PoisonRecord,
    key: Option<&'a IdempotencyKey>,
    key_state: Option<&'a (KeyRecord, Etag)>,
    receipts: &'a Held,
    /// Set when this record is replayed past the provider's key window.
    past_window: Option<WindowOverride<'a>>,
    /// How an uncertain attempt was checked, kept on the record.
    checked: Option<&'a str>,
}

impl Put<'_> {
    async fn run(
        &self,
        ops: &QueueOps,
        current: &PoisonRecord,
        by: &str,
        mut etag: Etag,
        item: ReplayItem,
    ) -> OpsResult<ReplayItem> {
        let interrupted_before = current.replay_started_at.is_some();
        if interrupted_before && self.key.is_none() {
            return Ok(item.with(ReplayAction::Skipped, INTERRUPTED_KEYLESS));
        }
        // A claim-checked job's blob is refreshed first, and a record whose
        // reference is invalid or whose blob is gone is refused before the
        // marker below is written (a marker would hold the record as
        // interrupted).
        super::enqueue::refresh_claim_check(ops, &self.rec.message, self.rec.encoding).await?;
        // Crash marker, needed only for keyless jobs: a keyed job re-put twice
        // is a clean duplicate, so it saves the round trip. The marker is
        // conditional on the version this replay saw, so of two replays racing
        // for one keyless record only one gets to put it.
        if self.key.is_none() {
            match ops.poison.mark_replay_started(self.rec, &etag).await? {
                Some(e) => etag = e,
                None => return Ok(item.with(ReplayAction::Skipped, CHANGED_MEANWHILE)),
            }
        }
        let receipt =
            crate::poison::put_creating(ops.source.as_ref(), &self.rec.message, Ttl::Default)
                .await?;
        failpoint::hit("replay.after_put");
        let how = Replayed::Reput {
            new_message_id: &receipt.id,
            note: self.checked,
        };
        let closed = self.close_and_count(ops, current, by, how, &mut etag);
        let gone = match closed.await? {
            Ok(gone) => gone,
            Err(why) => {
                // Someone else closed the record first; the copy just put is keyed
                // (keyless records stop at the marker above), so it is a duplicate.
                let why = format!(
                    "{why}; the copy this replay put ({}) is a duplicate its key will drop",
                    receipt.id
                );
                return Ok(item.with(ReplayAction::Skipped, why));
            }
        };
        let mut item = item;
        item.action = ReplayAction::Replayed;
        item.new_message_id = Some(receipt.id);
        item.copy_left = !gone;
        Ok(item)
    }

    /// Close the record, then delete the poison copy (that order: a crash in
    /// between leaves a closed record whose stray copy the next scan deletes).
    /// The key's ReplayCount is informational and independent: counted
    /// meanwhile, which saves a round trip per record. Whether the copy is
    /// gone; `Err(why)` when someone else closed the record first.
    async fn close_and_count(
        &self,
        ops: &QueueOps,
        current: &PoisonRecord,
        by: &str,
        how: Replayed<'_>,
        etag: &mut Etag,
    ) -> OpsResult<Result<bool, String>> {
        let close_then_delete = async {
            let closing = ops
                .poison
                .close_replayed(current, by, how, self.past_window.as_ref(), etag)
                .await?;
            if let Closing::AlreadyClosed(why) = closing {
                return Ok::<_, OpsError>(Err(why));
            }
            failpoint::hit("replay.after_record");
            Ok(Ok(ops
                .poison
                .delete_closed_copy(self.rec, self.receipts)
                .await))
        };
        let count_on_key = async {
            if let (Some(f), Some(k)) = (ops.function.as_ref(), self.key) {
                let seen = self.key_state.map(|(r, e)| (r, e));
                let _ = ops.keys.note_replay(&f.name, k, seen).await;
            }
        };
        let (closed, ()) = tokio::join!(close_then_delete, count_on_key);
        closed
    }
}

const CHANGED_MEANWHILE: &str =
    "the record changed while this replay ran (another replay or discard?); \
     run `poison show` and try again";

const INTERRUPTED_KEYLESS: &str =
    "an earlier replay was interrupted after it may have re-put this keyless job; \
     check the source queue, then discard or replay by hand";

/// `--wait`: poll each replayed key until done or the deadline.
pub(crate) async fn confirm(
    ops: &QueueOps,
    report: &mut ReplayReport,
    wait: Duration,
) -> OpsResult<()> {
    let deadline = far_or(wait);
    let Some(f) = ops.function.clone() else {
        return Ok(());
    };
    loop {
        let mut pending = 0;
        for item in report
            .items
            .iter_mut()
            .filter(|i| i.action == ReplayAction::Replayed && i.confirmed != Some(true))
        {
            let done = match item
                .key
                .as_ref()
                .and_then(|k| IdempotencyKey::new(k.clone()).ok())
            {
                Some(k) => {
                    let rec = ops.keys.get(&f.name, &k).await?;
                    item.provider = rec
                        .as_ref()
                        .and_then(|r| r.completed_answer())
                        .map(|a| a.summary());
                    rec.is_some_and(|r| r.status.is_settled())
                }
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
