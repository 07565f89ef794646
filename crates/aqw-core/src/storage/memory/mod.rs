//! An in-memory storage account on tokio time, for the engine's tests and
//! the fleet simulation.
//!
//! [`MemoryStorage`] implements [`Storage`]: every handle that
//! [`Storage::queue`] and [`Storage::table`] return, from any clone of it,
//! works on one shared account, so simulated replicas holding clones see the
//! same queues and tables. Its clock ([`MemoryStorage::now`]) is the wall time
//! at creation plus the tokio time elapsed since, so under
//! `#[tokio::test(start_paused = true)]` a week of visibility timeouts and
//! TTLs passes in milliseconds (`tokio::time::advance`, or any
//! `tokio::time::sleep` with the runtime idle).
//!
//! The store answers what the Azure adapter of crate `aqw` returns for the
//! same request (`crates/aqw-azure/src/azure.rs`, `crates/aqw-azure/src/tables.rs`, errors by
//! `pipeline::status_error`: 404 is [`StorageError::NotFound`], 409
//! [`StorageError::Conflict`], 412 [`StorageError::PreconditionFailed`],
//! anything else [`StorageError::Http`] with the service's status and code).
//! Where the adapter only passes the service's answer on, the answer is
//! Azurite's (`Azure/Azurite`, `src/queue/handlers/MessagesHandler.ts`,
//! `src/queue/persistence/LokiQueueMetadataStore.ts`,
//! `src/table/handlers/TableHandler.ts`,
//! `src/table/persistence/LokiTableMetadataStore.ts`,
//! `src/table/batch/TableBatchOrchestrator.ts`), which the contract suite
//! (`aqw_core::contract`) checks against. In detail:
//!
//! Queues
//! * Durations are whole seconds, sub-second ones rounded up and capped at
//!   7 days, as the adapter sends them (`clamp_secs`); a receive or peek asks
//!   for `max.clamp(1, 32)` messages (the adapter clamps, so a `max` out of
//!   range is not an error).
//! * Any operation on a missing queue: `NotFound` (404 QueueNotFound);
//!   `delete_queue` of a missing queue and `create_if_missing` of an existing
//!   one: `Ok` (the adapter swallows 404 / 409). A name that is not a valid
//!   queue name: `Http { 400, "OutOfRangeInput" }` (length not 3..=63) or
//!   `Http { 400, "InvalidResourceName" }`, on every operation.
//! * `receive` with a zero visibility timeout: `Http { 400,
//!   "OutOfRangeQueryParameterValue" }` (Get Messages takes 1 s to 7 days).
//!   Messages come in the order they became visible, then insertion order
//!   (Azurite sorts by `timeNextVisible`, then insertion): for messages never
//!   received and put without a delay, that is insertion order.
//! * `put`: text over 65,536 bytes of UTF-8: `Http { 413,
//!   "RequestBodyTooLarge" }` (checked first, as Azurite does); a TTL of
//!   zero seconds, or an initial visibility (when non-zero, the only case the
//!   adapter sends it) not below a finite `Ttl::After`: `Http { 400,
//!   "InvalidQueryParameterValue" }`. `Ttl::Default` is 7 days, `Ttl::Never`
//!   expires at 9999-12-31T23:59:59Z (what the service reports), and
//!   `Ttl::After(d)` is capped at 7 days, because the adapter sends it
//!   through the same `clamp_secs` as a visibility timeout. The returned pop
//!   receipt deletes or updates the message until it is received.
//! * A stale pop receipt (the message was received again, or updated, since)
//!   on `delete` / `update_visibility`: by default `NotFound`, the documented
//!   Azure answer (404 MessageNotFound: Delete Message, "If a message with a
//!   matching pop receipt isn't found, the service returns error code 404";
//!   seen in azure-storage-python issue 300 and azure-storage-queue-go issue
//!   20). Azurite answers `Http { 400, "PopReceiptMismatch" }` instead (its
//!   `deleteMessage` / `updateMessage`; `tests/connections.rs` in crate
//!   `aqw` asserts it): [`MemoryStorage::set_stale_receipt`] switches to
//!   that. A message that is gone (deleted or expired): `NotFound` (404
//!   MessageNotFound). A receipt stays valid after the visibility timeout
//!   lapses, until someone receives the message again.
//! * `update_visibility` changes the visibility alone and keeps the text (the
//!   adapter sends no text), and is not refused past the message's expiry
//!   (documented, but not enforced by the service: azure-sdk-for-java issue
//!   105; Azurite does not check either).
//! * Expired messages vanish from receive, peek, count, update and delete.
//!   `approximate_count` is the number of unexpired messages, visible or
//!   not. (Azurite also counts expired messages until a receive or peek has
//!   swept them; Azure's count is approximate.)
//! * Times in messages are whole seconds (the wire format is RFC 1123);
//!   visibility is computed from the exact clock.
//!
//! Tables
//! * Table names are case-insensitive (the service and Azurite). A name that
//!   is not 3..=63 ASCII letters and digits starting with a letter, or is
//!   `tables`: `Http { 400, "OutOfRangeInput" }` /
//!   `Http { 400, "InvalidResourceName" }` on every operation.
//! * On a missing table: `insert`, `merge`, `query_where` and `transaction`
//!   give `NotFound` (404 TableNotFound); `get` gives `Ok(None)` and `delete`
//!   and `delete_table` give `Ok(())`, because the adapter maps every 404 of
//!   those to that. `create_if_missing` of an existing table is `Ok`.
//! * `insert` of an existing row: `Conflict`; `get` of a missing row:
//!   `Ok(None)`; `merge` (the adapter always sends `If-Match`, `*` without an
//!   ETag) of a missing row: `NotFound`, of a row whose ETag moved on:
//!   `PreconditionFailed`; `delete` (`If-Match: *`) of a missing row: `Ok`.
//!   An ETag of `*` matches any version.
//! * Every write gets a fresh ETag (opaque, never reused, even after a
//!   delete and re-insert) and a service `Timestamp`, the clock time of the
//!   write, which [`Filter::ChangedBefore`] compares against. Entities come
//!   back without `PartitionKey`, `RowKey`, `Timestamp` or `odata` metadata,
//!   as the adapter strips them; the same keys in a written entity are
//!   ignored (type annotations such as `N@odata.type` are dropped, the value
//!   kept, which is what a read through the adapter shows).
//! * Entity rules, as Azure and Azurite enforce them: `PartitionKey` /
//!   `RowKey` over 512 UTF-16 units (1 KiB) or holding `/ \ # ?` or a
//!   control character, and a property that is a JSON object or array:
//!   `Http { 400, "InvalidInput" }`; a string property over 32 K UTF-16
//!   units (64 KiB): `Http { 400, "PropertyValueTooLarge" }`. Stricter
//!   than Azurite, as Azure documents it: more than 252 properties:
//!   `Http { 400, "TooManyProperties" }`; an entity over 1 MiB by Azure's
//!   size formula (strings count 2 bytes a character):
//!   `Http { 400, "EntityTooLarge" }`. A `null` property is not stored, and
//!   merging a `null` removes the property (Azurite: a null is never
//!   returned).
//! * `query_where` returns every match at once, ordered by (PartitionKey,
//!   RowKey) (byte order of the UTF-8 keys; Azure and Azurite order by
//!   UTF-16 units, the same for keys without characters beyond U+FFFF), and
//!   counts one `table.query` request per 1,000 rows returned (at least
//!   one), as the adapter's pages would. `select` keeps the named columns the
//!   row has (a missing one is left out, as Azurite does); keys and ETag
//!   always come back.
//! * `transaction`: more than [`MAX_BATCH_OPERATIONS`] operations:
//!   `Http { 400, "BatchOperationFailed" }` (Azurite answers a 400 inside the
//!   changeset, which the adapter's `batch_result` reports with that code),
//!   checked before anything else; no operation: `Ok` (Azurite). Then the
//!   operations run in order on a staged copy and the first failure is the
//!   batch's answer, with nothing applied: `Conflict`, `NotFound`,
//!   `PreconditionFailed`, or `Http { status, "BatchOperationFailed" }` for
//!   a rule above or for the same row twice in one batch (Azurite:
//!   400 InvalidDuplicateRow).
//!
//! Blobs
//! * One container is a map of names to bytes; `put` replaces, `get` of a
//!   missing blob or container is `Ok(None)`, `touch` of a missing one
//!   `NotFound`, `delete` of a missing one `Ok` and with a stale `if_match`
//!   `PreconditionFailed`; `list` returns names in order with the length,
//!   the last write at whole seconds and the ETag (a missing container:
//!   empty). `put` into a missing container: `NotFound`. Container names
//!   are not checked.
//!
//! Not modelled: `QueueBeingDeleted` / `TableBeingDeleted` (Azure refuses to
//! re-create a name for a while after its deletion; Azurite does not), the
//! adapter's retries, Azure's typing of JSON numbers (an
//! integer past `i32` is stored as given) and shared-access rules.
//!
//! Test hooks: [`MemoryStorage::request_counts`] (by the operation names of
//! the adapter's transport), [`MemoryStorage::set_unavailable`] (an outage:
//! every call fails with [`StorageError::Transport`]),
//! [`MemoryStorage::set_latency`] and [`MemoryStorage::set_stale_receipt`].
//!
//! Azure's scalability targets (off by default, [`AzureLimits`]):
//! [`MemoryStorage::set_azure_limits`] makes the store answer `Http { 503,
//! "ServerBusy" }` past 2,000 messages a second on a queue, 2,000 entities
//! a second on a table partition or 20,000 requests a second on the
//! account, and keep its times in whole seconds;
//! [`MemoryStorage::load_peaks`] and [`MemoryStorage::server_busy`] report
//! the load.
//!
//! [`Filter::ChangedBefore`]: super::Filter::ChangedBefore
//! [`MAX_BATCH_OPERATIONS`]: super::MAX_BATCH_OPERATIONS

