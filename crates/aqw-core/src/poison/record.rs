//! A poison record as stored in the record table: its row format (columns
//! and status) and the merges that change it. Only [`super::store`] writes
//! these rows; it is the one user of the merges below.

use super::envelope::{PoisonEnvelope, PoisonFormat, ENVELOPE_VERSION};
use crate::idempotency::now_rfc3339;
use crate::idempotency::IdempotencyKey;
use crate::message::MessageEncoding;
use crate::message::{ErrorInfo, ErrorKind};
use crate::storage::Entity;
use serde_json::{json, Value};

/// Table string properties hold 64 KiB (32 K UTF-16 units): store message
/// text in parts well under that.
const PART_CHARS: usize = 15_000;

/// Lifecycle of a poison record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RecordStatus {
    /// Poisoned and not acted on yet.
    Open,
    /// Closed by `poison replay`: re-put to the source queue, or its key was
    /// already done.
    Replayed,
    /// Closed by `poison discard`: dropped on purpose.
    Discarded,
    /// Closed by `poison fix`: a corrected message was put in its place.
    Replaced,
}

impl RecordStatus {
    /// The status named `s` (as [`RecordStatus::as_str`] spells it), if any.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "open" => Some(RecordStatus::Open),
            "replayed" => Some(RecordStatus::Replayed),
            "discarded" => Some(RecordStatus::Discarded),
            "replaced" => Some(RecordStatus::Replaced),
            _ => None,
        }
    }
    /// The status as the `Status` column spells it.
    pub const fn as_str(self) -> &'static str {
        match self {
            RecordStatus::Open => "open",
            RecordStatus::Replayed => "replayed",
            RecordStatus::Discarded => "discarded",
            RecordStatus::Replaced => "replaced",
        }
    }
}

/// One poisoned message, as stored in the record table.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoisonRecord {
    /// The source queue (the record's PartitionKey).
    pub queue: String,
    /// The function that ran the message.
    pub function: String,
    /// The source message id (the record id on the CLI).
    pub message_id: String,
    /// When the source message was put on its queue (RFC 3339).
    pub inserted_at: String,
    /// The message's DequeueCount when it was poisoned.
    pub dequeue_count: u32,
    /// When the job was first attempted (RFC 3339).
    pub first_attempt_at: String,
    /// When the message was poisoned (RFC 3339).
    pub poisoned_at: String,
    /// The job's idempotency key, if it has one.
    pub key: Option<crate::idempotency::IdempotencyKey>,
    /// The error that poisoned it.
    pub error: ErrorInfo,
    /// The source message text exactly as received.
    pub message: String,
    /// How `message` is encoded.
    pub encoding: MessageEncoding,
    /// Where the record stands: open, or how it was closed.
    pub status: RecordStatus,
    /// `aqw` for aqw's own envelopes, `host` for raw copies written by the Functions host.
    pub origin: String,
    /// The id of its copy on `<queue>-poison`, once named.
    pub poison_message_id: Option<String>,
    /// The copy's pop receipt as the record kept it, to delete the copy
    /// with (never serialized).
    #[serde(skip)]
    pub poison_pop_receipt: Option<String>,
    /// How many times it was replayed.
    pub replay_count: u32,
    /// When it was replayed (RFC 3339).
    pub replayed_at: Option<String>,
    /// Who replayed it.
    pub replayed_by: Option<String>,
    /// The id of the message the replay put on the source queue.
    pub replay_message_id: Option<String>,
    /// What the replay noted (e.g. the key was already done).
    pub replay_note: Option<String>,
    /// Set just before a replay re-puts the message (crash detection).
    pub(crate) replay_started_at: Option<String>,
    /// When it was discarded (RFC 3339).
    pub discarded_at: Option<String>,
    /// Who discarded it.
    pub discarded_by: Option<String>,
    /// Why, in the operator's words.
    pub discard_reason: Option<String>,
    /// `poison fix`: who put the corrected message, when, its id and key,
    /// and how many bytes longer (or shorter) its payload is.
    pub replaced_at: Option<String>,
    /// Who put the corrected message.
    pub replaced_by: Option<String>,
    /// The corrected message's id.
    pub replacement_message_id: Option<String>,
    /// The corrected payload's key.
    pub replacement_key: Option<crate::idempotency::IdempotencyKey>,
    /// How many bytes longer (negative: shorter) the corrected payload is.
    pub replacement_size_diff: Option<i64>,
    /// The W3C `traceparent` of the attempt that poisoned it, so replay,
    /// discard and fix link their spans to that job's trace.
    pub(crate) trace_parent: Option<String>,
    /// What its `<queue>-poison` copy is (`CopyFormat`, written with the
    /// record before the copy is put, so a raw copy is recognisable as aqw's
    /// own even after a crash before the copy's id is named here).
    pub copy_format: PoisonFormat,
    /// Who replayed or fixed it although its provider key was older than the
    /// function's `providerKeyWindow`, when, and the key's age then.
    pub past_provider_window_by: Option<String>,
    /// When the provider window was overridden (RFC 3339).
    pub past_provider_window_at: Option<String>,
    /// The key's age against the window at the override.
    pub past_provider_window_note: Option<String>,
    /// How many of the job's attempts ended with their outcome unknown
    /// (timeout, connection lost after sending, 408/500/502/504): the
    /// record needs a look at the provider whatever its last error says.
    #[serde(default)]
    pub uncertain_attempts: u32,
}

