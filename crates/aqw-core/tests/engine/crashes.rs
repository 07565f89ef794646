//! A crash at every failpoint of the job, poison and replay paths. The point
//! is armed on the test's thread; the job's task (or the replay) that hits
//! it panics there while the store survives: an in-process crash. Then the
//! same worker keeps running, or a fresh one takes over on the same store
//! (a restart), until every message is settled. Each effect is applied at
//! most once per provider key (an effect that completed before the crash
//! may be called again with the same provider key, which the provider
//! deduplicates), a poisoned job has exactly one poison copy, and nothing
//! is lost: every job is done or in an open poison record.

use crate::common::*;
use aqw_core::failpoint;
use aqw_core::idempotency::KeyStatus;
use aqw_core::message::ErrorKind;
use aqw_core::poison::RecordStatus;
use aqw_core::storage::Storage;
use serde_json::json;
use std::collections::{BTreeSet, HashSet};
use std::time::Duration;

/// After the crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum After {
    /// The worker whose job task crashed goes on.
    KeepRunning,
    /// It is shut down and a fresh worker starts on the same store.
    Restart,
}

/// How the jobs bound for poison fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bad {
    /// At once, permanently (poisoned on the first attempt).
    Permanent,
    /// Retryably, every time (poisoned at the fifth attempt; a crash on the
    /// poison path then brings it back over the cap).
    Exhausting,
}

const REJECTED: &str = "HTTP 422: amount must be positive";
const DOWN: &str = "HTTP 503 from provider: down";

/// Three jobs that succeed, two bound for poison; `point` armed before the
/// worker starts.
async fn crash_in_job(point: &'static str, after: After, bad: Bad) {
    let env = Env::new(move |job, _| match (is_bad(job), bad) {
        (false, _) => Behave::Succeed,
        (true, Bad::Permanent) => Behave::Fail(REJECTED.into()),
        (true, Bad::Exhausting) => Behave::Retry(DOWN.into()),
    });
    let goods: Vec<JobSpec> = (0..3).map(|i| env.job(&format!("good{i}"))).collect();
    let bads: Vec<JobSpec> = (0..2)
        .map(|i| env.job_with(&format!("bad{i}"), json!({ "bad": true })))
        .collect();
    for j in &goods {
        env.enqueue(j).await;
    }
    let mut bad_ids = BTreeSet::new();
    for j in &bads {
        bad_ids.insert(env.enqueue(j).await);
    }
    let ctx = format!("{point} ({after:?}, {bad:?})");

    failpoint::arm(point);
    let mut w = start(env.worker());
    env.wait_until(
        &format!("{ctx}: a job task crashed there"),
        minutes(10),
        || async { failpoint::armed().is_none() },
    )
    .await;
    assert!(
        !w.is_finished(),
        "{ctx}: the worker survives its job's crash"
    );
    if after == After::Restart {
        w.stop().await;
        w = start(env.worker());
    }
    env.wait_until(
        &format!("{ctx}: every job settled"),
        minutes(30),
        || async {
            let open: BTreeSet<String> = env
                .records()
                .await
                .into_iter()
                .filter(|r| r.status == RecordStatus::Open)
                .map(|r| r.message_id)
                .collect();
            let mut done = true;
            for j in &goods {
                done &= env
                    .key(&j.key)
                    .await
                    .is_some_and(|k| k.status == KeyStatus::Done);
            }
            done && open == bad_ids && env.source_depth().await == 0
        },
    )
    .await;
    w.stop().await;

    // Effects: once per good job, under one provider key; none for the bad.
    let good_keys: Vec<String> = goods.iter().map(|j| j.key.clone()).collect();
    env.provider.assert_applied_once(&good_keys);
    for j in &bads {
        let pks: HashSet<String> = env
            .provider
            .calls_for(&j.key)
            .into_iter()
            .map(|c| c.provider_key)
            .collect();
        assert_eq!(pks.len(), 1, "{ctx}: {}: one provider key", j.key);
        let key = env.key(&j.key).await.expect("the bad job's key");
        assert_ne!(key.status, KeyStatus::Done, "{ctx}: {} not done", j.key);
    }

    // Poison: one open record and one copy per bad job, none for the good.
    let records = env.records().await;
    assert_eq!(
        records.len(),
        bads.len(),
        "{ctx}: one record per bad job\n{}",
        env.dump().await
    );
    let (kind, error) = match bad {
        Bad::Permanent => (ErrorKind::Permanent, REJECTED),
        Bad::Exhausting => (ErrorKind::Retryable, DOWN),
    };
    let bad_keys: BTreeSet<&str> = bads.iter().map(|j| j.key.as_str()).collect();
    for r in &records {
        assert!(bad_ids.contains(&r.message_id), "{ctx}: {r:?}");
        assert!(
            bad_keys.contains(r.key.as_deref().unwrap_or("")),
            "{ctx}: {r:?}"
        );
        assert_eq!(r.status, RecordStatus::Open);
        assert_eq!(
            (r.error.kind, r.error.message.as_str()),
            (kind, error),
            "{ctx}: the handler's own error is kept"
        );
    }
    assert_eq!(
        env.poison_depth().await,
        bads.len() as u64,
        "{ctx}: one poison copy per poisoned job\n{}",
        env.dump().await
    );
    let copies = env.poison_copies().await;
    let copy_sources: Vec<&str> = copies.iter().map(|(_, e)| e.message_id.as_str()).collect();
    let unique: BTreeSet<&str> = copy_sources.iter().copied().collect();
    assert_eq!(copy_sources.len(), unique.len(), "{ctx}: {copy_sources:?}");
    assert_eq!(
        unique,
        bad_ids.iter().map(String::as_str).collect(),
        "{ctx}: a copy of each poisoned message"
    );
    for (id, envelope) in &copies {
        let r = records
            .iter()
            .find(|r| r.message_id == envelope.message_id)
            .unwrap();
        assert_eq!(
            r.poison_message_id.as_ref(),
            Some(id),
            "{ctx}: the record names its copy"
        );
        assert_eq!(envelope.message.as_deref(), Some(r.message.as_str()));
    }
    assert_eq!(env.source_depth().await, 0, "{ctx}: nothing left behind");
    assert_eq!(env.key_rows().await.len(), goods.len() + bads.len());

    // The crash happened where it was armed.
    let calls = env.provider.calls();
    let good_calls = |k: &str| calls.iter().filter(|c| c.key == k).count();
    match point {
        "effect.after" => {
            let again: Vec<&String> = good_keys.iter().filter(|k| good_calls(k) == 2).collect();
            assert_eq!(
                again.len(),
                1,
                "{ctx}: one effect called again after the crash"
            );
            let twice: Vec<&Call> = calls.iter().filter(|c| &c.key == again[0]).collect();
            assert_eq!(
                (&twice[0].outcome, &twice[1].outcome),
                (&CallOutcome::Applied, &CallOutcome::Deduplicated),
                "{ctx}: the second call carried the first one's provider key"
            );
            assert!(twice[1].previously_pending);
        }
        "done.after" => {
            let runs: Vec<usize> = good_keys.iter().map(|k| good_calls(k)).collect();
            assert_eq!(runs, [1, 1, 1], "{ctx}: a key done is never run again");
        }
        "claim.after" => {
            let mut abandoned = 0;
            for j in goods.iter().chain(&bads) {
                let key = env.key(&j.key).await.unwrap();
                abandoned += key
                    .history
                    .iter()
                    .filter(|a| a.outcome == "abandoned")
                    .count();
            }
            assert_eq!(
                abandoned, 1,
                "{ctx}: the crashed attempt is in a key's history"
            );
        }
        _ => {}
    }
}

