//! Claim-check payloads: a job body too large for a queue message is
//! written to a blob and the queue carries a small reference to it; the
//! worker fetches and verifies the body before the key is derived and the
//! handler runs, so where the body sits is invisible to the handler.
//!
//! The reference is the job's payload (encoded per `messageEncoding` like
//! any other), a JSON object with one reserved member:
//!
//! ```text
//! {"aqw.claimCheck":{"v":1,"blob":"<queue>/<sha256 hex>","length":<bytes>,"sha256":"<hex>"}}
//! ```
//!
//! The blob's name is the body's SHA-256 under the queue's name
//! (content-addressed): writing the same body twice writes the same bytes
//! to the same name, so a producer's retry never makes a second blob, and
//! a reader can tell the body it got is the one referenced (length and
//! hash checked on every read). The put is unconditional, not
//! `If-None-Match: *`: re-writing the same bytes refreshes the blob's last
//! write, the age retention counts from ([`crate::retention`] keeps a blob
//! until it is older than every message that can refer to it), where a
//! refused put would leave an old blob under a new message.
//!
//! A reference whose blob is missing poisons the job with kind
//! `claim_check_missing`, one whose blob has the wrong length or hash (or
//! whose reference is malformed) with `claim_check_corrupt`; neither runs
//! the handler. A storage failure while fetching is retried as any
//! storage failure is (the message comes back after its lease).

use crate::message::{max_payload, ErrorKind, MessageEncoding};
use crate::storage::{BlobStore, Storage, StorageError, StorageResult};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The reserved member of a reference.
pub const MARKER: &str = "aqw.claimCheck";
/// How every reference aqw writes begins: the worker looks no further into
/// a payload that does not begin so (a cheap test on every message).
const PREFIX: &str = "{\"aqw.claimCheck\":";
/// The container of claim-check blobs unless `aqw.claimCheck.container` says.
pub const DEFAULT_CONTAINER: &str = "aqw-payloads";
/// The smallest threshold: below it a reference could be larger than the
/// body it replaces.
pub const MIN_THRESHOLD: usize = 1024;

/// The claim-check settings (`aqw.claimCheck.*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimCheck {
    /// Whether a large job goes to a blob (else it is refused, as before).
    pub enabled: bool,
    /// A payload of more bytes than this is claim-checked.
    pub threshold: usize,
    /// The blob container (in the account of the function's connection).
    pub container: String,
}

impl ClaimCheck {
    /// The defaults for `encoding`: on, the threshold the largest payload
    /// that still fits a message, the container [`DEFAULT_CONTAINER`].
    pub fn defaults(encoding: MessageEncoding) -> Self {
        Self {
            enabled: true,
            threshold: max_payload(encoding),
            container: DEFAULT_CONTAINER.into(),
        }
    }

    /// Whether `payload` goes to a blob under these settings when messages
    /// are encoded per `encoding` (never above what a message holds).
    pub fn applies_to(&self, payload: &str, encoding: MessageEncoding) -> bool {
        self.enabled && payload.len() > self.threshold.min(max_payload(encoding))
    }
}

/// What a reference says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reference {
    /// The reference format's version (1).
    pub v: u32,
    /// The blob's name in the container.
    pub blob: String,
    /// The body's length in bytes.
    pub length: u64,
    /// The body's SHA-256, lowercase hex.
    pub sha256: String,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Wrapper {
    #[serde(rename = "aqw.claimCheck")]
    claim: Reference,
}

impl Reference {
    /// The reference of `body` on `queue` (nothing written).
    pub fn of(queue: &str, body: &str) -> Self {
        let sha = hex::encode(Sha256::digest(body.as_bytes()));
        Self {
            v: 1,
            blob: format!("{queue}/{sha}"),
            length: body.len() as u64,
            sha256: sha,
        }
    }

    /// The reference as a job payload.
    pub fn to_payload(&self) -> String {
        serde_json::to_string(&Wrapper {
            claim: self.clone(),
        })
        .unwrap_or_default()
    }
}

