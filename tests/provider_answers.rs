//! What a provider's answer means (issue 38), against a local provider:
//! each row of the answer table (docs/provider-answers.md) through the
//! built-in `http` handler; the lookup answering applied, not applied,
//! unknown and too slow; and, with Azurite and the binary, `aqw keys
//! check` and `aqw poison replay --dry-run` printing the provider's answer
//! for an attempt that may have taken effect.

use crate::common::{aqw, eventually, Scripted, TestApp};
use aqw::handlers::http::HttpHandler;
use aqw::handlers::lookup::{ask, LookupAnswer};
use aqw_core::handler::ProviderAnswers;
use aqw_core::handler::{Handler, HandlerError, Job};
use aqw_core::handler::{Lookup, ReplayMarker};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One scripted answer: status, headers, body.
type Answer = (u16, Vec<(&'static str, &'static str)>, &'static str);

/// A provider that answers every request with the current script.
async fn provider(script: Arc<Mutex<Answer>>) -> url::Url {
    let app = axum::Router::new().fallback(move || {
        let (status, headers, body) = script.lock().unwrap().clone();
        async move {
            let mut h = HeaderMap::new();
            for (k, v) in headers {
                h.insert(k, HeaderValue::from_static(v));
            }
            if body == "SLOW" {
                tokio::time::sleep(Duration::from_secs(3)).await;
            }
            (StatusCode::from_u16(status).unwrap(), h, body)
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    url::Url::parse(&format!("http://{addr}/effects")).unwrap()
}

fn job() -> Job {
    Job {
        function: "Job".into(),
        message_id: "m-1".into(),
        dequeue_count: 1,
        payload: r#"{"orderId":"o-1"}"#.into(),
        key: None,
        provider_key: Some("pk-1".into()),
        previously_pending: false,
        key_partition: None,
        trace: None,
    }
}

/// How an answer was read, in the table's words.
fn reading(r: &Result<aqw_core::handler::Success, HandlerError>) -> String {
    match r {
        Ok(s) if s.provider.as_ref().is_some_and(|p| p.replayed) => "replayed success".into(),
        Ok(_) => "success".into(),
        Err(HandlerError::InProgress { .. }) => "in progress".into(),
        Err(HandlerError::ReplayedFailure { .. }) => "replayed failure".into(),
        Err(HandlerError::Throttled {
            retry_after: Some(_),
            ..
        }) => "later".into(),
        Err(HandlerError::Throttled { .. }) => "later, aqw's backoff".into(),
        Err(HandlerError::Permanent { .. }) => "permanent".into(),
        Err(HandlerError::Retryable {
            retry_after: Some(_),
            may_have_taken_effect: false,
            ..
        }) => "later".into(),
        Err(HandlerError::Retryable {
            may_have_taken_effect: false,
            ..
        }) => "refused, not applied".into(),
        Err(HandlerError::Retryable { .. }) => "may have taken effect".into(),
    }
}

/// Every row of the answer table, read by the built-in handler.
#[tokio::test]
async fn each_row_of_the_answer_table() {
    let script = Arc::new(Mutex::new((200, vec![], "")));
    let url = provider(script.clone()).await;
    let answers = ProviderAnswers {
        refused_statuses: vec![451],
        replay_marker: Some(ReplayMarker {
            pointer: "/idempotent_replayed".into(),
            value: json!(true),
        }),
        ..Default::default()
    };
    let h = HttpHandler::new(url, Duration::from_secs(5))
        .unwrap()
        .reading_answers(answers);
    let rows: Vec<(Answer, &str)> = vec![
        ((201, vec![], r#"{"id":"cr_1"}"#), "success"),
        (
            (200, vec![("idempotent-replayed", "true")], "{}"),
            "replayed success",
        ),
        (
            (200, vec![], r#"{"idempotent_replayed":true}"#),
            "replayed success",
        ),
        ((409, vec![], "idempotency_key_in_use"), "in progress"),
        (
            (422, vec![], "key reused with other parameters"),
            "permanent",
        ),
        ((404, vec![], "no such account"), "permanent"),
        ((451, vec![], "declared refusal"), "refused, not applied"),
        ((429, vec![("retry-after", "2")], ""), "later"),
        ((429, vec![], "too many requests"), "later, aqw's backoff"),
        (
            (429, vec![("ratelimit", r#""default";r=0;t=10"#)], ""),
            "later",
        ),
        (
            (
                429,
                vec![("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "5")],
                "",
            ),
            "later",
        ),
        ((503, vec![("retry-after", "5")], ""), "later"),
        (
            (503, vec![], "upstream connect error or disconnect/reset"),
            "may have taken effect",
        ),
        ((500, vec![], "boom"), "may have taken effect"),
        (
            (500, vec![("idempotent-replayed", "true")], "boom"),
            "replayed failure",
        ),
        (
            (500, vec![], r#"{"idempotent_replayed":true}"#),
            "replayed failure",
        ),
    ];
    for (answer, expected) in rows {
        let shown = format!("{answer:?}");
        *script.lock().unwrap() = answer;
        let got = reading(&h.handle(&job()).await);
        assert_eq!(got, expected, "{shown}");
    }
}

/// The lookup answers applied (2xx), not applied (404, 410), and unknown
/// (another status, too slow, nobody listening), each with its reason.
#[tokio::test]
async fn a_lookup_answers_applied_not_applied_or_unknown() {
    let script = Arc::new(Mutex::new((200, vec![], "")));
    let url = provider(script.clone()).await;
    let lookup = Lookup {
        url: format!(
            "{}/{{providerKey}}",
            url.as_str().trim_end_matches("/effects")
        ),
        timeout: Duration::from_secs(1),
    };
    let cases: Vec<(Answer, &str)> = vec![
        ((200, vec![], r#"{"status":"succeeded"}"#), "applied"),
        ((404, vec![], ""), "not applied"),
        ((410, vec![], ""), "not applied"),
        (
            (500, vec![], "oops"),
            "unknown (the provider answered HTTP 500: oops)",
        ),
        (
            (302, vec![("location", "/x")], ""),
            "unknown (the provider answered HTTP 302)",
        ),
        ((200, vec![], "SLOW"), "unknown (timed out after 1s"),
    ];
    for (answer, expected) in cases {
        *script.lock().unwrap() = answer;
        let got = ask(Some(&lookup), "pk/ä 1").await.line();
        assert!(got.starts_with(expected), "{got}");
    }
    let closed = Lookup {
        url: "http://127.0.0.1:9/{providerKey}".into(),
        timeout: Duration::from_secs(1),
    };
    assert!(matches!(
        ask(Some(&closed), "pk").await,
        LookupAnswer::Unknown { .. }
    ));
    assert_eq!(ask(None, "pk").await, LookupAnswer::NotAsked);
}

/// A job whose every attempt answered 500 (may have taken effect) is
/// poisoned; `aqw keys check` asks the provider's lookup and exits 0 when
/// it answers, 1 when it cannot tell; `poison replay --dry-run` marks the
/// record with its provider key and the provider's answer before anything
/// is replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_check_and_the_dry_run_show_the_providers_answer() {
    let script = Arc::new(Mutex::new((200, vec![], r#"{"status":"succeeded"}"#)));
    let url = provider(script.clone()).await;
    let base = url.as_str().trim_end_matches("/effects").to_string();
    let app = TestApp::new(
        json!({"key": "receipt:{/orderId}",
               "handler": {"type": "http", "url": format!("{base}/effects"),
                           "lookup": {"url": format!("{base}/idempotency/{{providerKey}}"), "timeout": "00:00:01"}}}),
        json!({"maxDequeueCount": 2}),
        json!({}),
    );
    let id = app.enqueue(r#"{"orderId":"u-1"}"#).await;
    let timed_out = Scripted::new(|_, _| Err(HandlerError::uncertain("POST /effects: timed out")));
    let w = app.start_worker(timed_out);
    eventually("the poison copy", Duration::from_secs(60), || async {
        (app.poison_messages().await.len() == 1).then_some(())
    })
    .await;
    w.stop().await;
    let run = |args: &[&str]| {
        let out = aqw(app.path(), args);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        (out.status.code(), text)
    };
    let (code, text) = run(&["keys", "check", "Job", "receipt:u-1"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("provider:     applied (the provider answered HTTP 200"),
        "{text}"
    );
    assert!(text.contains("uncertain:    2 attempt(s)"), "{text}");
    let (code, text) = run(&[
        "poison",
        "replay",
        "--uncertain-checked",
        &app.queue,
        "--all",
        "--dry-run",
    ]);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("! an attempt may have taken effect (provider key"),
        "{text}"
    );
    assert!(text.contains("the provider says: applied"), "{text}");
    let page = record_page(&app, &id).await;
    assert!(page.contains("the provider says: applied"), "{page}");
    *script.lock().unwrap() = (503, vec![], "");
    let (code, text) = run(&["keys", "check", "Job", "receipt:u-1", "--output", "json"]);
    assert_eq!(code, Some(1), "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["provider"]["answer"], "unknown", "{text}");
    let (code, _) = run(&["keys", "check", "Job", "receipt:never"]);
    assert_eq!(code, Some(1), "a key never claimed cannot be checked");
    // Issue 39: the provider cannot tell, and nobody checked: not replayed.
    let (code, text) = run(&["poison", "replay", &app.queue, "--all", "--by", "op"]);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("ask the provider first (aqw keys check Job receipt:u-1)"),
        "{text}"
    );
    // The lookup answers: replayed without the flag, its answer kept.
    *script.lock().unwrap() = (404, vec![], "");
    let (code, text) = run(&["poison", "replay", &app.queue, "--all", "--by", "op"]);
    assert_eq!(code, Some(0), "{text}");
    let rec = crate::common::poison_record(&app, &id).await;
    assert_eq!(
        rec.replay_note.as_deref(),
        Some("uncertain attempt checked with the provider: not applied (the provider answered HTTP 404)")
    );
    // The provider confirmed no effect: a new provider key, kept with who and why.
    let before = app
        .keys()
        .get("Job", &key("receipt:u-1"))
        .await
        .unwrap()
        .unwrap();
    let (code, text) = run(&[
        "keys",
        "new-provider-key",
        "Job",
        "receipt:u-1",
        "--reason",
        "ledger: no entry under the old key",
        "--by",
        "tester",
    ]);
    assert_eq!(code, Some(0), "{text}");
    let after = app
        .keys()
        .get("Job", &key("receipt:u-1"))
        .await
        .unwrap()
        .unwrap();
    assert_ne!(before.provider_key, after.provider_key);
    let note = after.history.last().unwrap();
    assert_eq!(note.outcome, "provider key replaced");
    assert!(note
        .error
        .as_deref()
        .unwrap()
        .contains(&before.provider_key));
    assert!(note.error.as_deref().unwrap().contains("by tester: ledger"));
    let (code, text) = run(&[
        "keys",
        "new-provider-key",
        "Job",
        "receipt:never",
        "--reason",
        "x",
        "--by",
        "t",
    ]);
    assert_eq!(code, Some(1), "{text}");
    let (code, _) = run(&[
        "keys",
        "new-provider-key",
        "Job",
        "receipt:u-1",
        "--by",
        "t",
    ]);
    assert_eq!(code, Some(2), "--reason is needed");
    app.cleanup().await;
}

/// The dashboard's record page of `id` (read-only, through its router).
async fn record_page(app: &TestApp, id: &str) -> String {
    use aqw::dashboard::{self, Dashboard, Options};
    use tower::ServiceExt as _;
    let options = Options {
        read_only: true,
        ..Options::default()
    };
    let router = dashboard::app(Arc::new(
        Dashboard::new(app.config.clone(), options).unwrap(),
    ));
    let uri = format!("/q/{}/record?id={id}", app.queue);
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

fn key(k: &str) -> aqw_core::idempotency::IdempotencyKey {
    aqw_core::idempotency::IdempotencyKey::new(k).unwrap()
}
