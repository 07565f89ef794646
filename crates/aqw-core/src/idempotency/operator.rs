//! The operator's key commands: `aqw keys list` ([`KeyStore::list`]) and
//! `aqw keys new-provider-key` ([`KeyStore::replace_provider_key`]).

use super::key::IdempotencyKey;
use super::record::{
    fmt_time, history_with, provider_key_changes_with, short_error, Attempt, KeyRecord, KeyStatus,
    ProviderKeyChange,
};
use super::store::KeyStore;
use crate::storage::{Entity, StorageError, StorageResult};
use serde_json::json;
use time::OffsetDateTime;

/// The history outcome of a provider-key replacement: the key's current
/// provider key has not been sent since.
pub const PROVIDER_KEY_REPLACED: &str = "provider key replaced";

/// What `aqw keys list` selects.
#[derive(Debug, Clone, Default)]
pub struct KeyQuery {
    /// Keys starting with this text.
    pub prefix: Option<String>,
    /// Keys in this status.
    pub status: Option<KeyStatus>,
    /// Keys whose record changed at or after this time.
    pub since: Option<OffsetDateTime>,
    /// Keys whose record changed before this time.
    pub until: Option<OffsetDateTime>,
    /// At most this many.
    pub limit: Option<usize>,
}

impl KeyStore {
    /// The keys of `function` that `query` selects, in key-hash order,
    /// every page followed (`aqw keys list`). The function, status, prefix
    /// and time bounds are filtered by the service (one query over the
    /// table, a request per 1,000 rows it scans); at most `query.limit`
    /// come back.
    pub async fn list(&self, function: &str, query: &KeyQuery) -> StorageResult<Vec<KeyRecord>> {
        let mut filter = crate::storage::Filter::eq("Function", function);
        if let Some(p) = query.prefix.as_ref().filter(|p| !p.is_empty()) {
            filter = filter.and(crate::storage::Filter::StartsWith {
                column: "Key",
                prefix: p.clone(),
            });
        }
        if let Some(s) = query.status {
            filter = filter.and(crate::storage::Filter::eq("Status", s.as_str()));
        }
        if let Some(t) = query.since {
            filter = filter.and(crate::storage::Filter::ChangedSince(t));
        }
        if let Some(t) = query.until {
            filter = filter.and(crate::storage::Filter::ChangedBefore(t));
        }
        let rows = match self
            .table
            .query_where(&crate::storage::TableQuery {
                partition: None,
                filter: Some(filter),
                select: &[],
            })
            .await
        {
            Err(StorageError::NotFound) => return Ok(vec![]),
            other => other?,
        };
        Ok(rows
            .iter()
            .take(query.limit.unwrap_or(usize::MAX))
            .map(|r| KeyRecord::from_entity(&r.partition_key, &r.row_key, &r.entity))
            .collect())
    }

    /// Replace a key's provider key by a fresh one (issue 38): for a
    /// provider that replays a saved failure under the old one, once it has
    /// confirmed the old one took no effect. Refused (the `Err` text) for a
    /// key never claimed, settled, or held by a running attempt. The history
    /// and the key's `ProviderKeyChanges` keep who, why, and the old and new
    /// provider keys; the new key's window starts now (`FirstSeen`).
    /// Returns the new provider key.
    pub async fn replace_provider_key(
        &self,
        function: &str,
        key: &IdempotencyKey,
        by: &str,
        reason: &str,
    ) -> StorageResult<Result<String, String>> {
        let (pk, rk) = (key.partition_key(function), key.row_key());
        for _ in 0..5 {
            let Some((e, etag)) = self.table.get(&pk, &rk).await? else {
                return Ok(Err(never_claimed(key)));
            };
            let now = crate::clock::now_utc();
            let rec = KeyRecord::from_entity(&pk, &rk, &e);
            if let Some(why) = replace_refusal(&rec, key, now) {
                return Ok(Err(why));
            }
            let fresh = crate::entropy::uuid().to_string();
            let update = replacement(&rec, now, &fresh, by, reason);
            match self.table.merge(&pk, &rk, &update, Some(&etag)).await {
                Ok(_) => return Ok(Ok(fresh)),
                Err(StorageError::PreconditionFailed | StorageError::NotFound) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(StorageError::PreconditionFailed)
    }

    /// `keys new-provider-key --dry-run`: the key's record as it is, if
    /// [`replace_provider_key`](Self::replace_provider_key) would replace
    /// its provider key now, else why not. Reads only.
    pub async fn rehearse_provider_key(
        &self,
        function: &str,
        key: &IdempotencyKey,
    ) -> StorageResult<Result<KeyRecord, String>> {
        let (pk, rk) = (key.partition_key(function), key.row_key());
        let Some((e, _)) = self.table.get(&pk, &rk).await? else {
            return Ok(Err(never_claimed(key)));
        };
        let rec = KeyRecord::from_entity(&pk, &rk, &e);
        Ok(match replace_refusal(&rec, key, crate::clock::now_utc()) {
            Some(why) => Err(why),
            None => Ok(rec),
        })
    }
}

fn never_claimed(key: &IdempotencyKey) -> String {
    format!(
        "key {} was never claimed: its first attempt mints a provider key",
        key.as_str()
    )
}

/// Why a key's provider key may not be replaced now: settled, or held by a
/// running attempt.
fn replace_refusal(rec: &KeyRecord, key: &IdempotencyKey, now: OffsetDateTime) -> Option<String> {
    if rec.status.is_settled() {
        return Some(format!(
            "key {} is {}: nothing is left to run",
            key.as_str(),
            rec.status.as_str()
        ));
    }
    rec.lease_live(now).map(|_| {
        format!(
            "key {} is held by a running attempt; try again when it ends",
            key.as_str()
        )
    })
}

/// The merge that gives `rec` the provider key `fresh`: the key, its new
/// `FirstSeen`, a history note and the audit entry.
fn replacement(
    rec: &KeyRecord,
    now: OffsetDateTime,
    fresh: &str,
    by: &str,
    reason: &str,
) -> Entity {
    let note = Attempt {
        at: fmt_time(now),
        message_id: rec.message_id.clone().unwrap_or_default(),
        dequeue_count: 0,
        outcome: PROVIDER_KEY_REPLACED.into(),
        error: Some(short_error(&format!(
            "by {by}: {reason} (was {})",
            rec.provider_key
        ))),
        may_have_taken_effect: false,
        provider: None,
    };
    let change = ProviderKeyChange {
        at: fmt_time(now),
        by: short_error(by),
        reason: short_error(reason),
        old: rec.provider_key.clone(),
        new: fresh.to_string(),
    };
    let mut update = Entity::new();
    update.insert("ProviderKey".into(), json!(fresh));
    update.insert("FirstSeen".into(), json!(fmt_time(now)));
    update.insert("History".into(), json!(history_with(&rec.history, note)));
    update.insert(
        "ProviderKeyChanges".into(),
        json!(provider_key_changes_with(&rec.provider_key_changes, change)),
    );
    update
}
