//! The storage port: what the engine asks of queues, tables and blob
//! containers ([`BlobStore`]), in the
//! engine's own words. [`QueueStore`] and [`TableStore`] are implemented by
//! the Azure adapter (crate `aqw-azure`, `crates/aqw-azure/src/`) and by [`memory`], the
//! in-memory store on tokio time that the engine's tests and the fleet
//! simulation run on. The contract suite (`aqw_core::contract`) runs the same
//! checks on both, so the fake cannot drift from the emulator.
//!
//! Queries are typed ([`Filter`]): domain code never writes a filter string;
//! only the Azure adapter turns a [`TableQuery`] into OData.

pub mod memory;

use async_trait::async_trait;
use serde_json::{Map, Value};
use std::sync::Arc;
use std::time::Duration;
use time::OffsetDateTime;

/// The longest a queue message can stay invisible (a visibility timeout or
/// a retry delay): Queue Storage takes at most 7 days.
pub const MAX_VISIBILITY_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

/// A table entity's properties (without PartitionKey/RowKey/odata metadata).
pub type Entity = Map<String, Value>;

/// An opaque entity version for optimistic concurrency (`If-Match`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Etag(pub String);

/// One entity of a query, with its version.
#[derive(Debug, Clone)]
pub struct Row {
    /// The entity's PartitionKey.
    pub partition_key: String,
    /// The entity's RowKey.
    pub row_key: String,
    /// The entity's properties.
    pub entity: Entity,
    /// The entity's ETag as the query returned it (`odata.etag`), usable for
    /// `If-Match`; None only if the service left it out.
    pub etag: Option<Etag>,
}

/// Storage failures the rest of aqw reasons about.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StorageError {
    /// The queue, message, table or entity does not exist (HTTP 404).
    #[error("not found")]
    NotFound,
    /// It exists already (HTTP 409).
    #[error("already exists")]
    Conflict,
    /// An `If-Match` failed: the entity changed since it was read (HTTP 412).
    #[error("precondition failed: another writer changed it first")]
    PreconditionFailed,
    /// Any other HTTP error answer.
    #[error("storage answered HTTP {status} ({code})")]
    Http {
        /// The HTTP status.
        status: u16,
        /// The service's error code (e.g. `QueueBeingDeleted`).
        code: String,
    },
    /// The service could not be reached (I/O or connection failure); the
    /// scrubbed cause.
    #[error("storage unreachable: {0}")]
    Transport(String),
    /// Anything else (credentials, an unreadable answer), described.
    #[error("storage error: {0}")]
    Other(String),
}

/// The result of a storage call.
pub type StorageResult<T> = Result<T, StorageError>;

/// A message as received (with a lease) from a queue.
#[derive(Debug, Clone)]
pub struct ReceivedMessage {
    /// The message's id.
    pub id: String,
    /// The receipt that proves the lease: needed to delete the message or
    /// change its visibility.
    pub pop_receipt: String,
    /// How many times the message was received, this time included.
    pub dequeue_count: u32,
    /// When the message was put on the queue.
    pub insertion_time: OffsetDateTime,
    /// When the message expires.
    pub expiration_time: OffsetDateTime,
    /// When the message becomes visible again (the lease ends).
    pub next_visible: OffsetDateTime,
    /// The message text exactly as stored (still encoded).
    pub text: String,
}

/// A message seen without a lease.
#[derive(Debug, Clone)]
pub struct PeekedMessage {
    /// The message's id.
    pub id: String,
    /// How many times the message was received.
    pub dequeue_count: u32,
    /// When the message was put on the queue.
    pub insertion_time: OffsetDateTime,
    /// When the service deletes it unread (its time-to-live ends).
    pub expiration_time: OffsetDateTime,
    /// The message text exactly as stored (still encoded).
    pub text: String,
}

/// What a successful put returns.
#[derive(Debug, Clone)]
pub struct PutReceipt {
    /// The new message's id.
    pub id: String,
    /// A receipt for the new message (for a visibility change or a delete).
    pub pop_receipt: String,
    /// When the message was put on the queue.
    pub insertion_time: OffsetDateTime,
}

/// Message time-to-live on put.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ttl {
    /// The service default (7 days).
    Default,
    /// Never expires (`messagettl=-1`).
    Never,
    /// Expires this long after the put.
    After(Duration),
}

