//! A worker built in code: settings and handlers from the embedding binary,
//! no app folder on disk. `aqw run` is built the same way, from the
//! configuration its loader read (crate `aqw`, `src/worker.rs`).
//!
//! ```
//! # use aqw_core::builder::{handler_fn, WorkerBuilder};
//! # use aqw_core::handler::Success;
//! # use aqw_core::storage::memory::MemoryStorage;
//! # use std::sync::Arc;
//! # tokio_test_block_on(async {
//! let storage = MemoryStorage::new();
//! let worker = WorkerBuilder::new(Arc::new(storage.clone()))
//!     .max_dequeue_count(5)
//!     .function("SendReceipt", "receipts", handler_fn(|job| async move {
//!         // job.provider_key: send it as the provider's Idempotency-Key.
//!         let _ = (&job.payload, &job.provider_key, job.previously_pending);
//!         Ok(Success::default())
//!     }))
//!     .build()
//!     .expect("valid settings");
//! # let _ = worker;
//! # });
//! # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
//! #     tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
//! # }
//! ```

use crate::alert::Alerts;
use crate::config::{AppConfig, FunctionConfig};
use crate::handler::{Handler, HandlerError, Job, Success};
use crate::idempotency::KeySpec;
use crate::retry::RetryStrategy;
use crate::runtime::FunctionRuntime;
use crate::storage::Storage;
use crate::worker::{run_runtimes, Health};
use async_trait::async_trait;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A function added to a builder: its settings, its own storage (`None`:
/// the worker's), and its handler.
type Registration = (FunctionConfig, Option<Arc<dyn Storage>>, Arc<dyn Handler>);

/// Settings and handlers in, a [`Worker`] out.
pub struct WorkerBuilder {
    app: AppConfig,
    storage: Option<Arc<dyn Storage>>,
    functions: Vec<Registration>,
    alerts: Alerts,
}

/// Why a worker could not be built: the setting and what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("{setting}: {message}")]
pub struct BuildError {
    /// The setting at fault (`functions.SendReceipt.queue`).
    pub(crate) setting: String,
    /// What is wrong with it.
    pub message: String,
}

impl WorkerBuilder {
    /// A builder with the defaults of an empty `host.json`
    /// (`AppConfig::defaults`) over `storage`.
    pub fn new(storage: Arc<dyn Storage>) -> Self {
        Self {
            app: AppConfig::defaults("."),
            storage: Some(storage),
            functions: vec![],
            alerts: Alerts::disabled(),
        }
    }

    /// A builder over a configuration read elsewhere (the binary's
    /// loader); each function then names its storage ([`Self::function_on`]).
    pub fn from_config(app: AppConfig) -> Self {
        Self {
            app: AppConfig {
                functions: vec![],
                ..app
            },
            storage: None,
            functions: vec![],
            alerts: Alerts::disabled(),
        }
    }

    /// `maxDequeueCount`: attempts before a message is poisoned (1..=1000).
    pub fn max_dequeue_count(mut self, n: u32) -> Self {
        self.app.max_dequeue_count = n;
        self
    }

    /// `batchSize` (1..=32); `newBatchThreshold` follows as half of it.
    pub fn batch_size(mut self, n: u32) -> Self {
        self.app.batch_size = n;
        self.app.new_batch_threshold = n / 2;
        self
    }

    /// The delay between attempts.
    pub fn retry(mut self, retry: RetryStrategy) -> Self {
        self.app.retry = retry;
        self
    }

    /// How long a received message stays leased while its handler runs.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.app.lease = lease;
        self
    }

    /// Any other setting, on the configuration itself.
    pub fn configure(mut self, change: impl FnOnce(&mut AppConfig)) -> Self {
        change(&mut self.app);
        self
    }

    /// Where poison events and breaker changes go (default: logged only).
    pub fn alerts(mut self, alerts: Alerts) -> Self {
        self.alerts = alerts;
        self
    }

    /// A function named `name` consuming `queue`, its key from the
    /// payload's `idempotencyKey` field ([`Self::key`] to change it), run
    /// by `handler`, on the builder's storage.
    pub fn function(
        mut self,
        name: impl Into<String>,
        queue: impl Into<String>,
        handler: impl Handler + 'static,
    ) -> Self {
        let f = FunctionConfig::new(name, queue);
        self.functions.push((f, None, Arc::new(handler)));
        self
    }

    /// A function with its whole configuration, on `storage`.
    pub fn function_on(
        mut self,
        function: FunctionConfig,
        storage: Arc<dyn Storage>,
        handler: Arc<dyn Handler>,
    ) -> Self {
        self.functions.push((function, Some(storage), handler));
        self
    }

    /// The key rule of the function added last.
    pub fn key(mut self, key: KeySpec) -> Self {
        if let Some((f, _, _)) = self.functions.last_mut() {
            f.key = key;
        }
        self
    }

    /// Check the settings and build each function's runtime (nothing is
    /// touched in storage yet).
    pub fn build(self) -> Result<Worker, BuildError> {
        check_settings(&self.app)?;
        let mut app = self.app;
        let mut functions = Vec::new();
        for (mut f, storage, handler) in self.functions {
            if app.functions.iter().any(|g| g.name == f.name) {
                return Err(err(
                    &format!("functions.{}", f.name),
                    "two functions have this name",
                ));
            }
            if let Err(m) = crate::config::validate_function_name(&f.name) {
                return Err(err(&format!("functions.{}", f.name), &m.to_string()));
            }
            if let Err(m) = crate::config::validate_queue_name(&f.queue) {
                return Err(err(&format!("functions.{}.queue", f.name), &m.to_string()));
            }
            let Some(storage) = storage.or_else(|| self.storage.clone()) else {
                return Err(err(
                    &format!("functions.{}", f.name),
                    "no storage (use WorkerBuilder::new or function_on)",
                ));
            };
            if f.connection.setting == "embedded" {
                // Functions on different storages given in code must not
                // share a control read or a sweep: name the account by the
                // storage itself.
                f.connection.setting = format!("embedded@{:p}", Arc::as_ptr(&storage));
            }
            app.functions.push(f.clone());
            functions.push((f, storage, handler));
        }
        let app = Arc::new(app);
        let runtimes = functions
            .into_iter()
            .map(|(f, storage, handler)| {
                Arc::new(FunctionRuntime::new(
                    app.clone(),
                    f,
                    storage.as_ref(),
                    handler,
                    self.alerts.clone(),
                ))
            })
            .collect();
        Ok(Worker { app, runtimes })
    }
}