mod blob;
mod limits;
mod queue;
mod table;
#[cfg(test)]
mod tests;

use super::{
    BlobStore, Etag, QueueStore, Storage, StorageError, StorageResult, TableStore,
    MAX_VISIBILITY_TIMEOUT,
};
use blob::{Container, MemoryBlobs};
pub use limits::AzureLimits;
use limits::{Load, Scope};
use queue::{MemoryQueue, Queue};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use table::{MemoryTable, Table};
use time::OffsetDateTime;

/// What a stale pop receipt gets on `delete` and `update_visibility`
/// (see the module documentation: Azure and Azurite differ).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StaleReceipt {
    /// [`StorageError::NotFound`], Azure's documented 404 MessageNotFound
    /// (the default).
    #[default]
    NotFound,
    /// `StorageError::Http { status: 400, code: "PopReceiptMismatch" }`, as
    /// Azurite answers.
    PopReceiptMismatch,
}

/// An in-memory storage account on tokio time (see the [module
/// documentation](self) for the semantics). Clones share the account.
#[derive(Clone)]
pub struct MemoryStorage {
    shared: Arc<Shared>,
}

impl Default for MemoryStorage {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for MemoryStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.shared.lock();
        f.debug_struct("MemoryStorage")
            .field("now", &self.now())
            .field("queues", &st.queues.len())
            .field("tables", &st.tables.len())
            .field("unavailable", &st.unavailable)
            .finish()
    }
}

