//! Azure Functions custom handler mode (`aqw serve`).
//!
//! The Functions host receives, renews and deletes queue messages and POSTs
//! each invocation to `/{FunctionName}`. aqw runs the same [`process`] as
//! `aqw run`, with a [`Settle`] that only tells the host what to do:
//! success, duplicate or a completed poison copy → 200 (the host deletes the
//! message). The host's answer to a non-2xx is fixed: below its
//! `maxDequeueCount` it makes the message visible again after its one
//! `visibilityTimeout` (default 0), at it it poisons the message without an
//! error (`QueueProcessor.CompleteProcessingMessageAsync`). So a keyed job's
//! retryable failure below the cap is a fresh copy visible after aqw's own
//! retry delay (exponential with jitter, `Retry-After` honoured) and a 200;
//! the key counts the attempts the copies spent
//! (`aqw_core::job::process`, `carried_attempts`), and at the cap aqw writes
//! its own poison envelope and record first. A keyless job has no key to
//! count on: its failure below the cap is a 500, and the host's fixed retry
//! and DequeueCount apply. docs/operations.md ("Attempts, backoff and
//! maintenance under `aqw serve`") cites the host's lines.
//!
//! # What the host really sends
//!
//! Read from Azure/azure-functions-host, not from the docs' example:
//! `src/WebJobs.Script/Workers/MessageExtensions/ScriptInvocationContextExtensions.cs`,
//! `ToHttpScriptInvocationContext` fills `Data[binding]` from the trigger
//! input and `Metadata[name]` from the binding data (keys ending in
//! "trigger" dropped), each through `GetHttpScriptInvocationContextValue`:
//! `byte[]` → base64, `DateTime(Offset)` → a date, what `JObject.FromObject`
//! accepts → an object, anything else → `JsonConvert.SerializeObject(value)`.
//! The host's test `GetHttpScriptInvocationContextValueTest_String` expects
//! `"stringTest"` → `"\"stringTest\""`. So for a queue trigger:
//!
//! - `Data.<binding>` is the JSON string literal of the message text, as a
//!   JSON string (encoded twice); with function.json `"dataType": "binary"`
//!   it is the base64 of the message bytes (`WorkerFunctionInvoker` passes
//!   `byte[]`);
//! - `Metadata.Id` and `Metadata.PopReceipt` are encoded twice the same way,
//!   `Metadata.DequeueCount` is the string `"5"` (a `long` serialized), the
//!   three times are plain ISO 8601 strings;
//! - for a string trigger whose message is a JSON object, the host merges the
//!   payload's top-level properties into the binding data, **over** the
//!   built-in ones and ignoring case (`Utility.ApplyBindingData` in
//!   `WorkerFunctionInvoker.TransformInput`; the binder's dictionary is
//!   `StringComparer.OrdinalIgnoreCase`). A payload field `id` therefore
//!   replaces `Metadata.Id`. aqw detects that shadowing and does not trust
//!   such a field (see [`parse_invocation`]); `"dataType": "binary"` avoids
//!   the merge altogether.
//!
//! The docs' cleaned-up shape (`DequeueCount` a number, text unquoted) is
//! accepted too: a number `DequeueCount` marks it.
//!
//! The host reads only `Outputs`, `Logs` and `ReturnValue` of a 2xx answer
//! and throws on a non-2xx before reading the body
//! (`DefaultHttpWorkerService.ProcessDefaultInvocationRequest`), so the error
//! of a failed attempt is written to aqw's own log, not only to `Logs`.

use crate::app::runtimes;
use crate::handlers::Registry;
use aqw_core::config::{AppConfig, FunctionConfig, MessageEncoding};
use aqw_core::job::{process, producer_context, record_outcome, Outcome, Settle};
use aqw_core::message::encode;
use aqw_core::runtime::{ensure_resources, FunctionRuntime};
use aqw_core::storage::{ReceivedMessage, StorageResult};
use aqw_core::worker::Health;
use async_trait::async_trait;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use base64::Engine;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use tracing::{warn, Instrument};

/// The header the host puts its invocation id in (`HttpWorkerConstants`).
pub const INVOCATION_ID_HEADER: &str = "x-azure-functions-invocationid";

#[derive(Clone)]
pub struct ServeState {
    pub functions: Arc<HashMap<String, Arc<FunctionRuntime>>>,
    /// Function folders aqw does not serve, with the reason (answered 404).
    pub skipped: Arc<HashMap<String, String>>,
    pub hard_stop: CancellationToken,
}

