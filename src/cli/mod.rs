//! The command line over the library: [`args`] (clap's types), [`commands`]
//! (dispatch to `aqw::ops` and friends), [`render`] (text and JSON output),
//! `purge` (the two purge commands) and [`exit`] (the exit codes, decided once).

pub mod args;
mod commands;
pub mod exit;
mod purge;
mod render;

pub use args::Cli;
pub use exit::{Exit, Failure};

/// Run one parsed command line.
pub async fn run(cli: Cli) -> Result<Exit, Failure> {
    commands::dispatch(cli).await
}
