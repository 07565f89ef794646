//! The routes: read views (GET) and actions (POST). Every action goes through
//! the same `aqw_core::ops` function as its CLI command, with "by" set to the
//! authenticated principal.

use super::auth::{self, Principal, Via};
use super::chart;
use super::payload::PayloadView;
use super::progress::{plausible_id, progress_url};
use super::request::{all, get, page, pairs, see_other, tri, Pairs, Refused, S};
use super::selection::{self, cause, SelectError};
use super::views::{self, ListPage, RecordPage, StatusRow, Viewer};
use super::{Dashboard, MAX_SELECTION, PAGE_SIZE};
use aqw_core::ops::{self, Filter, FixAction, OpsError, QueueOps, ReplayAction, ReplayOptions};
use aqw_core::schedule::ScheduleStatus;
use aqw_core::scrub::scrub;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;

/// A page that only says why the request was not carried out.
pub(super) fn refusal(status: StatusCode, title: &str, v: &Viewer, message: &str) -> Response {
    page(status, title, v, None, views::message(message))
}

impl Dashboard {
    fn viewer(&self, p: Option<&Principal>) -> Viewer {
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

    pub(super) fn refuse(&self, status: StatusCode, why: &str) -> Response {
        let mut r = page(
            status,
            &status.to_string(),
            &self.viewer(None),
            None,
            views::message(why),
        );
        if status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, "Bearer".parse().expect("static"));
        }
        r
    }

    /// Who may read: anyone when no authentication is configured (a
    /// read-only dashboard on loopback), else an authenticated principal.
    pub(super) fn gate(&self, headers: &HeaderMap) -> Result<Viewer, Refused> {
        let p = self.auth.identify(headers);
        let cfg = self.auth.config();
        if p.is_none() && cfg.configured() {
            if auth::Auth::presents_session(headers) && !headers.contains_key(header::AUTHORIZATION)
            {
                // Signed out, expired, or from before a restart: say so
                // rather than quietly asking again.
                return Err(Box::new(self.refuse(
                    StatusCode::UNAUTHORIZED,
                    "Your session has ended (signed out, expired, or the dashboard restarted): sign in again at /login.",
                )));
            }
            if cfg.token.is_some() && !headers.contains_key(header::AUTHORIZATION) {
                return Err(Box::new(see_other("/login")));
            }
            return Err(Box::new(
                self.refuse(StatusCode::UNAUTHORIZED, "Sign in first."),
            ));
        }
        Ok(self.viewer(p.as_ref()))
    }

    /// Who may act: an authenticated principal whose form carries its own
    /// CSRF token, on a dashboard that is not read-only.
    pub(super) fn actor(
        &self,
        headers: &HeaderMap,
        form: &Pairs,
    ) -> Result<(Viewer, Principal), Refused> {
        if self.read_only {
            return Err(Box::new(
                self.refuse(StatusCode::FORBIDDEN, "This dashboard is read-only."),
            ));
        }
        let Some(p) = self.auth.identify(headers) else {
            return Err(Box::new(self.refuse(
                StatusCode::UNAUTHORIZED,
                "Actions need authentication: sign in (or send the bearer token) and try again. Nothing was changed.",
            )));
        };
        if !self.auth.csrf_ok(&p, get(form, "csrf").unwrap_or("")) {
            return Err(Box::new(self.refuse(
                StatusCode::FORBIDDEN,
                "The form's CSRF token is not yours (forged or stale): reload the page. Nothing was changed.",
            )));
        }
        Ok((self.viewer(Some(&p)), p))
    }

    pub(super) fn queue_ops(&self, name: &str) -> Result<&QueueOps, Refused> {
        self.queues
            .iter()
            .find(|q| q.queue == name)
            .map(|q| q.as_ref())
            .ok_or_else(|| {
                Box::new(self.refuse(
                    StatusCode::NOT_FOUND,
                    "No function of this app consumes that queue.",
                ))
            })
    }

    pub(super) fn ops_error(&self, v: &Viewer, e: OpsError) -> Response {
        let status = match e {
            OpsError::Usage(_) => StatusCode::CONFLICT,
            OpsError::Storage(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        let text = scrub(&format!("{:#}", anyhow::Error::from(e)));
        page(status, "Not done", v, None, views::message(&text))
    }
}

/// 404 for an id no record can have (`/`, `\`, `#`, `?` or control
/// characters are not allowed in a table key, so storage would only fail).
fn no_such_record(v: &Viewer, id: &str) -> Result<(), Refused> {
    if plausible_id(id) {
        return Ok(());
    }
    let m = "No such record: record ids never contain /, \\, #, ? or control characters.";
    Err(Box::new(refusal(
        StatusCode::NOT_FOUND,
        "No such record",
        v,
        m,
    )))
}

pub async fn status(State(d): S, headers: HeaderMap) -> Response {
    let v = tri!(d.gate(&headers));
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
    page(StatusCode::OK, "Status", &v, Some(30), body)
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
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Response {
    let v = tri!(d.gate(&headers));
    let ops = tri!(d.queue_ops(&queue));
    let params = pairs(q.unwrap_or_default().as_bytes());
    let selected = match selection::select(ops, &params).await {
        Ok(s) => s,
        Err(SelectError::BadFilter(m)) => {
            return refusal(StatusCode::BAD_REQUEST, "Bad filter", &v, &m)
        }
        Err(SelectError::Ops(e)) => return d.ops_error(&v, e),
    };
    let chosen = selected.chosen();
    let matching = &selected.matching;
    let groups = selection::groups(&queue, matching);
    let chart = chart::poisons_chart(matching, time::OffsetDateTime::now_utc(), &|r| cause(r).1);
    let pages = chosen.len().div_ceil(PAGE_SIZE).max(1);
    let n = get(&params, "page")
        .and_then(|p| p.parse::<usize>().ok())
        .unwrap_or(1)
        .clamp(1, pages);
    let shown = &chosen[((n - 1) * PAGE_SIZE).min(chosen.len())..(n * PAGE_SIZE).min(chosen.len())];
    let form = selection::filter_form(&params);
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
    page(
        StatusCode::OK,
        &format!("Poison records of {queue}"),
        &v,
        None,
        body,
    )
}

pub async fn record(
    State(d): S,
    Path(queue): Path<String>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Response {
    let v = tri!(d.gate(&headers));
    let ops = tri!(d.queue_ops(&queue));
    let params = pairs(q.unwrap_or_default().as_bytes());
    let Some(id) = get(&params, "id") else {
        return d.refuse(StatusCode::BAD_REQUEST, "Which record? (?id=…)");
    };
    tri!(no_such_record(&v, id));
    let mut report = match ops::show(ops, id).await {
        Ok(r) => r,
        Err(OpsError::Usage(m)) => return refusal(StatusCode::NOT_FOUND, "No such record", &v, &m),
        Err(e) => return d.ops_error(&v, e),
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
    page(
        StatusCode::OK,
        &format!("Record {id}"),
        &v,
        None,
        views::record_page(&p, &v),
    )
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
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let form = pairs(&body);
    let (v, p) = tri!(d.actor(&headers, &form));
    let ops = tri!(d.queue_ops(&queue));
    let ids = all(&form, "id");
    if ids.is_empty() || ids.len() > MAX_SELECTION {
        let m = format!("Select between 1 and {MAX_SELECTION} open records.");
        return refusal(StatusCode::BAD_REQUEST, "Nothing selected", &v, &m);
    }
    for id in &ids {
        tri!(no_such_record(&v, id));
    }
    let dry_run = get(&form, "mode") != Some("real");
    let opts = ReplayOptions {
        filter: Filter {
            ids: ids.clone(),
            ..Filter::default()
        },
        dry_run,
        by: p.name.clone(),
        concurrency: ops::DEFAULT_REPLAY_CONCURRENCY,
        past_provider_window: get(&form, "past_provider_window").is_some(),
        // The review page's "may have taken effect" mark is the check.
        uncertain_checked: true,
        ..ReplayOptions::default()
    };
    let mut report = match ops::replay(ops, &opts, &|_, _| {}).await {
        Ok(r) => r,
        Err(e) => return d.ops_error(&v, e),
    };
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
        return page(
            status,
            title,
            &v,
            None,
            views::dry_run_page(&queue, &report, &v),
        );
    }
    tracing::info!(event = "aqw.dashboard.replay", queue = %queue, by = %p.name, count = report.replayed + report.already_done, "replayed from the dashboard");
    see_other(&progress_url(&queue, &ids))
}

pub async fn discard(
    State(d): S,
    Path(queue): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let form = pairs(&body);
    let (v, p) = tri!(d.actor(&headers, &form));
    let ops = tri!(d.queue_ops(&queue));
    let (Some(id), Some(reason)) = (get(&form, "id"), get(&form, "reason")) else {
        return refusal(
            StatusCode::BAD_REQUEST,
            "Not discarded",
            &v,
            "A discard needs a reason.",
        );
    };
    tri!(no_such_record(&v, id));
    let close_key = get(&form, "close_key").is_some();
    if let Err(e) = ops::discard(ops, id, reason.trim(), &p.name, close_key).await {
        return d.ops_error(&v, e);
    }
    tracing::info!(event = "aqw.dashboard.discard", queue = %queue, id = %id, by = %p.name, close_key, "discarded from the dashboard");
    see_other(&views::record_url(&queue, id))
}

pub async fn fix(
    State(d): S,
    Path(queue): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let form = pairs(&body);
    let (v, p) = tri!(d.actor(&headers, &form));
    let ops = tri!(d.queue_ops(&queue));
    let (Some(id), Some(payload)) = (get(&form, "id"), get(&form, "payload")) else {
        return refusal(
            StatusCode::BAD_REQUEST,
            "Not fixed",
            &v,
            "A fix needs a payload.",
        );
    };
    tri!(no_such_record(&v, id));
    let past_window = get(&form, "past_provider_window").is_some();
    let report = match ops::fix(ops, id, payload, &p.name, None, past_window).await {
        Ok(r) => r,
        Err(e) => return d.ops_error(&v, e),
    };
    if report.action != FixAction::Replaced {
        let m = format!(
            "{}: {}",
            report.action,
            report.detail.as_deref().unwrap_or("")
        );
        return page(
            StatusCode::CONFLICT,
            "Not fixed",
            &v,
            None,
            views::message(&m),
        );
    }
    tracing::info!(event = "aqw.dashboard.fix", queue = %queue, id = %id, by = %p.name, "payload fixed from the dashboard");
    see_other(&progress_url(&queue, &[id.to_string()]))
}

pub async fn login_form(State(d): S, headers: HeaderMap) -> Response {
    if d.auth.config().token.is_none() {
        return d.refuse(
            StatusCode::NOT_FOUND,
            "No token is configured: sign in through the platform.",
        );
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
    r
}

pub async fn login(State(d): S, headers: HeaderMap, body: Bytes) -> Response {
    let form = pairs(&body);
    let csrf = get(&form, "csrf").unwrap_or("");
    if !d.auth.login_csrf_ok(&headers, csrf) {
        return d.refuse(
            StatusCode::FORBIDDEN,
            "The sign-in form is stale or forged: reload it.",
        );
    }
    let Some(session) = d.auth.login(get(&form, "token").unwrap_or("")) else {
        // Counted and logged (rate-limited) by the throttle, which sees the 401.
        let body = views::login_page(csrf, Some("Wrong token."));
        return page(
            StatusCode::UNAUTHORIZED,
            "Sign in",
            &d.viewer(None),
            None,
            body,
        );
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
    r
}

pub async fn logout(State(d): S, headers: HeaderMap, body: Bytes) -> Response {
    let form = pairs(&body);
    let Some(p) = d.auth.identify(&headers) else {
        return see_other("/login");
    };
    if !d.auth.csrf_ok(&p, get(&form, "csrf").unwrap_or("")) {
        return d.refuse(StatusCode::FORBIDDEN, "Stale form: reload the page.");
    }
    d.auth.logout(&p);
    let mut r = see_other("/login");
    let c = auth::set_cookie(&headers, auth::SESSION_COOKIE, "", 0);
    r.headers_mut()
        .append(header::SET_COOKIE, c.parse().expect("static"));
    r
}
