//! Azure Functions custom handler mode (`aqw serve`).
//!
//! The Functions host receives, renews and deletes queue messages and POSTs
//! each invocation to `/{FunctionName}`. aqw runs the same [`process`] as
//! `aqw run`, with a [`Settle`] that only tells the host what to do:
//! success, duplicate or a completed poison copy → 200 (the host deletes the
//! message); a retryable failure below the cap → 500 (the host retries). At the
//! cap aqw writes its own poison envelope and record first, so the host never
//! makes its second, error-less copy.

use crate::config::AppConfig;
use crate::handlers::Registry;
use crate::message::encode;
use crate::storage::{ReceivedMessage, StorageResult};
use crate::telemetry::Alerts;
use crate::worker::{process, runtimes, FunctionRuntime, Outcome, Settle};
use async_trait::async_trait;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

#[derive(Clone)]
pub struct ServeState {
    pub functions: Arc<HashMap<String, Arc<FunctionRuntime>>>,
    pub hard_stop: CancellationToken,
}

impl ServeState {
    pub fn new(rts: Vec<Arc<FunctionRuntime>>) -> Self {
        Self {
            functions: Arc::new(
                rts.into_iter()
                    .map(|r| (r.function.name.clone(), r))
                    .collect(),
            ),
            hard_stop: CancellationToken::new(),
        }
    }
}

pub fn app(state: ServeState) -> Router {
    Router::new()
        .route("/{function}", post(invoke))
        .with_state(state)
}

/// The host settles the message; we only record what to answer.
#[derive(Default)]
struct HostSettle;

#[async_trait]
impl Settle for HostSettle {
    async fn renew(&self, _lease: Duration) -> StorageResult<()> {
        Ok(()) // the host renews its own lease
    }
    async fn delete(&self) -> StorageResult<()> {
        Ok(()) // the host deletes the message after a 2xx
    }
    async fn retry_after(&self, _after: Duration) -> StorageResult<()> {
        Ok(()) // the host makes it visible again after a non-2xx
    }
}

fn invocation_response(status: StatusCode, logs: Vec<String>, error: Option<String>) -> Response {
    let mut body = json!({"Outputs": {}, "Logs": logs, "ReturnValue": null});
    if let Some(e) = error {
        body["error"] = json!(e);
    }
    (status, Json(body)).into_response()
}

fn bad_request(status: StatusCode, message: String) -> Response {
    (status, Json(json!({"error": message}))).into_response()
}

fn metadata_u32(meta: &Value, key: &str) -> Option<u32> {
    match meta.get(key)? {
        Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

fn metadata_time(meta: &Value, key: &str) -> OffsetDateTime {
    meta.get(key)
        .and_then(Value::as_str)
        .and_then(|s| OffsetDateTime::parse(s, &Rfc3339).ok())
        .unwrap_or_else(OffsetDateTime::now_utc)
}

/// Turn one invocation body into the message aqw would have received.
pub fn parse_invocation(
    body: &[u8],
    binding: &str,
    rt: &FunctionRuntime,
) -> Result<ReceivedMessage, String> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| format!("invocation body is not JSON: {e}"))?;
    let data = v
        .get("Data")
        .and_then(Value::as_object)
        .ok_or("invocation has no Data object")?;
    let item = match data.get(binding) {
        Some(item) => item,
        // One trigger binding: accept it under whatever name the host used.
        None if data.len() == 1 => data.values().next().expect("one entry"),
        None => {
            return Err(format!(
                "Data has no \"{binding}\" entry (the queueTrigger binding name)"
            ))
        }
    };
    // The host passes the decoded message: as a JSON string, or already parsed
    // when the message was JSON. Either way, recover the payload text.
    let payload = match item {
        Value::String(s) => s.clone(),
        Value::Null => return Err(format!("Data.{binding} is null")),
        other => other.to_string(),
    };
    let meta = v.get("Metadata").ok_or("invocation has no Metadata")?;
    let dequeue_count = metadata_u32(meta, "DequeueCount")
        .ok_or("Metadata.DequeueCount is missing or not a number")?;
    let id = meta
        .get("Id")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or("Metadata.Id is missing")?
        .to_string();
    Ok(ReceivedMessage {
        id,
        pop_receipt: meta
            .get("PopReceipt")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        dequeue_count,
        insertion_time: metadata_time(meta, "InsertionTime"),
        expiration_time: metadata_time(meta, "ExpirationTime"),
        next_visible: metadata_time(meta, "NextVisibleTime"),
        // Re-encoded per messageEncoding, so a poison record replays byte-exact.
        text: encode(&payload, rt.app.message_encoding),
    })
}

