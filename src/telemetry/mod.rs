//! Logs, metrics (the health gauges in [`gauges`]) and (in [`alerts`], chat
//! formats in `chat.rs`) the poison alert webhook.
//!
//! Secrets never reach a log line: [`scrub`] removes account keys, SAS
//! signatures, `Authorization` values and bearer tokens, and the log writer
//! runs every line through it as a last line of defence.

use std::io::Write;
use std::sync::OnceLock;

pub mod alerts;
mod chat;
pub mod gauges;
use aqw_core::alert as groups;
mod json_line;
pub use alerts::alert_body;
use aqw_core::scrub::scrubbed;
pub use gauges::render_metrics;

/// One formatted event as one line: a newline inside it (free text such as a
/// pause reason, in the text format) written as `\n`, and control
/// characters and bidirectional overrides as `\uXXXX` (valid in the JSON
/// format), so no field can forge a line or recolour a terminal (issue 40).
fn one_event(text: &str) -> std::borrow::Cow<'_, str> {
    let body = text.strip_suffix('\n').unwrap_or(text);
    if !body.contains('\n') && aqw_core::scrub::json_safe(body).len() == body.len() {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = aqw_core::scrub::json_safe(body).replace('\n', "\\n");
    if text.ends_with('\n') {
        out.push('\n');
    }
    std::borrow::Cow::Owned(out)
}

/// Log writer that scrubs every formatted event before it reaches stderr.
struct ScrubbingStderr;

impl Write for ScrubbingStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let scrubbed = scrubbed(&text);
        std::io::stderr().write_all(one_event(&scrubbed).as_bytes())?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// The JSON log format's span fields, grown by appending. tracing-subscriber's
/// `JsonFields` parses a span's fields back into a map and re-serializes all
/// of them on every `span.record(..)`; the `aqw.job` span is recorded on
/// several times per job (key, invocation id, outcome, duration), which
/// callgrind put at 4-11 % of `aqw run`'s instructions. The object is kept
/// valid JSON with no key twice (a field recorded again rewrites the
/// object, which aqw's spans never need), so the line formatter
/// ([`json_line`]) copies it as is. Fields for the exporter only
/// ([`for_logs`]) are left out.
pub(crate) struct AppendJsonFields;

impl<'w> tracing_subscriber::fmt::FormatFields<'w> for AppendJsonFields {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        mut writer: tracing_subscriber::fmt::format::Writer<'w>,
        fields: R,
    ) -> std::fmt::Result {
        let mut members = Vec::new();
        let mut visitor = json_line::Members(&mut members, json_line::Fields::Span);
        fields.record(&mut LogFieldsOnly(&mut visitor));
        let members = std::str::from_utf8(&members).map_err(|_| std::fmt::Error)?;
        writer.write_char('{')?;
        writer.write_str(members.strip_prefix(',').unwrap_or_default())?;
        writer.write_char('}')
    }

    fn add_fields(
        &self,
        current: &'w mut tracing_subscriber::fmt::FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> std::fmt::Result {
        let mut added = String::new();
        self.format_fields(
            tracing_subscriber::fmt::format::Writer::new(&mut added),
            fields,
        )?;
        let mut names = FieldNames::default();
        fields.record(&mut names);
        if names.0.iter().any(|n| has_key(&current.fields, n)) {
            merge_json_objects(&mut current.fields, &added);
        } else {
            append_json_object(&mut current.fields, &added);
        }
        Ok(())
    }
}

