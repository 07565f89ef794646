//! Shared helpers for the integration tests: a real Azurite (started or
//! reused through `scripts/azurite.sh`), isolated apps with random queue and
//! table names, an effect-counting HTTP sink, and deadline polling; the
//! WebDriver client of the browser test in [`webdriver`].
#![allow(dead_code)]

pub mod webdriver;

use aqw::config::{self};
use aqw::handlers::Registry;
use aqw_azure::AzureStorage;
use aqw_core::config::AppConfig;
use aqw_core::handler::{Handler, HandlerError, Job, Success};
use aqw_core::storage::{QueueStore, Storage, TableStore};
use async_trait::async_trait;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub const CONN: &str = "UseDevelopmentStorage=true";

/// A free TCP port on loopback (the listener is dropped at once).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Start (or reuse) Azurite once per test process (every integration test
/// shares the one `it` binary, tests/it.rs).
pub fn azurite() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        let root = env!("CARGO_MANIFEST_DIR");
        let status = std::process::Command::new("bash")
            .arg(format!("{root}/scripts/azurite.sh"))
            .arg("start")
            .status()
            .expect("run scripts/azurite.sh");
        assert!(status.success(), "scripts/azurite.sh start failed");
    });
}

pub fn random_name(prefix: &str) -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("{prefix}{}", &id[..12])
}

/// An isolated app folder: random queue and table names.
pub struct TestApp {
    pub dir: tempfile::TempDir,
    pub queue: String,
    pub keys_table: String,
    pub poison_table: String,
    /// Pause and breaker rows: a table per test, so no test sees another's pause.
    pub control_table: String,
    pub config: Arc<AppConfig>,
}

pub fn env_map() -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    env.insert("AzureWebJobsStorage".to_string(), CONN.to_string());
    env
}

