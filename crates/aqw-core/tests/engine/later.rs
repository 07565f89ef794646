//! Every "later" is later, and the rate adapts (issue 49): a provider's
//! bare 429 spends no attempt and slows each replica's adaptive rate until
//! the fleet stays under the provider's limit; a limit that changes
//! mid-run is followed; a 409 "in progress" is waited out until
//! `aqw.inProgressTimeout`, and past it poisoned as `in_progress` with how
//! long it lasted.

use crate::common::*;
use aqw_core::handler::Job;
use aqw_core::message::ErrorKind;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// The share of 429 answers among the calls started in `[from, to)`.
fn share_429(env: &Env, from: Instant, to: Instant) -> (f64, usize) {
    let calls = env.provider.calls();
    let starts = env.provider.call_starts();
    let (mut n, mut refused) = (0usize, 0usize);
    for (c, at) in calls.iter().zip(starts) {
        if at >= from && at < to {
            n += 1;
            if c.outcome == CallOutcome::Failed("HTTP 429".into()) {
                refused += 1;
            }
        }
    }
    (refused as f64 / n.max(1) as f64, n)
}

/// The first 5-second window (from `start`, in 1 s steps) whose 429 share
/// is under 20 %: when the fleet's rate converged under the limit.
fn converged_at(env: &Env, start: Instant, end: Instant) -> Option<Duration> {
    let window = Duration::from_secs(5);
    let mut at = start;
    while at + window <= end {
        let (share, n) = share_429(env, at, at + window);
        if n > 0 && share < 0.2 {
            return Some(at - start);
        }
        at += Duration::from_secs(1);
    }
    None
}

/// 50 replicas, 600 jobs, a provider taking 10 calls a second and
/// answering a bare 429 beyond (no `Retry-After`, as many do): nothing
/// poisoned, nothing doubled, no attempt spent on a refusal, and once the
/// replicas' adaptive rates converge, under 20 % of the calls refused.
#[tokio::test(start_paused = true)]
async fn a_bare_429_fleet_converges_under_the_limit_and_poisons_none() {
    let limit = Arc::new(AtomicU32::new(10));
    // Seeded: the bench prints this run's figures (bench/later.py).
    let env = Env::seeded(4291, limited_to(limit));
    let jobs = env.enqueue_many("b", 600).await;
    let start = Instant::now();
    let fleet: Vec<Running> = (0..50).map(|_| start_replica(&env)).collect();
    env.drained(minutes(30)).await;
    let end = Instant::now();
    for r in fleet {
        r.stop().await;
    }
    let calls = env.provider.calls();
    if std::env::var("AQW_DEBUG_RATE").is_ok() {
        let starts = env.provider.call_starts();
        let mut per_s: std::collections::BTreeMap<u64, (u32, u32)> = Default::default();
        for (c, at) in calls.iter().zip(starts) {
            let e = per_s.entry((at - start).as_secs()).or_default();
            e.0 += 1;
            if c.outcome == CallOutcome::Failed("HTTP 429".into()) {
                e.1 += 1;
            }
        }
        eprintln!("{per_s:?}");
    }
    let (overall, _) = share_429(&env, start, end);
    let converged = converged_at(&env, start, end).expect("the fleet converged");
    let (after, n_after) = share_429(&env, start + converged, end);
    println!(
        "bare 429 at 10/s, 50 replicas, {} jobs: {} calls over {:?}, 429 share {:.1} % overall; converged after {:?}, then {:.1} % of {n_after} calls answered 429",
        jobs.len(),
        calls.len(),
        end - start,
        overall * 100.0,
        converged,
        after * 100.0,
    );
    assert!(env.records().await.is_empty(), "nothing poisoned");
    env.provider.assert_applied_once(&jobs);
    let max_dc = calls.iter().map(|c| c.dequeue_count).max().unwrap_or(0);
    assert_eq!(max_dc, 1, "a refusal spends no attempt");
    assert!(after < 0.2, "429 share after convergence: {after}");
}

/// One replica of the test's function, started.
fn start_replica(env: &Env) -> Running {
    start(env.worker())
}

