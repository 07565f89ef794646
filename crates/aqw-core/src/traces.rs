//! Traces of jobs: one `aqw.job` span per attempt with its steps beneath it,
//! W3C trace context in and out. The exporters (chosen by the environment)
//! are the binary's: here is only the `tracing` / OpenTelemetry API side.
//!
//! Why the split between "on" and "off": with no exporter configured nothing
//! is exported and nothing is built for it — the job span that always existed
//! for log lines stays, the child spans are [`tracing::Span::none`], and the
//! trace and span ids on the outcome line are two random numbers (or the
//! producer's trace id). The handler still gets a `traceparent`, so its own
//! tracing can join the producer's trace.
//!
//! Queue messages have no headers: a producer's context travels in the
//! payload only where `aqw.tracing.parent` (a JSON pointer) says so, and aqw
//! reads or writes it nowhere else.

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use tracing_opentelemetry::OpenTelemetrySpanExt;

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported (an exporter was installed at start-up).
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Turn span export on or off (the binary's exporter, once at start-up).
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

static STORAGE_SPANS: AtomicBool = AtomicBool::new(false);

/// Whether each storage request gets its own `aqw.storage` client span
/// (`AQW_TRACE_STORAGE=true`, while exporting). Off by default: a keyed job
/// makes three storage requests, each inside a step span (`aqw.key.claim`,
/// `aqw.key.done`, `aqw.settle`) that already times it and carries its
/// error, so the request spans doubled those steps: 3 of a job's 8 spans,
/// and with them some 40 % of what exporting costs per job (callgrind,
/// BENCHMARKS.md "Traces"). Turn them on to see the storage's own status
/// codes, and the SDK's retries, one span per request.
pub fn storage_spans() -> bool {
    STORAGE_SPANS.load(Ordering::Relaxed) && enabled()
}

/// Turn the per-request storage spans on or off (`AQW_TRACE_STORAGE`, read
/// by the binary at start-up); they show only while exporting.
pub fn set_storage_spans(on: bool) {
    STORAGE_SPANS.store(on, Ordering::Relaxed);
}

/// A W3C trace context as it travels: `traceparent` and, when there is one,
/// `tracestate` (<https://www.w3.org/TR/trace-context/>).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// The trace the context belongs to.
    pub(crate) trace_id: TraceId,
    /// The span that is the parent of what comes next.
    pub(crate) span_id: SpanId,
    /// The `sampled` flag: the producer records this trace.
    sampled: bool,
    /// The vendor-specific `tracestate`, when there is one (and it is valid).
    pub tracestate: Option<String>,
}

impl TraceContext {
    /// Parse a `traceparent` (version 00 layout; a higher version is read by
    /// its first four fields, as the spec asks). `None` for anything invalid,
    /// including the all-zero ids.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<Self> {
        let parts: Vec<&str> = traceparent.trim().split('-').collect();
        let [version, trace, span, flags, rest @ ..] = parts.as_slice() else {
            return None;
        };
        let hex = |s: &str, n: usize| {
            s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        };
        if !hex(version, 2) || *version == "ff" || (*version == "00" && !rest.is_empty()) {
            return None;
        }
        if !hex(trace, 32) || !hex(span, 16) || !hex(flags, 2) {
            return None;
        }
        let trace_id = TraceId::from_hex(trace).ok()?;
        let span_id = SpanId::from_hex(span).ok()?;
        if trace_id == TraceId::INVALID || span_id == SpanId::INVALID {
            return None;
        }
        let flags = u8::from_str_radix(flags, 16).ok()?;
        let tracestate = tracestate
            .map(str::trim)
            .filter(|s| !s.is_empty() && TraceState::from_str(s).is_ok())
            .map(str::to_string);
        Some(Self {
            trace_id,
            span_id,
            sampled: flags & 1 == 1,
            tracestate,
        })
    }

    /// The `traceparent` header value: `00-<trace id>-<span id>-<flags>`.
    pub fn traceparent(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            self.trace_id,
            self.span_id,
            u8::from(self.sampled)
        )
    }

    fn from_span_context(sc: &SpanContext) -> Option<Self> {
        if !sc.is_valid() {
            return None;
        }
        let state = sc.trace_state().header();
        Some(Self {
            trace_id: sc.trace_id(),
            span_id: sc.span_id(),
            sampled: sc.is_sampled(),
            tracestate: (!state.is_empty()).then_some(state),
        })
    }

    fn to_otel(&self) -> opentelemetry::Context {
        let state = self
            .tracestate
            .as_deref()
            .and_then(|s| TraceState::from_str(s).ok())
            .unwrap_or_default();
        let flags = if self.sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        let sc = SpanContext::new(self.trace_id, self.span_id, flags, true, state);
        opentelemetry::Context::new().with_remote_span_context(sc)
    }
}

