//! A replayed poisoned key runs once: two replays racing for one record,
//! and a replay while another copy of the job is still on the source queue.

use crate::common::*;
use aqw_core::idempotency::KeyStatus;
use aqw_core::ops::ReplayAction;
use aqw_core::poison::RecordStatus;

const REJECTED: &str = "HTTP 422: amount must be positive";

/// One job poisoned by a permanent refusal; its job and message id.
async fn poisoned(env: &Env) -> (JobSpec, String) {
    let job = env.job("grant");
    let id = env.enqueue(&job).await;
    let w = start(env.worker());
    env.wait_until("the job poisoned", minutes(5), || async {
        env.source_depth().await == 0 && !env.records().await.is_empty()
    })
    .await;
    w.stop().await;
    (job, id)
}

/// Two operators replay the same record at the same moment (and a third
/// later): the job is put back twice at most, runs once, applies once.
#[tokio::test(start_paused = true)]
async fn two_replays_at_once_run_the_job_once() {
    let env = Env::new(|_, _| Behave::Fail(REJECTED.into()));
    let (job, _) = poisoned(&env).await;
    env.provider.set_rule(|_, _| Behave::Succeed);

    // Each storage call takes a moment, so the two replays interleave: both
    // list the record open before either closes it.
    env.storage
        .set_latency(std::time::Duration::from_millis(20));
    let (a, b) = tokio::join!(env.replay_all(), env.replay_all());
    env.storage.set_latency(std::time::Duration::ZERO);
    assert_eq!((a.selected, b.selected), (1, 1), "both saw the record open");
    assert_eq!(env.source_depth().await, 2, "both put the job back");
    assert_eq!(
        a.replayed + b.replayed,
        1,
        "one replay closed the record: {a:?} {b:?}"
    );
    assert_eq!(
        a.failed + b.failed,
        a.selected + b.selected - 1,
        "{a:?} {b:?}"
    );
    let w = start(env.worker());
    env.wait_until("the key done", minutes(5), || async {
        env.key(&job.key)
            .await
            .is_some_and(|k| k.status == KeyStatus::Done)
    })
    .await;
    env.drained(minutes(5)).await;
    let c = env.replay_all().await;
    assert_eq!(c.selected, 0, "{c:?}");
    tokio::time::sleep(minutes(2)).await;
    w.stop().await;

    let calls = env.provider.calls();
    assert_eq!(calls.len(), 2, "one refusal, then one run: {calls:?}");
    assert_eq!(calls[1].outcome, CallOutcome::Applied);
    env.provider
        .assert_applied_once(std::slice::from_ref(&job.key));
    let records = env.records().await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].status, RecordStatus::Replayed);
    assert_eq!(env.source_depth().await, 0);
    assert_eq!(env.poison_depth().await, 0);
}

/// The job was enqueued twice; one copy was poisoned while the other was
/// still on its way. Replayed while that copy is on the source queue: the
/// two messages of one key run once between them.
#[tokio::test(start_paused = true)]
async fn a_replay_while_a_copy_is_on_the_source_queue_runs_once() {
    let env = Env::new(|_, _| Behave::Fail(REJECTED.into()));
    let (job, _) = poisoned(&env).await;
    env.provider.set_rule(|_, _| Behave::Succeed);

    // The producer's second copy of the same job arrives; the operator
    // replays at the same moment.
    let late = env.enqueue(&job).await;
    let report = env.replay_all().await;
    assert_eq!(report.replayed, 1, "{report:?}");
    let reput = report.items[0].new_message_id.clone().expect("a re-put");
    assert_ne!(reput, late);
    assert_eq!(
        env.source_depth().await,
        2,
        "both copies on the source queue"
    );
    let w = start(env.worker());
    env.wait_until("the key done", minutes(5), || async {
        env.key(&job.key)
            .await
            .is_some_and(|k| k.status == KeyStatus::Done)
    })
    .await;
    env.drained(minutes(5)).await;
    tokio::time::sleep(minutes(2)).await;
    w.stop().await;

    let calls = env.provider.calls();
    let runs: Vec<&Call> = calls
        .iter()
        .filter(|c| c.outcome != CallOutcome::Failed(REJECTED.into()))
        .collect();
    assert_eq!(runs.len(), 1, "one of the two copies ran: {runs:?}");
    env.provider
        .assert_applied_once(std::slice::from_ref(&job.key));
    let key = env.key(&job.key).await.unwrap();
    assert_eq!(key.status, KeyStatus::Done);
    assert_eq!(key.attempts, 2, "the refused attempt and the one run");
    let records = env.records().await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].status, RecordStatus::Replayed);
    assert_eq!(env.source_depth().await, 0);
    assert_eq!(env.poison_depth().await, 0);
}

