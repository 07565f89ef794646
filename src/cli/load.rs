//! What almost every command does first: load the app folder, then open the
//! storage account of a function or a queue. One helper each, so every
//! command fails alike (a usage error, exit 2) on a bad folder, an unknown
//! function or queue, or a connection that cannot be opened; and the
//! parsers of the options several commands share. A leaf: the
//! dispatcher and every command file import it, it imports none of them.

use super::exit::Failure;
use aqw_core::config::{AppConfig, FunctionConfig, StorageAccount};
use aqw_core::ops::{self, PurgeOptions, QueueOps};
use aqw_core::storage::Storage;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The app folder, loaded and validated.
pub(super) fn load(app: &Path) -> Result<Arc<AppConfig>, Failure> {
    aqw::config::load(app)
        .map(Arc::new)
        .map_err(|e| Failure::usage(format!("{e:#}")))
}

/// The storage account of `connection`.
pub(super) fn connect(connection: &StorageAccount) -> Result<Arc<dyn Storage>, Failure> {
    aqw::app::connect(connection).map_err(|e| Failure::usage(e.to_string()))
}

/// The function named `function` (a usage error when it is unknown).
pub(super) fn function_named<'a>(
    app: &'a AppConfig,
    function: &str,
) -> Result<&'a FunctionConfig, Failure> {
    app.function(function)
        .ok_or_else(|| Failure::usage(format!("no function named {function}")))
}

/// The storage account of `function` (a usage error when it is unknown).
pub(super) fn function_storage(
    app: &AppConfig,
    function: &str,
) -> Result<Arc<dyn Storage>, Failure> {
    connect(&function_named(app, function)?.connection)
}

/// The operator's view of `queue`, on the account of the function that
/// consumes it (a usage error naming the known queues when none does).
pub(super) fn queue_ops(app: &Arc<AppConfig>, queue: &str) -> Result<QueueOps, Failure> {
    let connection = app
        .function_for_queue(queue)
        .map(|f| &f.connection)
        .ok_or_else(|| {
            let known: Vec<&str> = app.functions.iter().map(|f| f.queue.as_str()).collect();
            Failure::usage(format!(
                "queue \"{queue}\" is not consumed by any function of this app (known: {})",
                known.join(", ")
            ))
        })?;
    let storage = connect(connection)?;
    Ok(QueueOps::new(app.clone(), queue, storage.as_ref()))
}

/// A `--since` / `--until` time (RFC 3339).
pub(super) fn parse_time(s: &str) -> Result<time::OffsetDateTime, Failure> {
    ops::parse_time(s).map_err(|e| Failure::usage(e.to_string()))
}

/// An `--error` pattern (a regular expression).
pub(super) fn parse_error_regex(error: Option<&str>) -> Result<Option<regex::Regex>, Failure> {
    error
        .map(regex::Regex::new)
        .transpose()
        .map_err(|e| Failure::usage(format!("--error: {e}")))
}

/// `--wait`: a timespan of at most a day (a replayed key is done within its
/// retries, far sooner).
pub(super) fn parse_wait(wait: Option<&str>) -> Result<Option<Duration>, Failure> {
    let Some(w) = wait else { return Ok(None) };
    let d =
        aqw_core::config::parse_timespan(w).map_err(|e| Failure::usage(format!("--wait: {e}")))?;
    if d > Duration::from_secs(24 * 3600) {
        return Err(Failure::usage("--wait must be at most 1.00:00:00 (a day)"));
    }
    Ok(Some(d))
}

/// The payload of `enqueue` and `poison fix`: exactly one of `--payload`,
/// `--file` or `-` (stdin).
pub(super) fn read_payload(
    payload: Option<String>,
    file: Option<PathBuf>,
    stdin: Option<&str>,
) -> Result<String, Failure> {
    match (payload, file, stdin) {
        (Some(p), None, None) => Ok(p),
        (None, Some(f), None) => {
            std::fs::read_to_string(&f).map_err(|e| Failure::usage(format!("{}: {e}", f.display())))
        }
        (None, None, Some("-")) => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .map_err(|e| Failure::usage(format!("stdin: {e}")))?;
            Ok(s)
        }
        _ => Err(Failure::usage(
            "give exactly one of --payload TEXT, --file PATH or -",
        )),
    }
}

/// `--older-than` and `--dry-run` of both purges (`keys purge`, `poison purge`).
pub(super) fn purge_options(
    older_than: Option<&str>,
    dry_run: bool,
) -> Result<PurgeOptions, Failure> {
    let older_than = older_than
        .map(|s| {
            aqw_core::config::parse_timespan(s)
                .map_err(|e| Failure::usage(format!("--older-than: {e}")))
        })
        .transpose()?;
    Ok(PurgeOptions {
        older_than,
        dry_run,
    })
}
