//! aqw's integration tests: one test binary (the `it` target in Cargo.toml,
//! `autotests = false`), each `tests/<name>.rs` one module of it, all sharing
//! `tests/common/`. One binary links the crate and its dependencies once
//! instead of once per file.
//!
//! Pick by module path: `cargo test --test it worker::` runs tests/worker.rs,
//! `cargo test --test it keys::crash` the tests of tests/keys.rs whose names
//! start with `crash`.
//!
//! The modules share one process and run on parallel threads, so none may
//! change process-wide state (`std::env::set_var`, a global tracing
//! subscriber or metrics recorder, the current directory): an environment
//! variable goes to the spawned `aqw` with `Command::env`, and a test that
//! must install something global re-runs the binary on itself alone
//! (tests/log_filter.rs). `tests/layout.rs` checks that every file here is
//! declared below.

mod common;

mod bad_input;
mod claim_check;
mod claim_check_keys;
mod claim_check_refs;
mod connections;
mod contract;
mod dashboard;
mod dashboard_browser;
mod dashboard_forms;
mod dashboard_hardening;
mod dashboard_probes;
mod delayed;
mod deploy;
mod durable_ops;
mod fleet;
mod flex;
// Crash points and the key store's test seam exist in `failpoints` builds only.
#[cfg(feature = "failpoints")]
mod failpoints;
mod free_text;
mod gates;
mod hostile_input;
mod identity;
mod identity_https;
mod incident;
mod keys;
mod later;
mod layout;
mod log_filter;
mod monitoring;
mod oncall;
mod oncall3;
mod oncall4;
mod operations;
mod outage;
mod patch_bounds;
mod poison_format;
mod provider_answers;
#[cfg(feature = "failpoints")]
mod provider_window;
mod recovery;
mod redaction;
mod redaction_probes;
mod reliability;
mod report;
mod retention;
mod schedules;
mod serve;
mod serve_backoff;
mod spread;
mod traces;
mod triage;
mod worker;
