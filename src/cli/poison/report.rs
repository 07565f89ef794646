//! `aqw poison report`: the incident as one table (the engine's
//! `ops::report`), as aligned text or JSON.

use crate::cli::exit::{Exit, Failure};
use crate::cli::load::{parse_time, queue_ops};
use crate::cli::output::{first_line, print_json, Output};
use aqw_core::config::AppConfig;
use aqw_core::ops::{IncidentReport, KeyOutcome, ReportRow};
use aqw_core::scrub::one_line;
use clap::Args;
use std::sync::Arc;

/// The incident as one table: per record what happened, the decision
/// (open, replayed, fixed, discarded), who, when, why, its key's final
/// state, the provider's answer to the attempt that completed it and any
/// attempt still uncertain; a line per key a fix created; totals.
#[derive(Args)]
#[command(
    after_help = "Cost: a scan of <queue>-poison (as poison list), one query of the queue's records (no payloads),\none read per distinct key.\n\nExit codes: 0 every record closed and no attempt uncertain, 1 a record is open or an attempt may have\ntaken effect and its key is not settled, 2 bad arguments, 3 storage error.\n\nExamples:\n  aqw poison report receipts --since 06:00:00\n  aqw poison report receipts --since 2026-12-06T09:00:00Z --output json"
)]
pub struct ReportArgs {
    /// Source queue of the poisoned messages (not the -poison queue).
    pub queue: String,
    /// Poisoned at or after: RFC 3339 time or a duration ago (hh:mm:ss).
    #[arg(long)]
    pub since: Option<String>,
}

/// `poison report QUEUE [--since T]`: exit 1 while a record is open or an
/// attempt is still uncertain.
pub(super) async fn run(
    app: &Arc<AppConfig>,
    a: ReportArgs,
    output: Output,
) -> Result<Exit, Failure> {
    let since = a.since.as_deref().map(parse_time).transpose()?;
    let report = aqw_core::ops::report(&queue_ops(app, &a.queue)?, since).await?;
    if output == Output::Json {
        print_json(&report);
    } else {
        print_text(&report);
    }
    Ok(Exit::needs_a_person_if(report.needs_a_person()))
}

/// The provider's answer to the completing attempt, in a few words.
fn provider_cell(k: &KeyOutcome) -> String {
    match (&k.provider, k.state) {
        (Some(a), _) => format!("{} (HTTP {})", a.answer, a.status),
        (None, "done") => "not recorded".into(),
        (None, _) => "-".into(),
    }
}

fn uncertain_cell(k: &KeyOutcome) -> String {
    match &k.uncertain {
        None => "-".into(),
        Some(u) if u.resolved => format!("{} resolved", u.attempts),
        Some(u) => format!("{} open", u.attempts),
    }
}

/// A row's cells, in the table's column order.
fn cells(r: &ReportRow) -> [String; 10] {
    let time = |t: Option<&str>| t.map_or("-".into(), |t| t.chars().take(19).collect());
    [
        one_line(&r.id),
        one_line(&r.function),
        time(Some(&r.poisoned_at)),
        r.decision.to_string(),
        r.by.as_deref().map_or("-".into(), one_line),
        time(r.at.as_deref()),
        r.key.as_deref().map_or("-".into(), one_line),
        r.key_state.state.to_string(),
        provider_cell(&r.key_state),
        uncertain_cell(&r.key_state),
    ]
}

const HEADERS: [&str; 10] = [
    "ID",
    "FUNCTION",
    "POISONED AT",
    "DECISION",
    "BY",
    "AT",
    "KEY",
    "KEY STATE",
    "PROVIDER",
    "UNCERTAIN",
];

fn print_text(report: &IncidentReport) {
    if report.records.is_empty() {
        let since = report
            .since
            .as_deref()
            .map_or(String::new(), |s| format!(" since {s}"));
        outln!("no poison records for {}{since}", one_line(&report.queue));
        return;
    }
    let rows: Vec<[String; 10]> = report.records.iter().map(cells).collect();
    let mut widths = HEADERS.map(|h| h.chars().count());
    for row in &rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        padded.join("  ").trim_end().to_string()
    };
    outln!("{}", line(&HEADERS.map(str::to_string)));
    let indent = " ".repeat(widths[0] + 2);
    for (row, r) in rows.iter().zip(&report.records) {
        outln!("{}", line(row));
        print_details(r, &indent);
    }
    print_totals(report);
}

/// Beneath a row: what happened, why, the uncertain attempt's provider
/// key, and the key a fix created.
fn print_details(r: &ReportRow, indent: &str) {
    let (first, tail) = first_line(&r.error);
    outln!(
        "{indent}happened:  {}: {}{tail}",
        r.error_kind,
        one_line(first)
    );
    if let Some(why) = &r.why {
        outln!("{indent}why:       {}", one_line(why));
    }
    if let Some(u) = r.key_state.uncertain.as_ref().filter(|u| !u.resolved) {
        let pk = u.provider_key.as_deref().unwrap_or("-");
        let key = r.key.as_deref().map_or("-".into(), one_line);
        outln!(
            "{indent}uncertain: {} attempt(s) may have taken effect under provider key {pk}: aqw keys check {} {key}",
            u.attempts,
            one_line(&r.function)
        );
    }
    match (&r.put_as, &r.created) {
        (Some(m), Some(c)) => outln!(
            "{indent}created:   message {} was poisoned again as record {}",
            one_line(m),
            one_line(c)
        ),
        (Some(m), None) => outln!("{indent}put as:    message {}", one_line(m)),
        _ => {}
    }
    if let Some(from) = &r.created_by {
        outln!(
            "{indent}from:      the replay or fix of record {}",
            one_line(from)
        );
    }
    if let Some(n) = &r.new_key {
        outln!(
            "{indent}new key:   {} (fix, message {}): {}, provider {}, uncertain {}",
            one_line(&n.key),
            n.message_id.as_deref().unwrap_or("-"),
            n.state.state,
            provider_cell(&n.state),
            uncertain_cell(&n.state)
        );
    }
}

fn print_totals(report: &IncidentReport) {
    let t = &report.totals;
    outln!(
        "{} record(s): {} open, {} replayed, {} fixed, {} discarded",
        t.records,
        t.open,
        t.replayed,
        t.fixed,
        t.discarded
    );
    outln!(
        "{} key(s): {} done exactly once, {} done more than once, {} not done, {} still uncertain, {} cancelled",
        t.keys,
        t.keys_done_once,
        t.keys_done_more_than_once,
        t.keys_not_done,
        t.uncertain,
        t.keys_cancelled
    );
    if t.keyless_uncertain > 0 {
        outln!(
            "{} keyless record(s) with an attempt that may have taken effect (no key settles them)",
            t.keyless_uncertain
        );
    }
    print_key_changes(report);
}

/// Every provider-key replacement: who, when, why, old → new.
fn print_key_changes(report: &IncidentReport) {
    if report.provider_key_changes.is_empty() {
        outln!("provider keys replaced: none");
        return;
    }
    outln!(
        "provider keys replaced: {}",
        report.provider_key_changes.len()
    );
    for c in &report.provider_key_changes {
        outln!(
            "  {} at {} by {}: {} -> {}; why: {}",
            one_line(&c.key),
            one_line(&c.change.at),
            one_line(&c.change.by),
            one_line(&c.change.old),
            one_line(&c.change.new),
            one_line(&c.change.reason)
        );
    }
}
