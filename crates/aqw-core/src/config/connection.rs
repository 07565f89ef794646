//! Which storage account a function's queue, keys and records are in, as
//! the engine sees it: the connection setting that names it, and what a
//! storage adapter resolved that setting to (endpoints and credentials, in
//! the adapter's own shape: `aqw_azure::Connection` on Azure), held here
//! unread. The engine groups and compares accounts by the setting alone; no
//! endpoint, account name or credential type of any cloud is defined here.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// A function's storage account: the setting that names it, and the
/// adapter's resolution of it (opaque to the engine).
#[derive(Clone)]
pub struct StorageAccount {
    /// The setting it came from (`AzureWebJobsStorage`).
    pub setting: String,
    resolved: Option<Arc<dyn Any + Send + Sync>>,
}

impl StorageAccount {
    /// The account named by `setting`, as an adapter resolved it.
    pub fn new<T: Any + Send + Sync>(setting: impl Into<String>, resolved: T) -> Self {
        Self {
            setting: setting.into(),
            resolved: Some(Arc::new(resolved)),
        }
    }

    /// The account of a worker built in code on a storage it was given
    /// (nothing to resolve): the setting is named `embedded`.
    pub(crate) fn embedded() -> Self {
        Self {
            setting: "embedded".to_string(),
            resolved: None,
        }
    }

    /// The adapter's resolution, if it is a `T` (`None` for an embedded
    /// account or another adapter's).
    pub fn resolved<T: Any>(&self) -> Option<&T> {
        self.resolved.as_deref()?.downcast_ref()
    }
}

/// The setting only: the resolution may hold credentials.
impl fmt::Debug for StorageAccount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StorageAccount")
            .field("setting", &self.setting)
            .finish_non_exhaustive()
    }
}

/// One setting names one account within an app: accounts are the same when
/// their settings are.
impl PartialEq for StorageAccount {
    fn eq(&self, other: &Self) -> bool {
        self.setting == other.setting
    }
}

impl Eq for StorageAccount {}
