//! What every alert format shows: a poison event ([`PoisonAlert`]), its
//! window's records grouped by cause ([`group_alerts`]: error kind, HTTP
//! status, the error's first line with what varies masked), the window's
//! facts, and the commands and link an operator follows. The binary's
//! alert formats (generic, Slack, Teams) all render from here.
//!
//! [`Alerts`] is the engine's side of alerting: a handle that logs each
//! poison event and hands it, with breaker events, to whoever delivers
//! them (the binary's webhook task), without ever blocking a job.

use crate::scrub::scrub;
use regex::Regex;
use std::collections::BTreeMap;
use std::sync::LazyLock;
use std::time::Duration;
use tokio::sync::mpsc;
// tokio's clock: the gather and the window run on paused time in tests.
use tokio::time::Instant;

/// A new poison record, for the alert.
#[derive(Debug, Clone)]
pub struct PoisonAlert {
    /// The source queue the message was poisoned from.
    pub queue: String,
    /// `<queue>-poison` (named by the poison path, which owns the naming).
    pub poison_queue: String,
    /// The function whose handler ran the message.
    pub function: String,
    /// The poisoned message's id on the source queue.
    pub message_id: String,
    /// The message's idempotency key, if the function derives one.
    pub key: Option<String>,
    /// The kind of the last error (`retryable`, `permanent`, …), as a string.
    pub error_kind: String,
    /// The last error's text.
    pub error: String,
    /// When the message was poisoned.
    pub poisoned_at: time::OffsetDateTime,
    /// Some attempt of the job ended with its outcome unknown: the effect
    /// may have happened, whatever the last error was.
    pub uncertain: bool,
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

/// One cause in an alert window: how many records, and a few samples (the
/// first record first).
pub struct AlertGroup<'a> {
    /// The error kind the group's records share.
    pub kind: &'a str,
    /// The HTTP status code in the group's error text, if it has one.
    pub status: Option<u16>,
    /// The error's first line with what varies masked (see [`error_group`]):
    /// what the group is keyed on.
    pub text: String,
    /// The exact error of the group's first record (scrubbed of secrets,
    /// first line, at most 300 characters): what a person reads.
    pub example: String,
    /// How many records of the window fall in the group.
    pub count: usize,
    /// Up to five sample message ids, the first record first.
    pub ids: Vec<&'a str>,
    /// Up to five distinct sample keys.
    pub keys: Vec<&'a str>,
    /// Records of the group with an uncertain attempt, all of them named.
    pub uncertain_ids: Vec<&'a str>,
}

/// A window's records grouped by cause, the biggest group first.
pub fn group_alerts(batch: &[PoisonAlert]) -> Vec<AlertGroup<'_>> {
    const SAMPLES: usize = 5;
    let mut groups: Vec<AlertGroup> = Vec::new();
    for a in batch {
        let (status, text) = error_group(&a.error);
        let i = match groups
            .iter()
            .position(|g| g.kind == a.error_kind && g.text == text)
        {
            Some(i) => i,
            None => {
                groups.push(AlertGroup {
                    kind: &a.error_kind,
                    status,
                    text,
                    example: crate::scrub::printable(&scrub(
                        a.error.lines().next().unwrap_or("").trim(),
                    ))
                    .chars()
                    .take(300)
                    .collect(),
                    count: 0,
                    ids: vec![],
                    keys: vec![],
                    uncertain_ids: vec![],
                });
                groups.len() - 1
            }
        };
        let g = &mut groups[i];
        g.count += 1;
        if a.uncertain {
            g.uncertain_ids.push(&a.message_id);
        }
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
    groups
}

/// The command every alert names first: the queue's open records grouped
/// by cause, with the next commands (`aqw triage`).
pub fn triage_command(queue: &str) -> String {
    format!("aqw triage {queue}")
}

/// The runbook an alert links: `aqw.alert.runbookUrl` when set, else the
/// command that prints the runbook embedded in the aqw binary, of the
/// binary's own version (`aqw oncall [KIND]`). Never a web address that is
/// not the operator's own.
pub fn runbook_link(configured: Option<&url::Url>, kind: Option<&str>) -> String {
    match (configured, kind) {
        (Some(u), _) => u.to_string(),
        (None, Some(k)) => format!("aqw oncall {k}"),
        (None, None) => "aqw oncall".to_string(),
    }
}

/// The command that shows one record.
pub fn show_command(queue: &str, id: &str) -> String {
    format!("aqw poison show {queue} {id}")
}

/// The command that lists a queue's open records.
pub fn list_command(queue: &str) -> String {
    format!("aqw poison list {queue} --status open")
}

/// `aqw.alert.dashboardUrl` for one queue: `{queue}` replaced by its name.
pub fn dashboard_link(dashboard: Option<&url::Url>, queue: &str) -> Option<String> {
    dashboard.map(|u| {
        u.as_str()
            .replace("%7Bqueue%7D", queue)
            .replace("{queue}", queue)
    })
}

