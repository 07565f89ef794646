//! Outages. The circuit breaker (`src/breaker/`) counts retryable
//! failures by distinct job (`spread.rs` has the fleet-wide cases): a provider that is down fails everyone, the
//! breaker opens and parks what it received (a fresh copy, so the wasted
//! receives spend no attempt), and nothing is walked to poison; without it
//! the same outage poisons. A partial outage (a few keys failing every
//! time) never trips it, and those keys reach poison as before. A storage
//! outage loses nothing and doubles nothing.

use crate::common::*;
use aqw_core::alert::AlertEvent;
use aqw_core::breaker::BreakerSettings;
use aqw_core::idempotency::KeyStatus;
use aqw_core::message::ErrorKind;
use aqw_core::poison::RecordStatus;
use serde_json::json;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const UNAVAILABLE: &str = "HTTP 503 Service Unavailable";

/// A provider down (503 to every call) until the switch is turned off.
fn down_provider() -> (Env, Arc<AtomicBool>) {
    let down = Arc::new(AtomicBool::new(true));
    let is_down = down.clone();
    let env = Env::new(move |_, _| {
        if is_down.load(Ordering::SeqCst) {
            Behave::Retry(UNAVAILABLE.into())
        } else {
            Behave::Succeed
        }
    });
    (env, down)
}

async fn enqueue_jobs(env: &Env, n: usize) -> Vec<JobSpec> {
    let jobs: Vec<JobSpec> = (0..n).map(|i| env.job(&format!("o{i}"))).collect();
    for j in &jobs {
        env.enqueue(j).await;
    }
    jobs
}

/// The breaker transitions announced since the last look (their `state`).
fn breaker_states(env: &Env) -> Vec<String> {
    env.alerts()
        .into_iter()
        .filter_map(|a| match a {
            AlertEvent::Breaker(body) => body["state"].as_str().map(str::to_string),
            AlertEvent::Poisoned(_) | AlertEvent::Notice(_) => None,
        })
        .collect()
}

async fn all_done(env: &Env, jobs: &[JobSpec]) -> bool {
    for j in jobs {
        if !env
            .key(&j.key)
            .await
            .is_some_and(|k| k.status == KeyStatus::Done)
        {
            return false;
        }
    }
    env.source_depth().await == 0
}

/// Ten minutes of a provider down for everyone, 100 jobs: the breaker
/// opens, the provider sees only probes while it is open, no job is
/// poisoned or even nears its cap; after the outage every job runs once.
#[tokio::test(start_paused = true)]
async fn a_full_outage_opens_the_breaker_and_poisons_nothing() {
    let (env, down) = down_provider();
    let jobs = enqueue_jobs(&env, 100).await;
    let app = env.app();
    let in_flight = (app.batch_size + app.new_batch_threshold) as usize;
    let w = start(env.worker());
    env.wait_until("the breaker opened", minutes(5), || async {
        env.control().await.breaker_open()
    })
    .await;
    let at_open = env.provider.calls().len();
    // The outage lasts this long: not a synchronisation.
    tokio::time::sleep(minutes(10)).await;
    let during = env.provider.calls().len() - at_open;
    let states = breaker_states(&env);
    assert!(env.records().await.is_empty(), "an outage poisons nothing");
    assert_eq!(env.poison_depth().await, 0);
    let probes = states.iter().filter(|s| *s == "half-open").count();
    println!(
        "calls before the breaker opened: {at_open}; while open: {during}; transitions {states:?}"
    );
    assert!(states.first().is_some_and(|s| s == "open"), "{states:?}");
    assert!(
        probes >= 2,
        "the breaker probed during the outage: {states:?}"
    );
    // Each half-open lets 2 probe messages through (the default).
    assert!(
        during <= 2 * probes + in_flight,
        "{during} calls while open ({probes} probe rounds, {in_flight} in flight at most)"
    );
    assert!(
        at_open < 100,
        "the breaker opened before every job was tried: {at_open}"
    );

    down.store(false, Ordering::SeqCst);
    env.wait_until("every job done after the outage", minutes(30), || async {
        all_done(&env, &jobs).await
    })
    .await;
    w.stop().await;

    let keys: Vec<String> = jobs.iter().map(|j| j.key.clone()).collect();
    env.provider.assert_applied_once(&keys);
    let max_dc = env.provider.calls().iter().map(|c| c.dequeue_count).max();
    assert!(
        max_dc.is_some_and(|dc| dc < 5),
        "parked copies spent no attempt: highest dequeue count {max_dc:?}"
    );
    assert!(env.records().await.is_empty(), "nothing poisoned");
    assert_eq!(env.poison_depth().await, 0);
    assert_eq!(env.source_depth().await, 0);
    let c = env.control().await;
    assert_eq!(c.breaker.map(|b| b.state).as_deref(), Some("closed"));
    assert_eq!(
        breaker_states(&env).last().map(String::as_str),
        Some("closed")
    );
}

