//! Durable group operations (issue 40): a group replay, discard or fix is a row
//! in the control table (partition `PARTITION`, RowKey the operation's
//! id), carried out by whoever holds its lease, not by the request that
//! asked for it. The row says who asked, what (the selection, the
//! fingerprint of the reviewed ids, a cutoff so records poisoned later are
//! not swept in), the rate, the state, the counts and the lease; every
//! write after the insert is conditional on the row's ETag, so a cancel
//! from any process and a second executor are seen at the next record.
//!
//! No ids are stored (10,000 would pass an entity's 1 MiB): a resumed
//! operation re-selects the still-open records of its selection, and each
//! record's close is ETag-guarded, so a record handled before a crash is
//! never selected again. The executor is [`execute`]; this file is the model
//! and [`OperationStore`], the only code that knows the row's columns.

mod interactive;
mod patch;
mod row;
mod run;

pub use interactive::replay_group;
/// A parsed JSON Patch (RFC 6902), as [`parse_patch`] gives it.
pub use json_patch::Patch;
pub use patch::PatchError;
pub(crate) use patch::MAX_PATCH_OPS;
pub use row::{CancelRefusal, Claim, OperationStore, Refresh};
pub use run::{execute, resume_idle, watch, ExecuteOptions, LEASE};

use super::{Filter, OpsResult, QueueOps};
use crate::poison::{PoisonRecord, RecordStatus};
use crate::redact::Redaction;
use crate::storage::Etag;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// The control-table partition of operation rows.
pub(crate) const PARTITION: &str = "operations";

/// The rate of an operation when none is given: records per second.
pub const DEFAULT_RATE: f64 = 50.0;

/// The slowest rate an operation may be given: one record every 10 s, so a
/// record's checkpoint always renews the lease well before it expires.
pub const MIN_RATE: f64 = 0.1;

/// The fastest rate an operation may be given, records per second.
pub const MAX_RATE: f64 = 1000.0;

/// Records this operation replayed that came back poisoned before it halts
/// itself, when none is given.
pub const DEFAULT_HALT_AFTER: u32 = 3;

/// Take-overs of an operation whose executor died holding its lease, in a
/// row with no checkpoint between them, before the next claim halts it
/// (`crashed executors`) instead of running it again: an operation that
/// kills its executor (out of memory, say) would otherwise be taken by
/// every idle `aqw run` in turn, each dying the same way.
pub const MAX_TAKEOVERS: u32 = 3;

/// What an operation does with each record.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum OpKind {
    /// Re-put each record with its original key (`aqw poison replay`).
    Replay {
        /// Replay records past the provider's key window too.
        past_provider_window: bool,
        /// The operator checked the provider for uncertain attempts.
        uncertain_checked: bool,
    },
    /// Close each record without a re-put (`aqw poison discard`).
    Discard {
        /// Why, kept on each record.
        reason: String,
        /// Also close each record's key (a resend becomes a duplicate).
        close_key: bool,
    },
    /// Put each record's payload corrected by one JSON Patch (RFC 6902) in
    /// its place, closing the record as replaced (`aqw poison fix`, for a
    /// bad producer's whole batch). A record the patch does not apply to
    /// (a `test` fails, a path is missing, the payload is not JSON) is left
    /// open and counted as skipped.
    Fix {
        /// The patch, as JSON text (checked by [`parse_patch`]).
        patch: String,
        /// Go ahead although a provider key is older than the function's
        /// providerKeyWindow; kept on each record.
        past_provider_window: bool,
    },
    /// A kind this aqw does not know (written by a newer one): shown,
    /// never carried out here.
    Unknown {
        /// The kind's name as the row spells it.
        name: String,
    },
}

impl OpKind {
    /// `replay`, `discard`, `fix`, or `unknown`.
    pub fn name(&self) -> &'static str {
        match self {
            OpKind::Replay { .. } => "replay",
            OpKind::Discard { .. } => "discard",
            OpKind::Fix { .. } => "fix",
            OpKind::Unknown { .. } => "unknown",
        }
    }
}

/// The largest JSON Patch a group fix takes, in bytes: it is kept on the
/// operation's row (a property holds 64 KiB), and a correction is small.
const MAX_PATCH_BYTES: usize = 16 * 1024;

/// `text` as a JSON Patch (RFC 6902): a non-empty array of at most
/// `MAX_PATCH_OPS` operations, at most `MAX_PATCH_BYTES`. The error
/// says what is wrong, for exit 2 or a 400.
pub fn parse_patch(text: &str) -> Result<json_patch::Patch, PatchRefusal> {
    if text.len() > MAX_PATCH_BYTES {
        return Err(PatchRefusal::TooLarge {
            bytes: text.len(),
            max: MAX_PATCH_BYTES,
        });
    }
    let patch: json_patch::Patch =
        serde_json::from_str(text).map_err(|e| PatchRefusal::NotAPatch {
            reason: e.to_string(),
        })?;
    if patch.0.is_empty() {
        return Err(PatchRefusal::NoOperations);
    }
    if patch.0.len() > MAX_PATCH_OPS {
        return Err(PatchRefusal::TooManyOperations {
            count: patch.0.len(),
            max: MAX_PATCH_OPS,
        });
    }
    Ok(patch)
}

