//! The root command and the noun enum: one line a noun. A noun with
//! subcommands keeps its one-line about here (clap reads a group's about
//! from this enum); each subcommand's arguments, help and examples are on
//! its `Args` struct beside its command in the noun's module. `completions`
//! stays here: it prints this whole tree. Every argument, value and
//! subcommand carries its one-line help; every leaf command ends with an
//! example (`help_tests.rs` walks the tree).

use aqw::telemetry::LogFormat;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

use super::output::Output;

const EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  the command worked and found something that needs a person
     (open poison records, a replayed key not done in time)
  2  usage or configuration error; nothing was touched
  3  storage or runtime error

Settings come from the environment, then local.settings.json Values in the
app folder (the environment wins). NO_COLOR turns colour off.

On call? `aqw triage QUEUE`: the open records grouped by cause with the next
commands; `aqw oncall [KIND]`: this version's runbook, one screen per kind.";

#[derive(Parser)]
#[command(
    name = "aqw",
    version,
    about = "Azure Queue Storage worker that makes background jobs safe to retry",
    after_help = EXIT_CODES
)]
pub struct Cli {
    /// App folder holding host.json (and <Function>/function.json).
    #[arg(long, global = true, default_value = ".", env = "AQW_APP")]
    pub app: PathBuf,
    /// Output format of records and reports.
    #[arg(long, global = true, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// Log format (stderr).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "AQW_LOG_FORMAT")]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    Run(super::service::RunArgs),
    Serve(super::service::ServeArgs),
    Enqueue(super::enqueue::EnqueueArgs),
    Status(super::status::StatusArgs),
    Triage(super::triage::TriageArgs),
    Oncall(super::oncall::OncallArgs),
    Pause(super::control::PauseArgs),
    Resume(super::control::ResumeArgs),
    /// Inspect, replay and discard poisoned messages.
    #[command(subcommand)]
    Poison(super::poison::PoisonCmd),
    /// Idempotency records.
    #[command(subcommand)]
    Keys(super::keys::KeysCmd),
    /// Durable group operations: replay or discard a selection at a rate,
    /// surviving the process that started it; list, show, cancel, resume.
    #[command(subcommand)]
    Ops(super::ops::OpsCmd),
    Dashboard(super::service::DashboardArgs),
    /// The effective configuration, resolved, secrets masked, each setting's source.
    #[command(subcommand)]
    Config(super::config::ConfigCmd),
    /// Print shell completions.
    #[command(after_help = "Example:\n  aqw completions bash > /etc/bash_completion.d/aqw")]
    Completions {
        /// The shell to print completions for.
        shell: clap_complete::Shell,
    },
}
