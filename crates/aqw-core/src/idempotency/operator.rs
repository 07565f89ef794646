//! The operator's key commands: `aqw keys list` ([`KeyStore::list`]),
//! `aqw keys new-provider-key` ([`KeyStore::replace_provider_key`]),
//! closing a key for good ([`KeyStore::cancel`]) and counting a replay on
//! it ([`KeyStore::note_replay`], which starts a new run of its attempts).

use super::key::IdempotencyKey;
use super::record::{
    cap_error, fmt_time, history_with, provider_key_changes_with, short_error, Attempt, KeyRecord,
    KeyStatus, ProviderKeyChange,
};
use super::store::KeyStore;
use crate::storage::{Entity, Etag, StorageError, StorageResult};
use serde_json::json;
use time::OffsetDateTime;

/// The history outcome of a provider-key replacement: the key's current
/// provider key has not been sent since.
pub(crate) const PROVIDER_KEY_REPLACED: &str = "provider key replaced";

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
    ) -> StorageResult<Result<String, KeyRefusal>> {
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
    ) -> StorageResult<Result<KeyRecord, KeyRefusal>> {
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

/// Why an operator's change to a key (a new provider key, a close) is
/// refused now; each names the key, as the operator gave it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyRefusal {
    /// No record: its first attempt will mint a provider key.
    #[error("key {key} was never claimed: its first attempt mints a provider key")]
    NeverClaimed {
        /// The key.
        key: IdempotencyKey,
    },
    /// Done or cancelled: nothing is left to run.
    #[error("key {key} is {}: nothing is left to run", .status.as_str())]
    Settled {
        /// The key.
        key: IdempotencyKey,
        /// Its settled status.
        status: KeyStatus,
    },
    /// A live lease: an attempt is running right now.
    #[error("key {key} is held by a running attempt; try again when it ends")]
    Running {
        /// The key.
        key: IdempotencyKey,
    },
    /// A live lease of a named worker, while closing the key.
    #[error("key {key} is held by a running attempt ({owner}); try again when it ends")]
    RunningOn {
        /// The key.
        key: IdempotencyKey,
        /// The lease owner (`-` when unnamed).
        owner: String,
    },
    /// The record kept changing under the close; a retry may pass.
    #[error("key {key} kept changing while closing it; try again")]
    KeptChanging {
        /// The key.
        key: IdempotencyKey,
    },
}

fn never_claimed(key: &IdempotencyKey) -> KeyRefusal {
    KeyRefusal::NeverClaimed { key: key.clone() }
}

/// Why a key's provider key may not be replaced now: settled, or held by a
/// running attempt.
fn replace_refusal(
    rec: &KeyRecord,
    key: &IdempotencyKey,
    now: OffsetDateTime,
) -> Option<KeyRefusal> {
    let key = key.clone();
    if rec.status.is_settled() {
        return Some(KeyRefusal::Settled {
            key,
            status: rec.status,
        });
    }
    rec.lease_live(now).map(|_| KeyRefusal::Running { key })
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

impl KeyStore {
    /// Close `key` for good (`poison discard --close-key`): any later delivery
    /// of the job is settled as a duplicate without running. A key already
    /// done is left done (returned as is); a key held by a live lease is
    /// refused, since an attempt is running right now.
    pub async fn cancel(
        &self,
        function: &str,
        key: &IdempotencyKey,
        by: &str,
        reason: &str,
    ) -> StorageResult<Result<KeyStatus, KeyRefusal>> {
        let (pk, rk) = (key.partition_key(function), key.row_key());
        let now = crate::clock::now_utc();
        let mut update = Entity::new();
        update.insert("Status".into(), json!("cancelled"));
        update.insert("LeaseUntil".into(), json!(""));
        update.insert("CancelledAt".into(), json!(fmt_time(now)));
        update.insert("CancelledBy".into(), json!(by));
        update.insert(
            "CancelReason".into(),
            json!(cap_error(&crate::scrub::one_line(reason))),
        );
        for _ in 0..5 {
            match self.table.get(&pk, &rk).await {
                Ok(Some((e, etag))) => {
                    let rec = KeyRecord::from_entity(&pk, &rk, &e);
                    if rec.status.is_settled() {
                        return Ok(Ok(rec.status));
                    }
                    if rec.lease_live(now).is_some() {
                        return Ok(Err(KeyRefusal::RunningOn {
                            key: key.clone(),
                            owner: rec.lease_owner.as_deref().unwrap_or("-").to_string(),
                        }));
                    }
                    match self.table.merge(&pk, &rk, &update, Some(&etag)).await {
                        Ok(_) => return Ok(Ok(KeyStatus::Cancelled)),
                        Err(StorageError::PreconditionFailed | StorageError::NotFound) => continue,
                        Err(e) => return Err(e),
                    }
                }
                Ok(None) | Err(StorageError::NotFound) => {
                    // Never claimed: record it closed, so a first delivery is a duplicate too.
                    let fresh = closed_before_claim(update.clone(), function, key);
                    match self.table.insert(&pk, &rk, &fresh).await {
                        Ok(_) => return Ok(Ok(KeyStatus::Cancelled)),
                        Err(StorageError::Conflict) => continue,
                        Err(StorageError::NotFound) => self.table.create_if_missing().await?,
                        Err(e) => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(Err(KeyRefusal::KeptChanging { key: key.clone() }))
    }

    /// Count a replay on the key's record (best effort, no lease needed).
    ///
    /// `seen` is the record and ETag the caller read before re-putting: when
    /// nothing changed since, one conditional merge is enough; otherwise the
    /// record is read again.
    pub async fn note_replay(
        &self,
        function: &str,
        key: &IdempotencyKey,
        seen: Option<(&KeyRecord, &Etag)>,
    ) -> StorageResult<()> {
        let (pk, rk) = (key.partition_key(function), key.row_key());
        if let Some((rec, etag)) = seen {
            let update = replay_update(rec);
            match self.table.merge(&pk, &rk, &update, Some(etag)).await {
                Ok(_) => return Ok(()),
                Err(StorageError::PreconditionFailed | StorageError::NotFound) => {}
                Err(e) => return Err(e),
            }
        }
        if let Some((e, etag)) = self.table.get(&pk, &rk).await? {
            let rec = KeyRecord::from_entity(&pk, &rk, &e);
            let update = replay_update(&rec);
            match self.table.merge(&pk, &rk, &update, Some(&etag)).await {
                Ok(_) | Err(StorageError::PreconditionFailed) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// A new record for a key closed before its first claim: `update` plus the
/// columns a claim would have written.
fn closed_before_claim(mut fresh: Entity, function: &str, key: &IdempotencyKey) -> Entity {
    fresh.insert("Key".into(), json!(key.as_str()));
    fresh.insert("Function".into(), json!(function));
    let provider_key = crate::entropy::uuid().to_string();
    fresh.insert("ProviderKey".into(), json!(provider_key));
    fresh.insert("Attempts".into(), json!(0));
    fresh.insert("LastError".into(), json!(""));
    fresh.insert("ReplayCount".into(), json!(0));
    fresh
}

/// A replay counted on the key: and, on a key not done, a new run whose
/// attempts `maxDequeueCount` caps again (a key left `pending` by a
/// poisoning whose key update failed would otherwise count the poisoned
/// run's attempts against the replay).
fn replay_update(rec: &KeyRecord) -> Entity {
    let mut update = Entity::new();
    update.insert("ReplayCount".into(), json!(rec.replay_count + 1));
    if !rec.status.is_settled() {
        update.insert("RunAttempts".into(), json!(0));
    }
    update
}
