//! The claim protocol over Table Storage: one record per key ([`super::record`]),
//! claimed by insert or `If-Match` take-over, pending → done.

use super::key::IdempotencyKey;
use super::record::{
    abandoned_attempt, cap_error, fmt_time, history_with, now_rfc3339, parse_history, short_error,
    Attempt, KeyRecord, KeyStatus, ProviderAnswer,
};
use crate::storage::{Entity, Etag, StorageError, StorageResult, TableOp, TableStore};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use time::OffsetDateTime;

/// A key this worker holds: what the handler needs and what finishing needs.
#[derive(Debug, Clone)]
pub struct ClaimedKey {
    /// The key claimed.
    pub key: IdempotencyKey,
    /// The function it belongs to.
    pub function: String,
    /// The record's PartitionKey.
    pub(crate) partition_key: String,
    /// The record's RowKey.
    pub(crate) row_key: String,
    /// The record's version after the claim (finishing is conditional on it).
    pub(crate) etag: Etag,
    /// The provider idempotency key to send (minted with the record).
    pub provider_key: String,
    /// An earlier attempt held this key and did not finish: it may have reached
    /// the provider, so the handler must send the same provider key.
    pub previously_pending: bool,
    /// Who this claim holds the lease as (the worker's
    /// `<worker>/<message id>/<dequeue count>`).
    pub(crate) lease_owner: String,
    /// When the key was first claimed (the job's first attempt).
    pub(crate) first_seen: Option<String>,
    /// The attempt this claim is for, and the attempts before it.
    pub(crate) message_id: String,
    /// The message's DequeueCount at this attempt.
    pub(crate) dequeue_count: u32,
    /// The attempts before this one, oldest first.
    pub(crate) history: Vec<Attempt>,
    /// Attempts that earlier queue copies of the job spent before `aqw
    /// serve` put the job back as a fresh copy with its retry delay (the
    /// `CarriedAttempts` column; a fresh copy starts at DequeueCount 1, so
    /// the key keeps the count). 0 on a key taken over from `poisoned`: a
    /// replay starts a new attempt budget.
    pub carried_attempts: u32,
    /// The claims of the job's current run, this one included (the
    /// `RunAttempts` column): the attempt number `aqw run` caps
    /// (`crate::decide::attempt_of_key`). 1 on a key's first claim and on
    /// a key taken over from `poisoned`.
    pub run_attempts: u32,
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
    /// When the message was put on the queue (now when unknown).
    inserted: OffsetDateTime,
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
            "RunAttempts": 1,
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
            lease_owner: self.owner.into(),
            first_seen,
            message_id: self.message_id.into(),
            dequeue_count: self.dequeue_count,
            history,
            carried_attempts: 0,
            run_attempts: 1,
        }
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
            provider: None,
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
    HeldElsewhere {
        /// When its lease ends.
        until: OffsetDateTime,
    },
}

/// Error from finishing a claim.
#[derive(Debug, thiserror::Error)]
pub enum FinishError {
    /// A storage call failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// Another worker took the key over (our lease expired) before this
    /// attempt finished.
    #[error("lost the key's lease to another worker before finishing")]
    LeaseLost,
}

/// The idempotency table.
#[derive(Clone)]
pub struct KeyStore {
    pub(super) table: Arc<dyn TableStore>,
}

impl KeyStore {
    /// The key records of `table`.
    pub fn new(table: Arc<dyn TableStore>) -> Self {
        Self { table }
    }

    /// The table the records are in.
    pub fn table(&self) -> &Arc<dyn TableStore> {
        &self.table
    }

    /// The record of `key` of `function`, if there is one.
    pub async fn get(
        &self,
        function: &str,
        key: &IdempotencyKey,
    ) -> StorageResult<Option<KeyRecord>> {
        Ok(self.get_versioned(function, key).await?.map(|(r, _)| r))
    }

    /// [`KeyStore::get`] with the record's ETag.
    pub(crate) async fn get_versioned(
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
        let now = crate::clock::now_utc();
        self.claim_attempt(function, key, lease_owner, lease, message_id, 0, now)
            .await
    }

