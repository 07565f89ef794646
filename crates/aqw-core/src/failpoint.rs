//! Test-only crash points between the steps that must be crash-safe.
//!
//! Built only with `--features failpoints` (the test command enables it;
//! release builds compile every `hit` to nothing). With the feature on, a
//! point crashes in one of two ways:
//!
//! * `AQW_FAILPOINT=<name>` makes the process abort at that point, as a
//!   `kill -9` would at the worst moment (the binary's crash tests);
//! * `arm` makes the next `hit` of that point on this thread panic, which
//!   unwinds the job's task there and then, while the store survives: the
//!   engine's in-process crash tests, on a current-thread runtime where every
//!   task of the test runs on the test's thread.

#[cfg(feature = "failpoints")]
thread_local! {
    static ARMED: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Crash here if this point is armed.
#[cfg(feature = "failpoints")]
pub fn hit(name: &str) {
    let armed = ARMED.with(|a| {
        let mut a = a.borrow_mut();
        if a.as_deref() == Some(name) {
            *a = None;
            true
        } else {
            false
        }
    });
    if armed {
        panic!("failpoint {name}: crash");
    }
    if std::env::var("AQW_FAILPOINT").ok().as_deref() == Some(name) {
        eprintln!("failpoint {name}: aborting");
        std::process::abort();
    }
}

/// Crash here if this point is armed (compiled out without `failpoints`).
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(crate) fn hit(_name: &str) {}

/// Make the next [`hit`] of `name` on this thread panic (once).
#[cfg(feature = "failpoints")]
pub fn arm(name: &str) {
    ARMED.with(|a| *a.borrow_mut() = Some(name.to_string()));
}

/// Disarm this thread's point, if it was not hit.
#[cfg(feature = "failpoints")]
pub fn disarm() {
    ARMED.with(|a| *a.borrow_mut() = None);
}

/// Whether an [`arm`]ed point is still waiting to be hit on this thread.
#[cfg(feature = "failpoints")]
pub fn armed() -> Option<String> {
    ARMED.with(|a| a.borrow().clone())
}

/// Every crash point of the engine, in the order a job meets them.
pub const POINTS: &[&str] = &[
    "claim.after",
    "effect.after",
    "done.after",
    "poison.after_record",
    "poison.after_put",
    "poison.after_mark",
    "replay.after_put",
    "replay.after_record",
    "purge.after_batch",
];
