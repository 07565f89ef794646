//! `aqw keys list`: a function's keys, filtered by the service.

use crate::cli::exit::{Exit, Failure};
use crate::cli::load::{connect, function_named, load, parse_time};
use crate::cli::output::{print_json, Output};
use aqw_core::idempotency::KeyRecord;
use aqw_core::scrub::one_line;
use clap::{Args, ValueEnum};
use std::path::Path;

/// Which keys `keys list` shows.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KeyStatusFilter {
    /// Claimed, not finished (running, or its attempt ended without a verdict).
    Pending,
    /// The effect happened.
    Done,
    /// The job was poisoned; a replay runs it.
    Poisoned,
    /// Closed by an operator: a delivery is a duplicate.
    Cancelled,
}

/// List a function's keys (every page), oldest change first within each
/// key-hash partition; filtered by the service.
#[derive(Args)]
#[command(
    after_help = "Cost: one query over the keys table, one request per 1,000 rows the service scans (the\nfilters run on the service; the table holds every function's keys of this account).\n\nExit codes: 0 listed (none is not an error), 1 some listed key is pending or poisoned, 2 bad arguments, 3 storage error.\n\nExamples:\n  aqw keys list GrantCredit --prefix credits:acct-7: --status poisoned\n  aqw keys list GrantCredit --since 02:00:00 --output json"
)]
pub struct ListArgs {
    /// The function whose keys to list.
    pub function: String,
    /// Keys starting with this text.
    #[arg(long)]
    pub prefix: Option<String>,
    /// Keys in this state only.
    #[arg(long, value_enum)]
    pub status: Option<KeyStatusFilter>,
    /// Changed at or after: RFC 3339 time or a duration ago (hh:mm:ss).
    #[arg(long)]
    pub since: Option<String>,
    /// Changed before: RFC 3339 time or a duration ago (hh:mm:ss).
    #[arg(long)]
    pub until: Option<String>,
    /// At most this many (default: all).
    #[arg(long)]
    pub limit: Option<usize>,
}

/// `keys list`: the function's keys the filters select.
pub(super) async fn run(app_dir: &Path, a: ListArgs, output: Output) -> Result<Exit, Failure> {
    let ListArgs {
        function,
        prefix,
        status,
        since,
        until,
        limit,
    } = a;
    let app = load(app_dir)?;
    let f = function_named(&app, &function)?;
    let query = aqw_core::idempotency::KeyQuery {
        prefix,
        status: status.map(|s| match s {
            KeyStatusFilter::Pending => aqw_core::idempotency::KeyStatus::Pending,
            KeyStatusFilter::Done => aqw_core::idempotency::KeyStatus::Done,
            KeyStatusFilter::Poisoned => aqw_core::idempotency::KeyStatus::Poisoned,
            KeyStatusFilter::Cancelled => aqw_core::idempotency::KeyStatus::Cancelled,
        }),
        since: since.as_deref().map(parse_time).transpose()?,
        until: until.as_deref().map(parse_time).transpose()?,
        limit,
    };
    let storage = connect(&f.connection)?;
    let keys = aqw_core::idempotency::KeyStore::new(aqw_core::storage::Storage::table(
        storage.as_ref(),
        &app.keys_table,
    ));
    let listed = keys
        .list(&function, &query)
        .await
        .map_err(|e| Failure::runtime(format!("{e:#}")))?;
    print_list(&listed, output);
    let unsettled = listed.iter().any(|k| {
        matches!(
            k.status,
            aqw_core::idempotency::KeyStatus::Pending | aqw_core::idempotency::KeyStatus::Poisoned
        )
    });
    Ok(Exit::needs_a_person_if(unsettled))
}

/// `keys list`: one line per key (status, attempts, uncertain attempts,
/// the key), or the records as JSON.
fn print_list(keys: &[KeyRecord], output: Output) {
    if output == Output::Json {
        print_json(&keys);
        return;
    }
    outln!("{:<10} {:>8} {:>9}  KEY", "STATUS", "ATTEMPTS", "UNCERTAIN");
    for k in keys {
        let uncertain = k.history.iter().filter(|a| a.may_have_taken_effect).count();
        outln!(
            "{:<10} {:>8} {:>9}  {}",
            k.status.as_str(),
            k.attempts,
            uncertain,
            one_line(&k.key)
        );
    }
    outln!("{} key(s)", keys.len());
}
