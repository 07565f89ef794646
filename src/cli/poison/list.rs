//! `aqw poison list`: its arguments, the selection, and its output. In JSON
//! each record's message is masked by its function's `redact` as every other
//! view masks a payload; `--unredacted` prints them exact, and says who
//! asked in a warning event (`aqw.poison.unredacted`).

use crate::cli::exit::{Exit, Failure};
use crate::cli::load::{parse_error_regex, parse_time, queue_ops};
use crate::cli::output::{first_line, print_json, Output};
use aqw_core::config::AppConfig;
use aqw_core::ops::{self, Filter, QueueOps};
use aqw_core::poison::{PoisonRecord, RecordStatus};
use aqw_core::redact::Redaction;
use clap::{Args, ValueEnum};
use std::sync::Arc;

/// Which records `poison list` shows.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StatusFilter {
    /// Not yet replayed or discarded: needs a person.
    Open,
    /// Re-put to the source queue.
    Replayed,
    /// Closed without replaying.
    Discarded,
    /// Closed by `poison fix`: a corrected message took its place.
    Replaced,
    /// Every record.
    All,
}

/// List poison records, newest first; exit 1 while any listed record is open.
#[derive(Args)]
#[command(
    after_help = "Examples:\n  aqw poison list receipts --status open\n  aqw poison list receipts --since 01:00:00 --error 'HTTP 503'\n  aqw poison list receipts --output json --unredacted --by alice"
)]
pub struct ListArgs {
    /// Source queue of the poisoned messages (not the -poison queue).
    pub queue: String,
    /// Records in this state only.
    #[arg(long, value_enum, default_value_t = StatusFilter::All)]
    pub status: StatusFilter,
    /// Poisoned at or after: RFC 3339 time or a duration ago (hh:mm:ss).
    #[arg(long)]
    pub since: Option<String>,
    /// Poisoned before: RFC 3339 time or a duration ago (hh:mm:ss).
    #[arg(long)]
    pub until: Option<String>,
    /// Records of this function only.
    #[arg(long)]
    pub function: Option<String>,
    /// Regular expression over the error text.
    #[arg(long)]
    pub error: Option<String>,
    /// Print each message exact in --output json, the fields the function
    /// redacts included; logged as a warning (aqw.poison.unredacted) with --by.
    #[arg(long)]
    pub unredacted: bool,
    /// Who asks for --unredacted, kept in its log event (default: $USER).
    #[arg(long, env = "USER")]
    pub by: Option<String>,
}

/// A record as `--output json` prints it: the record, then what its
/// function's `redact` masked in its message (absent when nothing was).
#[derive(serde::Serialize)]
pub(super) struct Listed<'a> {
    #[serde(flatten)]
    pub record: &'a PoisonRecord,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redacted: Option<&'a str>,
}

/// The record status `poison list --status` selects (`None`: all).
fn record_status(status: StatusFilter) -> Option<RecordStatus> {
    match status {
        StatusFilter::Open => Some(RecordStatus::Open),
        StatusFilter::Replayed => Some(RecordStatus::Replayed),
        StatusFilter::Discarded => Some(RecordStatus::Discarded),
        StatusFilter::Replaced => Some(RecordStatus::Replaced),
        StatusFilter::All => None,
    }
}

/// `poison list`: exit 1 while a listed record is open.
pub(super) async fn run(
    app: &Arc<AppConfig>,
    a: ListArgs,
    output: Output,
) -> Result<Exit, Failure> {
    let by = match (a.unredacted, a.by.as_deref().map(str::trim)) {
        (true, None | Some("")) => {
            return Err(Failure::usage(
                "--unredacted is logged with who asked: give --by NAME (or set $USER)",
            ))
        }
        (_, by) => by.unwrap_or_default().to_string(),
    };
    let filter = Filter {
        status: record_status(a.status),
        since: a.since.as_deref().map(parse_time).transpose()?,
        until: a.until.as_deref().map(parse_time).transpose()?,
        function: a.function,
        error: parse_error_regex(a.error.as_deref())?,
        ids: vec![],
    };
    let ops = queue_ops(app, &a.queue)?;
    let mut records = ops::list(&ops, &filter).await?;
    let open = records
        .iter()
        .filter(|r| r.status == RecordStatus::Open)
        .count();
    if records.is_empty() && output == Output::Text {
        // Say what the filter hid: "0 open, 5 in all", not "no records".
        let all = ops.records().await?;
        let open_all = all
            .iter()
            .filter(|r| r.status == RecordStatus::Open)
            .count();
        empty(&a.queue, open_all, all.len());
        return Ok(Exit::Ok);
    }
    let notes = if a.unredacted {
        tracing::warn!(event = "aqw.poison.unredacted", by = %by, queue = %a.queue, records = records.len(), "poison list --unredacted: messages printed exact, the fields their functions redact included");
        vec![None; records.len()]
    } else {
        let masked = |r: &mut PoisonRecord| {
            let rules = redaction(app, &ops, r);
            ops::mask_message(r, rules)
        };
        records.iter_mut().map(masked).collect()
    };
    render(&a.queue, &records, &notes, open, output);
    Ok(Exit::needs_a_person_if(open > 0))
}

