//! What every engine test shares: an [`Env`] (a fresh memory store, names
//! random per test, the test's [`Provider`]), a running worker
//! ([`Running`]), the readers of the store's state, and polling on
//! simulated time.

use aqw_core::alert::{AlertEvent, Alerts};
use aqw_core::builder::{Worker, WorkerBuilder};
use aqw_core::config::{AppConfig, FunctionConfig, KeySpec};
use aqw_core::control::{Control, ControlStore};
use aqw_core::handler::{Handler, HandlerError, Job, ProviderAnswer, Success};
use aqw_core::idempotency::{IdempotencyKey, KeyRecord, KeyStore, KeyTemplate};
use aqw_core::message::{encode, MessageEncoding};
use aqw_core::ops::{QueueOps, ReplayOptions, ReplayReport};
use aqw_core::poison::{PoisonEnvelope, PoisonRecord, PoisonStore};
use aqw_core::retry::RetryStrategy;
use aqw_core::storage::memory::MemoryStorage;
use aqw_core::storage::{Storage, StorageError, Ttl};
use async_trait::async_trait;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// `n` simulated minutes.
pub const fn minutes(n: u64) -> Duration {
    Duration::from_secs(60 * n)
}

/// The message encoding of every test app (the default).
pub const ENCODING: MessageEncoding = MessageEncoding::Base64;

/// What the test's provider does with one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Behave {
    /// Apply the effect (once per provider key) and answer 2xx.
    Succeed,
    /// A retryable failure with this text (a 503).
    Retry(String),
    /// A permanent failure with this text (a 4xx).
    Fail(String),
    /// A refusal with `Retry-After` (a 429): "later", nothing applied.
    Later(Duration),
    /// "Still processing an earlier request with this key" (a 409).
    InProgress,
    /// A bare 429: refused for now, no delay named.
    Throttled,
}

/// How one call to the provider ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallOutcome {
    /// The effect was applied by this call.
    Applied,
    /// The provider had applied this provider key before: it answered from
    /// its idempotency store, applying nothing.
    Deduplicated,
    /// The call failed with this text; nothing applied.
    Failed(String),
}

/// One call the handler made to the provider.
#[derive(Debug, Clone)]
pub struct Call {
    /// The business key.
    pub key: String,
    pub provider_key: String,
    pub message_id: String,
    pub dequeue_count: u32,
    pub previously_pending: bool,
    pub outcome: CallOutcome,
}

type Rule = Arc<dyn Fn(&Job, usize) -> Behave + Send + Sync>;

struct ProviderState {
    calls: Vec<Call>,
    /// Provider key → the business key whose effect it applied.
    applied: HashMap<String, String>,
    /// What to do with a call: from the job and the number of this call
    /// for its business key (1 for the first).
    rule: Rule,
    /// How long each call takes (tokio time).
    delay: Duration,
    /// When each call started (tokio time).
    started: Vec<tokio::time::Instant>,
    /// Calls in flight now, and the most at once: overall (`""`) and per
    /// payload `tenant`.
    in_flight: HashMap<String, u32>,
    peak: HashMap<String, u32>,
}

/// The outside provider behind the test's handler: it deduplicates by the
/// provider key, as a real one honouring `Idempotency-Key` does, and counts
/// every call and every applied effect.
#[derive(Clone)]
pub struct Provider(Arc<Mutex<ProviderState>>);

