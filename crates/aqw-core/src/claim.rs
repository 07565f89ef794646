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
//! A reference is input: anyone who can put a message on the queue can
//! write one. Before any storage call it is checked against the queue the
//! message was read from ([`Scope`], `Reference::check`): version 1, the
//! blob exactly `<that queue>/<sha256>` with the hash 64 lowercase hex
//! digits, the length within `aqw.claimCheck.maxBytes`. One that fails is
//! poisoned at once with kind `claim_check_invalid`, without a storage call,
//! and its error says which rule failed, never anything about other blobs:
//! a reference can neither read nor touch another queue's body, nor a blob
//! outside the container (`../`), nor tell whether such a blob exists.
//!
//! A valid reference whose blob is missing poisons the job with kind
//! `claim_check_missing`, one whose blob has the wrong length or hash with
//! `claim_check_corrupt` (read no further than the reference's length);
//! none of the three runs the handler. A storage failure while fetching is
//! retried as any storage failure is (the message comes back after its
//! lease).

use crate::message::{max_payload, ErrorKind, MessageEncoding};
use crate::storage::{BlobRead, BlobStore, StorageError, StorageResult};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The reserved member of a reference.
#[cfg(test)]
const MARKER: &str = "aqw.claimCheck";
/// How every reference aqw writes begins: the worker looks no further into
/// a payload that does not begin so (a cheap test on every message).
const PREFIX: &str = "{\"aqw.claimCheck\":";
/// The container of claim-check blobs unless `aqw.claimCheck.container` says.
pub const DEFAULT_CONTAINER: &str = "aqw-payloads";
/// The smallest threshold: below it a reference could be larger than the
/// body it replaces.
pub const MIN_THRESHOLD: usize = 1024;
/// The largest body a reference may name unless `aqw.claimCheck.maxBytes`
/// says: 16 MiB. A body is held whole in memory while its job runs
/// (fetched, hashed, handed to the handler), so this bounds a job's memory:
/// at the default `batchSize` of 16, 256 MiB per function and replica at
/// worst. It is three times the 5 MiB job the tests run.
pub const DEFAULT_MAX_BYTES: u64 = 16 * 1024 * 1024;
/// The largest `aqw.claimCheck.maxBytes`: 256 MiB (16 such jobs in flight
/// are 4 GiB; a larger body belongs in storage the handler reads itself).
pub const MAX_BYTES_CAP: u64 = 256 * 1024 * 1024;

/// The claim-check settings (`aqw.claimCheck.*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimCheck {
    /// Whether a large job goes to a blob (else it is refused, as before).
    pub enabled: bool,
    /// A payload of more bytes than this is claim-checked.
    pub threshold: usize,
    /// The blob container (in the account of the function's connection).
    pub container: String,
    /// The largest body a reference may name (and a producer may put).
    pub max_bytes: u64,
}

impl ClaimCheck {
    /// The defaults for `encoding`: on, the threshold the largest payload
    /// that still fits a message, the container [`DEFAULT_CONTAINER`].
    pub fn defaults(encoding: MessageEncoding) -> Self {
        Self {
            enabled: true,
            threshold: max_payload(encoding),
            container: DEFAULT_CONTAINER.into(),
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }

    /// What a reference read from `queue` may name.
    pub fn scope<'a>(&self, queue: &'a str) -> Scope<'a> {
        Scope {
            queue,
            max_bytes: self.max_bytes,
        }
    }

    /// A producer's refusal of a body of `len` bytes bound for a blob that
    /// no worker would fetch (over [`ClaimCheck::max_bytes`]).
    pub(crate) fn refuse_oversize(&self, len: usize) -> Result<(), Oversize> {
        match len as u64 > self.max_bytes {
            true => Err(Oversize {
                len,
                max_bytes: self.max_bytes,
            }),
            false => Ok(()),
        }
    }

    /// Whether `payload` goes to a blob under these settings when messages
    /// are encoded per `encoding` (never above what a message holds).
    pub(crate) fn applies_to(&self, payload: &str, encoding: MessageEncoding) -> bool {
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

/// What a reference read from a queue may name: only that queue's own
/// content-addressed blob, of at most `max_bytes`. Every read or write of a
/// blob a message names goes through a reference checked against the scope
/// of the queue the message was read from (`Reference::check`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scope<'a> {
    /// The source queue the message was read from (for a poison record,
    /// the queue it was poisoned from, not `<queue>-poison`).
    pub queue: &'a str,
    /// The largest body a reference may name (`aqw.claimCheck.maxBytes`).
    pub(crate) max_bytes: u64,
}