/// The names of the fields a record carries.
#[derive(Default)]
struct FieldNames(Vec<&'static str>);

impl tracing::field::Visit for FieldNames {
    fn record_debug(&mut self, f: &tracing::field::Field, _: &dyn std::fmt::Debug) {
        self.0.push(f.name());
    }
}

/// Whether the object text `object` may already have the key `name` (a
/// `"name":` anywhere; a false yes only costs the slower merge).
fn has_key(object: &str, name: &str) -> bool {
    object
        .match_indices(name)
        .any(|(i, _)| object[..i].ends_with('"') && object[i + name.len()..].starts_with("\":"))
}

/// `current` with `added`'s members, a key in both taking `added`'s value.
fn merge_json_objects(current: &mut String, added: &str) {
    use serde_json::{Map, Value};
    let mut merged: Map<String, Value> = serde_json::from_str(current).unwrap_or_default();
    let added: Map<String, Value> = serde_json::from_str(added).unwrap_or_default();
    merged.extend(added);
    *current = Value::Object(merged).to_string();
}

/// The text log format's fields: tracing-subscriber's own, without the
/// exporter-only ones ([`for_logs`]).
pub(crate) struct TextFields;

impl<'w> tracing_subscriber::fmt::FormatFields<'w> for TextFields {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        writer: tracing_subscriber::fmt::format::Writer<'w>,
        fields: R,
    ) -> std::fmt::Result {
        use tracing_subscriber::field::VisitOutput;
        let mut text = tracing_subscriber::fmt::format::DefaultVisitor::new(writer, true);
        fields.record(&mut LogFieldsOnly(&mut text));
        text.finish()
    }
}

/// Whether a field belongs on a log line. The OpenTelemetry messaging fields
/// (`messaging.*`) are given to the job span only while exporting, for the
/// exporter; the log line already has the same facts under its short names
/// (`queue`, `message_id`). Leaving them out keeps a line the same with
/// export on or off, and saved some 30 k instructions per job with it on
/// (formatting them into the span, then parsing and writing them again on
/// every line).
fn for_logs(field: &tracing::field::Field) -> bool {
    !field.name().starts_with("messaging.")
}

/// A visitor that passes on only the fields [`for_logs`] keeps.
struct LogFieldsOnly<'v, V>(&'v mut V);

impl<V: tracing::field::Visit> tracing::field::Visit for LogFieldsOnly<'_, V> {
    fn record_f64(&mut self, f: &tracing::field::Field, v: f64) {
        if for_logs(f) {
            self.0.record_f64(f, v)
        }
    }
    fn record_i64(&mut self, f: &tracing::field::Field, v: i64) {
        if for_logs(f) {
            self.0.record_i64(f, v)
        }
    }
    fn record_u64(&mut self, f: &tracing::field::Field, v: u64) {
        if for_logs(f) {
            self.0.record_u64(f, v)
        }
    }
    fn record_i128(&mut self, f: &tracing::field::Field, v: i128) {
        if for_logs(f) {
            self.0.record_i128(f, v)
        }
    }
    fn record_u128(&mut self, f: &tracing::field::Field, v: u128) {
        if for_logs(f) {
            self.0.record_u128(f, v)
        }
    }
    fn record_bool(&mut self, f: &tracing::field::Field, v: bool) {
        if for_logs(f) {
            self.0.record_bool(f, v)
        }
    }
    fn record_str(&mut self, f: &tracing::field::Field, v: &str) {
        if for_logs(f) {
            self.0.record_str(f, v)
        }
    }
    fn record_bytes(&mut self, f: &tracing::field::Field, v: &[u8]) {
        if for_logs(f) {
            self.0.record_bytes(f, v)
        }
    }
    fn record_error(&mut self, f: &tracing::field::Field, v: &(dyn std::error::Error + 'static)) {
        if for_logs(f) {
            self.0.record_error(f, v)
        }
    }
    fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
        if for_logs(f) {
            self.0.record_debug(f, v)
        }
    }
}

/// `current` (a JSON object's text, or empty) with the members of `added`
/// (another object's text) appended.
fn append_json_object(current: &mut String, added: &str) {
    let added_members = added
        .strip_prefix('{')
        .and_then(|a| a.strip_suffix('}'))
        .unwrap_or_default();
    if added_members.is_empty() {
        if current.is_empty() {
            current.push_str("{}");
        }
        return;
    }
    match current.strip_suffix('}') {
        Some(head) if head.len() > 1 => {
            current.truncate(head.len());
            current.push(',');
        }
        _ => {
            current.clear();
            current.push('{');
        }
    }
    current.push_str(added_members);
    current.push('}');
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One readable line per event.
    Text,
    /// One JSON object per line, fields flattened (for log pipelines).
    Json,
}

