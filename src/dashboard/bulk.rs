//! Actions on every open record a query selects (a group of the alert, a
//! search, a time range, a function): replay with a dry run first, discard
//! with a reason after a review, fix with one JSON Patch after a preview
//! (which says, per record, whether the patch applies and the key the
//! corrected job derives, never the corrected body: a patch that moves a
//! redacted field elsewhere must not show it). Why they are safe to click:
//! - the selection is [`selection::select`], the list page's own, forced to
//!   open records;
//! - the dry run (or review) carries a digest of the ids it showed, and
//!   the real action re-selects and refuses (409) when the same query now
//!   selects other records, so an action touches exactly what was reviewed;
//!   a fix's preview carries a digest of the patch it applied, and the real
//!   fix runs only that patch. Both digests are keyed
//!   ([`selection::ReviewKey`], a secret of this process), so a client
//!   cannot compute one and skip the review;
//! - a patch passes the bounds of `aqw_core`'s `apply_patch` (growth,
//!   bytes copied, ops) or its preview is refused (400) before it runs;
//! - the real action is a durable operation ([`super::operations`]): a row
//!   naming who, the query, the fingerprint and the rate the review chose,
//!   carried out by a background task at that rate, not by the request (a
//!   closed tab cancels nothing), with no cap on the number of records;
//!   every record is audited as from the CLI (by = the signed-in principal
//!   and the operation's id), plus a log event when the operation starts
//!   and stops naming the query and the fingerprint.

use super::auth::Principal;
use super::error::{DashboardError, Path};
use super::forms::{Filters, GroupForm};
use super::operations::{op_id_field, op_id_of, rate_field, rate_of, selection_of};
use super::request::{page, Act, Answer, S};
use super::selection;
use super::text::{or_dash, Text};
use super::views::{self, csrf_field, enc, record_url, Viewer};
use super::Dashboard;
use aqw_core::ops::operation::{self, NewOperation, OpKind};
use aqw_core::ops::{self, Filter, QueueOps, ReplayOptions, ReplayReport};
use aqw_core::poison::PoisonRecord;
use axum::extract::State;
use axum::http::StatusCode;
use maud::{html, Markup};
use tokio::sync::MutexGuard;

/// The fields of a query a review carries to the real action (status is
/// always open).
fn carried_pairs(query: &Filters) -> Vec<(&'static str, &str)> {
    let mut pairs = query.pairs();
    pairs.retain(|(k, _)| *k != "status");
    pairs
}

/// A readable summary of a query, for the audit log and the pages.
fn describe(query: &Filters) -> String {
    let parts: Vec<String> = carried_pairs(query)
        .iter()
        .map(|(k, v)| format!("{k}={v:?}"))
        .collect();
    if parts.is_empty() {
        "every open record".into()
    } else {
        format!("open records with {}", parts.join(", "))
    }
}

impl Dashboard {
    /// The open records `form`'s query selects: at least one, and, for the
    /// real action, the very set the dry run showed.
    async fn bulk_selection(
        &self,
        ops: &QueueOps,
        form: &GroupForm,
    ) -> Result<(Filters, Vec<PoisonRecord>), DashboardError> {
        let query = form.filters();
        let chosen = selection::select(ops, &query).await?.into_chosen();
        let (n, what) = (chosen.len(), describe(&query));
        if n == 0 {
            let m = format!("No open record matches ({what}). Nothing was changed.");
            return Err(DashboardError::conflict("Nothing matches", m));
        }
        let ids: Vec<String> = chosen.iter().map(|r| r.message_id.clone()).collect();
        let reviewed = (self.review).ids_ok(&ops.queue, &ids, form.reviewed.get());
        if form.real() && !reviewed {
            let m = format!(
                "The records this query selects changed since your review ({n} now match: {what}). Nothing was changed: go back to the list and review again."
            );
            return Err(DashboardError::conflict("Changed since the review", m));
        }
        Ok((query, chosen))
    }
}

/// A group action that may go ahead: who asks, on which queue, and the
/// records its query selects.
struct Begun<'a> {
    form: GroupForm,
    v: Viewer,
    p: Principal,
    ops: &'a QueueOps,
    query: Filters,
    chosen: Vec<PoisonRecord>,
    ids: Vec<String>,
}

