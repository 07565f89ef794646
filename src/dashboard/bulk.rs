//! Actions on every open record a query selects (a group of the alert, a
//! search, a time range, a function): replay with a dry run first, discard
//! with a reason after a review. Why they are safe to click:
//! - the selection is [`selection::select`], the list page's own, forced to
//!   open records;
//! - the dry run (or review) carries a fingerprint of the ids it showed, and
//!   the real action re-selects and refuses (409) when the same query now
//!   selects other records, so an action touches exactly what was reviewed;
//! - at most [`BULK_LIMIT`] records per action, one group action at a time
//!   per dashboard (429 otherwise), each record at most [`BULK_RATE`] per
//!   second, through the same [`crate::ops`] function as the CLI, so every
//!   record is audited as from the CLI (by = the signed-in principal), plus
//!   one log event per action naming the query and the fingerprint.

use super::auth::Principal;
use super::handlers::refusal;
use super::request::{get, page, pairs, tri, Pairs, Refused, S};
use super::selection::{self, fingerprint, SelectError};
use super::views::{self, csrf_field, enc, record_url, Viewer};
use super::Dashboard;
use crate::ops::{self, Filter, OpsError, QueueOps, ReplayOptions, ReplayReport};
use crate::poison::PoisonRecord;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use maud::{html, Markup};
use std::time::Duration;
use tokio::sync::MutexGuard;

/// Records one group action may touch; more must be narrowed (or done with
/// `aqw poison replay`, which has no cap).
pub const BULK_LIMIT: usize = 500;
/// Records per second a group action replays or discards: a storm of
/// re-puts would hit the provider that just recovered all at once.
pub const BULK_RATE: f64 = 50.0;

/// The query fields a group action carries from the list page to the real action.
const QUERY_FIELDS: [&str; 6] = ["since", "until", "function", "error", "search", "group"];

/// The query of a group action's form, forced to open records.
fn open_query(form: &Pairs) -> Pairs {
    let mut q: Pairs = QUERY_FIELDS
        .iter()
        .filter_map(|k| get(form, k).map(|v| (k.to_string(), v.to_string())))
        .collect();
    q.push(("status".into(), "open".into()));
    q
}

/// A readable summary of a query, for the audit log and the pages.
fn describe(query: &Pairs) -> String {
    let parts: Vec<String> = query
        .iter()
        .filter(|(k, _)| k != "status")
        .map(|(k, v)| format!("{k}={v:?}"))
        .collect();
    if parts.is_empty() {
        "every open record".into()
    } else {
        format!("open records with {}", parts.join(", "))
    }
}

impl Dashboard {
    /// The open records `form`'s query selects: between 1 and [`BULK_LIMIT`],
    /// and, for the real action, the very set the dry run showed.
    async fn bulk_selection(
        &self,
        v: &Viewer,
        ops: &QueueOps,
        form: &Pairs,
    ) -> Result<(Pairs, Vec<PoisonRecord>), Refused> {
        let no = |status, title, m: &str| Box::new(refusal(status, title, v, m));
        let query = open_query(form);
        let chosen = match selection::select(ops, &query).await {
            Ok(s) => s.into_chosen(),
            Err(SelectError::BadFilter(m)) => {
                return Err(no(StatusCode::BAD_REQUEST, "Bad filter", &m))
            }
            Err(SelectError::Ops(e)) => return Err(Box::new(self.ops_error(v, e))),
        };
        let (n, what) = (chosen.len(), describe(&query));
        if n == 0 {
            let m = format!("No open record matches ({what}). Nothing was changed.");
            return Err(no(StatusCode::CONFLICT, "Nothing matches", &m));
        }
        if n > BULK_LIMIT {
            let m = format!(
                "{n} open records match ({what}); a group action from the dashboard takes at most {BULK_LIMIT}. Narrow the filter, or use `aqw poison replay {} --since … --error …`, which has no cap. Nothing was changed.",
                ops.queue
            );
            return Err(no(StatusCode::BAD_REQUEST, "Too many records", &m));
        }
        let ids: Vec<String> = chosen.iter().map(|r| r.message_id.clone()).collect();
        if get(form, "mode") == Some("real") && get(form, "reviewed") != Some(&fingerprint(&ids)) {
            let m = format!(
                "The records this query selects changed since your review ({n} now match: {what}). Nothing was changed: go back to the list and review again."
            );
            return Err(no(StatusCode::CONFLICT, "Changed since the review", &m));
        }
        Ok((query, chosen))
    }
}

