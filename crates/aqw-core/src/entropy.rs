//! The engine's randomness: every jitter, id and provider key the engine
//! draws comes from here, never from `rand::thread_rng` or
//! `Uuid::new_v4` directly.
//!
//! In production it is the operating system's randomness (`thread_rng`).
//! A simulation calls [`seed_thread`]: from then on, on that thread, every
//! draw comes from one generator seeded with the simulation's seed, so the
//! same seed gives the same jitters, ids and keys in the same order. The
//! engine's tests run on a current-thread tokio runtime, where every task
//! of a test runs on the test's thread (as `failpoint::arm` (with the `failpoints` feature) relies
//! on too), so a thread is the right scope: tests running beside each other
//! on other threads neither see nor move this thread's generator.

use rand::distributions::uniform::{SampleRange, SampleUniform};
use rand::distributions::{Distribution, Standard};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::cell::RefCell;

thread_local! {
    static SEEDED: RefCell<Option<StdRng>> = const { RefCell::new(None) };
}

/// From now on, draw this thread's randomness from a generator seeded with
/// `seed` (simulations and tests only).
pub fn seed_thread(seed: u64) {
    SEEDED.with(|s| *s.borrow_mut() = Some(StdRng::seed_from_u64(seed)));
}

/// Back to the operating system's randomness on this thread.
pub fn unseed_thread() {
    SEEDED.with(|s| *s.borrow_mut() = None);
}

/// Whether [`seed_thread`] is in force on this thread.
pub fn seeded() -> bool {
    SEEDED.with(|s| s.borrow().is_some())
}

/// A value of `T` drawn uniformly (`f64` in `[0, 1)`, integers over their
/// whole range).
pub(crate) fn gen<T>() -> T
where
    Standard: Distribution<T>,
{
    SEEDED.with(|s| match s.borrow_mut().as_mut() {
        Some(rng) => rng.gen(),
        None => rand::thread_rng().gen(),
    })
}

/// A value drawn uniformly from `range`.
pub(crate) fn gen_range<T: SampleUniform, R: SampleRange<T>>(range: R) -> T {
    SEEDED.with(|s| match s.borrow_mut().as_mut() {
        Some(rng) => rng.gen_range(range),
        None => rand::thread_rng().gen_range(range),
    })
}

/// A random (version 4) UUID.
pub fn uuid() -> uuid::Uuid {
    uuid::Builder::from_random_bytes(gen::<[u8; 16]>()).into_uuid()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_the_same_draws_and_unseeded_draws_differ() {
        let draw = || (uuid(), gen::<u64>(), gen_range(0.5..1.5));
        seed_thread(7);
        let first = (draw(), draw());
        seed_thread(7);
        assert_eq!(first, (draw(), draw()));
        seed_thread(8);
        assert_ne!(first.0, draw());
        unseed_thread();
        assert!(!seeded());
        assert_ne!(uuid(), uuid());
        assert_eq!(first.0 .0.get_version_num(), 4);
    }
}
