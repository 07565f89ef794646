//! `aqw run`: the engine's poll loops (`aqw_core::worker`) wired to this
//! binary's parts: storage connected per connection setting, handlers
//! resolved (built-in `http` and `exec`, or registered in code), the alert
//! webhook, and the ops HTTP port.

use crate::handlers::Registry;
use aqw_core::config::AppConfig;
use aqw_core::worker::*;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// `aqw run`: poll every function until `shutdown`, then drain.
pub async fn run(
    app: Arc<AppConfig>,
    registry: Registry,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let alerts = crate::telemetry::alerts::start(app.alert_target(), app.alert_window);
    let worker = crate::app::worker(&app, &registry, &alerts)?;
    let rts = worker.runtimes().to_vec();
    for s in &app.skipped {
        warn!(event = "aqw.function.skipped", function = %s.name, reason = %s.reason, "function not run");
    }
    for note in crate::config::queues::run_notes(&app) {
        warn!(event = "aqw.config.not_applied", "{note}");
    }
    let health = Arc::new(Health::default());
    let server = match app.http_port {
        Some(port) => {
            Some(crate::http::serve_ops(port, health.clone(), rts.clone(), shutdown.clone()).await?)
        }
        None => None,
    };
    let watchers = watch_operations(&app, &alerts, &shutdown);
    worker.run_reporting(health, shutdown).await;
    for w in watchers {
        w.abort();
    }
    if let Some(s) = server {
        s.abort();
    }
    Ok(())
}

/// One watcher of durable operations per storage account the functions
/// use (issue 40): an operation whose executor died is resumed here (or
/// halted and alerted, when its executors keep dying).
fn watch_operations(
    app: &Arc<AppConfig>,
    alerts: &aqw_core::alert::Alerts,
    shutdown: &CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut seen: Vec<&aqw_core::config::StorageAccount> = vec![];
    let mut tasks = vec![];
    for f in &app.functions {
        if seen.contains(&&f.connection) {
            continue;
        }
        seen.push(&f.connection);
        let Ok(storage) = crate::app::connect(&f.connection) else {
            continue;
        };
        let owner = format!("run-{}-{}", std::process::id(), tasks.len());
        let opts = aqw_core::ops::operation::ExecuteOptions {
            alerts: alerts.clone(),
            ..aqw_core::ops::operation::ExecuteOptions::new(owner)
        };
        let watch = aqw_core::ops::operation::watch(app.clone(), storage, opts, shutdown.clone());
        tasks.push(tokio::spawn(watch));
    }
    tasks
}
