//! Retention never deletes a key an open poison record needs. Three jobs: G
//! succeeds (a settled key nobody needs); P is refused for good (an open
//! record, its key poisoned); J was enqueued twice, its first copy
//! poisoned and its second, arriving minutes later after the fix, done: an
//! open record whose key is done, the one case where only the open-record
//! guard stands between the purge and a key a replay needs.

use crate::common::*;
use aqw_core::failpoint;
use aqw_core::idempotency::KeyStatus;
use aqw_core::ops::{PurgeOptions, ReplayAction, ReplayOptions};
use aqw_core::poison::RecordStatus;
use aqw_core::retention::sweep::{LEASE_PARTITION, LEASE_ROW};
use aqw_core::storage::Storage;
use serde_json::Value;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

const REJECTED: &str = "HTTP 422: amount must be positive";

/// Past the default keys retention (30 days).
const PAST_RETENTION: Duration = Duration::from_secs(31 * 86_400);

/// The worker's sweep rounds (1 h by default), shorter to keep the test
/// short.
const SWEEP_INTERVAL: Duration = Duration::from_secs(600);

struct Setup {
    env: Env,
    g: JobSpec,
    p: JobSpec,
    j: JobSpec,
    /// The poisoned first copy of J (its record's id).
    j_poisoned: String,
    worker: Option<Running>,
}

async fn setup() -> Setup {
    let fixed = Arc::new(AtomicBool::new(false));
    let is_fixed = fixed.clone();
    let env = Env::new(move |job, _| {
        let name = serde_json::from_str::<Value>(&job.payload).unwrap()["name"]
            .as_str()
            .unwrap_or("")
            .to_string();
        match name.as_str() {
            "g" => Behave::Succeed,
            "j" if is_fixed.load(Ordering::SeqCst) => Behave::Succeed,
            _ => Behave::Fail(REJECTED.into()),
        }
    });
    let named = |n: &str| env.job_with(n, serde_json::json!({ "name": n }));
    let (g, p, j) = (named("g"), named("p"), named("j"));
    env.enqueue(&g).await;
    env.enqueue(&p).await;
    let j_poisoned = env.enqueue(&j).await;
    env.enqueue_after(&j, Duration::from_secs(300)).await;
    let worker = env
        .builder()
        .configure(|app| app.retention.sweep.interval = SWEEP_INTERVAL)
        .build()
        .unwrap();
    let worker = start(worker);
    env.wait_until("P and J's first copy poisoned", minutes(5), || async {
        env.records().await.len() == 2
    })
    .await;
    fixed.store(true, Ordering::SeqCst);
    env.wait_until("J's second copy ran", minutes(10), || async {
        env.key(&j.key)
            .await
            .is_some_and(|k| k.status == KeyStatus::Done)
    })
    .await;
    env.drained(minutes(5)).await;
    let s = Setup {
        env,
        g,
        p,
        j,
        j_poisoned,
        worker: Some(worker),
    };
    s.assert_keys(true).await;
    s
}

impl Setup {
    /// J and P kept (as they were), G kept or purged.
    async fn assert_keys(&self, g_kept: bool) {
        let env = &self.env;
        let status = |k: Option<aqw_core::idempotency::KeyRecord>| k.map(|k| k.status);
        assert_eq!(status(env.key(&self.j.key).await), Some(KeyStatus::Done));
        assert_eq!(
            status(env.key(&self.p.key).await),
            Some(KeyStatus::Poisoned)
        );
        let g = status(env.key(&self.g.key).await);
        assert_eq!(g, g_kept.then_some(KeyStatus::Done), "G's key");
        let open: Vec<String> = env
            .records()
            .await
            .into_iter()
            .filter(|r| r.status == RecordStatus::Open)
            .filter_map(|r| r.key.map(|k| k.to_string()))
            .collect();
        assert!(
            open.contains(&self.j.key) && open.contains(&self.p.key),
            "{open:?}"
        );
    }

