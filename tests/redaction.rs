//! `aqw.functions.<Name>.redact`, against Azurite and the real binary: the
//! card number never shows in `poison show` (text or JSON) or on the
//! dashboard's record page, a search cannot find it, a fix written from the
//! masked view keeps it, and a replay sends the exact stored payload.

use crate::common::*;
use aqw::dashboard::{self, AuthConfig, Dashboard, Options};
use aqw_core::handler::HandlerError;
use axum::body::Body;
use axum::http::Request;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceExt as _;

const DEADLINE: Duration = Duration::from_secs(60);
const CARD: &str = "4242424242424242";

fn app() -> TestApp {
    TestApp::new(
        json!({"key": "pay:{/account}", "redact": ["/card/number", "/customer/email"]}),
        json!({"maxDequeueCount": 1}),
        json!({}),
    )
}

/// Poison `payloads` with a handler that always fails (retryable, cap 1).
pub(crate) async fn poisoned(app: &TestApp, payloads: &[&str]) -> Vec<String> {
    let mut ids = vec![];
    for p in payloads {
        ids.push(app.enqueue(p).await);
    }
    let h = Scripted::new(|_, _| Err(HandlerError::retryable("HTTP 503 card processor down")));
    let w = app.start_worker(h);
    eventually("the poison copies", DEADLINE, || async {
        (app.poison_messages().await.len() == payloads.len()).then_some(())
    })
    .await;
    w.stop().await;
    ids
}

async fn get_page(app: &TestApp, uri: &str) -> String {
    let auth = AuthConfig {
        token: Some("redaction-test-token-0123456789".into()),
        ..AuthConfig::default()
    };
    let options = Options {
        read_only: true,
        auth,
        ..Options::default()
    };
    let d = Dashboard::new(app.config.clone(), options).unwrap();
    let req = Request::get(uri)
        .header("authorization", "Bearer redaction-test-token-0123456789")
        .body(Body::empty())
        .unwrap();
    let resp = dashboard::app(Arc::new(d)).oneshot(req).await.unwrap();
    let bytes = axum::body::to_bytes(resp.into_body(), 4 << 20)
        .await
        .unwrap();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redacted_fields_never_show_and_replay_and_fix_keep_them() {
    let app = app();
    let typo = format!(
        r#"{{"acount":"A-1","card":{{"number":"{CARD}","exp":"12/30"}},"customer":{{"email":"ada@example.com"}}}}"#
    );
    let keyed = format!(r#"{{"account":"A-2","card":{{"number":"{CARD}"}}}}"#);
    let ids = poisoned(&app, &[&typo, &keyed]).await;
    let (typo_id, keyed_id) = (&ids[0], &ids[1]);

    // poison show, text and JSON: masked, and says so.
    let text = aqw(app.path(), &["poison", "show", &app.queue, keyed_id]);
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    assert!(!text.contains(CARD), "{text}");
    assert!(
        text.contains("redacted (/card/number)") && text.contains("[redacted]"),
        "{text}"
    );
    let out = aqw(
        app.path(),
        &["poison", "show", &app.queue, typo_id, "--output", "json"],
    );
    let raw = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        !raw.contains(CARD) && !raw.contains("ada@example.com"),
        "{raw}"
    );
    let v: Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(v["payload"]["card"]["exp"], "12/30", "the rest is shown");
    assert!(v["redacted"].as_str().unwrap().contains("/customer/email"));

    // The dashboard's record page and its search.
    let page = get_page(&app, &format!("/q/{}/record?id={typo_id}", app.queue)).await;
    assert!(
        page.contains("payload-redacted") && !page.contains(CARD),
        "record page"
    );
    let found = get_page(&app, &format!("/q/{}?search={CARD}", app.queue)).await;
    assert!(
        found.contains("0 record(s)"),
        "a search cannot probe a redacted field"
    );
    let found = get_page(&app, &format!("/q/{}?search=12%2F30", app.queue)).await;
    assert!(found.contains("1 record(s)"), "the rest is searchable");

    // A fix written from the masked view: the card number is kept.
    let shown = v["payloadText"]
        .as_str()
        .unwrap()
        .replace("acount", "account");
    let out = aqw(
        app.path(),
        &[
            "poison",
            "fix",
            &app.queue,
            "--id",
            typo_id,
            "--payload",
            &shown,
            "--by",
            "oncall",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A replay: the exact stored payload.
    let out = aqw(
        app.path(),
        &[
            "poison",
            "replay",
            "--uncertain-checked",
            &app.queue,
            "--id",
            keyed_id,
            "--by",
            "oncall",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sent: Vec<String> = app
        .source()
        .peek(32)
        .await
        .unwrap()
        .into_iter()
        .map(|m| {
            aqw_core::message::decode(&m.text, aqw_core::message::MessageEncoding::Base64).unwrap()
        })
        .collect();
    assert!(sent.contains(&keyed), "replay is byte-exact: {sent:?}");
    let fixed: Vec<Value> = sent
        .iter()
        .filter(|t| t.contains("A-1"))
        .map(|t| serde_json::from_str(t).unwrap())
        .collect();
    assert_eq!(fixed.len(), 1, "{sent:?}");
    assert_eq!(
        fixed[0]["card"]["number"], CARD,
        "the fix kept the stored value"
    );
    assert_eq!(fixed[0]["customer"]["email"], "ada@example.com");
    assert_eq!(fixed[0]["account"], "A-1");
    app.cleanup().await;
}

#[test]
fn a_bad_pointer_exits_2_naming_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let host = json!({"version": "2.0", "aqw": {"functions": {"Job": {"queue": "qqq", "key": "none", "redact": ["card.number"]}}}});
    std::fs::write(dir.path().join("host.json"), host.to_string()).unwrap();
    let out = aqw(dir.path(), &["config", "show"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("aqw.functions.Job.redact") && err.contains("starts with /"),
        "{err}"
    );
}
