//! `aqw` — thin CLI over the library. Exit codes: 0 success; 1 something
//! needs a person; 2 usage or configuration error (nothing touched); 3
//! storage or runtime error.

mod cli;

use aqw::telemetry;
use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    telemetry::init_logging(args.log_format);
    let exit = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => match runtime.block_on(cli::run(args)) {
            Ok(exit) => exit,
            Err(f) => {
                eprintln!("aqw: {}", telemetry::scrub(&f.message));
                f.exit
            }
        },
        Err(e) => {
            eprintln!("aqw: cannot start the async runtime: {e}");
            cli::Exit::Runtime
        }
    };
    ExitCode::from(exit)
}
