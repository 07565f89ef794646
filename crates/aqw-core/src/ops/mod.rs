//! The operator's procedure: status, triage, list, show,
//! report, replay, discard, fix, enqueue, `keys show` and the purges, one file each. Each command
//! returns data; the binary renders it and decides the exit code.
//!
//! This file holds what the commands share: [`QueueOps`] (the stores of one
//! source queue), [`Filter`] and [`OpsError`]. The commands are procedures
//! over [`KeyStore`] and [`PoisonStore`]: neither table's rows are written
//! here.
//!
//! Poison records live in the record table (no 32-message peek limit). Raw
//! copies written to `<queue>-poison` by the Functions host itself are found
//! by a scan of the poison queue ([`PoisonStore::scan`]) and imported as
//! records (origin `host`), so they are listed and replayed like aqw's own.

mod control;
mod discard;
mod enqueue;
mod fix;
mod keys;
mod list;
pub mod operation;
pub(crate) mod provider;
mod purge;
mod rehearse;
mod replay;
mod replay_report;
mod report;
mod show;
mod status;
pub mod triage;
mod window;

pub use control::{control_store, pause, resume};
pub use discard::discard;
pub use enqueue::{
    enqueue, enqueue_with, prepare_enqueue, with_trace_context, Delivery, DeliveryError, Enqueued,
    PreparedEnqueue,
};
pub use fix::{fix, FixAction, FixReport};
pub use keys::key_record;
pub use list::{list, list_summaries};
pub use provider::{is_idempotent, saves_failures, SavesFailures};
pub use purge::{purge_keys, purge_records, PurgeOptions};
pub use rehearse::{rehearse_discard, rehearse_fix, DiscardRehearsal, FixRehearsal};
pub use replay::{replay, ReplayOptions, DEFAULT_REPLAY_CONCURRENCY};
pub use replay_report::{PoisonedAgain, ReplayAction, ReplayItem, ReplayReport};
pub use report::{
    report, IncidentReport, KeyOutcome, NewKey, ReportAnswer, ReportKeyChange, ReportRow,
    ReportTotals, Uncertain,
};
pub use show::{mask_message, show, ShowReport};
pub use status::{status, QueueStatus};
pub use window::ProviderWindow;