fn split_parts(text: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut cur = String::new();
    let mut n = 0;
    for c in text.chars() {
        cur.push(c);
        n += 1;
        if n == PART_CHARS {
            parts.push(std::mem::take(&mut cur));
            n = 0;
        }
    }
    if !cur.is_empty() || parts.is_empty() {
        parts.push(cur);
    }
    parts
}

/// The message text stored in `parts` columns `Message0`, `Message1`, ….
fn joined_message(e: &Entity, parts: u32) -> String {
    (0..parts.max(1))
        .map(|i| {
            e.get(&format!("Message{i}"))
                .and_then(Value::as_str)
                .unwrap_or("")
        })
        .collect()
}

/// The `CopyFormat` column: absent (records older than the setting) is the envelope.
fn copy_format(column: Option<&str>) -> PoisonFormat {
    match column {
        Some("raw") => PoisonFormat::Raw,
        _ => PoisonFormat::Envelope,
    }
}

impl PoisonRecord {
    /// The record as table columns (the message text split in parts).
    pub fn to_entity(&self) -> Entity {
        let mut e = Entity::new();
        let mut put = |k: &str, v: Value| {
            e.insert(k.to_string(), v);
        };
        put(col::QUEUE, json!(self.queue));
        put(col::FUNCTION, json!(self.function));
        put(col::MESSAGE_ID, json!(self.message_id));
        put(col::INSERTED_AT, json!(self.inserted_at));
        put(col::DEQUEUE_COUNT, json!(self.dequeue_count));
        put(col::FIRST_ATTEMPT_AT, json!(self.first_attempt_at));
        put(col::POISONED_AT, json!(self.poisoned_at));
        put(col::KEY, json!(self.key.as_deref().unwrap_or_default()));
        put(col::ERROR_KIND, json!(self.error.kind.as_str()));
        put(col::ERROR_MESSAGE, json!(self.error.message));
        put(col::ENCODING, json!(self.encoding.as_str()));
        let parts = split_parts(&self.message);
        put(col::MESSAGE_PARTS, json!(parts.len()));
        for (i, p) in parts.into_iter().enumerate() {
            put(&format!("Message{i}"), json!(p));
        }
        put(col::STATUS, json!(self.status.as_str()));
        put(col::ORIGIN, json!(self.origin));
        put(
            col::POISON_MESSAGE_ID,
            json!(self.poison_message_id.clone().unwrap_or_default()),
        );
        put(
            col::POISON_POP_RECEIPT,
            json!(self.poison_pop_receipt.clone().unwrap_or_default()),
        );
        put(col::REPLAY_COUNT, json!(self.replay_count));
        if let Some(tp) = &self.trace_parent {
            put(col::TRACE_PARENT, json!(tp));
        }
        put(col::COPY_FORMAT, json!(self.copy_format.as_str()));
        if self.uncertain_attempts > 0 {
            put(col::UNCERTAIN_ATTEMPTS, json!(self.uncertain_attempts));
        }
        e
    }

