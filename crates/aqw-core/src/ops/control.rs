//! `aqw pause` / `aqw resume`: an operator's pause on a function's control
//! row, which every worker and `aqw serve` honour within
//! [`crate::control::WATCH_INTERVAL`]; procedures over [`ControlStore`].

use super::{OpsError, OpsResult};
use crate::config::AppConfig;
use crate::control::{Control, ControlStore};
use crate::storage::Storage;

/// The control store of `function`, which must be configured.
pub fn control_store(
    app: &AppConfig,
    function: &str,
    storage: &dyn Storage,
) -> OpsResult<ControlStore> {
    if app.function(function).is_none() {
        let known: Vec<&str> = app.functions.iter().map(|f| f.name.as_str()).collect();
        return Err(OpsError::Usage(format!(
            "no function named {function} (known: {})",
            known.join(", ")
        )));
    }
    Ok(ControlStore::new(storage.table(&app.control_table)))
}

/// Pause `function`; the row as it now reads.
pub async fn pause(
    store: &ControlStore,
    function: &str,
    by: &str,
    reason: &str,
) -> OpsResult<Control> {
    if by.trim().is_empty() {
        return Err(OpsError::Usage("--by must name who pauses".into()));
    }
    store.pause(function, by, reason).await?;
    Ok(store.get(function).await?)
}

/// Resume `function`; the row as it now reads.
pub async fn resume(store: &ControlStore, function: &str, by: &str) -> OpsResult<Control> {
    store.resume(function, by).await?;
    Ok(store.get(function).await?)
}
