//! The tables of the memory store: the table state (rows in key order),
//! the entity rules of the service, and [`TableStore`] on them, as the
//! module documentation of [`super`] describes.

use super::{count, http, Scope, Shared, State};
use crate::storage::{
    Entity, Etag, Filter, Row, StorageError, StorageResult, TableOp, TableQuery, TableStore,
    MAX_BATCH_OPERATIONS,
};
use async_trait::async_trait;
use serde_json::Value;
use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, MutexGuard};
use time::OffsetDateTime;

/// A query page of the Table service.
const QUERY_PAGE: usize = 1000;
/// PartitionKey / RowKey: 1 KiB of UTF-16.
const MAX_KEY_UTF16: usize = 512;
/// A string property: 64 KiB of UTF-16.
const MAX_STRING_UTF16: usize = 32 * 1024;
/// A binary property: 64 KiB.
const MAX_BINARY_BYTES: usize = 64 * 1024;
/// Custom properties of an entity (255 with PartitionKey, RowKey, Timestamp).
const MAX_PROPERTIES: usize = 252;
/// An entity, by Azure's size formula.
const MAX_ENTITY_BYTES: usize = 1024 * 1024;

/// Azure's table naming rules (Azurite's `validateTableName`), with Azure's
/// error codes.
fn check_table_name(name: &str) -> StorageResult<()> {
    if !(3..=63).contains(&name.len()) {
        return Err(http(400, "OutOfRangeInput"));
    }
    let mut bytes = name.bytes();
    let first_letter = bytes.next().is_some_and(|b| b.is_ascii_alphabetic());
    if !first_letter
        || !bytes.all(|b| b.is_ascii_alphanumeric())
        || name.eq_ignore_ascii_case("tables")
    {
        return Err(http(400, "InvalidResourceName"));
    }
    Ok(())
}

/// PartitionKey / RowKey rules: 1 KiB, no `/ \ # ?` or control characters.
fn check_key(key: &str) -> StorageResult<()> {
    let forbidden =
        |c: char| matches!(c, '/' | '\\' | '#' | '?') || matches!(c as u32, 0..=0x1f | 0x7f..=0x9f);
    if key.encode_utf16().count() > MAX_KEY_UTF16 || key.chars().any(forbidden) {
        return Err(http(400, "InvalidInput"));
    }
    Ok(())
}

/// Properties the service manages or the adapter strips on reads.
fn is_metadata(name: &str) -> bool {
    matches!(name, "PartitionKey" | "RowKey" | "Timestamp")
        || name.starts_with("odata.")
        || name.contains("@odata.")
}

/// The written properties as the service takes them: metadata dropped,
/// `null`s kept (an insert drops them, a merge removes those properties),
/// values checked.
fn written(entity: &Entity) -> StorageResult<Entity> {
    let mut out = Entity::new();
    for (name, value) in entity {
        if is_metadata(name) {
            continue;
        }
        match value {
            Value::Object(_) | Value::Array(_) => return Err(http(400, "InvalidInput")),
            Value::String(s) => {
                let binary = entity
                    .get(&format!("{name}@odata.type"))
                    .and_then(Value::as_str)
                    == Some("Edm.Binary");
                let too_large = if binary {
                    let padding = s.bytes().rev().take_while(|&b| b == b'=').count();
                    (s.len() / 4 * 3).saturating_sub(padding) > MAX_BINARY_BYTES
                } else {
                    s.encode_utf16().count() > MAX_STRING_UTF16
                };
                if too_large {
                    return Err(http(400, "PropertyValueTooLarge"));
                }
            }
            _ => {}
        }
        out.insert(name.clone(), value.clone());
    }
    Ok(out)
}

