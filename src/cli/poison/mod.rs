//! `aqw poison …`: inspect, replay, fix and discard poisoned messages. One
//! file a subcommand, each holding its arguments beside its command and
//! its output; this file is their enum and the dispatch.

mod discard;
mod fix;
mod list;
mod purge;
mod replay;
mod report;
mod show;

use crate::cli::exit::{Exit, Failure};
use crate::cli::load::load;
use crate::cli::output::Output;
use clap::Subcommand;
use std::path::Path;

/// `aqw poison`: one line a subcommand; its help and examples are on its
/// `Args` struct, in its file.
#[derive(Subcommand)]
pub enum PoisonCmd {
    List(list::ListArgs),
    Show(show::ShowArgs),
    Report(report::ReportArgs),
    Replay(replay::ReplayArgs),
    Fix(fix::FixArgs),
    Discard(discard::DiscardArgs),
    Purge(purge::PurgeArgs),
}

pub(super) async fn run(app_dir: &Path, cmd: PoisonCmd, output: Output) -> Result<Exit, Failure> {
    let app = load(app_dir)?;
    match cmd {
        PoisonCmd::List(a) => list::run(&app, a, output).await,
        PoisonCmd::Show(a) => show::run(&app, a, output).await,
        PoisonCmd::Report(a) => report::run(&app, a, output).await,
        PoisonCmd::Replay(a) => replay::run(&app, a, output).await,
        PoisonCmd::Fix(a) => fix::run(&app, a, output).await,
        PoisonCmd::Discard(a) => discard::run(&app, a, output).await,
        PoisonCmd::Purge(a) => purge::run(&app, a, output).await,
    }
}
