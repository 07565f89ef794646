//! The fleet with real processes (issue 37): `aqw run` processes on one
//! Azurite, under a fleet-wide rate limit that matches the provider's own,
//! and a pause that outlasts its messages' time-to-live.

use crate::common::{eventually, TestApp};
use crate::outage::Process;
use aqw_core::control::ControlStore;
use aqw_core::storage::{Storage, Ttl};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A provider that takes at most 10 calls in each second (429 with
/// `Retry-After: 1` beyond), recording (orderId, status, when) per call.
#[derive(Clone)]
struct LimitedProvider {
    window: Arc<Mutex<(Instant, u32)>>,
    calls: Arc<Mutex<Vec<(String, u16, Instant)>>>,
}

impl LimitedProvider {
    async fn start() -> (Self, String) {
        let p = Self {
            window: Arc::new(Mutex::new((Instant::now(), 0))),
            calls: Arc::default(),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/effects", listener.local_addr().unwrap());
        let app = axum::Router::new()
            .route("/effects", axum::routing::post(limited))
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
}

async fn limited(State(p): State<LimitedProvider>, body: String) -> (StatusCode, HeaderMap) {
    let id = serde_json::from_str::<Value>(&body)
        .ok()
        .and_then(|v| v["orderId"].as_str().map(str::to_string))
        .unwrap_or_default();
    let status = {
        let mut w = p.window.lock().unwrap();
        if w.0.elapsed() >= Duration::from_secs(1) {
            *w = (Instant::now(), 0);
        }
        w.1 += 1;
        if w.1 > 10 {
            429
        } else {
            200
        }
    };
    p.calls.lock().unwrap().push((id, status, Instant::now()));
    let mut headers = HeaderMap::new();
    if status == 429 {
        headers.insert("retry-after", "1".parse().unwrap());
    }
    (StatusCode::from_u16(status).unwrap(), headers)
}

/// 8 `aqw run` processes, 150 jobs, a provider that takes 10 calls a
/// second, and `limits.callsPerSecond: 10` on the function: every job runs
/// once, none is poisoned, and the fleet's call rate over the run stays
/// within 10 % of the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_processes_keep_a_fleet_wide_rate_limit() {
    let (provider, url) = LimitedProvider::start().await;
    let app = TestApp::new(
        json!({"key": "receipt:{/orderId}", "handler": {"type": "http", "url": url, "timeout": "00:00:05"},
               "limits": {"callsPerSecond": 10}}),
        json!({"maxPollingInterval": "00:00:02"}),
        json!({}),
    );
    let fleet: Vec<Process> = (0..8).map(|_| Process::start(&app)).collect();
    for i in 0..150 {
        app.enqueue(&json!({"orderId": format!("r{i}")}).to_string())
            .await;
    }
    eventually(
        "every effect happened",
        Duration::from_secs(180),
        || async { (provider.effects().len() >= 150).then_some(()) },
    )
    .await;
    app.drained(Duration::from_secs(60)).await;
    drop(fleet);
    let calls = provider.calls.lock().unwrap().clone();
    let limited = calls.iter().filter(|c| c.1 == 429).count();
    let span = calls.last().unwrap().2 - calls[0].2;
    let rate = (calls.len() - 1) as f64 / span.as_secs_f64();
    let busiest = calls
        .iter()
        .map(|(_, _, at)| {
            calls
                .iter()
                .filter(|c| c.2 >= *at && c.2 < *at + Duration::from_secs(1))
                .count()
        })
        .max()
        .unwrap_or(0);
    println!(
        "8 processes at callsPerSecond 10: {} calls for 150 jobs in {span:.1?}, {rate:.2} calls/s, at most {busiest} in any second, {limited} answered 429",
        calls.len()
    );
    assert_eq!(
        TestApp::exact_count(app.poison_queue().as_ref()).await,
        0,
        "nothing poisoned"
    );
    let effects = provider.effects();
    assert!(effects.values().all(|n| *n == 1), "every effect once");
    assert!(
        rate <= 11.0,
        "the fleet's call rate {rate:.2}/s is within 10 % of 10/s"
    );
    app.cleanup().await;
}

/// A pause longer than the messages' time-to-live, with a real `aqw run`:
/// the held messages are put back as fresh copies before they expire, and
/// after the resume each runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_past_the_messages_ttl_keeps_them() {
    let (provider, url) = LimitedProvider::start().await;
    let app = TestApp::new(
        json!({"key": "receipt:{/orderId}", "handler": {"type": "http", "url": url, "timeout": "00:00:05"}}),
        json!({}),
        json!({}),
    );
    let control = ControlStore::new(app.storage().table(&app.config.control_table));
    control.create_if_missing().await.unwrap();
    control
        .pause("Job", "tester", "longer than the TTL")
        .await
        .unwrap();
    let source = app.source();
    source.create_if_missing().await.unwrap();
    let ttl = Duration::from_secs(20);
    for i in 0..3 {
        let payload = json!({"orderId": format!("t{i}")}).to_string();
        let text = aqw_core::message::encode(&payload, app.config.message_encoding);
        source
            .put(&text, Duration::ZERO, Ttl::After(ttl))
            .await
            .unwrap();
    }
    let put_at = Instant::now();
    let worker = Process::start(&app);
    // The guard's first look puts them back with the default time-to-live.
    eventually(
        "the held messages put back",
        Duration::from_secs(15),
        || async {
            let peeked = source.peek(32).await.ok()?;
            let far = time::OffsetDateTime::now_utc() + time::Duration::days(1);
            (peeked.len() == 3 && peeked.iter().all(|m| m.expiration_time > far)).then_some(())
        },
    )
    .await;
    // Past the original time-to-live: they are still there.
    tokio::time::sleep((ttl + Duration::from_secs(2)).saturating_sub(put_at.elapsed())).await;
    assert_eq!(source.peek(32).await.unwrap().len(), 3, "nothing expired");
    control.resume("Job", "tester").await.unwrap();
    eventually("every effect happened", Duration::from_secs(60), || async {
        (provider.effects().len() >= 3).then_some(())
    })
    .await;
    app.drained(Duration::from_secs(30)).await;
    drop(worker);
    assert!(provider.effects().values().all(|n| *n == 1));
    assert_eq!(TestApp::exact_count(app.poison_queue().as_ref()).await, 0);
    app.cleanup().await;
}
