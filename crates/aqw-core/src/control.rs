//! The control row of each function, in its own table (`aqw.tables.control`,
//! `aqwcontrol` by default; PartitionKey `function`, RowKey the function's
//! name): whether an operator paused it (by whom, when, why), and the
//! breaker state the last worker to change it published. Every worker and
//! `aqw serve` read it every [`WATCH_INTERVAL`]; `aqw status` reads it once.
//! [`ControlStore`] is the only code that knows its columns.

use crate::idempotency::now_rfc3339;
use crate::storage::{Entity, StorageError, StorageResult, TableStore};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// How often a running function reads its control row: a pause or resume
/// is honoured within this (plus one in-flight receive), at one partition
/// query per worker per interval for all its functions.
pub const WATCH_INTERVAL: Duration = Duration::from_secs(2);

const PARTITION: &str = "function";

/// What separates a function's name from the rest of an evidence row's key.
const EVIDENCE_INFIX: &str = "~evidence~";

/// The longest `Failing` column read back: [`crate::breaker::evidence::MAX_TRACKED`]
/// entries of at most 46 characters, with room.
const MAX_FAILING_TEXT: usize = 4096;

mod col {
    pub(super) const PAUSED: &str = "Paused";
    pub(super) const PAUSED_BY: &str = "PausedBy";
    pub(super) const PAUSED_AT: &str = "PausedAt";
    pub(super) const PAUSE_REASON: &str = "PauseReason";
    pub(super) const RESUMED_BY: &str = "ResumedBy";
    pub(super) const RESUMED_AT: &str = "ResumedAt";
    pub(super) const BREAKER: &str = "BreakerState";
    pub(super) const BREAKER_AT: &str = "BreakerChangedAt";
    pub(super) const BREAKER_REASON: &str = "BreakerReason";
    pub(super) const BREAKER_WORKER: &str = "BreakerWorker";
    pub(super) const BREAKER_COOL_DOWN: &str = "BreakerCoolDownSeconds";
    pub(super) const BREAKER_PROBE_CLOSED_AT: &str = "BreakerProbeClosedAt";
    pub(super) const EV_AT: &str = "EvidenceAtMs";
    pub(super) const EV_SUCCESSES: &str = "Successes";
    pub(super) const EV_LAST_SUCCESS: &str = "LastSuccessMs";
    pub(super) const EV_FAILING: &str = "Failing";
    pub(super) const EV_RATE: &str = "LearnedRate";
}

/// The highest rate an evidence row may carry (calls/s): anything above is input
/// gone wrong, ignored.
const MAX_SHARED_RATE: f64 = 1_000_000.0;

/// One replica's breaker evidence for one function, as published. Times
/// are Unix milliseconds on the publisher's clock.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EvidenceRow {
    /// The function.
    pub function: String,
    /// The publishing replica (a hash of its worker id).
    pub(crate) replica: String,
    /// When it was written.
    pub(crate) at_ms: i64,
    /// Its successes in the breaker's window.
    pub(crate) successes: u32,
    /// Its last success.
    pub last_success_ms: Option<i64>,
    /// Its distinct failing jobs: each job, its first and latest failure.
    pub(crate) failing: Vec<(u64, i64, i64)>,
    /// The call rate its adaptive rate learned (calls/s), while its
    /// provider throttles it ([`crate::flow::adaptive::SHARE_FOR`]).
    pub(crate) rate: Option<f64>,
}

impl EvidenceRow {
    fn row_key(function: &str, replica: &str) -> String {
        format!("{function}{EVIDENCE_INFIX}{replica}")
    }

    fn to_entity(&self) -> Entity {
        let failing: Vec<String> = self
            .failing
            .iter()
            .map(|(job, first, last)| format!("{job:016x}:{first}:{last}"))
            .collect();
        let mut e = Entity::new();
        e.insert(col::EV_AT.into(), json!(self.at_ms));
        e.insert(col::EV_SUCCESSES.into(), json!(self.successes));
        // Always written (0: none), since a merge keeps what it does not name.
        e.insert(
            col::EV_LAST_SUCCESS.into(),
            json!(self.last_success_ms.unwrap_or(0)),
        );
        e.insert(col::EV_FAILING.into(), json!(failing.join(",")));
        // Always written (0: none), like the last success.
        e.insert(col::EV_RATE.into(), json!(self.rate.unwrap_or(0.0)));
        e
    }