impl Dashboard {
    /// What every group action checks after its asker and form ([`Act`]):
    /// a queue of this app, a real action not submitted before, the one
    /// group-action slot (held until the returned guard drops), and a
    /// selection that may be acted on.
    async fn begin<'a>(
        &'a self,
        queue: &str,
        Act { v, p, form }: Act<GroupForm>,
    ) -> Result<(Begun<'a>, MutexGuard<'a, ()>), DashboardError> {
        let ops = self.queue_ops(queue)?;
        if form.real() {
            // Submitted before: show what that submission created.
            if let Some(op) = self.submitted_before(&form.op).await? {
                return Err(DashboardError::SubmittedBefore(op.id));
            }
        }
        let Ok(slot) = self.bulk.try_lock() else {
            return Err(DashboardError::Busy("Another group action is running on this dashboard; try again when it has finished. Nothing was changed."));
        };
        let (query, chosen) = self.bulk_selection(ops, &form).await?;
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

pub async fn replay(State(d): S, Path(queue): Path<String>, act: Act<GroupForm>) -> Answer {
    let (b, _slot) = d.begin(&queue, act).await?;
    let past_provider_window = b.form.past_provider_window.is_set();
    if b.form.real() {
        let kind = OpKind::Replay {
            past_provider_window,
            // The review page's "may have taken effect" mark is the check.
            uncertain_checked: true,
        };
        return d.start_group(&b, &queue, kind).await;
    }
    let opts = ReplayOptions {
        filter: Filter {
            ids: b.ids.clone(),
            ..Filter::default()
        },
        dry_run: true,
        by: b.p.name.clone(),
        concurrency: ops::DEFAULT_REPLAY_CONCURRENCY,
        past_provider_window,
        uncertain_checked: true,
        ..ReplayOptions::default()
    };
    let report = ops::replay(b.ops, &opts, &|_, _| {}).await?;
    let reviewed = d.review.ids(&queue, &b.ids);
    let body = replay_review(&queue, &report, &b.query, &reviewed, &b.v);
    Ok(page(
        StatusCode::OK,
        "Group replay: dry run",
        &b.v,
        None,
        body,
    ))
}

impl Dashboard {
    /// The real group action: an operation row for the reviewed selection,
    /// carried out in the background; the answer is its page.
    async fn start_group(&self, b: &Begun<'_>, queue: &str, kind: OpKind) -> Answer {
        let bad = |m: String| DashboardError::bad_input("Bad request", m);
        let selection = selection_of(&b.query).map_err(bad)?;
        let rate = rate_of(&b.form.rate).map_err(bad)?;
        let id = op_id_of(&b.form.op).map_err(bad)?;
        let new = NewOperation {
            queue: queue.to_string(),
            kind,
            by: b.p.name.clone(),
            selection,
            // The unkeyed fingerprint, as the CLI's: comparable anywhere.
            fingerprint: operation::fingerprint(&b.ids),
            selected: b.ids.len() as u64,
            rate,
            halt_after: operation::DEFAULT_HALT_AFTER,
        };
        let (op, _) = self.start_operation(new, &id).await?;
        Ok(super::request::see_other(&format!("/ops/{}", enc(&op.id))))
    }
}

pub async fn discard(State(d): S, Path(queue): Path<String>, act: Act<GroupForm>) -> Answer {
    let (b, _slot) = d.begin(&queue, act).await?;
    let reason = b.form.reason.get().map(str::trim);
    let Some(reason) = reason.filter(|_| b.form.real()) else {
        let reviewed = d.review.ids(&queue, &b.ids);
        let body = discard_review(&queue, &b.chosen, &b.query, &reviewed, &b.v);
        return Ok(page(
            StatusCode::OK,
            "Group discard: review",
            &b.v,
            None,
            body,
        ));
    };
    let kind = OpKind::Discard {
        reason: reason.to_string(),
        close_key: b.form.close_key.is_set(),
    };
    d.start_group(&b, &queue, kind).await
}

/// The hidden fields that carry a reviewed query to the real action.
fn carried(query: &Filters, reviewed: &str, v: &Viewer) -> Markup {
    html! {
        (csrf_field(v))
        input type="hidden" name="mode" value="real";
        input type="hidden" name="reviewed" value=(reviewed);
        (op_id_field())
        (query_fields(query))
    }
}

/// A query's fields as hidden inputs (status aside: always open).
fn query_fields(query: &Filters) -> Markup {
    html! {
        @for (k, val) in carried_pairs(query) {
            input type="hidden" name=(k) value=(val);
        }
    }
}

fn replay_review(
    queue: &str,
    r: &ReplayReport,
    query: &Filters,
    reviewed: &str,
    v: &Viewer,
) -> Markup {
    html! {
        p #group-review { "Dry run of a group replay: nothing has changed yet. "
            (r.selected) " open record(s): " (Text(&describe(query))) "." }
        (views::dry_run_table(queue, r))
        @if v.can_act {
            form method="post" action={ "/q/" (enc(queue)) "/group/replay" } {
                (carried(query, reviewed, v))
                @if r.past_provider_window { input type="hidden" name="past_provider_window" value="1"; }
                (rate_field())
                button #group-replay-real type="submit" { "Replay these " (r.selected) " for real" }
            }
        }
    }
}