/// Ten minutes of outage under a breaker that probes every second or two:
/// each of the ten jobs is probed again and again, and a failed probe is
/// parked as a fresh copy, so the outage spends none of their attempts
/// (the cap counts real failures): no job goes past its second delivery.
#[tokio::test(start_paused = true)]
async fn a_long_outage_spends_no_attempt() {
    let (env, down) = down_provider();
    let jobs = enqueue_jobs(&env, 10).await;
    let quick = BreakerSettings {
        failure_ratio: 0.8,
        minimum_attempts: 10,
        window: Duration::from_secs(10),
        cool_down: Duration::from_millis(500),
        max_cool_down: Duration::from_secs(1),
        probes: 1,
        ..BreakerSettings::default()
    };
    let worker = env
        .builder_on(Arc::new(env.storage.clone()), |f| f.breaker = Some(quick))
        .build()
        .unwrap();
    let w = start(worker);
    env.wait_until("the breaker opened", minutes(5), || async {
        env.control().await.breaker_open()
    })
    .await;
    // The outage lasts this long: not a synchronisation.
    tokio::time::sleep(minutes(10)).await;
    let calls = env.provider.calls().len();
    assert!(
        calls > 10 * 5,
        "each job was probed over and over: {calls} calls"
    );
    assert!(env.records().await.is_empty(), "an outage poisons nothing");
    assert_eq!(env.poison_depth().await, 0);

    down.store(false, Ordering::SeqCst);
    env.wait_until("every job done after the outage", minutes(30), || async {
        all_done(&env, &jobs).await
    })
    .await;
    w.stop().await;
    let keys: Vec<String> = jobs.iter().map(|j| j.key.clone()).collect();
    env.provider.assert_applied_once(&keys);
    let max_dc = env.provider.calls().iter().map(|c| c.dequeue_count).max();
    assert!(
        max_dc.is_some_and(|dc| dc <= 2),
        "one real failure at most, then a fresh copy: highest dequeue count {max_dc:?}"
    );
    assert!(env.records().await.is_empty(), "nothing poisoned");
    assert_eq!(env.source_depth().await, 0);
}

/// The same outage without the breaker walks jobs to poison: what the
/// breaker prevents above.
#[tokio::test(start_paused = true)]
async fn without_the_breaker_the_same_outage_poisons() {
    let (env, _down) = down_provider();
    enqueue_jobs(&env, 40).await;
    let worker = env
        .builder_on(Arc::new(env.storage.clone()), |f| f.breaker = None)
        .build()
        .unwrap();
    let w = start(worker);
    env.wait_until("jobs poisoned", minutes(10), || async {
        !env.records().await.is_empty()
    })
    .await;
    w.stop().await;
    assert!(env.poison_depth().await > 0);
    assert!(breaker_states(&env).is_empty());
}

