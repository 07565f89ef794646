//! The engine's wall clock: [`now_utc`] is the system's UTC time, unless a
//! simulation turned on [`simulate`], in which case it follows tokio's
//! clock, so a `#[tokio::test(start_paused = true)]` moves records, key
//! ages and retention cutoffs days ahead in milliseconds, together with the
//! in-memory store's own timestamps.
//!
//! Durations the engine measures (the breaker's window, the gate, lease
//! renewal, heartbeats) use `tokio::time::Instant`, which a paused runtime
//! controls as well.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use time::OffsetDateTime;

static SIMULATED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// A wall time pinned to a tokio instant on this thread ([`simulate_from`]).
    static PINNED: Cell<Option<(OffsetDateTime, tokio::time::Instant)>> = const { Cell::new(None) };
}

/// The wall time and the monotonic instant it was read at, once.
fn anchor() -> &'static (OffsetDateTime, std::time::Instant) {
    static ANCHOR: OnceLock<(OffsetDateTime, std::time::Instant)> = OnceLock::new();
    // An hour back, where the monotonic clock allows: a paused runtime's
    // clock starts where the real one stood when it was built, which can be
    // a moment before the anchor is read; a difference that saturated at
    // zero would hold the simulated time still until it caught up.
    ANCHOR.get_or_init(|| {
        let (wall, now) = (OffsetDateTime::now_utc(), std::time::Instant::now());
        let back = std::time::Duration::from_secs(3600);
        match now.checked_sub(back) {
            Some(earlier) => (wall - back, earlier),
            None => (wall, now),
        }
    })
}

/// Follow tokio's clock from now on, in this process (simulations and
/// tests only: a real deployment keeps the system clock, which NTP
/// corrects and a monotonic clock would drift from over months).
pub fn simulate() {
    anchor();
    SIMULATED.store(true, Ordering::Relaxed);
}

/// Follow tokio's clock on this thread, the wall time being `wall` now
/// (call it inside the runtime): a seeded simulation's clock starts at the
/// same instant whatever the real time, so whole-second boundaries, record
/// times and schedule ticks fall alike on every run of a seed. Other
/// threads keep [`simulate`]'s clock.
pub fn simulate_from(wall: OffsetDateTime) {
    simulate();
    PINNED.with(|p| p.set(Some((wall, tokio::time::Instant::now()))));
}

/// Whether [`simulate`] was called.
pub fn simulated() -> bool {
    SIMULATED.load(Ordering::Relaxed)
}

/// The current UTC time: the system's, or the simulation's.
pub fn now_utc() -> OffsetDateTime {
    if let Some((wall, at)) = PINNED.with(Cell::get) {
        return wall + tokio::time::Instant::now().saturating_duration_since(at);
    }
    if !simulated() {
        return OffsetDateTime::now_utc();
    }
    let (wall, at) = anchor();
    let now = tokio::time::Instant::now().into_std();
    *wall + now.saturating_duration_since(*at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_simulation_follows_the_paused_clock() {
        simulate();
        let before = now_utc();
        tokio::time::advance(Duration::from_secs(3 * 86_400)).await;
        let moved = now_utc() - before;
        assert!(moved >= time::Duration::days(3), "{moved}");
        assert!(
            moved < time::Duration::days(3) + time::Duration::seconds(5),
            "{moved}"
        );
    }
}
