//! The `azure_core` 1.x pipeline aqw's queue, table and blob clients share:
//! transport, retry options and the account-key / SAS authorization policies.
//!
//! * [`CountingTransport`]: the pipeline's `HttpClient`, one pooled client
//!   ([`super::transport`]: hyper, or reqwest behind a proxy; rustls on
//!   ring, where `azure_core`'s own reqwest 0.13 transport would pull in
//!   aws-lc) that counts every request by operation and status.
//! * [`SharedKeyPolicy`] (in [`super::shared_key`]): `azure_storage_queue` and
//!   `azure_storage_blob` 1.x take only Entra ID tokens or a SAS in the URL,
//!   and there is no 1.x Tables crate, so account keys are
//!   signed here, per try (after the retry policy, so every retry carries a
//!   fresh `x-ms-date`). The canonicalization is the one the 0.21 SDK used
//!   against Azure and Azurite (azure-sdk-for-rust
//!   `sdk/storage/src/authorization/authorization_policy.rs`, 0.21 line:
//!   `string_to_sign`, `canonicalize_header`, `canonicalized_resource`,
//!   `canonicalized_resource_table`), which follows "Authorize with Shared Key"
//!   (learn.microsoft.com/rest/api/storageservices/authorize-with-shared-key):
//!   queues sign the 12-line SharedKey string (Content-Length empty when 0,
//!   all `x-ms-*` headers sorted, `/account/path` plus every query parameter
//!   lowercased and sorted); tables sign the Table-service SharedKey string
//!   (`VERB`, `Content-MD5`, `Content-Type`, `x-ms-date`, `/account/path`).
//!   Azurite checks the same strings (Azurite `src/queue/authentication/
//!   QueueSharedKeyAuthenticator.ts`, `src/table/authentication/
//!   TableSharedKeyAuthenticator.ts`), including the path-style
//!   `/devstoreaccount1/devstoreaccount1/...` resource.
//! * [`SasPolicy`]: appends the connection string's SAS to each request URL.
//!
//! The key and the SAS never reach a log line or an error: the policies hold
//! them in [`Secret`]s, errors are mapped to status and code only
//! (`azure::map_err`), and `azure_core`'s logging policy redacts the
//! `Authorization` header and every query parameter outside its allow-list
//! (`sig` is not on it).

use super::transport::{error_chain, Incoming, Outgoing, SendError, Transport, BODY_LIMIT_HEADER};
use super::{Secret, StorageError};
use async_trait::async_trait;
use azure_core::error::{Error, ErrorKind};
use azure_core::http::headers::{HeaderName, HeaderValue, Headers};
use azure_core::http::policies::{Policy, PolicyResult};
use azure_core::http::{AsyncRawResponse, Body, Context, HttpClient, Method, Request};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};
use tracing::Instrument;

pub use super::shared_key::{Service, SharedKeyPolicy};

/// Counts requests by operation and status, then hands them to the wire
/// ([`super::transport`]).
#[derive(Debug)]
pub struct CountingTransport {
    /// Built on the first request: a connection that is only validated
    /// (`aqw run`'s preflight, `--dry-run`s, a bench probe) never sends
    /// anything, and the TLS roots load on the first client built.
    client: OnceLock<Transport>,
    counts: Arc<Mutex<BTreeMap<String, u64>>>,
}

impl CountingTransport {
    pub fn new(counts: Arc<Mutex<BTreeMap<String, u64>>>) -> Result<Self, String> {
        Ok(Self {
            client: OnceLock::new(),
            counts,
        })
    }

    /// The pooled client, built on first use.
    fn http(&self) -> azure_core::Result<&Transport> {
        if let Some(c) = self.client.get() {
            return Ok(c);
        }
        let built = Transport::from_env(super::transport::STORAGE)
            .map_err(|e| Error::with_message(ErrorKind::Io, e))?;
        Ok(self.client.get_or_init(|| built))
    }
}

/// The request header by which the blob clients mark their requests
/// (`blobs::BlobRequests`), for the counting transport to name them: the
/// blob and queue crates send the same `x-ms-version`. Taken off the
/// request before the wire, like [`BODY_LIMIT_HEADER`].
pub(crate) const BLOB_REQUEST_HEADER: &str = "x-aqw-blob";

