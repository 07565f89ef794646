//! The poison alert: one ERROR line per new record, and per queue at most
//! one webhook POST a window, its records grouped by cause (error kind, HTTP
//! status, the error's first line with what varies masked).

use super::scrub;
use regex::Regex;
use serde_json::json;
use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

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

/// One cause in an alert window: how many records, and a few samples.
struct AlertGroup<'a> {
    kind: &'a str,
    status: Option<u16>,
    text: String,
    count: usize,
    ids: Vec<&'a str>,
    keys: Vec<&'a str>,
    /// Records of the group with an uncertain attempt, all of them named.
    uncertain_ids: Vec<&'a str>,
}

/// A window's records grouped by cause, the biggest group first.
fn group_alerts(batch: &[PoisonAlert]) -> Vec<AlertGroup<'_>> {
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

/// The webhook body (and the ERROR log summary) for one queue's window:
/// counts grouped by error kind and error text, each group with samples and
/// the command that lists it.
pub fn alert_body(queue: &str, batch: &[PoisonAlert]) -> serde_json::Value {
    let groups = group_alerts(batch);
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
            "mayHaveTakenEffect": g.uncertain_ids,
        })).collect::<Vec<_>>(),
        "mayHaveTakenEffect": batch.iter().filter(|a| a.uncertain).count(),
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
    /// Where breaker events go at once (they are rare: no window).
    webhook: Option<(reqwest::Client, url::Url)>,
}

impl Alerts {
    pub fn disabled() -> Self {
        Self {
            tx: None,
            webhook: None,
        }
    }

    /// Start the sender task (needs a tokio runtime).
    /// The window summary is logged (ERROR `aqw.poison.alert`) with or
    /// without a webhook.
    pub fn start(webhook: Option<url::Url>, window: Duration) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap_or_default();
        let direct = webhook.clone().map(|u| (client, u));
        tokio::spawn(alert_loop(webhook, window, rx));
        Self {
            tx: Some(tx),
            webhook: direct,
        }
    }

    /// A breaker changed state: one POST of its own event
    /// (`aqw.breaker.open`, `aqw.breaker.closed`, ...), retried like the
    /// poison alert; the log line is the caller's.
    pub fn breaker(&self, body: serde_json::Value) {
        if let Some((client, url)) = &self.webhook {
            tokio::spawn(post_with_backoff(client.clone(), url.clone(), body));
        }
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
    // Only a webhook needs a client: building one loads the system's root
    // certificates (some 19 M instructions).
    let client = webhook.as_ref().map(|_| {
        reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap_or_default()
    });
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
            if let (Some(webhook), Some(client)) = (webhook.clone(), client.clone()) {
                tokio::spawn(post_with_backoff(client, webhook, body));
            }
        }
    }
}

/// POST one alert, retried with backoff (0.5 s doubling to 30 s, 6 tries);
/// a failure is a warning, never a worker error.
async fn post_with_backoff(client: reqwest::Client, url: url::Url, body: serde_json::Value) {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
            uncertain: error.contains("timed out"),
        }
    }

    /// Six records of one window: three 503s with different request ids, a
    /// closed account (404), a timeout and a missing key field.
    fn mixed_window() -> [PoisonAlert; 6] {
        [
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
        ]
    }

    #[test]
    fn a_mixed_window_is_grouped_by_cause_not_reported_as_its_first_record() {
        let body = alert_body("credits", &mixed_window());
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
