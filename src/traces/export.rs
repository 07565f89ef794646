//! Where spans go, chosen by the environment the way the ecosystem does it:
//!
//! - **OTLP** when `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
//!   `OTEL_EXPORTER_OTLP_ENDPOINT` is set (or `OTEL_TRACES_EXPORTER=otlp`,
//!   which means `http://localhost:4318`). HTTP with protobuf by default,
//!   JSON with `OTEL_EXPORTER_OTLP_PROTOCOL=http/json`; gRPC is not built in
//!   (it would bring tonic and a second HTTP/2 stack) and is refused with a
//!   clear error. Headers, timeout and compression come from the standard
//!   `OTEL_EXPORTER_OTLP_*` variables, read by `opentelemetry-otlp`; the
//!   service from `OTEL_SERVICE_NAME` / `OTEL_RESOURCE_ATTRIBUTES` (default
//!   `aqw`).
//! - **Application Insights** when `APPLICATIONINSIGHTS_CONNECTION_STRING`
//!   is set, as a Functions app already has it: the maintained
//!   `opentelemetry-application-insights` exporter, to the connection
//!   string's `IngestionEndpoint`. The job span is a request, its steps are
//!   dependencies.
//! - Both may be set: spans go to both. Neither, or `OTEL_SDK_DISABLED=true`,
//!   or `OTEL_TRACES_EXPORTER=none`: nothing is installed.
//!
//! Export never blocks or fails a job: spans wait in the SDK's bounded batch
//! queue (`OTEL_BSP_MAX_QUEUE_SIZE`, 2048) and are dropped when it is full;
//! the export runs on the SDK's own thread through aqw's reqwest client
//! (connect timeout 2 s, the OTLP timeout overall), and a failing collector
//! costs a warning a minute, never a job.

use super::client::ExportClient;
use super::set_enabled;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use std::time::Duration;

/// One place spans are sent.
#[derive(Clone, PartialEq, Eq)]
pub enum ExportTarget {
    Otlp {
        json: bool,
        /// Scheme, host, port and path (no user info, no query) for messages.
        shown: String,
        timeout: Duration,
        /// The signal's URL, for aqw's own `http/protobuf` encoder
        /// ([`super::otlp`]); `None` leaves the export to opentelemetry-otlp
        /// (`http/json`, or a compression setting).
        native: Option<String>,
    },
    AppInsights {
        /// Holds the instrumentation key: never printed.
        connection_string: String,
        shown: String,
        /// `IngestionEndpoint` kept as written when it is plain HTTP on
        /// loopback (a local agent or test receiver); the exporter would
        /// otherwise upgrade it to HTTPS, as the Azure SDKs do.
        loopback_http: Option<String>,
    },
}

impl std::fmt::Debug for ExportTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl ExportTarget {
    /// What a log line or `--help` may say about it.
    pub fn describe(&self) -> String {
        match self {
            Self::Otlp { json, shown, .. } => format!(
                "OTLP/HTTP ({}) to {shown}",
                if *json { "json" } else { "protobuf" }
            ),
            Self::AppInsights { shown, .. } => format!("Application Insights at {shown}"),
        }
    }
}

fn shown(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.set_query(None);
            u.to_string()
        }
        Err(_) => "(an invalid URL)".into(),
    }
}

/// The export targets the environment asks for. `get` reads one variable
/// (empty counts as unset). Errors name the variable, never its secret.
pub fn targets_from_env(get: impl Fn(&str) -> Option<String>) -> Result<Vec<ExportTarget>, String> {
    let get = |k: &str| get(k).filter(|v| !v.trim().is_empty());
    if get("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Ok(vec![]);
    }
    let exporter = get("OTEL_TRACES_EXPORTER").map(|v| v.to_ascii_lowercase());
    if exporter.as_deref() == Some("none") {
        return Ok(vec![]);
    }
    let mut targets = Vec::new();
    let endpoint = get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .map(|e| (e, false))
        .or_else(|| get("OTEL_EXPORTER_OTLP_ENDPOINT").map(|e| (e, true)));
    if endpoint.is_some() || exporter.as_deref() == Some("otlp") {
        targets.push(otlp_target(&get, endpoint)?);
    }
    if let Some(cs) = get("APPLICATIONINSIGHTS_CONNECTION_STRING") {
        targets.push(app_insights_target(cs)?);
    }
    Ok(targets)
}