    /// Replaying J's record after the purge: closed "already done" from the
    /// key the purge kept, nothing put back, no second run.
    async fn replay_j(&self) {
        let env = &self.env;
        let opts = ReplayOptions {
            by: "oncall".into(),
            concurrency: 1,
            filter: aqw_core::ops::Filter {
                ids: vec![self.j_poisoned.clone()],
                ..Default::default()
            },
            ..Default::default()
        };
        let report = aqw_core::ops::replay(&env.ops(), &opts, &|_: usize, _: usize| {})
            .await
            .unwrap();
        assert_eq!(report.items.len(), 1);
        assert_eq!(
            report.items[0].action,
            ReplayAction::AlreadyDone,
            "{report:?}"
        );
        assert_eq!(env.source_depth().await, 0, "not re-put");
        let runs = env
            .provider
            .calls_for(&self.j.key)
            .into_iter()
            .filter(|c| c.outcome == CallOutcome::Applied)
            .count();
        assert_eq!(runs, 1, "J ran once");
        env.provider
            .assert_applied_once(&[self.g.key.clone(), self.j.key.clone()]);
    }
}

/// `aqw keys purge` past the retention: G's key goes, J's (done, but
/// referred to by an open record) and P's (poisoned) stay.
#[tokio::test(start_paused = true)]
async fn the_purge_keeps_a_key_an_open_record_needs() {
    let mut s = setup().await;
    s.worker.take().expect("running").stop().await;
    let env = &s.env;
    tokio::time::advance(PAST_RETENTION).await;

    let purge = |dry_run| async move {
        let opts = PurgeOptions {
            older_than: None,
            dry_run,
        };
        aqw_core::ops::purge_keys(
            &env.app(),
            &env.storage,
            std::slice::from_ref(&env.function),
            opts,
        )
        .await
        .unwrap()
    };
    let dry = purge(true).await;
    assert_eq!((dry.counts.deleted, dry.counts.kept_open_record), (1, 1));
    s.assert_keys(true).await;
    let report = purge(false).await;
    assert_eq!(report.counts.scanned, 2, "the two settled keys: {report:?}");
    assert_eq!(report.counts.deleted, 1, "G's: {report:?}");
    assert_eq!(report.counts.kept_open_record, 1, "J's: {report:?}");
    s.assert_keys(false).await;
    assert_eq!(env.key_rows().await.len(), 2);
    s.replay_j().await;
}

/// Whether the worker's sweeper finished a round: a finished sweep holds
/// its lease until the next round.
async fn sweep_finished(env: &Env) -> bool {
    let keys = env.storage.table(&env.keys_table);
    let until = keys.get(LEASE_PARTITION, LEASE_ROW).await.ok().flatten();
    let until = until
        .and_then(|(e, _)| e.get("Until")?.as_str().map(str::to_string))
        .and_then(|u| OffsetDateTime::parse(&u, &Rfc3339).ok());
    until.is_some_and(|u| u - env.storage.now() > SWEEP_INTERVAL / 2)
}

/// The sweep of a running worker, past the retention: the same outcome.
#[tokio::test(start_paused = true)]
async fn the_workers_sweep_keeps_a_key_an_open_record_needs() {
    let mut s = setup().await;
    let env = &s.env;
    // Its first round (nothing old enough yet) ends before the clock
    // jumps, so the round that counts starts after.
    env.wait_until("the first sweep finished", minutes(20), || {
        sweep_finished(env)
    })
    .await;
    s.assert_keys(true).await;
    tokio::time::advance(PAST_RETENTION).await;
    assert!(!sweep_finished(env).await);
    env.wait_until("a sweep finished after the advance", minutes(20), || {
        sweep_finished(env)
    })
    .await;
    s.assert_keys(false).await;
    s.replay_j().await;
    s.worker.take().expect("running").stop().await;
}

