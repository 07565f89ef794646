//! The pages, as maud templates: every value is HTML-escaped by maud, and no
//! page has inline script or style (the CSP forbids both).

use super::payload::PayloadView;
use super::text::{or_dash, Text};
use aqw_core::idempotency::KeyRecord;
use aqw_core::ops::{ProviderWindow, QueueStatus, ReplayReport};
use aqw_core::poison::{PoisonRecord, RecordStatus};
use aqw_core::schedule::ScheduleStatus;
use maud::{html, Markup, DOCTYPE};

/// Who is looking, and what they may do.
#[derive(Debug, Clone, Default)]
pub struct Viewer {
    /// The principal's name, when authenticated.
    pub name: Option<String>,
    /// The CSRF token of this viewer's forms.
    pub csrf: Option<String>,
    /// Actions are enabled and this viewer may use them.
    pub can_act: bool,
    /// Signed in with a session cookie (a logout button makes sense).
    pub session: bool,
    pub read_only: bool,
    /// The configured queues, for the navigation.
    pub queues: Vec<String>,
    /// `aqw.alert.runbookUrl`, linked from the navigation when set.
    pub runbook: Option<String>,
}

/// How long before `now` the RFC 3339 time `at` was, coarsely ("45 s ago",
/// "12 min ago", "3 h ago", "5 d ago"); `at` itself when it does not parse.
pub fn ago(at: &str, now: time::OffsetDateTime) -> String {
    use time::format_description::well_known::Rfc3339;
    let Ok(t) = time::OffsetDateTime::parse(at, &Rfc3339) else {
        return at.to_string();
    };
    let secs = (now - t).whole_seconds();
    match secs {
        s if s < 0 => "in the future".to_string(),
        s if s < 60 => format!("{s} s ago"),
        s if s < 3600 => format!("{} min ago", s / 60),
        s if s < 86_400 => format!("{} h ago", s / 3600),
        s => format!("{} d ago", s / 86_400),
    }
}

/// A time shown relative to now, the exact time on hover (`title`) and for
/// machines (`datetime`); no script needed.
fn when(at: &str) -> Markup {
    html! { time datetime=(Text(at)) title=(Text(at)) { (Text(&ago(at, time::OffsetDateTime::now_utc()))) } }
}

/// A query-string component, percent-encoded.
pub fn enc(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

pub fn record_url(queue: &str, id: &str) -> String {
    format!("/q/{}/record?id={}", enc(queue), enc(id))
}

pub fn layout(title: &str, v: &Viewer, refresh: Option<u32>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                @if let Some(s) = refresh { meta http-equiv="refresh" content=(s); }
                title { (Text(title)) " · aqw dashboard" }
                link rel="stylesheet" href="/assets/dashboard.css";
            }
            body {
                header { (nav(v)) }
                main { h1 { (Text(title)) } (body) }
            }
        }
    }
}

