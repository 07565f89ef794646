//! The front page's triage section: for each queue with open records, the
//! plan `aqw triage QUEUE` prints (the engine's `ops::triage::plan`), made
//! without asking the provider's lookup (a page view never calls the
//! provider; the CLI does).

use super::text::Text;
use super::views::enc;
use aqw_core::ops::triage::{StepKind, TriageGroup, TriagePlan};
use aqw_core::ops::QueueOps;
use maud::{html, Markup};

/// The plans of `queues` (those with open records), or why a queue's
/// could not be made.
pub async fn plans(queues: &[&QueueOps]) -> Vec<(String, Result<TriagePlan, String>)> {
    let plans = futures::future::join_all(queues.iter().map(|q| crate::triage::gather(q, false)));
    queues
        .iter()
        .zip(plans.await)
        .map(|(q, p)| (q.queue.clone(), p.map_err(|e| e.to_string())))
        .collect()
}

/// The section, at the top of the front page; nothing when nothing is open.
pub fn section(plans: &[(String, Result<TriagePlan, String>)]) -> Markup {
    html! {
        @for (queue, plan) in plans {
            section.triage id={ "triage-" (enc(queue)) } {
                @match plan {
                    Ok(p) if p.open > 0 => { (plan_view(p)) }
                    Ok(_) => {}
                    Err(e) => { p.error { "triage of " (Text(queue)) ": cannot read: " (Text(e)) } }
                }
            }
        }
    }
}

fn plan_view(p: &TriagePlan) -> Markup {
    let v = &p.provider;
    html! {
        h2 { "Triage: " (Text(&p.queue)) " — " (p.open) " open record(s) in " (p.groups.len()) " group(s), most urgent first" }
        p.muted {
            "Provider answering: " strong { (v.answering) } " (" (Text(&v.why)) "). Breaker " (Text(&v.breaker))
            "; saves failures: " (Text(v.saves_failures.as_deref().unwrap_or("not known to")))
            ". The same plan on the command line: " code { "aqw triage " (Text(&p.queue)) }
            " (it also asks the provider's lookup about uncertain attempts)."
        }
        @for n in &p.notes { p.muted { "Note: " (Text(n)) } }
        ol.groups { @for g in &p.groups { (group_view(g)) } }
        p { "When every group is done:" }
        ul.steps { @for s in &p.confirm { li { code { (Text(&s.text)) } " — " (Text(&s.why)) } } }
    }
}

fn group_view(g: &TriageGroup) -> Markup {
    let status = g.status.map(|s| format!(" (HTTP {s})")).unwrap_or_default();
    html! {
        li.group data-cause=(g.cause.slug()) {
            strong { (g.cause.slug()) } ": " (g.count) " × " (Text(&g.error_kind)) (status) ": " code { (Text(&g.error)) }
            p { "Records: " (Text(&g.ids.iter().take(10).cloned().collect::<Vec<_>>().join(", ")))
                @if g.ids.len() > 10 { " … and " (g.ids.len() - 10) " more" } }
            @for r in g.records.iter().filter(|r| r.uncertain || r.lookup.is_some()).take(10) {
                p.muted { (Text(&r.id)) ": "
                    @if r.uncertain { "an attempt may have taken effect; " }
                    @if let Some(l) = &r.lookup { "provider says: " (Text(&l.line)) }
                    @if let Some(w) = &r.window { "; " (Text(w)) } }
            }
            p { "Means: " (Text(&g.meaning)) }
            ol.steps { @for s in &g.steps { li {
                @match s.kind {
                    StepKind::Run => { code { (Text(&s.text)) } }
                    StepKind::Edit => { "edit the CAPITALS first: " code { (Text(&s.text)) } }
                    StepKind::Do => { em { (Text(&s.text)) } }
                }
                " — " (Text(&s.why))
            } } }
            p.muted { "Runbook: " code { (Text(&g.runbook)) } }
        }
    }
}
