//! The routes: read views (GET) and actions (POST). Every action goes through
//! the same `aqw_core::ops` function as its CLI command, with "by" set to the
//! authenticated principal.

use super::auth::{self, Principal, Via};
use super::chart;
use super::error::{DashboardError, Form, Path, Query};
use super::forms::{
    CsrfForm, DiscardForm, Filters, FixForm, LoginForm, Mode, One, PageQuery, RecordQuery,
    ReplayForm,
};
use super::payload::PayloadView;
use super::progress::{plausible_id, progress_url};
use super::request::{page, see_other, Act, Answer, Reader, S};
use super::selection::{self, cause};
use super::views::{self, ListPage, RecordPage, StatusRow, Viewer};
use super::{Dashboard, MAX_SELECTION, PAGE_SIZE};
use aqw_core::ops::{self, Filter, FixAction, OpsError, QueueOps, ReplayAction, ReplayOptions};
use aqw_core::schedule::ScheduleStatus;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};

impl Dashboard {
    pub(super) fn viewer(&self, p: Option<&Principal>) -> Viewer {
        Viewer {
            name: p.map(|p| p.name.clone()),
            csrf: p.map(|p| self.auth.csrf_for(p)),
            can_act: !self.read_only && p.is_some(),
            session: p.is_some_and(|p| p.via == Via::Session),
            read_only: self.read_only,
            queues: self.queues.iter().map(|q| q.queue.clone()).collect(),
            runbook: self.app.alert_runbook_url.as_ref().map(|u| u.to_string()),
        }
    }

    /// Who may read: anyone when no authentication is configured (a
    /// read-only dashboard on loopback), else an authenticated principal.
    pub(super) fn gate(&self, headers: &HeaderMap) -> Result<Viewer, DashboardError> {
        let p = self.auth.identify(headers);
        let cfg = self.auth.config();
        if p.is_none() && cfg.configured() {
            if auth::Auth::presents_session(headers) && !headers.contains_key(header::AUTHORIZATION)
            {
                // Signed out, expired, or from before a restart: say so
                // rather than quietly asking again.
                return Err(DashboardError::Unauthenticated(
                    "Your session has ended (signed out, expired, or the dashboard restarted): sign in again at /login.",
                ));
            }
            if cfg.token.is_some() && !headers.contains_key(header::AUTHORIZATION) {
                return Err(DashboardError::SignInFirst);
            }
            return Err(DashboardError::Unauthenticated("Sign in first."));
        }
        Ok(self.viewer(p.as_ref()))
    }

    /// Who may act, before their form is read: an authenticated principal,
    /// on a dashboard that is not read-only.
    pub(super) fn acting(&self, headers: &HeaderMap) -> Result<Principal, DashboardError> {
        if self.read_only {
            return Err(DashboardError::Forbidden("This dashboard is read-only."));
        }
        self.auth.identify(headers).ok_or(DashboardError::Unauthenticated(
            "Actions need authentication: sign in (or send the bearer token) and try again. Nothing was changed.",
        ))
    }

    /// `p`'s viewer, if `csrf` (from their form) is their own CSRF token.
    pub(super) fn csrf_checked(&self, p: &Principal, csrf: &str) -> Result<Viewer, DashboardError> {
        if !self.auth.csrf_ok(p, csrf) {
            return Err(DashboardError::Forbidden(
                "The form's CSRF token is not yours (forged or stale): reload the page. Nothing was changed.",
            ));
        }
        Ok(self.viewer(Some(p)))
    }

    pub(super) fn queue_ops(&self, name: &str) -> Result<&QueueOps, DashboardError> {
        self.queues
            .iter()
            .find(|q| q.queue == name)
            .map(|q| q.as_ref())
            .ok_or_else(|| {
                DashboardError::not_found(
                    "404 Not Found",
                    "No function of this app consumes that queue.",
                )
            })
    }
}

/// 404 for an id no record can have (`/`, `\`, `#`, `?` or control
/// characters are not allowed in a table key, so storage would only fail).
fn no_such_record(id: &str) -> Result<(), DashboardError> {
    if plausible_id(id) {
        return Ok(());
    }
    Err(DashboardError::not_found(
        "No such record",
        "No such record: record ids never contain /, \\, #, ? or control characters.",
    ))
}