/// Azure's entity limits on what would be stored.
fn check_entity(pk: &str, rk: &str, entity: &Entity) -> StorageResult<()> {
    if entity.len() > MAX_PROPERTIES {
        return Err(http(400, "TooManyProperties"));
    }
    // "4 bytes + Len(PartitionKey + RowKey) * 2 bytes + For-Each Property
    // (8 bytes + Len(Property Name) * 2 bytes + Sizeof(.Net Property Type))".
    let utf16 = |s: &str| s.encode_utf16().count();
    let mut size = 4 + (utf16(pk) + utf16(rk)) * 2;
    for (name, value) in entity {
        size += 8 + utf16(name) * 2;
        size += match value {
            Value::String(s) => 4 + utf16(s) * 2,
            Value::Bool(_) => 1,
            Value::Number(n) if n.as_i64().is_some_and(|i| i32::try_from(i).is_ok()) => 4,
            Value::Number(_) => 8,
            _ => 0,
        };
    }
    if size > MAX_ENTITY_BYTES {
        return Err(http(400, "EntityTooLarge"));
    }
    Ok(())
}

fn etag_matches(current: &Etag, wanted: &Etag) -> bool {
    wanted.0 == "*" || wanted == current
}

#[derive(Clone)]
struct Stored {
    entity: Entity,
    etag: Etag,
    /// The service Timestamp: when the row was last written.
    timestamp: OffsetDateTime,
}

#[derive(Default)]
pub(super) struct Table {
    /// (PartitionKey, RowKey) → row, in query order.
    rows: BTreeMap<(String, String), Stored>,
}

impl Table {
    fn row(&self, pk: &str, rk: &str) -> Option<&Stored> {
        self.rows.get(&(pk.to_string(), rk.to_string()))
    }

    /// One operation of a batch on partition `pk`, checked against the rows
    /// as they are (nothing is applied): its RowKey and the entity it
    /// leaves, `None` for a delete. `seen` holds the batch's RowKeys so far.
    fn stage(
        &self,
        pk: &str,
        op: TableOp,
        seen: &mut HashSet<String>,
    ) -> StorageResult<(String, Option<Entity>)> {
        match op {
            TableOp::Insert { row_key, entity } => {
                if !seen.insert(row_key.clone()) {
                    return Err(http(400, "BatchOperationFailed"));
                }
                let entity = inserted(pk, &row_key, &entity).map_err(in_batch)?;
                if self.row(pk, &row_key).is_some() {
                    return Err(StorageError::Conflict);
                }
                Ok((row_key, Some(entity)))
            }
            TableOp::Merge {
                row_key,
                entity,
                if_match,
            } => {
                if !seen.insert(row_key.clone()) {
                    return Err(http(400, "BatchOperationFailed"));
                }
                check_key(pk).map_err(in_batch)?;
                check_key(&row_key).map_err(in_batch)?;
                let changes = written(&entity).map_err(in_batch)?;
                let current = self.row(pk, &row_key).ok_or(StorageError::NotFound)?;
                if if_match.is_some_and(|want| !etag_matches(&current.etag, &want)) {
                    return Err(StorageError::PreconditionFailed);
                }
                let entity = merged(pk, &row_key, &current.entity, &changes).map_err(in_batch)?;
                Ok((row_key, Some(entity)))
            }
            TableOp::Delete { row_key, if_match } => {
                if !seen.insert(row_key.clone()) {
                    return Err(http(400, "BatchOperationFailed"));
                }
                let current = self.row(pk, &row_key).ok_or(StorageError::NotFound)?;
                if !etag_matches(&current.etag, &if_match) {
                    return Err(StorageError::PreconditionFailed);
                }
                Ok((row_key, None))
            }
        }
    }

    /// Apply a batch's staged rows (RowKey, new row or `None` for deleted)
    /// to partition `pk`.
    fn apply(&mut self, pk: &str, staged: Vec<(String, Option<Stored>)>) {
        for (rk, after) in staged {
            let key = (pk.to_string(), rk);
            match after {
                Some(row) => {
                    self.rows.insert(key, row);
                }
                None => {
                    self.rows.remove(&key);
                }
            }
        }
    }
}