/// A group action that may go ahead: who asks, on which queue, and the
/// records its query selects.
struct Begun<'a> {
    form: Pairs,
    v: Viewer,
    p: Principal,
    ops: &'a QueueOps,
    query: Pairs,
    chosen: Vec<PoisonRecord>,
    ids: Vec<String>,
}

impl Dashboard {
    /// What both group actions check first: an actor with its CSRF token,
    /// a queue of this app, the one group-action slot (held until the
    /// returned guard drops), and a selection that may be acted on.
    async fn begin<'a>(
        &'a self,
        queue: &str,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<(Begun<'a>, MutexGuard<'a, ()>), Refused> {
        let form = pairs(body);
        let (v, p) = self.actor(headers, &form)?;
        let ops = self.queue_ops(queue)?;
        let Ok(slot) = self.bulk.try_lock() else {
            let m = "Another group action is running on this dashboard; try again when it has finished. Nothing was changed.";
            return Err(Box::new(refusal(
                StatusCode::TOO_MANY_REQUESTS,
                "Busy",
                &v,
                m,
            )));
        };
        let (query, chosen) = self.bulk_selection(&v, ops, &form).await?;
        let ids = chosen.iter().map(|r| r.message_id.clone()).collect();
        let begun = Begun {
            form,
            v,
            p,
            ops,
            query,
            chosen,
            ids,
        };
        Ok((begun, slot))
    }
}

pub async fn replay(
    State(d): S,
    Path(queue): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (b, _slot) = tri!(d.begin(&queue, &headers, &body).await);
    let Begun {
        form,
        v,
        p,
        ops,
        query,
        ids,
        ..
    } = b;
    let dry_run = get(&form, "mode") != Some("real");
    let opts = ReplayOptions {
        filter: Filter {
            ids: ids.clone(),
            ..Filter::default()
        },
        dry_run,
        by: p.name.clone(),
        rate: Some(BULK_RATE),
        concurrency: ops::DEFAULT_REPLAY_CONCURRENCY,
        past_provider_window: get(&form, "past_provider_window").is_some(),
        // The review page's "may have taken effect" mark is the check.
        uncertain_checked: true,
        ..ReplayOptions::default()
    };
    let report = match ops::replay(ops, &opts, &|_, _| {}).await {
        Ok(r) => r,
        Err(e) => return d.ops_error(&v, e),
    };
    let what = describe(&query);
    if dry_run {
        let body = replay_review(&queue, &report, &query, &fingerprint(&ids), &v);
        return page(StatusCode::OK, "Group replay: dry run", &v, None, body);
    }
    tracing::info!(event = "aqw.dashboard.group_replay", queue = %queue, by = %p.name, query = %what, selection = %fingerprint(&ids), selected = report.selected, replayed = report.replayed, already_done = report.already_done, failed = report.failed, "group replayed from the dashboard");
    let status = if report.failed > 0 {
        StatusCode::CONFLICT
    } else {
        StatusCode::OK
    };
    let body = html! {
        p #group-done { "Replayed " (report.replayed) " of " (report.selected) " (" (what) "); "
            (report.already_done) " already done (closed without a re-put), " (report.failed) " not replayed." }
        (views::dry_run_table(&queue, &report))
        p { a href={ "/q/" (enc(&queue)) } { "Back to the list" } }
    };
    page(status, "Group replay", &v, None, body)
}