/// Whether `payload` is a reference: `None` for an ordinary payload, else
/// the reference or why it is malformed.
pub fn parse(payload: &str) -> Option<Result<Reference, String>> {
    if !payload.starts_with(PREFIX) {
        return None;
    }
    Some(
        serde_json::from_str::<Wrapper>(payload)
            .map_err(|e| format!("malformed claim-check reference: {e}"))
            .and_then(|w| match w.claim.v {
                1 => Ok(w.claim),
                v => Err(format!("claim-check reference version {v} is not known")),
            }),
    )
}

/// Why a referenced body could not be had.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FetchError {
    /// The blob is gone.
    #[error("claim-check blob {0} is missing")]
    Missing(String),
    /// The reference is malformed, or the blob is not the body it names.
    #[error("{0}")]
    Corrupt(String),
    /// Storage failed; a later attempt may succeed.
    #[error("claim-check blob could not be read: {0}")]
    Storage(#[from] StorageError),
}

impl FetchError {
    /// The kind a job is poisoned with, or `None` for a storage failure
    /// (retried).
    pub fn poison_kind(&self) -> Option<ErrorKind> {
        match self {
            FetchError::Missing(_) => Some(ErrorKind::ClaimCheckMissing),
            FetchError::Corrupt(_) => Some(ErrorKind::ClaimCheckCorrupt),
            FetchError::Storage(_) => None,
        }
    }
}

/// A blob name as errors show it (one line, scrubbed).
fn shown(name: &str) -> String {
    crate::scrub::scrub(&crate::scrub::one_line(name))
}

/// Write `body` as the blob of its reference on `queue` (creating the
/// container when it is missing) and return the reference.
pub async fn put_body(blobs: &dyn BlobStore, queue: &str, body: &str) -> StorageResult<Reference> {
    let reference = Reference::of(queue, body);
    match blobs.put(&reference.blob, body.as_bytes()).await {
        Err(StorageError::NotFound) => {
            blobs.create_if_missing().await?;
            blobs.put(&reference.blob, body.as_bytes()).await?;
        }
        other => {
            other?;
        }
    }
    Ok(reference)
}

/// The body `reference` names, checked: its length and SHA-256 must be the
/// reference's and it must be UTF-8.
pub async fn fetch(blobs: &dyn BlobStore, reference: &Reference) -> Result<String, FetchError> {
    let name = shown(&reference.blob);
    let bytes = blobs
        .get(&reference.blob)
        .await?
        .ok_or_else(|| FetchError::Missing(name.clone()))?;
    if bytes.len() as u64 != reference.length {
        return Err(FetchError::Corrupt(format!(
            "claim-check blob {name} is {} bytes, the reference says {}",
            bytes.len(),
            reference.length
        )));
    }
    let sha = hex::encode(Sha256::digest(&bytes));
    if !sha.eq_ignore_ascii_case(&reference.sha256) {
        return Err(FetchError::Corrupt(format!(
            "claim-check blob {name} does not have the SHA-256 the reference says"
        )));
    }
    String::from_utf8(bytes).map_err(|e| {
        FetchError::Corrupt(format!(
            "claim-check blob {name} is not UTF-8 (byte {})",
            e.utf8_error().valid_up_to()
        ))
    })
}

/// The job's body: `payload` itself, or the body it references (fetched
/// from `container` of `storage` and checked).
pub async fn resolve(
    storage: &dyn Storage,
    container: &str,
    payload: &str,
) -> Result<Option<String>, FetchError> {
    match parse(payload) {
        None => Ok(None),
        Some(Err(e)) => Err(FetchError::Corrupt(e)),
        Some(Ok(r)) => fetch(storage.blobs(container).as_ref(), &r).await.map(Some),
    }
}

/// Message text decoded, and for a reference its body fetched and
/// checked: the payload the handler gets (`poison show`, a fix's redaction
/// restore). The error is a decode or fetch error's text.
pub async fn decode_body(
    blobs: &dyn BlobStore,
    text: &str,
    encoding: MessageEncoding,
) -> Result<String, String> {
    let payload = crate::message::decode(text, encoding).map_err(|e| e.to_string())?;
    match parse(&payload) {
        None => Ok(payload),
        Some(Err(e)) => Err(e),
        Some(Ok(r)) => fetch(blobs, &r).await.map_err(|e| e.to_string()),
    }
}

