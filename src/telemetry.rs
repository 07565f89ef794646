//! Logs, metrics and the poison alert webhook.
//!
//! Secrets never reach a log line: [`scrub`] removes account keys, SAS
//! signatures, `Authorization` values and bearer tokens, and the log writer
//! runs every line through it as a last line of defence.

use regex::Regex;
use serde_json::json;
use std::collections::HashMap;
use std::io::Write;
use std::sync::{LazyLock, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

fn patterns() -> &'static [(Regex, &'static str)] {
    static P: OnceLock<Vec<(Regex, &'static str)>> = OnceLock::new();
    P.get_or_init(|| {
        vec![
            (Regex::new(r"(?i)(AccountKey\s*=\s*)[^;\s]+").unwrap(), "${1}***"),
            (Regex::new(r"(?i)(SharedAccessSignature\s*=\s*)[^;\s]+").unwrap(), "${1}***"),
            (Regex::new(r"(?i)([?&;]sig=)[^&\s;]+").unwrap(), "${1}***"),
            (Regex::new(r"(?i)(authorization[\x22']?\s*[:=]\s*[\x22']?)(Bearer|SharedKey|Basic)?\s*[^\s\x22',]+").unwrap(), "${1}***"),
            (Regex::new(r"(?i)(bearer\s+)[A-Za-z0-9\-._~+/]+=*").unwrap(), "${1}***"),
            // A SharedKey signature wherever it appears (the SDK's debug lines
            // print headers in Debug form, not as "Authorization: ...").
            (Regex::new(r"(SharedKey(?:Lite)?\s+[A-Za-z0-9]+:)[A-Za-z0-9+/=]+").unwrap(), "${1}***"),
            // A bare storage account key: 64 bytes in base64.
            (Regex::new(r"[A-Za-z0-9+/]{86}==").unwrap(), "***"),
        ]
    })
}

/// Remove secrets from text bound for a log line, an error or a record.
pub fn scrub(text: &str) -> String {
    let mut out = std::borrow::Cow::Borrowed(text);
    for (re, rep) in patterns() {
        if re.is_match(&out) {
            out = std::borrow::Cow::Owned(re.replace_all(&out, *rep).into_owned());
        }
    }
    out.into_owned()
}

/// Log writer that scrubs every formatted event before it reaches stderr.
struct ScrubbingStderr;

impl Write for ScrubbingStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        std::io::stderr().write_all(scrub(&text).as_bytes())?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
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
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::filter::FilterExt as _;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{filter::Targets, EnvFilter, Layer, Registry};
    // An explicit AQW_LOG / RUST_LOG is taken as is (the SDK's own debug lines
    // included: the scrubbing writer still guards them); the default keeps the
    // SDK at warn.
    let filter = match std::env::var("AQW_LOG").or_else(|_| std::env::var("RUST_LOG")) {
        Ok(f) => EnvFilter::try_new(f).unwrap_or_else(|_| EnvFilter::new("info")),
        Err(_) => EnvFilter::new("info,azure_core=warn,azure_identity=warn,azure_storage_queue=warn,typespec_client_core=warn,reqwest=warn,hyper=warn"),
    };
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(|| ScrubbingStderr)
        .with_target(false);
    let fmt: Box<dyn Layer<Registry> + Send + Sync> = match format {
        LogFormat::Json => fmt
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .boxed(),
        // https://no-color.org: any non-empty NO_COLOR turns colour off.
        LogFormat::Text => fmt
            .with_ansi(
                std::io::IsTerminal::is_terminal(&std::io::stderr())
                    && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
            )
            .boxed(),
    };
    // The step spans (`aqw.key.claim`, `aqw.storage`, ...) exist only while
    // exporting, for the exporter: the log lines stay as they are with export
    // off, and the fmt layer does not format every step's fields.
    let without_step_spans = tracing_subscriber::filter::filter_fn(|m| {
        !m.is_span() || m.name() == "aqw.job" || !m.name().starts_with("aqw.")
    });
    let otel = traces.map(|p| {
        // No per-span busy/idle timing (it costs a clock read at every poll
        // of an instrumented future), thread or source-location attributes:
        // each is work on every span of every job that nobody reads in a
        // job trace (bench (g) measures the rest).
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("aqw"))
            .with_tracked_inactivity(false)
            .with_threads(false)
            .with_location(false)
            .with_filter(Targets::new().with_target("aqw", tracing::Level::INFO))
    });
    let _ = tracing_subscriber::registry()
        .with(fmt.with_filter(filter.and(without_step_spans)))
        .with(otel)
        .try_init();
}