    /// A row read back: input like any other (another version, a hand
    /// edit): malformed entries are skipped and sizes bounded.
    fn from_entity(row_key: &str, e: &Entity) -> Option<Self> {
        let (function, replica) = row_key.split_once(EVIDENCE_INFIX)?;
        let int = |k: &str| e.get(k).and_then(|v| v.as_i64());
        let text = e
            .get(col::EV_FAILING)
            .and_then(|v| v.as_str())
            .unwrap_or("");
        let failing = if text.len() > MAX_FAILING_TEXT {
            Vec::new()
        } else {
            text.split(',')
                .filter_map(|p| {
                    let mut parts = p.splitn(3, ':');
                    let job = u64::from_str_radix(parts.next()?, 16).ok()?;
                    let first: i64 = parts.next()?.parse().ok()?;
                    let last: i64 = parts.next()?.parse().ok()?;
                    Some((job, first.min(last), last))
                })
                .take(crate::breaker::evidence::MAX_TRACKED)
                .collect()
        };
        Some(Self {
            function: function.to_string(),
            replica: replica.to_string(),
            at_ms: int(col::EV_AT)?,
            successes: int(col::EV_SUCCESSES)
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(0),
            last_success_ms: int(col::EV_LAST_SUCCESS).filter(|t| *t > 0),
            failing,
            rate: e
                .get(col::EV_RATE)
                .and_then(|v| v.as_f64())
                .filter(|r| r.is_finite() && *r > 0.0 && *r <= MAX_SHARED_RATE),
        })
    }
}

/// Every control row of the partition, read once: each function's row, and
/// the evidence rows of every replica.
#[derive(Debug, Clone, Default)]
pub struct ControlRows {
    /// Each function's control row, by name.
    pub functions: std::collections::HashMap<String, Control>,
    /// The evidence rows, as read.
    pub evidence: Vec<EvidenceRow>,
}

/// An operator's pause.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Pause {
    /// Who paused it.
    pub by: String,
    /// When (RFC 3339).
    pub at: String,
    /// Why, in the operator's words.
    pub reason: String,
}

/// The breaker state a worker published.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PublishedBreaker {
    /// `closed`, `open` or `half-open`.
    pub state: String,
    /// When it changed (RFC 3339).
    pub at: String,
    /// Why: the transition's summary (or the resume that marked it closed).
    pub reason: String,
    /// The id of the worker that published it.
    pub worker: String,
    /// How long the publisher's breaker stays open (an `open` row), so
    /// the replicas following it wait as long.
    #[serde(skip)]
    pub(crate) cool_down: Option<Duration>,
    /// When a worker's probe last closed it (RFC 3339): a column of its
    /// own, which later states' writes leave alone, so a replica that
    /// published over a close it never read still learns of it.
    #[serde(skip)]
    pub(crate) probe_closed_at: Option<String>,
}

/// One function's control row, read.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Control {
    /// The operator's pause; `None` when not paused.
    pub pause: Option<Pause>,
    /// The breaker state last published; `None` when no worker published one.
    pub breaker: Option<PublishedBreaker>,
}

impl Control {
    /// True when the breaker someone published is not closed.
    pub fn breaker_open(&self) -> bool {
        self.breaker.as_ref().is_some_and(|b| b.state != "closed")
    }

