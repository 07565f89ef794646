//! The JSON log line, written straight into one buffer.
//!
//! The same line tracing-subscriber's JSON format writes with
//! `flatten_event(true)`, `with_current_span(true)`, no target and no span
//! list: `timestamp`, `level`, the event's fields in their order, then
//! `span`, the current span's fields and its `name`. Why our own: the stock
//! formatter parses the span's stored fields back into a map and writes
//! them again on every line, and sends every piece of the line (each quote,
//! colon and key) through an `io::Write` adaptor that checks it is UTF-8;
//! together some 35 k instructions per `aqw run` job (callgrind,
//! bench/profile.md round five). Here each value is escaped by serde_json
//! straight into the line, and the span's fields, stored as a JSON object
//! with no key twice ([`super::AppendJsonFields`]), are copied as they are.

use tracing::field::{Field, Visit};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::FormatTime;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// [`FormatEvent`] of `--log-format json`.
pub(crate) struct JsonLine;

impl<S, N> FormatEvent<S, N> for JsonLine
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let mut stamp = String::with_capacity(32);
        tracing_subscriber::fmt::time::SystemTime.format_time(&mut Writer::new(&mut stamp))?;
        let mut line = Vec::with_capacity(512);
        line.extend_from_slice(b"{\"timestamp\":");
        value(&mut line, &stamp);
        line.extend_from_slice(b",\"level\":");
        value(&mut line, event.metadata().level().as_str());
        event.record(&mut super::LogFieldsOnly(&mut Members(
            &mut line,
            Fields::Event,
        )));
        // The event's own parent when it names one, else the current span,
        // as tracing-subscriber's JSON format chooses.
        let span = event
            .parent()
            .and_then(|id| ctx.span(id))
            .or_else(|| ctx.lookup_current());
        if let Some(span) = span {
            line.extend_from_slice(b",\"span\":{");
            let ext = span.extensions();
            let stored = ext
                .get::<FormattedFields<N>>()
                .map(|f| f.fields.as_str())
                .unwrap_or_default();
            let members = stored
                .strip_prefix('{')
                .and_then(|s| s.strip_suffix('}'))
                .unwrap_or_default();
            if !members.is_empty() {
                line.extend_from_slice(members.as_bytes());
                line.push(b',');
            }
            line.extend_from_slice(b"\"name\":");
            value(&mut line, span.name());
            line.push(b'}');
        }
        line.extend_from_slice(b"}\n");
        writer.write_str(std::str::from_utf8(&line).map_err(|_| std::fmt::Error)?)
    }
}

/// `v` as JSON, escaped by serde_json. Writing into a `Vec` cannot fail,
/// and every value given here serializes.
fn value<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, v: &T) {
    let _ = serde_json::to_writer(out, v);
}

/// Writes each field as `,"name":value`.
pub(crate) struct Members<'a>(pub &'a mut Vec<u8>, pub Fields);

/// Whose fields [`Members`] writes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fields {
    /// An event's: all of them, the `log.*` ones of a `log` crate record
    /// included (its target, module, file and line), as tracing-subscriber's
    /// flattened JSON writes them.
    Event,
    /// A span's: without `log.*`, as tracing-subscriber's `JsonFields`.
    Span,
}

impl Members<'_> {
    fn key(&mut self, field: &Field) -> bool {
        let name = field.name();
        if self.1 == Fields::Span && name.starts_with("log.") {
            return false;
        }
        self.0.push(b',');
        value(self.0, name.strip_prefix("r#").unwrap_or(name));
        self.0.push(b':');
        true
    }
}

impl Visit for Members<'_> {
    fn record_f64(&mut self, field: &Field, v: f64) {
        if self.key(field) {
            // NaN and the infinities become null.
            value(self.0, &v);
        }
    }
    fn record_i64(&mut self, field: &Field, v: i64) {
        if self.key(field) {
            value(self.0, &v);
        }
    }
    fn record_u64(&mut self, field: &Field, v: u64) {
        if self.key(field) {
            value(self.0, &v);
        }
    }
    fn record_bool(&mut self, field: &Field, v: bool) {
        if self.key(field) {
            value(self.0, &v);
        }
    }
    fn record_str(&mut self, field: &Field, v: &str) {
        if self.key(field) {
            value(self.0, v);
        }
    }
    fn record_error(&mut self, field: &Field, v: &(dyn std::error::Error + 'static)) {
        if self.key(field) {
            value(self.0, &format_args!("{v}"));
        }
    }
    fn record_debug(&mut self, field: &Field, v: &dyn std::fmt::Debug) {
        if self.key(field) {
            value(self.0, &format_args!("{v:?}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_text_is_a_json_string_that_reads_back(text in any::<String>()) {
            let mut out = Vec::new();
            value(&mut out, &format_args!("{text}"));
            let back: String = serde_json::from_slice(&out).unwrap();
            prop_assert_eq!(back, text);
        }
    }

    /// An event naming its parent span carries that span, not the current
    /// one; an event's `log.*` fields stay on its line.
    #[test]
    fn an_events_own_parent_is_its_span() {
        use tracing_subscriber::layer::SubscriberExt as _;
        let buf = super::super::tests::Buf::default();
        let sink = buf.clone();
        let layer = tracing_subscriber::fmt::layer()
            .event_format(JsonLine)
            .fmt_fields(super::super::AppendJsonFields)
            .with_writer(move || sink.clone());
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
            let job = tracing::info_span!("aqw.job", key = "k-1");
            let _other = tracing::info_span!("aqw.other").entered();
            // As a `log` crate record arrives (tracing-log): its metadata
            // as `log.*` fields, which the line keeps.
            tracing::info!(parent: &job, event = "aqw.job.completed", n = 2u64,
                log.target = "rustls::conn", "done");
        });
        let out = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let line: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(line["span"]["name"], "aqw.job", "{out}");
        assert_eq!(line["span"]["key"], "k-1", "{out}");
        assert_eq!(line["log.target"], "rustls::conn", "{out}");
        assert_eq!(
            (line["message"].as_str(), line["n"].as_u64()),
            (Some("done"), Some(2))
        );
    }

    #[test]
    fn floats_that_json_cannot_hold_are_null() {
        let mut out = Vec::new();
        value(&mut out, &f64::NAN);
        value(&mut out, &0.5);
        assert_eq!(out, b"null0.5");
    }
}