/// The process-wide Prometheus recorder (installed on first use).
pub fn metrics_handle() -> &'static metrics_exporter_prometheus::PrometheusHandle {
    static H: OnceLock<metrics_exporter_prometheus::PrometheusHandle> = OnceLock::new();
    H.get_or_init(|| {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new()
            .set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Full("aqw_handler_duration_seconds".into()),
                &[
                    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                ],
            )
            .expect("static buckets")
            .build_recorder();
        let handle = recorder.handle();
        // Another recorder may already be installed (tests): then ours only renders.
        let _ = metrics::set_global_recorder(recorder);
        handle
    })
}

/// A new poison record, for the alert.
#[derive(Debug, Clone)]
pub struct PoisonAlert {
    pub queue: String,
    /// `<queue>-poison` (named by the poison path, which owns the naming).
    pub poison_queue: String,
    pub function: String,
    pub message_id: String,
    pub key: Option<String>,
    pub error_kind: String,
    pub error: String,
    pub poisoned_at: time::OffsetDateTime,
}

/// The error text an alert groups by: an HTTP status code if the text has
/// one, and the first line with ids, numbers and times masked, so the same
/// outage in ten messages is one group and a 404 is not hidden among 503s.
pub fn error_group(error: &str) -> (Option<u16>, String) {
    static STATUS: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"(?i)\b(?:HTTP|status)\W{0,3}([1-5]\d\d)\b").unwrap());
    static MASK: LazyLock<Regex> = LazyLock::new(|| {
        // Any word with a digit in it: counts, times, request and message ids.
        Regex::new(r"[\w-]*\d[\w-]*").unwrap()
    });
    let first = scrub(error.lines().next().unwrap_or("").trim());
    let status = STATUS
        .captures(&first)
        .and_then(|c| c[1].parse::<u16>().ok());
    let mut masked = MASK.replace_all(&first, "#").to_string();
    if let Some(code) = status {
        // Keep the status code itself readable.
        masked = STATUS_MASKED
            .replace(&masked, format!("HTTP {code}").as_str())
            .to_string();
    }
    let masked: String = masked.chars().take(160).collect();
    (status, masked)
}

static STATUS_MASKED: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?i)\b(?:HTTP|status)\W{0,3}#").unwrap());

/// The webhook body (and the ERROR log summary) for one queue's window:
/// counts grouped by error kind and error text, each group with samples and
/// the command that lists it.
pub fn alert_body(queue: &str, batch: &[PoisonAlert]) -> serde_json::Value {
    struct Group<'a> {
        kind: &'a str,
        status: Option<u16>,
        text: String,
        count: usize,
        ids: Vec<&'a str>,
        keys: Vec<&'a str>,
    }
    const SAMPLES: usize = 5;
    let mut groups: Vec<Group> = Vec::new();
    for a in batch {
        let (status, text) = error_group(&a.error);
        let g = match groups
            .iter_mut()
            .position(|g| g.kind == a.error_kind && g.text == text)
        {
            Some(i) => &mut groups[i],
            None => {
                groups.push(Group {
                    kind: &a.error_kind,
                    status,
                    text,
                    count: 0,
                    ids: vec![],
                    keys: vec![],
                });
                groups.last_mut().expect("just pushed")
            }
        };
        g.count += 1;
        if g.ids.len() < SAMPLES {
            g.ids.push(&a.message_id);
        }
        if let Some(k) = &a.key {
            if g.keys.len() < SAMPLES && !g.keys.contains(&k.as_str()) {
                g.keys.push(k);
            }
        }
    }
    groups.sort_by(|a, b| b.count.cmp(&a.count).then(a.text.cmp(&b.text)));
    let mut functions: Vec<&str> = batch.iter().map(|a| a.function.as_str()).collect();
    functions.sort();
    functions.dedup();
    let fmt = |t: time::OffsetDateTime| {
        t.format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default()
    };
    let first = batch.iter().map(|a| a.poisoned_at).min();
    let last = batch.iter().map(|a| a.poisoned_at).max();
    json!({
        "event": "aqw.poison.new",
        "severity": "error",
        "queue": queue,
        "poisonQueue": batch.first().map(|a| a.poison_queue.clone()),
        "count": batch.len(),
        "function": functions.join(","),
        "firstPoisonedAt": first.map(fmt),
        "lastPoisonedAt": last.map(fmt),
        "groups": groups.iter().map(|g| json!({
            "count": g.count,
            "errorKind": g.kind,
            "status": g.status,
            "error": g.text,
            "messageIds": g.ids,
            "keys": g.keys,
        })).collect::<Vec<_>>(),
        "next": format!("aqw poison list {queue} --status open"),
        "hint": format!("read each group with `aqw poison list {queue} --status open`, then `aqw poison show {queue} ID`; replay once the cause is fixed, discard a job that must never run"),
        // The first record, kept for receivers written against the old body.
        "messageId": batch.first().map(|a| a.message_id.clone()),
    })
}

