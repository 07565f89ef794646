//! Storage behind two small traits: [`QueueStore`] and [`TableStore`].
//!
//! This folder is the only code that imports the Azure SDK crates; switching
//! SDK lines touches nothing outside it. On the maintained 1.x line:
//!
//! * [`azure`]: [`connect`], queues on `azure_storage_queue` 1.x;
//! * [`tables`]: our own typed Tables client (no 1.x Tables crate exists);
//! * [`pipeline`]: the shared `azure_core` 1.x transport, retry options, and
//!   the SAS authorization policy;
//! * [`shared_key`]: the SharedKey authorization policy (account keys);
//! * [`identity`]: Entra ID credentials (`azure_identity` 1.x) and the order
//!   they are tried in;
//! * [`connection`]: connection strings and identity-based settings → a
//!   [`Connection`].
//!
//! Queue and table behaviour is proven against Azurite in `tests/`, never on a fake.

pub mod azure;
pub mod identity;
pub mod pipeline;
pub mod shared_key;
pub mod tables;
pub(crate) mod transport;

pub mod connection;
use async_trait::async_trait;
pub use connection::{
    parse_connection_string, resolve_connection, table_endpoint_for, Connection, Credentials,
    Secret, DEV_ACCOUNT, DEV_KEY,
};
use serde_json::{Map, Value};
use std::sync::Arc;
use std::time::Duration;
use time::OffsetDateTime;

/// The longest a queue message can stay invisible (a visibility timeout or
/// a retry delay): Queue Storage takes at most 7 days.
pub const MAX_VISIBILITY_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

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

/// A table entity's properties (without PartitionKey/RowKey/odata metadata).
pub type Entity = Map<String, Value>;

/// An opaque entity version for optimistic concurrency (`If-Match`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Etag(pub String);

/// One entity of a query, with its version.
#[derive(Debug, Clone)]
pub struct Row {
    pub partition_key: String,
    pub row_key: String,
    pub entity: Entity,
    /// The entity's ETag as the query returned it (`odata.etag`), usable for
    /// `If-Match`; None only if the service left it out.
    pub etag: Option<Etag>,
}

/// Storage failures the rest of aqw reasons about.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StorageError {
    #[error("not found")]
    NotFound,
    #[error("already exists")]
    Conflict,
    #[error("precondition failed: another writer changed it first")]
    PreconditionFailed,
    #[error("storage answered HTTP {status} ({code})")]
    Http { status: u16, code: String },
    #[error("storage unreachable: {0}")]
    Transport(String),
    #[error("storage error: {0}")]
    Other(String),
}

pub type StorageResult<T> = Result<T, StorageError>;

/// A message as received (with a lease) from a queue.
#[derive(Debug, Clone)]
pub struct ReceivedMessage {
    pub id: String,
    pub pop_receipt: String,
    pub dequeue_count: u32,
    pub insertion_time: OffsetDateTime,
    pub expiration_time: OffsetDateTime,
    pub next_visible: OffsetDateTime,
    /// The message text exactly as stored (still encoded).
    pub text: String,
}

/// A message seen without a lease.
#[derive(Debug, Clone)]
pub struct PeekedMessage {
    pub id: String,
    pub dequeue_count: u32,
    pub insertion_time: OffsetDateTime,
    pub text: String,
}

/// What a successful put returns.
#[derive(Debug, Clone)]
pub struct PutReceipt {
    pub id: String,
    pub pop_receipt: String,
    pub insertion_time: OffsetDateTime,
}

/// Message time-to-live on put.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ttl {
    /// The service default (7 days).
    Default,
    /// Never expires (`messagettl=-1`).
    Never,
    After(Duration),
}

