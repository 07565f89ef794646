//! `aqw triage QUEUE`: the open records grouped by cause, most urgent
//! first, with what aqw knows, what it means and the next commands (the
//! plan is the engine's, `aqw_core::ops::triage`; the reads are `aqw::triage`).

use super::exit::{Exit, Failure};
use super::load::{load, queue_ops};
use super::output::print_json;
use super::output::Output;
use aqw_core::ops::triage::{RecordFacts, StepKind, TriageGroup, TriagePlan};
use clap::Args;
use std::path::Path;

/// The open poison records grouped by cause, most urgent first, with what
/// aqw knows, what it means and the exact next commands; exit 1 while any is open.
#[derive(Args)]
#[command(
    after_help = "Exit codes: 0 nothing open; 1 records are open (the plan is printed); 2 bad arguments or configuration; 3 storage error.\n\nAsks the function's handler.lookup about each attempt that may have taken effect, and about a refusal of a provider that saves failures.\n\nExamples:\n  aqw triage payouts\n  aqw triage payouts --output json"
)]
pub struct TriageArgs {
    /// Source queue of the poisoned messages (not the -poison queue).
    pub queue: String,
}

/// How many ids a text group lists (JSON lists all).
const IDS_SHOWN: usize = 10;

pub(super) async fn run(app_dir: &Path, a: TriageArgs, output: Output) -> Result<Exit, Failure> {
    let app = load(app_dir)?;
    let ops = queue_ops(&app, &a.queue)?;
    let plan = aqw::triage::gather(&ops, true).await?;
    match output {
        Output::Json => print_json(&plan),
        Output::Text => text(&plan),
    }
    Ok(Exit::needs_a_person_if(plan.open > 0))
}

fn text(p: &TriagePlan) {
    if p.open == 0 {
        outln!("TRIAGE {}: nothing open", p.queue);
        return;
    }
    outln!(
        "TRIAGE {} (function {}): {} open record(s) in {} group(s), most urgent first",
        p.queue,
        p.function,
        p.open,
        p.groups.len()
    );
    let v = &p.provider;
    outln!("provider answering: {} ({})", v.answering, v.why);
    outln!(
        "  breaker {}; last success {}; lookup {}; providerKeyWindow {}",
        v.breaker,
        v.last_success.as_deref().unwrap_or("none seen"),
        if v.lookup { "configured" } else { "none" },
        v.provider_key_window.as_deref().unwrap_or("not set")
    );
    if let Some(why) = &v.paused {
        outln!("  {why}");
    }
    match &v.saves_failures {
        Some(why) => outln!("  saves failures under a key: yes, {why}"),
        None => outln!("  saves failures under a key: not known to"),
    }
    if v.idempotent {
        outln!("  honours Idempotency-Key: declared (handler.idempotent)");
    }
    for n in &p.notes {
        outln!("note: {n}");
    }
    for (i, g) in p.groups.iter().enumerate() {
        group(i + 1, g);
    }
    outln!("");
    outln!("when every group is done:");
    for s in &p.confirm {
        outln!("    {}    # {}", s.text, s.why);
    }
}

fn group(n: usize, g: &TriageGroup) {
    outln!("");
    let status = g.status.map(|s| format!(" (HTTP {s})")).unwrap_or_default();
    outln!(
        "{n}. {}: {} × {}{status}: {}",
        g.cause.slug(),
        g.count,
        g.error_kind,
        g.error
    );
    let shown: Vec<&str> = g.ids.iter().take(IDS_SHOWN).map(String::as_str).collect();
    let more = g.ids.len().saturating_sub(IDS_SHOWN);
    let more = if more > 0 {
        format!(" … and {more} more (--output json lists all)")
    } else {
        String::new()
    };
    outln!("   records: {}{more}", shown.join(", "));
    if !g.keys.is_empty() {
        let keys: Vec<&str> = g.keys.iter().take(IDS_SHOWN).map(String::as_str).collect();
        outln!("   keys: {}", keys.join(", "));
    }
    for r in g.records.iter().filter(|r| worth_a_line(r)).take(IDS_SHOWN) {
        record(r);
    }
    outln!("   means: {}", g.meaning);
    outln!("   next (runbook: {}):", g.runbook);
    for s in &g.steps {
        match s.kind {
            StepKind::Run => outln!("    {}    # {}", s.text, s.why),
            StepKind::Edit => outln!("    {}    # edit the CAPITALS first: {}", s.text, s.why),
            StepKind::Do => outln!("    # do: {} ({})", s.text, s.why),
        }
    }
}

fn worth_a_line(r: &RecordFacts) -> bool {
    r.uncertain || r.lookup.is_some() || r.past_window
}

fn record(r: &RecordFacts) {
    let mut parts = Vec::new();
    if let Some(s) = &r.key_state {
        parts.push(s.clone());
    }
    if r.uncertain {
        parts.push("an attempt may have taken effect".into());
    }
    if let Some(pk) = &r.provider_key {
        parts.push(format!("provider key {pk}"));
    }
    if let Some(l) = &r.lookup {
        parts.push(format!("provider says: {}", l.line));
    }
    if let Some(w) = &r.window {
        parts.push(w.clone());
    }
    outln!(
        "   {} ({}): {}",
        r.id,
        r.key.as_deref().unwrap_or("no key"),
        parts.join("; ")
    );
}
