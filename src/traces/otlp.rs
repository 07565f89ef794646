//! OTLP/HTTP protobuf export, encoded straight from the SDK's span data.
//!
//! Why not opentelemetry-otlp's exporter for `http/protobuf`: it groups a
//! batch by resource and scope by cloning every `SpanData`
//! (opentelemetry-proto `group_spans_by_resource_and_scope`), converts the
//! copy into the generated message types (a `String` per attribute key and
//! value), encodes those with prost, then drops both: about 60 k
//! instructions per `aqw run` job, over half of what exporting costs
//! (callgrind, bench/profile.md round five). This writes the same
//! `ExportTraceServiceRequest` (opentelemetry-proto `trace/v1/trace.proto`,
//! `common/v1/common.proto`, fields in number order, defaults left out as
//! proto3 does, oneof members always written) from the borrowed batch in
//! one buffer, sized first. tests/traces.rs decodes it with prost, and the
//! unit test below checks it against opentelemetry-proto's own conversion.
//! `http/json`, or a compression setting, keeps the SDK's exporter.

use super::client::ExportClient;
use opentelemetry::trace::{SpanId, SpanKind, Status};
use opentelemetry::{Array, InstrumentationScope, KeyValue, Value};
use opentelemetry_http::HttpClient;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use opentelemetry_sdk::Resource;
use std::time::SystemTime;

/// The `http/protobuf` exporter: one POST per batch to `url`.
#[derive(Debug)]
pub(crate) struct OtlpProtobuf {
    pub(crate) client: ExportClient,
    pub(crate) url: String,
    /// `OTEL_EXPORTER_OTLP_[TRACES_]HEADERS` (they may hold a token).
    pub(crate) headers: http::HeaderMap,
    resource: Vec<KeyValue>,
    resource_schema: String,
}

impl OtlpProtobuf {
    pub(crate) fn new(client: ExportClient, url: String, headers: http::HeaderMap) -> Self {
        Self {
            client,
            url,
            headers,
            resource: Vec::new(),
            resource_schema: String::new(),
        }
    }
}

impl SpanExporter for OtlpProtobuf {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let body = encode_request(&self.resource, &self.resource_schema, &batch);
        let mut request = http::Request::post(self.url.as_str())
            .header(http::header::CONTENT_TYPE, "application/x-protobuf")
            .body(bytes::Bytes::from(body))
            .map_err(|_| OTelSdkError::InternalFailure("the OTLP endpoint is not a URI".into()))?;
        request.headers_mut().extend(self.headers.clone());
        match self.client.send_bytes(request).await {
            Ok(rsp) if rsp.status().is_success() => Ok(()),
            Ok(rsp) => Err(OTelSdkError::InternalFailure(format!(
                "OTLP export answered HTTP {}",
                rsp.status()
            ))),
            Err(e) => Err(OTelSdkError::InternalFailure(e.to_string())),
        }
    }

    fn set_resource(&mut self, resource: &Resource) {
        (self.resource, self.resource_schema) = resource_parts(resource);
    }
}

/// A resource's attributes and schema URL, kept for every export.
fn resource_parts(resource: &Resource) -> (Vec<KeyValue>, String) {
    let attrs = resource
        .iter()
        .map(|(k, v)| KeyValue::new(k.clone(), v.clone()))
        .collect();
    (attrs, resource.schema_url().unwrap_or_default().to_string())
}

