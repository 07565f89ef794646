//! Issue 52, against Azurite: honest gates. A provider that declares it
//! honours `Idempotency-Key` is replayed after an uncertain attempt without
//! `--uncertain-checked`, one that does not keeps the gate; a provider known
//! to save failures (declared, or seen answering with a saved failure) makes
//! the dry run warn before a same-key replay of a refusal and name the way
//! out, which `keys new-provider-key --dry-run` rehearses without a change
//! and `poison report` then lists; `--wait` returns as soon as a replayed
//! job is poisoned again, naming the new record, and the report links the
//! two records.

use crate::common::*;
use aqw_core::handler::HandlerError;
use aqw_core::handler::Success;
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

fn json_of(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(out)))
}

/// The open records' ids, as `poison list --output json` gives them.
fn open_ids(app: &TestApp) -> Vec<String> {
    let q = app.queue.as_str();
    let out = aqw(
        app.path(),
        &["poison", "list", q, "--status", "open", "--output", "json"],
    );
    json_of(&out)
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|r| r["messageId"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Wait until `n` records are open; their ids.
async fn open_records(app: &TestApp, n: usize) -> Vec<String> {
    eventually(&format!("{n} open record(s)"), DEADLINE, || async {
        let ids = open_ids(app);
        (ids.len() == n).then_some(ids)
    })
    .await
}

fn http_app(sink: &Sink, extra: Value) -> TestApp {
    let mut handler = json!({"type": "http", "url": format!("{}/effects", sink.url),
        "timeout": "00:00:05"});
    if let (Value::Object(h), Value::Object(extra)) = (&mut handler, extra) {
        h.extend(extra);
    }
    TestApp::new(
        json!({"key": "pay:{/order}", "handler": handler}),
        json!({"maxDequeueCount": 2}),
        json!({}),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_provider_needs_no_uncertain_check_and_others_keep_the_gate() {
    let sink = Sink::start().await;
    sink.fail_with(500);
    let idempotent = http_app(&sink, json!({"idempotent": true}));
    let plain = http_app(&sink, json!({}));
    idempotent.enqueue(r#"{"order":"o-i"}"#).await;
    plain.enqueue(r#"{"order":"o-p"}"#).await;
    let workers = [
        idempotent.start_configured_worker(),
        plain.start_configured_worker(),
    ];
    let [i] = <[String; 1]>::try_from(open_records(&idempotent, 1).await).unwrap();
    let [p] = <[String; 1]>::try_from(open_records(&plain, 1).await).unwrap();
    sink.fail_with(200);

    // The provider that does not declare it: the gate stays.
    let q = plain.queue.as_str();
    let dry = text(&aqw(
        plain.path(),
        &["poison", "replay", q, "--id", &p, "--dry-run"],
    ));
    assert!(dry.contains("! an attempt may have taken effect"), "{dry}");
    assert!(!dry.contains("no --uncertain-checked needed"), "{dry}");
    let out = aqw(
        plain.path(),
        &["poison", "replay", q, "--id", &p, "--by", "op"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("then replay with --uncertain-checked"),
        "{}",
        text(&out)
    );
    assert_eq!(open_ids(&plain), std::slice::from_ref(&p), "not replayed");

    // The one that does: replayed without the flag, the reason kept.
    let q = idempotent.queue.as_str();
    let dry = text(&aqw(
        idempotent.path(),
        &["poison", "replay", q, "--id", &i, "--dry-run"],
    ));
    assert!(
        dry.contains("(handler.idempotent), a same-key replay cannot double it; no --uncertain-checked needed"),
        "{dry}"
    );
    let args = [
        "poison", "replay", q, "--id", &i, "--by", "op", "--wait", "00:01:00",
    ];
    let out = aqw(idempotent.path(), &args);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("[done]") || text(&out).contains("[completed"),
        "{}",
        text(&out)
    );
    let record = poison_record(&idempotent, &i).await;
    assert!(
        record
            .replay_note
            .as_deref()
            .unwrap_or_default()
            .contains("handler.idempotent"),
        "{:?}",
        record.replay_note
    );
    let applied = sink.applied_effects("/effects");
    assert_eq!(
        applied.len(),
        1,
        "the idempotent job applied once: {applied:?}"
    );
    for w in workers {
        w.stop().await;
    }
    idempotent.cleanup().await;
    plain.cleanup().await;
}

/// A handler that refuses order `o-refused` (402) until `fixed`, answers
/// `o-saved` with a saved failure, and succeeds otherwise.
fn saving_provider(fixed: Arc<AtomicBool>) -> Arc<Scripted> {
    Scripted::new(move |job, _| {
        if job.payload.contains("o-saved") {
            return Err(HandlerError::ReplayedFailure {
                message: "HTTP 402 (replayed): card declined".into(),
            });
        }
        if job.payload.contains("o-refused") && !fixed.load(Ordering::SeqCst) {
            return Err(HandlerError::permanent("HTTP 402: card declined"));
        }
        Ok(Success::done())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_seen_saving_a_failure_is_warned_about_and_the_way_out_is_audited() {
    let app = TestApp::new(json!({"key": "pay:{/order}"}), json!({}), json!({}));
    let q = app.queue.clone();
    let fixed = Arc::new(AtomicBool::new(false));
    let w = app.start_worker(saving_provider(fixed.clone()));
    app.enqueue(r#"{"order":"o-refused"}"#).await;
    let [refused] = <[String; 1]>::try_from(open_records(&app, 1).await).unwrap();
    let dry = text(&aqw(
        app.path(),
        &["poison", "replay", &q, "--all", "--dry-run"],
    ));
    assert!(!dry.contains("saves failures"), "no evidence yet: {dry}");

    // The provider answers another job with a saved failure: evidence.
    app.enqueue(r#"{"order":"o-saved"}"#).await;
    let ids = open_records(&app, 2).await;
    let saved = ids.iter().find(|i| **i != refused).unwrap().clone();
    let dry = text(&aqw(
        app.path(),
        &["poison", "replay", &q, "--id", &refused, "--dry-run"],
    ));
    let warning =
        format!("! the provider saves failures (it answered record {saved} with a saved failure");
    assert!(dry.contains(&warning), "{dry}");
    assert!(dry.contains("aqw keys check Job pay:o-refused"), "{dry}");
    assert!(
        dry.contains("aqw keys new-provider-key Job pay:o-refused --reason"),
        "{dry}"
    );
    assert!(
        dry.contains(&format!("aqw poison replay {q} --id {refused} --wait")),
        "{dry}"
    );

    // The way out, rehearsed: nothing changes.
    let key = aqw_core::idempotency::IdempotencyKey::new("pay:o-refused").unwrap();
    let old = app
        .keys()
        .get("Job", &key)
        .await
        .unwrap()
        .unwrap()
        .provider_key;
    let by_reason = ["--by", "dave", "--reason", "ledger: no charge (ticket 7)"];
    let mut args = vec![
        "keys",
        "new-provider-key",
        "Job",
        "pay:o-refused",
        "--dry-run",
    ];
    args.extend(by_reason);
    let out = aqw(app.path(), &args);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("provider key {old} would be replaced")),
        "{}",
        text(&out)
    );
    assert!(text(&out).contains("nothing changed"), "{}", text(&out));
    let same = app.keys().get("Job", &key).await.unwrap().unwrap();
    assert_eq!(same.provider_key, old, "a dry run changed nothing");
    assert!(same.provider_key_changes.is_empty());

    // Replaced: the warning goes (the new key was never sent), the replay runs.
    args.pop();
    let out = aqw(
        app.path(),
        &args[..4]
            .iter()
            .chain(&by_reason)
            .copied()
            .collect::<Vec<_>>(),
    );
    assert!(out.status.success(), "{}", text(&out));
    let new = app
        .keys()
        .get("Job", &key)
        .await
        .unwrap()
        .unwrap()
        .provider_key;
    assert_ne!(new, old);
    let dry = text(&aqw(
        app.path(),
        &["poison", "replay", &q, "--id", &refused, "--dry-run"],
    ));
    assert!(!dry.contains("saves failures"), "{dry}");
    fixed.store(true, Ordering::SeqCst);
    let args = [
        "poison", "replay", &q, "--id", &refused, "--by", "dave", "--wait", "00:01:00",
    ];
    let out = aqw(app.path(), &args);
    assert!(out.status.success(), "{}", text(&out));

    // The report names the replacement: who, why, old and new.
    let report = json_of(&aqw(
        app.path(),
        &["poison", "report", &q, "--output", "json"],
    ));
    let changes = report["providerKeyChanges"].as_array().unwrap();
    assert_eq!(changes.len(), 1, "{report:#}");
    let c = &changes[0];
    assert_eq!(
        (c["key"].as_str(), c["by"].as_str(), c["reason"].as_str()),
        (
            Some("pay:o-refused"),
            Some("dave"),
            Some("ledger: no charge (ticket 7)")
        )
    );
    assert_eq!(
        (c["old"].as_str(), c["new"].as_str()),
        (Some(old.as_str()), Some(new.as_str()))
    );
    let shown = text(&aqw(app.path(), &["poison", "report", &q]));
    assert!(shown.contains("provider keys replaced: 1"), "{shown}");
    assert!(
        shown.contains("pay:o-refused at ")
            && shown.contains(&format!(
                "by dave: {old} -> {new}; why: ledger: no charge (ticket 7)"
            )),
        "{shown}"
    );
    w.stop().await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_saving_provider_is_warned_about_without_evidence() {
    let sink = Sink::start().await;
    sink.fail_with(402);
    let app = http_app(&sink, json!({"savesFailures": true}));
    app.enqueue(r#"{"order":"o-d"}"#).await;
    let w = app.start_configured_worker();
    let [id] = <[String; 1]>::try_from(open_records(&app, 1).await).unwrap();
    w.stop().await;
    let q = app.queue.as_str();
    let dry = text(&aqw(
        app.path(),
        &["poison", "replay", q, "--id", &id, "--dry-run"],
    ));
    assert!(
        dry.contains("! the provider saves failures (declared (handler.savesFailures))"),
        "{dry}"
    );
    let out = aqw(
        app.path(),
        &[
            "poison",
            "replay",
            q,
            "--id",
            &id,
            "--dry-run",
            "--output",
            "json",
        ],
    );
    let item = &json_of(&out)["items"][0];
    assert_eq!(
        item["savedFailure"], "declared (handler.savesFailures)",
        "{item:#}"
    );
    app.cleanup().await;
}

/// Run `aqw` and wait for it at most `deadline`: None (killed) if it runs longer.
fn aqw_within(
    app: &std::path::Path,
    args: &[String],
    deadline: Duration,
) -> Option<std::process::Output> {
    let mut child = std::process::Command::new(aqw_bin())
        .args(args)
        .arg("--app")
        .arg(app)
        .env("AzureWebJobsStorage", "UseDevelopmentStorage=true")
        .env_remove("AQW_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run aqw");
    let end = std::time::Instant::now() + deadline;
    while std::time::Instant::now() < end {
        if child.try_wait().expect("wait").is_some() {
            return Some(child.wait_with_output().expect("output"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_returns_when_the_job_is_poisoned_again_and_the_report_links_both_records() {
    let app = TestApp::new(json!({"key": "pay:{/order}"}), json!({}), json!({}));
    let q = app.queue.clone();
    let h = Scripted::new(|_, _| Err(HandlerError::permanent("HTTP 422: amount is not a number")));
    let w = app.start_worker(h);
    app.enqueue(r#"{"order":"o-w","amount":"x"}"#).await;
    let [first] = <[String; 1]>::try_from(open_records(&app, 1).await).unwrap();

    // --wait of ten minutes; the job is poisoned again within a second.
    let args = [
        "poison", "replay", &q, "--id", &first, "--by", "op", "--wait", "00:10:00",
    ];
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let dir = app.path().to_path_buf();
    let out = tokio::task::spawn_blocking(move || aqw_within(&dir, &args, DEADLINE * 2))
        .await
        .unwrap()
        .expect("--wait returned before its ten minutes");
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "poisoned again: {said}");
    let again = open_records(&app, 1).await.remove(0);
    assert_ne!(again, first);
    assert!(
        said.contains(&format!(
            "[POISONED AGAIN as {again} (permanent): HTTP 422: amount is not a number]"
        )),
        "{said}"
    );
    assert!(
        said.contains("1 poisoned again, 0 not confirmed done"),
        "{said}"
    );
    w.stop().await;

    // Closed for good: the report links both records and its totals add up.
    let discard = [
        "poison",
        "discard",
        &q,
        "--id",
        &again,
        "--reason",
        "bad amount",
        "--by",
        "op",
        "--close-key",
    ];
    let out = aqw(app.path(), &discard);
    assert!(out.status.success(), "{}", text(&out));
    let out = aqw(app.path(), &["poison", "report", &q, "--output", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let report = json_of(&out);
    let row = |id: &str| {
        report["records"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == id)
            .unwrap()
            .clone()
    };
    assert_eq!(row(&first)["created"], json!(again), "{report:#}");
    assert_eq!(row(&again)["createdBy"], json!(first), "{report:#}");
    let t = &report["totals"];
    assert_eq!(t["keys"], 1, "{t}");
    assert_eq!(t["keysCancelled"], 1, "{t}");
    let sum: u64 = [
        "keysDoneOnce",
        "keysDoneMoreThanOnce",
        "keysNotDone",
        "uncertain",
        "keysCancelled",
    ]
    .iter()
    .map(|k| t[*k].as_u64().unwrap())
    .sum();
    assert_eq!(sum, 1, "every key counted once: {t}");
    let shown = text(&aqw(app.path(), &["poison", "report", &q]));
    assert!(
        shown.contains(&format!(
            "created:   message {again} was poisoned again as record {again}"
        )),
        "{shown}"
    );
    assert!(
        shown.contains(&format!("from:      the replay or fix of record {first}")),
        "{shown}"
    );
    assert!(
        shown.contains("1 key(s): 0 done exactly once, 0 done more than once, 0 not done, 0 still uncertain, 1 cancelled"),
        "{shown}"
    );
    app.cleanup().await;
}
