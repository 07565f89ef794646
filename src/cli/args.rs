//! The command line: clap's derive types. Every argument, value and
//! subcommand carries its one-line help; every leaf command ends with an
//! example (a test below walks the tree).

use aqw::telemetry::LogFormat;
use clap::{Args, Parser, Subcommand};
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
    /// Run the standalone worker: poll every function's queue until SIGTERM/SIGINT.
    #[command(
        after_help = "Examples:\n  AzureWebJobsStorage=UseDevelopmentStorage=true aqw run --app ./app\n  aqw run --app /app --log-format json"
    )]
    Run,
    /// Azure Functions custom handler: serve invocations on FUNCTIONS_CUSTOMHANDLER_PORT.
    #[command(
        after_help = "The Functions host starts it (host.json customHandler → aqw serve).\n\nExample, by hand:\n  FUNCTIONS_CUSTOMHANDLER_PORT=7071 aqw serve --app examples/functions-app"
    )]
    Serve,
    /// Put a job on a queue, encoded per the app's messageEncoding.
    #[command(
        after_help = "Examples:\n  aqw enqueue receipts --payload '{\"orderId\":\"o-1\"}'\n  jq -c . order.json | aqw enqueue receipts -\n  aqw enqueue receipts --file order.json --delay 00:30:00\n  aqw enqueue receipts --file order.json --at 2026-12-24T18:00:00Z --ttl never"
    )]
    Enqueue(EnqueueArgs),
    /// Depth and poison count per queue; exit 1 while any poison record is
    /// open, a function is paused, or a breaker is not closed.
    #[command(
        after_help = "Exit codes: 0 nothing needs a person; 1 a poison record is open, a function is paused, or a breaker is open or half-open (its own or the fleet's); 2 bad arguments or configuration; 3 storage error.\n\nExamples:\n  aqw status\n  aqw status --output json"
    )]
    Status,
    /// The open poison records grouped by cause, most urgent first, with what
    /// aqw knows, what it means and the exact next commands; exit 1 while any is open.
    #[command(
        after_help = "Exit codes: 0 nothing open; 1 records are open (the plan is printed); 2 bad arguments or configuration; 3 storage error.\n\nAsks the function's handler.lookup about each attempt that may have taken effect, and about a refusal of a provider that saves failures.\n\nExamples:\n  aqw triage payouts\n  aqw triage payouts --output json"
    )]
    Triage(super::triage::TriageArgs),
    /// Print the on-call runbook embedded in this binary, whole or one incident kind's page.
    #[command(
        after_help = "Exit codes: 0 printed; 2 an unknown kind (the kinds are listed).\n\nExamples:\n  aqw oncall\n  aqw oncall outage"
    )]
    Oncall(super::oncall::OncallArgs),
    /// Stop a function receiving (every worker and `aqw serve`, within seconds); in-flight jobs finish.
    #[command(
        after_help = "Examples:\n  aqw pause GrantCredits --reason 'ledger maintenance until 14:00'\n  aqw pause GrantCredits --by alice"
    )]
    Pause(PauseArgs),
    /// Let a paused function receive again.
    #[command(after_help = "Example:\n  aqw resume GrantCredits")]
    Resume(ResumeArgs),
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
    /// Serve the poison dashboard (status, records, replay/discard/fix) in a browser.
    #[command(
        after_help = "Actions need AQW_DASHBOARD_TOKEN (sign in with it, or send it as a bearer token), or\nAQW_DASHBOARD_TRUST_PRINCIPAL=1 behind App Service / Container Apps authentication;\nAQW_DASHBOARD_USER names the token's holder on the records (default: dashboard).\nWithout either, only --read-only starts.\n\nExamples:\n  AQW_DASHBOARD_TOKEN=$(openssl rand -hex 24) aqw dashboard --app ./app\n  aqw dashboard --read-only --listen 127.0.0.1:9000"
    )]
    Dashboard(DashboardArgs),
    /// The effective configuration, resolved, secrets masked, each setting's source.
    #[command(subcommand)]
    Config(ConfigCmd),
    /// Print shell completions.
    #[command(after_help = "Example:\n  aqw completions bash > /etc/bash_completion.d/aqw")]
    Completions {
        /// The shell to print completions for.
        shell: clap_complete::Shell,
    },
}