/// A provider whose limit moves from 10 to 3 to 20 calls a second while
/// 12 replicas work through 500 jobs: each change is followed, none is
/// poisoned or doubled.
#[tokio::test(start_paused = true)]
async fn a_limit_that_changes_mid_run_is_followed() {
    let limit = Arc::new(AtomicU32::new(10));
    let env = Env::seeded(4292, limited_to(limit.clone()));
    let jobs = env.enqueue_many("c", 500).await;
    let start = Instant::now();
    let fleet: Vec<Running> = (0..12).map(|_| start_replica(&env)).collect();
    tokio::time::sleep(Duration::from_secs(20)).await;
    limit.store(3, Ordering::Relaxed);
    let low = Instant::now();
    tokio::time::sleep(Duration::from_secs(30)).await;
    limit.store(20, Ordering::Relaxed);
    let high = Instant::now();
    env.drained(minutes(30)).await;
    let end = Instant::now();
    for r in fleet {
        r.stop().await;
    }
    let phases = [(start, low), (low, high), (high, end)];
    let shares: Vec<String> = phases
        .iter()
        .map(|(a, b)| {
            let (s, n) = share_429(&env, *a, *b);
            let rate = n as f64 * (1.0 - s) / (*b - *a).as_secs_f64().max(1.0);
            format!("{:.1} % of {n} calls, {rate:.1} done/s", s * 100.0)
        })
        .collect();
    println!(
        "limit 10 → 3 → 20/s, 12 replicas, {} jobs in {:?}: 429 share per phase {shares:?}",
        jobs.len(),
        end - start
    );
    assert!(env.records().await.is_empty(), "nothing poisoned");
    env.provider.assert_applied_once(&jobs);
}

/// A replica its provider throttles shares its learned rate on its
/// evidence row, where `aqw status` reads the fleet's (the sum, how many
/// replicas, the newest row's age); once the provider stops throttling,
/// the rows go after `SHARE_FOR` and the status shows none.
#[tokio::test(start_paused = true)]
async fn the_learned_rate_is_shared_and_shown_by_status() {
    let limit = Arc::new(AtomicU32::new(3));
    let env = Env::new(limited_to(limit.clone()));
    let jobs = env.enqueue_many("s", 120).await;
    let fleet: Vec<Running> = (0..4).map(|_| start_replica(&env)).collect();
    let ops = env.ops();
    let learned = || async {
        aqw_core::ops::status(&ops)
            .await
            .expect("status")
            .learned_rate
    };
    env.wait_until("three replicas share a rate", minutes(5), || async {
        learned().await.is_some_and(|r| r.replicas >= 3)
    })
    .await;
    let r = learned().await.expect("a learned rate");
    println!("shared while throttled at 3/s: {}", r.describe());
    assert!(r.sum > 0.0 && r.sum < 100.0, "{r:?}");
    assert!(r.min <= r.median && r.median <= r.max, "{r:?}");
    assert!(r.newest_age_s <= 150.0, "{r:?}");
    limit.store(1000, Ordering::Relaxed);
    env.drained(minutes(30)).await;
    env.wait_until("the episode over, the rows gone", minutes(15), || async {
        learned().await.is_none()
    })
    .await;
    for f in fleet {
        f.stop().await;
    }
    assert!(env.records().await.is_empty(), "nothing poisoned");
    env.provider.assert_applied_once(&jobs);
}