impl ServeState {
    pub fn new(rts: Vec<Arc<FunctionRuntime>>) -> Self {
        let skipped = rts
            .first()
            .map(|r| {
                r.app
                    .skipped
                    .iter()
                    .map(|s| (s.name.clone(), s.reason.clone()))
                    .collect()
            })
            .unwrap_or_default();
        Self {
            functions: Arc::new(
                rts.into_iter()
                    .map(|r| (r.function.name.clone(), r))
                    .collect(),
            ),
            skipped: Arc::new(skipped),
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
    fn poisons_failed_last_attempt(&self) -> bool {
        true
    }
    fn delivers_while_paused(&self) -> bool {
        true
    }
    fn parks_retries(&self) -> bool {
        true
    }
}

/// The body the host reads: only `Outputs`, `Logs` and `ReturnValue` exist
/// in its `HttpScriptInvocationResult`.
fn invocation_response(status: StatusCode, logs: Vec<String>) -> Response {
    (
        status,
        Json(json!({"Outputs": {}, "Logs": logs, "ReturnValue": null})),
    )
        .into_response()
}

/// A request aqw cannot read: 4xx with the field named. The message is not
/// poisoned by aqw; the host retries it and poisons it at its own cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvocationError {
    pub status: StatusCode,
    pub field: String,
    pub message: String,
}

impl InvocationError {
    fn bad(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            field: field.into(),
            message: message.into(),
        }
    }

    fn into_response(self) -> Response {
        (
            self.status,
            Json(
                json!({"error": format!("{}: {}", self.field, self.message), "field": self.field}),
            ),
        )
            .into_response()
    }
}

/// How the invocation was serialized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// What the Functions host sends: strings encoded twice, numbers as strings.
    Host,
    /// The docs' example: plain strings, `DequeueCount` a number.
    Docs,
}

/// One invocation turned into the message aqw would have received.
#[derive(Debug, Clone)]
pub struct Invocation {
    pub message: ReceivedMessage,
    /// The payload decoded once: the job reads it; the text is for copies.
    pub payload: aqw_core::message::Payload,
    pub shape: Shape,
    /// Metadata fields the payload's own top-level properties replaced (the
    /// host's binding-data merge); aqw did not use their values.
    pub shadowed: Vec<&'static str>,
}

/// A host-encoded string: the JSON string literal inside a JSON string.
fn unquote_host(s: &str) -> Option<String> {
    if s.starts_with('"') {
        serde_json::from_str::<String>(s).ok()
    } else {
        None
    }
}

/// Turn one invocation body into the message aqw would have received.
///
/// The message text is recovered byte-exact (re-encoded per
/// `messageEncoding`, so a poison record written here replays through
/// `aqw run` unchanged), except when the host hands over a JSON object,
/// which only the docs' example does: that is re-serialized compactly.
pub fn parse_invocation(
    body: &[u8],
    function: &FunctionConfig,
    encoding: MessageEncoding,
) -> Result<Invocation, InvocationError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| InvocationError::bad("(body)", format!("invocation body is not JSON: {e}")))?;
    let (data_field, item) = data_item(&v, &function.binding_name)?;
    let meta = match v.get("Metadata") {
        Some(Value::Object(m)) => m,
        Some(_) => return Err(InvocationError::bad("Metadata", "must be an object")),
        None => return Err(InvocationError::bad("Metadata", "missing")),
    };
    let shape = match meta.get("DequeueCount") {
        Some(Value::Number(_)) => Shape::Docs,
        _ => Shape::Host,
    };
    let (text, payload) = if function.binary_data {
        // No binding-data merge happens for a binary trigger.
        (binary_text(item, &data_field, encoding)?, None)
    } else {
        let payload = string_payload(item, &data_field, shape)?;
        (encode(&payload, encoding), Some(payload))
    };
    let meta = Metadata {
        meta,
        shape,
        payload_fields: payload_fields(payload.as_deref()),
    };
    let shadowed = meta.shadowed();
    let decoded = payload.map_or_else(
        || aqw_core::message::Payload::decode(&text, encoding),
        aqw_core::message::Payload::decoded,
    );
    let insertion = meta.time("InsertionTime")?;
    let id = meta.id()?.unwrap_or_else(|| derived_id(insertion, &text));
    let now = OffsetDateTime::now_utc();
    Ok(Invocation {
        message: ReceivedMessage {
            id,
            pop_receipt: meta.string("PopReceipt")?.unwrap_or_default(),
            dequeue_count: meta.dequeue_count()?,
            insertion_time: insertion.unwrap_or(now),
            expiration_time: meta.time("ExpirationTime")?.unwrap_or(now),
            next_visible: meta.time("NextVisibleTime")?.unwrap_or(now),
            text,
        },
        payload: decoded,
        shape,
        shadowed,
    })
}