/// Why a group fix's JSON Patch is refused before it touches a record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatchRefusal {
    /// Over `MAX_PATCH_BYTES`.
    #[error("the patch is {bytes} bytes; at most {max}")]
    TooLarge {
        /// The patch's length.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// Not an RFC 6902 array of operations.
    #[error("not a JSON Patch (RFC 6902: an array of {{\"op\",\"path\",…}}): {reason}")]
    NotAPatch {
        /// The JSON reader's reason.
        reason: String,
    },
    /// An empty array.
    #[error("the patch has no operations")]
    NoOperations,
    /// Over `MAX_PATCH_OPS` operations.
    #[error("the patch has {count} operations; at most {max}")]
    TooManyOperations {
        /// The operations given.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A `move`, `copy` or `test` reading a redacted field.
    #[error("the patch reads {pointer:?}, a redacted field (or above or below one): a group fix may replace or remove a redacted field, never move, copy or test one")]
    ReadsRedacted {
        /// The pointer read (from the patch, not the payload).
        pointer: String,
    },
}

/// [`parse_patch`], refused when it reads a field `redact` masks: a `move`
/// or `copy` from one, or a `test` of one (or of a pointer above or below
/// one; a rule's `*` matches any segment) would carry its value into a key,
/// a preview or a field shown unmasked, or answer a guess. Writing or
/// removing one is fine.
pub fn parse_patch_for(text: &str, redact: &Redaction) -> Result<json_patch::Patch, PatchRefusal> {
    use json_patch::PatchOperation as Op;
    let patch = parse_patch(text)?;
    for op in &patch.0 {
        let read = match op {
            Op::Move(m) => Some(m.from.to_string()),
            Op::Copy(c) => Some(c.from.to_string()),
            Op::Test(t) => Some(t.path.to_string()),
            _ => None,
        };
        if let Some(p) = read.filter(|p| redact.touches(p)) {
            return Err(PatchRefusal::ReadsRedacted { pointer: p });
        }
    }
    Ok(patch)
}

/// Why `ops`'s function cannot take a group fix, if it cannot: it must be
/// keyed, since a corrected job put twice (a fix interrupted between its
/// put and its record's close, then resumed) is settled only by its key.
pub fn fix_refused(ops: &QueueOps) -> Option<String> {
    match ops.function.as_ref() {
        None => Some(format!("no function of this app consumes {}", ops.queue)),
        Some(f) if matches!(f.key, crate::idempotency::KeySpec::None) => Some(format!(
            "{} is keyless (\"key\": \"none\"): a group fix needs a keyed function, since a corrected job put twice is settled only by its key; fix records one by one with `aqw poison fix`",
            f.name
        )),
        Some(_) => None,
    }
}

/// `payload` corrected by `patch`, as compact JSON: what a group fix puts in
/// place of a record. The only code that applies a patch: op by op, within
/// the bounds of the `patch` module (the payload's growth, the bytes copied, the
/// number of ops), refused before an op allocates past them. The error
/// (one line) says why there is no corrected payload.
fn apply_patch(patch: &json_patch::Patch, payload: &str) -> Result<String, PatchError> {
    patch::apply(&patch.0, payload)
}

/// Where an operation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OpState {
    /// Created; no executor has started it.
    Queued,
    /// An executor holds (or held, until its lease expires) the lease.
    Running,
    /// Every selected record was handled.
    Done,
    /// Someone cancelled it; records handled before stay handled.
    Cancelled,
    /// It stopped itself: the breaker opened, or replayed jobs came back poisoned.
    Halted,
    /// It could not go on (its selection no longer parses, say).
    Failed,
}

impl OpState {
    /// The state's name, as the row and the JSON output spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            OpState::Queued => "queued",
            OpState::Running => "running",
            OpState::Done => "done",
            OpState::Cancelled => "cancelled",
            OpState::Halted => "halted",
            OpState::Failed => "failed",
        }
    }

    /// The state named `s`.
    pub fn parse(s: &str) -> Option<Self> {
        [
            OpState::Queued,
            OpState::Running,
            OpState::Done,
            OpState::Cancelled,
            OpState::Halted,
            OpState::Failed,
        ]
        .into_iter()
        .find(|st| st.as_str() == s)
    }

    /// Done, cancelled, halted or failed: nothing will run it again.
    pub fn is_final(self) -> bool {
        !matches!(self, OpState::Queued | OpState::Running)
    }
}