    /// The record a table row holds (missing columns read as empty or defaults).
    pub fn from_entity(e: &Entity) -> Self {
        let s = |k: &str| {
            e.get(k)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        };
        let n = |k: &str| e.get(k).and_then(Value::as_u64).unwrap_or(0) as u32;
        let message = joined_message(e, n(col::MESSAGE_PARTS));
        PoisonRecord {
            queue: s(col::QUEUE).unwrap_or_default(),
            function: s(col::FUNCTION).unwrap_or_default(),
            message_id: s(col::MESSAGE_ID).unwrap_or_default(),
            inserted_at: s(col::INSERTED_AT).unwrap_or_default(),
            dequeue_count: n(col::DEQUEUE_COUNT),
            first_attempt_at: s(col::FIRST_ATTEMPT_AT).unwrap_or_default(),
            poisoned_at: s(col::POISONED_AT).unwrap_or_default(),
            key: s(col::KEY).and_then(|k| IdempotencyKey::new(k).ok()),
            error: ErrorInfo {
                kind: ErrorKind::parse(&s(col::ERROR_KIND).unwrap_or_default()),
                message: s(col::ERROR_MESSAGE).unwrap_or_default(),
            },
            message,
            encoding: if s(col::ENCODING).as_deref() == Some("none") {
                MessageEncoding::None
            } else {
                MessageEncoding::Base64
            },
            status: s(col::STATUS)
                .and_then(|s| RecordStatus::parse(&s))
                .unwrap_or(RecordStatus::Open),
            origin: s(col::ORIGIN).unwrap_or_else(|| "aqw".into()),
            poison_message_id: s(col::POISON_MESSAGE_ID),
            poison_pop_receipt: s(col::POISON_POP_RECEIPT),
            replay_count: n(col::REPLAY_COUNT),
            replayed_at: s(col::REPLAYED_AT),
            replayed_by: s(col::REPLAYED_BY),
            replay_message_id: s(col::REPLAY_MESSAGE_ID),
            replay_note: s(col::REPLAY_NOTE),
            replay_started_at: s(col::REPLAY_STARTED_AT),
            discarded_at: s(col::DISCARDED_AT),
            discarded_by: s(col::DISCARDED_BY),
            discard_reason: s(col::DISCARD_REASON),
            replaced_at: s(col::REPLACED_AT),
            replaced_by: s(col::REPLACED_BY),
            replacement_message_id: s(col::REPLACEMENT_MESSAGE_ID),
            replacement_key: s(col::REPLACEMENT_KEY).and_then(|k| IdempotencyKey::new(k).ok()),
            replacement_size_diff: e.get(col::REPLACEMENT_SIZE_DIFF).and_then(Value::as_i64),
            trace_parent: s(col::TRACE_PARENT),
            copy_format: copy_format(s(col::COPY_FORMAT).as_deref()),
            past_provider_window_by: s(col::PAST_PROVIDER_WINDOW_BY),
            past_provider_window_at: s(col::PAST_PROVIDER_WINDOW_AT),
            past_provider_window_note: s(col::PAST_PROVIDER_WINDOW_NOTE),
            uncertain_attempts: n(col::UNCERTAIN_ATTEMPTS),
        }
    }

    /// A new open record for `envelope` (whose `message` holds the full text).
    pub fn open(envelope: PoisonEnvelope, origin: &str, poison_message_id: Option<String>) -> Self {
        PoisonRecord {
            queue: envelope.queue,
            function: envelope.function,
            message_id: envelope.message_id,
            inserted_at: envelope.inserted_at,
            dequeue_count: envelope.dequeue_count,
            first_attempt_at: envelope.first_attempt_at,
            poisoned_at: envelope.poisoned_at,
            key: envelope.key,
            error: envelope.error,
            message: envelope.message.unwrap_or_default(),
            encoding: envelope.encoding,
            status: RecordStatus::Open,
            origin: origin.to_string(),
            poison_message_id,
            poison_pop_receipt: None,
            replay_count: 0,
            replayed_at: None,
            replayed_by: None,
            replay_message_id: None,
            replay_note: None,
            replay_started_at: None,
            discarded_at: None,
            discarded_by: None,
            discard_reason: None,
            replaced_at: None,
            replaced_by: None,
            replacement_message_id: None,
            replacement_key: None,
            replacement_size_diff: None,
            trace_parent: None,
            uncertain_attempts: 0,
            copy_format: PoisonFormat::Envelope,
            past_provider_window_by: None,
            past_provider_window_at: None,
            past_provider_window_note: None,
        }
    }