async fn crash_point(point: &'static str) {
    for after in [After::KeepRunning, After::Restart] {
        crash_in_job(point, after, Bad::Permanent).await;
        crash_in_job(point, after, Bad::Exhausting).await;
    }
}

#[tokio::test(start_paused = true)]
async fn crash_after_claim() {
    crash_point("claim.after").await;
}

#[tokio::test(start_paused = true)]
async fn crash_after_effect() {
    crash_point("effect.after").await;
}

#[tokio::test(start_paused = true)]
async fn crash_after_done() {
    crash_point("done.after").await;
}

#[tokio::test(start_paused = true)]
async fn crash_after_poison_record() {
    crash_point("poison.after_record").await;
}

#[tokio::test(start_paused = true)]
async fn crash_after_poison_put() {
    crash_point("poison.after_put").await;
}

#[tokio::test(start_paused = true)]
async fn crash_after_poison_mark() {
    crash_point("poison.after_mark").await;
}

/// Seed 8343 of the simulation: two live copies of one failing job. The
/// first copy's poisoning crashes after its record; its next delivery
/// finishes it and marks the key poisoned. The second copy, put before that
/// poisoning, spent its deliveries waiting behind the key (staged here by
/// receiving it past the delivery bound, 3 x maxDequeueCount, before the
/// worker starts) and is read over the bound once the key is poisoned: a
/// leftover of the poisoned run, settled as a duplicate as its claim would
/// settle it, not poisoned as `crashed` into a second record for the job.
#[tokio::test(start_paused = true)]
async fn a_copy_over_its_bound_of_a_key_poisoned_after_a_crash_is_a_duplicate() {
    let env = Env::new(|_, _| Behave::Retry(DOWN.into()));
    let job = env.job("failing");
    let second = env.enqueue(&job).await;
    let q = env.storage.queue(&env.queue);
    for i in 0..16 {
        let got = q
            .receive(1, minutes(1))
            .await
            .expect("receive the second copy");
        assert_eq!(got.len(), 1, "the second copy is visible");
        let m = &got[0];
        assert_eq!(m.id, second);
        // Given back at once; the last delivery hides it until the first
        // copy is poisoned.
        let hide = if i == 15 { minutes(30) } else { Duration::ZERO };
        q.update_visibility(&m.id, &m.pop_receipt, &m.text, hide)
            .await
            .expect("give the second copy back");
    }
    let first = env.enqueue(&job).await;

    failpoint::arm("poison.after_record");
    let w = start(env.worker());
    env.wait_until(
        "the first copy's poisoning crashed after its record",
        minutes(10),
        || async { failpoint::armed().is_none() },
    )
    .await;
    env.wait_until(
        "the first copy's poisoning finished, the key poisoned",
        minutes(20),
        || async {
            let poisoned = env
                .key(&job.key)
                .await
                .is_some_and(|k| k.status == KeyStatus::Poisoned);
            let named = env
                .records()
                .await
                .iter()
                .any(|r| r.message_id == first && r.poison_message_id.is_some());
            poisoned && named
        },
    )
    .await;
    env.wait_until("the second copy settled", minutes(60), || async {
        env.source_depth().await == 0
    })
    .await;
    w.stop().await;

    let records = env.records().await;
    assert_eq!(
        records.len(),
        1,
        "one poison record for the job\n{}",
        env.dump().await
    );
    assert_eq!(records[0].message_id, first);
    assert_eq!(records[0].status, RecordStatus::Open);
    assert_eq!(env.poison_depth().await, 1, "one poison copy for the job");
}

