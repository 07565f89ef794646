//! [`OperationStore`]: every read and write of operation rows. Columns are
//! named here only; each write after the insert is conditional on the ETag
//! its caller read.

use super::{NewOperation, OpKind, OpState, Operation, Selection, PARTITION};
use crate::idempotency::fmt_time;
use crate::storage::{Entity, Etag, Filter, StorageError, StorageResult, TableQuery, TableStore};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use time::OffsetDateTime;

mod col {
    pub(super) const QUEUE: &str = "Queue";
    pub(super) const KIND: &str = "Kind";
    pub(super) const BY: &str = "By";
    pub(super) const CREATED_AT: &str = "CreatedAt";
    pub(super) const FUNCTION: &str = "SelFunction";
    pub(super) const ERROR: &str = "SelError";
    pub(super) const SINCE: &str = "SelSince";
    pub(super) const UNTIL: &str = "SelUntil";
    pub(super) const GROUP: &str = "SelGroup";
    pub(super) const SEARCH: &str = "SelSearch";
    pub(super) const LIMIT: &str = "SelLimit";
    pub(super) const PATCH: &str = "Patch";
    pub(super) const CUTOFF: &str = "Cutoff";
    pub(super) const FINGERPRINT: &str = "Fingerprint";
    pub(super) const SELECTED: &str = "Selected";
    pub(super) const RATE: &str = "Rate";
    pub(super) const HALT_AFTER: &str = "HaltAfter";
    pub(super) const REASON: &str = "Reason";
    pub(super) const CLOSE_KEY: &str = "CloseKey";
    pub(super) const PAST_WINDOW: &str = "PastProviderWindow";
    pub(super) const UNCERTAIN_CHECKED: &str = "UncertainChecked";
    pub(super) const STATE: &str = "State";
    pub(super) const DONE: &str = "Done";
    pub(super) const SKIPPED: &str = "Skipped";
    pub(super) const FAILED: &str = "Failed";
    pub(super) const RETURNED: &str = "ReturnedPoisoned";
    pub(super) const LAST_ERROR: &str = "LastError";
    pub(super) const STOP_REASON: &str = "StopReason";
    pub(super) const LEASE_OWNER: &str = "LeaseOwner";
    pub(super) const LEASE_UNTIL: &str = "LeaseUntil";
    pub(super) const UPDATED_AT: &str = "UpdatedAt";
    pub(super) const TAKEOVERS: &str = "Takeovers";
}

/// What a claim of an operation's lease gave.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// The lease is this executor's: the row and its new ETag.
    Taken(Box<Operation>, Etag),
    /// Its lease had expired once too often in a row
    /// ([`super::MAX_TAKEOVERS`]): the claim halted it instead (the row as
    /// written). Whoever claimed reports it.
    Halted(Box<Operation>),
    /// Not this executor's to run: someone else holds it, it is finished
    /// or of an unknown kind, or another executor won the race.
    No,
}

/// What an executor's checkpoint found.
#[derive(Debug, Clone, PartialEq)]
pub enum Refresh {
    /// Written: go on, at this version.
    Go(Etag),
    /// The row says stop (cancelled, another executor took the lease, or
    /// it vanished): the row as it now is, when there is one.
    Stop(Option<Box<Operation>>),
}

/// The operation rows of one control table.
#[derive(Clone)]
pub struct OperationStore {
    table: Arc<dyn TableStore>,
}

/// Free text (who, a reason, an error) as the row keeps it: secrets
/// removed, one line.
fn one_line(s: &str) -> String {
    crate::scrub::one_line(&crate::scrub::scrub(s))
}

impl OperationStore {
    /// The operation rows of `table` (the control table).
    pub fn new(table: Arc<dyn TableStore>) -> Self {
        Self { table }
    }

    /// Insert a new operation (state `queued`), creating the table if
    /// needed. Its id sorts by creation time.
    pub async fn create(&self, new: &NewOperation) -> StorageResult<Operation> {
        self.insert(new, None, None).await
    }