/// The record id and the field an action on one record needs with it:
/// 400 (`why`: title, message) without either, 404 for an id no record can have.
fn record_and<'a>(
    id: &'a One,
    needed: &'a One,
    why: (&'static str, &'static str),
) -> Result<(&'a str, &'a str), DashboardError> {
    let (Some(id), Some(value)) = (id.get(), needed.get()) else {
        return Err(DashboardError::bad_input(why.0, why.1));
    };
    no_such_record(id)?;
    Ok((id, value))
}

pub async fn status(State(d): S, Reader(v): Reader) -> Answer {
    let lines = futures::future::join_all(d.queues.iter().map(|q| ops::status(q))).await;
    let rows: Vec<StatusRow> = d
        .queues
        .iter()
        .zip(lines)
        .map(|(q, s)| StatusRow {
            queue: q.queue.clone(),
            function: q
                .function
                .as_ref()
                .map(|f| f.name.clone())
                .unwrap_or_default(),
            status: s.map_err(|e| format!("{e}")),
        })
        .collect();
    let schedules = schedule_rows(&d).await;
    // The triage of each queue with open records, at the top.
    let open: Vec<&QueueOps> = d
        .queues
        .iter()
        .zip(&rows)
        .filter(|(_, r)| r.status.as_ref().is_ok_and(|s| s.open_records > 0))
        .map(|(q, _)| q.as_ref())
        .collect();
    let plans = super::triage::plans(&open).await;
    let body = maud::html! {
        (super::triage::section(&plans))
        (views::status_page(&rows, d.app.alert_webhook.is_some(), &v))
        (views::schedules_table(&schedules))
    };
    Ok(page(StatusCode::OK, "Status", &v, Some(30), body))
}

/// Each schedule's next tick and its newest tick's outcome, as `aqw
/// status` shows them (or why it could not be read).
async fn schedule_rows(d: &super::Dashboard) -> Vec<(String, Result<ScheduleStatus, String>)> {
    let mut out = Vec::new();
    for s in &d.app.schedules {
        let ops = d
            .queues
            .iter()
            .find(|q| q.function.as_ref().is_some_and(|f| f.name == s.function));
        let status = match ops {
            Some(q) => aqw_core::schedule::status(&d.app, s, q.control.table().as_ref(), &q.keys)
                .await
                .map_err(|e| e.to_string()),
            None => Err(format!("no queue of function {}", s.function)),
        };
        out.push((s.name.clone(), status));
    }
    out
}

pub async fn list(
    State(d): S,
    Path(queue): Path<String>,
    Reader(v): Reader,
    Query(filters): Query<Filters>,
    Query(at): Query<PageQuery>,
) -> Answer {
    let ops = d.queue_ops(&queue)?;
    filters.check()?;
    let selected = selection::select(ops, &filters).await?;
    let chosen = selected.chosen();
    let matching = &selected.matching;
    let groups = selection::groups(&queue, matching);
    let chart = chart::poisons_chart(matching, time::OffsetDateTime::now_utc(), &|r| cause(r).1);
    let pages = chosen.len().div_ceil(PAGE_SIZE).max(1);
    let n = (at.page.get())
        .and_then(|p| p.parse::<usize>().ok())
        .unwrap_or(1)
        .clamp(1, pages);
    let shown = &chosen[((n - 1) * PAGE_SIZE).min(chosen.len())..(n * PAGE_SIZE).min(chosen.len())];
    let form = selection::filter_form(&filters);
    let query = url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(form.iter().filter(|(k, v)| !v.is_empty() && *k != "group"))
        .finish();
    let p = ListPage {
        queue: &queue,
        records: shown,
        groups: &groups,
        total: chosen.len(),
        page: n,
        pages,
        query,
        form: &form,
        chart,
    };
    let body = views::list_page(&p, &v, |r| cause(r).1);
    let title = format!("Poison records of {queue}");
    Ok(page(StatusCode::OK, &title, &v, None, body))
}