/// `OTEL_EXPORTER_OTLP_HEADERS`, then `OTEL_EXPORTER_OTLP_TRACES_HEADERS`
/// over it: `key=value` pairs, comma-separated, values percent-encoded (the
/// OTLP exporter spec). An invalid pair is a configuration error naming the
/// variable and the key, never the value (often a token).
pub(crate) fn headers_from_env(
    get: impl Fn(&str) -> Option<String>,
) -> Result<http::HeaderMap, String> {
    let mut headers = http::HeaderMap::new();
    for var in [
        "OTEL_EXPORTER_OTLP_HEADERS",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    ] {
        let Some(list) = get(var) else { continue };
        for pair in list.split(',').filter(|p| !p.trim().is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let key = key.trim();
            let invalid = || format!("{var}: the header {key:?} is not a valid key=value pair");
            let value = percent_encoding::percent_decode_str(value.trim())
                .decode_utf8()
                .map_err(|_| invalid())?;
            let name = http::HeaderName::from_bytes(key.as_bytes()).map_err(|_| invalid())?;
            let value = http::HeaderValue::from_str(&value).map_err(|_| invalid())?;
            headers.insert(name, value);
        }
    }
    Ok(headers)
}

/// `ExportTraceServiceRequest`: one `ResourceSpans`, one `ScopeSpans` per
/// instrumentation scope (in the order they first appear).
pub(crate) fn encode_request(resource: &[KeyValue], schema: &str, batch: &[SpanData]) -> Vec<u8> {
    let mut scopes: Vec<(&InstrumentationScope, Vec<&SpanData>)> = Vec::new();
    for span in batch {
        match scopes
            .iter_mut()
            .find(|(s, _)| *s == &span.instrumentation_scope)
        {
            Some((_, spans)) => spans.push(span),
            None => scopes.push((&span.instrumentation_scope, vec![span])),
        }
    }
    let span_lens: Vec<Vec<usize>> = scopes
        .iter()
        .map(|(_, spans)| spans.iter().map(|s| span_len(s)).collect())
        .collect();
    let scope_lens: Vec<usize> = scopes
        .iter()
        .zip(&span_lens)
        .map(|((scope, _), lens)| scope_spans_len(scope, lens))
        .collect();
    let resource_len = attrs_len(1, resource);
    let resource_spans_len = field_len(1, resource_len)
        + scope_lens.iter().map(|l| field_len(2, *l)).sum::<usize>()
        + str_len(3, schema);
    let mut out = Vec::with_capacity(field_len(1, resource_spans_len));
    len_field(&mut out, 1, resource_spans_len);
    len_field(&mut out, 1, resource_len);
    put_attrs(&mut out, 1, resource);
    for (((scope, spans), lens), scope_len) in scopes.iter().zip(&span_lens).zip(&scope_lens) {
        len_field(&mut out, 2, *scope_len);
        len_field(&mut out, 1, scope_len_of(scope));
        put_scope(&mut out, scope);
        for (span, len) in spans.iter().zip(lens) {
            len_field(&mut out, 2, *len);
            put_span(&mut out, span);
        }
        put_str(&mut out, 3, scope.schema_url().unwrap_or_default());
    }
    put_str(&mut out, 3, schema);
    out
}

// --- wire format (protobuf encoding: varints, tags, length-delimited) ---

const VARINT: u32 = 0;
const FIXED64: u32 = 1;
const LEN: u32 = 2;
const FIXED32: u32 = 5;

fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn tag_len(field: u32) -> usize {
    varint_len(u64::from(field << 3))
}

fn put_tag(out: &mut Vec<u8>, field: u32, wire: u32) {
    put_varint(out, u64::from((field << 3) | wire));
}

/// A length-delimited field of `len` bytes, tag and length included.
fn field_len(field: u32, len: usize) -> usize {
    tag_len(field) + varint_len(len as u64) + len
}

fn len_field(out: &mut Vec<u8>, field: u32, len: usize) {
    put_tag(out, field, LEN);
    put_varint(out, len as u64);
}

fn str_len(field: u32, s: &str) -> usize {
    if s.is_empty() {
        0
    } else {
        field_len(field, s.len())
    }
}

fn put_str(out: &mut Vec<u8>, field: u32, s: &str) {
    if !s.is_empty() {
        len_field(out, field, s.len());
        out.extend_from_slice(s.as_bytes());
    }
}

fn uint_len(field: u32, v: u64) -> usize {
    if v == 0 {
        0
    } else {
        tag_len(field) + varint_len(v)
    }
}