    /// The text of its `<queue>-poison` copy: the envelope, or (raw) the
    /// source message text exactly as received.
    pub(super) fn copy_text(&self, poison_table: &str) -> String {
        match self.copy_format {
            PoisonFormat::Envelope => self.envelope().to_queue_text(poison_table),
            PoisonFormat::Raw => self.message.clone(),
        }
    }

    /// Whether `text`, a poison-queue message, is a copy of this record.
    pub(super) fn is_copy_text(&self, text: &str) -> bool {
        match self.copy_format {
            PoisonFormat::Raw => text == self.message,
            PoisonFormat::Envelope => PoisonEnvelope::from_queue_text(text)
                .is_some_and(|e| e.message_id == self.message_id),
        }
    }

    /// The record's RowKey: the source message id, or `host-<id>` for a raw
    /// copy the Functions host put on the poison queue.
    pub(super) fn row_key(&self) -> String {
        if self.origin == "host" {
            super::envelope::host_record_id(&self.message_id)
        } else {
            self.message_id.clone()
        }
    }

    /// Its `poison/1` envelope, with the full message text.
    pub(crate) fn envelope(&self) -> PoisonEnvelope {
        PoisonEnvelope {
            aqw: ENVELOPE_VERSION.into(),
            queue: self.queue.clone(),
            function: self.function.clone(),
            message_id: self.message_id.clone(),
            inserted_at: self.inserted_at.clone(),
            dequeue_count: self.dequeue_count,
            first_attempt_at: self.first_attempt_at.clone(),
            poisoned_at: self.poisoned_at.clone(),
            key: self.key.clone(),
            error: self.error.clone(),
            message: Some(self.message.clone()),
            record: None,
            encoding: self.encoding,
        }
    }
}

/// The narrow query behind the open-records gauge: the status column and
/// its open value, and the two error columns it reads.
pub(super) const OPEN_ERRORS_QUERY: (&str, &str, [&str; 2]) = (
    col::STATUS,
    RecordStatus::Open.as_str(),
    [col::ERROR_KIND, col::ERROR_MESSAGE],
);

/// Every column but the payload's parts (`Message0`…): what a list view
/// reads, so a page over 10,000 records never pulls 10,000 payloads.
pub(super) const SUMMARY_COLUMNS: [&str; 36] = [
    col::COPY_FORMAT,
    col::DEQUEUE_COUNT,
    col::DISCARD_REASON,
    col::DISCARDED_AT,
    col::DISCARDED_BY,
    col::ENCODING,
    col::ERROR_KIND,
    col::ERROR_MESSAGE,
    col::FIRST_ATTEMPT_AT,
    col::FUNCTION,
    col::INSERTED_AT,
    col::KEY,
    col::MESSAGE_ID,
    col::MESSAGE_PARTS,
    col::ORIGIN,
    col::PAST_PROVIDER_WINDOW_AT,
    col::PAST_PROVIDER_WINDOW_BY,
    col::PAST_PROVIDER_WINDOW_NOTE,
    col::POISON_MESSAGE_ID,
    col::POISON_POP_RECEIPT,
    col::POISONED_AT,
    col::QUEUE,
    col::REPLACED_AT,
    col::REPLACED_BY,
    col::REPLACEMENT_KEY,
    col::REPLACEMENT_MESSAGE_ID,
    col::REPLACEMENT_SIZE_DIFF,
    col::REPLAY_COUNT,
    col::REPLAY_MESSAGE_ID,
    col::REPLAY_NOTE,
    col::REPLAY_STARTED_AT,
    col::REPLAYED_AT,
    col::REPLAYED_BY,
    col::STATUS,
    col::TRACE_PARENT,
    col::UNCERTAIN_ATTEMPTS,
];

/// The error of a row read by [`OPEN_ERRORS_QUERY`].
pub(super) fn error_of(e: &Entity) -> ErrorInfo {
    let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or_default();
    ErrorInfo {
        kind: ErrorKind::parse(s(col::ERROR_KIND)),
        message: s(col::ERROR_MESSAGE).to_string(),
    }
}

