//! Retention: purging settled keys and closed poison records, by the
//! operator (`aqw keys purge`, `aqw poison purge`) or by the background
//! sweep of `aqw run` ([`sweep`]).
//!
//! A key is deleted only when all of these hold, each checked by a
//! different party so that no single mistake deletes a live key:
//! 1. the service's filter returned it: `done` or `cancelled`, and its row
//!    (`Timestamp`) unchanged for longer than the keys retention, which
//!    config keeps at least the source messages' TTL plus aqw's longest
//!    visibility delay ([`crate::config::key_retention_floor`]);
//! 2. no open poison record refers to it (the open records are read before
//!    the keys are scanned);
//! 3. the row is still at the ETag the scan read: each delete in the
//!    `$batch` carries `If-Match`, so a key a replay or a worker touched
//!    since (pending again, done again) fails the batch and is kept.
//!
//! A batch that fails (one row changed or already gone) is retried one row
//! at a time, so one changed key keeps only itself.
//!
//! Claim-check blobs follow the same three rules ([`blobs`]).

pub mod blobs;
pub mod sweep;

use crate::idempotency::{KeyStore, PurgeCandidate};
use crate::poison::{open_record_keys, PoisonStore};
use crate::storage::{StorageError, StorageResult, TableOp, TableStore, MAX_BATCH_OPERATIONS};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use time::OffsetDateTime;

/// Spaces storage requests at most `rate` per second (`None`: no limit).
pub struct Pacer {
    interval: Option<Duration>,
    next: tokio::time::Instant,
    /// Requests made so far.
    pub(crate) requests: u64,
}

impl Pacer {
    /// A pacer allowing `requests_per_second` (`None`: no limit).
    pub fn new(requests_per_second: Option<f64>) -> Self {
        Self {
            interval: requests_per_second.map(|r| Duration::from_secs_f64(1.0 / r)),
            next: tokio::time::Instant::now(),
            requests: 0,
        }
    }

    /// Wait for the next request's turn, and count it.
    pub(crate) async fn turn(&mut self) {
        self.requests += 1;
        if let Some(i) = self.interval {
            tokio::time::sleep_until(self.next).await;
            self.next = tokio::time::Instant::now() + i;
        }
    }
}

/// Why a row the scan returned was not deleted, and how much was.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PurgeCounts {
    /// Rows the filter returned (settled, older than the cutoff).
    pub scanned: u64,
    /// Deleted (with `--dry-run`: would be deleted).
    pub deleted: u64,
    /// Kept: an open poison record refers to the key.
    pub kept_open_record: u64,
    /// Kept: the row changed after the scan read it (412).
    pub kept_changed: u64,
    /// Gone before our delete (another sweeper or operator): not counted as deleted.
    pub already_gone: u64,
}

impl PurgeCounts {
    fn add(&mut self, o: &PurgeCounts) {
        self.scanned += o.scanned;
        self.deleted += o.deleted;
        self.kept_open_record += o.kept_open_record;
        self.kept_changed += o.kept_changed;
        self.already_gone += o.already_gone;
    }
}

/// What one purge did.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PurgeReport {
    /// `keys` or `records`.
    pub what: &'static str,
    /// The table purged.
    pub table: String,
    /// Nothing was deleted: `deleted` counts what would have been.
    pub dry_run: bool,
    /// Rows last changed before this time were eligible (RFC 3339).
    pub cutoff: String,
    /// How old a row had to be, in seconds.
    pub older_than_seconds: u64,
    /// What was scanned, deleted and kept.
    #[serde(flatten)]
    pub counts: PurgeCounts,
    /// Storage requests made (scans, batches, single deletes).
    pub requests: u64,
}

/// One purge run's inputs.
pub struct PurgeRun<'a> {
    /// Rows last changed more than this long ago are eligible.
    pub older_than: Duration,
    /// Count what would be deleted; delete nothing.
    pub dry_run: bool,
    /// Spaces the run's storage requests.
    pub pacer: &'a mut Pacer,
    /// The sweeper's lease, renewed as the run goes; the run stops when it
    /// is lost (another worker carries on). None for the operator commands.
    pub lease: Option<&'a mut sweep::SweepLease>,
}

impl PurgeRun<'_> {
    /// Whether to go on: no lease, or the lease still (or again) ours.
    async fn still_ours(&mut self) -> StorageResult<bool> {
        match self.lease.as_deref_mut() {
            None => Ok(true),
            Some(l) => l.hold().await,
        }
    }

    /// Now minus `older_than`; a span longer than the calendar reaches back
    /// is "before anything", which nothing is older than.
    fn cutoff(&self) -> OffsetDateTime {
        let span = time::Duration::try_from(self.older_than).unwrap_or(time::Duration::MAX);
        crate::clock::now_utc()
            .checked_sub(span)
            .unwrap_or(time::PrimitiveDateTime::MIN.assume_utc())
    }

    fn report(&self, what: &'static str, table: &str, counts: PurgeCounts) -> PurgeReport {
        PurgeReport {
            what,
            table: table.to_string(),
            dry_run: self.dry_run,
            cutoff: crate::idempotency::fmt_time(self.cutoff()),
            older_than_seconds: self.older_than.as_secs(),
            counts,
            requests: self.pacer.requests,
        }
    }
}

