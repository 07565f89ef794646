//! Pause and resume from the dashboard: the status page's "receiving"
//! column (paused by whom, when and why; a breaker that is not closed) and
//! its two actions, under the same authentication and CSRF rules as replay,
//! through the same `aqw_core::ops` procedures as `aqw pause` / `aqw resume`.

use super::error::{DashboardError, Path};
use super::forms::{CsrfForm, PauseForm};
use super::request::{see_other, Act, Answer, S};
use super::Dashboard;
use aqw_core::config::FunctionConfig;
use aqw_core::ops::QueueOps;
use axum::extract::State;

impl Dashboard {
    /// The queue's ops and the function that consumes it (404 without one).
    fn consumed(&self, queue: &str) -> Result<(&QueueOps, &FunctionConfig), DashboardError> {
        let ops = self.queue_ops(queue)?;
        let f = ops.function.as_ref().ok_or_else(|| {
            DashboardError::not_found("404 Not Found", "No function consumes that queue.")
        })?;
        Ok((ops, f))
    }
}

pub async fn pause(
    State(d): S,
    Path(queue): Path<String>,
    Act { p, form, .. }: Act<PauseForm>,
) -> Answer {
    let (ops, f) = d.consumed(&queue)?;
    let reason = form.reason.or_empty().trim();
    aqw_core::ops::pause(&ops.control, &f.name, &p.name, reason).await?;
    tracing::info!(event = "aqw.dashboard.pause", function = %f.name, by = %p.name, "paused from the dashboard");
    Ok(see_other("/"))
}

pub async fn resume(
    State(d): S,
    Path(queue): Path<String>,
    Act { p, .. }: Act<CsrfForm>,
) -> Answer {
    let (ops, f) = d.consumed(&queue)?;
    aqw_core::ops::resume(&ops.control, &f.name, &p.name).await?;
    tracing::info!(event = "aqw.dashboard.resume", function = %f.name, by = %p.name, "resumed from the dashboard");
    Ok(see_other("/"))
}
