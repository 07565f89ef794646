//! `aqw config show`: the effective configuration, resolved, secrets
//! masked, each setting's source.

use crate::cli::exit::{Exit, Failure};
use crate::cli::load::load;
use crate::cli::output::{print_json, Output};
use aqw::config::show::Setting;
use clap::Subcommand;
use std::path::Path;

#[derive(Subcommand)]
pub enum ConfigCmd {
    /// Print the effective configuration: functions, queues, handlers, keys,
    /// cap, retry, ports, exporters; secrets masked; where each came from.
    #[command(
        after_help = "Examples:\n  aqw config show --app ./app\n  aqw config show --output json"
    )]
    Show,
}

pub(super) fn run(app_dir: &Path, cmd: ConfigCmd, output: Output) -> Result<Exit, Failure> {
    match cmd {
        ConfigCmd::Show => show(app_dir, output),
    }
}

/// `config show`: the effective configuration, secrets masked.
fn show(app_dir: &Path, output: Output) -> Result<Exit, Failure> {
    let app = load(app_dir)?;
    let look = aqw::config::show::lookup(app_dir).map_err(|e| Failure::usage(format!("{e:#}")))?;
    print_settings(&aqw::config::show::effective(&app, &look), output);
    Ok(Exit::Ok)
}

/// `config show`: one row per setting, with its source.
fn print_settings(settings: &[Setting], output: Output) {
    if output == Output::Json {
        print_json(&settings);
        return;
    }
    let w = settings.iter().map(|s| s.name.len()).max().unwrap_or(0);
    for s in settings {
        outln!("{:<w$}  {}  ({})", s.name, s.value, s.source.as_str());
    }
}
