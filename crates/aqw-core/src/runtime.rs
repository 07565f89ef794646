//! One function's runtime: its queue, key and poison stores, handler,
//! policy and gate, built from the configuration over any [`Storage`]; and
//! the queues and tables every function needs, created before polling.

use crate::alert::Alerts;
use crate::config::{AppConfig, FunctionConfig};
use crate::control::ControlStore;
use crate::decide::Policy;
use crate::gate::Gate;
use crate::handler::Handler;
use crate::idempotency::KeyStore;
use crate::poison::PoisonSink;
use crate::storage::{QueueStore, Storage, StorageError};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// Everything [`crate::job::process`] needs for one function.
pub struct FunctionRuntime {
    /// The app's configuration.
    pub app: Arc<AppConfig>,
    /// The function's configuration.
    pub function: FunctionConfig,
    /// The source queue.
    pub source: Arc<dyn QueueStore>,
    /// The container of claim-check bodies (`aqw.claimCheck.container`).
    pub(crate) blobs: Arc<dyn crate::storage::BlobStore>,
    /// The function's idempotency keys.
    pub(crate) keys: KeyStore,
    /// Where its poisoned messages go.
    pub poison: PoisonSink,
    /// What runs each job.
    pub handler: Arc<dyn Handler>,
    /// Cap, retry delays, lease and timeout, decided once from config.
    pub(crate) policy: Policy,
    /// Where the poll loop says it polled (once a minute).
    pub(crate) heartbeats: crate::heartbeat::HeartbeatStore,
    /// Unique per process: lease owners are `<worker_id>/<message id>/<dequeue count>`.
    pub(crate) worker_id: String,
    /// The operator's pause and the circuit breaker, asked before receiving.
    pub gate: Arc<Gate>,
    /// The fleet-wide flow limits, when the function has any.
    pub(crate) flow: Option<Arc<crate::flow::Flow>>,
    /// The call rate learned from the provider's throttling
    /// (`aqw.adaptiveRate`): inactive until its first 429.
    pub(crate) adaptive: Arc<crate::flow::adaptive::AdaptiveRate>,
    /// Where the expiry guard's alert goes.
    pub(crate) alerts: Alerts,
    /// When this replica last raised the expiry alert for the function.
    pub(crate) expiry_alerted: std::sync::Mutex<Option<tokio::time::Instant>>,
}

impl FunctionRuntime {
    /// The runtime of `function` on `storage`, with a new worker id, its gate
    /// (pause and breaker) and its poison sink raising alerts through `alerts`.
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
            format: app.poison_format,
            alerts: alerts.clone(),
        };
        let worker_id = crate::entropy::uuid().simple().to_string()[..12].to_string();
        let control_table = storage.table(&app.control_table);
        let flow = crate::flow::Flow::new(
            &function.name,
            &worker_id,
            control_table.clone(),
            &function.limits,
        );
        let control = ControlStore::new(control_table);
        let adaptive = Arc::new(crate::flow::adaptive::AdaptiveRate::new(
            &function.name,
            app.adaptive_rate,
            function.limits.calls_per_second,
        ));
        let gate = Gate::new(
            &function.name,
            &worker_id,
            function.breaker,
            control,
            alerts.clone(),
        )
        .on_account(&function.connection.setting)
        .with_adaptive(adaptive.clone());
        Self {
            adaptive,
            policy: app.policy_for(&function),
            keys: KeyStore::new(storage.table(&app.keys_table)),
            heartbeats: crate::heartbeat::HeartbeatStore::new(storage.table(&app.heartbeat_table)),
            source,
            blobs: storage.blobs(&app.claim_check.container),
            poison,
            handler,
            worker_id,
            gate: Arc::new(gate),
            flow,
            alerts,
            expiry_alerted: std::sync::Mutex::new(None),
            function,
            app,
        }
    }
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
                    biased;
                    _ = tokio::time::sleep(delay) => {}
                    _ = shutdown.cancelled() => return false,
                }
                delay = (delay * 2).min(Duration::from_secs(10));
            }
        }
    }
}

/// The retention sweep's targets: one per storage account (connection
/// setting), with the functions whose keys and records live there.
pub(crate) fn sweep_targets(
    rts: &[Arc<FunctionRuntime>],
) -> Vec<crate::retention::sweep::SweepTarget> {
    let mut by_setting: HashMap<String, crate::retention::sweep::SweepTarget> = HashMap::new();
    for rt in rts {
        let t = by_setting
            .entry(rt.function.connection.setting.clone())
            .or_insert_with(|| crate::retention::sweep::SweepTarget {
                tables: crate::retention::AccountTables {
                    keys: rt.keys.clone(),
                    records: rt.poison.records.clone(),
                    functions: vec![],
                },
                records: vec![],
                blobs: Some(rt.blobs.clone()),
            });
        t.tables.functions.push(rt.function.name.clone());
        t.records.push(rt.poison.store());
    }
    let mut out: Vec<_> = by_setting.into_values().collect();
    out.sort_by(|a, b| a.tables.functions.cmp(&b.tables.functions));
    out
}