    fn from_entity(e: &Entity) -> Self {
        let s = |k: &str| e.get(k).and_then(|v| v.as_str()).unwrap_or("").to_string();
        let paused = e.get(col::PAUSED).and_then(|v| v.as_bool()) == Some(true);
        let pause = paused.then(|| Pause {
            by: s(col::PAUSED_BY),
            at: s(col::PAUSED_AT),
            reason: s(col::PAUSE_REASON),
        });
        let breaker = e.contains_key(col::BREAKER).then(|| PublishedBreaker {
            state: s(col::BREAKER),
            at: s(col::BREAKER_AT),
            reason: s(col::BREAKER_REASON),
            worker: s(col::BREAKER_WORKER),
            cool_down: e
                .get(col::BREAKER_COOL_DOWN)
                .and_then(|v| v.as_f64())
                .filter(|s| s.is_finite() && *s >= 0.0 && *s <= 7.0 * 86_400.0)
                .map(Duration::from_secs_f64),
            probe_closed_at: e
                .get(col::BREAKER_PROBE_CLOSED_AT)
                .and_then(|v| v.as_str())
                .filter(|t| t.len() <= 64)
                .map(str::to_string),
        });
        Self { pause, breaker }
    }
}

/// Every read and write of control rows.
#[derive(Clone)]
pub struct ControlStore {
    table: Arc<dyn TableStore>,
}

impl ControlStore {
    /// The control rows of `table`.
    pub fn new(table: Arc<dyn TableStore>) -> Self {
        Self { table }
    }

    /// Create the control table if it does not exist.
    pub async fn create_if_missing(&self) -> StorageResult<()> {
        self.table.create_if_missing().await
    }

    /// The function's control row; the default when there is none (or no
    /// table yet).
    pub async fn get(&self, function: &str) -> StorageResult<Control> {
        match self.table.get(PARTITION, function).await {
            Ok(Some((e, _))) => Ok(Control::from_entity(&e)),
            Ok(None) | Err(StorageError::NotFound) => Ok(Control::default()),
            Err(e) => Err(e),
        }
    }

    /// Pause `function`: recorded with who, when and why; workers stop
    /// receiving within [`WATCH_INTERVAL`].
    pub async fn pause(&self, function: &str, by: &str, reason: &str) -> StorageResult<()> {
        let mut u = Entity::new();
        u.insert(col::PAUSED.into(), json!(true));
        // Neutralised on the way in too: one line, no control characters.
        u.insert(col::PAUSED_BY.into(), json!(crate::scrub::one_line(by)));
        u.insert(col::PAUSED_AT.into(), json!(now_rfc3339()));
        u.insert(
            col::PAUSE_REASON.into(),
            json!(crate::scrub::one_line(reason)),
        );
        self.upsert(function, u).await
    }

    /// Lift the pause. A breaker state left open by a worker that has
    /// stopped would keep `aqw status` at exit 1 for ever, so a resume
    /// also marks it closed; a live worker whose breaker is still open
    /// publishes `open` again at its next failed probe.
    pub async fn resume(&self, function: &str, by: &str) -> StorageResult<()> {
        let mut u = Entity::new();
        let now = now_rfc3339();
        u.insert(col::PAUSED.into(), json!(false));
        u.insert(col::RESUMED_BY.into(), json!(by));
        u.insert(col::RESUMED_AT.into(), json!(now));
        if self.get(function).await?.breaker_open() {
            u.insert(col::BREAKER.into(), json!("closed"));
            u.insert(col::BREAKER_AT.into(), json!(now));
            u.insert(
                col::BREAKER_REASON.into(),
                json!(format!("marked closed by aqw resume ({by})")),
            );
        }
        self.upsert(function, u).await
    }

    /// A worker's breaker changed state: last writer wins, which is the
    /// most recent transition of any worker.
    pub async fn publish_breaker(
        &self,
        function: &str,
        state: &str,
        reason: &str,
        worker: &str,
        cool_down: Option<Duration>,
    ) -> StorageResult<()> {
        let mut u = Entity::new();
        u.insert(col::BREAKER.into(), json!(state));
        // Written with every opening (a later `open` row always carries its
        // own); other states leave it as it was: nulls are not stored.
        if let Some(d) = cool_down {
            u.insert(col::BREAKER_COOL_DOWN.into(), json!(d.as_secs_f64()));
        }
        let now = now_rfc3339();
        // A probe's success: kept apart from the state, which the next
        // writer overwrites (seed 6936).
        if state == "closed" {
            u.insert(col::BREAKER_PROBE_CLOSED_AT.into(), json!(now));
        }
        u.insert(col::BREAKER_AT.into(), json!(now));
        u.insert(col::BREAKER_REASON.into(), json!(reason));
        u.insert(col::BREAKER_WORKER.into(), json!(worker));
        self.upsert(function, u).await
    }

