//! The schedule task of every worker: wake at each tick, claim the due ticks
//! in the schedule's control row under its ETag, put them, clear the claim.
//!
//! The row (`schedules` partition of the control table, RowKey = the
//! schedule's name): `last` (the newest tick claimed), `pending` (ticks
//! claimed and maybe not yet put, space-separated), `claimedAt`,
//! `claimedBy`. Cost per schedule and tick: one read per replica, and for
//! the one replica whose claim lands two merges and one put per due tick.
//! Nothing is read between ticks: each replica computes the next tick
//! itself.

use super::{tick_text, Schedule};
use crate::config::AppConfig;
use crate::idempotency::derive_key;
use crate::runtime::FunctionRuntime;
use crate::storage::{Entity, QueueStore, StorageError, StorageResult, TableStore, Ttl};
use serde::Serialize;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// The control table's partition of the schedule rows.
pub const PARTITION: &str = "schedules";

/// A claim older than this whose ticks were not cleared is put again by
/// whoever sees it (the claimer crashed between the claim and the put).
pub(crate) const STALE_CLAIM: Duration = Duration::from_secs(30);

/// After a storage error, the next try.
const RETRY_AFTER: Duration = Duration::from_secs(15);

/// Replicas wake up to this long after a tick, at random, so they do not
/// all read the row in the same millisecond.
const WAKE_JITTER_MS: u64 = 1_000;

/// The schedules of `app` whose function runs here, one task each, until
/// `shutdown`.
pub fn spawn(app: &AppConfig, rts: &[Arc<FunctionRuntime>], shutdown: &CancellationToken) {
    for s in &app.schedules {
        let Some(rt) = rts.iter().find(|rt| rt.function.name == s.function) else {
            continue;
        };
        let control = rt.gate.control().table().clone();
        let target = Target {
            queue: rt.source.clone(),
            encoding: app.message_encoding,
        };
        crate::clock::spawn(run(
            s.clone(),
            control,
            target,
            rt.worker_id.clone(),
            shutdown.clone(),
        ));
    }
}

/// Where a schedule's ticks go: its function's queue, in the app's encoding.
#[derive(Clone)]
pub struct Target {
    /// The function's source queue.
    pub queue: Arc<dyn QueueStore>,
    /// The app's `messageEncoding`.
    pub(crate) encoding: crate::message::MessageEncoding,
}

