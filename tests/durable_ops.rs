//! Durable group operations (issue 40) with the real binary on Azurite: an
//! `aqw ops discard` killed (SIGKILL) mid-run is taken over by another
//! process and each record is discarded once; a cancel from another process
//! stops it before its next record; it halts when the function's breaker
//! opens; bad input exits 2 naming the value. A group fix (`aqw ops fix`,
//! one JSON Patch) corrects a bad producer's batch and a real `aqw run`
//! runs each corrected job once; `aqw poison replay --all` is an operation;
//! an operation created with `--detach` is carried out by an idle `aqw run`.

use crate::common::*;
use aqw_core::control::ControlStore;
use aqw_core::message::{ErrorInfo, ErrorKind, MessageEncoding};
use aqw_core::ops::operation::{OpState, Operation, OperationStore};
use aqw_core::poison::{PoisonEnvelope, PoisonRecord, RecordStatus};
use aqw_core::storage::{Storage, Ttl};
use futures::StreamExt as _;
use serde_json::json;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn app() -> TestApp {
    TestApp::new(json!({"key": "order:{/orderId}"}), json!({}), json!({}))
}

/// `n` open records, each with its envelope copy on `<queue>-poison`.
pub(crate) async fn poisoned(app: &TestApp, n: usize) {
    poisoned_named(app, "rec", n).await
}

