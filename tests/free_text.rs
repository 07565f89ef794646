//! Free text cannot forge or hide (issue 40): a pause reason, a discard
//! reason and a name with a newline, an ANSI escape and a right-to-left
//! override are stored on one line and shown visibly escaped by
//! `aqw status`, `aqw poison show` and the dashboard.

use crate::common::{aqw, poisoned_by_worker, TestApp};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// A line break to forge a log line, a colour escape and a bidi override.
const HOSTILE: &str = "ledger\nINFO aqw.forged by=admin \u{1b}[31mred \u{202E}evil";

fn assert_neutral(what: &str, text: &str) {
    assert!(!text.contains('\u{1b}'), "{what}: a raw escape: {text:?}");
    assert!(
        !text.contains('\u{202E}'),
        "{what}: a raw override: {text:?}"
    );
    assert!(
        !text
            .lines()
            .any(|l| l.trim_start().starts_with("INFO aqw.forged")),
        "{what}: a forged line: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_reasons_and_names_are_shown_escaped_everywhere() {
    let app = TestApp::new(json!({"key": "order:{/orderId}"}), json!({}), json!({}));
    let id = poisoned_by_worker(&app, Duration::from_secs(60)).await;
    let path = app.path().to_path_buf();
    let run = |args: &[&str]| {
        let out = aqw(&path, args);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
        )
    };
    let (code, _) = run(&["pause", "Job", "--reason", HOSTILE, "--by", "eve\u{202E}"]);
    assert_eq!(code, Some(0));
    let (code, text) = run(&["status"]);
    assert_eq!(code, Some(1), "{text}");
    assert_neutral("aqw status", &text);
    assert!(text.contains("ledger\\nINFO aqw.forged"), "{text}");
    let (code, text) = run(&["status", "--output", "json"]);
    assert_eq!(code, Some(1));
    assert_neutral("aqw status --output json", &text);
    let (code, text) = run(&[
        "poison", "discard", &app.queue, "--id", &id, "--reason", HOSTILE, "--by", "eve",
    ]);
    assert_eq!(code, Some(0), "{text}");
    let (_, text) = run(&["poison", "show", &app.queue, &id]);
    assert_neutral("aqw poison show", &text);
    assert!(text.contains("\\u{202e}evil"), "{text}");
    let page = dashboard_page(&app, "/").await;
    assert_neutral("the dashboard's status page", &page);
    let page = dashboard_page(&app, &format!("/q/{}/record?id={id}", app.queue)).await;
    assert_neutral("the dashboard's record page", &page);
    run(&["resume", "Job", "--by", "eve"]);
    app.cleanup().await;
}

async fn dashboard_page(app: &TestApp, uri: &str) -> String {
    use aqw::dashboard::{self, Dashboard, Options};
    use tower::ServiceExt as _;
    let options = Options {
        read_only: true,
        ..Options::default()
    };
    let router = dashboard::app(Arc::new(
        Dashboard::new(app.config.clone(), options).unwrap(),
    ));
    let req = axum::http::Request::builder()
        .uri(uri)
        .body(axum::body::Body::empty())
        .unwrap();
    let resp = router.oneshot(req).await.unwrap();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    String::from_utf8_lossy(&bytes).into_owned()
}
