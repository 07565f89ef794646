//! The trace exporters' HTTP client, shared by the OTLP encoder
//! ([`super::otlp`]) and the exporters chosen in [`super::export`]: its own
//! file, so neither of those imports the other.

use async_trait::async_trait;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tracing::warn;

/// The exporters' HTTP client: aqw's reqwest (one TLS stack), blocking,
/// because the SDK's batch thread runs the export with no async runtime.
/// Failures are counted and warned about at most once a minute.
#[derive(Debug)]
pub(crate) struct ExportClient {
    client: reqwest::blocking::Client,
    target: &'static str,
    last_warning: Mutex<Option<(Instant, u64)>>,
}

impl ExportClient {
    pub(crate) fn new(target: &'static str, timeout: Duration) -> Result<Self, String> {
        // reqwest's blocking client owns a runtime: build it off any async one.
        let client = std::thread::spawn(move || {
            aqw_azure::tls::blocking_client_builder()
                .connect_timeout(Duration::from_secs(2).min(timeout))
                .timeout(timeout)
                .build()
        })
        .join()
        .map_err(|_| "cannot build the trace exporter's HTTP client".to_string())?
        .map_err(|e| format!("cannot build the trace exporter's HTTP client: {e}"))?;
        Ok(Self {
            client,
            target,
            last_warning: Mutex::new(None),
        })
    }

    fn note(&self, result: &'static str, error: Option<String>) {
        metrics::counter!("aqw_trace_exports_total", "target" => self.target, "result" => result)
            .increment(1);
        let Some(error) = error else { return };
        let mut last = self.last_warning.lock().unwrap_or_else(|p| p.into_inner());
        let quiet = last.is_some_and(|(at, _)| at.elapsed() < Duration::from_secs(60));
        if quiet {
            if let Some((_, n)) = last.as_mut() {
                *n += 1;
            }
            return;
        }
        let suppressed = last.map(|(_, n)| n).unwrap_or(0);
        *last = Some((Instant::now(), 0));
        warn!(event = "aqw.traces.export_failed", target = self.target, error = %aqw_core::scrub::scrub(&error),
            failures_not_shown = suppressed,
            "trace export failed; spans wait in a bounded queue and are dropped when it is full (jobs are not affected)");
    }
}

#[async_trait]
impl HttpClient for ExportClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let sent = self
            .client
            .request(parts.method, parts.uri.to_string())
            .headers(parts.headers)
            .body(body.to_vec())
            .send();
        let rsp = match sent {
            Ok(r) => r,
            Err(e) => {
                // reqwest's text names the URL; keep the kind only.
                let what = if e.is_connect() {
                    "cannot connect"
                } else if e.is_timeout() {
                    "timed out"
                } else {
                    "request failed"
                };
                self.note("error", Some(format!("{}: {what}", self.target)));
                return Err(format!("{}: {what}", self.target).into());
            }
        };
        let status = rsp.status();
        let headers = rsp.headers().clone();
        let body = rsp.bytes().unwrap_or_default();
        if status.is_success() {
            self.note("ok", None);
        } else {
            self.note("rejected", Some(format!("{}: HTTP {status}", self.target)));
        }
        let mut out = Response::builder().status(status);
        if let Some(h) = out.headers_mut() {
            *h = headers;
        }
        Ok(out.body(body)?)
    }
}
