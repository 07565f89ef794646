//! Traces of real jobs, as users run them: the `aqw` binary (`aqw enqueue`,
//! `aqw run`) against Azurite, an HTTP handler server, and local receivers
//! that decode what the exporters send — OTLP/HTTP protobuf
//! (`ExportTraceServiceRequest`) and the Application Insights track API
//! (gzip JSON envelopes, the exporter's own wire format).

use crate::common::*;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message as _;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::Read as _;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const PRODUCER: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
const PRODUCER_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";

/// One span as the OTLP receiver decoded it.
#[derive(Debug, Clone)]
struct SeenSpan {
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    kind: i32,
    status_code: i32,
    attrs: BTreeMap<String, String>,
    /// (trace id, span id) of each link.
    links: Vec<(String, String)>,
}

/// A local collector: `/v1/traces` (OTLP protobuf) and `/v2/track`
/// (Application Insights).
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<SeenSpan>>>,
    envelopes: Arc<Mutex<Vec<Value>>>,
}

impl Receiver {
    async fn start() -> (Self, String) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let r = Receiver::default();
        let app = Router::new()
            .route("/v1/traces", post(otlp))
            .route("/v2/track", post(track))
            .with_state(r.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (r, url)
    }

    fn spans(&self) -> Vec<SeenSpan> {
        self.spans.lock().unwrap().clone()
    }

    fn named(&self, name: &str) -> Vec<SeenSpan> {
        self.spans()
            .into_iter()
            .filter(|s| s.name == name)
            .collect()
    }
}

async fn otlp(State(r): State<Receiver>, body: Bytes) -> StatusCode {
    let Ok(req) = ExportTraceServiceRequest::decode(body) else {
        return StatusCode::BAD_REQUEST;
    };
    let mut out = r.spans.lock().unwrap();
    for rs in req.resource_spans {
        for ss in rs.scope_spans {
            for s in ss.spans {
                let attrs = s
                    .attributes
                    .iter()
                    .map(|kv| {
                        let v = match kv.value.as_ref().and_then(|v| v.value.clone()) {
                            Some(AnyValue::StringValue(s)) => s,
                            Some(AnyValue::IntValue(i)) => i.to_string(),
                            Some(AnyValue::BoolValue(b)) => b.to_string(),
                            Some(AnyValue::DoubleValue(d)) => d.to_string(),
                            other => format!("{other:?}"),
                        };
                        (kv.key.clone(), v)
                    })
                    .collect();
                out.push(SeenSpan {
                    name: s.name,
                    trace_id: hex(&s.trace_id),
                    span_id: hex(&s.span_id),
                    parent_span_id: hex(&s.parent_span_id),
                    kind: s.kind,
                    status_code: s.status.map(|st| st.code).unwrap_or(0),
                    attrs,
                    links: s
                        .links
                        .iter()
                        .map(|l| (hex(&l.trace_id), hex(&l.span_id)))
                        .collect(),
                });
            }
        }
    }
    StatusCode::OK
}

