//! `aqw poison replay`.

use super::replay_report::{PoisonedAgain, ReplayAction, ReplayItem, ReplayReport};
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
    let mut report = empty_report(ops, opts);
    report.selected = selected.len();
    let saves_failures = saves_failures_if_refused(ops, opts, &selected).await?;
    let batch = Batch {
        receipts: &receipts,
        overrides: &overrides,
        saves_failures: saves_failures.as_ref(),
    };
    replay_all(ops, opts, selected, &batch, &mut report, progress).await;
    ops.poison.release(receipts).await;
    if let (Some(wait), false) = (opts.wait, opts.dry_run) {
        confirm(ops, &mut report, wait).await?;
    }
    Ok(report)
}

/// A report of nothing replayed yet.
pub(super) fn empty_report(ops: &QueueOps, opts: &ReplayOptions) -> ReplayReport {
    ReplayReport {
        queue: ops.queue.clone(),
        function: ops.function.as_ref().map(|f| f.name.clone()),
        selected: 0,
        replayed: 0,
        already_done: 0,
        failed: 0,
        unconfirmed: 0,
        poisoned_again: 0,
        dry_run: opts.dry_run,
        past_provider_window: opts.past_provider_window,
        operation: None,
        items: vec![],
    }
}

/// For a dry run that selected a refusal: whether the provider is known to
/// save failures (read only then; only a dry run warns).
async fn saves_failures_if_refused(
    ops: &QueueOps,
    opts: &ReplayOptions,
    selected: &[(PoisonRecord, Option<Etag>)],
) -> OpsResult<Option<super::provider::SavesFailures>> {
    let refusal = selected
        .iter()
        .any(|(r, _)| super::provider::is_refusal(r.error.kind));
    if !(opts.dry_run && refusal) {
        return Ok(None);
    }
    super::provider::saves_failures(ops).await
}