fn put_uint(out: &mut Vec<u8>, field: u32, v: u64) {
    if v != 0 {
        put_tag(out, field, VARINT);
        put_varint(out, v);
    }
}

fn fixed64_len(field: u32, v: u64) -> usize {
    if v == 0 {
        0
    } else {
        tag_len(field) + 8
    }
}

fn put_fixed64(out: &mut Vec<u8>, field: u32, v: u64) {
    if v != 0 {
        put_tag(out, field, FIXED64);
        out.extend_from_slice(&v.to_le_bytes());
    }
}

// --- common.proto: AnyValue, KeyValue, InstrumentationScope ---

/// One array element or plain value.
enum Scalar<'a> {
    Bool(bool),
    Int(i64),
    Double(f64),
    Str(&'a str),
}

fn scalars(a: &Array) -> Vec<Scalar<'_>> {
    match a {
        Array::Bool(v) => v.iter().map(|b| Scalar::Bool(*b)).collect(),
        Array::I64(v) => v.iter().map(|i| Scalar::Int(*i)).collect(),
        Array::F64(v) => v.iter().map(|f| Scalar::Double(*f)).collect(),
        Array::String(v) => v.iter().map(|s| Scalar::Str(s.as_str())).collect(),
        _ => Vec::new(),
    }
}

/// An `AnyValue`'s body: its oneof member, written even when it is the
/// default (a oneof has presence).
fn scalar_len(s: &Scalar<'_>) -> usize {
    match s {
        Scalar::Bool(b) => tag_len(2) + varint_len(u64::from(*b)),
        Scalar::Int(i) => tag_len(3) + varint_len(*i as u64),
        Scalar::Double(_) => tag_len(4) + 8,
        Scalar::Str(s) => field_len(1, s.len()),
    }
}

fn put_scalar(out: &mut Vec<u8>, s: &Scalar<'_>) {
    match s {
        Scalar::Bool(b) => {
            put_tag(out, 2, VARINT);
            put_varint(out, u64::from(*b));
        }
        Scalar::Int(i) => {
            put_tag(out, 3, VARINT);
            put_varint(out, *i as u64);
        }
        Scalar::Double(d) => {
            put_tag(out, 4, FIXED64);
            out.extend_from_slice(&d.to_le_bytes());
        }
        Scalar::Str(s) => {
            len_field(out, 1, s.len());
            out.extend_from_slice(s.as_bytes());
        }
    }
}

fn as_scalar(v: &Value) -> Option<Scalar<'_>> {
    match v {
        Value::Bool(b) => Some(Scalar::Bool(*b)),
        Value::I64(i) => Some(Scalar::Int(*i)),
        Value::F64(f) => Some(Scalar::Double(*f)),
        Value::String(s) => Some(Scalar::Str(s.as_str())),
        _ => None,
    }
}

fn any_value_len(v: &Value) -> usize {
    match (as_scalar(v), v) {
        (Some(s), _) => scalar_len(&s),
        (None, Value::Array(a)) => field_len(5, array_len(a)),
        _ => 0,
    }
}

fn array_len(a: &Array) -> usize {
    scalars(a).iter().map(|s| field_len(1, scalar_len(s))).sum()
}

fn put_any_value(out: &mut Vec<u8>, v: &Value) {
    match (as_scalar(v), v) {
        (Some(s), _) => put_scalar(out, &s),
        (None, Value::Array(a)) => {
            len_field(out, 5, array_len(a));
            for s in scalars(a) {
                len_field(out, 1, scalar_len(&s));
                put_scalar(out, &s);
            }
        }
        _ => {}
    }
}

fn key_value_len(kv: &KeyValue) -> usize {
    str_len(1, kv.key.as_str()) + field_len(2, any_value_len(&kv.value))
}

/// Repeated `KeyValue` as field `field`.
fn attrs_len(field: u32, attrs: &[KeyValue]) -> usize {
    attrs
        .iter()
        .map(|kv| field_len(field, key_value_len(kv)))
        .sum()
}