async fn track(State(r): State<Receiver>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let mut text = Vec::new();
    let gz = headers
        .get("content-encoding")
        .is_some_and(|v| v.as_bytes() == b"gzip");
    if gz {
        if flate2::read::GzDecoder::new(&body[..])
            .read_to_end(&mut text)
            .is_err()
        {
            return StatusCode::BAD_REQUEST;
        }
    } else {
        text = body.to_vec();
    }
    let Ok(Value::Array(items)) = serde_json::from_slice::<Value>(&text) else {
        return StatusCode::BAD_REQUEST;
    };
    r.envelopes.lock().unwrap().extend(items);
    StatusCode::OK
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// An HTTP handler that answers 500 to the first `failures` calls, then
/// 200, and keeps the `traceparent` of every call.
#[derive(Clone)]
struct Handler {
    failures: usize,
    traceparents: Arc<Mutex<Vec<Option<String>>>>,
}

impl Handler {
    async fn start(failures: usize) -> (Self, String) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/effects", listener.local_addr().unwrap());
        let h = Handler {
            failures,
            traceparents: Arc::default(),
        };
        let app = Router::new()
            .route("/effects", post(handle))
            .with_state(h.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (h, url)
    }

    fn calls(&self) -> Vec<Option<String>> {
        self.traceparents.lock().unwrap().clone()
    }
}

async fn handle(State(h): State<Handler>, headers: HeaderMap) -> StatusCode {
    let mut seen = h.traceparents.lock().unwrap();
    seen.push(
        headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
    );
    if seen.len() <= h.failures {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::OK
    }
}

fn traced_app(handler_url: &str) -> TestApp {
    TestApp::new(
        json!({"key": "order:{/orderId}", "handler": {"type": "http", "url": handler_url, "timeout": "00:00:05"}}),
        json!({}),
        json!({"tracing": {"parent": "/traceparent"}}),
    )
}

/// `aqw run` with `env`, logging JSON lines to a file.
struct Worker {
    child: Child,
    log: tempfile::NamedTempFile,
}

impl Worker {
    fn start(app: &TestApp, env: &[(&str, &str)]) -> Self {
        let log = tempfile::NamedTempFile::new().unwrap();
        let mut cmd = Command::new(aqw_bin());
        cmd.args(["--log-format", "json", "run", "--app"])
            .arg(app.path())
            .env("AzureWebJobsStorage", CONN)
            .env_remove("AQW_LOG")
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
            .stdout(Stdio::null())
            .stderr(log.reopen().unwrap());
        for k in [
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "APPLICATIONINSIGHTS_CONNECTION_STRING",
            "OTEL_SDK_DISABLED",
            "OTEL_TRACES_EXPORTER",
        ] {
            cmd.env_remove(k);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        Worker {
            child: cmd.spawn().unwrap(),
            log,
        }
    }

    /// SIGTERM, then the exit status (the trace guard flushes on the way out).
    fn stop(mut self) -> (std::process::ExitStatus, Vec<Value>) {
        unsafe_sigterm(self.child.id());
        let status = self.child.wait().unwrap();
        let lines = std::fs::read_to_string(self.log.path())
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        (status, lines)
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }
}

fn unsafe_sigterm(pid: u32) {
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
}

/// `aqw enqueue` as a producer inside a trace: TRACEPARENT in its
/// environment, no exporter. Returns the payload as it was put.
async fn enqueue_as_producer(app: &TestApp, payload: &str) -> String {
    let out = Command::new(aqw_bin())
        .args(["enqueue", &app.queue, "--payload", payload, "--app"])
        .arg(app.path())
        .env("AzureWebJobsStorage", CONN)
        .env("TRACEPARENT", PRODUCER)
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("APPLICATIONINSIGHTS_CONNECTION_STRING")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let peeked = app.source().peek(1).await.unwrap();
    aqw_core::message::decode(&peeked[0].text, app.config.message_encoding).unwrap()
}

#[tokio::test]
async fn otlp_sees_three_attempts_in_the_producers_trace_and_the_handler_its_span() {
    let (rx, rx_url) = Receiver::start().await;
    let (handler, handler_url) = Handler::start(2).await;
    let app = traced_app(&handler_url);
    let put = enqueue_as_producer(&app, r#"{"orderId":"o-trace-1"}"#).await;
    let sent: Value = serde_json::from_str(&put).unwrap();
    let enqueue_tp = sent["traceparent"]
        .as_str()
        .expect("enqueue wrote the context");
    assert!(
        enqueue_tp.starts_with(&format!("00-{PRODUCER_TRACE}-")),
        "{enqueue_tp}"
    );
    let enqueue_span = enqueue_tp.split('-').nth(2).unwrap().to_string();

    // Storage request spans are asked for (AQW_TRACE_STORAGE), so the
    // claim's table request shows beneath it.
    let worker = Worker::start(
        &app,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &rx_url),
            ("AQW_TRACE_STORAGE", "true"),
        ],
    );
    let jobs = eventually("three aqw.job spans", Duration::from_secs(60), || async {
        let jobs = rx.named("aqw.job");
        (jobs.len() >= 3).then_some(jobs)
    })
    .await;
    app.drained(Duration::from_secs(30)).await;
    let (status, lines) = worker.stop();
    assert!(status.success(), "aqw run exited {status:?}");

    let mut jobs = jobs;
    jobs.sort_by_key(|j| j.attrs["dequeue_count"].parse::<u32>().unwrap());
    let outcomes: Vec<&str> = jobs.iter().map(|j| j.attrs["outcome"].as_str()).collect();
    assert_eq!(outcomes, ["retried", "retried", "completed"]);
    for (i, j) in jobs.iter().enumerate() {
        assert_eq!(
            j.trace_id, PRODUCER_TRACE,
            "attempt {i} joined the producer's trace"
        );
        assert_eq!(
            j.parent_span_id, enqueue_span,
            "parent is the enqueue's span"
        );
        assert_eq!(j.kind, 5, "aqw.job is a consumer span");
        assert_eq!(j.attrs["key"], "order:o-trace-1");
        assert_eq!(j.attrs["queue"], app.queue);
        assert_eq!(j.attrs["messaging.destination.name"], app.queue);
        assert_eq!(j.attrs["messaging.operation.type"], "process");
        assert_eq!(j.attrs["messaging.message.id"], j.attrs["message_id"]);
        assert!(j.attrs.contains_key("duration_ms"));
        // Failed attempts carry an error status (2), the last one not.
        assert_eq!(j.status_code == 2, i < 2, "status of attempt {i}: {j:?}");
    }
    let all = rx.spans();
    let children = |job: &SeenSpan, name: &str| -> Vec<SeenSpan> {
        all.iter()
            .filter(|s| s.parent_span_id == job.span_id && s.name == name)
            .cloned()
            .collect()
    };
    let calls = handler.calls();
    assert_eq!(calls.len(), 3);
    for (i, j) in jobs.iter().enumerate() {
        assert_eq!(
            children(j, "aqw.key.claim").len(),
            1,
            "claim of attempt {i}"
        );
        assert_eq!(children(j, "aqw.settle").len(), 1, "settle of attempt {i}");
        let handler_spans = children(j, "aqw.handler");
        assert_eq!(handler_spans.len(), 1, "handler call of attempt {i}");
        let hs = &handler_spans[0];
        assert_eq!(hs.kind, 3, "the handler call is a client span");
        assert_eq!(hs.status_code == 2, i < 2);
        // The handler got this very span as its parent.
        let expected = format!("00-{}-{}-01", hs.trace_id, hs.span_id);
        assert!(
            calls
                .iter()
                .any(|c| c.as_deref() == Some(expected.as_str())),
            "handler saw {calls:?}, expected {expected}"
        );
        // Storage calls hang beneath the steps, with HTTP conventions.
        let claim = &children(j, "aqw.key.claim")[0];
        let storage: Vec<&SeenSpan> = all
            .iter()
            .filter(|s| s.parent_span_id == claim.span_id)
            .collect();
        assert!(!storage.is_empty(), "the claim's table request");
        assert!(storage[0].attrs.contains_key("http.request.method"));
        assert!(!storage[0].attrs["url.full"].contains('?'));
    }
    assert_eq!(children(&jobs[2], "aqw.key.done").len(), 1);
    // The outcome lines carry the same ids and a duration.
    for j in &jobs {
        let line = lines
            .iter()
            .find(|l| l["span_id"] == j.span_id.as_str())
            .unwrap_or_else(|| panic!("no outcome line for span {}", j.span_id));
        assert_eq!(line["trace_id"], PRODUCER_TRACE);
        assert!(line["duration_ms"].is_u64());
        assert_eq!(line["outcome"], j.attrs["outcome"].as_str());
    }
    app.cleanup().await;
}

#[tokio::test]
async fn app_insights_gets_the_job_as_a_request_with_its_dependencies() {
    let (rx, rx_url) = Receiver::start().await;
    let (handler, handler_url) = Handler::start(0).await;
    let app = traced_app(&handler_url);
    app.enqueue(&format!(
        r#"{{"orderId":"o-ai-1","traceparent":"{PRODUCER}"}}"#
    ))
    .await;
    let cs = format!(
        "InstrumentationKey=11111111-2222-3333-4444-555555555555;IngestionEndpoint={rx_url}/"
    );
    let worker = Worker::start(&app, &[("APPLICATIONINSIGHTS_CONNECTION_STRING", &cs)]);
    let request = eventually("a request envelope", Duration::from_secs(60), || async {
        rx.envelopes
            .lock()
            .unwrap()
            .iter()
            .find(|e| e["data"]["baseType"] == "RequestData")
            .cloned()
    })
    .await;
    app.drained(Duration::from_secs(30)).await;
    let (status, _) = worker.stop();
    assert!(status.success());
    assert_eq!(handler.calls().len(), 1);
    let envelopes = rx.envelopes.lock().unwrap().clone();
    let base = &request["data"]["baseData"];
    assert_eq!(base["name"], "aqw.job");
    assert_eq!(base["success"], true);
    assert_eq!(request["tags"]["ai.operation.id"], PRODUCER_TRACE);
    assert_eq!(request["iKey"], "11111111-2222-3333-4444-555555555555");
    let request_id = base["id"].as_str().unwrap();
    let deps: Vec<&Value> = envelopes
        .iter()
        .filter(|e| e["data"]["baseType"] == "RemoteDependencyData")
        .filter(|e| e["tags"]["ai.operation.parentId"] == request_id)
        .collect();
    let names: Vec<&str> = deps
        .iter()
        .filter_map(|d| d["data"]["baseData"]["name"].as_str())
        .collect();
    for step in ["aqw.key.claim", "aqw.handler", "aqw.key.done", "aqw.settle"] {
        assert!(
            names.contains(&step),
            "{step} is a dependency of the request: {names:?}"
        );
    }
    for d in &deps {
        assert_eq!(d["tags"]["ai.operation.id"], PRODUCER_TRACE);
    }
    // Without AQW_TRACE_STORAGE the steps carry no storage request spans:
    // every dependency is one of aqw's own steps.
    let all_deps: Vec<&str> = envelopes
        .iter()
        .filter(|e| e["data"]["baseType"] == "RemoteDependencyData")
        .filter_map(|e| e["data"]["baseData"]["name"].as_str())
        .collect();
    assert!(
        all_deps.iter().all(|n| n.starts_with("aqw.")),
        "no storage request spans unless asked for: {all_deps:?}"
    );
    app.cleanup().await;
}

/// A collector that accepts connections and never answers.
async fn black_hole() -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((sock, _)) = listener.accept().await {
            held.push(sock);
        }
    });
    (url, task)
}