/// Install the global tracing subscriber (idempotent). `AQW_LOG` / `RUST_LOG`
/// set the filter; the SDK's own debug lines stay off by default. With an
/// exporter's `traces` provider (see `traces::export`), aqw's own spans
/// (target `aqw`, info and up) also go to OpenTelemetry; the HTTP stack's
/// never do.
pub fn init_logging(
    format: LogFormat,
    traces: Option<&opentelemetry_sdk::trace::SdkTracerProvider>,
) {
    use tracing_subscriber::filter::FilterExt as _;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{EnvFilter, Layer};
    // An explicit AQW_LOG / RUST_LOG is taken as is (the SDK's own debug lines
    // included: the scrubbing writer still guards them); the default keeps the
    // SDK at warn.
    let filter = match std::env::var("AQW_LOG").or_else(|_| std::env::var("RUST_LOG")) {
        Ok(f) => EnvFilter::try_new(f).unwrap_or_else(|_| EnvFilter::new("info")),
        Err(_) => EnvFilter::new("info,azure_core=warn,azure_identity=warn,azure_storage_queue=warn,typespec_client_core=warn,reqwest=warn,hyper=warn"),
    };
    let fmt = fmt_layer(format);
    // The step spans (`aqw.key.claim`, `aqw.storage`, ...) exist only while
    // exporting, for the exporter: the log lines stay as they are with export
    // off, and the fmt layer does not format every step's fields.
    let without_step_spans = tracing_subscriber::filter::filter_fn(|m| {
        !m.is_span() || m.name() == "aqw.job" || !m.name().starts_with("aqw.")
    });
    let otel = traces.map(otel_layer);
    let registry =
        tracing_subscriber::registry().with(fmt.with_filter(filter.and(without_step_spans)));
    // No exporter: no OpenTelemetry layer at all. An `Option` layer that is
    // `None` answers "always interested" for every callsite, which made the
    // whole stack's debug and trace events live (built, then dropped by the
    // fmt layer's filter): the SDK's logging policy sanitized every
    // request's headers for a debug line nobody saw, some 10 % of `aqw
    // run`'s instructions (callgrind).
    let _ = match otel {
        Some(otel) => registry.with(otel).try_init(),
        None => registry.try_init(),
    };
}

/// The OpenTelemetry layer: aqw's own spans (target `aqw`, info and up)
/// plus warnings and errors, to the exporters' `provider`.
fn otel_layer<S>(
    p: &opentelemetry_sdk::trace::SdkTracerProvider,
) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::filter::FilterExt as _;
    use tracing_subscriber::{filter::Targets, Layer};
    // No per-span busy/idle timing (it costs a clock read at every poll
    // of an instrumented future), thread or source-location attributes:
    // each is work on every span of every job that nobody reads in a
    // job trace (bench (g) measures the rest).
    tracing_opentelemetry::layer()
        .with_tracer(p.tracer("aqw"))
        .with_tracked_inactivity(false)
        .with_threads(false)
        .with_location(false)
        // No OpenTelemetry `Context` attached to the thread on every
        // poll of an instrumented future (a context clone and a
        // thread-local push at each enter, a pop at each exit): aqw
        // reads a span's context through the registry
        // (`OpenTelemetrySpanExt::context`), never `Context::current()`,
        // and a step span still finds its parent as tracing's current
        // span (tests/traces.rs checks the tree).
        .with_context_activation(false)
        // No `target` attribute (the Rust module path) on every span:
        // the span's name already says which step it is.
        .with_target(false)
        .with_filter(
            Targets::new()
                .with_target("aqw", tracing::Level::INFO)
                .and(spans_and_warnings()),
        )
}

/// What the OpenTelemetry layer takes besides aqw's spans: warnings and
/// errors (a retry's cause, storage trouble), which become events on the span
/// they happen in. An info line, above all the one outcome line per job,
/// repeats what its span already carries (outcome, duration, ids): as a span
/// event it was one more thing to convert and encode for every job
/// (callgrind, bench/profile.md "Traces").
fn spans_and_warnings() -> tracing_subscriber::filter::FilterFn {
    tracing_subscriber::filter::filter_fn(|m| m.is_span() || *m.level() <= tracing::Level::WARN)
}

