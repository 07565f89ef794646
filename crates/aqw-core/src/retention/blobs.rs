//! Retention of claim-check blobs ([`crate::claim`]): a queue's blobs
//! (`<queue>/…` in the container) are deleted when nothing can deliver or
//! replay them any more, by the rule keys follow (see [`super`]):
//!
//! 1. the blob's last write (`Last-Modified`: its put, a producer's put of
//!    the same body, or the refresh before a replay) is older than the keys
//!    retention, which config keeps at least the source messages' TTL plus
//!    aqw's longest visibility delay. Every message that refers to a blob
//!    was put after that write (enqueue and fix write the blob, then put;
//!    replay refreshes it, then puts; a claim-checked job is refused a
//!    time-to-live of "never"), so none is alive any more;
//! 2. no open poison record of the queue refers to it (read after the
//!    listing, and only when it found a blob past the cutoff: a record
//!    opening after the run's start belongs to a message alive then, whose
//!    blob was written less than a TTL before, so after the cutoff);
//! 3. the blob is still at the ETag the listing read: the delete carries
//!    `If-Match`, so a blob written or refreshed since is kept.
//!
//! An orphan (a crash between the blob's write and the enqueue) has no
//! message and no record, so it goes by the same rule once it is old
//! enough. Cost per round and queue: one listing request per 5,000 of its
//! blobs (one 404 when there is no container); when one is past the cutoff,
//! a read of the queue's poison records and one delete per blob.

use super::{PurgeCounts, PurgeReport, PurgeRun};
use crate::poison::{PoisonStore, RecordStatus};
use crate::storage::{BlobStore, StorageError, StorageResult};
use std::collections::HashSet;

/// Delete the blobs of `store`'s queue in `blobs` that are older than the
/// run's cutoff and that no open record of the queue refers to.
pub async fn purge_blobs(
    store: &PoisonStore,
    blobs: &dyn BlobStore,
    run: &mut PurgeRun<'_>,
) -> StorageResult<PurgeReport> {
    let cutoff = run.cutoff();
    run.pacer.turn().await;
    let listed = blobs.list(&format!("{}/", store.queue())).await?;
    let old: Vec<_> = listed
        .into_iter()
        .filter(|b| b.last_modified < cutoff)
        .collect();
    let open = if old.is_empty() {
        HashSet::new()
    } else {
        run.pacer.turn().await;
        referenced_by_open_records(store).await?
    };
    let mut counts = PurgeCounts::default();
    for blob in old {
        counts.scanned += 1;
        if open.contains(&blob.name) {
            counts.kept_open_record += 1;
            continue;
        }
        if run.dry_run {
            counts.deleted += 1;
            continue;
        }
        if !run.still_ours().await? {
            break;
        }
        run.pacer.turn().await;
        match blobs.delete(&blob.name, Some(&blob.etag)).await {
            Ok(()) => counts.deleted += 1,
            Err(StorageError::PreconditionFailed) => counts.kept_changed += 1,
            Err(e) => return Err(e),
        }
    }
    Ok(run.report("blobs", blobs.name(), counts))
}

/// The blobs the open records of `store`'s queue refer to.
async fn referenced_by_open_records(store: &PoisonStore) -> StorageResult<HashSet<String>> {
    let records = match store.list().await {
        Ok(r) => r,
        Err(StorageError::NotFound) => return Ok(HashSet::new()),
        Err(e) => return Err(e),
    };
    // Only a queue's own blobs are listed, so only a reference to one of
    // them keeps anything; whatever length it says (keeping is the safe
    // side: the blob goes once the record closes).
    let scope = crate::claim::Scope {
        queue: store.queue(),
        max_bytes: u64::MAX,
    };
    Ok(records
        .into_iter()
        .filter(|(r, _)| r.status == RecordStatus::Open)
        .filter_map(|(r, _)| {
            let payload = crate::message::decode(&r.message, r.encoding).ok()?;
            crate::claim::parse(&payload, scope)
                .and_then(Result::ok)
                .map(|c| c.blob.clone())
        })
        .collect())
}
