//! The poison alert: one ERROR line per new record, and per queue at most
//! one webhook POST a window, its records grouped by cause (error kind, HTTP
//! status, the error's first line with what varies masked), in the
//! receiver's format ([`AlertFormat`]: aqw's JSON, Slack or Teams, the last
//! two in `chat.rs`), signed with HMAC-SHA256 when a secret is set.

use super::groups::{
    dashboard_link, group_alerts, list_command, runbook_link, show_command, triage_command,
    window_facts, PoisonAlert,
};
use serde_json::json;
use std::time::Duration;
use tokio::sync::mpsc;
/// The webhook body (and the ERROR log summary) for one queue's window:
/// counts grouped by error kind and error text, each group with samples and
/// the command that lists it.
pub fn alert_body(queue: &str, batch: &[PoisonAlert]) -> serde_json::Value {
    generic_body(queue, batch, None, None)
}

/// aqw's own JSON body (`aqw.alert.format` `generic`).
fn generic_body(
    queue: &str,
    batch: &[PoisonAlert],
    dashboard: Option<String>,
    runbook: Option<&url::Url>,
) -> serde_json::Value {
    let groups = group_alerts(batch);
    let facts = window_facts(batch);
    json!({
        "event": "aqw.poison.new",
        "severity": "error",
        "queue": queue,
        "poisonQueue": batch.first().map(|a| a.poison_queue.clone()),
        "count": batch.len(),
        "function": facts.functions,
        "firstPoisonedAt": facts.first,
        "lastPoisonedAt": facts.last,
        "groups": groups.iter().map(|g| json!({
            "count": g.count,
            "errorKind": g.kind,
            "status": g.status,
            "error": g.example,
            "errorGroup": g.text,
            "messageIds": g.ids,
            "keys": g.keys,
            "mayHaveTakenEffect": g.uncertain_ids,
            "show": g.ids.first().map(|id| show_command(queue, id)),
        })).collect::<Vec<_>>(),
        "uncertainRecords": batch.iter().filter(|a| a.uncertain).count(),
        "next": triage_command(queue),
        "list": list_command(queue),
        "runbook": runbook_link(runbook, None),
        "hint": format!("start with `{}`: the open records grouped by cause, what each means and the exact next commands; the runbook: {}", triage_command(queue), runbook_link(runbook, None)),
        // The window's first record, kept for receivers written against
        // the old body (its group has the rest).
        "messageId": batch.first().map(|a| a.message_id.clone()),
        "dashboardUrl": dashboard,
    })
}

/// The body a receiver in `format` takes, for one queue's window.
pub fn render_alert(
    format: AlertFormat,
    queue: &str,
    batch: &[PoisonAlert],
    links: (Option<&url::Url>, Option<&url::Url>),
) -> serde_json::Value {
    let (dashboard, runbook) = links;
    let link = dashboard_link(dashboard, queue);
    let book = runbook_link(runbook, None);
    match format {
        AlertFormat::Generic => generic_body(queue, batch, link, runbook),
        AlertFormat::Slack => super::chat::slack_body(queue, batch, link.as_deref(), &book),
        AlertFormat::Teams => super::chat::teams_body(queue, batch, link.as_deref(), &book),
    }
}

/// Header names of a signed alert.
pub const SIGNATURE_HEADER: &str = "X-Aqw-Signature";
pub const TIMESTAMP_HEADER: &str = "X-Aqw-Timestamp";

