//! Durable group operations (issue 40): an operation row carried out by
//! whoever holds its lease. An executor killed mid-run is resumed by
//! another after its lease expires and each record is handled once; a
//! cancel from another store handle stops it before its next record; it
//! halts itself when the breaker opens or its replayed jobs come back
//! poisoned; records poisoned after its creation are not its own.

use crate::common::*;
use aqw_core::control::ControlStore;
use aqw_core::ops::operation::{
    execute, resume_idle, ExecuteOptions, NewOperation, OpKind, OpState, Operation, OperationStore,
    Selection, LEASE,
};
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
    ExecuteOptions {
        owner: owner.into(),
        lease: LEASE,
        take_over: false,
    }
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
    let first = spawn(&env, &op.id, "worker-a");
    wait_done_at_least(&env, &op.id, 5).await;
    first.abort();
    let _ = first.await;
    tokio::time::sleep(LEASE).await;
    let app = env.app();
    let storage: &dyn Storage = &env.storage;
    let ran = resume_idle(&app, storage, &executor("worker-b")).await;
    assert_eq!(ran.expect("resume"), 1, "an idle worker picked it up");
    assert_eq!(row(&env, &op.id).await.state, OpState::Done);

    let w = start(env.worker());
    env.drained(minutes(5)).await;
    tokio::time::sleep(minutes(1)).await;
    w.stop().await;
    env.provider.assert_applied_once(&keys);
    for r in env.records().await {
        assert_eq!(r.status, RecordStatus::Replayed, "{}", env.dump().await);
        assert_eq!(r.replay_count, 1, "closed once: {r:?}");
    }
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
    assert!(again.unwrap_err().contains("already cancelled"));
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
