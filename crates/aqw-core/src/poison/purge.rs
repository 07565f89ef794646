//! What retention may read of the record table: the keys open records refer
//! to (never purged, whatever their status), and a queue's closed records
//! last changed before a cutoff.

use super::record::col;
use super::store::PoisonStore;
use crate::idempotency::{IdempotencyKey, KeyStore, PurgeCandidate};
use crate::storage::{Filter, StorageError, StorageResult, TableQuery, TableStore};
use std::collections::HashSet;
use time::OffsetDateTime;

/// The (PartitionKey, RowKey) in the key table of every key an open record
/// of `records` refers to, over all source queues of the table.
pub(crate) async fn open_record_keys(
    records: &dyn TableStore,
) -> StorageResult<HashSet<(String, String)>> {
    let query = TableQuery {
        partition: None,
        filter: Some(Filter::eq(col::STATUS, "open")),
        select: &[col::STATUS, col::FUNCTION, col::KEY],
    };
    let rows = match records.query_where(&query).await {
        Ok(rows) => rows,
        // No record table yet: no record refers to anything.
        Err(StorageError::NotFound) => return Ok(HashSet::new()),
        Err(e) => return Err(e),
    };
    Ok(rows
        .iter()
        .filter_map(|r| {
            let text = |c: &str| r.entity.get(c).and_then(|v| v.as_str()).unwrap_or("");
            let key = IdempotencyKey::new(text(col::KEY)).ok()?;
            Some(KeyStore::address(text(col::FUNCTION), &key))
        })
        .collect())
}

impl PoisonStore {
    /// This queue's records that are closed (replayed, discarded, replaced)
    /// and whose row last changed before `cutoff`. Open records never match.
    pub(crate) async fn closed_before(
        &self,
        cutoff: OffsetDateTime,
    ) -> StorageResult<Vec<PurgeCandidate>> {
        let filter = Filter::one_of(col::STATUS, &["replayed", "discarded", "replaced"])
            .and(Filter::ChangedBefore(cutoff));
        let rows = match self
            .records
            .query_where(&TableQuery {
                partition: Some(&self.queue),
                filter: Some(filter),
                select: &[col::STATUS],
            })
            .await
        {
            Ok(rows) => rows,
            Err(StorageError::NotFound) => return Ok(vec![]),
            Err(e) => return Err(e),
        };
        Ok(rows
            .into_iter()
            .filter(|r| r.entity.get(col::STATUS).and_then(|s| s.as_str()) != Some("open"))
            .filter_map(|r| {
                Some(PurgeCandidate {
                    partition_key: r.partition_key,
                    row_key: r.row_key,
                    etag: r.etag?,
                })
            })
            .collect())
    }

    /// The record table, for the purge's conditional deletes.
    pub(crate) fn records_table(&self) -> &std::sync::Arc<dyn TableStore> {
        &self.records
    }
}