/// The records an operation acts on: the open records of one queue that
/// pass these filters and were poisoned at or before `cutoff`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Selection {
    /// Only records of this function.
    pub function: Option<String>,
    /// Only records whose error matches this regular expression.
    pub error: Option<String>,
    /// Only records poisoned at or after this time (RFC 3339).
    pub since: Option<String>,
    /// Only records poisoned at or before this time (RFC 3339).
    pub until: Option<String>,
    /// Only records of this alert group (`kind|first line masked`, as
    /// `group_of` and the dashboard's groups name it).
    pub group: Option<String>,
    /// Only records whose id is this text, or whose key or payload (with
    /// the function's `redact` fields masked) contains it, ignoring case:
    /// the dashboard's search.
    pub search: Option<String>,
    /// At most this many records in all (`poison replay --all --limit`),
    /// oldest first; a resumed run takes what its predecessors left of it.
    pub limit: Option<u64>,
    /// The operation's creation: records poisoned later are not its own.
    pub cutoff: String,
}

impl Selection {
    /// The filter of `poison list` this selection is, forced to open records.
    pub(crate) fn filter(&self) -> Result<Filter, SelectionError> {
        let time = |s: &Option<String>| {
            s.as_deref()
                .map(|t| {
                    OffsetDateTime::parse(t, &Rfc3339).map_err(|e| SelectionError::Time {
                        text: t.to_string(),
                        reason: e.to_string(),
                    })
                })
                .transpose()
        };
        let error = self
            .error
            .as_deref()
            .map(|re| {
                regex::Regex::new(re).map_err(|e| SelectionError::ErrorPattern {
                    pattern: re.to_string(),
                    reason: e.to_string(),
                })
            })
            .transpose()?;
        let cutoff = Some(self.cutoff.clone());
        let until = match (time(&self.until)?, time(&cutoff)?) {
            (Some(u), Some(c)) => Some(u.min(c)),
            (u, c) => u.or(c),
        };
        Ok(Filter {
            status: Some(RecordStatus::Open),
            since: time(&self.since)?,
            until,
            function: self.function.clone(),
            error,
            ids: vec![],
        })
    }

    /// A readable summary, for the list and the audit log.
    pub fn describe(&self) -> String {
        let mut parts = vec![];
        for (name, v) in [
            ("function", &self.function),
            ("error", &self.error),
            ("since", &self.since),
            ("until", &self.until),
            ("group", &self.group),
            ("search", &self.search),
        ] {
            if let Some(v) = v {
                parts.push(format!("{name}={v:?}"));
            }
        }
        if let Some(l) = self.limit {
            parts.push(format!("at most {l}"));
        }
        parts.push(format!("poisoned by {}", self.cutoff));
        format!("open records with {}", parts.join(", "))
    }
}

impl Selection {
    /// Whether `rec` passes the group and the search (the filter's part is
    /// [`Selection::filter`]); `redact` is the function's, so a search
    /// cannot probe a masked field.
    pub(crate) fn picks(&self, rec: &PoisonRecord, redact: &Redaction) -> bool {
        let in_group = self.group.as_ref().is_none_or(|g| *g == group_of(rec));
        in_group && self.search.as_deref().is_none_or(|s| found(rec, s, redact))
    }
}

/// The alert group of a record: its error kind and first line, masked as
/// the alert and the dashboard group them.
fn group_of(rec: &PoisonRecord) -> String {
    let masked = crate::alert::error_group(&rec.error.message).1;
    format!("{}|{masked}", rec.error.kind.as_str())
}

fn found(rec: &PoisonRecord, text: &str, redact: &Redaction) -> bool {
    let needle = text.trim().to_lowercase();
    let contains = |hay: &str| hay.to_lowercase().contains(&needle);
    rec.message_id.eq_ignore_ascii_case(&needle)
        || rec.key.as_deref().is_some_and(contains)
        || match crate::message::decode(&rec.message, rec.encoding) {
            Ok(p) => contains(redact.mask(&p).text()),
            Err(_) => redact.is_empty() && contains(&rec.message),
        }
}

/// The open records `sel` picks on `ops`'s queue, oldest first, with their
/// ETags (payloads included: a search and a replay need them). What an
/// executor acts on and what a creator fingerprints.
pub async fn select_open(
    ops: &QueueOps,
    sel: &Selection,
) -> OpsResult<Vec<(PoisonRecord, Option<Etag>)>> {
    let filter = sel.filter()?;
    let none = Redaction::default();
    let redact = ops.function.as_ref().map_or(&none, |f| &f.redact);
    let mut all = super::replay::select(ops, &filter).await?;
    all.retain(|(r, _)| sel.picks(r, redact));
    Ok(all)
}