async fn jobs_complete_with_collector(endpoint: &str) {
    let (handler, handler_url) = Handler::start(0).await;
    let app = traced_app(&handler_url);
    let n = 150;
    for i in 0..n {
        app.enqueue(&format!(r#"{{"orderId":"o-down-{i}"}}"#)).await;
    }
    let worker = Worker::start(
        &app,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "1000"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "64"),
        ],
    );
    app.drained(Duration::from_secs(120)).await;
    assert_eq!(handler.calls().len(), n, "every job ran once");
    eventually("an export warning", Duration::from_secs(30), || async {
        worker
            .log_text()
            .contains("aqw.traces.export_failed")
            .then_some(())
    })
    .await;
    let (status, lines) = worker.stop();
    assert!(status.success(), "exit {status:?}");
    let completed = lines
        .iter()
        .filter(|l| l["event"] == "aqw.job.completed")
        .count();
    assert_eq!(completed, n);
    // One warning a minute at most, however many exports failed.
    let warnings = lines
        .iter()
        .filter(|l| l["event"] == "aqw.traces.export_failed")
        .count();
    assert_eq!(warnings, 1, "warnings are rate-limited");
    app.cleanup().await;
}

#[tokio::test]
async fn a_refusing_collector_costs_a_warning_not_a_job() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    jobs_complete_with_collector(&format!("http://127.0.0.1:{port}")).await;
}

