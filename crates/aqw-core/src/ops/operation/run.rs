//! The executor of a durable operation: whoever holds the row's lease
//! handles the still-open records of its selection at the operation's
//! rate, up to [`in_flight`] at once (one at up to 10 a second), and writes
//! its counts (renewing the lease) after every `in_flight` records under
//! the row's ETag, so a cancel from any process stops it within that many
//! records (before its next one at up to 10 a second); the records in
//! flight finish first. It halts itself when the target function's
//! breaker opens or when [`super::Operation::halt_after`] of the jobs it
//! replayed come back poisoned. A record's poison-queue copy is deleted with
//! the pop receipt its record kept (one request); copies that cannot be
//! (a scan made the receipt stale) are swept in one pass at the end, so a
//! record's cost does not grow with the poison queue's depth.

use super::{Claim, OpKind, OpState, Operation, OperationStore, Refresh};
use crate::alert::Alerts;
use crate::config::AppConfig;
use crate::ops::fix::{replace_record, FixAction};
use crate::ops::replay::{past_window_overrides, replay_one, Batch};
use crate::ops::ReplayItem;
use crate::ops::{OpsError, OpsResult, QueueOps, ReplayAction, ReplayOptions};
use crate::poison::{Held, PoisonRecord};
use crate::storage::{Etag, Storage, StorageError};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;
use tokio::sync::mpsc::UnboundedSender;
use tokio::time::Instant;

/// How long an executor's lease lasts; renewed with every record (at
/// [`super::MIN_RATE`] at least every 10 s), so a dead executor's operation
/// is free again within a minute.
pub const LEASE: Duration = Duration::from_secs(60);

/// How often an idle `aqw run` looks for an operation whose executor died
/// (one query of the operations partition; jittered by the caller).
const IDLE_SCAN_INTERVAL: Duration = Duration::from_secs(30);

/// Records in flight at once: one at up to 10 a second (a cancel is seen
/// before the next record), then one more per 10 a second, at most 8, so a
/// rate above what one record's round trips allow is still reached.
fn in_flight(rate: f64) -> usize {
    ((rate / 10.0).ceil() as usize).clamp(1, MAX_IN_FLIGHT)
}

/// The most records an executor handles at once.
const MAX_IN_FLIGHT: usize = 8;

/// How often a running operation reads the breaker and the records its
/// replayed jobs may have come back as (2 requests).
const HALT_CHECK: Duration = Duration::from_secs(2);

/// How long the end-of-run sweep holds the poison queue's copies.
const SWEEP_HOLD: Duration = Duration::from_secs(120);

/// Who executes, and for how long a lease.
#[derive(Debug, Clone)]
pub struct ExecuteOptions {
    /// The executor's id (kept on the row as the lease owner).
    pub owner: String,
    /// How long a lease lasts ([`LEASE`]).
    pub lease: Duration,
    /// Take the lease even while another executor holds it
    /// ([`OperationStore::claim`]).
    pub take_over: bool,
    /// What the provider's lookup answered, by provider key, for a replay's
    /// uncertain records (the process that asked only: not kept on the row,
    /// so a resumed run gates those records again).
    pub provider_answers: HashMap<String, String>,
    /// Where a replay sends what it did with each record, for a caller that
    /// reports them (`poison replay --all`).
    pub observer: Option<UnboundedSender<ReplayItem>>,
    /// Where a halt is alerted (`aqw run`'s webhook); the ERROR log event
    /// `aqw.operation.halted` is written either way.
    pub alerts: Alerts,
}

impl ExecuteOptions {
    /// An executor named `owner` with a [`LEASE`]-long lease, no take-over,
    /// no answers, no observer.
    pub fn new(owner: impl Into<String>) -> Self {
        Self {
            owner: owner.into(),
            lease: LEASE,
            take_over: false,
            provider_answers: HashMap::new(),
            observer: None,
            alerts: Alerts::disabled(),
        }
    }
}

