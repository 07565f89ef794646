//! `aqw pause` and `aqw resume`: a function's control row, which every
//! worker and `aqw serve` watches.

use crate::cli::exit::{Exit, Failure};
use crate::cli::load::{function_storage, load};
use crate::cli::output::{print_json, Output};
use aqw_core::ops;
use clap::Args;
use std::path::Path;

/// Stop a function receiving (every worker and `aqw serve`, within seconds); in-flight jobs finish.
#[derive(Args)]
#[command(
    after_help = "Examples:\n  aqw pause GrantCredits --reason 'ledger maintenance until 14:00'\n  aqw pause GrantCredits --by alice"
)]
pub struct PauseArgs {
    /// The function to pause.
    pub function: String,
    /// Why, shown by `aqw status` and the dashboard.
    #[arg(long, default_value = "")]
    pub reason: String,
    /// Who is doing it, kept on the control row (default: $USER; needed).
    #[arg(long, env = "USER")]
    pub by: String,
}

/// Let a paused function receive again.
#[derive(Args)]
#[command(after_help = "Example:\n  aqw resume GrantCredits")]
pub struct ResumeArgs {
    /// The function to resume.
    pub function: String,
    /// Who is doing it, kept on the control row (default: $USER; needed).
    #[arg(long, env = "USER")]
    pub by: String,
}

pub(super) async fn pause(app_dir: &Path, a: PauseArgs, output: Output) -> Result<Exit, Failure> {
    let app = load(app_dir)?;
    let storage = function_storage(&app, &a.function)?;
    let store = ops::control_store(&app, &a.function, storage.as_ref())?;
    let row = ops::pause(&store, &a.function, &a.by, &a.reason).await?;
    print_control(&a.function, &row, output);
    Ok(Exit::Ok)
}

pub(super) async fn resume(app_dir: &Path, a: ResumeArgs, output: Output) -> Result<Exit, Failure> {
    let app = load(app_dir)?;
    let storage = function_storage(&app, &a.function)?;
    let store = ops::control_store(&app, &a.function, storage.as_ref())?;
    let row = ops::resume(&store, &a.function, &a.by).await?;
    print_control(&a.function, &row, output);
    Ok(Exit::Ok)
}

/// `pause` / `resume`: the function's control row as it now reads.
fn print_control(function: &str, row: &aqw_core::control::Control, output: Output) {
    if output == Output::Json {
        print_json(&serde_json::json!({"function": function, "control": row}));
        return;
    }
    match &row.pause {
        Some(p) => outln!(
            "{function} paused by {} at {}; workers stop receiving within {}s (in-flight jobs finish)",
            p.by,
            p.at,
            aqw_core::control::WATCH_INTERVAL.as_secs()
        ),
        None => outln!(
            "{function} resumed; workers receive again within {}s",
            aqw_core::control::WATCH_INTERVAL.as_secs()
        ),
    }
}
