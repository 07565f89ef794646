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
use aqw_core::ops::{
    DiscardRehearsal, Enqueued, FixAction, FixRehearsal, FixReport, QueueStatus, ReplayReport,
    ShowReport,
};
use aqw_core::poison::PoisonRecord;
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

/// `poison show`.
pub fn poison_show(report: &ShowReport, pretty: bool, output: Output) {
    if output == Output::Json {
        print_json(&report);
        return;
    }
    let r = &report.record;
    outln!(
        "record:        {} ({}, origin {})",
        r.message_id,
        r.status.as_str(),
        r.origin
    );
    outln!("queue:         {} (function {})", r.queue, r.function);
    outln!(
        "error:         [{}] {}",
        r.error.kind.as_str(),
        r.error.message
    );
    outln!("attempts:      dequeued {} time(s)", r.dequeue_count);
    outln!("inserted:      {}", r.inserted_at);
    outln!("first attempt: {}", r.first_attempt_at);
    outln!("poisoned:      {}", r.poisoned_at);
    outln!("key:           {}", r.key.as_deref().unwrap_or("-"));
    match &report.key_record {
        Some(k) => {
            outln!("key state:     {}", key_state_line(k));
            print_history(&k.history, "               ");
        }
        None => outln!("key state:     no record"),
    }
    print_window_and_copy(report);
    print_uncertain(report);
    if let Some(note) = &report.redacted {
        outln!("redacted:      {note}");
    }
    let exact = if report.redacted.is_some() {
        "redacted"
    } else {
        "exact text"
    };
    match (&report.payload, &report.payload_text, &report.decode_error) {
        (Some(v), _, _) if pretty => outln!(
            "payload (indented with --pretty; the exact text is in --output json's payloadText):\n{}",
            serde_json::to_string_pretty(v).unwrap_or_default()
        ),
        (Some(_), Some(t), _) => outln!("payload ({exact}):\n{t}"),
        (None, Some(t), _) => outln!("payload (not JSON):\n{t}"),
        (_, _, Some(e)) => outln!(
            "payload:       undecodable: {e}\nraw text:      {}",
            r.message
        ),
        _ => {}
    }
}

/// Attempts that may have taken effect, and what the provider said of them.
fn print_uncertain(report: &ShowReport) {
    let r = &report.record;
    if r.uncertain_attempts > 0 {
        outln!(
            "uncertain:     {} attempt(s) may have taken effect; the provider key {} keeps a retry from doubling it",
            r.uncertain_attempts,
            report.key_record.as_ref().map_or("-", |k| k.provider_key.as_str())
        );
    }
    if let Some(check) = &report.provider_check {
        outln!("provider says: {check}");
    }
    // Resolved: once the key is done, the uncertainty is answered.
    if let Some(k) = report
        .key_record
        .as_ref()
        .filter(|k| r.uncertain_attempts > 0 && k.status.is_settled())
    {
        let answer = k
            .completed_answer()
            .map(|a| format!(" ({})", a.summary()))
            .unwrap_or_default();
        outln!(
            "resolved:      the key is {}{answer}: the effect happened once",
            k.status.as_str()
        );
    }
}

/// The provider key against its window, how the record was closed, its
/// encoding and its poison copy (id and format).
fn print_window_and_copy(report: &ShowReport) {
    let r = &report.record;
    if let Some(w) = &report.provider_window {
        outln!("provider key:  {}", w.summary());
    }
    print_closing(r, report.replacement_key_record.as_ref());
    outln!(
        "encoding:      {} ({} bytes of message text)",
        r.encoding.as_str(),
        r.message.len()
    );
    outln!(
        "poison copy:   {} ({})",
        r.poison_message_id.as_deref().unwrap_or("-"),
        r.copy_format.as_str()
    );
}

/// How a record was closed: replayed, replaced or discarded, by whom.
fn print_closing(r: &PoisonRecord, replacement: Option<&KeyRecord>) {
    if let Some(by) = &r.past_provider_window_by {
        outln!(
            "past window:   overridden by {by} at {}: {}",
            r.past_provider_window_at.as_deref().unwrap_or("-"),
            r.past_provider_window_note.as_deref().unwrap_or("")
        );
    }
    if let Some(by) = &r.replayed_by {
        outln!(
            "replayed:      {} by {by} as {}",
            r.replayed_at.as_deref().unwrap_or("-"),
            r.replay_message_id.as_deref().unwrap_or("-")
        );
    }
    if let Some(by) = &r.replaced_by {
        outln!(
            "replaced:      {} by {by} with {} (key {}, payload {:+} bytes)",
            r.replaced_at.as_deref().unwrap_or("-"),
            r.replacement_message_id.as_deref().unwrap_or("-"),
            r.replacement_key.as_deref().unwrap_or("-"),
            r.replacement_size_diff.unwrap_or(0)
        );
        outln!(
            "new key:       {}",
            replacement.map_or("not claimed yet".into(), key_state_line)
        );
    }
    if let Some(by) = &r.discarded_by {
        outln!(
            "discarded:     {} by {}: {}",
            r.discarded_at.as_deref().unwrap_or("-"),
            one_line(by),
            one_line(r.discard_reason.as_deref().unwrap_or("-"))
        );
    }
}

