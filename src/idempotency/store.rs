//! The claim protocol over Table Storage: one record per key, pending →
//! done, with its attempt history.

use super::key::IdempotencyKey;
use crate::storage::{Entity, Etag, StorageError, StorageResult, TableOp, TableStore};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;
use uuid::Uuid;

/// Key status in the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyStatus {
    Pending,
    Done,
    Poisoned,
    /// Closed by an operator (`poison discard --close-key`): the job must
    /// never run, so any later delivery is settled as a duplicate.
    Cancelled,
}

impl KeyStatus {
    fn parse(s: &str) -> Self {
        match s {
            "done" => KeyStatus::Done,
            "poisoned" => KeyStatus::Poisoned,
            "cancelled" => KeyStatus::Cancelled,
            _ => KeyStatus::Pending,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            KeyStatus::Pending => "pending",
            KeyStatus::Done => "done",
            KeyStatus::Poisoned => "poisoned",
            KeyStatus::Cancelled => "cancelled",
        }
    }

    /// Nothing will run for this key again: done, or closed by an operator.
    pub fn is_settled(self) -> bool {
        matches!(self, KeyStatus::Done | KeyStatus::Cancelled)
    }
}

/// How many attempts a key record remembers (the newest are kept).
pub const HISTORY_LEN: usize = 10;
/// Each remembered error is cut to this many bytes (the full last error is
/// on the poison record).
const HISTORY_ERROR_MAX: usize = 300;

/// One attempt at a key's job, kept on the key record (`History` column,
/// JSON, newest last, at most [`HISTORY_LEN`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attempt {
    pub at: String,
    pub message_id: String,
    pub dequeue_count: u32,
    /// `completed`, `retried`, `poisoned` or `released`.
    pub outcome: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The attempt ended without knowing whether the effect happened (a
    /// timeout, a connection lost after the request was sent, a 5xx after
    /// the provider took the body): the provider key is what keeps a retry
    /// from doubling it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub may_have_taken_effect: bool,
}

fn parse_history(text: Option<&str>) -> Vec<Attempt> {
    text.and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or_default()
}

/// The history with `attempt` appended, as the column's JSON text.
fn history_with(history: &[Attempt], attempt: Attempt) -> String {
    let mut all: Vec<Attempt> = history.to_vec();
    all.push(attempt);
    let skip = all.len().saturating_sub(HISTORY_LEN);
    serde_json::to_string(&all[skip..]).unwrap_or_else(|_| "[]".into())
}

fn short_error(error: &str) -> String {
    scrubbed_and_cut(error, HISTORY_ERROR_MAX, "…")
}

/// `text` scrubbed of secrets and cut to `max` bytes (on a character
/// boundary), with `marker` saying it was cut.
fn scrubbed_and_cut(text: &str, max: usize, marker: &str) -> String {
    let s = crate::telemetry::scrub(text);
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{marker}", &s[..end])
}

/// The idempotency record of one key, as stored.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyRecord {
    pub key: String,
    pub function: String,
    pub status: KeyStatus,
    pub provider_key: String,
    pub attempts: u32,
    pub last_error: Option<String>,
    pub lease_owner: Option<String>,
    pub lease_until: Option<String>,
    pub message_id: Option<String>,
    pub first_seen: Option<String>,
    pub completed_at: Option<String>,
    pub replay_count: u32,
    /// Who closed the key (`poison discard --close-key`), when and why.
    pub cancelled_by: Option<String>,
    pub cancelled_at: Option<String>,
    pub cancel_reason: Option<String>,
    /// The last [`HISTORY_LEN`] attempts, oldest first.
    pub history: Vec<Attempt>,
    pub partition_key: String,
    pub row_key: String,
}