impl TestApp {
    /// `function` is the `aqw.functions.Job` object (queue is filled in);
    /// `queues` the `extensions.queues` object; `aqw_extra` more `aqw` keys.
    pub fn new(function: Value, queues: Value, aqw_extra: Value) -> Self {
        azurite();
        let queue = random_name("q");
        let keys_table = random_name("k");
        let poison_table = random_name("p");
        let control_table = random_name("c");
        let mut f = function;
        f["queue"] = json!(queue);
        let mut aqw = json!({
            "functions": { "Job": f },
            "tables": { "keys": keys_table, "poison": poison_table, "control": control_table },
            "retry": { "strategy": "exponential", "initialDelay": "00:00:00.100", "maxDelay": "00:00:00.300" },
            "shutdownTimeout": "00:00:05"
        });
        if let Value::Object(extra) = aqw_extra {
            for (k, v) in extra {
                aqw[k] = v;
            }
        }
        let mut q = json!({ "maxPollingInterval": "00:00:00.200" });
        if let Value::Object(extra) = queues {
            for (k, v) in extra {
                q[k] = v;
            }
        }
        let host = json!({ "version": "2.0", "extensions": { "queues": q }, "aqw": aqw });
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("host.json"),
            serde_json::to_string_pretty(&host).unwrap(),
        )
        .unwrap();
        let config = Arc::new(
            config::load_with_env(dir.path(), &env_map()).expect("test host.json is valid"),
        );
        Self {
            dir,
            queue,
            keys_table,
            poison_table,
            control_table,
            config,
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn storage(&self) -> AzureStorage {
        aqw_azure::connect(aqw_azure::connection_of(&self.config.functions[0].connection).unwrap())
            .unwrap()
    }

    pub fn source(&self) -> Arc<dyn QueueStore> {
        self.storage().queue(&self.queue)
    }

    pub fn poison_queue(&self) -> Arc<dyn QueueStore> {
        self.storage().queue(&format!("{}-poison", self.queue))
    }

    pub fn records(&self) -> Arc<dyn TableStore> {
        self.storage().table(&self.poison_table)
    }

    pub fn keys(&self) -> aqw_core::idempotency::KeyStore {
        aqw_core::idempotency::KeyStore::new(self.storage().table(&self.keys_table))
    }

    pub async fn enqueue(&self, payload: &str) -> String {
        let q = self.source();
        q.create_if_missing().await.unwrap();
        let text = aqw_core::message::encode(payload, self.config.message_encoding);
        q.put(&text, Duration::ZERO, aqw_core::storage::Ttl::Default)
            .await
            .unwrap()
            .id
    }

    pub async fn enqueue_raw(&self, text: &str) -> String {
        let q = self.source();
        q.create_if_missing().await.unwrap();
        q.put(text, Duration::ZERO, aqw_core::storage::Ttl::Default)
            .await
            .unwrap()
            .id
    }

    /// Start an in-process worker with `handler`; stop it with the returned token.
    pub fn start_worker(&self, handler: Arc<dyn Handler>) -> RunningWorker {
        let shutdown = CancellationToken::new();
        let registry = Registry::new().register("Job", handler);
        let task = tokio::spawn(aqw::worker::run(
            self.config.clone(),
            registry,
            shutdown.clone(),
        ));
        RunningWorker { shutdown, task }
    }

    /// Start an in-process worker whose handlers come from host.json.
    pub fn start_configured_worker(&self) -> RunningWorker {
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(aqw::worker::run(
            self.config.clone(),
            Registry::new(),
            shutdown.clone(),
        ));
        RunningWorker { shutdown, task }
    }

    /// All messages currently in the poison queue (received, then released).
    pub async fn poison_messages(&self) -> Vec<aqw_core::storage::PeekedMessage> {
        match self.poison_queue().peek(32).await {
            Ok(m) => m,
            Err(aqw_core::storage::StorageError::NotFound) => vec![],
            Err(e) => panic!("{e}"),
        }
    }

    pub async fn source_count(&self) -> usize {
        self.source().peek(32).await.map(|m| m.len()).unwrap_or(0)
    }

    /// Exact count of messages in a queue, visible or not: receive everything
    /// visible is not enough, so this uses the approximate count, which
    /// Azurite reports exactly.
    pub async fn exact_count(q: &dyn QueueStore) -> u64 {
        q.approximate_count().await.unwrap_or(0)
    }

    /// Wait until the source queue holds no message at all (visible or not).
    pub async fn drained(&self, deadline: Duration) {
        eventually("source queue empty", deadline, || async {
            (Self::exact_count(self.source().as_ref()).await == 0).then_some(())
        })
        .await;
    }

    pub async fn cleanup(&self) {
        let s = self.storage();
        let _ = s.queue(&self.queue).delete_queue().await;
        let _ = s
            .queue(&format!("{}-poison", self.queue))
            .delete_queue()
            .await;
        let _ = s.table(&self.keys_table).delete_table().await;
        let _ = s.table(&self.poison_table).delete_table().await;
        let _ = s.table(&self.control_table).delete_table().await;
    }
}

pub struct RunningWorker {
    pub shutdown: CancellationToken,
    pub task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl RunningWorker {
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.unwrap().unwrap();
    }
}

/// Poll `check` until it returns Some or the deadline passes.
pub async fn eventually<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let end = tokio::time::Instant::now() + deadline;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if tokio::time::Instant::now() >= end {
            panic!("timed out after {deadline:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What a scripted handler does on its n-th call.
pub type Script = dyn Fn(&Job, usize) -> Result<Success, HandlerError> + Send + Sync;

/// A handler scripted per attempt, counting its calls.
pub struct Scripted {
    pub calls: AtomicUsize,
    pub jobs: Mutex<Vec<Job>>,
    pub script: Box<Script>,
    pub delay: Duration,
}

impl Scripted {
    pub fn new(
        f: impl Fn(&Job, usize) -> Result<Success, HandlerError> + Send + Sync + 'static,
    ) -> Arc<Self> {
        Arc::new(Self {
            calls: AtomicUsize::new(0),
            jobs: Mutex::new(vec![]),
            script: Box::new(f),
            delay: Duration::ZERO,
        })
    }
    pub fn slow(
        delay: Duration,
        f: impl Fn(&Job, usize) -> Result<Success, HandlerError> + Send + Sync + 'static,
    ) -> Arc<Self> {
        Arc::new(Self {
            calls: AtomicUsize::new(0),
            jobs: Mutex::new(vec![]),
            script: Box::new(f),
            delay,
        })
    }
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Handler for Scripted {
    async fn handle(&self, job: &Job) -> Result<Success, HandlerError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        self.jobs.lock().unwrap().push(job.clone());
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        (self.script)(job, n)
    }
}

/// One request the sink received.
#[derive(Debug, Clone)]
pub struct SinkRequest {
    pub path: String,
    pub idempotency_key: Option<String>,
    pub business_key: Option<String>,
    pub previously_pending: bool,
    pub body: String,
    /// What the sink answered.
    pub status: u16,
}

/// An HTTP sink that records every request (the effect ledger). With
/// `dedupe`, it applies each Idempotency-Key once, like a real provider.
#[derive(Clone, Default)]
pub struct Sink {
    pub requests: Arc<Mutex<Vec<SinkRequest>>>,
    /// Status to answer (200 by default); set to fail on purpose.
    pub status: Arc<Mutex<u16>>,
    pub url: String,
}

impl Sink {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let sink = Sink {
            requests: Arc::default(),
            status: Arc::new(Mutex::new(200)),
            url: format!("http://{addr}"),
        };
        let app = Router::new()
            .route("/{*path}", post(record))
            .with_state(sink.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        sink
    }

    pub fn fail_with(&self, status: u16) {
        *self.status.lock().unwrap() = status;
    }

    pub fn all(&self) -> Vec<SinkRequest> {
        self.requests.lock().unwrap().clone()
    }

    /// Requests to one path.
    pub fn to(&self, path: &str) -> Vec<SinkRequest> {
        self.all().into_iter().filter(|r| r.path == path).collect()
    }

    /// Effects as a provider that dedupes on Idempotency-Key would apply them.
    pub fn applied_effects(&self, path: &str) -> Vec<SinkRequest> {
        let mut seen = std::collections::HashSet::new();
        self.all()
            .into_iter()
            .filter(|r| r.path == path && r.status < 300)
            .filter(|r| seen.insert(r.idempotency_key.clone().unwrap_or_default()))
            .collect()
    }
}

async fn record(
    State(sink): State<Sink>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: String,
) -> StatusCode {
    let h = |n: &str| {
        headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let status = if uri.path().starts_with("/effects") {
        *sink.status.lock().unwrap()
    } else {
        200
    };
    sink.requests.lock().unwrap().push(SinkRequest {
        path: uri.path().to_string(),
        idempotency_key: h("idempotency-key"),
        business_key: h("aqw-key"),
        previously_pending: h("aqw-previously-pending").as_deref() == Some("true"),
        body,
        status,
    });
    StatusCode::from_u16(status).unwrap()
}

/// The aqw binary built for this test run.
pub fn aqw_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_aqw"))
}

/// Run the aqw binary against `app` with `UseDevelopmentStorage=true`.
pub fn aqw(app: &Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(aqw_bin())
        .args(args)
        .arg("--app")
        .arg(app)
        .env("AzureWebJobsStorage", CONN)
        .env_remove("AQW_LOG")
        .output()
        .expect("run aqw")
}

/// One real poison record: a worker poisons a job its handler refuses
/// (404, permanent); returns the source message id.
pub async fn poisoned_by_worker(app: &TestApp, deadline: Duration) -> String {
    let id = app.enqueue(r#"{"orderId":"o-1"}"#).await;
    let h = Scripted::new(|_, _| Err(HandlerError::permanent("HTTP 404 Not Found: no such order")));
    let w = app.start_worker(h);
    eventually("the poison copy", deadline, || async {
        (app.poison_messages().await.len() == 1).then_some(())
    })
    .await;
    w.stop().await;
    id
}

/// The poison record of a source message, read through the operator's store.
pub async fn poison_record(app: &TestApp, id: &str) -> aqw_core::poison::PoisonRecord {
    let ops = aqw_core::ops::QueueOps::new(app.config.clone(), &app.queue, &app.storage());
    ops.record(id).await.unwrap().unwrap().0
}

/// The URL a started `aqw dashboard` prints on its first stdout line
/// (read on a thread, so a dashboard that never prints fails at the deadline).
pub fn dashboard_url(stdout: std::process::ChildStdout, deadline: Duration) -> String {
    use std::io::BufRead as _;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(deadline)
        .expect("the dashboard prints its URL");
    line.split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL in {line:?}"))
        .trim_end_matches('/')
        .to_string()
}

/// `aqw serve` instances in this process, as Flex may start several, each
/// answering `Job` with success; stop them with [`stop_serve_instances`].
pub fn start_serve_instances(
    app: &TestApp,
    n: usize,
) -> Vec<(
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<anyhow::Result<()>>,
)> {
    (0..n)
        .map(|_| {
            let stop = tokio_util::sync::CancellationToken::new();
            let registry = aqw::handlers::Registry::new().register(
                "Job",
                Scripted::new(|_, _| Ok(aqw_core::handler::Success::done())),
            );
            let task = tokio::spawn(aqw::serve::serve(
                app.config.clone(),
                registry,
                free_port(),
                stop.clone(),
            ));
            (stop, task)
        })
        .collect()
}

/// Stop what [`start_serve_instances`] started; each must end cleanly.
pub async fn stop_serve_instances(
    instances: Vec<(
        tokio_util::sync::CancellationToken,
        tokio::task::JoinHandle<anyhow::Result<()>>,
    )>,
) {
    for (stop, task) in instances {
        stop.cancel();
        task.await.unwrap().unwrap();
    }
}
