//! Durable group operations (issue 40): an operation row carried out by
//! whoever holds its lease. An executor killed mid-run is resumed by
//! another after its lease expires and each record is handled once; a
//! cancel from another store handle stops it before its next record; it
//! halts itself when the breaker opens or its replayed jobs come back
//! poisoned; records poisoned after its creation are not its own. A group
//! fix (one JSON Patch for a bad producer's batch) killed mid-run runs each
//! corrected job once; `poison replay --all` is an operation that keeps
//! its limit; a kind this aqw does not know is never run. A fix whose
//! patch would grow each payload past its bound (a copy bomb) is refused
//! record by record and its executor lives on; an operation whose
//! executors keep dying holding its lease is halted, never taken again.

use crate::common::*;
use aqw_core::alert::{AlertEvent, Alerts};
use aqw_core::control::ControlStore;
use aqw_core::ops::operation::{
    execute, replay_group, resume_idle, Claim, ExecuteOptions, NewOperation, OpKind, OpState,
    Operation, OperationStore, Selection, LEASE, MAX_TAKEOVERS,
};
use aqw_core::ops::{ReplayAction, ReplayOptions};
use aqw_core::poison::RecordStatus;
use aqw_core::storage::Storage;
use std::time::Duration;

const REFUSED: &str = "HTTP 422: refused for good";

/// `n` jobs poisoned at their first attempt (a permanent refusal); their keys.
async fn poisoned(env: &Env, n: usize) -> Vec<String> {
    let keys = env.enqueue_many("p", n).await;
    let w = start(env.worker());
    env.wait_until("every job poisoned", minutes(10), || async {
        env.records().await.len() == n && env.source_depth().await == 0
    })
    .await;
    w.stop().await;
    keys
}

fn store(env: &Env) -> OperationStore {
    OperationStore::new(env.storage.table(&env.control_table))
}

fn executor(owner: &str) -> ExecuteOptions {
    ExecuteOptions::new(owner)
}

async fn create(env: &Env, kind: OpKind, n: u64, rate: f64) -> Operation {
    let new = NewOperation {
        queue: env.queue.clone(),
        kind,
        by: "oncall".into(),
        selection: Selection::default(),
        fingerprint: "reviewed".into(),
        selected: n,
        rate,
        halt_after: 3,
    };
    store(env).create(&new).await.expect("create the operation")
}

fn discard_kind() -> OpKind {
    OpKind::Discard {
        reason: "refused for good".into(),
        close_key: false,
    }
}

fn replay_kind() -> OpKind {
    OpKind::Replay {
        past_provider_window: false,
        uncertain_checked: false,
    }
}

async fn row(env: &Env, id: &str) -> Operation {
    store(env).get(id).await.expect("read").expect("the row").0
}

/// Spawn an executor of `id` on its own task (a process of its own, as
/// far as the store can tell).
fn spawn(env: &Env, id: &str, owner: &str) -> tokio::task::JoinHandle<Option<Operation>> {
    let (ops, st, id, opts) = (env.ops(), store(env), id.to_string(), executor(owner));
    tokio::spawn(async move { execute(&ops, &st, &id, &opts).await.expect("execute") })
}

async fn wait_done_at_least(env: &Env, id: &str, n: u64) {
    env.wait_until("the operation's progress", minutes(5), || async {
        row(env, id).await.done >= n
    })
    .await;
}

/// Run an executor of `id` until `done` records are handled, kill it (its
/// task aborted, as by SIGKILL), and wait out its lease.
async fn kill_after(env: &Env, id: &str, done: u64) {
    let first = spawn(env, id, "worker-a");
    wait_done_at_least(env, id, done).await;
    first.abort();
    let _ = first.await;
    tokio::time::sleep(LEASE).await;
}

/// Run the replayed jobs: each of `keys` applied once, and each record
/// replayed and closed once.
async fn assert_each_replayed_job_ran_once(env: &Env, keys: &[String]) {
    let w = start(env.worker());
    env.drained(minutes(5)).await;
    tokio::time::sleep(minutes(1)).await;
    w.stop().await;
    env.provider.assert_applied_once(keys);
    for r in env.records().await {
        assert_eq!(r.status, RecordStatus::Replayed, "{}", env.dump().await);
        assert_eq!(r.replay_count, 1, "closed once: {r:?}");
    }
}

