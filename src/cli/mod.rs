//! The command line over the library, one module per noun of the command
//! tree, each holding its subcommands' clap arguments beside their commands
//! and their output: [`poison`], [`keys`], [`ops`] (durable group
//! operations), [`config`], [`control`] (`pause`, `resume`), [`status`],
//! [`enqueue`], [`triage`], [`oncall`] (the embedded runbook) and
//! [`service`] (`run`, `serve`, `dashboard`). Beneath them, imported by
//! them and importing none of them: [`load`] (the one load-and-connect, and
//! the option parsers several commands share), [`output`] (`outln!`,
//! `--output`, the views two nouns share) and [`exit`] (the exit codes,
//! decided once). [`args`] is the root command and the noun enum; this file
//! turns a refused command line into its exit, builds the runtime and
//! dispatches.
//!
//! A new subcommand of a noun is a file in the noun's folder and a line in
//! its enum; a new noun is its module, a line in [`args::Command`] and one
//! in `dispatch`.

/// Exit on a command line clap refused, as clap does (exit 2, or 0 for
/// `--help`), naming `$USER` when it is the missing `--by`'s default.
pub fn parse_error(e: clap::Error) -> ! {
    let missing_by = e.kind() == clap::error::ErrorKind::MissingRequiredArgument
        && e.to_string().contains("--by")
        && std::env::var_os("USER").is_none();
    if missing_by {
        let _ = e.print();
        eprintln!(
            "aqw: who is doing it is kept on the record: give --by NAME, or set $USER (it is not set here)"
        );
        std::process::exit(2);
    }
    e.exit()
}

#[macro_use]
mod output;
mod args;
mod config;
mod control;
mod enqueue;
mod exit;
#[cfg(test)]
mod help_tests;
mod keys;
mod load;
mod oncall;
mod ops;
mod poison;
mod service;
mod status;
mod triage;

pub use args::Cli;
use args::Command;
use clap::CommandFactory;
pub use exit::{Exit, Failure};

/// The async runtime a command runs on.
///
/// `run` and `serve` get one worker thread unless `TOKIO_WORKER_THREADS`
/// (tokio's own setting) says otherwise. Their jobs wait on the network;
/// with a worker per core, tokio's idle worker wakes and searches for
/// work each time one job's response lands, and on this 2-core machine
/// that cost about a tenth of `aqw run`'s CPU per job at the same
/// throughput (bench/profile.md, round five). One thread carries thousands
/// of jobs a second at ~0.3 ms of CPU each; nothing CPU-bound shares it
/// (the dashboard is its own command and keeps a thread per core).
pub fn runtime(cli: &Cli) -> Result<tokio::runtime::Runtime, Failure> {
    let setting = match std::env::var("TOKIO_WORKER_THREADS") {
        Ok(s) => Some(s),
        Err(std::env::VarError::NotPresent) => None,
        // tokio would read it itself and panic on it.
        Err(std::env::VarError::NotUnicode(_)) => {
            return Err(Failure::usage("TOKIO_WORKER_THREADS is not valid UTF-8"))
        }
    };
    let threads = worker_threads(&cli.command, setting.as_deref()).map_err(Failure::usage)?;
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Some(n) = threads {
        builder.worker_threads(n);
    }
    builder
        .build()
        .map_err(|e| Failure::runtime(format!("cannot start the async runtime: {e}")))
}

/// The most worker threads a command may ask for: far more than a machine
/// has cores, and far below what makes tokio's own arithmetic overflow.
const MAX_WORKER_THREADS: usize = 1024;

/// Worker threads for `command` (`None`: tokio's default, one per core).
/// A setting tokio would panic on is a usage error here.
fn worker_threads(command: &Command, setting: Option<&str>) -> Result<Option<usize>, String> {
    use Command as C;
    match (setting, command) {
        (Some(text), _) => match text.trim().parse::<usize>() {
            Ok(n) if (1..=MAX_WORKER_THREADS).contains(&n) => Ok(Some(n)),
            _ => Err(format!(
                "TOKIO_WORKER_THREADS must be a whole number of threads from 1 to {MAX_WORKER_THREADS} (got {:?})",
                aqw_core::scrub::one_line(text)
            )),
        },
        (None, C::Run(_) | C::Serve(_)) => Ok(Some(1)),
        (None, _) => Ok(None),
    }
}

/// Run one parsed command line.
pub async fn run(cli: Cli) -> Result<Exit, Failure> {
    dispatch(cli).await
}

/// Dispatch: each noun's module turns its arguments into a call of the
/// library, renders what it returns, and says which exit code that means.
async fn dispatch(cli: Cli) -> Result<Exit, Failure> {
    let output = cli.output;
    match cli.command {
        Command::Run(a) => service::run(&cli.app, a).await,
        Command::Serve(a) => service::serve(&cli.app, a).await,
        Command::Dashboard(a) => service::dashboard(&cli.app, a).await,
        Command::Enqueue(a) => enqueue::run(&cli.app, a, output).await,
        Command::Status(a) => status::run(&cli.app, a, output).await,
        Command::Triage(a) => triage::run(&cli.app, a, output).await,
        Command::Oncall(a) => oncall::run(a, output),
        Command::Poison(cmd) => poison::run(&cli.app, cmd, output).await,
        Command::Pause(a) => control::pause(&cli.app, a, output).await,
        Command::Resume(a) => control::resume(&cli.app, a, output).await,
        Command::Ops(cmd) => ops::run(&cli.app, cmd, output).await,
        Command::Completions { shell } => {
            // Into a buffer, then out as one line: a closed pipe exits
            // quietly (clap_complete panics on a write error).
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "aqw", &mut script);
            outln!("{}", String::from_utf8_lossy(&script).trim_end());
            Ok(Exit::Ok)
        }
        Command::Config(cmd) => config::run(&cli.app, cmd, output),
        Command::Keys(cmd) => keys::run(&cli.app, cmd, output).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn threads(line: &[&str], setting: Option<&str>) -> Result<Option<usize>, String> {
        worker_threads(&Cli::parse_from(line).command, setting)
    }

    #[test]
    fn the_job_loops_get_one_worker_thread_unless_tokio_worker_threads_is_set() {
        assert_eq!(threads(&["aqw", "run"], None), Ok(Some(1)));
        assert_eq!(threads(&["aqw", "serve"], None), Ok(Some(1)));
        assert_eq!(threads(&["aqw", "run"], Some("4")), Ok(Some(4)));
        assert_eq!(threads(&["aqw", "status"], Some(" 2 ")), Ok(Some(2)));
        assert_eq!(
            threads(&["aqw", "dashboard", "--read-only"], None),
            Ok(None)
        );
        assert_eq!(threads(&["aqw", "status"], None), Ok(None));
    }

    #[test]
    fn a_worker_thread_count_tokio_would_panic_on_is_a_usage_error() {
        for bad in ["0", "", "two", "-1"] {
            let e = threads(&["aqw", "run"], Some(bad)).unwrap_err();
            assert!(e.contains("TOKIO_WORKER_THREADS"), "{e}");
        }
    }
}
