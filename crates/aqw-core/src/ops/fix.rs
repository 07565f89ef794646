//! `aqw poison fix`.

use super::{window, OpsError, OpsResult, QueueOps};
use crate::config::FunctionConfig;
use crate::idempotency::derive_key;
use crate::idempotency::IdempotencyKey;
use crate::message::decode;
use crate::poison::{Closing, PoisonRecord, Replacement, WindowOverride};
use crate::storage::Ttl;
use std::time::Duration;
use tracing::Instrument;

/// What `poison fix` did with a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FixAction {
    /// The corrected message was put and the record closed as replaced.
    Replaced,
    /// The corrected job's key is done or cancelled: nothing was put and the
    /// record is still open.
    AlreadyDone,
    /// Someone else closed the record meanwhile (the corrected message was put).
    Skipped,
}

impl FixAction {
    /// The action's name, as the JSON output spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            FixAction::Replaced => "replaced",
            FixAction::AlreadyDone => "already-done",
            FixAction::Skipped => "skipped",
        }
    }
}

impl std::fmt::Display for FixAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// What `poison fix` did.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FixReport {
    /// The record id (the source message id).
    pub(crate) id: String,
    /// `replaced`, or `already-done` (the corrected job's key is done or
    /// cancelled: nothing was put and the record is still open).
    pub action: FixAction,
    /// The key the record keeps (the poisoned payload's).
    pub old_key: Option<IdempotencyKey>,
    /// The key the corrected payload derives (`None`: a keyless function).
    pub new_key: Option<IdempotencyKey>,
    /// The id of the corrected message, when one was put.
    pub new_message_id: Option<String>,
    /// The corrected payload's size minus the original's, in bytes.
    pub size_diff: i64,
    /// With `--wait`: the new key reached done in time.
    pub confirmed: Option<bool>,
    /// Why nothing was put, or what else happened.
    pub detail: Option<String>,
}

/// `poison fix`: put a corrected payload in place of a poisoned one, and
/// close the old record as `replaced` (by whom, the new message id and key,
/// the size difference). The corrected payload must be one the worker would
/// run: it must derive a key (unless the function is keyless) and fit in a
/// message. If its key is already done, nothing is put: the job happened.
///
/// Order: put first, then close the record, then delete the poison copy. A
/// crash after the put leaves the record open; running the fix again puts a
/// second copy that its key settles as a duplicate.
///
/// A record whose key (the old one, or the corrected job's) is pending or
/// poisoned with a provider key older than the function's
/// `providerKeyWindow` is refused (exit 2, nothing put) unless
/// `past_provider_window`, which is then kept on the record.
pub async fn fix(
    ops: &QueueOps,
    id: &str,
    payload: &str,
    by: &str,
    wait: Option<Duration>,
    past_provider_window: bool,
) -> OpsResult<FixReport> {
    let span = crate::traces::step_span!("aqw.fix", otel.kind = "producer", queue = %ops.queue, poison.id = %id, by = %by);
    fix_record(ops, id, payload, by, wait, past_provider_window)
        .instrument(span)
        .await
}

async fn fix_record(
    ops: &QueueOps,
    id: &str,
    payload: &str,
    by: &str,
    wait: Option<Duration>,
    past_provider_window: bool,
) -> OpsResult<FixReport> {
    let (rec, etag) = ops.open_record(id).await?;
    crate::traces::link_to(&tracing::Span::current(), rec.trace_parent.as_deref());
    let mut report = replace_record(ops, &rec, etag, payload, by, past_provider_window).await?;
    if report.action != FixAction::Replaced {
        return Ok(report);
    }
    ops.poison
        .scan_and_delete_copy(&rec, Duration::from_secs(30))
        .await?;
    if let (Some(wait), Some(k), Some(f)) = (wait, &report.new_key, &ops.function) {
        report.confirmed = Some(wait_settled(ops, &f.name, k, wait).await?);
    }
    Ok(report)
}

/// Put `payload` in place of the open record `rec` (read at `etag`) and
/// close it as replaced: everything `poison fix` does but deleting the
/// poison-queue copy (the caller does, by a scan or by the receipt the
/// record kept) and waiting. A durable group fix calls it per record.
pub(crate) async fn replace_record(
    ops: &QueueOps,
    rec: &PoisonRecord,
    mut etag: crate::storage::Etag,
    payload: &str,
    by: &str,
    past_provider_window: bool,
) -> OpsResult<FixReport> {
    let id = rec.message_id.as_str();
    // A payload written from a redacted view gets its masked values back.
    let original = ops.body_of(rec).await;
    let restored = match (&ops.function, original) {
        (Some(f), Ok(original)) => f.redact.restore(payload, &original).into_owned(),
        _ => payload.to_string(),
    };
    let payload = restored.as_str();
    let (f, key) = corrected(ops, payload)?;
    let mut report = new_report(rec, id, payload, key);
    let note = past_window_note(ops, rec, report.new_key.as_ref(), past_provider_window).await?;
    let past_window = note.as_deref().map(|note| WindowOverride { by, note });
    if let Some(k) = &report.new_key {
        if let Some(detail) = already_settled(ops, &f.name, k).await? {
            report.detail = Some(detail);
            return Ok(report);
        }
    }
    let text = super::enqueue::corrected_text(ops, payload).await?;
    let receipt = crate::poison::put_creating(ops.source.as_ref(), &text, Ttl::Default).await?;
    let replacement = Replacement {
        by,
        new_message_id: &receipt.id,
        new_key: report.new_key.as_deref(),
        size_diff: report.size_diff,
    };
    if let Closing::AlreadyClosed(why) = ops
        .poison
        .close_replaced(rec, &replacement, past_window.as_ref(), &mut etag)
        .await?
    {
        report.action = FixAction::Skipped;
        report.detail = Some(format!(
            "{why} (someone else closed it meanwhile); the corrected message {} was put and its key settles any duplicate",
            receipt.id
        ));
        report.new_message_id = Some(receipt.id);
        return Ok(report);
    }
    report.action = FixAction::Replaced;
    report.new_message_id = Some(receipt.id);
    Ok(report)
}