/// Carry out operation `id` on `ops` (its queue) if its lease is free:
/// the row as it was left (done, halted, cancelled, failed, or taken over
/// by another executor); `None` when it was not this executor's to run.
/// A storage error on the row itself ends the run with `Err`; the lease
/// then expires and the next executor resumes.
pub async fn execute(
    ops: &QueueOps,
    store: &OperationStore,
    id: &str,
    opts: &ExecuteOptions,
) -> OpsResult<Option<Operation>> {
    let claim = store.claim(id, &opts.owner, opts.lease, opts.take_over);
    let (op, etag) = match claim.await? {
        Claim::Taken(op, etag) => (*op, etag),
        Claim::Halted(op) => {
            halted(&op, ops, &opts.alerts);
            return Ok(Some(*op));
        }
        Claim::No => return Ok(None),
    };
    tracing::info!(event = "aqw.operation.started", operation = %op.id, queue = %op.queue,
        kind = op.kind.name(), by = %op.by, owner = %crate::scrub::one_line(&opts.owner),
        selection = %crate::scrub::one_line(&op.selection.describe()), fingerprint = %op.fingerprint,
        done = op.done, "an executor took the operation's lease");
    let resumed = op.updated_at != op.created_at;
    let run = Run {
        base_returned: op.returned_poisoned,
        ops,
        store,
        op,
        etag,
        opts,
        put_ids: HashSet::new(),
        checked: None,
        copies_left: false,
        // The row as read before this claim: written since its creation
        // means an executor claimed it before.
        resumed,
    };
    run.go().await.map(Some)
}

/// Resume every unfinished operation on one of `app`'s queues whose lease
/// is free (its executor died): what an idle `aqw run` does every
/// `IDLE_SCAN_INTERVAL`. One partition query when there is none.
pub async fn resume_idle(
    app: &Arc<AppConfig>,
    storage: &dyn Storage,
    opts: &ExecuteOptions,
) -> OpsResult<usize> {
    let store = OperationStore::new(storage.table(&app.control_table));
    let now = crate::clock::now_utc();
    let mut ran = 0;
    for op in store.unfinished().await? {
        if !op.lease_free(now) || app.function_for_queue(&op.queue).is_none() {
            continue;
        }
        let ops = QueueOps::new(app.clone(), &op.queue, storage);
        if execute(&ops, &store, &op.id, opts).await?.is_some() {
            ran += 1;
        }
    }
    Ok(ran)
}

/// What an `aqw run` replica does between jobs: every
/// `IDLE_SCAN_INTERVAL` (±20 %, so replicas spread out) one query of the
/// operations partition, and when an unfinished operation's lease is free,
/// carry it out. Stops at `shutdown`; an operation it was running is left
/// mid-way, as by a crash, and resumed by the next executor once the lease
/// expires. An error is logged and the next round tries again.
pub async fn watch(
    app: Arc<AppConfig>,
    storage: Arc<dyn Storage>,
    opts: ExecuteOptions,
    shutdown: tokio_util::sync::CancellationToken,
) {
    loop {
        let jitter = crate::entropy::gen::<f64>() * 0.4 + 0.8;
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(IDLE_SCAN_INTERVAL.mul_f64(jitter)) => {}
        }
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => return,
            r = resume_idle(&app, storage.as_ref(), &opts) => if let Err(e) = r {
                let e = crate::scrub::one_line(&crate::scrub::scrub(&e.to_string()));
                tracing::warn!(event = "aqw.operation.watch_failed", error = %e, "could not look for operations to resume; trying again next round");
            }
        }
    }
}

/// One executor's run of one operation.
struct Run<'a> {
    ops: &'a QueueOps,
    store: &'a OperationStore,
    op: Operation,
    etag: Etag,
    opts: &'a ExecuteOptions,
    /// The messages this run re-put (to know them if they come back poisoned).
    put_ids: HashSet<String>,
    /// The returned count an earlier executor left on the row.
    base_returned: u64,
    /// When the breaker and the returns were last read.
    checked: Option<Instant>,
    /// A record's copy could not be deleted by its kept receipt: sweep.
    copies_left: bool,
    /// An executor ran it before this one.
    resumed: bool,
}

