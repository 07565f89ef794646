//! Pause and resume from the dashboard: the status page's "receiving"
//! column (paused by whom, when and why; a breaker that is not closed) and
//! its two actions, under the same authentication and CSRF rules as replay,
//! through the same `aqw_core::ops` procedures as `aqw pause` / `aqw resume`.

use super::request::{get, pairs, see_other, tri, S};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;

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
    if let Err(e) = aqw_core::ops::pause(&ops.control, &f.name, &p.name, reason).await {
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
    if let Err(e) = aqw_core::ops::resume(&ops.control, &f.name, &p.name).await {
        return d.ops_error(&v, e);
    }
    tracing::info!(event = "aqw.dashboard.resume", function = %f.name, by = %p.name, "resumed from the dashboard");
    see_other("/")
}