/// Three jobs poisoned while the provider refused them; the provider fixed;
/// a replay crashes at `point`, and is run again (the runbook's "safe to
/// interrupt and run again").
async fn crash_in_replay(point: &'static str) {
    let env = Env::new(|_, _| Behave::Fail(REJECTED.into()));
    let jobs: Vec<JobSpec> = (0..3).map(|i| env.job(&format!("j{i}"))).collect();
    for j in &jobs {
        env.enqueue(j).await;
    }
    let w = start(env.worker());
    env.wait_until("all poisoned", minutes(5), || async {
        env.records().await.len() == jobs.len() && env.source_depth().await == 0
    })
    .await;
    let failed_pks: Vec<String> = jobs
        .iter()
        .map(|j| env.provider.calls_for(&j.key)[0].provider_key.clone())
        .collect();

    env.provider.set_rule(|_, _| Behave::Succeed);
    failpoint::arm(point);
    let crashed = tokio::spawn(replay_all(env.ops())).await;
    assert!(
        crashed.as_ref().is_err_and(|e| e.is_panic()),
        "{point}: the replay crashed there: {:?}",
        crashed.map(|r| r.replayed)
    );
    assert_eq!(failpoint::armed(), None);
    let again = env.replay_all().await;
    assert_eq!(
        again.failed, 0,
        "{point}: the second run replays the rest: {again:?}"
    );
    env.wait_until(&format!("{point}: every key done"), minutes(10), || async {
        let mut done = true;
        for j in &jobs {
            done &= env
                .key(&j.key)
                .await
                .is_some_and(|k| k.status == KeyStatus::Done);
        }
        done && env.source_depth().await == 0
    })
    .await;
    // The crashed run held the poison copies it scanned (2 min): a later
    // run's scan sees them again and removes a closed record's leftover.
    tokio::time::sleep(Duration::from_secs(121)).await;
    let last = env.replay_all().await;
    assert_eq!(last.selected, 0, "{point}: nothing left open: {last:?}");
    tokio::time::sleep(minutes(1)).await;
    w.stop().await;

    let keys: Vec<String> = jobs.iter().map(|j| j.key.clone()).collect();
    env.provider.assert_applied_once(&keys);
    for (j, pk) in jobs.iter().zip(&failed_pks) {
        let calls = env.provider.calls_for(&j.key);
        assert!(
            calls.iter().all(|c| &c.provider_key == pk),
            "{point}: {calls:?}"
        );
        let applied = calls
            .iter()
            .filter(|c| c.outcome == CallOutcome::Applied)
            .count();
        assert_eq!(applied, 1, "{point}: {calls:?}");
    }
    let records = env.records().await;
    assert_eq!(
        records.len(),
        jobs.len(),
        "{point}: no record lost or added"
    );
    for r in &records {
        assert_eq!(r.status, RecordStatus::Replayed, "{point}: {r:?}");
    }
    assert_eq!(
        env.poison_depth().await,
        0,
        "{point}: no copy left\n{}",
        env.dump().await
    );
    assert_eq!(env.source_depth().await, 0);
}

#[tokio::test(start_paused = true)]
async fn crash_after_replay_put() {
    crash_in_replay("replay.after_put").await;
}

#[tokio::test(start_paused = true)]
async fn crash_after_replay_record() {
    crash_in_replay("replay.after_record").await;
}

/// The crash tests above, and `retention.rs` for `purge.after_batch`.
const COVERED: &[&str] = &[
    "claim.after",
    "effect.after",
    "done.after",
    "poison.after_record",
    "poison.after_put",
    "poison.after_mark",
    "replay.after_put",
    "replay.after_record",
    "purge.after_batch",
];

/// A failpoint added to the engine needs a crash test here.
#[tokio::test(start_paused = true)]
async fn every_failpoint_has_a_crash_test() {
    for p in failpoint::POINTS {
        assert!(COVERED.contains(p), "failpoint {p} has no crash test");
    }
}