impl Run<'_> {
    async fn go(mut self) -> OpsResult<Operation> {
        let selected = match super::select_open(self.ops, &self.op.selection).await {
            Ok(s) => s,
            Err(OpsError::Usage(e)) => return self.finish(OpState::Failed, Some(&e)).await,
            Err(e) => return Err(e),
        };
        let mut selected = selected;
        // The first run takes exactly the limit; a resumed one is bounded
        // by the time the limit was kept as (`until`), since the counts on
        // the row can miss records closed after the last checkpoint.
        if let (Some(limit), false) = (self.op.selection.limit, self.resumed) {
            selected.truncate(limit as usize);
        }
        if let Some(why) = self.should_halt().await? {
            return self.finish(OpState::Halted, Some(&why)).await;
        }
        let hands = Hands {
            ops: self.ops,
            opts: self.opts,
            kind: self.op.kind.clone(),
            by: self.op.record_by(),
        };
        match self.carry_out(&hands, selected).await? {
            Some(Stop::Halt(why)) => return self.finish(OpState::Halted, Some(&why)).await,
            Some(Stop::Row(now)) => return Ok(self.stopped_drained(now).await),
            Some(Stop::Error(e)) => return Err(e),
            None => {}
        }
        // A resumed run cannot know what its predecessor left between a
        // record's close and its copy's delete: it always sweeps.
        let resumed = self.resumed;
        if (self.copies_left || resumed) && self.sweep().await.is_err() {
            self.op.last_error = Some("poison-queue copies left for the next scan".into());
        }
        self.finish(OpState::Done, None).await
    }

    /// Handle `selected` at the rate with up to [`in_flight`] records at
    /// once (each starting no earlier than its slot), writing the counts and
    /// renewing the lease after every `in_flight` records. A halt or a row
    /// that says stop feeds no more records; those in flight finish first,
    /// so no record is left half done by a stop.
    async fn carry_out(
        &mut self,
        hands: &Hands<'_>,
        selected: Vec<(PoisonRecord, Option<Etag>)>,
    ) -> OpsResult<Option<Stop>> {
        let interval = Duration::from_secs_f64(1.0 / self.op.rate.max(super::MIN_RATE));
        let width = in_flight(self.op.rate);
        let start = Instant::now();
        let mut records = selected.into_iter().enumerate();
        let mut pending = futures::stream::FuturesUnordered::new();
        let (mut stop, mut since) = (None, 0);
        loop {
            while stop.is_none() && pending.len() < width {
                let Some((i, (rec, etag))) = records.next() else {
                    break;
                };
                pending.push(async move {
                    tokio::time::sleep_until(start + interval.mul_f64(i as f64)).await;
                    hands.handle(rec, etag).await
                });
            }
            let Some(outcome) = futures::StreamExt::next(&mut pending).await else {
                return Ok(stop);
            };
            self.count(outcome);
            since += 1;
            if stop.is_some() || since < width {
                continue;
            }
            since = 0;
            stop = match self.should_halt().await {
                Ok(Some(why)) => Some(Stop::Halt(why)),
                Ok(None) => None,
                Err(e) => Some(Stop::Error(e)),
            };
            if stop.is_some() {
                continue;
            }
            let checkpoint = self.store.checkpoint(&self.op, &self.etag, self.opts.lease);
            match checkpoint.await {
                Ok(Refresh::Go(e)) => self.etag = e,
                Ok(Refresh::Stop(now)) => stop = Some(Stop::Row(now)),
                Err(e) => stop = Some(Stop::Error(e.into())),
            }
        }
    }

    /// Count how a record went on the row (written at the next checkpoint).
    fn count(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Done { put, copy_left } => {
                self.op.done += 1;
                self.put_ids.extend(put);
                self.copies_left |= copy_left;
            }
            Outcome::Skipped(why) => {
                self.op.skipped += 1;
                self.op.last_error = Some(why);
            }
            Outcome::Failed(why) => {
                self.op.failed += 1;
                self.op.last_error = Some(why);
            }
        }
    }

    /// Why to halt now, if the function's breaker is open or too many
    /// replayed jobs came back poisoned; read every [`HALT_CHECK`].
    async fn should_halt(&mut self) -> OpsResult<Option<String>> {
        if self.checked.is_some_and(|t| t.elapsed() < HALT_CHECK) {
            return Ok(None);
        }
        self.checked = Some(Instant::now());
        let function = self.ops.function.as_ref().map(|f| f.name.clone());
        if let Some(f) = function {
            let control = self.ops.control.get(&f).await?;
            if let Some(b) = control.breaker.filter(|b| b.state != "closed") {
                return Ok(Some(format!(
                    "the breaker of {f} is {}: {}",
                    b.state, b.reason
                )));
            }
        }
        if self.put_ids.is_empty() || self.op.halt_after == 0 {
            return Ok(None);
        }
        let since = OffsetDateTime::parse(&self.op.created_at, &Rfc3339)
            .unwrap_or_else(|_| crate::clock::now_utc());
        let open = self.ops.poison.open_ids_since(since).await?;
        let back = open.iter().filter(|id| self.put_ids.contains(*id)).count() as u64;
        self.op.returned_poisoned = self.base_returned + back;
        Ok(
            (self.op.returned_poisoned >= u64::from(self.op.halt_after)).then(|| {
                format!(
                    "{} job(s) this operation replayed came back poisoned (it halts at {})",
                    self.op.returned_poisoned, self.op.halt_after
                )
            }),
        )
    }

    /// One pass over the poison queue: the scan deletes the copies of every
    /// closed record (this run's among them) and releases the rest.
    async fn sweep(&self) -> OpsResult<()> {
        let held = self.ops.poison.scan(Some(SWEEP_HOLD)).await?;
        self.ops.poison.release(held).await;
        Ok(())
    }

    async fn finish(mut self, state: OpState, reason: Option<&str>) -> OpsResult<Operation> {
        match self
            .store
            .finish(&self.op, &self.etag, state, reason)
            .await?
        {
            Refresh::Go(_) => {
                self.op.state = state;
                self.op.stop_reason = reason.map(str::to_string);
                self.op.lease_until = None;
                if state == OpState::Halted {
                    halted(&self.op, self.ops, &self.opts.alerts);
                } else {
                    log_end(&self.op);
                }
                Ok(self.op)
            }
            Refresh::Stop(now) => Ok(self.stopped(now)),
        }
    }

    /// The row said stop (a cancel, a take-over) and the records in flight
    /// finished: their counts are written when the lease is still ours (a
    /// cancel), so `ops show` counts what was done; then the row as it is.
    async fn stopped_drained(self, now: Option<Box<Operation>>) -> Operation {
        match self.store.add_counts(&self.op).await {
            Ok(Some(row)) => self.stopped(Some(Box::new(row))),
            _ => self.stopped(now),
        }
    }

    /// The row said stop: it is as someone else left it.
    fn stopped(self, now: Option<Box<Operation>>) -> Operation {
        let op = now.map(|o| *o).unwrap_or(self.op);
        log_end(&op);
        op
    }
}

