//! The worker's operations endpoints: `/healthz`, `/readyz`, `/metrics`.

use crate::telemetry::gauges;
use aqw_core::runtime::FunctionRuntime;
use aqw_core::storage::{StorageError, StorageResult};
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use aqw_core::worker::Health;

#[derive(Clone)]
pub struct OpsState {
    pub health: Arc<Health>,
    /// A poll heartbeat older than this is unhealthy.
    pub stale_after: Duration,
}

pub fn app(state: OpsState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(state)
}

async fn healthz(State(s): State<OpsState>) -> (StatusCode, &'static str) {
    let last = s.health.last_poll_ms.load(Ordering::Relaxed);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64;
    // Before the first poll the process is starting: alive.
    if last == 0 || now.saturating_sub(last) <= s.stale_after.as_millis() as u64 {
        (StatusCode::OK, "ok\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "poll loop stalled\n")
    }
}

async fn readyz(State(s): State<OpsState>) -> (StatusCode, &'static str) {
    if s.health.draining.load(Ordering::Relaxed) {
        (StatusCode::SERVICE_UNAVAILABLE, "draining\n")
    } else if s.health.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "storage unreachable\n")
    }
}

async fn metrics_text() -> String {
    crate::telemetry::render_metrics()
}

/// Bind the ops server and start it plus the queue-depth sampler.
pub async fn serve_ops(
    port: u16,
    health: Arc<Health>,
    rts: Vec<Arc<FunctionRuntime>>,
    shutdown: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    crate::telemetry::metrics_handle();
    let stale_after = rts
        .first()
        .map(|r| r.app.max_polling_interval * 3 + Duration::from_secs(60))
        .unwrap_or(Duration::from_secs(240));
    let listener = tokio::net::TcpListener::bind(("0.0.0.0", port))
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on port {port} (aqw.http.port): {e}"))?;
    let router = app(OpsState {
        health,
        stale_after,
    });
    let sampler_stop = shutdown.clone();
    tokio::spawn(async move {
        // Sampled, not counted per message: a few calls per queue per interval.
        let every = rts
            .first()
            .map(|r| r.app.metrics_interval)
            .unwrap_or(Duration::from_secs(60));
        let mut tick = tokio::time::interval(every);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = sampler_stop.cancelled() => return,
            }
            for rt in &rts {
                sample_queue(rt).await;
            }
        }
    });
    Ok(tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    }))
}

/// Refresh one function's health gauges: the source and poison queue
/// depths, the age of the oldest visible message, and its open poison
/// records by error group. A failed call leaves that gauge as it was.
async fn sample_queue(rt: &FunctionRuntime) {
    let queue = rt.function.queue.clone();
    // A queue that does not exist yet (the poison queue is created by the
    // first poisoning) holds nothing: 0, so the gauge is there from the start.
    let depth = |r: StorageResult<u64>| match r {
        Ok(n) => Some(n as f64),
        Err(StorageError::NotFound) => Some(0.0),
        Err(_) => None,
    };
    if let Some(n) = depth(rt.source.approximate_count().await) {
        metrics::gauge!("aqw_queue_depth", "queue" => queue.clone()).set(n);
    }
    if let Some(n) = depth(rt.poison.poison_queue.approximate_count().await) {
        metrics::gauge!("aqw_poison_depth", "queue" => queue.clone()).set(n);
    }
    // A retried message becomes visible again behind newer ones, so the
    // front of the queue is not always its oldest: look at the most one
    // peek returns (32).
    if let Ok(peeked) = rt.source.peek(32).await {
        let age = gauges::oldest_age_seconds(
            time::OffsetDateTime::now_utc(),
            peeked.iter().map(|m| m.insertion_time),
        );
        metrics::gauge!("aqw_queue_oldest_age_seconds", "queue" => queue.clone()).set(age);
    }
    if let Ok(errors) = rt.poison.store().open_errors().await {
        let groups =
            gauges::open_groups(errors.iter().map(|e| (e.kind.as_str(), e.message.as_str())));
        gauges::set_open_groups(&queue, groups);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    fn state() -> OpsState {
        OpsState {
            health: Arc::new(Health::default()),
            stale_after: Duration::from_secs(60),
        }
    }

    async fn status(s: &OpsState, path: &str) -> StatusCode {
        app(s.clone())
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap()
            .status()
    }

    #[tokio::test]
    async fn readiness_follows_state() {
        let s = state();
        assert_eq!(status(&s, "/readyz").await, StatusCode::SERVICE_UNAVAILABLE);
        s.health.ready.store(true, Ordering::Relaxed);
        assert_eq!(status(&s, "/readyz").await, StatusCode::OK);
        s.health.draining.store(true, Ordering::Relaxed);
        assert_eq!(status(&s, "/readyz").await, StatusCode::SERVICE_UNAVAILABLE);
    }

    #[tokio::test]
    async fn liveness_follows_the_heartbeat() {
        let s = state();
        assert_eq!(status(&s, "/healthz").await, StatusCode::OK);
        s.health.beat();
        assert_eq!(status(&s, "/healthz").await, StatusCode::OK);
        s.health.last_poll_ms.store(1, Ordering::Relaxed);
        assert_eq!(
            status(&s, "/healthz").await,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }

    #[tokio::test]
    async fn metrics_render() {
        metrics::counter!("aqw_messages_total", "function" => "T", "outcome" => "completed")
            .increment(1);
        let s = state();
        assert_eq!(status(&s, "/metrics").await, StatusCode::OK);
    }
}
