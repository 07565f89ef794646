//! The dashboard's forms, queries and paths through axum's extractors, in
//! process (`tower::ServiceExt::oneshot`) against Azurite: a form that
//! cannot be read, a missing field, a value past its bound or a query sent
//! twice is a 400 page that says which field (never axum's plain text, never
//! a panic) and changes nothing; a body that is not a form is a 415 page; an
//! unknown id in a path is a 404 page; and the actions still work.

use crate::common::*;
use crate::dashboard::{bget, bpost, csrf_of, dashboard, enc, keyed_app, Reply};
use aqw::dashboard::MAX_FIELD_CHARS;
use aqw_core::ops::operation::OperationStore;
use aqw_core::poison::RecordStatus;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use serde_json::json;
use std::time::Duration;
use tower::ServiceExt as _;

const DEADLINE: Duration = Duration::from_secs(60);

/// A refusal drawn as the dashboard's page (not a plain-text rejection).
fn assert_page(r: &Reply, status: StatusCode, says: &[&str]) {
    assert_eq!(r.status, status, "{}", r.body);
    let kind = r.headers["content-type"].to_str().unwrap();
    assert!(kind.starts_with("text/html"), "{kind}: {}", r.body);
    assert!(r.body.contains("<title>") && r.body.contains("aqw dashboard"));
    for s in says {
        assert!(r.body.contains(s), "{s:?} not in {}", r.body);
    }
}

/// POST `body` as the bearer principal with this content type.
async fn post_as(r: &Router, uri: &str, content_type: &str, body: &str) -> Reply {
    let req = Request::post(uri)
        .header("authorization", "Bearer test-token-0123456789abcdef")
        .header("content-type", content_type)
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = r.clone().oneshot(req).await.unwrap();
    let (status, headers) = (resp.status(), resp.headers().clone());
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_or_incomplete_form_is_a_400_page_and_changes_nothing() {
    let app = keyed_app(json!({"maxDequeueCount": 1}));
    let id = poisoned_by_worker(&app, DEADLINE).await;
    let r = dashboard(&app, false);
    let q = &app.queue;
    let csrf = csrf_of(
        &bget(&r, &format!("/q/{q}/record?id={}", enc(&id)))
            .await
            .body,
    );
    let (discard, eid) = (format!("/q/{q}/discard"), enc(&id));
    // Malformed: a single-valued field sent twice, a mode no form has.
    let twice = format!("id={eid}&id=other&reason=r&csrf={csrf}");
    let got = bpost(&r, &discard, &twice).await;
    assert_page(
        &got,
        StatusCode::BAD_REQUEST,
        &["could not be read", "id: sent more than once"],
    );
    let sideways = format!("mode=sideways&csrf={csrf}");
    let got = bpost(&r, &format!("/q/{q}/group/replay"), &sideways).await;
    assert_page(
        &got,
        StatusCode::BAD_REQUEST,
        &["mode: unknown variant `sideways`"],
    );
    // Missing fields: each action says which.
    let got = bpost(&r, &discard, &format!("id={eid}&csrf={csrf}")).await;
    assert_page(
        &got,
        StatusCode::BAD_REQUEST,
        &["A discard needs a reason."],
    );
    let got = bpost(&r, &format!("/q/{q}/fix"), &format!("id={eid}&csrf={csrf}")).await;
    assert_page(&got, StatusCode::BAD_REQUEST, &["A fix needs a payload."]);
    let got = bpost(
        &r,
        &format!("/q/{q}/replay"),
        &format!("mode=real&csrf={csrf}"),
    )
    .await;
    assert_page(&got, StatusCode::BAD_REQUEST, &["Select between 1 and 100"]);
    // Past a bound: named, with the bound.
    let long = "r".repeat(MAX_FIELD_CHARS + 1);
    let got = bpost(&r, &discard, &format!("id={eid}&reason={long}&csrf={csrf}")).await;
    assert_page(
        &got,
        StatusCode::BAD_REQUEST,
        &["reason: at most 1000 characters"],
    );
    // Not a form at all.
    let json_body = format!(r#"{{"id":"{eid}","reason":"r","csrf":"{csrf}"}}"#);
    let got = post_as(&r, &discard, "application/json", &json_body).await;
    assert_page(
        &got,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        &["application/x-www-form-urlencoded"],
    );
    // Who asks is still checked before the form is read.
    let anon = Request::post(&discard)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Body::from(twice.clone()))
        .unwrap();
    let anon = r.clone().oneshot(anon).await.unwrap();
    assert_eq!(anon.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(poison_record(&app, &id).await.status, RecordStatus::Open);
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_id_in_a_path_is_a_404_page_and_a_bad_query_a_400() {
    let app = keyed_app(json!({}));
    let r = dashboard(&app, false);
    let q = &app.queue;
    let unknown = OperationStore::new_id();
    let got = bget(&r, &format!("/ops/{unknown}")).await;
    assert_page(
        &got,
        StatusCode::NOT_FOUND,
        &["No group operation has that id."],
    );
    let csrf = csrf_of(&bget(&r, &format!("/q/{q}")).await.body);
    let cancel = bpost(
        &r,
        &format!("/ops/{unknown}/cancel"),
        &format!("csrf={csrf}"),
    )
    .await;
    assert_page(&cancel, StatusCode::NOT_FOUND, &["No such operation"]);
    let got = bget(&r, "/q/no-such-queue").await;
    assert_page(
        &got,
        StatusCode::NOT_FOUND,
        &["No function of this app consumes that queue."],
    );
    let got = bget(&r, &format!("/q/{q}/record?id=never-poisoned")).await;
    assert_page(&got, StatusCode::NOT_FOUND, &["No such record"]);
    // A path segment that is not UTF-8, a query field sent twice.
    let got = bget(&r, "/q/%FF").await;
    assert_page(
        &got,
        StatusCode::BAD_REQUEST,
        &["The path could not be read"],
    );
    let got = bget(&r, &format!("/q/{q}?status=open&status=all")).await;
    assert_page(
        &got,
        StatusCode::BAD_REQUEST,
        &["status: sent more than once"],
    );
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_record_discard_and_progress_still_work_through_the_extractors() {
    let app = keyed_app(json!({"maxDequeueCount": 1}));
    let id = poisoned_by_worker(&app, DEADLINE).await;
    let r = dashboard(&app, false);
    let q = &app.queue;
    // A filtered list (blank fields are absent, as a browser sends them).
    let list = bget(&r, &format!("/q/{q}?status=open&since=&search=o-1&page=x")).await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.body);
    assert!(list.body.contains(&id), "{}", list.body);
    let record = bget(&r, &format!("/q/{q}/record?id={}", enc(&id))).await;
    assert_eq!(record.status, StatusCode::OK);
    let csrf = csrf_of(&record.body);
    let form = format!(
        "id={}&reason=duplicate+order&close_key=&csrf={csrf}",
        enc(&id)
    );
    let done = bpost(&r, &format!("/q/{q}/discard"), &form).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    let rec = poison_record(&app, &id).await;
    assert_eq!(rec.status, RecordStatus::Discarded);
    assert_eq!(rec.discard_reason.as_deref(), Some("duplicate order"));
    let progress = format!("/q/{q}/progress?id={}&id=&since=1", enc(&id));
    let page = bget(&r, &progress).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains(&id), "{}", page.body);
    app.cleanup().await;
}
