//! What `aqw poison replay` did (or would do), record by record: the
//! action, the key as replay found it, the uncertain gate's and the saved
//! failure's notes, and with `--wait` how each replayed job ended.

use crate::idempotency::{IdempotencyKey, KeyRecord};

/// What replay did (or would do) with one record. Serialized in kebab-case
/// (`would-close-already-done`), as the JSON output has always shown it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReplayAction {
    /// Re-put to the source queue; the record is closed.
    Replayed,
    /// The key is already done: the record is closed without a re-put.
    AlreadyDone,
    /// Dry run: would be re-put.
    WouldReplay,
    /// Dry run: the key is done, the record would be closed without a re-put.
    WouldCloseAlreadyDone,
    /// Not replayed: the record changed meanwhile, or a keyless replay was
    /// interrupted before.
    Skipped,
    /// Not replayed: an error.
    Failed,
}

impl ReplayAction {
    /// What a dry run reports: the key is done (closed without a re-put) or not.
    pub(super) fn would(key_done: bool) -> Self {
        if key_done {
            ReplayAction::WouldCloseAlreadyDone
        } else {
            ReplayAction::WouldReplay
        }
    }

    /// The action's name, as the JSON output spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            ReplayAction::Replayed => "replayed",
            ReplayAction::AlreadyDone => "already-done",
            ReplayAction::WouldReplay => "would-replay",
            ReplayAction::WouldCloseAlreadyDone => "would-close-already-done",
            ReplayAction::Skipped => "skipped",
            ReplayAction::Failed => "failed",
        }
    }
}

impl std::fmt::Display for ReplayAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// A replayed job poisoned again (`--wait`): its new record.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoisonedAgain {
    /// The new record's id (the replayed message's id).
    pub id: String,
    /// Its error kind (`permanent`, `replayed_failure`, …).
    pub kind: String,
    /// Its error, first line, scrubbed.
    pub error: String,
}

/// What replay did (or would do) with one record.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplayItem {
    /// The record id (the source message id).
    pub id: String,
    /// The record's key: re-derived from the payload, else the one kept.
    pub key: Option<IdempotencyKey>,
    /// What replay did with it.
    pub action: ReplayAction,
    /// The id of the message re-put to the source queue.
    pub new_message_id: Option<String>,
    /// Why it was skipped or failed, or a note on what was done.
    pub detail: Option<String>,
    /// With --wait: whether the key is done.
    pub confirmed: Option<bool>,
    /// The key's state when replay looked (`none`: never claimed).
    pub key_state: Option<String>,
    /// With --wait: what the provider answered the attempt that completed
    /// the key (`provider: replayed` proves the effect happened only once).
    pub provider: Option<String>,
    /// The provider key, when an attempt of a key not yet done may have
    /// taken effect: check the provider before replaying (a dry run says so).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uncertain_provider_key: Option<String>,
    /// What the provider's lookup said of that key (set by the caller that
    /// can ask, the CLI or the dashboard).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_check: Option<String>,
    /// The uncertain attempt needs no check: the function's provider
    /// declares it honours `Idempotency-Key` (`handler.idempotent`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub provider_dedupes: bool,
    /// Dry run: a same-key replay of this refusal comes back as the failure
    /// the provider saved (it is known to save failures: why); a new
    /// provider key is the way out once the provider says "not applied".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub saved_failure: Option<String>,
    /// With --wait: the replayed job was poisoned again, as this record.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub poisoned_again: Option<PoisonedAgain>,
    /// The record was closed but its poison-queue copy may still be there
    /// (no receipt deleted it): a scan of the poison queue settles it.
    #[serde(skip)]
    pub(crate) copy_left: bool,
}

impl ReplayItem {
    /// Note the key's state as replay found it (and, when it is not done
    /// and an attempt may have taken effect, its provider key); whether
    /// the key is done.
    pub(super) fn note_key(&mut self, rec: Option<&KeyRecord>) -> bool {
        self.key_state = Some(rec.map_or("none".into(), |r| r.state_summary()));
        let done = rec.is_some_and(|r| r.status.is_settled());
        self.uncertain_provider_key = rec
            .filter(|r| !done && r.history.iter().any(|a| a.may_have_taken_effect))
            .map(|r| r.provider_key.clone());
        done
    }

    pub(super) fn new(id: &str, key: Option<IdempotencyKey>, action: ReplayAction) -> Self {
        ReplayItem {
            id: id.to_string(),
            key,
            action,
            new_message_id: None,
            detail: None,
            confirmed: None,
            key_state: None,
            uncertain_provider_key: None,
            provider_check: None,
            provider_dedupes: false,
            saved_failure: None,
            poisoned_again: None,
            provider: None,
            copy_left: false,
        }
    }

    pub(super) fn with(mut self, action: ReplayAction, detail: impl Into<String>) -> Self {
        self.action = action;
        self.detail = Some(detail.into());
        self
    }
}

/// What `aqw poison replay` did (or would do): counts and each record.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplayReport {
    /// The source queue.
    pub queue: String,
    /// The function that consumes it, if the app has one.
    pub function: Option<String>,
    /// How many open records the filter and limit selected.
    pub selected: usize,
    /// How many were re-put.
    pub replayed: usize,
    /// How many were closed without a re-put, their key already done.
    pub already_done: usize,
    /// How many were skipped or failed.
    pub failed: usize,
    /// With `--wait`: how many replayed jobs were neither done nor poisoned
    /// again by the deadline.
    pub unconfirmed: usize,
    /// With `--wait`: how many replayed jobs were poisoned again.
    pub poisoned_again: usize,
    /// Nothing was changed (`--dry-run`).
    pub dry_run: bool,
    /// `--past-provider-window` was given.
    pub past_provider_window: bool,
    /// The durable operation that carried it out (`--all`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
    /// One item per selected record.
    pub items: Vec<ReplayItem>,
}

impl ReplayReport {
    /// Exit 1 when some selected records were not replayed, not confirmed,
    /// or poisoned again.
    pub fn needs_a_person(&self) -> bool {
        self.failed > 0 || self.unconfirmed > 0 || self.poisoned_again > 0
    }

    pub(crate) fn push(&mut self, item: ReplayItem) {
        match item.action {
            ReplayAction::Replayed => self.replayed += 1,
            ReplayAction::AlreadyDone => self.already_done += 1,
            ReplayAction::Failed | ReplayAction::Skipped => self.failed += 1,
            ReplayAction::WouldReplay | ReplayAction::WouldCloseAlreadyDone => {}
        }
        self.items.push(item);
    }
}
