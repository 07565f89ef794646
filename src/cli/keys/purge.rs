//! `aqw keys purge`: arguments → [`aqw_core::ops`]'s key purge, one
//! report per storage account, text or JSON.

use crate::cli::exit::{Exit, Failure};
use crate::cli::load::{connect, load, purge_options};
use crate::cli::output::{print_purge_reports, Output};
use aqw_core::ops;
use clap::Args;
use std::collections::BTreeMap;
use std::path::Path;

/// Delete settled keys (done, cancelled) older than the keys retention;
/// pending and poisoned keys, and keys of open poison records, are kept.
#[derive(Args)]
#[command(
    after_help = "Exit codes: 0 purged (or counted), 2 bad arguments or an --older-than below the safety floor, 3 storage error.\n\nExamples:\n  aqw keys purge --dry-run\n  aqw keys purge --function SendReceipt --older-than 30.00:00:00 --output json"
)]
pub struct PurgeArgs {
    /// Only this function's keys (default: every function of the app).
    #[arg(long)]
    pub function: Option<String>,
    /// Purge what last changed longer ago than this ([d.]hh:mm:ss) instead of
    /// the configured retention.
    #[arg(long)]
    pub older_than: Option<String>,
    /// Count what would be deleted; delete nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// `aqw keys purge`: every function (or `--function`), one pass per account.
pub(super) async fn run(app_dir: &Path, a: PurgeArgs, output: Output) -> Result<Exit, Failure> {
    let app = load(app_dir)?;
    let opts = purge_options(a.older_than.as_deref(), a.dry_run)?;
    let mut by_account: BTreeMap<String, (aqw_core::config::StorageAccount, Vec<String>)> =
        BTreeMap::new();
    for f in &app.functions {
        if a.function.as_deref().is_some_and(|only| only != f.name) {
            continue;
        }
        let e = by_account
            .entry(f.connection.setting.clone())
            .or_insert_with(|| (f.connection.clone(), vec![]));
        e.1.push(f.name.clone());
    }
    if by_account.is_empty() {
        return Err(Failure::usage(format!(
            "no function named {}",
            a.function.unwrap_or_default()
        )));
    }
    let mut reports = Vec::new();
    for (connection, functions) in by_account.values() {
        let storage = connect(connection)?;
        reports.push(ops::purge_keys(&app, storage.as_ref(), functions, opts).await?);
    }
    print_purge_reports(&reports, output);
    Ok(Exit::Ok)
}
