//! Durable group operations on the dashboard (issue 40): a group replay or
//! discard, once reviewed, becomes an operation row carried out by a
//! background task of this process (not by the request: a closed tab
//! cancels nothing; if this process dies, an idle `aqw run` resumes it once
//! its lease expires). `/ops` lists the operations, `/ops/{id}` watches
//! one (refreshing itself while it runs) and cancels it.

use super::error::{DashboardError, Path};
use super::forms::{CsrfForm, Filters, One};
use super::request::{page, see_other, Act, Answer, Reader, S};
use super::text::{or_dash, Text};
use super::views::{csrf_field, enc, Viewer};
use super::Dashboard;
use aqw_core::ops::operation::{
    self as operation, CancelRefusal, ExecuteOptions, NewOperation, OpKind, Operation,
    OperationStore, Selection,
};
use aqw_core::ops::{OpsError, QueueOps};
use axum::extract::State;
use axum::http::StatusCode;
use maud::{html, Markup};
use std::sync::Arc;

/// Seconds between refreshes of a running operation's page.
const REFRESH_SECS: u32 = 2;

/// The operation selection a group action's query is: the list page's
/// filter (its error box is a case-insensitive substring), search and group.
pub(super) fn selection_of(query: &Filters) -> Result<Selection, String> {
    let time = |k: &str, v: &One| {
        v.get()
            .map(|s| aqw_core::ops::parse_time(s).map(aqw_core::idempotency::fmt_time))
            .transpose()
            .map_err(|e| format!("{k}: {e}"))
    };
    let text = |v: &One| v.get().map(str::to_string);
    Ok(Selection {
        function: text(&query.function),
        error: (query.error.get()).map(|e| format!("(?i){}", regex::escape(e))),
        since: time("since", &query.since)?,
        until: time("until", &query.until)?,
        group: text(&query.group),
        search: text(&query.search),
        limit: None,
        cutoff: String::new(),
    })
}

/// The id a reviewed form carries for the operation it creates (made when
/// the review was shown: a second submission finds the first's row); a
/// fresh one for a form without it.
pub(super) fn op_id_of(op: &One) -> Result<String, String> {
    match op.get() {
        Some(id) if OperationStore::is_id(id) => Ok(id.to_string()),
        Some(_) => Err(
            "the form's operation id is not one: reload the review. Nothing was changed.".into(),
        ),
        None => Ok(OperationStore::new_id()),
    }
}

/// The hidden field that makes a reviewed form's operation once-only.
pub(super) fn op_id_field() -> Markup {
    html! { input type="hidden" name="op" value=(OperationStore::new_id()); }
}

/// The rate a review form asked for (records per second), checked.
pub(super) fn rate_of(rate: &One) -> Result<f64, String> {
    let Some(text) = rate.get() else {
        return Ok(operation::DEFAULT_RATE);
    };
    match text.trim().parse::<f64>() {
        Ok(r) if r.is_finite() && (operation::MIN_RATE..=1000.0).contains(&r) => Ok(r),
        _ => Err(format!(
            "rate {:?}: records per second must be between {} and 1000. Nothing was changed.",
            aqw_core::scrub::scrub(text),
            operation::MIN_RATE
        )),
    }
}

