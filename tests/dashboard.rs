//! The dashboard's security, against a real Azurite through its router
//! (`tower::ServiceExt::oneshot`): unauthenticated and forged actions change
//! nothing, "by" is the principal, hostile payloads render inert, secrets
//! never render, and the poison list pages through 1,000 records.

use crate::common::*;
use aqw::dashboard::{self, AuthConfig, Dashboard, Options};
use aqw_core::handler::HandlerError;
use aqw_core::message::{ErrorInfo, ErrorKind, MessageEncoding};
use aqw_core::poison::{PoisonEnvelope, PoisonRecord, RecordStatus};
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::Router;
use base64::Engine as _;
use futures::StreamExt as _;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceExt as _;

const DEADLINE: Duration = Duration::from_secs(60);
const TOKEN: &str = "test-token-0123456789abcdef";

pub(crate) fn dashboard(app: &TestApp, read_only: bool) -> Router {
    let auth = AuthConfig {
        token: Some(TOKEN.into()),
        user: "oncall".into(),
        trust_principal: false,
        ..AuthConfig::default()
    };
    let options = Options {
        read_only,
        auth,
        ..Options::default()
    };
    let d = Dashboard::new(app.config.clone(), options).unwrap();
    dashboard::app(Arc::new(d))
}

pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: String,
}

