//! The Azure adapter of the storage port ([`QueueStore`], [`TableStore`],
//! defined in `aqw_core::storage` and re-exported here).
//!
//! This folder is the only code that imports the Azure SDK crates; switching
//! SDK lines touches nothing outside it. On the maintained 1.x line:
//!
//! * [`azure`]: [`connect`], queues on `azure_storage_queue` 1.x;
//! * [`tables`]: our own typed Tables client (no 1.x Tables crate exists);
//! * [`blobs`]: our own Blob client for claim-check bodies (the same
//!   pipeline, no SDK blob crate);
//! * [`pipeline`]: the shared `azure_core` 1.x transport, retry options, and
//!   the SAS authorization policy;
//! * [`shared_key`]: the SharedKey authorization policy (account keys);
//! * [`identity`]: Entra ID credentials (`azure_identity` 1.x) and the order
//!   they are tried in;
//! * [`connection`]: connection strings and identity-based settings → a
//!   [`Connection`].
//!
//! Queue and table behaviour is proven against Azurite in `tests/`; the
//! contract suite (`aqw_core::contract`) runs the same checks here and on
//! the in-memory store.

pub mod azure;
pub mod blobs;
pub mod identity;
pub mod pipeline;
pub mod shared_key;
pub mod tables;
pub(crate) mod transport;

pub mod connection;
pub use connection::{
    blob_endpoint_for, parse_connection_string, resolve_connection, table_endpoint_for, Connection,
    Credentials, Secret, DEV_ACCOUNT, DEV_KEY,
};
// What the adapter's files take from here with `use super::*`.
#[allow(unused_imports)]
use async_trait::async_trait;
#[allow(unused_imports)]
use serde_json::{Map, Value};
#[allow(unused_imports)]
use std::sync::Arc;
#[allow(unused_imports)]
use std::time::Duration;
use time::OffsetDateTime;

pub use aqw_core::storage::*;

/// Turn off backtrace capture in library error values unless the user asked
/// for it with `RUST_LIB_BACKTRACE`. Call first thing in `main`, before any
/// thread exists (it sets a process environment variable).
///
/// Why: `azure_core`'s error type captures a `std::backtrace::Backtrace` in
/// every constructor, and the SDK builds errors on its hot path for things
/// that are not failures (`ClientRequestIdPolicy` probes for its header with
/// an erroring lookup on every queue request). With `RUST_BACKTRACE=1`, which
/// many container images set, each of those walks the stack: measured +12 %
/// instructions per message (callgrind, `scripts/profile.sh`), +15 % CPU in
/// the bench. `std` reads `RUST_LIB_BACKTRACE` before `RUST_BACKTRACE`
/// for captured backtraces, and panics read `RUST_BACKTRACE` alone, so panic
/// backtraces stay exactly as the user configured them.
pub fn quiet_library_backtraces() {
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        std::env::set_var("RUST_LIB_BACKTRACE", "0");
    }
}

/// `'text'` as an OData string literal (quotes doubled).
pub fn odata_string(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// `datetime'…'` as an OData literal, for comparisons on `Timestamp`
/// (whole seconds: the sub-second part is dropped, rounding down).
pub fn odata_datetime(t: OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    format!(
        "datetime'{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z'",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

pub use azure::{connect, AzureStorage};
