//! `aqw poison discard`.

use super::{OpsError, OpsResult, QueueOps};
use crate::idempotency::IdempotencyKey;
use crate::poison::{PoisonRecord, RecordStatus};
use std::time::Duration;
use tracing::Instrument;

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
    let span = crate::traces::step_span!("aqw.discard", queue = %ops.queue, poison.id = %id, by = %by, close_key);
    discard_record(ops, id, reason, by, close_key)
        .instrument(span)
        .await
}

async fn discard_record(
    ops: &QueueOps,
    id: &str,
    reason: &str,
    by: &str,
    close_key: bool,
) -> OpsResult<PoisonRecord> {
    let (rec, etag) = ops.open_record(id).await?;
    let rec = close_discarded(ops, rec, &etag, reason, by, close_key).await?;
    ops.poison
        .scan_and_delete_copy(&rec, Duration::from_secs(30))
        .await?;
    Ok(rec)
}

/// Close the open record `rec` (at version `etag`) as discarded, its key
/// first with `close_key`; its poison-queue copy is left to the caller (one
/// record: a scan now; a durable operation: one scan at its end, so a
/// record's cost does not grow with the poison queue's depth).
pub(super) async fn close_discarded(
    ops: &QueueOps,
    mut rec: PoisonRecord,
    etag: &crate::storage::Etag,
    reason: &str,
    by: &str,
    close_key: bool,
) -> OpsResult<PoisonRecord> {
    let id = rec.message_id.clone();
    crate::traces::link_to(&tracing::Span::current(), rec.trace_parent.as_deref());
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
            .and_then(|k| IdempotencyKey::new(k).map_err(OpsError::Key))?;
        if let Err(refused) = ops.keys.cancel(&rec.function, &key, by, reason).await? {
            return Err(OpsError::Usage(refused.to_string()));
        }
    }
    ops.poison.close_discarded(&rec, by, reason, etag).await?;
    rec.status = RecordStatus::Discarded;
    rec.discarded_by = Some(by.into());
    rec.discard_reason = Some(reason.into());
    Ok(rec)
}
