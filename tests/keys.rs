//! Idempotency keys against a real Azurite: the seed's replay and race
//! checks, a crash after the effect, poisoned keys, any key text, same-store
//! effects and the per-message storage request budget.

use crate::common::*;
use aqw_core::handler::{HandlerError, Success};
use aqw_core::idempotency::{IdempotencyKey, KeyStatus, NextAction};
use aqw_core::storage::Storage;
use serde_json::json;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(60);

fn http_function(sink: &Sink) -> serde_json::Value {
    json!({"key": "receipt:{/orderId}", "handler": {"type": "http", "url": format!("{}/effects", sink.url), "timeout": "00:00:05"}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_check_same_job_twice_one_effect() {
    let sink = Sink::start().await;
    let app = TestApp::new(http_function(&sink), json!({}), json!({}));
    let payload = r#"{"orderId":"42","email":"a@example.com"}"#;
    app.enqueue(payload).await;
    app.enqueue(payload).await;
    let w = app.start_configured_worker();
    app.drained(DEADLINE).await;
    w.stop().await;
    let reqs = sink.all();
    assert_eq!(reqs.len(), 1, "one request reached the provider: {reqs:?}");
    assert_eq!(reqs[0].business_key.as_deref(), Some("receipt%3A42"));
    let rows = app
        .storage()
        .table(&app.keys_table)
        .query(None)
        .await
        .unwrap();
    assert_eq!(rows.len(), 1, "one key record");
    let rec = app
        .keys()
        .get("Job", &IdempotencyKey::new("receipt:42").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.status, KeyStatus::Done);
    assert_eq!(
        reqs[0].idempotency_key.as_deref(),
        Some(rec.provider_key.as_str())
    );
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn race_check_two_workers_one_effect_per_key() {
    let sink = Sink::start().await;
    let app = TestApp::new(http_function(&sink), json!({"batchSize": 8}), json!({}));
    let keys = 30;
    for copy in 0..3 {
        for k in 0..keys {
            app.enqueue(&format!(r#"{{"orderId":"o{k}","copy":{copy}}}"#))
                .await;
        }
    }
    // Two worker instances, each with its own storage clients, racing.
    let w1 = app.start_configured_worker();
    let w2 = app.start_configured_worker();
    app.drained(DEADLINE).await;
    w1.stop().await;
    w2.stop().await;
    let mut per_key: HashMap<String, usize> = HashMap::new();
    for r in sink.all() {
        *per_key.entry(r.business_key.unwrap()).or_default() += 1;
    }
    assert_eq!(per_key.len(), keys, "every key's effect happened");
    assert!(
        per_key.values().all(|&n| n == 1),
        "exactly once per key: {per_key:?}"
    );
    let rows = app
        .storage()
        .table(&app.keys_table)
        .query(None)
        .await
        .unwrap();
    assert_eq!(rows.len(), keys);
    assert!(rows.iter().all(|(_, _, e)| e["Status"] == "done"));
    app.cleanup().await;
}

#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_the_effect_resends_the_same_provider_key() {
    let sink = Sink::start().await;
    let app = TestApp::new(
        http_function(&sink),
        json!({}),
        json!({"lease": "00:00:02"}),
    );
    app.enqueue(r#"{"orderId":"crash-1"}"#).await;
    // First run dies (abort, like kill -9) right after the effect, before `done`.
    let out = std::process::Command::new(aqw_bin())
        .args(["run", "--app"])
        .arg(app.path())
        .env("AzureWebJobsStorage", CONN)
        .env("AQW_FAILPOINT", "effect.after")
        .output()
        .unwrap();
    assert!(!out.status.success(), "the failpoint aborted the worker");
    assert_eq!(sink.all().len(), 1);
    let k = IdempotencyKey::new("receipt:crash-1").unwrap();
    assert_eq!(
        app.keys().get("Job", &k).await.unwrap().unwrap().status,
        KeyStatus::Pending
    );
    // The next worker gets the message after the lease ends and resends with the same key.
    let w = app.start_configured_worker();
    app.drained(DEADLINE).await;
    w.stop().await;
    let reqs = sink.all();
    assert_eq!(reqs.len(), 2, "the retry reached the provider again");
    assert_eq!(
        reqs[0].idempotency_key, reqs[1].idempotency_key,
        "same Idempotency-Key"
    );
    assert_eq!(
        sink.applied_effects("/effects").len(),
        1,
        "a provider deduping on the key applies one effect"
    );
    let rec = app.keys().get("Job", &k).await.unwrap().unwrap();
    assert_eq!((rec.status, rec.attempts), (KeyStatus::Done, 2));
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_key_is_not_done_and_a_later_message_runs() {
    let app = TestApp::new(
        json!({"key": "credits:{/account}:{/period}"}),
        json!({}),
        json!({}),
    );
    let h = Scripted::new(|job, _| {
        if job.payload.contains("bad") {
            Err(HandlerError::permanent("invalid account"))
        } else {
            Ok(Success::done())
        }
    });
    app.enqueue(r#"{"account":"a1","period":"2026-11","bad":true}"#)
        .await;
    let w = app.start_worker(h.clone());
    let k = IdempotencyKey::new("credits:a1:2026-11").unwrap();
    let keys = app.keys();
    eventually("key poisoned", DEADLINE, || async {
        keys.get("Job", &k)
            .await
            .ok()
            .flatten()
            .filter(|r| r.status == KeyStatus::Poisoned)
            .map(|_| ())
    })
    .await;
    app.enqueue(r#"{"account":"a1","period":"2026-11"}"#).await;
    eventually("key done", DEADLINE, || async {
        keys.get("Job", &k)
            .await
            .ok()
            .flatten()
            .filter(|r| r.status == KeyStatus::Done)
            .map(|_| ())
    })
    .await;
    w.stop().await;
    assert_eq!(h.calls(), 2);
    let jobs = h.jobs.lock().unwrap().clone();
    assert!(
        jobs[1].previously_pending,
        "the later attempt is told an earlier one existed"
    );
    assert_eq!(
        jobs[0].provider_key, jobs[1].provider_key,
        "same provider key across the poison"
    );
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_with_any_characters_work_and_long_keys_stay_distinct() {
    azurite();
    let storage =
        aqw_azure::connect(&aqw_azure::parse_connection_string("X", CONN).unwrap()).unwrap();
    let table = storage.table(&random_name("k"));
    table.create_if_missing().await.unwrap();
    let keys = aqw_core::idempotency::KeyStore::new(table.clone());
    let long_a = format!("{}A", "p".repeat(600));
    let long_b = format!("{}B", "p".repeat(600));
    let texts = [
        "a/b\\c".to_string(),
        "hash#frag?q=1&x".to_string(),
        "it's \"quoted\"".to_string(),
        "emoji 😀 ünïcödé".to_string(),
        "%27%2F".to_string(),
        "k".repeat(10 * 1024),
        long_a.clone(),
        long_b.clone(),
    ];
    for t in &texts {
        let k = IdempotencyKey::new(t.clone()).unwrap();
        let NextAction::Run(c) = keys
            .claim("F", &k, "owner", Duration::from_secs(30), "m")
            .await
            .unwrap()
        else {
            panic!("fresh key {t:.40} should run")
        };
        keys.complete(&c, vec![]).await.unwrap();
        let again = keys
            .claim("F", &k, "owner2", Duration::from_secs(30), "m2")
            .await
            .unwrap();
        assert!(matches!(again, NextAction::AlreadyDone), "{t:.40}");
        let rec = keys.get("F", &k).await.unwrap().unwrap();
        assert_eq!(&rec.key, t, "the original key text is stored");
    }
    assert_eq!(
        table.query(None).await.unwrap().len(),
        texts.len(),
        "keys differing after 512 chars are distinct"
    );
    table.delete_table().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_race_on_one_key_has_exactly_one_winner() {
    azurite();
    let conn = aqw_azure::parse_connection_string("X", CONN).unwrap();
    let name = random_name("k");
    let setup = aqw_azure::connect(&conn).unwrap();
    setup.table(&name).create_if_missing().await.unwrap();
    let k = IdempotencyKey::new("race:1").unwrap();
    let mut tasks = Vec::new();
    for i in 0..8 {
        let s = aqw_azure::connect(&conn).unwrap();
        let keys = aqw_core::idempotency::KeyStore::new(s.table(&name));
        let k = k.clone();
        tasks.push(tokio::spawn(async move {
            keys.claim("F", &k, &format!("w{i}"), Duration::from_secs(30), "m")
                .await
                .unwrap()
        }));
    }
    let mut winners = 0;
    for t in tasks {
        match t.await.unwrap() {
            NextAction::Run(_) => winners += 1,
            NextAction::HeldElsewhere { .. } => {}
            NextAction::AlreadyDone => panic!("nobody finished"),
        }
    }
    assert_eq!(winners, 1);
    setup.table(&name).delete_table().await.unwrap();
}

/// A credit ledger: the grant and the key's `done` land in one transaction.
struct Ledger;

#[async_trait::async_trait]
impl aqw_core::handler::Handler for Ledger {
    async fn handle(&self, job: &aqw_core::handler::Job) -> Result<Success, HandlerError> {
        let v: serde_json::Value = serde_json::from_str(&job.payload).unwrap();
        let mut entry = aqw_core::storage::Entity::new();
        entry.insert("Kind".into(), json!("credit-grant"));
        entry.insert("Account".into(), v["account"].clone());
        entry.insert("Credits".into(), v["credits"].clone());
        // The ledger row is keyed by the business key: a second grant for the
        // same key could not even be inserted.
        let row = format!(
            "ledger-{}",
            IdempotencyKey::new(job.key.clone().unwrap())
                .unwrap()
                .row_key()
        );
        Ok(Success::done().with_entity(row, entry))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_store_effect_and_done_mark_land_together_once() {
    let app = TestApp::new(
        json!({"key": "credits:{/account}:{/period}"}),
        json!({}),
        json!({}),
    );
    for _ in 0..3 {
        app.enqueue(r#"{"account":"acc-7","period":"2026-11","credits":100}"#)
            .await;
    }
    let w = app.start_worker(Arc::new(Ledger));
    app.drained(DEADLINE).await;
    w.stop().await;
    let rows = app
        .storage()
        .table(&app.keys_table)
        .query(None)
        .await
        .unwrap();
    let ledger: Vec<_> = rows
        .iter()
        .filter(|(_, rk, _)| rk.starts_with("ledger-"))
        .collect();
    assert_eq!(ledger.len(), 1, "one ledger entry");
    assert_eq!(ledger[0].2["Credits"], 100);
    let k = IdempotencyKey::new("credits:acc-7:2026-11").unwrap();
    assert_eq!(
        ledger[0].0,
        k.partition_key("Job"),
        "same partition as the key"
    );
    assert_eq!(
        app.keys().get("Job", &k).await.unwrap().unwrap().status,
        KeyStatus::Done
    );
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_message_costs_three_storage_requests_besides_the_receive() {
    let app = TestApp::new(json!({"key": "job:{/id}"}), json!({}), json!({}));
    let n = 10;
    for i in 0..n {
        app.enqueue(&format!(r#"{{"id":"{i}"}}"#)).await;
    }
    let storage = app.storage();
    storage
        .table(&app.keys_table)
        .create_if_missing()
        .await
        .unwrap();
    let rt = aqw_core::runtime::FunctionRuntime::new(
        app.config.clone(),
        app.config.functions[0].clone(),
        &storage,
        Scripted::new(|_, _| Ok(Success::done())),
        aqw_core::alert::Alerts::disabled(),
    );
    let before = storage.request_counts();
    let msgs = rt
        .source
        .receive(32, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(msgs.len(), n);
    let stop = tokio_util::sync::CancellationToken::new();
    for m in &msgs {
        let settle = aqw_core::worker::QueueSettle::new(rt.source.clone(), m);
        assert_eq!(
            aqw_core::job::process(
                &rt,
                m,
                &aqw_core::message::Payload::decode(&m.text, rt.app.message_encoding),
                &settle,
                &aqw_core::traces::start_job(&tracing::Span::none(), None),
                &stop
            )
            .await,
            aqw_core::job::Outcome::Completed
        );
    }
    let after = storage.request_counts();
    let delta =
        |op: &str| after.get(op).copied().unwrap_or(0) - before.get(op).copied().unwrap_or(0);
    let total: u64 = after.values().sum::<u64>() - before.values().sum::<u64>();
    assert_eq!(delta("queue.receive"), 1);
    assert_eq!(delta("table.insert"), n as u64);
    assert_eq!(delta("table.update"), n as u64);
    assert_eq!(delta("queue.delete"), n as u64);
    assert_eq!(
        total - 1,
        3 * n as u64,
        "claim insert + done update + delete per message: {after:?}"
    );
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_show_prints_the_record() {
    let app = TestApp::new(json!({"key": "job:{/id}"}), json!({}), json!({}));
    app.enqueue(r#"{"id":"shown"}"#).await;
    let w = app.start_worker(Scripted::new(|_, _| Ok(Success::done())));
    app.drained(DEADLINE).await;
    w.stop().await;
    let out = aqw(
        app.path(),
        &["keys", "show", "Job", "job:shown", "--output", "json"],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"], "done");
    assert_eq!(v["key"], "job:shown");
    assert_eq!(v["providerKey"].as_str().unwrap().len(), 36);
    let text = aqw(app.path(), &["keys", "show", "Job", "job:missing"]);
    assert_eq!(
        text.status.code(),
        Some(1),
        "a key never claimed needs a look"
    );
    assert!(String::from_utf8_lossy(&text.stdout).contains("no record"));
    app.cleanup().await;
}