/// `poison fix`.
pub fn poison_fix(id: &str, by: &str, report: &FixReport, output: Output) {
    if output == Output::Json {
        print_json(&report);
        return;
    }
    match report.action {
        FixAction::Replaced => outln!(
            "replaced {id} by {} (key {} → {}, payload {:+} bytes, by {by}){}",
            report.new_message_id.as_deref().unwrap_or("-"),
            report.old_key.as_deref().unwrap_or("-"),
            report.new_key.as_deref().unwrap_or("-"),
            report.size_diff,
            match report.confirmed {
                Some(true) => "; the new key is done",
                Some(false) => "; the new key is NOT done yet",
                None => "",
            }
        ),
        _ => outln!(
            "{id}: {}: {}",
            report.action.as_str(),
            report.detail.as_deref().unwrap_or("-")
        ),
    }
}

/// A record as `--output json` prints it: the record, then what its
/// function's `redact` masked in its message (absent when nothing was).
#[derive(serde::Serialize)]
pub struct Listed<'a> {
    #[serde(flatten)]
    pub record: &'a PoisonRecord,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redacted: Option<&'a str>,
}

/// `poison discard`.
pub fn poison_discard(
    id: &str,
    reason: &str,
    by: &str,
    close_key: bool,
    (rec, redacted): (&PoisonRecord, Option<&str>),
    output: Output,
) {
    if output == Output::Json {
        print_json(&Listed {
            record: rec,
            redacted,
        });
        return;
    }
    let key_note = match (close_key, rec.key.as_deref()) {
        (true, Some(k)) => format!("; key {k} closed: a resend is a duplicate"),
        (false, Some(k)) => format!("; key {k} left poisoned: a resend runs"),
        _ => String::new(),
    };
    outln!("discarded {id} ({reason}, by {by}){key_note}");
}

/// `poison replay`: a line per record, then the counts.
pub fn poison_replay(report: &ReplayReport, waited: bool, output: Output) {
    if output == Output::Json {
        print_json(&report);
        return;
    }
    for i in &report.items {
        let extra = match (&i.new_message_id, &i.detail) {
            (Some(n), _) => format!("as {n}"),
            (None, Some(d)) => d.clone(),
            _ => String::new(),
        };
        let conf = match (i.confirmed, &i.provider, &i.poisoned_again) {
            (_, _, Some(p)) => format!(
                " [POISONED AGAIN as {} ({}): {}]",
                p.id,
                p.kind,
                one_line(&p.error)
            ),
            (Some(true), Some(p), _) => format!(" [completed ({p})]"),
            (Some(true), None, _) => " [done]".into(),
            (Some(false), _, _) => " [NOT done yet]".into(),
            (None, _, _) => String::new(),
        };
        let key = match (&i.key, &i.key_state) {
            (Some(k), Some(st)) if report.dry_run => format!("  key {k} ({st})"),
            _ => String::new(),
        };
        outln!(
            "{:<38} {:<26} {}{conf}{key}",
            i.id,
            i.action.as_str(),
            extra
        );
        print_replay_notes(i, report);
    }
    outln!(
        "{}: {} selected, {} replayed, {} already done, {} not replayed{}",
        if report.dry_run { "dry run" } else { "replay" },
        report.selected,
        report.replayed,
        report.already_done,
        report.failed,
        if waited {
            format!(
                ", {} poisoned again, {} not confirmed done",
                report.poisoned_again, report.unconfirmed
            )
        } else {
            String::new()
        }
    );
}

/// Beneath a replay row: the uncertain attempt (and whether the provider
/// dedupes it), and a saving provider's warning with the way out.
fn print_replay_notes(i: &aqw_core::ops::ReplayItem, report: &ReplayReport) {
    if let Some(pk) = &i.uncertain_provider_key {
        let dedupes = if i.provider_dedupes {
            ": the provider honours Idempotency-Key (handler.idempotent), a same-key replay cannot double it; no --uncertain-checked needed"
        } else {
            ""
        };
        outln!("    ! an attempt may have taken effect (provider key {pk}){dedupes}");
        if let Some(check) = &i.provider_check {
            outln!("      the provider says: {check}");
        }
    }
    if let Some(why) = &i.saved_failure {
        let key = i.key.as_deref().map_or("KEY".into(), one_line);
        let function = report
            .function
            .as_deref()
            .map_or("FUNCTION".into(), one_line);
        outln!("    ! the provider saves failures ({}): a same-key replay gets the saved failure back (replayed_failure)", one_line(why));
        outln!("      the way out, once the cause is fixed: aqw keys check {function} {key}");
        outln!("      if it says \"not applied\": aqw keys new-provider-key {function} {key} --reason \"…\" --dry-run, then without --dry-run");
        outln!(
            "      then: aqw poison replay {} --id {} --wait 00:02:00",
            one_line(&report.queue),
            one_line(&i.id)
        );
    }
}

