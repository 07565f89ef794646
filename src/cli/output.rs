//! Everything a command prints: text for a person, JSON for a program;
//! `outln!`, the one way a line reaches stdout.

/// `println!` for the CLI's output: a closed pipe (`aqw poison list q |
/// head`) ends the process quietly with exit 0, as ripgrep does, instead of
/// `println!`'s panic; any other write error is reported, exit 74.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cli::output::write_line(format_args!($($arg)*))
    };
}

/// Write one line of output to stdout (see [`outln`]).
/// Control characters (but newline and tab) and bidirectional overrides are
/// written as `\uXXXX` (valid in JSON, visible in a terminal): free text
/// from a record or a control row cannot recolour the terminal or reorder
/// the line (issue 40).
pub(crate) fn write_line(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let text = line.to_string();
    let text = aqw_core::scrub::json_safe(&text);
    let mut out = std::io::stdout().lock();
    let written = out
        .write_all(text.as_bytes())
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush());
    if let Err(e) = written {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("aqw: cannot write the output: {e}");
        std::process::exit(74);
    }
}

use aqw_core::idempotency::{Attempt, KeyRecord, KeyStatus, HISTORY_LEN};
use aqw_core::retention::PurgeReport;
use clap::ValueEnum;

/// How a command prints: `--output text|json`.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Tables and lines for a person.
    Text,
    /// Complete JSON for a program.
    Json,
}

pub fn print_json(v: &impl serde::Serialize) {
    outln!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

/// One line on a key's state. A done key's earlier errors are history, not
/// a current error, so they are not repeated here.
pub(super) fn key_state_line(k: &KeyRecord) -> String {
    let tries = format!("{} attempt(s)", k.attempts);
    match k.status {
        KeyStatus::Done => format!(
            "done at {} after {tries}; provider key {}",
            k.completed_at.as_deref().unwrap_or("-"),
            k.provider_key
        ),
        KeyStatus::Cancelled => format!("cancelled (never runs again) after {tries}"),
        s => format!(
            "{} after {tries}; provider key {}; last error: {}",
            s.as_str(),
            k.provider_key,
            k.last_error.as_deref().unwrap_or("-")
        ),
    }
}

/// The key's attempt history, oldest first, flagging attempts that may have
/// taken effect (their provider key is what keeps a retry from doubling).
pub(super) fn print_history(history: &[Attempt], indent: &str) {
    if history.is_empty() {
        return;
    }
    outln!("attempts:      (last {}, oldest first)", HISTORY_LEN);
    for a in history {
        let flag = match (a.certainty(), &a.provider) {
            (Some(c), _) => format!("  [{c}]"),
            (None, Some(p)) if p.body.is_empty() => format!("  ({})", p.summary()),
            (None, Some(p)) => format!("  ({}: {})", p.summary(), p.body),
            (None, None) => String::new(),
        };
        outln!(
            "{indent}{}  dq {}  {}  {:<9} {}{flag}",
            a.at,
            a.dequeue_count,
            a.message_id,
            a.outcome,
            a.error.as_deref().unwrap_or("")
        );
    }
}

/// An error's first line, and a note naming how many lines follow it
/// (empty when none): `list` and `report` show one line per error.
pub fn first_line(text: &str) -> (&str, String) {
    let mut lines = text.lines();
    let first = lines.next().unwrap_or("");
    let more = lines.count();
    let tail = if more > 0 {
        format!("  (+{more} more line(s): aqw poison show)")
    } else {
        String::new()
    };
    (first, tail)
}

/// The purge reports of `keys purge` and `poison purge`.
pub(super) fn print_purge_reports(reports: &[PurgeReport], output: Output) {
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
