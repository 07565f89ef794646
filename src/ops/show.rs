//! `aqw poison show`.

use super::{OpsError, OpsResult, ProviderWindow, QueueOps};
use crate::idempotency::KeyRecord;
use crate::message::decode;
use crate::poison::PoisonRecord;

/// `aqw poison show`: the record, its key state and the decoded payload.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShowReport {
    pub record: PoisonRecord,
    pub key_record: Option<KeyRecord>,
    pub payload: Option<serde_json::Value>,
    pub payload_text: Option<String>,
    pub decode_error: Option<String>,
    /// The provider key's age against the function's `providerKeyWindow`
    /// (when it declares one and the key has a record).
    pub provider_window: Option<ProviderWindow>,
}

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
    let window = ops.function.as_ref().and_then(|f| f.provider_key_window);
    let provider_window = key_record
        .as_ref()
        .and_then(|k| ProviderWindow::of(window, k, time::OffsetDateTime::now_utc()));
    let (payload, payload_text, decode_error) = match decode(&record.message, record.encoding) {
        Ok(text) => (serde_json::from_str(&text).ok(), Some(text), None),
        Err(e) => (None, None, Some(e.to_string())),
    };
    Ok(ShowReport {
        record,
        key_record,
        payload,
        payload_text,
        decode_error,
        provider_window,
    })
}
