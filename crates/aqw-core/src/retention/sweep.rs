//! The background sweep of `aqw run`: one sweeper per storage account at a
//! time, at a bounded request rate, between long pauses.
//!
//! The one sweeper is chosen by a lease row in the key table (PartitionKey
//! [`LEASE_PARTITION`], which no function's keys can use: function names
//! start with a letter). A worker takes the row by insert (409: someone has
//! it) or, once `Until` has passed, by a merge with the row's `If-Match`
//! ETag (412: another worker took it first), and renews it while it sweeps.
//! A worker that dies stops renewing; the next one takes over after the
//! lease ends. A finished sweep leaves the row held until the next round
//! (`Until` = now + `aqw.retention.sweep.interval`), so however many workers
//! run, the account is swept once per interval. The lease saves work; it is
//! not what makes a delete safe —
//! two sweepers at once (a lease lost while paused) only find each other's
//! rows gone, since every delete is conditional (see [`super`]).

use super::{purge_keys, purge_records, AccountTables, Pacer, PurgeRun};
use crate::config::Retention;
use crate::idempotency::fmt_time;
use crate::poison::PoisonStore;
use crate::storage::{Entity, Etag, StorageError, StorageResult, TableStore};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// The lease row's PartitionKey in the key table.
pub const LEASE_PARTITION: &str = "~retention";
/// The lease row's RowKey.
pub const LEASE_ROW: &str = "sweeper";

/// This worker's hold on the sweeper lease of one key table.
pub struct SweepLease {
    table: Arc<dyn TableStore>,
    owner: String,
    lease: Duration,
    held: Option<(Etag, OffsetDateTime)>,
}

impl SweepLease {
    /// `owner`'s hold on the sweeper lease in `table`, valid for `lease` after
    /// each renewal; nothing is held until [`SweepLease::hold`].
    pub fn new(table: Arc<dyn TableStore>, owner: &str, lease: Duration) -> Self {
        Self {
            table,
            owner: owner.to_string(),
            lease,
            held: None,
        }
    }

    fn row(&self, until: OffsetDateTime) -> Entity {
        let mut e = Entity::new();
        e.insert("Owner".into(), json!(self.owner));
        e.insert("Until".into(), json!(fmt_time(until)));
        e
    }

    /// Take the lease, or renew it when half of it has passed. False: another
    /// worker holds a live lease (or won the take-over).
    pub async fn hold(&mut self) -> StorageResult<bool> {
        let now = crate::clock::now_utc();
        if let Some((_, until)) = &self.held {
            if *until - now > self.lease / 2 {
                return Ok(true);
            }
        }
        let until = now + self.lease;
        let taken = match self.table.get(LEASE_PARTITION, LEASE_ROW).await? {
            None => match self
                .table
                .insert(LEASE_PARTITION, LEASE_ROW, &self.row(until))
                .await
            {
                Ok(etag) => Some(etag),
                Err(StorageError::Conflict) => None,
                Err(e) => return Err(e),
            },
            Some((e, etag)) => {
                let owner = e.get("Owner").and_then(|v| v.as_str()).unwrap_or("");
                let ends = e
                    .get("Until")
                    .and_then(|v| v.as_str())
                    .and_then(|s| OffsetDateTime::parse(s, &Rfc3339).ok())
                    .unwrap_or(OffsetDateTime::UNIX_EPOCH);
                if owner != self.owner && ends > now {
                    None
                } else {
                    let row = self.row(until);
                    match self
                        .table
                        .merge(LEASE_PARTITION, LEASE_ROW, &row, Some(&etag))
                        .await
                    {
                        Ok(etag) => Some(etag),
                        Err(StorageError::PreconditionFailed | StorageError::NotFound) => None,
                        Err(e) => return Err(e),
                    }
                }
            }
        };
        self.held = taken.map(|etag| (etag, until));
        Ok(self.held.is_some())
    }

    /// Keep the lease, unrenewed, until `until` (best effort): after a
    /// finished sweep, `until` is the next round, so the other workers skip
    /// this one; after a failed one, now, so another may try at once.
    pub async fn release_until(&mut self, until: OffsetDateTime) {
        if let Some((etag, _)) = self.held.take() {
            let row = self.row(until);
            let _ = self
                .table
                .merge(LEASE_PARTITION, LEASE_ROW, &row, Some(&etag))
                .await;
        }
    }
}

/// One storage account's sweep: its tables and the source queues' records.
pub struct SweepTarget {
    /// The account's key and record tables, and its functions.
    pub(crate) tables: AccountTables,
    /// The record stores of the source queues on the account.
    pub(crate) records: Vec<PoisonStore>,
    /// The account's claim-check container, when the app has one.
    pub(crate) blobs: Option<Arc<dyn crate::storage::BlobStore>>,
}

