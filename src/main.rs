//! `aqw` — thin CLI over the library. Exit codes: 0 success; 1 something
//! needs a person; 2 usage or configuration error (nothing touched); 3
//! storage or runtime error.

mod cli;

use aqw::{telemetry, traces};
use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    aqw_azure::quiet_library_backtraces();
    let args = cli::Cli::try_parse().unwrap_or_else(|e| cli::parse_error(e));
    // Exporters come from the process environment (OTEL_*,
    // APPLICATIONINSIGHTS_CONNECTION_STRING); the guard flushes them at exit.
    let traces = match traces::export::targets_from_env(|k| std::env::var(k).ok())
        .and_then(|t| traces::export::install(&t))
        .and_then(|guard| {
            traces::export::storage_spans_from_env(|k| std::env::var(k).ok())
                .map(aqw_core::traces::set_storage_spans)
                .map(|()| guard)
        }) {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("aqw: {}", aqw_core::scrub::scrub(&e));
            return cli::Exit::Usage.into();
        }
    };
    telemetry::init_logging(args.log_format, traces.provider());
    let exit = match cli::runtime(&args).and_then(|rt| rt.block_on(cli::run(args))) {
        Ok(exit) => exit,
        Err(f) => {
            eprintln!("aqw: {}", aqw_core::scrub::scrub(&f.message));
            f.exit
        }
    };
    drop(traces);
    ExitCode::from(exit)
}