/// The adaptive rate costs nothing on the happy path: 200 keyed jobs on
/// one replica, nothing throttled, make the same storage requests per
/// message with `aqw.adaptiveRate` on (the default) and off (the test's
/// own depth polls, `queue.metadata`, left out).
#[tokio::test(start_paused = true)]
async fn the_adaptive_rate_costs_no_request_on_the_happy_path() {
    let mut per_message = Vec::new();
    for on in [true, false] {
        let env = Env::seeded(4293, |_, _| Behave::Succeed);
        let jobs = env.enqueue_many("h", 200).await;
        env.storage.reset_request_counts();
        let worker = env
            .builder()
            .configure(move |app| app.adaptive_rate = on)
            .build()
            .expect("valid settings");
        let running = start(worker);
        env.drained(minutes(5)).await;
        running.stop().await;
        env.provider.assert_applied_once(&jobs);
        let counts = env.storage.request_counts();
        let requests: u64 = counts
            .iter()
            .filter(|(op, _)| op.as_str() != "queue.metadata")
            .map(|(_, n)| n)
            .sum();
        per_message.push(requests as f64 / jobs.len() as f64);
        let rows = aqw_core::control::ControlStore::new(aqw_core::storage::Storage::table(
            &env.storage,
            &env.control_table,
        ))
        .all()
        .await
        .expect("read the control rows");
        assert!(
            rows.evidence.is_empty(),
            "no evidence row: {:?}",
            rows.evidence
        );
    }
    println!(
        "happy path, 200 keyed jobs on one replica: {:.3} storage requests per message with the adaptive rate on, {:.3} off",
        per_message[0], per_message[1]
    );
    assert!(
        (per_message[0] - per_message[1]).abs() < 0.05,
        "on {} vs off {}",
        per_message[0],
        per_message[1]
    );
}

/// A provider that answers 409 "in progress" for `lasting` after a key's
/// first call, then applies it.
fn in_progress_for(lasting: Duration) -> impl Fn(&Job, usize) -> Behave + Send + Sync + 'static {
    let first: Mutex<HashMap<String, Instant>> = Mutex::new(HashMap::new());
    move |job, _| {
        let key = job.key.as_ref().map(|k| k.to_string()).unwrap_or_default();
        let mut first = first.lock().unwrap();
        let since = *first.entry(key).or_insert_with(Instant::now);
        if since.elapsed() < lasting {
            Behave::InProgress
        } else {
            Behave::Succeed
        }
    }
}

/// An "in progress" of 8 s (the case: 3 jobs poisoned after
/// 5 × 409 in 3 s) is waited out: done, no attempt spent, nothing poisoned.
#[tokio::test(start_paused = true)]
async fn an_in_progress_of_eight_seconds_is_waited_out() {
    let env = Env::new(in_progress_for(Duration::from_secs(8)));
    let jobs = env.enqueue_many("p", 3).await;
    let running = start(env.worker());
    env.drained(minutes(5)).await;
    running.stop().await;
    assert!(env.records().await.is_empty(), "nothing poisoned");
    env.provider.assert_applied_once(&jobs);
    let calls = env.provider.calls();
    assert!(calls.len() > 3 * 2, "several 409s per job: {}", calls.len());
    assert!(
        calls.iter().all(|c| c.dequeue_count == 1),
        "every wait a fresh copy: no attempt spent"
    );
    let rec = env.key(&jobs[0]).await.expect("the key");
    assert!(
        rec.history.iter().any(|a| a.outcome == "in_progress"),
        "the waits are in the key's history: {:?}",
        rec.history
    );
}

/// An "in progress" that outlasts `aqw.inProgressTimeout` (here 1 min):
/// after it, each 409 is an uncertain attempt, and at the cap the job is
/// poisoned as `in_progress`, its error saying how long it lasted.
#[tokio::test(start_paused = true)]
async fn an_in_progress_past_the_timeout_is_poisoned_with_its_duration() {
    let env = Env::new(|_, _| Behave::InProgress);
    let job = env.job("stuck");
    env.enqueue(&job).await;
    let worker = env
        .builder()
        .configure(|app| app.in_progress_timeout = Duration::from_secs(60))
        .build()
        .expect("valid settings");
    let running = start(worker);
    env.wait_until("poisoned", minutes(10), || async {
        env.records().await.len() == 1
    })
    .await;
    running.stop().await;
    let rec = &env.records().await[0];
    assert_eq!(rec.error.kind, ErrorKind::InProgress, "{:?}", rec.error);
    let m = &rec.error.message;
    assert!(m.contains("(in progress for 1m"), "{m}");
    let calls = env.provider.calls_for(&job.key);
    let spent = calls.iter().filter(|c| c.dequeue_count > 1).count();
    assert_eq!(spent, 4, "attempts 2 to 5 after the timeout");
    assert!(calls.len() > 5, "waited before spending: {}", calls.len());
}
