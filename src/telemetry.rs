//! Logs, metrics and the poison alert webhook.
//!
//! Secrets never reach a log line: [`scrub`] removes account keys, SAS
//! signatures, `Authorization` values and bearer tokens, and the log writer
//! runs every line through it as a last line of defence.

use regex::Regex;
use serde_json::json;
use std::collections::HashMap;
use std::io::Write;
use std::sync::OnceLock;
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
    Text,
    Json,
}

/// Install the global tracing subscriber (idempotent). `AQW_LOG` / `RUST_LOG`
/// set the filter; the SDK's own debug lines stay off by default.
pub fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    // An explicit AQW_LOG / RUST_LOG is taken as is (the SDK's own debug lines
    // included: the scrubbing writer still guards them); the default keeps the
    // SDK at warn.
    let filter = match std::env::var("AQW_LOG").or_else(|_| std::env::var("RUST_LOG")) {
        Ok(f) => EnvFilter::try_new(f).unwrap_or_else(|_| EnvFilter::new("info")),
        Err(_) => EnvFilter::new("info,azure_core=warn,azure_identity=warn,azure_storage_queue=warn,typespec_client_core=warn,reqwest=warn,hyper=warn"),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| ScrubbingStderr)
        .with_target(false);
    let _ = match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
    };
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
    pub function: String,
    pub message_id: String,
    pub key: Option<String>,
    pub error_kind: String,
    pub error: String,
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
    pub fn start(webhook: Option<url::Url>, window: Duration) -> Self {
        let Some(webhook) = webhook else {
            return Self::disabled();
        };
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
            "message moved to {}-poison",
            alert.queue
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
    webhook: url::Url,
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
            let first = &batch[0];
            let body = json!({
                "event": "aqw.poison.new",
                "severity": "error",
                "queue": queue,
                "poisonQueue": format!("{queue}-poison"),
                "count": batch.len(),
                "function": first.function,
                "messageId": first.message_id,
                "key": first.key,
                "errorKind": first.error_kind,
                "error": scrub(&first.error),
                "messageIds": batch.iter().map(|a| a.message_id.clone()).collect::<Vec<_>>(),
                "hint": format!("aqw poison list {queue}"),
            });
            let client = client.clone();
            let url = webhook.clone();
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
        let key = crate::config::DEV_KEY;
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
}