fn nav(v: &Viewer) -> Markup {
    html! {
        nav {
            a.brand href="/" { "aqw" }
            a href="/" { "Status" }
            @for q in &v.queues { a href={ "/q/" (enc(q)) } { (Text(q)) } }
            a #nav-ops href="/ops" { "Operations" }
            @match &v.runbook {
                Some(url) => { a #oncall href=(url) rel="noopener noreferrer" { "On call" } }
                None => { span.muted #oncall title="the runbook embedded in the aqw binary" { "On call: " code { "aqw oncall" } } }
            }
            span.who {
                @if v.read_only { span.badge { "read-only" } " " }
                @if let Some(n) = &v.name { "signed in as " b #who { (Text(n)) } }
                @if let (true, Some(csrf)) = (v.session, &v.csrf) {
                    form.inline method="post" action="/logout" {
                        input type="hidden" name="csrf" value=(csrf);
                        button type="submit" { "Sign out" }
                    }
                }
            }
        }
    }
}

pub(super) fn csrf_field(v: &Viewer) -> Markup {
    html! { @if let Some(c) = &v.csrf { input type="hidden" name="csrf" value=(c); } }
}

/// One queue's line on the status page (or the error reading it).
pub struct StatusRow {
    pub queue: String,
    pub function: String,
    pub status: Result<QueueStatus, String>,
}

pub fn status_page(rows: &[StatusRow], webhook: bool, v: &Viewer) -> Markup {
    let open: usize = rows
        .iter()
        .filter_map(|r| r.status.as_ref().ok())
        .map(|s| s.open_records)
        .sum();
    html! {
        @if open > 0 {
            p.alert #alert-state { "ALERT: " (open) " open poison record(s) need a person" }
        } @else {
            p.ok #alert-state { "OK: no open poison records" }
        }
        p.muted { "Alert webhook: " (if webhook { "configured" } else { "not configured" })
            ". The alert fires on the first open record of a queue; " code { "aqw status" } " exits 1 while any is open." }
        table #status {
            thead { tr { th { "function" } th { "queue" } th { "depth" } th { "poison depth" }
                th { "open records" } th { "oldest open" } th { "alert" } th { "receiving" } } }
            tbody { @for r in rows { (status_row(r, v)) } }
        }
    }
}

fn status_row(r: &StatusRow, v: &Viewer) -> Markup {
    let n = |v: Option<u64>| v.map(|n| n.to_string()).unwrap_or_else(|| "?".into());
    html! {
        tr {
            td { (Text(&r.function)) }
            td { a href={ "/q/" (enc(&r.queue)) } { (Text(&r.queue)) } }
            @match &r.status {
                Ok(s) => {
                    td.num { (n(s.depth)) } td.num { (n(s.poison_depth)) }
                    td.num { a href={ "/q/" (enc(&r.queue)) "?status=open" } { (s.open_records) } }
                    td { (or_dash(s.oldest_open.as_deref())) }
                    td { @if s.open_records > 0 { span.badge.bad { "firing" } } @else { span.badge.good { "ok" } } }
                    td {
                        (receiving(&r.queue, &s.control, v))
                        @if let Some(rate) = &s.learned_rate {
                            " " span.badge.bad { "throttled" } " " (rate.describe())
                        }
                    }
                }
                Err(e) => { td.error colspan="6" { "cannot read: " (Text(e)) } }
            }
        }
    }
}

/// The schedules (none: nothing): when each ticks, its next tick, and its
/// newest tick with that key's state.
pub fn schedules_table(rows: &[(String, Result<ScheduleStatus, String>)]) -> Markup {
    html! {
        @if !rows.is_empty() {
            h2 { "Schedules" }
            table #schedules {
                thead { tr { th { "schedule" } th { "function" } th { "when" } th { "next tick" } th { "last tick" } th { "outcome" } } }
                tbody { @for (name, r) in rows { tr {
                    td { (Text(name)) }
                    @match r {
                        Ok(s) => {
                            td { (Text(&s.function)) } td { (Text(&s.when)) " (catch-up " (s.catch_up) ")" }
                            td { (s.next.as_deref().unwrap_or("never")) }
                            td { (s.last_tick.as_deref().unwrap_or("none yet")) }
                            td { (or_dash(s.last_outcome.as_deref())) }
                        }
                        Err(e) => { td.error colspan="5" { "cannot read: " (Text(e)) } }
                    }
                } } }
            }
        }
    }
}

/// One error cause, as the alert groups them.
pub struct Group {
    pub id: String,
    pub kind: String,
    pub text: String,
    pub count: usize,
}

/// The list page's data.
pub struct ListPage<'a> {
    pub queue: &'a str,
    pub records: &'a [&'a PoisonRecord],
    pub groups: &'a [Group],
    pub total: usize,
    pub page: usize,
    pub pages: usize,
    /// The filter's query string (without `page`), for links.
    pub query: String,
    pub form: &'a [(&'static str, String)],
    /// Poisons over time of every matched record (not just this page).
    pub chart: Markup,
}

