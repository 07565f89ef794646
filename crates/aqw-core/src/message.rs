//! Message encoding, the 64 KiB limit, and the kind of error that poisons a
//! message (the poison envelope itself is [`crate::poison::PoisonEnvelope`]).

use base64::Engine;
use serde::{Deserialize, Serialize};

/// How message text is encoded on the queue (`extensions.queues.messageEncoding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MessageEncoding {
    /// The text is the payload's bytes in base64 (the Functions default).
    Base64,
    /// The text is the payload itself.
    None,
}

impl MessageEncoding {
    /// The setting's value: `base64` or `none`.
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
    /// The text is not valid base64; the decoder's complaint.
    #[error("message is not valid base64 (messageEncoding is base64): {0}")]
    Base64(String),
    /// The decoded bytes are not UTF-8; the offset of the first bad byte.
    #[error("message payload is not valid UTF-8 (byte {0})")]
    Utf8(usize),
}

/// A delivery's payload, decoded from its text once: the poll loop (or, in
/// serve mode, the host's invocation) makes it, and the producer's trace
/// context, the claim check and the job read the same copy. Parsed as JSON
/// at most once, when first asked ([`Payload::json`]); the text is bounded
/// by a message's size (64 KiB) or by serve's invocation body limit.
#[derive(Debug, Clone)]
pub struct Payload {
    decoded: Result<String, DecodeError>,
    json: std::sync::OnceLock<Option<serde_json::Value>>,
}

impl Payload {
    /// Decode a message's text under the queue's `messageEncoding`.
    pub fn decode(text: &str, encoding: MessageEncoding) -> Self {
        Self::from_result(decode(text, encoding))
    }

    /// A payload already decoded (serve mode reads it from the invocation).
    pub fn decoded(payload: String) -> Self {
        Self::from_result(Ok(payload))
    }

    fn from_result(decoded: Result<String, DecodeError>) -> Self {
        Self {
            decoded,
            json: std::sync::OnceLock::new(),
        }
    }

    /// The payload, or why the text could not be decoded.
    pub fn text(&self) -> Result<&str, &DecodeError> {
        self.decoded.as_deref()
    }

    /// The payload as JSON: `None` when it could not be decoded or is not
    /// JSON. Parsed on the first call only.
    pub fn json(&self) -> Option<&serde_json::Value> {
        self.json
            .get_or_init(|| {
                let text = self.decoded.as_deref().ok()?;
                serde_json::from_str(text).ok()
            })
            .as_ref()
    }
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

/// Why a payload cannot be put as one message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// The encoded payload is over the service's message size.
    #[error(
        "payload is {payload_len} bytes; with messageEncoding {} a message holds at most {max_payload} bytes of payload ({max_text} bytes of text)",
        .encoding.as_str()
    )]
    TooLarge {
        /// The payload's length in bytes.
        payload_len: usize,
        /// The app's message encoding.
        encoding: MessageEncoding,
        /// The largest payload that fits with this encoding.
        max_payload: usize,
        /// The largest message text the service takes.
        max_text: usize,
    },
}

/// Encode a payload, refusing what would not fit in one message (before any I/O).
pub fn encode_checked(payload: &str, encoding: MessageEncoding) -> Result<String, EncodeError> {
    let text = encode(payload, encoding);
    if text.len() > MAX_MESSAGE_TEXT {
        return Err(EncodeError::TooLarge {
            payload_len: payload.len(),
            encoding,
            max_payload: max_payload(encoding),
            max_text: MAX_MESSAGE_TEXT,
        });
    }
    Ok(text)
}

/// Kind of the error that poisoned a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ErrorKind {
    /// A failure that may pass on a later attempt.
    Retryable,
    /// A failure no retry can fix.
    Permanent,
    /// The message text could not be decoded.
    Decode,
    /// The handler ran past `functionTimeout`.
    Timeout,
    /// Dequeued past `maxDequeueCount` without completing: its attempts
    /// ended with no verdict (a worker that crashed or lost its lease).
    Crashed,
    /// The provider answered every attempt "still processing an earlier
    /// request with this key" (HTTP 409) up to the cap.
    #[serde(rename = "in_progress")]
    InProgress,
    /// The provider answered with a failure it saved from an earlier
    /// attempt under the same `Idempotency-Key`: no retry with that key can
    /// succeed inside the provider's window.
    #[serde(rename = "replayed_failure")]
    ReplayedFailure,
    /// The job's claim-check blob is gone ([`crate::claim`]): no body to
    /// run it on.
    #[serde(rename = "claim_check_missing")]
    ClaimCheckMissing,
    /// The job's claim-check blob is not the body its reference names
    /// (length or SHA-256).
    #[serde(rename = "claim_check_corrupt")]
    ClaimCheckCorrupt,
    /// The job's claim-check reference is malformed or names anything but
    /// its own queue's content-addressed blob within
    /// `aqw.claimCheck.maxBytes` (`crate::claim::Reference::check`):
    /// refused without a storage call.
    #[serde(rename = "claim_check_invalid")]
    ClaimCheckInvalid,
}

impl ErrorKind {
    /// The kind's name, as records and alerts show it.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Retryable => "retryable",
            ErrorKind::Permanent => "permanent",
            ErrorKind::Decode => "decode",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Crashed => "crashed",
            ErrorKind::InProgress => "in_progress",
            ErrorKind::ReplayedFailure => "replayed_failure",
            ErrorKind::ClaimCheckMissing => "claim_check_missing",
            ErrorKind::ClaimCheckCorrupt => "claim_check_corrupt",
            ErrorKind::ClaimCheckInvalid => "claim_check_invalid",
        }
    }
    /// The kind named `s`; anything unknown is `Retryable`.
    pub fn parse(s: &str) -> Self {
        match s {
            "permanent" => ErrorKind::Permanent,
            "decode" => ErrorKind::Decode,
            "timeout" => ErrorKind::Timeout,
            "crashed" => ErrorKind::Crashed,
            "in_progress" => ErrorKind::InProgress,
            "replayed_failure" => ErrorKind::ReplayedFailure,
            "claim_check_missing" => ErrorKind::ClaimCheckMissing,
            "claim_check_corrupt" => ErrorKind::ClaimCheckCorrupt,
            "claim_check_invalid" => ErrorKind::ClaimCheckInvalid,
            _ => ErrorKind::Retryable,
        }
    }
}

/// The error that poisoned (or may poison) a message: its kind and text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorInfo {
    /// What kind of error it is.
    pub kind: ErrorKind,
    /// Its text.
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
        let e = encode_checked(&"a".repeat(65_537), MessageEncoding::None).unwrap_err();
        assert!(matches!(
            e,
            EncodeError::TooLarge {
                payload_len: 65_537,
                max_payload: 65_536,
                ..
            }
        ));
        assert!(e.to_string().contains("65536"));
    }

    proptest! {
        #[test]
        fn decoder_never_panics(s in "\\PC{0,200}") {
            let _ = decode(&s, MessageEncoding::Base64);
        }

        #[test]
        fn encode_decode_roundtrip(s in "\\PC{0,300}") {
            for enc in [MessageEncoding::Base64, MessageEncoding::None] {
                prop_assert_eq!(decode(&encode(&s, enc), enc).unwrap(), s.clone());
            }
        }
    }
}
