//! `aqw serve` with the guarantees of `aqw run` (issue 41): a keyed job's
//! failed attempt is put back as a fresh copy after aqw's own retry delay
//! and answered 200, so the Functions host, which would retry after its
//! fixed `visibilityTimeout` (0 here, its default), never does; the key
//! counts the attempts, so the cap holds exactly whatever DequeueCount the
//! host sends; the retention sweep and the heartbeats run in a serve-only
//! deployment; bad per-function settings exit 2 naming the setting.
//!
//! The host is played by [`host_round`]: it receives from the queue, POSTs
//! the invocation serialized by the host's rules (`serve::host_invocation`,
//! checked against tests/fixtures/custom-handler), deletes on a 2xx and, on
//! anything else, makes the message visible again after its
//! `visibilityTimeout` (`QueueProcessor.CompleteProcessingMessageAsync`).

use crate::common::*;
use crate::serve::{call, host_invocation, state};
use aqw::serve::ServeState;
use aqw_core::handler::HandlerError;
use aqw_core::poison::PoisonEnvelope;
use aqw_core::storage::Storage;
use axum::http::StatusCode;
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// The host's `visibilityTimeout` after a failed invocation: its default, 0.
const HOST_VISIBILITY: Duration = Duration::ZERO;

/// A keyed app whose host would retry at once and whose aqw retry backs
/// off exponentially from 1 s.
fn backoff_app(max_dequeue_count: u32) -> TestApp {
    TestApp::new(
        json!({"key": "receipt:{/orderId}"}),
        json!({"maxDequeueCount": max_dequeue_count, "visibilityTimeout": "00:00:00"}),
        json!({"retry": {"strategy": "exponential", "initialDelay": "00:00:01", "maxDelay": "00:00:08"}}),
    )
}

/// One receive by the host: the invocation of the next visible message, its
/// answer, and the message settled as the host settles it. `None` when no
/// message is visible.
async fn host_round(app: &TestApp, s: &ServeState) -> Option<(u32, StatusCode)> {
    let q = app.source();
    let msg = q.receive(1, Duration::from_secs(30)).await.ok()?.pop()?;
    let text = aqw_core::message::decode(&msg.text, app.config.message_encoding).unwrap();
    let body = host_invocation("job", &text, &msg.id, msg.dequeue_count);
    let (status, v) = call(s, "Job", body).await;
    if status.is_success() {
        q.delete(&msg.id, &msg.pop_receipt).await.unwrap();
    } else {
        q.update_visibility(&msg.id, &msg.pop_receipt, &msg.text, HOST_VISIBILITY)
            .await
            .unwrap();
    }
    assert!(status != StatusCode::BAD_REQUEST, "{v}");
    Some((msg.dequeue_count, status))
}