use crate::config::{AppConfig, FunctionConfig};
use crate::idempotency::{IdempotencyKey, KeyRecord, KeyStore};
use crate::poison::{PoisonRecord, PoisonStore, RecordStatus};
use crate::storage::{Etag, QueueStore, Storage, StorageError};
use std::sync::Arc;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Errors of the operator commands, mapped to exit codes by the binary.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// Bad arguments or config (exit 2).
    #[error("{0}")]
    Usage(String),
    /// An idempotency key given or derived is invalid (exit 2).
    #[error(transparent)]
    Key(#[from] crate::idempotency::KeyError),
    /// Storage failed (exit 3).
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// A payload or selection the operator gave that aqw refuses: a usage
/// error (exit 2) with the refusal's own text.
macro_rules! usage_from {
    ($($t:ty),*) => {$(
        impl From<$t> for OpsError {
            fn from(e: $t) -> Self {
                OpsError::Usage(e.to_string())
            }
        }
    )*};
}
usage_from!(
    crate::message::EncodeError,
    crate::claim::Oversize,
    crate::ops::operation::SelectionError
);

/// The result of an operator command.
pub type OpsResult<T> = Result<T, OpsError>;

/// The stores of one source queue: its keys and its poison records.
pub struct QueueOps {
    /// The app's configuration.
    pub(crate) app: Arc<AppConfig>,
    /// The function consuming the queue, if the app has one.
    pub function: Option<FunctionConfig>,
    /// The source queue's name.
    pub queue: String,
    /// The source queue.
    pub(crate) source: Arc<dyn QueueStore>,
    /// The queue's poison records and their `<queue>-poison` copies.
    pub poison: PoisonStore,
    /// The function's idempotency keys.
    pub keys: KeyStore,
    /// The function's pause and published breaker state.
    pub control: crate::control::ControlStore,
    /// The workers' poll heartbeats.
    pub(crate) heartbeats: crate::heartbeat::HeartbeatStore,
    /// The container of claim-check bodies (`aqw.claimCheck.container`).
    pub blobs: Arc<dyn crate::storage::BlobStore>,
}

impl QueueOps {
    /// The stores of source queue `queue` of `app`, on `storage`.
    pub fn new(app: Arc<AppConfig>, queue: &str, storage: &dyn Storage) -> Self {
        let function = app.function_for_queue(queue).cloned();
        let poison = PoisonStore::new(
            queue,
            function
                .as_ref()
                .map(|f| f.name.as_str())
                .unwrap_or_default(),
            app.message_encoding,
            storage.table(&app.poison_table),
            storage.queue(&crate::poison::poison_queue_name(queue)),
        );
        Self {
            function,
            queue: queue.to_string(),
            source: storage.queue(queue),
            poison,
            keys: KeyStore::new(storage.table(&app.keys_table)),
            control: crate::control::ControlStore::new(storage.table(&app.control_table)),
            heartbeats: crate::heartbeat::HeartbeatStore::new(storage.table(&app.heartbeat_table)),
            blobs: storage.blobs(&app.claim_check.container),
            app,
        }
    }

    /// All records of this queue (a scan imports what the poison queue holds
    /// beyond them).
    pub async fn records(&self) -> OpsResult<Vec<PoisonRecord>> {
        Ok(self
            .poison
            .list()
            .await?
            .into_iter()
            .map(|(r, _)| r)
            .collect())
    }

    /// The record `id` with its ETag, if there is one.
    pub async fn record(&self, id: &str) -> OpsResult<Option<(PoisonRecord, Etag)>> {
        Ok(self.poison.find(id).await?)
    }

    /// The record `id`, which must be open (a usage error otherwise).
    pub(crate) async fn open_record(&self, id: &str) -> OpsResult<(PoisonRecord, Etag)> {
        let (rec, etag) = self.record(id).await?.ok_or_else(|| {
            OpsError::Usage(format!("no poison record {id} for queue {}", self.queue))
        })?;
        if rec.status != RecordStatus::Open {
            return Err(OpsError::Usage(format!(
                "record {id} is already {}",
                rec.status.as_str()
            )));
        }
        Ok((rec, etag))
    }

    /// What a claim-check reference of this queue's records may name: the
    /// source queue's own blobs (records are the source queue's, whichever
    /// queue, `<queue>-poison` or the table, they were read from).
    fn claim_scope(&self) -> crate::claim::Scope<'_> {
        self.app.claim_check.scope(&self.queue)
    }

    /// A record's payload as its job would run: decoded, a claim-checked
    /// body fetched through a reference checked for this queue
    /// (`crate::claim::decode_body`); else why not (show, a fix's
    /// redaction restore, a group fix and its preview).
    pub async fn body_of(&self, rec: &PoisonRecord) -> Result<String, crate::claim::BodyError> {
        let scope = self.claim_scope();
        crate::claim::decode_body(self.blobs.as_ref(), &rec.message, rec.encoding, scope).await
    }

    /// The key state of a record, if its function and key are known.
    pub async fn key_record(&self, rec: &PoisonRecord) -> OpsResult<Option<KeyRecord>> {
        self.key_named(rec.key.as_deref()).await
    }

    /// The record of key `k` of the queue's function, if both exist.
    pub async fn key_named(&self, k: Option<&str>) -> OpsResult<Option<KeyRecord>> {
        let (Some(f), Some(k)) = (self.function.as_ref(), k) else {
            return Ok(None);
        };
        let key = IdempotencyKey::new(k)?;
        match self.keys.get(&f.name, &key).await {
            Ok(r) => Ok(r),
            Err(StorageError::NotFound) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

/// A time bound of a filter: an RFC 3339 time, or a duration ago
/// (`hh:mm:ss`), as `poison list --since` and the dashboard take it.
pub fn parse_time(s: &str) -> Result<OffsetDateTime, TimeBoundError> {
    let text = || s.to_string();
    if let Ok(t) = OffsetDateTime::parse(s, &Rfc3339) {
        // In UTC, as the service compares it: a time at the edge of the
        // date type with a far offset (9999-12-31T23:59:59-23:59) has no
        // UTC form and is refused rather than panicking later.
        return t
            .checked_to_offset(time::UtcOffset::UTC)
            .ok_or_else(|| TimeBoundError::OutOfRange { text: text() });
    }
    let ago =
        crate::config::parse_timespan(s).map_err(|_| TimeBoundError::NotATime { text: text() })?;
    // A far-past bound (10000000.00:00:00 is some 27,000 years) is refused
    // rather than overflowing the date type.
    time::Duration::try_from(ago)
        .ok()
        .and_then(|ago| crate::clock::now_utc().checked_sub(ago))
        .ok_or_else(|| TimeBoundError::TooFarBack { text: text() })
}

/// Why a filter's time bound is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimeBoundError {
    /// An RFC 3339 time with no UTC form in the date type.
    #[error("\"{text}\" is out of range: give a time between the years -9999 and 9999 in UTC")]
    OutOfRange {
        /// The bound as given.
        text: String,
    },
    /// Neither an RFC 3339 time nor a timespan.
    #[error("\"{text}\" is neither an RFC 3339 time nor a duration ago (hh:mm:ss)")]
    NotATime {
        /// The bound as given.
        text: String,
    },
    /// A duration ago reaching before the date type's first year.
    #[error("\"{text}\" reaches back before the year -9999: give a shorter duration ago or an RFC 3339 time")]
    TooFarBack {
        /// The bound as given.
        text: String,
    },
}

#[cfg(test)]
mod parse_time_tests {
    use super::{parse_time, TimeBoundError};

    #[test]
    fn a_far_past_duration_is_an_error_not_a_panic() {
        let e = parse_time("10000000.00:00:00").unwrap_err();
        assert!(matches!(e, TimeBoundError::TooFarBack { .. }));
        let e = e.to_string();
        assert!(e.contains("10000000.00:00:00"), "{e}");
        assert!(parse_time("01:00:00").is_ok());
        assert!(parse_time("2026-12-01T00:00:00Z").is_ok());
        assert_eq!(
            parse_time("yesterday"),
            Err(TimeBoundError::NotATime {
                text: "yesterday".into()
            })
        );
        let e = parse_time("9999-12-31T23:59:59-23:59").unwrap_err();
        assert!(matches!(e, TimeBoundError::OutOfRange { .. }));
        let e = e.to_string();
        assert!(e.contains("out of range"), "{e}");
        let t = parse_time("2026-12-01T01:00:00+01:00").unwrap();
        assert_eq!((t.offset(), t.hour()), (time::UtcOffset::UTC, 0));
    }
}

/// Filters of `poison list` and `poison replay`.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Only records in this status.
    pub status: Option<RecordStatus>,
    /// Only records poisoned at or after this time.
    pub since: Option<OffsetDateTime>,
    /// Only records poisoned at or before this time.
    pub until: Option<OffsetDateTime>,
    /// Only records of this function.
    pub function: Option<String>,
    /// Only records whose error matches.
    pub error: Option<regex::Regex>,
    /// Only these records (message ids); empty = any.
    pub ids: Vec<String>,
}

impl Filter {
    /// Whether record `r` passes every filter that is set.
    pub(crate) fn matches(&self, r: &PoisonRecord) -> bool {
        let at = OffsetDateTime::parse(&r.poisoned_at, &Rfc3339).ok();
        self.status.is_none_or(|s| s == r.status)
            && self.since.is_none_or(|s| at.is_some_and(|t| t >= s))
            && self.until.is_none_or(|u| at.is_some_and(|t| t <= u))
            && self.function.as_ref().is_none_or(|f| f == &r.function)
            && self
                .error
                .as_ref()
                .is_none_or(|re| re.is_match(&r.error.message))
            && (self.ids.is_empty() || self.ids.iter().any(|i| i == &r.message_id))
    }
}
