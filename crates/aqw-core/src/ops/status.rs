//! `aqw status`: one line per queue.

use super::{OpsResult, QueueOps};
use crate::poison::{PoisonRecord, RecordStatus};
use crate::storage::StorageError;

/// One queue's line in `aqw status`.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueStatus {
    /// The function consuming the queue (empty when none does).
    pub function: String,
    /// The source queue.
    pub queue: String,
    /// Approximate messages on the queue (0 when it does not exist).
    pub depth: Option<u64>,
    /// Approximate messages on `<queue>-poison`.
    pub poison_depth: Option<u64>,
    /// Open poison records.
    pub open_records: usize,
    /// When the oldest open record was poisoned (RFC 3339).
    pub oldest_open: Option<String>,
    /// The newest poll heartbeat of any worker (`None`: none ever).
    pub last_poll: Option<String>,
    /// Workers whose heartbeat is recent (see `crate::heartbeat`).
    pub polling_workers: usize,
    /// The operator's pause and the breaker state a worker published.
    pub control: crate::control::Control,
    /// The call rate the function's replicas learned from its provider's
    /// throttling, as they share it on their evidence rows while throttled
    /// (`None`: no replica is throttled now).
    pub learned_rate: Option<crate::flow::adaptive::FleetRate>,
}

impl QueueStatus {
    /// Paused, or a breaker not closed: `aqw status` exits 1.
    pub fn held(&self) -> bool {
        self.control.pause.is_some() || self.control.breaker_open()
    }
}

/// `aqw status` for one queue: its depths, open records, control row and
/// heartbeats (importing the Functions host's raw poison copies first).
pub async fn status(ops: &QueueOps) -> OpsResult<QueueStatus> {
    let depth = match ops.source.approximate_count().await {
        Ok(n) => Some(n),
        Err(StorageError::NotFound) => Some(0),
        Err(e) => return Err(e.into()),
    };
    let poison_depth = Some(ops.poison.poison_depth().await?);
    // Import raw Functions-host copies first (peek: nothing changes visibility).
    ops.poison.scan(None).await?;
    let open: Vec<PoisonRecord> = ops
        .records()
        .await?
        .into_iter()
        .filter(|r| r.status == RecordStatus::Open)
        .collect();
    let oldest_open = open.iter().map(|r| r.poisoned_at.clone()).min();
    // The whole control partition in one query: the function's row and the
    // replicas' evidence rows, where a throttled replica shares its rate.
    let (control, learned_rate) = match &ops.function {
        Some(f) => {
            let mut rows = ops.control.all().await?;
            let now_ms = (crate::clock::now_utc().unix_timestamp_nanos() / 1_000_000) as i64;
            let rate = crate::flow::adaptive::fleet_rate(&rows.evidence, &f.name, None, now_ms);
            (rows.functions.remove(&f.name).unwrap_or_default(), rate)
        }
        None => Default::default(),
    };
    let beats = ops.heartbeats.last_polls(&ops.queue).await?;
    let now = crate::clock::now_utc();
    let polling_workers = beats
        .iter()
        .filter(|b| crate::heartbeat::is_recent(&b.last_poll, now))
        .count();
    Ok(QueueStatus {
        function: ops
            .function
            .as_ref()
            .map(|f| f.name.clone())
            .unwrap_or_default(),
        queue: ops.queue.clone(),
        depth,
        poison_depth,
        open_records: open.len(),
        oldest_open,
        control,
        learned_rate,
        last_poll: beats.first().map(|b| b.last_poll.clone()),
        polling_workers,
    })
}
