//! A key record as stored in the table: its columns, its status, and the
//! attempt history it keeps (newest last, errors short and scrubbed).

use crate::storage::Entity;
use serde_json::Value;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Key status in the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyStatus {
    /// Claimed: an attempt holds it, or one failed and the next may claim it.
    Pending,
    /// The effect happened: later deliveries are duplicates.
    Done,
    /// Its message went to poison: a replay (or a later message with the
    /// same key) may run it again.
    Poisoned,
    /// Closed by an operator (`poison discard --close-key`): the job must
    /// never run, so any later delivery is settled as a duplicate.
    Cancelled,
}

impl KeyStatus {
    fn parse(s: &str) -> Self {
        match s {
            "done" => KeyStatus::Done,
            "poisoned" => KeyStatus::Poisoned,
            "cancelled" => KeyStatus::Cancelled,
            _ => KeyStatus::Pending,
        }
    }
    /// The status as the `Status` column spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyStatus::Pending => "pending",
            KeyStatus::Done => "done",
            KeyStatus::Poisoned => "poisoned",
            KeyStatus::Cancelled => "cancelled",
        }
    }

    /// Nothing will run for this key again: done, or closed by an operator.
    pub fn is_settled(self) -> bool {
        matches!(self, KeyStatus::Done | KeyStatus::Cancelled)
    }
}

/// What an outside provider answered an attempt: its status, a short
/// scrubbed excerpt of its body, and whether it said it replayed an earlier
/// answer for the same idempotency key (the proof of "exactly once").
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderAnswer {
    /// The HTTP status the provider answered.
    pub status: u16,
    /// A short, scrubbed excerpt of the response body.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub body: String,
    /// The provider said it answered from its idempotency store.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replayed: bool,
}

impl ProviderAnswer {
    /// `provider: replayed` or `provider: HTTP 201`, for one line.
    pub fn summary(&self) -> String {
        if self.replayed {
            "provider: replayed".into()
        } else {
            format!("provider: HTTP {}", self.status)
        }
    }
}

/// One replacement of a key's provider key (`aqw keys new-provider-key`),
/// kept on the key record (`ProviderKeyChanges` column, JSON, newest last,
/// at most `PROVIDER_KEY_CHANGES_LEN`) apart from the attempt history,
/// which later attempts would push it out of: the audit of the riskiest
/// decision of an incident (`poison report` lists each).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderKeyChange {
    /// When (RFC 3339).
    pub at: String,
    /// Who replaced it (scrubbed, cut).
    pub by: String,
    /// Why, with the provider's confirmation (scrubbed, cut).
    pub reason: String,
    /// The provider key it replaced.
    pub old: String,
    /// The provider key it minted.
    pub new: String,
}

/// How many provider-key replacements a key record keeps (the newest).
const PROVIDER_KEY_CHANGES_LEN: usize = 20;

/// `changes` plus `change`, as the `ProviderKeyChanges` column holds them.
pub(super) fn provider_key_changes_with(
    changes: &[ProviderKeyChange],
    change: ProviderKeyChange,
) -> String {
    let mut all = changes.to_vec();
    all.push(change);
    let skip = all.len().saturating_sub(PROVIDER_KEY_CHANGES_LEN);
    serde_json::to_string(&all[skip..]).unwrap_or_else(|_| "[]".into())
}

/// How many attempts a key record remembers (the newest are kept).
pub const HISTORY_LEN: usize = 10;
/// Each remembered error is cut to this many bytes (the full last error is
/// on the poison record).
const HISTORY_ERROR_MAX: usize = 300;

/// One attempt at a key's job, kept on the key record (`History` column,
/// JSON, newest last, at most [`HISTORY_LEN`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attempt {
    /// When the attempt ended (RFC 3339).
    pub at: String,
    /// The queue message the attempt ran.
    pub message_id: String,
    /// The message's DequeueCount at the attempt.
    pub dequeue_count: u32,
    /// `completed`, `retried`, `poisoned` or `released`.
    pub outcome: String,
    /// The attempt's error, short and scrubbed; `None` when it completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The attempt ended without knowing whether the effect happened (a
    /// timeout, a connection lost after the request was sent, a 5xx after
    /// the provider took the body): the provider key is what keeps a retry
    /// from doubling it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub may_have_taken_effect: bool,
    /// What the provider answered a completed attempt (a failed one's status
    /// and body excerpt are in its error: `HTTP 503: …`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<ProviderAnswer>,
}

