//! Poll heartbeats: each `aqw run` worker writes, at most once a minute per
//! queue, the time it last polled that queue (one row per queue and worker,
//! in the `aqw.tables.heartbeats` table). `aqw status` reads them to say
//! whether anything is consuming a queue. A heartbeat costs one upsert a
//! minute per queue and worker, nothing per message.

use crate::storage::{Entity, StorageError, StorageResult, TableStore};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use time::OffsetDateTime;
use tokio::time::Instant;

/// How often a worker writes its heartbeat for one queue.
pub(crate) const HEARTBEAT_EVERY: Duration = Duration::from_secs(60);

/// A worker whose last poll is older than this is reported as not polling
/// (three missed heartbeats: a slow poll or a storage blip is not an alarm).
const HEARTBEAT_STALE: Duration = Duration::from_secs(180);

/// One worker's last poll of a queue.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Heartbeat {
    /// The worker's id.
    pub worker: String,
    /// RFC 3339.
    pub(crate) last_poll: String,
}

/// The heartbeat table: partition = queue, row = worker id.
#[derive(Clone)]
pub struct HeartbeatStore {
    table: Arc<dyn TableStore>,
}

impl HeartbeatStore {
    /// The heartbeats of `table`.
    pub fn new(table: Arc<dyn TableStore>) -> Self {
        Self { table }
    }

    /// The table the heartbeats are in.
    pub(crate) fn table(&self) -> &Arc<dyn TableStore> {
        &self.table
    }

    /// Record that `worker` polled `queue` now (an upsert).
    pub(crate) async fn beat(&self, queue: &str, worker: &str) -> StorageResult<()> {
        let mut e = Entity::new();
        let now = crate::idempotency::fmt_time(crate::clock::now_utc());
        e.insert("LastPoll".into(), json!(now));
        // Merge is update-only here (`If-Match: *`): the first beat inserts.
        match self.table.merge(queue, worker, &e, None).await {
            Err(StorageError::NotFound) => match self.table.insert(queue, worker, &e).await {
                Err(StorageError::Conflict) => self.table.merge(queue, worker, &e, None).await,
                other => other,
            },
            other => other,
        }
        .map(|_| ())
    }

    /// Every worker's last poll of `queue`, newest first (none when the
    /// table does not exist yet).
    pub async fn last_polls(&self, queue: &str) -> StorageResult<Vec<Heartbeat>> {
        let rows = match self.table.query(Some(queue)).await {
            Ok(rows) => rows,
            Err(StorageError::NotFound) => return Ok(vec![]),
            Err(e) => return Err(e),
        };
        let mut beats: Vec<Heartbeat> = rows
            .into_iter()
            .filter_map(|(_, worker, e)| {
                let last_poll = e.get("LastPoll").and_then(Value::as_str)?.to_string();
                Some(Heartbeat { worker, last_poll })
            })
            .collect();
        beats.sort_by(|a, b| b.last_poll.cmp(&a.last_poll));
        Ok(beats)
    }
}

/// When a poll loop next owes a heartbeat.
#[derive(Debug, Default)]
pub(crate) struct Pacer {
    last: Option<Instant>,
}

impl Pacer {
    /// Whether a heartbeat is due at `now` (the first poll always is); if so,
    /// counts it as written.
    pub(crate) fn due(&mut self, now: Instant) -> bool {
        let due = self
            .last
            .is_none_or(|t| now.duration_since(t) >= HEARTBEAT_EVERY);
        if due {
            self.last = Some(now);
        }
        due
    }
}

/// Whether `last_poll` (RFC 3339) is within [`HEARTBEAT_STALE`] of `now`.
pub(crate) fn is_recent(last_poll: &str, now: OffsetDateTime) -> bool {
    let format = time::format_description::well_known::Rfc3339;
    OffsetDateTime::parse(last_poll, &format)
        .is_ok_and(|t| now - t <= time::Duration::try_from(HEARTBEAT_STALE).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heartbeat_is_due_once_a_minute() {
        let mut p = Pacer::default();
        let t0 = Instant::now();
        assert!(p.due(t0), "the first poll writes one");
        assert!(!p.due(t0 + Duration::from_secs(59)));
        assert!(p.due(t0 + HEARTBEAT_EVERY));
        let now = crate::clock::now_utc();
        let at = |ago: i64| crate::idempotency::fmt_time(now - time::Duration::seconds(ago));
        assert!(is_recent(&at(170), now));
        assert!(!is_recent(&at(190), now));
        assert!(!is_recent("garbage", now));
    }
}
