//! `aqw run`: the engine's poll loops (`aqw_core::worker`) wired to this
//! binary's parts: storage connected per connection setting, handlers
//! resolved (built-in `http` and `exec`, or registered in code), the alert
//! webhook, and the ops HTTP port.

use crate::config::AppConfig;
use crate::handlers::Registry;
pub use aqw_core::worker::*;
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
    worker.run_reporting(health, shutdown).await;
    if let Some(s) = server {
        s.abort();
    }
    Ok(())
}