/// `Data.<binding>` (or the one entry of `Data`, whatever the host named it),
/// with the field name errors should give.
fn data_item<'a>(v: &'a Value, binding: &str) -> Result<(String, &'a Value), InvocationError> {
    let data = match v.get("Data") {
        Some(Value::Object(d)) => d,
        Some(_) => return Err(InvocationError::bad("Data", "must be an object")),
        None => {
            return Err(InvocationError::bad(
                "Data",
                "missing (invocation has no Data object)",
            ))
        }
    };
    match data.get_key_value(binding) {
        Some((name, item)) => Ok((format!("Data.{name}"), item)),
        // One trigger binding: accept it under whatever name the host used.
        None if data.len() == 1 => {
            let (name, item) = data.iter().next().expect("one entry");
            Ok((format!("Data.{name}"), item))
        }
        None => Err(InvocationError::bad(
            format!("Data.{binding}"),
            "missing (the queueTrigger binding name in function.json)",
        )),
    }
}

/// `dataType: binary`: base64 of the message bytes → the queue text.
fn binary_text(
    item: &Value,
    field: &str,
    encoding: MessageEncoding,
) -> Result<String, InvocationError> {
    let Value::String(b64) = item else {
        return Err(InvocationError::bad(
            field,
            "must be a base64 string (function.json dataType is binary)",
        ));
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| {
            InvocationError::bad(
                field,
                format!("is not base64 ({e}), but dataType is binary"),
            )
        })?;
    match encoding {
        MessageEncoding::Base64 => Ok(base64::engine::general_purpose::STANDARD.encode(&bytes)),
        MessageEncoding::None => String::from_utf8(bytes).map_err(|_| {
            InvocationError::bad(
                field,
                "is not UTF-8, which a messageEncoding none queue cannot hold",
            )
        }),
    }
}

/// A string trigger: the message text, unquoted once more in the host's shape.
fn string_payload(item: &Value, field: &str, shape: Shape) -> Result<String, InvocationError> {
    match (item, shape) {
        (Value::String(s), Shape::Host) => unquote_host(s).ok_or_else(|| {
            InvocationError::bad(
                field,
                "expected the JSON string literal of the message text, as the Functions \
                 host encodes it (a string that itself starts with a quote)",
            )
        }),
        (Value::String(s), Shape::Docs) => Ok(s.clone()),
        (Value::Null, _) => Err(InvocationError::bad(field, "is null")),
        (other, _) => Ok(other.to_string()),
    }
}

/// The payload's top-level property names (lowercased) that the host merges
/// into the binding data: objects only, null and array values skipped.
fn payload_fields(payload: Option<&str>) -> Vec<String> {
    payload
        .and_then(|p| serde_json::from_str::<Map<String, Value>>(p).ok())
        .map(|m| {
            m.into_iter()
                .filter(|(_, v)| !v.is_null() && !v.is_array())
                .map(|(k, _)| k.to_ascii_lowercase())
                .collect()
        })
        .unwrap_or_default()
}

/// The queue metadata aqw reads.
const METADATA: [&str; 6] = [
    "DequeueCount",
    "Id",
    "PopReceipt",
    "InsertionTime",
    "ExpirationTime",
    "NextVisibleTime",
];

/// `Metadata`, read knowing which fields the payload shadowed.
struct Metadata<'a> {
    meta: &'a Map<String, Value>,
    shape: Shape,
    payload_fields: Vec<String>,
}