impl MemoryStorage {
    /// An empty account whose clock is the engine's ([`crate::clock`]),
    /// switched to simulated time: the engine's record times, key ages and
    /// retention cutoffs move with the store's under a paused runtime.
    pub fn new() -> Self {
        crate::clock::simulate();
        Self::starting_at(crate::clock::now_utc())
    }

    /// An empty account whose clock starts at `wall` (deterministic times
    /// for tests).
    pub fn starting_at(wall: OffsetDateTime) -> Self {
        Self {
            shared: Arc::new(Shared {
                clock: Clock {
                    base: wall,
                    start: tokio::time::Instant::now(),
                },
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// The account's clock: its start time plus the tokio time elapsed since
    /// (insertion, visibility and expiry times, entity Timestamps).
    pub fn now(&self) -> OffsetDateTime {
        self.shared.clock.now()
    }

    /// Requests made so far, by operation, named as the Azure adapter's
    /// transport counts them (`queue.receive`, `queue.peek`, `queue.put`,
    /// `queue.update`, `queue.delete`, `queue.metadata`, `queue.create`,
    /// `queue.delete_queue`, `table.insert`, `table.get`, `table.update`,
    /// `table.delete`, `table.query`, `table.batch`, `table.admin`,
    /// `blob.put`, `blob.get`, `blob.update`, `blob.delete`, `blob.list`,
    /// `blob.admin`). Every
    /// call counts, failed ones too; a query counts one per 1,000 rows.
    pub fn request_counts(&self) -> BTreeMap<String, u64> {
        self.shared.lock().counts.clone()
    }

    /// All requests made so far.
    pub fn total_requests(&self) -> u64 {
        self.shared.lock().counts.values().sum()
    }

    /// Start counting requests from zero.
    pub fn reset_request_counts(&self) {
        self.shared.lock().counts.clear();
    }

    /// Simulate an outage: while set, every call fails with
    /// [`StorageError::Transport`] (and changes nothing).
    pub fn set_unavailable(&self, unavailable: bool) {
        self.shared.lock().unavailable = unavailable;
    }

    /// Whether an outage is being simulated.
    pub fn is_unavailable(&self) -> bool {
        self.shared.lock().unavailable
    }

    /// Make every call wait `latency` of tokio time before it takes effect
    /// (zero, the default, does not wait or yield).
    pub fn set_latency(&self, latency: Duration) {
        self.shared.lock().latency = latency;
    }

    /// Enforce Azure's scalability targets (see [`AzureLimits`]; `None`,
    /// the default, enforces nothing). Turning them on starts the peaks
    /// and refusals from zero.
    pub fn set_azure_limits(&self, limits: Option<AzureLimits>) {
        let mut st = self.shared.lock();
        st.load = Load::default();
        st.load.limits = limits;
    }

    /// The most each queue (`queue <name>`), each table partition
    /// (`partition <table>/<pk>`) and the account (`account`) served in one
    /// second while the limits were on: messages, entities, requests.
    pub fn load_peaks(&self) -> BTreeMap<String, u64> {
        self.shared.lock().load.peaks.clone()
    }

    /// Requests refused as ServerBusy while the limits were on, by the
    /// target they met (`account`, `queue <name>`, `partition <t>/<pk>`).
    pub fn server_busy(&self) -> BTreeMap<String, u64> {
        self.shared.lock().load.refused.clone()
    }

    /// Choose what a stale pop receipt gets (default
    /// [`StaleReceipt::NotFound`], Azure's answer).
    pub fn set_stale_receipt(&self, answer: StaleReceipt) {
        self.shared.lock().stale_receipt = answer;
    }

    /// The queues that exist, sorted.
    #[cfg(test)]
    fn queue_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.shared.lock().queues.keys().cloned().collect();
        names.sort();
        names
    }

    /// The tables that exist (lowercase), sorted.
    #[cfg(test)]
    fn table_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.shared.lock().tables.keys().cloned().collect();
        names.sort();
        names
    }
}

impl Storage for MemoryStorage {
    fn queue(&self, name: &str) -> Arc<dyn QueueStore> {
        Arc::new(MemoryQueue {
            shared: self.shared.clone(),
            name: name.to_string(),
        })
    }

    fn table(&self, name: &str) -> Arc<dyn TableStore> {
        Arc::new(MemoryTable {
            shared: self.shared.clone(),
            name: name.to_string(),
            key: name.to_ascii_lowercase(),
        })
    }

    fn blobs(&self, name: &str) -> Arc<dyn BlobStore> {
        Arc::new(MemoryBlobs {
            shared: self.shared.clone(),
            name: name.to_string(),
        })
    }
}

/// Wall time at creation plus tokio time since.
struct Clock {
    base: OffsetDateTime,
    start: tokio::time::Instant,
}

impl Clock {
    fn now(&self) -> OffsetDateTime {
        self.base + self.start.elapsed()
    }
}

struct Shared {
    clock: Clock,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    queues: BTreeMap<String, Queue>,
    /// By lowercase name.
    tables: BTreeMap<String, Table>,
    containers: BTreeMap<String, Container>,
    counts: BTreeMap<String, u64>,
    unavailable: bool,
    latency: Duration,
    stale_receipt: StaleReceipt,
    /// Message order and ETags.
    seq: u64,
    /// Azure's targets, when on, and the load against them.
    load: Load,
}

impl State {
    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn next_etag(&mut self) -> Etag {
        Etag(format!("W/\"mem-{:012x}\"", self.next_seq()))
    }
}

impl Shared {
    /// The state, even if a panicking test poisoned the lock.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The configured latency, waited before a call takes effect.
    async fn delay(&self) {
        let latency = self.lock().latency;
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
    }

    /// Count the request and refuse it during an outage or, with Azure's
    /// limits on, past a target of the account or of `scope` (503
    /// ServerBusy); the state and the time of the request (whole seconds
    /// when the limits say so).
    fn begin(
        &self,
        op: &'static str,
        scope: Scope<'_>,
    ) -> StorageResult<(MutexGuard<'_, State>, OffsetDateTime)> {
        let mut st = self.lock();
        count(&mut st, op, 1);
        if st.unavailable {
            return Err(StorageError::Transport(
                "memory storage unavailable (simulated outage)".into(),
            ));
        }
        let now = self.clock.now();
        if !st.load.admit(now.unix_timestamp(), scope) {
            return Err(http(503, "ServerBusy"));
        }
        match st.load.limits {
            Some(l) if l.whole_seconds => Ok((st, wire(now))),
            _ => Ok((st, now)),
        }
    }
}

fn count(st: &mut State, op: &'static str, n: u64) {
    match st.counts.get_mut(op) {
        Some(c) => *c += n,
        None => {
            st.counts.insert(op.to_string(), n);
        }
    }
}

fn http(status: u16, code: &str) -> StorageError {
    StorageError::Http {
        status,
        code: code.into(),
    }
}

/// Whole seconds, sub-second durations rounded up, at most 7 days: what the
/// adapter sends for a visibility timeout or a TTL (`clamp_secs`).
fn whole_secs(d: Duration) -> u64 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    secs.min(MAX_VISIBILITY_TIMEOUT.as_secs())
}

/// A time as the wire carries it (RFC 1123: whole seconds).
fn wire(t: OffsetDateTime) -> OffsetDateTime {
    t.replace_nanosecond(0).unwrap_or(t)
}
