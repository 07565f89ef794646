//! Reliability under crashes and storage faults, against a real Azurite:
//!
//! - `crash_storm_loses_nothing_and_doubles_nothing`: several `aqw run`
//!   processes, one SIGKILLed and restarted every 2–5 s while jobs flow in
//!   waves; afterwards every job's effect is applied, none is applied under two
//!   provider keys, the queue is empty and no poison record is unexplained.
//! - `storage_chaos_every_job_processed_once`: an in-test TCP proxy in front of
//!   Azurite's queue and table ports answers ~20 % of requests with a synthetic
//!   503/500, resets some connections (before forwarding, and after forwarding
//!   with the answer dropped, so the write landed but the client never knew),
//!   and black-holes everything for 2 s once; then a full outage checks that
//!   readiness goes false and comes back.
//! - `azurite_restart_mid_run_worker_recovers`: a second, private Azurite is
//!   killed mid-run and started again empty on the same ports; the worker must
//!   keep going and process jobs enqueued after the restart.
//!
//! Tunables (environment): `AQW_STORM_JOBS` (400), `AQW_STORM_WORKERS` (4),
//! `AQW_CHAOS_SECS` (20; the full run is 60), `AQW_CHAOS_JOBS` (200).
//! The three tests take a file-local lock so they never load this 2-core
//! machine at the same time.

use crate::common::free_port;

use crate::common::*;
use aqw_core::storage::{QueueStore, Storage, StorageError};
use rand::seq::SliceRandom;
use rand::Rng;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

// ---------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------

/// The tests of this file run one at a time (each is heavy on a 2-core box).
/// A tokio mutex: works across the tests' separate runtimes, never poisoned.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    SERIAL.lock().await
}

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn http_function(sink: &Sink) -> Value {
    json!({"key": "receipt:{/orderId}", "handler": {"type": "http", "url": format!("{}/effects", sink.url), "timeout": "00:00:05"}})
}

/// The `Aqw-Key` header the sink records for an order.
fn business_key(order: &str) -> String {
    aqw::handlers::http::header_safe(&format!("receipt:{order}"))
}

/// `count` jobs `<prefix><i>`, plus a second copy (same orderId) of every
/// tenth one, shuffled. Returns (payloads, expected business keys).
fn jobs(prefix: &str, count: usize) -> (Vec<String>, Vec<String>) {
    let mut msgs: Vec<String> = (0..count)
        .map(|i| json!({"orderId": format!("{prefix}{i}"), "n": i}).to_string())
        .collect();
    for i in (0..count).step_by(10) {
        msgs.push(json!({"orderId": format!("{prefix}{i}"), "n": i, "copy": 2}).to_string());
    }
    msgs.shuffle(&mut rand::thread_rng());
    let keys = (0..count)
        .map(|i| business_key(&format!("{prefix}{i}")))
        .collect();
    (msgs, keys)
}