pub fn list_page(p: &ListPage, v: &Viewer, group_of: impl Fn(&PoisonRecord) -> String) -> Markup {
    html! {
        (filter_form(p))
        h2 { "Poisons per hour, last 24 hours" }
        (p.chart)
        h2 { "By error cause (as in the alert)" }
        table #groups {
            thead { tr { th { "records" } th { "kind" } th { "error" } } }
            tbody { @for g in p.groups { tr {
                td.num { a href={ "/q/" (enc(p.queue)) "?" (p.query) "&group=" (enc(&g.id)) } { (g.count) } }
                td { (Text(&g.kind)) } td.wrap { (Text(&g.text)) }
            } } }
        }
        h2 #total { (p.total) " record(s) · page " (p.page) " of " (p.pages) }
        form method="post" action={ "/q/" (enc(p.queue)) "/replay" } {
            (csrf_field(v))
            input type="hidden" name="mode" value="dry-run";
            (records_table(p, v, &group_of))
            @if v.can_act { button #replay-selected type="submit" { "Replay selected (dry run first)" } }
        }
        (pager(p))
        @if v.can_act && p.total > 0 && field(p, "status") == "open" { (group_actions(p, v)) }
    }
}

fn field<'a>(p: &'a ListPage, k: &str) -> &'a str {
    p.form
        .iter()
        .find(|(n, _)| *n == k)
        .map(|(_, v)| v.as_str())
        .unwrap_or("")
}

/// Replay, discard or fix every open record this page's query selects (all
/// pages, the chosen group only): each shows a dry run, review or preview first.
fn group_actions(p: &ListPage, v: &Viewer) -> Markup {
    let query = html! {
        (csrf_field(v))
        input type="hidden" name="mode" value="dry-run";
        @for (k, val) in p.form.iter().filter(|(k, val)| *k != "status" && !val.is_empty()) {
            input type="hidden" name=(k) value=(val);
        }
    };
    html! {
        section #group-actions {
            h2 { "Act on all " (p.total) " matching open record(s)" }
            form.inline method="post" action={ "/q/" (enc(p.queue)) "/group/replay" } {
                (query)
                button #group-replay type="submit" { "Replay all " (p.total) " (dry run first)" }
            }
            " "
            form.inline method="post" action={ "/q/" (enc(p.queue)) "/group/discard" } {
                (query)
                button #group-discard type="submit" { "Discard all " (p.total) " (review first)" }
            }
            " "
            form.inline method="post" action={ "/q/" (enc(p.queue)) "/group/fix" } {
                (query)
                button #group-fix type="submit" { "Fix all " (p.total) " with a patch (preview first)" }
            }
        }
    }
}

fn filter_form(p: &ListPage) -> Markup {
    let val = |k: &str| {
        p.form
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.as_str())
            .unwrap_or("")
    };
    html! {
        form.filters method="get" action={ "/q/" (enc(p.queue)) } {
            label { "status " select name="status" {
                @for s in ["open", "replayed", "discarded", "replaced", "all"] {
                    option value=(s) selected[val("status") == s] { (s) }
                }
            } }
            label { "since " input name="since" value=(val("since")) placeholder="RFC 3339 or hh:mm:ss ago"; }
            label { "until " input name="until" value=(val("until")) placeholder="RFC 3339 or hh:mm:ss ago"; }
            label { "function " input name="function" value=(val("function")); }
            label { "error text " input name="error" value=(val("error")); }
            label { "search " input name="search" value=(val("search")) placeholder="record id, key or payload text"; }
            @if !val("group").is_empty() { input type="hidden" name="group" value=(val("group")); }
            button type="submit" { "Filter" }
        }
    }
}

