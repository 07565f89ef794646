//! The provider's key window at replay time, against Azurite: a record
//! whose key is still `poisoned` with a provider key older than the
//! function's `providerKeyWindow` is refused by `poison replay` and
//! `poison fix` (exit 2, naming the window and the key's age, nothing
//! touched) until the operator passes `--past-provider-window`, which the
//! record keeps (who, when) and `poison show` prints.
//!
//! The old provider key is made without waiting: the key store's test seam
//! `KeyStore::set_provider_key_minted_at` (built with the `failpoints`
//! feature only) writes the key row's mint time (`FirstSeen`) three days back,
//! so this module is too (its `mod` line in tests/it.rs is gated).

use crate::common::*;
use serde_json::{json, Value};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(60);
const THREE_DAYS: time::Duration = time::Duration::days(3);

fn json_out(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// An app whose provider remembers keys for a day, with `orders` poisoned
/// (one 503 each), and the record ids in the same order.
async fn poisoned_app(sink: &Sink, orders: &[&str]) -> (TestApp, Vec<String>) {
    sink.fail_with(503);
    let app = TestApp::new(
        json!({"key": "receipt:{/orderId}", "providerKeyWindow": "1.00:00:00",
               "handler": {"type": "http", "url": format!("{}/effects", sink.url), "timeout": "00:00:05"}}),
        json!({"maxDequeueCount": 1}),
        json!({}),
    );
    let mut ids = vec![];
    for o in orders {
        ids.push(app.enqueue(&format!(r#"{{"orderId":"{o}"}}"#)).await);
    }
    let w = app.start_configured_worker();
    eventually("poison records", DEADLINE, || async {
        let rows = app
            .records()
            .query(Some(&app.queue))
            .await
            .unwrap_or_default();
        (rows.len() == orders.len() && TestApp::exact_count(app.source().as_ref()).await == 0)
            .then_some(())
    })
    .await;
    w.stop().await;
    sink.fail_with(200);
    (app, ids)
}

/// Make `order`'s provider key three days old.
async fn age_key(app: &TestApp, order: &str) {
    let key = aqw_core::idempotency::IdempotencyKey::new(format!("receipt:{order}")).unwrap();
    let minted = time::OffsetDateTime::now_utc() - THREE_DAYS;
    app.keys()
        .set_provider_key_minted_at("Job", &key, minted)
        .await
        .unwrap();
}

fn record_status(app: &TestApp, id: &str) -> Value {
    json_out(&aqw(
        app.path(),
        &["poison", "show", &app.queue, id, "--output", "json"],
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_past_the_window_is_refused_until_overridden() {
    let sink = Sink::start().await;
    let (app, ids) = poisoned_app(&sink, &["old", "young"]).await;
    age_key(&app, "old").await;
    assert_shown_against_the_window(&app, &ids);
    for args in [
        vec!["--all"],
        vec!["--id", ids[0].as_str()],
        vec!["--all", "--dry-run"],
    ] {
        let mut a = vec![
            "poison",
            "replay",
            "--uncertain-checked",
            app.queue.as_str(),
            "--by",
            "oncall",
        ];
        a.extend(args);
        let out = aqw(app.path(), &a);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{a:?}: {err}");
        assert!(
            err.contains("providerKeyWindow 1.00:00:00") && err.contains("3.00:00:"),
            "{err}"
        );
        assert!(
            err.contains(&ids[0]) && !err.contains(&ids[1]),
            "names the old record only: {err}"
        );
        assert!(err.contains("--past-provider-window"), "{err}");
    }
    assert_eq!(app.source_count().await, 0, "nothing was re-put");
    assert_eq!(record_status(&app, &ids[0])["record"]["status"], "open");

    let out = aqw(
        app.path(),
        &[
            "poison",
            "replay",
            "--uncertain-checked",
            &app.queue,
            "--id",
            &ids[1],
            "--by",
            "oncall",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "within the window: no override needed"
    );
    assert_overridden_replay(&app, &ids[0]);
    assert!(record_status(&app, &ids[1])["record"]["pastProviderWindowBy"].is_null());
    assert_eq!(app.source_count().await, 2, "both re-put");
    app.cleanup().await;
}

/// Replay `id` with the override: it is replayed, and the record keeps who
/// overrode the window, when, and the key's age against it.
fn assert_overridden_replay(app: &TestApp, id: &str) {
    let out = aqw(
        app.path(),
        &[
            "poison",
            "replay",
            "--uncertain-checked",
            &app.queue,
            "--id",
            id,
            "--by",
            "oncall",
            "--past-provider-window",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let show = record_status(app, id);
    let r = &show["record"];
    assert_eq!(
        (r["status"].as_str(), r["pastProviderWindowBy"].as_str()),
        (Some("replayed"), Some("oncall"))
    );
    assert!(r["pastProviderWindowAt"].as_str().is_some());
    assert!(r["pastProviderWindowNote"]
        .as_str()
        .unwrap()
        .contains("1.00:00:00"));
    let text = aqw(app.path(), &["poison", "show", &app.queue, id]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("overridden by oncall"));
}

/// `poison show` (JSON and text): the old key past the window, the young one within.
fn assert_shown_against_the_window(app: &TestApp, ids: &[String]) {
    let show = record_status(app, &ids[0]);
    let w = &show["providerWindow"];
    assert_eq!(
        (w["past"].as_bool(), w["windowSecs"].as_u64()),
        (Some(true), Some(86_400)),
        "{show}"
    );
    assert!(w["keyAgeSecs"].as_u64().unwrap() >= 3 * 86_400);
    assert_eq!(record_status(app, &ids[1])["providerWindow"]["past"], false);
    let text = aqw(app.path(), &["poison", "show", &app.queue, &ids[0]]);
    let text = String::from_utf8_lossy(&text.stdout).to_string();
    assert!(
        text.contains("PAST the window") && text.contains("1.00:00:00"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fix_past_the_window_is_refused_until_overridden() {
    let sink = Sink::start().await;
    let (app, ids) = poisoned_app(&sink, &["fixme"]).await;
    age_key(&app, "fixme").await;
    let fix = |extra: &[&str]| {
        let mut a = vec![
            "poison",
            "fix",
            app.queue.as_str(),
            "--id",
            ids[0].as_str(),
            "--payload",
            r#"{"orderId":"fixme","note":"corrected"}"#,
            "--by",
            "oncall",
        ];
        a.extend(extra);
        aqw(app.path(), &a)
    };
    let out = fix(&[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("providerKeyWindow 1.00:00:00") && err.contains("receipt:fixme"),
        "{err}"
    );
    assert_eq!(app.source_count().await, 0, "nothing put");
    let out = fix(&["--past-provider-window", "--output", "json"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(json_out(&out)["action"], "replaced");
    let r = &record_status(&app, &ids[0])["record"];
    assert_eq!(
        (r["status"].as_str(), r["pastProviderWindowBy"].as_str()),
        (Some("replaced"), Some("oncall"))
    );
    app.cleanup().await;
}

#[test]
fn a_bad_window_is_a_config_error_naming_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let host = json!({"version": "2.0", "aqw": {"functions": {"Pay": {"queue": "pay", "key": "none", "providerKeyWindow": "a day"}}}});
    std::fs::write(dir.path().join("host.json"), host.to_string()).unwrap();
    let out = aqw(dir.path(), &["poison", "list", "pay"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("aqw.functions.Pay.providerKeyWindow"), "{err}");
}

/// The dashboard's router, bearer-authenticated as `oncall`.
fn dashboard(app: &TestApp) -> axum::Router {
    let auth = aqw::dashboard::AuthConfig {
        token: Some(TOKEN.into()),
        user: "oncall".into(),
        ..Default::default()
    };
    let options = aqw::dashboard::Options {
        auth,
        ..Default::default()
    };
    let d = aqw::dashboard::Dashboard::new(app.config.clone(), options).unwrap();
    aqw::dashboard::app(std::sync::Arc::new(d))
}

const TOKEN: &str = "test-token-0123456789abcdef";

/// GET (no form) or POST (a form) as the bearer: (status, body).
async fn call(r: &axum::Router, uri: &str, form: Option<&str>) -> (u16, String) {
    use tower::ServiceExt as _;
    let req = axum::http::Request::builder()
        .method(if form.is_some() { "POST" } else { "GET" })
        .uri(uri)
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(axum::body::Body::from(form.unwrap_or("").to_string()))
        .unwrap();
    let resp = r.clone().oneshot(req).await.unwrap();
    let status = resp.status().as_u16();
    let bytes = axum::body::to_bytes(resp.into_body(), 16 << 20)
        .await
        .unwrap();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_the_window_and_refuses_until_overridden() {
    let sink = Sink::start().await;
    let (app, ids) = poisoned_app(&sink, &["dash"]).await;
    age_key(&app, "dash").await;
    let r = dashboard(&app);
    let q = &app.queue;
    let enc = |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
    let (status, page) = call(&r, &format!("/q/{q}/record?id={}", enc(&ids[0])), None).await;
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("id=\"provider-window\"") && page.contains("PAST the window"),
        "{page}"
    );
    assert!(
        page.contains("name=\"past_provider_window\""),
        "the override is offered"
    );
    let csrf = regex::Regex::new(r#"name="csrf" value="([0-9a-f]+)""#)
        .unwrap()
        .captures(&page)
        .unwrap()[1]
        .to_string();
    let form = format!("id={}&csrf={csrf}", enc(&ids[0]));
    assert_refused_in_dashboard(&r, q, &form).await;
    let over = format!("{form}&past_provider_window=1");
    let (status, dry) = call(
        &r,
        &format!("/q/{q}/replay"),
        Some(&format!("{over}&mode=dry-run")),
    )
    .await;
    assert_eq!(status, 200, "{dry}");
    assert!(
        dry.contains("name=\"past_provider_window\""),
        "the real replay keeps the override"
    );
    let (status, body) = call(
        &r,
        &format!("/q/{q}/replay"),
        Some(&format!("{over}&mode=real")),
    )
    .await;
    assert_eq!(status, 303, "{body}");
    let (_, page) = call(&r, &format!("/q/{q}/record?id={}", enc(&ids[0])), None).await;
    assert!(
        page.contains("id=\"past-window\"") && page.contains("overridden by"),
        "{page}"
    );
    assert_eq!(
        record_status(&app, &ids[0])["record"]["pastProviderWindowBy"],
        "oncall"
    );
    app.cleanup().await;
}

/// Replay (dry run and real) and fix from the dashboard: 409, naming the window.
async fn assert_refused_in_dashboard(r: &axum::Router, q: &str, form: &str) {
    let enc = |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
    let payload = enc(r#"{"orderId":"dash"}"#);
    for (path, extra) in [
        ("replay", "mode=dry-run".to_string()),
        ("replay", "mode=real".into()),
        ("fix", format!("payload={payload}")),
    ] {
        let (status, body) = call(
            r,
            &format!("/q/{q}/{path}"),
            Some(&format!("{form}&{extra}")),
        )
        .await;
        assert_eq!(status, 409, "{path} {extra}: {body}");
        assert!(body.contains("providerKeyWindow 1.00:00:00"), "{body}");
    }
}
