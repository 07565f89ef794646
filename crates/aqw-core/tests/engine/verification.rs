//! The article's four verification tests (duplicate, race, exhaust,
//! recover: `reference/000_632eee4edeea717a.txt`, "How to verify it"), and
//! a job that fails twice, then succeeds.

use crate::common::*;
use aqw_core::alert::AlertEvent;
use aqw_core::idempotency::KeyStatus;
use aqw_core::message::ErrorKind;
use aqw_core::ops::ReplayAction;
use aqw_core::poison::RecordStatus;
use aqw_core::storage::memory::MemoryStorage;
use aqw_core::storage::{
    PeekedMessage, PutReceipt, QueueStore, ReceivedMessage, Storage, StorageResult, TableStore, Ttl,
};
use async_trait::async_trait;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// 1. Replay (duplicate): the same job enqueued twice, one effect; the
/// second copy is dropped without running the handler.
#[tokio::test(start_paused = true)]
async fn the_same_job_enqueued_twice_has_one_effect() {
    let env = Env::new(|_, _| Behave::Succeed);
    let job = env.job("receipt");
    let first = env.enqueue(&job).await;
    let second = env.enqueue(&job).await;
    assert_ne!(first, second, "two messages");
    // One message at a time: the second copy meets a key already done.
    let w = start(env.builder().batch_size(1).build().unwrap());
    env.drained(minutes(5)).await;
    w.stop().await;

    assert_eq!(
        env.provider.calls().len(),
        1,
        "the duplicate was settled without a call"
    );
    env.provider
        .assert_applied_once(std::slice::from_ref(&job.key));
    let rec = env.key(&job.key).await.expect("the key record");
    assert_eq!(rec.status, KeyStatus::Done);
    assert_eq!(rec.attempts, 1);
    let outcomes: Vec<&str> = rec.history.iter().map(|a| a.outcome.as_str()).collect();
    assert_eq!(outcomes, ["completed"]);
    assert_eq!(env.key_rows().await.len(), 1, "one key record for the job");
    assert!(env.records().await.is_empty(), "nothing poisoned");
    assert_eq!(env.poison_depth().await, 0);
    assert_eq!(env.source_depth().await, 0);
}