/// The corrected job, checked as the worker would take it: the queue's
/// function and the key it derives (its text is made when it is put:
/// [`super::enqueue::corrected_text`]).
fn corrected(ops: &QueueOps, payload: &str) -> OpsResult<(FunctionConfig, Option<IdempotencyKey>)> {
    let f = ops.function.clone().ok_or_else(|| {
        OpsError::Usage(format!(
            "queue {} is not consumed by a function of this app",
            ops.queue
        ))
    })?;
    let key = derive_key(&f.key, payload).map_err(|e| {
        OpsError::Usage(format!(
            "the corrected payload would be poisoned at once: {e}"
        ))
    })?;
    let claim_check = &ops.app.claim_check;
    if !claim_check.applies_to(payload, ops.app.message_encoding) {
        crate::message::encode_checked(payload, ops.app.message_encoding)?;
    } else {
        claim_check.refuse_oversize(payload.len())?;
    }
    Ok((f, key))
}

/// The old record's key and the corrected job's, against the provider's key
/// window: a refusal if either is past it without the override, else the
/// note the record keeps when the override was needed.
async fn past_window_note(
    ops: &QueueOps,
    rec: &PoisonRecord,
    new_key: Option<&IdempotencyKey>,
    past_provider_window: bool,
) -> OpsResult<Option<String>> {
    let old_key = rec.key.clone().and_then(|k| IdempotencyKey::new(k).ok());
    let mut past = Vec::new();
    for key in [
        old_key.as_ref(),
        new_key.filter(|k| Some(*k) != old_key.as_ref()),
    ] {
        if let Some(w) = window::state(ops, key).await? {
            if w.past {
                past.push((rec.message_id.clone(), w));
            }
        }
    }
    if past.is_empty() {
        return Ok(None);
    }
    if !past_provider_window {
        return Err(window::refusal(&past));
    }
    let notes: Vec<String> = past.iter().map(|(_, w)| w.override_note()).collect();
    Ok(Some(notes.join("; ")))
}

/// The report of fixing `rec` with `payload` (whose key is `new_key`), before
/// anything is done: already-done unless the corrected message is put.
fn new_report(
    rec: &PoisonRecord,
    id: &str,
    payload: &str,
    new_key: Option<IdempotencyKey>,
) -> FixReport {
    let old_len = decode(&rec.message, rec.encoding)
        .map(|p| p.len())
        .unwrap_or(rec.message.len());
    FixReport {
        id: id.into(),
        action: FixAction::AlreadyDone,
        old_key: rec.key.clone(),
        new_key,
        new_message_id: None,
        size_diff: payload.len() as i64 - old_len as i64,
        confirmed: None,
        detail: None,
    }
}

/// If the corrected job's key is already done or cancelled: why nothing is put.
async fn already_settled(
    ops: &QueueOps,
    function: &str,
    k: &IdempotencyKey,
) -> OpsResult<Option<String>> {
    let Some(kr) = ops.keys.get(function, k).await? else {
        return Ok(None);
    };
    if !kr.status.is_settled() {
        return Ok(None);
    }
    Ok(Some(format!(
        "key {} is already {} ({}); nothing put. If that job is the one this record \
         was for, discard the record",
        k.as_str(),
        kr.status.as_str(),
        kr.completed_at.as_deref().unwrap_or("-")
    )))
}

/// `--wait`: poll the key until it is settled or the deadline passes.
async fn wait_settled(
    ops: &QueueOps,
    function: &str,
    k: &IdempotencyKey,
    wait: Duration,
) -> OpsResult<bool> {
    let deadline = super::replay::far_or(wait);
    loop {
        let done = ops
            .keys
            .get(function, k)
            .await?
            .is_some_and(|r| r.status.is_settled());
        if done || tokio::time::Instant::now() >= deadline {
            return Ok(done);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::ReplayAction;

    /// The JSON output spells actions as it did when they were strings.
    #[test]
    fn actions_serialize_as_their_kebab_case_names() {
        for a in [
            ReplayAction::Replayed,
            ReplayAction::AlreadyDone,
            ReplayAction::WouldReplay,
            ReplayAction::WouldCloseAlreadyDone,
            ReplayAction::Skipped,
            ReplayAction::Failed,
        ] {
            assert_eq!(serde_json::to_value(a).unwrap(), a.as_str());
            assert_eq!(format!("{a:<26}|").len(), 27);
        }
        let names = [
            ReplayAction::WouldCloseAlreadyDone.as_str(),
            FixAction::Replaced.as_str(),
            FixAction::AlreadyDone.as_str(),
            FixAction::Skipped.as_str(),
        ];
        assert_eq!(
            names,
            [
                "would-close-already-done",
                "replaced",
                "already-done",
                "skipped"
            ]
        );
        for a in [
            FixAction::Replaced,
            FixAction::AlreadyDone,
            FixAction::Skipped,
        ] {
            assert_eq!(serde_json::to_value(a).unwrap(), a.as_str());
        }
    }
}
