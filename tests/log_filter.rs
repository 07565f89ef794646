//! The installed log subscriber keeps the HTTP stack's debug and trace
//! events dead when nothing exports traces: their callsites must report
//! "disabled", so their fields (the SDK's logging policy sanitizes every
//! request's headers for its debug line) are never built. A `None`
//! OpenTelemetry layer once made every callsite live.
//!
//! It installs the process-wide subscriber, so it runs in a process of its
//! own: every integration test shares the one `it` binary (tests/it.rs), and
//! a global subscriber installed here would log every other test's in-process
//! worker to stderr, and make spans live that they start (`aqw.job`), while
//! any subscriber a test had installed first would make `try_init` a no-op
//! and this test check the wrong one. The test re-runs the binary on itself
//! alone, with [`OWN_PROCESS`] set, and does its work there.

use std::process::Command;
use tracing::Level;

/// Set in the child process that does the test's work.
const OWN_PROCESS: &str = "AQW_IT_LOG_FILTER_OWN_PROCESS";

#[test]
fn without_an_exporter_only_the_filtered_events_are_live() {
    if std::env::var_os(OWN_PROCESS).is_none() {
        return in_own_process("without_an_exporter_only_the_filtered_events_are_live");
    }
    aqw::telemetry::init_logging(aqw::telemetry::LogFormat::Json, None);
    assert!(!tracing::enabled!(
        target: "typespec_client_core::http::policies::logging",
        Level::DEBUG
    ));
    assert!(!tracing::enabled!(target: "hyper::proto::h1::io", Level::TRACE));
    assert!(!tracing::enabled!(target: "reqwest::connect", Level::DEBUG));
    assert!(tracing::enabled!(target: "aqw_core::job", Level::INFO));
    assert!(!tracing::enabled!(target: "aqw_core::job", Level::DEBUG));
}

/// Run this module's test `name` alone in a fresh copy of the test binary
/// (the environment inherited, `AQW_LOG` / `RUST_LOG` included, as a test
/// binary of its own had it) and require that it ran and passed.
fn in_own_process(name: &str) {
    // `it::log_filter` → `log_filter::<name>`, the harness's test path.
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    let test = format!("{module}::{name}");
    let out = Command::new(std::env::current_exe().expect("the test binary's path"))
        .args([test.as_str(), "--exact", "--test-threads=1", "--nocapture"])
        .env(OWN_PROCESS, "1")
        .output()
        .expect("run the test binary again");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("test result: ok. 1 passed"),
        "{test} in its own process:\n{stdout}{stderr}"
    );
}