/// Why a reference is refused before any storage call. The text says which
/// rule failed and never repeats the blob name, nor anything storage holds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    /// Not a JSON object of exactly `v`, `blob`, `length` and `sha256`.
    #[error("the claim-check reference is not an object of v, blob, length and sha256 (line {line}, column {column})")]
    Malformed {
        /// Where the JSON reader stopped.
        line: usize,
        /// Where the JSON reader stopped.
        column: usize,
    },
    /// A version other than 1.
    #[error("the claim-check reference's version is not 1")]
    Version,
    /// `sha256` is not 64 lowercase hex digits.
    #[error("the claim-check reference's sha256 is not 64 lowercase hex digits")]
    Hash,
    /// `blob` is not `<this queue>/<sha256>`.
    #[error(
        "the reference does not name this queue's content-addressed blob (<queue>/<its sha256>)"
    )]
    NotOwnBlob,
    /// `length` is over `aqw.claimCheck.maxBytes`.
    #[error("the claim-check reference's length {length} is over aqw.claimCheck.maxBytes ({max})")]
    TooLong {
        /// What the reference says.
        length: u64,
        /// The setting.
        max: u64,
    },
}

/// A reference that passed `Reference::check` for the queue it was read
/// from: the only kind `fetch` and `refresh_text` ask storage about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked(Reference);

impl std::ops::Deref for Checked {
    type Target = Reference;
    fn deref(&self) -> &Reference {
        &self.0
    }
}

/// 64 lowercase hex digits.
fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl Reference {
    /// The reference as valid in `scope`: version 1, a SHA-256 of 64
    /// lowercase hex digits, the blob exactly `<scope.queue>/<that hash>`,
    /// and a length within `scope.max_bytes`. No I/O.
    pub(crate) fn check(self, scope: Scope<'_>) -> Result<Checked, Invalid> {
        if self.v != 1 {
            return Err(Invalid::Version);
        }
        if !is_sha256_hex(&self.sha256) {
            return Err(Invalid::Hash);
        }
        let own = self
            .blob
            .strip_prefix(scope.queue)
            .and_then(|rest| rest.strip_prefix('/'))
            .is_some_and(|sha| sha == self.sha256);
        if !own || scope.queue.is_empty() {
            return Err(Invalid::NotOwnBlob);
        }
        if self.length > scope.max_bytes {
            return Err(Invalid::TooLong {
                length: self.length,
                max: scope.max_bytes,
            });
        }
        Ok(Checked(self))
    }
}

/// Whether `payload` is taken for a reference (it begins with the
/// reserved member), whatever it says.
pub fn is_reference(payload: &str) -> bool {
    payload.starts_with(PREFIX)
}

/// Whether `payload` is a reference: `None` for an ordinary payload, else
/// the reference checked for `scope` (`Reference::check`) or why it is
/// refused. No I/O.
pub fn parse(payload: &str, scope: Scope<'_>) -> Option<Result<Checked, Invalid>> {
    if !is_reference(payload) {
        return None;
    }
    Some(
        serde_json::from_str::<Wrapper>(payload)
            .map_err(|e| Invalid::Malformed {
                line: e.line(),
                column: e.column(),
            })
            .and_then(|w| w.claim.check(scope)),
    )
}

/// A body over [`ClaimCheck::max_bytes`], refused before it is written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "payload is {len} bytes; aqw.claimCheck.maxBytes allows at most {max_bytes} (a worker \
     would poison a larger claim-checked job at once)"
)]
pub(crate) struct Oversize {
    /// The body's length in bytes.
    pub(crate) len: usize,
    /// The configured limit.
    pub(crate) max_bytes: u64,
}