fn err(setting: &str, message: &str) -> BuildError {
    BuildError {
        setting: setting.to_string(),
        message: message.to_string(),
    }
}

/// The app-wide settings an embedding binary can set out of range.
fn check_settings(app: &AppConfig) -> Result<(), BuildError> {
    if !(1..=1000).contains(&app.max_dequeue_count) {
        return Err(err("maxDequeueCount", "must be between 1 and 1000"));
    }
    if !(1..=32).contains(&app.batch_size) {
        return Err(err("batchSize", "must be between 1 and 32"));
    }
    if app.lease < Duration::from_secs(1) || app.lease > crate::storage::MAX_VISIBILITY_TIMEOUT {
        return Err(err("lease", "must be between 1 second and 7 days"));
    }
    Ok(())
}

/// A built worker: run it until a shutdown token is cancelled.
pub struct Worker {
    app: Arc<AppConfig>,
    runtimes: Vec<Arc<FunctionRuntime>>,
}

impl Worker {
    /// The configuration it runs with.
    pub fn config(&self) -> &Arc<AppConfig> {
        &self.app
    }

    /// Each function's runtime (to process one message by hand, or to
    /// serve the ops endpoints).
    pub fn runtimes(&self) -> &[Arc<FunctionRuntime>] {
        &self.runtimes
    }

    /// Poll every function until `shutdown`, then drain in-flight jobs
    /// (within `shutdownTimeout`).
    pub async fn run(self, shutdown: CancellationToken) {
        self.run_reporting(Arc::new(Health::default()), shutdown)
            .await
    }

    /// [`Self::run`], reporting readiness and the last poll in `health`.
    pub async fn run_reporting(self, health: Arc<Health>, shutdown: CancellationToken) {
        crate::schedule::spawn(&self.app, &self.runtimes, &shutdown);
        run_runtimes(&self.app, &self.runtimes, health, shutdown).await
    }
}

/// A handler from an async closure over the [`Job`].
pub fn handler_fn<F, Fut>(f: F) -> FnHandler<F>
where
    F: Fn(Job) -> Fut + Send + Sync,
    Fut: Future<Output = Result<Success, HandlerError>> + Send,
{
    FnHandler(f)
}

/// The [`Handler`] of [`handler_fn`].
pub struct FnHandler<F>(F);

#[async_trait]
impl<F, Fut> Handler for FnHandler<F>
where
    F: Fn(Job) -> Fut + Send + Sync,
    Fut: Future<Output = Result<Success, HandlerError>> + Send,
{
    async fn handle(&self, job: &Job) -> Result<Success, HandlerError> {
        (self.0)(job.clone()).await
    }
}
