//! Retention against Azurite: the purges delete settled keys and closed
//! records only, never a key that is pending, poisoned or referred to by an
//! open record; a dry run changes nothing; a killed purge is finished by the
//! next; two sweeping workers keep the key table bounded; bad settings exit 2.

use crate::common::*;
use aqw_core::idempotency::{IdempotencyKey, KeyStore, NextAction};
use aqw_core::ops::{self, PurgeOptions};
use aqw_core::retention::{purge_partition, Pacer, PurgeRun};
use aqw_core::storage::{Entity, TableStore};
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashSet};
use std::time::Duration;

/// Short retention, allowed only by the testing override; no background sweep.
fn short_retention(sweep: Value) -> Value {
    json!({ "retention": {
        "keys": "00:00:01",
        "closedRecords": "00:00:01",
        "unsafeShortRetention": true,
        "sweep": sweep,
    }})
}

fn no_sweep_app() -> TestApp {
    TestApp::new(
        json!({"key": "{/id}"}),
        json!({}),
        short_retention(json!({"enabled": false})),
    )
}

fn key(s: &str) -> IdempotencyKey {
    IdempotencyKey::new(s).unwrap()
}

/// A key in each state the purge must tell apart.
async fn key_in(keys: &KeyStore, k: &str, state: &str) {
    let NextAction::Run(c) = keys
        .claim("Job", &key(k), "test/m/1", Duration::from_secs(600), "m")
        .await
        .unwrap()
    else {
        panic!("fresh key {k} not claimed")
    };
    match state {
        "done" => keys.complete(&c, vec![]).await.unwrap(),
        "poisoned" => keys.mark_poisoned(&c, "boom", false).await.unwrap(),
        _ => {}
    }
}

async fn record(records: &dyn TableStore, queue: &str, id: &str, status: &str, k: &str) {
    records.create_if_missing().await.unwrap();
    let e: Entity = json!({"Status": status, "Function": "Job", "Key": k})
        .as_object()
        .unwrap()
        .clone();
    records.insert(queue, id, &e).await.unwrap();
}

/// Every row of a table with its ETag: equal snapshots = nothing changed.
async fn snapshot(t: &dyn TableStore) -> BTreeSet<(String, String, String)> {
    t.query_rows(None)
        .await
        .unwrap()
        .into_iter()
        .map(|r| {
            (
                r.partition_key,
                r.row_key,
                r.etag.map(|e| e.0).unwrap_or_default(),
            )
        })
        .collect()
}

async fn row_keys(t: &dyn TableStore) -> HashSet<String> {
    snapshot(t).await.into_iter().map(|(_, rk, _)| rk).collect()
}

/// The purge of `app`'s keys, once every settled key is past the cutoff.
async fn purge_when_old(
    app: &TestApp,
    dry_run: bool,
    settled: u64,
) -> aqw_core::retention::PurgeReport {
    let storage = app.storage();
    let opts = PurgeOptions {
        older_than: None,
        dry_run,
    };
    eventually(
        "settled keys older than the retention",
        Duration::from_secs(20),
        || async {
            let r = ops::purge_keys(&app.config, &storage, &["Job".into()], opts)
                .await
                .unwrap();
            (r.counts.scanned == settled).then_some(r)
        },
    )
    .await
}

#[tokio::test]
async fn purge_keeps_live_keys_and_dry_run_changes_nothing() {
    let app = no_sweep_app();
    let keys = app.keys();
    for i in 0..12 {
        key_in(&keys, &format!("done-{i}"), "done").await;
    }
    key_in(&keys, "pending", "pending").await;
    key_in(&keys, "poisoned", "poisoned").await;
    key_in(&keys, "done-open", "done").await;
    record(
        app.records().as_ref(),
        &app.queue,
        "m-open",
        "open",
        "done-open",
    )
    .await;
    record(
        app.records().as_ref(),
        &app.queue,
        "m-poisoned",
        "open",
        "poisoned",
    )
    .await;
    let table = keys.table().clone();

    let before = snapshot(table.as_ref()).await;
    let dry = purge_when_old(&app, true, 13).await;
    assert_eq!((dry.counts.deleted, dry.counts.kept_open_record), (12, 1));
    assert_eq!(
        snapshot(table.as_ref()).await,
        before,
        "--dry-run deleted nothing"
    );

    let real = purge_when_old(&app, false, 13).await;
    assert_eq!(
        (real.counts.deleted, real.counts.kept_open_record),
        (12, 1),
        "{real:?}"
    );
    let left = row_keys(table.as_ref()).await;
    let expect: HashSet<String> = ["pending", "poisoned", "done-open"]
        .iter()
        .map(|k| key(k).row_key())
        .collect();
    assert_eq!(left, expect, "only the live keys are left");
    println!(
        "purge: {} requests for {} keys deleted",
        real.requests, real.counts.deleted
    );
    app.cleanup().await;
}

