//! A fleet-wide rate limit as one table row: the generic cell rate
//! algorithm (GCRA, as in ATM traffic shaping and redis-cell). The row
//! holds the *theoretical arrival time* (`Tat`, Unix seconds) of the next
//! call the fleet may make; reserving `n` calls moves it `n / rate` ahead,
//! under an ETag, so two replicas never reserve the same slot. A replica
//! reserves only while the row is less than [`HORIZON`] ahead of now, so
//! every call it reserved starts within about a second and a message never
//! waits out its lease before its slot.
//!
//! Written by hand: no crate keeps a GCRA in an Azure table row, and the
//! whole algorithm is the two lines of [`reserve`].

use super::rows::{self, Versioned};
use crate::storage::{StorageResult, TableStore};
use serde_json::json;
use std::time::Duration;

/// How far ahead of now the fleet's reservations may run: a replica that
/// finds the row further ahead waits instead of reserving.
pub(crate) const HORIZON: Duration = Duration::from_secs(1);

const TAT: &str = "Tat";

/// Where a reservation landed: the first call's start, in seconds from now
/// (0 when at once), and the spacing between calls.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Reserved {
    /// Calls reserved (the rest of what was asked for is not).
    pub calls: u32,
    /// The first call's start, in seconds after now.
    pub(crate) first_in: f64,
    /// Seconds between two reserved calls (`1 / rate`).
    pub spacing: f64,
    /// The row's `Tat` after this reservation, to hand back unused calls.
    pub(super) tat_after: f64,
}

/// The pure rule: reserve `n` calls at `rate` per second at `now` on a row
/// at `tat`. `Err(wait)` when the row is more than [`HORIZON`] ahead.
fn reserve(tat: f64, now: f64, n: u32, rate: f64) -> Result<(Reserved, f64), Duration> {
    let ahead = tat - now;
    if ahead > HORIZON.as_secs_f64() {
        return Err(Duration::from_secs_f64(ahead - HORIZON.as_secs_f64()));
    }
    let start = tat.max(now);
    let new_tat = start + f64::from(n) / rate;
    let reserved = Reserved {
        calls: n,
        first_in: start - now,
        spacing: 1.0 / rate,
        tat_after: new_tat,
    };
    Ok((reserved, new_tat))
}

/// Reserve up to `n` calls on the row `rk`, retrying when another replica
/// wrote first.
pub(super) async fn take(
    table: &dyn TableStore,
    rk: &str,
    n: u32,
    rate: f64,
) -> StorageResult<Result<Reserved, Duration>> {
    rows::update(table, rk, |row: Option<&Versioned>, now| {
        let tat = row.and_then(|r| r.entity.get(TAT)).and_then(|v| v.as_f64());
        match reserve(tat.unwrap_or(now), now, n, rate) {
            Ok((r, new_tat)) => rows::Change::Write(entity(new_tat), Ok(r)),
            Err(wait) => rows::Change::Keep(Err(wait)),
        }
    })
    .await
}

/// Hand back `unused` calls of `reserved` (fewer messages came than were
/// reserved), when no replica reserved after it; otherwise they are lost,
/// which only leaves the fleet a little under its limit.
pub(super) async fn give_back(
    table: &dyn TableStore,
    rk: &str,
    reserved: &Reserved,
    unused: u32,
) -> StorageResult<()> {
    rows::update(table, rk, |row: Option<&Versioned>, _now| {
        let tat = row.and_then(|r| r.entity.get(TAT)).and_then(|v| v.as_f64());
        match tat {
            Some(t) if t == reserved.tat_after => {
                rows::Change::Write(entity(t - f64::from(unused) * reserved.spacing), ())
            }
            _ => rows::Change::Keep(()),
        }
    })
    .await
}

fn entity(tat: f64) -> crate::storage::Entity {
    let mut e = crate::storage::Entity::new();
    e.insert(TAT.into(), json!(tat));
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_are_spaced_at_the_rate_and_stop_at_the_horizon() {
        // An idle row (in the past) starts at once.
        let (r, tat) = reserve(0.0, 100.0, 5, 10.0).unwrap();
        assert_eq!(r.first_in, 0.0);
        assert!((tat - 100.5).abs() < 1e-9);
        // The next replica queues behind it.
        let (r2, tat2) = reserve(tat, 100.0, 5, 10.0).unwrap();
        assert!((r2.first_in - 0.5).abs() < 1e-9);
        assert!((tat2 - 101.0).abs() < 1e-9);
        // 1 s ahead is the horizon: still allowed; beyond it, wait.
        assert!(reserve(101.0, 100.0, 1, 10.0).is_ok());
        let wait = reserve(102.5, 100.0, 1, 10.0).unwrap_err();
        assert!((wait.as_secs_f64() - 1.5).abs() < 1e-9);
    }
}