/// Every receive of one worker, as the race test's evidence.
#[derive(Clone, Default)]
struct ReceiveLog(Arc<Mutex<Vec<(&'static str, String)>>>);

impl ReceiveLog {
    /// The message ids `worker` received.
    fn of(&self, worker: &str) -> Vec<String> {
        let log = self.0.lock().unwrap();
        log.iter()
            .filter(|(w, _)| *w == worker)
            .map(|(_, id)| id.clone())
            .collect()
    }
}

/// The memory store seen by one worker: every call passes through; what
/// its receives return is logged under the worker's name.
struct Tap {
    inner: MemoryStorage,
    worker: &'static str,
    log: ReceiveLog,
}

impl Storage for Tap {
    fn queue(&self, name: &str) -> Arc<dyn QueueStore> {
        Arc::new(TapQueue {
            inner: self.inner.queue(name),
            worker: self.worker,
            log: self.log.clone(),
        })
    }
    fn table(&self, name: &str) -> Arc<dyn TableStore> {
        self.inner.table(name)
    }
    fn blobs(&self, name: &str) -> Arc<dyn aqw_core::storage::BlobStore> {
        self.inner.blobs(name)
    }
}

struct TapQueue {
    inner: Arc<dyn QueueStore>,
    worker: &'static str,
    log: ReceiveLog,
}

#[async_trait]
impl QueueStore for TapQueue {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn create_if_missing(&self) -> StorageResult<()> {
        self.inner.create_if_missing().await
    }
    async fn receive(&self, max: u8, visibility: Duration) -> StorageResult<Vec<ReceivedMessage>> {
        let got = self.inner.receive(max, visibility).await?;
        let mut log = self.log.0.lock().unwrap();
        log.extend(got.iter().map(|m| (self.worker, m.id.clone())));
        Ok(got)
    }
    async fn peek(&self, max: u8) -> StorageResult<Vec<PeekedMessage>> {
        self.inner.peek(max).await
    }
    async fn put(&self, text: &str, visibility: Duration, ttl: Ttl) -> StorageResult<PutReceipt> {
        self.inner.put(text, visibility, ttl).await
    }
    async fn update_visibility(
        &self,
        id: &str,
        pop_receipt: &str,
        text: &str,
        visibility: Duration,
    ) -> StorageResult<String> {
        self.inner
            .update_visibility(id, pop_receipt, text, visibility)
            .await
    }
    async fn delete(&self, id: &str, pop_receipt: &str) -> StorageResult<()> {
        self.inner.delete(id, pop_receipt).await
    }
    async fn approximate_count(&self) -> StorageResult<u64> {
        self.inner.approximate_count().await
    }
    async fn delete_queue(&self) -> StorageResult<()> {
        self.inner.delete_queue().await
    }
}

/// 2. Race: two workers on clones of one store each receive a copy of the
/// same key while the other holds it; one effect, and the loser's copy is
/// settled without a call.
#[tokio::test(start_paused = true)]
async fn two_workers_racing_on_one_key_have_one_effect() {
    let env = Env::new(|_, _| Behave::Succeed);
    // Long enough that each worker holds its copy while the other claims.
    env.provider.set_delay(Duration::from_secs(5));
    let job = env.job("credits");
    let ids: HashSet<String> = [env.enqueue(&job).await, env.enqueue(&job).await].into();
    let log = ReceiveLog::default();
    let worker = |name: &'static str| {
        let tap = Tap {
            inner: env.storage.clone(),
            worker: name,
            log: log.clone(),
        };
        // One message in flight per worker: each takes one copy.
        let b = env.builder_on(Arc::new(tap), |_| {}).batch_size(1);
        start(b.build().unwrap())
    };
    let (a, b) = (worker("a"), worker("b"));
    env.drained(minutes(5)).await;
    a.stop().await;
    b.stop().await;

    let (got_a, got_b) = (log.of("a"), log.of("b"));
    assert!(
        !got_a.is_empty() && !got_b.is_empty(),
        "both workers received a copy: a {got_a:?}, b {got_b:?}"
    );
    let first_round: HashSet<String> = [got_a[0].clone(), got_b[0].clone()].into();
    assert_eq!(
        first_round, ids,
        "each worker's first receive was one of the copies"
    );
    assert_eq!(
        env.provider.calls().len(),
        1,
        "one call; the other copy skipped"
    );
    env.provider
        .assert_applied_once(std::slice::from_ref(&job.key));
    let rec = env.key(&job.key).await.expect("the key record");
    assert_eq!(rec.status, KeyStatus::Done);
    assert_eq!(rec.attempts, 1, "the loser never claimed the key");
    assert_eq!(env.key_rows().await.len(), 1);
    assert!(env.records().await.is_empty(), "nothing poisoned");
    assert_eq!(env.source_depth().await, 0);
}

const DOWN: &str = "HTTP 503 from provider: down";

/// An always failing job walked to poison: its job, message id and the
/// first call's provider key.
pub(crate) async fn exhausted(env: &Env) -> (JobSpec, String) {
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

/// 3. Exhaust: a handler that always fails retryably is attempted
/// maxDequeueCount (5) times, then leaves exactly one poison record and one
/// `<queue>-poison` copy with the exact message and the last error, an
/// alert, an empty source queue and a key that is not done.
#[tokio::test(start_paused = true)]
async fn an_always_failing_job_uses_every_attempt_then_leaves_one_record() {
    let env = Env::new(|_, n| Behave::Retry(format!("{DOWN} (attempt {n})")));
    let (job, id) = exhausted(&env).await;

    let calls = env.provider.calls();
    assert_eq!(calls.len(), 5, "every attempt used, no more");
    let dcs: Vec<u32> = calls.iter().map(|c| c.dequeue_count).collect();
    assert_eq!(dcs, [1, 2, 3, 4, 5]);
    assert!(
        calls
            .iter()
            .all(|c| c.provider_key == calls[0].provider_key),
        "one provider key on every attempt"
    );
    assert!(env.provider.effects().is_empty(), "nothing applied");
    let last_error = format!("{DOWN} (attempt 5)");

    let records = env.records().await;
    assert_eq!(records.len(), 1, "one poison record");
    let r = &records[0];
    assert_eq!(r.status, RecordStatus::Open);
    assert_eq!(r.message_id, id);
    assert_eq!(r.message, job.text, "the exact message text");
    let decoded = aqw_core::message::decode(&r.message, ENCODING).unwrap();
    assert_eq!(decoded, job.payload, "the exact payload");
    assert_eq!(r.key.as_deref(), Some(job.key.as_str()));
    assert_eq!(r.dequeue_count, 5);
    assert_eq!(r.error.kind, ErrorKind::Retryable);
    assert_eq!(r.error.message, last_error);
    assert_eq!(r.function, env.function);

    assert_eq!(env.poison_depth().await, 1, "one poison copy");
    let copies = env.poison_copies().await;
    let (copy_id, envelope) = &copies[0];
    assert_eq!(
        r.poison_message_id.as_ref(),
        Some(copy_id),
        "the record names it"
    );
    assert_eq!(envelope.message.as_deref(), Some(job.text.as_str()));
    assert_eq!(envelope.message_id, id);
    assert_eq!(envelope.queue, env.queue);
    assert_eq!(envelope.dequeue_count, 5);
    assert_eq!(envelope.error.kind, ErrorKind::Retryable);
    assert_eq!(envelope.error.message, last_error);
    assert_eq!(envelope.key.as_deref(), Some(job.key.as_str()));
    assert!(envelope.first_attempt_at <= envelope.poisoned_at);

    assert_eq!(env.source_depth().await, 0, "the source message is gone");
    let key = env.key(&job.key).await.expect("the key record");
    assert_eq!(key.status, KeyStatus::Poisoned, "not done");
    assert_eq!(key.attempts, 5);
    assert_eq!(key.provider_key, calls[0].provider_key);
    assert_eq!(key.last_error.as_deref(), Some(last_error.as_str()));
    let outcomes: Vec<&str> = key.history.iter().map(|a| a.outcome.as_str()).collect();
    assert_eq!(
        outcomes,
        ["retried", "retried", "retried", "retried", "poisoned"]
    );

    let alerts: Vec<_> = env
        .alerts()
        .into_iter()
        .filter_map(|a| match a {
            AlertEvent::Poisoned(p) => Some(p),
            AlertEvent::Breaker(_) | AlertEvent::Notice(_) => None,
        })
        .collect();
    assert_eq!(alerts.len(), 1, "one alert for the one record");
    assert_eq!(alerts[0].message_id, id);
    assert_eq!(alerts[0].queue, env.queue);
    assert_eq!(alerts[0].key.as_deref(), Some(job.key.as_str()));
    assert_eq!(alerts[0].error, last_error);

    let status = aqw_core::ops::status(&env.ops()).await.unwrap();
    assert_eq!(status.open_records, 1, "aqw status sees the open record");
}

/// 4. Recover: after exhaust, fix the handler and replay the record: the
/// job runs once more, with the provider key of the failed attempts, its
/// effect happens once and the record closes; replaying again does nothing.
#[tokio::test(start_paused = true)]
async fn a_replay_from_the_record_succeeds_once_with_the_original_key() {
    let env = Env::new(|_, _| Behave::Retry(DOWN.into()));
    let (job, id) = exhausted(&env).await;
    let failed = env.provider.calls();
    assert_eq!(failed.len(), 5);

    env.provider.set_rule(|_, _| Behave::Succeed);
    let w = start(env.worker());
    let report = env.replay_all().await;
    assert_eq!((report.selected, report.replayed), (1, 1), "{report:?}");
    assert_eq!(report.items[0].action, ReplayAction::Replayed);
    env.wait_until("the replayed key done", minutes(5), || async {
        env.key(&job.key)
            .await
            .is_some_and(|k| k.status == KeyStatus::Done)
    })
    .await;
    env.drained(minutes(5)).await;

    let again = env.replay_all().await;
    assert_eq!(again.selected, 0, "nothing left to replay: {again:?}");
    // Whatever a second replay could have put would have run by now.
    tokio::time::sleep(minutes(2)).await;
    w.stop().await;

    let calls = env.provider.calls();
    assert_eq!(calls.len(), 6, "five failures, then one run");
    let run = &calls[5];
    assert_eq!(run.outcome, CallOutcome::Applied);
    assert_eq!(
        run.provider_key, failed[0].provider_key,
        "the replay sent the provider key of the failed attempts"
    );
    assert!(
        run.previously_pending,
        "told an earlier attempt held the key"
    );
    env.provider
        .assert_applied_once(std::slice::from_ref(&job.key));

    let records = env.records().await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].message_id, id);
    assert_eq!(
        records[0].status,
        RecordStatus::Replayed,
        "the record closed"
    );
    assert_eq!(records[0].replayed_by.as_deref(), Some("oncall"));
    assert_eq!(env.poison_depth().await, 0, "its copy removed");
    assert_eq!(env.source_depth().await, 0);
    let key = env.key(&job.key).await.unwrap();
    assert_eq!(key.status, KeyStatus::Done);
    assert_eq!(key.replay_count, 1);
    assert_eq!(key.provider_key, failed[0].provider_key);
}

