//! Read-modify-write of one flow row (partition [`PARTITION`] of the
//! control table) under its ETag: insert when missing, merge `If-Match`
//! when present, and read again when another replica wrote first.

use crate::storage::{Entity, Etag, StorageError, StorageResult, TableStore};
use std::time::Duration;

/// The control table's partition of the flow rows (the pause and breaker
/// rows are in `function`, so the control watch never reads these).
pub const PARTITION: &str = "limits";

/// How many times one update reads again after losing a race.
const ATTEMPTS: u32 = 8;

/// A row as read, with its version.
pub(super) struct Versioned {
    pub(super) entity: Entity,
    etag: Etag,
}

/// What an update decided: write these properties, or leave the row.
pub(super) enum Change<T> {
    Write(Entity, T),
    Keep(T),
}

/// Apply `decide` (given the row, or `None`, and now in Unix seconds) to
/// row `rk` until its write lands or it keeps the row; a create of the
/// control table when it is missing. After [`ATTEMPTS`] lost races the
/// last error is returned (`PreconditionFailed`).
pub(super) async fn update<T>(
    table: &dyn TableStore,
    rk: &str,
    mut decide: impl FnMut(Option<&Versioned>, f64) -> Change<T>,
) -> StorageResult<T> {
    let mut last = StorageError::PreconditionFailed;
    for attempt in 0..ATTEMPTS {
        if attempt > 0 {
            // Spread the replicas that lost the same race.
            let ms = crate::entropy::gen_range(1..=5 * attempt as u64);
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        let row = match table.get(PARTITION, rk).await {
            Ok(r) => r.map(|(entity, etag)| Versioned { entity, etag }),
            Err(StorageError::NotFound) => None,
            Err(e) => return Err(e),
        };
        let now = now_seconds();
        let (entity, value) = match decide(row.as_ref(), now) {
            Change::Keep(v) => return Ok(v),
            Change::Write(e, v) => (e, v),
        };
        let written = match &row {
            Some(r) => table.merge(PARTITION, rk, &entity, Some(&r.etag)).await,
            None => match table.insert(PARTITION, rk, &entity).await {
                Err(StorageError::NotFound) => {
                    table.create_if_missing().await?;
                    table.insert(PARTITION, rk, &entity).await
                }
                other => other,
            },
        };
        match written {
            Ok(_) => return Ok(value),
            Err(e @ (StorageError::PreconditionFailed | StorageError::Conflict)) => last = e,
            Err(StorageError::NotFound) => last = StorageError::NotFound,
            Err(e) => return Err(e),
        }
    }
    Err(last)
}

/// Now, in Unix seconds (following simulated time in tests).
pub(super) fn now_seconds() -> f64 {
    let now = crate::clock::now_utc();
    now.unix_timestamp() as f64 + f64::from(now.nanosecond()) / 1e9
}