/// Purge the settled keys of `functions` from `keys`, keeping every key an
/// open record of `records` refers to.
pub(crate) async fn purge_keys(
    keys: &KeyStore,
    records: &dyn TableStore,
    functions: &[String],
    run: &mut PurgeRun<'_>,
) -> StorageResult<PurgeReport> {
    let cutoff = run.cutoff();
    run.pacer.turn().await;
    // Read before the scan: a record opening later refers to a key whose
    // message is still alive, so younger than any purge cutoff (docs/design.md, "Retention: why no purge runs a job twice").
    let open = open_record_keys(records).await?;
    let mut total = PurgeCounts::default();
    'functions: for f in functions {
        if !run.still_ours().await? {
            break;
        }
        run.pacer.turn().await;
        let by_partition = match keys.settled_before_by_partition(f, cutoff).await {
            Err(StorageError::NotFound) => break, // no key table yet
            r => r?,
        };
        for (partition, found) in by_partition {
            if !run.still_ours().await? {
                break 'functions;
            }
            let counts =
                purge_partition(keys.table().as_ref(), &partition, found, &open, run).await?;
            total.add(&counts);
        }
    }
    Ok(run.report("keys", keys.table().name(), total))
}

/// Purge `store`'s closed records older than the run's cutoff.
pub(crate) async fn purge_records(
    store: &PoisonStore,
    run: &mut PurgeRun<'_>,
) -> StorageResult<PurgeReport> {
    run.pacer.turn().await;
    let found = store.closed_before(run.cutoff()).await?;
    let table = store.records_table().clone();
    let counts =
        purge_partition(table.as_ref(), store.queue(), found, &HashSet::new(), run).await?;
    Ok(run.report("records", table.name(), counts))
}

/// Delete `found` (one partition) except the `protected` rows, 100 per batch.
pub async fn purge_partition(
    table: &dyn TableStore,
    partition: &str,
    found: Vec<PurgeCandidate>,
    protected: &HashSet<(String, String)>,
    run: &mut PurgeRun<'_>,
) -> StorageResult<PurgeCounts> {
    let mut counts = PurgeCounts {
        scanned: found.len() as u64,
        ..Default::default()
    };
    let (kept, doomed): (Vec<_>, Vec<_>) = found
        .into_iter()
        .partition(|c| protected.contains(&(c.partition_key.clone(), c.row_key.clone())));
    counts.kept_open_record = kept.len() as u64;
    if run.dry_run {
        counts.deleted = doomed.len() as u64;
        return Ok(counts);
    }
    for chunk in doomed.chunks(MAX_BATCH_OPERATIONS) {
        delete_unchanged(table, partition, chunk, run.pacer, &mut counts).await?;
        // A crash between batches: the next purge finds what is left.
        crate::failpoint::hit("purge.after_batch");
    }
    Ok(counts)
}

/// One `$batch` of conditional deletes; if it fails (a row changed or is
/// gone, which rolls the whole batch back), each row alone.
async fn delete_unchanged(
    table: &dyn TableStore,
    partition: &str,
    chunk: &[PurgeCandidate],
    pacer: &mut Pacer,
    counts: &mut PurgeCounts,
) -> StorageResult<()> {
    let op = |c: &PurgeCandidate| TableOp::Delete {
        row_key: c.row_key.clone(),
        if_match: c.etag.clone(),
    };
    pacer.turn().await;
    match table
        .transaction(partition, chunk.iter().map(op).collect())
        .await
    {
        Ok(()) => {
            counts.deleted += chunk.len() as u64;
            return Ok(());
        }
        Err(StorageError::PreconditionFailed | StorageError::NotFound) if chunk.len() > 1 => {}
        Err(StorageError::PreconditionFailed) => {
            counts.kept_changed += 1;
            return Ok(());
        }
        Err(StorageError::NotFound) => {
            counts.already_gone += 1;
            return Ok(());
        }
        Err(e) => return Err(e),
    }
    for c in chunk {
        pacer.turn().await;
        match table.transaction(partition, vec![op(c)]).await {
            Ok(()) => counts.deleted += 1,
            Err(StorageError::PreconditionFailed) => counts.kept_changed += 1,
            Err(StorageError::NotFound) => counts.already_gone += 1,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Shared by the sweep and the commands: the keys and record tables of one account.
#[derive(Clone)]
pub(crate) struct AccountTables {
    /// The key table.
    pub(crate) keys: KeyStore,
    /// The poison record table (open records protect their keys).
    pub(crate) records: Arc<dyn TableStore>,
    /// The functions whose keys live in this account.
    pub(crate) functions: Vec<String>,
}