/// Fails twice, then succeeds: no poison, one effect, one provider key on
/// all three attempts, and the key's history keeps the three.
#[tokio::test(start_paused = true)]
async fn fail_fail_succeed_has_one_effect_and_three_attempts() {
    let env = Env::new(|_, n| {
        if n < 3 {
            Behave::Retry(format!("{DOWN} (attempt {n})"))
        } else {
            Behave::Succeed
        }
    });
    let job = env.job("receipt");
    env.enqueue(&job).await;
    let w = start(env.worker());
    env.drained(minutes(5)).await;
    w.stop().await;

    let calls = env.provider.calls();
    assert_eq!(calls.len(), 3);
    let dcs: Vec<u32> = calls.iter().map(|c| c.dequeue_count).collect();
    assert_eq!(dcs, [1, 2, 3]);
    let pending: Vec<bool> = calls.iter().map(|c| c.previously_pending).collect();
    assert_eq!(
        pending,
        [false, true, true],
        "retries are told the key was held"
    );
    assert!(calls
        .iter()
        .all(|c| c.provider_key == calls[0].provider_key));
    env.provider
        .assert_applied_once(std::slice::from_ref(&job.key));

    let key = env.key(&job.key).await.expect("the key record");
    assert_eq!(key.status, KeyStatus::Done);
    assert_eq!(key.attempts, 3);
    assert_eq!(key.provider_key, calls[0].provider_key);
    assert_eq!(key.last_error, None, "done: no current error");
    let history: Vec<(&str, u32)> = key
        .history
        .iter()
        .map(|a| (a.outcome.as_str(), a.dequeue_count))
        .collect();
    assert_eq!(history, [("retried", 1), ("retried", 2), ("completed", 3)]);
    assert_eq!(
        key.history[0].error.as_deref(),
        Some(format!("{DOWN} (attempt 1)").as_str())
    );
    assert!(key.completed_answer().is_some_and(|a| !a.replayed));
    assert!(env.records().await.is_empty(), "nothing poisoned");
    assert_eq!(env.poison_depth().await, 0);
    assert_eq!(env.source_depth().await, 0);
}