impl Metadata<'_> {
    fn is_shadowed(&self, name: &str) -> bool {
        let lower = name.to_ascii_lowercase();
        self.payload_fields.contains(&lower)
    }

    fn shadowed(&self) -> Vec<&'static str> {
        METADATA
            .into_iter()
            .filter(|n| self.is_shadowed(n))
            .collect()
    }

    /// The value, unless the payload replaced it.
    fn trusted(&self, name: &str) -> Option<&Value> {
        if self.is_shadowed(name) {
            None
        } else {
            self.meta.get(name)
        }
    }

    fn string(&self, name: &str) -> Result<Option<String>, InvocationError> {
        match self.trusted(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(match self.shape {
                // Lenient: an id never starts with a quote of its own.
                Shape::Host => unquote_host(s).unwrap_or_else(|| s.clone()),
                Shape::Docs => s.clone(),
            })),
            Some(other) => Err(InvocationError::bad(
                format!("Metadata.{name}"),
                format!("must be a string, not {other}"),
            )),
        }
    }

    fn time(&self, name: &str) -> Result<Option<OffsetDateTime>, InvocationError> {
        Ok(self
            .string(name)?
            .and_then(|s| OffsetDateTime::parse(&s, &Rfc3339).ok()))
    }

    /// The message id; `None` when the payload hid it.
    fn id(&self) -> Result<Option<String>, InvocationError> {
        if self.is_shadowed("Id") {
            return Ok(None);
        }
        match self.string("Id")? {
            Some(id) if !id.is_empty() => Ok(Some(id)),
            _ => Err(InvocationError::bad("Metadata.Id", "missing or empty")),
        }
    }

    fn dequeue_count(&self) -> Result<u32, InvocationError> {
        if self.is_shadowed("DequeueCount") {
            // The real count is lost: never poison at the cap on our own
            // (the host still does, with its true count).
            return Ok(1);
        }
        let value = self.meta.get("DequeueCount");
        let n = match value {
            Some(Value::Number(n)) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
            Some(Value::String(s)) => unquote_host(s)
                .unwrap_or_else(|| s.clone())
                .trim()
                .parse()
                .ok(),
            None => return Err(InvocationError::bad("Metadata.DequeueCount", "missing")),
            _ => None,
        };
        n.filter(|n| *n >= 1).ok_or_else(|| {
            InvocationError::bad(
                "Metadata.DequeueCount",
                format!(
                    "{} is not a positive number",
                    value.map(Value::to_string).unwrap_or_default()
                ),
            )
        })
    }
}

/// A stable stand-in for a queue message id the payload hid: the same for
/// every attempt of one message (its insertion time and text do not change).
fn derived_id(insertion: Option<OffsetDateTime>, text: &str) -> String {
    let mut h = Sha256::new();
    if let Some(t) = insertion {
        h.update(t.unix_timestamp_nanos().to_be_bytes());
    }
    h.update(text.as_bytes());
    format!("derived-{}", &hex::encode(h.finalize())[..24])
}

