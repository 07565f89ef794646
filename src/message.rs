//! Message encoding, the poison envelope and the 64 KiB limit.

use base64::Engine;
use serde::{Deserialize, Serialize};

/// How message text is encoded on the queue (`extensions.queues.messageEncoding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MessageEncoding {
    Base64,
    None,
}

impl MessageEncoding {
    pub fn as_str(self) -> &'static str {
        match self {
            MessageEncoding::Base64 => "base64",
            MessageEncoding::None => "none",
        }
    }
}

/// Azure Queue Storage's limit on message text.
pub const MAX_MESSAGE_TEXT: usize = 64 * 1024;

/// The largest payload that fits a message under `encoding`.
pub fn max_payload(encoding: MessageEncoding) -> usize {
    match encoding {
        MessageEncoding::Base64 => MAX_MESSAGE_TEXT / 4 * 3,
        MessageEncoding::None => MAX_MESSAGE_TEXT,
    }
}

/// Why a message could not be decoded. Always permanent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("message is not valid base64 (messageEncoding is base64): {0}")]
    Base64(String),
    #[error("message payload is not valid UTF-8 (byte {0})")]
    Utf8(usize),
}

/// The suffix of a queue's poison queue (Functions' naming).
pub const POISON_SUFFIX: &str = "-poison";

/// The poison queue of `queue`: `<queue>-poison`.
pub fn poison_queue_name(queue: &str) -> String {
    format!("{queue}{POISON_SUFFIX}")
}

/// The record id of a raw copy the Functions host itself put on the poison
/// queue (no aqw envelope): `host-<poison message id>`.
pub fn host_record_id(poison_message_id: &str) -> String {
    format!("host-{poison_message_id}")
}

/// Decode message text into the payload string.
pub fn decode(text: &str, encoding: MessageEncoding) -> Result<String, DecodeError> {
    let bytes = match encoding {
        MessageEncoding::None => return Ok(text.to_string()),
        MessageEncoding::Base64 => base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(|e| DecodeError::Base64(e.to_string()))?,
    };
    String::from_utf8(bytes).map_err(|e| DecodeError::Utf8(e.utf8_error().valid_up_to()))
}

/// Encode a payload as message text.
pub fn encode(payload: &str, encoding: MessageEncoding) -> String {
    match encoding {
        MessageEncoding::None => payload.to_string(),
        MessageEncoding::Base64 => {
            base64::engine::general_purpose::STANDARD.encode(payload.as_bytes())
        }
    }
}

/// Encode a payload, refusing what would not fit in one message (before any I/O).
pub fn encode_checked(payload: &str, encoding: MessageEncoding) -> Result<String, String> {
    let text = encode(payload, encoding);
    if text.len() > MAX_MESSAGE_TEXT {
        return Err(format!(
            "payload is {} bytes; with messageEncoding {} a message holds at most {} bytes of payload ({} bytes of text)",
            payload.len(),
            encoding.as_str(),
            max_payload(encoding),
            MAX_MESSAGE_TEXT
        ));
    }
    Ok(text)
}

/// Kind of the error that poisoned a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ErrorKind {
    Retryable,
    Permanent,
    Decode,
    Timeout,
    Crashed,
}

impl ErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Retryable => "retryable",
            ErrorKind::Permanent => "permanent",
            ErrorKind::Decode => "decode",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Crashed => "crashed",
        }
    }
    pub fn parse(s: &str) -> Self {
        match s {
            "permanent" => ErrorKind::Permanent,
            "decode" => ErrorKind::Decode,
            "timeout" => ErrorKind::Timeout,
            "crashed" => ErrorKind::Crashed,
            _ => ErrorKind::Retryable,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorInfo {
    pub kind: ErrorKind,
    pub message: String,
}

/// Where the full record lives when the envelope would exceed 64 KiB.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordRef {
    pub table: String,
    pub partition_key: String,
    pub row_key: String,
}

/// The poison queue message, `"aqw": "poison/1"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoisonEnvelope {
    pub aqw: String,
    pub queue: String,
    pub function: String,
    pub message_id: String,
    pub inserted_at: String,
    pub dequeue_count: u32,
    pub first_attempt_at: String,
    pub poisoned_at: String,
    pub key: Option<crate::idempotency::IdempotencyKey>,
    pub error: ErrorInfo,
    /// The source message text exactly as received; absent when `record` is set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub record: Option<RecordRef>,
    pub encoding: MessageEncoding,
}

pub const ENVELOPE_VERSION: &str = "poison/1";

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
    fn base64_roundtrip_and_errors() {
        assert_eq!(
            decode(
                &encode("{\"a\":1}", MessageEncoding::Base64),
                MessageEncoding::Base64
            )
            .unwrap(),
            "{\"a\":1}"
        );
        assert!(matches!(
            decode("!!!", MessageEncoding::Base64),
            Err(DecodeError::Base64(_))
        ));
        let bad_utf8 = base64::engine::general_purpose::STANDARD.encode([0x66, 0xff, 0xfe]);
        assert_eq!(
            decode(&bad_utf8, MessageEncoding::Base64),
            Err(DecodeError::Utf8(1))
        );
        assert_eq!(
            decode("raw text", MessageEncoding::None).unwrap(),
            "raw text"
        );
    }

    #[test]
    fn size_limits() {
        assert_eq!(max_payload(MessageEncoding::Base64), 49_152);
        assert!(encode_checked(&"a".repeat(49_152), MessageEncoding::Base64).is_ok());
        assert!(encode_checked(&"a".repeat(49_153), MessageEncoding::Base64).is_err());
        assert!(encode_checked(&"a".repeat(65_536), MessageEncoding::None).is_ok());
        assert!(encode_checked(&"a".repeat(65_537), MessageEncoding::None)
            .unwrap_err()
            .contains("65536"));
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
        fn decoder_never_panics(s in "\\PC{0,200}") {
            let _ = decode(&s, MessageEncoding::Base64);
            let _ = PoisonEnvelope::from_queue_text(&s);
        }

        #[test]
        fn encode_decode_roundtrip(s in "\\PC{0,300}") {
            for enc in [MessageEncoding::Base64, MessageEncoding::None] {
                prop_assert_eq!(decode(&encode(&s, enc), enc).unwrap(), s.clone());
            }
        }
    }
}