/// Why a message's payload, claim-checked or not, could not be had.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BodyError {
    /// The message text does not decode.
    #[error(transparent)]
    Decode(#[from] crate::message::DecodeError),
    /// The reference is refused or its blob could not be fetched.
    #[error(transparent)]
    Fetch(#[from] FetchError),
}

/// Why a referenced body could not be had.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FetchError {
    /// The reference breaks a rule of its queue's scope: refused before
    /// any storage call.
    #[error(transparent)]
    Invalid(#[from] Invalid),
    /// The blob is gone.
    #[error("claim-check blob {0} is missing")]
    Missing(String),
    /// The blob is not the body its reference names.
    #[error("{0}")]
    Corrupt(String),
    /// Storage failed; a later attempt may succeed.
    #[error("claim-check blob could not be read: {0}")]
    Storage(#[from] StorageError),
}

impl FetchError {
    /// The kind a job is poisoned with, or `None` for a storage failure
    /// (retried).
    pub(crate) fn poison_kind(&self) -> Option<ErrorKind> {
        match self {
            FetchError::Invalid(_) => Some(ErrorKind::ClaimCheckInvalid),
            FetchError::Missing(_) => Some(ErrorKind::ClaimCheckMissing),
            FetchError::Corrupt(_) => Some(ErrorKind::ClaimCheckCorrupt),
            FetchError::Storage(_) => None,
        }
    }
}

/// A blob name as errors show it (one line, scrubbed). Only a checked
/// reference's name is ever shown: `<queue>/<sha256>` of the message's own
/// queue.
fn shown(name: &str) -> String {
    crate::scrub::scrub(&crate::scrub::one_line(name))
}

/// Write `body` as the blob of its reference on `queue` (creating the
/// container when it is missing) and return the reference.
pub(crate) async fn put_body(
    blobs: &dyn BlobStore,
    queue: &str,
    body: &str,
) -> StorageResult<Reference> {
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

/// The body `reference` names, checked: read no further than the
/// reference's length (a larger blob is corrupt without being read whole),
/// and its length and SHA-256 must be the reference's and it must be UTF-8.
pub(crate) async fn fetch(
    blobs: &dyn BlobStore,
    reference: &Checked,
) -> Result<String, FetchError> {
    let name = shown(&reference.blob);
    let bytes = match blobs.get(&reference.blob, reference.length).await? {
        None => return Err(FetchError::Missing(name)),
        Some(BlobRead::Whole(bytes)) => bytes,
        Some(BlobRead::TooLarge(_)) => {
            return Err(FetchError::Corrupt(format!(
                "claim-check blob {name} is larger than the {} bytes the reference says",
                reference.length
            )))
        }
    };
    if bytes.len() as u64 != reference.length {
        return Err(FetchError::Corrupt(format!(
            "claim-check blob {name} is {} bytes, the reference says {}",
            bytes.len(),
            reference.length
        )));
    }
    if hex::encode(Sha256::digest(&bytes)) != reference.sha256 {
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

/// Message text read from `scope.queue` decoded, and for a reference its
/// body fetched and checked: the payload the handler gets (`poison show`,
/// a fix's redaction restore, a group fix and its preview). The error is a
/// decode or fetch error's text.
pub(crate) async fn decode_body(
    blobs: &dyn BlobStore,
    text: &str,
    encoding: MessageEncoding,
    scope: Scope<'_>,
) -> Result<String, BodyError> {
    let payload = crate::message::decode(text, encoding)?;
    match parse(&payload, scope) {
        None => Ok(payload),
        Some(Err(e)) => Err(FetchError::Invalid(e).into()),
        Some(Ok(r)) => Ok(fetch(blobs, &r).await?),
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

/// Before message text read from `scope.queue` is put on it again (a
/// replay): when it is a reference, mark its blob written now, so retention
/// counts the blob's age from this put; a missing blob is
/// [`FetchError::Missing`] (the job cannot be replayed: its body is gone).
/// A reference that fails [`Reference::check`] is [`FetchError::Invalid`]
/// and touches nothing: only a queue's own blobs are ever written.
pub(crate) async fn refresh_text(
    blobs: &dyn BlobStore,
    text: &str,
    encoding: MessageEncoding,
    scope: Scope<'_>,
) -> Result<(), FetchError> {
    let Ok(payload) = crate::message::decode(text, encoding) else {
        return Ok(());
    };
    match parse(&payload, scope) {
        None => Ok(()),
        Some(Err(e)) => Err(e.into()),
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
/// `claim_check_missing` when it runs, visibly; an invalid reference as
/// `claim_check_invalid`, and nothing is touched for it); one request, and
/// only for a valid reference.
pub(crate) async fn refresh_before_reput(
    blobs: &dyn BlobStore,
    text: &str,
    encoding: MessageEncoding,
    scope: Scope<'_>,
) {
    if let Err(e) = refresh_text(blobs, text, encoding, scope).await {
        let e = crate::scrub::scrub(&e.to_string());
        tracing::warn!(event = "aqw.claim_check.refresh_failed", error = %e, "could not refresh a claim-checked job's blob before putting it back; retention counts its age from its last write");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: u64 = DEFAULT_MAX_BYTES;

    fn scope(queue: &str) -> Scope<'_> {
        Scope {
            queue,
            max_bytes: MAX,
        }
    }

    /// A reference payload with these members, as a producer could write it.
    fn reference(v: u32, blob: &str, length: u64, sha: &str) -> String {
        serde_json::json!({ MARKER: { "v": v, "blob": blob, "length": length, "sha256": sha } })
            .to_string()
    }

    #[test]
    fn a_reference_round_trips_and_ordinary_payloads_are_not_references() {
        let r = Reference::of("orders", "{\"big\":1}");
        assert_eq!(r.length, 9);
        assert!(r.blob.starts_with("orders/") && r.blob.ends_with(&r.sha256));
        let text = r.to_payload();
        assert!(text.starts_with(PREFIX), "{text}");
        assert_eq!(parse(&text, scope("orders")), Some(Ok(Checked(r))));
        assert_eq!(parse("{\"aqw\":1}", scope("orders")), None);
        assert_eq!(parse(" {\"aqw.claimCheck\":1}", scope("orders")), None);
        assert!(matches!(
            parse("{\"aqw.claimCheck\":{\"v\":1}}", scope("orders")),
            Some(Err(Invalid::Malformed { .. }))
        ));
    }

    /// The probes of issue 48 and their neighbours on queue `orders`, each
    /// with the rule it breaks.
    fn refused_cases(sha: &str) -> Vec<(String, Invalid)> {
        let upper = sha.to_uppercase();
        let not_own = [
            "../victim/doc.txt".to_string(),
            "../victim/nope.txt".into(),
            format!("charges/{sha}"),
            format!("orders/../charges/{sha}"),
            format!("orders/{sha}/"),
            format!("orders-poison/{sha}"),
            format!("orders/{}", "0".repeat(64)),
        ];
        let mut cases: Vec<(String, Invalid)> = not_own
            .iter()
            .map(|blob| (reference(1, blob, 1, sha), Invalid::NotOwnBlob))
            .collect();
        let own = format!("orders/{sha}");
        let too_long = Invalid::TooLong {
            length: MAX + 1,
            max: MAX,
        };
        cases.extend([
            (
                reference(1, &format!("orders/{upper}"), 1, &upper),
                Invalid::Hash,
            ),
            (reference(1, "orders/ab", 1, "ab"), Invalid::Hash),
            (reference(2, &own, 1, sha), Invalid::Version),
            (reference(1, &own, MAX + 1, sha), too_long),
        ]);
        cases
    }

    /// Each probe is refused by the rule it breaks, and the error names no
    /// blob.
    #[test]
    fn a_reference_names_only_its_own_queues_blob() {
        let sha = hex::encode(Sha256::digest(b"x"));
        let check = |payload: &str| parse(payload, scope("orders")).unwrap();
        for (payload, want) in refused_cases(&sha) {
            let got = check(&payload).unwrap_err();
            assert_eq!(got, want, "{payload}");
            let text = got.to_string();
            assert!(
                !text.contains("victim") && !text.contains("charges") && !text.contains(&sha),
                "{text}"
            );
        }
        let ok = check(&reference(1, &format!("orders/{sha}"), MAX, &sha)).unwrap();
        assert_eq!(ok.blob, format!("orders/{sha}"));
        assert_eq!(
            parse(&reference(1, &format!("orders/{sha}"), 1, &sha), scope("")),
            Some(Err(Invalid::NotOwnBlob)),
            "no queue, no blob"
        );
        // A malformed reference's error is a position, not its text.
        let e = check("{\"aqw.claimCheck\":{\"v\":1,\"blob\":7,\"length\":\"../victim\"}}")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("victim"), "{e}");
    }

    proptest::proptest! {
        /// Any blob name but `<queue>/<the sha256>` is refused.
        #[test]
        fn any_other_blob_name_is_refused(blob in "\\PC{0,80}", sha in "[0-9a-f]{64}") {
            let payload = reference(1, &blob, 10, &sha);
            let got = parse(&payload, scope("orders")).unwrap();
            proptest::prop_assert_eq!(got.is_ok(), blob == format!("orders/{sha}"));
        }

        /// Names one edit away from the valid one are refused.
        #[test]
        fn a_near_miss_is_refused(sha in "[0-9a-f]{64}", at in 0usize..71, c in proptest::char::any()) {
            let valid = format!("orders/{sha}");
            let mut chars: Vec<char> = valid.chars().collect();
            chars.insert(at.min(chars.len()), c);
            let blob: String = chars.into_iter().collect();
            let got = parse(&reference(1, &blob, 10, &sha), scope("orders")).unwrap();
            proptest::prop_assert!(got.is_err(), "{blob}");
        }
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
        assert!(c.refuse_oversize(DEFAULT_MAX_BYTES as usize).is_ok());
        assert_eq!(
            c.refuse_oversize(DEFAULT_MAX_BYTES as usize + 1),
            Err(Oversize {
                len: DEFAULT_MAX_BYTES as usize + 1,
                max_bytes: DEFAULT_MAX_BYTES
            })
        );
        let off = ClaimCheck {
            enabled: false,
            ..c
        };
        assert!(!off.applies_to(&"a".repeat(100_000), b64));
    }
}