/// The row an insert would store.
fn inserted(pk: &str, rk: &str, entity: &Entity) -> StorageResult<Entity> {
    check_key(pk)?;
    check_key(rk)?;
    let mut e = written(entity)?;
    e.retain(|_, v| !v.is_null());
    check_entity(pk, rk, &e)?;
    Ok(e)
}

/// The merged properties of `current` and `entity` (a `null` removes).
fn merged(pk: &str, rk: &str, current: &Entity, entity: &Entity) -> StorageResult<Entity> {
    let mut e = current.clone();
    for (name, value) in entity {
        if value.is_null() {
            e.remove(name);
        } else {
            e.insert(name.clone(), value.clone());
        }
    }
    check_entity(pk, rk, &e)?;
    Ok(e)
}

/// Errors inside a batch as the adapter's `batch_result` reports them.
fn in_batch(e: StorageError) -> StorageError {
    match e {
        StorageError::Http { status, .. } => http(status, "BatchOperationFailed"),
        other => other,
    }
}

/// A handle on one table of the shared account.
pub(super) struct MemoryTable {
    pub(super) shared: Arc<Shared>,
    /// As given (what `name()` returns).
    pub(super) name: String,
    /// Lowercase: table names are case-insensitive.
    pub(super) key: String,
}

impl MemoryTable {
    /// Count the request, then check the name: the state and the time.
    async fn begin(
        &self,
        op: &'static str,
        scope: Scope<'_>,
    ) -> StorageResult<(MutexGuard<'_, State>, OffsetDateTime)> {
        self.shared.delay().await;
        let (st, now) = self.shared.begin(op, scope)?;
        check_table_name(&self.name)?;
        Ok((st, now))
    }
}

#[async_trait]
impl TableStore for MemoryTable {
    fn name(&self) -> &str {
        &self.name
    }

    async fn create_if_missing(&self) -> StorageResult<()> {
        let (mut st, _) = self.begin("table.admin", Scope::Account).await?;
        st.tables.entry(self.key.clone()).or_default();
        Ok(())
    }

    async fn insert(&self, pk: &str, rk: &str, entity: &Entity) -> StorageResult<Etag> {
        let (mut st, now) = self
            .begin("table.insert", Scope::Partition(&self.key, pk))
            .await?;
        let entity = inserted(pk, rk, entity)?;
        let etag = st.next_etag();
        let table = st.tables.get_mut(&self.key).ok_or(StorageError::NotFound)?;
        let key = (pk.to_string(), rk.to_string());
        if table.rows.contains_key(&key) {
            return Err(StorageError::Conflict);
        }
        table.rows.insert(
            key,
            Stored {
                entity,
                etag: etag.clone(),
                timestamp: now,
            },
        );
        Ok(etag)
    }

    async fn get(&self, pk: &str, rk: &str) -> StorageResult<Option<(Entity, Etag)>> {
        let (st, _) = self
            .begin("table.get", Scope::Partition(&self.key, pk))
            .await?;
        // A missing table is a 404 too, which the adapter reads as "no row".
        Ok(st
            .tables
            .get(&self.key)
            .and_then(|t| t.row(pk, rk))
            .map(|s| (s.entity.clone(), s.etag.clone())))
    }

    async fn merge(
        &self,
        pk: &str,
        rk: &str,
        entity: &Entity,
        if_match: Option<&Etag>,
    ) -> StorageResult<Etag> {
        let (mut st, now) = self
            .begin("table.update", Scope::Partition(&self.key, pk))
            .await?;
        check_key(pk)?;
        check_key(rk)?;
        let changes = written(entity)?;
        let etag = st.next_etag();
        let table = st.tables.get_mut(&self.key).ok_or(StorageError::NotFound)?;
        let current = table.row(pk, rk).ok_or(StorageError::NotFound)?;
        if if_match.is_some_and(|want| !etag_matches(&current.etag, want)) {
            return Err(StorageError::PreconditionFailed);
        }
        let entity = merged(pk, rk, &current.entity, &changes)?;
        table.rows.insert(
            (pk.to_string(), rk.to_string()),
            Stored {
                entity,
                etag: etag.clone(),
                timestamp: now,
            },
        );
        Ok(etag)
    }

