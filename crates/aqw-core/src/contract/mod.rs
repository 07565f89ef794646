//! The storage contract: one suite of checks that every implementation of
//! the storage port must pass, run on the in-memory store
//! ([`crate::storage::memory`], in this crate's tests) and on Azurite
//! through the Azure adapter (crate `aqw`'s tests, with the `contract`
//! feature), so the fake cannot drift from the emulator.
//!
//! Every check takes a `&dyn Storage`, works on its own queue or table with
//! a random valid name, removes it at the end (also when the check fails),
//! and returns `Err` naming the first expectation that failed.
//!
//! Time: the checks that need time to pass (a visibility timeout lapsing, a
//! TTL expiring) wait with `tokio::time::sleep`, a few seconds each. On a
//! runtime with paused time (`#[tokio::test(start_paused = true)]`, the
//! memory store's clock) that costs nothing; against Azurite, on a normal
//! runtime, it is real time (about 7 s for the whole suite). Expiry across
//! days stays a unit test of the memory store.
//!
//! Where the in-memory store may answer as Azure does and Azurite answers
//! otherwise, the checks accept both: a stale pop receipt is `NotFound`
//! (Azure's 404 MessageNotFound) or `Http { 400, "PopReceiptMismatch" }`
//! (Azurite's), and checks on an error's status leave the code alone where
//! the adapter or the emulator decide it.

mod blob;
mod query;
mod queue;
mod table;

pub use blob::{blob_missing, blob_put_get_delete, random_container_name};
pub use query::{table_continuation, table_queries};
pub use queue::{
    queue_missing, queue_put_limits, queue_receive_and_pop_receipts, queue_ttl_expiry,
    queue_visibility_timeout_lapses,
};
pub use table::{table_entities, table_missing, table_transactions};

use crate::storage::{Entity, Storage, StorageError, StorageResult};
use serde_json::Value;
use std::fmt::Debug;

/// What a check returns: `Err` says which expectation failed.
pub type CheckResult = Result<(), String>;

/// The name of every check, in the order [`run_all`] runs them.
pub const CHECKS: &[&str] = &[
    "queue_receive_and_pop_receipts",
    "queue_visibility_timeout_lapses",
    "queue_put_limits",
    "queue_ttl_expiry",
    "queue_missing",
    "table_entities",
    "table_missing",
    "table_transactions",
    "table_queries",
    "table_continuation",
    "blob_put_get_delete",
    "blob_missing",
];

/// Run the check called `name` (one of [`CHECKS`]).
pub async fn run_check(storage: &dyn Storage, name: &str) -> CheckResult {
    match name {
        "queue_receive_and_pop_receipts" => queue_receive_and_pop_receipts(storage).await,
        "queue_visibility_timeout_lapses" => queue_visibility_timeout_lapses(storage).await,
        "queue_put_limits" => queue_put_limits(storage).await,
        "queue_ttl_expiry" => queue_ttl_expiry(storage).await,
        "queue_missing" => queue_missing(storage).await,
        "table_entities" => table_entities(storage).await,
        "table_missing" => table_missing(storage).await,
        "table_transactions" => table_transactions(storage).await,
        "table_queries" => table_queries(storage).await,
        "table_continuation" => table_continuation(storage).await,
        "blob_put_get_delete" => blob_put_get_delete(storage).await,
        "blob_missing" => blob_missing(storage).await,
        other => Err(format!("no contract check is called {other:?}")),
    }
}

/// Run every check, one after another, and report each outcome.
pub async fn report(storage: &dyn Storage) -> Vec<(&'static str, CheckResult)> {
    let mut out = Vec::with_capacity(CHECKS.len());
    for &name in CHECKS {
        out.push((name, run_check(storage, name).await));
    }
    out
}

/// Run every check (all of them, also after a failure); `Err` lists the
/// failed ones, a line each.
pub async fn run_all(storage: &dyn Storage) -> CheckResult {
    let failed: Vec<String> = report(storage)
        .await
        .into_iter()
        .filter_map(|(name, r)| r.err().map(|e| format!("{name}: {e}")))
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("\n"))
    }
}

/// A random queue name: `aqwc-` and 32 hex digits (valid: 3-63 of [a-z0-9-]).
pub fn random_queue_name() -> String {
    format!("aqwc-{}", uuid::Uuid::new_v4().simple())
}

/// A random table name: `aqwc` and 32 hex digits (valid: 3-63 alphanumerics
/// starting with a letter).
pub fn random_table_name() -> String {
    format!("aqwc{}", uuid::Uuid::new_v4().simple())
}

// ---------------------------------------------------------------- helpers --

/// Fail the check with the message (and the file and line) unless `cond`
/// holds.
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!("{} ({}:{})", format!($($msg)+), file!(), line!()));
        }
    };
}
pub(crate) use ensure;

/// The value of a call that must succeed.
fn ok<T>(what: &str, r: StorageResult<T>) -> Result<T, String> {
    r.map_err(|e| format!("{what}: unexpected error {e:?}"))
}

/// A call that must fail as `expected` says (`wanted` describes it).
fn fails<T: Debug>(
    what: &str,
    r: StorageResult<T>,
    wanted: &str,
    expected: impl Fn(&StorageError) -> bool,
) -> CheckResult {
    match r {
        Err(e) if expected(&e) => Ok(()),
        other => Err(format!("{what}: expected {wanted}, got {other:?}")),
    }
}

fn not_found(e: &StorageError) -> bool {
    matches!(e, StorageError::NotFound)
}

fn status(want: u16) -> impl Fn(&StorageError) -> bool {
    move |e| matches!(e, StorageError::Http { status, .. } if *status == want)
}

fn entity(v: Value) -> Entity {
    v.as_object().cloned().unwrap_or_default()
}
