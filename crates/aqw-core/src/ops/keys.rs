//! `aqw keys show`: the idempotency record of one key.

use super::OpsResult;
use crate::config::AppConfig;
use crate::idempotency::{IdempotencyKey, KeyRecord, KeyStore};
use crate::storage::{Storage, StorageError};

/// The record of `key` of `function`, or `None` if it was never claimed.
pub async fn key_record(
    app: &AppConfig,
    storage: &dyn Storage,
    function: &str,
    key: &str,
) -> OpsResult<Option<KeyRecord>> {
    let k = IdempotencyKey::new(key)?;
    let keys = KeyStore::new(storage.table(&app.keys_table));
    match keys.get(function, &k).await {
        Ok(r) => Ok(r),
        Err(StorageError::NotFound) => Ok(None),
        Err(e) => Err(e.into()),
    }
}