impl KeyRecord {
    fn from_entity(pk: &str, rk: &str, e: &Entity) -> Self {
        let s = |k: &str| {
            e.get(k)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        };
        let n = |k: &str| e.get(k).and_then(Value::as_u64).unwrap_or(0) as u32;
        KeyRecord {
            key: s("Key").unwrap_or_default(),
            function: s("Function").unwrap_or_default(),
            status: KeyStatus::parse(&s("Status").unwrap_or_default()),
            provider_key: s("ProviderKey").unwrap_or_default(),
            attempts: n("Attempts"),
            last_error: s("LastError"),
            lease_owner: s("LeaseOwner"),
            lease_until: s("LeaseUntil"),
            message_id: s("MessageId"),
            first_seen: s("FirstSeen"),
            completed_at: s("CompletedAt"),
            replay_count: n("ReplayCount"),
            cancelled_by: s("CancelledBy"),
            cancelled_at: s("CancelledAt"),
            cancel_reason: s("CancelReason"),
            history: parse_history(e.get("History").and_then(Value::as_str)),
            partition_key: pk.to_string(),
            row_key: rk.to_string(),
        }
    }

    /// The end of a live lease held on the key, if any.
    pub fn lease_live(&self, now: OffsetDateTime) -> Option<OffsetDateTime> {
        let until = OffsetDateTime::parse(self.lease_until.as_deref()?, &Rfc3339).ok()?;
        (until > now && self.lease_owner.is_some()).then_some(until)
    }
}

/// A key this worker holds: what the handler needs and what finishing needs.
#[derive(Debug, Clone)]
pub struct ClaimedKey {
    pub key: IdempotencyKey,
    pub function: String,
    pub partition_key: String,
    pub row_key: String,
    pub etag: Etag,
    pub provider_key: String,
    /// An earlier attempt held this key and did not finish: it may have reached
    /// the provider, so the handler must send the same provider key.
    pub previously_pending: bool,
    pub attempts: u32,
    pub lease_owner: String,
    /// When the key was first claimed (the job's first attempt).
    pub first_seen: Option<String>,
    /// The attempt this claim is for, and the attempts before it.
    pub message_id: String,
    pub dequeue_count: u32,
    pub history: Vec<Attempt>,
}

/// One claim's inputs, shared by its insert and take-over paths.
struct ClaimRequest<'a> {
    function: &'a str,
    key: &'a IdempotencyKey,
    partition_key: String,
    row_key: String,
    owner: &'a str,
    now: OffsetDateTime,
    lease_until: String,
    message_id: &'a str,
    dequeue_count: u32,
}

impl ClaimRequest<'_> {
    /// The record of a key claimed for the first time.
    fn fresh_entity(&self, provider_key: &str) -> Entity {
        let fresh = json!({
            "Key": self.key.as_str(),
            "Function": self.function,
            "Status": "pending",
            "ProviderKey": provider_key,
            "Attempts": 1,
            "LastError": "",
            "LeaseOwner": self.owner,
            "LeaseUntil": self.lease_until,
            "MessageId": self.message_id,
            "FirstSeen": fmt_time(self.now),
            "ReplayCount": 0,
        });
        let Value::Object(fresh) = fresh else {
            unreachable!("a JSON object literal")
        };
        fresh
    }

    fn claimed(
        &self,
        etag: Etag,
        provider_key: String,
        attempts: u32,
        first_seen: Option<String>,
        history: Vec<Attempt>,
    ) -> ClaimedKey {
        ClaimedKey {
            key: self.key.clone(),
            function: self.function.into(),
            partition_key: self.partition_key.clone(),
            row_key: self.row_key.clone(),
            etag,
            provider_key,
            previously_pending: false,
            attempts,
            lease_owner: self.owner.into(),
            first_seen,
            message_id: self.message_id.into(),
            dequeue_count: self.dequeue_count,
            history,
        }
    }
}

