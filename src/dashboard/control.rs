//! Pause and resume from the dashboard: the status page's "receiving"
//! column (paused by whom, when and why; a breaker that is not closed) and
//! its two actions, under the same authentication and CSRF rules as replay,
//! through the same `crate::ops` procedures as `aqw pause` / `aqw resume`.

use super::handlers::{get, pairs, see_other, tri, S};
use super::views::{csrf_field, enc, Viewer};
use crate::control::Control;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use maud::{html, Markup};

/// The status page's cell: what the control row says, and the action.
pub(super) fn receiving(queue: &str, c: &Control, v: &Viewer) -> Markup {
    html! {
        @if let Some(p) = &c.pause {
            span.badge.bad { "paused" } " by " (p.by) " at " (p.at)
            @if !p.reason.is_empty() { ": " (p.reason) }
        } @else {
            span.badge.good { "yes" }
        }
        @if let Some(b) = c.breaker.as_ref().filter(|_| c.breaker_open()) {
            " " span.badge.bad { "breaker " (b.state) } " " (b.reason)
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

pub async fn pause(
    State(d): S,
    Path(queue): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let form = pairs(&body);
    let (v, p) = tri!(d.actor(&headers, &form));
    let ops = tri!(d.queue_ops(&queue));
    let Some(f) = &ops.function else {
        return d.refuse(StatusCode::NOT_FOUND, "No function consumes that queue.");
    };
    let reason = get(&form, "reason").unwrap_or("").trim();
    if let Err(e) = crate::ops::pause(&ops.control, &f.name, &p.name, reason).await {
        return d.ops_error(&v, e);
    }
    tracing::info!(event = "aqw.dashboard.pause", function = %f.name, by = %p.name, "paused from the dashboard");
    see_other("/")
}

pub async fn resume(
    State(d): S,
    Path(queue): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let form = pairs(&body);
    let (v, p) = tri!(d.actor(&headers, &form));
    let ops = tri!(d.queue_ops(&queue));
    let Some(f) = &ops.function else {
        return d.refuse(StatusCode::NOT_FOUND, "No function consumes that queue.");
    };
    if let Err(e) = crate::ops::resume(&ops.control, &f.name, &p.name).await {
        return d.ops_error(&v, e);
    }
    tracing::info!(event = "aqw.dashboard.resume", function = %f.name, by = %p.name, "resumed from the dashboard");
    see_other("/")
}