fn discard_review(
    queue: &str,
    records: &[PoisonRecord],
    query: &Filters,
    reviewed: &str,
    v: &Viewer,
) -> Markup {
    html! {
        p #group-review { "Review of a group discard: nothing has changed yet. "
            (records.len()) " open record(s): " (Text(&describe(query))) "." }
        table #group-records {
            thead { tr { th { "id" } th { "key" } th { "error" } } }
            tbody { @for r in records { tr {
                td.id { a href=(record_url(queue, &r.message_id)) { (Text(&r.message_id)) } }
                td.id { (or_dash(r.key.as_deref())) }
                td.wrap { (Text(&selection::cause(r).1)) }
            } } }
        }
        @if v.can_act {
            form method="post" action={ "/q/" (enc(queue)) "/group/discard" } {
                (carried(query, reviewed, v))
                label { "reason " input #group-discard-reason name="reason" required; }
                label { input type="checkbox" name="close_key" value="1"; " also close their keys (a producer's resend is then a duplicate)" }
                (rate_field())
                button #group-discard-real type="submit" { "Discard these " (records.len()) }
            }
        }
    }
}

/// How many records a group fix's preview patches (each may read a blob).
const FIX_PREVIEW_ROWS: usize = 100;

/// A group fix: the review asks for a patch, the preview applies it to each
/// record (nothing changes), the real action is an operation of kind fix.
pub async fn fix(State(d): S, Path(queue): Path<String>, act: Act<GroupForm>) -> Answer {
    let (b, _slot) = d.begin(&queue, act).await?;
    let patch_text = b.form.patch.get().map(str::trim).unwrap_or_default();
    if patch_text.is_empty() {
        let reviewed = d.review.ids(&queue, &b.ids);
        let body = fix_review(&queue, &b.chosen, &b.query, &reviewed, "", &b.v, None);
        return Ok(page(StatusCode::OK, "Group fix: patch", &b.v, None, body));
    }
    if let Some(why) = operation::fix_refused(b.ops) {
        return Err(DashboardError::bad_input("Bad request", why));
    }
    let none = aqw_core::redact::Redaction::default();
    let redact = b.ops.function.as_ref().map_or(&none, |f| &f.redact);
    let patch = operation::parse_patch_for(patch_text, redact)
        .map_err(|m| DashboardError::bad_input("Bad request", format!("patch: {m}")))?;
    if !b.form.real() {
        return d.fix_preview_page(&queue, &b, patch_text, &patch).await;
    }
    // The ids were reviewed (begin checked); the patch must be the one
    // previewed, not one edited after the preview.
    if !(d.review).patch_ok(&queue, patch_text, b.form.patch_reviewed.get()) {
        let m = "The patch is not the one previewed (it was edited after its preview, or never previewed). Nothing was changed: preview it, then fix.";
        return Err(DashboardError::conflict("Preview this patch first", m));
    }
    let kind = OpKind::Fix {
        patch: patch_text.to_string(),
        past_provider_window: b.form.past_provider_window.is_set(),
    };
    d.start_group(&b, &queue, kind).await
}