#[tokio::test]
async fn poison_purge_deletes_closed_records_only_and_dry_run_changes_nothing() {
    let app = no_sweep_app();
    let records = app.records();
    for (id, status) in [
        ("a", "replayed"),
        ("b", "discarded"),
        ("c", "replaced"),
        ("d", "open"),
    ] {
        record(records.as_ref(), &app.queue, id, status, id).await;
    }
    let before = snapshot(records.as_ref()).await;
    let out = aqw(
        app.path(),
        &[
            "poison",
            "purge",
            &app.queue,
            "--dry-run",
            "--output",
            "json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        snapshot(records.as_ref()).await,
        before,
        "--dry-run deleted nothing"
    );
    // The records' service timestamps can straddle a whole second, which
    // the cutoff is compared at: purge until the three have aged past it,
    // adding up what each purge deleted.
    let deleted = std::sync::atomic::AtomicU64::new(0);
    eventually("closed records purged", Duration::from_secs(20), || async {
        let out = aqw(
            app.path(),
            &["poison", "purge", &app.queue, "--output", "json"],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let n = v[0]["deleted"].as_u64().unwrap();
        let total = deleted.fetch_add(n, std::sync::atomic::Ordering::SeqCst) + n;
        (total >= 3).then_some(())
    })
    .await;
    assert_eq!(deleted.into_inner(), 3, "each closed record deleted once");
    assert_eq!(
        row_keys(records.as_ref()).await,
        HashSet::from(["d".to_string()])
    );
    app.cleanup().await;
}

#[tokio::test]
async fn a_key_changed_after_the_scan_is_kept() {
    // A replay during a sweep: the sweep read the key done, then the replayed
    // message's claim made it pending. The delete's If-Match must miss.
    let app = no_sweep_app();
    let keys = app.keys();
    key_in(&keys, "replayed", "done").await;
    let (pk, rk) = KeyStore::address("Job", &key("replayed"));
    let found = eventually(
        "the done key is old enough",
        Duration::from_secs(20),
        || async {
            let cutoff = time::OffsetDateTime::now_utc() - Duration::from_secs(1);
            let f = keys.settled_before(&pk, cutoff).await.unwrap();
            (!f.is_empty()).then_some(f)
        },
    )
    .await;
    let pending: Entity = json!({"Status": "pending"}).as_object().unwrap().clone();
    keys.table().merge(&pk, &rk, &pending, None).await.unwrap();
    let mut pacer = Pacer::new(None);
    let mut run = PurgeRun {
        older_than: Duration::from_secs(1),
        dry_run: false,
        pacer: &mut pacer,
        lease: None,
    };
    let c = purge_partition(keys.table().as_ref(), &pk, found, &HashSet::new(), &mut run)
        .await
        .unwrap();
    assert_eq!((c.deleted, c.kept_changed), (0, 1), "{c:?}");
    let rec = keys.get("Job", &key("replayed")).await.unwrap().unwrap();
    assert_eq!(rec.status, aqw_core::idempotency::KeyStatus::Pending);
    app.cleanup().await;
}

#[tokio::test]
async fn a_purge_killed_mid_run_is_finished_by_the_next() {
    let app = no_sweep_app();
    let keys = app.keys();
    for i in 0..20 {
        key_in(&keys, &format!("k{i}"), "done").await;
    }
    key_in(&keys, "pending", "pending").await;
    key_in(&keys, "poisoned", "poisoned").await;
    purge_when_old(&app, true, 20).await;
    let killed = std::process::Command::new(aqw_bin())
        .args(["keys", "purge", "--app"])
        .arg(app.path())
        .env("AzureWebJobsStorage", CONN)
        .env("AQW_FAILPOINT", "purge.after_batch")
        .output()
        .unwrap();
    assert!(!killed.status.success(), "the failpoint aborted the purge");
    let table = keys.table().clone();
    let left = row_keys(table.as_ref()).await.len();
    assert!(
        left > 2 && left < 22,
        "killed after one batch: {left} rows left"
    );
    let out = aqw(app.path(), &["keys", "purge", "--output", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let expect: HashSet<String> = ["pending", "poisoned"]
        .iter()
        .map(|k| key(k).row_key())
        .collect();
    assert_eq!(row_keys(table.as_ref()).await, expect);
    app.cleanup().await;
}

/// One wave of `n` good jobs and one bad one; the key table's rows after it.
async fn run_wave(
    app: &TestApp,
    w: usize,
    n: usize,
    protected: &mut HashSet<String>,
) -> HashSet<String> {
    let bad = format!("bad-{w}");
    protected.insert(key(&bad).row_key());
    app.enqueue(&json!({"id": bad}).to_string()).await;
    for i in 0..n {
        app.enqueue(&json!({"id": format!("w{w}-{i}")}).to_string())
            .await;
    }
    app.drained(Duration::from_secs(60)).await;
    live_rows(app.keys().table().as_ref(), protected).await
}

/// The key table's rows, checked to still hold every `protected` key.
async fn live_rows(t: &dyn TableStore, protected: &HashSet<String>) -> HashSet<String> {
    let rows = row_keys(t).await;
    assert!(
        protected.is_subset(&rows),
        "a poisoned key of an open record was purged"
    );
    rows
}

#[tokio::test]
async fn two_sweeping_workers_keep_the_key_table_bounded() {
    let app = TestApp::new(
        json!({"key": "{/id}"}),
        json!({"maxDequeueCount": 1}),
        short_retention(json!({
            "requestsPerSecond": 100, "interval": "00:00:01", "lease": "00:00:05"
        })),
    );
    // Jobs whose id starts with "bad" fail for good: poisoned keys, open records.
    let handler = Scripted::new(|job, _| {
        if job.payload.contains("\"bad") {
            Err(aqw_core::handler::HandlerError::permanent("bad job"))
        } else {
            Ok(aqw_core::handler::Success::done())
        }
    });
    let (w1, w2) = (
        app.start_worker(handler.clone()),
        app.start_worker(handler.clone()),
    );
    let table = app.keys().table().clone();
    let (wave, mut protected, mut max_seen) = (40usize, HashSet::new(), 0);
    for w in 0..4 {
        let rows = run_wave(&app, w, wave, &mut protected).await;
        max_seen = max_seen.max(rows.len());
        // The sweep catches up before the next wave: one wave is the bound.
        eventually(
            "the wave's settled keys purged",
            Duration::from_secs(60),
            || async {
                (live_rows(table.as_ref(), &protected).await.len() <= protected.len() + 1)
                    .then_some(())
            },
        )
        .await;
    }
    assert!(max_seen <= wave + protected.len() + 1, "{max_seen}");
    let left = row_keys(table.as_ref()).await;
    assert!(
        left.contains(aqw_core::retention::sweep::LEASE_ROW),
        "{left:?}"
    );
    println!(
        "key table bound: at most {max_seen} entities over 4 waves of {wave} jobs; {} left (poisoned keys of open records + the sweeper lease)",
        left.len()
    );
    w1.stop().await;
    w2.stop().await;
    app.cleanup().await;
}

#[tokio::test]
async fn bad_retention_settings_exit_2_naming_the_setting() {
    let app = no_sweep_app();
    let host = app.path().join("host.json");
    let good: Value = serde_json::from_str(&std::fs::read_to_string(&host).unwrap()).unwrap();
    let cases = [
        (
            json!({"keys": "10.00:00:00"}),
            "aqw.retention.keys",
            "14.00 days",
        ),
        (
            json!({"keys": "30.00:00:00", "sourceMessageTtl": "never"}),
            "aqw.retention.keys",
            "never",
        ),
        (
            json!({"closedRecords": "soon"}),
            "aqw.retention.closedRecords",
            "timespan",
        ),
        (
            json!({"sweep": {"requestsPerSecond": 0}}),
            "aqw.retention.sweep.requestsPerSecond",
            "between",
        ),
        (
            json!({"keep": "1.00:00:00"}),
            "aqw.retention",
            "unknown field",
        ),
    ];
    for (retention, field, words) in cases {
        let mut h = good.clone();
        h["aqw"]["retention"] = retention;
        std::fs::write(&host, h.to_string()).unwrap();
        let out = aqw(app.path(), &["keys", "purge", "--dry-run"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(field) && err.contains(words), "{field}: {err}");
    }
    let mut h = good.clone();
    h["aqw"]["retention"] = json!({});
    std::fs::write(&host, h.to_string()).unwrap();
    let out = aqw(app.path(), &["keys", "purge", "--older-than", "01:00:00"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--older-than") && err.contains("14.00 days"),
        "{err}"
    );
}

#[tokio::test]
async fn one_sweeper_holds_the_lease_and_another_takes_over_when_it_expires() {
    use aqw_core::retention::sweep::SweepLease;
    let app = no_sweep_app();
    let table = app.keys().table().clone();
    table.create_if_missing().await.unwrap();
    let lease = Duration::from_secs(1);
    let (mut a, mut b) = (
        SweepLease::new(table.clone(), "worker-a", lease),
        SweepLease::new(table.clone(), "worker-b", lease),
    );
    assert!(
        a.hold().await.unwrap(),
        "the first worker takes the free lease"
    );
    assert!(!b.hold().await.unwrap(), "a live lease is not taken");
    // worker-a dies: it stops renewing, and worker-b takes over after expiry.
    let end = tokio::time::Instant::now() + Duration::from_secs(20);
    while !b.hold().await.unwrap() {
        assert!(
            tokio::time::Instant::now() < end,
            "worker-b never took the expired lease"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut a = SweepLease::new(table.clone(), "worker-a", Duration::from_secs(60));
    assert!(!a.hold().await.unwrap(), "worker-b holds it now");
    b.release_until(time::OffsetDateTime::now_utc()).await;
    assert!(a.hold().await.unwrap(), "a released lease is free at once");
    app.cleanup().await;
}