    /// [`Self::create`], the row holding `owner`'s lease from its insert: the
    /// creator that carries it out itself, so an idle worker looking for
    /// operations to resume cannot take it first.
    pub async fn create_held(
        &self,
        new: &NewOperation,
        owner: &str,
        lease: Duration,
    ) -> StorageResult<Operation> {
        self.insert(new, Some((owner, lease)), None).await
    }

    /// [`Self::create_held`] under the id `id` (from [`Self::new_id`], made
    /// before the row, e.g. when a reviewed form was shown), inserted only if
    /// absent: the same id twice creates one operation (a form submitted
    /// twice). The operation, and whether this call created it (`false`:
    /// the row an earlier call with this id made, as it is now).
    pub async fn create_held_once(
        &self,
        id: &str,
        new: &NewOperation,
        owner: &str,
        lease: Duration,
    ) -> StorageResult<(Operation, bool)> {
        match self.insert(new, Some((owner, lease)), Some(id)).await {
            Ok(op) => Ok((op, true)),
            Err(StorageError::Conflict) => match self.get(id).await? {
                Some((op, _)) => Ok((op, false)),
                None => Err(StorageError::Conflict),
            },
            Err(e) => Err(e),
        }
    }

    /// A new operation id, `20261206T201500-1a2b3c4d`: sorts by creation
    /// (or by when it was made, for [`Self::create_held_once`]), unique by its tail.
    pub fn new_id() -> String {
        let stamp = fmt_time(crate::clock::now_utc()).replace([':', '-', '.'], "");
        format!(
            "{}-{}",
            stamp.get(..15).unwrap_or(&stamp),
            &crate::entropy::uuid().simple().to_string()[..8]
        )
    }

    /// Whether `id` could name an operation: what [`Self::new_id`] makes
    /// ids of (ASCII letters, digits, `-`, `_`), at most 64 of them, so it
    /// is safe as a RowKey and in a URL. Anything else names none: answer
    /// "no such operation" without asking storage (issue 48: `a%2Fb` in
    /// the path reached storage, which answered HTTP 500).
    pub fn is_id(id: &str) -> bool {
        !id.is_empty()
            && id.len() <= 64
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    }

    async fn insert(
        &self,
        new: &NewOperation,
        held: Option<(&str, Duration)>,
        id: Option<&str>,
    ) -> StorageResult<Operation> {
        let now = crate::clock::now_utc();
        let id = id.map_or_else(Self::new_id, str::to_string);
        let mut selection = new.selection.clone();
        // The creator's own cutoff, when it counted the records with one
        // (so the fingerprint and the operation agree), else now.
        if selection.cutoff.is_empty() {
            selection.cutoff = fmt_time(now);
        }
        let op = Operation {
            id,
            queue: new.queue.clone(),
            kind: new.kind.clone(),
            by: one_line(&new.by),
            created_at: fmt_time(now),
            selection,
            fingerprint: new.fingerprint.clone(),
            selected: new.selected,
            rate: new.rate.max(super::MIN_RATE),
            halt_after: new.halt_after,
            state: OpState::Queued,
            done: 0,
            skipped: 0,
            failed: 0,
            returned_poisoned: 0,
            takeovers: 0,
            last_error: None,
            stop_reason: None,
            lease_owner: held.map(|(o, _)| one_line(o)),
            lease_until: held.map(|(_, l)| fmt_time(now + l)),
            updated_at: fmt_time(now),
        };
        let mut entity = to_entity(&op);
        if let (Some(o), Some(u)) = (&op.lease_owner, &op.lease_until) {
            entity.insert(col::LEASE_OWNER.into(), json!(o));
            entity.insert(col::LEASE_UNTIL.into(), json!(u));
        }
        match self.table.insert(PARTITION, &op.id, &entity).await {
            Err(StorageError::NotFound) => {
                self.table.create_if_missing().await?;
                self.table.insert(PARTITION, &op.id, &entity).await?;
            }
            other => {
                other?;
            }
        }
        Ok(op)
    }

