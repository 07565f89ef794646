//! `aqw keys …`: idempotency records: list, check (the provider's lookup),
//! new-provider-key, show, purge. One file a subcommand, each holding its
//! arguments beside its command and its output; this file is their enum and
//! the dispatch.

mod check;
mod list;
mod new_provider_key;
mod purge;
mod show;

use crate::cli::exit::{Exit, Failure};
use crate::cli::output::Output;
use clap::Subcommand;
use std::path::Path;

/// `aqw keys`: one line a subcommand; its help and examples are on its
/// `Args` struct, in its file.
#[derive(Subcommand)]
pub enum KeysCmd {
    List(list::ListArgs),
    Check(check::CheckArgs),
    NewProviderKey(new_provider_key::NewProviderKeyArgs),
    Show(show::ShowArgs),
    Purge(purge::PurgeArgs),
}

pub(super) async fn run(app_dir: &Path, cmd: KeysCmd, output: Output) -> Result<Exit, Failure> {
    match cmd {
        KeysCmd::List(a) => list::run(app_dir, a, output).await,
        KeysCmd::Check(a) => check::run(app_dir, a, output).await,
        KeysCmd::NewProviderKey(a) => new_provider_key::run(app_dir, a, output).await,
        KeysCmd::Show(a) => show::run(app_dir, a, output).await,
        KeysCmd::Purge(a) => purge::run(app_dir, a, output).await,
    }
}
