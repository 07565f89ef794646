//! The operator's procedure against a real Azurite: exhaust → alert →
//! list/show → fix → replay → confirm, plus dry-run, interrupted replays,
//! already-done keys, Functions-host raw poison messages, discard and status.

use crate::common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(60);

fn app_with_sink(sink: &Sink, max: u32) -> TestApp {
    TestApp::new(
        json!({"key": "receipt:{/orderId}", "handler": {"type": "http", "url": format!("{}/effects", sink.url), "timeout": "00:00:05"}}),
        json!({"maxDequeueCount": max}),
        json!({"alert": {"webhook": format!("{}/alerts", sink.url), "window": "00:00:01"}}),
    )
}

fn json_out(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// `poison replay --all --by test` with `concurrency` records at a time.
fn replay_all(concurrency: usize) -> aqw_core::ops::ReplayOptions {
    aqw_core::ops::ReplayOptions {
        filter: Default::default(),
        limit: None,
        rate: None,
        dry_run: false,
        by: "test".into(),
        wait: None,
        concurrency,
        past_provider_window: false,
        uncertain_checked: true,
        provider_answers: Default::default(),
    }
}

async fn poisoned(app: &TestApp, n: usize) {
    eventually("poison records", DEADLINE, || async {
        let rows = app
            .records()
            .query(Some(&app.queue))
            .await
            .unwrap_or_default();
        (rows.len() >= n && TestApp::exact_count(app.source().as_ref()).await == 0).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhaust_then_recover_with_the_original_key() {
    // Seed check 3 (exhaust) and 4 (recover).
    let sink = Sink::start().await;
    sink.fail_with(503);
    let app = app_with_sink(&sink, 3);
    let id = app
        .enqueue(r#"{"orderId":"ord-9","email":"c@example.com"}"#)
        .await;
    let w = app.start_configured_worker();
    poisoned(&app, 1).await;
    let alert = eventually("alert at the webhook", DEADLINE, || {
        let a = sink.to("/alerts");
        async move { a.first().cloned() }
    })
    .await;
    let alert: Value = serde_json::from_str(&alert.body).unwrap();
    assert_eq!(alert["event"], "aqw.poison.new");
    assert_eq!(alert["queue"], app.queue.as_str());
    assert_eq!(alert["messageId"], id.as_str());
    assert_eq!(alert["count"], 1);
    let failed = sink.to("/effects");
    assert_eq!(failed.len(), 3, "every attempt used");

    // Step 2: read before changing anything.
    let list = aqw(
        app.path(),
        &["poison", "list", &app.queue, "--output", "json"],
    );
    assert_eq!(list.status.code(), Some(1), "open records need a person");
    let records = json_out(&list);
    assert_eq!(records.as_array().unwrap().len(), 1);
    let r = &records[0];
    assert_eq!(
        (
            r["messageId"].as_str(),
            r["status"].as_str(),
            r["dequeueCount"].as_u64()
        ),
        (Some(id.as_str()), Some("open"), Some(3))
    );
    assert!(r["error"]["message"].as_str().unwrap().contains("HTTP 503"));
    let show = json_out(&aqw(
        app.path(),
        &["poison", "show", &app.queue, &id, "--output", "json"],
    ));
    assert_eq!(show["payload"]["orderId"], "ord-9");
    assert_eq!(show["keyRecord"]["status"], "poisoned");
    let status = aqw(app.path(), &["status", "--output", "json"]);
    assert_eq!(
        status.status.code(),
        Some(1),
        "status exits 1 while a record is open"
    );

    // Step 4–6: fix, replay with --wait, confirm one effect.
    sink.fail_with(200);
    let out = aqw(
        app.path(),
        &[
            "poison",
            "replay",
            "--uncertain-checked",
            &app.queue,
            "--id",
            &id,
            "--by",
            "oncall",
            "--wait",
            "00:00:30",
            "--output",
            "json",
        ],
    );
    let report = json_out(&out);
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert_eq!(report["replayed"], 1);
    assert_eq!(report["items"][0]["confirmed"], true);
    w.stop().await;
    let effects = sink.to("/effects");
    assert_eq!(effects.len(), 4);
    assert_eq!(
        sink.applied_effects("/effects").len(),
        1,
        "the effect happened once"
    );
    assert!(
        effects
            .iter()
            .all(|e| e.idempotency_key == failed[0].idempotency_key),
        "same Idempotency-Key as the failed attempts"
    );
    assert!(effects[3].previously_pending);
    let (e, _) = app.records().get(&app.queue, &id).await.unwrap().unwrap();
    assert_eq!(e["Status"], "replayed");
    assert_eq!(e["ReplayedBy"], "oncall");
    assert_eq!(
        TestApp::exact_count(app.poison_queue().as_ref()).await,
        0,
        "poison queue empty"
    );
    assert_eq!(aqw(app.path(), &["status"]).status.code(), Some(0));

    // A second replay does nothing.
    let again = aqw(
        app.path(),
        &[
            "poison",
            "replay",
            "--uncertain-checked",
            &app.queue,
            "--all",
            "--by",
            "oncall",
            "--output",
            "json",
        ],
    );
    assert_eq!(again.status.code(), Some(0));
    assert_eq!(json_out(&again)["selected"], 0);
    assert_eq!(TestApp::exact_count(app.source().as_ref()).await, 0);
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_changes_nothing() {
    let sink = Sink::start().await;
    sink.fail_with(400);
    let app = app_with_sink(&sink, 5);
    for i in 0..3 {
        app.enqueue(&format!(r#"{{"orderId":"d{i}"}}"#)).await;
    }
    let w = app.start_configured_worker();
    poisoned(&app, 3).await;
    w.stop().await;
    let snapshot = |app: &TestApp| {
        let records = app.records();
        let pq = app.poison_queue();
        let src = app.source();
        async move {
            let mut rows: Vec<String> = records
                .query(None)
                .await
                .unwrap()
                .into_iter()
                .map(|(p, r, e)| format!("{p}/{r}/{}", Value::Object(e)))
                .collect();
            rows.sort();
            let mut pm: Vec<String> = pq
                .peek(32)
                .await
                .unwrap()
                .into_iter()
                .map(|m| format!("{}:{}", m.id, m.text))
                .collect();
            pm.sort();
            (rows, pm, src.peek(32).await.unwrap().len())
        }
    };
    let before = snapshot(&app).await;
    let out = aqw(
        app.path(),
        &[
            "poison",
            "replay",
            "--uncertain-checked",
            &app.queue,
            "--all",
            "--dry-run",
            "--by",
            "x",
            "--output",
            "json",
        ],
    );
    assert_eq!(out.status.code(), Some(0));
    let report = json_out(&out);
    assert_eq!(report["selected"], 3);
    assert!(report["items"]
        .as_array()
        .unwrap()
        .iter()
        .all(|i| i["action"] == "would-replay"));
    assert_eq!(snapshot(&app).await, before, "queues and table unchanged");
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn already_done_key_is_closed_not_reput() {
    let sink = Sink::start().await;
    sink.fail_with(500);
    let app = app_with_sink(&sink, 1);
    let id = app.enqueue(r#"{"orderId":"dup"}"#).await;
    let w = app.start_configured_worker();
    poisoned(&app, 1).await;
    // The same job arrives again later and succeeds: the key is done.
    sink.fail_with(200);
    app.enqueue(r#"{"orderId":"dup"}"#).await;
    let keys = app.keys();
    let k = aqw_core::idempotency::IdempotencyKey::new("receipt:dup").unwrap();
    eventually("key done", DEADLINE, || async {
        keys.get("Job", &k)
            .await
            .ok()
            .flatten()
            .filter(|r| r.status == aqw_core::idempotency::KeyStatus::Done)
            .map(|_| ())
    })
    .await;
    w.stop().await;
    let out = aqw(
        app.path(),
        &[
            "poison",
            "replay",
            "--uncertain-checked",
            &app.queue,
            "--id",
            &id,
            "--by",
            "x",
            "--output",
            "json",
        ],
    );
    let report = json_out(&out);
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert_eq!(report["items"][0]["action"], "already-done");
    assert_eq!(
        TestApp::exact_count(app.source().as_ref()).await,
        0,
        "not re-put"
    );
    let (e, _) = app.records().get(&app.queue, &id).await.unwrap().unwrap();
    assert_eq!(
        (e["Status"].as_str(), e["ReplayNote"].as_str()),
        (Some("replayed"), Some("already done"))
    );
    assert_eq!(sink.applied_effects("/effects").len(), 1);
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn functions_host_raw_poison_message_is_listed_and_replayed_as_is() {
    let sink = Sink::start().await;
    let app = app_with_sink(&sink, 5);
    let raw = aqw_core::message::encode(r#"{"orderId":"from-host"}"#, app.config.message_encoding);
    let pq = app.poison_queue();
    pq.create_if_missing().await.unwrap();
    let pid = pq
        .put(&raw, Duration::ZERO, aqw_core::storage::Ttl::Default)
        .await
        .unwrap()
        .id;
    let list = json_out(&aqw(
        app.path(),
        &["poison", "list", &app.queue, "--output", "json"],
    ));
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list[0]["origin"], "host");
    assert_eq!(list[0]["messageId"], pid.as_str());
    let out = aqw(
        app.path(),
        &[
            "poison",
            "replay",
            "--uncertain-checked",
            &app.queue,
            "--id",
            &pid,
            "--by",
            "x",
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
    let msgs = app.source().peek(32).await.unwrap();
    assert_eq!(msgs.len(), 1);
    assert_eq!(msgs[0].text, raw, "re-put byte-exact");
    eventually("poison copy removed", DEADLINE, || async {
        (TestApp::exact_count(app.poison_queue().as_ref()).await == 0).then_some(())
    })
    .await;
    app.cleanup().await;
}

#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_killed_between_reput_and_record_update_then_rerun() {
    let sink = Sink::start().await;
    sink.fail_with(500);
    let app = app_with_sink(&sink, 1);
    let id = app.enqueue(r#"{"orderId":"interrupted"}"#).await;
    let w = app.start_configured_worker();
    poisoned(&app, 1).await;
    w.stop().await;
    sink.fail_with(200);
    for point in ["replay.after_put", "replay.after_record"] {
        let out = std::process::Command::new(aqw_bin())
            .args([
                "poison",
                "replay",
                "--uncertain-checked",
                &app.queue,
                "--all",
                "--by",
                "x",
                "--app",
            ])
            .arg(app.path())
            .env("AzureWebJobsStorage", CONN)
            .env("AQW_FAILPOINT", point)
            .output()
            .unwrap();
        if point == "replay.after_put" {
            assert!(!out.status.success(), "aborted at {point}");
        }
    }
    // The second run (failpoint after the record update) finished the replay.
    let out = aqw(
        app.path(),
        &[
            "poison",
            "replay",
            "--uncertain-checked",
            &app.queue,
            "--all",
            "--by",
            "x",
            "--output",
            "json",
        ],
    );
    assert_eq!(json_out(&out)["selected"], 0, "nothing left to replay");
    let w = app.start_configured_worker();
    app.drained(DEADLINE).await;
    w.stop().await;
    assert_eq!(sink.applied_effects("/effects").len(), 1, "one effect");
    let (e, _) = app.records().get(&app.queue, &id).await.unwrap().unwrap();
    assert_eq!(e["Status"], "replayed");
    assert_eq!(
        app.records().query(Some(&app.queue)).await.unwrap().len(),
        1,
        "one closed record"
    );
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_rate_is_respected() {
    let app = TestApp::new(
        json!({"key": "none"}),
        json!({"maxDequeueCount": 1}),
        json!({}),
    );
    let n = 30;
    for i in 0..n {
        app.enqueue(&format!(r#"{{"i":{i}}}"#)).await;
    }
    let w = app.start_worker(Scripted::new(|_, _| {
        Err(aqw_core::handler::HandlerError::permanent("no"))
    }));
    poisoned(&app, n).await;
    w.stop().await;
    let start = Instant::now();
    let out = aqw(
        app.path(),
        &[
            "poison",
            "replay",
            "--uncertain-checked",
            &app.queue,
            "--all",
            "--rate",
            "20",
            "--by",
            "x",
            "--output",
            "json",
        ],
    );
    let took = start.elapsed();
    assert_eq!(json_out(&out)["replayed"], n);
    // A loose lower bound only: 30 messages at 20/s cannot take less than 29/20 s.
    assert!(took >= Duration::from_millis(1450), "{took:?}");
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discard_needs_reason_and_name_and_closes_the_record() {
    let app = TestApp::new(
        json!({"key": "none"}),
        json!({"maxDequeueCount": 1}),
        json!({}),
    );
    let id = app.enqueue(r#"{"x":1}"#).await;
    let w = app.start_worker(Scripted::new(|_, _| {
        Err(aqw_core::handler::HandlerError::permanent("no"))
    }));
    poisoned(&app, 1).await;
    w.stop().await;
    assert_eq!(
        aqw(
            app.path(),
            &["poison", "discard", &app.queue, "--id", &id, "--by", "me"]
        )
        .status
        .code(),
        Some(2)
    );
    // No --by and no $USER to default to: a usage error (replay alike).
    for args in [
        vec![
            "poison",
            "discard",
            &app.queue,
            "--id",
            &id,
            "--reason",
            "test data",
        ],
        vec![
            "poison",
            "replay",
            "--uncertain-checked",
            &app.queue,
            "--id",
            &id,
        ],
    ] {
        let out = std::process::Command::new(aqw_bin())
            .args(&args)
            .arg("--app")
            .arg(app.path())
            .env("AzureWebJobsStorage", CONN)
            .env_remove("USER")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("--by"),
            "{args:?}"
        );
    }
    let out = aqw(
        app.path(),
        &[
            "poison",
            "discard",
            &app.queue,
            "--id",
            &id,
            "--reason",
            "test data",
            "--by",
            "me",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (e, _) = app.records().get(&app.queue, &id).await.unwrap().unwrap();
    assert_eq!(
        (
            e["Status"].as_str(),
            e["DiscardReason"].as_str(),
            e["DiscardedBy"].as_str()
        ),
        (Some("discarded"), Some("test data"), Some("me"))
    );
    assert_eq!(TestApp::exact_count(app.poison_queue().as_ref()).await, 0);
    let list = aqw(
        app.path(),
        &["poison", "list", &app.queue, "--status", "open"],
    );
    assert_eq!(list.status.code(), Some(0), "nothing open");
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_records_etag_guards_its_update() {
    // Replay updates records with the ETag their listing returned: it must be
    // the entity's real version (a stale one must fail, the listed one pass).
    let app = TestApp::new(json!({"key": "job:{/id}"}), json!({}), json!({}));
    let t = app.records();
    t.create_if_missing().await.unwrap();
    let mut e = aqw_core::storage::Entity::new();
    e.insert("Status".into(), json!("open"));
    let first = t.insert(&app.queue, "r1", &e).await.unwrap();
    let rows = t.query_rows(Some(&app.queue)).await.unwrap();
    assert_eq!(rows.len(), 1);
    let listed = rows[0]
        .etag
        .clone()
        .expect("query returns each entity's ETag");
    assert_eq!(listed, first, "the listing's ETag is the insert's");
    e.insert("Status".into(), json!("replayed"));
    let second = t.merge(&app.queue, "r1", &e, Some(&listed)).await.unwrap();
    assert!(matches!(
        t.merge(&app.queue, "r1", &e, Some(&listed)).await,
        Err(aqw_core::storage::StorageError::PreconditionFailed)
    ));
    let rows = t.query_rows(Some(&app.queue)).await.unwrap();
    assert_eq!(rows[0].etag.as_ref(), Some(&second));
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_costs_five_requests_per_keyed_record() {
    // Per keyed record: key read, put, record close (conditional on the
    // listed ETag), poison copy delete, key ReplayCount (conditional on the
    // key's ETag). Plus one scan and one listing for the whole command.
    let sink = Sink::start().await;
    sink.fail_with(500);
    let app = app_with_sink(&sink, 1);
    let n = 6;
    for i in 0..n {
        app.enqueue(&format!(r#"{{"orderId":"rc-{i}"}}"#)).await;
    }
    let w = app.start_configured_worker();
    poisoned(&app, n).await;
    w.stop().await;
    let storage = app.storage();
    let ops = aqw_core::ops::QueueOps::new(app.config.clone(), &app.queue, &storage);
    let opts = replay_all(4);
    let before = storage.request_counts();
    let report = aqw_core::ops::replay(&ops, &opts, &|_, _| {})
        .await
        .unwrap();
    let after = storage.request_counts();
    assert_eq!((report.replayed, report.failed), (n, 0), "{report:?}");
    let delta =
        |op: &str| after.get(op).copied().unwrap_or(0) - before.get(op).copied().unwrap_or(0);
    let n = n as u64;
    assert_eq!(delta("queue.put"), n, "{after:?}");
    assert_eq!(delta("queue.delete"), n, "{after:?}");
    assert_eq!(
        delta("table.get"),
        n,
        "one key read each, no record read: {after:?}"
    );
    assert_eq!(
        delta("table.update"),
        2 * n,
        "record close + ReplayCount: {after:?}"
    );
    assert_eq!(delta("table.query"), 2, "scan + listing: {after:?}");
    // The counts landed: every record replayed once, every key counted once.
    let rows = app.records().query(Some(&app.queue)).await.unwrap();
    assert!(rows
        .iter()
        .all(|(_, _, e)| e["Status"] == "replayed" && e["ReplayCount"] == 1));
    let keys = app.keys();
    for i in 0..n {
        let k = aqw_core::idempotency::IdempotencyKey::new(format!("receipt:rc-{i}")).unwrap();
        assert_eq!(keys.get("Job", &k).await.unwrap().unwrap().replay_count, 1);
    }
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_concurrent_replays_put_each_keyless_job_once() {
    // Keyless jobs have no key to drop a second copy, so of two replays
    // racing for a record only the one whose conditional marker lands may
    // put it; the other reports it skipped.
    let sink = Sink::start().await;
    sink.fail_with(500);
    let app = TestApp::new(
        json!({"key": "none", "handler": {"type": "http", "url": format!("{}/effects", sink.url), "timeout": "00:00:05"}}),
        json!({"maxDequeueCount": 1}),
        json!({}),
    );
    let n = 8;
    for i in 0..n {
        app.enqueue(&format!(r#"{{"n":{i}}}"#)).await;
    }
    let w = app.start_configured_worker();
    poisoned(&app, n).await;
    w.stop().await;
    let storage = app.storage();
    let opts = replay_all(8);
    let a = aqw_core::ops::QueueOps::new(app.config.clone(), &app.queue, &storage);
    let b = aqw_core::ops::QueueOps::new(app.config.clone(), &app.queue, &storage);
    let (ra, rb) = tokio::join!(
        aqw_core::ops::replay(&a, &opts, &|_, _| {}),
        aqw_core::ops::replay(&b, &opts, &|_, _| {})
    );
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert_eq!(ra.replayed + rb.replayed, n, "{ra:?}\n{rb:?}");
    assert_eq!(
        TestApp::exact_count(app.source().as_ref()).await,
        n as u64,
        "each job back on the queue exactly once: {ra:?}\n{rb:?}"
    );
    let rows = app.records().query(Some(&app.queue)).await.unwrap();
    assert!(rows.iter().all(|(_, _, e)| e["Status"] == "replayed"));
    app.cleanup().await;
}
