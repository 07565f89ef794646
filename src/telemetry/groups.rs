//! What every alert format shows: a poison event ([`PoisonAlert`]), its
//! window's records grouped by cause ([`group_alerts`]: error kind, HTTP
//! status, the error's first line with what varies masked), the window's
//! facts, and the commands and link an operator follows. `alerts.rs` and
//! `chat.rs` both render from here.

use super::scrub;
use regex::Regex;
use std::sync::LazyLock;

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

/// One cause in an alert window: how many records, and a few samples (the
/// first record first).
pub(super) struct AlertGroup<'a> {
    pub(super) kind: &'a str,
    pub(super) status: Option<u16>,
    pub(super) text: String,
    pub(super) count: usize,
    pub(super) ids: Vec<&'a str>,
    pub(super) keys: Vec<&'a str>,
    /// Records of the group with an uncertain attempt, all of them named.
    pub(super) uncertain_ids: Vec<&'a str>,
}

/// A window's records grouped by cause, the biggest group first.
pub(super) fn group_alerts(batch: &[PoisonAlert]) -> Vec<AlertGroup<'_>> {
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

/// The command that shows one record.
pub(super) fn show_command(queue: &str, id: &str) -> String {
    format!("aqw poison show {queue} {id}")
}

/// The command that lists a queue's open records.
pub(super) fn list_command(queue: &str) -> String {
    format!("aqw poison list {queue} --status open")
}

/// `aqw.alert.dashboardUrl` for one queue: `{queue}` replaced by its name.
pub(super) fn dashboard_link(dashboard: Option<&url::Url>, queue: &str) -> Option<String> {
    dashboard.map(|u| {
        u.as_str()
            .replace("%7Bqueue%7D", queue)
            .replace("{queue}", queue)
    })
}

/// The window facts every format shows: functions, first and last times.
pub(super) struct WindowFacts {
    pub(super) functions: String,
    pub(super) first: Option<String>,
    pub(super) last: Option<String>,
}

pub(super) fn window_facts(batch: &[PoisonAlert]) -> WindowFacts {
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
