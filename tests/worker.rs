//! Worker core against a real Azurite: receive, DequeueCount, retry, poison,
//! lease renewal, shutdown, crash-safe poison path, config errors.

use crate::common::*;
use aqw_core::handler::{HandlerError, Success};
use aqw_core::message::ErrorKind;
use aqw_core::poison::PoisonEnvelope;
use serde_json::json;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(30);

fn keyed() -> serde_json::Value {
    json!({ "key": "job:{/id}" })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn always_failing_job_uses_every_attempt_then_poisons_once() {
    let app = TestApp::new(keyed(), json!({"maxDequeueCount": 5}), json!({}));
    let payload = r#"{"id":"a-1","note":"exact text ✓"}"#;
    let id = app.enqueue(payload).await;
    let original_text = aqw_core::message::encode(payload, app.config.message_encoding);
    let h = Scripted::new(|_, n| {
        Err(HandlerError::retryable(format!(
            "provider down (attempt {n})"
        )))
    });
    let w = app.start_worker(h.clone());
    let msgs = eventually("one poison message", DEADLINE, || async {
        let m = app.poison_messages().await;
        (!m.is_empty()).then_some(m)
    })
    .await;
    app.drained(DEADLINE).await;
    w.stop().await;
    assert_eq!(h.calls(), 5, "attempted exactly maxDequeueCount times");
    assert_eq!(msgs.len(), 1);
    let env = PoisonEnvelope::from_queue_text(&msgs[0].text).expect("aqw envelope");
    assert_eq!(
        env.message.as_deref(),
        Some(original_text.as_str()),
        "exact original text"
    );
    assert_eq!(env.message_id, id);
    assert_eq!(env.queue, app.queue);
    assert_eq!(env.function, "Job");
    assert_eq!(env.dequeue_count, 5);
    assert_eq!(env.key.as_deref(), Some("job:a-1"));
    assert_eq!(env.error.kind, ErrorKind::Retryable);
    assert_eq!(env.error.message, "provider down (attempt 5)");
    assert!(
        !env.inserted_at.is_empty()
            && !env.poisoned_at.is_empty()
            && !env.first_attempt_at.is_empty()
    );
    assert!(env.first_attempt_at <= env.poisoned_at);
    // The record agrees, and the key is not done.
    let rec = app
        .records()
        .get(&app.queue, &id)
        .await
        .unwrap()
        .expect("record");
    assert_eq!(rec.0["Status"], "open");
    let key = app
        .keys()
        .get(
            "Job",
            &aqw_core::idempotency::IdempotencyKey::new("job:a-1").unwrap(),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(key.status, aqw_core::idempotency::KeyStatus::Poisoned);
    assert_eq!(key.attempts, 5);
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_bound_on_receive_poisons_without_running() {
    let app = TestApp::new(keyed(), json!({"maxDequeueCount": 2}), json!({}));
    app.enqueue(r#"{"id":"crashy"}"#).await;
    // Six deliveries "crashed" before their claim (received, never settled,
    // nothing written): the key counts no attempt, and the DequeueCount's
    // bound (3 x maxDequeueCount) is what poisons it. Make it visible again
    // each time.
    let q = app.source();
    for _ in 0..6 {
        let m = q.receive(1, Duration::from_secs(30)).await.unwrap();
        assert_eq!(m.len(), 1);
        q.update_visibility(&m[0].id, &m[0].pop_receipt, &m[0].text, Duration::ZERO)
            .await
            .unwrap();
    }
    let h = Scripted::new(|_, _| Ok(Success::done()));
    let w = app.start_worker(h.clone());
    let msgs = eventually("poisoned", DEADLINE, || async {
        let m = app.poison_messages().await;
        (!m.is_empty()).then_some(m)
    })
    .await;
    w.stop().await;
    assert_eq!(h.calls(), 0, "the handler never ran");
    let env = PoisonEnvelope::from_queue_text(&msgs[0].text).unwrap();
    assert_eq!(env.error.kind, ErrorKind::Crashed);
    assert!(
        env.error
            .message
            .contains("dequeued 7 times without an attempt"),
        "{}",
        env.error.message
    );
    assert_eq!(env.dequeue_count, 7);
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_error_and_undecodable_message_poison_after_one_attempt() {
    let app = TestApp::new(keyed(), json!({}), json!({}));
    let h = Scripted::new(|job, _| {
        if job.payload.contains("reject") {
            Err(HandlerError::permanent("card declined: do not retry"))
        } else {
            Ok(Success::done())
        }
    });
    let bad_id = app.enqueue(r#"{"id":"p-1","reject":true}"#).await;
    let raw_id = app.enqueue_raw("%%% not base64 %%%").await;
    let utf8_id = app
        .enqueue_raw(
            &aqw_core::message::encode("x", app.config.message_encoding).replace("eA==", "/w=="),
        )
        .await;
    let w = app.start_worker(h.clone());
    let msgs = eventually("three poison messages", DEADLINE, || async {
        let m = app.poison_messages().await;
        (m.len() >= 3).then_some(m)
    })
    .await;
    w.stop().await;
    assert_eq!(
        h.calls(),
        1,
        "only the permanent job reached the handler, once"
    );
    let by_id = |id: &str| {
        msgs.iter()
            .map(|m| PoisonEnvelope::from_queue_text(&m.text).unwrap())
            .find(|e| e.message_id == id)
            .unwrap()
    };
    let p = by_id(&bad_id);
    assert_eq!((p.error.kind, p.dequeue_count), (ErrorKind::Permanent, 1));
    let d = by_id(&raw_id);
    assert_eq!((d.error.kind, d.dequeue_count), (ErrorKind::Decode, 1));
    assert_eq!(
        d.message.as_deref(),
        Some("%%% not base64 %%%"),
        "undecodable text kept verbatim"
    );
    let u = by_id(&utf8_id);
    assert_eq!(u.error.kind, ErrorKind::Decode);
    assert!(u.error.message.contains("UTF-8"), "{}", u.error.message);
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fails_twice_then_succeeds_without_poison() {
    let app = TestApp::new(keyed(), json!({}), json!({}));
    app.enqueue(r#"{"id":"flaky"}"#).await;
    let h = Scripted::new(|_, n| {
        if n < 3 {
            Err(HandlerError::retryable("blip"))
        } else {
            Ok(Success::done())
        }
    });
    let w = app.start_worker(h.clone());
    let keys = app.keys();
    let k = aqw_core::idempotency::IdempotencyKey::new("job:flaky").unwrap();
    eventually("key done", DEADLINE, || async {
        keys.get("Job", &k)
            .await
            .ok()
            .flatten()
            .filter(|r| r.status == aqw_core::idempotency::KeyStatus::Done)
            .map(|_| ())
    })
    .await;
    app.drained(DEADLINE).await;
    w.stop().await;
    assert_eq!(h.calls(), 3);
    assert!(app.poison_messages().await.is_empty());
    let jobs = h.jobs.lock().unwrap().clone();
    assert!(
        !jobs[0].previously_pending && jobs[1].previously_pending && jobs[2].previously_pending
    );
    assert!(
        jobs.iter().all(|j| j.provider_key == jobs[0].provider_key),
        "one provider key for every attempt"
    );
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_slower_than_the_lease_keeps_its_message() {
    // Lease 2 s, renewed every 1 s; the handler takes 5 s. Two workers poll the
    // queue all along: without renewal the second would get the message.
    let app = TestApp::new(keyed(), json!({}), json!({"lease": "00:00:02"}));
    app.enqueue(r#"{"id":"slow"}"#).await;
    let h = Scripted::slow(Duration::from_secs(5), |_, _| Ok(Success::done()));
    let w1 = app.start_worker(h.clone());
    let w2 = app.start_worker(h.clone());
    app.drained(DEADLINE).await;
    w1.stop().await;
    w2.stop().await;
    assert_eq!(h.calls(), 1, "delivered once while the first attempt ran");
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_between_poison_put_and_source_delete_leaves_one_copy() {
    let app = TestApp::new(
        json!({"key": "none"}),
        json!({"maxDequeueCount": 1}),
        json!({}),
    );
    app.enqueue(r#"{"id":"c"}"#).await;
    // First attempt: poison record + envelope written, then "crash" before the delete.
    let q = app.source();
    let m = q
        .receive(1, Duration::from_secs(1))
        .await
        .unwrap()
        .remove(0);
    let storage = app.storage();
    let rt = aqw_core::runtime::FunctionRuntime::new(
        app.config.clone(),
        app.config.functions[0].clone(),
        &storage,
        Scripted::new(|_, _| Ok(Success::done())),
        aqw_core::alert::Alerts::disabled(),
    );
    app.records().create_if_missing().await.unwrap();
    let err = aqw_core::message::ErrorInfo {
        kind: ErrorKind::Permanent,
        message: "boom".into(),
    };
    assert!(
        rt.poison.write(&m, None, &err, None, None).await.unwrap(),
        "first write creates the record"
    );
    // The message comes back (DequeueCount 2 > max 1): the worker poisons it again.
    let h = Scripted::new(|_, _| Ok(Success::done()));
    let w = app.start_worker(h.clone());
    app.drained(DEADLINE).await;
    w.stop().await;
    assert_eq!(h.calls(), 0);
    assert_eq!(
        TestApp::exact_count(app.poison_queue().as_ref()).await,
        1,
        "exactly one poison copy"
    );
    assert_eq!(
        app.records().query(Some(&app.queue)).await.unwrap().len(),
        1,
        "exactly one record"
    );
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_kib_message_poisons_byte_exact() {
    let app = TestApp::new(
        json!({"key": "none"}),
        json!({"messageEncoding": "none"}),
        json!({}),
    );
    let text = "z".repeat(aqw_core::message::MAX_MESSAGE_TEXT);
    let id = app.enqueue_raw(&text).await;
    let h = Scripted::new(|_, _| Err(HandlerError::permanent("too big to handle")));
    let w = app.start_worker(h.clone());
    let msgs = eventually("poisoned", DEADLINE, || async {
        let m = app.poison_messages().await;
        (!m.is_empty()).then_some(m)
    })
    .await;
    w.stop().await;
    let env = PoisonEnvelope::from_queue_text(&msgs[0].text).unwrap();
    assert!(
        env.message.is_none() && env.record.is_some(),
        "the envelope carries a reference"
    );
    let (e, _) = app.records().get(&app.queue, &id).await.unwrap().unwrap();
    let rec = aqw_core::poison::PoisonRecord::from_entity(&e);
    assert_eq!(
        rec.message, text,
        "the record holds the full text byte-exact"
    );
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_jobs_in_flight_loses_nothing() {
    // Real process: `aqw run` with an exec handler. Two fast jobs complete;
    // two slow jobs are still running at SIGTERM past shutdownTimeout, and
    // are released (visible again at once).
    let app = TestApp::new(
        json!({"key": "job:{/id}", "handler": {"type": "exec", "command": ["sh", "-c",
            "p=$(cat); case \"$p\" in *slow*) touch \"$AQW_MESSAGE_ID.started\"; sleep 30;; *) touch \"$AQW_MESSAGE_ID.done\";; esac"]}}),
        json!({}),
        json!({"shutdownTimeout": "00:00:01"}),
    );
    for p in [
        r#"{"id":"f1"}"#,
        r#"{"id":"f2"}"#,
        r#"{"id":"s1","slow":1}"#,
        r#"{"id":"s2","slow":1}"#,
    ] {
        app.enqueue(p).await;
    }
    let mut child = std::process::Command::new(aqw_bin())
        .args(["run", "--app"])
        .arg(app.path())
        .current_dir(app.path())
        .env("AzureWebJobsStorage", CONN)
        .spawn()
        .unwrap();
    let dir = app.path().to_path_buf();
    let count = |suffix: &'static str| {
        let dir = dir.clone();
        move || {
            std::fs::read_dir(&dir)
                .unwrap()
                .filter(|e| {
                    e.as_ref()
                        .unwrap()
                        .file_name()
                        .to_string_lossy()
                        .ends_with(suffix)
                })
                .count()
        }
    };
    let (done, started) = (count(".done"), count(".started"));
    eventually("fast jobs done and slow jobs running", DEADLINE, || {
        let r = (done() == 2 && started() == 2).then_some(());
        async move { r }
    })
    .await;
    let pid = child.id() as i32;
    unsafe_kill(pid, "TERM");
    let status = child.wait().unwrap();
    assert!(status.success(), "exit 0 after SIGTERM: {status:?}");
    // The slow jobs were released: visible again at once, not after the 30 s lease.
    let visible = app.source().peek(32).await.unwrap();
    assert_eq!(visible.len(), 2, "both in-flight messages visible again");
    assert!(app.poison_messages().await.is_empty());
    app.cleanup().await;
}

fn unsafe_kill(pid: i32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(ok.success());
}

#[test]
fn config_errors_exit_2_naming_the_field_before_any_network_access() {
    // A listener stands in for storage: it must see no connection at all.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let conn = format!(
        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={};QueueEndpoint=http://127.0.0.1:{port}/devstoreaccount1;TableEndpoint=http://127.0.0.1:{port}/devstoreaccount1",
        aqw_azure::DEV_KEY
    );
    let cases: &[(&str, &str)] = &[
        ("{ not json", "invalid JSON"),
        (
            r#"{"aqw": {"functions": {"F": {"queue": "orders", "handler": {"type": "exec", "command": ["x"]}}}, "bogus": 1}}"#,
            "aqw.bogus",
        ),
        (
            r#"{"extensions": {"queues": {"maxDequeueCount": 0}}, "aqw": {"functions": {"F": {"queue": "orders"}}}}"#,
            "extensions.queues.maxDequeueCount",
        ),
        (
            r#"{"extensions": {"queues": {"maxPollingInterval": "2 seconds"}}, "aqw": {"functions": {"F": {"queue": "orders"}}}}"#,
            "extensions.queues.maxPollingInterval",
        ),
        (
            r#"{"extensions": {"queues": {"batchSize": 64}}, "aqw": {"functions": {"F": {"queue": "orders"}}}}"#,
            "extensions.queues.batchSize",
        ),
        (
            r#"{"aqw": {"functions": {"F": {"queue": "Orders_Bad"}}}}"#,
            "aqw.functions.F.queue",
        ),
        (
            r#"{"aqw": {"functions": {"F": {"queue": "a-very-long-queue-name-that-leaves-no-room-for-the-poison"}}}}"#,
            "-poison",
        ),
        (
            r#"{"aqw": {"functions": {"F": {"queue": "orders", "key": "r:{messageId}"}}}}"#,
            "aqw.functions.F.key",
        ),
        (
            r#"{"aqw": {"functions": {"F": {"queue": "orders", "handler": {"type": "exec", "command": ["x"]}}}, "retry": {"strategy": "linear"}}}"#,
            "aqw.retry.strategy",
        ),
        (
            r#"{"aqw": {"functions": {"F": {"queue": "orders", "connection": "MissingSetting"}}}}"#,
            "MissingSetting",
        ),
        (
            r#"{"aqw": {"functions": {"F": {"queue": "orders"}}, "tables": {"keys": "bad-name"}}}"#,
            "aqw.tables.keys",
        ),
        (
            r#"{"aqw": {"functions": {"F": {"queue": "orders"}}}}"#,
            "aqw.functions.F.handler",
        ),
    ];
    for (host, field) in cases {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("host.json"), host).unwrap();
        let out = std::process::Command::new(aqw_bin())
            .args(["run", "--app"])
            .arg(dir.path())
            .env("AzureWebJobsStorage", &conn)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{host}: {stderr}");
        assert!(
            stderr.contains(field),
            "{host}: stderr should name {field}: {stderr}"
        );
        assert!(
            stderr.contains("host.json") || stderr.contains("environment"),
            "{stderr}"
        );
        assert!(!stderr.contains(aqw_azure::DEV_KEY), "no secret in errors");
    }
    // A function folder and host.json disagreeing on the queue.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("host.json"),
        r#"{"aqw": {"functions": {"F": {"queue": "orders"}}}}"#,
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("F")).unwrap();
    std::fs::write(
        dir.path().join("F/function.json"),
        r#"{"bindings": [{"type": "queueTrigger", "name": "m", "queueName": "other", "connection": "AzureWebJobsStorage"}]}"#,
    )
    .unwrap();
    let out = std::process::Command::new(aqw_bin())
        .args(["run", "--app"])
        .arg(dir.path())
        .env("AzureWebJobsStorage", &conn)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("aqw.functions.F.queue"));
    assert!(
        matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "no network access"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_rejects_oversize_payload_before_any_io() {
    // With claim-check off (on, a large job goes to a blob: tests/claim_check.rs).
    let app = TestApp::new(
        json!({"key": "none"}),
        json!({}),
        json!({"claimCheck": {"enabled": false}}),
    );
    let big = format!("{{\"id\":\"{}\"}}", "x".repeat(50_000));
    let out = aqw(app.path(), &["enqueue", &app.queue, "--payload", &big]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("49152"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        app.source().peek(1).await.is_err(),
        "queue was never created: no I/O happened"
    );
    let ok = aqw(
        app.path(),
        &[
            "enqueue",
            &app.queue,
            "--payload",
            r#"{"id":"1"}"#,
            "--output",
            "json",
        ],
    );
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let msgs = app.source().peek(1).await.unwrap();
    assert_eq!(
        aqw_core::message::decode(&msgs[0].text, app.config.message_encoding).unwrap(),
        r#"{"id":"1"}"#
    );
    app.cleanup().await;
}