/// Killed after 7 of 20 records, the executor's lease holds the operation
/// until it expires; then another executor resumes it, and every record is
/// discarded once (no record is seen closed twice, none left open), each
/// naming the operation, and every poison-queue copy is gone.
#[tokio::test(start_paused = true)]
async fn a_discard_killed_mid_run_is_resumed_and_closes_each_record_once() {
    let env = Env::new(|_, _| Behave::Fail(REFUSED.into()));
    poisoned(&env, 20).await;
    let op = create(&env, discard_kind(), 20, 5.0).await;
    let first = spawn(&env, &op.id, "worker-a");
    wait_done_at_least(&env, &op.id, 7).await;
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    let left = row(&env, &op.id).await;
    assert_eq!(left.state, OpState::Running);
    assert!(left.done >= 7 && left.done < 20, "{left:?}");

    let (ops, st) = (env.ops(), store(&env));
    let early = execute(&ops, &st, &op.id, &executor("worker-b")).await;
    assert_eq!(
        early.unwrap(),
        None,
        "the dead executor's lease still holds"
    );
    tokio::time::sleep(LEASE).await;
    let end = execute(&ops, &st, &op.id, &executor("worker-b"))
        .await
        .expect("resume")
        .expect("the lease expired: worker-b runs it");
    assert_eq!(end.state, OpState::Done, "{end:?}");
    assert_eq!(
        (end.skipped, end.failed),
        (0, 0),
        "nothing seen twice: {end:?}"
    );
    let records = env.records().await;
    assert_eq!(records.len(), 20);
    for r in &records {
        assert_eq!(r.status, RecordStatus::Discarded, "{}", env.dump().await);
        let by = r.discarded_by.as_deref().unwrap_or_default();
        assert!(by.contains(&op.id), "the record names the operation: {by}");
    }
    // At most the one record in flight at the kill is missing from the counts.
    assert!(end.done >= 19 && end.done <= 20, "{end:?}");
    assert_eq!(env.poison_depth().await, 0, "the sweep deleted every copy");
    assert_eq!(row(&env, &op.id).await.state, OpState::Done);
}

/// A replay killed mid-run and resumed: each job's effect happens once,
/// each record is closed once with one replay.
#[tokio::test(start_paused = true)]
async fn a_replay_killed_mid_run_is_resumed_and_runs_each_job_once() {
    let env = Env::new(|_, _| Behave::Fail(REFUSED.into()));
    let keys = poisoned(&env, 12).await;
    env.provider.set_rule(|_, _| Behave::Succeed);
    let op = create(&env, replay_kind(), 12, 4.0).await;
    kill_after(&env, &op.id, 5).await;
    let app = env.app();
    let storage: &dyn Storage = &env.storage;
    let ran = resume_idle(&app, storage, &executor("worker-b")).await;
    assert_eq!(ran.expect("resume"), 1, "an idle worker picked it up");
    assert_eq!(row(&env, &op.id).await.state, OpState::Done);

    assert_each_replayed_job_ran_once(&env, &keys).await;
}