impl Attempt {
    /// What this attempt means for the effect, in the operator's words:
    /// `may have taken effect` (outcome unknown), `refused, not applied`
    /// (a failure that certainly did not apply), or none (completed).
    pub fn certainty(&self) -> Option<&'static str> {
        if self.may_have_taken_effect {
            Some("may have taken effect")
        } else if self.error.is_some() {
            Some("refused, not applied")
        } else {
            None
        }
    }
}

pub(super) fn parse_history(text: Option<&str>) -> Vec<Attempt> {
    text.and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or_default()
}

/// The history with `attempt` appended, as the column's JSON text.
pub(super) fn history_with(history: &[Attempt], attempt: Attempt) -> String {
    let mut all: Vec<Attempt> = history.to_vec();
    all.push(attempt);
    let skip = all.len().saturating_sub(HISTORY_LEN);
    serde_json::to_string(&all[skip..]).unwrap_or_else(|_| "[]".into())
}

/// An error as the attempt history keeps it: scrubbed and cut.
pub(crate) fn short_error(error: &str) -> String {
    scrubbed_and_cut(error, HISTORY_ERROR_MAX, "…")
}

/// `text` scrubbed of secrets and cut to `max` bytes (on a character
/// boundary), with `marker` saying it was cut.
fn scrubbed_and_cut(text: &str, max: usize, marker: &str) -> String {
    let s = crate::scrub::scrub(text);
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{marker}", &s[..end])
}

/// The idempotency record of one key, as stored.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyRecord {
    /// The business key, as text.
    pub key: String,
    /// The function the key belongs to.
    pub function: String,
    /// Where the key's job stands.
    pub status: KeyStatus,
    /// The provider idempotency key (a UUID minted with the record), sent on
    /// every attempt and replay.
    pub provider_key: String,
    /// How many attempts claimed the key.
    pub attempts: u32,
    /// The last failed attempt's error (capped and scrubbed).
    pub last_error: Option<String>,
    /// Who holds (or last held) the lease:
    /// `<worker>/<message id>/<dequeue count>`.
    pub lease_owner: Option<String>,
    /// When the lease ends (RFC 3339); `None` once released.
    pub lease_until: Option<String>,
    /// The message of the latest attempt.
    pub message_id: Option<String>,
    /// When the key was first claimed, and its provider key minted (RFC 3339).
    pub first_seen: Option<String>,
    /// When the key was marked done (RFC 3339).
    pub completed_at: Option<String>,
    /// How many times an operator replayed the key's job.
    pub replay_count: u32,
    /// Who closed the key (`poison discard --close-key`), when and why.
    pub cancelled_by: Option<String>,
    /// When the key was closed (RFC 3339).
    pub cancelled_at: Option<String>,
    /// Why the key was closed, in the operator's words.
    pub cancel_reason: Option<String>,
    /// The last [`HISTORY_LEN`] attempts, oldest first.
    pub history: Vec<Attempt>,
    /// Attempts spent by earlier queue copies of the job (`aqw serve`'s
    /// retry with backoff; see `ClaimedKey::carried_attempts`).
    pub(crate) carried_attempts: u32,
    /// The claims of the job's current run (`RunAttempts`): counted by
    /// each claim, started again when a poisoned key is taken over or an
    /// operator replays it; what `maxDequeueCount` caps in `aqw run`
    /// (`crate::decide::attempt_of_key`). A record written before the
    /// column existed counts `Attempts`.
    pub run_attempts: u32,
    /// Every replacement of the provider key (who, why, old and new), oldest first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub provider_key_changes: Vec<ProviderKeyChange>,
    /// The record's PartitionKey.
    pub partition_key: String,
    /// The record's RowKey (hex SHA-256 of the key).
    pub row_key: String,
}

impl KeyRecord {
    pub(super) fn from_entity(pk: &str, rk: &str, e: &Entity) -> Self {
        let s = |k: &str| {
            e.get(k)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        };
        let n = |k: &str| e.get(k).and_then(Value::as_u64).unwrap_or(0) as u32;
        KeyRecord {
            key: s("Key").unwrap_or_default(),
            function: s("Function").unwrap_or_default(),
            status: KeyStatus::parse(&s("Status").unwrap_or_default()),
            provider_key: s("ProviderKey").unwrap_or_default(),
            attempts: n("Attempts"),
            last_error: s("LastError"),
            lease_owner: s("LeaseOwner"),
            lease_until: s("LeaseUntil"),
            message_id: s("MessageId"),
            first_seen: s("FirstSeen"),
            completed_at: s("CompletedAt"),
            replay_count: n("ReplayCount"),
            cancelled_by: s("CancelledBy"),
            cancelled_at: s("CancelledAt"),
            cancel_reason: s("CancelReason"),
            history: parse_history(e.get("History").and_then(Value::as_str)),
            carried_attempts: n("CarriedAttempts"),
            run_attempts: e
                .get("RunAttempts")
                .and_then(Value::as_u64)
                .map_or_else(|| n("Attempts"), |v| v as u32),
            provider_key_changes: e
                .get("ProviderKeyChanges")
                .and_then(Value::as_str)
                .and_then(|t| serde_json::from_str(t).ok())
                .unwrap_or_default(),
            partition_key: pk.to_string(),
            row_key: rk.to_string(),
        }
    }