/// 100 jobs, those with `bad(i)` failing every time (their own keys, not
/// the provider): the breaker, which counts first attempts only, never
/// trips; the failing keys reach poison after their five attempts, the
/// others run once.
async fn partial_outage(bad: impl Fn(usize) -> bool) {
    let env = Env::new(|job, _| {
        if is_bad(job) {
            Behave::Retry(UNAVAILABLE.into())
        } else {
            Behave::Succeed
        }
    });
    let jobs: Vec<(JobSpec, bool)> = (0..100)
        .map(|i| {
            (
                env.job_with(&format!("o{i}"), json!({ "bad": bad(i) })),
                bad(i),
            )
        })
        .collect();
    let n_bad = jobs.iter().filter(|(_, b)| *b).count();
    for (j, _) in &jobs {
        env.enqueue(j).await;
    }
    let w = start(env.worker());
    env.wait_until("the bad poisoned, the rest done", minutes(30), || async {
        env.records().await.len() == n_bad && env.source_depth().await == 0
    })
    .await;
    w.stop().await;

    let good: Vec<String> = jobs
        .iter()
        .filter(|(_, b)| !b)
        .map(|(j, _)| j.key.clone())
        .collect();
    let bad: BTreeSet<String> = jobs
        .iter()
        .filter(|(_, b)| *b)
        .map(|(j, _)| j.key.clone())
        .collect();
    env.provider.assert_applied_once(&good);
    for k in &good {
        assert_eq!(env.key(k).await.map(|r| r.status), Some(KeyStatus::Done));
    }
    let records = env.records().await;
    let poisoned: BTreeSet<String> = records
        .iter()
        .filter_map(|r| r.key.as_ref().map(|k| k.to_string()))
        .collect();
    assert_eq!(poisoned, bad, "exactly the failing keys are poisoned");
    for r in &records {
        assert_eq!(r.status, RecordStatus::Open);
        assert_eq!((r.error.kind, r.dequeue_count), (ErrorKind::Retryable, 5));
    }
    for k in &bad {
        assert_eq!(
            env.provider.calls_for(k).len(),
            5,
            "{k}: every attempt used"
        );
    }
    assert_eq!(env.poison_depth().await, n_bad as u64, "one copy each");
    assert!(
        breaker_states(&env).is_empty(),
        "a partial outage never trips"
    );
    assert!(env.control().await.breaker.is_none());
}

/// One job in five fails every time (`tests/outage.rs`' partial outage).
#[tokio::test(start_paused = true)]
async fn a_partial_outage_poisons_its_own_keys_and_lets_the_rest_through() {
    partial_outage(|i| i % 5 == 0).await;
}

/// Three jobs in four fail every time: 75 % of first attempts fail, under
/// the 90 % that trips, while with their retries counted the failures
/// would be over it.
#[tokio::test(start_paused = true)]
async fn retries_of_failing_keys_do_not_trip_the_breaker() {
    partial_outage(|i| i % 4 != 0).await;
}

/// Storage unreachable for five minutes while jobs run: the worker backs
/// off and carries on, every job runs, none twice, none poisoned.
#[tokio::test(start_paused = true)]
async fn a_storage_outage_loses_nothing_and_doubles_nothing() {
    let env = Env::new(|_, _| Behave::Succeed);
    env.provider.set_delay(Duration::from_secs(2));
    let jobs = enqueue_jobs(&env, 40).await;
    let w = start(env.worker());
    env.wait_until("jobs running", minutes(5), || async {
        env.provider.calls().len() >= 5
    })
    .await;
    env.storage.set_unavailable(true);
    // The outage lasts this long: not a synchronisation.
    tokio::time::sleep(minutes(5)).await;
    assert!(
        !w.is_finished(),
        "the worker keeps going through the outage"
    );
    env.storage.set_unavailable(false);
    env.wait_until("every job done after the outage", minutes(30), || async {
        all_done(&env, &jobs).await
    })
    .await;
    w.stop().await;

    let keys: Vec<String> = jobs.iter().map(|j| j.key.clone()).collect();
    env.provider.assert_applied_once(&keys);
    assert!(env.records().await.is_empty(), "nothing poisoned");
    assert_eq!(env.poison_depth().await, 0);
    assert_eq!(env.key_rows().await.len(), jobs.len());
}

