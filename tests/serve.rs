//! `aqw serve` (Functions custom handler): `fn app(state) -> Router` driven
//! with `oneshot`, and the binary itself, with request bodies serialized the
//! way the Functions host serializes them (see
//! tests/fixtures/custom-handler/README.md for the host code each rule comes
//! from), against Azurite.

use crate::common::free_port;

use crate::common::*;
use aqw::handlers::Registry;
use aqw::serve::{app, parse_invocation, ServeState, Shape};
use aqw_core::handler::{Handler, HandlerError, Job, Success};
use aqw_core::poison::PoisonEnvelope;
use async_trait::async_trait;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use base64::Engine;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceExt;

fn fixture(name: &str) -> String {
    std::fs::read_to_string(format!(
        "{}/tests/fixtures/custom-handler/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

/// `JsonConvert.SerializeObject(string)`, then sent as a JSON string: the
/// host's `GetHttpScriptInvocationContextValue` for a string.
fn host_str(s: &str) -> Value {
    Value::String(serde_json::to_string(s).unwrap())
}

/// A queue-trigger invocation serialized by the host's rules
/// (`ToHttpScriptInvocationContext` + `Utility.ApplyBindingData`).
pub(crate) fn host_invocation(binding: &str, text: &str, id: &str, dequeue: u32) -> String {
    let mut meta = Map::new();
    meta.insert("DequeueCount".into(), json!(dequeue.to_string()));
    meta.insert("ExpirationTime".into(), json!("2026-12-09T17:58:31+00:00"));
    meta.insert("Id".into(), host_str(id));
    meta.insert("InsertionTime".into(), json!("2026-12-02T17:58:31+00:00"));
    meta.insert("NextVisibleTime".into(), json!("2026-12-02T18:08:32+00:00"));
    meta.insert(
        "PopReceipt".into(),
        host_str("AgAAAAMAAAAAAAAAAgtnDU/+1QE="),
    );
    meta.insert(
        "sys".into(),
        json!({"MethodName": "SendReceipt", "UtcNow": "2026-12-02T17:58:32.2205399Z", "RandGuid": "24ad4c06-24ad-4e5b-8294-3da9714877e9"}),
    );
    // The payload's top-level properties win over the built-in ones,
    // compared ignoring case; null and array values are skipped.
    if let Ok(Value::Object(payload)) = serde_json::from_str::<Value>(text) {
        for (k, v) in payload {
            let value = match &v {
                Value::Null | Value::Array(_) => continue,
                Value::Object(_) => v.clone(),
                Value::String(s) => host_str(s),
                Value::Bool(b) => host_str(if *b { "True" } else { "False" }),
                Value::Number(n) => host_str(&n.to_string()),
            };
            let name = meta
                .keys()
                .find(|m| m.eq_ignore_ascii_case(&k))
                .cloned()
                .unwrap_or(k);
            if !name.to_ascii_lowercase().ends_with("trigger") {
                meta.insert(name, value);
            }
        }
    }
    json!({"Data": {binding: host_str(text)}, "Metadata": meta}).to_string()
}

/// The same, for function.json `"dataType": "binary"`: base64 bytes, no merge.
fn host_binary_invocation(binding: &str, bytes: &[u8], id: &str, dequeue: u32) -> String {
    let mut v: Value = serde_json::from_str(&host_invocation(binding, "", id, dequeue)).unwrap();
    v["Data"][binding] = json!(base64::engine::general_purpose::STANDARD.encode(bytes));
    v.to_string()
}

pub(crate) async fn state(app: &TestApp, handler: Arc<dyn Handler>) -> ServeState {
    let registry = Registry::new().register("Job", handler);
    let rts =
        aqw::app::runtimes(&app.config, &registry, &aqw_core::alert::Alerts::disabled()).unwrap();
    assert!(
        aqw_core::runtime::ensure_resources(&rts, &tokio_util::sync::CancellationToken::new())
            .await
    );
    ServeState::new(rts)
}

pub(crate) async fn call(state: &ServeState, function: &str, body: String) -> (StatusCode, Value) {
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

fn keyed_app() -> TestApp {
    TestApp::new(
        json!({"key": "receipt:{/orderId}"}),
        json!({"maxDequeueCount": 5}),
        json!({}),
    )
}

#[test]
fn the_host_builder_reproduces_every_host_fixture() {
    let cases = [
        (
            "host-string.json",
            host_invocation("job", r#"{"orderId":"fx-1","amount":12.5}"#, "m-host-1", 1),
        ),
        (
            "host-id-in-payload.json",
            host_invocation("job", r#"{"id":42,"orderId":"fx-2"}"#, "m-host-2", 2),
        ),
        (
            "host-binary.json",
            host_binary_invocation("job", br#"{"orderId":"fx-1","amount":12.5}"#, "m-host-3", 1),
        ),
    ];
    for (name, built) in cases {
        let want: Value = serde_json::from_str(&fixture(name)).unwrap();
        let got: Value = serde_json::from_str(&built).unwrap();
        assert_eq!(got, want, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fixture_shape_parses_to_the_exact_message() {
    let app_ = keyed_app();
    let enc = app_.config.message_encoding;
    let text = r#"{"orderId":"fx-1","amount":12.5}"#;
    let f = app_.config.functions[0].clone();
    let mut binary = f.clone();
    binary.binary_data = true;
    let cases = [
        ("host-string.json", &f, "m-host-1", 1, Shape::Host),
        ("host-binary.json", &binary, "m-host-3", 1, Shape::Host),
        ("docs-shape.json", &f, "m-docs-4", 1, Shape::Docs),
    ];
    for (name, func, id, dq, shape) in cases {
        let inv = parse_invocation(fixture(name).as_bytes(), func, enc).unwrap();
        assert_eq!(inv.shape, shape, "{name}");
        assert_eq!(inv.message.id, id, "{name}: a bare id, no quotes");
        assert_eq!(inv.message.dequeue_count, dq, "{name}");
        assert_eq!(
            inv.message.pop_receipt, "AgAAAAMAAAAAAAAAAgtnDU/+1QE=",
            "{name}"
        );
        assert_eq!(
            aqw_core::message::decode(&inv.message.text, enc).unwrap(),
            text,
            "{name}"
        );
        assert_eq!(
            inv.message.insertion_time.unix_timestamp(),
            1_796_234_311,
            "{name}: InsertionTime 2026-12-02T17:58:31Z"
        );
        assert!(inv.shadowed.is_empty(), "{name}");
    }
    // Binary keeps bytes that are not UTF-8 exactly (base64 messageEncoding).
    let bytes = [0xffu8, 0xfe, b'{', 0x00];
    let inv = parse_invocation(
        host_binary_invocation("job", &bytes, "m-bin", 3).as_bytes(),
        &binary,
        enc,
    )
    .unwrap();
    assert_eq!(
        inv.message.text,
        base64::engine::general_purpose::STANDARD.encode(bytes)
    );
    // The payload's `id` replaced Metadata.Id: not used as the message id.
    let inv = parse_invocation(fixture("host-id-in-payload.json").as_bytes(), &f, enc).unwrap();
    assert_eq!(inv.shadowed, ["Id"]);
    assert!(inv.message.id.starts_with("derived-"), "{}", inv.message.id);
    assert_eq!(inv.message.dequeue_count, 2);
    // The same message on a later attempt (new pop receipt, count) keeps its id.
    let later = host_invocation("job", r#"{"id":42,"orderId":"fx-2"}"#, "m-host-2", 3)
        .replace("AgAAAAMAAAAAAAAAAgtnDU", "BgAAAAMAAAAAAAAAAgtnDU");
    let again = parse_invocation(later.as_bytes(), &f, enc).unwrap();
    assert_eq!(again.message.id, inv.message.id);
    // A payload field named like DequeueCount: the count is not trusted.
    let inv = parse_invocation(
        host_invocation("job", r#"{"orderId":"x","dequeueCount":"many"}"#, "m-dc", 5).as_bytes(),
        &f,
        enc,
    )
    .unwrap();
    assert_eq!(inv.shadowed, ["DequeueCount"]);
    assert_eq!(
        inv.message.dequeue_count, 1,
        "never poisons at the cap on a payload's word"
    );
    assert_eq!(inv.message.id, "m-dc");
    app_.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_invocations_get_a_4xx_naming_the_field_and_are_not_poisoned() {
    let app_ = keyed_app();
    let h = Scripted::new(|_, _| Ok(Success::done()));
    let s = state(&app_, h.clone()).await;
    let good = host_invocation("job", r#"{"orderId":"m"}"#, "x", 1);
    let with = |path: &[&str], v: Value| {
        let mut b: Value = serde_json::from_str(&good).unwrap();
        let mut at = &mut b;
        for p in &path[..path.len() - 1] {
            at = &mut at[*p];
        }
        at[path[path.len() - 1]] = v;
        b.to_string()
    };
    let without = |obj: &str, field: &str| {
        let mut b: Value = serde_json::from_str(&good).unwrap();
        b[obj].as_object_mut().unwrap().remove(field);
        b.to_string()
    };
    let cases = [
        ("not json".to_string(), "(body)"),
        (
            without("Data", "job").replace("\"Data\":{}", "\"Data\":{\"a\":1,\"b\":2}"),
            "Data.message",
        ),
        (
            json!({"Metadata": {"DequeueCount": "1", "Id": "\"x\""}}).to_string(),
            "Data",
        ),
        (with(&["Data"], json!("text")), "Data"),
        (with(&["Data", "job"], Value::Null), "Data.job"),
        // Host shape, but the text is not the JSON string literal the host sends.
        (
            with(&["Data", "job"], json!(r#"{"orderId":"m"}"#)),
            "Data.job",
        ),
        (without("Metadata", "DequeueCount"), "Metadata.DequeueCount"),
        (
            with(&["Metadata", "DequeueCount"], json!("many")),
            "Metadata.DequeueCount",
        ),
        (
            with(&["Metadata", "DequeueCount"], json!("0")),
            "Metadata.DequeueCount",
        ),
        (
            with(&["Metadata", "DequeueCount"], json!(true)),
            "Metadata.DequeueCount",
        ),
        (without("Metadata", "Id"), "Metadata.Id"),
        (with(&["Metadata", "Id"], json!(7)), "Metadata.Id"),
        (with(&["Metadata"], json!([])), "Metadata"),
    ];
    for (body, field) in cases {
        let (got, v) = call(&s, "Job", body.clone()).await;
        assert_eq!(got, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(v["field"], field, "{body}: {v}");
        assert!(v["error"].as_str().unwrap().starts_with(field), "{v}");
    }
    let (got, v) = call(&s, "Nope", good.clone()).await;
    assert_eq!(got, StatusCode::NOT_FOUND);
    assert!(
        v["error"].as_str().unwrap().contains("unknown function"),
        "{v}"
    );
    assert_eq!(h.calls(), 0);
    assert!(
        app_.poison_messages().await.is_empty(),
        "aqw poisoned nothing"
    );
    app_.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_shaped_failures_are_put_back_until_the_cap_then_aqw_poisons_with_a_bare_id() {
    let app_ = keyed_app();
    let h = Scripted::new(|_, n| Err(HandlerError::retryable(format!("smtp timeout #{n}"))));
    let s = state(&app_, h.clone()).await;
    let payload = r#"{"orderId":"fx-1","note":"a \"quoted\" \\ line"}"#;
    // Each failure is a fresh copy after the retry delay and a 200; the
    // key counts the attempts (tests/serve_backoff.rs plays the host whole).
    for attempt in 1..=5 {
        let (status, v) = call(&s, "Job", host_invocation("job", payload, "m-h2", 1)).await;
        assert_eq!(status, StatusCode::OK, "attempt {attempt}: {v}");
        assert!(v.get("error").is_none(), "no field the host ignores: {v}");
    }
    assert_eq!(
        TestApp::exact_count(app_.source().as_ref()).await,
        4,
        "a fresh copy per attempt below the cap"
    );
    assert_eq!(h.calls(), 5);
    for job in h.jobs.lock().unwrap().iter() {
        assert_eq!(job.payload, payload, "the handler sees the original text");
        assert_eq!(job.key.as_deref(), Some("receipt:fx-1"));
        assert_eq!(job.message_id, "m-h2");
    }
    let msgs = app_.poison_messages().await;
    assert_eq!(msgs.len(), 1);
    let env = PoisonEnvelope::from_queue_text(&msgs[0].text).unwrap();
    assert_eq!(env.error.message, "smtp timeout #5");
    assert_eq!(env.message_id, "m-h2", "a bare id, no quotes");
    assert_eq!(env.dequeue_count, 5);
    assert_eq!(
        env.message.as_deref(),
        Some(aqw_core::message::encode(payload, app_.config.message_encoding).as_str())
    );
    let (e, _) = app_
        .records()
        .get(&app_.queue, "m-h2")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(e["Status"], "open");
    app_.cleanup().await;
}

/// Payloads the host would mangle if aqw read its shape wrongly.
fn tricky_payloads() -> Vec<(&'static str, String)> {
    vec![
        ("json", r#"{"orderId":"p-json","amount":12.5}"#.to_string()),
        ("plain", "orderId=p-plain; not json at all".to_string()),
        (
            "quotes",
            "{\"orderId\":\"p-quotes\",\"s\":\"\\\"q\\\" \\\\ back\\\\slash \\u00e9 é ✓ 𝄞 \\n\"}"
                .to_string(),
        ),
        (
            "48KiB",
            format!(
                "{{\"orderId\":\"p-big\",\"pad\":\"{}\"}}",
                "x".repeat(48 * 1024 - 32)
            ),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_mode_poison_records_replay_byte_exact_through_aqw_run() {
    // Keyless, so the plain text is a valid job too; every job fails
    // permanently in serve mode, then succeeds under `aqw run` after replay.
    let app_ = TestApp::new(
        json!({"key": "none"}),
        json!({"maxDequeueCount": 5}),
        json!({}),
    );
    let failing = Scripted::new(|_, _| Err(HandlerError::permanent("provider rejected it")));
    let s = state(&app_, failing.clone()).await;
    let payloads = tricky_payloads();
    for (name, p) in &payloads {
        let (status, v) = call(
            &s,
            "Job",
            host_invocation("job", p, &format!("m-{name}"), 1),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{name}: {v}");
    }
    let seen: Vec<String> = failing
        .jobs
        .lock()
        .unwrap()
        .iter()
        .map(|j| j.payload.clone())
        .collect();
    for (name, p) in &payloads {
        assert!(seen.contains(p), "{name}: the handler saw the exact text");
        let (e, _) = app_
            .records()
            .get(&app_.queue, &format!("m-{name}"))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("record m-{name}"));
        assert_eq!(e["Status"], "open");
    }
    let out = aqw(
        app_.path(),
        &[
            "poison",
            "replay",
            "--uncertain-checked",
            &app_.queue,
            "--all",
            "--by",
            "t",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ok = Scripted::new(|_, _| Ok(Success::done()));
    let worker = app_.start_worker(ok.clone());
    app_.drained(Duration::from_secs(60)).await;
    worker.stop().await;
    let mut replayed: Vec<String> = ok
        .jobs
        .lock()
        .unwrap()
        .iter()
        .map(|j| j.payload.clone())
        .collect();
    let mut want: Vec<String> = payloads.iter().map(|(_, p)| p.clone()).collect();
    replayed.sort();
    want.sort();
    assert_eq!(replayed, want, "aqw run got every payload byte-exact, once");
    app_.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_id_field_never_becomes_the_message_id() {
    let app_ = keyed_app();
    let h = Scripted::new(|_, _| Err(HandlerError::permanent("closed account")));
    let s = state(&app_, h.clone()).await;
    // Two different messages whose payloads both say "Id": 42.
    for (order, id) in [("a", "m-one"), ("b", "m-two")] {
        let p = format!(r#"{{"Id":42,"orderId":"{order}"}}"#);
        let (status, v) = call(&s, "Job", host_invocation("job", &p, id, 1)).await;
        assert_eq!(status, StatusCode::OK, "{v}");
    }
    let msgs = app_.poison_messages().await;
    assert_eq!(msgs.len(), 2, "two records, not one overwritten");
    let ids: Vec<String> = msgs
        .iter()
        .map(|m| PoisonEnvelope::from_queue_text(&m.text).unwrap().message_id)
        .collect();
    assert_ne!(ids[0], ids[1]);
    for id in &ids {
        assert!(id.starts_with("derived-") && !id.contains('"'), "{id}");
        assert!(app_.records().get(&app_.queue, id).await.unwrap().is_some());
    }
    app_.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_invocation_of_a_done_key_answers_200_without_running() {
    let app_ = keyed_app();
    let h = Scripted::new(|_, _| Ok(Success::done()));
    let s = state(&app_, h.clone()).await;
    let payload = r#"{"orderId":"once"}"#;
    for id in ["m-a", "m-b"] {
        let (status, v) = call(&s, "Job", host_invocation("job", payload, id, 1)).await;
        assert_eq!(status, StatusCode::OK, "{v}");
    }
    // The docs' shape of the same job is a duplicate too.
    let docs = fixture("docs-shape.json").replace("fx-1", "once");
    assert_eq!(call(&s, "Job", docs).await.0, StatusCode::OK);
    assert_eq!(h.calls(), 1, "one effect per key");
    app_.cleanup().await;
}

/// A handler whose first call waits for `open`; later calls succeed.
struct Gate {
    entered: tokio::sync::Notify,
    open: tokio::sync::Notify,
    calls: std::sync::atomic::AtomicUsize,
}

#[async_trait]
impl Handler for Gate {
    async fn handle(&self, _job: &Job) -> Result<Success, HandlerError> {
        if self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            self.entered.notify_one();
            self.open.notified().await;
        }
        Ok(Success::done())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferral_at_the_last_attempt_becomes_a_record_not_a_silent_host_poison() {
    let app_ = keyed_app();
    let gate = Arc::new(Gate {
        entered: tokio::sync::Notify::new(),
        open: tokio::sync::Notify::new(),
        calls: 0.into(),
    });
    let s = state(&app_, gate.clone()).await;
    let payload = r#"{"orderId":"held"}"#;
    let first = {
        let s = s.clone();
        let body = host_invocation("job", payload, "m-holder", 1);
        tokio::spawn(async move { call(&s, "Job", body).await })
    };
    gate.entered.notified().await;
    // A duplicate at its last attempt while the key is held: below the cap it
    // would be deferred (500); at the cap the host would poison it silently.
    let (status, v) = call(&s, "Job", host_invocation("job", payload, "m-late", 4)).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "deferred: {v}");
    let (status, v) = call(&s, "Job", host_invocation("job", payload, "m-late", 5)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (e, _) = app_
        .records()
        .get(&app_.queue, "m-late")
        .await
        .unwrap()
        .unwrap();
    assert!(
        e["ErrorMessage"]
            .as_str()
            .unwrap_or_default()
            .contains("held by another attempt"),
        "{e:?}"
    );
    gate.open.notify_one();
    assert_eq!(first.await.unwrap().0, StatusCode::OK);
    // Replaying the record now is a duplicate: the holder finished the key.
    let out = aqw(
        app_.path(),
        &[
            "poison",
            "replay",
            "--uncertain-checked",
            &app_.queue,
            "--id",
            "m-late",
            "--by",
            "t",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let worker = app_.start_worker(Scripted::new(|_, _| {
        panic!("must not run: the key is done")
    }));
    app_.drained(Duration::from_secs(60)).await;
    worker.stop().await;
    assert_eq!(gate.calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    app_.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_binary_answers_the_host_with_ops_endpoints_and_invocation_ids_in_its_log() {
    let ops_port = free_port();
    let app_ = TestApp::new(
        json!({"key": "none", "handler": {"type": "exec", "command": ["sh", "-c", "cat >/dev/null"]}}),
        json!({}),
        json!({"http": {"port": ops_port}}),
    );
    // A function folder with another trigger: served as 404, not fatal.
    std::fs::create_dir_all(app_.path().join("Web")).unwrap();
    std::fs::write(
        app_.path().join("Web/function.json"),
        r#"{"bindings":[{"type":"httpTrigger","name":"req","direction":"in"}]}"#,
    )
    .unwrap();
    // Missing or bad port: exit 2 before any I/O.
    let out = aqw(app_.path(), &["serve"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("FUNCTIONS_CUSTOMHANDLER_PORT"));
    let port = free_port();
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = std::process::Command::new(aqw_bin())
        .args(["--log-format", "json", "serve", "--app"])
        .arg(app_.path())
        .env("AzureWebJobsStorage", CONN)
        .env("FUNCTIONS_CUSTOMHANDLER_PORT", port.to_string())
        .stdout(log.reopen().unwrap())
        .stderr(log.reopen().unwrap())
        .spawn()
        .unwrap();
    let client = reqwest::Client::new();
    let body = host_invocation("message", r#"{"x":1}"#, "bin-1", 1);
    let resp = eventually("serve answers", Duration::from_secs(30), || {
        let client = client.clone();
        let body = body.clone();
        async move {
            client
                .post(format!("http://127.0.0.1:{port}/Job"))
                .header("X-Azure-Functions-InvocationId", "inv-0b7e")
                // The host's HttpClient propagates its invocation's context.
                .header(
                    "traceparent",
                    "00-5c1d2b3e4f5a69788796a5b4c3d2e1f0-1122334455667788-01",
                )
                .body(body)
                .send()
                .await
                .ok()
        }
    })
    .await;
    assert_eq!(resp.status().as_u16(), 200);
    let web = client
        .post(format!("http://127.0.0.1:{port}/Web"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(web.status().as_u16(), 404);
    assert!(web.text().await.unwrap().contains("httpTrigger"));
    let get = |path: &'static str| {
        let client = client.clone();
        async move {
            let r = client
                .get(format!("http://127.0.0.1:{ops_port}{path}"))
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    assert_eq!(get("/readyz").await.0, 200);
    assert_eq!(get("/healthz").await.0, 200);
    let (_, metrics) = get("/metrics").await;
    assert!(
        metrics.lines().any(|l| l.starts_with("aqw_messages_total")
            && l.contains("function=\"Job\"")
            && l.contains("outcome=\"completed\"")),
        "{metrics}"
    );
    let _ = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    assert!(child.wait().unwrap().success(), "exit 0 on SIGTERM");
    let text = std::fs::read_to_string(log.path()).unwrap();
    let job_lines: Vec<&str> = text.lines().filter(|l| l.contains("bin-1")).collect();
    assert!(!job_lines.is_empty(), "{text}");
    for l in job_lines {
        assert!(
            l.contains("inv-0b7e"),
            "every job line carries the invocation id: {l}"
        );
    }
    assert!(text.contains("aqw.function.skipped"), "{text}");
    let outcome: Value = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l["event"] == "aqw.job.completed")
        .expect("an outcome line");
    assert_eq!(
        outcome["trace_id"], "5c1d2b3e4f5a69788796a5b4c3d2e1f0",
        "the job joined the host's trace"
    );
    app_.cleanup().await;
}

#[test]
fn the_example_functions_app_is_a_valid_aqw_app() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/functions-app");
    let cfg = aqw::config::load_with_env(&dir, &env_map()).unwrap();
    let f = cfg.function("SendReceipt").unwrap();
    assert_eq!(f.queue, "receipts");
    assert_eq!(f.binding_name, "job");
    assert!(
        f.binary_data,
        "the example asks the host for the exact bytes"
    );
    let host: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("host.json")).unwrap()).unwrap();
    assert!(
        host["customHandler"]
            .get("enableForwardingHttpRequest")
            .is_none(),
        "a setting the host does not use for queue triggers"
    );
}
