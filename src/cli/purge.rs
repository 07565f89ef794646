//! `aqw keys purge` and `aqw poison purge`: arguments → [`aqw_core::ops`]'s
//! purges, one report per storage account or queue, text or JSON.

use super::exit::{Exit, Failure};
use super::output::print_json;
use super::output::Output;
use aqw_core::config::AppConfig;
use aqw_core::ops::{self, PurgeOptions, QueueOps};
use aqw_core::retention::PurgeReport;
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

fn options(older_than: Option<&str>, dry_run: bool) -> Result<PurgeOptions, Failure> {
    let older_than = older_than
        .map(|s| {
            aqw_core::config::parse_timespan(s)
                .map_err(|e| Failure::usage(format!("--older-than: {e}")))
        })
        .transpose()?;
    Ok(PurgeOptions {
        older_than,
        dry_run,
    })
}

/// `aqw keys purge`: every function (or `--function`), one pass per account.
pub async fn keys(app: &Arc<AppConfig>, a: PurgeArgs, output: Output) -> Result<Exit, Failure> {
    let opts = options(a.older_than.as_deref(), a.dry_run)?;
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
    render(&reports, output);
    Ok(Exit::Ok)
}

/// `aqw poison purge QUEUE`.
pub async fn records(
    ops_of_queue: QueueOps,
    older_than: Option<&str>,
    dry_run: bool,
    output: Output,
) -> Result<Exit, Failure> {
    let opts = options(older_than, dry_run)?;
    let report = ops::purge_records(&ops_of_queue, opts).await?;
    render(&[report], output);
    Ok(Exit::Ok)
}

fn render(reports: &[PurgeReport], output: Output) {
    if output == Output::Json {
        print_json(&reports);
        return;
    }
    for r in reports {
        let verb = if r.dry_run { "would delete" } else { "deleted" };
        let c = &r.counts;
        outln!(
            "{} {}: scanned {} settled older than {} ({} s), {verb} {}; kept {} (open poison record), {} (changed since read); {} already gone; {} requests",
            r.what, r.table, c.scanned, r.cutoff, r.older_than_seconds, c.deleted, c.kept_open_record, c.kept_changed, c.already_gone, r.requests
        );
    }
}