/// A blob request's name for the counting transport.
pub(crate) fn blob_operation(method: Method, url: &url::Url) -> &'static str {
    let query = url.query().unwrap_or("");
    match method {
        _ if query.contains("restype=container") && !query.contains("comp=list") => "blob.admin",
        Method::Get if query.contains("comp=list") => "blob.list",
        Method::Put if query.contains("comp=metadata") => "blob.update",
        Method::Put => "blob.put",
        Method::Get => "blob.get",
        Method::Delete => "blob.delete",
        _ => "blob.other",
    }
}

pub(crate) fn operation_name(method: Method, url: &url::Url) -> &'static str {
    use Method as M;
    let path = url.path();
    let query = url.query().unwrap_or("");
    let is_table_port =
        url.port() == Some(10002) || url.host_str().is_some_and(|h| h.contains(".table."));
    if path.ends_with("/messages") || path.contains("/messages/") {
        let with_id = path.contains("/messages/");
        return match (method, with_id) {
            (M::Get, _) if query.contains("peekonly=true") => "queue.peek",
            (M::Get, _) => "queue.receive",
            (M::Post, _) => "queue.put",
            (M::Put, true) => "queue.update",
            (M::Delete, true) => "queue.delete",
            (M::Delete, false) => "queue.clear",
            _ => "queue.other",
        };
    }
    if path.ends_with("$batch") {
        return "table.batch";
    }
    if path.ends_with("/Tables") || path.contains("/Tables(") {
        return "table.admin";
    }
    if path.ends_with("()") {
        return "table.query";
    }
    if path.contains("(PartitionKey=") {
        return match method {
            M::Get => "table.get",
            M::Put | M::Patch => "table.update",
            M::Delete => "table.delete",
            _ => "table.other",
        };
    }
    if matches!(method, M::Post) && (is_table_port || !query.contains("comp=")) {
        return "table.insert";
    }
    if query.contains("comp=metadata") {
        return "queue.metadata";
    }
    match method {
        M::Put => "queue.create",
        M::Delete => "queue.delete_queue",
        _ => "other",
    }
}

/// One storage request as a client span (OpenTelemetry HTTP conventions),
/// only while traces are exported. The URL loses its query: a SAS lives there.
fn storage_span(method: Method, op: &'static str, url: &url::Url) -> tracing::Span {
    if !aqw_core::traces::storage_spans() {
        return tracing::Span::none();
    }
    let mut shown = url.clone();
    shown.set_query(None);
    let method = http_method(method);
    aqw_core::step_span!(
        "aqw.storage",
        otel.kind = "client",
        otel.name = %format!("{method} {op}"),
        http.request.method = %method,
        server.address = url.host_str().unwrap_or_default(),
        server.port = url.port_or_known_default().unwrap_or_default(),
        url.full = %shown,
        aqw.storage.operation = op,
        http.response.status_code = tracing::field::Empty,
        error.type = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    )
}

fn http_method(m: Method) -> http::Method {
    match m {
        Method::Delete => http::Method::DELETE,
        Method::Get => http::Method::GET,
        Method::Head => http::Method::HEAD,
        Method::Patch => http::Method::PATCH,
        Method::Post => http::Method::POST,
        Method::Put => http::Method::PUT,
        _ => http::Method::GET,
    }
}

#[async_trait]
impl HttpClient for CountingTransport {
    async fn execute_request(&self, request: &Request) -> azure_core::Result<AsyncRawResponse> {
        let op = match find_header(request.headers(), BLOB_REQUEST_HEADER) {
            Some(_) => blob_operation(request.method(), request.url()),
            None => operation_name(request.method(), request.url()),
        };
        let body_limit =
            find_header(request.headers(), BODY_LIMIT_HEADER).and_then(|v| v.parse::<u64>().ok());
        let outgoing = outgoing(request)?;
        let http = self.http()?;
        let span = storage_span(request.method(), op, request.url());
        let sent = http.send_bounded(outgoing, body_limit);
        let result = sent.instrument(span.clone()).await;
        self.record_outcome(op, &span, result.as_ref().map(|r| r.status).ok());
        match result {
            Ok(rsp) => Ok(raw_response(rsp)),
            Err(SendError::Connect(text)) => Err(Error::with_message(
                ErrorKind::Connection,
                aqw_core::scrub::scrub(&text),
            )),
            Err(SendError::Io(text)) => Err(Error::with_message(
                ErrorKind::Io,
                aqw_core::scrub::scrub(&text),
            )),
            Err(SendError::TimedOut(after)) => Err(Error::with_message(
                ErrorKind::Io,
                format!("no complete response within {after:?}"),
            )),
            Err(SendError::Invalid(text)) => Err(Error::with_message(ErrorKind::Other, text)),
        }
    }
}

