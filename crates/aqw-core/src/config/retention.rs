//! `aqw.retention`: what the purge commands and the sweep may delete, and
//! the key-purge safety floor.

use crate::storage::MAX_VISIBILITY_TIMEOUT;
use std::time::Duration;

const DAY: Duration = Duration::from_secs(86_400);

/// The Queue service's default message time-to-live (a put without
/// `messagettl`).
const SERVICE_DEFAULT_MESSAGE_TTL: Duration = Duration::from_secs(7 * 86_400);

/// The retention rules and the sweep, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Retention {
    /// The longest time-to-live a producer gives messages on the source
    /// queues (`aqw.retention.sourceMessageTtl`); `None` = `-1`, never expire.
    pub source_message_ttl: Option<Duration>,
    /// How long a settled key (done, cancelled) is kept after its last
    /// change (`aqw.retention.keys`); `None` = never purged.
    pub keys: Option<Duration>,
    /// How long a closed poison record (replayed, discarded, replaced) is
    /// kept after its last change (`aqw.retention.closedRecords`); `None` =
    /// never purged.
    pub closed_records: Option<Duration>,
    /// `aqw.retention.sweep`: the background purge.
    pub sweep: SweepSettings,
    /// `aqw.retention.unsafeShortRetention` (testing only): a keys
    /// retention below [`key_retention_floor`] is accepted.
    pub unsafe_short: bool,
}

/// `aqw.retention.sweep`: the background purge of `aqw run`.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepSettings {
    /// Whether `aqw run` sweeps at all.
    pub enabled: bool,
    /// Storage requests per second the sweep may make (reads and batches).
    pub requests_per_second: f64,
    /// Pause between two sweeps of the whole account.
    pub interval: Duration,
    /// How long the sweeper's lease row stays valid without renewal.
    pub lease: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            source_message_ttl: Some(SERVICE_DEFAULT_MESSAGE_TTL),
            keys: Some(DEFAULT_KEYS),
            closed_records: Some(DEFAULT_CLOSED_RECORDS),
            sweep: SweepSettings {
                enabled: true,
                requests_per_second: DEFAULT_SWEEP_RATE,
                interval: Duration::from_secs(3600),
                lease: Duration::from_secs(60),
            },
            unsafe_short: false,
        }
    }
}

/// 30 days: twice the safety floor of the default TTL (7 + 7 days), so a
/// support question about last month's job still finds its key.
pub const DEFAULT_KEYS: Duration = Duration::from_secs(30 * 86_400);
/// 30 days: a closed record is the audit trail of an operator's decision.
const DEFAULT_CLOSED_RECORDS: Duration = Duration::from_secs(30 * 86_400);
/// 5 requests/s: a batch deletes up to 100 keys, so 250 keys/s at most
/// (above the 200 jobs/s that motivate the purge) for well under 1 % of a
/// partition's 2,000 operations/s.
const DEFAULT_SWEEP_RATE: f64 = 5.0;

/// The shortest safe key retention: any message that can still carry a
/// settled key lives at most its TTL, plus the visibility delays aqw itself
/// sets on it (up to [`MAX_VISIBILITY_TIMEOUT`]). `None`: no finite bound
/// (messages that never expire).
pub fn key_retention_floor(source_message_ttl: Option<Duration>) -> Option<Duration> {
    source_message_ttl.map(|ttl| ttl.saturating_add(MAX_VISIBILITY_TIMEOUT))
}

/// `"never"` or a timespan of at least a second.
fn days(d: Duration) -> String {
    let n = d.as_secs_f64() / DAY.as_secs_f64();
    format!("{n:.2} days ({} s)", d.as_secs())
}

/// Why a keys retention of `keys` is unsafe for messages living
/// `source_message_ttl`, naming both numbers; Ok when it is safe.
pub fn check_key_retention(
    keys: Duration,
    source_message_ttl: Option<Duration>,
) -> Result<(), RetentionError> {
    match key_retention_floor(source_message_ttl) {
        None => Err(RetentionError::MessagesNeverExpire),
        Some(floor) if keys < floor => Err(RetentionError::ShorterThanMessageLife {
            keys,
            source_message_ttl: source_message_ttl.unwrap_or_default(),
            floor,
        }),
        Some(_) => Ok(()),
    }
}

/// Why a keys retention is unsafe for the source messages' life.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RetentionError {
    /// Messages never expire, so only keys kept for good are safe.
    #[error("must be \"never\" while aqw.retention.sourceMessageTtl is \"never\" (-1): a message that never expires can always bring its key back")]
    MessagesNeverExpire,
    /// Keys would be purged while a message could still bring them back.
    #[error(
        "{} is shorter than the source messages' TTL {} plus aqw's longest visibility delay {} (= {}); a delivery could still reach a purged key",
        days(*.keys),
        days(*.source_message_ttl),
        days(MAX_VISIBILITY_TIMEOUT),
        days(*.floor)
    )]
    ShorterThanMessageLife {
        /// The retention asked for.
        keys: Duration,
        /// The source messages' TTL.
        source_message_ttl: Duration,
        /// The shortest safe retention (TTL plus the longest visibility delay).
        floor: Duration,
    },
}