/// The window facts every format shows: functions, first and last times.
pub struct WindowFacts {
    /// The window's function names, sorted, comma-separated.
    pub functions: String,
    /// When the window's first record was poisoned (RFC 3339).
    pub first: Option<String>,
    /// When the window's last record was poisoned (RFC 3339).
    pub last: Option<String>,
}

/// The facts of one window's records: functions, first and last times.
pub fn window_facts(batch: &[PoisonAlert]) -> WindowFacts {
    let mut functions: Vec<&str> = batch.iter().map(|a| a.function.as_str()).collect();
    functions.sort();
    functions.dedup();
    let fmt = |t: time::OffsetDateTime| {
        t.format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default()
    };
    WindowFacts {
        functions: functions.join(","),
        first: batch.iter().map(|a| a.poisoned_at).min().map(fmt),
        last: batch.iter().map(|a| a.poisoned_at).max().map(fmt),
    }
}

/// What the engine hands to the alert delivery.
#[derive(Debug, Clone)]
pub enum AlertEvent {
    /// A message was poisoned (grouped per queue and window by the delivery).
    Poisoned(PoisonAlert),
    /// A breaker changed state: its event body, sent at once.
    Breaker(serde_json::Value),
    /// Any other event sent at once (its body has `event` and `summary`):
    /// held messages about to expire.
    Notice(serde_json::Value),
}

/// The engine's alert handle: cheap to clone, never blocks.
#[derive(Clone, Debug, Default)]
pub struct Alerts {
    tx: Option<mpsc::UnboundedSender<AlertEvent>>,
}

impl Alerts {
    /// Alerts that only log (no delivery).
    pub fn disabled() -> Self {
        Self { tx: None }
    }

    /// A handle and the receiving end its events arrive on (the delivery
    /// task's input).
    pub fn channel() -> (Self, mpsc::UnboundedReceiver<AlertEvent>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Self { tx: Some(tx) }, rx)
    }

    /// A breaker changed state: its event goes to the delivery at once; the
    /// log line is the caller's.
    pub(crate) fn breaker(&self, body: serde_json::Value) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(AlertEvent::Breaker(body));
        }
    }

    /// An event for the delivery at once (`event`, `severity`,
    /// `function`, `summary`); the log line is the caller's.
    pub(crate) fn notice(&self, body: serde_json::Value) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(AlertEvent::Notice(body));
        }
    }

    /// Log the stable ERROR event and queue the alert for delivery.
    pub(crate) fn poisoned(&self, alert: PoisonAlert) {
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
            let _ = tx.send(AlertEvent::Poisoned(alert));
        }
    }
}

/// How long the first record of a burst waits for the others.
const GATHER: Duration = Duration::from_secs(1);

struct QueueWindow {
    last_sent: Option<Instant>,
    pending: Vec<PoisonAlert>,
    /// When the oldest pending record arrived.
    since: Option<Instant>,
}

/// The alert delivery's windowing, apart from what delivers a window (the
/// binary's `telemetry::alerts` posts it; a test drives this on paused
/// tokio time): poison alerts gathered per
/// queue, `deliver`ed as one batch once the first has waited `GATHER`
/// and the queue's last window is `window` old; other events passed to
/// `event` at once. Ends when every sender is gone.
pub async fn gather(
    window: Duration,
    mut rx: mpsc::UnboundedReceiver<AlertEvent>,
    mut deliver: impl FnMut(&str, Vec<PoisonAlert>),
    mut event: impl FnMut(serde_json::Value),
) {
    let mut windows: BTreeMap<String, QueueWindow> = BTreeMap::new();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            biased;
            msg = rx.recv() => match msg {
                Some(AlertEvent::Poisoned(a)) => {
                    let w = windows.entry(a.queue.clone()).or_insert(QueueWindow { last_sent: None, pending: vec![], since: None });
                    w.since.get_or_insert_with(Instant::now);
                    w.pending.push(a);
                }
                Some(AlertEvent::Breaker(body) | AlertEvent::Notice(body)) => event(body),
                None => break,
            },
            _ = tick.tick() => {}
        }
        for (queue, w) in windows.iter_mut() {
            // A window's first alert waits a second for the rest of a
            // burst: poisonings in the same second land in one alert.
            let gathered = w.since.is_some_and(|t| t.elapsed() >= GATHER);
            let due = gathered && w.last_sent.is_none_or(|t| t.elapsed() >= window);
            if w.pending.is_empty() || !due {
                continue;
            }
            let batch = std::mem::take(&mut w.pending);
            w.since = None;
            w.last_sent = Some(Instant::now());
            deliver(queue, batch);
        }
    }
}

/// The shape of the webhook body (`aqw.alert.format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AlertFormat {
    /// aqw's own JSON (the body documented in docs/runbooks.md, step 1 of the procedure), for scripts,
    /// relays and incident tools.
    #[default]
    Generic,
    /// A Slack incoming-webhook message in Block Kit.
    Slack,
    /// A Teams incoming webhook or Workflows message: one Adaptive Card.
    Teams,
}

