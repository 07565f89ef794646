//! Provider outages and operator pauses against a real Azurite: the
//! circuit breaker keeps a full outage out of the poison queue, a partial
//! one still poisons only its own keys, and pause / resume stop and restart
//! receiving on every worker.

use crate::common::{aqw, eventually, TestApp};
use aqw_core::control::ControlStore;
use aqw_core::storage::Storage;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A provider behind the HTTP handler: down (503 to everyone), failing
/// only the orders whose id starts with `failing_prefix`, or slow.
#[derive(Clone, Default)]
struct Provider {
    down: Arc<AtomicBool>,
    failing_prefix: Arc<Mutex<Option<String>>>,
    delay: Arc<Mutex<Duration>>,
    /// (orderId, status answered) of every call, in order.
    calls: Arc<Mutex<Vec<(String, u16)>>>,
    started: Arc<AtomicUsize>,
    finished: Arc<AtomicUsize>,
}

impl Provider {
    async fn start(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/effects", listener.local_addr().unwrap());
        let app = axum::Router::new()
            .route("/effects", axum::routing::post(answer))
            .with_state(self.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        url
    }
    fn calls(&self) -> usize {
        self.calls.lock().unwrap().len()
    }
    /// Successful calls per order id.
    fn effects(&self) -> HashMap<String, usize> {
        let mut out = HashMap::new();
        for (id, status) in self.calls.lock().unwrap().iter() {
            if *status < 300 {
                *out.entry(id.clone()).or_default() += 1;
            }
        }
        out
    }
}

/// Counts a call as ended when its handler ends, answered or not: under
/// load the client's 5 s timeout can drop a slow call mid-sleep, and axum
/// then drops the handler's future without running its last lines.
struct Ended(Arc<AtomicUsize>);

impl Drop for Ended {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

async fn answer(State(p): State<Provider>, body: String) -> StatusCode {
    p.started.fetch_add(1, Ordering::SeqCst);
    let _ended = Ended(p.finished.clone());
    let delay = *p.delay.lock().unwrap();
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let id = serde_json::from_str::<Value>(&body)
        .ok()
        .and_then(|v| v["orderId"].as_str().map(str::to_string))
        .unwrap_or_default();
    let failing = p
        .failing_prefix
        .lock()
        .unwrap()
        .as_ref()
        .is_some_and(|f| id.starts_with(f.as_str()));
    let status = if p.down.load(Ordering::SeqCst) || failing {
        503
    } else {
        200
    };
    p.calls.lock().unwrap().push((id, status));
    StatusCode::from_u16(status).unwrap()
}

/// Short settings so an outage of a few seconds trips, probes and closes.
fn breaker() -> Value {
    json!({"failureRatio": 0.8, "minimumAttempts": 10, "window": "00:00:10",
           "coolDown": "00:00:00.500", "maxCoolDown": "00:00:01", "probes": 1})
}

fn app_for(url: &str, breaker: Value, batch: u32) -> TestApp {
    TestApp::new(
        json!({"key": "receipt:{/orderId}", "handler": {"type": "http", "url": url, "timeout": "00:00:05"}, "breaker": breaker}),
        json!({"batchSize": batch, "maxDequeueCount": 5}),
        json!({"lease": "00:00:10"}),
    )
}

async fn enqueue_orders(app: &TestApp, prefix: &str, n: usize) {
    for i in 0..n {
        app.enqueue(&json!({"orderId": format!("{prefix}{i}")}).to_string())
            .await;
    }
}

fn control(app: &TestApp) -> ControlStore {
    ControlStore::new(app.storage().table(&app.config.control_table))
}

/// Poison copies (not only the first 32 a peek shows).
async fn poisoned(app: &TestApp) -> u64 {
    TestApp::exact_count(app.poison_queue().as_ref()).await
}

/// Wait until every order has had its effect, then the queue is empty.
async fn all_done(app: &TestApp, provider: &Provider, n: usize, deadline: Duration) {
    eventually("every effect happened", deadline, || async {
        (provider.effects().len() >= n).then_some(())
    })
    .await;
    app.drained(deadline).await;
}

/// The outage of `period`: off until the breaker opened and for the rest of
/// the period, then on again; how many calls the provider got while off.
async fn outage(app: &TestApp, provider: &Provider, period: Duration) -> (usize, usize) {
    let started = Instant::now();
    let store = control(app);
    eventually("the breaker opened", Duration::from_secs(30), || async {
        let c = store.get("Job").await.ok()?;
        c.breaker_open().then_some(())
    })
    .await;
    let at_open = provider.calls();
    if let Some(rest) = period.checked_sub(started.elapsed()) {
        // The outage itself lasts this long: not a synchronisation.
        tokio::time::sleep(rest).await;
    }
    provider.down.store(false, Ordering::SeqCst);
    (at_open, provider.calls())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_outage_poisons_nothing_and_calls_the_provider_only_for_probes() {
    let provider = Provider::default();
    let url = provider.start().await;
    let app = app_for(&url, breaker(), 16);
    provider.down.store(true, Ordering::SeqCst);
    enqueue_orders(&app, "o", 200).await;
    let w = app.start_configured_worker();
    let period = Duration::from_secs(4);
    let (at_open, during) = outage(&app, &provider, period).await;
    all_done(&app, &provider, 200, Duration::from_secs(90)).await;
    w.stop().await;
    let after_open = during - at_open;
    // One probe per cool-down (0.5 s doubling to 1 s) over the period, plus
    // what was already running (batchSize 16 + newBatchThreshold 8) when it tripped.
    let probe_bound = (period.as_millis() / 500) as usize + 1;
    println!("calls before the trip: {at_open}; during the rest of the outage: {after_open} (probe bound {probe_bound} + 24 in flight)");
    assert!(
        after_open <= probe_bound + 24,
        "{after_open} calls after the breaker opened"
    );
    assert_eq!(poisoned(&app).await, 0, "an outage poisons nothing");
    let effects = provider.effects();
    assert_eq!(effects.len(), 200);
    assert!(
        effects.values().all(|n| *n == 1),
        "every effect exactly once"
    );
    let c = control(&app).get("Job").await.unwrap();
    assert_eq!(c.breaker.unwrap().state, "closed");
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_the_breaker_the_same_outage_poisons() {
    let provider = Provider::default();
    let url = provider.start().await;
    let app = app_for(&url, json!(false), 16);
    provider.down.store(true, Ordering::SeqCst);
    enqueue_orders(&app, "o", 40).await;
    let w = app.start_configured_worker();
    eventually("messages poisoned", Duration::from_secs(60), || async {
        (poisoned(&app).await > 0).then_some(())
    })
    .await;
    w.stop().await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partial_outage_poisons_its_own_keys_and_lets_the_rest_through() {
    let provider = Provider::default();
    let url = provider.start().await;
    let app = app_for(&url, breaker(), 16);
    *provider.failing_prefix.lock().unwrap() = Some("bad".into());
    // Every fifth order fails, spread through the queue.
    for i in 0..100 {
        let id = if i % 5 == 0 {
            format!("bad{i}")
        } else {
            format!("good{i}")
        };
        app.enqueue(&json!({"orderId": id}).to_string()).await;
    }
    let w = app.start_configured_worker();
    eventually("20 poisoned", Duration::from_secs(90), || async {
        (poisoned(&app).await == 20).then_some(())
    })
    .await;
    all_done(&app, &provider, 80, Duration::from_secs(60)).await;
    w.stop().await;
    let effects = provider.effects();
    assert_eq!(effects.len(), 80);
    assert!(effects.keys().all(|k| k.starts_with("good")));
    assert!(effects.values().all(|n| *n == 1));
    let c = control(&app).get("Job").await.unwrap();
    assert!(c.breaker.is_none(), "a partial outage never trips: {c:?}");
    app.cleanup().await;
}

/// One in-process worker whose gates the test can see.
struct Worker {
    rts: Vec<Arc<aqw_core::runtime::FunctionRuntime>>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
}

impl Worker {
    async fn start(app: &TestApp) -> Self {
        let alerts = aqw_core::alert::Alerts::disabled();
        let rts =
            aqw::app::runtimes(&app.config, &aqw::handlers::Registry::new(), &alerts).unwrap();
        let (shutdown, tracker) = (CancellationToken::new(), TaskTracker::new());
        let health = Arc::new(aqw_core::worker::Health::default());
        for rt in &rts {
            rt.source.create_if_missing().await.unwrap();
            rt.gate.refresh().await;
            let (g, s) = (rt.clone(), shutdown.clone());
            tokio::spawn(async move { g.gate.watch(s).await });
            let (hard_stop, t) = (CancellationToken::new(), tracker.clone());
            tokio::spawn(aqw_core::worker::poll_loop(
                rt.clone(),
                shutdown.clone(),
                hard_stop,
                t,
                health.clone(),
            ));
        }
        Self {
            rts,
            shutdown,
            tracker,
        }
    }
    fn paused(&self) -> bool {
        self.rts.iter().all(|r| r.gate.paused())
    }
    /// No job of this worker is in flight (received and not yet settled).
    fn idle(&self) -> bool {
        self.tracker.is_empty()
    }
    async fn stop(self) {
        self.shutdown.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }
}

/// Pause through the CLI; then every worker sees it, in-flight jobs end,
/// `aqw status` says who paused and why (exit 1), and no call starts.
async fn pause_and_watch(app: &TestApp, provider: &Provider, fleet: &[Worker]) {
    let out = aqw(
        app.path(),
        &[
            "pause",
            "Job",
            "--by",
            "tester",
            "--reason",
            "ledger maintenance",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eventually(
        "every worker sees the pause",
        Duration::from_secs(30),
        || async { fleet.iter().all(Worker::paused).then_some(()) },
    )
    .await;
    // In-flight jobs finish: every received job is settled (a message
    // received as the pause took hold is parked, not run), every started
    // call has ended.
    eventually(
        "in-flight jobs finished",
        Duration::from_secs(30),
        || async {
            let s = provider.started.load(Ordering::SeqCst);
            let ended = s == provider.finished.load(Ordering::SeqCst);
            (ended && fleet.iter().all(Worker::idle)).then_some(s)
        },
    )
    .await;
    let at_pause = provider.started.load(Ordering::SeqCst);
    let status = aqw(app.path(), &["status"]);
    assert_eq!(status.status.code(), Some(1), "status exits 1 while paused");
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains("PAUSED   Job by tester") && text.contains("ledger maintenance"),
        "{text}"
    );
    // Watch for new calls over a few pause polls.
    tokio::time::sleep(aqw_core::control::WATCH_INTERVAL * 2).await;
    assert_eq!(
        provider.started.load(Ordering::SeqCst),
        at_pause,
        "no call after the pause"
    );
    assert!(app.source_count().await > 0, "work is left for the resume");
}

async fn pause_during_a_run(workers: usize) {
    let provider = Provider::default();
    *provider.delay.lock().unwrap() = Duration::from_millis(300);
    let url = provider.start().await;
    // A few jobs in flight per worker (batchSize 4 + newBatchThreshold, half
    // a batch per core), 300 ms each: 300 jobs outlast the pause taking hold.
    let app = app_for(&url, breaker(), 4);
    enqueue_orders(&app, "p", 300).await;
    let mut fleet = Vec::new();
    for _ in 0..workers {
        fleet.push(Worker::start(&app).await);
    }
    eventually("some jobs ran", Duration::from_secs(30), || async {
        (provider.calls() >= 10).then_some(())
    })
    .await;
    pause_and_watch(&app, &provider, &fleet).await;
    let out = aqw(app.path(), &["resume", "Job", "--by", "tester"]);
    assert!(out.status.success());
    all_done(&app, &provider, 300, Duration::from_secs(90)).await;
    for w in fleet {
        w.stop().await;
    }
    assert!(provider.effects().values().all(|n| *n == 1));
    assert_eq!(aqw(app.path(), &["status"]).status.code(), Some(0));
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pause_stops_receiving_and_resume_drains_the_queue() {
    pause_during_a_run(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pause_and_resume_hold_for_two_workers() {
    pause_during_a_run(2).await;
}

#[test]
fn bad_breaker_settings_exit_2_naming_the_setting() {
    let cases = [
        (
            json!({"failureRatio": 1.5}),
            "aqw.functions.Job.breaker.failureRatio",
        ),
        (
            json!({"failureRatio": -0.1}),
            "aqw.functions.Job.breaker.failureRatio",
        ),
        (
            json!({"window": "00:00:00"}),
            "aqw.functions.Job.breaker.window",
        ),
        (
            json!({"minimumAttempts": 0}),
            "aqw.functions.Job.breaker.minimumAttempts",
        ),
    ];
    for (breaker, field) in cases {
        let dir = tempfile::tempdir().unwrap();
        let host = json!({"version": "2.0", "aqw": {"functions": {"Job": {"queue": "qqq", "handler": {"type": "http", "url": "http://127.0.0.1:9/x"}, "breaker": breaker}}}});
        std::fs::write(dir.path().join("host.json"), host.to_string()).unwrap();
        let out = aqw(dir.path(), &["status"]);
        assert_eq!(out.status.code(), Some(2), "{breaker}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(field), "{breaker}: {err}");
    }
}

/// A queue-trigger invocation as the host sends it (`DequeueCount` and the
/// payload's fields as JSON strings; see tests/serve.rs for the full rules).
fn invocation(text: &str, id: &str, dequeue: u32) -> String {
    let s = |v: &str| Value::String(serde_json::to_string(v).unwrap());
    let mut meta = serde_json::Map::new();
    meta.insert("DequeueCount".into(), json!(dequeue.to_string()));
    meta.insert("Id".into(), s(id));
    meta.insert("PopReceipt".into(), s("AgAAAAMAAAAAAAAAAgtnDU/+1QE="));
    meta.insert("InsertionTime".into(), json!("2026-12-02T17:58:31+00:00"));
    meta.insert("ExpirationTime".into(), json!("2026-12-09T17:58:31+00:00"));
    meta.insert("NextVisibleTime".into(), json!("2026-12-02T18:08:32+00:00"));
    if let Ok(Value::Object(payload)) = serde_json::from_str::<Value>(text) {
        for (k, v) in payload {
            if let Value::String(v) = v {
                meta.insert(k, s(&v));
            }
        }
    }
    json!({"Data": {"job": s(text)}, "Metadata": meta}).to_string()
}

async fn invoke(state: &aqw::serve::ServeState, body: String) -> StatusCode {
    use tower::ServiceExt;
    let req = axum::http::Request::post("/Job")
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body))
        .unwrap();
    aqw::serve::app(state.clone())
        .oneshot(req)
        .await
        .unwrap()
        .status()
}

#[tokio::test]
async fn in_serve_mode_a_paused_function_parks_a_fresh_copy_and_answers_200() {
    let provider = Provider::default();
    let url = provider.start().await;
    let app = app_for(&url, breaker(), 16);
    let alerts = aqw_core::alert::Alerts::disabled();
    let rts = aqw::app::runtimes(&app.config, &aqw::handlers::Registry::new(), &alerts).unwrap();
    assert!(aqw_core::runtime::ensure_resources(&rts, &CancellationToken::new()).await);
    let gate = rts[0].gate.clone();
    let state = aqw::serve::ServeState::new(rts);
    control(&app)
        .pause("Job", "tester", "maintenance")
        .await
        .unwrap();
    gate.refresh().await;
    let text = json!({"orderId": "s1"}).to_string();
    // The host's 4th delivery: a failure now would be one step from poison.
    let status = invoke(&state, invocation(&text, "m-s1", 4)).await;
    assert_eq!(status, StatusCode::OK, "the host deletes its copy");
    assert_eq!(provider.calls(), 0, "nothing runs while paused");
    let q = app.source();
    assert_eq!(
        TestApp::exact_count(q.as_ref()).await,
        1,
        "a fresh copy waits"
    );
    assert_eq!(poisoned(&app).await, 0);
    control(&app).resume("Job", "tester").await.unwrap();
    gate.refresh().await;
    let status = invoke(&state, invocation(&text, "m-s1-copy", 1)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(provider.effects().get("s1"), Some(&1));
    app.cleanup().await;
}

/// A worker process as users run it: `aqw run` on the app folder.
pub(crate) struct Process(std::process::Child);

impl Process {
    pub(crate) fn start(app: &TestApp) -> Self {
        let child = std::process::Command::new(crate::common::aqw_bin())
            .args(["run", "--app"])
            .arg(app.path())
            .env("AzureWebJobsStorage", crate::common::CONN)
            .env_remove("AQW_LOG")
            .stdout(std::process::Stdio::null())
            .stderr(log_to())
            .spawn()
            .expect("start aqw run");
        Self(child)
    }
}

/// Where a process's log goes: nowhere, or a new file in
/// `AQW_TEST_PROCESS_LOGS` (a directory) when a person debugging a fleet
/// test sets it.
fn log_to() -> std::process::Stdio {
    let Some(dir) = std::env::var_os("AQW_TEST_PROCESS_LOGS") else {
        return std::process::Stdio::null();
    };
    let name = format!("aqw-{}.log", uuid::Uuid::new_v4().simple());
    match std::fs::File::create(std::path::Path::new(&dir).join(name)) {
        Ok(f) => f.into(),
        Err(_) => std::process::Stdio::null(),
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(self.0.id().to_string())
            .status();
        let _ = self.0.wait();
    }
}

/// Issue 37, with real processes: 8 `aqw run` processes, 600 keyed jobs
/// arriving as the provider goes down for 60 s (every call 503), the
/// default breaker and retry settings. One breaker for the fleet: nothing
/// is poisoned, every effect happens once, and the provider sees fewer
/// calls during the outage than there are jobs: what a trip costs is the
/// replicas' first attempts and jobs in flight (some 250 calls here),
/// whatever the number of jobs (12 separate breakers poisoned 68 % of 300
/// jobs and took 1,197 calls before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_processes_through_a_minute_long_outage_poison_nothing() {
    let provider = Provider::default();
    let url = provider.start().await;
    let app = TestApp::new(
        json!({"key": "receipt:{/orderId}", "handler": {"type": "http", "url": url, "timeout": "00:00:05"}}),
        json!({"maxPollingInterval": "00:00:02"}),
        json!({}),
    );
    provider.down.store(true, Ordering::SeqCst);
    let fleet: Vec<Process> = (0..8).map(|_| Process::start(&app)).collect();
    let started = Instant::now();
    enqueue_orders(&app, "f", 600).await;
    // The outage itself lasts this long: not a synchronisation.
    tokio::time::sleep(Duration::from_secs(60).saturating_sub(started.elapsed())).await;
    let during = provider.calls();
    provider.down.store(false, Ordering::SeqCst);
    all_done(&app, &provider, 600, Duration::from_secs(360)).await;
    drop(fleet);
    println!("8 processes, 600 jobs, a 60 s outage: {during} provider calls during the outage");
    assert_eq!(poisoned(&app).await, 0, "an outage poisons nothing");
    let effects = provider.effects();
    assert_eq!(effects.len(), 600);
    assert!(
        effects.values().all(|n| *n == 1),
        "every effect exactly once"
    );
    assert!(
        during < 600,
        "{during} calls during the outage for 600 jobs"
    );
    app.cleanup().await;
}
