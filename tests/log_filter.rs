//! The installed log subscriber keeps the HTTP stack's debug and trace
//! events dead when nothing exports traces: their callsites must report
//! "disabled", so their fields (the SDK's logging policy sanitizes every
//! request's headers for its debug line) are never built. A `None`
//! OpenTelemetry layer once made every callsite live.
//!
//! Its own test binary: it installs the process-wide subscriber.

use tracing::Level;

#[test]
fn without_an_exporter_only_the_filtered_events_are_live() {
    aqw::telemetry::init_logging(aqw::telemetry::LogFormat::Json, None);
    assert!(!tracing::enabled!(
        target: "typespec_client_core::http::policies::logging",
        Level::DEBUG
    ));
    assert!(!tracing::enabled!(target: "hyper::proto::h1::io", Level::TRACE));
    assert!(!tracing::enabled!(target: "reqwest::connect", Level::DEBUG));
    assert!(tracing::enabled!(target: "aqw::job", Level::INFO));
    assert!(!tracing::enabled!(target: "aqw::job", Level::DEBUG));
}