    /// The operation `id` with its ETag.
    pub async fn get(&self, id: &str) -> StorageResult<Option<(Operation, Etag)>> {
        match self.table.get(PARTITION, id).await {
            Ok(found) => Ok(found.map(|(e, etag)| (from_entity(id, &e), etag))),
            Err(StorageError::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every operation, newest first (one partition query).
    pub async fn list(&self) -> StorageResult<Vec<Operation>> {
        self.query(None).await
    }

    /// The operations not yet finished (queued or running), newest first:
    /// what an idle worker looks at, one query whatever the history.
    pub(crate) async fn unfinished(&self) -> StorageResult<Vec<Operation>> {
        let states = [OpState::Queued.as_str(), OpState::Running.as_str()];
        self.query(Some(Filter::one_of(col::STATE, &states))).await
    }

    async fn query(&self, filter: Option<Filter>) -> StorageResult<Vec<Operation>> {
        let query = TableQuery {
            partition: Some(PARTITION),
            filter,
            select: &[],
        };
        match self.table.query_where(&query).await {
            Ok(rows) => {
                let mut ops: Vec<Operation> = rows
                    .iter()
                    .map(|r| from_entity(&r.row_key, &r.entity))
                    .collect();
                ops.sort_by(|a, b| b.id.cmp(&a.id));
                Ok(ops)
            }
            Err(StorageError::NotFound) => Ok(vec![]),
            Err(e) => Err(e),
        }
    }

    /// Cancel `id` on behalf of `by`: the executor sees it before its next
    /// record. `Err` with why when it is unknown or already finished.
    pub async fn cancel(
        &self,
        id: &str,
        by: &str,
    ) -> StorageResult<Result<Operation, CancelRefusal>> {
        let id_ = || id.to_string();
        loop {
            let Some((op, etag)) = self.get(id).await? else {
                return Ok(Err(CancelRefusal::Unknown { id: id_() }));
            };
            if op.state.is_final() {
                return Ok(Err(CancelRefusal::Finished {
                    id: id_(),
                    state: op.state,
                }));
            }
            let why = format!("cancelled by {}", one_line(by));
            let update = stop_update(OpState::Cancelled, &why);
            match self.table.merge(PARTITION, id, &update, Some(&etag)).await {
                Ok(_) => {
                    let now = self.get(id).await?.map(|(o, _)| o);
                    return Ok(now.ok_or_else(|| CancelRefusal::Vanished { id: id_() }));
                }
                Err(StorageError::PreconditionFailed) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Take the lease of `id` for `owner` until `now + lease`, when the
    /// operation is not finished and its lease is free (or already
    /// `owner`'s), under the ETag read. `take_over` takes a lease still held
    /// (an operator who knows its holder is gone): safe, since the holder's
    /// next checkpoint then fails on the ETag and it stops, and each
    /// record's close is ETag-guarded.
    ///
    /// Taking an expired lease from another holder (its executor died
    /// holding it) counts a take-over on the row, in the same write; the
    /// claim that would be take-over number [`super::MAX_TAKEOVERS`] + 1
    /// with no checkpoint between them halts the operation instead
    /// (`crashed executors`): an operation that kills whoever runs it is
    /// not handed from worker to worker for ever.
    pub async fn claim(
        &self,
        id: &str,
        owner: &str,
        lease: Duration,
        take_over: bool,
    ) -> StorageResult<Claim> {
        let Some((mut op, etag)) = self.get(id).await? else {
            return Ok(Claim::No);
        };
        let now = crate::clock::now_utc();
        let mine = op.lease_owner.as_deref() == Some(owner);
        let unknown = matches!(op.kind, OpKind::Unknown { .. });
        if unknown || op.state.is_final() || !(mine || take_over || op.lease_free(now)) {
            return Ok(Claim::No);
        }
        let dead_holder = !mine && op.lease_owner.is_some() && op.lease_free(now);
        let takeovers = op.takeovers.saturating_add(u32::from(dead_holder));
        if takeovers > super::MAX_TAKEOVERS {
            return self.halt_crashed(op, &etag, owner).await;
        }
        let mut u = lease_update(owner, now, lease);
        u.insert(col::STATE.into(), json!(OpState::Running.as_str()));
        u.insert(col::TAKEOVERS.into(), json!(takeovers));
        match self.table.merge(PARTITION, id, &u, Some(&etag)).await {
            Ok(etag) => {
                op.state = OpState::Running;
                op.lease_owner = Some(owner.to_string());
                op.takeovers = takeovers;
                Ok(Claim::Taken(Box::new(op), etag))
            }
            Err(StorageError::PreconditionFailed) => Ok(Claim::No),
            Err(e) => Err(e),
        }
    }

    /// Halt `op`, whose executors died holding its lease once too often
    /// in a row, under `etag`; `Claim::No` when someone else wrote first.
    async fn halt_crashed(&self, mut op: Operation, etag: &Etag, by: &str) -> StorageResult<Claim> {
        let why = format!(
            "crashed executors: its lease expired {} times in a row with no progress between (last held by {}); found by {}",
            op.takeovers.saturating_add(1),
            op.lease_owner.as_deref().unwrap_or("?"),
            by
        );
        let mut u = stop_update(OpState::Halted, &why);
        u.insert(
            col::LEASE_UNTIL.into(),
            json!(fmt_time(crate::clock::now_utc())),
        );
        match self.table.merge(PARTITION, &op.id, &u, Some(etag)).await {
            Ok(_) => {
                op.state = OpState::Halted;
                op.stop_reason = Some(one_line(&why));
                Ok(Claim::Halted(Box::new(op)))
            }
            Err(StorageError::PreconditionFailed) => Ok(Claim::No),
            Err(e) => Err(e),
        }
    }

    /// The executor's write after each record: its counts and a renewed
    /// lease, conditional on `etag`. A 412 means someone else wrote the
    /// row: a cancel, or another executor that took an expired lease. A
    /// checkpoint is progress: the take-overs in a row start again at 0,
    /// so an operation resumed across rolling restarts is never halted.
    pub async fn checkpoint(
        &self,
        op: &Operation,
        etag: &Etag,
        lease: Duration,
    ) -> StorageResult<Refresh> {
        let owner = op.lease_owner.as_deref().unwrap_or_default();
        let mut u = lease_update(owner, crate::clock::now_utc(), lease);
        counts_into(&mut u, op);
        u.insert(col::TAKEOVERS.into(), json!(0));
        self.write_or_stop(op, etag, u).await
    }

    /// After a stop the executor did not write (a cancel): its counts, when
    /// the lease is still its own (not taken over), conditional on the row
    /// as read now; the row as written, or `None` when it was not ours or
    /// changed again (the counts then stay as they were: the records are
    /// the truth).
    pub(crate) async fn add_counts(&self, op: &Operation) -> StorageResult<Option<Operation>> {
        let Some((now, etag)) = self.get(&op.id).await? else {
            return Ok(None);
        };
        if now.lease_owner != op.lease_owner {
            return Ok(None);
        }
        let mut u = Entity::new();
        counts_into(&mut u, op);
        match self.table.merge(PARTITION, &op.id, &u, Some(&etag)).await {
            Ok(_) => Ok(self.get(&op.id).await?.map(|(o, _)| o)),
            Err(StorageError::PreconditionFailed) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The executor's last write: `state` (done, halted or failed), the
    /// counts, `reason`, and the lease let go.
    pub(crate) async fn finish(
        &self,
        op: &Operation,
        etag: &Etag,
        state: OpState,
        reason: Option<&str>,
    ) -> StorageResult<Refresh> {
        let mut u = stop_update(state, reason.unwrap_or_default());
        if reason.is_none() {
            u.remove(col::STOP_REASON);
        }
        counts_into(&mut u, op);
        u.insert(
            col::LEASE_UNTIL.into(),
            json!(fmt_time(crate::clock::now_utc())),
        );
        self.write_or_stop(op, etag, u).await
    }

    /// Merge `u` under `etag`. A 412 is someone else's write (a cancel, a
    /// take-over: stop), or this executor's own earlier write that the
    /// transport retried after a lost answer: the row then still says
    /// running under this executor's lease, and the write is made again
    /// under the row's new ETag.
    async fn write_or_stop(
        &self,
        op: &Operation,
        etag: &Etag,
        u: Entity,
    ) -> StorageResult<Refresh> {
        let mut etag = etag.clone();
        for _ in 0..3 {
            match self.table.merge(PARTITION, &op.id, &u, Some(&etag)).await {
                Ok(etag) => return Ok(Refresh::Go(etag)),
                Err(StorageError::PreconditionFailed) | Err(StorageError::NotFound) => {}
                Err(e) => return Err(e),
            }
            match self.get(&op.id).await? {
                Some((now, e))
                    if now.state == OpState::Running && now.lease_owner == op.lease_owner =>
                {
                    etag = e;
                }
                now => return Ok(Refresh::Stop(now.map(|(o, _)| Box::new(o)))),
            }
        }
        let now = self.get(&op.id).await?.map(|(o, _)| Box::new(o));
        Ok(Refresh::Stop(now))
    }
}

fn lease_update(owner: &str, now: OffsetDateTime, lease: Duration) -> Entity {
    let mut u = Entity::new();
    u.insert(col::LEASE_OWNER.into(), json!(one_line(owner)));
    u.insert(col::LEASE_UNTIL.into(), json!(fmt_time(now + lease)));
    u.insert(col::UPDATED_AT.into(), json!(fmt_time(now)));
    u
}

fn stop_update(state: OpState, reason: &str) -> Entity {
    let mut u = Entity::new();
    u.insert(col::STATE.into(), json!(state.as_str()));
    u.insert(col::STOP_REASON.into(), json!(one_line(reason)));
    u.insert(
        col::UPDATED_AT.into(),
        json!(fmt_time(crate::clock::now_utc())),
    );
    u
}

fn counts_into(u: &mut Entity, op: &Operation) {
    u.insert(col::DONE.into(), json!(op.done));
    u.insert(col::SKIPPED.into(), json!(op.skipped));
    u.insert(col::FAILED.into(), json!(op.failed));
    u.insert(col::RETURNED.into(), json!(op.returned_poisoned));
    if let Some(e) = &op.last_error {
        u.insert(col::LAST_ERROR.into(), json!(one_line(e)));
    }
}

fn to_entity(op: &Operation) -> Entity {
    let mut e = Entity::new();
    let mut put = |k: &str, v: Value| {
        e.insert(k.into(), v);
    };
    put(col::QUEUE, json!(op.queue));
    put(col::KIND, json!(op.kind.name()));
    put(col::BY, json!(op.by));
    put(col::CREATED_AT, json!(op.created_at));
    let s = &op.selection;
    for (k, v) in [
        (col::FUNCTION, &s.function),
        (col::ERROR, &s.error),
        (col::SINCE, &s.since),
        (col::UNTIL, &s.until),
        (col::GROUP, &s.group),
        (col::SEARCH, &s.search),
    ] {
        if let Some(v) = v {
            put(k, json!(v));
        }
    }
    if let Some(l) = s.limit {
        put(col::LIMIT, json!(l));
    }
    put(col::CUTOFF, json!(s.cutoff));
    put(col::FINGERPRINT, json!(op.fingerprint));
    put(col::SELECTED, json!(op.selected));
    put(col::RATE, json!(op.rate));
    put(col::HALT_AFTER, json!(op.halt_after));
    match &op.kind {
        OpKind::Replay {
            past_provider_window,
            uncertain_checked,
        } => {
            put(col::PAST_WINDOW, json!(past_provider_window));
            put(col::UNCERTAIN_CHECKED, json!(uncertain_checked));
        }
        OpKind::Discard { reason, close_key } => {
            put(col::REASON, json!(one_line(reason)));
            put(col::CLOSE_KEY, json!(close_key));
        }
        OpKind::Fix {
            patch,
            past_provider_window,
        } => {
            put(col::PATCH, json!(patch));
            put(col::PAST_WINDOW, json!(past_provider_window));
        }
        // Never written: an unknown kind is only ever read.
        OpKind::Unknown { .. } => {}
    }
    put(col::STATE, json!(op.state.as_str()));
    put(col::UPDATED_AT, json!(op.updated_at));
    let mut e2 = e;
    counts_into(&mut e2, op);
    e2
}

fn from_entity(id: &str, e: &Entity) -> Operation {
    let s = |k: &str| e.get(k).and_then(Value::as_str).map(str::to_string);
    let n = |k: &str| e.get(k).and_then(Value::as_u64).unwrap_or(0);
    let kind = kind_of(e);
    Operation {
        id: id.to_string(),
        queue: s(col::QUEUE).unwrap_or_default(),
        kind,
        by: s(col::BY).unwrap_or_default(),
        created_at: s(col::CREATED_AT).unwrap_or_default(),
        selection: Selection {
            function: s(col::FUNCTION),
            error: s(col::ERROR),
            since: s(col::SINCE),
            until: s(col::UNTIL),
            group: s(col::GROUP),
            search: s(col::SEARCH),
            limit: e.get(col::LIMIT).and_then(Value::as_u64),
            cutoff: s(col::CUTOFF).unwrap_or_default(),
        },
        fingerprint: s(col::FINGERPRINT).unwrap_or_default(),
        selected: n(col::SELECTED),
        rate: e
            .get(col::RATE)
            .and_then(Value::as_f64)
            .unwrap_or(super::DEFAULT_RATE),
        halt_after: n(col::HALT_AFTER) as u32,
        // An unknown state is read as failed: never run by a worker that
        // does not understand it.
        state: s(col::STATE)
            .and_then(|st| OpState::parse(&st))
            .unwrap_or(OpState::Failed),
        done: n(col::DONE),
        skipped: n(col::SKIPPED),
        failed: n(col::FAILED),
        returned_poisoned: n(col::RETURNED),
        // A row written before the column existed: none counted.
        takeovers: u32::try_from(n(col::TAKEOVERS)).unwrap_or(u32::MAX),
        last_error: s(col::LAST_ERROR),
        stop_reason: s(col::STOP_REASON).filter(|r| !r.is_empty()),
        lease_owner: s(col::LEASE_OWNER),
        lease_until: s(col::LEASE_UNTIL),
        updated_at: s(col::UPDATED_AT).unwrap_or_default(),
    }
}

/// The kind a row names. A kind this aqw does not know is kept as such and
/// never run: read as a replay it would do the wrong thing to every record.
fn kind_of(e: &Entity) -> OpKind {
    let s = |k: &str| e.get(k).and_then(Value::as_str).map(str::to_string);
    let b = |k: &str| e.get(k).and_then(Value::as_bool).unwrap_or(false);
    match s(col::KIND).as_deref() {
        Some("discard") => OpKind::Discard {
            reason: s(col::REASON).unwrap_or_default(),
            close_key: b(col::CLOSE_KEY),
        },
        Some("replay") => OpKind::Replay {
            past_provider_window: b(col::PAST_WINDOW),
            uncertain_checked: b(col::UNCERTAIN_CHECKED),
        },
        Some("fix") => OpKind::Fix {
            patch: s(col::PATCH).unwrap_or_default(),
            past_provider_window: b(col::PAST_WINDOW),
        },
        other => OpKind::Unknown {
            name: other.unwrap_or_default().to_string(),
        },
    }
}

/// Why an operation was not cancelled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CancelRefusal {
    /// No operation has this id.
    #[error("no operation {id}")]
    Unknown {
        /// The id asked for.
        id: String,
    },
    /// It has already finished (done, failed or cancelled).
    #[error("operation {id} is already {}", .state.as_str())]
    Finished {
        /// The id.
        id: String,
        /// Its final state.
        state: super::OpState,
    },
    /// Its row went away during the cancel.
    #[error("operation {id} vanished")]
    Vanished {
        /// The id.
        id: String,
    },
}