/// Seed 6936 of the simulation, staged on two replicas' gates: r1's
/// breaker opened in a full outage and enough distinct outage jobs failed
/// its probes that each failed probe reopens it. r2's probe succeeds and
/// publishes `closed`; r1's next half-open publish overwrites that state
/// before r1 ever read it, and r1 sees no success of its own (only a job
/// failing alone is left). r1's next read still learns of the close (the
/// row keeps the probe's close apart from its state) and closes, so that
/// job's failures are its own again (counted, not parked) and it can reach
/// poison.
#[tokio::test(start_paused = true)]
async fn a_probe_close_overwritten_before_it_was_read_still_closes_the_fleet() {
    use aqw_core::alert::Alerts;
    use aqw_core::breaker::{job_id, Admission, Attempt};
    use aqw_core::control::ControlStore;
    use aqw_core::gate::Gate;
    use aqw_core::storage::Storage;
    let env = Env::new(|_, _| Behave::Succeed);
    let control = ControlStore::new(env.storage.table(&env.control_table));
    control.create_if_missing().await.unwrap();
    let settings = Some(BreakerSettings::default());
    let gate = |w: &str| {
        Gate::new(
            &env.function,
            w,
            settings,
            control.clone(),
            Alerts::disabled(),
        )
    };
    let (r1, r2) = (gate("w-1"), gate("w-2"));
    let down = |i: usize| Attempt::FailedRetryable(job_id(&format!("outage-{i}")));
    let step = Duration::from_secs(1);
    // The outage trips r1 (the quiet rule: five distinct jobs failing).
    let mut i = 0;
    while r1.holds().is_none() {
        assert!(i < 60, "five distinct jobs failing trip the breaker");
        r1.record(down(i), Some(UNAVAILABLE));
        i += 1;
        tokio::time::advance(step).await;
    }
    // Three openings' probes, two each, fail on distinct outage jobs.
    for _ in 0..3 {
        let mut waited = 0;
        while !matches!(r1.admit(2), Admission::Receive(2)) {
            assert!(waited < 400, "the cool-down ends");
            waited += 1;
            tokio::time::advance(step).await;
        }
        for _ in 0..2 {
            r1.record(down(i), Some(UNAVAILABLE));
            i += 1;
        }
        assert!(r1.holds().is_some(), "a failed probe of a new job reopens");
    }
    let row = |state: &'static str, worker: &'static str| {
        let env = &env;
        move || async move {
            let c = env.control().await;
            c.breaker
                .is_some_and(|b| b.state == state && b.worker == worker)
        }
    };
    env.wait_until(
        "r1's opening published",
        Duration::from_secs(5),
        row("open", "w-1"),
    )
    .await;
    // r2 follows r1's row, probes once it hears no verdict, and succeeds.
    r2.refresh().await;
    r1.refresh().await;
    let mut waited = 0;
    while !matches!(r2.admit(2), Admission::Receive(n) if n > 0) {
        assert!(waited < 700, "a follower probes once it hears no verdict");
        waited += 1;
        tokio::time::advance(step).await;
    }
    r2.record(Attempt::Succeeded(job_id("good")), None);
    assert_eq!(r2.holds(), None, "r2's probe closed its breaker");
    env.wait_until(
        "r2's close published",
        Duration::from_secs(5),
        row("closed", "w-2"),
    )
    .await;
    // r1's cool-down ends before its next read: its half-open state
    // overwrites r2's `closed`.
    let mut waited = 0;
    while !matches!(r1.admit(2), Admission::Receive(_)) {
        assert!(waited < 400, "r1's cool-down ends");
        waited += 1;
        tokio::time::advance(step).await;
    }
    env.wait_until(
        "r1's probing published",
        Duration::from_secs(5),
        row("half-open", "w-1"),
    )
    .await;
    eprintln!(
        "DBG before {:?} {:?} {:?}",
        r1.holds(),
        r1.allowance(),
        env.control().await
    );
    r1.refresh().await;
    eprintln!("DBG after {:?} {:?}", r1.holds(), r1.allowance());
    assert_eq!(r1.holds(), None, "the fleet's close reached r1");
    assert_eq!(
        r1.allowance(),
        Some(2),
        "closed, ramping up from the probes"
    );
    // A job failing alone is now its own: counted, never parked.
    let alone = Attempt::FailedRetryable(job_id("failing-alone"));
    for _ in 0..4 {
        r1.record(alone, Some("HTTP 500 fails alone"));
        assert_eq!(r1.holds(), None, "one key failing alone trips nothing");
        tokio::time::advance(step).await;
    }
}