/// The record table's column names: the one place that spells them.
pub(super) mod col {
    pub(crate) const DEQUEUE_COUNT: &str = "DequeueCount";
    pub(crate) const DISCARD_REASON: &str = "DiscardReason";
    pub(crate) const DISCARDED_AT: &str = "DiscardedAt";
    pub(crate) const DISCARDED_BY: &str = "DiscardedBy";
    pub(crate) const ENCODING: &str = "Encoding";
    pub(crate) const ERROR_KIND: &str = "ErrorKind";
    pub(crate) const ERROR_MESSAGE: &str = "ErrorMessage";
    pub(crate) const FIRST_ATTEMPT_AT: &str = "FirstAttemptAt";
    pub(crate) const FUNCTION: &str = "Function";
    pub(crate) const INSERTED_AT: &str = "InsertedAt";
    pub(crate) const KEY: &str = "Key";
    pub(crate) const MESSAGE_ID: &str = "MessageId";
    pub(crate) const MESSAGE_PARTS: &str = "MessageParts";
    pub(crate) const ORIGIN: &str = "Origin";
    pub(crate) const COPY_FORMAT: &str = "CopyFormat";
    pub(crate) const PAST_PROVIDER_WINDOW_AT: &str = "PastProviderWindowAt";
    pub(crate) const PAST_PROVIDER_WINDOW_BY: &str = "PastProviderWindowBy";
    pub(crate) const PAST_PROVIDER_WINDOW_NOTE: &str = "PastProviderWindowNote";
    pub(crate) const POISON_MESSAGE_ID: &str = "PoisonMessageId";
    pub(crate) const POISON_POP_RECEIPT: &str = "PoisonPopReceipt";
    pub(crate) const POISONED_AT: &str = "PoisonedAt";
    pub(crate) const QUEUE: &str = "Queue";
    pub(crate) const REPLACED_AT: &str = "ReplacedAt";
    pub(crate) const REPLACED_BY: &str = "ReplacedBy";
    pub(crate) const REPLACEMENT_KEY: &str = "ReplacementKey";
    pub(crate) const REPLACEMENT_MESSAGE_ID: &str = "ReplacementMessageId";
    pub(crate) const REPLACEMENT_SIZE_DIFF: &str = "ReplacementSizeDiff";
    pub(crate) const REPLAY_COUNT: &str = "ReplayCount";
    pub(crate) const REPLAY_MESSAGE_ID: &str = "ReplayMessageId";
    pub(crate) const REPLAY_NOTE: &str = "ReplayNote";
    pub(crate) const REPLAY_STARTED_AT: &str = "ReplayStartedAt";
    pub(crate) const REPLAYED_AT: &str = "ReplayedAt";
    pub(crate) const REPLAYED_BY: &str = "ReplayedBy";
    pub(crate) const STATUS: &str = "Status";
    pub(crate) const TRACE_PARENT: &str = "TraceParent";
    pub(crate) const UNCERTAIN_ATTEMPTS: &str = "UncertainAttempts";
}

/// How a replay closes a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replayed<'a> {
    /// The message was re-put to the source queue as `new_message_id`.
    Reput {
        /// The id of the message put on the source queue.
        new_message_id: &'a str,
        /// How an uncertain attempt was checked before (the replay note).
        note: Option<&'a str>,
    },
    /// Its key was already done: closed without a re-put (the record's
    /// replay note says so).
    KeyAlreadyDone,
}

/// What `poison fix` put in place of a record, as the record keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Replacement<'a> {
    /// Who put the corrected message.
    pub by: &'a str,
    /// The corrected message's id.
    pub new_message_id: &'a str,
    /// The corrected payload's key, if the function derives one.
    pub new_key: Option<&'a str>,
    /// How many bytes longer (negative: shorter) the corrected payload is.
    pub size_diff: i64,
}

/// An operator's override of the function's `providerKeyWindow`: who, and
/// the key's age against the window (kept on the record with the time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WindowOverride<'a> {
    /// Who overrode it.
    pub by: &'a str,
    /// The key's age against the window (see
    /// [`crate::ops::ProviderWindow::override_note`]).
    pub note: &'a str,
}

/// Add an override of the provider-key window to a closing merge.
pub(super) fn with_window_override(mut u: Entity, o: Option<&WindowOverride<'_>>) -> Entity {
    if let Some(o) = o {
        u.insert(col::PAST_PROVIDER_WINDOW_BY.into(), json!(o.by));
        u.insert(col::PAST_PROVIDER_WINDOW_AT.into(), json!(now_rfc3339()));
        u.insert(col::PAST_PROVIDER_WINDOW_NOTE.into(), json!(o.note));
    }
    u
}

/// The replay note of a record closed without a re-put.
const NOTE_ALREADY_DONE: &str = "already done";

