//! `aqw keys purge` and `aqw poison purge`: one retention pass run by an
//! operator, at full speed, with the same guards as the sweep (see
//! [`crate::retention`]), or only counted with `--dry-run`.

use super::{OpsError, OpsResult, QueueOps};
use crate::config::{check_key_retention, AppConfig};
use crate::idempotency::KeyStore;
use crate::retention::{self, Pacer, PurgeReport, PurgeRun};
use crate::storage::Storage;
use std::time::Duration;

/// What the operator asked for.
#[derive(Debug, Clone, Copy, Default)]
pub struct PurgeOptions {
    /// Purge what is older than this instead of the configured retention.
    pub older_than: Option<Duration>,
    /// Only count what would be deleted; delete nothing.
    pub dry_run: bool,
}

/// Purge the settled keys of `functions` (all on `storage`'s account).
pub async fn purge_keys(
    app: &AppConfig,
    storage: &dyn Storage,
    functions: &[String],
    opts: PurgeOptions,
) -> OpsResult<PurgeReport> {
    let older_than = opts.older_than.or(app.retention.keys).ok_or_else(|| {
        OpsError::Usage(
            "aqw.retention.keys is \"never\": keys are kept for good; pass --older-than to purge anyway (it must still be safe)".into(),
        )
    })?;
    if !app.retention.unsafe_short {
        check_key_retention(older_than, app.retention.source_message_ttl)
            .map_err(|m| OpsError::Usage(format!("--older-than: {m}")))?;
    }
    let keys = KeyStore::new(storage.table(&app.keys_table));
    let records = storage.table(&app.poison_table);
    let mut pacer = Pacer::new(None);
    let mut run = PurgeRun {
        older_than,
        dry_run: opts.dry_run,
        pacer: &mut pacer,
        lease: None,
    };
    Ok(retention::purge_keys(&keys, records.as_ref(), functions, &mut run).await?)
}

/// Purge the closed poison records of one source queue.
pub async fn purge_records(ops: &QueueOps, opts: PurgeOptions) -> OpsResult<PurgeReport> {
    let older_than = opts
        .older_than
        .or(ops.app.retention.closed_records)
        .ok_or_else(|| {
            OpsError::Usage(
                "aqw.retention.closedRecords is \"never\": closed records are kept for good; pass --older-than to purge anyway".into(),
            )
        })?;
    let mut pacer = Pacer::new(None);
    let mut run = PurgeRun {
        older_than,
        dry_run: opts.dry_run,
        pacer: &mut pacer,
        lease: None,
    };
    Ok(retention::purge_records(&ops.poison, &mut run).await?)
}
