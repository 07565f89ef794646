//! Issue 52 item 6, against Azurite: a claim-checked record's replay finds
//! its key. A 200 KB job (claim-checked: its message is a reference) and a
//! small job, both poisoned after five HTTP 500s: every check that reads the
//! key's state sees the claim-checked one's key as it sees the small one's:
//! the dry run's key state and uncertain mark, the uncertain gate, "already
//! done", and the provider's key window. Before the fix the key was derived
//! from the reference, found nothing, and the record read `(none)` with no
//! gate.

use crate::common::*;
use aqw_core::handler::{HandlerError, Success};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(60);

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A job of about 200 KB, over the claim-check threshold.
fn big_job(id: &str) -> String {
    let rows: Vec<Value> = (0..4_000)
        .map(|i| json!({ "n": i, "sku": format!("sku-{i:08}"), "note": "padding" }))
        .collect();
    let job = json!({ "id": id, "rows": rows }).to_string();
    assert!(job.len() > 150_000, "{} bytes", job.len());
    job
}

/// Put `job` with `aqw enqueue` (which claim-checks it); its blob name.
fn enqueue_big(app: &TestApp, job: &str, name: &str) -> String {
    let file = app.path().join(name);
    std::fs::write(&file, job).unwrap();
    let args = [
        "enqueue",
        &app.queue,
        "--file",
        file.to_str().unwrap(),
        "--output",
        "json",
    ];
    let out = aqw(app.path(), &args);
    assert!(out.status.success(), "{}", text(&out));
    let put: Value = serde_json::from_slice(&out.stdout).unwrap();
    put["blob"].as_str().expect("claim-checked").to_string()
}

/// Every attempt ends in an HTTP 500 (may have taken effect) until `ok`.
fn flaky(ok: Arc<AtomicBool>) -> Arc<Scripted> {
    Scripted::new(move |_, _| {
        if ok.load(Ordering::SeqCst) {
            Ok(Success::done())
        } else {
            Err(HandlerError::uncertain("HTTP 500: upstream error"))
        }
    })
}

/// The open records: (id, key) of each.
fn open(app: &TestApp) -> Vec<(String, String)> {
    let q = app.queue.as_str();
    let out = aqw(
        app.path(),
        &["poison", "list", q, "--status", "open", "--output", "json"],
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|r| {
                    let s = |k: &str| r[k].as_str().unwrap_or_default().to_string();
                    (s("messageId"), s("key"))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The `n` open records, once each one's key says poisoned too: a worker
/// writes the record and its copy, then marks the key (`job/settle.rs`), so
/// a record can be listed before its key says so (CI saw `pending`).
async fn poisoned(app: &TestApp, n: usize) -> Vec<(String, String)> {
    let records = eventually(&format!("{n} open record(s)"), DEADLINE, || async {
        let got = open(app);
        (got.len() == n).then_some(got)
    })
    .await;
    for (_, key) in &records {
        let key = aqw_core::idempotency::IdempotencyKey::new(key.clone()).unwrap();
        eventually(&format!("key {key:?} poisoned"), DEADLINE, || async {
            let rec = app.keys().get("Job", &key).await.ok()??;
            (rec.status == aqw_core::idempotency::KeyStatus::Poisoned).then_some(())
        })
        .await;
    }
    records
}

/// The dry run's row of record `id`, with the lines beneath it.
fn block(dry: &str, id: &str) -> String {
    let lines: Vec<&str> = dry.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with(id))
        .unwrap_or_else(|| panic!("{id}: {dry}"));
    let more = lines[at + 1..].iter().take_while(|l| l.starts_with("    "));
    std::iter::once(lines[at])
        .chain(more.copied())
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_checked_records_key_is_seen_by_the_dry_run_the_gate_and_already_done() {
    let app = TestApp::new(
        json!({"key": "job:{/id}"}),
        json!({"maxDequeueCount": 5}),
        json!({}),
    );
    let q = app.queue.clone();
    let big_id = random_name("big");
    let job = big_job(&big_id);
    enqueue_big(&app, &job, "big.json");
    app.enqueue(r#"{"id":"small-1"}"#).await;
    let ok = Arc::new(AtomicBool::new(false));
    let w = app.start_worker(flaky(ok.clone()));
    let records = poisoned(&app, 2).await;
    let big = records
        .iter()
        .find(|(_, k)| k.contains(&big_id))
        .expect("the big one")
        .0
        .clone();
    let small = records
        .iter()
        .find(|(_, k)| k == "job:small-1")
        .expect("the small one")
        .0
        .clone();

    // The dry run: both keys found, both marked.
    let dry = text(&aqw(
        app.path(),
        &["poison", "replay", &q, "--all", "--dry-run"],
    ));
    for (id, key) in [
        (&big, format!("job:{big_id}")),
        (&small, "job:small-1".to_string()),
    ] {
        let b = block(&dry, id);
        assert!(
            b.contains(&format!("key {key} (poisoned after 5 attempt(s))")),
            "{b}"
        );
        assert!(!b.contains("(none)"), "{b}");
        assert!(
            b.contains("! an attempt may have taken effect (provider key "),
            "{b}"
        );
    }

    // The uncertain gate holds it.
    let out = aqw(
        app.path(),
        &["poison", "replay", &q, "--id", &big, "--by", "op"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("ask the provider first"),
        "{}",
        text(&out)
    );

    // Already done: the same body put again (the same blob, the same key) runs.
    ok.store(true, Ordering::SeqCst);
    enqueue_big(&app, &job, "again.json");
    let key = aqw_core::idempotency::IdempotencyKey::new(format!("job:{big_id}")).unwrap();
    eventually("the big key done", DEADLINE, || async {
        let rec = app.keys().get("Job", &key).await.ok()??;
        rec.status.is_settled().then_some(())
    })
    .await;
    let dry = text(&aqw(
        app.path(),
        &["poison", "replay", &q, "--id", &big, "--dry-run"],
    ));
    assert!(
        block(&dry, &big).contains("would-close-already-done"),
        "{dry}"
    );
    let out = aqw(
        app.path(),
        &["poison", "replay", &q, "--id", &big, "--by", "op"],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("already-done"), "{}", text(&out));
    w.stop().await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_checked_records_key_is_held_to_the_provider_window() {
    let app = TestApp::new(
        json!({"key": "job:{/id}", "providerKeyWindow": "00:00:01"}),
        json!({"maxDequeueCount": 1}),
        json!({}),
    );
    let q = app.queue.clone();
    let big_id = random_name("big");
    enqueue_big(&app, &big_job(&big_id), "big.json");
    let w = app.start_worker(flaky(Arc::new(AtomicBool::new(false))));
    let big = poisoned(&app, 1).await.remove(0).0;
    w.stop().await;
    // The provider key ages past the one-second window: replay refuses.
    let refused = eventually("the window refusal", DEADLINE, || async {
        let out = aqw(
            app.path(),
            &["poison", "replay", &q, "--id", &big, "--dry-run"],
        );
        (out.status.code() == Some(2)).then(|| text(&out))
    })
    .await;
    assert!(refused.contains("providerKeyWindow"), "{refused}");
    assert!(refused.contains(&big), "{refused}");
    assert!(refused.contains(&format!("job:{big_id}")), "{refused}");
    app.cleanup().await;
}