/// The pipeline's request as the wire's: method, URL, headers, body. A
/// header that is not valid HTTP is named, its value never (it could be
/// the `Authorization`).
fn outgoing(request: &Request) -> azure_core::Result<Outgoing<'_>> {
    let mut headers = http::HeaderMap::with_capacity(16);
    for (name, value) in request.headers().iter() {
        if matches!(name.as_str(), BODY_LIMIT_HEADER | BLOB_REQUEST_HEADER) {
            continue; // for the transport, not the service
        }
        let invalid = || {
            Error::with_message(
                ErrorKind::Other,
                format!("request header {} is not valid HTTP", name.as_str()),
            )
        };
        let name = request_header_name(name.as_str()).map_err(|_| invalid())?;
        let value = http::HeaderValue::from_str(value.as_str()).map_err(|_| invalid())?;
        headers.append(name, value);
    }
    let body = match request.body() {
        Body::Bytes(b) => b.clone(),
        #[allow(unreachable_patterns)]
        _ => {
            return Err(Error::with_message(
                ErrorKind::Other,
                "streamed request bodies are not used by aqw",
            ))
        }
    };
    Ok(Outgoing {
        method: http_method(request.method()),
        url: request.url().as_str(),
        headers,
        body,
    })
}

impl CountingTransport {
    /// One sent request on its span, in the metrics and in the
    /// per-operation counts; `status` is `None` when no response came.
    fn record_outcome(&self, op: &'static str, span: &tracing::Span, status: Option<u16>) {
        let label = match status {
            Some(s) => status_label(s),
            None => "error".into(),
        };
        if !span.is_none() {
            match status {
                Some(s) => {
                    span.record("http.response.status_code", s);
                    if s >= 400 {
                        span.record("otel.status_code", "error");
                    }
                }
                None => {
                    span.record("error.type", "transport");
                    span.record("otel.status_code", "error");
                }
            }
        }
        metrics::counter!("aqw_storage_requests_total", "operation" => op, "status" => label)
            .increment(1);
        let mut counts = self.counts.lock().unwrap();
        match counts.get_mut(op) {
            Some(n) => *n += 1,
            None => {
                counts.insert(op.to_string(), 1);
            }
        }
    }
}

/// A status as a metric label, without an allocation for the usual ones.
fn status_label(status: u16) -> std::borrow::Cow<'static, str> {
    match status {
        200 => "200".into(),
        201 => "201".into(),
        202 => "202".into(),
        204 => "204".into(),
        404 => "404".into(),
        409 => "409".into(),
        412 => "412".into(),
        500 => "500".into(),
        503 => "503".into(),
        other => other.to_string().into(),
    }
}

/// A request header's wire name, without an allocation for the ones the
/// pipeline sets on every request (`from_bytes` copies any name that is
/// not a standard one, such as every `x-ms-*`: 28 allocations per job).
fn request_header_name(name: &str) -> Result<http::HeaderName, http::header::InvalidHeaderName> {
    const KNOWN: &[&str] = &[
        "x-ms-version",
        "x-ms-date",
        "x-ms-client-request-id",
        "authorization",
        "user-agent",
        "content-type",
        "content-length",
        "accept",
        "dataserviceversion",
        "maxdataserviceversion",
        "if-match",
        "prefer",
    ];
    match KNOWN.iter().copied().find(|k| *k == name) {
        Some(k) => Ok(http::HeaderName::from_static(k)),
        None => http::HeaderName::from_bytes(name.as_bytes()),
    }
}