/// The redaction of the function that ran `record` (by its name; else the
/// function of its queue).
pub(super) fn redaction<'a>(
    app: &'a AppConfig,
    ops: &'a QueueOps,
    record: &PoisonRecord,
) -> &'a Redaction {
    static NONE: std::sync::OnceLock<Redaction> = std::sync::OnceLock::new();
    let by_name = app.functions.iter().find(|f| f.name == record.function);
    by_name
        .or(ops.function.as_ref())
        .map_or_else(|| NONE.get_or_init(Redaction::default), |f| &f.redact)
}

fn render(
    queue: &str,
    records: &[PoisonRecord],
    notes: &[Option<String>],
    open: usize,
    output: Output,
) {
    if output == Output::Json {
        let listed: Vec<Listed> = (records.iter().zip(notes))
            .map(|(record, note)| Listed {
                record,
                redacted: note.as_deref(),
            })
            .collect();
        print_json(&listed);
    } else if records.is_empty() {
        outln!("no poison records for {queue}");
    } else {
        print_records(records);
        outln!("{} record(s), {open} open", records.len());
    }
}

/// The list for a person: every id and key in full (columns as wide as
/// their longest value), the error's first line in full beneath each row.
fn print_records(records: &[PoisonRecord]) {
    let width = |f: &dyn Fn(&PoisonRecord) -> usize, title: &str| {
        records.iter().map(f).max().unwrap_or(0).max(title.len())
    };
    let id_w = width(&|r| r.message_id.chars().count(), "ID");
    let key_w = width(&|r| r.key.as_deref().unwrap_or("-").chars().count(), "KEY");
    outln!(
        "{:<id_w$}  {:<9}  {:<20}  {:>3}  {:<10}  KEY",
        "ID",
        "STATUS",
        "POISONED AT",
        "DQ",
        "KIND"
    );
    outln!("{:<id_w$}  ERROR", "");
    for r in records {
        outln!(
            "{:<id_w$}  {:<9}  {:<20}  {:>3}  {:<10}  {:<key_w$}",
            r.message_id,
            r.status.as_str(),
            r.poisoned_at.chars().take(19).collect::<String>(),
            r.dequeue_count,
            r.error.kind.as_str(),
            r.key.as_deref().unwrap_or("-"),
        );
        let (first, tail) = first_line(&r.error.message);
        outln!("{:<id_w$}  {first}{tail}", "");
        if r.uncertain_attempts > 0 && r.status == aqw_core::poison::RecordStatus::Open {
            outln!(
                "{:<id_w$}  [{} attempt(s) may have taken effect: check the provider before replaying]",
                "", r.uncertain_attempts
            );
        } else if r.uncertain_attempts > 0 {
            // Closed: the warning no longer asks for a check; the key says
            // how it ended.
            outln!(
                "{:<id_w$}  [{} attempt(s) may have taken effect; record {}: `aqw poison show` says how its key ended]",
                "", r.uncertain_attempts, r.status.as_str()
            );
        }
    }
}

/// `poison list` that matched nothing: what the filter hid.
fn empty(queue: &str, open: usize, all: usize) {
    if all == 0 {
        outln!("no poison records for {queue}");
    } else {
        outln!("no poison records for {queue} match ({open} open, {all} in all)");
    }
}