pub async fn discard(
    State(d): S,
    Path(queue): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (b, _slot) = tri!(d.begin(&queue, &headers, &body).await);
    let Begun {
        form,
        v,
        p,
        ops,
        query,
        chosen,
        ids,
    } = b;
    let reason = get(&form, "reason").map(str::trim);
    let close_key = get(&form, "close_key").is_some();
    let Some(reason) = reason.filter(|_| get(&form, "mode") == Some("real")) else {
        let body = discard_review(&queue, &chosen, &query, &fingerprint(&ids), &v);
        return page(StatusCode::OK, "Group discard: review", &v, None, body);
    };
    let mut failed: Vec<(String, String)> = vec![];
    let pace = Duration::from_secs_f64(1.0 / BULK_RATE);
    for id in &ids {
        let started = tokio::time::Instant::now();
        if let Err(e) = ops::discard(ops, id, reason, &p.name, close_key).await {
            failed.push((id.clone(), why(e)));
        }
        tokio::time::sleep_until(started + pace).await;
    }
    let what = describe(&query);
    tracing::info!(event = "aqw.dashboard.group_discard", queue = %queue, by = %p.name, query = %what, selection = %fingerprint(&ids), selected = ids.len(), failed = failed.len(), close_key, "group discarded from the dashboard (the reason is on each record)");
    let status = if failed.is_empty() {
        StatusCode::OK
    } else {
        StatusCode::CONFLICT
    };
    let body = html! {
        p #group-done { "Discarded " (ids.len() - failed.len()) " of " (ids.len()) " (" (what) ")"
            @if close_key { ", their keys closed" } "." }
        @if !failed.is_empty() { table #group-failed {
            thead { tr { th { "id" } th { "not discarded" } } }
            tbody { @for (id, e) in &failed { tr { td.id { a href=(record_url(&queue, id)) { (id) } } td { (e) } } } }
        } }
        p { a href={ "/q/" (enc(&queue)) } { "Back to the list" } }
    };
    page(status, "Group discard", &v, None, body)
}

fn why(e: OpsError) -> String {
    crate::telemetry::scrub(&format!("{:#}", anyhow::Error::from(e)))
}

/// The hidden fields that carry a reviewed query to the real action.
fn carried(query: &Pairs, reviewed: &str, v: &Viewer) -> Markup {
    html! {
        (csrf_field(v))
        input type="hidden" name="mode" value="real";
        input type="hidden" name="reviewed" value=(reviewed);
        @for (k, val) in query.iter().filter(|(k, _)| k != "status") {
            input type="hidden" name=(k) value=(val);
        }
    }
}

fn replay_review(
    queue: &str,
    r: &ReplayReport,
    query: &Pairs,
    reviewed: &str,
    v: &Viewer,
) -> Markup {
    html! {
        p #group-review { "Dry run of a group replay: nothing has changed yet. "
            (r.selected) " open record(s): " (describe(query)) "." }
        (views::dry_run_table(queue, r))
        @if v.can_act {
            form method="post" action={ "/q/" (enc(queue)) "/group/replay" } {
                (carried(query, reviewed, v))
                @if r.past_provider_window { input type="hidden" name="past_provider_window" value="1"; }
                button #group-replay-real type="submit" { "Replay these " (r.selected) " for real" }
            }
        }
    }
}

fn discard_review(
    queue: &str,
    records: &[PoisonRecord],
    query: &Pairs,
    reviewed: &str,
    v: &Viewer,
) -> Markup {
    html! {
        p #group-review { "Review of a group discard: nothing has changed yet. "
            (records.len()) " open record(s): " (describe(query)) "." }
        table #group-records {
            thead { tr { th { "id" } th { "key" } th { "error" } } }
            tbody { @for r in records { tr {
                td.id { a href=(record_url(queue, &r.message_id)) { (r.message_id) } }
                td.id { (r.key.as_deref().unwrap_or("-")) }
                td.wrap { (selection::cause(r).1) }
            } } }
        }
        @if v.can_act {
            form method="post" action={ "/q/" (enc(queue)) "/group/discard" } {
                (carried(query, reviewed, v))
                label { "reason " input #group-discard-reason name="reason" required; }
                label { input type="checkbox" name="close_key" value="1"; " also close their keys (a producer's resend is then a duplicate)" }
                button #group-discard-real type="submit" { "Discard these " (records.len()) }
            }
        }
    }
}
