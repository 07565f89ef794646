//! The progress page after a replay or a fix: it refreshes itself while a
//! key it waits for is not yet done, and stops — saying why — when there is
//! nothing to wait for (every key done, or no such record) or when
//! [`PROGRESS_DEADLINE`] has passed since the action, so a tab left open
//! does not poll storage every second forever.

use super::error::{Path, Query};
use super::forms::ProgressQuery;
use super::request::{page, see_other, Answer, Reader, S};
use super::views::{self, enc, Progress};
use super::MAX_SELECTION;
use aqw_core::ops::{OpsError, QueueOps};
use aqw_core::poison::RecordStatus;
use axum::extract::State;
use axum::http::StatusCode;
use std::time::{SystemTime, UNIX_EPOCH};

/// How long after the action the page keeps refreshing itself.
pub const PROGRESS_DEADLINE_SECS: u64 = 10 * 60;

/// Whether a record could have this id: table keys cannot hold `/`, `\`,
/// `#`, `?` or control characters (storage would refuse the request).
pub fn plausible_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 1024
        && !id
            .chars()
            .any(|c| matches!(c, '/' | '\\' | '#' | '?') || c.is_control())
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The progress page of `ids`, started now.
pub fn progress_url(queue: &str, ids: &[String]) -> String {
    progress_url_since(queue, ids, now_secs())
}

fn progress_url_since(queue: &str, ids: &[String], since: u64) -> String {
    let q: Vec<String> = ids.iter().map(|i| format!("id={}", enc(i))).collect();
    format!("/q/{}/progress?{}&since={since}", enc(queue), q.join("&"))
}

fn missing(id: &str) -> Progress {
    Progress {
        record: None,
        id: id.into(),
        key: None,
        key_status: None,
        settled: false,
    }
}

async fn progress_of(ops: &QueueOps, id: &str) -> Result<Progress, OpsError> {
    if !plausible_id(id) {
        return Ok(missing(id));
    }
    let Some((rec, _)) = ops.record(id).await? else {
        return Ok(missing(id));
    };
    let mut probe = rec.clone();
    if rec.status == RecordStatus::Replaced {
        probe.key = rec.replacement_key.clone();
    }
    let kr = ops.key_record(&probe).await?;
    Ok(Progress {
        id: id.into(),
        key: probe.key.as_deref().map(str::to_string),
        key_status: kr.as_ref().map(|k| k.status.as_str().to_string()),
        settled: rec.status != RecordStatus::Open && kr.is_some_and(|k| k.status.is_settled()),
        record: Some(rec),
    })
}

/// Why the page no longer refreshes although a key is not done, if so.
fn stopped(rows: &[Progress], since: u64) -> Option<String> {
    let waiting = rows.iter().any(|r| r.record.is_some() && !r.settled);
    let gone = rows.iter().filter(|r| r.record.is_none()).count();
    let elapsed = now_secs().saturating_sub(since);
    if waiting && elapsed > PROGRESS_DEADLINE_SECS {
        return Some(format!(
            "Stopped refreshing {} minutes after the action: a key is still not done. \
             Reload to look again, or check the worker.",
            PROGRESS_DEADLINE_SECS / 60
        ));
    }
    (gone > 0 && !waiting).then(|| {
        format!("Not refreshing: {gone} record(s) do not exist, so there is nothing to wait for.")
    })
}

pub async fn progress(
    State(d): S,
    Path(queue): Path<String>,
    Reader(v): Reader,
    Query(q): Query<ProgressQuery>,
) -> Answer {
    let ops = d.queue_ops(&queue)?;
    let ids: Vec<String> = (q.ids.into_iter())
        .filter(|i| !i.is_empty())
        .take(MAX_SELECTION)
        .collect();
    let Some(since) = q.since.get().and_then(|s| s.parse::<u64>().ok()) else {
        // An old link: start the deadline now, in the URL the page reloads.
        return Ok(see_other(&progress_url(&queue, &ids)));
    };
    let mut rows = Vec::new();
    for id in &ids {
        rows.push(progress_of(ops, id).await?);
    }
    let note = stopped(&rows, since);
    let waiting = rows.iter().any(|r| r.record.is_some() && !r.settled);
    let refresh = (waiting && note.is_none()).then_some(1);
    let body = views::progress_page(&queue, &rows, note.as_deref());
    Ok(page(StatusCode::OK, "Replay progress", &v, refresh, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_a_table_key_cannot_hold_are_not_records() {
        for ok in ["abc-123", "host-9f", "x.y:z"] {
            assert!(plausible_id(ok), "{ok}");
        }
        for bad in ["", "a/b", "a\\b", "a#b", "a?b", "a\nb"] {
            assert!(!plausible_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn the_page_stops_for_missing_records_and_after_its_deadline() {
        let gone = vec![missing("nope")];
        assert!(stopped(&gone, now_secs()).unwrap().contains("do not exist"));
        let url = progress_url_since("q", &["a b".into()], 7);
        assert_eq!(url, "/q/q/progress?id=a+b&since=7");
    }
}
