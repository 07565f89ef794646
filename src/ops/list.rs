//! `aqw poison list`.

use super::{Filter, OpsResult, QueueOps};
use crate::poison::PoisonRecord;

/// `aqw poison list`: records matching `filter`, newest first.
pub async fn list(ops: &QueueOps, filter: &Filter) -> OpsResult<Vec<PoisonRecord>> {
    ops.poison.scan(None).await?;
    let mut out: Vec<PoisonRecord> = ops
        .records()
        .await?
        .into_iter()
        .filter(|r| filter.matches(r))
        .collect();
    out.sort_by(|a, b| {
        b.poisoned_at
            .cmp(&a.poisoned_at)
            .then(b.message_id.cmp(&a.message_id))
    });
    Ok(out)
}
