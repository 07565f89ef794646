//! # aqw-azure — the Azure adapter of the aqw engine's storage port
//!
//! The engine (`aqw-core`) defines the port ([`QueueStore`], [`TableStore`],
//! [`BlobStore`] under one [`Storage`], in `aqw_core::storage`); this crate
//! implements it on Azure Queue, Table and Blob storage. The seam is one
//! call: [`open`] a function's account (an `aqw_core::config::StorageAccount`
//! holding this crate's [`Connection`]) and get an `Arc<dyn Storage>`; nothing
//! else of this crate needs to be named to run the engine on Azure.
//!
//! This crate is the only code that imports the Azure SDK crates; switching
//! SDK lines touches nothing outside it. On the maintained 1.x line:
//!
//! * [`azure`]: [`open`] and [`connect`], queues on `azure_storage_queue` 1.x;
//! * [`tables`]: our own typed Tables client (no 1.x Tables crate exists);
//! * [`blobs`]: claim-check bodies on `azure_storage_blob` 1.x (the same
//!   transport, retries and authorization as queues);
//! * [`pipeline`]: the shared `azure_core` 1.x transport, retry options, and
//!   the SAS authorization policy;
//! * [`shared_key`]: the SharedKey authorization policy (account keys);
//! * [`identity`]: Entra ID credentials (`azure_identity` 1.x) and the order
//!   they are tried in;
//! * [`connection`]: connection strings and identity-based settings → a
//!   [`Connection`].
//!
//! * [`transport`]: how a request reaches the wire (hyper, or reqwest behind
//!   a proxy), which the binary's `http` handler shares;
//! * [`tls`]: the one rustls configuration every HTTP client of aqw uses.
//!
//! Queue, table and blob behaviour is proven against Azurite in the binary's
//! `tests/`; the contract suite (`aqw_core::contract`) runs the same checks
//! there on this adapter and in `aqw-core` on the in-memory store.
//!
//! ## Layout
//!
//! | rule | file |
//! |---|---|
//! | the seam (`open`), the OData literals, the crate page | `crates/aqw-azure/src/lib.rs` |
//! | connection strings and identity-based settings → a `Connection` (queue, table and blob endpoints) | `crates/aqw-azure/src/connection.rs` |
//! | queues on `azure_storage_queue` 1.x; `connect`, the `AzureStorage` the port is implemented on | `crates/aqw-azure/src/azure.rs` |
//! | our Tables client on the `azure_core` 1.x pipeline; the typed query written as OData | `crates/aqw-azure/src/tables.rs` |
//! | claim-check bodies on `azure_storage_blob` 1.x (put, bounded get, touch, conditional delete, list by prefix); blob requests marked for naming and a read's bound handed to the transport | `crates/aqw-azure/src/blobs.rs` |
//! | SharedKey / SAS / bearer signing, retries and timeouts in the pipeline; requests named by operation (blob requests by the blob clients' mark) | `crates/aqw-azure/src/pipeline.rs` |
//! | how a storage request reaches the wire: hyper directly, reqwest behind a proxy; pool and request timeouts | `crates/aqw-azure/src/transport.rs` |
//! | SharedKey signing of each try (string to sign, HMAC) | `crates/aqw-azure/src/shared_key.rs` |
//! | which identity signs (workload, managed, developer tools) | `crates/aqw-azure/src/identity.rs` |
//! | one TLS client configuration (roots loaded once) shared by every HTTP client | `crates/aqw-azure/src/tls.rs` |

pub mod azure;
pub mod blobs;
pub mod identity;
pub mod pipeline;
pub mod shared_key;
pub mod tables;
pub mod tls;
pub mod transport;

pub mod connection;
use aqw_core::config::StorageAccount;
pub use connection::{
    blob_endpoint_for, connection_of, parse_connection_string, resolve_connection,
    table_endpoint_for, Connection, Credentials, Secret, DEV_ACCOUNT, DEV_KEY,
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

use aqw_core::storage::*;

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

/// The seam: the engine's storage account (a function's `connection`,
/// resolved by [`resolve_connection`]) opened as the engine's port. Every
/// command, the worker and the custom handler open storage here; only code
/// that reads the adapter's own request counts (benchmarks, a few tests)
/// calls [`connect`] for the concrete [`AzureStorage`].
pub fn open(account: &StorageAccount) -> Result<Arc<dyn Storage>, StorageError> {
    let connection = connection_of(account).map_err(StorageError::Other)?;
    Ok(Arc::new(connect(connection)?))
}