pub async fn record(
    State(d): S,
    Path(queue): Path<String>,
    Reader(v): Reader,
    Query(q): Query<RecordQuery>,
) -> Answer {
    let ops = d.queue_ops(&queue)?;
    let Some(id) = q.id.get() else {
        return Err(DashboardError::bad_input(
            "400 Bad Request",
            "Which record? (?id=…)",
        ));
    };
    no_such_record(id)?;
    let mut report = match ops::show(ops, id).await {
        Ok(r) => r,
        Err(OpsError::Usage(m)) => return Err(DashboardError::not_found("No such record", m)),
        Err(e) => return Err(e.into()),
    };
    if let Some(pk) = report.uncertain_provider_key() {
        let lookup = ops
            .function
            .as_ref()
            .and_then(|f| crate::handlers::lookup::of(&f.handler));
        report.provider_check = Some(crate::handlers::lookup::ask(lookup, pk).await.line());
    }
    let (payload, editable) = PayloadView::of_report(&report);
    let p = RecordPage {
        queue: &queue,
        record: &report.record,
        key: report.key_record.as_ref(),
        payload: &payload,
        editable: &editable,
        window: report.provider_window.as_ref(),
        redacted: report.redacted.as_deref(),
        provider_check: report.provider_check.as_deref(),
    };
    let body = views::record_page(&p, &v);
    Ok(page(
        StatusCode::OK,
        &format!("Record {id}"),
        &v,
        None,
        body,
    ))
}

/// The provider's answer for each item whose key may have taken effect.
async fn ask_about_uncertain(ops: &ops::QueueOps, report: &mut ops::ReplayReport) {
    let lookup = ops
        .function
        .as_ref()
        .and_then(|f| crate::handlers::lookup::of(&f.handler));
    for item in report.items.iter_mut() {
        if let Some(pk) = &item.uncertain_provider_key {
            item.provider_check = Some(crate::handlers::lookup::ask(lookup, pk).await.line());
        }
    }
}

pub async fn replay(
    State(d): S,
    Path(queue): Path<String>,
    Act { v, p, form }: Act<ReplayForm>,
) -> Answer {
    let ops = d.queue_ops(&queue)?;
    let ids: Vec<String> = form.ids.into_iter().filter(|i| !i.is_empty()).collect();
    if ids.is_empty() || ids.len() > MAX_SELECTION {
        let m = format!("Select between 1 and {MAX_SELECTION} open records.");
        return Err(DashboardError::bad_input("Nothing selected", m));
    }
    for id in &ids {
        no_such_record(id)?;
    }
    let dry_run = form.mode != Some(Mode::Real);
    let opts = ReplayOptions {
        filter: Filter {
            ids: ids.clone(),
            ..Filter::default()
        },
        dry_run,
        by: p.name.clone(),
        concurrency: ops::DEFAULT_REPLAY_CONCURRENCY,
        past_provider_window: form.past_provider_window.is_set(),
        // The review page's "may have taken effect" mark is the check.
        uncertain_checked: true,
        ..ReplayOptions::default()
    };
    let mut report = ops::replay(ops, &opts, &|_, _| {}).await?;
    ask_about_uncertain(ops, &mut report).await;
    let trouble = (report.items.iter())
        .any(|i| matches!(i.action, ReplayAction::Failed | ReplayAction::Skipped));
    if dry_run || trouble {
        let title = if dry_run {
            "Replay: dry run"
        } else {
            "Replay: not all replayed"
        };
        let status = if trouble {
            StatusCode::CONFLICT
        } else {
            StatusCode::OK
        };
        let body = views::dry_run_page(&queue, &report, &v);
        return Ok(page(status, title, &v, None, body));
    }
    tracing::info!(event = "aqw.dashboard.replay", queue = %queue, by = %p.name, count = report.replayed + report.already_done, "replayed from the dashboard");
    Ok(see_other(&progress_url(&queue, &ids)))
}

