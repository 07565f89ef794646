//! `aqw poison replay --all` as a durable operation: the interactive replay
//! keeps its checks and its report (each record's action, the uncertain
//! gate's answers, `--wait`), but the records are replayed by an operation
//! row this process creates holding its lease, so a process killed mid-way
//! leaves an operation that `aqw ops resume` or an idle `aqw run` finishes,
//! each record once.

use super::{
    execute, fingerprint, select_open, ExecuteOptions, NewOperation, OpKind, Operation,
    OperationStore, Selection, DEFAULT_HALT_AFTER, DEFAULT_RATE, MAX_RATE, MIN_RATE,
};
use crate::idempotency::fmt_time;
use crate::ops::replay::{confirm, past_window_overrides};
use crate::ops::{OpsError, OpsResult, QueueOps, ReplayOptions, ReplayReport};
use std::collections::HashSet;
use time::format_description::well_known::Rfc3339;

/// Replay every open record `opts.filter` picks (oldest first, at most
/// `opts.limit`) through an operation: the operation (as it ended; none
/// when nothing matched, so no row is written) and the report `poison
/// replay` prints. Before anything is created, the records
/// past the provider's key window are refused unless
/// `opts.past_provider_window` (exit 2, nothing touched). `opts.rate`
/// (default [`DEFAULT_RATE`]) must be within [`MIN_RATE`]..=[`MAX_RATE`];
/// the operation sets how many records are in flight, so
/// `opts.concurrency` does not apply.
/// `progress` is called with (handled, selected) after each record.
pub async fn replay_group(
    ops: &QueueOps,
    store: &OperationStore,
    opts: &ReplayOptions,
    mut exec: ExecuteOptions,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> OpsResult<(Option<Operation>, ReplayReport)> {
    let (new, ids) = prepare(ops, opts).await?;
    if ids.is_empty() {
        // Nothing open matches: no row for an operation with nothing to do.
        return Ok((None, empty_report(ops, opts)));
    }
    let created = store.create_held(&new, &exec.owner, exec.lease).await?;
    tracing::info!(event = "aqw.operation.created", operation = %created.id, queue = %created.queue,
        kind = "replay", by = %created.by, selected = created.selected,
        "poison replay --all is carried out as an operation");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    exec.provider_answers = opts.provider_answers.clone();
    exec.observer = Some(tx);
    let total = ids.len();
    let run = async move {
        let end = execute(ops, store, &created.id, &exec).await;
        drop(exec);
        end.map(|e| e.unwrap_or(created))
    };
    let collect = async {
        let mut items = vec![];
        while let Some(item) = rx.recv().await {
            items.push(item);
            progress(items.len(), total);
        }
        items
    };
    let (end, items) = tokio::join!(run, collect);
    let end = end?;
    let mut report = empty_report(ops, opts);
    report.selected = total;
    report.operation = Some(end.id.clone());
    let handled: HashSet<String> = items.iter().map(|i| i.id.clone()).collect();
    for item in items {
        report.push(item);
    }
    // Selected but not reached (cancelled, halted): neither done nor failed
    // by this run; the operation's row says why.
    report.failed += ids.iter().filter(|id| !handled.contains(*id)).count();
    if let Some(wait) = opts.wait {
        confirm(ops, &mut report, wait).await?;
    }
    Ok((Some(end), report))
}

/// The report of an operation's replay: never a dry run.
fn empty_report(ops: &QueueOps, opts: &ReplayOptions) -> ReplayReport {
    let mut report = crate::ops::replay::empty_report(ops, opts);
    report.dry_run = false;
    report
}

/// The operation `opts` asks for and the ids it selects now, checked:
/// the rate, and the provider's key window (refused before anything exists).
async fn prepare(ops: &QueueOps, opts: &ReplayOptions) -> OpsResult<(NewOperation, Vec<String>)> {
    let rate = opts.rate.unwrap_or(DEFAULT_RATE);
    if !(rate.is_finite() && (MIN_RATE..=MAX_RATE).contains(&rate)) {
        return Err(OpsError::Usage(format!(
            "--rate {rate}: a replay of --all is an operation, at {MIN_RATE} to {MAX_RATE} records per second"
        )));
    }
    let mut selection = Selection {
        error: opts.filter.error.as_ref().map(|r| r.as_str().to_string()),
        since: opts.filter.since.map(fmt_time),
        until: opts.filter.until.map(fmt_time),
        function: opts.filter.function.clone(),
        limit: opts.limit.map(|l| l as u64),
        cutoff: fmt_time(crate::clock::now_utc()),
        ..Selection::default()
    };
    let mut open = select_open(ops, &selection).await?;
    if let Some(l) = opts.limit {
        open.truncate(l);
    }
    past_window_overrides(ops, opts, &open).await?;
    // A limit is also kept as a time: a resumed run must not count records
    // it cannot see (those closed after the last checkpoint) to find where
    // the limit ends.
    if let (Some(_), Some((last, _))) = (opts.limit, open.last()) {
        if let Ok(t) = time::OffsetDateTime::parse(&last.poisoned_at, &Rfc3339) {
            let bound = opts.filter.until.map_or(t, |u| u.min(t));
            selection.until = Some(fmt_time(bound));
        }
    }
    let ids: Vec<String> = open.iter().map(|(r, _)| r.message_id.clone()).collect();
    let new = NewOperation {
        queue: ops.queue.clone(),
        kind: OpKind::Replay {
            past_provider_window: opts.past_provider_window,
            uncertain_checked: opts.uncertain_checked,
        },
        by: opts.by.clone(),
        selection,
        fingerprint: fingerprint(&ids),
        selected: ids.len() as u64,
        rate,
        halt_after: DEFAULT_HALT_AFTER,
    };
    Ok((new, ids))
}
