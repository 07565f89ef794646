//! The operation rows of an account, and this process as an operation's
//! executor (`poison replay --all` runs one too).

use crate::cli::exit::Failure;
use crate::cli::load::queue_ops;
use aqw_core::config::AppConfig;
use aqw_core::ops::operation::{ExecuteOptions, OperationStore};
use aqw_core::ops::QueueOps;
use std::sync::Arc;

pub(super) fn storage(e: aqw_core::storage::StorageError) -> Failure {
    Failure::runtime(aqw_core::scrub::scrub(&format!("{e:#}")))
}

/// The operation rows of the account of `queue`'s function (default: the
/// first function's queue), with that queue's stores.
pub(super) fn stores(
    app: &Arc<AppConfig>,
    queue: Option<&str>,
) -> Result<(QueueOps, OperationStore), Failure> {
    let queue = match queue {
        Some(q) => q.to_string(),
        None => app
            .functions
            .first()
            .map(|f| f.queue.clone())
            .ok_or_else(|| Failure::usage("the app has no function"))?,
    };
    let ops = queue_ops(app, &queue)?;
    let store = OperationStore::new(ops.control.table().clone());
    Ok((ops, store))
}

/// This process as an operation's executor.
pub(crate) fn executor(take_over: bool) -> ExecuteOptions {
    let owner = format!(
        "cli-{}-{}",
        std::process::id(),
        &uuid::Uuid::new_v4().simple().to_string()[..6]
    );
    ExecuteOptions {
        take_over,
        ..ExecuteOptions::new(owner)
    }
}