/// One Azure queue.
#[async_trait]
pub trait QueueStore: Send + Sync {
    /// The queue's name.
    fn name(&self) -> &str;
    /// Create the queue if it does not exist.
    async fn create_if_missing(&self) -> StorageResult<()>;
    /// Receive up to `max` (1..=32) messages, each invisible for `visibility`.
    async fn receive(&self, max: u8, visibility: Duration) -> StorageResult<Vec<ReceivedMessage>>;
    /// Look at up to `max` (1..=32) messages without leasing them.
    async fn peek(&self, max: u8) -> StorageResult<Vec<PeekedMessage>>;
    /// Put a message with `text`, invisible for `visibility`, expiring per `ttl`.
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
    /// Approximate number of messages on the queue.
    async fn approximate_count(&self) -> StorageResult<u64>;
    /// Remove the queue (tests and cleanup).
    async fn delete_queue(&self) -> StorageResult<()>;
}

/// An operation inside an entity-group transaction.
#[derive(Debug, Clone)]
pub enum TableOp {
    /// Insert an entity; the transaction fails if it exists.
    Insert {
        /// The entity's RowKey.
        row_key: String,
        /// Its properties.
        entity: Entity,
    },
    /// Merge properties into an entity (`if_match`: only at that version).
    Merge {
        /// The entity's RowKey.
        row_key: String,
        /// The properties to merge.
        entity: Entity,
        /// Only if the entity is still at this version; `None`: any version.
        if_match: Option<Etag>,
    },
    /// Delete only if the entity is still at `if_match` (a row changed since
    /// it was read fails the batch with `PreconditionFailed`).
    Delete {
        /// The entity's RowKey.
        row_key: String,
        /// The version the entity must still be at.
        if_match: Etag,
    },
}

/// A server-side query: a typed [`Filter`] (within one partition when
/// `partition` is set) and the columns to return (`$select`; empty = all).
/// The keys (PartitionKey, RowKey) always come back.
#[derive(Debug, Clone, Default)]
pub struct TableQuery<'a> {
    /// Only this partition, when set.
    pub partition: Option<&'a str>,
    /// Only the rows that match, when set.
    pub filter: Option<Filter>,
    /// The columns to return; empty means all.
    pub select: &'a [&'a str],
}

/// What a query may ask the service to filter on: the few shapes the engine
/// needs, so a backend can evaluate them exactly (the Azure adapter writes
/// them as OData, the memory store compares values).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Filter {
    /// A string column equals the value.
    Eq {
        /// The column's name.
        column: &'static str,
        /// The string it must equal.
        value: String,
    },
    /// A string column equals one of the values.
    OneOf {
        /// The column's name.
        column: &'static str,
        /// The strings it may equal (none: nothing matches).
        values: Vec<String>,
    },
    /// The row last changed (the service's `Timestamp`) before this time.
    /// The Azure adapter compares at whole seconds (OData's `datetime'…'`),
    /// rounding the bound down, so a row exactly at the bound never matches.
    ChangedBefore(OffsetDateTime),
    /// The row last changed at or after this time (at whole seconds,
    /// rounding the bound down, as [`Filter::ChangedBefore`]).
    ChangedSince(OffsetDateTime),
    /// A string column starts with the prefix (a range on the server:
    /// `ge prefix and lt` the prefix with its last character raised).
    StartsWith {
        /// The column's name.
        column: &'static str,
        /// The prefix.
        prefix: String,
    },
    /// Every one of the filters matches.
    And(Vec<Filter>),
}

impl Filter {
    /// `column eq value`.
    pub(crate) fn eq(column: &'static str, value: impl Into<String>) -> Self {
        Filter::Eq {
            column,
            value: value.into(),
        }
    }

    /// `column` is one of `values`.
    pub(crate) fn one_of(column: &'static str, values: &[&str]) -> Self {
        Filter::OneOf {
            column,
            values: values.iter().map(|v| v.to_string()).collect(),
        }
    }

    /// Both `self` and `other`.
    pub fn and(self, other: Filter) -> Self {
        match self {
            Filter::And(mut all) => {
                all.push(other);
                Filter::And(all)
            }
            first => Filter::And(vec![first, other]),
        }
    }

    /// Whether an entity last changed at `changed` matches (how a backend
    /// without a query language evaluates the filter; `ChangedBefore` at
    /// whole seconds, as the service compares).
    /// The row's own keys answer for the columns `PartitionKey` and `RowKey`
    /// (as the service's filter sees them).
    pub(crate) fn matches(
        &self,
        (partition_key, row_key): (&str, &str),
        entity: &Entity,
        changed: OffsetDateTime,
    ) -> bool {
        let text = |c: &str| match c {
            "PartitionKey" => Some(partition_key),
            "RowKey" => Some(row_key),
            _ => entity.get(c).and_then(|v| v.as_str()),
        };
        match self {
            Filter::Eq { column, value } => text(column) == Some(value.as_str()),
            Filter::OneOf { column, values } => {
                text(column).is_some_and(|t| values.iter().any(|v| v == t))
            }
            Filter::ChangedBefore(t) => {
                let whole = t.replace_nanosecond(0).unwrap_or(*t);
                changed < whole
            }
            Filter::ChangedSince(t) => {
                let whole = t.replace_nanosecond(0).unwrap_or(*t);
                changed >= whole
            }
            Filter::StartsWith { column, prefix } => {
                text(column).is_some_and(|t| t.starts_with(prefix.as_str()))
            }
            Filter::And(all) => all
                .iter()
                .all(|f| f.matches((partition_key, row_key), entity, changed)),
        }
    }
}

