//! The poison envelope (the message aqw puts on `<queue>-poison`) and the
//! names of poison queues and host-copy records.

use crate::message::{encode, ErrorInfo, MessageEncoding, MAX_MESSAGE_TEXT};
use base64::Engine;
use serde::{Deserialize, Serialize};

/// The suffix of a queue's poison queue (Functions' naming).
pub(crate) const POISON_SUFFIX: &str = "-poison";

/// The poison queue of `queue`: `<queue>-poison`.
pub fn poison_queue_name(queue: &str) -> String {
    format!("{queue}{POISON_SUFFIX}")
}

/// The record id of a raw copy the Functions host itself put on the poison
/// queue (no aqw envelope): `host-<poison message id>`.
pub(crate) fn host_record_id(poison_message_id: &str) -> String {
    format!("host-{poison_message_id}")
}

/// What aqw puts on `<queue>-poison` (`aqw.poison.format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PoisonFormat {
    /// The `poison/1` envelope: error, key and ids travel with the message.
    #[default]
    Envelope,
    /// The source message text exactly as received, as the Functions host
    /// writes it, so WebJobs readers of the poison queue see the original
    /// body; the error, history and key stay in the record table.
    Raw,
}

impl PoisonFormat {
    /// The setting's value: `envelope` or `raw`.
    pub fn as_str(self) -> &'static str {
        match self {
            PoisonFormat::Envelope => "envelope",
            PoisonFormat::Raw => "raw",
        }
    }
}

/// Where the full record lives when the envelope would exceed 64 KiB.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordRef {
    /// The record table's name.
    pub(crate) table: String,
    /// The record's PartitionKey (the source queue).
    pub(crate) partition_key: String,
    /// The record's RowKey (the source message id).
    pub(crate) row_key: String,
}

/// The poison queue message, `"aqw": "poison/1"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoisonEnvelope {
    /// The envelope's version: `ENVELOPE_VERSION`.
    pub aqw: String,
    /// The source queue.
    pub queue: String,
    /// The function that ran the message.
    pub function: String,
    /// The source message's id.
    pub message_id: String,
    /// When the source message was put on its queue (RFC 3339).
    pub inserted_at: String,
    /// The message's DequeueCount when it was poisoned.
    pub dequeue_count: u32,
    /// When the job was first attempted (RFC 3339; the insertion time if unknown).
    pub first_attempt_at: String,
    /// When the message was poisoned (RFC 3339).
    pub poisoned_at: String,
    /// The job's idempotency key, if it has one.
    pub key: Option<crate::idempotency::IdempotencyKey>,
    /// The error that poisoned it.
    pub error: ErrorInfo,
    /// The source message text exactly as received; absent when `record` is set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Where the full record is, when the message was left out to fit 64 KiB.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub record: Option<RecordRef>,
    /// How `message` (and the envelope on the queue) is encoded.
    pub encoding: MessageEncoding,
}

/// The `aqw` value of every envelope this version writes.
pub(crate) const ENVELOPE_VERSION: &str = "poison/1";

impl PoisonEnvelope {
    /// The envelope as poison-queue text: JSON, encoded per `encoding`. When
    /// the message itself would not fit, it is replaced by a reference to the
    /// record table (which always holds the full text).
    pub fn to_queue_text(&self, poison_table: &str) -> String {
        let full = encode(
            &serde_json::to_string(self).expect("envelope serialises"),
            self.encoding,
        );
        if full.len() <= MAX_MESSAGE_TEXT {
            return full;
        }
        let mut slim = self.clone();
        slim.message = None;
        slim.record = Some(RecordRef {
            table: poison_table.to_string(),
            partition_key: self.queue.clone(),
            row_key: self.message_id.clone(),
        });
        let text = encode(
            &serde_json::to_string(&slim).expect("envelope serialises"),
            self.encoding,
        );
        if text.len() <= MAX_MESSAGE_TEXT {
            return text;
        }
        // Only a pathological error text could get here (errors are capped).
        slim.error.message = "(error text too long; see the poison record)".into();
        encode(
            &serde_json::to_string(&slim).expect("envelope serialises"),
            self.encoding,
        )
    }

    /// Parse poison-queue text. `None` for anything that is not an aqw envelope
    /// (for example a raw copy written by the Functions host).
    pub fn from_queue_text(text: &str) -> Option<Self> {
        let try_parse = |s: &str| -> Option<Self> {
            let env: Self = serde_json::from_str(s).ok()?;
            (env.aqw == ENVELOPE_VERSION).then_some(env)
        };
        if let Some(e) = try_parse(text) {
            return Some(e);
        }
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .ok()?;
        try_parse(std::str::from_utf8(&decoded).ok()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ErrorKind;
    use proptest::prelude::*;

    fn env(message: &str, encoding: MessageEncoding) -> PoisonEnvelope {
        PoisonEnvelope {
            aqw: ENVELOPE_VERSION.into(),
            queue: "orders".into(),
            function: "F".into(),
            message_id: "id-1".into(),
            inserted_at: "t".into(),
            dequeue_count: 5,
            first_attempt_at: "t".into(),
            poisoned_at: "t".into(),
            key: Some(crate::idempotency::IdempotencyKey::new("k").unwrap()),
            error: ErrorInfo {
                kind: ErrorKind::Retryable,
                message: "boom".into(),
            },
            message: Some(message.into()),
            record: None,
            encoding,
        }
    }

    #[test]
    fn envelope_roundtrips_both_encodings() {
        for enc in [MessageEncoding::Base64, MessageEncoding::None] {
            let e = env("the original text", enc);
            let text = e.to_queue_text("aqwpoison");
            assert_eq!(PoisonEnvelope::from_queue_text(&text).unwrap(), e);
        }
        assert!(PoisonEnvelope::from_queue_text("raw host body").is_none());
        assert!(PoisonEnvelope::from_queue_text("{\"aqw\":\"other\"}").is_none());
    }

    #[test]
    fn oversize_envelope_carries_a_reference() {
        let big = "x".repeat(MAX_MESSAGE_TEXT);
        let e = env(&big, MessageEncoding::None);
        let text = e.to_queue_text("aqwpoison");
        assert!(text.len() <= MAX_MESSAGE_TEXT);
        let parsed = PoisonEnvelope::from_queue_text(&text).unwrap();
        assert!(parsed.message.is_none());
        assert_eq!(parsed.record.unwrap().row_key, "id-1");
    }

    proptest! {
        #[test]
        fn parser_never_panics(s in "\\PC{0,200}") {
            let _ = PoisonEnvelope::from_queue_text(&s);
        }
    }
}