impl Provider {
    pub fn new(rule: impl Fn(&Job, usize) -> Behave + Send + Sync + 'static) -> Self {
        Self(Arc::new(Mutex::new(ProviderState {
            calls: vec![],
            applied: HashMap::new(),
            rule: Arc::new(rule),
            delay: Duration::ZERO,
            started: vec![],
            in_flight: HashMap::new(),
            peak: HashMap::new(),
        })))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ProviderState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Change what the provider does from now on ("fix the handler").
    pub fn set_rule(&self, rule: impl Fn(&Job, usize) -> Behave + Send + Sync + 'static) {
        self.state().rule = Arc::new(rule);
    }

    /// Make every call take `delay` of tokio time.
    pub fn set_delay(&self, delay: Duration) {
        self.state().delay = delay;
    }

    /// The handler the worker runs: one call to this provider per attempt.
    pub fn handler(&self) -> Arc<dyn Handler> {
        Arc::new(ProviderHandler(self.clone()))
    }

    /// The most calls that were in flight at once, overall (`None`) or for
    /// one payload `tenant`.
    pub fn peak_in_flight(&self, tenant: Option<&str>) -> u32 {
        let group = tenant.map(|t| format!("tenant:{t}")).unwrap_or_default();
        self.state().peak.get(&group).copied().unwrap_or(0)
    }

    /// When each call started, in order.
    pub fn call_starts(&self) -> Vec<tokio::time::Instant> {
        self.state().started.clone()
    }

    /// Count a call in (or out of, `delta` -1) flight, overall and for its tenant.
    fn count_in_flight(&self, job: &Job, delta: i32) {
        let tenant = serde_json::from_str::<Value>(&job.payload)
            .ok()
            .and_then(|v| v["tenant"].as_str().map(|t| format!("tenant:{t}")));
        let mut st = self.state();
        if delta > 0 {
            st.started.push(tokio::time::Instant::now());
        }
        for group in std::iter::once(String::new()).chain(tenant) {
            let n = st.in_flight.entry(group.clone()).or_default();
            *n = n.saturating_add_signed(delta);
            let now = *n;
            let peak = st.peak.entry(group).or_default();
            *peak = (*peak).max(now);
        }
    }

    async fn serve(&self, job: &Job) -> Result<Success, HandlerError> {
        self.count_in_flight(job, 1);
        let delay = self.state().delay;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        self.count_in_flight(job, -1);
        let key = job.key.as_ref().map(|k| k.to_string()).unwrap_or_default();
        let provider_key = job.provider_key.clone().unwrap_or_default();
        let mut st = self.state();
        let n = st.calls.iter().filter(|c| c.key == key).count() + 1;
        let behave = (st.rule)(job, n);
        let (outcome, result) = match behave {
            Behave::Succeed if st.applied.contains_key(&provider_key) => (
                CallOutcome::Deduplicated,
                Ok(Success::answered(ProviderAnswer {
                    status: 200,
                    body: String::new(),
                    replayed: true,
                })),
            ),
            Behave::Succeed => {
                st.applied.insert(provider_key.clone(), key.clone());
                (
                    CallOutcome::Applied,
                    Ok(Success::answered(ProviderAnswer {
                        status: 201,
                        body: String::new(),
                        replayed: false,
                    })),
                )
            }
            Behave::Retry(m) => (
                CallOutcome::Failed(m.clone()),
                Err(HandlerError::retryable(m)),
            ),
            Behave::Later(after) => (
                CallOutcome::Failed("HTTP 429".into()),
                Err(HandlerError::throttled(
                    "HTTP 429: rate limited",
                    Some(after),
                )),
            ),
            Behave::Throttled => (
                CallOutcome::Failed("HTTP 429".into()),
                Err(HandlerError::throttled("HTTP 429", None)),
            ),
            Behave::Fail(m) => (
                CallOutcome::Failed(m.clone()),
                Err(HandlerError::permanent(m)),
            ),
            Behave::InProgress => (
                CallOutcome::Failed("HTTP 409".into()),
                Err(HandlerError::InProgress {
                    message: "HTTP 409: in progress".into(),
                    retry_after: None,
                }),
            ),
        };
        st.calls.push(Call {
            key,
            provider_key,
            message_id: job.message_id.clone(),
            dequeue_count: job.dequeue_count,
            previously_pending: job.previously_pending,
            outcome,
        });
        result
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.state().calls.clone()
    }

    /// The calls for one business key, in order.
    pub fn calls_for(&self, key: &str) -> Vec<Call> {
        self.calls().into_iter().filter(|c| c.key == key).collect()
    }

    /// Applied effects per business key: the distinct provider keys the
    /// provider applied for it (a deduplicated call applies nothing).
    pub fn effects(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for key in self.state().applied.values() {
            *out.entry(key.clone()).or_default() += 1;
        }
        out
    }

    /// Each of `keys` had its effect applied exactly once, every call for it
    /// carried one provider key (so retries and replays could not double
    /// it), and no other key had an effect.
    pub fn assert_applied_once(&self, keys: &[String]) {
        let effects = self.effects();
        for k in keys {
            assert_eq!(effects.get(k), Some(&1), "{k}: applied once ({effects:?})");
            let pks: HashSet<String> = self
                .calls_for(k)
                .into_iter()
                .map(|c| c.provider_key)
                .collect();
            assert_eq!(pks.len(), 1, "{k}: one provider key on every call: {pks:?}");
        }
        let expected: HashSet<&String> = keys.iter().collect();
        let others: Vec<&String> = effects.keys().filter(|k| !expected.contains(k)).collect();
        assert!(others.is_empty(), "effects nobody expected: {others:?}");
    }
}

struct ProviderHandler(Provider);

#[async_trait]
impl Handler for ProviderHandler {
    async fn handle(&self, job: &Job) -> Result<Success, HandlerError> {
        self.0.serve(job).await
    }
}

/// Whether the job's payload says `"bad": true`.
pub fn is_bad(job: &Job) -> bool {
    serde_json::from_str::<Value>(&job.payload)
        .ok()
        .and_then(|v| v.get("bad").and_then(Value::as_bool))
        .unwrap_or(false)
}

/// One job: its payload, its business key and the message text a producer
/// puts on the queue.
#[derive(Debug, Clone)]
pub struct JobSpec {
    pub payload: String,
    pub key: String,
    pub text: String,
}

/// A worker running on its own task until [`Running::stop`].
pub struct Running {
    shutdown: CancellationToken,
    handle: JoinHandle<()>,
}

/// Run `worker` until stopped.
pub fn start(worker: Worker) -> Running {
    let shutdown = CancellationToken::new();
    let handle = tokio::spawn(worker.run(shutdown.clone()));
    Running { shutdown, handle }
}

impl Running {
    /// Shut down as SIGTERM would: stop receiving, drain in-flight jobs.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.handle.await.expect("the worker ends without a panic");
    }