/// One schedule's task: a round at each tick until `shutdown`.
pub async fn run(
    schedule: Schedule,
    control: Arc<dyn TableStore>,
    target: Target,
    worker_id: String,
    shutdown: CancellationToken,
) {
    loop {
        let wake = match round(&schedule, control.as_ref(), &target, &worker_id).await {
            Ok(Some(next)) => next,
            Ok(None) => return, // no tick ever again (a cron pattern past its last year)
            Err(e) => {
                warn!(event = "aqw.schedule.error", schedule = %schedule.name, error = %e, "schedule round failed; trying again");
                crate::clock::now_utc() + RETRY_AFTER
            }
        };
        let jitter = Duration::from_millis(crate::entropy::gen_range(0..WAKE_JITTER_MS));
        let wait = Duration::try_from(wake - crate::clock::now_utc()).unwrap_or_default() + jitter;
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// The row as read.
struct Row {
    /// The newest tick claimed (`None`: unreadable, the schedule starts over).
    last: Option<OffsetDateTime>,
    /// The newest tick put on the queue (not one skipped, nor the start).
    last_put: Option<OffsetDateTime>,
    pending: Vec<OffsetDateTime>,
    claimed_at: Option<OffsetDateTime>,
    etag: crate::storage::Etag,
}

fn parse_time(v: Option<&Value>) -> Option<OffsetDateTime> {
    v.and_then(Value::as_str)
        .and_then(|s| OffsetDateTime::parse(s, &Rfc3339).ok())
}

async fn read_row(control: &dyn TableStore, name: &str) -> StorageResult<Option<Row>> {
    let (e, etag) = match control.get(PARTITION, name).await {
        Ok(Some(r)) => r,
        Ok(None) | Err(StorageError::NotFound) => return Ok(None),
        Err(e) => return Err(e),
    };
    let pending = e
        .get("pending")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|t| OffsetDateTime::parse(t, &Rfc3339).ok())
        .collect();
    Ok(Some(Row {
        last: parse_time(e.get("last")),
        last_put: parse_time(e.get("lastPut")),
        pending,
        claimed_at: parse_time(e.get("claimedAt")),
        etag,
    }))
}

fn row_entity(
    last: OffsetDateTime,
    pending: &[OffsetDateTime],
    by: &str,
    last_put: Option<OffsetDateTime>,
) -> Entity {
    let mut e = Entity::new();
    e.insert("last".into(), tick_text(last).into());
    let pending: Vec<String> = pending.iter().map(|t| tick_text(*t)).collect();
    e.insert("pending".into(), pending.join(" ").into());
    e.insert(
        "claimedAt".into(),
        tick_text(crate::clock::now_utc()).into(),
    );
    e.insert("claimedBy".into(), by.into());
    if let Some(t) = last_put {
        e.insert("lastPut".into(), tick_text(t).into());
    }
    e
}

/// One round: put what is due (or what a crashed claimer left), and say
/// when to wake next.
async fn round(
    s: &Schedule,
    control: &dyn TableStore,
    queue: &Target,
    by: &str,
) -> StorageResult<Option<OffsetDateTime>> {
    let now = crate::clock::now_utc();
    let Some(row) = read_row(control, &s.name).await? else {
        return start(s, control, by, now, None).await;
    };
    let Some(last) = row.last else {
        return start(s, control, by, now, Some(&row.etag)).await;
    };
    if !row.pending.is_empty() {
        return repair(s, control, queue, by, &row, last, now).await;
    }
    let (due, moved_to) = s.due(last, now);
    if moved_to == last {
        return Ok(s.when.next_after(last.max(now)));
    }
    let claim = row_entity(moved_to, &due, by, row.last_put);
    let etag = match control
        .merge(PARTITION, &s.name, &claim, Some(&row.etag))
        .await
    {
        Ok(etag) => etag,
        // Another replica claimed first and puts them; look again once its
        // claim would be stale, in case it died before the put.
        Err(StorageError::PreconditionFailed) => {
            let next = s.when.next_after(now).unwrap_or(now + STALE_CLAIM);
            return Ok(Some(next.min(now + STALE_CLAIM)));
        }
        Err(e) => return Err(e),
    };
    put_ticks(s, queue, &due).await?;
    let cleared = row_entity(moved_to, &[], by, due.last().copied().or(row.last_put));
    // Not cleared (a storage error): the claim goes stale and the next
    // reader puts the ticks again, their keys settling the second copies.
    let _ = control
        .merge(PARTITION, &s.name, &cleared, Some(&etag))
        .await;
    // `all` may have more missed ticks to put: go again at once.
    let next = s.when.next_after(moved_to).filter(|t| *t > now);
    Ok(Some(next.unwrap_or(now)))
}

/// A schedule without a (readable) row starts now: no tick from before it
/// existed runs.
async fn start(
    s: &Schedule,
    control: &dyn TableStore,
    by: &str,
    now: OffsetDateTime,
    over: Option<&crate::storage::Etag>,
) -> StorageResult<Option<OffsetDateTime>> {
    let first = row_entity(s.when.latest_at(now).unwrap_or(now), &[], by, None);
    let written = match over {
        None => insert_creating(control, &s.name, &first).await,
        Some(etag) => control
            .merge(PARTITION, &s.name, &first, Some(etag))
            .await
            .map(|_| ()),
    };
    match written {
        Ok(()) | Err(StorageError::Conflict) | Err(StorageError::PreconditionFailed) => {}
        Err(e) => return Err(e),
    }
    info!(event = "aqw.schedule.started", schedule = %s.name, next = %s.when.next_after(now).map(tick_text).unwrap_or_default(), "schedule started");
    Ok(s.when.next_after(now))
}

/// Ticks claimed and not cleared: wait while the claim is fresh (its
/// claimer is putting them), put them again once it is stale (the claimer
/// died; their keys settle a copy it did put), then clear the claim.
async fn repair(
    s: &Schedule,
    control: &dyn TableStore,
    queue: &Target,
    by: &str,
    row: &Row,
    last: OffsetDateTime,
    now: OffsetDateTime,
) -> StorageResult<Option<OffsetDateTime>> {
    let claimed = row.claimed_at.unwrap_or(OffsetDateTime::UNIX_EPOCH);
    if now - claimed < STALE_CLAIM {
        return Ok(Some(claimed + STALE_CLAIM));
    }
    put_ticks(s, queue, &row.pending).await?;
    let last_put = row.pending.iter().max().copied().or(row.last_put);
    let cleared = row_entity(last, &[], by, last_put);
    match control
        .merge(PARTITION, &s.name, &cleared, Some(&row.etag))
        .await
    {
        Ok(_) | Err(StorageError::PreconditionFailed) => Ok(Some(now)),
        // Not a tight loop of re-puts: the caller waits before the next try.
        Err(e) => Err(e),
    }
}

async fn insert_creating(control: &dyn TableStore, rk: &str, e: &Entity) -> StorageResult<()> {
    match control.insert(PARTITION, rk, e).await {
        Err(StorageError::NotFound) => {
            control.create_if_missing().await?;
            control.insert(PARTITION, rk, e).await.map(|_| ())
        }
        other => other.map(|_| ()),
    }
}

async fn put_ticks(s: &Schedule, target: &Target, ticks: &[OffsetDateTime]) -> StorageResult<()> {
    for tick in ticks {
        let text = crate::message::encode(&s.tick_payload(*tick), target.encoding);
        crate::poison::put_creating(target.queue.as_ref(), &text, Ttl::Default).await?;
        info!(event = "aqw.schedule.tick", schedule = %s.name, tick = %tick_text(*tick), "tick enqueued");
    }
    Ok(())
}

/// One schedule as `aqw status` shows it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleStatus {
    /// The schedule.
    pub name: String,
    /// Its function.
    pub function: String,
    /// When it ticks.
    pub when: String,
    /// Its catch-up policy.
    pub catch_up: &'static str,
    /// The next tick.
    pub next: Option<String>,
    /// The newest tick put on the queue.
    pub last_tick: Option<String>,
    /// That tick's key.
    last_key: Option<String>,
    /// That key's state (`done`, `pending`, `poisoned`, `cancelled`), or
    /// `not run yet`.
    pub last_outcome: Option<String>,
    /// Why its row or its key could not be read, when they could not: the
    /// other schedules are still shown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl ScheduleStatus {
    /// Schedule `s` as its configuration says, its row unread for `why`.
    pub fn unread(s: &Schedule, why: String) -> Self {
        ScheduleStatus {
            name: s.name.clone(),
            function: s.function.clone(),
            when: s.when.describe(),
            catch_up: s.catch_up.as_str(),
            next: s.when.next_after(crate::clock::now_utc()).map(tick_text),
            last_tick: None,
            last_key: None,
            last_outcome: None,
            error: Some(why),
        }
    }
}