/// The history entry for a holder that vanished with its lease.
fn abandoned_attempt(rec: &KeyRecord) -> Attempt {
    // Lease owners are `<worker>/<message id>/<dequeue count>`.
    let dc = rec
        .lease_owner
        .as_deref()
        .and_then(|o| o.rsplit('/').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    Attempt {
        at: rec.lease_until.clone().unwrap_or_default(),
        message_id: rec.message_id.clone().unwrap_or_default(),
        dequeue_count: dc,
        outcome: "abandoned".into(),
        error: Some("the attempt ended without a result (crash, kill or lost storage)".into()),
        may_have_taken_effect: true,
    }
}

impl ClaimedKey {
    /// This attempt, as a history entry.
    fn attempt(&self, outcome: &str, error: Option<&str>, uncertain: bool) -> Attempt {
        Attempt {
            at: now_rfc3339(),
            message_id: self.message_id.clone(),
            dequeue_count: self.dequeue_count,
            outcome: outcome.into(),
            error: error.map(short_error),
            may_have_taken_effect: uncertain,
        }
    }
}

/// What the claim decided.
#[derive(Debug, Clone)]
// Returned once per message and matched at once, never stored: boxing the
// claim would only add an allocation per message.
#[allow(clippy::large_enum_variant)]
pub enum NextAction {
    /// This worker holds the key: run the handler.
    Run(ClaimedKey),
    /// The effect already happened: delete the message as a duplicate.
    AlreadyDone,
    /// Another worker holds a live lease: come back after it ends.
    HeldElsewhere { until: OffsetDateTime },
}

/// Error from finishing a claim.
#[derive(Debug, thiserror::Error)]
pub enum FinishError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("lost the key's lease to another worker before finishing")]
    LeaseLost,
}

pub(crate) fn now_rfc3339() -> String {
    fmt_time(OffsetDateTime::now_utc())
}

pub(crate) fn fmt_time(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_default()
}

/// The idempotency table.
#[derive(Clone)]
pub struct KeyStore {
    table: Arc<dyn TableStore>,
}

impl KeyStore {
    pub fn new(table: Arc<dyn TableStore>) -> Self {
        Self { table }
    }

    pub fn table(&self) -> &Arc<dyn TableStore> {
        &self.table
    }

    pub async fn get(
        &self,
        function: &str,
        key: &IdempotencyKey,
    ) -> StorageResult<Option<KeyRecord>> {
        Ok(self.get_versioned(function, key).await?.map(|(r, _)| r))
    }

    /// [`KeyStore::get`] with the record's ETag.
    pub async fn get_versioned(
        &self,
        function: &str,
        key: &IdempotencyKey,
    ) -> StorageResult<Option<(KeyRecord, Etag)>> {
        let (pk, rk) = (key.partition_key(function), key.row_key());
        Ok(self
            .table
            .get(&pk, &rk)
            .await?
            .map(|(e, etag)| (KeyRecord::from_entity(&pk, &rk, &e), etag)))
    }

    /// Claim `key` for `lease_owner` until now + `lease`.
    pub async fn claim(
        &self,
        function: &str,
        key: &IdempotencyKey,
        lease_owner: &str,
        lease: Duration,
        message_id: &str,
    ) -> StorageResult<NextAction> {
        self.claim_attempt(function, key, lease_owner, lease, message_id, 0)
            .await
    }