/// What every record of one replay shares: the poison copies its scan holds,
/// and the notes of the records replayed past the provider's key window.
pub(super) struct Batch<'a> {
    pub(super) receipts: &'a Held,
    pub(super) overrides: &'a HashMap<String, String>,
    /// A dry run's: why the provider is known to save failures, if it is.
    pub(super) saves_failures: Option<&'a super::provider::SavesFailures>,
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
        let key = record_key(ops, rec).await;
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
/// the same key), else the one kept on the record. A claim-checked job's
/// message is a reference, not the payload: its key is the one the worker
/// derived from the fetched body and kept on the record, else derived from
/// the body fetched now (a host copy keeps no key). Without this, the key
/// of a claim-checked record was never found (issue 52): no uncertain
/// gate, no provider window, no "already done".
pub(super) async fn record_key(ops: &QueueOps, rec: &PoisonRecord) -> Option<IdempotencyKey> {
    let kept = || rec.key.clone().and_then(|k| IdempotencyKey::new(k).ok());
    let (Some(f), Ok(payload)) = (ops.function.as_ref(), decode(&rec.message, rec.encoding)) else {
        return kept();
    };
    if !crate::claim::is_reference(&payload) {
        return derive_key(&f.key, &payload).ok().flatten();
    }
    if let Some(k) = kept() {
        return Some(k);
    }
    let body = ops.body_of(rec).await.ok()?;
    derive_key(&f.key, &body).ok().flatten()
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
    let key = record_key(ops, rec).await;
    let item_key = key.clone().or(rec.key.clone());
    let mut item = ReplayItem::new(&rec.message_id, item_key, ReplayAction::Failed);
    let key_state = key_state(ops, key.as_ref()).await?;
    let done = item.note_key(key_state.as_ref().map(|(r, _)| r));
    item.provider_dedupes = item.uncertain_provider_key.is_some()
        && super::provider::is_idempotent(ops.function.as_ref());
    if opts.dry_run {
        let unsettled = key_state.as_ref().map(|(r, _)| r).filter(|_| !done);
        item.saved_failure = saved_failure(batch.saves_failures, rec, unsettled);
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
    let checked = match uncertain_gate(&item, opts, ops.function.as_ref()) {
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
/// A provider that declares it honours `Idempotency-Key`
/// (`handler.idempotent`) needs neither: the replay carries the same
/// provider key, which the provider applies at most once, so it cannot
/// double the effect (`Ok` with that note, kept on the record).
fn uncertain_gate(
    item: &ReplayItem,
    opts: &ReplayOptions,
    f: Option<&crate::config::FunctionConfig>,
) -> Result<Option<String>, String> {
    let Some(pk) = &item.uncertain_provider_key else {
        return Ok(None);
    };
    if super::provider::is_idempotent(f) {
        return Ok(Some(IDEMPOTENT_NOTE.to_string()));
    }
    let function = f.map_or("FUNCTION", |f| f.name.as_str());
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

/// Why a same-key replay of `rec` would come back as the provider's saved
/// failure: the provider is known to save failures, `rec` is a refusal,
/// and its key (not settled) holds a provider key the provider has seen (a
/// key whose provider key was replaced since its last attempt has not).
fn saved_failure(
    saves: Option<&super::provider::SavesFailures>,
    rec: &PoisonRecord,
    unsettled: Option<&KeyRecord>,
) -> Option<String> {
    let (saves, key) = (saves?, unsettled?);
    let sent = key
        .history
        .last()
        .is_some_and(|a| a.outcome != crate::idempotency::PROVIDER_KEY_REPLACED);
    (super::provider::is_refusal(rec.error.kind) && sent).then(|| saves.why())
}

/// Kept on a record whose uncertain attempt the declared provider dedupes.
const IDEMPOTENT_NOTE: &str = "uncertain attempt: the provider honours Idempotency-Key \
    (handler.idempotent), so the same-key replay cannot double the effect";

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

/// `--wait`: poll each replayed job until its key is done or it is
/// poisoned again (a record under the replayed message's id: the new
/// record's id and kind are kept on the item), or the deadline. Returns as
/// soon as every replayed job is one or the other, not at the deadline. A
/// keyless job can only be seen poisoned again: nothing says it is done.
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
        for item in report.items.iter_mut().filter(|i| {
            i.action == ReplayAction::Replayed
                && i.confirmed != Some(true)
                && i.poisoned_again.is_none()
        }) {
            if !settled_or_poisoned(ops, &f.name, item).await? {
                pending += 1;
            }
        }
        report.poisoned_again = report
            .items
            .iter()
            .filter(|i| i.poisoned_again.is_some())
            .count();
        if pending == 0 || tokio::time::Instant::now() >= deadline {
            report.unconfirmed = pending;
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// One poll of one replayed job: its key done (`confirmed`, with the
/// provider's answer), or a record for its message (`poisoned_again`).
/// Whether the job has ended either way.
async fn settled_or_poisoned(
    ops: &QueueOps,
    function: &str,
    item: &mut ReplayItem,
) -> OpsResult<bool> {
    if let Some(k) = item
        .key
        .as_ref()
        .and_then(|k| IdempotencyKey::new(k.clone()).ok())
    {
        let rec = ops.keys.get(function, &k).await?;
        item.provider = rec
            .as_ref()
            .and_then(|r| r.completed_answer())
            .map(|a| a.summary());
        if rec.is_some_and(|r| r.status.is_settled()) {
            item.confirmed = Some(true);
            return Ok(true);
        }
    }
    item.confirmed = Some(false);
    let Some(new_id) = item.new_message_id.as_deref() else {
        return Ok(false);
    };
    let Some((again, _)) = ops.poison.find(new_id).await? else {
        return Ok(false);
    };
    let error = crate::scrub::scrub(&again.error.message);
    item.poisoned_again = Some(PoisonedAgain {
        id: again.message_id,
        kind: again.error.kind.as_str().to_string(),
        error: error.lines().next().unwrap_or_default().to_string(),
    });
    Ok(true)
}