/// A purge crashed between two batches is finished by the next run, and
/// neither deletes the key an open record needs.
#[tokio::test(start_paused = true)]
async fn a_purge_crashed_between_batches_is_finished_by_the_next() {
    let mut s = setup().await;
    let env = &s.env;
    // Many settled keys, spread over the partitions the purge walks one
    // batch at a time.
    let more: Vec<JobSpec> = (0..150)
        .map(|i| env.job_with(&format!("more{i}"), serde_json::json!({ "name": "g" })))
        .collect();
    for j in &more {
        env.enqueue(j).await;
    }
    env.wait_until("the others done", minutes(10), || async {
        env.source_depth().await == 0 && env.key_rows().await.len() == 3 + more.len()
    })
    .await;
    s.worker.take().expect("running").stop().await;
    tokio::time::advance(PAST_RETENTION).await;

    let purge = || {
        let (app, storage, f) = (env.app(), env.storage.clone(), env.function.clone());
        async move {
            aqw_core::ops::purge_keys(&app, &storage, &[f], PurgeOptions::default())
                .await
                .unwrap()
        }
    };
    failpoint::arm("purge.after_batch");
    let crashed = tokio::spawn(purge()).await;
    assert!(crashed.is_err_and(|e| e.is_panic()), "the purge crashed");
    assert_eq!(failpoint::armed(), None);
    let left_after_crash = env.key_rows().await.len();
    assert!(
        left_after_crash > 2 && left_after_crash < 3 + more.len(),
        "one batch deleted before the crash: {left_after_crash} rows left"
    );
    let report = purge().await;
    assert_eq!(report.counts.kept_open_record, 1, "{report:?}");
    assert_eq!(
        report.counts.deleted as usize,
        left_after_crash - 2,
        "the rest: {report:?}"
    );
    s.assert_keys(false).await;
    assert_eq!(env.key_rows().await.len(), 2, "J's and P's");
    for j in &more {
        assert!(env.key(&j.key).await.is_none(), "{} purged", j.key);
    }
}

/// `aqw serve`'s maintenance on 8 replicas at once (a Flex app scaled out):
/// the sweeper lease lets one replica sweep the account per interval. Each
/// finished round leaves the lease until the next one, so two rounds'
/// `Until` are at least an interval apart; at least one round runs per
/// interval (plus the time a lease taker needs), whoever sweeps.
#[tokio::test(start_paused = true)]
async fn eight_serve_replicas_sweep_the_account_once_per_interval() {
    let env = Env::new(|_, _| Behave::Succeed);
    let interval = minutes(10);
    let replicas: Vec<_> = (0..8)
        .map(|_| {
            env.builder()
                .configure(|app| app.retention.sweep.interval = interval)
                .build()
                .expect("valid settings")
        })
        .collect();
    let stop = tokio_util::sync::CancellationToken::new();
    let mut tasks = vec![];
    for w in &replicas {
        let (app, rts) = (w.config().clone(), w.runtimes().to_vec());
        assert!(aqw_core::runtime::ensure_resources(&rts, &stop).await);
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            aqw_core::worker::serve_maintenance(&app, &rts, stop).await
        }));
    }
    let keys = env.storage.table(&env.keys_table);
    let (mut rounds, mut owners) = (
        Vec::<OffsetDateTime>::new(),
        std::collections::BTreeSet::new(),
    );
    let rounds_wanted = 12;
    let end = tokio::time::Instant::now() + interval * (rounds_wanted + 2);
    while tokio::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let Some((row, _)) = keys.get(LEASE_PARTITION, LEASE_ROW).await.unwrap() else {
            continue;
        };
        let until = row["Until"]
            .as_str()
            .and_then(|u| OffsetDateTime::parse(u, &Rfc3339).ok());
        let Some(until) = until else { continue };
        // A finished round holds the lease for the interval; a sweep in
        // progress holds it for `lease` only.
        if until - env.storage.now() > interval / 2 && rounds.last() != Some(&until) {
            rounds.push(until);
            owners.insert(row["Owner"].as_str().unwrap_or_default().to_string());
        }
    }
    stop.cancel();
    for t in tasks {
        t.await.unwrap();
    }
    for pair in rounds.windows(2) {
        assert!(
            pair[1] - pair[0] >= interval,
            "two sweeps within one interval: {rounds:?}"
        );
    }
    assert!(
        rounds.len() as u32 >= rounds_wanted - 1,
        "{} rounds: {rounds:?}",
        rounds.len()
    );
    println!(
        "{} sweep rounds by {} of 8 replicas in {} intervals",
        rounds.len(),
        owners.len(),
        rounds_wanted + 2
    );
}