/// The response headers `azure_core` and aqw read, as static names: the
/// pipeline's `HeaderName::from(String)` lowercases into a second copy of
/// every name, for every response.
fn response_header_name(name: &str) -> HeaderName {
    const KNOWN: &[&str] = &[
        "content-length",
        "content-type",
        "date",
        "etag",
        "server",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "cache-control",
        "location",
        "preference-applied",
        "dataserviceversion",
        "retry-after",
        "retry-after-ms",
        "x-ms-retry-after-ms",
        "x-ms-request-id",
        "x-ms-client-request-id",
        "x-ms-version",
        "x-ms-error-code",
        "x-ms-popreceipt",
        "x-ms-time-next-visible",
        "x-ms-approximate-messages-count",
        "x-ms-continuation-nextpartitionkey",
        "x-ms-continuation-nextrowkey",
    ];
    match KNOWN.iter().copied().find(|k| *k == name) {
        Some(k) => HeaderName::from_static(k),
        None => HeaderName::from(name.to_owned()),
    }
}

/// A response as the pipeline's: status, the headers that are text, the body.
fn raw_response(rsp: Incoming) -> AsyncRawResponse {
    let mut headers = HashMap::with_capacity(rsp.headers.len());
    for (k, v) in &rsp.headers {
        if let Ok(v) = v.to_str() {
            headers.insert(
                response_header_name(k.as_str()),
                HeaderValue::from(v.to_owned()),
            );
        }
    }
    AsyncRawResponse::from_bytes(rsp.status.into(), Headers::from(headers), rsp.body)
}

/// A header's value, without `Headers::get_optional_str`: that one builds an
/// `azure_core::Error` for every absent header, and an error captures a
/// backtrace when `RUST_BACKTRACE` is set (measured: ~5 % of the worker's CPU
/// in SharedKey signing alone). `name` is lowercase, as stored.
pub(crate) fn find_header<'a>(h: &'a Headers, name: &str) -> Option<&'a str> {
    h.iter()
        .find(|(k, _)| k.as_str() == name)
        .map(|(_, v)| v.as_str())
}

/// Appends a SAS (the query string of a connection string's
/// `SharedAccessSignature`) to every request URL that has none yet.
pub struct SasPolicy {
    token: Secret,
}

impl std::fmt::Debug for SasPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SasPolicy(***)")
    }
}

impl SasPolicy {
    pub fn new(token: &Secret) -> Result<Self, String> {
        let pairs: Vec<(String, String)> = url::form_urlencoded::parse(token.expose().as_bytes())
            .into_owned()
            .collect();
        if !pairs.iter().any(|(k, _)| k == "sig") {
            return Err("the SAS token has no signature (sig)".into());
        }
        Ok(Self {
            token: token.clone(),
        })
    }
}

#[async_trait]
impl Policy for SasPolicy {
    async fn send(
        &self,
        ctx: &Context,
        request: &mut Request,
        next: &[Arc<dyn Policy>],
    ) -> PolicyResult {
        if !request.url().query_pairs().any(|(k, _)| k == "sig") {
            let pairs = url::form_urlencoded::parse(self.token.expose().as_bytes());
            request.url_mut().query_pairs_mut().extend_pairs(pairs);
        }
        next[0].send(ctx, request, &next[1..]).await
    }
}

/// A storage status and error code as a [`StorageError`].
pub(crate) fn status_error(status: u16, code: String) -> StorageError {
    match status {
        404 => StorageError::NotFound,
        409 if code != "QueueBeingDeleted" && code != "TableBeingDeleted" => StorageError::Conflict,
        412 => StorageError::PreconditionFailed,
        _ => StorageError::Http { status, code },
    }
}

/// Map an SDK error to [`StorageError`], keeping only status and error code:
/// SDK messages can carry URLs, and URLs can carry SAS signatures.
pub(crate) fn map_err(e: azure_core::Error) -> StorageError {
    match e.kind() {
        azure_core::error::ErrorKind::HttpResponse {
            status, error_code, ..
        } => status_error(u16::from(*status), error_code.clone().unwrap_or_default()),
        azure_core::error::ErrorKind::Io | azure_core::error::ErrorKind::Connection => {
            StorageError::Transport(aqw_core::scrub::scrub(&error_chain(&e)))
        }
        azure_core::error::ErrorKind::Credential => {
            StorageError::Other("credential error (check the connection setting)".into())
        }
        azure_core::error::ErrorKind::DataConversion => StorageError::Other(format!(
            "unexpected response from storage: {}",
            aqw_core::scrub::scrub(&e.to_string())
        )),
        _ => StorageError::Other(aqw_core::scrub::scrub(&e.to_string())),
    }
}