/// A cancel written through another handle on the store stops the
/// executor before its next record; records handled stay handled.
#[tokio::test(start_paused = true)]
async fn a_cancel_from_another_process_stops_it_before_the_next_record() {
    let env = Env::new(|_, _| Behave::Fail(REFUSED.into()));
    poisoned(&env, 20).await;
    let op = create(&env, discard_kind(), 20, 2.0).await;
    let run = spawn(&env, &op.id, "worker-a");
    wait_done_at_least(&env, &op.id, 3).await;
    let other = OperationStore::new(env.storage.table(&env.control_table));
    let cancelled = other.cancel(&op.id, "bob").await.unwrap().expect("cancel");
    assert_eq!(cancelled.state, OpState::Cancelled);
    let closed_at_cancel = discarded(&env).await;
    let end = run.await.unwrap().expect("it ran");
    assert_eq!(end.state, OpState::Cancelled, "{end:?}");
    assert_eq!(end.stop_reason.as_deref(), Some("cancelled by bob"));
    tokio::time::sleep(minutes(1)).await;
    let closed = discarded(&env).await;
    assert!(
        closed <= closed_at_cancel + 1 && closed < 20,
        "at most the record in flight after the cancel: {closed_at_cancel} then {closed}"
    );
    let again = other.cancel(&op.id, "bob").await.unwrap();
    let refused = again.unwrap_err();
    assert!(matches!(
        refused,
        aqw_core::ops::operation::CancelRefusal::Finished {
            state: aqw_core::ops::operation::OpState::Cancelled,
            ..
        }
    ));
    assert!(refused.to_string().contains("already cancelled"));
    let ops = env.ops();
    let rerun = execute(&ops, &other, &op.id, &executor("worker-b")).await;
    assert_eq!(
        rerun.unwrap(),
        None,
        "a cancelled operation never runs again"
    );
}

async fn discarded(env: &Env) -> usize {
    let records = env.records().await;
    records
        .iter()
        .filter(|r| r.status == RecordStatus::Discarded)
        .count()
}

/// The target function's breaker opens (another worker published it): the
/// operation halts with the reason on its row.
#[tokio::test(start_paused = true)]
async fn it_halts_when_the_functions_breaker_opens() {
    let env = Env::new(|_, _| Behave::Fail(REFUSED.into()));
    poisoned(&env, 20).await;
    env.provider.set_rule(|_, _| Behave::Succeed);
    let op = create(&env, replay_kind(), 20, 2.0).await;
    let run = spawn(&env, &op.id, "worker-a");
    wait_done_at_least(&env, &op.id, 3).await;
    ControlStore::new(env.storage.table(&env.control_table))
        .publish_breaker(&env.function, "open", "5 of 5 calls failed", "w-9", None)
        .await
        .unwrap();
    let end = run.await.unwrap().expect("it ran");
    assert_eq!(end.state, OpState::Halted, "{end:?}");
    let why = end.stop_reason.clone().unwrap_or_default();
    assert!(
        why.contains("breaker") && why.contains("5 of 5 calls failed"),
        "{why}"
    );
    assert!(end.done < 20, "{end:?}");
    let stored = row(&env, &op.id).await;
    assert_eq!(stored.stop_reason.as_deref(), Some(why.as_str()));
}

/// The replayed jobs fail again (the cause is not fixed): once three of
/// them are back in the poison table, the operation halts.
#[tokio::test(start_paused = true)]
async fn it_halts_when_its_replayed_jobs_come_back_poisoned() {
    let env = Env::new(|_, _| Behave::Fail(REFUSED.into()));
    poisoned(&env, 30).await;
    let w = start(env.worker());
    let op = create(&env, replay_kind(), 30, 1.0).await;
    let end = spawn(&env, &op.id, "worker-a")
        .await
        .unwrap()
        .expect("it ran");
    w.stop().await;
    assert_eq!(end.state, OpState::Halted, "{end:?}");
    assert!(end.returned_poisoned >= 3, "{end:?}");
    assert!(end.done < 30, "it stopped early: {end:?}");
    let why = end.stop_reason.unwrap_or_default();
    assert!(why.contains("came back poisoned"), "{why}");
}