    /// Whether the worker's run ended (it never should on its own).
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }
}

/// A failpoint's panic is the in-process crash a test asked for: keep it
/// off the test output (any other panic is reported as usual).
fn quiet_failpoint_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let text = info
                .payload()
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| info.payload().downcast_ref::<&str>().copied())
                .unwrap_or("");
            if !text.starts_with("failpoint ") {
                default(info);
            }
        }));
    });
}

/// One test's world: a fresh memory store, a function and its queue and
/// tables named at random, the provider behind its handler, and the alerts
/// the engine raised.
pub struct Env {
    pub storage: MemoryStorage,
    pub provider: Provider,
    /// Random, per test: in every name below.
    pub id: String,
    pub function: String,
    pub queue: String,
    pub keys_table: String,
    pub poison_table: String,
    pub control_table: String,
    pub heartbeat_table: String,
    alerts: Alerts,
    alert_rx: Mutex<UnboundedReceiver<AlertEvent>>,
}

impl Env {
    /// A fresh store (which turns the engine's clock to simulated time) and
    /// a provider following `rule`.
    pub fn new(rule: impl Fn(&Job, usize) -> Behave + Send + Sync + 'static) -> Self {
        let id = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
        Self::on(MemoryStorage::new(), id, rule)
    }

    /// [`Env::new`], bit for bit from `seed`: the engine's randomness and
    /// wall clock pinned as the seeded simulation's (`sim/`), so a test
    /// whose figures the bench prints gives the same figures every run.
    /// Call it first in the test, on the test's own (current-thread) runtime.
    pub fn seeded(seed: u64, rule: impl Fn(&Job, usize) -> Behave + Send + Sync + 'static) -> Self {
        aqw_core::entropy::seed_thread(seed);
        let wall = time::macros::datetime!(2026-03-02 08:00:00.250 UTC);
        aqw_core::clock::simulate_from(wall);
        let id = aqw_core::entropy::uuid().simple().to_string()[..12].to_string();
        Self::on(MemoryStorage::starting_at(wall), id, rule)
    }