async fn call(
    r: &Router,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    form: Option<&str>,
) -> Reply {
    let mut req = Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if form.is_some() {
        req = req.header("content-type", "application/x-www-form-urlencoded");
    }
    let req = req
        .body(Body::from(form.unwrap_or("").to_string()))
        .unwrap();
    let resp = r.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = axum::body::to_bytes(resp.into_body(), 16 << 20)
        .await
        .unwrap();
    Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

const BEARER: (&str, &str) = ("authorization", "Bearer test-token-0123456789abcdef");

/// GET as the bearer principal.
pub(crate) async fn bget(r: &Router, uri: &str) -> Reply {
    call(r, "GET", uri, &[BEARER], None).await
}

/// POST a form as the bearer principal.
pub(crate) async fn bpost(r: &Router, uri: &str, form: &str) -> Reply {
    call(r, "POST", uri, &[BEARER], Some(form)).await
}

/// An app whose jobs are keyed by `orderId`, with these queue settings.
pub(crate) fn keyed_app(queues: serde_json::Value) -> TestApp {
    TestApp::new(json!({"key": "order:{/orderId}"}), queues, json!({}))
}

/// The `aqw_session=…` pair a sign-in sets.
fn session_cookie(signed_in: &Reply) -> String {
    let set = signed_in.headers.get_all("set-cookie");
    let session = set
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .find(|c| c.starts_with("aqw_session="))
        .unwrap();
    session.split(';').next().unwrap().to_string()
}

/// POST the sign-in form with its pre-login cookie.
async fn sign_in(r: &Router, nonce: &str, form: &str) -> Reply {
    call(r, "POST", "/login", &[("cookie", nonce)], Some(form)).await
}

pub(crate) fn csrf_of(page: &str) -> String {
    let re = regex::Regex::new(r#"name="csrf" value="([0-9a-f]+)""#).unwrap();
    re.captures(page).expect("a form with a CSRF token")[1].to_string()
}

pub(crate) fn enc(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// Every way of sending `form` to `uri` without being its principal (or
/// without its CSRF token) is refused.
async fn assert_refused(r: &Router, uri: &str, form: &str, csrf: &str) {
    // No credentials at all (even with a valid-looking token).
    let with_csrf = format!("{form}&csrf={csrf}");
    let anon = call(r, "POST", uri, &[], Some(&with_csrf)).await;
    assert_eq!(
        anon.status,
        StatusCode::UNAUTHORIZED,
        "{uri}: {}",
        anon.body
    );
    // A wrong token.
    let wrong = call(
        r,
        "POST",
        uri,
        &[("authorization", "Bearer nope-nope-nope-nope")],
        Some(&with_csrf),
    )
    .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED, "{uri}");
    // The right principal, a forged or missing CSRF token.
    for forged in [format!("{form}&csrf={}", "ab".repeat(32)), form.to_string()] {
        let f = bpost(r, uri, &forged).await;
        assert_eq!(f.status, StatusCode::FORBIDDEN, "{uri}: {}", f.body);
    }
    // A session cookie that is not one of ours.
    let cookie = "aqw_session=v1.00.1.00";
    let c = call(r, "POST", uri, &[("cookie", cookie)], Some(&with_csrf)).await;
    assert_eq!(c.status, StatusCode::UNAUTHORIZED, "{uri}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actions_without_credentials_or_with_a_forged_csrf_token_change_nothing() {
    let app = keyed_app(json!({"maxDequeueCount": 1}));
    let id = poisoned_by_worker(&app, DEADLINE).await;
    let r = dashboard(&app, false);
    let q = &app.queue;
    let record_uri = format!("/q/{q}/record?id={}", enc(&id));
    // A real CSRF token, for the bearer principal.
    let page = bget(&r, &record_uri).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let csrf = csrf_of(&page.body);
    let actions = [
        ("replay", format!("mode=real&id={}", enc(&id))),
        ("discard", format!("id={}&reason=gone", enc(&id))),
        (
            "fix",
            format!("id={}&payload=%7B%22orderId%22%3A%22o-2%22%7D", enc(&id)),
        ),
    ];
    for (action, form) in &actions {
        assert_refused(&r, &format!("/q/{q}/{action}"), form, &csrf).await;
    }
    // Read-only: even the right principal with its own token is refused.
    let ro = dashboard(&app, true);
    for (action, form) in &actions {
        let with_csrf = format!("{form}&csrf={csrf}");
        let f = bpost(&ro, &format!("/q/{q}/{action}"), &with_csrf).await;
        assert_eq!(f.status, StatusCode::FORBIDDEN, "read-only {action}");
    }
    // Nothing changed: the record is open, the poison copy is there, the
    // source queue is empty and no key was closed.
    let rec = poison_record(&app, &id).await;
    assert_eq!(rec.status, RecordStatus::Open);
    assert_eq!(rec.replayed_by, None);
    assert_eq!(app.poison_messages().await.len(), 1);
    assert_eq!(TestApp::exact_count(app.source().as_ref()).await, 0);
    // Views need authentication too: a browser is sent to sign in.
    let anon_view = call(&r, "GET", "/", &[], None).await;
    assert_eq!(anon_view.status, StatusCode::SEE_OTHER);
    assert_eq!(anon_view.headers["location"], "/login");
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_is_the_principal_never_a_form_field() {
    let app = keyed_app(json!({"maxDequeueCount": 1}));
    let id = poisoned_by_worker(&app, DEADLINE).await;
    let r = dashboard(&app, false);
    let q = &app.queue;
    let page = bget(&r, &format!("/q/{q}/record?id={}", enc(&id))).await;
    let csrf = csrf_of(&page.body);
    let form = format!(
        "id={}&reason=account+closed&by=mallory&close_key=1&csrf={csrf}",
        enc(&id)
    );
    let d = bpost(&r, &format!("/q/{q}/discard"), &form).await;
    assert_eq!(d.status, StatusCode::SEE_OTHER, "{}", d.body);
    let rec = poison_record(&app, &id).await;
    assert_eq!(rec.status, RecordStatus::Discarded);
    assert_eq!(rec.discarded_by.as_deref(), Some("oncall"));
    assert_eq!(rec.discard_reason.as_deref(), Some("account closed"));
    // The key was closed too, by the same principal.
    let key = aqw_core::idempotency::IdempotencyKey::new("order:o-1").unwrap();
    let kr = app.keys().get("Job", &key).await.unwrap().unwrap();
    assert_eq!(
        (kr.status.as_str(), kr.cancelled_by.as_deref()),
        ("cancelled", Some("oncall"))
    );
    // The record page now shows the audit trail; a second discard is refused.
    let after = bget(&r, &format!("/q/{q}/record?id={}", enc(&id))).await;
    assert!(
        after.body.contains("discarded by <b>oncall</b>"),
        "{}",
        after.body
    );
    let again = bpost(&r, &format!("/q/{q}/discard"), &form).await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    app.cleanup().await;
}

/// Insert a record straight into the poison table (records are table rows).
pub(crate) async fn insert_record(
    app: &TestApp,
    id: &str,
    message: &str,
    encoding: MessageEncoding,
    error: &str,
) {
    let env = PoisonEnvelope {
        aqw: "poison/1".into(),
        queue: app.queue.clone(),
        function: "Job".into(),
        message_id: id.into(),
        inserted_at: "2026-12-03T10:00:00Z".into(),
        dequeue_count: 5,
        first_attempt_at: "2026-12-03T10:00:00Z".into(),
        poisoned_at: format!("2026-12-03T10:{:02}:00Z", id.len() % 60),
        key: aqw_core::idempotency::IdempotencyKey::new(format!("order:{id}")).ok(),
        error: ErrorInfo {
            kind: ErrorKind::Retryable,
            message: error.into(),
        },
        message: Some(message.into()),
        record: None,
        encoding,
    };
    let rec = PoisonRecord::open(env, "aqw", None);
    app.records()
        .insert(&app.queue, id, &rec.to_entity())
        .await
        .unwrap();
}

/// A page with nothing live in it and every security header.
fn assert_inert(p: &Reply) {
    assert_eq!(p.status, StatusCode::OK, "{}", p.body);
    assert!(
        !p.body.contains("<script"),
        "a live script tag: {}",
        &p.body
    );
    assert!(!p.body.contains("<img"), "a live img tag");
    assert!(
        !p.body.contains("Eby8vdM02xNOcq"),
        "the account key rendered"
    );
    assert!(!p.body.contains(TOKEN), "the dashboard token rendered");
    let csp = p.headers["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("default-src 'none'") && csp.contains("frame-ancestors 'none'"));
    assert!(!csp.contains("unsafe-inline"));
    assert_eq!(p.headers["x-frame-options"], "DENY");
    assert_eq!(p.headers["x-content-type-options"], "nosniff");
}

/// Four hostile records: script tags with a secret in the error, a 40 KB
/// line, invalid UTF-8 and invalid base64.
async fn insert_hostile(app: &TestApp) {
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let script =
        r#"{"orderId":"</pre><script>alert(1)</script>","note":"<img src=x onerror=alert(2)>"}"#;
    let long = format!(r#"{{"orderId":"long","blob":"{}"}}"#, "A".repeat(40_000));
    let invalid = b"{\"orderId\":\"\xff\xfe<script>alert(3)</script>\"}";
    let secret = "AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
    let error =
        format!("HTTP 500 <script>alert(4)</script> DefaultEndpointsProtocol=http;{secret}");
    insert_record(
        app,
        "hostile-script",
        &b64(script.as_bytes()),
        MessageEncoding::Base64,
        &error,
    )
    .await;
    insert_record(
        app,
        "hostile-long",
        &long,
        MessageEncoding::None,
        "HTTP 503",
    )
    .await;
    insert_record(
        app,
        "hostile-invalid-utf8",
        &b64(invalid),
        MessageEncoding::Base64,
        "decode",
    )
    .await;
    insert_record(
        app,
        "hostile-not-base64",
        "%%%<script>alert(5)</script>",
        MessageEncoding::Base64,
        "decode",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_payloads_render_inert_and_no_secret_renders() {
    let app = keyed_app(json!({}));
    app.records().create_if_missing().await.unwrap();
    insert_hostile(&app).await;
    let r = dashboard(&app, false);
    let q = &app.queue;
    let mut pages = vec![bget(&r, &format!("/q/{q}?status=all")).await];
    for id in [
        "hostile-script",
        "hostile-long",
        "hostile-invalid-utf8",
        "hostile-not-base64",
    ] {
        pages.push(bget(&r, &format!("/q/{q}/record?id={id}")).await);
    }
    pages.iter().for_each(assert_inert);
    assert!(pages[1]
        .body
        .contains("&lt;/pre&gt;&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(
        pages[2].body.contains(&"A".repeat(40_000)),
        "the long line is shown whole"
    );
    let invalid_page = &pages[3].body;
    assert!(invalid_page.contains("Not UTF-8"));
    assert!(
        invalid_page.contains("\u{FFFD}\u{FFFD}&lt;script&gt;alert(3)"),
        "lossy text"
    );
    assert!(invalid_page.contains("22 ff fe 3c 73"), "hex dump");
    assert!(pages[4].body.contains("not valid base64"));
    app.cleanup().await;
}

/// 1,000 open records: every third a 404, the others 503s.
async fn insert_thousand(app: &TestApp) {
    let ids: Vec<String> = (0..1000).map(|i| format!("rec-{i:04}")).collect();
    futures::stream::iter(ids.iter().map(|id| async move {
        let n = id[4..].parse::<u32>().unwrap();
        let error = if n % 3 == 0 {
            format!("HTTP 404 order {n} not found")
        } else {
            format!("HTTP 503 attempt {n}")
        };
        let payload = format!(r#"{{"orderId":"{id}"}}"#);
        insert_record(app, id, &payload, MessageEncoding::None, &error).await;
    }))
    .buffer_unordered(16)
    .collect::<Vec<()>>()
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_poison_list_pages_through_a_thousand_records() {
    let app = keyed_app(json!({}));
    app.records().create_if_missing().await.unwrap();
    insert_thousand(&app).await;
    let r = dashboard(&app, false);
    let q = &app.queue;
    let rows = |body: &str| body.matches("<td class=\"id\"><a href=\"/q/").count();
    let first = bget(&r, &format!("/q/{q}")).await;
    assert_eq!(first.status, StatusCode::OK);
    assert!(
        first.body.contains("1000 record(s) · page 1 of 20"),
        "{}",
        &first.body[..2000.min(first.body.len())]
    );
    assert_eq!(rows(&first.body), dashboard::PAGE_SIZE);
    // Grouped by cause as in the alert: 334 × 404, 666 × 503, numbers masked.
    assert!(
        first.body.contains(
            ">334</a></td><td>retryable</td><td class=\"wrap\">HTTP 404 order # not found"
        ),
        "groups"
    );
    assert!(
        first
            .body
            .contains(">666</a></td><td>retryable</td><td class=\"wrap\">HTTP 503 attempt #"),
        "groups"
    );
    let last = bget(&r, &format!("/q/{q}?status=open&page=20")).await;
    assert!(last.body.contains("page 20 of 20"));
    assert_eq!(rows(&last.body), 50);
    let beyond = bget(&r, &format!("/q/{q}?page=999")).await;
    assert!(beyond.body.contains("page 20 of 20"));
    // A cause filter, then its pages.
    let group = enc("retryable|HTTP 404 order # not found");
    let g = bget(&r, &format!("/q/{q}?status=open&group={group}&page=7")).await;
    assert!(
        g.body.contains("334 record(s) · page 7 of 7"),
        "{}",
        &g.body[..2000.min(g.body.len())]
    );
    assert_eq!(rows(&g.body), 34);
    // Error text filter (case-insensitive text, not a regex).
    let e = bget(&r, &format!("/q/{q}?error=order+99+NOT")).await;
    assert!(
        e.body.contains("1 record(s)"),
        "{}",
        &e.body[..2000.min(e.body.len())]
    );
    // The status page counts them all and shows the alert firing.
    let s = bget(&r, "/").await;
    assert!(s.body.contains("ALERT: 1000 open poison record(s)"));
    app.cleanup().await;
}

#[test]
fn the_dashboard_refuses_to_start_with_actions_and_no_authentication() {
    azurite();
    let app = keyed_app(json!({}));
    let out = std::process::Command::new(aqw_bin())
        .args(["dashboard", "--listen", "127.0.0.1:0", "--app"])
        .arg(app.path())
        .env("AzureWebJobsStorage", CONN)
        .env_remove("AQW_DASHBOARD_TOKEN")
        .env_remove("AQW_DASHBOARD_TRUST_PRINCIPAL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("AQW_DASHBOARD_TOKEN") && err.contains("--read-only"),
        "{err}"
    );
    let short = std::process::Command::new(aqw_bin())
        .args(["dashboard", "--app"])
        .arg(app.path())
        .env("AzureWebJobsStorage", CONN)
        .env("AQW_DASHBOARD_TOKEN", "short")
        .output()
        .unwrap();
    assert_eq!(short.status.code(), Some(2));
}

/// A worker whose handler fails with a 503 while `fail` is set, until `n`
/// poison copies exist.
async fn poison_while_failing(
    app: &TestApp,
    n: usize,
) -> (Arc<std::sync::atomic::AtomicBool>, RunningWorker) {
    let fail = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let f = fail.clone();
    let h = Scripted::new(move |_, _| {
        if f.load(std::sync::atomic::Ordering::SeqCst) {
            Err(HandlerError::retryable("HTTP 503 ledger down"))
        } else {
            Ok(aqw_core::handler::Success::default())
        }
    });
    let w = app.start_worker(h);
    eventually("the poison copies", DEADLINE, || async {
        (app.poison_messages().await.len() == n).then_some(())
    })
    .await;
    (fail, w)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_selection_replays_after_its_dry_run_and_confirms_on_the_progress_page() {
    let app = keyed_app(json!({"maxDequeueCount": 1}));
    let a = app.enqueue(r#"{"orderId":"sel-a"}"#).await;
    let b = app.enqueue(r#"{"orderId":"sel-b"}"#).await;
    let (fail, w) = poison_while_failing(&app, 2).await;
    let r = dashboard(&app, false);
    let q = &app.queue;
    let list = bget(&r, &format!("/q/{q}")).await;
    let csrf = csrf_of(&list.body);
    assert_eq!(
        list.body.matches("type=\"checkbox\" name=\"id\"").count(),
        2
    );
    let ids = format!("id={}&id={}&csrf={csrf}", enc(&a), enc(&b));
    let dry = bpost(
        &r,
        &format!("/q/{q}/replay"),
        &format!("mode=dry-run&{ids}"),
    )
    .await;
    assert_eq!(dry.status, StatusCode::OK, "{}", dry.body);
    assert_eq!(dry.body.matches("would-replay").count(), 2);
    assert_eq!(poison_record(&app, &a).await.status, RecordStatus::Open);
    fail.store(false, std::sync::atomic::Ordering::SeqCst);
    let real = bpost(&r, &format!("/q/{q}/replay"), &format!("mode=real&{ids}")).await;
    assert_eq!(real.status, StatusCode::SEE_OTHER, "{}", real.body);
    let progress = real.headers["location"].to_str().unwrap().to_string();
    let done = eventually("both keys confirmed", DEADLINE, || async {
        let p = bget(&r, &progress).await;
        p.body
            .contains("Confirmed: every key is done.")
            .then_some(p)
    })
    .await;
    assert_eq!(
        done.body.matches("confirmed done").count(),
        2,
        "{}",
        done.body
    );
    for id in [&a, &b] {
        let rec = poison_record(&app, id).await;
        assert_eq!(
            (rec.status, rec.replayed_by.as_deref()),
            (RecordStatus::Replayed, Some("oncall"))
        );
    }
    w.stop().await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_without_auth_shows_views_and_no_forms() {
    let app = keyed_app(json!({"maxDequeueCount": 1}));
    let id = poisoned_by_worker(&app, DEADLINE).await;
    let d = Dashboard::new(
        app.config.clone(),
        Options {
            read_only: true,
            ..Options::default()
        },
    )
    .unwrap();
    let r = dashboard::app(Arc::new(d));
    let q = &app.queue;
    let page = call(
        &r,
        "GET",
        &format!("/q/{q}/record?id={}", enc(&id)),
        &[],
        None,
    )
    .await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(
        page.body.contains("read-only") && !page.body.contains("<form method=\"post\""),
        "{}",
        page.body
    );
    let post = call(
        &r,
        "POST",
        &format!("/q/{q}/discard"),
        &[],
        Some(&format!("id={}&reason=x", enc(&id))),
    )
    .await;
    assert_eq!(post.status, StatusCode::FORBIDDEN);
    assert_eq!(poison_record(&app, &id).await.status, RecordStatus::Open);
    // Actions enabled without any authentication: refused before anything starts.
    assert!(Dashboard::new(app.config.clone(), Options::default()).is_err());
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_in_needs_the_token_and_its_own_form() {
    let app = keyed_app(json!({}));
    let r = dashboard(&app, false);
    let form = call(&r, "GET", "/login", &[], None).await;
    let set = form.headers["set-cookie"].to_str().unwrap().to_string();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    let nonce = set.split(';').next().unwrap().to_string();
    let csrf = csrf_of(&form.body);
    let wrong = sign_in(&r, &nonce, &format!("csrf={csrf}&token=wrong-wrong-wrong")).await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert!(wrong.headers.get("set-cookie").is_none());
    let forged = sign_in(
        &r,
        &nonce,
        &format!("csrf={}&token={TOKEN}", "00".repeat(32)),
    )
    .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    let no_cookie = call(
        &r,
        "POST",
        "/login",
        &[],
        Some(&format!("csrf={csrf}&token={TOKEN}")),
    )
    .await;
    assert_eq!(no_cookie.status, StatusCode::FORBIDDEN);
    let ok = sign_in(&r, &nonce, &format!("csrf={csrf}&token={TOKEN}")).await;
    assert_eq!(ok.status, StatusCode::SEE_OTHER);
    let cookie = session_cookie(&ok);
    let status = call(&r, "GET", "/", &[("cookie", &cookie)], None).await;
    assert_eq!(status.status, StatusCode::OK);
    assert!(
        status
            .body
            .contains("signed in as <b id=\"who\">oncall</b>"),
        "{}",
        status.body
    );
    assert!(!status.body.contains(TOKEN));
    app.cleanup().await;
}

/// Open records of two error groups, inserted as rows: three "ledger down"
/// 503s and two "order not found" 404s.
async fn two_groups(app: &TestApp) -> (Vec<String>, Vec<String>) {
    app.records().create_if_missing().await.unwrap();
    app.source().create_if_missing().await.unwrap();
    let down: Vec<String> = (0..3).map(|i| format!("down-{i}")).collect();
    let gone: Vec<String> = (0..2).map(|i| format!("gone-{i}")).collect();
    for id in &down {
        let payload = format!(r#"{{"orderId":"{id}"}}"#);
        insert_record(
            app,
            id,
            &payload,
            MessageEncoding::None,
            "HTTP 503 ledger down",
        )
        .await;
    }
    for id in &gone {
        let payload = format!(r#"{{"orderId":"{id}"}}"#);
        insert_record(
            app,
            id,
            &payload,
            MessageEncoding::None,
            "HTTP 404 order not found",
        )
        .await;
    }
    (down, gone)
}

async fn statuses(app: &TestApp, ids: &[String]) -> Vec<RecordStatus> {
    let mut out = vec![];
    for id in ids {
        out.push(poison_record(app, id).await.status);
    }
    out
}

/// A real group action's answer is a redirect to its operation's page:
/// that page once the operation is done (it runs in the background).
async fn operation_done(r: &Router, answer: &Reply) -> String {
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
    let to = answer.headers["location"].to_str().unwrap().to_string();
    assert!(to.starts_with("/ops/"), "{to}");
    eventually("the operation done", Duration::from_secs(30), || async {
        let page = bget(r, &to).await.body;
        page.contains("<strong>done</strong>").then_some(page)
    })
    .await
}

/// The value of the hidden `reviewed` field on a review page.
pub(crate) fn reviewed_of(page: &str) -> String {
    let re = regex::Regex::new(r#"name="reviewed" value="([0-9a-f]+)""#).unwrap();
    re.captures(page).expect("a review form")[1].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_replay_touches_only_that_group_and_only_what_its_dry_run_showed() {
    let app = keyed_app(json!({}));
    let (down, gone) = two_groups(&app).await;
    let r = dashboard(&app, false);
    let q = &app.queue;
    let group = enc("retryable|HTTP 503 ledger down");
    let list = bget(&r, &format!("/q/{q}?group={group}")).await;
    assert!(
        list.body.contains("Replay all 3 (dry run first)"),
        "{}",
        list.body
    );
    let csrf = csrf_of(&list.body);
    let query = format!("csrf={csrf}&group={group}");
    // The dry run shows the group's three records and changes nothing.
    let dry = bpost(
        &r,
        &format!("/q/{q}/group/replay"),
        &format!("{query}&mode=dry-run"),
    )
    .await;
    assert_eq!(dry.status, StatusCode::OK, "{}", dry.body);
    assert_eq!(dry.body.matches("would-replay").count(), 3, "{}", dry.body);
    assert!(gone.iter().all(|id| !dry.body.contains(id.as_str())));
    assert_eq!(statuses(&app, &down).await, [RecordStatus::Open; 3]);
    let reviewed = reviewed_of(&dry.body);
    // A real action without the dry run's fingerprint, or with a stale one, does nothing.
    for stale in ["", "&reviewed=0123456789abcdef01234567"] {
        let no = bpost(
            &r,
            &format!("/q/{q}/group/replay"),
            &format!("{query}&mode=real{stale}"),
        )
        .await;
        assert_eq!(no.status, StatusCode::CONFLICT, "{}", no.body);
        assert!(no.body.contains("Nothing was changed"), "{}", no.body);
    }
    assert_eq!(statuses(&app, &down).await, [RecordStatus::Open; 3]);
    // The real one replays exactly that group, by the principal.
    let real = bpost(
        &r,
        &format!("/q/{q}/group/replay"),
        &format!("{query}&mode=real&reviewed={reviewed}"),
    )
    .await;
    // It became a durable operation, carried out in the background; the
    // answer is the operation's page.
    let op_page = operation_done(&r, &real).await;
    assert!(
        op_page.contains("3 done, 0 skipped, 0 failed of 3 selected"),
        "{op_page}"
    );
    assert_eq!(statuses(&app, &down).await, [RecordStatus::Replayed; 3]);
    assert_eq!(statuses(&app, &gone).await, [RecordStatus::Open; 2]);
    for id in &down {
        let by = poison_record(&app, id)
            .await
            .replayed_by
            .unwrap_or_default();
        assert!(by.starts_with("oncall (operation "), "{by}");
    }
    assert_eq!(
        app.source_count().await,
        3,
        "one re-put per record of the group"
    );
    // The group is now empty: a second real action finds nothing.
    let again = bpost(
        &r,
        &format!("/q/{q}/group/replay"),
        &format!("{query}&mode=real&reviewed={reviewed}"),
    )
    .await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{}", again.body);
    assert_eq!(app.source_count().await, 3);
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_discard_is_reviewed_needs_a_reason_and_closes_keys_when_asked() {
    let app = keyed_app(json!({}));
    let (down, gone) = two_groups(&app).await;
    let r = dashboard(&app, false);
    let q = &app.queue;
    let csrf = csrf_of(&bget(&r, &format!("/q/{q}")).await.body);
    let query = format!("csrf={csrf}&error=not+found");
    let review = bpost(
        &r,
        &format!("/q/{q}/group/discard"),
        &format!("{query}&mode=dry-run"),
    )
    .await;
    assert_eq!(review.status, StatusCode::OK, "{}", review.body);
    assert!(review.body.contains("2 open record(s)"), "{}", review.body);
    assert_eq!(statuses(&app, &gone).await, [RecordStatus::Open; 2]);
    let reviewed = reviewed_of(&review.body);
    // Without a reason the real action shows the review again and changes nothing.
    let no_reason = bpost(
        &r,
        &format!("/q/{q}/group/discard"),
        &format!("{query}&mode=real&reviewed={reviewed}"),
    )
    .await;
    assert!(no_reason.body.contains("Review of a group discard"));
    assert_eq!(statuses(&app, &gone).await, [RecordStatus::Open; 2]);
    let done = bpost(
        &r,
        &format!("/q/{q}/group/discard"),
        &format!("{query}&mode=real&reviewed={reviewed}&reason=orders+deleted&close_key=1"),
    )
    .await;
    let op_page = operation_done(&r, &done).await;
    assert!(
        op_page.contains("2 done, 0 skipped, 0 failed of 2 selected"),
        "{op_page}"
    );
    for id in &gone {
        let rec = poison_record(&app, id).await;
        assert_eq!(
            (rec.status, rec.discard_reason.as_deref()),
            (RecordStatus::Discarded, Some("orders deleted"))
        );
        let by = rec.discarded_by.unwrap_or_default();
        assert!(by.starts_with("oncall (operation "), "{by}");
    }
    assert_eq!(statuses(&app, &down).await, [RecordStatus::Open; 3]);
    // Unauthenticated or forged group actions are refused like the others.
    assert_refused(
        &r,
        &format!("/q/{q}/group/discard"),
        "mode=real&reason=x",
        &csrf,
    )
    .await;
    assert_refused(&r, &format!("/q/{q}/group/replay"), "mode=real", &csrf).await;
    app.cleanup().await;
}

/// A group discard at half a record a second is cancelled from its page:
/// the operation stops before its next record, the rest stay open; the
/// operations list shows it; a cancel without credentials is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_operation_is_listed_watched_and_cancelled_from_its_page() {
    let app = keyed_app(json!({}));
    let (down, _) = two_groups(&app).await;
    let r = dashboard(&app, false);
    let q = &app.queue;
    let group = enc("retryable|HTTP 503 ledger down");
    let csrf = csrf_of(&bget(&r, &format!("/q/{q}?group={group}")).await.body);
    let query = format!("csrf={csrf}&group={group}");
    let review = bpost(
        &r,
        &format!("/q/{q}/group/discard"),
        &format!("{query}&mode=dry-run"),
    )
    .await;
    let reviewed = reviewed_of(&review.body);
    let bad = format!("{query}&mode=real&reviewed={reviewed}&reason=r&rate=0");
    let refused = bpost(&r, &format!("/q/{q}/group/discard"), &bad).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.body);
    assert!(
        refused.body.contains("rate &quot;0&quot;"),
        "{}",
        refused.body
    );
    let form = format!("{query}&mode=real&reviewed={reviewed}&reason=r&rate=0.5");
    let started = bpost(&r, &format!("/q/{q}/group/discard"), &form).await;
    assert_eq!(started.status, StatusCode::SEE_OTHER, "{}", started.body);
    let to = started.headers["location"].to_str().unwrap().to_string();
    let list = bget(&r, "/ops").await;
    assert!(list.body.contains(&to), "{}", list.body);
    let page = bget(&r, &to).await;
    assert!(page.body.contains("op-cancel"), "{}", page.body);
    assert_refused(&r, &format!("{to}/cancel"), "", &csrf).await;
    let cancel = bpost(&r, &format!("{to}/cancel"), &format!("csrf={csrf}")).await;
    assert_eq!(cancel.status, StatusCode::SEE_OTHER, "{}", cancel.body);
    let after = bget(&r, &to).await.body;
    assert!(
        after.contains("<strong>cancelled</strong>") && after.contains("cancelled by oncall"),
        "{after}"
    );
    assert!(
        !after.contains("op-cancel"),
        "no cancel button on a cancelled operation"
    );
    // Give a live executor time to act on a record it should not: at most
    // the one in flight when the cancel landed.
    let open = || async {
        statuses(&app, &down)
            .await
            .iter()
            .filter(|s| **s == RecordStatus::Open)
            .count()
    };
    let at_cancel = open().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let later = open().await;
    assert!(
        at_cancel >= 1 && later + 1 >= at_cancel && later >= 1,
        "{at_cancel} then {later}"
    );
    app.cleanup().await;
}

/// A group fix: the list offers it, the first step asks for a patch, a bad
/// patch is a 400, the preview says per record whether the patch applies
/// and the key the corrected job derives but never shows a corrected body,
/// a patch that moves, copies or tests a redacted field is refused, a patch
/// edited after its preview is refused, and the
/// real action is an operation that replaces only the records the patch
/// applies to, leaving the others open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_fix_previews_without_bodies_and_replaces_only_what_the_patch_fits() {
    let app = TestApp::new(
        json!({"key": "order:{/orderId}", "redact": ["/card"]}),
        json!({}),
        json!({}),
    );
    app.records().create_if_missing().await.unwrap();
    app.source().create_if_missing().await.unwrap();
    let ids: Vec<String> = (0..3).map(|i| format!("fix-{i}")).collect();
    for id in &ids {
        let payload = format!(r#"{{"orderId":"{id}","card":"4242424242424242"}}"#);
        insert_record(
            &app,
            id,
            &payload,
            MessageEncoding::None,
            "HTTP 422 no currency",
        )
        .await;
    }
    let r = dashboard(&app, false);
    let q = &app.queue;
    let list = bget(&r, &format!("/q/{q}")).await;
    assert!(
        list.body.contains("Fix all 3 with a patch"),
        "{}",
        list.body
    );
    let csrf = csrf_of(&list.body);
    let query = format!("csrf={csrf}&error=currency");
    let uri = format!("/q/{q}/group/fix");
    let ask = bpost(&r, &uri, &format!("{query}&mode=dry-run")).await;
    assert_eq!(ask.status, StatusCode::OK, "{}", ask.body);
    assert!(ask.body.contains("3 open record(s)") && ask.body.contains("group-fix-patch"));
    let bad = bpost(
        &r,
        &uri,
        &format!("{query}&mode=preview&patch={}", enc("{}")),
    )
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);
    assert!(bad.body.contains("not a JSON Patch"), "{}", bad.body);
    // Moving, copying or testing a redacted field would show it: refused.
    for reads in [
        r#"[{"op":"move","from":"/card","path":"/shown"}]"#,
        r#"[{"op":"copy","from":"/card","path":"/orderId"}]"#,
        r#"[{"op":"test","path":"/card","value":"4242424242424242"}]"#,
        r#"[{"op":"copy","from":"","path":"/all"}]"#,
    ] {
        let form = format!("{query}&mode=preview&patch={}", enc(reads));
        let refused = bpost(&r, &uri, &form).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{reads}");
        assert!(
            refused.body.contains("a redacted field"),
            "{}",
            refused.body
        );
        assert!(!refused.body.contains("4242424242424242"));
    }
    let patch = r#"[{"op":"test","path":"/orderId","value":"fix-0"},{"op":"remove","path":"/card"},{"op":"add","path":"/currency","value":"EUR"}]"#;
    let preview = bpost(
        &r,
        &uri,
        &format!("{query}&mode=preview&patch={}", enc(patch)),
    )
    .await;
    assert_eq!(preview.status, StatusCode::OK, "{}", preview.body);
    assert!(
        preview.body.contains("applies to 1 of the first 3"),
        "{}",
        preview.body
    );
    assert!(preview.body.contains("key order:fix-0"), "{}", preview.body);
    assert!(preview.body.contains("did not match"), "{}", preview.body);
    assert!(
        !preview.body.contains("4242424242424242"),
        "no body, no card"
    );
    assert_eq!(statuses(&app, &ids).await, [RecordStatus::Open; 3]);
    let reviewed = reviewed_of(&preview.body);
    let digest = regex::Regex::new(r#"name="patch_reviewed" value="([0-9a-f]+)""#)
        .unwrap()
        .captures(&preview.body)
        .expect("the previewed patch's digest")[1]
        .to_string();
    // A patch edited after its preview is refused.
    let real_form = |p: &str| {
        format!(
            "{query}&mode=real&reviewed={reviewed}&patch_reviewed={digest}&patch={}",
            enc(p)
        )
    };
    let stale = bpost(&r, &uri, &real_form(&patch.replace("EUR", "USD"))).await;
    assert_eq!(stale.status, StatusCode::CONFLICT, "{}", stale.body);
    assert_eq!(statuses(&app, &ids).await, [RecordStatus::Open; 3]);
    let real = bpost(&r, &uri, &real_form(patch)).await;
    let op_page = operation_done(&r, &real).await;
    assert!(
        op_page.contains("1 done, 2 skipped, 0 failed of 3 selected"),
        "{op_page}"
    );
    assert_eq!(
        statuses(&app, &ids).await,
        [
            RecordStatus::Replaced,
            RecordStatus::Open,
            RecordStatus::Open
        ]
    );
    let fixed = poison_record(&app, &ids[0]).await;
    let by = fixed.replaced_by.unwrap_or_default();
    assert!(by.starts_with("oncall (operation "), "{by}");
    assert_refused(&r, &uri, &format!("mode=real&patch={}", enc(patch)), &csrf).await;
    app.cleanup().await;
}
