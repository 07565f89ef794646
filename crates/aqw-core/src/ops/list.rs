//! `aqw poison list`, and the dashboard's list (the same order, without payloads).

use super::{Filter, OpsResult, QueueOps};
use crate::poison::PoisonRecord;

/// `aqw poison list`: records matching `filter`, newest first.
pub async fn list(ops: &QueueOps, filter: &Filter) -> OpsResult<Vec<PoisonRecord>> {
    ops.poison.scan(None).await?;
    Ok(newest_first(
        ops.records()
            .await?
            .into_iter()
            .filter(|r| filter.matches(r)),
    ))
}

/// [`list`] without the payloads (each record's `message` is empty): the
/// dashboard's list page, which shows no payload and must stay fast at
/// 10,000 open records.
pub async fn list_summaries(ops: &QueueOps, filter: &Filter) -> OpsResult<Vec<PoisonRecord>> {
    ops.poison.scan(None).await?;
    Ok(newest_first(
        ops.poison
            .list_summaries()
            .await?
            .into_iter()
            .filter(|r| filter.matches(r)),
    ))
}

fn newest_first(records: impl Iterator<Item = PoisonRecord>) -> Vec<PoisonRecord> {
    let mut out: Vec<PoisonRecord> = records.collect();
    out.sort_by(|a, b| {
        b.poisoned_at
            .cmp(&a.poisoned_at)
            .then(b.message_id.cmp(&a.message_id))
    });
    out
}