/// The producer's trace context in a JSON payload at `pointer`: a
/// `traceparent` string, or an object with `traceparent` (and `tracestate`).
/// `None` when the payload is not JSON, or nothing valid is there: a bad
/// context never fails a job, the attempt then starts a trace of its own.
fn context_in_payload(pointer: &str, payload: &str) -> Option<TraceContext> {
    let doc: serde_json::Value = serde_json::from_str(payload).ok()?;
    context_in_json(pointer, &doc)
}

/// [`context_in_payload`] over a payload already parsed.
pub(crate) fn context_in_json(pointer: &str, doc: &serde_json::Value) -> Option<TraceContext> {
    match doc.pointer(pointer)? {
        serde_json::Value::String(tp) => TraceContext::parse(tp, None),
        serde_json::Value::Object(o) => TraceContext::parse(
            o.get("traceparent")?.as_str()?,
            o.get("tracestate").and_then(|v| v.as_str()),
        ),
        _ => None,
    }
}

/// Write `cx` at `pointer` into a JSON object payload, unless a valid
/// context is already there (the producer's own wins). `Ok(None)`: nothing
/// changed. An error when the payload is not a JSON object or the pointer's
/// parent is missing — `aqw enqueue` reports it instead of sending a message
/// without the context it was asked to carry.
pub(crate) fn put_context_in_payload(
    pointer: &str,
    payload: &str,
    cx: &TraceContext,
) -> Result<Option<String>, String> {
    if context_in_payload(pointer, payload).is_some() {
        return Ok(None);
    }
    let mut doc: serde_json::Value = serde_json::from_str(payload)
        .map_err(|_| "aqw.tracing.parent is set but the payload is not JSON".to_string())?;
    let (parent, last) = pointer.rsplit_once('/').unwrap_or(("", pointer));
    let last = last.replace("~1", "/").replace("~0", "~");
    let Some(serde_json::Value::Object(obj)) = doc.pointer_mut(parent) else {
        return Err(format!(
            "aqw.tracing.parent {pointer:?}: the payload has no JSON object at {:?}",
            if parent.is_empty() { "/" } else { parent }
        ));
    };
    obj.insert(last, serde_json::Value::String(cx.traceparent()));
    Ok(Some(doc.to_string()))
}

/// The ids a job's outcome line carries, and the context its handler gets.
#[derive(Debug, Clone)]
pub struct JobTrace {
    /// The trace id, in hex.
    pub(crate) trace_id: String,
    /// The attempt span's id, in hex.
    pub(crate) span_id: String,
    /// The context of the attempt span (off: of its stand-in ids).
    pub(crate) context: TraceContext,
}

/// Start the trace of one attempt on its `aqw.job` span: join the producer's
/// trace when the message carried one. Call it before the span is entered.
pub fn start_job(span: &tracing::Span, parent: Option<&TraceContext>) -> JobTrace {
    if enabled() {
        if let Some(p) = parent {
            let _ = span.set_parent(p.to_otel());
        }
        if let Some(cx) = TraceContext::from_span_context(span.context().span().span_context()) {
            return JobTrace::of(cx);
        }
    }
    let context = TraceContext {
        trace_id: parent.map(|p| p.trace_id).unwrap_or_else(|| {
            TraceId::from_bytes(crate::entropy::gen::<u128>().max(1).to_be_bytes())
        }),
        span_id: SpanId::from_bytes(crate::entropy::gen::<u64>().max(1).to_be_bytes()),
        sampled: parent.is_none_or(|p| p.sampled),
        tracestate: parent.and_then(|p| p.tracestate.clone()),
    };
    JobTrace::of(context)
}

