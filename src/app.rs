//! Wiring one app: a runtime per function (handler resolved, storage
//! connected once per connection setting), and the queues and tables they
//! need. `aqw run` ([`crate::worker::run`]) and `aqw serve`
//! ([`crate::serve::serve`]) both start from here.

use crate::handlers::Registry;
use aqw_core::alert::Alerts;
use aqw_core::config::AppConfig;
use aqw_core::runtime::FunctionRuntime;
use aqw_core::storage::{Storage, StorageError};
use std::collections::HashMap;
use std::sync::Arc;

/// Connect to the storage account of `connection`: the one place every
/// command, the worker and the custom handler open storage, through the
/// adapter's seam ([`aqw_azure::open`]): the engine's port, not the Azure
/// type.
pub fn connect(
    connection: &aqw_core::config::StorageAccount,
) -> Result<Arc<dyn Storage>, StorageError> {
    aqw_azure::open(connection)
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
pub fn open_storage(app: &AppConfig) -> Result<HashMap<String, Arc<dyn Storage>>, StorageError> {
    let mut out = HashMap::new();
    for f in &app.functions {
        if !out.contains_key(&f.connection.setting) {
            out.insert(f.connection.setting.clone(), connect(&f.connection)?);
        }
    }
    Ok(out)
}

/// Build the worker of every function, on the same builder an embedding
/// binary uses (handlers resolved, storage connected once per setting,
/// nothing touched yet).
pub fn worker(
    app: &Arc<AppConfig>,
    registry: &Registry,
    alerts: &Alerts,
) -> anyhow::Result<aqw_core::builder::Worker> {
    let stores = open_storage(app).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut builder =
        aqw_core::builder::WorkerBuilder::from_config((**app).clone()).alerts(alerts.clone());
    for f in &app.functions {
        let handler = registry
            .resolve(&f.name, &f.handler, &app.app_dir)
            .map_err(|e| anyhow::anyhow!("host.json: {e}"))?;
        let storage = stores[&f.connection.setting].clone();
        builder = builder.function_on(f.clone(), storage, handler);
    }
    builder
        .build()
        .map_err(|e| anyhow::anyhow!("host.json: {e}"))
}

/// The runtime of every function (see [`worker`]).
pub fn runtimes(
    app: &Arc<AppConfig>,
    registry: &Registry,
    alerts: &Alerts,
) -> anyhow::Result<Vec<Arc<FunctionRuntime>>> {
    Ok(worker(app, registry, alerts)?.runtimes().to_vec())
}