/// Put payloads on a queue (directly, not through any proxy), 16 at a time.
async fn enqueue_all(
    q: &Arc<dyn QueueStore>,
    payloads: &[String],
    encoding: aqw_core::config::MessageEncoding,
) {
    use futures::StreamExt;
    let results: Vec<Result<_, StorageError>> = futures::stream::iter(payloads.iter().cloned())
        .map(|p| {
            let q = q.clone();
            async move {
                let text = aqw_core::message::encode(&p, encoding);
                q.put(&text, Duration::ZERO, aqw_core::storage::Ttl::Default)
                    .await
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    for r in results {
        r.expect("enqueue (direct to Azurite)");
    }
}

/// What the sink saw, per business key.
struct Ledger {
    /// Applied effects (deduped on Idempotency-Key, like a real provider).
    applied: HashMap<String, usize>,
    /// Distinct Idempotency-Keys over every request.
    provider_keys: HashMap<String, HashSet<String>>,
    requests: usize,
    previously_pending: usize,
}

fn ledger(sink: &Sink) -> Ledger {
    let mut applied: HashMap<String, usize> = HashMap::new();
    for r in sink.applied_effects("/effects") {
        *applied
            .entry(r.business_key.unwrap_or_default())
            .or_default() += 1;
    }
    let all = sink.to("/effects");
    let mut provider_keys: HashMap<String, HashSet<String>> = HashMap::new();
    for r in &all {
        provider_keys
            .entry(r.business_key.clone().unwrap_or_default())
            .or_default()
            .insert(r.idempotency_key.clone().unwrap_or_default());
    }
    Ledger {
        applied,
        provider_keys,
        requests: all.len(),
        previously_pending: all.iter().filter(|r| r.previously_pending).count(),
    }
}

/// Keys whose effect is missing, and keys applied under more than one provider key.
fn lost_and_doubled(l: &Ledger, expected: &[String]) -> (Vec<String>, Vec<String>) {
    let lost: Vec<String> = expected
        .iter()
        .filter(|k| l.applied.get(*k).copied().unwrap_or(0) == 0)
        .cloned()
        .collect();
    let mut doubled: Vec<String> = l
        .provider_keys
        .iter()
        .filter(|(_, ks)| ks.len() > 1)
        .map(|(k, ks)| format!("{k}: {ks:?}"))
        .collect();
    doubled.sort();
    (lost, doubled)
}

fn all_applied(sink: &Sink, expected: &[String]) -> bool {
    let l = ledger(sink);
    expected.iter().all(|k| l.applied.contains_key(k))
}

/// Wait (up to 90 s) until every expected key's effect is applied and the
/// source queue is empty; None on timeout, so the caller can explain.
async fn applied_and_drained(
    what: &'static str,
    sink: &Sink,
    q: &Arc<dyn QueueStore>,
    expected: &[String],
) -> Option<()> {
    let (sink, q, expected) = (sink.clone(), q.clone(), expected.to_vec());
    eventually_or_none(what, Duration::from_secs(90), move || {
        let (sink, q, expected) = (sink.clone(), q.clone(), expected.clone());
        async move {
            (all_applied(&sink, &expected) && TestApp::exact_count(q.as_ref()).await == 0)
                .then_some(())
        }
    })
    .await
}

/// Like `eventually`, but returns None instead of panicking, so the caller
/// can gather diagnostics before failing.
async fn eventually_or_none<T, F, Fut>(
    what: &'static str,
    deadline: Duration,
    check: F,
) -> Option<T>
where
    T: Send + 'static,
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = Option<T>> + Send + 'static,
{
    tokio::spawn(async move { eventually(what, deadline, check).await })
        .await
        .ok()
}

/// Poison records of a queue (an absent table means none).
async fn poison_records(
    storage: &dyn Storage,
    table: &str,
    queue: &str,
) -> Vec<(String, String, aqw_core::storage::Entity)> {
    match storage.table(table).query(Some(queue)).await {
        Ok(r) => r,
        Err(StorageError::NotFound) => vec![],
        Err(e) => panic!("query poison records: {e}"),
    }
}

/// Check every poison record: print it; one is explained only if it is a
/// `crashed` record (dequeued past the cap by crashes or deferrals) whose
/// key nonetheless reached `done` (another copy of the job completed it).
/// Returns the unexplained ones.
async fn unexplained_poison(
    app: &TestApp,
    storage: &dyn Storage,
    records: &[(String, String, aqw_core::storage::Entity)],
) -> Vec<String> {
    let keys = aqw_core::idempotency::KeyStore::new(storage.table(&app.keys_table));
    let mut bad = vec![];
    for (_, id, e) in records {
        let kind = e.get("ErrorKind").and_then(Value::as_str).unwrap_or("");
        let key = e.get("Key").and_then(Value::as_str).unwrap_or("");
        let msg = e.get("ErrorMessage").and_then(Value::as_str).unwrap_or("");
        let status = match aqw_core::idempotency::IdempotencyKey::new(key) {
            Ok(k) => keys
                .get("Job", &k)
                .await
                .ok()
                .flatten()
                .map(|r| r.status.as_str().to_string())
                .unwrap_or_else(|| "absent".into()),
            Err(_) => "no key".into(),
        };
        println!(
            "POISON RECORD {id}: kind={kind} key={key} key_status={status} dequeueCount={} error={msg}",
            e.get("DequeueCount").cloned().unwrap_or(Value::Null)
        );
        if !(kind == "crashed" && status == "done") {
            bad.push(format!(
                "{id}: kind={kind} key={key} key_status={status}: {msg}"
            ));
        }
    }
    bad
}

fn port_open(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(200),
    )
    .is_ok()
}

/// `/readyz` of an in-process worker: Some(true) 200, Some(false) 503, None unreachable.
async fn ready(port: u16) -> Option<bool> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    match client
        .get(format!("http://127.0.0.1:{port}/readyz"))
        .send()
        .await
    {
        Ok(r) => Some(r.status().is_success()),
        Err(_) => None,
    }
}

/// /readyz transitions: (seconds since the watch started, answer).
type ReadinessLog = Arc<Mutex<Vec<(f64, Option<bool>)>>>;

/// Record /readyz transitions until cancelled.
fn watch_readiness(
    port: u16,
    stop: CancellationToken,
) -> (ReadinessLog, tokio::task::JoinHandle<()>) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let out = log.clone();
    let start = Instant::now();
    let task = tokio::spawn(async move {
        let mut last: Option<Option<bool>> = None;
        loop {
            let r = ready(port).await;
            if last != Some(r) {
                log.lock().unwrap().push((start.elapsed().as_secs_f64(), r));
                last = Some(r);
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                _ = stop.cancelled() => return,
            }
        }
    });
    (out, task)
}

/// Keeps a folder of child logs; on a panic it is kept and its path printed.
struct Logs {
    dir: Option<tempfile::TempDir>,
}

impl Logs {
    fn new() -> Self {
        Self {
            dir: Some(tempfile::tempdir().unwrap()),
        }
    }
    fn path(&self) -> &Path {
        self.dir.as_ref().unwrap().path()
    }
}

impl Drop for Logs {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(d) = self.dir.take() {
                let p = d.keep();
                eprintln!("child logs kept in {}", p.display());
            }
        }
    }
}