    /// How old its provider key is: the key is minted once, with the record,
    /// at `FirstSeen`. `None` when that time is missing or unreadable.
    pub(crate) fn provider_key_age(&self, now: OffsetDateTime) -> Option<std::time::Duration> {
        let minted = OffsetDateTime::parse(self.first_seen.as_deref()?, &Rfc3339).ok()?;
        Some((now - minted).try_into().unwrap_or_default())
    }

    /// The key's state in a few words, for a dry run's row: `poisoned after
    /// 2 attempt(s)`, `done at …`, `cancelled`.
    pub fn state_summary(&self) -> String {
        match self.status {
            KeyStatus::Done => format!("done at {}", self.completed_at.as_deref().unwrap_or("-")),
            KeyStatus::Cancelled => "cancelled".into(),
            s => format!("{} after {} attempt(s)", s.as_str(), self.attempts),
        }
    }

    /// What the provider answered the attempt that completed the key.
    pub fn completed_answer(&self) -> Option<&ProviderAnswer> {
        self.history
            .iter()
            .rev()
            .find(|a| a.outcome == "completed")
            .and_then(|a| a.provider.as_ref())
    }

    /// The end of a live lease held on the key, if any.
    pub(crate) fn lease_live(&self, now: OffsetDateTime) -> Option<OffsetDateTime> {
        let until = OffsetDateTime::parse(self.lease_until.as_deref()?, &Rfc3339).ok()?;
        (until > now && self.lease_owner.is_some()).then_some(until)
    }
}

/// The history entry for a holder that vanished with its lease.
pub(super) fn abandoned_attempt(rec: &KeyRecord) -> Attempt {
    // Lease owners are `<worker>/<message id>/<dequeue count>`.
    let dc = rec
        .lease_owner
        .as_deref()
        .and_then(|o| o.rsplit('/').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    Attempt {
        at: rec.lease_until.clone().unwrap_or_default(),
        message_id: rec.message_id.clone().unwrap_or_default(),
        dequeue_count: dc,
        outcome: "abandoned".into(),
        error: Some("the attempt ended without a result (crash, kill or lost storage)".into()),
        may_have_taken_effect: true,
        provider: None,
    }
}

/// Now, as RFC 3339 text (the record's time format).
pub(crate) fn now_rfc3339() -> String {
    fmt_time(crate::clock::now_utc())
}

/// `t` as RFC 3339 text; empty if it cannot be formatted.
pub fn fmt_time(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_default()
}

/// Errors are capped before they are stored (Table string properties hold 64 KiB).
pub(crate) fn cap_error(s: &str) -> String {
    scrubbed_and_cut(s, 4096, "… [truncated]")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_keeps_the_newest_attempts_with_short_scrubbed_errors() {
        let attempt = |n: u32| Attempt {
            at: format!("t{n}"),
            message_id: "m".into(),
            dequeue_count: n,
            outcome: "retried".into(),
            error: Some(short_error(&format!(
                "GET https://a.queue.core.windows.net/q?sv=1&sig=secret{n} {}",
                "x".repeat(1000)
            ))),
            may_have_taken_effect: n.is_multiple_of(2),
            provider: None,
        };
        let mut h: Vec<Attempt> = vec![];
        for n in 1..=HISTORY_LEN as u32 + 3 {
            h = parse_history(Some(&history_with(&h, attempt(n))));
        }
        assert_eq!(h.len(), HISTORY_LEN);
        assert_eq!(h[0].dequeue_count, 4, "the oldest three dropped");
        assert_eq!(h.last().unwrap().dequeue_count, HISTORY_LEN as u32 + 3);
        let e = h[0].error.as_deref().unwrap();
        assert!(
            e.len() <= HISTORY_ERROR_MAX + 3 && !e.contains("secret"),
            "{e}"
        );
        assert!(parse_history(Some("not json")).is_empty());
    }
}