    /// [`claim`](Self::claim) for attempt `dequeue_count` of `message_id`
    /// (the numbers the attempt history records).
    pub async fn claim_attempt(
        &self,
        function: &str,
        key: &IdempotencyKey,
        lease_owner: &str,
        lease: Duration,
        message_id: &str,
        dequeue_count: u32,
    ) -> StorageResult<NextAction> {
        let now = OffsetDateTime::now_utc();
        let req = ClaimRequest {
            function,
            key,
            partition_key: key.partition_key(function),
            row_key: key.row_key(),
            owner: lease_owner,
            now,
            lease_until: fmt_time(now + lease),
            message_id,
            dequeue_count,
        };
        let (pk, rk) = (&req.partition_key, &req.row_key);
        for _ in 0..5 {
            let provider_key = Uuid::new_v4().to_string();
            match self
                .table
                .insert(pk, rk, &req.fresh_entity(&provider_key))
                .await
            {
                Ok(etag) => {
                    let first_seen = Some(fmt_time(now));
                    return Ok(NextAction::Run(req.claimed(
                        etag,
                        provider_key,
                        1,
                        first_seen,
                        vec![],
                    )));
                }
                Err(StorageError::Conflict) => {}
                // The table is gone (deleted, or an in-memory emulator restarted):
                // recreate it and claim again rather than give the message up.
                Err(StorageError::NotFound) => {
                    self.table.create_if_missing().await?;
                    continue;
                }
                Err(e) => return Err(e),
            }
            let Some((entity, etag)) = self.table.get(pk, rk).await? else {
                continue; // deleted in between: insert again
            };
            let rec = KeyRecord::from_entity(pk, rk, &entity);
            if rec.status.is_settled() {
                return Ok(NextAction::AlreadyDone);
            }
            if rec.lease_owner.as_deref() == Some(lease_owner) {
                // Our own write landed (an SDK-level retry then saw 409/412).
                let (attempts, first, history) = (rec.attempts, rec.first_seen, rec.history);
                let mut c = req.claimed(etag, rec.provider_key, attempts, first, history);
                c.previously_pending = attempts > 1;
                return Ok(NextAction::Run(c));
            }
            if let Some(until) = rec.lease_live(now) {
                return Ok(NextAction::HeldElsewhere { until });
            }
            if let Some(c) = self.take_over(&req, rec, etag).await? {
                return Ok(NextAction::Run(c));
            }
        }
        // Five rounds of losing races: someone else is active on this key.
        Ok(NextAction::HeldElsewhere {
            until: now + Duration::from_secs(1),
        })
    }