/// The rate box of a review form.
pub(super) fn rate_field() -> Markup {
    html! {
        label { "records per second " input #group-rate name="rate" type="number" min="0.1" max="1000" step="any" value=(operation::DEFAULT_RATE); }
    }
}

impl Dashboard {
    fn owned_queue(&self, name: &str) -> Option<Arc<QueueOps>> {
        self.queues.iter().find(|q| q.queue == name).cloned()
    }

    /// Every distinct operations store (one per control table the queues use).
    fn op_stores(&self) -> Vec<OperationStore> {
        let mut seen = vec![];
        let mut stores = vec![];
        for q in &self.queues {
            let t = q.control.table();
            if !seen
                .iter()
                .any(|s: &Arc<dyn aqw_core::storage::TableStore>| Arc::ptr_eq(s, t))
            {
                seen.push(t.clone());
                stores.push(OperationStore::new(t.clone()));
            }
        }
        stores
    }

    /// Create the operation under `id` (once: a form submitted twice gets
    /// the first submission's operation, `false`) and start its executor on
    /// a task of its own.
    pub(super) async fn start_operation(
        &self,
        new: NewOperation,
        id: &str,
    ) -> Result<(Operation, bool), OpsError> {
        let ops = self
            .owned_queue(&new.queue)
            .ok_or_else(|| OpsError::Usage(format!("no function consumes {}", new.queue)))?;
        let store = OperationStore::new(ops.control.table().clone());
        let opts = ExecuteOptions::new(format!(
            "dashboard-{}-{}",
            std::process::id(),
            &uuid::Uuid::new_v4().simple().to_string()[..6]
        ));
        // Held from its insert, so an idle `aqw run` cannot take it first.
        let (op, created) = store
            .create_held_once(id, &new, &opts.owner, opts.lease)
            .await?;
        if !created {
            return Ok((op, false));
        }
        let id = op.id.clone();
        tokio::spawn(async move {
            if let Err(e) = operation::execute(&ops, &store, &id, &opts).await {
                let e = aqw_core::scrub::scrub(&e.to_string());
                tracing::warn!(event = "aqw.operation.executor_failed", operation = %id, error = %e, "the operation stopped on a storage error; its lease expires and an idle `aqw run` resumes it");
            }
        });
        Ok((op, true))
    }

    /// The operation a reviewed form's `op` names, when a submission of
    /// that form already created it (issue 48: the same form posted twice
    /// made two operations).
    pub(super) async fn submitted_before(&self, op: &One) -> Result<Option<Operation>, OpsError> {
        match op.get().filter(|id| OperationStore::is_id(id)) {
            Some(id) => self.find_op(id).await,
            None => Ok(None),
        }
    }

    async fn find_op(&self, id: &str) -> Result<Option<Operation>, OpsError> {
        for store in self.op_stores() {
            if let Some((op, _)) = store.get(id).await? {
                return Ok(Some(op));
            }
        }
        Ok(None)
    }
}

pub async fn list(State(d): S, Reader(v): Reader) -> Answer {
    let mut all = vec![];
    for store in d.op_stores() {
        all.extend(store.list().await?);
    }
    all.sort_by(|a, b| b.id.cmp(&a.id));
    let running = all.iter().any(|o| !o.state.is_final());
    let body = html! {
        @if all.is_empty() { p #ops-none { "No group operation yet." } }
        @else { table #ops {
            thead { tr { th { "id" } th { "state" } th { "kind" } th { "queue" } th { "done / selected" } th { "by" } } }
            tbody { @for o in &all { tr {
                td.id { a href={ "/ops/" (enc(&o.id)) } { (Text(&o.id)) } }
                td.state { (o.state.as_str()) } td { (o.kind.name()) } td { (Text(&o.queue)) }
                td { (o.done) " / " (o.selected) } td { (Text(&o.by)) }
            } } }
        } }
    };
    let refresh = running.then_some(REFRESH_SECS);
    Ok(page(StatusCode::OK, "Group operations", &v, refresh, body))
}

/// 404 for an id no operation can have, before any storage call.
fn no_such_operation(id: &str) -> Result<(), DashboardError> {
    if OperationStore::is_id(id) {
        return Ok(());
    }
    Err(DashboardError::not_found(
        "No such operation",
        "No group operation has that id: ids are letters, digits and dashes.",
    ))
}

/// The 404 of an id no operation has.
fn unknown_operation() -> DashboardError {
    DashboardError::not_found("No such operation", "No group operation has that id.")
}

pub async fn show(State(d): S, Path(id): Path<String>, Reader(v): Reader) -> Answer {
    no_such_operation(&id)?;
    let op = d.find_op(&id).await?.ok_or_else(unknown_operation)?;
    let refresh = (!op.state.is_final()).then_some(REFRESH_SECS);
    let patch = match &op.kind {
        OpKind::Fix { patch, .. } => Some(d.patch_shown(&op.queue, patch, v.can_act)),
        _ => None,
    };
    let body = op_view(&op, patch.as_deref(), &v);
    Ok(page(StatusCode::OK, "Group operation", &v, refresh, body))
}

impl Dashboard {
    /// A fix's patch as `/ops/{id}` shows it ([`aqw_core::redact::patch_for_display`]):
    /// values only to a viewer who may act, and then masked where they
    /// write a field the function of `queue` redacts; none when no function
    /// of this app consumes `queue`, whose rules are then unknown.
    fn patch_shown(&self, queue: &str, patch: &str, can_act: bool) -> String {
        let ops = self.owned_queue(queue);
        let function = ops.as_ref().and_then(|q| q.function.as_ref());
        let none = aqw_core::redact::Redaction::default();
        let redact = function.map_or(&none, |f| &f.redact);
        let shown =
            aqw_core::redact::patch_for_display(patch, redact, can_act && function.is_some());
        aqw_core::scrub::printable(&shown).to_string()
    }
}

fn op_view(op: &Operation, patch: Option<&str>, v: &Viewer) -> Markup {
    html! {
        p #op-state { "Operation " (Text(&op.id)) ": " strong { (op.state.as_str()) } ", " (op.kind.name()) " on " (Text(&op.queue)) "." }
        p #op-progress { (op.done) " done, " (op.skipped) " skipped, " (op.failed) " failed of "
            (op.selected) " selected, at " (op.rate) " per second." }
        dl {
            dt { "asked by" } dd { (Text(&op.by)) " at " (Text(&op.created_at)) }
            dt { "selection" } dd { (Text(&op.selection.describe())) }
            dt { "fingerprint of the reviewed ids" } dd.id { (Text(&op.fingerprint)) }
            @if let OpKind::Discard { reason, close_key } = &op.kind {
                dt { "reason" } dd { (Text(reason)) @if *close_key { " (keys closed)" } }
            }
            @if let Some(patch) = patch {
                dt { "JSON Patch" } dd.id #op-patch { (Text(patch)) }
                @if !v.can_act { dd #op-patch-values { "Values are shown only to those who may act." } }
            }
            @if op.returned_poisoned > 0 { dt { "replayed jobs back in poison" } dd { (op.returned_poisoned) } }
            @if let Some(r) = &op.stop_reason { dt { "stopped" } dd #op-stopped { (Text(r)) } }
            @if let Some(e) = &op.last_error { dt { "last error" } dd { (Text(e)) } }
            @if let (Some(o), false) = (&op.lease_owner, op.state.is_final()) {
                dt { "carried out by" } dd { (Text(o)) " until " (or_dash(op.lease_until.as_deref())) }
            }
        }
        @if v.can_act && !op.state.is_final() {
            form method="post" action={ "/ops/" (enc(&op.id)) "/cancel" } {
                (csrf_field(v))
                button #op-cancel type="submit" { "Cancel this operation" }
            }
        }
        p { a href="/ops" { "All operations" } " · " a href={ "/q/" (enc(&op.queue)) } { "Back to the list" } }
    }
}

pub async fn cancel(State(d): S, Path(id): Path<String>, Act { p, .. }: Act<CsrfForm>) -> Answer {
    no_such_operation(&id)?;
    for store in d.op_stores() {
        match store.cancel(&id, &p.name).await? {
            Ok(_) => return Ok(see_other(&format!("/ops/{}", enc(&id)))),
            Err(CancelRefusal::Unknown { .. }) => continue,
            Err(why) => return Err(DashboardError::conflict("Not cancelled", why.to_string())),
        }
    }
    Err(unknown_operation())
}