/// One Azure queue.
#[async_trait]
pub trait QueueStore: Send + Sync {
    fn name(&self) -> &str;
    async fn create_if_missing(&self) -> StorageResult<()>;
    /// Receive up to `max` (1..=32) messages, each invisible for `visibility`.
    async fn receive(&self, max: u8, visibility: Duration) -> StorageResult<Vec<ReceivedMessage>>;
    async fn peek(&self, max: u8) -> StorageResult<Vec<PeekedMessage>>;
    async fn put(&self, text: &str, visibility: Duration, ttl: Ttl) -> StorageResult<PutReceipt>;
    /// Change a leased message's visibility; returns the new pop receipt.
    /// The text is what the message holds (kept for backends that rewrite it;
    /// the 1.x queue client changes the visibility alone).
    async fn update_visibility(
        &self,
        id: &str,
        pop_receipt: &str,
        text: &str,
        visibility: Duration,
    ) -> StorageResult<String>;
    /// Delete a leased message. NotFound means it is already gone (or the
    /// lease moved on): callers decide whether that is success.
    async fn delete(&self, id: &str, pop_receipt: &str) -> StorageResult<()>;
    async fn approximate_count(&self) -> StorageResult<u64>;
    /// Remove the queue (tests and cleanup).
    async fn delete_queue(&self) -> StorageResult<()>;
}

/// An operation inside an entity-group transaction.
#[derive(Debug, Clone)]
pub enum TableOp {
    Insert {
        row_key: String,
        entity: Entity,
    },
    Merge {
        row_key: String,
        entity: Entity,
        if_match: Option<Etag>,
    },
    /// Delete only if the entity is still at `if_match` (a row changed since
    /// it was read fails the batch with `PreconditionFailed`).
    Delete {
        row_key: String,
        if_match: Etag,
    },
}

/// A server-side query: an OData `$filter` (within one partition when
/// `partition` is set) and the columns to return (`$select`; empty = all).
#[derive(Debug, Clone, Default)]
pub struct TableQuery<'a> {
    pub partition: Option<&'a str>,
    pub filter: Option<String>,
    pub select: &'a [&'a str],
}

/// The most operations one entity-group transaction may hold.
pub const MAX_BATCH_OPERATIONS: usize = 100;

/// `'text'` as an OData string literal (quotes doubled).
pub fn odata_string(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// `datetime'…'` as an OData literal, for comparisons on `Timestamp`.
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

/// One Azure table of JSON entities.
#[async_trait]
pub trait TableStore: Send + Sync {
    fn name(&self) -> &str;
    async fn create_if_missing(&self) -> StorageResult<()>;
    /// Insert; `Conflict` when (pk, rk) exists. Returns the new ETag.
    async fn insert(&self, pk: &str, rk: &str, entity: &Entity) -> StorageResult<Etag>;
    async fn get(&self, pk: &str, rk: &str) -> StorageResult<Option<(Entity, Etag)>>;
    /// Merge properties into the entity; `PreconditionFailed` when the ETag moved on.
    async fn merge(
        &self,
        pk: &str,
        rk: &str,
        entity: &Entity,
        if_match: Option<&Etag>,
    ) -> StorageResult<Etag>;
    async fn delete(&self, pk: &str, rk: &str) -> StorageResult<()>;
    /// All entities of a partition (or of the table when `pk` is None), with
    /// their ETags, following continuations.
    async fn query_rows(&self, pk: Option<&str>) -> StorageResult<Vec<Row>> {
        self.query_where(&TableQuery {
            partition: pk,
            ..Default::default()
        })
        .await
    }
    /// The entities matching `query`, with their ETags, following continuations.
    async fn query_where(&self, query: &TableQuery<'_>) -> StorageResult<Vec<Row>>;
    /// [`TableStore::query_rows`] without the versions.
    async fn query(&self, pk: Option<&str>) -> StorageResult<Vec<(String, String, Entity)>> {
        Ok(self
            .query_rows(pk)
            .await?
            .into_iter()
            .map(|r| (r.partition_key, r.row_key, r.entity))
            .collect())
    }
    /// An entity-group transaction: all operations land or none does (at
    /// most [`MAX_BATCH_OPERATIONS`], all in partition `pk`).
    async fn transaction(&self, pk: &str, ops: Vec<TableOp>) -> StorageResult<()>;
    async fn delete_table(&self) -> StorageResult<()>;
}

/// Opens queues and tables of one storage account.
pub trait Storage: Send + Sync {
    fn queue(&self, name: &str) -> Arc<dyn QueueStore>;
    fn table(&self, name: &str) -> Arc<dyn TableStore>;
}

pub use azure::{connect, AzureStorage};
