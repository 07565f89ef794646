//! Durable group operations (issue 40) with the real binary on Azurite: an
//! `aqw ops discard` killed (SIGKILL) mid-run is taken over by another
//! process and each record is discarded once; a cancel from another process
//! stops it before its next record; it halts when the function's breaker
//! opens; bad input exits 2 naming the value.

use crate::common::*;
use aqw::control::ControlStore;
use aqw::message::{ErrorInfo, ErrorKind, MessageEncoding};
use aqw::ops::operation::{OpState, Operation, OperationStore};
use aqw::poison::{PoisonEnvelope, PoisonRecord, RecordStatus};
use aqw::storage::{Storage, Ttl};
use futures::StreamExt as _;
use serde_json::json;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn app() -> TestApp {
    TestApp::new(json!({"key": "order:{/orderId}"}), json!({}), json!({}))
}

/// `n` open records, each with its envelope copy on `<queue>-poison`.
async fn poisoned(app: &TestApp, n: usize) {
    app.records().create_if_missing().await.unwrap();
    app.poison_queue().create_if_missing().await.unwrap();
    let ids: Vec<String> = (0..n).map(|i| format!("rec-{i:03}")).collect();
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
            key: aqw::idempotency::IdempotencyKey::new(format!("order:{id}")).ok(),
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

fn store(app: &TestApp) -> OperationStore {
    OperationStore::new(app.storage().table(&app.control_table))
}

/// `aqw ARGS` as a child process of its own.
fn spawn(app: &TestApp, args: &[&str]) -> Child {
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

async fn records_in(app: &TestApp, status: RecordStatus) -> Vec<PoisonRecord> {
    let ops = aqw::ops::QueueOps::new(app.config.clone(), &app.queue, &app.storage());
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