/// The log lines' layer: the format asked for, written through the scrubber.
fn fmt_layer(
    format: LogFormat,
) -> Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync> {
    use tracing_subscriber::Layer;
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(|| ScrubbingStderr)
        .with_target(false);
    match format {
        LogFormat::Json => fmt
            .event_format(json_line::JsonLine)
            .fmt_fields(AppendJsonFields)
            .boxed(),
        // https://no-color.org: any non-empty NO_COLOR turns colour off.
        LogFormat::Text => fmt
            .with_ansi(
                std::io::IsTerminal::is_terminal(&std::io::stderr())
                    && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
            )
            .fmt_fields(TextFields)
            .boxed(),
    }
}

/// Handler latency buckets, in seconds: jobs run from milliseconds (an HTTP
/// call) to minutes (a report, an export), so the buckets reach 10 minutes,
/// the Functions default `functionTimeout` ceiling on a Consumption plan.
pub const HANDLER_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

/// The process-wide Prometheus recorder (installed on first use).
pub fn metrics_handle() -> &'static metrics_exporter_prometheus::PrometheusHandle {
    static H: OnceLock<metrics_exporter_prometheus::PrometheusHandle> = OnceLock::new();
    H.get_or_init(|| {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new()
            .set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Full("aqw_handler_duration_seconds".into()),
                HANDLER_BUCKETS,
            )
            .expect("static buckets")
            .build_recorder();
        let handle = recorder.handle();
        // Another recorder may already be installed (tests): then ours only renders.
        let _ = metrics::set_global_recorder(recorder);
        handle
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_objects_are_appended_to() {
        let mut s = String::new();
        append_json_object(&mut s, "{}");
        assert_eq!(s, "{}");
        append_json_object(&mut s, r#"{"a":1}"#);
        assert_eq!(s, r#"{"a":1}"#);
        append_json_object(&mut s, r#"{"b":"x}","c":null}"#);
        assert_eq!(s, r#"{"a":1,"b":"x}","c":null}"#);
        append_json_object(&mut s, "{}");
        assert_eq!(s, r#"{"a":1,"b":"x}","c":null}"#);
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["b"], "x}");
    }

    #[derive(Clone, Default)]
    pub(super) struct Buf(pub(super) std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A job span as it is made while exporting (the messaging fields given)
    /// and one line in it, in both formats: the line has the short names,
    /// never the exporter's `messaging.*` ones.
    #[test]
    fn exporter_only_fields_stay_off_log_lines() {
        use tracing_subscriber::layer::SubscriberExt as _;
        for json in [true, false] {
            let buf = Buf::default();
            let writer = buf.clone();
            let fmt = tracing_subscriber::fmt::layer()
                .with_writer(move || writer.clone())
                .with_ansi(false);
            let layer = if json {
                fmt.event_format(json_line::JsonLine)
                    .fmt_fields(AppendJsonFields)
                    .boxed()
            } else {
                fmt.fmt_fields(TextFields).boxed()
            };
            use tracing_subscriber::Layer as _;
            let subscriber = tracing_subscriber::registry().with(layer);
            tracing::subscriber::with_default(subscriber, || {
                let span = tracing::info_span!(
                    "aqw.job",
                    queue = "orders",
                    dequeue_count = 2u32,
                    outcome = tracing::field::Empty,
                    messaging.system = Some("azure_queue_storage"),
                    messaging.destination.name = Some("orders"),
                );
                span.record("outcome", "completed");
                let _g = span.enter();
                tracing::info!(event = "aqw.job.completed", "job completed");
            });
            let out = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
            assert!(!out.contains("messaging"), "{out}");
            assert!(out.contains("orders") && out.contains("completed"), "{out}");
            if json {
                let line: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
                assert_eq!(line["span"]["queue"], "orders", "{out}");
                assert_eq!(line["span"]["dequeue_count"], 2, "{out}");
            } else {
                assert!(out.contains("queue=\"orders\""), "{out}");
            }
        }
    }

    /// The exporter's layer sees spans, warnings and errors, not info lines.
    #[test]
    fn the_exporter_layer_takes_spans_and_warnings() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tracing_subscriber::layer::SubscriberExt as _;
        use tracing_subscriber::Layer;
        #[derive(Clone, Default)]
        struct Seen(std::sync::Arc<(AtomicUsize, AtomicUsize)>);
        impl<S: tracing::Subscriber> Layer<S> for Seen {
            fn on_new_span(
                &self,
                _: &tracing::span::Attributes<'_>,
                _: &tracing::span::Id,
                _: tracing_subscriber::layer::Context<'_, S>,
            ) {
                self.0 .0.fetch_add(1, Ordering::SeqCst);
            }
            fn on_event(
                &self,
                _: &tracing::Event<'_>,
                _: tracing_subscriber::layer::Context<'_, S>,
            ) {
                self.0 .1.fetch_add(1, Ordering::SeqCst);
            }
        }
        let seen = Seen::default();
        let subscriber =
            tracing_subscriber::registry().with(seen.clone().with_filter(spans_and_warnings()));
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("aqw.job");
            let _g = span.enter();
            tracing::info!(event = "aqw.job.completed", "job completed");
            tracing::debug!("detail");
            tracing::warn!(event = "aqw.job.retried", "attempt failed; will retry");
            tracing::error!("storage down");
        });
        assert_eq!(seen.0 .0.load(Ordering::SeqCst), 1, "spans");
        assert_eq!(
            seen.0 .1.load(Ordering::SeqCst),
            2,
            "events: the warning and the error"
        );
    }

    /// A JSON log line inside a span that was recorded on carries the
    /// span's fields, the recorded ones included, the last value winning.
    #[test]
    fn recorded_span_fields_reach_the_json_line() {
        use tracing_subscriber::layer::SubscriberExt as _;
        let buf = Buf::default();
        let writer = buf.clone();
        let layer = tracing_subscriber::fmt::layer()
            .event_format(json_line::JsonLine)
            .fmt_fields(AppendJsonFields)
            .with_writer(move || writer.clone());
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!(
                "aqw.job",
                function = "F",
                outcome = tracing::field::Empty,
                duration_ms = tracing::field::Empty
            );
            span.record("outcome", "retried");
            span.record("duration_ms", 12u64);
            span.record("outcome", "completed");
            let _g = span.enter();
            tracing::info!(event = "aqw.job.completed", "job completed");
        });
        let out = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let line: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        let span = &line["span"];
        assert_eq!(span["function"], "F", "{out}");
        assert_eq!(span["outcome"], "completed", "{out}");
        assert_eq!(span["duration_ms"], 12, "{out}");
        assert_eq!(span["name"], "aqw.job", "{out}");
        assert_eq!(out.matches("\"outcome\"").count(), 1, "no key twice: {out}");
        assert_eq!(line["event"], "aqw.job.completed");
        assert_eq!(line["level"], "INFO");
        assert!(
            line["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')),
            "{out}"
        );
    }
}

#[cfg(test)]
mod one_event_tests {
    use super::one_event;

    /// Issue 40: a field with a newline cannot forge a log line, and no
    /// control character or bidi override reaches the terminal raw.
    #[test]
    fn one_event_is_one_line_with_hidden_characters_escaped() {
        let line = "INFO paused reason=ledger\nINFO forged \u{1b}[31m \u{202E}x\n";
        let out = one_event(line);
        assert_eq!(out.matches('\n').count(), 1, "{out:?}");
        assert!(out.ends_with('\n'));
        assert!(
            !out.contains('\u{1b}') && !out.contains('\u{202E}'),
            "{out:?}"
        );
        assert!(
            out.contains("ledger\\nINFO forged \\u001b[31m \\u202ex"),
            "{out:?}"
        );
        assert_eq!(one_event("plain\n"), "plain\n");
    }
}
