//! The JSON log line, written straight into one buffer.
//!
//! The same line tracing-subscriber's JSON format writes with
//! `flatten_event(true)`, `with_current_span(true)`, no target and no span
//! list: `timestamp`, `level`, the event's fields in their order, then
//! `span`, the current span's fields and its `name`. Why our own: the stock
//! formatter parses the span's stored fields back into a map and writes
//! them again on every line, and sends every piece of the line (each quote,
//! colon and key) through an `io::Write` adaptor that checks it is UTF-8;
//! together some 35 k instructions per `aqw run` job, a sixth of all that
//! is ours (callgrind, bench/profile.md round five). The span's fields are
//! stored as a JSON object with no key twice ([`super::AppendJsonFields`]),
//! so they are copied as they are.

use std::fmt::Write as _;
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
        let mut line = String::with_capacity(512);
        line.push_str("{\"timestamp\":\"");
        tracing_subscriber::fmt::time::SystemTime.format_time(&mut Writer::new(&mut line))?;
        line.push_str("\",\"level\":\"");
        line.push_str(event.metadata().level().as_str());
        line.push('"');
        event.record(&mut super::LogFieldsOnly(&mut Members(&mut line)));
        // The event's own parent when it names one, else the current span,
        // as tracing-subscriber's JSON format chooses.
        let span = event
            .parent()
            .and_then(|id| ctx.span(id))
            .or_else(|| ctx.lookup_current());
        if let Some(span) = span {
            line.push_str(",\"span\":{");
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
                line.push_str(members);
                line.push(',');
            }
            line.push_str("\"name\":");
            push_str_value(&mut line, span.name());
            line.push('}');
        }
        line.push_str("}\n");
        writer.write_str(&line)
    }
}

/// Writes each field as `,"name":value`.
pub(crate) struct Members<'a>(pub &'a mut String);

impl Members<'_> {
    fn key(&mut self, field: &Field) -> bool {
        let name = field.name();
        // Fields of `log` records are the event's metadata, not its data.
        if name.starts_with("log.") {
            return false;
        }
        self.0.push(',');
        push_str_value(self.0, name.strip_prefix("r#").unwrap_or(name));
        self.0.push(':');
        true
    }
}

impl Visit for Members<'_> {
    fn record_f64(&mut self, field: &Field, value: f64) {
        if self.key(field) {
            match serde_json::Number::from_f64(value) {
                Some(n) => write!(self.0, "{n}").unwrap_or_default(),
                None => self.0.push_str("null"),
            }
        }
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        if self.key(field) {
            write!(self.0, "{value}").unwrap_or_default();
        }
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        if self.key(field) {
            write!(self.0, "{value}").unwrap_or_default();
        }
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        if self.key(field) {
            self.0.push_str(if value { "true" } else { "false" });
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if self.key(field) {
            push_str_value(self.0, value);
        }
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        if self.key(field) {
            push_str_value(self.0, &value.to_string());
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if self.key(field) {
            push_str_value(self.0, &format!("{value:?}"));
        }
    }
}

/// `value` as a JSON string (RFC 8259 escaping: `"`, `\` and the control
/// characters).
pub(crate) fn push_str_value(out: &mut String, value: &str) {
    out.reserve(value.len() + 2);
    out.push('"');
    let mut start = 0;
    for (i, b) in value.bytes().enumerate() {
        let escape = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0..=0x1f => "",
            _ => continue,
        };
        out.push_str(&value[start..i]);
        if escape.is_empty() {
            write!(out, "\\u{b:04x}").unwrap_or_default();
        } else {
            out.push_str(escape);
        }
        start = i + 1;
    }
    out.push_str(&value[start..]);
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_text_is_a_json_string_that_reads_back(text in any::<String>()) {
            let mut out = String::new();
            push_str_value(&mut out, &text);
            let back: String = serde_json::from_str(&out).unwrap();
            prop_assert_eq!(back, text);
        }
    }

    /// An event naming its parent span carries that span, not the current one.
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
            tracing::info!(parent: &job, event = "aqw.job.completed", n = 2u64, "done");
        });
        let out = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let line: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(line["span"]["name"], "aqw.job", "{out}");
        assert_eq!(line["span"]["key"], "k-1", "{out}");
        assert_eq!(
            (line["message"].as_str(), line["n"].as_u64()),
            (Some("done"), Some(2))
        );
    }

    #[test]
    fn control_characters_are_escaped() {
        let mut out = String::new();
        push_str_value(&mut out, "a\"b\\c\nd\u{1}e");
        assert_eq!(out, r#""a\"b\\c\nd\u0001e""#);
    }
}