/// The late copy ran (the key is done) before the operator replays: the
/// record is closed "already done" and nothing is put back.
#[tokio::test(start_paused = true)]
async fn a_replay_after_the_job_ran_closes_the_record_without_a_reput() {
    let env = Env::new(|_, _| Behave::Fail(REJECTED.into()));
    let (job, _) = poisoned(&env).await;
    env.provider.set_rule(|_, _| Behave::Succeed);
    env.enqueue(&job).await;
    let w = start(env.worker());
    env.wait_until("the late copy ran", minutes(5), || async {
        env.key(&job.key)
            .await
            .is_some_and(|k| k.status == KeyStatus::Done)
    })
    .await;
    env.drained(minutes(5)).await;

    let report = env.replay_all().await;
    assert_eq!((report.selected, report.already_done), (1, 1), "{report:?}");
    assert_eq!(report.items[0].action, ReplayAction::AlreadyDone);
    assert_eq!(report.items[0].new_message_id, None);
    assert_eq!(env.source_depth().await, 0, "nothing re-put");
    tokio::time::sleep(minutes(2)).await;
    w.stop().await;

    assert_eq!(env.provider.calls().len(), 2, "one refusal, one run");
    env.provider
        .assert_applied_once(std::slice::from_ref(&job.key));
    let records = env.records().await;
    assert_eq!(records[0].status, RecordStatus::Replayed);
    assert_eq!(env.poison_depth().await, 0);
}

/// `aqw serve`'s attempt budget lives on the key (`CarriedAttempts`): a
/// claim sees what the failed copies spent, and a claim of a poisoned key
/// (a replay) starts a new budget.
#[tokio::test(start_paused = true)]
async fn the_carried_attempts_survive_a_claim_and_a_replay_resets_them() {
    use aqw_core::idempotency::{IdempotencyKey, KeyStore, NextAction};
    use aqw_core::storage::Storage;
    let env = Env::new(|_, _| Behave::Succeed);
    let table = env.storage.table(&env.keys_table);
    table.create_if_missing().await.unwrap();
    let keys = KeyStore::new(table);
    let key = IdempotencyKey::new("job:carried").unwrap();
    let lease = minutes(1);
    let claim = |owner: &'static str| {
        let (keys, key) = (&keys, &key);
        async move {
            match keys
                .claim_attempt("F", key, owner, lease, "m", 1, aqw_core::clock::now_utc())
                .await
                .unwrap()
            {
                NextAction::Run(c) => c,
                other => panic!("not claimed: {other:?}"),
            }
        }
    };
    let first = claim("w/m/1").await;
    assert_eq!(first.carried_attempts, 0);
    keys.record_failure_carried(&first, "HTTP 503", false, 2)
        .await
        .unwrap();
    let second = claim("w/m/2").await;
    assert_eq!(second.carried_attempts, 2, "the copy counts on");
    keys.mark_poisoned(&second, "HTTP 503", false)
        .await
        .unwrap();
    let replayed = claim("w/m/3").await;
    assert_eq!(replayed.carried_attempts, 0, "a replay starts a new budget");
    // Written back, not only reported: the next claim sees 0 too.
    keys.record_failure(&replayed, "HTTP 503", false)
        .await
        .unwrap();
    assert_eq!(claim("w/m/4").await.carried_attempts, 0);
}

