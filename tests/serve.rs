//! `aqw serve` (Functions custom handler): `fn app(state) -> Router` driven
//! with `oneshot` using request bodies shaped like the host's (fixtures), and
//! end to end against Azurite.

mod common;

use aqw::handlers::{HandlerError, Registry, Success};
use aqw::message::PoisonEnvelope;
use aqw::serve::{app, ServeState};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::*;
use serde_json::{json, Value};
use std::sync::Arc;
use tower::ServiceExt;

fn fixture(name: &str) -> String {
    std::fs::read_to_string(format!(
        "{}/tests/fixtures/custom-handler/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

fn string_invocation(id: &str, dequeue: u32, payload: &str) -> String {
    fixture("queue-string.json")
        .replace("__DATA__", &serde_json::to_string(payload).unwrap())
        .replace("__DEQUEUE__", &dequeue.to_string())
        .replace("__ID__", id)
}

async fn state(app: &TestApp, handler: Arc<dyn aqw::Handler>) -> ServeState {
    let registry = Registry::new().register("Job", handler);
    let rts =
        aqw::worker::runtimes(&app.config, &registry, &aqw::telemetry::Alerts::disabled()).unwrap();
    assert!(aqw::worker::ensure_resources(&rts, &tokio_util::sync::CancellationToken::new()).await);
    ServeState::new(rts)
}

async fn call(state: &ServeState, function: &str, body: String) -> (StatusCode, Value) {
    let resp = app(state.clone())
        .oneshot(
            Request::post(format!("/{function}"))
                .header("content-type", "application/json")
                .body(Body::from(body))
                .unwrap(),
        )
        .await
        .unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_invocations_get_clear_4xx() {
    let app_ = TestApp::new(json!({"key": "receipt:{/orderId}"}), json!({}), json!({}));
    let h = Scripted::new(|_, _| Ok(Success::done()));
    let s = state(&app_, h.clone()).await;
    let cases = [
        (
            "Job",
            "not json".to_string(),
            StatusCode::BAD_REQUEST,
            "not JSON",
        ),
        (
            "Job",
            r#"{"Metadata": {"DequeueCount": 1, "Id": "x"}}"#.to_string(),
            StatusCode::BAD_REQUEST,
            "Data",
        ),
        (
            "Nope",
            string_invocation("x", 1, "{}"),
            StatusCode::NOT_FOUND,
            "unknown function",
        ),
        (
            "Job",
            r#"{"Data": {"job": "{}"}, "Metadata": {"Id": "x"}}"#.to_string(),
            StatusCode::BAD_REQUEST,
            "DequeueCount",
        ),
        (
            "Job",
            r#"{"Data": {"job": "{}"}, "Metadata": {"DequeueCount": "many", "Id": "x"}}"#
                .to_string(),
            StatusCode::BAD_REQUEST,
            "DequeueCount",
        ),
        (
            "Job",
            r#"{"Data": {"job": "{}"}, "Metadata": {"DequeueCount": 1}}"#.to_string(),
            StatusCode::BAD_REQUEST,
            "Id",
        ),
    ];
    for (f, body, status, needle) in cases {
        let (got, v) = call(&s, f, body.clone()).await;
        assert_eq!(got, status, "{body}");
        assert!(
            v["error"].as_str().unwrap().contains(needle),
            "{v} should mention {needle}"
        );
    }
    assert_eq!(h.calls(), 0);
    app_.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_parsed_json_data_is_accepted() {
    let app_ = TestApp::new(json!({"key": "receipt:{/orderId}"}), json!({}), json!({}));
    let h = Scripted::new(|_, _| Ok(Success::done()));
    let s = state(&app_, h.clone()).await;
    let (status, v) = call(
        &s,
        "Job",
        fixture("queue-parsed.json").replace("__ID__", "m-parsed"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["ReturnValue"], Value::Null);
    assert!(v["Outputs"].is_object() && v["Logs"].is_array());
    let jobs = h.jobs.lock().unwrap().clone();
    assert_eq!(jobs[0].key.as_deref(), Some("receipt:parsed-1"));
    app_.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_invocations_until_the_cap_then_aqw_poisons_and_answers_200() {
    let app_ = TestApp::new(
        json!({"key": "receipt:{/orderId}"}),
        json!({"maxDequeueCount": 5}),
        json!({}),
    );
    let h = Scripted::new(|_, n| Err(HandlerError::retryable(format!("smtp timeout #{n}"))));
    let s = state(&app_, h.clone()).await;
    let payload = r#"{"orderId":"fx-1"}"#;
    for dq in 1..=4 {
        let (status, _) = call(&s, "Job", string_invocation("host-msg-1", dq, payload)).await;
        assert!(
            !status.is_success(),
            "attempt {dq} must be non-2xx so the host retries"
        );
    }
    let (status, v) = call(&s, "Job", string_invocation("host-msg-1", 5, payload)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(h.calls(), 5);
    let msgs = app_.poison_messages().await;
    assert_eq!(msgs.len(), 1);
    let env = PoisonEnvelope::from_queue_text(&msgs[0].text).unwrap();
    assert_eq!(env.error.message, "smtp timeout #5");
    assert_eq!(env.message_id, "host-msg-1");
    assert_eq!(env.dequeue_count, 5);
    assert_eq!(
        env.message.as_deref(),
        Some(aqw::message::encode(payload, app_.config.message_encoding).as_str())
    );
    // `aqw poison replay` works on it like any other record.
    let out = aqw(
        app_.path(),
        &[
            "poison",
            "replay",
            &app_.queue,
            "--id",
            "host-msg-1",
            "--by",
            "t",
            "--output",
            "json",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let src = app_.source().peek(32).await.unwrap();
    assert_eq!(src.len(), 1);
    assert_eq!(
        aqw::message::decode(&src[0].text, app_.config.message_encoding).unwrap(),
        payload
    );
    let (e, _) = app_
        .records()
        .get(&app_.queue, "host-msg-1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(e["Status"], "replayed");
    app_.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_invocation_of_a_done_key_answers_200_without_running() {
    let app_ = TestApp::new(json!({"key": "receipt:{/orderId}"}), json!({}), json!({}));
    let h = Scripted::new(|_, _| Ok(Success::done()));
    let s = state(&app_, h.clone()).await;
    let payload = r#"{"orderId":"once"}"#;
    assert_eq!(
        call(&s, "Job", string_invocation("m-a", 1, payload))
            .await
            .0,
        StatusCode::OK
    );
    assert_eq!(
        call(&s, "Job", string_invocation("m-b", 1, payload))
            .await
            .0,
        StatusCode::OK
    );
    assert_eq!(h.calls(), 1, "the duplicate did not run");
    app_.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_binary_listens_on_the_custom_handler_port() {
    let app_ = TestApp::new(
        json!({"key": "none", "handler": {"type": "exec", "command": ["sh", "-c", "cat >/dev/null"]}}),
        json!({}),
        json!({}),
    );
    // Missing or bad port: exit 2 before any I/O.
    let out = aqw(app_.path(), &["serve"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("FUNCTIONS_CUSTOMHANDLER_PORT"));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = std::process::Command::new(aqw_bin())
        .args(["serve", "--app"])
        .arg(app_.path())
        .env("AzureWebJobsStorage", CONN)
        .env("FUNCTIONS_CUSTOMHANDLER_PORT", port.to_string())
        .spawn()
        .unwrap();
    let client = reqwest::Client::new();
    let body = string_invocation("bin-1", 1, r#"{"x":1}"#).replace("\"job\"", "\"message\"");
    let resp = eventually("serve answers", std::time::Duration::from_secs(30), || {
        let client = client.clone();
        let body = body.clone();
        async move {
            client
                .post(format!("http://127.0.0.1:{port}/Job"))
                .body(body)
                .send()
                .await
                .ok()
        }
    })
    .await;
    assert_eq!(resp.status().as_u16(), 200);
    let _ = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    assert!(child.wait().unwrap().success(), "exit 0 on SIGTERM");
    app_.cleanup().await;
}

#[test]
fn the_example_functions_app_is_a_valid_aqw_app() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/functions-app");
    let cfg = aqw::config::load_with_env(&dir, &env_map()).unwrap();
    let f = cfg.function("SendReceipt").unwrap();
    assert_eq!(f.queue, "receipts");
    assert_eq!(f.binding_name, "job");
}
