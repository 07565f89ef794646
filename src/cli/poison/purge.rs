//! `aqw poison purge QUEUE`: closed records past the retention deleted.

use crate::cli::exit::{Exit, Failure};
use crate::cli::load::{purge_options, queue_ops};
use crate::cli::output::{print_purge_reports, Output};
use aqw_core::config::AppConfig;
use clap::Args;
use std::sync::Arc;

/// Delete closed records (replayed, discarded, replaced) older than the
/// closed-records retention; open records are never purged.
#[derive(Args)]
#[command(
    after_help = "Exit codes: 0 purged (or counted), 2 bad arguments, 3 storage error.\n\nExamples:\n  aqw poison purge receipts --dry-run\n  aqw poison purge receipts --older-than 90.00:00:00 --output json"
)]
pub struct PurgeArgs {
    /// Source queue of the poisoned messages.
    pub queue: String,
    /// Purge what last changed longer ago than this ([d.]hh:mm:ss)
    /// instead of the configured retention.
    #[arg(long)]
    pub older_than: Option<String>,
    /// Count what would be deleted; delete nothing.
    #[arg(long)]
    pub dry_run: bool,
}

pub(super) async fn run(
    app: &Arc<AppConfig>,
    a: PurgeArgs,
    output: Output,
) -> Result<Exit, Failure> {
    let ops_of_queue = queue_ops(app, &a.queue)?;
    let opts = purge_options(a.older_than.as_deref(), a.dry_run)?;
    let report = aqw_core::ops::purge_records(&ops_of_queue, opts).await?;
    print_purge_reports(&[report], output);
    Ok(Exit::Ok)
}