/// `aqw run`'s attempt number is the key's `RunAttempts`: each claim
/// counts, a claim given back (a "later", an "in progress", a park while
/// the breaker holds) does not, a held key's refused claim writes nothing,
/// and a poisoned key taken over or a replay noted on a pending key starts
/// a new run.
#[tokio::test(start_paused = true)]
async fn the_run_attempts_count_claims_and_a_replay_resets_them() {
    use aqw_core::idempotency::{IdempotencyKey, KeyStore, NextAction};
    use aqw_core::storage::Storage;
    let env = Env::new(|_, _| Behave::Succeed);
    let table = env.storage.table(&env.keys_table);
    table.create_if_missing().await.unwrap();
    let keys = KeyStore::new(table);
    let key = IdempotencyKey::new("job:run-attempts").unwrap();
    let lease = minutes(1);
    let claim = |owner: &'static str| {
        let (keys, key) = (&keys, &key);
        async move {
            keys.claim_attempt("F", key, owner, lease, "m", 1, aqw_core::clock::now_utc())
                .await
                .unwrap()
        }
    };
    let run = |next: NextAction| match next {
        NextAction::Run(c) => c,
        other => panic!("not claimed: {other:?}"),
    };
    let first = run(claim("w/m/1").await);
    assert_eq!(first.run_attempts, 1);
    assert!(
        matches!(claim("w/m/2").await, NextAction::HeldElsewhere { .. }),
        "held: nothing written, nothing counted"
    );
    keys.record_failure(&first, "HTTP 503", false)
        .await
        .unwrap();
    let second = run(claim("w/m/3").await);
    assert_eq!(second.run_attempts, 2, "a failed attempt counts");
    keys.record_failure_given_back(&second, "retried", "HTTP 429", false)
        .await
        .unwrap();
    let third = run(claim("w/m/4").await);
    assert_eq!(third.run_attempts, 2, "a \"later\" gave its claim back");
    keys.mark_poisoned(&third, "HTTP 503", false).await.unwrap();
    let replayed = run(claim("w/m/5").await);
    assert_eq!(
        replayed.run_attempts, 1,
        "a poisoned key taken over: a new run"
    );
    keys.record_failure(&replayed, "HTTP 503", false)
        .await
        .unwrap();
    let rec = keys.get("F", &key).await.unwrap().unwrap();
    assert_eq!((rec.run_attempts, rec.attempts), (1, 4));
    keys.note_replay("F", &key, None).await.unwrap();
    assert_eq!(
        run(claim("w/m/6").await).run_attempts,
        1,
        "a replay noted on a pending key starts a new run"
    );
}

/// A copy of a job put before its key was poisoned (a second delivery
/// chain, a producer's duplicate send) is settled as a duplicate when it
/// arrives after the poisoning: it does not start a second attempt budget
/// and a second poison record. A resend put after the poisoning runs.
#[tokio::test(start_paused = true)]
async fn a_copy_put_before_the_poisoning_does_not_run_again() {
    let env = Env::new(|_, _| Behave::Retry("provider down".into()));
    let job = env.job("twice");
    env.enqueue(&job).await;
    // The second copy, put now, arrives long after the first is poisoned.
    env.enqueue_after(&job, minutes(30)).await;
    let w = start(env.worker());
    env.wait_until("the first copy poisoned", minutes(10), || async {
        env.records().await.len() == 1
    })
    .await;
    let calls = env.provider.calls().len();
    assert_eq!(calls, 5, "maxDequeueCount attempts");
    env.drained(minutes(40)).await;
    assert_eq!(
        env.provider.calls().len(),
        calls,
        "the leftover copy did not run"
    );
    assert_eq!(env.records().await.len(), 1, "one poison record");

    // A resend after the poisoning is a new attempt at the job: it runs.
    env.provider.set_rule(|_, _| Behave::Succeed);
    env.enqueue(&job).await;
    env.drained(minutes(5)).await;
    w.stop().await;
    env.provider
        .assert_applied_once(std::slice::from_ref(&job.key));
}

/// What [`FaultyMerges`] does to the next merge.
#[derive(Clone, Copy)]
enum MergeFault {
    /// Refused (HTTP 500), nothing written.
    Refuse,
    /// Written, its answer lost.
    LoseAnswer,
}

/// A key table whose next merges meet the faults queued on it.
struct FaultyMerges {
    inner: std::sync::Arc<dyn aqw_core::storage::TableStore>,
    faults: std::sync::Mutex<std::collections::VecDeque<MergeFault>>,
}

