//! The poison alert as a chat message: Slack Block Kit and a Teams
//! Adaptive Card. Each shows the window's groups (biggest first), the first
//! record of each group with the command that shows it, the command that
//! lists them all, and a link to the dashboard when one is configured.
//!
//! Limits kept here, from the vendors' references:
//! * Slack (docs.slack.dev/reference/block-kit/blocks): at most 50 blocks a
//!   message; a `header`'s plain text at most 150 characters; a `section`'s
//!   text at most 3000 and a field at most 2000; a button's text at most 75
//!   and its URL at most 3000. Incoming webhooks take `text` (the
//!   notification fallback) next to `blocks`.
//! * Teams (learn.microsoft.com, "Create Incoming Webhooks" and
//!   "Send Adaptive Cards using an Incoming Webhook"; the Workflows "Post to
//!   a channel when a webhook request is received" template takes the same
//!   body): `{"type":"message","attachments":[{"contentType":
//!   "application/vnd.microsoft.card.adaptive","contentUrl":null,"content":
//!   <AdaptiveCard>}]}`, the card at version 1.4 (adaptivecards.io schema:
//!   `TextBlock`, `FactSet`, `Container`, `Action.OpenUrl`).

use super::groups::{
    group_alerts, list_command, show_command, triage_command, window_facts, AlertGroup, PoisonAlert,
};
use serde_json::{json, Value};

/// Groups shown in a chat message; the rest are counted and listed by the
/// `aqw poison list` command the message ends with.
const CHAT_GROUPS: usize = 10;

/// At most `max` characters, an ellipsis marking a cut.
fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut out: String = text.chars().take(max - 1).collect();
    out.push('…');
    out
}