/// The signature of `body` sent at `timestamp` (Unix seconds):
/// `sha256=<hex HMAC-SHA256 of "<timestamp>.<body>">`. The timestamp is
/// signed with the body so a captured request cannot be replayed later with
/// a fresh timestamp; receivers reject timestamps older than a few minutes.
pub fn sign(secret: &SigningSecret, timestamp: u64, body: &[u8]) -> String {
    use hmac::Mac;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.expose().as_bytes())
        .expect("HMAC takes a key of any length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

use aqw_core::alert::{AlertEvent, AlertFormat, Alerts, SigningSecret, Webhook};

/// Start the task that delivers what the engine's [`Alerts`] handle sends
/// (needs a tokio runtime): poison alerts at most one POST per queue per
/// window, carrying how many records it covers, breaker events at once;
/// every POST retried with backoff, never blocking the worker. The window
/// summary is logged (ERROR `aqw.poison.alert`) with or without a webhook.
pub fn start(webhook: Option<Webhook>, window: Duration) -> Alerts {
    let (alerts, rx) = Alerts::channel();
    tokio::spawn(alert_loop(webhook, window, rx));
    alerts
}

/// A breaker changed state: one POST of its own event
/// (`aqw.breaker.open`, `aqw.breaker.closed`, ...), retried like the
/// poison alert; the log line is the engine's.
fn post_breaker_event(client: &reqwest::Client, webhook: &Webhook, body: serde_json::Value) {
    let body = event_links(webhook, body);
    // Slack and Teams take their own shapes: the event's summary as
    // one line of text there, aqw's JSON as it is otherwise.
    let summary = match body["triage"].as_str() {
        Some(triage) => format!(
            "{}\nOn call: `{triage}` · runbook: {}",
            body["summary"].as_str().unwrap_or_default(),
            body["runbook"].as_str().unwrap_or_default()
        ),
        None => format!(
            "{}\nOn call: runbook {}",
            body["summary"].as_str().unwrap_or_default(),
            body["runbook"].as_str().unwrap_or_default()
        ),
    };
    let summary = summary.as_str();
    let body = match webhook.format {
        AlertFormat::Generic => body.clone(),
        AlertFormat::Slack => super::chat::slack_text(summary),
        AlertFormat::Teams => super::chat::teams_text(summary),
    };
    tokio::spawn(post_with_backoff(client.clone(), webhook.clone(), body));
}

/// An event's on-call pointers: the configured runbook link in place of
/// the engine's `aqw oncall KIND`, and `aqw triage QUEUE` for the queue (or
/// the function's queue) it concerns.
pub fn event_links(webhook: &Webhook, mut body: serde_json::Value) -> serde_json::Value {
    if let Some(url) = &webhook.runbook_url {
        body["runbook"] = json!(url.as_str());
    }
    let queue = body["queue"].as_str().map(str::to_string).or_else(|| {
        let function = body["function"].as_str()?;
        webhook.queues.get(function).cloned()
    });
    if let Some(q) = queue {
        body["triage"] = json!(triage_command(&q));
    }
    body
}

async fn alert_loop(
    webhook: Option<Webhook>,
    window: Duration,
    rx: mpsc::UnboundedReceiver<AlertEvent>,
) {
    // Only a webhook needs a client.
    let client = webhook.as_ref().map(|_| {
        aqw_azure::tls::client_builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap_or_default()
    });
    let deliver = |queue: &str, batch: Vec<PoisonAlert>| {
        send_window(queue, &batch, webhook.as_ref(), client.as_ref())
    };
    let event = |body: serde_json::Value| {
        if let (Some(webhook), Some(client)) = (&webhook, &client) {
            post_breaker_event(client, webhook, body);
        }
    };
    aqw_core::alert::gather(window, rx, deliver, event).await;
}

/// One queue's window: the ERROR summary line, and the POST when there is
/// a webhook.
fn send_window(
    queue: &str,
    batch: &[PoisonAlert],
    webhook: Option<&Webhook>,
    client: Option<&reqwest::Client>,
) {
    let body = alert_body(queue, batch);
    tracing::error!(
        event = "aqw.poison.alert",
        queue = %queue,
        count = batch.len(),
        groups = %body["groups"],
        next = %body["next"].as_str().unwrap_or_default(),
        "{} message(s) poisoned on {queue} in this window",
        batch.len()
    );
    if let (Some(webhook), Some(client)) = (webhook, client) {
        let links = (webhook.dashboard_url.as_ref(), webhook.runbook_url.as_ref());
        let body = render_alert(webhook.format, queue, batch, links);
        tokio::spawn(post_with_backoff(client.clone(), webhook.clone(), body));
    }
}

/// POST one alert, retried with backoff (0.5 s doubling to 30 s, 6 tries);
/// a failure is a warning, never a worker error. The body is serialized
/// once, so the signature covers the exact bytes sent; each try is signed
/// with its own timestamp.
async fn post_with_backoff(client: reqwest::Client, webhook: Webhook, body: serde_json::Value) {
    let body = serde_json::to_vec(&body).unwrap_or_default();
    let mut delay = Duration::from_millis(500);
    for attempt in 1..=6 {
        let mut request = client
            .post(webhook.url.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json");
        if let Some(secret) = &webhook.secret {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs();
            request = request
                .header(TIMESTAMP_HEADER, now.to_string())
                .header(SIGNATURE_HEADER, sign(secret, now, &body));
        }
        match request.body(body.clone()).send().await {
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
    use super::super::groups::error_group;
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

    /// Issue 39: the alert shows the real error (an example of the group,
    /// not its masked key), its top-level fields do not mix records, and
    /// every format links the on-call guide.
    #[test]
    fn the_alert_shows_the_exact_error_and_links_the_oncall_guide() {
        let batch = [
            alert(
                "m1",
                Some("k1"),
                "permanent",
                "account acct-closed is closed (since 2026-01-01)",
                0,
            ),
            alert(
                "m2",
                Some("k2"),
                "permanent",
                "account acct-closed is closed (since 2026-02-01)",
                1,
            ),
        ];
        let body = alert_body("credits", &batch);
        let g = &body["groups"][0];
        assert_eq!(g["count"], 2);
        assert_eq!(
            g["error"],
            "account acct-closed is closed (since 2026-01-01)"
        );
        assert_eq!(g["errorGroup"], "account acct-closed is closed (since #)");
        assert_eq!(body["runbook"], "aqw oncall");
        assert_eq!(body["next"], "aqw triage credits");
        assert_eq!(body["uncertainRecords"], 0);
        assert!(
            body.get("mayHaveTakenEffect").is_none(),
            "no top-level field of another record"
        );
        for format in [AlertFormat::Slack, AlertFormat::Teams] {
            let text = render_alert(format, "credits", &batch, (None, None)).to_string();
            assert!(text.contains("aqw triage credits"), "{text}");
            assert!(text.contains("aqw oncall"), "{text}");
            assert!(!text.contains("github.com"), "{text}");
            let url: url::Url = "https://wiki.example/oncall".parse().unwrap();
            let text = render_alert(format, "credits", &batch, (None, Some(&url))).to_string();
            assert!(text.contains("https://wiki.example/oncall"), "{text}");
            assert!(text.contains("(since 2026-01-01)"), "{text}");
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
        assert_eq!(body["next"], "aqw triage credits");
        assert_eq!(body["list"], "aqw poison list credits --status open");
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
    fn the_signature_covers_timestamp_and_body_and_debug_hides_credentials() {
        let secret = SigningSecret::new("0123456789abcdef");
        let sig = sign(&secret, 1_800_000_000, br#"{"a":1}"#);
        assert!(sig.starts_with("sha256=") && sig.len() == 7 + 64, "{sig}");
        assert_ne!(
            sig,
            sign(&secret, 1_800_000_001, br#"{"a":1}"#),
            "timestamp signed"
        );
        assert_ne!(
            sig,
            sign(&secret, 1_800_000_000, br#"{"a":2}"#),
            "body signed"
        );
        let hook = Webhook {
            url: "https://hooks.slack.com/services/T0/B0/tokenpart"
                .parse()
                .unwrap(),
            format: AlertFormat::Slack,
            dashboard_url: None,
            secret: Some(secret),
            runbook_url: None,
            queues: Default::default(),
        };
        let shown = format!("{hook:?}");
        assert!(
            !shown.contains("tokenpart") && !shown.contains("0123456789abcdef"),
            "{shown}"
        );
    }

    /// Issue 52: a breaker event names `aqw triage` for its function's
    /// queue and carries the configured runbook link, never a URL that is
    /// not the operator's.
    #[test]
    fn a_breaker_event_points_to_triage_and_the_configured_runbook() {
        let mut hook = Webhook {
            url: "https://hooks.example/x".parse().unwrap(),
            format: AlertFormat::Generic,
            dashboard_url: None,
            secret: None,
            runbook_url: None,
            queues: [("GrantCredit".to_string(), "credits".to_string())].into(),
        };
        let event = json!({"event": "aqw.breaker.open", "function": "GrantCredit",
            "summary": "open", "runbook": aqw_core::alert::runbook_link(None, Some("outage"))});
        let body = event_links(&hook, event.clone());
        assert_eq!(body["triage"], "aqw triage credits");
        assert_eq!(body["runbook"], "aqw oncall outage");
        hook.runbook_url = Some("https://wiki.example/aqw".parse().unwrap());
        assert_eq!(
            event_links(&hook, event)["runbook"],
            "https://wiki.example/aqw"
        );
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
