//! The engine's wall clock: [`now_utc`] is the system's UTC time, unless a
//! simulation turned on `simulate`, in which case it follows tokio's
//! clock, so a `#[tokio::test(start_paused = true)]` moves records, key
//! ages and retention cutoffs days ahead in milliseconds, together with the
//! in-memory store's own timestamps.
//!
//! Durations the engine measures (the breaker's window, the gate, lease
//! renewal, heartbeats) use `tokio::time::Instant`, which a paused runtime
//! controls as well.
//!
//! A seeded simulation runs many replicas on one thread; each may be given
//! its own wrong clock ([`Skew`], run under [`with_skew`]): [`now_utc`] on a
//! pinned thread adds the offset of the task it is called from, and the
//! engine's spawns go through `carry` so a replica's tasks keep its
//! offset. Outside a simulation `carry` is the future itself and `now_utc`
//! never looks for an offset: the production path pays one relaxed load
//! per spawn.

use futures::future::Either;
use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, OnceLock};
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
pub(crate) fn simulate() {
    anchor();
    SIMULATED.store(true, Ordering::Relaxed);
}

/// Follow tokio's clock on this thread, the wall time being `wall` now
/// (call it inside the runtime): a seeded simulation's clock starts at the
/// same instant whatever the real time, so whole-second boundaries, record
/// times and schedule ticks fall alike on every run of a seed. Other
/// threads keep `simulate`'s clock.
pub fn simulate_from(wall: OffsetDateTime) {
    simulate();
    PINNED.with(|p| p.set(Some((wall, tokio::time::Instant::now()))));
}

/// How far one simulated replica's wall clock is off the true time (may
/// be negative); a clone moves with it, so a simulation can make the clock
/// jump while the replica runs.
#[derive(Debug, Clone, Default)]
pub struct Skew(Arc<AtomicI64>);

impl Skew {
    /// A clock `offset` off the true time.
    pub fn new(offset: time::Duration) -> Self {
        let skew = Self::default();
        skew.set(offset);
        skew
    }

    /// Move the clock to `offset` off the true time (a jump).
    pub fn set(&self, offset: time::Duration) {
        let ms = i64::try_from(offset.whole_milliseconds()).unwrap_or(0);
        self.0.store(ms, Ordering::Relaxed);
    }

    /// The clock's offset now.
    pub fn offset(&self) -> time::Duration {
        time::Duration::milliseconds(self.0.load(Ordering::Relaxed))
    }
}

tokio::task_local! {
    /// The wrong clock of the simulated replica this task belongs to.
    static SKEW: Skew;
}

/// Run `fut` with its wall clock `skew` off (simulations only: [`now_utc`]
/// reads it on a thread pinned by [`simulate_from`]).
pub fn with_skew<F: Future>(skew: Skew, fut: F) -> impl Future<Output = F::Output> {
    SKEW.scope(skew, fut)
}

/// `fut` for a task the engine spawns, keeping the spawning task's
/// [`Skew`] in a simulation; outside one, `fut` itself.
pub(crate) fn carry<F: Future>(fut: F) -> impl Future<Output = F::Output> {
    if !simulated() {
        return Either::Left(fut);
    }
    match SKEW.try_with(Skew::clone) {
        Ok(skew) => Either::Right(Either::Left(SKEW.scope(skew, fut))),
        Err(_) => Either::Right(Either::Right(fut)),
    }
}

/// `tokio::spawn` of `carry(fut)`: the engine's way to start a task.
pub fn spawn<F>(fut: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(carry(fut))
}

/// Whether `simulate` was called.
pub(crate) fn simulated() -> bool {
    SIMULATED.load(Ordering::Relaxed)
}

/// The current UTC time: the system's, or the simulation's.
pub fn now_utc() -> OffsetDateTime {
    if let Some((wall, at)) = PINNED.with(Cell::get) {
        let skew = SKEW.try_with(Skew::offset).unwrap_or(time::Duration::ZERO);
        return wall + tokio::time::Instant::now().saturating_duration_since(at) + skew;
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

    /// A replica's offset applies to its tasks, those it spawns through
    /// `carry` too, and moves when the simulation makes it jump; a task
    /// outside any replica reads the true (pinned) time.
    #[tokio::test(start_paused = true)]
    async fn a_skewed_task_and_its_spawns_read_their_own_clock() {
        let wall = time::macros::datetime!(2026-03-02 08:00:00 UTC);
        simulate_from(wall);
        let skew = Skew::new(time::Duration::seconds(-5));
        let moved = skew.clone();
        let (inner, spawned, jumped) = with_skew(skew, async move {
            let inner = now_utc();
            let spawned = tokio::spawn(carry(async { now_utc() })).await.unwrap();
            moved.set(time::Duration::seconds(30));
            (inner, spawned, now_utc())
        })
        .await;
        assert_eq!(inner, wall - time::Duration::seconds(5));
        assert_eq!(spawned, wall - time::Duration::seconds(5));
        assert_eq!(jumped, wall + time::Duration::seconds(30));
        assert_eq!(now_utc(), wall);
        let bare = tokio::spawn(async { now_utc() }).await.unwrap();
        assert_eq!(bare, wall, "a task outside a replica has no skew");
    }
}