async fn invoke(
    State(state): State<ServeState>,
    Path(function): Path<String>,
    body: Bytes,
) -> Response {
    let Some(rt) = state.functions.get(&function).cloned() else {
        let known: Vec<&String> = state.functions.keys().collect();
        return bad_request(
            StatusCode::NOT_FOUND,
            format!("unknown function \"{function}\" (known: {known:?})"),
        );
    };
    let msg = match parse_invocation(&body, &rt.function.binding_name, &rt) {
        Ok(m) => m,
        Err(e) => return bad_request(StatusCode::BAD_REQUEST, e),
    };
    let span = tracing::info_span!("job", function = %function, message_id = %msg.id, dequeue_count = msg.dequeue_count, key = tracing::field::Empty);
    let outcome = process(&rt, &msg, &HostSettle, &state.hard_stop)
        .instrument(span)
        .await;
    metrics::counter!("aqw_messages_total", "function" => function.clone(), "outcome" => outcome.label()).increment(1);
    let log = format!(
        "aqw: {} message {} (dequeue count {})",
        outcome.label(),
        msg.id,
        msg.dequeue_count
    );
    match outcome {
        Outcome::Completed | Outcome::Duplicate | Outcome::Poisoned { .. } => {
            invocation_response(StatusCode::OK, vec![log], None)
        }
        Outcome::Retried { .. } | Outcome::Deferred { .. } | Outcome::Released => {
            invocation_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                vec![log.clone()],
                Some(log),
            )
        }
        Outcome::Abandoned { error } => {
            invocation_response(StatusCode::SERVICE_UNAVAILABLE, vec![log], Some(error))
        }
    }
}

/// The port from `FUNCTIONS_CUSTOMHANDLER_PORT`.
pub fn port_from_env(value: Option<String>) -> Result<u16, String> {
    let v = value.ok_or("FUNCTIONS_CUSTOMHANDLER_PORT is not set (the Functions host sets it; set it by hand to run locally)")?;
    v.trim()
        .parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| {
            format!("FUNCTIONS_CUSTOMHANDLER_PORT=\"{v}\" is not a port number (1-65535)")
        })
}

/// `aqw serve`: answer invocations until `shutdown`.
pub async fn serve(
    app: Arc<AppConfig>,
    registry: Registry,
    port: u16,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let alerts = Alerts::start(app.alert_webhook.clone(), app.alert_window);
    let rts = runtimes(&app, &registry, &alerts)?;
    // Bind first: the host waits (60 s) for the port to open.
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on 127.0.0.1:{port}: {e}"))?;
    if !crate::worker::ensure_resources(&rts, &shutdown).await {
        return Ok(());
    }
    let state = ServeState::new(rts);
    let hard_stop = state.hard_stop.clone();
    tracing::info!(
        event = "aqw.serve.started",
        port,
        "custom handler listening"
    );
    let stop = shutdown.clone();
    let grace = app.shutdown_timeout;
    axum::serve(listener, self::app(state))
        .with_graceful_shutdown(async move {
            stop.cancelled().await;
            // In-flight invocations get shutdownTimeout, then are released.
            tokio::spawn(async move {
                tokio::time::sleep(grace).await;
                hard_stop.cancel();
            });
        })
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_parsing() {
        assert!(port_from_env(None).unwrap_err().contains("not set"));
        assert!(port_from_env(Some("abc".into()))
            .unwrap_err()
            .contains("not a port"));
        assert!(port_from_env(Some("0".into())).is_err());
        assert_eq!(port_from_env(Some("7071".into())).unwrap(), 7071);
    }
}