impl JobTrace {
    fn of(context: TraceContext) -> Self {
        Self {
            trace_id: context.trace_id.to_string(),
            span_id: context.span_id.to_string(),
            context,
        }
    }

    /// The context to hand on from inside `span` (the handler call span when
    /// exporting, so the handler's spans hang beneath it; off, the job's).
    pub(crate) fn context_within(&self, span: &tracing::Span) -> TraceContext {
        if enabled() && !span.is_none() {
            if let Some(cx) = TraceContext::from_span_context(span.context().span().span_context())
            {
                return cx;
            }
        }
        self.context.clone()
    }
}

/// The span of one attempt, `aqw.job`: a consumer span (a request in
/// Application Insights). Outcome, duration and status are recorded on it
/// by `finish_job`.
pub fn job_span(
    function: &str,
    queue: &str,
    message_id: &str,
    dequeue_count: u32,
) -> tracing::Span {
    let on = enabled();
    tracing::info_span!(
        "aqw.job",
        otel.kind = "consumer",
        function = %function,
        queue = %queue,
        message_id = %message_id,
        dequeue_count,
        key = tracing::field::Empty,
        invocation_id = tracing::field::Empty,
        outcome = tracing::field::Empty,
        duration_ms = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
        otel.status_message = tracing::field::Empty,
        // The OpenTelemetry messaging conventions, only where spans are
        // exported: log lines carry the same facts by their short names and
        // leave these out (`telemetry::for_logs`). Given at creation (`None`
        // records nothing): a record after it costs a visit of every layer
        // per field.
        messaging.system = on.then_some(MESSAGING_SYSTEM),
        messaging.operation.type = on.then_some("process"),
        messaging.destination.name = on.then_some(queue),
        messaging.message.id = on.then_some(message_id),
    )
}

/// `messaging.system` of Azure Queue Storage: the conventions list no value
/// for it, so this is aqw's own (lower-case, as theirs are).
pub(crate) const MESSAGING_SYSTEM: &str = "azure_queue_storage";

/// Record an attempt's end on its span. `error` (already scrubbed) marks
/// the span failed: retried, poisoned and abandoned attempts.
pub(crate) fn finish_job(
    span: &tracing::Span,
    outcome: &str,
    duration_ms: u64,
    error: Option<&str>,
) {
    span.record("outcome", outcome);
    span.record("duration_ms", duration_ms);
    if let Some(e) = error {
        span.record("otel.status_code", "error");
        span.record("otel.status_message", e);
    }
}

/// Mark a step span failed with a scrubbed message.
pub(crate) fn fail_step(span: &tracing::Span, message: &str) {
    if !span.is_none() {
        span.record("otel.status_code", "error");
        span.record("otel.status_message", crate::scrub::scrub(message).as_str());
    }
}

/// A child span of the current one, only when exporting (off, it costs
/// nothing: [`tracing::Span::none`]). `$name` is the span's name.
#[doc(hidden)]
#[macro_export]
macro_rules! step_span {
    ($name:literal $(, $($field:tt)*)?) => {
        if $crate::traces::enabled() {
            ::tracing::info_span!($name $(, $($field)*)?)
        } else {
            ::tracing::Span::none()
        }
    };
}
pub use crate::step_span;

/// Await `work` as the step `span`'s. The span is entered on every poll
/// only while storage spans are exported: they are the only spans a step
/// holds, and each finds its parent as the current span. Otherwise the
/// span is just held open around the await, which gives it the same start,
/// end and parent without the registry's enter and exit on every poll
/// (some 20 k instructions per exported job, bench/profile.md round five);
/// a warning logged inside the step then lands on the job span.
///
/// A plain function over `Either`, not an `async fn`: an `async fn` keeps
/// `work` and the future awaiting it side by side in its state, doubling
/// the job future at every step, and `tokio::spawn` copies the job future
/// (callgrind: +110 k instructions per job in `memcpy`).
pub(crate) fn in_step<F: std::future::Future>(
    span: tracing::Span,
    work: F,
) -> impl std::future::Future<Output = F::Output> {
    use futures::future::{Either, FutureExt};
    use tracing::Instrument;
    if storage_spans() {
        Either::Left(work.instrument(span))
    } else {
        Either::Right(work.map(move |out| {
            drop(span);
            out
        }))
    }
}