fn put_attrs(out: &mut Vec<u8>, field: u32, attrs: &[KeyValue]) {
    for kv in attrs {
        len_field(out, field, key_value_len(kv));
        put_str(out, 1, kv.key.as_str());
        len_field(out, 2, any_value_len(&kv.value));
        put_any_value(out, &kv.value);
    }
}

fn scope_attrs(scope: &InstrumentationScope) -> Vec<KeyValue> {
    scope.attributes().cloned().collect()
}

fn scope_len_of(scope: &InstrumentationScope) -> usize {
    str_len(1, scope.name())
        + str_len(2, scope.version().unwrap_or_default())
        + attrs_len(3, &scope_attrs(scope))
}

fn put_scope(out: &mut Vec<u8>, scope: &InstrumentationScope) {
    put_str(out, 1, scope.name());
    put_str(out, 2, scope.version().unwrap_or_default());
    put_attrs(out, 3, &scope_attrs(scope));
}

// --- trace.proto: ScopeSpans, Span, Event, Link, Status ---

fn scope_spans_len(scope: &InstrumentationScope, span_lens: &[usize]) -> usize {
    field_len(1, scope_len_of(scope))
        + span_lens.iter().map(|l| field_len(2, *l)).sum::<usize>()
        + str_len(3, scope.schema_url().unwrap_or_default())
}