/// Sends poison alerts to the webhook without ever blocking the worker: at
/// most one POST per queue per window, carrying how many records it covers,
/// retried with backoff.
#[derive(Clone)]
pub struct Alerts {
    tx: Option<mpsc::UnboundedSender<PoisonAlert>>,
}

impl Alerts {
    pub fn disabled() -> Self {
        Self { tx: None }
    }

    /// Start the sender task (needs a tokio runtime).
    /// The window summary is logged (ERROR `aqw.poison.alert`) with or
    /// without a webhook.
    pub fn start(webhook: Option<url::Url>, window: Duration) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(alert_loop(webhook, window, rx));
        Self { tx: Some(tx) }
    }

    /// Log the stable ERROR event and queue the webhook POST.
    pub fn poisoned(&self, alert: PoisonAlert) {
        tracing::error!(
            event = "aqw.poison.new",
            queue = %alert.queue,
            function = %alert.function,
            message_id = %alert.message_id,
            key = alert.key.as_deref().unwrap_or(""),
            error_kind = %alert.error_kind,
            error = %scrub(&alert.error),
            "message moved to {}",
            alert.poison_queue
        );
        if let Some(tx) = &self.tx {
            let _ = tx.send(alert);
        }
    }
}

struct QueueWindow {
    last_sent: Option<Instant>,
    pending: Vec<PoisonAlert>,
}