/// The merge that closes a record as discarded.
pub(super) fn discarded_update(by: &str, reason: &str) -> Entity {
    let mut u = Entity::new();
    u.insert(col::STATUS.into(), json!(RecordStatus::Discarded.as_str()));
    u.insert(col::DISCARDED_AT.into(), json!(now_rfc3339()));
    // Neutralised on the way in too: one line, no control characters.
    u.insert(col::DISCARDED_BY.into(), json!(crate::scrub::one_line(by)));
    u.insert(
        col::DISCARD_REASON.into(),
        json!(crate::scrub::one_line(reason)),
    );
    u
}

/// The merge that closes a record as replaced by a corrected message.
pub(super) fn replaced_update(r: &Replacement<'_>) -> Entity {
    let mut u = Entity::new();
    u.insert(col::STATUS.into(), json!(RecordStatus::Replaced.as_str()));
    u.insert(col::REPLACED_AT.into(), json!(now_rfc3339()));
    u.insert(col::REPLACED_BY.into(), json!(r.by));
    u.insert(col::REPLACEMENT_MESSAGE_ID.into(), json!(r.new_message_id));
    u.insert(
        col::REPLACEMENT_KEY.into(),
        json!(r.new_key.unwrap_or_default()),
    );
    u.insert(col::REPLACEMENT_SIZE_DIFF.into(), json!(r.size_diff));
    u
}

/// The merge that closes a record as replayed, its `replay_count`-th replay.
pub(super) fn replayed_update(by: &str, replay_count: u32, how: Replayed<'_>) -> Entity {
    let mut u = Entity::new();
    u.insert(col::STATUS.into(), json!(RecordStatus::Replayed.as_str()));
    u.insert(col::REPLAYED_AT.into(), json!(now_rfc3339()));
    u.insert(col::REPLAYED_BY.into(), json!(by));
    u.insert(col::REPLAY_COUNT.into(), json!(replay_count));
    match how {
        Replayed::Reput {
            new_message_id,
            note,
        } => {
            u.insert(col::REPLAY_MESSAGE_ID.into(), json!(new_message_id));
            if let Some(n) = note {
                u.insert(col::REPLAY_NOTE.into(), json!(n));
            }
        }
        Replayed::KeyAlreadyDone => {
            u.insert(col::REPLAY_NOTE.into(), json!(NOTE_ALREADY_DONE));
        }
    }
    u
}

/// The crash marker a keyless replay sets before it re-puts.
pub(super) fn replay_started_update() -> Entity {
    let mut u = Entity::new();
    u.insert(col::REPLAY_STARTED_AT.into(), json!(now_rfc3339()));
    u
}

/// The merge that names a record's poison-queue copy.
pub(super) fn copy_update(poison_message_id: &str, pop_receipt: Option<&str>) -> Entity {
    let mut u = Entity::new();
    u.insert(col::POISON_MESSAGE_ID.into(), json!(poison_message_id));
    if let Some(r) = pop_receipt {
        u.insert(col::POISON_POP_RECEIPT.into(), json!(r));
    }
    u
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_messages_split_and_join_exactly() {
        let text: String = "é😀a".repeat(30_000);
        let parts = split_parts(&text);
        assert!(parts.len() > 1 && parts.iter().all(|p| p.chars().count() <= PART_CHARS));
        assert_eq!(parts.concat(), text);
        assert_eq!(split_parts(""), vec![String::new()]);
    }

    /// A replay close carries either the new message id or the already-done
    /// note, never both.
    #[test]
    fn a_replay_close_names_the_reput_or_notes_the_done_key() {
        let reput = replayed_update(
            "ops",
            2,
            Replayed::Reput {
                new_message_id: "m2",
                note: None,
            },
        );
        assert_eq!(reput[col::REPLAY_MESSAGE_ID], json!("m2"));
        assert_eq!(reput[col::REPLAY_COUNT], json!(2));
        assert!(!reput.contains_key(col::REPLAY_NOTE));
        let done = replayed_update("ops", 1, Replayed::KeyAlreadyDone);
        assert_eq!(done[col::REPLAY_NOTE], json!(NOTE_ALREADY_DONE));
        assert_eq!(done[col::STATUS], json!("replayed"));
        assert!(!done.contains_key(col::REPLAY_MESSAGE_ID));
    }
}