    /// An env over `storage`, its names carrying `id` (a seeded simulation
    /// passes a store on its pinned clock and an id from its seed).
    pub fn on(
        storage: MemoryStorage,
        id: String,
        rule: impl Fn(&Job, usize) -> Behave + Send + Sync + 'static,
    ) -> Self {
        quiet_failpoint_panics();
        let (alerts, alert_rx) = Alerts::channel();
        Self {
            storage,
            provider: Provider::new(rule),
            function: format!("Job{id}"),
            queue: format!("q{id}"),
            keys_table: format!("keys{id}"),
            poison_table: format!("poison{id}"),
            control_table: format!("control{id}"),
            heartbeat_table: format!("beats{id}"),
            id,
            alerts,
            alert_rx: Mutex::new(alert_rx),
        }
    }

    /// A worker builder over `storage` for the test's function (key
    /// `job:{/id}`, maxDequeueCount 5, a fixed 1 s retry, polling backing
    /// off to 2 s), `change` applied to the function's configuration.
    pub fn builder_on(
        &self,
        storage: Arc<dyn Storage>,
        change: impl FnOnce(&mut FunctionConfig),
    ) -> WorkerBuilder {
        let mut f = FunctionConfig::new(&self.function, &self.queue);
        f.key = KeySpec::Template(KeyTemplate::parse("job:{/id}").expect("a valid template"));
        change(&mut f);
        let tables = (
            self.keys_table.clone(),
            self.poison_table.clone(),
            self.control_table.clone(),
            self.heartbeat_table.clone(),
        );
        WorkerBuilder::new(storage.clone())
            .max_dequeue_count(5)
            .retry(RetryStrategy::Fixed {
                delay: Duration::from_secs(1),
            })
            .alerts(self.alerts.clone())
            .configure(move |app| {
                (app.keys_table, app.poison_table) = (tables.0, tables.1);
                (app.control_table, app.heartbeat_table) = (tables.2, tables.3);
                app.max_polling_interval = Duration::from_secs(2);
            })
            .function_on(f, storage, self.provider.handler())
    }

    /// [`Self::builder_on`] the test's store, the function as configured.
    pub fn builder(&self) -> WorkerBuilder {
        self.builder_on(Arc::new(self.storage.clone()), |_| {})
    }

    /// A worker of the test's function on the test's store.
    pub fn worker(&self) -> Worker {
        self.builder().build().expect("valid settings")
    }

    /// The app configuration the workers run with (for the ops procedures).
    pub fn app(&self) -> Arc<AppConfig> {
        self.worker().config().clone()
    }

    /// The operator's view of the test's queue.
    pub fn ops(&self) -> QueueOps {
        QueueOps::new(self.app(), &self.queue, &self.storage)
    }

    /// A job named `name` (its id and key carry the test's random id), with
    /// `extra` fields in its payload.
    pub fn job_with(&self, name: &str, extra: Value) -> JobSpec {
        let id = format!("{}-{name}", self.id);
        let mut payload = json!({ "id": id, "note": "exact text ✓" });
        if let (Some(p), Value::Object(extra)) = (payload.as_object_mut(), extra) {
            p.extend(extra);
        }
        let payload = payload.to_string();
        JobSpec {
            text: encode(&payload, ENCODING),
            key: format!("job:{id}"),
            payload,
        }
    }

    /// A job named `name`.
    pub fn job(&self, name: &str) -> JobSpec {
        self.job_with(name, json!({}))
    }

    /// Put a job on the source queue as a producer does; its message id.
    pub async fn enqueue(&self, job: &JobSpec) -> String {
        self.enqueue_after(job, Duration::ZERO).await
    }

