//! Test-only crash points between the steps that must be crash-safe.
//!
//! Built only with `--features failpoints` (the test command enables it;
//! release builds compile every `hit` to nothing). With the feature on,
//! `AQW_FAILPOINT=<name>` makes the process abort at that point, as a
//! `kill -9` would at the worst moment.

#[cfg(feature = "failpoints")]
pub fn hit(name: &str) {
    if std::env::var("AQW_FAILPOINT").ok().as_deref() == Some(name) {
        eprintln!("failpoint {name}: aborting");
        std::process::abort();
    }
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_name: &str) {}