/// A record poisoned after the operation was created is not its own.
#[tokio::test(start_paused = true)]
async fn records_poisoned_after_its_creation_are_left_alone() {
    let env = Env::new(|_, _| Behave::Fail(REFUSED.into()));
    poisoned(&env, 3).await;
    let op = create(&env, discard_kind(), 3, 50.0).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let late = env.job("late");
    env.enqueue(&late).await;
    let w = start(env.worker());
    env.wait_until("the late job poisoned", minutes(5), || async {
        env.records().await.len() == 4
    })
    .await;
    w.stop().await;
    let (ops, st) = (env.ops(), store(&env));
    let end = execute(&ops, &st, &op.id, &executor("a"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((end.state, end.done), (OpState::Done, 3), "{end:?}");
    let open: Vec<_> = env
        .records()
        .await
        .into_iter()
        .filter(|r| r.status == RecordStatus::Open)
        .collect();
    assert_eq!(open.len(), 1);
    assert_eq!(open[0].key.as_deref(), Some(late.key.as_str()));
}

/// An operator takes over a lease still held (`aqw ops resume --take-over`):
/// the old executor, still alive, stops at its next record, and each record
/// is discarded once between the two.
#[tokio::test(start_paused = true)]
async fn a_take_over_stops_the_live_holder_at_its_next_record() {
    let env = Env::new(|_, _| Behave::Fail(REFUSED.into()));
    poisoned(&env, 16).await;
    let op = create(&env, discard_kind(), 16, 4.0).await;
    let old = spawn(&env, &op.id, "worker-a");
    wait_done_at_least(&env, &op.id, 4).await;
    let (ops, st) = (env.ops(), store(&env));
    let mut opts = executor("operator");
    opts.take_over = true;
    let (new_end, old_end) = tokio::join!(execute(&ops, &st, &op.id, &opts), old);
    let new_end = new_end.expect("take over").expect("it ran");
    let old_end = old_end.unwrap().expect("it ran");
    assert_eq!(new_end.state, OpState::Done, "{new_end:?}");
    assert_ne!(
        old_end.lease_owner.as_deref(),
        Some("worker-a"),
        "{old_end:?}"
    );
    assert_eq!(new_end.failed, 0, "{new_end:?}");
    assert!(
        new_end.skipped <= 1,
        "at most the one record both had in hand: {new_end:?}"
    );
    assert_eq!(discarded(&env).await, 16);
    for r in env.records().await {
        assert!(r.discarded_by.unwrap_or_default().contains(&op.id));
    }
}

/// A bad producer left out `currency`: one patch adds it to each of its
/// jobs. Killed mid-run and resumed after its lease, the group fix puts
/// each corrected job once in effect (a record fixed twice across the kill
/// has its second copy settled by the key); two jobs of another shape fail
/// the patch's `test` and stay open, each with why.
#[tokio::test(start_paused = true)]
async fn a_group_fix_killed_mid_run_runs_each_corrected_job_once() {
    let env = Env::new(|job, _| {
        if job.payload.contains("\"currency\"") {
            Behave::Succeed
        } else {
            Behave::Fail(REFUSED.into())
        }
    });
    let keys = env.enqueue_many("f", 12).await;
    for name in ["odd-1", "odd-2"] {
        env.enqueue(&env.job_with(name, serde_json::json!({"note": "other"})))
            .await;
    }
    let w = start(env.worker());
    env.wait_until("every job poisoned", minutes(10), || async {
        env.records().await.len() == 14 && env.source_depth().await == 0
    })
    .await;
    w.stop().await;
    let patch = r#"[{"op":"test","path":"/note","value":"exact text ✓"},
                    {"op":"add","path":"/currency","value":"EUR"}]"#;
    let kind = OpKind::Fix {
        patch: patch.into(),
        past_provider_window: false,
    };
    let op = create(&env, kind, 14, 2.0).await;
    kill_after(&env, &op.id, 4).await;
    let (ops, st) = (env.ops(), store(&env));
    let end = execute(&ops, &st, &op.id, &executor("worker-b"))
        .await
        .expect("resume")
        .expect("the lease expired");
    assert_eq!(end.state, OpState::Done, "{end:?}");
    assert!(end.skipped >= 2, "the two odd records: {end:?}");
    assert!(
        end.last_error
            .as_deref()
            .unwrap_or_default()
            .contains("did not match"),
        "{end:?}"
    );

    let w = start(env.worker());
    env.drained(minutes(5)).await;
    tokio::time::sleep(minutes(1)).await;
    w.stop().await;
    env.provider.assert_applied_once(&keys);
    let records = env.records().await;
    let replaced: Vec<_> = records
        .iter()
        .filter(|r| r.status == RecordStatus::Replaced)
        .collect();
    assert_eq!(replaced.len(), 12, "{}", env.dump().await);
    for r in replaced {
        let by = r.replaced_by.as_deref().unwrap_or_default();
        assert!(by.contains(&op.id), "the record names the operation: {by}");
    }
    let open: Vec<_> = records
        .iter()
        .filter(|r| r.status == RecordStatus::Open)
        .collect();
    assert_eq!(open.len(), 2, "the odd ones stay open");
    assert!(open.iter().all(|r| r.message.len() > 10));
}

/// `poison replay --all --limit 4` through an operation: the oldest four
/// replayed, each reported, the operation keeping the limit, the rest open.
#[tokio::test(start_paused = true)]
async fn replay_all_is_an_operation_that_keeps_its_limit() {
    let env = Env::new(|_, _| Behave::Fail(REFUSED.into()));
    poisoned(&env, 10).await;
    env.provider.set_rule(|_, _| Behave::Succeed);
    let opts = ReplayOptions {
        limit: Some(4),
        by: "oncall".into(),
        uncertain_checked: true,
        ..ReplayOptions::default()
    };
    let (ops, st) = (env.ops(), store(&env));
    let (op, report) = replay_group(&ops, &st, &opts, executor("cli"), &|_, _| {})
        .await
        .expect("replay");
    let op = op.expect("an operation");
    assert_eq!(op.state, OpState::Done, "{op:?}");
    assert_eq!((op.selected, op.done, op.selection.limit), (4, 4, Some(4)));
    assert_eq!(report.operation.as_deref(), Some(op.id.as_str()));
    assert_eq!((report.selected, report.replayed), (4, 4), "{report:?}");
    assert!(report
        .items
        .iter()
        .all(|i| i.action == ReplayAction::Replayed));
    let open = env.records().await;
    let open = open.iter().filter(|r| r.status == RecordStatus::Open);
    assert_eq!(open.count(), 6);
    let bad = ReplayOptions {
        rate: Some(5000.0),
        ..opts
    };
    let refused = replay_group(&ops, &st, &bad, executor("cli"), &|_, _| {}).await;
    assert!(refused.unwrap_err().to_string().contains("--rate 5000"));
    assert_eq!(st.list().await.unwrap().len(), 1, "nothing created");
    let none = ReplayOptions {
        filter: aqw_core::ops::Filter {
            error: Some(regex::Regex::new("matches nothing").unwrap()),
            ..Default::default()
        },
        rate: None,
        ..bad
    };
    let (op, report) = replay_group(&ops, &st, &none, executor("cli"), &|_, _| {})
        .await
        .expect("an empty replay");
    assert!(op.is_none() && report.selected == 0, "{report:?}");
    assert_eq!(st.list().await.unwrap().len(), 1, "no row for nothing");
}

/// A row of a kind a newer aqw wrote: listed as unknown, never claimed,
/// never resumed by an idle worker.
#[tokio::test(start_paused = true)]
async fn an_operation_of_an_unknown_kind_is_never_run() {
    let env = Env::new(|_, _| Behave::Fail(REFUSED.into()));
    poisoned(&env, 2).await;
    let op = create(&env, discard_kind(), 2, 5.0).await;
    let table = env.storage.table(&env.control_table);
    let mut kind = aqw_core::storage::Entity::new();
    kind.insert("Kind".into(), serde_json::json!("merge"));
    table
        .merge("operations", &op.id, &kind, None)
        .await
        .expect("rewrite the kind");
    let read = row(&env, &op.id).await;
    assert_eq!(
        read.kind,
        OpKind::Unknown {
            name: "merge".into()
        }
    );
    let (ops, st) = (env.ops(), store(&env));
    let ran = execute(&ops, &st, &op.id, &executor("a")).await.unwrap();
    assert_eq!(ran, None, "never claimed");
    let app = env.app();
    let storage: &dyn Storage = &env.storage;
    assert_eq!(resume_idle(&app, storage, &executor("b")).await.unwrap(), 0);
    let open = env.records().await;
    assert!(open.iter().all(|r| r.status == RecordStatus::Open));
}

/// At 80 records a second eight are in flight at once: killed mid-wave and
/// resumed, each job's effect still happens once and each record is closed
/// once.
#[tokio::test(start_paused = true)]
async fn a_fast_replay_with_records_in_flight_killed_and_resumed_runs_each_job_once() {
    let env = Env::new(|_, _| Behave::Fail(REFUSED.into()));
    let keys = poisoned(&env, 40).await;
    env.provider.set_rule(|_, _| Behave::Succeed);
    let op = create(&env, replay_kind(), 40, 80.0).await;
    kill_after(&env, &op.id, 12).await;
    let (ops, st) = (env.ops(), store(&env));
    let end = execute(&ops, &st, &op.id, &executor("worker-b"))
        .await
        .expect("resume")
        .expect("the lease expired");
    assert_eq!(end.state, OpState::Done, "{end:?}");
    assert_each_replayed_job_ran_once(&env, &keys).await;
}

/// `poison replay --all --limit 6` killed after two records and resumed by
/// another executor: the limit holds across the resume (kept as the time of
/// the sixth record), so exactly the six oldest are replayed.
#[tokio::test(start_paused = true)]
async fn a_limited_replay_resumed_after_a_kill_stops_at_its_limit() {
    let env = Env::new(|_, _| Behave::Fail(REFUSED.into()));
    let w = start(env.worker());
    for i in 0..10 {
        env.enqueue(&env.job(&format!("lim{i}"))).await;
        env.wait_until("poisoned", minutes(5), || async {
            env.records().await.len() == i + 1
        })
        .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    w.stop().await;
    env.provider.set_rule(|_, _| Behave::Succeed);
    let opts = ReplayOptions {
        limit: Some(6),
        rate: Some(1.0),
        by: "oncall".into(),
        uncertain_checked: true,
        ..ReplayOptions::default()
    };
    let (ops, st) = (env.ops(), store(&env));
    let run = {
        let (ops, st, opts) = (env.ops(), store(&env), opts.clone());
        tokio::spawn(async move {
            let _ = replay_group(&ops, &st, &opts, executor("cli"), &|_, _| {}).await;
        })
    };
    env.wait_until("the operation", minutes(1), || async {
        !st.list().await.unwrap_or_default().is_empty()
    })
    .await;
    let id = st.list().await.unwrap()[0].id.clone();
    wait_done_at_least(&env, &id, 2).await;
    run.abort();
    let _ = run.await;
    tokio::time::sleep(LEASE).await;
    let end = execute(&ops, &st, &id, &executor("worker-b"))
        .await
        .expect("resume")
        .expect("the lease expired");
    assert_eq!(end.state, OpState::Done, "{end:?}");
    let mut records = env.records().await;
    records.sort_by(|a, b| a.poisoned_at.cmp(&b.poisoned_at));
    let replayed: Vec<bool> = records
        .iter()
        .map(|r| r.status == RecordStatus::Replayed)
        .collect();
    assert_eq!(replayed, [[true; 6].as_slice(), &[false; 4]].concat());
}

/// The patch of issue 48: `add /a` of a 1 KiB value, then 40 copies of
/// `/a` into itself, each doubling the payload.
fn copy_bomb() -> String {
    let mut p =
        vec![serde_json::json!({"op": "add", "path": "/a", "value": {"s": "x".repeat(1024)}})];
    for i in 0..40 {
        p.push(serde_json::json!({"op": "copy", "from": "/a", "path": format!("/a/k{i}")}));
    }
    serde_json::Value::Array(p).to_string()
}

/// A group fix with the copy bomb: the executor refuses the patch on each
/// record at the op that would pass the payload's bound, before that op
/// allocates; the operation ends with every record left open and why, and
/// the same executor goes on to carry out the next operation.
#[tokio::test(start_paused = true)]
async fn a_copy_bomb_fix_is_refused_on_each_record_and_its_executor_lives_on() {
    let env = Env::new(|_, _| Behave::Fail(REFUSED.into()));
    poisoned(&env, 3).await;
    let kind = OpKind::Fix {
        patch: copy_bomb(),
        past_provider_window: false,
    };
    let op = create(&env, kind, 3, 5.0).await;
    let (ops, st) = (env.ops(), store(&env));
    let end = execute(&ops, &st, &op.id, &executor("worker-a"))
        .await
        .expect("execute")
        .expect("it ran");
    assert_eq!(end.state, OpState::Done, "{end:?}");
    assert_eq!((end.done, end.skipped, end.failed), (0, 3, 0), "{end:?}");
    let why = end.last_error.clone().unwrap_or_default();
    assert!(
        why.contains("would grow the payload past 1 MiB at op 10 (copy /a -> /a/k9)"),
        "{why}"
    );
    assert_eq!(row(&env, &op.id).await.last_error, end.last_error);
    assert!(env
        .records()
        .await
        .iter()
        .all(|r| r.status == RecordStatus::Open));
    let next = create(&env, discard_kind(), 3, 5.0).await;
    let end = execute(&ops, &st, &next.id, &executor("worker-a"))
        .await
        .expect("execute")
        .expect("it ran");
    assert_eq!((end.state, end.done), (OpState::Done, 3), "{end:?}");
}

async fn claim(st: &OperationStore, id: &str, owner: &str) -> Claim {
    st.claim(id, owner, LEASE, false).await.expect("claim")
}

/// Executors that die holding the lease (an out-of-memory patch killed
/// each `aqw run` that took it): each expired lease taken from a dead
/// holder is counted on the row, a checkpoint (progress) starts the count
/// again, and the claim past [`MAX_TAKEOVERS`] halts the operation with
/// `crashed executors` and an alert instead of running it; no idle worker
/// takes it again.
#[tokio::test(start_paused = true)]
async fn an_operation_whose_executors_keep_dying_is_halted_and_never_taken_again() {
    let env = Env::new(|_, _| Behave::Fail(REFUSED.into()));
    poisoned(&env, 2).await;
    let op = create(&env, discard_kind(), 2, 5.0).await;
    let st = store(&env);
    // The first claim of an unheld operation takes over nobody; one that
    // checkpoints made progress.
    assert!(matches!(
        claim(&st, &op.id, "first").await,
        Claim::Taken(..)
    ));
    assert_eq!(row(&env, &op.id).await.takeovers, 0);
    tokio::time::sleep(LEASE).await;
    let Claim::Taken(taken, etag) = claim(&st, &op.id, "resumed").await else {
        panic!("an expired lease is taken")
    };
    assert_eq!(row(&env, &op.id).await.takeovers, 1);
    st.checkpoint(&taken, &etag, LEASE)
        .await
        .expect("checkpoint");
    assert_eq!(row(&env, &op.id).await.takeovers, 0, "progress resets it");
    // Then executors that each die holding the lease, with no progress.
    for i in 1..=MAX_TAKEOVERS {
        tokio::time::sleep(LEASE).await;
        let owner = format!("dead-{i}");
        assert!(matches!(claim(&st, &op.id, &owner).await, Claim::Taken(..)));
        assert_eq!(row(&env, &op.id).await.takeovers, i);
    }
    tokio::time::sleep(LEASE).await;
    let (alerts, mut delivered) = Alerts::channel();
    let idle = ExecuteOptions {
        alerts,
        ..executor("idle")
    };
    let app = env.app();
    let storage: &dyn Storage = &env.storage;
    assert_eq!(resume_idle(&app, storage, &idle).await.unwrap(), 1);
    let halted = row(&env, &op.id).await;
    assert_eq!(halted.state, OpState::Halted, "{halted:?}");
    let why = halted.stop_reason.unwrap_or_default();
    assert!(why.starts_with("crashed executors"), "{why}");
    assert!(why.contains("dead-3") && why.contains("idle"), "{why}");
    let Ok(AlertEvent::Notice(body)) = delivered.try_recv() else {
        panic!("an alert")
    };
    assert_eq!(body["event"], "aqw.operation.halted", "{body}");
    assert_eq!(body["operation"], op.id.as_str(), "{body}");
    tokio::time::sleep(LEASE * 2).await;
    assert_eq!(resume_idle(&app, storage, &idle).await.unwrap(), 0);
    assert!(matches!(claim(&st, &op.id, "later").await, Claim::No));
    assert!(env
        .records()
        .await
        .iter()
        .all(|r| r.status == RecordStatus::Open));
}