    /// Put a job on the source queue, visible after `delay`.
    pub async fn enqueue_after(&self, job: &JobSpec, delay: Duration) -> String {
        let q = self.storage.queue(&self.queue);
        q.create_if_missing().await.expect("create the queue");
        q.put(&job.text, delay, Ttl::Default)
            .await
            .expect("put the job")
            .id
    }

    /// The key record of `key`, if it has one.
    pub async fn key(&self, key: &str) -> Option<KeyRecord> {
        let keys = KeyStore::new(self.storage.table(&self.keys_table));
        let k = IdempotencyKey::new(key).expect("a key");
        match keys.get(&self.function, &k).await {
            Ok(r) => r,
            Err(StorageError::NotFound) => None,
            Err(e) => panic!("read key {key}: {e}"),
        }
    }

    /// Every key row of the table (key text → status), without the
    /// retention sweeper's lease row.
    pub async fn key_rows(&self) -> BTreeMap<String, String> {
        let rows = match self.storage.table(&self.keys_table).query(None).await {
            Ok(rows) => rows,
            Err(StorageError::NotFound) => vec![],
            Err(e) => panic!("read the key table: {e}"),
        };
        rows.into_iter()
            .filter(|(pk, _, _)| pk != aqw_core::retention::sweep::LEASE_PARTITION)
            .map(|(_, _, e)| {
                let s = |c: &str| e.get(c).and_then(Value::as_str).unwrap_or("").to_string();
                (s("Key"), s("Status"))
            })
            .collect()
    }

    pub fn poison_store(&self) -> PoisonStore {
        PoisonStore::new(
            &self.queue,
            &self.function,
            ENCODING,
            self.storage.table(&self.poison_table),
            self.storage
                .queue(&aqw_core::poison::poison_queue_name(&self.queue)),
        )
    }

    /// Every poison record of the queue.
    pub async fn records(&self) -> Vec<PoisonRecord> {
        self.poison_store()
            .list()
            .await
            .expect("read the poison records")
            .into_iter()
            .map(|(r, _)| r)
            .collect()
    }

    /// Messages on the source queue, visible or not.
    pub async fn source_depth(&self) -> u64 {
        match self.storage.queue(&self.queue).approximate_count().await {
            Ok(n) => n,
            Err(StorageError::NotFound) => 0,
            Err(e) => panic!("count the source queue: {e}"),
        }
    }

    /// Messages on `<queue>-poison`, visible or not.
    pub async fn poison_depth(&self) -> u64 {
        self.poison_store()
            .poison_depth()
            .await
            .expect("count the poison queue")
    }

    /// The visible copies on `<queue>-poison` (id, envelope).
    pub async fn poison_copies(&self) -> Vec<(String, PoisonEnvelope)> {
        let q = self
            .storage
            .queue(&aqw_core::poison::poison_queue_name(&self.queue));
        let peeked = match q.peek(32).await {
            Ok(p) => p,
            Err(StorageError::NotFound) => vec![],
            Err(e) => panic!("peek the poison queue: {e}"),
        };
        peeked
            .into_iter()
            .map(|m| {
                let env = PoisonEnvelope::from_queue_text(&m.text)
                    .unwrap_or_else(|| panic!("not an aqw envelope: {}", m.text));
                (m.id, env)
            })
            .collect()
    }

    /// The function's control row (pause, published breaker state).
    pub async fn control(&self) -> Control {
        ControlStore::new(self.storage.table(&self.control_table))
            .get(&self.function)
            .await
            .expect("read the control row")
    }

    /// The alerts raised since the last call.
    pub fn alerts(&self) -> Vec<AlertEvent> {
        let mut rx = self.alert_rx.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = vec![];
        while let Ok(a) = rx.try_recv() {
            out.push(a);
        }
        out
    }

    /// `aqw poison replay QUEUE --all --by oncall`, one record at a time.
    pub async fn replay_all(&self) -> ReplayReport {
        replay_all(self.ops()).await
    }