/// Sweep every target once, under its lease, at the configured rate.
async fn sweep_once(
    target: &SweepTarget,
    retention: &Retention,
    owner: &str,
) -> StorageResult<bool> {
    let keys_table = target.tables.keys.table().clone();
    let mut lease = SweepLease::new(keys_table, owner, retention.sweep.lease);
    if !lease.hold().await? {
        return Ok(false);
    }
    let mut pacer = Pacer::new(Some(retention.sweep.requests_per_second));
    let result = sweep_held(target, retention, &mut pacer, &mut lease).await;
    let now = crate::clock::now_utc();
    let next_round = match result {
        Ok(()) => now + retention.sweep.interval,
        Err(_) => now,
    };
    lease.release_until(next_round).await;
    result.map(|_| true)
}

async fn sweep_held(
    target: &SweepTarget,
    retention: &Retention,
    pacer: &mut Pacer,
    lease: &mut SweepLease,
) -> StorageResult<()> {
    if let Some(older_than) = retention.keys {
        let mut run = PurgeRun {
            older_than,
            dry_run: false,
            pacer: &mut *pacer,
            lease: Some(&mut *lease),
        };
        let t = &target.tables;
        let r = purge_keys(&t.keys, t.records.as_ref(), &t.functions, &mut run).await?;
        info!(event = "aqw.retention.swept", what = "keys", table = %r.table, scanned = r.counts.scanned, deleted = r.counts.deleted, kept_open_record = r.counts.kept_open_record, kept_changed = r.counts.kept_changed, requests = r.requests, "retention sweep");
    }
    if let (Some(older_than), Some(blobs)) = (retention.keys, &target.blobs) {
        sweep_blobs(target, blobs.as_ref(), older_than, pacer, lease).await?;
    }
    if let Some(older_than) = retention.closed_records {
        for store in &target.records {
            let mut run = PurgeRun {
                older_than,
                dry_run: false,
                pacer: &mut *pacer,
                lease: Some(&mut *lease),
            };
            let r = purge_records(store, &mut run).await?;
            info!(event = "aqw.retention.swept", what = "records", queue = %store.queue(), scanned = r.counts.scanned, deleted = r.counts.deleted, kept_changed = r.counts.kept_changed, requests = r.requests, "retention sweep");
        }
    }
    Ok(())
}

/// The claim-check blobs of each source queue on the account, by the keys'
/// retention ([`super::blobs`]).
async fn sweep_blobs(
    target: &SweepTarget,
    blobs: &dyn crate::storage::BlobStore,
    older_than: Duration,
    pacer: &mut Pacer,
    lease: &mut SweepLease,
) -> StorageResult<()> {
    for store in &target.records {
        let mut run = PurgeRun {
            older_than,
            dry_run: false,
            pacer: &mut *pacer,
            lease: Some(&mut *lease),
        };
        let r = super::blobs::purge_blobs(store, blobs, &mut run).await?;
        info!(event = "aqw.retention.swept", what = "blobs", queue = %store.queue(), scanned = r.counts.scanned, deleted = r.counts.deleted, kept_open_record = r.counts.kept_open_record, kept_changed = r.counts.kept_changed, requests = r.requests, "retention sweep");
    }
    Ok(())
}

/// `aqw run`'s sweeper: pause, sweep every target, repeat, until `shutdown`.
/// Failures are logged and retried at the next round; jobs never wait on it.
pub async fn run(
    targets: Vec<SweepTarget>,
    retention: Retention,
    owner: String,
    shutdown: CancellationToken,
) {
    // Wait first: a deploy restarting every worker starts no sweep storm,
    // and a short-lived `aqw run` never sweeps.
    let first = retention.sweep.interval;
    run_after(first, targets, retention, owner, shutdown).await
}

/// [`run`], the first round after `first` instead of a whole interval:
/// `aqw serve` on a plan that scales to zero (Flex) may run no instance
/// for an interval, so each asks for the lease soon after it starts; a
/// round finished less than an interval ago still holds it, so this costs
/// one read of the lease row per start.
pub(crate) async fn run_after(
    mut first: Duration,
    targets: Vec<SweepTarget>,
    retention: Retention,
    owner: String,
    shutdown: CancellationToken,
) {
    if !retention.sweep.enabled || (retention.keys.is_none() && retention.closed_records.is_none())
    {
        return;
    }
    loop {
        let wait = std::mem::replace(&mut first, retention.sweep.interval);
        tokio::select! {
            biased;
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.cancelled() => return,
        }
        for t in &targets {
            let swept = tokio::select! {
                biased;
                r = sweep_once(t, &retention, &owner) => r,
                _ = shutdown.cancelled() => return,
            };
            if let Err(e) = swept {
                warn!(event = "aqw.retention.failed", error = %e, "retention sweep failed; retrying next round");
            }
        }
    }
}
