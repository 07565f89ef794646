//! The provider's key window at replay time. A provider forgets an
//! `Idempotency-Key` after a window of its own (Stripe: 24 hours), so a
//! record whose key is still `pending` or `poisoned` (an attempt may have
//! reached the provider) and whose provider key is older than the
//! function's `providerKeyWindow` cannot be replayed safely: the provider
//! would take the old key for a new request and could apply the effect a
//! second time. `poison replay` and `poison fix` refuse such records (a
//! usage error, exit 2, nothing touched) unless the operator overrides it
//! (`--past-provider-window`); the override is kept on the record.

use super::{OpsError, OpsResult, QueueOps};
use crate::idempotency::{IdempotencyKey, KeyRecord, KeyStatus};
use crate::span::fmt_span;
use std::time::Duration;
use time::OffsetDateTime;

/// A key's provider key against its function's `providerKeyWindow`, as
/// `poison show` and the dashboard report it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderWindow {
    /// The business key.
    pub key: String,
    /// The key's status.
    key_status: KeyStatus,
    /// When the provider key was minted (the key record's `FirstSeen`).
    pub(crate) minted_at: String,
    /// `providerKeyWindow`, as a timespan.
    pub(crate) window: String,
    /// `providerKeyWindow` in seconds.
    window_secs: u64,
    /// The provider key's age now, as a timespan.
    key_age: String,
    /// The provider key's age now, in seconds.
    key_age_secs: u64,
    /// Pending or poisoned, and older than the window: the provider may have
    /// forgotten the key, so replay and fix refuse without an override.
    pub past: bool,
}

impl ProviderWindow {
    /// The window state of `key`, when its function declares a window and
    /// the key record says when its provider key was minted.
    pub fn of(window: Option<Duration>, key: &KeyRecord, now: OffsetDateTime) -> Option<Self> {
        let window = window?;
        let age = key.provider_key_age(now)?;
        let unsettled = matches!(key.status, KeyStatus::Pending | KeyStatus::Poisoned);
        Some(ProviderWindow {
            key: key.key.clone(),
            key_status: key.status,
            minted_at: key.first_seen.clone().unwrap_or_default(),
            window: fmt_span(window),
            window_secs: window.as_secs(),
            key_age: fmt_span(age),
            key_age_secs: age.as_secs(),
            past: unsettled && age > window,
        })
    }

    /// One line: the key's age against the window.
    pub fn summary(&self) -> String {
        let verdict = if self.past {
            "PAST the window: the provider may have forgotten it"
        } else {
            "within the window"
        };
        format!(
            "provider key minted {} ({} ago), providerKeyWindow {}: {verdict}",
            self.minted_at, self.key_age, self.window
        )
    }

    /// What the record keeps when an operator overrides the window.
    pub(crate) fn override_note(&self) -> String {
        format!(
            "provider key of {} ({}) was {} old, past providerKeyWindow {}",
            self.key,
            self.key_status.as_str(),
            self.key_age,
            self.window
        )
    }
}

/// The window state of `key` (a key of the queue's function), if the
/// function declares `providerKeyWindow` and the key has a record.
pub(super) async fn state(
    ops: &QueueOps,
    key: Option<&IdempotencyKey>,
) -> OpsResult<Option<ProviderWindow>> {
    let (Some(f), Some(k)) = (ops.function.as_ref(), key) else {
        return Ok(None);
    };
    if f.provider_key_window.is_none() {
        return Ok(None);
    }
    let Some(rec) = ops.keys.get(&f.name, k).await? else {
        return Ok(None);
    };
    Ok(ProviderWindow::of(
        f.provider_key_window,
        &rec,
        crate::clock::now_utc(),
    ))
}

/// The refusal of records past the window (`(record id, state)`), naming
/// the window, each key's age and the override.
pub(super) fn refusal(past: &[(String, ProviderWindow)]) -> OpsError {
    let lines: Vec<String> = past
        .iter()
        .map(|(id, w)| {
            format!(
                "  record {id}: key {} is {}, its provider key minted {} is {} old, past providerKeyWindow {}",
                w.key,
                w.key_status.as_str(),
                w.minted_at,
                w.key_age,
                w.window
            )
        })
        .collect();
    OpsError::Usage(format!(
        "refused: {} record(s) past the provider's key window; the provider may have \
         forgotten the idempotency key and would apply the effect again if an earlier \
         attempt already reached it:\n{}\nCheck with the provider whether the effect \
         happened; then discard the record, or pass --past-provider-window (the dashboard: \
         \"past the provider's window\") to go ahead, which is kept on the record. Nothing \
         was changed.",
        past.len(),
        lines.join("\n")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(status: KeyStatus, first_seen: &str) -> KeyRecord {
        KeyRecord {
            key: "k".into(),
            function: "F".into(),
            status,
            provider_key: "p".into(),
            attempts: 1,
            last_error: None,
            lease_owner: None,
            lease_until: None,
            message_id: None,
            first_seen: Some(first_seen.into()),
            completed_at: None,
            replay_count: 0,
            cancelled_by: None,
            cancelled_at: None,
            cancel_reason: None,
            history: vec![],
            carried_attempts: 0,
            run_attempts: 0,
            provider_key_changes: vec![],
            partition_key: String::new(),
            row_key: String::new(),
        }
    }

    #[test]
    fn only_an_unsettled_key_older_than_the_window_is_past_it() {
        let now = OffsetDateTime::parse(
            "2026-12-04T00:00:00Z",
            &time::format_description::well_known::Rfc3339,
        )
        .unwrap();
        let day = Some(Duration::from_secs(86_400));
        let old = "2026-12-01T00:00:05Z";
        let w = ProviderWindow::of(day, &key(KeyStatus::Pending, old), now).unwrap();
        assert!(w.past);
        assert_eq!(
            (w.key_age.as_str(), w.window.as_str()),
            ("2.23:59:55", "1.00:00:00")
        );
        assert!(
            ProviderWindow::of(day, &key(KeyStatus::Poisoned, old), now)
                .unwrap()
                .past
        );
        assert!(
            !ProviderWindow::of(day, &key(KeyStatus::Done, old), now)
                .unwrap()
                .past
        );
        let young = key(KeyStatus::Pending, "2026-12-03T01:00:00Z");
        assert!(!ProviderWindow::of(day, &young, now).unwrap().past);
        assert!(ProviderWindow::of(None, &key(KeyStatus::Pending, old), now).is_none());
        let m = refusal(&[("id-1".into(), w)]).to_string();
        assert!(
            m.contains("1.00:00:00")
                && m.contains("2.23:59:55")
                && m.contains("--past-provider-window"),
            "{m}"
        );
    }
}