#[derive(Args)]
pub struct EnqueueArgs {
    /// Target queue (a configured function's queue).
    pub queue: String,
    /// The payload as text (JSON for keyed functions).
    #[arg(long, conflicts_with = "file")]
    pub payload: Option<String>,
    /// Read the payload from a file.
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// `-` reads the payload from standard input.
    #[arg(value_name = "-")]
    pub stdin: Option<String>,
    /// Enqueue even if the worker would poison it at once (no key derivable).
    #[arg(long)]
    pub force: bool,
    /// Deliver after this long ([d.]hh:mm:ss, under 7 days and shorter than --ttl).
    #[arg(long, value_name = "DURATION", conflicts_with = "at")]
    pub delay: Option<String>,
    /// Deliver at this time (RFC 3339, within 7 days).
    #[arg(long, value_name = "TIME")]
    pub at: Option<String>,
    /// The message's time-to-live from the put ([d.]hh:mm:ss, 1 s to 7
    /// days, or `never`); default: 7 days.
    #[arg(long, value_name = "DURATION|never")]
    pub ttl: Option<String>,
}

#[derive(Args)]
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

#[derive(Args)]
pub struct ResumeArgs {
    /// The function to resume.
    pub function: String,
    /// Who is doing it, kept on the control row (default: $USER; needed).
    #[arg(long, env = "USER")]
    pub by: String,
}

#[derive(Args)]
pub struct DashboardArgs {
    /// Address to listen on; anything but loopback exposes it (put TLS in front).
    #[arg(long, default_value = "127.0.0.1:8088", env = "AQW_DASHBOARD_LISTEN")]
    pub listen: std::net::SocketAddr,
    /// Views only: no replay, discard or fix (and no authentication needed).
    #[arg(long)]
    pub read_only: bool,
    /// Accept trusted-proxy ranges wider than /8 or /32 (AQW_DASHBOARD_ALLOW_WIDE_TRUSTED_PROXIES=1).
    #[arg(long)]
    pub allow_wide_trusted_proxies: bool,
    #[command(flatten)]
    pub limits: aqw::dashboard::ConnectionLimits,
}

