//! A fleet-wide limit on calls in flight as one table row: the row's
//! `Holders` column maps each replica (worker id) to how many calls it has
//! in flight and until when that entry is good (`[count, untilUnixSeconds]`).
//! A replica takes slots only when the live entries leave room, and writes
//! its own entry under the row's ETag; an entry not renewed within
//! [`HOLD_TTL`] (a crashed replica) stops counting, so a crash frees its
//! slots within a minute without anyone cleaning up.
//!
//! Written by hand: a lease-based counting semaphore over an ETagged row is
//! not something a crate offers for Azure Tables.

use super::rows::{self, Change, Versioned};
use crate::storage::{Entity, StorageResult, TableStore};
use std::collections::BTreeMap;
use std::time::Duration;

/// How long a replica's entry counts without being renewed.
pub const HOLD_TTL: Duration = Duration::from_secs(60);

/// How often a replica holding slots renews its entry.
pub(crate) const RENEW_EVERY: Duration = Duration::from_secs(20);

const HOLDERS: &str = "Holders";

/// The live entries of a row: worker id → (count, until).
type Holders = BTreeMap<String, (u32, f64)>;

/// Parse a row's holders, dropping expired or malformed entries.
pub(crate) fn live(entity: Option<&Entity>, now: f64) -> Holders {
    let text = entity
        .and_then(|e| e.get(HOLDERS))
        .and_then(|v| v.as_str())
        .unwrap_or("{}");
    // Entry by entry: one unreadable entry must not hide the others.
    let all: BTreeMap<String, serde_json::Value> = serde_json::from_str(text).unwrap_or_default();
    all.into_iter()
        .filter_map(|(w, v)| Some((w, serde_json::from_value::<(u32, f64)>(v).ok()?)))
        .filter(|(_, (n, until))| *n > 0 && until.is_finite() && *until > now)
        .collect()
}

/// The pure rule: with `holders` live, how many of `want` more slots
/// `me` (holding `mine`) may take under `limit`.
pub(crate) fn room(holders: &Holders, me: &str, mine: u32, limit: u32, want: u32) -> u32 {
    let others: u32 = holders
        .iter()
        .filter(|(w, _)| w.as_str() != me)
        .map(|(_, (n, _))| *n)
        .sum();
    limit.saturating_sub(others.saturating_add(mine)).min(want)
}

fn entity(holders: &Holders) -> Entity {
    let mut e = Entity::new();
    e.insert(
        HOLDERS.into(),
        serde_json::Value::String(serde_json::to_string(holders).unwrap_or_default()),
    );
    e
}

/// Take up to `want` slots for `me`, who holds `mine` now; how many it got.
pub(super) async fn take(
    table: &dyn TableStore,
    rk: &str,
    me: &str,
    mine: u32,
    limit: u32,
    want: u32,
) -> StorageResult<u32> {
    rows::update(table, rk, |row: Option<&Versioned>, now| {
        let mut holders = live(row.map(|r| &r.entity), now);
        let got = room(&holders, me, mine, limit, want);
        if got == 0 {
            return Change::Keep(0);
        }
        holders.insert(me.to_string(), (mine + got, now + HOLD_TTL.as_secs_f64()));
        Change::Write(entity(&holders), got)
    })
    .await
}

/// Write `me`'s entry as `mine` (renewed), or remove it at 0.
pub(super) async fn set(
    table: &dyn TableStore,
    rk: &str,
    me: &str,
    mine: u32,
) -> StorageResult<()> {
    rows::update(table, rk, |row: Option<&Versioned>, now| {
        let mut holders = live(row.map(|r| &r.entity), now);
        let fresh = now + HOLD_TTL.as_secs_f64() / 2.0;
        if mine == 0 {
            if holders.remove(me).is_none() && row.is_some() {
                return Change::Keep(());
            }
        } else if holders
            .get(me)
            .is_some_and(|(n, until)| *n == mine && *until > fresh)
        {
            // Already written (a take wrote it) and not due for renewal.
            return Change::Keep(());
        } else {
            holders.insert(me.to_string(), (mine, now + HOLD_TTL.as_secs_f64()));
        }
        Change::Write(entity(&holders), ())
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_counts_live_entries_of_others_and_my_own_count() {
        let mut e = Entity::new();
        e.insert(
            HOLDERS.into(),
            r#"{"a":[3,200.0],"b":[4,50.0],"me":[1,200.0],"bad":"x"}"#.into(),
        );
        let h = live(Some(&e), 100.0);
        // b expired at 50, "bad" is skipped, my own row entry is replaced
        // by the count I pass.
        assert_eq!(h.len(), 2);
        assert_eq!(room(&h, "me", 2, 10, 16), 5);
        assert_eq!(room(&h, "me", 7, 10, 16), 0);
        assert_eq!(room(&h, "a", 3, 10, 16), 6);
    }
}