/// What handles one record: the queue, the executor's options, the kind
/// and who (borrowing nothing of [`Run`], so records are handled while the
/// run counts and checkpoints).
struct Hands<'a> {
    ops: &'a QueueOps,
    opts: &'a ExecuteOptions,
    kind: OpKind,
    by: String,
}

/// Why a run stops short.
enum Stop {
    /// It halted itself (the breaker, replayed jobs back in poison).
    Halt(String),
    /// The row said stop (a cancel, a take-over): the row as it now is.
    Row(Option<Box<Operation>>),
    /// Storage failed on the row or the halt checks: the run ends with it
    /// (the lease expires and the next executor resumes).
    Error(OpsError),
}

impl Hands<'_> {
    /// Delete a closed record's copy by the receipt it kept; whether it is
    /// gone (when not, the end-of-run sweep deletes it).
    async fn copy_gone(&self, rec: &PoisonRecord) -> bool {
        let gone = self.ops.poison.delete_copy_by_receipt(rec).await;
        gone.unwrap_or(false)
    }

    /// Handle one record: how it went.
    async fn handle(&self, rec: PoisonRecord, etag: Option<Etag>) -> Outcome {
        match self.kind.clone() {
            OpKind::Discard { reason, close_key } => {
                self.discard(rec, etag, &reason, close_key).await
            }
            OpKind::Replay {
                past_provider_window,
                uncertain_checked,
            } => {
                let opts = ReplayOptions {
                    by: self.by.clone(),
                    past_provider_window,
                    uncertain_checked,
                    concurrency: 1,
                    provider_answers: self.opts.provider_answers.clone(),
                    ..ReplayOptions::default()
                };
                self.replay(rec, etag, &opts).await
            }
            OpKind::Fix {
                patch,
                past_provider_window,
            } => self.fix(rec, etag, &patch, past_provider_window).await,
            // Never claimed ([`OperationStore::claim`]).
            OpKind::Unknown { name } => Outcome::Failed(format!("unknown kind {name:?}")),
        }
    }

    async fn discard(
        &self,
        rec: PoisonRecord,
        etag: Option<Etag>,
        reason: &str,
        close_key: bool,
    ) -> Outcome {
        let id = rec.message_id.clone();
        let (rec, etag) = match self.with_etag(rec, etag).await {
            Ok(found) => found,
            Err(outcome) => return outcome,
        };
        let by = self.by.clone();
        let closing =
            crate::ops::discard::close_discarded(self.ops, rec, &etag, reason, &by, close_key);
        match closing.await {
            Ok(closed) => Outcome::Done {
                put: None,
                copy_left: !self.copy_gone(&closed).await,
            },
            Err(OpsError::Storage(StorageError::PreconditionFailed)) => Outcome::Skipped(format!(
                "{id}: changed meanwhile (another replay or discard?)"
            )),
            Err(OpsError::Usage(why)) => Outcome::Skipped(format!("{id}: {why}")),
            Err(e) => Outcome::Failed(format!("{id}: {e}")),
        }
    }

    async fn replay(&self, rec: PoisonRecord, etag: Option<Etag>, opts: &ReplayOptions) -> Outcome {
        let id = rec.message_id.clone();
        let listed = [(rec, etag)];
        let overrides = match past_window_overrides(self.ops, opts, &listed).await {
            Ok(o) => o,
            Err(e) => return Outcome::Skipped(format!("{id}: {e}")),
        };
        let [(rec, etag)] = listed;
        let batch = Batch {
            receipts: &Held::default(),
            overrides: &overrides,
            saves_failures: None,
        };
        let result = replay_one(self.ops, &rec, etag, opts, &batch).await;
        if let (Some(tx), Ok(item)) = (&self.opts.observer, &result) {
            // A caller that stopped listening does not stop the operation.
            let _ = tx.send(item.clone());
        }
        match result {
            Ok(item) => match item.action {
                // replay_one deleted the copy by its receipt already.
                ReplayAction::Replayed => Outcome::Done {
                    put: item.new_message_id,
                    copy_left: item.copy_left,
                },
                ReplayAction::AlreadyDone => Outcome::Done {
                    put: None,
                    copy_left: item.copy_left,
                },
                ReplayAction::Failed => {
                    Outcome::Failed(format!("{id}: {}", item.detail.unwrap_or_default()))
                }
                _ => Outcome::Skipped(format!("{id}: {}", item.detail.unwrap_or_default())),
            },
            Err(e) => Outcome::Failed(format!("{id}: {e}")),
        }
    }

    /// `rec` with the ETag to close it under: the listed one, else read
    /// again; why not when it vanished or cannot be read.
    async fn with_etag(
        &self,
        rec: PoisonRecord,
        etag: Option<Etag>,
    ) -> Result<(PoisonRecord, Etag), Outcome> {
        let id = rec.message_id.clone();
        match etag {
            Some(e) => Ok((rec, e)),
            None => match self.ops.poison.reread(&rec).await {
                Ok(Some(found)) => Ok(found),
                Ok(None) => Err(Outcome::Skipped(format!("{id}: record vanished"))),
                Err(e) => Err(Outcome::Failed(format!("{id}: {e}"))),
            },
        }
    }

    /// Put `rec`'s payload corrected by `patch` in its place (as `poison
    /// fix` does) and delete its copy by the receipt it kept.
    async fn fix(
        &self,
        rec: PoisonRecord,
        etag: Option<Etag>,
        patch: &str,
        past_provider_window: bool,
    ) -> Outcome {
        let id = rec.message_id.clone();
        let (rec, etag) = match self.with_etag(rec, etag).await {
            Ok(found) => found,
            Err(outcome) => return outcome,
        };
        // Checked when the operation was created; again here, since the
        // function's key or redaction may have changed since.
        let none = crate::redact::Redaction::default();
        let redact = self.ops.function.as_ref().map_or(&none, |f| &f.redact);
        let checked = match super::fix_refused(self.ops) {
            Some(why) => Err(why),
            None => super::parse_patch_for(patch, redact).map_err(|e| e.to_string()),
        };
        let patch = match checked {
            Ok(p) => p,
            Err(e) => return Outcome::Failed(format!("{id}: {e}")),
        };
        let body = self.ops.body_of(&rec).await;
        let corrected = match body.map(|b| super::apply_patch(&patch, &b)) {
            Ok(Ok(c)) => c,
            Ok(Err(why)) => return Outcome::Skipped(format!("{id}: {why}")),
            Err(e) => return Outcome::Skipped(format!("{id}: {e}")),
        };
        let by = self.by.clone();
        match replace_record(self.ops, &rec, etag, &corrected, &by, past_provider_window).await {
            Ok(report) if report.action == FixAction::Replaced => Outcome::Done {
                put: report.new_message_id,
                copy_left: !self.copy_gone(&rec).await,
            },
            Ok(report) => Outcome::Skipped(format!(
                "{id}: {}",
                report.detail.unwrap_or_else(|| report.action.to_string())
            )),
            Err(OpsError::Usage(why)) => Outcome::Skipped(format!("{id}: {why}")),
            Err(e) => Outcome::Failed(format!("{id}: {e}")),
        }
    }
}