    async fn delete(&self, pk: &str, rk: &str) -> StorageResult<()> {
        let (mut st, _) = self
            .begin("table.delete", Scope::Partition(&self.key, pk))
            .await?;
        // `If-Match: *`; a missing row or table is a 404 the adapter ignores.
        if let Some(table) = st.tables.get_mut(&self.key) {
            table.rows.remove(&(pk.to_string(), rk.to_string()));
        }
        Ok(())
    }

    async fn query_where(&self, query: &TableQuery<'_>) -> StorageResult<Vec<Row>> {
        let scope = match query.partition {
            Some(pk) => Scope::Partition(&self.key, pk),
            None => Scope::Account,
        };
        let (mut st, _) = self.begin("table.query", scope).await?;
        let table = st.tables.get(&self.key).ok_or(StorageError::NotFound)?;
        let rows: Box<dyn Iterator<Item = (&(String, String), &Stored)>> = match query.partition {
            Some(pk) => Box::new(
                table
                    .rows
                    .range((pk.to_string(), String::new())..)
                    .take_while(move |((p, _), _)| p == pk),
            ),
            None => Box::new(table.rows.iter()),
        };
        let out: Vec<Row> = rows
            .filter(|((pk, rk), s)| {
                query.filter.as_ref().is_none_or(|f: &Filter| {
                    f.matches((pk.as_str(), rk.as_str()), &s.entity, s.timestamp)
                })
            })
            .map(|((pk, rk), s)| {
                let mut entity = s.entity.clone();
                if !query.select.is_empty() {
                    entity.retain(|k, _| query.select.contains(&k.as_str()));
                }
                Row {
                    partition_key: pk.clone(),
                    row_key: rk.clone(),
                    entity,
                    etag: Some(s.etag.clone()),
                }
            })
            .collect();
        // One request per page of 1,000 rows, as the adapter follows them.
        let pages = out.len().div_ceil(QUERY_PAGE).max(1) as u64;
        count(&mut st, "table.query", pages - 1);
        st.load.charge(scope, out.len().saturating_sub(1) as u64);
        Ok(out)
    }

    async fn transaction(&self, pk: &str, ops: Vec<TableOp>) -> StorageResult<()> {
        let scope = Scope::Partition(&self.key, pk);
        let (mut st, now) = self.begin("table.batch", scope).await?;
        if ops.len() > MAX_BATCH_OPERATIONS {
            return Err(http(400, "BatchOperationFailed"));
        }
        st.load.charge(scope, ops.len().saturating_sub(1) as u64);
        if ops.is_empty() {
            return Ok(());
        }
        let etags: Vec<Etag> = ops.iter().map(|_| st.next_etag()).collect();
        let table = st.tables.get_mut(&self.key).ok_or(StorageError::NotFound)?;
        // Staged: (RowKey, new row or None for deleted). Nothing is applied
        // until every operation has passed.
        let mut staged: Vec<(String, Option<Stored>)> = Vec::with_capacity(ops.len());
        let mut seen = HashSet::new();
        for (op, etag) in ops.into_iter().zip(etags) {
            let (rk, after) = table.stage(pk, op, &mut seen)?;
            let after = after.map(|entity| Stored {
                entity,
                etag,
                timestamp: now,
            });
            staged.push((rk, after));
        }
        table.apply(pk, staged);
        Ok(())
    }

    async fn delete_table(&self) -> StorageResult<()> {
        let (mut st, _) = self.begin("table.admin", Scope::Account).await?;
        st.tables.remove(&self.key);
        Ok(())
    }
}