impl Dashboard {
    /// The preview of `patch` on the reviewed records (nothing changes),
    /// carrying this process's digests of the ids and the patch; 400 when
    /// the patch passes a bound on one of them.
    async fn fix_preview_page(
        &self,
        queue: &str,
        b: &Begun<'_>,
        patch_text: &str,
        patch: &operation::Patch,
    ) -> Answer {
        let preview = fix_preview(b.ops, &b.chosen, patch).await.map_err(|m| {
            DashboardError::bad_input("Bad request", format!("patch: {m}. Nothing was changed."))
        })?;
        let reviewed = self.review.ids(queue, &b.ids);
        let patch_reviewed = self.review.patch(queue, patch_text);
        let body = fix_review(
            queue,
            &b.chosen,
            &b.query,
            &reviewed,
            patch_text,
            &b.v,
            Some((&preview, &patch_reviewed)),
        );
        Ok(page(StatusCode::OK, "Group fix: preview", &b.v, None, body))
    }
}

/// One previewed record: its id, and the key the corrected job derives or
/// why the patch does not give a job the worker would run.
struct FixPreview {
    id: String,
    outcome: Result<String, String>,
}

/// The patch applied to the first [`FIX_PREVIEW_ROWS`] records; why not,
/// when it passes a bound on one of them (the patch itself is refused).
async fn fix_preview(
    ops: &QueueOps,
    records: &[PoisonRecord],
    patch: &operation::Patch,
) -> Result<Vec<FixPreview>, String> {
    let mut rows = vec![];
    for listed in records.iter().take(FIX_PREVIEW_ROWS) {
        // The list reads no payloads: read the whole record.
        let outcome = match ops.record(&listed.message_id).await {
            Ok(Some((r, _))) => operation::preview_fix(ops, &r, patch).await,
            Ok(None) => Err(operation::PatchError::NotApplied(
                "the record vanished".into(),
            )),
            Err(e) => Err(operation::PatchError::NotApplied(aqw_core::scrub::scrub(
                &e.to_string(),
            ))),
        };
        let outcome = match outcome {
            Err(operation::PatchError::Refused(m)) => {
                return Err(format!("{m} (on record {})", listed.message_id))
            }
            other => other.map_err(|e| e.to_string()),
        };
        rows.push(FixPreview {
            id: listed.message_id.clone(),
            outcome,
        });
    }
    Ok(rows)
}

fn fix_review(
    queue: &str,
    records: &[PoisonRecord],
    query: &Filters,
    reviewed: &str,
    patch: &str,
    v: &Viewer,
    preview: Option<(&[FixPreview], &str)>,
) -> Markup {
    let applies = preview.map(|(p, _)| p.iter().filter(|r| r.outcome.is_ok()).count());
    html! {
        p #group-review { "Group fix: nothing has changed yet. " (records.len())
            " open record(s): " (Text(&describe(query))) ". One JSON Patch (RFC 6902) is applied to each payload; "
            "a record it does not apply to is left open." }
        @if let Some((rows, _)) = preview {
            p #fix-preview-summary { "The patch applies to " (applies.unwrap_or(0)) " of the first " (rows.len()) "." }
            table #fix-preview {
                thead { tr { th { "id" } th { "corrected job" } } }
                tbody { @for r in rows { tr {
                    td.id { a href=(record_url(queue, &r.id)) { (Text(&r.id)) } }
                    @match &r.outcome {
                        Ok(k) => td.id { (Text(k)) },
                        Err(e) => td.wrap.refused { (Text(e)) },
                    }
                } } }
            }
        }
        @if v.can_act {
            form method="post" action={ "/q/" (enc(queue)) "/group/fix" } {
                (csrf_field(v))
                input type="hidden" name="reviewed" value=(reviewed);
                (op_id_field())
                (query_fields(query))
                label { "JSON Patch " textarea #group-fix-patch name="patch" rows="4" cols="80" required { (patch) } }
                @if let Some((_, patch_reviewed)) = preview {
                    input type="hidden" name="patch_reviewed" value=(patch_reviewed);
                    (rate_field())
                    button #group-fix-preview name="mode" value="preview" type="submit" { "Preview again" }
                    " "
                    button #group-fix-real name="mode" value="real" type="submit" { "Fix these " (records.len()) }
                } @else {
                    button #group-fix-preview name="mode" value="preview" type="submit" { "Preview" }
                }
            }
        }
    }
}