    /// Every function's control row, in one partition query (the watch of
    /// a worker's functions costs one request per interval, whatever their
    /// number). A missing table is no rows.
    pub async fn all(&self) -> StorageResult<ControlRows> {
        let query = crate::storage::TableQuery {
            partition: Some(PARTITION),
            ..Default::default()
        };
        let rows = match self.table.query_where(&query).await {
            Ok(rows) => rows,
            Err(StorageError::NotFound) => return Ok(Default::default()),
            Err(e) => return Err(e),
        };
        let mut all = ControlRows::default();
        for r in rows {
            if r.row_key.contains(EVIDENCE_INFIX) {
                all.evidence
                    .extend(EvidenceRow::from_entity(&r.row_key, &r.entity));
            } else {
                all.functions
                    .insert(r.row_key, Control::from_entity(&r.entity));
            }
        }
        Ok(all)
    }

    /// Publish this replica's evidence for a function (one upsert).
    pub(crate) async fn publish_evidence(&self, row: &EvidenceRow) -> StorageResult<()> {
        self.upsert(
            &EvidenceRow::row_key(&row.function, &row.replica),
            row.to_entity(),
        )
        .await
    }

    /// Remove a replica's evidence row (it has nothing to say any more, or
    /// its replica is long gone); a row already gone is fine.
    pub(crate) async fn delete_evidence(&self, function: &str, replica: &str) -> StorageResult<()> {
        let rk = EvidenceRow::row_key(function, replica);
        match self.table.delete(PARTITION, &rk).await {
            Ok(_) | Err(StorageError::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The table these rows live in (to tell which gates share one).
    pub fn table(&self) -> &Arc<dyn TableStore> {
        &self.table
    }

    /// Merge into the row, creating it (and the table) when missing.
    async fn upsert(&self, function: &str, update: Entity) -> StorageResult<()> {
        for _ in 0..3 {
            match self.table.merge(PARTITION, function, &update, None).await {
                Ok(_) => return Ok(()),
                Err(StorageError::NotFound) => {}
                Err(e) => return Err(e),
            }
            match self.table.insert(PARTITION, function, &update).await {
                Ok(_) => return Ok(()),
                // Someone inserted it meanwhile: merge again.
                Err(StorageError::Conflict) => continue,
                Err(StorageError::NotFound) => self.table.create_if_missing().await?,
                Err(e) => return Err(e),
            }
        }
        Err(StorageError::Conflict)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_evidence_row_round_trips_and_a_bad_rate_is_none() {
        let row = EvidenceRow {
            function: "F".into(),
            replica: "00ab".into(),
            at_ms: 1_000,
            successes: 3,
            last_success_ms: Some(900),
            failing: vec![(0xabc, 10, 20)],
            rate: Some(0.75),
        };
        let key = EvidenceRow::row_key("F", "00ab");
        let mut e = row.to_entity();
        assert_eq!(EvidenceRow::from_entity(&key, &e), Some(row.clone()));
        for bad in [json!(0.0), json!(-1.0), json!(1e300), json!("fast")] {
            e.insert(col::EV_RATE.into(), bad);
            let back = EvidenceRow::from_entity(&key, &e).unwrap();
            assert_eq!(back.rate, None);
            assert_eq!(back.failing, row.failing, "the rest still reads");
        }
        let none = EvidenceRow { rate: None, ..row };
        assert_eq!(
            EvidenceRow::from_entity(&key, &none.to_entity()),
            Some(none)
        );
    }
}