/// Play the host until the queue is empty (every copy settled).
async fn host_until_drained(app: &TestApp, s: &ServeState) -> Vec<(u32, StatusCode)> {
    let mut answers = vec![];
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        match host_round(app, s).await {
            Some(a) => answers.push(a),
            None if TestApp::exact_count(app.source().as_ref()).await == 0 => return answers,
            None => tokio::time::sleep(Duration::from_millis(50)).await,
        }
        assert!(Instant::now() < end, "not drained: {answers:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flaky_provider_under_serve_sees_attempts_spread_by_the_backoff_and_completes_once() {
    let app = backoff_app(5);
    let starts = Arc::new(Mutex::new(vec![]));
    let seen = starts.clone();
    let h = Scripted::new(move |_, n| {
        seen.lock().unwrap().push(Instant::now());
        match n {
            1 | 2 => Err(HandlerError::retryable(format!("HTTP 503: flaky #{n}"))),
            _ => Ok(aqw_core::handler::Success::done()),
        }
    });
    let s = state(&app, h.clone()).await;
    app.enqueue(r#"{"orderId":"flaky-1"}"#).await;
    let answers = host_until_drained(&app, &s).await;
    assert_eq!(h.calls(), 3, "two failures, then the success: {answers:?}");
    // Every answer a 200 at DequeueCount 1: the host never retried on its
    // own, so its visibilityTimeout of 0 never hammered the provider.
    assert_eq!(answers, vec![(1, StatusCode::OK); 3]);
    let starts = starts.lock().unwrap().clone();
    let gaps: Vec<Duration> = starts.windows(2).map(|w| w[1] - w[0]).collect();
    // Exponential from 1 s with ±20 % jitter: at least 0.8 s, then 1.6 s.
    // A lower bound only: the copies cannot become visible any sooner.
    assert!(gaps[0] >= Duration::from_millis(800), "{gaps:?}");
    assert!(gaps[1] >= Duration::from_millis(1600), "{gaps:?}");
    println!("gaps between attempts under serve: {gaps:?}");
    let key = aqw_core::idempotency::IdempotencyKey::new("receipt:flaky-1").unwrap();
    let rec = app.keys().get("Job", &key).await.unwrap().unwrap();
    assert_eq!(rec.status.as_str(), "done");
    let counted: Vec<u32> = rec.history.iter().map(|a| a.dequeue_count).collect();
    assert_eq!(counted, vec![1, 2, 3], "the key counts the attempts");
    assert!(app.poison_messages().await.is_empty());
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_providers_retry_after_is_honoured_under_serve_and_spends_no_attempt() {
    let app = backoff_app(5);
    let starts = Arc::new(Mutex::new(vec![]));
    let seen = starts.clone();
    let h = Scripted::new(move |_, n| {
        seen.lock().unwrap().push(Instant::now());
        match n {
            1 => Err(HandlerError::Retryable {
                message: "HTTP 429: slow down".into(),
                retry_after: Some(Duration::from_secs(3)),
                may_have_taken_effect: false,
            }),
            _ => Ok(aqw_core::handler::Success::done()),
        }
    });
    let s = state(&app, h.clone()).await;
    app.enqueue(r#"{"orderId":"later-1"}"#).await;
    let answers = host_until_drained(&app, &s).await;
    // Every answer a 200 at DequeueCount 1. Two calls of the provider; the
    // host may see one round more, where the adaptive rate (taught by the
    // 429) parks the copy once without calling it.
    assert!(
        answers.iter().all(|a| *a == (1, StatusCode::OK)) && (2..=3).contains(&answers.len()),
        "{answers:?}"
    );
    assert_eq!(h.calls(), 2, "{answers:?}");
    let starts = starts.lock().unwrap().clone();
    assert!(
        starts[1] - starts[0] >= Duration::from_secs(3),
        "{starts:?}"
    );
    let key = aqw_core::idempotency::IdempotencyKey::new("receipt:later-1").unwrap();
    let rec = app.keys().get("Job", &key).await.unwrap().unwrap();
    let counted: Vec<u32> = rec.history.iter().map(|a| a.dequeue_count).collect();
    assert_eq!(counted, vec![1, 1], "the 429 spent no attempt");
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_at_the_cap_is_poisoned_exactly_once_whatever_the_hosts_dequeue_count() {
    let app = backoff_app(3);
    let h = Scripted::new(|_, n| Err(HandlerError::retryable(format!("HTTP 503: down #{n}"))));
    let s = state(&app, h.clone()).await;
    app.enqueue(r#"{"orderId":"cap-1"}"#).await;
    // The first delivery dies with its instance before answering: the host
    // sees the lease end and delivers the message again, DequeueCount 2.
    let q = app.source();
    let lost = q.receive(1, Duration::from_secs(1)).await.unwrap();
    assert_eq!(lost.len(), 1);
    let answers = host_until_drained(&app, &s).await;
    // Attempt 2 (the host's count) fails and is put back; its copy, at
    // DequeueCount 1, is attempt 3 = the cap: aqw poisons it itself.
    assert_eq!(answers, vec![(2, StatusCode::OK), (1, StatusCode::OK)]);
    assert_eq!(h.calls(), 2);
    let msgs = app.poison_messages().await;
    assert_eq!(msgs.len(), 1, "one poison copy");
    let env = PoisonEnvelope::from_queue_text(&msgs[0].text).unwrap();
    assert_eq!(env.error.message, "HTTP 503: down #2");
    assert_eq!(env.dequeue_count, 3, "the job's attempts, not the copy's");
    let records = app.records().query(Some(&app.queue)).await.unwrap();
    assert_eq!(records.len(), 1, "one record: {records:?}");
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyless_function_under_serve_keeps_the_hosts_retry() {
    let app = TestApp::new(
        json!({"key": "none"}),
        json!({"maxDequeueCount": 2, "visibilityTimeout": "00:00:00"}),
        json!({}),
    );
    let h = Scripted::new(|_, _| Err(HandlerError::retryable("HTTP 503")));
    let s = state(&app, h.clone()).await;
    app.enqueue(r#"{"orderId":"keyless"}"#).await;
    let answers = host_until_drained(&app, &s).await;
    // No key to count on: a 500 below the cap (the host's retry), and at
    // the host's cap aqw's own record, answered 200.
    assert_eq!(
        answers,
        vec![(1, StatusCode::INTERNAL_SERVER_ERROR), (2, StatusCode::OK)]
    );
    assert_eq!(app.poison_messages().await.len(), 1);
    app.cleanup().await;
}

/// A key claimed and settled `done` (or left `poisoned`) by hand.
async fn key_in(app: &TestApp, k: &str, done: bool) {
    let keys = app.keys();
    let key = aqw_core::idempotency::IdempotencyKey::new(k).unwrap();
    let lease = Duration::from_secs(600);
    let aqw_core::idempotency::NextAction::Run(c) = keys
        .claim("Job", &key, "test/m/1", lease, "m")
        .await
        .unwrap()
    else {
        panic!("fresh key {k} not claimed")
    };
    match done {
        true => keys.complete(&c, vec![]).await.unwrap(),
        false => keys.mark_poisoned(&c, "boom", false).await.unwrap(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_and_heartbeats_run_under_a_serve_only_app() {
    let app = TestApp::new(
        json!({"key": "{/id}"}),
        json!({}),
        json!({"retention": {
            "keys": "00:00:01", "closedRecords": "00:00:01", "unsafeShortRetention": true,
            "sweep": {"requestsPerSecond": 100, "interval": "00:00:01", "lease": "00:00:05"}
        }}),
    );
    app.keys().table().create_if_missing().await.unwrap();
    for i in 0..20 {
        key_in(&app, &format!("done-{i}"), true).await;
    }
    // A poisoned key with an open record: a replay needs it, never purged.
    key_in(&app, "kept", false).await;
    let records = app.records();
    records.create_if_missing().await.unwrap();
    let open = json!({"Status": "open", "Function": "Job", "Key": "kept"});
    records
        .insert(&app.queue, "m-kept", open.as_object().unwrap())
        .await
        .unwrap();
    // Two instances, as Flex may start: no `aqw run` anywhere.
    let instances = start_serve_instances(&app, 2);
    let table = app.keys().table().clone();
    let left = eventually("the done keys swept", Duration::from_secs(60), || async {
        let rows = table.query(None).await.ok()?;
        let keys: Vec<String> = rows.into_iter().map(|(_, rk, _)| rk).collect();
        (keys.len() == 2).then_some(keys)
    })
    .await;
    let kept = aqw_core::idempotency::IdempotencyKey::new("kept")
        .unwrap()
        .row_key();
    assert!(left.contains(&kept), "{left:?}");
    assert!(
        left.contains(&aqw_core::retention::sweep::LEASE_ROW.to_string()),
        "{left:?}"
    );
    let beats =
        aqw_core::heartbeat::HeartbeatStore::new(app.storage().table(&app.config.heartbeat_table));
    let polls = eventually(
        "both instances' heartbeats",
        Duration::from_secs(30),
        || async {
            let b = beats.last_polls(&app.queue).await.ok()?;
            (b.len() == 2).then_some(b)
        },
    )
    .await;
    assert_eq!(polls.len(), 2, "{polls:?}");
    stop_serve_instances(instances).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_per_function_settings_exit_2_naming_the_setting() {
    let app = TestApp::new(
        json!({"key": "none", "handler": {"type": "exec", "command": ["sh", "-c", "cat >/dev/null"]}}),
        json!({"maxDequeueCount": 5}),
        json!({}),
    );
    let host = app.path().join("host.json");
    let good: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&host).unwrap()).unwrap();
    let cases = [
        (
            json!({"maxDequeueCount": 0}),
            "aqw.functions.Job.maxDequeueCount",
            "out of range",
        ),
        (
            json!({"batchSize": 64}),
            "aqw.functions.Job.batchSize",
            "out of range",
        ),
        (
            json!({"visibilityTimeout": "soon"}),
            "aqw.functions.Job.visibilityTimeout",
            "timespan",
        ),
        (
            json!({"visibilityTimeout": "8.00:00:00"}),
            "aqw.functions.Job.visibilityTimeout",
            "7 days",
        ),
        (
            json!({"retry": "linear"}),
            "aqw.functions.Job.retry.strategy",
            "linear",
        ),
        (
            json!({"retry": {"strategy": "exponential", "initialDelay": "00:01:00", "maxDelay": "00:00:10"}}),
            "aqw.functions.Job.retry.initialDelay",
            "maxDelay",
        ),
    ];
    for (setting, field, words) in cases {
        let mut h = good.clone();
        for (k, v) in setting.as_object().unwrap() {
            h["aqw"]["functions"]["Job"][k] = v.clone();
        }
        std::fs::write(&host, h.to_string()).unwrap();
        let out = aqw(app.path(), &["config", "show"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{field}: {err}");
        assert!(err.contains(field) && err.contains(words), "{field}: {err}");
    }
    // Valid for `aqw run`, refused by `aqw serve`: the host would poison
    // at its own count of 5 on any non-2xx.
    let mut h = good.clone();
    h["aqw"]["functions"]["Job"]["maxDequeueCount"] = json!(8);
    h["aqw"]["functions"]["Job"]["batchSize"] = json!(4);
    std::fs::write(&host, h.to_string()).unwrap();
    let out = std::process::Command::new(aqw_bin())
        .args(["serve", "--app"])
        .arg(app.path())
        .env("AzureWebJobsStorage", CONN)
        .env("FUNCTIONS_CUSTOMHANDLER_PORT", free_port().to_string())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("aqw.functions.Job.maxDequeueCount")
            && err.contains("extensions.queues.maxDequeueCount"),
        "{err}"
    );
    // `aqw config show` shows the overrides, and whether dynamic concurrency is on.
    h["concurrency"] = json!({"dynamicConcurrencyEnabled": true});
    std::fs::write(&host, h.to_string()).unwrap();
    let out = aqw(app.path(), &["config", "show"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "functions.Job.maxDequeueCount",
        "8 (app: 5)",
        "functions.Job.batchSize",
        "dynamicConcurrency",
        "not supported by aqw run",
    ] {
        assert!(text.contains(want), "{want}: {text}");
    }
    h["concurrency"] = json!({"dynamicConcurrencyEnabled": "yes"});
    std::fs::write(&host, h.to_string()).unwrap();
    let out = aqw(app.path(), &["config", "show"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("concurrency.dynamicConcurrencyEnabled"),
        "{err}"
    );
}