fn records_table(p: &ListPage, v: &Viewer, group_of: &dyn Fn(&PoisonRecord) -> String) -> Markup {
    html! {
        table #records {
            thead { tr { th {} th { "poisoned at" } th { "id" } th { "key" } th { "function" }
                th { "status" } th { "kind" } th { "cause" } th { "dequeued" } } }
            tbody { @for r in p.records { tr {
                td { @if v.can_act && r.status == RecordStatus::Open {
                    input type="checkbox" name="id" value=(r.message_id) aria-label="select";
                } }
                td { (when(&r.poisoned_at)) }
                td.id { a href=(record_url(p.queue, &r.message_id)) { (Text(&r.message_id)) } }
                td.id { (or_dash(r.key.as_deref())) }
                td { (Text(&r.function)) }
                td { span class={ "badge st-" (r.status.as_str()) } { (r.status.as_str()) }
                     @if r.uncertain_attempts > 0 { " " span.badge.uncertain title="an attempt's outcome is unknown: check the provider" { "may have taken effect" } } }
                td { (r.error.kind.as_str()) }
                td.wrap { (Text(&group_of(r))) }
                td.num { (r.dequeue_count) }
            } } }
        }
    }
}

fn pager(p: &ListPage) -> Markup {
    let link = |n: usize| format!("/q/{}?{}&page={n}", enc(p.queue), p.query);
    html! {
        nav.pager {
            @if p.page > 1 { a #prev href=(link(p.page - 1)) { "← newer" } }
            " page " (p.page) " / " (p.pages) " "
            @if p.page < p.pages { a #next href=(link(p.page + 1)) { "older →" } }
        }
    }
}

/// The record page's data.
pub struct RecordPage<'a> {
    pub queue: &'a str,
    pub record: &'a PoisonRecord,
    pub key: Option<&'a KeyRecord>,
    pub payload: &'a PayloadView,
    pub editable: &'a str,
    /// The provider key's age against the function's `providerKeyWindow`.
    pub window: Option<&'a ProviderWindow>,
    /// What the function's `redact` masked in the payload shown, if anything.
    pub redacted: Option<&'a str>,
    /// What the provider's lookup said of an uncertain key's provider key.
    pub provider_check: Option<&'a str>,
}

/// An uncertain record's line: resolved once its key is done (with the
/// provider's answer to the completing attempt); otherwise the lookup's
/// answer, or "check the provider".
fn uncertain_line(p: &RecordPage) -> String {
    let n = p.record.uncertain_attempts;
    if let Some(k) = p.key.filter(|k| k.status.is_settled()) {
        let answer = k
            .completed_answer()
            .map(|a| format!(" ({})", a.summary()))
            .unwrap_or_default();
        return format!(
            "{n} attempt(s) may have taken effect; resolved: the key is {}{answer}, so the effect happened once",
            k.status.as_str()
        );
    }
    match p.provider_check {
        Some(check) => format!("{n} attempt(s) may have taken effect; the provider says: {check}"),
        None => {
            format!("{n} attempt(s) may have taken effect: check the provider before replaying")
        }
    }
}

pub fn record_page(p: &RecordPage, v: &Viewer) -> Markup {
    let r = p.record;
    html! {
        dl.facts {
            dt { "status" } dd { span #record-status class={ "badge st-" (r.status.as_str()) } { (r.status.as_str()) } }
            dt { "record id" } dd.id { (Text(&r.message_id)) }
            dt { "queue / function" } dd { (Text(&r.queue)) " / " (Text(&r.function)) }
            dt { "key" } dd.id #record-key { (or_dash(r.key.as_deref())) }
            dt { "poisoned at" } dd { (when(&r.poisoned_at)) " (" (Text(&r.poisoned_at)) ")" }
            dt { "first attempt / dequeued" } dd { (Text(&r.first_attempt_at)) " / " (r.dequeue_count) " time(s)" }
            dt { "error (" (r.error.kind.as_str()) ")" } dd { pre.wrap #record-error { (Text(&r.error.message)) } }
            @if r.uncertain_attempts > 0 {
                dt { "uncertain" } dd #record-uncertain { (Text(&uncertain_line(p))) }
            }
            dt { "origin / encoding / poison copy" } dd { (Text(&r.origin)) " / " (r.encoding.as_str()) " / " (r.copy_format.as_str()) }
        }
        h2 { "Payload" }
        @if let Some(note) = p.redacted {
            p.warn #payload-redacted { (Text(note)) ". A fix that leaves a masked value as " code { (aqw_core::redact::MASK) } " keeps its stored value." }
        }
        (payload(p.payload))
        h2 { "Key state" }
        (key_state(p.key))
        @if let Some(w) = p.window {
            p #provider-window class={ @if w.past { "warn" } } { (w.summary()) }
        }
        h2 { "Audit trail" }
        (audit(r))
        @if r.status == RecordStatus::Open && v.can_act { (actions(p, v)) }
    }
}

fn payload(p: &PayloadView) -> Markup {
    html! {
        @match p {
            PayloadView::Json(t) | PayloadView::Text(t) => { pre.payload #payload { (t) } }
            PayloadView::Binary { lossy, hex, len, valid_up_to } => {
                p.warn { "Not UTF-8 (" (len) " bytes; the first invalid byte is at " (valid_up_to)
                    "). Shown lossily (� for each invalid sequence) and as hex." }
                pre.payload #payload { (lossy) }
                pre.hex { (hex) }
            }
            PayloadView::Undecodable { why, raw } => {
                p.warn { (why) ". The message text as received:" }
                pre.payload #payload { (raw) }
            }
        }
    }
}

fn key_state(k: Option<&KeyRecord>) -> Markup {
    let Some(k) = k else {
        return html! { p.muted #key-status { "no key record (keyless job, or never claimed)" } };
    };
    html! {
        dl.facts {
            dt { "status" } dd { span #key-status class={ "badge key-" (k.status.as_str()) } { (k.status.as_str()) } }
            dt { "attempts / replays" } dd { (k.attempts) " / " (k.replay_count) }
            dt { "provider key" } dd.id { (Text(&k.provider_key)) }
            dt { "first seen / completed" } dd { (or_dash(k.first_seen.as_deref())) " / " (or_dash(k.completed_at.as_deref())) }
            @if let Some(e) = &k.last_error { dt { "last error" } dd { pre.wrap #key-last-error { (Text(e)) } } }
            @if let Some(by) = &k.cancelled_by {
                dt { "closed" } dd { "by " (Text(by)) " at " (or_dash(k.cancelled_at.as_deref())) ": " (Text(k.cancel_reason.as_deref().unwrap_or(""))) }
            }
        }
        h3 { "Attempt history (newest last)" }
        table #history {
            thead { tr { th { "at" } th { "message" } th { "dequeue" } th { "outcome" } th { "error" } } }
            tbody { @for a in &k.history { tr {
                td { (Text(&a.at)) } td.id { (Text(&a.message_id)) } td.num { (a.dequeue_count) }
                td { (Text(&a.outcome))
                     @if let Some(c) = a.certainty() { " (" (Text(c)) ")" }
                     @if let Some(p) = &a.provider { " (" (Text(&p.summary())) ")" } }
                td.wrap { (Text(a.error.as_deref().unwrap_or(""))) }
            } } }
        }
    }
}

fn audit(r: &PoisonRecord) -> Markup {
    let at = |s: &Option<String>| super::text::neutralise(s.as_deref().unwrap_or("-"));
    html! {
        ul #audit {
            li { "poisoned at " (Text(&r.poisoned_at)) " after " (r.dequeue_count) " delivery(ies)" }
            @if let Some(by) = &r.replayed_by {
                li { "replayed by " b { (Text(by)) } " at " (at(&r.replayed_at)) "; new message " (at(&r.replay_message_id))
                    @if let Some(n) = &r.replay_note { " (" (Text(n)) ")" } }
            }
            @if let Some(by) = &r.discarded_by {
                li { "discarded by " b { (Text(by)) } " at " (at(&r.discarded_at)) ": " q { (Text(r.discard_reason.as_deref().unwrap_or(""))) } }
            }
            @if let Some(by) = &r.replaced_by {
                li { "replaced (fixed payload) by " b { (Text(by)) } " at " (at(&r.replaced_at)) "; new message "
                    (at(&r.replacement_message_id)) ", key " (or_dash(r.replacement_key.as_deref())) }
            }
            @if let Some(by) = &r.past_provider_window_by {
                li #past-window { "past the provider's key window, overridden by " b { (Text(by)) } " at "
                    (at(&r.past_provider_window_at)) ": " (Text(r.past_provider_window_note.as_deref().unwrap_or(""))) }
            }
        }
    }
}

/// The override of the provider's key window, offered only past it.
fn past_window_box(past: bool) -> Markup {
    html! {
        @if past {
            label { input .past-window type="checkbox" name="past_provider_window" value="1";
                " past the provider's window: go ahead anyway (kept on the record)" }
        }
    }
}

fn actions(p: &RecordPage, v: &Viewer) -> Markup {
    let base = format!("/q/{}", enc(p.queue));
    let id = &p.record.message_id;
    let past = p.window.is_some_and(|w| w.past);
    html! {
        h2 { "Actions" }
        section.actions {
            form method="post" action={ (base) "/replay" } {
                (csrf_field(v))
                input type="hidden" name="mode" value="dry-run";
                input type="hidden" name="id" value=(id);
                (past_window_box(past))
                button #replay type="submit" { "Replay… (dry run first)" }
            }
            form method="post" action={ (base) "/discard" } {
                (csrf_field(v))
                input type="hidden" name="id" value=(id);
                label { "Reason (kept on the record) " input #discard-reason name="reason" required; }
                label { input #close-key type="checkbox" name="close_key" value="1"; " also close the key (a resend never runs)" }
                button #discard type="submit" { "Discard" }
            }
            form method="post" action={ (base) "/fix" } {
                (csrf_field(v))
                input type="hidden" name="id" value=(id);
                label { "Corrected payload (put in place of this one; it must derive a key)" }
                textarea #fix-payload name="payload" rows="8" { (p.editable) }
                (past_window_box(past))
                button #fix type="submit" { "Fix payload" }
            }
        }
    }
}

/// What a replay did, or would do, with each record.
pub fn dry_run_table(queue: &str, r: &ReplayReport) -> Markup {
    html! {
        table #dry-run {
            thead { tr { th { "id" } th { "key" } th { (if r.dry_run { "would" } else { "did" }) } th { "detail" } } }
            tbody { @for i in &r.items { tr {
                td.id { a href=(record_url(queue, &i.id)) { (Text(&i.id)) } }
                td.id { (or_dash(i.key.as_deref())) }
                td { (i.action.as_str()) }
                td {
                    (Text(i.detail.as_deref().unwrap_or("")))
                    @if let Some(pk) = &i.uncertain_provider_key {
                        " " span.badge.uncertain.dry-run-uncertain { "may have taken effect: provider key " (Text(pk)) }
                        @if let Some(check) = &i.provider_check { " — the provider says: " (Text(check)) }
                    }
                }
            } } }
        }
    }
}

pub fn dry_run_page(queue: &str, r: &ReplayReport, v: &Viewer) -> Markup {
    html! {
        p { "Dry run: nothing has changed yet. " (r.selected) " open record(s) selected." }
        (dry_run_table(queue, r))
        @if v.can_act && !r.items.is_empty() {
            form method="post" action={ "/q/" (enc(queue)) "/replay" } {
                (csrf_field(v))
                input type="hidden" name="mode" value="real";
                @if r.past_provider_window { input type="hidden" name="past_provider_window" value="1"; }
                @for i in &r.items { input type="hidden" name="id" value=(i.id); }
                button #replay-real type="submit" { "Replay " (r.items.len()) " for real" }
            }
        }
    }
}

/// One record on the progress page.
pub struct Progress {
    pub record: Option<PoisonRecord>,
    pub id: String,
    /// The key whose state confirms the job (the replacement's after a fix).
    pub key: Option<String>,
    pub key_status: Option<String>,
    pub settled: bool,
}

/// `stopped`: why the page no longer refreshes itself, when it does not.
pub fn progress_page(queue: &str, rows: &[Progress], stopped: Option<&str>) -> Markup {
    let waiting = rows
        .iter()
        .filter(|r| r.record.is_some() && !r.settled)
        .count();
    html! {
        @if let Some(why) = stopped {
            p.warn #progress-state { (Text(why)) }
        } @else if waiting == 0 {
            p.ok #progress-state { "Confirmed: every key is done." }
        } @else {
            p.warn #progress-state { "Waiting for " (waiting) " key(s) to be done (this page refreshes itself)…" }
        }
        table #progress {
            thead { tr { th { "record" } th { "record status" } th { "key" } th { "key state" } } }
            tbody { @for r in rows { tr {
                td.id { a href=(record_url(queue, &r.id)) { (Text(&r.id)) } }
                td { (r.record.as_ref().map(|x| x.status.as_str()).unwrap_or("missing")) }
                td.id { (or_dash(r.key.as_deref())) }
                td { @if r.settled { span.badge.good.confirmed { "confirmed " (Text(r.key_status.as_deref().unwrap_or(""))) } }
                     @else { span.badge { (Text(r.key_status.as_deref().unwrap_or("not yet claimed"))) } } }
            } } }
        }
    }
}

pub fn login_page(csrf: &str, error: Option<&str>) -> Markup {
    html! {
        @if let Some(e) = error { p.alert #login-error { (e) } }
        p { "Paste the dashboard token (AQW_DASHBOARD_TOKEN). The session lasts 12 hours." }
        form method="post" action="/login" {
            input type="hidden" name="csrf" value=(csrf);
            label { "Token " input #token type="password" name="token" autocomplete="current-password" required; }
            button #login type="submit" { "Sign in" }
        }
    }
}

pub fn message(text: &str) -> Markup {
    html! { p #message { (Text(text)) } p { a href="/" { "Back to the status page" } } }
}

/// The status page's cell: what the control row says, and the action.
pub(super) fn receiving(queue: &str, c: &aqw_core::control::Control, v: &Viewer) -> Markup {
    html! {
        @if let Some(p) = &c.pause {
            span.badge.bad { "paused" } " by " (Text(&p.by)) " at " (Text(&p.at))
            @if !p.reason.is_empty() { ": " (Text(&p.reason)) }
        } @else {
            span.badge.good { "yes" }
        }
        @if let Some(b) = c.breaker.as_ref().filter(|_| c.breaker_open()) {
            " " span.badge.bad { "breaker " (Text(&b.state.to_string())) } " " (Text(&b.reason))
        }
        @if v.can_act {
            @if c.pause.is_some() {
                form method="post" action={ "/q/" (enc(queue)) "/resume" } {
                    (csrf_field(v))
                    button type="submit" { "Resume" }
                }
            } @else {
                form method="post" action={ "/q/" (enc(queue)) "/pause" } {
                    (csrf_field(v))
                    input type="text" name="reason" placeholder="reason" maxlength="200";
                    button type="submit" { "Pause" }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_how_long_ago_with_the_exact_time_kept() {
        let now = time::OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let at = |secs: i64| {
            (now - time::Duration::seconds(secs))
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap()
        };
        assert_eq!(ago(&at(45), now), "45 s ago");
        assert_eq!(ago(&at(12 * 60 + 5), now), "12 min ago");
        assert_eq!(ago(&at(3 * 3600), now), "3 h ago");
        assert_eq!(ago(&at(5 * 86_400), now), "5 d ago");
        assert_eq!(ago(&at(-10), now), "in the future");
        assert_eq!(ago("not a time", now), "not a time");
        let html = when("2026-12-03T10:00:00Z").into_string();
        assert!(
            html.starts_with(
                r#"<time datetime="2026-12-03T10:00:00Z" title="2026-12-03T10:00:00Z">"#
            ),
            "{html}"
        );
    }
}
