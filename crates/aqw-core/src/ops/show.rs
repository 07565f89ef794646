//! `aqw poison show`.

use super::{OpsError, OpsResult, ProviderWindow, QueueOps};
use crate::idempotency::KeyRecord;
use crate::message::{decode, encode};
use crate::poison::PoisonRecord;

/// `aqw poison show`: the record, its key state and the decoded payload.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShowReport {
    /// The record (its message masked when `redacted` says so).
    pub record: PoisonRecord,
    /// The key's record, when the function and key are known and it exists.
    pub key_record: Option<KeyRecord>,
    /// For a record replaced by a fix: the new key's record, if it has one
    /// (how the corrected job went).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replacement_key_record: Option<KeyRecord>,
    /// The payload as JSON, when it is JSON.
    pub payload: Option<serde_json::Value>,
    /// The payload as text, when it decodes.
    pub payload_text: Option<String>,
    /// Why the message could not be decoded.
    pub decode_error: Option<String>,
    /// The provider key's age against the function's `providerKeyWindow`
    /// (when it declares one and the key has a record).
    pub provider_window: Option<ProviderWindow>,
    /// What the function's `redact` masked in `payload`, `payloadText` and
    /// `record.message` (None when nothing was): they are then not the
    /// exact text, which stays stored and is what a replay sends.
    pub redacted: Option<String>,
    /// When an attempt of a key not yet done may have taken effect: what
    /// the provider's lookup said of its provider key (set by the caller
    /// that can ask, the CLI or the dashboard).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_check: Option<String>,
}

impl ShowReport {
    /// The provider key to check: the key is not done and an attempt may
    /// have taken effect.
    pub fn uncertain_provider_key(&self) -> Option<&str> {
        self.key_record
            .as_ref()
            .filter(|r| !r.status.is_settled() && r.history.iter().any(|a| a.may_have_taken_effect))
            .map(|r| r.provider_key.as_str())
    }
}

/// `aqw poison show`: record `id` (importing a raw host copy first if
/// needed), its key's state, its decoded payload with the function's
/// `redact` fields masked, and the provider key's window.
pub async fn show(ops: &QueueOps, id: &str) -> OpsResult<ShowReport> {
    let (record, _) = match ops.record(id).await? {
        Some(r) => r,
        None => {
            ops.poison.scan(None).await?;
            ops.record(id).await?.ok_or_else(|| {
                OpsError::Usage(format!("no poison record {id} for queue {}", ops.queue))
            })?
        }
    };
    let key_record = ops.key_record(&record).await?;
    let replacement_key_record = ops.key_named(record.replacement_key.as_deref()).await?;
    let window = ops.function.as_ref().and_then(|f| f.provider_key_window);
    let provider_window = key_record
        .as_ref()
        .and_then(|k| ProviderWindow::of(window, k, crate::clock::now_utc()));
    let mut record = record;
    let body = ops.body_of(&record).await.map_err(|e| e.to_string());
    let redaction = ops.function.as_ref().map(|f| &f.redact);
    let (payload, payload_text, decode_error, redacted) = shown(&mut record, body, redaction);
    Ok(ShowReport {
        record,
        key_record,
        replacement_key_record,
        payload,
        payload_text,
        decode_error,
        provider_window,
        redacted,
        provider_check: None,
    })
}

/// A listed record's message as a person may see it (`aqw poison list
/// --output json`, `poison discard --output json`): the function's `redact`
/// fields masked, as [`show`] masks them, or the message wholly hidden when
/// it does not decode; a claim-check reference (no payload in it) is left.
/// What was masked, None when nothing was.
pub fn mask_message(
    record: &mut PoisonRecord,
    redaction: &crate::redact::Redaction,
) -> Option<String> {
    if redaction.is_empty() {
        return None;
    }
    let Ok(text) = decode(&record.message, record.encoding) else {
        record.message = crate::redact::MASK.into();
        return Some("redacted (undecodable, wholly hidden)".into());
    };
    if crate::claim::is_reference(&text) {
        return None;
    }
    let masked = redaction.mask(&text);
    let note = masked.note()?;
    record.message = encode(masked.text(), record.encoding);
    Some(note)
}

/// The payload as shown: JSON and text with the function's `redact` fields
/// masked (the record's message too, unless it is a claim-check reference,
/// which holds no payload), or why there is none to show.
fn shown(
    record: &mut PoisonRecord,
    body: Result<String, String>,
    redaction: Option<&crate::redact::Redaction>,
) -> (
    Option<serde_json::Value>,
    Option<String>,
    Option<String>,
    Option<String>,
) {
    match body {
        Ok(text) => {
            let masked = redaction.map(|r| r.mask(&text));
            let note = masked.as_ref().and_then(|m| m.note());
            let text = match (&masked, &note) {
                (Some(m), Some(_)) => m.text().to_string(),
                _ => text,
            };
            let reference = decode(&record.message, record.encoding)
                .is_ok_and(|p| crate::claim::is_reference(&p));
            if note.is_some() && !reference {
                record.message = encode(&text, record.encoding);
            }
            (serde_json::from_str(&text).ok(), Some(text), None, note)
        }
        Err(e) => {
            // Undecodable: only its raw text could be shown, and a
            // redacted value could be anywhere in it.
            let note = redaction.filter(|r| !r.is_empty()).map(|_| {
                record.message = crate::redact::MASK.into();
                "redacted (undecodable, wholly hidden); replay sends the exact stored text"
                    .to_string()
            });
            (None, None, Some(e), note)
        }
    }
}