/// Schedule `s` as `aqw status` shows it: its row in `control`, and the
/// state of its newest tick's key in `keys`.
pub async fn status(
    app: &AppConfig,
    s: &Schedule,
    control: &dyn TableStore,
    keys: &crate::idempotency::KeyStore,
) -> StorageResult<ScheduleStatus> {
    let now = crate::clock::now_utc();
    let row = read_row(control, &s.name).await?;
    let last_tick = row.as_ref().and_then(|r| r.last_put);
    let function = app.functions.iter().find(|f| f.name == s.function);
    let last_key = match (last_tick, function) {
        (Some(t), Some(f)) => derive_key(&f.key, &s.tick_payload(t)).ok().flatten(),
        _ => None,
    };
    let last_outcome = match &last_key {
        Some(k) => Some(match keys.get(&s.function, k).await? {
            Some(rec) => rec.status.as_str().to_string(),
            None => "not run yet".to_string(),
        }),
        None => None,
    };
    Ok(ScheduleStatus {
        name: s.name.clone(),
        function: s.function.clone(),
        when: s.when.describe(),
        catch_up: s.catch_up.as_str(),
        next: s.when.next_after(now).map(tick_text),
        last_tick: last_tick.map(tick_text),
        last_key: last_key.map(|k| k.to_string()),
        last_outcome,
        error: None,
    })
}