/// `keys list`: one line per key (status, attempts, uncertain attempts,
/// the key), or the records as JSON.
pub fn key_list(keys: &[KeyRecord], output: Output) {
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

/// `keys check`: the key, its provider key, and the provider's answer.
pub fn key_check(rec: &KeyRecord, answer: &aqw::handlers::lookup::LookupAnswer, output: Output) {
    let uncertain = rec
        .history
        .iter()
        .filter(|a| a.may_have_taken_effect)
        .count();
    if output == Output::Json {
        print_json(&serde_json::json!({
            "key": rec.key,
            "function": rec.function,
            "status": rec.status.as_str(),
            "providerKey": rec.provider_key,
            "uncertainAttempts": uncertain,
            "provider": answer,
        }));
        return;
    }
    outln!("key:          {}", rec.key);
    outln!("status:       {}", rec.status.as_str());
    outln!("providerKey:  {}", rec.provider_key);
    outln!("uncertain:    {uncertain} attempt(s) may have taken effect");
    outln!("provider:     {}", answer.line());
}

/// `keys show`.
pub fn key_record(function: &str, key: &str, rec: Option<&KeyRecord>, output: Output) {
    let Some(r) = rec else {
        if output == Output::Json {
            print_json(&serde_json::json!({"key": key, "function": function, "record": null}));
        } else {
            outln!("no record for key {key:?} of {function} (never claimed)");
        }
        return;
    };
    if output == Output::Json {
        print_json(&r);
        return;
    }
    outln!("key:          {}", r.key);
    outln!("function:     {}", r.function);
    outln!("status:       {}", r.status.as_str());
    outln!("providerKey:  {}", r.provider_key);
    outln!("state:        {}", key_state_line(r));
    outln!("messageId:    {}", r.message_id.as_deref().unwrap_or("-"));
    outln!("firstSeen:    {}", r.first_seen.as_deref().unwrap_or("-"));
    outln!("completedAt:  {}", r.completed_at.as_deref().unwrap_or("-"));
    outln!("replayCount:  {}", r.replay_count);
    if let Some(by) = &r.cancelled_by {
        outln!(
            "cancelled:    {} by {}: {} (a delivery of this job is a duplicate)",
            r.cancelled_at.as_deref().unwrap_or("-"),
            one_line(by),
            one_line(r.cancel_reason.as_deref().unwrap_or("-"))
        );
    }
    outln!(
        "lease:        {} until {}",
        r.lease_owner.as_deref().unwrap_or("-"),
        r.lease_until.as_deref().unwrap_or("-")
    );
    outln!("row:          {} / {}", r.partition_key, r.row_key);
    print_history(&r.history, "              ");
}

/// One line on a key's state. A done key's earlier errors are history, not
/// a current error, so they are not repeated here.
fn key_state_line(k: &KeyRecord) -> String {
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
fn print_history(history: &[Attempt], indent: &str) {
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

/// `poison fix --dry-run`.
pub fn fix_rehearsal(r: &FixRehearsal, output: Output) {
    if output == Output::Json {
        print_json(&r);
        return;
    }
    outln!("dry run: poison fix {} (nothing changed)", r.id);
    outln!("old key:   {}", r.old_key.as_deref().unwrap_or("-"));
    outln!("new key:   {}", r.new_key.as_deref().unwrap_or("-"));
    outln!("key state: {}", r.key_state.as_deref().unwrap_or("-"));
    match &r.refusal {
        Some(why) => outln!("would:     refuse: {why}"),
        None => outln!("would:     put the corrected message and close the record as replaced"),
    }
    outln!("payload:   {:+} bytes", r.size_diff);
    for line in &r.diff {
        outln!("  {line}");
    }
}

/// `poison discard --dry-run`.
pub fn discard_rehearsal(r: &DiscardRehearsal, output: Output) {
    if output == Output::Json {
        print_json(&r);
        return;
    }
    outln!("dry run: poison discard {} (nothing changed)", r.id);
    outln!("key:       {}", r.key.as_deref().unwrap_or("-"));
    outln!("key state: {}", r.key_state.as_deref().unwrap_or("-"));
    let what = match (&r.refusal, r.close_key) {
        (Some(why), _) => format!("refuse: {why}"),
        (None, true) => "close the record and the key (a resend is a duplicate)".into(),
        (None, false) => "close the record; the key stays poisoned (a resend runs)".into(),
    };
    outln!("would:     {what}");
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