#[tokio::test]
async fn a_black_hole_collector_costs_a_warning_not_a_job() {
    let (url, task) = black_hole().await;
    jobs_complete_with_collector(&url).await;
    task.abort();
}

#[tokio::test]
async fn without_an_exporter_lines_still_carry_ids_and_the_handler_a_traceparent() {
    let (handler, handler_url) = Handler::start(0).await;
    let app = traced_app(&handler_url);
    app.enqueue(&format!(
        r#"{{"orderId":"o-off-1","traceparent":"{PRODUCER}"}}"#
    ))
    .await;
    let worker = Worker::start(&app, &[]);
    app.drained(Duration::from_secs(60)).await;
    let (status, lines) = worker.stop();
    assert!(status.success());
    let line = lines
        .iter()
        .find(|l| l["event"] == "aqw.job.completed")
        .expect("an outcome line");
    assert_eq!(line["trace_id"], PRODUCER_TRACE);
    let span_id = line["span_id"].as_str().unwrap();
    assert_eq!(span_id.len(), 16);
    let calls = handler.calls();
    assert_eq!(
        calls[0].as_deref(),
        Some(format!("00-{PRODUCER_TRACE}-{span_id}-01").as_str())
    );
    app.cleanup().await;
}

#[test]
fn a_bad_exporter_setting_is_a_config_error_naming_the_variable() {
    let out = Command::new(aqw_bin())
        .args(["status", "--app", "/nonexistent"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("OTEL_EXPORTER_OTLP_PROTOCOL"));
    let out = Command::new(aqw_bin())
        .args(["status", "--app", "/nonexistent"])
        .env(
            "APPLICATIONINSIGHTS_CONNECTION_STRING",
            "IngestionEndpoint=http://x/;SharedSecret=hunter2",
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("InstrumentationKey"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
}

// Multi-threaded: the CLI runs as a blocking child process while this
// runtime's receiver takes its export.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_and_discard_spans_link_to_the_poisoned_attempt() {
    let (rx, rx_url) = Receiver::start().await;
    let app = TestApp::new(
        json!({"key": "order:{/orderId}", "handler": {"type": "exec", "command": ["sh", "-c", "cat >/dev/null; exit 65"]}}),
        json!({}),
        json!({}),
    );
    let replayed = app.enqueue(r#"{"orderId":"o-link-1"}"#).await;
    let discarded = app.enqueue(r#"{"orderId":"o-link-2"}"#).await;
    let worker = Worker::start(&app, &[("OTEL_EXPORTER_OTLP_ENDPOINT", &rx_url)]);
    let jobs = eventually(
        "two poisoned attempts exported",
        Duration::from_secs(60),
        || async {
            let jobs: Vec<SeenSpan> = rx
                .named("aqw.job")
                .into_iter()
                .filter(|j| j.attrs.get("outcome").map(String::as_str) == Some("poisoned"))
                .collect();
            (jobs.len() == 2).then_some(jobs)
        },
    )
    .await;
    let (status, _) = worker.stop();
    assert!(status.success());
    let job_of = |id: &str| {
        jobs.iter()
            .find(|j| j.attrs["message_id"] == id)
            .unwrap()
            .clone()
    };
    let run = |args: &[&str]| {
        let out = Command::new(aqw_bin())
            .args(args)
            .arg("--app")
            .arg(app.path())
            .env("AzureWebJobsStorage", CONN)
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &rx_url)
            .output()
            .unwrap();
        assert!(
            out.status.code().is_some_and(|c| c <= 1),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "poison",
        "replay",
        "--uncertain-checked",
        &app.queue,
        "--id",
        &replayed,
        "--by",
        "tester",
    ]);
    run(&[
        "poison", "discard", &app.queue, "--id", &discarded, "--reason", "test", "--by", "tester",
    ]);
    for (name, id) in [("aqw.replay", &replayed), ("aqw.discard", &discarded)] {
        // The CLI flushes its spans before it exits.
        let spans = rx.named(name);
        assert_eq!(spans.len(), 1, "{name}: {spans:?}");
        let job = job_of(id);
        assert_eq!(
            spans[0].links,
            vec![(job.trace_id.clone(), job.span_id.clone())],
            "{name} links the attempt"
        );
        assert_eq!(spans[0].attrs["poison.id"], *id);
    }
    app.cleanup().await;
}