async fn invoke(
    State(state): State<ServeState>,
    Path(function): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let invocation_id = headers
        .get(INVOCATION_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let Some(rt) = state.functions.get(&function).cloned() else {
        return unknown_function(&state, &function, &invocation_id);
    };
    let inv = match parse_invocation(&body, &rt.function, rt.app.message_encoding) {
        Ok(m) => m,
        Err(e) => {
            // The host drops a non-2xx body: say it in our own log too.
            warn!(event = "aqw.serve.bad_invocation", function = %function, invocation_id = %invocation_id, field = %e.field, error = %e.message, "invocation rejected; the host will retry it");
            return e.into_response();
        }
    };
    let msg = inv.message;
    let span =
        aqw_core::traces::job_span(&function, &rt.function.queue, &msg.id, msg.dequeue_count);
    span.record("invocation_id", invocation_id.as_str());
    let trace = start_trace(&span, &headers, producer_context(&rt, &inv.payload));
    if !inv.shadowed.is_empty() {
        span.in_scope(|| {
            warn!(event = "aqw.serve.metadata_shadowed", fields = ?inv.shadowed,
                "the payload has top-level fields named like queue metadata, and the host merged them over the real values; \
                 aqw ignored them (a derived message id, no own poisoning at the cap). Set \"dataType\": \"binary\" on the queueTrigger binding to avoid the merge")
        });
    }
    let started = std::time::Instant::now();
    let outcome = process(
        &rt,
        &msg,
        &inv.payload,
        &HostSettle,
        &trace,
        &state.hard_stop,
    )
    .instrument(span.clone())
    .await;
    span.in_scope(|| record_outcome(&function, &outcome, started.elapsed(), &trace));
    let log = format!(
        "aqw: {} message {} (dequeue count {})",
        outcome.label(),
        msg.id,
        msg.dequeue_count
    );
    answer(&span, &outcome, log)
}

/// A 404 for a function aqw does not serve, saying why.
fn unknown_function(state: &ServeState, function: &str, invocation_id: &str) -> Response {
    let message = match state.skipped.get(function) {
        Some(reason) => format!("function \"{function}\" is not served by aqw: {reason}"),
        None => {
            let mut known: Vec<&String> = state.functions.keys().collect();
            known.sort();
            format!("unknown function \"{function}\" (known: {known:?})")
        }
    };
    warn!(event = "aqw.serve.unknown_function", function = %function, invocation_id = %invocation_id, "{message}");
    InvocationError {
        status: StatusCode::NOT_FOUND,
        field: "(path)".into(),
        message,
    }
    .into_response()
}

/// The host's answer for an outcome: 200 when the message is settled (the
/// host deletes it), 500 or 503 when the host should retry it.
fn answer(span: &tracing::Span, outcome: &Outcome, log: String) -> Response {
    match outcome {
        // A parked message lives on as its fresh copy: the host deletes this one.
        Outcome::Completed
        | Outcome::Duplicate
        | Outcome::Poisoned { .. }
        | Outcome::Parked { .. }
        | Outcome::RetriedAsCopy { .. } => invocation_response(StatusCode::OK, vec![log]),
        Outcome::Retried { .. } | Outcome::Deferred { .. } | Outcome::Released => {
            span.in_scope(|| {
                warn!(
                    event = "aqw.serve.retry",
                    outcome = outcome.label(),
                    "answering 500: the host retries after its visibilityTimeout"
                )
            });
            invocation_response(StatusCode::INTERNAL_SERVER_ERROR, vec![log])
        }
        Outcome::Abandoned { error } => {
            span.in_scope(|| warn!(event = "aqw.serve.retry", outcome = "abandoned", error = %aqw_core::scrub::scrub(error), "answering 503: the host retries after its visibilityTimeout"));
            invocation_response(StatusCode::SERVICE_UNAVAILABLE, vec![log])
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
    let alerts = crate::telemetry::alerts::start(app.alert_target(), app.alert_window);
    let rts = runtimes(&app, &registry, &alerts)?;
    // Bind first: the host waits (60 s) for the port to open.
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on 127.0.0.1:{port}: {e}"))?;
    let health = Arc::new(Health::default());
    let ops = match app.http_port {
        Some(p) => {
            Some(crate::http::serve_ops(p, health.clone(), rts.clone(), shutdown.clone()).await?)
        }
        None => None,
    };
    for s in &app.skipped {
        warn!(event = "aqw.function.skipped", function = %s.name, reason = %s.reason, "function not served; its invocations get 404");
    }
    if !ensure_resources(&rts, &shutdown).await {
        return Ok(());
    }
    health.ready.store(true, Ordering::Relaxed);
    for rt in &rts {
        // The host delivers regardless: the pause is honoured per message.
        rt.gate.refresh().await;
    }
    let gates = rts.iter().map(|rt| rt.gate.clone()).collect();
    tokio::spawn(aqw_core::gate::Gate::watch_all(gates, shutdown.clone()));
    let maintenance = start_maintenance(&app, &rts, &shutdown);
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
    let _ = maintenance.await;
    if let Some(o) = ops {
        o.abort();
    }
    Ok(())
}

/// What `aqw run` runs beside its poll loops (the sweep, heartbeats, flow
/// renewals: `aqw_core::worker::serve_maintenance`), and a warning for each
/// per-function setting the host applies in aqw's place.
fn start_maintenance(
    app: &Arc<AppConfig>,
    rts: &[Arc<FunctionRuntime>],
    shutdown: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    for note in crate::config::queues::serve_notes(app) {
        warn!(event = "aqw.config.not_applied", "{note}");
    }
    let (app, rts, stop) = (app.clone(), rts.to_vec(), shutdown.clone());
    tokio::spawn(async move { aqw_core::worker::serve_maintenance(&app, &rts, stop).await })
}

/// The host's HttpClient sends its invocation's W3C context: the job joins
/// it and links the producer's (when the payload carries one, see
/// `aqw.tracing.parent`); without it, the producer's context is the parent.
fn start_trace(
    span: &tracing::Span,
    headers: &HeaderMap,
    producer: Option<aqw_core::traces::TraceContext>,
) -> aqw_core::traces::JobTrace {
    let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
    match header("traceparent")
        .and_then(|tp| aqw_core::traces::TraceContext::parse(tp, header("tracestate")))
    {
        Some(host) => {
            if let Some(p) = &producer {
                aqw_core::traces::link_to(span, Some(&p.traceparent()));
            }
            aqw_core::traces::start_job(span, Some(&host))
        }
        None => aqw_core::traces::start_job(span, producer.as_ref()),
    }
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
