//! `aqw keys purge`: arguments → [`aqw_core::ops`]'s key purge, one
//! report per storage account, text or JSON.

use super::exit::{Exit, Failure};
use super::load::purge_options;
use super::output::{print_purge_reports, Output};
use aqw_core::config::AppConfig;
use aqw_core::ops;
use clap::Args;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The options both purge commands share.
#[derive(Args)]
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
pub async fn keys(app: &Arc<AppConfig>, a: PurgeArgs, output: Output) -> Result<Exit, Failure> {
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
        let storage = super::load::connect(connection)?;
        reports.push(ops::purge_keys(app, storage.as_ref(), functions, opts).await?);
    }
    print_purge_reports(&reports, output);
    Ok(Exit::Ok)
}
