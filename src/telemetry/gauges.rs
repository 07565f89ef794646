//! The health gauges the ops server's sampler (`src/http.rs`) refreshes at
//! `aqw.http.metricsInterval`: the age of a queue's oldest visible message,
//! and the open poison records of a queue grouped as the alert groups them.
//!
//! The open-record groups are rendered here, not through the `metrics`
//! recorder: a group's error text changes as incidents come and go, and a
//! recorder gauge, once created, stays in `/metrics` for the life of the
//! process. Rendering the last snapshot means a closed group disappears and
//! the series count stays at most [`OPEN_GROUPS_EXPORTED`] + 1 per queue.

use super::groups::error_group;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use time::OffsetDateTime;

/// Error groups exported per queue before the rest are summed into one
/// `other` series: enough to tell the causes of an incident apart, few
/// enough that a storm of distinct errors cannot flood Prometheus.
pub const OPEN_GROUPS_EXPORTED: usize = 10;

/// The gauge aqw renders itself: open records by queue and error group.
pub const OPEN_RECORDS_METRIC: &str = "aqw_poison_open_records";

/// The label value of the series that sums the groups past the cap.
pub const OTHER_GROUP: &str = "other";

/// Open records of one queue sharing a cause (error kind and masked text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenGroup {
    pub error_kind: String,
    pub error_group: String,
    pub count: u64,
}

/// Group open records' errors (kind, message) as the alert does, biggest
/// first, the groups past [`OPEN_GROUPS_EXPORTED`] summed into `other`.
pub fn open_groups<'a>(errors: impl IntoIterator<Item = (&'a str, &'a str)>) -> Vec<OpenGroup> {
    let mut counts: BTreeMap<(String, String), u64> = BTreeMap::new();
    for (kind, message) in errors {
        let (_, text) = error_group(message);
        *counts.entry((kind.to_string(), text)).or_default() += 1;
    }
    let mut groups: Vec<OpenGroup> = counts
        .into_iter()
        .map(|((error_kind, error_group), count)| OpenGroup {
            error_kind,
            error_group,
            count,
        })
        .collect();
    groups.sort_by_key(|g| std::cmp::Reverse(g.count));
    if groups.len() > OPEN_GROUPS_EXPORTED {
        let rest: u64 = groups.drain(OPEN_GROUPS_EXPORTED..).map(|g| g.count).sum();
        groups.push(OpenGroup {
            error_kind: OTHER_GROUP.into(),
            error_group: OTHER_GROUP.into(),
            count: rest,
        });
    }
    groups
}

fn snapshot() -> &'static Mutex<BTreeMap<String, Vec<OpenGroup>>> {
    static OPEN: Mutex<BTreeMap<String, Vec<OpenGroup>>> = Mutex::new(BTreeMap::new());
    &OPEN
}

/// Replace the open-record groups of `queue` with the latest count.
pub fn set_open_groups(queue: &str, groups: Vec<OpenGroup>) {
    let mut all = snapshot().lock().unwrap_or_else(|e| e.into_inner());
    all.insert(queue.to_string(), groups);
}

/// A Prometheus label value, escaped (text format: `\`, `"` and newlines).
fn label_value(v: &str) -> String {
    v.replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
}

/// The open-record groups in the Prometheus text format. A queue with no
/// open record still has one series (`error_group=""` at 0), so an alert
/// on it resolves instead of going absent.
fn render_open_groups() -> String {
    let all = snapshot().lock().unwrap_or_else(|e| e.into_inner());
    if all.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "# HELP {OPEN_RECORDS_METRIC} Open poison records by queue and error group (the alert's grouping; the top {OPEN_GROUPS_EXPORTED} groups, the rest as \"{OTHER_GROUP}\").\n# TYPE {OPEN_RECORDS_METRIC} gauge\n"
    );
    for (queue, groups) in all.iter() {
        let q = label_value(queue);
        if groups.is_empty() {
            let _ = writeln!(
                out,
                "{OPEN_RECORDS_METRIC}{{queue=\"{q}\",error_kind=\"\",error_group=\"\"}} 0"
            );
        }
        for g in groups {
            let _ = writeln!(
                out,
                "{OPEN_RECORDS_METRIC}{{queue=\"{q}\",error_kind=\"{}\",error_group=\"{}\"}} {}",
                label_value(&g.error_kind),
                label_value(&g.error_group),
                g.count
            );
        }
    }
    out
}

/// Everything `/metrics` serves: the recorder's metrics and the open-record
/// groups.
pub fn render_metrics() -> String {
    let mut text = super::metrics_handle().render();
    text.push_str(&render_open_groups());
    text
}

/// Seconds since the oldest of `insertion_times` (0 when there is none: an
/// empty queue has nothing waiting).
pub fn oldest_age_seconds(
    now: OffsetDateTime,
    insertion_times: impl IntoIterator<Item = OffsetDateTime>,
) -> f64 {
    insertion_times
        .into_iter()
        .min()
        .map(|t| (now - t).as_seconds_f64().max(0.0))
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_past_the_cap_are_summed_into_other() {
        let messages: Vec<String> = (0..15)
            .map(|i| format!("failure {}", "x".repeat(i + 1)))
            .collect();
        let mut errors: Vec<(&str, &str)> =
            messages.iter().map(|m| ("permanent", m.as_str())).collect();
        // The biggest group: the same 503 three times.
        errors.extend([("retryable", "HTTP 503 from ledger"); 3]);
        let groups = open_groups(errors);
        assert_eq!(groups.len(), OPEN_GROUPS_EXPORTED + 1);
        assert_eq!(groups[0].count, 3);
        assert_eq!(groups[0].error_group, "HTTP 503 from ledger");
        let other = groups.last().unwrap();
        assert_eq!((other.error_group.as_str(), other.count), (OTHER_GROUP, 6));
        assert_eq!(groups.iter().map(|g| g.count).sum::<u64>(), 18);
    }

    #[test]
    fn ids_in_errors_never_make_new_groups() {
        let groups = open_groups([
            ("retryable", "HTTP 503 (request 5b2c-77f1)"),
            ("retryable", "HTTP 503 (request 9a0e-0000)"),
        ]);
        assert_eq!(groups.len(), 1, "{groups:?}");
        assert!(!groups[0].error_group.contains("5b2c"));
    }

    #[test]
    fn the_rendered_groups_escape_label_values_and_keep_empty_queues() {
        set_open_groups(
            "render-test-a",
            open_groups([("permanent", r#"bad "quote" \ here"#)]),
        );
        set_open_groups("render-test-b", vec![]);
        let text = render_open_groups();
        assert!(
            text.contains(r#"error_group="bad \"quote\" \\ here""#),
            "{text}"
        );
        assert!(text.contains(
            r#"aqw_poison_open_records{queue="render-test-b",error_kind="",error_group=""} 0"#
        ));
    }

    #[test]
    fn the_oldest_age_is_measured_from_the_earliest_insertion() {
        let now = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let times = [
            now - time::Duration::seconds(30),
            now - time::Duration::seconds(90),
        ];
        assert_eq!(oldest_age_seconds(now, times), 90.0);
        assert_eq!(oldest_age_seconds(now, []), 0.0);
    }
}