/// OTLP/HTTP: `endpoint` is the signal's own URL (`false`) or the base that
/// `/v1/traces` is appended to (`true`), as the OTLP exporter spec says.
fn otlp_target(
    get: &impl Fn(&str) -> Option<String>,
    endpoint: Option<(String, bool)>,
) -> Result<ExportTarget, String> {
    let protocol = get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|| get("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .unwrap_or_else(|| "http/protobuf".into());
    let json = match protocol.as_str() {
        "http/protobuf" => false,
        "http/json" => true,
        "grpc" => return Err("OTEL_EXPORTER_OTLP_PROTOCOL=grpc: aqw exports OTLP over HTTP only; use http/protobuf (the collector's port 4318)".into()),
        other => return Err(format!("OTEL_EXPORTER_OTLP_PROTOCOL={other:?}: expected http/protobuf or http/json")),
    };
    let (base, is_base) = endpoint.unwrap_or(("http://localhost:4318".into(), true));
    if url::Url::parse(&base).is_err() {
        return Err("the OTLP endpoint (OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT) is not a URL".into());
    }
    let full = if is_base {
        format!("{}/v1/traces", base.trim_end_matches('/'))
    } else {
        base
    };
    let timeout = get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
        .or_else(|| get("OTEL_EXPORTER_OTLP_TIMEOUT"))
        .map(|ms| {
            ms.trim()
                .parse::<u64>()
                .map(Duration::from_millis)
                .map_err(|_| format!("OTEL_EXPORTER_OTLP_TIMEOUT={ms:?}: expected milliseconds"))
        })
        .transpose()?
        .unwrap_or(Duration::from_secs(10));
    let compressed = get("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION")
        .or_else(|| get("OTEL_EXPORTER_OTLP_COMPRESSION"))
        .is_some_and(|c| c.trim() != "none");
    Ok(ExportTarget::Otlp {
        json,
        shown: shown(&full),
        timeout,
        native: (!json && !compressed).then_some(full),
    })
}

/// Application Insights from its connection string (never shown: it holds
/// the instrumentation key).
fn app_insights_target(cs: String) -> Result<ExportTarget, String> {
    let field = |name: &str| {
        cs.split(';').find_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    };
    if field("InstrumentationKey").is_none_or(|k| k.is_empty()) {
        return Err("APPLICATIONINSIGHTS_CONNECTION_STRING has no InstrumentationKey".into());
    }
    let ingestion =
        field("IngestionEndpoint").unwrap_or_else(|| "https://dc.services.visualstudio.com".into());
    let loopback_http = url::Url::parse(&ingestion)
        .ok()
        .filter(|u| u.scheme() == "http")
        .filter(|u| match u.host() {
            Some(url::Host::Domain(d)) => d == "localhost",
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
            None => false,
        })
        .map(|u| u.to_string());
    Ok(ExportTarget::AppInsights {
        connection_string: cs,
        shown: shown(&ingestion),
        loopback_http,
    })
}

/// Flushes and shuts the exporters down when dropped (at most a few
/// seconds: a dead collector must not hold the process at exit).
#[must_use]
pub struct TracesGuard(Option<SdkTracerProvider>);

impl TracesGuard {
    pub fn off() -> Self {
        Self(None)
    }

    pub fn provider(&self) -> Option<&SdkTracerProvider> {
        self.0.as_ref()
    }
}

impl Drop for TracesGuard {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            set_enabled(false);
            let _ = p.shutdown_with_timeout(Duration::from_secs(3));
        }
    }
}

/// `AQW_TRACE_STORAGE`: whether storage requests get spans of their own
/// (see [`super::storage_spans`]). Unset: no.
pub fn storage_spans_from_env(get: impl Fn(&str) -> Option<String>) -> Result<bool, String> {
    match get("AQW_TRACE_STORAGE").as_deref().map(str::trim) {
        None | Some("") => Ok(false),
        Some(v) if v.eq_ignore_ascii_case("true") || v == "1" => Ok(true),
        Some(v) if v.eq_ignore_ascii_case("false") || v == "0" => Ok(false),
        Some(v) => Err(format!("AQW_TRACE_STORAGE={v:?}: expected true or false")),
    }
}

