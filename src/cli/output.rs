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

use aqw::config::show::Setting;
use aqw_core::config::MessageEncoding;
use aqw_core::idempotency::{fmt_time, Attempt, KeyRecord, KeyStatus, HISTORY_LEN};
use aqw_core::ops::{Enqueued, QueueStatus};
use aqw_core::retention::PurgeReport;
use clap::ValueEnum;

use aqw_core::schedule::ScheduleStatus;
use aqw_core::scrub::one_line;

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

/// `enqueue`: the message id, key and encoding.
pub fn enqueued(e: &Enqueued, output: Output) {
    let enc = match e.encoding {
        MessageEncoding::Base64 => "base64",
        MessageEncoding::None => "none",
    };
    if output == Output::Json {
        print_json(
            &serde_json::json!({"queue": e.queue, "messageId": e.message_id, "key": e.key.as_ref().map(|k| k.to_string()), "encoding": enc, "visibleAt": e.visible_at.map(fmt_time), "blob": e.blob}),
        );
    } else {
        let when = e
            .visible_at
            .map(|t| format!(", visible at {}", fmt_time(t)))
            .unwrap_or_default();
        let blob = e
            .blob
            .as_ref()
            .map(|b| format!(", body in blob {b}"))
            .unwrap_or_default();
        outln!(
            "enqueued {} to {} (key {}, encoding {enc}{when}{blob})",
            e.message_id,
            e.queue,
            e.key
                .as_ref()
                .map(|k| format!("{:?}", k.as_str()))
                .unwrap_or("none".into())
        );
    }
}

/// `status`: one line per queue.
pub fn status(lines: &[QueueStatus], schedules: &[ScheduleStatus], open: usize, output: Output) {
    if output == Output::Json {
        print_json(
            &serde_json::json!({"queues": lines, "schedules": schedules, "openPoisonRecords": open,
                "triage": lines.iter().filter(|l| l.open_records > 0)
                    .map(|l| aqw_core::alert::triage_command(&l.queue)).collect::<Vec<_>>()}),
        );
        return;
    }
    status_queues(lines);
    status_schedules(schedules);
}

/// `status`: one line per schedule (none when the app has none).
fn status_schedules(schedules: &[ScheduleStatus]) {
    if schedules.is_empty() {
        return;
    }
    outln!("");
    outln!(
        "{:<20} {:<20} {:<22}  {:<22}  LAST TICK",
        "SCHEDULE",
        "FUNCTION",
        "WHEN",
        "NEXT TICK"
    );
    for s in schedules {
        let last = match (&s.last_tick, &s.last_outcome) {
            _ if s.error.is_some() => format!(
                "cannot read: {}",
                one_line(s.error.as_deref().unwrap_or(""))
            ),
            (Some(t), Some(o)) => format!("{t} ({o})"),
            (Some(t), None) => t.clone(),
            (None, _) => "none yet".to_string(),
        };
        outln!(
            "{:<20} {:<20} {:<22}  {:<22}  {last}",
            one_line(&s.name),
            s.function,
            format!("{} (catch-up {})", s.when, s.catch_up),
            s.next.as_deref().unwrap_or("never")
        );
    }
}

fn status_queues(lines: &[QueueStatus]) {
    outln!(
        "{:<20} {:<24} {:>8} {:>8} {:>6}  {:<20}  LAST POLL",
        "FUNCTION",
        "QUEUE",
        "DEPTH",
        "POISON",
        "OPEN",
        "OLDEST OPEN"
    );
    for l in lines {
        let polled = match (&l.last_poll, l.polling_workers) {
            (None, _) => "never (no worker has polled)".to_string(),
            (Some(t), 0) => format!("{t} (NOT polling now)"),
            (Some(t), n) => format!("{t} ({n} worker(s) polling)"),
        };
        outln!(
            "{:<20} {:<24} {:>8} {:>8} {:>6}  {:<20}  {polled}",
            l.function,
            l.queue,
            l.depth.map(|d| d.to_string()).unwrap_or("-".into()),
            l.poison_depth.map(|d| d.to_string()).unwrap_or("-".into()),
            l.open_records,
            l.oldest_open.as_deref().unwrap_or("-")
        );
    }
}

/// Under the status table: each paused function and each breaker not
/// closed, with who, when and why, and each function's learned call rate
/// while its provider throttles it (in JSON they are on each queue's line).
pub fn status_control(lines: &[QueueStatus], output: Output) {
    if output == Output::Json {
        return;
    }
    for l in lines {
        if let Some(r) = &l.learned_rate {
            outln!("RATE     {} {}", l.function, r.describe());
        }
    }
    for l in lines {
        if let Some(p) = &l.control.pause {
            let why = if p.reason.is_empty() {
                "no reason given".to_string()
            } else {
                one_line(&p.reason)
            };
            outln!(
                "PAUSED   {} by {} at {}: {why}",
                l.function,
                one_line(&p.by),
                p.at
            );
        }
        if let Some(b) = l.control.breaker.as_ref().filter(|b| b.state != "closed") {
            outln!(
                "BREAKER  {} {} since {} (worker {}): {}",
                l.function,
                b.state,
                b.at,
                b.worker,
                one_line(&b.reason)
            );
        }
    }
    for l in lines.iter().filter(|l| l.open_records > 0) {
        outln!(
            "TRIAGE   {} open record(s) on {}: start with `{}` (grouped by cause, with the next commands)",
            l.open_records,
            l.queue,
            aqw_core::alert::triage_command(&l.queue)
        );
    }
}

/// `pause` / `resume`: the function's control row as it now reads.
pub fn control(function: &str, row: &aqw_core::control::Control, output: Output) {
    if output == Output::Json {
        print_json(&serde_json::json!({"function": function, "control": row}));
        return;
    }
    match &row.pause {
        Some(p) => outln!(
            "{function} paused by {} at {}; workers stop receiving within {}s (in-flight jobs finish)",
            p.by,
            p.at,
            aqw_core::control::WATCH_INTERVAL.as_secs()
        ),
        None => outln!(
            "{function} resumed; workers receive again within {}s",
            aqw_core::control::WATCH_INTERVAL.as_secs()
        ),
    }
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

/// `config show`: one row per setting, with its source.
pub fn config_show(settings: &[Setting], output: Output) {
    if output == Output::Json {
        print_json(&settings);
        return;
    }
    let w = settings.iter().map(|s| s.name.len()).max().unwrap_or(0);
    for s in settings {
        outln!("{:<w$}  {}  ({})", s.name, s.value, s.source.as_str());
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