/// A provider front that makes each effect take a while: it hands the request
/// to the `Sink` at once (the effect is applied and recorded), then holds
/// the answer 100–900 ms. A worker killed in that window has caused the
/// effect but not marked its key done: the crash window that matters.
async fn slow_provider(sink: &Sink) -> String {
    use axum::http::{HeaderMap, StatusCode};
    let target = format!("{}/effects", sink.url);
    let client = reqwest::Client::new();
    let app = axum::Router::new().route(
        "/effects",
        axum::routing::post(move |headers: HeaderMap, body: String| {
            let (client, target) = (client.clone(), target.clone());
            async move {
                let mut req = client.post(&target).body(body);
                for (k, v) in headers.iter() {
                    let name = k.as_str();
                    if name.starts_with("aqw-")
                        || name == "idempotency-key"
                        || name == "content-type"
                    {
                        req = req.header(k.clone(), v.clone());
                    }
                }
                let status = match req.send().await {
                    Ok(r) => r.status().as_u16(),
                    Err(_) => 502,
                };
                let hold = rand::thread_rng().gen_range(100..900);
                tokio::time::sleep(Duration::from_millis(hold)).await;
                StatusCode::from_u16(status).unwrap()
            }
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

// ---------------------------------------------------------------------------
// 1. Crash storm: `aqw run` processes SIGKILLed at random
// ---------------------------------------------------------------------------

/// `aqw run` child processes in fixed slots; each incarnation logs to its own file.
struct Fleet {
    app: PathBuf,
    logs: Logs,
    slots: Vec<Option<Child>>,
    incarnations: usize,
    kills: usize,
}

impl Fleet {
    fn new(app: &Path, n: usize) -> Self {
        Self {
            app: app.to_path_buf(),
            logs: Logs::new(),
            slots: (0..n).map(|_| None).collect(),
            incarnations: 0,
            kills: 0,
        }
    }

    fn spawn(&mut self, slot: usize) {
        assert!(self.slots[slot].is_none());
        self.incarnations += 1;
        let log = std::fs::File::create(
            self.logs
                .path()
                .join(format!("w{slot}-{}.log", self.incarnations)),
        )
        .unwrap();
        let child = Command::new(aqw_bin())
            .arg("run")
            .arg("--app")
            .arg(&self.app)
            .env("AzureWebJobsStorage", CONN)
            .env_remove("AQW_FAILPOINT")
            .env("AQW_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn aqw run");
        self.slots[slot] = Some(child);
    }

    /// SIGKILL (std's `Child::kill` on Unix) and reap.
    fn kill9(&mut self, slot: usize) {
        let mut c = self.slots[slot].take().expect("slot is running");
        if let Ok(Some(status)) = c.try_wait() {
            panic!("worker in slot {slot} had already exited ({status}) before it was killed");
        }
        c.kill().unwrap();
        c.wait().unwrap();
        self.kills += 1;
    }

    /// SIGTERM every worker; each must exit 0 within the deadline.
    async fn terminate_all(&mut self) {
        for c in self.slots.iter().flatten() {
            let st = Command::new("kill")
                .arg("-TERM")
                .arg(c.id().to_string())
                .status()
                .unwrap();
            assert!(st.success(), "kill -TERM {}", c.id());
        }
        for slot in 0..self.slots.len() {
            let mut c = self.slots[slot].take().unwrap();
            let status = eventually(
                "worker exits after SIGTERM",
                Duration::from_secs(40),
                || std::future::ready(c.try_wait().unwrap()),
            )
            .await;
            assert!(
                status.success(),
                "worker in slot {slot} exited with {status} after SIGTERM (expected 0)"
            );
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for c in self.slots.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_storm_loses_nothing_and_doubles_nothing() {
    let _serial = serial().await;
    let t0 = Instant::now();
    let n_jobs = env_num("AQW_STORM_JOBS", 400) as usize;
    let n_workers = env_num("AQW_STORM_WORKERS", 4).clamp(1, 8) as usize;
    let sink = Sink::start().await;
    let provider = slow_provider(&sink).await;
    let app = TestApp::new(
        json!({"key": "receipt:{/orderId}", "handler": {"type": "http", "url": format!("{provider}/effects"), "timeout": "00:00:05"}}),
        json!({"batchSize": 8}),
        json!({"lease": "00:00:05"}),
    );
    let (msgs, expected) = jobs("s", n_jobs);
    // One wave and one kill per cycle: at least 10 cycles (≥ 10 kills), waves
    // of at most ~150 messages so the queue stays far below 900.
    let cycles = 10.max(msgs.len().div_ceil(150));
    let mut waves: VecDeque<Vec<String>> = msgs
        .chunks(msgs.len().div_ceil(cycles))
        .map(<[String]>::to_vec)
        .collect();
    let q = app.source();
    q.create_if_missing().await.unwrap();

    let mut fleet = Fleet::new(app.path(), n_workers);
    for s in 0..n_workers {
        fleet.spawn(s);
    }
    let mut max_depth = 0;
    for cycle in 0..cycles {
        let (interval, kill_at, victim) = {
            let mut rng = rand::thread_rng();
            (
                Duration::from_millis(rng.gen_range(2000..=5000)),
                Duration::from_millis(rng.gen_range(200..1200)),
                rng.gen_range(0..n_workers),
            )
        };
        let start = Instant::now();
        let mut took = String::new();
        if let Some(wave) = waves.pop_front() {
            let len = wave.len();
            let qq = q.clone();
            let depth = eventually(
                "room on the queue for the next wave",
                Duration::from_secs(90),
                move || {
                    let q = qq.clone();
                    async move {
                        let d = TestApp::exact_count(q.as_ref()).await as usize;
                        (d + len < 900).then_some(d)
                    }
                },
            )
            .await;
            max_depth = max_depth.max(depth + len);
            let room = start.elapsed();
            enqueue_all(&q, &wave, app.config.message_encoding).await;
            took = format!(
                "(room check {:.1}s, enqueue of {len} {:.1}s) ",
                room.as_secs_f64(),
                (start.elapsed() - room).as_secs_f64()
            );
        }
        // Kill while the wave is in flight: workers poll every ≤ 200 ms and
        // each effect takes 100–900 ms.
        tokio::time::sleep(kill_at).await;
        fleet.kill9(victim);
        fleet.spawn(victim);
        println!(
            "storm: cycle {cycle}: {took}killed slot {victim} at {:.1}s; {} effects applied so far",
            t0.elapsed().as_secs_f64(),
            ledger(&sink).applied.len()
        );
        tokio::time::sleep_until(start + interval).await;
    }
    assert!(waves.is_empty());
    assert!(fleet.kills >= 10, "only {} kills", fleet.kills);
    let storm_done = t0.elapsed();

    // The survivors drain the queue.
    {
        let drained = applied_and_drained(
            "every job applied and the source queue empty",
            &sink,
            &q,
            &expected,
        )
        .await;
        if drained.is_none() {
            let l = ledger(&sink);
            let (lost, doubled) = lost_and_doubled(&l, &expected);
            let depth = TestApp::exact_count(q.as_ref()).await;
            let recs = poison_records(&app.storage(), &app.poison_table, &app.queue).await;
            let _ = unexplained_poison(&app, &app.storage(), &recs).await;
            panic!(
                "not drained after 90 s: {} keys without effect (first: {:?}), {} doubled, queue depth {depth}, {} poison records",
                lost.len(),
                lost.iter().take(10).collect::<Vec<_>>(),
                doubled.len(),
                recs.len()
            );
        }
    }
    fleet.terminate_all().await;

    // Verdict.
    let l = ledger(&sink);
    let (lost, doubled) = lost_and_doubled(&l, &expected);
    let rows = app
        .storage()
        .table(&app.keys_table)
        .query(None)
        .await
        .unwrap();
    let retried_keys = rows
        .iter()
        .filter(|(_, _, e)| e.get("Attempts").and_then(Value::as_u64).unwrap_or(0) > 1)
        .count();
    let recs = poison_records(&app.storage(), &app.poison_table, &app.queue).await;
    let poison_depth = TestApp::exact_count(app.poison_queue().as_ref()).await;
    println!(
        "storm: {n_jobs} jobs ({} messages, max depth {max_depth}), {n_workers} workers, {} kills, \
         {} incarnations; storm {:.1}s, total {:.1}s; {} provider requests ({} previously_pending), \
         {retried_keys} keys took more than one attempt, {} poison records, poison queue depth {poison_depth}",
        msgs.len(),
        fleet.kills,
        fleet.incarnations,
        storm_done.as_secs_f64(),
        t0.elapsed().as_secs_f64(),
        l.requests,
        l.previously_pending,
        recs.len()
    );
    assert!(
        retried_keys > 0,
        "the storm never interrupted a job between its claim and `done`: it proved nothing"
    );
    assert!(
        lost.is_empty(),
        "{} jobs lost (no applied effect): {lost:?}",
        lost.len()
    );
    assert!(
        doubled.is_empty(),
        "{} business keys reached the provider under two provider keys: {doubled:?}",
        doubled.len()
    );
    let applied_total: usize = l.applied.values().sum();
    assert_eq!(applied_total, n_jobs, "one applied effect per job");
    assert_eq!(
        TestApp::exact_count(app.source().as_ref()).await,
        0,
        "source queue empty"
    );
    // A key's provider key is minted once: one record per key, all done, and
    // every request carried its record's ProviderKey.
    assert_eq!(rows.len(), n_jobs, "one key record per job");
    let provider: HashMap<String, String> = rows
        .iter()
        .map(|(_, _, e)| {
            (
                business_key(e["Key"].as_str().unwrap().trim_start_matches("receipt:")),
                e["ProviderKey"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let not_done: Vec<_> = rows
        .iter()
        .filter(|(_, _, e)| e["Status"] != "done")
        .map(|(_, _, e)| format!("{} {}", e["Key"], e["Status"]))
        .collect();
    assert!(not_done.is_empty(), "keys not done: {not_done:?}");
    for r in sink.to("/effects") {
        let bk = r.business_key.unwrap_or_default();
        assert_eq!(
            r.idempotency_key.as_deref(),
            provider.get(&bk).map(String::as_str),
            "request for {bk} carried its key record's ProviderKey"
        );
    }
    let bad = unexplained_poison(&app, &app.storage(), &recs).await;
    assert!(bad.is_empty(), "unexplained poison records: {bad:?}");
    app.cleanup().await;
}

// ---------------------------------------------------------------------------
// 2. Storage chaos through an in-test proxy
// ---------------------------------------------------------------------------
//
// HTTP/1.1 keep-alive would carry many requests on one TCP connection. The
// proxy makes every connection carry exactly one request instead: it reads
// the request head, replaces any `Connection` header with `Connection: close`
// before forwarding, and Azurite then answers with `Connection: close` and
// closes, so the client (hyper) never reuses the connection. A per-connection
// decision is therefore a per-request decision, without parsing responses or
// chunked bodies: after the head the proxy just pipes bytes both ways.

#[derive(Default)]
struct ChaosStats {
    forwarded: AtomicU64,
    status_503: AtomicU64,
    status_500: AtomicU64,
    reset_before: AtomicU64,
    reset_after: AtomicU64,
    blackholed: AtomicU64,
    outage_resets: AtomicU64,
}

#[derive(Default)]
struct Chaos {
    /// Inject 503/500/resets per request.
    inject: AtomicBool,
    /// Reset every connection at once (a full storage outage).
    outage: AtomicBool,
    /// Until then, hold every new request unanswered, then reset it.
    blackhole_until: Mutex<Option<Instant>>,
    stats: ChaosStats,
}

enum Fault {
    Forward,
    Status(u16),
    /// Drop the connection before the request reaches Azurite.
    ResetBefore,
    /// Forward, let Azurite apply it, drop its answer and reset.
    ResetAfter,
}

impl Chaos {
    fn pick(&self) -> Fault {
        if !self.inject.load(Ordering::SeqCst) {
            return Fault::Forward;
        }
        let r: f64 = rand::thread_rng().gen();
        if r < 0.15 {
            Fault::Status(503)
        } else if r < 0.20 {
            Fault::Status(500)
        } else if r < 0.24 {
            Fault::ResetBefore
        } else if r < 0.28 {
            Fault::ResetAfter
        } else {
            Fault::Forward
        }
    }
    fn summary(&self) -> String {
        let s = &self.stats;
        let g = |a: &AtomicU64| a.load(Ordering::SeqCst);
        format!(
            "forwarded {}, 503 {}, 500 {}, reset before forwarding {}, reset after forwarding {}, black-holed {}, outage resets {}",
            g(&s.forwarded),
            g(&s.status_503),
            g(&s.status_500),
            g(&s.reset_before),
            g(&s.reset_after),
            g(&s.blackholed),
            g(&s.outage_resets)
        )
    }
}

/// Listen on 127.0.0.1:0 and proxy to 127.0.0.1:`upstream`; returns the port.
async fn start_proxy(upstream: u16, chaos: Arc<Chaos>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = listener.accept().await else {
                continue;
            };
            let chaos = chaos.clone();
            tokio::spawn(async move {
                let _ = proxy_conn(sock, upstream, chaos).await;
            });
        }
    });
    port
}

fn reset(s: TcpStream) {
    let _ = s.set_zero_linger();
    drop(s);
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.split("\r\n").skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then_some(v.trim())
    })
}

/// The request head with `Connection: close` (one request per connection).
fn close_after_one(head: &str) -> String {
    let mut out = String::with_capacity(head.len() + 20);
    for line in head.split("\r\n").filter(|l| !l.is_empty()) {
        if line
            .split_once(':')
            .is_some_and(|(k, _)| k.trim().eq_ignore_ascii_case("connection"))
        {
            continue;
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str("Connection: close\r\n\r\n");
    out
}

/// Read the rest of a request body whose length is known (`have` bytes already read).
async fn read_body(
    client: &mut TcpStream,
    content_length: Option<usize>,
    have: usize,
) -> std::io::Result<Vec<u8>> {
    let missing = content_length.unwrap_or(0).saturating_sub(have);
    let mut rest = vec![0u8; missing];
    if missing > 0 {
        client.read_exact(&mut rest).await?;
    }
    Ok(rest)
}

async fn proxy_conn(
    mut client: TcpStream,
    upstream: u16,
    chaos: Arc<Chaos>,
) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(8192);
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        if buf.len() > 256 * 1024 {
            return Ok(());
        }
        let mut tmp = [0u8; 16 * 1024];
        let n = client.read(&mut tmp).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let content_length: Option<usize> =
        header(&head, "content-length").and_then(|v| v.parse().ok());
    let chunked = header(&head, "transfer-encoding").is_some_and(|v| v.contains("chunked"));
    let stats = &chaos.stats;

    if chaos.outage.load(Ordering::SeqCst) {
        stats.outage_resets.fetch_add(1, Ordering::SeqCst);
        reset(client);
        return Ok(());
    }
    let hole = *chaos.blackhole_until.lock().unwrap();
    if let Some(until) = hole {
        if Instant::now() < until {
            // Accept, never answer; when the hole closes, drop the connection
            // (a stall that lasted until now, not reqwest's 30 s timeout).
            stats.blackholed.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep_until(until).await;
            reset(client);
            return Ok(());
        }
    }
    let fault = chaos.pick();
    // Synthetic answers read the whole body first where its length is known,
    // so the client reads them as answers (not as a reset mid-upload).
    // Read the whole body first where its length is known, so a synthetic
    // answer is read by the client as an answer (not a reset mid-upload).
    match fault {
        Fault::ResetBefore => {
            stats.reset_before.fetch_add(1, Ordering::SeqCst);
            reset(client);
            return Ok(());
        }
        Fault::Status(code) => {
            let _ = tokio::time::timeout(
                Duration::from_secs(5),
                read_body(&mut client, content_length, buf.len() - head_end),
            )
            .await;
            let (reason, ecode) = if code == 503 {
                (&stats.status_503, "ServerBusy")
            } else {
                (&stats.status_500, "InternalError")
            };
            reason.fetch_add(1, Ordering::SeqCst);
            let text = if code == 503 {
                "Service Unavailable"
            } else {
                "Internal Server Error"
            };
            let body = format!(
                "<?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>{ecode}</Code><Message>injected by the reliability test proxy</Message></Error>"
            );
            let resp = format!(
                "HTTP/1.1 {code} {text}\r\nContent-Type: application/xml\r\nx-ms-error-code: {ecode}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            client.write_all(resp.as_bytes()).await?;
            client.shutdown().await?;
            return Ok(());
        }
        Fault::Forward | Fault::ResetAfter => {}
    }
    let mut up = match TcpStream::connect(("127.0.0.1", upstream)).await {
        Ok(u) => u,
        Err(_) => {
            reset(client);
            return Ok(());
        }
    };
    up.write_all(close_after_one(&head).as_bytes()).await?;
    up.write_all(&buf[head_end..]).await?;
    if matches!(fault, Fault::ResetAfter) && !chunked {
        let rest = read_body(&mut client, content_length, buf.len() - head_end).await?;
        up.write_all(&rest).await?;
        // Let Azurite apply it and answer; throw the answer away.
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(30), up.read_to_end(&mut answer)).await;
        stats.reset_after.fetch_add(1, Ordering::SeqCst);
        reset(client);
        return Ok(());
    }
    stats.forwarded.fetch_add(1, Ordering::SeqCst);
    let (mut cr, mut cw) = client.into_split();
    let (mut ur, mut uw) = up.into_split();
    let upload = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut cr, &mut uw).await;
    });
    let _ = tokio::io::copy(&mut ur, &mut cw).await;
    let _ = cw.shutdown().await;
    upload.abort();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_chaos_every_job_processed_once() {
    let _serial = serial().await;
    let t0 = Instant::now();
    let chaos_secs = env_num("AQW_CHAOS_SECS", 20).max(5);
    let n_jobs = env_num("AQW_CHAOS_JOBS", 200) as usize;
    let sink = Sink::start().await;
    let chaos = Arc::new(Chaos::default());
    let qport = start_proxy(10001, chaos.clone()).await;
    let tport = start_proxy(10002, chaos.clone()).await;
    let provider = slow_provider(&sink).await;
    let ops_port = free_port();
    let app = TestApp::new(
        json!({"key": "receipt:{/orderId}", "handler": {"type": "http", "url": format!("{provider}/effects"), "timeout": "00:00:05"}}),
        json!({"batchSize": 8}),
        json!({"lease": "00:00:05", "http": {"port": ops_port}}),
    );
    let conn = format!(
        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={};\
         QueueEndpoint=http://127.0.0.1:{qport}/devstoreaccount1;TableEndpoint=http://127.0.0.1:{tport}/devstoreaccount1;",
        aqw_azure::DEV_KEY
    );
    let env = BTreeMap::from([("AzureWebJobsStorage".to_string(), conn)]);
    let config = Arc::new(aqw::config::load_with_env(app.path(), &env).expect("proxied config"));
    assert!(aqw_azure::connection_of(&config.functions[0].connection)
        .unwrap()
        .queue_endpoint
        .contains(&format!(":{qport}/")));
    // `app.source()` etc. use `UseDevelopmentStorage=true`: direct, never proxied.
    let q = app.source();
    q.create_if_missing().await.unwrap();
    let (msgs, expected) = jobs("c", n_jobs);

    chaos.inject.store(true, Ordering::SeqCst);
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(aqw::worker::run(
        config.clone(),
        aqw::handlers::Registry::new(),
        shutdown.clone(),
    ));
    let watch_stop = CancellationToken::new();
    let (readiness, watcher) = watch_readiness(ops_port, watch_stop.clone());

    // Jobs arrive in 10 waves spread over the chaos window; the black hole
    // opens once, 40 % into it, 300 ms after a wave (its jobs in flight).
    let chaos_end = t0 + Duration::from_secs(chaos_secs);
    let waves = 10;
    let per_wave = msgs.len().div_ceil(waves);
    let mut blackhole_at = None;
    for (i, wave) in msgs.chunks(per_wave).enumerate() {
        let at = t0 + Duration::from_secs(chaos_secs) * i as u32 / waves as u32;
        tokio::time::sleep_until(at).await;
        enqueue_all(&q, wave, app.config.message_encoding).await;
        if i == waves * 4 / 10 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let now = Instant::now();
            *chaos.blackhole_until.lock().unwrap() = Some(now + Duration::from_secs(2));
            blackhole_at = Some(now.duration_since(t0).as_secs_f64());
        }
    }
    tokio::time::sleep_until(chaos_end).await;
    chaos.inject.store(false, Ordering::SeqCst);
    println!(
        "chaos: {chaos_secs}s window over ({:.1}s); {} effects applied; {}",
        t0.elapsed().as_secs_f64(),
        ledger(&sink).applied.len(),
        chaos.summary()
    );

    {
        let drained = applied_and_drained(
            "every job applied and the source queue empty after the chaos",
            &sink,
            &q,
            &expected,
        )
        .await;
        if drained.is_none() {
            let l = ledger(&sink);
            let (lost, doubled) = lost_and_doubled(&l, &expected);
            let recs = poison_records(&app.storage(), &app.poison_table, &app.queue).await;
            let _ = unexplained_poison(&app, &app.storage(), &recs).await;
            panic!(
                "not drained 90 s after the chaos: {} keys without effect (first: {:?}), {} doubled, queue depth {}, {} poison records, worker finished: {}",
                lost.len(),
                lost.iter().take(10).collect::<Vec<_>>(),
                doubled.len(),
                TestApp::exact_count(q.as_ref()).await,
                recs.len(),
                worker.is_finished()
            );
        }
    }
    let drained_at = t0.elapsed();
    let ready_during_chaos = readiness.lock().unwrap().clone();

    // Readiness: a 2 s black hole cannot make it false (see the report at
    // the end), so a full outage does: every connection is reset until
    // /readyz answers 503, then storage comes back and so must readiness.
    assert_eq!(ready(ops_port).await, Some(true), "ready before the outage");
    chaos.outage.store(true, Ordering::SeqCst);
    let outage_start = Instant::now();
    eventually(
        "/readyz 503 during a storage outage",
        Duration::from_secs(30),
        || async { (ready(ops_port).await == Some(false)).then_some(()) },
    )
    .await;
    let not_ready_after = outage_start.elapsed();
    chaos.outage.store(false, Ordering::SeqCst);
    let outage_end = Instant::now();
    eventually(
        "/readyz 200 after the outage",
        Duration::from_secs(30),
        || async { (ready(ops_port).await == Some(true)).then_some(()) },
    )
    .await;
    let ready_again_after = outage_end.elapsed();
    assert!(
        !worker.is_finished(),
        "the worker kept running through the outage"
    );

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), worker)
        .await
        .expect("worker stops within 30 s of shutdown")
        .unwrap()
        .expect("worker exits Ok");
    watch_stop.cancel();
    let _ = watcher.await;

    // Verdict, through direct (non-proxied) clients.
    let l = ledger(&sink);
    let (lost, doubled) = lost_and_doubled(&l, &expected);
    let storage = app.storage();
    let rows = storage.table(&app.keys_table).query(None).await.unwrap();
    let recs = poison_records(&storage, &app.poison_table, &app.queue).await;
    let retried_keys = rows
        .iter()
        .filter(|(_, _, e)| e.get("Attempts").and_then(Value::as_u64).unwrap_or(0) > 1)
        .count();
    println!(
        "chaos: {n_jobs} jobs ({} messages); drained at {:.1}s; black hole at {:?}s for 2 s; \
         readiness during chaos+drain {:?}; outage: not ready after {:.1}s, ready again {:.1}s after; \
         {} provider requests ({} previously_pending), {retried_keys} keys took more than one attempt, \
         {} poison records; total {:.1}s; {}",
        msgs.len(),
        drained_at.as_secs_f64(),
        blackhole_at,
        ready_during_chaos,
        not_ready_after.as_secs_f64(),
        ready_again_after.as_secs_f64(),
        l.requests,
        l.previously_pending,
        recs.len(),
        t0.elapsed().as_secs_f64(),
        chaos.summary()
    );
    let s = &chaos.stats;
    assert!(
        s.status_503.load(Ordering::SeqCst) > 0
            && s.status_500.load(Ordering::SeqCst) > 0
            && s.reset_before.load(Ordering::SeqCst) + s.reset_after.load(Ordering::SeqCst) > 0
            && s.blackholed.load(Ordering::SeqCst) > 0,
        "the chaos was real: {}",
        chaos.summary()
    );
    assert!(lost.is_empty(), "{} jobs lost: {lost:?}", lost.len());
    assert!(
        doubled.is_empty(),
        "business keys under two provider keys: {doubled:?}"
    );
    for k in &expected {
        assert_eq!(
            l.applied.get(k).copied(),
            Some(1),
            "{k} applied exactly once"
        );
    }
    assert_eq!(
        l.applied.values().sum::<usize>(),
        n_jobs,
        "no stray effects"
    );
    assert_eq!(
        TestApp::exact_count(q.as_ref()).await,
        0,
        "source queue empty"
    );
    assert_eq!(rows.len(), n_jobs, "one key record per job");
    let not_done: Vec<_> = rows
        .iter()
        .filter(|(_, _, e)| e["Status"] != "done")
        .map(|(_, _, e)| format!("{} {}", e["Key"], e["Status"]))
        .collect();
    assert!(not_done.is_empty(), "keys not done: {not_done:?}");
    let bad = unexplained_poison(&app, &storage, &recs).await;
    assert!(bad.is_empty(), "unexplained poison records: {bad:?}");
    app.cleanup().await;
}

// ---------------------------------------------------------------------------
// 3. A private Azurite killed mid-run and started again (empty) on the same ports
// ---------------------------------------------------------------------------

/// A second Azurite on its own ports, owned by this test (never the shared one).
struct PrivateAzurite {
    dir: tempfile::TempDir,
    queue_port: u16,
    table_port: u16,
    blob_port: u16,
    child: Option<Child>,
    starts: usize,
}

impl PrivateAzurite {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
            queue_port: free_port(),
            table_port: free_port(),
            blob_port: free_port(),
            child: None,
            starts: 0,
        }
    }

    fn connection_string(&self) -> String {
        format!(
            "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={};\
             QueueEndpoint=http://127.0.0.1:{}/devstoreaccount1;TableEndpoint=http://127.0.0.1:{}/devstoreaccount1;",
            aqw_azure::DEV_KEY,
            self.queue_port,
            self.table_port
        )
    }

    async fn start(&mut self) {
        assert!(self.child.is_none());
        self.starts += 1;
        let bin =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/azurite/node_modules/.bin/azurite");
        assert!(
            bin.exists(),
            "{} missing (scripts/azurite.sh install)",
            bin.display()
        );
        let log =
            std::fs::File::create(self.dir.path().join(format!("azurite-{}.log", self.starts)))
                .unwrap();
        let child = Command::new(bin)
            .args([
                "--silent",
                "--inMemoryPersistence",
                "--skipApiVersionCheck",
                "--disableTelemetry",
                "--loose",
            ])
            .args([
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
                &self.blob_port.to_string(),
            ])
            .args([
                "--queueHost",
                "127.0.0.1",
                "--queuePort",
                &self.queue_port.to_string(),
            ])
            .args([
                "--tableHost",
                "127.0.0.1",
                "--tablePort",
                &self.table_port.to_string(),
            ])
            // (--location is refused together with --inMemoryPersistence;
            // the working directory takes its debug files, if any.)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn the private Azurite");
        self.child = Some(child);
        let (qp, tp) = (self.queue_port, self.table_port);
        let child = self.child.as_mut().unwrap();
        let log = self.dir.path().join(format!("azurite-{}.log", self.starts));
        eventually("private Azurite listening", Duration::from_secs(60), || {
            if let Ok(Some(st)) = child.try_wait() {
                panic!(
                    "the private Azurite exited ({st}): {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            std::future::ready((port_open(qp) && port_open(tp)).then_some(()))
        })
        .await;
    }

    /// SIGKILL: no graceful close, the in-memory data is gone.
    async fn kill(&mut self) {
        let mut c = self.child.take().expect("running");
        c.kill().unwrap();
        c.wait().unwrap();
        let (qp, tp) = (self.queue_port, self.table_port);
        eventually(
            "private Azurite ports closed",
            Duration::from_secs(10),
            || std::future::ready((!port_open(qp) && !port_open(tp)).then_some(())),
        )
        .await;
    }
}

impl Drop for PrivateAzurite {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azurite_restart_mid_run_worker_recovers() {
    let _serial = serial().await;
    let t0 = Instant::now();
    let mut azurite = PrivateAzurite::new();
    azurite.start().await;
    let sink = Sink::start().await;
    let ops_port = free_port();
    // TestApp gives random names and the folder; its own config (shared
    // Azurite) is not used for anything here.
    let app = TestApp::new(
        http_function(&sink),
        json!({"batchSize": 8}),
        json!({"lease": "00:00:05", "http": {"port": ops_port}}),
    );
    let env = BTreeMap::from([(
        "AzureWebJobsStorage".to_string(),
        azurite.connection_string(),
    )]);
    let config = Arc::new(aqw::config::load_with_env(app.path(), &env).expect("config"));
    let storage =
        aqw_azure::connect(aqw_azure::connection_of(&config.functions[0].connection).unwrap())
            .unwrap();
    let q = storage.queue(&app.queue);
    q.create_if_missing().await.unwrap();

    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(aqw::worker::run(
        config.clone(),
        aqw::handlers::Registry::new(),
        shutdown.clone(),
    ));
    eventually("worker ready", Duration::from_secs(30), || async {
        (ready(ops_port).await == Some(true)).then_some(())
    })
    .await;

    // Before: jobs flow, and storage dies while they do.
    let (before, _) = jobs("before", 60);
    enqueue_all(&q, &before, config.message_encoding).await;
    {
        let sink = sink.clone();
        eventually(
            "some jobs processed before the kill",
            Duration::from_secs(30),
            move || std::future::ready((ledger(&sink).applied.len() >= 5).then_some(())),
        )
        .await;
    }
    azurite.kill().await;
    let killed_at = t0.elapsed();
    let applied_before = ledger(&sink).applied.len();
    eventually(
        "/readyz 503 while storage is down",
        Duration::from_secs(30),
        || async { (ready(ops_port).await == Some(false)).then_some(()) },
    )
    .await;
    let not_ready_after = t0.elapsed() - killed_at;
    assert!(
        !worker.is_finished(),
        "the worker kept running while storage was down"
    );

    // Same ports, empty: every queue and table is gone.
    azurite.start().await;
    let restarted_at = t0.elapsed();
    {
        let q = q.clone();
        eventually(
            "the worker recreated its source queue",
            Duration::from_secs(30),
            move || {
                let q = q.clone();
                async move { q.approximate_count().await.ok().map(|_| ()) }
            },
        )
        .await;
    }
    eventually(
        "/readyz 200 after the restart",
        Duration::from_secs(30),
        || async { (ready(ops_port).await == Some(true)).then_some(()) },
    )
    .await;
    let ready_again_after = t0.elapsed() - restarted_at;

    // After: new jobs must be processed, once each.
    let (after, expected_after) = jobs("after", 20);
    for p in &after {
        // Put without creating the queue: the worker must have done that.
        q.put(
            &aqw_core::message::encode(p, config.message_encoding),
            Duration::ZERO,
            aqw_core::storage::Ttl::Default,
        )
        .await
        .expect("put after restart");
    }
    let processed = {
        let (sink, expected) = (sink.clone(), expected_after.clone());
        eventually_or_none(
            "jobs enqueued after the restart processed",
            Duration::from_secs(45),
            move || std::future::ready(all_applied(&sink, &expected).then_some(())),
        )
        .await
    };
    let l = ledger(&sink);
    let applied_after = expected_after
        .iter()
        .filter(|k| l.applied.contains_key(*k))
        .count();
    let keys_table = match storage.table(&config.keys_table).query(None).await {
        Ok(rows) => format!("exists ({} rows)", rows.len()),
        Err(StorageError::NotFound) => "MISSING (404)".to_string(),
        Err(e) => format!("error {e}"),
    };
    let records_table = match storage.table(&config.poison_table).query(None).await {
        Ok(rows) => {
            let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
            for (_, _, e) in &rows {
                let kind = e.get("ErrorKind").and_then(Value::as_str).unwrap_or("");
                let msg = e.get("ErrorMessage").and_then(Value::as_str).unwrap_or("");
                *kinds.entry(format!("{kind}: {msg}")).or_default() += 1;
            }
            format!("exists ({} records: {kinds:?})", rows.len())
        }
        Err(StorageError::NotFound) => "missing (404)".to_string(),
        Err(e) => format!("error {e}"),
    };
    let depth = TestApp::exact_count(q.as_ref()).await;
    println!(
        "restart: killed at {:.1}s with {applied_before}/60 applied; not ready {:.1}s later; \
         restarted at {:.1}s, ready again {:.1}s later; {applied_after}/20 post-restart jobs applied; \
         keys table {keys_table}; poison table {records_table}; source depth {depth}; total {:.1}s",
        killed_at.as_secs_f64(),
        not_ready_after.as_secs_f64(),
        restarted_at.as_secs_f64(),
        ready_again_after.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    assert!(!worker.is_finished(), "the worker did not exit");
    assert!(
        processed.is_some(),
        "only {applied_after}/20 jobs enqueued after the Azurite restart were processed within 45 s \
         (keys table: {keys_table}; poison table: {records_table}; source depth {depth})"
    );
    let (lost, doubled) = lost_and_doubled(&l, &expected_after);
    assert!(
        lost.is_empty() && doubled.is_empty(),
        "lost {lost:?}, doubled {doubled:?}"
    );

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), worker)
        .await
        .expect("worker stops within 30 s of shutdown")
        .unwrap()
        .expect("worker exits Ok");
}