    /// [`claim`](Self::claim) for attempt `dequeue_count` of `message_id`
    /// (the numbers the attempt history records), put on the queue at
    /// `inserted`: a copy put before its key was poisoned is a leftover of
    /// the poisoned run (a second delivery chain, a duplicate send) and is
    /// settled as a duplicate; one put after it (a replay, a resend) runs.
    #[allow(clippy::too_many_arguments)]
    pub async fn claim_attempt(
        &self,
        function: &str,
        key: &IdempotencyKey,
        lease_owner: &str,
        lease: Duration,
        message_id: &str,
        dequeue_count: u32,
        inserted: OffsetDateTime,
    ) -> StorageResult<NextAction> {
        let now = crate::clock::now_utc();
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
            inserted,
        };
        for _ in 0..5 {
            if let Some(next) = self.claim_round(&req).await? {
                return Ok(next);
            }
        }
        // Five rounds of losing races: someone else is active on this key.
        Ok(NextAction::HeldElsewhere {
            until: now + Duration::from_secs(1),
        })
    }

    /// One round of a claim: insert a fresh record, or decide on the one
    /// already there. `None` when a race was lost and the round must be tried
    /// again.
    async fn claim_round(&self, req: &ClaimRequest<'_>) -> StorageResult<Option<NextAction>> {
        let (pk, rk) = (&req.partition_key, &req.row_key);
        let provider_key = crate::entropy::uuid().to_string();
        match self
            .table
            .insert(pk, rk, &req.fresh_entity(&provider_key))
            .await
        {
            Ok(etag) => {
                let first_seen = Some(fmt_time(req.now));
                let claim = req.claimed(etag, provider_key, first_seen, vec![]);
                return Ok(Some(NextAction::Run(claim)));
            }
            Err(StorageError::Conflict) => {}
            // The table is gone (deleted, or an in-memory emulator restarted):
            // recreate it and claim again rather than give the message up.
            Err(StorageError::NotFound) => {
                self.table.create_if_missing().await?;
                return Ok(None);
            }
            Err(e) => return Err(e),
        }
        let Some((entity, etag)) = self.table.get(pk, rk).await? else {
            return Ok(None); // deleted in between: insert again
        };
        let rec = KeyRecord::from_entity(pk, rk, &entity);
        self.claim_existing(req, rec, etag).await
    }

    /// The claim of a key that already has a record: settled, ours, held
    /// elsewhere, or free to take over (`None` when the take-over lost a race).
    async fn claim_existing(
        &self,
        req: &ClaimRequest<'_>,
        rec: KeyRecord,
        etag: Etag,
    ) -> StorageResult<Option<NextAction>> {
        if settles_copy(&rec, req.inserted) {
            return Ok(Some(NextAction::AlreadyDone));
        }
        if rec.lease_owner.as_deref() == Some(req.owner) {
            // Our own write landed (an SDK-level retry then saw 409/412).
            let (attempts, first, history) = (rec.attempts, rec.first_seen, rec.history);
            let mut c = req.claimed(etag, rec.provider_key, first, history);
            c.previously_pending = attempts > 1;
            c.carried_attempts = rec.carried_attempts;
            c.run_attempts = rec.run_attempts.max(1);
            return Ok(Some(NextAction::Run(c)));
        }
        if let Some(until) = rec.lease_live(req.now) {
            return Ok(Some(NextAction::HeldElsewhere { until }));
        }
        Ok(self.take_over(req, rec, etag).await?.map(NextAction::Run))
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
        // A poisoned key taken over is a replay (or a new job with its key):
        // it starts a new attempt budget.
        let (carried, run_attempts) = match rec.status {
            KeyStatus::Poisoned => (0, 1),
            _ => (rec.carried_attempts, rec.run_attempts.saturating_add(1)),
        };
        update.insert("RunAttempts".into(), json!(run_attempts));
        if carried != rec.carried_attempts {
            update.insert("CarriedAttempts".into(), json!(0));
        }
        update.insert("Status".into(), json!("pending"));
        update.insert("Attempts".into(), json!(attempts));
        update.insert("LeaseOwner".into(), json!(req.owner));
        update.insert("LeaseUntil".into(), json!(req.lease_until));
        update.insert("MessageId".into(), json!(req.message_id));
        let (pk, rk) = (&req.partition_key, &req.row_key);
        match self.table.merge(pk, rk, &update, Some(&etag)).await {
            Ok(etag) => {
                let mut c = req.claimed(etag, rec.provider_key, rec.first_seen, history);
                c.previously_pending = true;
                c.carried_attempts = carried;
                c.run_attempts = run_attempts;
                Ok(Some(c))
            }
            Err(StorageError::PreconditionFailed) | Err(StorageError::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Extend the key's lease (with the message lease, while the handler runs).
    pub(crate) async fn extend(
        &self,
        claim: &mut ClaimedKey,
        lease: Duration,
    ) -> Result<(), FinishError> {
        let mut update = Entity::new();
        update.insert(
            "LeaseUntil".into(),
            json!(fmt_time(crate::clock::now_utc() + lease)),
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
        self.complete_answered(claim, effects, None).await
    }

    /// [`complete`](Self::complete), keeping what the provider answered in
    /// the attempt history.
    pub(crate) async fn complete_answered(
        &self,
        claim: &ClaimedKey,
        effects: Vec<(String, Entity)>,
        provider: Option<ProviderAnswer>,
    ) -> Result<(), FinishError> {
        let mut done = claim.attempt("completed", None, false);
        done.provider = provider;
        let mut update = Entity::new();
        update.insert("Status".into(), json!("done"));
        update.insert("CompletedAt".into(), json!(now_rfc3339()));
        update.insert("LeaseUntil".into(), json!(""));
        // Done: earlier errors are history now, not a current error.
        update.insert("LastError".into(), json!(""));
        update.insert("History".into(), json!(history_with(&claim.history, done)));
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
    pub(crate) async fn record_failure_as(
        &self,
        claim: &ClaimedKey,
        outcome: &str,
        error: &str,
        uncertain: bool,
    ) -> Result<(), FinishError> {
        self.record_failure_with(claim, outcome, error, uncertain, Entity::new())
            .await
    }

    /// `record_failure_as` of an attempt that
    /// spends none of the job's attempts (the provider said "later" or
    /// "in progress", or it failed while the breaker holds: parked as a
    /// fresh copy): the claim is given back to the run's count.
    pub async fn record_failure_given_back(
        &self,
        claim: &ClaimedKey,
        outcome: &str,
        error: &str,
        uncertain: bool,
    ) -> Result<(), FinishError> {
        let mut update = Entity::new();
        update.insert(
            "RunAttempts".into(),
            json!(claim.run_attempts.saturating_sub(1)),
        );
        self.record_failure_with(claim, outcome, error, uncertain, update)
            .await
    }

    /// [`record_failure`](Self::record_failure) of an attempt whose job goes
    /// on as a fresh queue copy (`aqw serve`'s retry with backoff): the key
    /// keeps `carried`, the attempts spent so far, for the copy to count on.
    pub async fn record_failure_carried(
        &self,
        claim: &ClaimedKey,
        error: &str,
        uncertain: bool,
        carried: u32,
    ) -> Result<(), FinishError> {
        let mut update = Entity::new();
        update.insert("CarriedAttempts".into(), json!(carried));
        self.record_failure_with(claim, "retried", error, uncertain, update)
            .await
    }

    async fn record_failure_with(
        &self,
        claim: &ClaimedKey,
        outcome: &str,
        error: &str,
        uncertain: bool,
        mut update: Entity,
    ) -> Result<(), FinishError> {
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

    /// Test seam: set when `key`'s provider key was minted (`FirstSeen`), so
    /// a test can make a key older than a provider's window without waiting.
    #[cfg(feature = "failpoints")]
    #[doc(hidden)]
    pub async fn set_provider_key_minted_at(
        &self,
        function: &str,
        key: &IdempotencyKey,
        minted_at: OffsetDateTime,
    ) -> StorageResult<()> {
        let (pk, rk) = (key.partition_key(function), key.row_key());
        let mut update = Entity::new();
        update.insert("FirstSeen".into(), json!(fmt_time(minted_at)));
        self.table.merge(&pk, &rk, &update, None).await.map(|_| ())
    }

    /// Merge into a record this worker owns. A 412 is re-checked: our own
    /// retried write is success; anything else means the lease was lost.
    /// Write `update` to the key we hold, trying a refused or lost answer
    /// again (up to [`OWNED_WRITE_TRIES`] times): this write is what
    /// settles the claim (a success, a failure, a claim given back by a
    /// "later" or an "in progress"), and one left unwritten counts the
    /// claim as a crashed attempt, spending the job's budget for a fault of
    /// storage's (sim seeds 2139, 5453). A retried write whose first answer
    /// was lost after it applied is recognised by `merge_owned_once`.
    async fn merge_owned(&self, claim: &ClaimedKey, update: Entity) -> Result<Etag, FinishError> {
        let mut tries = 1;
        loop {
            match self.merge_owned_once(claim, &update).await {
                Err(FinishError::Storage(e)) if tries < OWNED_WRITE_TRIES && transient(&e) => {
                    tokio::time::sleep(Duration::from_millis(100 * u64::from(tries))).await;
                    tries += 1;
                }
                other => return other,
            }
        }
    }

    async fn merge_owned_once(
        &self,
        claim: &ClaimedKey,
        update: &Entity,
    ) -> Result<Etag, FinishError> {
        match self
            .table
            .merge(
                &claim.partition_key,
                &claim.row_key,
                update,
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
                        .merge(&claim.partition_key, &claim.row_key, update, Some(&etag))
                        .await?)
                } else {
                    Err(FinishError::LeaseLost)
                }
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// How many times a write to a held key is tried on a refused or lost
/// answer ([`KeyStore::merge_owned`]).
const OWNED_WRITE_TRIES: u32 = 3;

/// A storage answer worth trying again: the service refused for now (5xx,
/// 408, 429) or the answer never came (transport).
fn transient(e: &StorageError) -> bool {
    match e {
        StorageError::Http { status, .. } => *status >= 500 || matches!(status, 408 | 429),
        StorageError::Transport(_) => true,
        _ => false,
    }
}

/// Whether the key's record settles a message put at `inserted` without
/// running it: the key is settled, or the copy predates its poisoning
/// ([`put_before_poisoning`]). The one rule for the claim and, over a
/// message's delivery bound, for the job before any claim
/// (`job::key_state_of`), so both settle such a copy alike.
pub(crate) fn settles_copy(rec: &KeyRecord, inserted: OffsetDateTime) -> bool {
    rec.status.is_settled() || put_before_poisoning(rec, inserted)
}

/// Whether a message put at `inserted` predates its poisoned key's
/// poisoning (the newest `poisoned` attempt of the history): it belongs to
/// the run that was poisoned, and running it would start a second attempt
/// budget and a second poison record without anyone asking.
fn put_before_poisoning(rec: &KeyRecord, inserted: OffsetDateTime) -> bool {
    if rec.status != KeyStatus::Poisoned {
        return false;
    }
    rec.history
        .iter()
        .rev()
        .find(|a| a.outcome == "poisoned")
        .and_then(|a| {
            OffsetDateTime::parse(&a.at, &time::format_description::well_known::Rfc3339).ok()
        })
        .is_some_and(|poisoned_at| inserted + POISONING_MARGIN < poisoned_at)
}

/// How much earlier than the poisoning a message must have been put to
/// count as a leftover: the service writes insertion times in whole
/// seconds, on its own clock, so a replay put in the same second as the
/// poisoning (or under a little clock skew) must still run.
const POISONING_MARGIN: Duration = Duration::from_secs(2);