#[derive(Subcommand)]
pub enum ConfigCmd {
    /// Print the effective configuration: functions, queues, handlers, keys,
    /// cap, retry, ports, exporters; secrets masked; where each came from.
    #[command(
        after_help = "Examples:\n  aqw config show --app ./app\n  aqw config show --output json"
    )]
    Show,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Walks clap's command tree: every argument, value and subcommand has a
    /// one-line help, and every leaf command ends with an example.
    #[test]
    fn help_teaches_every_argument_and_command() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for a in cmd.get_arguments() {
                let id = a.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                if a.get_help().is_none() {
                    missing.push(format!("{path} --{id}: no help"));
                }
                // Flags' true/false and clap_complete's shell names need none.
                let own_values = a.get_action().takes_values() && id != "shell";
                for v in a.get_possible_values().into_iter().filter(|_| own_values) {
                    if v.get_help().is_none() {
                        missing.push(format!("{path} --{id} {}: no help", v.get_name()));
                    }
                }
            }
            for sc in cmd.get_subcommands() {
                let name = format!("{path} {}", sc.get_name());
                if sc.get_about().is_none() {
                    missing.push(format!("{name}: no about"));
                }
                let is_leaf = sc.get_subcommands().next().is_none();
                let has_example = sc
                    .get_after_help()
                    .is_some_and(|h| h.to_string().contains("Example"));
                if is_leaf && !has_example {
                    missing.push(format!("{name}: no example"));
                }
                walk(sc, &name, missing);
            }
        }
        let cmd = Cli::command();
        cmd.clone().debug_assert();
        let mut missing = Vec::new();
        walk(&cmd, "aqw", &mut missing);
        assert!(missing.is_empty(), "{missing:#?}");
        let top = cmd.get_after_help().unwrap().to_string();
        for code in ["0 ", "1 ", "2 ", "3 "] {
            assert!(
                top.contains(&format!("  {code}")),
                "exit code {code} in: {top}"
            );
        }
    }

    /// Every example line of every command's help, as clap parses it: a
    /// help example that no longer parses is a broken procedure.
    #[test]
    fn every_help_example_parses() {
        fn examples(cmd: &clap::Command, out: &mut Vec<String>) {
            if let Some(h) = cmd.get_after_help() {
                let h = h.to_string();
                let from = h.find("Example").map_or(h.len(), |i| i);
                out.extend(
                    h[from..]
                        .lines()
                        .filter(|l| l.starts_with("  "))
                        .map(str::to_string),
                );
            }
            cmd.get_subcommands().for_each(|sc| examples(sc, out));
        }
        // The examples rely on --by defaulting to $USER, as in a login shell.
        if std::env::var_os("USER").is_none() {
            std::env::set_var("USER", "operator");
        }
        let mut lines = Vec::new();
        examples(&Cli::command(), &mut lines);
        let mut parsed = 0;
        for line in &lines {
            for argv in aqw_invocations(line) {
                if let Err(e) = Cli::try_parse_from(&argv) {
                    panic!("help example does not parse: {line}\n{argv:?}\n{e}");
                }
                parsed += 1;
            }
        }
        let leaves = 16;
        assert!(
            parsed >= leaves,
            "only {parsed} aqw invocations in {lines:#?}"
        );
    }

    /// Issue 39: the procedure the alert links (docs/oncall.md) can be
    /// followed as written: every `aqw` command it shows, in a code block
    /// or inline, parses, its placeholders (QUEUE, ID, KEY, …) filled in
    /// and `[optional]` flags given.
    #[test]
    fn every_command_in_the_oncall_guide_parses() {
        let doc = include_str!("../../docs/oncall.md");
        let (mut lines, mut prose, mut in_block) = (Vec::new(), String::new(), false);
        for line in doc.lines() {
            if line.trim_start().starts_with("```") {
                in_block = !in_block;
            } else if in_block {
                lines.push(line.trim().to_string());
            } else {
                prose.push_str(line.trim());
                prose.push(' ');
            }
        }
        lines.extend(prose.split('`').skip(1).step_by(2).map(str::to_string));
        if std::env::var_os("USER").is_none() {
            std::env::set_var("USER", "operator");
        }
        let fill = |w: &str| match w.trim_start_matches('[').trim_end_matches(']') {
            "QUEUE" => "receipts".to_string(),
            "FUNCTION" => "SendReceipt".into(),
            "KEY" => "receipt:o-1".into(),
            "T" => "06:00:00".into(),
            other => other.to_string(),
        };
        // Prose names a command (`aqw poison list` prints …): its path
        // must exist; anything with arguments must parse.
        let names_a_command = |argv: &[String]| {
            let mut cmd = Cli::command();
            argv[1..].iter().all(|w| match cmd.find_subcommand(w) {
                Some(sub) => {
                    cmd = sub.clone();
                    true
                }
                None => false,
            })
        };
        let mut parsed = 0;
        for line in &lines {
            for argv in aqw_invocations(line) {
                if argv.len() > 1 && names_a_command(&argv) {
                    continue;
                }
                let argv: Vec<String> = argv.iter().map(|w| fill(w)).collect();
                if let Err(e) = Cli::try_parse_from(&argv) {
                    panic!("docs/oncall.md: a command does not parse: {line}\n{argv:?}\n{e}");
                }
                parsed += 1;
            }
        }
        assert!(parsed >= 30, "only {parsed} aqw commands in docs/oncall.md");
    }

    /// The `aqw` commands of one shell line: words split as a POSIX shell
    /// would for these examples (quotes, `$(…)` as one word, pipes,
    /// redirections, leading `NAME=value` assignments dropped).
    fn aqw_invocations(line: &str) -> Vec<Vec<String>> {
        let (mut words, mut word, mut quote, mut depth) = (vec![], String::new(), None, 0);
        let mut chars = line.trim().chars().peekable();
        while let Some(c) = chars.next() {
            match (quote, c) {
                (Some(q), c) if c == q => quote = None,
                (Some('"'), '\\') => word.extend(chars.next()),
                (Some(_), c) => word.push(c),
                (None, '\'' | '"') => quote = Some(c),
                (None, '$') if chars.peek() == Some(&'(') => {
                    depth += 1;
                    word.push(c);
                }
                (None, ')') if depth > 0 => {
                    depth -= 1;
                    word.push(c);
                }
                (None, ' ') if depth == 0 => {
                    words.extend((!word.is_empty()).then(|| std::mem::take(&mut word)))
                }
                (None, c) => word.push(c),
            }
        }
        words.extend((!word.is_empty()).then_some(word));
        let mut out = Vec::new();
        for segment in words.split(|w| w == "|") {
            let mut argv: Vec<String> = Vec::new();
            let mut it = segment
                .iter()
                .skip_while(|w| w.contains('=') && !w.starts_with('-'));
            while let Some(w) = it.next() {
                if w == ">" {
                    it.next();
                } else {
                    argv.push(w.clone());
                }
            }
            if argv.first().is_some_and(|w| w == "aqw") {
                out.push(argv);
            }
        }
        out
    }

    #[test]
    fn by_behaves_the_same_on_replay_and_discard() {
        let by_of = |sub: &str| {
            let cmd = Cli::command();
            let poison = cmd.find_subcommand("poison").unwrap();
            let arg = poison
                .find_subcommand(sub)
                .unwrap()
                .get_arguments()
                .find(|a| a.get_id() == "by")
                .unwrap()
                .clone();
            (
                arg.get_env().map(|e| e.to_os_string()),
                arg.get_default_values().to_vec(),
            )
        };
        assert_eq!(by_of("replay"), by_of("discard"));
    }
}