async fn alert_loop(
    webhook: Option<url::Url>,
    window: Duration,
    mut rx: mpsc::UnboundedReceiver<PoisonAlert>,
) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap_or_default();
    let mut windows: HashMap<String, QueueWindow> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            msg = rx.recv() => match msg {
                Some(a) => windows.entry(a.queue.clone()).or_insert(QueueWindow { last_sent: None, pending: vec![] }).pending.push(a),
                None => break,
            },
            _ = tick.tick() => {}
        }
        for (queue, w) in windows.iter_mut() {
            let due = w.last_sent.is_none_or(|t| t.elapsed() >= window);
            if w.pending.is_empty() || !due {
                continue;
            }
            let batch = std::mem::take(&mut w.pending);
            w.last_sent = Some(Instant::now());
            let body = alert_body(queue, &batch);
            tracing::error!(
                event = "aqw.poison.alert",
                queue = %queue,
                count = batch.len(),
                groups = %body["groups"],
                next = %body["next"].as_str().unwrap_or_default(),
                "{} message(s) poisoned on {queue} in this window",
                batch.len()
            );
            let Some(webhook) = webhook.clone() else {
                continue;
            };
            let client = client.clone();
            let url = webhook;
            tokio::spawn(async move {
                let mut delay = Duration::from_millis(500);
                for attempt in 1..=6 {
                    match client.post(url.clone()).json(&body).send().await {
                        Ok(r) if r.status().is_success() => return,
                        Ok(r) => tracing::warn!(
                            event = "aqw.alert.failed",
                            attempt,
                            status = r.status().as_u16(),
                            "alert webhook refused the alert"
                        ),
                        Err(_) => tracing::warn!(
                            event = "aqw.alert.failed",
                            attempt,
                            "alert webhook unreachable"
                        ),
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(30));
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrub_removes_secrets() {
        let key = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
        let cases = [
            format!(
                "DefaultEndpointsProtocol=https;AccountName=a;AccountKey={key};EndpointSuffix=x"
            ),
            "GET https://a.queue.core.windows.net/q?sv=2022&sig=abc%2Bdef%3D&se=1".to_string(),
            "Authorization: SharedKey devstoreaccount1:c2lnbmF0dXJl".to_string(),
            r#"HeaderName("authorization"): HeaderValue("SharedKey devstoreaccount1:c2lnbmF0dXJl=")"#.to_string(),
            "authorization=Bearer eyJhbGciOi.payload.sig".to_string(),
            "token bearer eyJhbGciOiJIUzI1NiJ9.e30.abc".to_string(),
            format!("the key is {key}"),
            "SharedAccessSignature=sv=2022&sig=zzz".to_string(),
        ];
        for c in cases {
            let s = scrub(&c);
            assert!(!s.contains(key), "{s}");
            assert!(!s.contains("abc%2Bdef"), "{s}");
            assert!(!s.contains("c2lnbmF0dXJl"), "{s}");
            assert!(!s.contains("eyJhbGciOi"), "{s}");
            assert!(!s.contains("zzz"), "{s}");
        }
        assert_eq!(scrub("plain text, no secrets"), "plain text, no secrets");
    }

    fn alert(id: &str, key: Option<&str>, kind: &str, error: &str, at: i64) -> PoisonAlert {
        PoisonAlert {
            queue: "credits".into(),
            poison_queue: "credits-poison".into(),
            function: "GrantCredit".into(),
            message_id: id.into(),
            key: key.map(str::to_string),
            error_kind: kind.into(),
            error: error.into(),
            poisoned_at: time::OffsetDateTime::from_unix_timestamp(1_800_000_000 + at).unwrap(),
        }
    }

    #[test]
    fn a_mixed_window_is_grouped_by_cause_not_reported_as_its_first_record() {
        let batch = [
            alert(
                "m1",
                Some("credits:acct-closed:2026"),
                "permanent",
                "HTTP 404 Not Found: account acct-closed is closed",
                0,
            ),
            alert(
                "m2",
                Some("credits:a1:2026"),
                "retryable",
                "HTTP 503 Service Unavailable (request 5b2c)\nbody: ledger down",
                1,
            ),
            alert(
                "m3",
                Some("credits:a2:2026"),
                "retryable",
                "HTTP 503 Service Unavailable (request 77f1)",
                2,
            ),
            alert(
                "m4",
                Some("credits:a3:2026"),
                "timeout",
                "handler exceeded functionTimeout (10s)",
                3,
            ),
            alert("m5", None, "permanent", "key field /acountId is missing", 4),
            alert(
                "m6",
                Some("credits:a4:2026"),
                "retryable",
                "HTTP 503 Service Unavailable (request 9a0e)",
                5,
            ),
        ];
        let body = alert_body("credits", &batch);
        assert_eq!(body["count"], 6);
        assert_eq!(body["function"], "GrantCredit");
        assert_eq!(body["firstPoisonedAt"], "2027-01-15T08:00:00Z");
        assert_eq!(body["lastPoisonedAt"], "2027-01-15T08:00:05Z");
        assert_eq!(body["next"], "aqw poison list credits --status open");
        let groups = body["groups"].as_array().unwrap();
        assert_eq!(groups.len(), 4, "{groups:#?}");
        // The biggest group first: the three 503s, whatever their request ids.
        assert_eq!(groups[0]["count"], 3);
        assert_eq!(groups[0]["status"], 503);
        assert_eq!(groups[0]["errorKind"], "retryable");
        assert_eq!(groups[0]["messageIds"], json!(["m2", "m3", "m6"]));
        assert_eq!(
            groups[0]["keys"],
            json!(["credits:a1:2026", "credits:a2:2026", "credits:a4:2026"])
        );
        assert!(groups[0]["error"]
            .as_str()
            .unwrap()
            .starts_with("HTTP 503 Service Unavailable"));
        let closed = groups.iter().find(|g| g["status"] == 404).unwrap();
        assert_eq!(closed["count"], 1);
        assert_eq!(closed["keys"], json!(["credits:acct-closed:2026"]));
        let missing = groups
            .iter()
            .find(|g| g["error"].as_str().unwrap().contains("/acountId"))
            .unwrap();
        assert_eq!(missing["keys"], json!([]));
        assert_eq!(missing["messageIds"], json!(["m5"]));
    }

    #[test]
    fn error_groups_keep_the_status_and_mask_what_varies() {
        assert_eq!(
            error_group("HTTP 503 at 2026-12-03T10:00:00Z, retry 3 of 5"),
            (Some(503), "HTTP 503 at #:#:#, retry # of #".to_string())
        );
        assert_eq!(error_group("status: 429 too many").0, Some(429));
        assert_eq!(error_group("smtp timeout").0, None);
        let (_, t) = error_group("sig=abc%2Bdef secret AccountKey=zzz;");
        assert!(!t.contains("zzz") && !t.contains("abc%2Bdef"), "{t}");
    }
}