    /// The store's state in a few lines, for a failure message.
    pub async fn dump(&self) -> String {
        let records: Vec<String> = self
            .records()
            .await
            .iter()
            .map(|r| {
                format!(
                    "{} {} key={:?} copy={:?} error={}:{}",
                    r.message_id,
                    r.status.as_str(),
                    r.key.as_deref(),
                    r.poison_message_id,
                    r.error.kind.as_str(),
                    r.error.message
                )
            })
            .collect();
        let calls: Vec<String> = self
            .provider
            .calls()
            .iter()
            .map(|c| {
                format!(
                    "{} pk={} msg={} dc={} {:?}",
                    c.key,
                    &c.provider_key[..8.min(c.provider_key.len())],
                    c.message_id,
                    c.dequeue_count,
                    c.outcome
                )
            })
            .collect();
        format!(
            "source depth {}, poison depth {}\nkeys {:#?}\nrecords {records:#?}\ncalls {calls:#?}",
            self.source_depth().await,
            self.poison_depth().await,
            self.key_rows().await,
        )
    }

    /// Poll `condition` every 100 ms of tokio time until it holds; fail
    /// with the store's state after `within` of simulated time.
    pub async fn wait_until<F, Fut>(&self, what: &str, within: Duration, mut condition: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if condition().await {
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                panic!(
                    "{what}: not within {within:?} of simulated time\n{}",
                    self.dump().await
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Until the source queue is empty.
    pub async fn drained(&self, within: Duration) {
        self.wait_until("the source queue drained", within, || async {
            self.source_depth().await == 0
        })
        .await;
    }
}

/// `aqw poison replay QUEUE --all --by oncall` over `ops` (owned, so it can
/// run on a task of its own).
pub async fn replay_all(ops: QueueOps) -> ReplayReport {
    let opts = ReplayOptions {
        by: "oncall".into(),
        concurrency: 1,
        ..Default::default()
    };
    let progress = |_: usize, _: usize| {};
    aqw_core::ops::replay(&ops, &opts, &progress)
        .await
        .expect("replay")
}

/// A provider that takes 10 calls in each one-second window and answers a
/// 429 with `Retry-After: 1` beyond ("later").
pub fn ten_calls_a_second() -> impl Fn(&Job, usize) -> Behave + Send + Sync + 'static {
    let window = Mutex::new((tokio::time::Instant::now(), 0u32));
    move |_, _| {
        let mut w = window.lock().unwrap();
        if w.0.elapsed() >= Duration::from_secs(1) {
            *w = (tokio::time::Instant::now(), 0);
        }
        w.1 += 1;
        if w.1 > 10 {
            Behave::Later(Duration::from_secs(1))
        } else {
            Behave::Succeed
        }
    }
}

/// A provider that takes `limit` calls in each one-second window (read at
/// each call, so a test can change it) and answers a bare 429 beyond.
pub fn limited_to(
    limit: Arc<std::sync::atomic::AtomicU32>,
) -> impl Fn(&Job, usize) -> Behave + Send + Sync + 'static {
    let window = Mutex::new((tokio::time::Instant::now(), 0u32));
    move |_, _| {
        let mut w = window.lock().unwrap();
        if w.0.elapsed() >= Duration::from_secs(1) {
            *w = (tokio::time::Instant::now(), 0);
        }
        w.1 += 1;
        if w.1 > limit.load(std::sync::atomic::Ordering::Relaxed) {
            Behave::Throttled
        } else {
            Behave::Succeed
        }
    }
}

impl Env {
    /// `n` jobs named `<prefix><i>` on the source queue; their keys.
    pub async fn enqueue_many(&self, prefix: &str, n: usize) -> Vec<String> {
        let mut keys = Vec::with_capacity(n);
        for i in 0..n {
            let job = self.job(&format!("{prefix}{i}"));
            self.enqueue(&job).await;
            keys.push(job.key);
        }
        keys
    }
}
