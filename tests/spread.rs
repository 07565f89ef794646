//! The breaker on fleet-wide evidence with real processes (issue 49): an
//! outage over 200 jobs spread across 16 `aqw run` processes (all 200 were
//! poisoned before: no process saw 20 first attempts), and a trickle of one
//! job every 2 s through an outage on 2 processes (26 of 35 poisoned
//! before). aqw's default retry and breaker; the provider answers 503 to
//! every call during the outage.

use crate::common::{eventually, TestApp};
use crate::outage::Process;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A provider down (503) until `up_at`, recording (orderId, status, when).
#[derive(Clone)]
struct Provider {
    up_at: Instant,
    calls: Arc<Mutex<Vec<(String, u16, Instant)>>>,
}

impl Provider {
    async fn start(outage: Duration) -> (Self, String) {
        let p = Self {
            up_at: Instant::now() + outage,
            calls: Arc::default(),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/effects", listener.local_addr().unwrap());
        let app = axum::Router::new()
            .route("/effects", axum::routing::post(serve))
            .with_state(p.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (p, url)
    }

    fn effects(&self) -> HashMap<String, usize> {
        let mut out = HashMap::new();
        for (id, status, _) in self.calls.lock().unwrap().iter() {
            if *status < 300 {
                *out.entry(id.clone()).or_default() += 1;
            }
        }
        out
    }

    fn calls_while_down(&self) -> usize {
        let calls = self.calls.lock().unwrap();
        calls.iter().filter(|c| c.2 < self.up_at).count()
    }

    /// While down: the distinct jobs called, and the calls in each second
    /// from the first call (where the calls go: a first wave, retries).
    fn while_down_by_second(&self) -> (usize, Vec<usize>) {
        let calls = self.calls.lock().unwrap();
        let down: Vec<_> = calls.iter().filter(|c| c.2 < self.up_at).collect();
        let jobs: std::collections::HashSet<&str> = down.iter().map(|c| c.0.as_str()).collect();
        let Some(first) = down.iter().map(|c| c.2).min() else {
            return (0, Vec::new());
        };
        let mut per_second = Vec::new();
        for c in &down {
            let s = usize::try_from(c.2.duration_since(first).as_secs()).unwrap_or(usize::MAX);
            if s < 600 {
                if per_second.len() <= s {
                    per_second.resize(s + 1, 0);
                }
                per_second[s] += 1;
            }
        }
        (jobs.len(), per_second)
    }
}

async fn serve(State(p): State<Provider>, body: String) -> StatusCode {
    let id = serde_json::from_str::<Value>(&body)
        .ok()
        .and_then(|v| v["orderId"].as_str().map(str::to_string))
        .unwrap_or_default();
    let status = if Instant::now() < p.up_at { 503 } else { 201 };
    p.calls.lock().unwrap().push((id, status, Instant::now()));
    StatusCode::from_u16(status).unwrap()
}

/// `jobs` jobs put `every` apart over `processes` processes while the
/// provider is down for `outage`: none poisoned, each effect once.
/// An outage over `jobs` spread across `processes`: nothing poisoned, each
/// effect once, and with `fewer_calls_than_jobs` fewer provider calls
/// while down than jobs (the bar for a burst).
async fn outage_over(
    processes: usize,
    jobs: usize,
    every: Duration,
    outage: Duration,
    fewer_calls_than_jobs: bool,
) {
    let (provider, url) = Provider::start(outage).await;
    let app = TestApp::new(
        json!({"key": "receipt:{/orderId}", "handler": {"type": "http", "url": url, "timeout": "00:00:05"}}),
        json!({"maxPollingInterval": "00:00:02"}),
        // aqw's default retry (the test app's own is a fast one).
        json!({"retry": {"strategy": "exponential", "initialDelay": "00:00:01", "maxDelay": "00:05:00"}}),
    );
    let fleet: Vec<Process> = (0..processes).map(|_| Process::start(&app)).collect();
    for i in 0..jobs {
        app.enqueue(&json!({"orderId": format!("s{i}")}).to_string())
            .await;
        // The producer's pace: the schedule under test, not a synchronisation.
        tokio::time::sleep(every).await;
    }
    eventually(
        "every effect happened",
        Duration::from_secs(600),
        || async { (provider.effects().len() >= jobs).then_some(()) },
    )
    .await;
    app.drained(Duration::from_secs(60)).await;
    drop(fleet);
    let during = provider.calls_while_down();
    let (called, per_second) = provider.while_down_by_second();
    println!(
        "{processes} processes, {jobs} jobs every {every:?}, a {outage:?} outage: {during} provider calls while down ({:.2} per job), {called} distinct jobs called; calls per second from the first: {per_second:?}",
        during as f64 / jobs as f64
    );
    assert_eq!(
        TestApp::exact_count(app.poison_queue().as_ref()).await,
        0,
        "an outage poisons nothing"
    );
    assert!(
        provider.effects().values().all(|n| *n == 1),
        "every effect once"
    );
    assert!(
        !fewer_calls_than_jobs || during < jobs,
        "{during} provider calls while down for {jobs} jobs"
    );
    app.cleanup().await;
}

/// 16 processes, 200 jobs at once, a 90 s outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_processes_hold_through_an_outage_over_200_jobs() {
    outage_over(16, 200, Duration::ZERO, Duration::from_secs(90), true).await;
}

/// 2 processes, one job every 2 s through a 70 s outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickle_through_an_outage_on_two_processes() {
    outage_over(
        2,
        35,
        Duration::from_secs(2),
        Duration::from_secs(70),
        false,
    )
    .await;
}