#[async_trait::async_trait]
impl aqw_core::storage::TableStore for FaultyMerges {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn create_if_missing(&self) -> aqw_core::storage::StorageResult<()> {
        self.inner.create_if_missing().await
    }
    async fn insert(
        &self,
        pk: &str,
        rk: &str,
        entity: &aqw_core::storage::Entity,
    ) -> aqw_core::storage::StorageResult<aqw_core::storage::Etag> {
        self.inner.insert(pk, rk, entity).await
    }
    async fn get(
        &self,
        pk: &str,
        rk: &str,
    ) -> aqw_core::storage::StorageResult<
        Option<(aqw_core::storage::Entity, aqw_core::storage::Etag)>,
    > {
        self.inner.get(pk, rk).await
    }
    async fn merge(
        &self,
        pk: &str,
        rk: &str,
        entity: &aqw_core::storage::Entity,
        if_match: Option<&aqw_core::storage::Etag>,
    ) -> aqw_core::storage::StorageResult<aqw_core::storage::Etag> {
        use aqw_core::storage::StorageError;
        let fault = self.faults.lock().unwrap().pop_front();
        match fault {
            None => self.inner.merge(pk, rk, entity, if_match).await,
            Some(MergeFault::Refuse) => Err(StorageError::Http {
                status: 500,
                code: "InternalError".into(),
            }),
            Some(MergeFault::LoseAnswer) => {
                self.inner.merge(pk, rk, entity, if_match).await?;
                Err(StorageError::Transport("answer lost (test)".into()))
            }
        }
    }
    async fn delete(&self, pk: &str, rk: &str) -> aqw_core::storage::StorageResult<()> {
        self.inner.delete(pk, rk).await
    }
    async fn query_where(
        &self,
        query: &aqw_core::storage::TableQuery<'_>,
    ) -> aqw_core::storage::StorageResult<Vec<aqw_core::storage::Row>> {
        self.inner.query_where(query).await
    }
    async fn transaction(
        &self,
        pk: &str,
        ops: Vec<aqw_core::storage::TableOp>,
    ) -> aqw_core::storage::StorageResult<()> {
        self.inner.transaction(pk, ops).await
    }
    async fn delete_table(&self) -> aqw_core::storage::StorageResult<()> {
        self.inner.delete_table().await
    }
}

/// Sim seeds 2139 and 5453: the write that gives a "later"'s claim back
/// (or records a success) refused or its answer lost must not leave the
/// claim counted as a crashed attempt: a write to a held key is tried
/// again, a bounded number of times.
#[tokio::test(start_paused = true)]
async fn a_refused_or_lost_give_back_is_written_again() {
    use aqw_core::idempotency::{IdempotencyKey, KeyStore, NextAction};
    use aqw_core::storage::Storage;
    use MergeFault::{LoseAnswer, Refuse};
    let env = Env::new(|_, _| Behave::Succeed);
    let inner = env.storage.table(&env.keys_table);
    inner.create_if_missing().await.unwrap();
    let table = std::sync::Arc::new(FaultyMerges {
        inner,
        faults: Default::default(),
    });
    let keys = KeyStore::new(table.clone());
    let key = IdempotencyKey::new("job:give-back-faults").unwrap();
    let arm = |faults: &[MergeFault]| table.faults.lock().unwrap().extend(faults);
    let claim = |owner: &'static str| {
        let (keys, key) = (&keys, &key);
        async move {
            match keys
                .claim_attempt(
                    "F",
                    key,
                    owner,
                    minutes(1),
                    "m",
                    1,
                    aqw_core::clock::now_utc(),
                )
                .await
                .unwrap()
            {
                NextAction::Run(c) => c,
                other => panic!("not claimed: {other:?}"),
            }
        }
    };
    let first = claim("w/m/1").await;
    keys.record_failure(&first, "HTTP 503", false)
        .await
        .unwrap();
    let second = claim("w/m/2").await;
    assert_eq!(second.run_attempts, 2);
    arm(&[Refuse, Refuse]);
    keys.record_failure_given_back(&second, "retried", "HTTP 429", false)
        .await
        .expect("a refused give-back is written again");
    let third = claim("w/m/3").await;
    assert_eq!(third.run_attempts, 2, "the refused give-back landed");
    arm(&[LoseAnswer]);
    keys.record_failure_given_back(&third, "in_progress", "HTTP 409", true)
        .await
        .expect("a give-back whose answer was lost is recognised as written");
    let fourth = claim("w/m/4").await;
    assert_eq!(fourth.run_attempts, 2, "the lost-answer give-back landed");
    arm(&[Refuse, Refuse, Refuse]);
    assert!(
        keys.record_failure_given_back(&fourth, "retried", "HTTP 429", false)
            .await
            .is_err(),
        "tried a bounded number of times"
    );
    table.faults.lock().unwrap().clear();
    arm(&[Refuse]);
    keys.complete(&fourth, Vec::new()).await.unwrap();
    let rec = keys.get("F", &key).await.unwrap().unwrap();
    assert_eq!(
        rec.status,
        KeyStatus::Done,
        "a refused done-write is written again"
    );
}