pub async fn discard(
    State(d): S,
    Path(queue): Path<String>,
    Act { p, form, .. }: Act<DiscardForm>,
) -> Answer {
    let ops = d.queue_ops(&queue)?;
    let why = ("Not discarded", "A discard needs a reason.");
    let (id, reason) = record_and(&form.id, &form.reason, why)?;
    let close_key = form.close_key.is_set();
    ops::discard(ops, id, reason.trim(), &p.name, close_key).await?;
    tracing::info!(event = "aqw.dashboard.discard", queue = %queue, id = %id, by = %p.name, close_key, "discarded from the dashboard");
    Ok(see_other(&views::record_url(&queue, id)))
}

pub async fn fix(
    State(d): S,
    Path(queue): Path<String>,
    Act { p, form, .. }: Act<FixForm>,
) -> Answer {
    let ops = d.queue_ops(&queue)?;
    let why = ("Not fixed", "A fix needs a payload.");
    let (id, payload) = record_and(&form.id, &form.payload, why)?;
    let past_window = form.past_provider_window.is_set();
    let report = ops::fix(ops, id, payload, &p.name, None, past_window).await?;
    if report.action != FixAction::Replaced {
        let m = format!(
            "{}: {}",
            report.action,
            report.detail.as_deref().unwrap_or("")
        );
        return Err(DashboardError::conflict("Not fixed", m));
    }
    tracing::info!(event = "aqw.dashboard.fix", queue = %queue, id = %id, by = %p.name, "payload fixed from the dashboard");
    Ok(see_other(&progress_url(&queue, &[id.to_string()])))
}

pub async fn login_form(State(d): S, headers: HeaderMap) -> Answer {
    if d.auth.config().token.is_none() {
        return Err(DashboardError::not_found(
            "404 Not Found",
            "No token is configured: sign in through the platform.",
        ));
    }
    let nonce = auth::random_hex(16);
    let mut r = page(
        StatusCode::OK,
        "Sign in",
        &d.viewer(None),
        None,
        views::login_page(&d.auth.login_csrf(&nonce), None),
    );
    let c = auth::set_cookie(&headers, auth::LOGIN_COOKIE, &nonce, 3600);
    r.headers_mut()
        .append(header::SET_COOKIE, c.parse().expect("hex cookie"));
    Ok(r)
}

pub async fn login(State(d): S, headers: HeaderMap, Form(form): Form<LoginForm>) -> Answer {
    let csrf = form.csrf.or_empty();
    if !d.auth.login_csrf_ok(&headers, csrf) {
        return Err(DashboardError::Forbidden(
            "The sign-in form is stale or forged: reload it.",
        ));
    }
    let Some(session) = d.auth.login(form.token.or_empty()) else {
        // Counted and logged (rate-limited) by the throttle, which sees the 401.
        let body = views::login_page(csrf, Some("Wrong token."));
        let v = d.viewer(None);
        return Ok(page(StatusCode::UNAUTHORIZED, "Sign in", &v, None, body));
    };
    let mut r = see_other("/");
    let h = r.headers_mut();
    let c = auth::set_cookie(
        &headers,
        auth::SESSION_COOKIE,
        &session,
        auth::SESSION_TTL_SECS,
    );
    h.append(header::SET_COOKIE, c.parse().expect("ascii cookie"));
    h.append(
        header::SET_COOKIE,
        auth::set_cookie(&headers, auth::LOGIN_COOKIE, "", 0)
            .parse()
            .expect("static"),
    );
    Ok(r)
}

/// Sign out: nobody is sent to the sign-in page before the form is read.
pub async fn logout(
    State(d): S,
    headers: HeaderMap,
    form: Result<Form<CsrfForm>, DashboardError>,
) -> Answer {
    let Some(p) = d.auth.identify(&headers) else {
        return Ok(see_other("/login"));
    };
    let Form(form) = form?;
    if !d.auth.csrf_ok(&p, form.csrf.or_empty()) {
        return Err(DashboardError::Forbidden("Stale form: reload the page."));
    }
    d.auth.logout(&p);
    let mut r = see_other("/login");
    let c = auth::set_cookie(&headers, auth::SESSION_COOKIE, "", 0);
    r.headers_mut()
        .append(header::SET_COOKIE, c.parse().expect("static"));
    Ok(r)
}