fn log_end(op: &Operation) {
    tracing::info!(event = "aqw.operation.stopped", operation = %op.id, queue = %op.queue,
        kind = op.kind.name(), by = %op.by, state = op.state.as_str(), done = op.done,
        skipped = op.skipped, failed = op.failed, returned_poisoned = op.returned_poisoned,
        reason = %op.stop_reason.as_deref().unwrap_or(""), fingerprint = %op.fingerprint,
        "the operation stopped (each record it touched names it)");
}

/// An operation halted (the breaker, replayed jobs back in poison, its
/// executors crashing): the ERROR event `aqw.operation.halted` and an
/// alert, since nothing will run it again until someone looks.
fn halted(op: &Operation, ops: &QueueOps, alerts: &Alerts) {
    let reason = op.stop_reason.as_deref().unwrap_or("");
    tracing::error!(event = "aqw.operation.halted", operation = %op.id, queue = %op.queue,
        kind = op.kind.name(), by = %op.by, done = op.done, skipped = op.skipped,
        failed = op.failed, takeovers = op.takeovers, reason = %reason,
        "the operation halted; nothing runs it again (`aqw ops show {}`)", op.id);
    let summary = format!(
        "operation {} ({} on {}, by {}) halted: {reason}. Nothing runs it again; see `aqw ops show {}`",
        op.id,
        op.kind.name(),
        op.queue,
        op.by,
        op.id
    );
    alerts.notice(serde_json::json!({
        "event": "aqw.operation.halted",
        "severity": "error",
        "function": ops.function.as_ref().map_or("", |f| f.name.as_str()),
        "queue": op.queue,
        "operation": op.id,
        "reason": reason,
        "summary": crate::scrub::one_line(&crate::scrub::scrub(&summary)),
        "runbook": crate::alert::runbook_link(None, None),
    }));
}

/// How one record went.
enum Outcome {
    /// Handled: the message it put (replay, fix), and whether its
    /// poison-queue copy is left for the sweep.
    Done {
        put: Option<String>,
        copy_left: bool,
    },
    Skipped(String),
    Failed(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_record_in_flight_up_to_ten_a_second_then_one_per_ten_up_to_eight() {
        let widths: Vec<usize> = [0.1, 1.0, 10.0, 10.5, 20.0, 50.0, 80.0, 1000.0]
            .into_iter()
            .map(in_flight)
            .collect();
        assert_eq!(widths, [1, 1, 1, 2, 2, 5, 8, 8]);
    }
}