/// [`poisoned`], the records' ids (and order ids) starting with `prefix`.
async fn poisoned_named(app: &TestApp, prefix: &str, n: usize) {
    app.records().create_if_missing().await.unwrap();
    app.poison_queue().create_if_missing().await.unwrap();
    let ids: Vec<String> = (0..n).map(|i| format!("{prefix}-{i:03}")).collect();
    futures::stream::iter(ids.iter().map(|id| async move {
        let env = PoisonEnvelope {
            aqw: "poison/1".into(),
            queue: app.queue.clone(),
            function: "Job".into(),
            message_id: id.clone(),
            inserted_at: "2026-12-03T10:00:00Z".into(),
            dequeue_count: 5,
            first_attempt_at: "2026-12-03T10:00:00Z".into(),
            poisoned_at: "2026-12-03T10:05:00Z".into(),
            key: aqw_core::idempotency::IdempotencyKey::new(format!("order:{id}")).ok(),
            error: ErrorInfo {
                kind: ErrorKind::Permanent,
                message: "HTTP 422 refused".into(),
            },
            message: Some(format!(r#"{{"orderId":"{id}"}}"#)),
            record: None,
            encoding: MessageEncoding::None,
        };
        let text = env.to_queue_text(&app.poison_table);
        let rec = PoisonRecord::open(env, "aqw", None);
        app.records()
            .insert(&app.queue, id, &rec.to_entity())
            .await
            .unwrap();
        let q = app.poison_queue();
        q.put(&text, Duration::ZERO, Ttl::Default).await.unwrap();
    }))
    .buffer_unordered(16)
    .collect::<Vec<()>>()
    .await;
}

pub(crate) fn store(app: &TestApp) -> OperationStore {
    OperationStore::new(app.storage().table(&app.control_table))
}

/// `aqw ARGS` as a child process of its own.
pub(crate) fn spawn(app: &TestApp, args: &[&str]) -> Child {
    Command::new(aqw_bin())
        .args(args)
        .arg("--app")
        .arg(app.path())
        .env("AzureWebJobsStorage", CONN)
        .env_remove("AQW_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start aqw")
}

/// The only operation of the app, once its row shows `done` records.
async fn progressed(app: &TestApp, done: u64) -> Operation {
    eventually(
        "the operation's progress",
        Duration::from_secs(60),
        || async {
            let ops = store(app).list().await.unwrap();
            ops.into_iter().find(|o| o.done >= done)
        },
    )
    .await
}

pub(crate) async fn records_in(app: &TestApp, status: RecordStatus) -> Vec<PoisonRecord> {
    let ops = aqw_core::ops::QueueOps::new(app.config.clone(), &app.queue, &app.storage());
    let all = ops.records().await.unwrap();
    all.into_iter().filter(|r| r.status == status).collect()
}

fn wait_exit(child: &mut Child, within: Duration) -> Option<i32> {
    let end = std::time::Instant::now() + within;
    while std::time::Instant::now() < end {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    panic!("aqw did not exit within {within:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_discard_is_taken_over_by_another_process_each_record_once() {
    let app = app();
    poisoned(&app, 40).await;
    let q = app.queue.clone();
    let args = [
        "ops",
        "discard",
        &q,
        "--reason",
        "refused for good",
        "--rate",
        "10",
        "--by",
        "alice",
    ];
    let mut first = spawn(&app, &args);
    let op = progressed(&app, 8).await;
    first.kill().unwrap();
    first.wait().unwrap();

    let held = aqw(app.path(), &["ops", "resume", &op.id]);
    assert_eq!(
        held.status.code(),
        Some(2),
        "the dead process's lease still holds"
    );
    assert!(String::from_utf8_lossy(&held.stderr).contains("is held by"));
    let out = aqw(
        app.path(),
        &["ops", "resume", &op.id, "--take-over", "--output", "json"],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let end: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(end["state"], "done", "{end}");
    assert_eq!(
        (end["skipped"].as_u64(), end["failed"].as_u64()),
        (Some(0), Some(0)),
        "{end}"
    );

    let discarded = records_in(&app, RecordStatus::Discarded).await;
    assert_eq!(discarded.len(), 40, "every record, none left open");
    for r in &discarded {
        let by = r.discarded_by.as_deref().unwrap_or_default();
        assert!(
            by.starts_with("alice (operation ") && by.contains(&op.id),
            "{by}"
        );
    }
    assert_eq!(
        TestApp::exact_count(app.poison_queue().as_ref()).await,
        0,
        "copies swept"
    );
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_from_another_process_stops_it_before_the_next_record() {
    let app = app();
    poisoned(&app, 40).await;
    let q = app.queue.clone();
    let args = [
        "ops", "discard", &q, "--reason", "refused", "--rate", "4", "--by", "alice",
    ];
    let mut running = spawn(&app, &args);
    let op = progressed(&app, 3).await;
    let out = aqw(app.path(), &["ops", "cancel", &op.id, "--by", "bob"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let at_cancel = records_in(&app, RecordStatus::Discarded).await.len();
    assert_eq!(
        wait_exit(&mut running, Duration::from_secs(20)),
        Some(1),
        "cancelled: exit 1"
    );
    let after = records_in(&app, RecordStatus::Discarded).await.len();
    assert!(
        after <= at_cancel + 1 && after < 40,
        "{at_cancel} then {after}"
    );

    let show = aqw(app.path(), &["ops", "show", &op.id, "--output", "json"]);
    assert_eq!(show.status.code(), Some(1));
    let row: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(
        (row["state"].as_str(), row["stopReason"].as_str()),
        (Some("cancelled"), Some("cancelled by bob"))
    );
    let list = aqw(app.path(), &["ops", "list"]);
    assert!(String::from_utf8_lossy(&list.stdout).contains(&op.id));
    let again = aqw(app.path(), &["ops", "cancel", &op.id, "--by", "bob"]);
    assert_eq!(again.status.code(), Some(2), "already cancelled");
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_halts_when_the_functions_breaker_opens() {
    let app = app();
    poisoned(&app, 40).await;
    let q = app.queue.clone();
    let args = ["ops", "replay", &q, "--rate", "4", "--by", "alice"];
    let mut running = spawn(&app, &args);
    let op = progressed(&app, 3).await;
    ControlStore::new(app.storage().table(&app.control_table))
        .publish_breaker("Job", "open", "8 of 10 calls failed", "w-1", None)
        .await
        .unwrap();
    assert_eq!(
        wait_exit(&mut running, Duration::from_secs(20)),
        Some(1),
        "halted: exit 1"
    );
    let (row, _) = store(&app).get(&op.id).await.unwrap().unwrap();
    assert_eq!(row.state, OpState::Halted, "{row:?}");
    let why = row.stop_reason.unwrap_or_default();
    assert!(
        why.contains("breaker of Job is open") && why.contains("8 of 10"),
        "{why}"
    );
    assert!(
        records_in(&app, RecordStatus::Open).await.len() > 20,
        "it stopped early"
    );
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_operation_input_exits_2_naming_the_value() {
    let app = app();
    let q = app.queue.clone();
    for (args, named) in [
        (
            vec!["ops", "discard", &q, "--reason", "r", "--rate", "0"],
            "--rate 0",
        ),
        (vec!["ops", "replay", &q, "--rate", "NaN"], "--rate NaN"),
        (vec!["ops", "replay", &q, "--error", "("], "--error"),
        (vec!["ops", "replay", "nosuchqueue"], "nosuchqueue"),
        (vec!["ops", "show", "no-such-op"], "no operation no-such-op"),
        (
            vec!["ops", "replay", &q, "--reviewed", "abc"],
            "--reviewed abc",
        ),
    ] {
        let mut args = args;
        if args[1] != "show" {
            args.extend(["--by", "alice"]);
        }
        let out = aqw(app.path(), &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(named), "{args:?}: {err}");
    }
    app.cleanup().await;
}

/// An app whose handler posts to `sink`'s `/effects`.
pub(crate) fn app_to(sink: &Sink) -> TestApp {
    let handler =
        json!({"type": "http", "url": format!("{}/effects", sink.url), "timeout": "00:00:05"});
    TestApp::new(
        json!({"key": "order:{/orderId}", "handler": handler}),
        json!({}),
        json!({}),
    )
}

pub(crate) fn out_of(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A producer left out `currency`: `aqw ops fix` with one patch puts each
/// record's corrected payload in its place (records replaced, naming the
/// operation), and a real `aqw run` applies each corrected job once. Bad
/// patches exit 2 naming the flag, with nothing created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_fix_corrects_a_batch_and_a_real_worker_runs_each_once() {
    let sink = Sink::start().await;
    let app = app_to(&sink);
    poisoned(&app, 6).await;
    let q = app.queue.clone();
    for (patch, named) in [
        ("{}", "--patch: not a JSON Patch"),
        ("[]", "--patch: the patch has no operations"),
        (
            r#"[{"op":"shout","path":"/a"}]"#,
            "--patch: not a JSON Patch",
        ),
    ] {
        let out = aqw(
            app.path(),
            &["ops", "fix", &q, "--patch", patch, "--by", "a"],
        );
        assert_eq!(out.status.code(), Some(2), "{patch}: {}", out_of(&out));
        assert!(out_of(&out).contains(named), "{}", out_of(&out));
    }
    let missing = aqw(
        app.path(),
        &[
            "ops",
            "fix",
            &q,
            "--patch-file",
            "/no/such/patch.json",
            "--by",
            "a",
        ],
    );
    assert_eq!(missing.status.code(), Some(2), "{}", out_of(&missing));
    assert!(
        store(&app).list().await.unwrap().is_empty(),
        "nothing created"
    );

    let patch = r#"[{"op":"add","path":"/currency","value":"EUR"}]"#;
    let dry = aqw(
        app.path(),
        &[
            "ops",
            "fix",
            &q,
            "--patch",
            patch,
            "--by",
            "alice",
            "--dry-run",
        ],
    );
    let text = out_of(&dry);
    assert_eq!(dry.status.code(), Some(0), "{text}");
    assert!(text.contains("fix      -> key order:rec-000"), "{text}");
    assert!(text.contains("the patch fits 6 of 6 record(s)"), "{text}");
    assert!(
        store(&app).list().await.unwrap().is_empty(),
        "a dry run creates nothing"
    );
    let out = aqw(
        app.path(),
        &[
            "ops", "fix", &q, "--patch", patch, "--by", "alice", "--output", "json",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", out_of(&out));
    let op: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (
            op["state"].as_str(),
            op["done"].as_u64(),
            op["kind"]["kind"].as_str()
        ),
        (Some("done"), Some(6), Some("fix")),
        "{op}"
    );
    let id = op["id"].as_str().unwrap().to_string();
    let replaced = records_in(&app, RecordStatus::Replaced).await;
    assert_eq!(replaced.len(), 6);
    for r in &replaced {
        let by = r.replaced_by.as_deref().unwrap_or_default();
        assert!(by.contains(&id) && by.contains("alice"), "{by}");
    }
    let mut run = spawn(&app, &["run"]);
    let applied = eventually(
        "six corrected jobs applied",
        Duration::from_secs(60),
        || async {
            let done = sink.applied_effects("/effects");
            (done.len() >= 6).then_some(done)
        },
    )
    .await;
    let _ = run.kill();
    let _ = run.wait();
    assert_eq!(applied.len(), 6, "each once");
    for r in &applied {
        assert!(r.body.contains(r#""currency":"EUR""#), "{}", r.body);
    }
    let keys: std::collections::HashSet<_> =
        applied.iter().map(|r| r.business_key.clone()).collect();
    assert_eq!(keys.len(), 6, "six keys: {keys:?}");
    app.cleanup().await;

    // A keyless function takes no group fix: a corrected job put twice
    // would run twice.
    let keyless = TestApp::new(json!({"key": "none"}), json!({}), json!({}));
    let out = aqw(
        keyless.path(),
        &["ops", "fix", &keyless.queue, "--patch", patch, "--by", "a"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", out_of(&out));
    assert!(out_of(&out).contains("keyless"), "{}", out_of(&out));
    keyless.cleanup().await;
}

/// `aqw poison replay --all` is carried out as an operation (its JSON names
/// it, `ops show` has it done); an operation created with `--detach` is
/// taken by a real, idle `aqw run` within its scan and finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_all_is_an_operation_and_an_idle_run_carries_out_a_detached_one() {
    let sink = Sink::start().await;
    let app = app_to(&sink);
    poisoned_named(&app, "rep", 4).await;
    let q = app.queue.clone();
    let out = aqw(
        app.path(),
        &[
            "poison",
            "replay",
            &q,
            "--all",
            "--uncertain-checked",
            "--by",
            "alice",
            "--output",
            "json",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", out_of(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["replayed"], 4, "{report}");
    let id = report["operation"]
        .as_str()
        .expect("the operation")
        .to_string();
    let show = aqw(app.path(), &["ops", "show", &id, "--output", "json"]);
    let op: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(
        (op["state"].as_str(), op["done"].as_u64()),
        (Some("done"), Some(4)),
        "{op}"
    );

    poisoned_named(&app, "dis", 5).await;
    let out = aqw(
        app.path(),
        &[
            "ops",
            "discard",
            &q,
            "--reason",
            "refused for good",
            "--detach",
            "--by",
            "bob",
            "--output",
            "json",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", out_of(&out));
    let queued: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(queued["state"], "queued", "{queued}");
    let detached = queued["id"].as_str().unwrap().to_string();
    let mut run = spawn(&app, &["run"]);
    let done = eventually(
        "an idle aqw run carries out the detached operation",
        Duration::from_secs(90),
        || async {
            let (op, _) = store(&app).get(&detached).await.unwrap()?;
            (op.state == OpState::Done).then_some(op)
        },
    )
    .await;
    let _ = run.kill();
    let _ = run.wait();
    assert_eq!(done.done, 5, "{done:?}");
    let owner = done.lease_owner.clone().unwrap_or_default();
    assert!(
        !owner.starts_with("cli-"),
        "a worker carried it out: {owner}"
    );
    let discarded = records_in(&app, RecordStatus::Discarded).await;
    assert_eq!(discarded.len(), 5);
    assert!(discarded.iter().all(|r| r
        .discarded_by
        .as_deref()
        .unwrap_or_default()
        .contains(&detached)));
    app.cleanup().await;
}