fn nanos(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn kind(k: &SpanKind) -> u64 {
    match k {
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
        SpanKind::Producer => 4,
        SpanKind::Consumer => 5,
    }
}

/// `SpanFlags`: the trace flags, "has is-remote", and "is remote".
fn flags(parent_is_remote: bool, trace_flags: u8) -> u32 {
    u32::from(trace_flags) | 0x100 | if parent_is_remote { 0x200 } else { 0 }
}

fn status_parts(s: &Status) -> (u64, &str) {
    match s {
        Status::Unset => (0, ""),
        Status::Ok => (1, ""),
        Status::Error { description } => (2, description.as_ref()),
    }
}

fn status_len(s: &Status) -> usize {
    let (code, message) = status_parts(s);
    str_len(2, message) + uint_len(3, code)
}

fn event_len(e: &opentelemetry::trace::Event) -> usize {
    fixed64_len(1, nanos(e.timestamp))
        + str_len(2, &e.name)
        + attrs_len(3, &e.attributes)
        + uint_len(4, u64::from(e.dropped_attributes_count))
}

fn link_len(l: &opentelemetry::trace::Link) -> usize {
    let cx = &l.span_context;
    field_len(1, 16)
        + field_len(2, 8)
        + str_len(3, &cx.trace_state().header())
        + attrs_len(4, &l.attributes)
        + uint_len(5, u64::from(l.dropped_attributes_count))
        + tag_len(6)
        + 4
}

fn span_len(s: &SpanData) -> usize {
    let cx = &s.span_context;
    let parent = s.parent_span_id != SpanId::INVALID;
    field_len(1, 16)
        + field_len(2, 8)
        + str_len(3, &cx.trace_state().header())
        + if parent { field_len(4, 8) } else { 0 }
        + str_len(5, &s.name)
        + uint_len(6, kind(&s.span_kind))
        + fixed64_len(7, nanos(s.start_time))
        + fixed64_len(8, nanos(s.end_time))
        + attrs_len(9, &s.attributes)
        + uint_len(10, u64::from(s.dropped_attributes_count))
        + s.events
            .iter()
            .map(|e| field_len(11, event_len(e)))
            .sum::<usize>()
        + uint_len(12, u64::from(s.events.dropped_count))
        + s.links
            .iter()
            .map(|l| field_len(13, link_len(l)))
            .sum::<usize>()
        + uint_len(14, u64::from(s.links.dropped_count))
        + field_len(15, status_len(&s.status))
        + tag_len(16)
        + 4
}

fn put_span(out: &mut Vec<u8>, s: &SpanData) {
    let cx = &s.span_context;
    len_field(out, 1, 16);
    out.extend_from_slice(&cx.trace_id().to_bytes());
    len_field(out, 2, 8);
    out.extend_from_slice(&cx.span_id().to_bytes());
    put_str(out, 3, &cx.trace_state().header());
    if s.parent_span_id != SpanId::INVALID {
        len_field(out, 4, 8);
        out.extend_from_slice(&s.parent_span_id.to_bytes());
    }
    put_str(out, 5, &s.name);
    put_uint(out, 6, kind(&s.span_kind));
    put_fixed64(out, 7, nanos(s.start_time));
    put_fixed64(out, 8, nanos(s.end_time));
    put_attrs(out, 9, &s.attributes);
    put_uint(out, 10, u64::from(s.dropped_attributes_count));
    for e in s.events.iter() {
        len_field(out, 11, event_len(e));
        put_fixed64(out, 1, nanos(e.timestamp));
        put_str(out, 2, &e.name);
        put_attrs(out, 3, &e.attributes);
        put_uint(out, 4, u64::from(e.dropped_attributes_count));
    }
    put_uint(out, 12, u64::from(s.events.dropped_count));
    for l in s.links.iter() {
        let lcx = &l.span_context;
        len_field(out, 13, link_len(l));
        len_field(out, 1, 16);
        out.extend_from_slice(&lcx.trace_id().to_bytes());
        len_field(out, 2, 8);
        out.extend_from_slice(&lcx.span_id().to_bytes());
        put_str(out, 3, &lcx.trace_state().header());
        put_attrs(out, 4, &l.attributes);
        put_uint(out, 5, u64::from(l.dropped_attributes_count));
        put_tag(out, 6, FIXED32);
        let f = flags(lcx.is_remote(), lcx.trace_flags().to_u8());
        out.extend_from_slice(&f.to_le_bytes());
    }
    put_uint(out, 14, u64::from(s.links.dropped_count));
    let (code, message) = status_parts(&s.status);
    len_field(out, 15, status_len(&s.status));
    put_str(out, 2, message);
    put_uint(out, 3, code);
    put_tag(out, 16, FIXED32);
    let f = flags(s.parent_span_is_remote, cx.trace_flags().to_u8());
    out.extend_from_slice(&f.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{Event, Link, SpanContext, TraceFlags, TraceId, TraceState};
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
    use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
    use prost::Message;
    use std::time::Duration;

    fn attributes() -> Vec<KeyValue> {
        vec![
            KeyValue::new("key", "order:o-1 \"quoted\" é"),
            KeyValue::new("dequeue_count", 3i64),
            KeyValue::new("negative", -2i64),
            KeyValue::new("ratio", 0.5),
            KeyValue::new("zero", 0i64),
            KeyValue::new("empty", ""),
            KeyValue::new("flag", false),
            KeyValue::new(
                "list",
                Value::Array(Array::String(vec!["a".into(), "b".into()])),
            ),
        ]
    }

    fn span(scope: &InstrumentationScope, n: u8, parent: bool) -> SpanData {
        let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_765_000_000_000 + u64::from(n));
        let cx = |s: u8, remote| {
            SpanContext::new(
                TraceId::from_bytes([7; 16]),
                SpanId::from_bytes([s; 8]),
                TraceFlags::SAMPLED,
                remote,
                TraceState::from_key_value([("vendor", "a1")]).unwrap(),
            )
        };
        SpanData {
            span_context: cx(n, false),
            parent_span_id: if parent {
                SpanId::from_bytes([9; 8])
            } else {
                SpanId::INVALID
            },
            parent_span_is_remote: parent,
            span_kind: [SpanKind::Consumer, SpanKind::Client, SpanKind::Internal]
                [usize::from(n % 3)]
            .clone(),
            name: format!("aqw.step{n}").into(),
            start_time: at,
            end_time: at + Duration::from_micros(1500),
            attributes: attributes(),
            dropped_attributes_count: u32::from(n),
            events: {
                let mut e = opentelemetry_sdk::trace::SpanEvents::default();
                e.events = vec![Event::new(
                    "warn",
                    at,
                    vec![KeyValue::new("error", "HTTP 503")],
                    1,
                )];
                e.dropped_count = 2;
                e
            },
            links: {
                let mut l = opentelemetry_sdk::trace::SpanLinks::default();
                l.links = vec![Link::new(
                    cx(3, true),
                    vec![KeyValue::new("poison.id", "p-1")],
                    0,
                )];
                l
            },
            status: if n.is_multiple_of(2) {
                Status::error("HTTP 503: busy")
            } else {
                Status::Unset
            },
            instrumentation_scope: scope.clone(),
        }
    }

    fn resource() -> Resource {
        Resource::builder()
            .with_service_name("aqw")
            .with_attribute(KeyValue::new("service.version", "9.9.9"))
            .build()
    }

    /// What opentelemetry-otlp would send for the same batch, decoded.
    fn theirs(batch: Vec<SpanData>, resource: &Resource) -> ExportTraceServiceRequest {
        ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(
                batch,
                &ResourceAttributesWithSchema::from(resource),
            ),
        }
    }

    fn ours(batch: &[SpanData], resource: &Resource) -> ExportTraceServiceRequest {
        let (attrs, schema) = resource_parts(resource);
        ExportTraceServiceRequest::decode(encode_request(&attrs, &schema, batch).as_slice())
            .expect("prost decodes what we encode")
    }

    #[test]
    fn the_request_is_opentelemetry_protos_own() {
        let scope = InstrumentationScope::builder("aqw")
            .with_version("1.2.3")
            .build();
        let batch: Vec<SpanData> = (0..5).map(|n| span(&scope, n, n > 0)).collect();
        let r = resource();
        assert_eq!(ours(&batch, &r), theirs(batch, &r));
    }

    #[test]
    fn spans_of_two_scopes_go_in_two_scope_spans() {
        let a = InstrumentationScope::builder("aqw").build();
        let b = InstrumentationScope::builder("other")
            .with_schema_url("https://x/1")
            .build();
        let batch = vec![span(&a, 1, true), span(&b, 2, false), span(&a, 3, true)];
        let r = resource();
        let (mut ours, mut theirs) = (ours(&batch, &r), theirs(batch, &r));
        // The SDK's grouping goes through a HashMap: compare in name order.
        for req in [&mut ours, &mut theirs] {
            req.resource_spans[0].scope_spans.sort_by(|x, y| {
                x.scope
                    .as_ref()
                    .unwrap()
                    .name
                    .cmp(&y.scope.as_ref().unwrap().name)
            });
        }
        assert_eq!(ours, theirs);
        assert_eq!(ours.resource_spans[0].scope_spans[0].spans.len(), 2);
    }

    #[test]
    fn varints_are_as_long_as_their_value_needs() {
        for v in [
            0u64,
            1,
            127,
            128,
            16_383,
            16_384,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(out.len(), varint_len(v), "{v}");
        }
    }

    #[test]
    fn headers_come_from_both_variables_the_traces_one_winning() {
        let vars = |general: &'static str, traces: &'static str| {
            move |k: &str| match k {
                "OTEL_EXPORTER_OTLP_HEADERS" => Some(general.to_string()),
                "OTEL_EXPORTER_OTLP_TRACES_HEADERS" => Some(traces.to_string()),
                _ => None,
            }
        };
        let h = headers_from_env(vars("api-key=s3cret%20one, x-team=a", "x-team=b")).unwrap();
        assert_eq!(h["api-key"], "s3cret one");
        assert_eq!(h["x-team"], "b");
        let e = headers_from_env(vars("bad key=t0ken", "")).unwrap_err();
        assert!(
            e.contains("OTEL_EXPORTER_OTLP_HEADERS") && !e.contains("t0ken"),
            "{e}"
        );
    }
}
