//! What retention may read of the key table: the partitions of a function
//! and, in one of them, the settled keys last changed before a cutoff. The
//! server-side filter is the first guard of the purge: a `pending` or
//! `poisoned` key never leaves the service as a candidate.

use super::key::IdempotencyKey;
use super::store::KeyStore;
use crate::storage::{Etag, Filter, Row, StorageResult, TableQuery};
use std::collections::{BTreeMap, HashSet};
use time::OffsetDateTime;

/// A settled key that may be deleted if it is still at `etag`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PurgeCandidate {
    /// The key's partition.
    pub(crate) partition_key: String,
    /// The key's row (hex SHA-256 of the key).
    pub(crate) row_key: String,
    /// The version the key was read at; the delete is conditional on it.
    pub(crate) etag: Etag,
}

/// The columns a purge reads: the status, to check the filter's work again.
const PURGE_COLUMNS: &[&str] = &["Status"];

impl KeyStore {
    /// Every partition `function`'s keys can live in (function + first hash
    /// byte, see [`IdempotencyKey::partition_key`]).
    pub(crate) fn partitions(function: &str) -> impl Iterator<Item = String> + '_ {
        (0..=255u8).map(move |b| format!("{function}-{b:02x}"))
    }

    /// The settled keys of every partition of `function` last changed
    /// before `cutoff`, grouped by partition: one paged range query on
    /// `PartitionKey` (`<function>-` to `<function>.`), not one query per
    /// partition (256 requests per function even when it has no keys). A
    /// row of another function whose name starts with `<function>-` is in
    /// the range too, so only this function's own partitions are kept.
    pub(crate) async fn settled_before_by_partition(
        &self,
        function: &str,
        cutoff: OffsetDateTime,
    ) -> StorageResult<BTreeMap<String, Vec<PurgeCandidate>>> {
        let filter = Filter::StartsWith {
            column: "PartitionKey",
            prefix: format!("{function}-"),
        }
        .and(Filter::one_of("Status", &["done", "cancelled"]))
        .and(Filter::ChangedBefore(cutoff));
        let rows = self
            .table()
            .query_where(&TableQuery {
                partition: None,
                filter: Some(filter),
                select: PURGE_COLUMNS,
            })
            .await?;
        let own: HashSet<String> = Self::partitions(function).collect();
        let mut grouped: BTreeMap<String, Vec<PurgeCandidate>> = BTreeMap::new();
        for c in rows.into_iter().filter_map(settled_candidate) {
            if own.contains(&c.partition_key) {
                grouped.entry(c.partition_key.clone()).or_default().push(c);
            }
        }
        Ok(grouped)
    }

    /// The (PartitionKey, RowKey) of `key` of `function`.
    pub fn address(function: &str, key: &IdempotencyKey) -> (String, String) {
        (key.partition_key(function), key.row_key())
    }

    /// Keys of `partition` that are done or cancelled and whose row last
    /// changed before `cutoff` (the service's `Timestamp`, which is never
    /// earlier than `CompletedAt` or `CancelledAt`).
    pub async fn settled_before(
        &self,
        partition: &str,
        cutoff: OffsetDateTime,
    ) -> StorageResult<Vec<PurgeCandidate>> {
        let filter =
            Filter::one_of("Status", &["done", "cancelled"]).and(Filter::ChangedBefore(cutoff));
        let rows = self
            .table()
            .query_where(&TableQuery {
                partition: Some(partition),
                filter: Some(filter),
                select: PURGE_COLUMNS,
            })
            .await?;
        Ok(rows.into_iter().filter_map(settled_candidate).collect())
    }
}

/// A row the filter returned, if it really is settled and carries an ETag
/// (a row without one cannot be deleted conditionally, so it is kept).
fn settled_candidate(row: Row) -> Option<PurgeCandidate> {
    let status = row.entity.get("Status").and_then(|s| s.as_str());
    if !matches!(status, Some("done") | Some("cancelled")) {
        return None;
    }
    Some(PurgeCandidate {
        partition_key: row.partition_key,
        row_key: row.row_key,
        etag: row.etag?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_settled_rows_with_an_etag_are_candidates() {
        let row = |status: &str, etag: Option<&str>| Row {
            partition_key: "F-00".into(),
            row_key: "ab".into(),
            entity: json!({ "Status": status }).as_object().unwrap().clone(),
            etag: etag.map(|e| Etag(e.into())),
        };
        assert!(settled_candidate(row("done", Some("e"))).is_some());
        assert!(settled_candidate(row("cancelled", Some("e"))).is_some());
        assert!(settled_candidate(row("pending", Some("e"))).is_none());
        assert!(settled_candidate(row("poisoned", Some("e"))).is_none());
        assert!(settled_candidate(row("done", None)).is_none());
        let all: Vec<String> = KeyStore::partitions("F").collect();
        assert_eq!(
            (all.len(), all[0].as_str(), all[255].as_str()),
            (256, "F-00", "F-ff")
        );
    }
}