/// The producer span of `aqw enqueue` (only when exporting).
pub fn enqueue_span(queue: &str) -> tracing::Span {
    step_span!("aqw.enqueue", otel.kind = "producer", queue = %queue)
}

/// Link `span` to the trace of the attempt that wrote a poison record (its
/// saved `traceparent`), so replay, discard and fix show up next to the job.
pub fn link_to(span: &tracing::Span, traceparent: Option<&str>) {
    if !enabled() {
        return;
    }
    if let Some(cx) = traceparent.and_then(|tp| TraceContext::parse(tp, None)) {
        let sc = SpanContext::new(
            cx.trace_id,
            cx.span_id,
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        );
        span.add_link(sc);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn traceparent_round_trips_and_rejects_invalid() {
        let cx = TraceContext::parse(TP, Some("congo=t61rcWkgMzE")).unwrap();
        assert_eq!(cx.traceparent(), TP);
        assert_eq!(cx.tracestate.as_deref(), Some("congo=t61rcWkgMzE"));
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "<script>",
        ] {
            assert!(TraceContext::parse(bad, None).is_none(), "{bad:?}");
        }
        // A future version may append fields.
        assert!(TraceContext::parse(&format!("01{}-more", &TP[2..]), None).is_some());
    }

    #[test]
    fn payload_context_is_read_at_the_pointer_only() {
        let p =
            format!(r#"{{"orderId":"o-1","meta":{{"traceparent":"{TP}","tracestate":"a=b"}}}}"#);
        let cx = context_in_payload("/meta", &p).unwrap();
        assert_eq!(cx.tracestate.as_deref(), Some("a=b"));
        let flat = format!(r#"{{"traceparent":"{TP}"}}"#);
        assert_eq!(
            context_in_payload("/traceparent", &flat)
                .unwrap()
                .traceparent(),
            TP
        );
        assert!(context_in_payload("/traceparent", "not json").is_none());
        assert!(context_in_payload("/missing", &flat).is_none());
        assert!(context_in_payload("/traceparent", r#"{"traceparent":"garbage"}"#).is_none());
    }

    #[test]
    fn enqueue_writes_the_context_unless_one_is_there() {
        let cx = TraceContext::parse(TP, None).unwrap();
        let out = put_context_in_payload("/traceparent", r#"{"a":1}"#, &cx)
            .unwrap()
            .unwrap();
        assert_eq!(context_in_payload("/traceparent", &out).unwrap(), cx);
        assert_eq!(
            put_context_in_payload("/traceparent", &out, &cx).unwrap(),
            None
        );
        let nested = put_context_in_payload("/meta/tp", r#"{"meta":{}}"#, &cx)
            .unwrap()
            .unwrap();
        assert!(nested.contains(TP));
        assert!(put_context_in_payload("/meta/tp", r#"{"a":1}"#, &cx).is_err());
        assert!(put_context_in_payload("/tp", "[1]", &cx).is_err());
        assert!(put_context_in_payload("/tp", "plain text", &cx).is_err());
    }

    #[test]
    fn off_the_job_keeps_the_producers_trace_id() {
        let parent = TraceContext::parse(TP, None).unwrap();
        let t = start_job(&tracing::Span::none(), Some(&parent));
        assert_eq!(t.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_ne!(t.span_id, "00f067aa0ba902b7");
        let fresh = start_job(&tracing::Span::none(), None);
        assert_eq!(fresh.trace_id.len(), 32);
        assert_eq!(fresh.span_id.len(), 16);
        assert!(TraceContext::parse(&fresh.context.traceparent(), None).is_some());
    }
}