/// The fingerprint of a set of record ids (order does not matter): what a
/// review showed, so an operation can say it acts on what was reviewed.
pub fn fingerprint(ids: &[String]) -> String {
    use sha2::Digest;
    let mut sorted: Vec<&str> = ids.iter().map(String::as_str).collect();
    sorted.sort_unstable();
    let digest = sha2::Sha256::digest(sorted.join("\n").as_bytes());
    hex::encode(&digest[..12])
}

/// What a group fix would do with `rec` (read with its payload): the key
/// the corrected job derives (`key K`, or `keyless`), or why the record
/// would be left open ([`PatchError::Refused`] when the patch passes a
/// bound on this payload: refuse the patch itself). Reads the blob of a
/// claim-checked payload; never returns the corrected body (a patch may
/// move a redacted field).
pub async fn preview_fix(
    ops: &QueueOps,
    rec: &PoisonRecord,
    patch: &json_patch::Patch,
) -> Result<String, PatchError> {
    let left = PatchError::NotApplied;
    let body = ops.body_of(rec).await.map_err(|e| left(e.to_string()))?;
    let corrected = apply_patch(patch, &body)?;
    let f = ops.function.as_ref();
    let f = f.ok_or_else(|| left("no function consumes this queue".into()))?;
    match crate::idempotency::derive_key(&f.key, &corrected) {
        Ok(Some(k)) => Ok(format!("key {}", k.as_str())),
        Ok(None) => Ok("keyless".into()),
        Err(e) => Err(left(format!("would be poisoned at once: {e}"))),
    }
}

/// Why a stored selection gives no filter (a row written by hand or by an
/// older version: the CLI and dashboard check both before creating one).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SelectionError {
    /// A time bound that is not RFC 3339.
    #[error("{text:?}: {reason}")]
    Time {
        /// The bound as stored.
        text: String,
        /// The parser's reason.
        reason: String,
    },
    /// An error pattern that is not a regular expression.
    #[error("error pattern {pattern:?}: {reason}")]
    ErrorPattern {
        /// The pattern as stored.
        pattern: String,
        /// The regex compiler's reason.
        reason: String,
    },
}

/// What an operator asks for; [`OperationStore::create`] makes it a row.
#[derive(Debug, Clone)]
pub struct NewOperation {
    /// The source queue.
    pub queue: String,
    /// What to do with each record.
    pub kind: OpKind,
    /// Who asks (kept on the row and, with the operation's id, on each record).
    pub by: String,
    /// Which records (an empty cutoff is set to the creation time).
    pub selection: Selection,
    /// The fingerprint of the ids the operator reviewed.
    pub fingerprint: String,
    /// How many records the review showed.
    pub selected: u64,
    /// Records per second (at least [`MIN_RATE`]).
    pub rate: f64,
    /// Replayed records back in the poison table before it halts itself.
    pub halt_after: u32,
}

/// An operation row, read.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Operation {
    /// Its id (the row's RowKey): time-sortable.
    pub id: String,
    /// The source queue.
    pub queue: String,
    /// What it does with each record.
    pub kind: OpKind,
    /// Who asked.
    pub by: String,
    /// When (RFC 3339).
    pub created_at: String,
    /// Which records.
    pub selection: Selection,
    /// The fingerprint of the ids the operator reviewed.
    pub fingerprint: String,
    /// How many records the review showed.
    pub selected: u64,
    /// Records per second.
    pub rate: f64,
    /// Replayed records back in the poison table before it halts itself.
    halt_after: u32,
    /// Where it stands.
    pub state: OpState,
    /// Records handled (replayed, closed as already done, discarded).
    pub done: u64,
    /// Records left alone (someone else closed them, a gate refused them).
    pub skipped: u64,
    /// Records an error stopped.
    pub failed: u64,
    /// Records this operation replayed that came back poisoned.
    pub returned_poisoned: u64,
    /// Expired leases taken from a dead executor since the last checkpoint
    /// ([`MAX_TAKEOVERS`]); 0 on a row written before it was counted.
    pub takeovers: u32,
    /// The last error or refusal, one line.
    pub last_error: Option<String>,
    /// Why it was cancelled, halted or failed (and by whom).
    pub stop_reason: Option<String>,
    /// The executor holding the lease.
    pub lease_owner: Option<String>,
    /// Until when (RFC 3339).
    pub lease_until: Option<String>,
    /// The last write to the row (RFC 3339).
    updated_at: String,
}

impl Operation {
    /// Whether its lease is free at `now`: none, or expired.
    fn lease_free(&self, now: OffsetDateTime) -> bool {
        self.lease_until
            .as_deref()
            .and_then(|t| OffsetDateTime::parse(t, &Rfc3339).ok())
            .is_none_or(|until| until <= now)
    }

    /// The `by` each record it touches keeps: who asked, and through which operation.
    fn record_by(&self) -> String {
        format!("{} (operation {})", self.by, self.id)
    }
}