/// Send `request` through `pipeline` with its status checks skipped, and
/// turn a non-2xx answer into a [`StorageError`] carrying the service's
/// error code: the one send of our Tables client.
pub(crate) async fn send_checked(
    pipeline: &azure_core::http::Pipeline,
    request: &mut Request,
) -> Result<azure_core::http::RawResponse, StorageError> {
    let rsp = pipeline
        .send(
            &azure_core::http::Context::new(),
            request,
            Some(azure_core::http::PipelineSendOptions {
                skip_checks: true,
                ..Default::default()
            }),
        )
        .await
        .map_err(map_err)?;
    let status = u16::from(rsp.status());
    if (200..300).contains(&status) {
        return Ok(rsp);
    }
    Err(status_error(status, error_code(&rsp)))
}

/// The service's error code: the `x-ms-error-code` header, else a Tables
/// JSON body's `odata.error.code` (a Blob error body is XML: the header
/// always carries its code).
fn error_code(rsp: &azure_core::http::RawResponse) -> String {
    if let Some(c) = find_header(rsp.headers(), "x-ms-error-code") {
        return c.to_string();
    }
    serde_json::from_slice::<serde_json::Value>(rsp.body())
        .ok()
        .and_then(|v| {
            v.pointer("/odata.error/code")
                .and_then(serde_json::Value::as_str)
                .map(str::to_string)
        })
        .unwrap_or_default()
}

/// A fresh `x-ms-client-request-id`, set on each request so azure_core's
/// ClientRequestIdPolicy finds it without building an error for the absent
/// header (see [`find_header`]). From the thread's RNG: `Uuid::new_v4` asks
/// the kernel (a getrandom syscall) for every request.
pub(crate) fn client_request_id() -> String {
    uuid::Builder::from_random_bytes(rand::random())
        .into_uuid()
        .hyphenated()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of "Authorize with Shared Key" (Blob/Queue/File string):
    /// same layout, headers and resource as documented there.
    #[test]
    fn policies_do_not_print_secrets() {
        let key = Secret::new(crate::DEV_KEY);
        let p = SharedKeyPolicy::new("acct", &key, Service::Queue).unwrap();
        assert!(!format!("{p:?}").contains(crate::DEV_KEY));
        let sas = SasPolicy::new(&Secret::new("sv=2024&sig=c2VjcmV0")).unwrap();
        assert!(!format!("{sas:?}").contains("c2VjcmV0"));
    }

    #[test]
    fn request_header_names_are_the_wires_with_or_without_a_copy() {
        for name in [
            "x-ms-version",
            "authorization",
            "if-match",
            "x-ms-other",
            "content-md5",
        ] {
            let wire = http::HeaderName::from_bytes(name.as_bytes()).unwrap();
            assert_eq!(request_header_name(name).unwrap(), wire, "{name}");
        }
        assert!(request_header_name("bad name").is_err());
    }

    #[test]
    fn blob_requests_are_named_by_operation() {
        let u = |s: &str| url::Url::parse(s).unwrap();
        let op = |m, s| blob_operation(m, &u(s));
        assert_eq!(op(Method::Put, "http://h/a/c/q/x"), "blob.put");
        assert_eq!(op(Method::Get, "http://h/a/c/q/x"), "blob.get");
        assert_eq!(
            op(Method::Put, "http://h/a/c/q/x?comp=metadata"),
            "blob.update"
        );
        assert_eq!(op(Method::Delete, "http://h/a/c/q/x"), "blob.delete");
        assert_eq!(
            op(Method::Get, "http://h/a/c?comp=list&restype=container"),
            "blob.list"
        );
        assert_eq!(
            op(Method::Put, "http://h/a/c?restype=container"),
            "blob.admin"
        );
        assert_eq!(
            op(Method::Delete, "http://h/a/c?restype=container"),
            "blob.admin"
        );
    }
}