/// The most operations one entity-group transaction may hold.
pub const MAX_BATCH_OPERATIONS: usize = 100;

/// One Azure table of JSON entities.
#[async_trait]
pub trait TableStore: Send + Sync {
    /// The table's name.
    fn name(&self) -> &str;
    /// Create the table if it does not exist.
    async fn create_if_missing(&self) -> StorageResult<()>;
    /// Insert; `Conflict` when (pk, rk) exists. Returns the new ETag.
    async fn insert(&self, pk: &str, rk: &str, entity: &Entity) -> StorageResult<Etag>;
    /// The entity at (`pk`, `rk`) with its ETag; `None` when there is none.
    async fn get(&self, pk: &str, rk: &str) -> StorageResult<Option<(Entity, Etag)>>;
    /// Merge properties into the entity; `PreconditionFailed` when the ETag moved on.
    async fn merge(
        &self,
        pk: &str,
        rk: &str,
        entity: &Entity,
        if_match: Option<&Etag>,
    ) -> StorageResult<Etag>;
    /// Delete the entity at (`pk`, `rk`), whatever its version.
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
    /// Remove the table (tests and cleanup).
    async fn delete_table(&self) -> StorageResult<()>;
}

/// One blob of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobItem {
    /// The blob's name (may hold `/`).
    pub name: String,
    /// Its length in bytes.
    pub length: u64,
    /// When it was last written (or touched).
    pub last_modified: OffsetDateTime,
    /// Its version, for a conditional delete.
    pub etag: Etag,
}

/// What a bounded read of a blob ([`BlobStore::get`]) found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlobRead {
    /// The whole blob: at most the bound.
    Whole(Vec<u8>),
    /// The blob is larger than the bound, and was not read past it: its
    /// size when the service said it (a length header), else `None`.
    TooLarge(Option<u64>),
}

/// One Blob Storage container of block blobs (claim-check payloads,
/// [`crate::claim`]).
#[async_trait]
pub trait BlobStore: Send + Sync {
    /// The container's name.
    fn name(&self) -> &str;
    /// Create the container if it does not exist.
    async fn create_if_missing(&self) -> StorageResult<()>;
    /// Write `bytes` as the blob `name`, replacing any blob of that name;
    /// the new ETag. `NotFound` when the container is missing.
    async fn put(&self, name: &str, bytes: &[u8]) -> StorageResult<Etag>;
    /// The blob's bytes when it holds at most `max_bytes`, else
    /// [`BlobRead::TooLarge`] without reading more than the bound (the blob's
    /// bytes are input: a larger one must cost no more memory than the
    /// bound); `None` when there is no such blob (or container).
    async fn get(&self, name: &str, max_bytes: u64) -> StorageResult<Option<BlobRead>>;
    /// Mark the blob written now (its `last_modified` and ETag change, the
    /// bytes do not); `NotFound` when it is missing.
    async fn touch(&self, name: &str) -> StorageResult<Etag>;
    /// Delete the blob: `Ok` when it is already gone; with `if_match`, only
    /// while it is still at that version (`PreconditionFailed` otherwise).
    async fn delete(&self, name: &str, if_match: Option<&Etag>) -> StorageResult<()>;
    /// Every blob whose name starts with `prefix`, by name, following
    /// continuations; empty when the container is missing.
    async fn list(&self, prefix: &str) -> StorageResult<Vec<BlobItem>>;
    /// Remove the container (tests and cleanup); `Ok` when it is missing.
    async fn delete_container(&self) -> StorageResult<()>;
}

/// Opens queues, tables and blob containers of one storage account.
pub trait Storage: Send + Sync {
    /// The queue `name` of this account.
    fn queue(&self, name: &str) -> Arc<dyn QueueStore>;
    /// The table `name` of this account.
    fn table(&self, name: &str) -> Arc<dyn TableStore>;
    /// The blob container `name` of this account.
    fn blobs(&self, name: &str) -> Arc<dyn BlobStore>;
}