/// Write `body` to its blob and encode its reference as message text.
pub async fn put_as_reference(
    blobs: &dyn BlobStore,
    queue: &str,
    body: &str,
    encoding: MessageEncoding,
) -> StorageResult<String> {
    let reference = put_body(blobs, queue, body).await?;
    Ok(crate::message::encode(&reference.to_payload(), encoding))
}

/// Before message text is put on a queue again (a replay): when it is a
/// reference, mark its blob written now, so retention counts the blob's
/// age from this put; a missing blob is [`FetchError::Missing`] (the job
/// cannot be replayed: its body is gone).
pub async fn refresh_text(
    blobs: &dyn BlobStore,
    text: &str,
    encoding: MessageEncoding,
) -> Result<(), FetchError> {
    let Ok(payload) = crate::message::decode(text, encoding) else {
        return Ok(());
    };
    match parse(&payload) {
        None | Some(Err(_)) => Ok(()),
        Some(Ok(r)) => match blobs.touch(&r.blob).await {
            Ok(_) => Ok(()),
            Err(StorageError::NotFound) => Err(FetchError::Missing(shown(&r.blob))),
            Err(e) => Err(e.into()),
        },
    }
}

/// Before the worker puts a message's text back (a retry copy under
/// serve, a parked job, a message rescued from its time-to-live): when it
/// is a reference, refresh its blob, so a job kept alive that way longer
/// than `aqw.retention.keys` still finds its body. Best effort: the put
/// goes ahead whatever happens here (a job whose blob is gone poisons as
/// `claim_check_missing` when it runs, visibly); one request, and only for
/// a reference.
pub async fn refresh_before_reput(blobs: &dyn BlobStore, text: &str, encoding: MessageEncoding) {
    if let Err(e) = refresh_text(blobs, text, encoding).await {
        let e = crate::scrub::scrub(&e.to_string());
        tracing::warn!(event = "aqw.claim_check.refresh_failed", error = %e, "could not refresh a claim-checked job's blob before putting it back; retention counts its age from its last write");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reference_round_trips_and_ordinary_payloads_are_not_references() {
        let r = Reference::of("orders", "{\"big\":1}");
        assert_eq!(r.length, 9);
        assert!(r.blob.starts_with("orders/") && r.blob.ends_with(&r.sha256));
        let text = r.to_payload();
        assert!(text.starts_with(PREFIX), "{text}");
        assert_eq!(parse(&text), Some(Ok(r)));
        assert_eq!(parse("{\"aqw\":1}"), None);
        assert_eq!(parse(" {\"aqw.claimCheck\":1}"), None);
        assert!(matches!(
            parse("{\"aqw.claimCheck\":{\"v\":1}}"),
            Some(Err(_))
        ));
        let v2 = "{\"aqw.claimCheck\":{\"v\":2,\"blob\":\"q/x\",\"length\":1,\"sha256\":\"00\"}}";
        assert!(matches!(parse(v2), Some(Err(e)) if e.contains("version 2")));
    }

    #[test]
    fn the_threshold_is_the_largest_payload_that_fits() {
        let c = ClaimCheck::defaults(MessageEncoding::Base64);
        assert_eq!(c.threshold, 49_152);
        let b64 = MessageEncoding::Base64;
        assert!(!c.applies_to(&"a".repeat(49_152), b64));
        assert!(c.applies_to(&"a".repeat(49_153), b64));
        let none = ClaimCheck::defaults(MessageEncoding::None);
        assert!(!none.applies_to(&"a".repeat(65_536), MessageEncoding::None));
        assert!(
            none.applies_to(&"a".repeat(65_536), b64),
            "capped at what fits"
        );
        let off = ClaimCheck {
            enabled: false,
            ..c
        };
        assert!(!off.applies_to(&"a".repeat(100_000), b64));
    }
}
