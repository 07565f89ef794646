//! The blob containers of the memory store: [`BlobStore`] as the Azure
//! adapter answers (`crates/aqw-azure/src/blobs.rs` of crate `aqw-azure`: a 404 on get is
//! `None`, on delete and on list of a missing container `Ok`), checked
//! against Azurite by the contract suite (`aqw_core::contract`).

use super::{count, wire, Shared, State};
use crate::storage::{BlobItem, BlobRead, BlobStore, Etag, StorageError, StorageResult};
use async_trait::async_trait;
use std::collections::BTreeMap;
use std::sync::{Arc, MutexGuard};
use time::OffsetDateTime;

/// A container: blobs by name (listed in name order, as the service lists).
#[derive(Default)]
pub(super) struct Container {
    blobs: BTreeMap<String, Stored>,
}

struct Stored {
    bytes: Arc<Vec<u8>>,
    etag: Etag,
    last_modified: OffsetDateTime,
}

/// A handle on one container of a shared account.
pub(super) struct MemoryBlobs {
    pub(super) shared: Arc<Shared>,
    pub(super) name: String,
}

impl MemoryBlobs {
    async fn begin(
        &self,
        op: &'static str,
    ) -> StorageResult<(MutexGuard<'_, State>, OffsetDateTime)> {
        self.shared.delay().await;
        self.shared.begin(op, super::Scope::Account)
    }
}

fn blob_etag(st: &mut State) -> Etag {
    Etag(format!("\"0xMEM{:012X}\"", st.next_seq()))
}

#[async_trait]
impl BlobStore for MemoryBlobs {
    fn name(&self) -> &str {
        &self.name
    }

    async fn create_if_missing(&self) -> StorageResult<()> {
        let (mut st, _) = self.begin("blob.admin").await?;
        st.containers.entry(self.name.clone()).or_default();
        Ok(())
    }

    async fn put(&self, name: &str, bytes: &[u8]) -> StorageResult<Etag> {
        let (mut st, now) = self.begin("blob.put").await?;
        let etag = blob_etag(&mut st);
        let container = st
            .containers
            .get_mut(&self.name)
            .ok_or(StorageError::NotFound)?;
        container.blobs.insert(
            name.to_string(),
            Stored {
                bytes: Arc::new(bytes.to_vec()),
                etag: etag.clone(),
                last_modified: wire(now),
            },
        );
        Ok(etag)
    }

    async fn get(&self, name: &str, max_bytes: u64) -> StorageResult<Option<BlobRead>> {
        let (st, _) = self.begin("blob.get").await?;
        let found = st
            .containers
            .get(&self.name)
            .and_then(|c| c.blobs.get(name))
            .map(|b| b.bytes.clone());
        drop(st);
        // The size is checked before the bytes are copied, as the Azure
        // adapter checks the length header before reading the body.
        Ok(found.map(|b| match b.len() as u64 {
            n if n > max_bytes => BlobRead::TooLarge(Some(n)),
            _ => BlobRead::Whole(b.as_ref().clone()),
        }))
    }

    async fn touch(&self, name: &str) -> StorageResult<Etag> {
        let (mut st, now) = self.begin("blob.update").await?;
        let etag = blob_etag(&mut st);
        let blob = st
            .containers
            .get_mut(&self.name)
            .and_then(|c| c.blobs.get_mut(name))
            .ok_or(StorageError::NotFound)?;
        blob.etag = etag.clone();
        blob.last_modified = wire(now);
        Ok(etag)
    }

    async fn delete(&self, name: &str, if_match: Option<&Etag>) -> StorageResult<()> {
        let (mut st, _) = self.begin("blob.delete").await?;
        let Some(container) = st.containers.get_mut(&self.name) else {
            return Ok(());
        };
        match (container.blobs.get(name), if_match) {
            (None, _) => Ok(()),
            (Some(b), Some(want)) if b.etag != *want && want.0 != "*" => {
                Err(StorageError::PreconditionFailed)
            }
            (Some(_), _) => {
                container.blobs.remove(name);
                Ok(())
            }
        }
    }

    async fn list(&self, prefix: &str) -> StorageResult<Vec<BlobItem>> {
        let (mut st, _) = self.begin("blob.list").await?;
        let items: Vec<BlobItem> = st
            .containers
            .get(&self.name)
            .map(|c| {
                c.blobs
                    .range(prefix.to_string()..)
                    .take_while(|(n, _)| n.starts_with(prefix))
                    .map(|(n, b)| BlobItem {
                        name: n.clone(),
                        length: b.bytes.len() as u64,
                        last_modified: b.last_modified,
                        etag: b.etag.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        // One request per 5,000 names, as the service pages a listing.
        let pages = (items.len() as u64).div_ceil(5000).max(1);
        count(&mut st, "blob.list", pages - 1);
        Ok(items)
    }

    async fn delete_container(&self) -> StorageResult<()> {
        let (mut st, _) = self.begin("blob.admin").await?;
        st.containers.remove(&self.name);
        Ok(())
    }
}
