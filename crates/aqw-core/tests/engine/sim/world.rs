//! The simulated world's storage: every replica reaches the one memory
//! store through its own [`SimStorage`], which writes each request and its
//! answer to the shared event log, and injects the seed's storage faults
//! (ServerBusy and 500 answers, timeouts, answers lost after the request
//! was applied, latency) and a killed replica's silence.

use aqw_core::storage::memory::MemoryStorage;
use aqw_core::storage::{
    BlobItem, BlobRead, BlobStore, Entity, Etag, PeekedMessage, PutReceipt, QueueStore,
    ReceivedMessage, Row, Storage, StorageError, StorageResult, TableOp, TableQuery, TableStore,
    Ttl,
};
use async_trait::async_trait;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The storage faults of one run, drawn from its seed.
#[derive(Debug, Clone, Copy, Default)]
pub struct StorageFaults {
    /// Share of requests refused before they apply (503 ServerBusy, 500,
    /// or a timeout).
    pub refused: f64,
    /// Share of requests applied whose answer is lost (a timeout to the
    /// caller).
    pub lost: f64,
    /// Most latency added to a request (uniform up to it).
    pub latency_ms: u64,
}

struct WorldState {
    log: Vec<String>,
    rng: StdRng,
    faults: StorageFaults,
    /// Faults apply only while set (off for the settling phase).
    faults_on: bool,
    killed: BTreeSet<usize>,
}

/// What every replica's storage shares: the event log, the fault
/// generator and the set of killed replicas.
#[derive(Clone)]
pub struct World {
    state: Arc<Mutex<WorldState>>,
    t0: tokio::time::Instant,
}

/// How one request is handled.
enum Fate {
    Apply,
    Refuse(StorageError),
    Lose,
}