/// The HMAC-SHA256 key that signs webhook bodies; never printed.
#[derive(Clone)]
pub struct SigningSecret(String);

impl SigningSecret {
    /// A secret holding `value`.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The key itself, for the signer only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for SigningSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningSecret(***)")
    }
}

/// Where alerts go and how: the URL, the body format, the dashboard link
/// and the signing secret.
#[derive(Clone)]
pub struct Webhook {
    /// Where the webhook body is posted.
    pub url: url::Url,
    /// The body's shape.
    pub format: AlertFormat,
    /// `aqw.alert.dashboardUrl`: the link in the alert, `{queue}` replaced.
    pub dashboard_url: Option<url::Url>,
    /// The key that signs each body, when set.
    pub secret: Option<SigningSecret>,
    /// `aqw.alert.runbookUrl`: the runbook link every alert carries
    /// (`None`: the `aqw oncall` command, see [`runbook_link`]).
    pub runbook_url: Option<url::Url>,
    /// Each function's queue, so an event of a function (a breaker) names
    /// `aqw triage QUEUE`.
    pub queues: std::collections::BTreeMap<String, String>,
}

impl std::fmt::Debug for Webhook {
    // A Slack or Teams webhook URL is itself a credential: only its host.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhook")
            .field("host", &self.url.host_str())
            .field("format", &self.format)
            .field("signed", &self.secret.is_some())
            .finish()
    }
}

#[cfg(test)]
mod gather_tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tokio::time::{sleep, Instant};

    fn alert(queue: &str, id: &str) -> PoisonAlert {
        PoisonAlert {
            queue: queue.into(),
            poison_queue: format!("{queue}-poison"),
            function: "GrantCredit".into(),
            message_id: id.into(),
            key: None,
            error_kind: "retryable".into(),
            error: "HTTP 503".into(),
            poisoned_at: time::OffsetDateTime::UNIX_EPOCH,
            uncertain: false,
        }
    }

    /// A window as delivered: its queue, its records' ids, when (since start).
    type Sent = Arc<Mutex<Vec<(String, Vec<String>, Duration)>>>;

    fn sent_ids(sent: &Sent) -> Vec<(String, Vec<String>)> {
        let sent = sent.lock().unwrap();
        sent.iter()
            .map(|(q, ids, _)| (q.clone(), ids.clone()))
            .collect()
    }

    fn window(q: &str, ids: &[&str]) -> (String, Vec<String>) {
        (q.into(), ids.iter().map(|s| s.to_string()).collect())
    }

    /// Issue 39: poisonings in the same second land in one alert (the
    /// first waits [`GATHER`] for the rest), a breaker event goes at once,
    /// the next record of the queue waits for its window, and another queue
    /// has its own.
    #[tokio::test(start_paused = true)]
    async fn a_burst_in_one_second_is_one_alert_and_the_next_waits_for_the_window() {
        let (alerts, rx) = Alerts::channel();
        let sent: Sent = Arc::default();
        let events = Arc::new(Mutex::new(Vec::new()));
        let start = Instant::now();
        let (log, seen) = (sent.clone(), events.clone());
        let task = tokio::spawn(gather(
            Duration::from_secs(60),
            rx,
            move |q: &str, batch: Vec<PoisonAlert>| {
                let ids = batch.into_iter().map(|a| a.message_id).collect();
                log.lock()
                    .unwrap()
                    .push((q.to_string(), ids, start.elapsed()));
            },
            move |body| seen.lock().unwrap().push(body),
        ));
        alerts.poisoned(alert("credits", "m1"));
        sleep(Duration::from_millis(300)).await;
        alerts.poisoned(alert("credits", "m2"));
        sleep(Duration::from_millis(600)).await;
        alerts.poisoned(alert("credits", "m3"));
        alerts.poisoned(alert("receipts", "r1"));
        sleep(Duration::from_millis(50)).await;
        assert!(sent_ids(&sent).is_empty(), "the burst is still gathering");

        sleep(Duration::from_millis(350)).await;
        assert_eq!(sent_ids(&sent), [window("credits", &["m1", "m2", "m3"])]);
        let at = sent.lock().unwrap()[0].2;
        assert!(
            at >= GATHER && at < GATHER + Duration::from_millis(300),
            "{at:?}"
        );
        alerts.breaker(serde_json::json!({"event": "aqw.breaker.open"}));
        alerts.poisoned(alert("credits", "m4"));
        sleep(Duration::from_millis(10)).await;
        assert_eq!(
            events.lock().unwrap().len(),
            1,
            "a breaker event goes at once"
        );

        sleep(Duration::from_secs(1)).await;
        let receipts = window("receipts", &["r1"]);
        assert_eq!(sent_ids(&sent)[1..], [receipts], "its own window");
        sleep(Duration::from_secs(58)).await;
        assert_eq!(sent_ids(&sent).len(), 2, "m4 waits for the credits window");
        sleep(Duration::from_secs(2)).await;
        assert_eq!(sent_ids(&sent)[2..], [window("credits", &["m4"])]);
        drop(alerts);
        task.await.unwrap();
    }
}
