//! Trace exporters chosen by the environment ([`export`]: OTLP/HTTP,
//! Application Insights) and the OTLP protobuf encoder ([`otlp`]). The job's
//! spans and the W3C context they carry are the engine's
//! (`aqw_core::traces`), named there by their users.

mod client;
pub mod export;
mod otlp;

use aqw_core::traces::*;
pub use export::{ExportTarget, TracesGuard};
