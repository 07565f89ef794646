//! Wiring one app: a runtime per function (handler resolved, storage
//! connected once per connection setting), and the queues and tables they
//! need. `aqw run` ([`crate::worker::run`]) and `aqw serve`
//! ([`crate::serve::serve`]) both start from here.

use crate::config::{AppConfig, FunctionConfig};
use crate::control::ControlStore;
use crate::decide::Policy;
use crate::gate::Gate;
use crate::handlers::{Handler, Registry};
use crate::idempotency::KeyStore;
use crate::poison::PoisonSink;
use crate::storage::{QueueStore, Storage, StorageError};
use crate::telemetry::Alerts;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// Everything [`crate::job::process`] needs for one function.
pub struct FunctionRuntime {
    pub app: Arc<AppConfig>,
    pub function: FunctionConfig,
    pub source: Arc<dyn QueueStore>,
    pub keys: KeyStore,
    pub poison: PoisonSink,
    pub handler: Arc<dyn Handler>,
    /// Cap, retry delays, lease and timeout, decided once from config.
    pub policy: Policy,
    /// Where the poll loop says it polled (once a minute).
    pub heartbeats: crate::heartbeat::HeartbeatStore,
    /// Unique per process: lease owners are `<worker_id>/<message id>/<dequeue count>`.
    pub worker_id: String,
    /// The operator's pause and the circuit breaker, asked before receiving.
    pub gate: Arc<Gate>,
}

impl FunctionRuntime {
    pub fn new(
        app: Arc<AppConfig>,
        function: FunctionConfig,
        storage: &dyn Storage,
        handler: Arc<dyn Handler>,
        alerts: Alerts,
    ) -> Self {
        let source = storage.queue(&function.queue);
        let poison = PoisonSink {
            source_queue: function.queue.clone(),
            function: function.name.clone(),
            poison_queue: storage.queue(&function.poison_queue()),
            records: storage.table(&app.poison_table),
            encoding: app.message_encoding,
            ttl: app.poison_ttl,
            alerts: alerts.clone(),
        };
        let worker_id = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
        let control = ControlStore::new(storage.table(&app.control_table));
        let gate = Gate::new(
            &function.name,
            &worker_id,
            function.breaker,
            control,
            alerts,
        );
        Self {
            policy: Policy::from_config(&app),
            keys: KeyStore::new(storage.table(&app.keys_table)),
            heartbeats: crate::heartbeat::HeartbeatStore::new(storage.table(&app.heartbeat_table)),
            source,
            poison,
            handler,
            worker_id,
            gate: Arc::new(gate),
            function,
            app,
        }
    }
}

/// Connect to the storage account of `connection`: the one place every
/// command, the worker and the custom handler open storage.
pub fn connect(
    connection: &crate::config::Connection,
) -> Result<crate::storage::AzureStorage, StorageError> {
    crate::storage::connect(connection)
}

/// Check, before any I/O, that every function has a handler and a usable
/// connection (configuration errors: exit 2).
pub fn preflight(app: &AppConfig, registry: &Registry) -> Result<(), String> {
    for f in &app.functions {
        registry
            .resolve(&f.name, &f.handler, &app.app_dir)
            .map_err(|e| format!("{}: {e}", app.app_dir.join("host.json").display()))?;
        connect(&f.connection).map_err(|e| format!("environment: {e}"))?;
    }
    Ok(())
}

/// Open storage for every function (one client set per connection setting).
pub fn open_storage(
    app: &AppConfig,
) -> Result<HashMap<String, Arc<crate::storage::AzureStorage>>, StorageError> {
    let mut out = HashMap::new();
    for f in &app.functions {
        if !out.contains_key(&f.connection.setting) {
            out.insert(
                f.connection.setting.clone(),
                Arc::new(connect(&f.connection)?),
            );
        }
    }
    Ok(out)
}

/// Build the runtime of every function (handlers resolved, nothing touched yet).
pub fn runtimes(
    app: &Arc<AppConfig>,
    registry: &Registry,
    alerts: &Alerts,
) -> anyhow::Result<Vec<Arc<FunctionRuntime>>> {
    let stores = open_storage(app).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut out = Vec::new();
    for f in &app.functions {
        let handler = registry
            .resolve(&f.name, &f.handler, &app.app_dir)
            .map_err(|e| anyhow::anyhow!("host.json: {e}"))?;
        let storage = stores[&f.connection.setting].clone();
        out.push(Arc::new(FunctionRuntime::new(
            app.clone(),
            f.clone(),
            storage.as_ref(),
            handler,
            alerts.clone(),
        )));
    }
    Ok(out)
}

/// Create the tables and queues every function needs, retrying until storage answers
/// or `shutdown`.
pub async fn ensure_resources(rts: &[Arc<FunctionRuntime>], shutdown: &CancellationToken) -> bool {
    let mut delay = Duration::from_millis(200);
    loop {
        let mut result = Ok(());
        for rt in rts {
            for r in [
                rt.keys.table().create_if_missing().await,
                rt.poison.records.create_if_missing().await,
                rt.heartbeats.table().create_if_missing().await,
                rt.source.create_if_missing().await,
            ] {
                match r {
                    // Least-privilege identities may not create queues or
                    // tables (403): assume they were created by the operator.
                    Err(StorageError::Http { status: 403, .. }) => {
                        warn!("no permission to create a queue or table; assuming it exists")
                    }
                    Err(e) => result = Err(e),
                    Ok(()) => {}
                }
            }
        }
        match result {
            Ok(()) => return true,
            Err(e) => {
                warn!(event = "aqw.storage.unavailable", error = %e, retry_in_ms = delay.as_millis() as u64, "cannot reach storage at startup; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = shutdown.cancelled() => return false,
                }
                delay = (delay * 2).min(Duration::from_secs(10));
            }
        }
    }
}