/// OTLP/HTTP: aqw's own `http/protobuf` encoder when `native` names the
/// URL ([`super::otlp`]), else opentelemetry-otlp's exporter.
fn otlp_exporter(
    builder: opentelemetry_sdk::trace::TracerProviderBuilder,
    json: bool,
    timeout: Duration,
    native: Option<&str>,
) -> Result<opentelemetry_sdk::trace::TracerProviderBuilder, String> {
    use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
    let client = ExportClient::new("otlp", timeout)?;
    if let Some(url) = native {
        let headers = super::otlp::headers_from_env(|k| std::env::var(k).ok())?;
        let exporter = super::otlp::OtlpProtobuf::new(client, url.to_string(), headers);
        return Ok(builder.with_batch_exporter(exporter));
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(if json {
            Protocol::HttpJson
        } else {
            Protocol::HttpBinary
        })
        .with_http_client(client)
        .build()
        .map_err(|e| format!("cannot set up the OTLP exporter: {e}"))?;
    Ok(builder.with_batch_exporter(exporter))
}

/// Build the tracer provider for `targets` (none: off, nothing built).
pub fn install(targets: &[ExportTarget]) -> Result<TracesGuard, String> {
    if targets.is_empty() {
        return Ok(TracesGuard::off());
    }
    let mut builder = SdkTracerProvider::builder().with_resource(resource());
    for t in targets {
        builder = match t {
            ExportTarget::Otlp {
                json,
                timeout,
                native,
                ..
            } => otlp_exporter(builder, *json, *timeout, native.as_deref())?,
            ExportTarget::AppInsights {
                connection_string,
                loopback_http,
                ..
            } => {
                let client = ExportClient::new("appinsights", Duration::from_secs(10))?;
                let invalid = |_| {
                    "APPLICATIONINSIGHTS_CONNECTION_STRING is not a valid connection string"
                        .to_string()
                };
                let mut exporter =
                    opentelemetry_application_insights::Exporter::new_from_connection_string(
                        connection_string,
                        client,
                    )
                    .map_err(invalid)?;
                // Deprecated upstream in favour of the connection string,
                // whose parser upgrades every endpoint to HTTPS.
                #[allow(deprecated)]
                if let Some(endpoint) = loopback_http {
                    exporter = exporter.with_endpoint(endpoint).map_err(invalid)?;
                }
                builder.with_batch_exporter(exporter)
            }
        };
    }
    set_enabled(true);
    Ok(TracesGuard(Some(builder.build())))
}

/// The service: `OTEL_SERVICE_NAME` / `OTEL_RESOURCE_ATTRIBUTES` when set
/// (the SDK reads them), else `aqw`.
fn resource() -> Resource {
    let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|v| !v.is_empty())
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| v.contains("service.name="));
    let mut r = Resource::builder().with_attribute(opentelemetry::KeyValue::new(
        "service.version",
        env!("CARGO_PKG_VERSION"),
    ));
    if !named {
        r = r.with_service_name("aqw");
    }
    r.build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn targets(vars: &[(&str, &str)]) -> Result<Vec<ExportTarget>, String> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        targets_from_env(|k| m.get(k).cloned())
    }

    #[test]
    fn storage_spans_are_asked_for_by_name() {
        let with = |v: Option<&str>| {
            storage_spans_from_env(|k| {
                (k == "AQW_TRACE_STORAGE")
                    .then(|| v.map(String::from))
                    .flatten()
            })
        };
        assert_eq!(with(None), Ok(false));
        assert_eq!(with(Some("true")), Ok(true));
        assert_eq!(with(Some("1")), Ok(true));
        assert_eq!(with(Some("FALSE")), Ok(false));
        assert!(with(Some("yes")).unwrap_err().contains("AQW_TRACE_STORAGE"));
    }

    #[test]
    fn nothing_set_means_nothing_exported() {
        assert_eq!(targets(&[]).unwrap(), vec![]);
        assert_eq!(
            targets(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_SDK_DISABLED", "true")
            ])
            .unwrap(),
            vec![]
        );
        assert_eq!(
            targets(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_TRACES_EXPORTER", "none")
            ])
            .unwrap(),
            vec![]
        );
    }

    #[test]
    fn otlp_endpoints_follow_the_spec() {
        let t = targets(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://user:pw@c:4318/")]).unwrap();
        assert_eq!(
            t[0].describe(),
            "OTLP/HTTP (protobuf) to http://c:4318/v1/traces"
        );
        let t = targets(&[
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://c:9/custom?sig=secret",
            ),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ])
        .unwrap();
        assert_eq!(t[0].describe(), "OTLP/HTTP (json) to http://c:9/custom");
        let t = targets(&[("OTEL_TRACES_EXPORTER", "otlp")]).unwrap();
        assert_eq!(
            t[0].describe(),
            "OTLP/HTTP (protobuf) to http://localhost:4318/v1/traces"
        );
        let e = targets(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ])
        .unwrap_err();
        assert!(e.contains("4318"), "{e}");
        assert!(targets(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "5s")
        ])
        .is_err());
        assert!(targets(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "not a url")]).is_err());
    }

    #[test]
    fn app_insights_errors_never_show_the_key() {
        let cs = "InstrumentationKey=00000000-1111-2222-3333-444444444444;IngestionEndpoint=https://westeurope-5.in.applicationinsights.azure.com/";
        let t = targets(&[("APPLICATIONINSIGHTS_CONNECTION_STRING", cs)]).unwrap();
        let shown = format!("{t:?}");
        assert!(shown.contains("westeurope-5"), "{shown}");
        assert!(!shown.contains("4444"), "{shown}");
        let e = targets(&[(
            "APPLICATIONINSIGHTS_CONNECTION_STRING",
            "IngestionEndpoint=https://x/;Secret=s3",
        )])
        .unwrap_err();
        assert!(!e.contains("s3"), "{e}");
        let both = targets(&[
            ("APPLICATIONINSIGHTS_CONNECTION_STRING", cs),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
        ])
        .unwrap();
        assert_eq!(both.len(), 2);
    }
}