    /// Take over a free key (released, or its lease expired), keeping its
    /// ProviderKey. `None` when someone else changed it first.
    async fn take_over(
        &self,
        req: &ClaimRequest<'_>,
        rec: KeyRecord,
        etag: Etag,
    ) -> StorageResult<Option<ClaimedKey>> {
        let attempts = rec.attempts + 1;
        let mut update = Entity::new();
        let mut history = rec.history.clone();
        if rec.lease_until.is_some() {
            // The lease expired without being released: the holder crashed
            // or lost storage mid-way, after the claim and maybe after the
            // effect. Say so in the history.
            let text = history_with(&history, abandoned_attempt(&rec));
            history = parse_history(Some(&text));
            update.insert("History".into(), json!(text));
        }
        update.insert("Status".into(), json!("pending"));
        update.insert("Attempts".into(), json!(attempts));
        update.insert("LeaseOwner".into(), json!(req.owner));
        update.insert("LeaseUntil".into(), json!(req.lease_until));
        update.insert("MessageId".into(), json!(req.message_id));
        let (pk, rk) = (&req.partition_key, &req.row_key);
        match self.table.merge(pk, rk, &update, Some(&etag)).await {
            Ok(etag) => {
                let mut c = req.claimed(etag, rec.provider_key, attempts, rec.first_seen, history);
                c.previously_pending = true;
                Ok(Some(c))
            }
            Err(StorageError::PreconditionFailed) | Err(StorageError::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Extend the key's lease (with the message lease, while the handler runs).
    pub async fn extend(&self, claim: &mut ClaimedKey, lease: Duration) -> Result<(), FinishError> {
        let mut update = Entity::new();
        update.insert(
            "LeaseUntil".into(),
            json!(fmt_time(OffsetDateTime::now_utc() + lease)),
        );
        claim.etag = self.merge_owned(claim, update).await?;
        Ok(())
    }

    /// Mark the key done (before the message is deleted), optionally writing
    /// the caller's entities in the same entity-group transaction.
    pub async fn complete(
        &self,
        claim: &ClaimedKey,
        effects: Vec<(String, Entity)>,
    ) -> Result<(), FinishError> {
        let mut update = Entity::new();
        update.insert("Status".into(), json!("done"));
        update.insert("CompletedAt".into(), json!(now_rfc3339()));
        update.insert("LeaseUntil".into(), json!(""));
        // Done: earlier errors are history now, not a current error.
        update.insert("LastError".into(), json!(""));
        update.insert(
            "History".into(),
            json!(history_with(
                &claim.history,
                claim.attempt("completed", None, false)
            )),
        );
        if effects.is_empty() {
            self.merge_owned(claim, update).await?;
            return Ok(());
        }
        let mut ops: Vec<TableOp> = effects
            .into_iter()
            .map(|(row_key, entity)| TableOp::Insert { row_key, entity })
            .collect();
        ops.push(TableOp::Merge {
            row_key: claim.row_key.clone(),
            entity: update,
            if_match: Some(claim.etag.clone()),
        });
        match self.table.transaction(&claim.partition_key, ops).await {
            Ok(()) => Ok(()),
            Err(StorageError::PreconditionFailed) | Err(StorageError::Conflict) => {
                // Either our own retried batch landed, or someone else took the key.
                match self.table.get(&claim.partition_key, &claim.row_key).await? {
                    Some((e, _)) => {
                        let rec = KeyRecord::from_entity(&claim.partition_key, &claim.row_key, &e);
                        if rec.status == KeyStatus::Done
                            && rec.lease_owner.as_deref() == Some(&claim.lease_owner)
                        {
                            Ok(())
                        } else {
                            Err(FinishError::LeaseLost)
                        }
                    }
                    None => Err(FinishError::LeaseLost),
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Record a failed attempt and release the lease so the next attempt can
    /// claim at once. `uncertain`: the effect may have happened anyway.
    pub async fn record_failure(
        &self,
        claim: &ClaimedKey,
        error: &str,
        uncertain: bool,
    ) -> Result<(), FinishError> {
        self.record_failure_as(claim, "retried", error, uncertain)
            .await
    }

    /// [`record_failure`](Self::record_failure) with the history's outcome
    /// named (`retried`, `released`).
    pub async fn record_failure_as(
        &self,
        claim: &ClaimedKey,
        outcome: &str,
        error: &str,
        uncertain: bool,
    ) -> Result<(), FinishError> {
        let mut update = Entity::new();
        update.insert("LastError".into(), json!(cap_error(error)));
        update.insert("LeaseUntil".into(), json!(""));
        update.insert(
            "History".into(),
            json!(history_with(
                &claim.history,
                claim.attempt(outcome, Some(error), uncertain)
            )),
        );
        self.merge_owned(claim, update).await.map(|_| ())
    }

    /// The message went to poison: the key is not done; a later message with the
    /// same key may run.
    pub async fn mark_poisoned(
        &self,
        claim: &ClaimedKey,
        error: &str,
        uncertain: bool,
    ) -> Result<(), FinishError> {
        let mut update = Entity::new();
        update.insert("Status".into(), json!("poisoned"));
        update.insert("LastError".into(), json!(cap_error(error)));
        update.insert("LeaseUntil".into(), json!(""));
        update.insert(
            "History".into(),
            json!(history_with(
                &claim.history,
                claim.attempt("poisoned", Some(error), uncertain)
            )),
        );
        self.merge_owned(claim, update).await.map(|_| ())
    }

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
    ) -> StorageResult<Result<KeyStatus, String>> {
        let (pk, rk) = (key.partition_key(function), key.row_key());
        let now = OffsetDateTime::now_utc();
        let mut update = Entity::new();
        update.insert("Status".into(), json!("cancelled"));
        update.insert("LeaseUntil".into(), json!(""));
        update.insert("CancelledAt".into(), json!(fmt_time(now)));
        update.insert("CancelledBy".into(), json!(by));
        update.insert("CancelReason".into(), json!(cap_error(reason)));
        for _ in 0..5 {
            match self.table.get(&pk, &rk).await {
                Ok(Some((e, etag))) => {
                    let rec = KeyRecord::from_entity(&pk, &rk, &e);
                    if rec.status.is_settled() {
                        return Ok(Ok(rec.status));
                    }
                    if rec.lease_live(now).is_some() {
                        return Ok(Err(format!(
                            "key {} is held by a running attempt ({}); try again when it ends",
                            key.as_str(),
                            rec.lease_owner.as_deref().unwrap_or("-")
                        )));
                    }
                    match self.table.merge(&pk, &rk, &update, Some(&etag)).await {
                        Ok(_) => return Ok(Ok(KeyStatus::Cancelled)),
                        Err(StorageError::PreconditionFailed | StorageError::NotFound) => continue,
                        Err(e) => return Err(e),
                    }
                }
                Ok(None) | Err(StorageError::NotFound) => {
                    // Never claimed: record it closed, so a first delivery is a duplicate too.
                    let mut fresh = update.clone();
                    fresh.insert("Key".into(), json!(key.as_str()));
                    fresh.insert("Function".into(), json!(function));
                    fresh.insert("ProviderKey".into(), json!(Uuid::new_v4().to_string()));
                    fresh.insert("Attempts".into(), json!(0));
                    fresh.insert("LastError".into(), json!(""));
                    fresh.insert("ReplayCount".into(), json!(0));
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
        Ok(Err(format!(
            "key {} kept changing while closing it; try again",
            key.as_str()
        )))
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
            let mut update = Entity::new();
            update.insert("ReplayCount".into(), json!(rec.replay_count + 1));
            match self.table.merge(&pk, &rk, &update, Some(etag)).await {
                Ok(_) => return Ok(()),
                Err(StorageError::PreconditionFailed | StorageError::NotFound) => {}
                Err(e) => return Err(e),
            }
        }
        if let Some((e, etag)) = self.table.get(&pk, &rk).await? {
            let rec = KeyRecord::from_entity(&pk, &rk, &e);
            let mut update = Entity::new();
            update.insert("ReplayCount".into(), json!(rec.replay_count + 1));
            match self.table.merge(&pk, &rk, &update, Some(&etag)).await {
                Ok(_) | Err(StorageError::PreconditionFailed) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Merge into a record this worker owns. A 412 is re-checked: our own
    /// retried write is success; anything else means the lease was lost.
    async fn merge_owned(&self, claim: &ClaimedKey, update: Entity) -> Result<Etag, FinishError> {
        match self
            .table
            .merge(
                &claim.partition_key,
                &claim.row_key,
                &update,
                Some(&claim.etag),
            )
            .await
        {
            Ok(etag) => Ok(etag),
            Err(StorageError::PreconditionFailed) => {
                let Some((e, etag)) = self.table.get(&claim.partition_key, &claim.row_key).await?
                else {
                    return Err(FinishError::LeaseLost);
                };
                let rec = KeyRecord::from_entity(&claim.partition_key, &claim.row_key, &e);
                let ours = rec.lease_owner.as_deref() == Some(&claim.lease_owner);
                let applied = update.iter().all(|(k, v)| e.get(k) == Some(v));
                if ours && applied {
                    Ok(etag)
                } else if ours {
                    // Our record moved on (e.g. our own extend landed twice): apply again.
                    Ok(self
                        .table
                        .merge(&claim.partition_key, &claim.row_key, &update, Some(&etag))
                        .await?)
                } else {
                    Err(FinishError::LeaseLost)
                }
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// Errors are capped before they are stored (Table string properties hold 64 KiB).
pub fn cap_error(s: &str) -> String {
    scrubbed_and_cut(s, 4096, "… [truncated]")
}

#[cfg(test)]
mod tests {
    use crate::idempotency::key::KeyTemplate;
    #[test]
    fn history_keeps_the_newest_attempts_with_short_scrubbed_errors() {
        let attempt = |n: u32| Attempt {
            at: format!("t{n}"),
            message_id: "m".into(),
            dequeue_count: n,
            outcome: "retried".into(),
            error: Some(short_error(&format!(
                "GET https://a.queue.core.windows.net/q?sv=1&sig=secret{n} {}",
                "x".repeat(1000)
            ))),
            may_have_taken_effect: n.is_multiple_of(2),
        };
        let mut h: Vec<Attempt> = vec![];
        for n in 1..=HISTORY_LEN as u32 + 3 {
            h = parse_history(Some(&history_with(&h, attempt(n))));
        }
        assert_eq!(h.len(), HISTORY_LEN);
        assert_eq!(h[0].dequeue_count, 4, "the oldest three dropped");
        assert_eq!(h.last().unwrap().dequeue_count, HISTORY_LEN as u32 + 3);
        let e = h[0].error.as_deref().unwrap();
        assert!(
            e.len() <= HISTORY_ERROR_MAX + 3 && !e.contains("secret"),
            "{e}"
        );
        assert!(parse_history(Some("not json")).is_empty());
    }

    use super::*;
    use proptest::prelude::*;

    #[test]
    fn template_renders_pointers() {
        let t = KeyTemplate::parse("credits:{/accountId}:{/period}").unwrap();
        let k = t
            .render(&json!({"accountId": "a1", "period": 202611}))
            .unwrap();
        assert_eq!(k.as_str(), "credits:a1:202611");
        let t = KeyTemplate::parse("x{{y}}:{/a/b}").unwrap();
        assert_eq!(
            t.render(&json!({"a": {"b": "z"}})).unwrap().as_str(),
            "x{y}:z"
        );
    }

    #[test]
    fn template_names_the_missing_field() {
        let t = KeyTemplate::parse("receipt:{/orderId}").unwrap();
        let e = t.render(&json!({"other": 1})).unwrap_err();
        assert!(e.contains("/orderId"), "{e}");
        assert!(t.render(&json!({"orderId": ""})).is_err());
        assert!(t.render(&json!({"orderId": null})).is_err());
        assert!(t.render(&json!({"orderId": {"x": 1}})).is_err());
    }

    #[test]
    fn per_attempt_templates_are_rejected() {
        for bad in [
            "r:{messageId}",
            "r:{/a}:{dequeueCount}",
            "r:{now}",
            "r:{random}",
            "r:{uuid}",
            "r:{sys.RandGuid}",
        ] {
            assert!(KeyTemplate::parse(bad).is_err(), "{bad}");
        }
        assert!(KeyTemplate::parse("constant")
            .unwrap_err()
            .contains("share one key"));
        assert!(KeyTemplate::parse("r:{/a").is_err());
        assert!(KeyTemplate::parse("r:/a}").is_err());
    }

    #[test]
    fn row_keys_distinguish_long_keys() {
        let a = IdempotencyKey::new(format!("{}a", "x".repeat(600))).unwrap();
        let b = IdempotencyKey::new(format!("{}b", "x".repeat(600))).unwrap();
        assert_ne!(a.row_key(), b.row_key());
        assert_eq!(a.row_key().len(), 64);
        assert!(a.partition_key("F").starts_with("F-"));
    }

    proptest! {
        #[test]
        fn same_payload_same_key(order in "[a-zA-Z0-9 /#?'\"😀]{1,40}", period in 0u32..1_000_000) {
            let t = KeyTemplate::parse("receipt:{/orderId}:{/period}").unwrap();
            let p = json!({"orderId": order, "period": period});
            let k1 = t.render(&p).unwrap();
            let k2 = t.render(&p.clone()).unwrap();
            prop_assert_eq!(&k1, &k2);
            prop_assert_eq!(k1.row_key(), k2.row_key());
        }

        #[test]
        fn key_ignores_everything_but_the_pointed_fields(order in "[a-z0-9]{1,20}", noise in any::<u64>()) {
            // The template sees only the payload; extra fields (or anything a
            // message carries around it) cannot change the key.
            let t = KeyTemplate::parse("r:{/orderId}").unwrap();
            let a = t.render(&json!({"orderId": order})).unwrap();
            let b = t.render(&json!({"orderId": order, "attempt": noise, "ts": noise.to_string()})).unwrap();
            prop_assert_eq!(a, b);
        }

        #[test]
        fn template_parser_never_panics(s in "\\PC{0,60}") {
            let _ = KeyTemplate::parse(&s);
        }
    }
}