impl World {
    pub fn new(seed: u64, faults: StorageFaults) -> Self {
        Self {
            state: Arc::new(Mutex::new(WorldState {
                log: vec![],
                rng: StdRng::seed_from_u64(seed ^ 0x5EED_FA17),
                faults,
                faults_on: true,
                killed: BTreeSet::new(),
            })),
            t0: tokio::time::Instant::now(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, WorldState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Append one event, stamped with simulated milliseconds.
    pub fn note(&self, event: String) {
        let ms = self.t0.elapsed().as_millis();
        self.lock().log.push(format!("{ms:>9} {event}"));
    }

    /// How many events the log holds now.
    pub fn mark(&self) -> usize {
        self.lock().log.len()
    }

    pub fn log(&self) -> Vec<String> {
        self.lock().log.clone()
    }

    pub fn set_faults_on(&self, on: bool) {
        self.lock().faults_on = on;
    }

    /// From now on every storage request of `replica` hangs, as a killed
    /// process's would never arrive.
    pub fn kill(&self, replica: usize) {
        self.lock().killed.insert(replica);
    }

    /// The storage replica `replica` sees.
    pub fn storage(&self, inner: &MemoryStorage, replica: usize) -> Arc<dyn Storage> {
        Arc::new(SimStorage {
            inner: inner.clone(),
            world: self.clone(),
            replica,
        })
    }

    fn draw(&self, replica: usize) -> (Fate, Duration, bool) {
        let mut st = self.lock();
        let killed = st.killed.contains(&replica);
        if !st.faults_on {
            return (Fate::Apply, Duration::ZERO, killed);
        }
        let f = st.faults;
        let latency = match f.latency_ms {
            0 => Duration::ZERO,
            n => Duration::from_millis(st.rng.gen_range(0..=n)),
        };
        let roll: f64 = st.rng.gen();
        let fate = if roll < f.refused {
            Fate::Refuse(match st.rng.gen_range(0..3) {
                0 => StorageError::Http {
                    status: 503,
                    code: "ServerBusy".into(),
                },
                1 => StorageError::Http {
                    status: 500,
                    code: "InternalError".into(),
                },
                _ => StorageError::Transport("operation timed out (simulated)".into()),
            })
        } else if roll < f.refused + f.lost {
            Fate::Lose
        } else {
            Fate::Apply
        };
        (fate, latency, killed)
    }

    /// Run one request of `replica` through the seed's faults, logging it.
    async fn request<T, F>(&self, replica: usize, what: String, apply: F) -> StorageResult<T>
    where
        F: Future<Output = StorageResult<T>>,
    {
        let (fate, latency, killed) = self.draw(replica);
        if killed {
            std::future::pending::<()>().await;
        }
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        let result = match fate {
            Fate::Apply => apply.await,
            Fate::Refuse(e) => Err(e),
            Fate::Lose => match apply.await {
                Ok(_) => Err(StorageError::Transport(
                    "answer lost after apply (simulated)".into(),
                )),
                Err(e) => Err(e),
            },
        };
        let shown = match &result {
            Ok(_) => "ok".to_string(),
            Err(e) => format!("err {e}"),
        };
        self.note(format!("r{replica} {what} -> {shown}"));
        result
    }
}

struct SimStorage {
    inner: MemoryStorage,
    world: World,
    replica: usize,
}

impl Storage for SimStorage {
    fn queue(&self, name: &str) -> Arc<dyn QueueStore> {
        Arc::new(SimQueue {
            inner: self.inner.queue(name),
            world: self.world.clone(),
            replica: self.replica,
        })
    }
    fn table(&self, name: &str) -> Arc<dyn TableStore> {
        Arc::new(SimTable {
            inner: self.inner.table(name),
            world: self.world.clone(),
            replica: self.replica,
        })
    }
    fn blobs(&self, name: &str) -> Arc<dyn BlobStore> {
        Arc::new(SimBlobs {
            inner: self.inner.blobs(name),
            world: self.world.clone(),
            replica: self.replica,
        })
    }
}

struct SimQueue {
    inner: Arc<dyn QueueStore>,
    world: World,
    replica: usize,
}

impl SimQueue {
    async fn req<T>(
        &self,
        op: &str,
        f: impl Future<Output = StorageResult<T>>,
    ) -> StorageResult<T> {
        let what = format!("queue.{op} {}", self.inner.name());
        self.world.request(self.replica, what, f).await
    }
}

#[async_trait]
impl QueueStore for SimQueue {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn create_if_missing(&self) -> StorageResult<()> {
        self.req("create", self.inner.create_if_missing()).await
    }
    async fn receive(&self, max: u8, visibility: Duration) -> StorageResult<Vec<ReceivedMessage>> {
        // When it was sent, as the log's length then (the pause check).
        let sent = self.world.mark();
        let got = self
            .req("receive", self.inner.receive(max, visibility))
            .await?;
        if got.is_empty() {
            return Ok(got);
        }
        let ids: Vec<String> = got
            .iter()
            .map(|m| format!("{}#{}", m.id, m.dequeue_count))
            .collect();
        self.world.note(format!(
            "r{} received {} {} sent#{sent}",
            self.replica,
            self.inner.name(),
            ids.join(",")
        ));
        Ok(got)
    }
    async fn peek(&self, max: u8) -> StorageResult<Vec<PeekedMessage>> {
        self.req("peek", self.inner.peek(max)).await
    }
    async fn put(&self, text: &str, visibility: Duration, ttl: Ttl) -> StorageResult<PutReceipt> {
        self.req("put", self.inner.put(text, visibility, ttl)).await
    }
    async fn update_visibility(
        &self,
        id: &str,
        pop_receipt: &str,
        text: &str,
        visibility: Duration,
    ) -> StorageResult<String> {
        let f = self
            .inner
            .update_visibility(id, pop_receipt, text, visibility);
        self.req(&format!("update {id} {visibility:?}"), f).await
    }
    async fn delete(&self, id: &str, pop_receipt: &str) -> StorageResult<()> {
        let f = self.inner.delete(id, pop_receipt);
        self.req(&format!("delete {id}"), f).await
    }
    async fn approximate_count(&self) -> StorageResult<u64> {
        self.req("count", self.inner.approximate_count()).await
    }
    async fn delete_queue(&self) -> StorageResult<()> {
        self.req("delete_queue", self.inner.delete_queue()).await
    }
}

struct SimTable {
    inner: Arc<dyn TableStore>,
    world: World,
    replica: usize,
}

impl SimTable {
    async fn req<T>(
        &self,
        op: &str,
        f: impl Future<Output = StorageResult<T>>,
    ) -> StorageResult<T> {
        let what = format!("table.{op} {}", self.inner.name());
        self.world.request(self.replica, what, f).await
    }
}

#[async_trait]
impl TableStore for SimTable {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn create_if_missing(&self) -> StorageResult<()> {
        self.req("create", self.inner.create_if_missing()).await
    }
    async fn insert(&self, pk: &str, rk: &str, entity: &Entity) -> StorageResult<Etag> {
        let f = self.inner.insert(pk, rk, entity);
        self.req(&format!("insert {pk}/{rk}"), f).await
    }
    async fn get(&self, pk: &str, rk: &str) -> StorageResult<Option<(Entity, Etag)>> {
        let f = self.inner.get(pk, rk);
        self.req(&format!("get {pk}/{rk}"), f).await
    }
    async fn merge(
        &self,
        pk: &str,
        rk: &str,
        entity: &Entity,
        if_match: Option<&Etag>,
    ) -> StorageResult<Etag> {
        let f = self.inner.merge(pk, rk, entity, if_match);
        self.req(&format!("merge {pk}/{rk}"), f).await
    }
    async fn delete(&self, pk: &str, rk: &str) -> StorageResult<()> {
        let f = self.inner.delete(pk, rk);
        self.req(&format!("delete {pk}/{rk}"), f).await
    }
    async fn query_where(&self, query: &TableQuery<'_>) -> StorageResult<Vec<Row>> {
        // Its partition named: the pause check tells the gate's reads of the
        // control rows from the operations' and the schedules'.
        let op = format!("query {}", query.partition.unwrap_or("*"));
        self.req(&op, self.inner.query_where(query)).await
    }
    async fn transaction(&self, pk: &str, ops: Vec<TableOp>) -> StorageResult<()> {
        let f = self.inner.transaction(pk, ops);
        self.req(&format!("batch {pk}"), f).await
    }
    async fn delete_table(&self) -> StorageResult<()> {
        self.req("delete_table", self.inner.delete_table()).await
    }
}

struct SimBlobs {
    inner: Arc<dyn BlobStore>,
    world: World,
    replica: usize,
}

impl SimBlobs {
    async fn req<T>(
        &self,
        op: &str,
        f: impl Future<Output = StorageResult<T>>,
    ) -> StorageResult<T> {
        let what = format!("blob.{op} {}", self.inner.name());
        self.world.request(self.replica, what, f).await
    }
}

#[async_trait]
impl BlobStore for SimBlobs {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn create_if_missing(&self) -> StorageResult<()> {
        self.req("create", self.inner.create_if_missing()).await
    }
    async fn put(&self, name: &str, bytes: &[u8]) -> StorageResult<Etag> {
        self.req(&format!("put {name}"), self.inner.put(name, bytes))
            .await
    }
    async fn get(&self, name: &str, max_bytes: u64) -> StorageResult<Option<BlobRead>> {
        self.req(&format!("get {name}"), self.inner.get(name, max_bytes))
            .await
    }
    async fn touch(&self, name: &str) -> StorageResult<Etag> {
        self.req(&format!("touch {name}"), self.inner.touch(name))
            .await
    }
    async fn delete(&self, name: &str, if_match: Option<&Etag>) -> StorageResult<()> {
        self.req(&format!("delete {name}"), self.inner.delete(name, if_match))
            .await
    }
    async fn list(&self, prefix: &str) -> StorageResult<Vec<BlobItem>> {
        self.req("list", self.inner.list(prefix)).await
    }
    async fn delete_container(&self) -> StorageResult<()> {
        self.req("delete_container", self.inner.delete_container())
            .await
    }
}