/// Slack `mrkdwn` text: `&`, `<` and `>` are control characters there.
fn mrkdwn(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Inline code in Slack or Teams markdown (backticks cannot be escaped in
/// either: they become quotes).
fn code(text: &str) -> String {
    format!("`{}`", text.replace('`', "'"))
}

/// "3 × retryable (HTTP 503)": a group's headline, with how many of its
/// jobs may have taken effect (check those before a replay).
fn group_title(g: &AlertGroup) -> String {
    let mut title = match g.status {
        Some(status) => format!("{} × {} (HTTP {status})", g.count, g.kind),
        None => format!("{} × {}", g.count, g.kind),
    };
    if !g.uncertain_ids.is_empty() {
        title.push_str(&format!(
            " · {} may have taken effect",
            g.uncertain_ids.len()
        ));
    }
    title
}

fn headline(queue: &str, batch: &[PoisonAlert]) -> String {
    format!("aqw: {} message(s) poisoned on {queue}", batch.len())
}

/// The Slack Block Kit message of one queue's window.
pub(super) fn slack_body(
    queue: &str,
    batch: &[PoisonAlert],
    dashboard: Option<&str>,
    runbook: &str,
) -> Value {
    let groups = group_alerts(batch);
    let facts = window_facts(batch);
    let field = |name: &str, value: &str| json!({"type": "mrkdwn", "text": clip(&format!("*{name}*\n{}", mrkdwn(value)), 2000)});
    let mut blocks = vec![
        json!({"type": "header", "text": {"type": "plain_text", "text": clip(&headline(queue, batch), 150)}}),
        json!({"type": "section", "fields": [
            field("Queue", queue),
            field("Function", &facts.functions),
            field("First poisoned", facts.first.as_deref().unwrap_or("")),
            field("Last poisoned", facts.last.as_deref().unwrap_or("")),
        ]}),
        json!({"type": "divider"}),
    ];
    for g in groups.iter().take(CHAT_GROUPS) {
        let first = g.ids.first().copied().unwrap_or_default();
        let text = format!(
            "*{}*\n```{}```\nFirst record {} · inspect: {}",
            mrkdwn(&group_title(g)),
            mrkdwn(&g.example.replace("```", "'''")),
            code(first),
            code(&show_command(queue, first)),
        );
        blocks.push(
            json!({"type": "section", "text": {"type": "mrkdwn", "text": clip(&text, 3000)}}),
        );
    }
    let more = groups.len().saturating_sub(CHAT_GROUPS);
    let next = match more {
        0 => format!("Every open record: {}", code(&list_command(queue))),
        n => format!("{n} more group(s): {}", code(&list_command(queue))),
    };
    // A configured runbook is a link; the default is the command that
    // prints the runbook embedded in the binary.
    let book = match runbook.starts_with("https://") {
        true => format!("<{}|runbook>", mrkdwn(runbook)),
        false => code(runbook),
    };
    let next = format!(
        "Start here: {} (groups by cause, next commands) · {next} · runbook: {book}",
        code(&triage_command(queue))
    );
    blocks.push(
        json!({"type": "context", "elements": [{"type": "mrkdwn", "text": clip(&next, 3000)}]}),
    );
    if let Some(url) = dashboard {
        blocks.push(json!({"type": "actions", "elements": [{
            "type": "button",
            "text": {"type": "plain_text", "text": "Open dashboard"},
            "url": clip(url, 3000),
        }]}));
    }
    json!({"text": headline(queue, batch), "blocks": blocks})
}

/// A one-line Slack message (a breaker event).
pub(super) fn slack_text(text: &str) -> Value {
    json!({"text": mrkdwn(text)})
}

/// A one-line Teams message (a breaker event): one Adaptive Card.
pub(super) fn teams_text(text: &str) -> Value {
    json!({
        "type": "message",
        "attachments": [{
            "contentType": "application/vnd.microsoft.card.adaptive",
            "contentUrl": null,
            "content": {
                "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
                "type": "AdaptiveCard",
                "version": "1.4",
                "body": [{"type": "TextBlock", "text": text, "wrap": true}],
            },
        }],
    })
}

/// One group of the Teams card: headline, error text, first record and
/// the command that shows it.
fn teams_group(queue: &str, g: &AlertGroup) -> Value {
    let first = g.ids.first().copied().unwrap_or_default();
    json!({
        "type": "Container",
        "separator": true,
        "items": [
            {"type": "TextBlock", "text": group_title(g), "weight": "Bolder", "wrap": true},
            {"type": "TextBlock", "text": g.example, "fontType": "Monospace", "wrap": true},
            {"type": "FactSet", "facts": [
                {"title": "First record", "value": first},
                {"title": "Inspect", "value": show_command(queue, first)},
            ]},
        ],
    })
}

/// The Teams message (one Adaptive Card 1.4) of one queue's window.
pub(super) fn teams_body(
    queue: &str,
    batch: &[PoisonAlert],
    dashboard: Option<&str>,
    runbook: &str,
) -> Value {
    let groups = group_alerts(batch);
    let facts = window_facts(batch);
    let mut body = vec![
        json!({"type": "TextBlock", "text": headline(queue, batch), "size": "Large", "weight": "Bolder", "wrap": true}),
        json!({"type": "FactSet", "facts": [
            {"title": "Queue", "value": queue},
            {"title": "Function", "value": facts.functions},
            {"title": "First poisoned", "value": facts.first.unwrap_or_default()},
            {"title": "Last poisoned", "value": facts.last.unwrap_or_default()},
        ]}),
    ];
    body.extend(
        groups
            .iter()
            .take(CHAT_GROUPS)
            .map(|g| teams_group(queue, g)),
    );
    let more = groups.len().saturating_sub(CHAT_GROUPS);
    let next = match more {
        0 => format!("Every open record: {}", list_command(queue)),
        n => format!("{n} more group(s): {}", list_command(queue)),
    };
    let book = match runbook.starts_with("https://") {
        true => format!("[runbook]({runbook})"),
        false => format!("runbook: {}", code(runbook)),
    };
    let next = format!(
        "Start here: {} (groups by cause, next commands) · {next} · {book}",
        code(&triage_command(queue))
    );
    body.push(json!({"type": "TextBlock", "text": next, "isSubtle": true, "wrap": true, "separator": true}));
    let mut card = json!({
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "type": "AdaptiveCard",
        "version": "1.4",
        "msteams": {"width": "Full"},
        "body": body,
    });
    if let Some(url) = dashboard {
        card["actions"] =
            json!([{"type": "Action.OpenUrl", "title": "Open dashboard", "url": url}]);
    }
    json!({
        "type": "message",
        "attachments": [{
            "contentType": "application/vnd.microsoft.card.adaptive",
            "contentUrl": null,
            "content": card,
        }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alert(id: &str, error: &str) -> PoisonAlert {
        PoisonAlert {
            queue: "credits".into(),
            poison_queue: "credits-poison".into(),
            function: "GrantCredit".into(),
            message_id: id.into(),
            key: None,
            error_kind: "permanent".into(),
            error: error.into(),
            poisoned_at: time::OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap(),
            uncertain: false,
        }
    }

    /// A window of 14 distinct causes, one with text Slack must escape.
    fn storm() -> Vec<PoisonAlert> {
        let mut batch: Vec<PoisonAlert> = (0..13)
            .map(|i| alert(&format!("m{i}"), &format!("cause {}", "z".repeat(i + 1))))
            .collect();
        batch.push(alert("mx", "bad <input> & more"));
        batch
    }

    #[test]
    fn slack_blocks_stay_within_block_kit_limits() {
        let body = slack_body(
            "credits",
            &storm(),
            Some("https://grafana.example/d/aqw"),
            "aqw oncall",
        );
        let blocks = body["blocks"].as_array().unwrap();
        assert!(blocks.len() <= 50);
        assert!(body["text"].as_str().unwrap().contains("14 message(s)"));
        assert!(blocks[0]["text"]["text"].as_str().unwrap().chars().count() <= 150);
        let sections: Vec<&str> = blocks
            .iter()
            .filter_map(|b| {
                b["text"]["text"]
                    .as_str()
                    .filter(|_| b["type"] == "section")
            })
            .collect();
        assert_eq!(sections.len(), CHAT_GROUPS);
        assert!(sections.iter().all(|t| t.chars().count() <= 3000));
        let text = body.to_string();
        assert!(text.contains("&lt;input&gt; &amp; more"), "{text}");
        assert!(text.contains("4 more group(s)"), "{text}");
        let button = &blocks.last().unwrap()["elements"][0];
        assert_eq!(button["url"], "https://grafana.example/d/aqw");
        assert!(button["text"]["text"].as_str().unwrap().len() <= 75);
    }

    #[test]
    fn the_teams_card_is_an_adaptive_card_attachment() {
        let body = teams_body("credits", &storm()[..2], None, "aqw oncall");
        assert_eq!(body["type"], "message");
        let a = &body["attachments"][0];
        assert_eq!(a["contentType"], "application/vnd.microsoft.card.adaptive");
        assert_eq!(a["content"]["type"], "AdaptiveCard");
        assert_eq!(a["content"]["version"], "1.4");
        assert!(
            a["content"].get("actions").is_none(),
            "no link without a dashboard"
        );
        let group = &a["content"]["body"][2];
        assert_eq!(group["type"], "Container");
        assert_eq!(
            group["items"][2]["facts"][1]["value"],
            "aqw poison show credits m0"
        );
    }
}
