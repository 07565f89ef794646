//! `aqw` — thin CLI over the library. Exit codes: 0 success; 1 something
//! needs a person; 2 usage or configuration error (nothing touched); 3
//! storage or runtime error.

use aqw::config::{self, AppConfig, MessageEncoding};
use aqw::ops::{self, Filter, OpsError, QueueOps, ReplayOptions};
use aqw::poison::RecordStatus;
use aqw::telemetry::{self, LogFormat};
use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};
use std::io::{IsTerminal, Read};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  the command worked and found something that needs a person
     (open poison records, a replayed key not done in time)
  2  usage or configuration error; nothing was touched
  3  storage or runtime error

Settings come from the environment, then local.settings.json Values in the
app folder (the environment wins). NO_COLOR turns colour off.";

#[derive(Parser)]
#[command(
    name = "aqw",
    version,
    about = "Azure Queue Storage worker that makes background jobs safe to retry",
    after_help = EXIT_CODES
)]
struct Cli {
    /// App folder holding host.json (and <Function>/function.json).
    #[arg(long, global = true, default_value = ".", env = "AQW_APP")]
    app: PathBuf,
    /// Output format of records and reports.
    #[arg(long, global = true, value_enum, default_value_t = Output::Text)]
    output: Output,
    /// Log format (stderr).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "AQW_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    /// Tables and lines for a person.
    Text,
    /// Complete JSON for a program.
    Json,
}

#[derive(Subcommand)]
enum Command {
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
        after_help = "Examples:\n  aqw enqueue receipts --payload '{\"orderId\":\"o-1\"}'\n  jq -c . order.json | aqw enqueue receipts -"
    )]
    Enqueue(EnqueueArgs),
    /// Depth and poison count per queue; exit 1 while any poison record is open.
    #[command(after_help = "Examples:\n  aqw status\n  aqw status --output json")]
    Status,
    /// Inspect, replay and discard poisoned messages.
    #[command(subcommand)]
    Poison(PoisonCmd),
    /// Idempotency records.
    #[command(subcommand)]
    Keys(KeysCmd),
    /// Print shell completions.
    #[command(after_help = "Example:\n  aqw completions bash > /etc/bash_completion.d/aqw")]
    Completions {
        /// The shell to print completions for.
        shell: clap_complete::Shell,
    },
}

#[derive(Args)]
struct EnqueueArgs {
    /// Target queue (a configured function's queue).
    queue: String,
    /// The payload as text (JSON for keyed functions).
    #[arg(long, conflicts_with = "file")]
    payload: Option<String>,
    /// Read the payload from a file.
    #[arg(long)]
    file: Option<PathBuf>,
    /// `-` reads the payload from standard input.
    #[arg(value_name = "-")]
    stdin: Option<String>,
    /// Enqueue even if the worker would poison it at once (no key derivable).
    #[arg(long)]
    force: bool,
}

/// Which records `poison list` shows.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum StatusFilter {
    /// Not yet replayed or discarded: needs a person.
    Open,
    /// Re-put to the source queue.
    Replayed,
    /// Closed without replaying.
    Discarded,
    /// Closed by `poison fix`: a corrected message took its place.
    Replaced,
    /// Every record.
    All,
}

#[derive(Subcommand)]
enum PoisonCmd {
    /// List poison records, newest first; exit 1 while any listed record is open.
    #[command(
        after_help = "Examples:\n  aqw poison list receipts --status open\n  aqw poison list receipts --since 01:00:00 --error 'HTTP 503'"
    )]
    List {
        /// Source queue of the poisoned messages (not the -poison queue).
        queue: String,
        /// Records in this state only.
        #[arg(long, value_enum, default_value_t = StatusFilter::All)]
        status: StatusFilter,
        /// Poisoned at or after: RFC 3339 time or a duration ago (hh:mm:ss).
        #[arg(long)]
        since: Option<String>,
        /// Poisoned before: RFC 3339 time or a duration ago (hh:mm:ss).
        #[arg(long)]
        until: Option<String>,
        /// Records of this function only.
        #[arg(long)]
        function: Option<String>,
        /// Regular expression over the error text.
        #[arg(long)]
        error: Option<String>,
    },
    /// Show one record: error, attempts, key state and decoded payload.
    #[command(
        after_help = "Example:\n  aqw poison show receipts 7d0f3c9e-1b7a-4f1e-9d7a-2a1f0c3e4b5d"
    )]
    Show {
        /// Source queue of the poisoned message.
        queue: String,
        /// The record id: the source message id (as `poison list` shows it).
        id: String,
    },
    /// Re-put poisoned messages to their source queue with their original key.
    #[command(
        after_help = "Examples:\n  aqw poison replay receipts --all --error 'HTTP 503' --dry-run\n  aqw poison replay receipts --id ID --wait 00:02:00"
    )]
    Replay {
        /// Source queue of the poisoned messages.
        queue: String,
        /// A record to replay (repeat for several).
        #[arg(long = "id", required_unless_present = "all")]
        ids: Vec<String>,
        /// Every open record (narrowed by --error, --since, --limit).
        #[arg(long, conflicts_with = "ids")]
        all: bool,
        /// Only records whose error matches this regular expression.
        #[arg(long)]
        error: Option<String>,
        /// Only records poisoned at or after: RFC 3339 time or a duration ago.
        #[arg(long)]
        since: Option<String>,
        /// At most this many records.
        #[arg(long)]
        limit: Option<usize>,
        /// Messages per second.
        #[arg(long)]
        rate: Option<f64>,
        /// Say what would be replayed; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Who is doing it, kept on the record (default: $USER; needed
        /// unless --dry-run).
        #[arg(long, env = "USER", required_unless_present = "dry_run")]
        by: Option<String>,
        /// Wait (hh:mm:ss) until each replayed key is done, and report.
        #[arg(long)]
        wait: Option<String>,
        /// Records replayed at once.
        #[arg(long, default_value_t = aqw::ops::DEFAULT_REPLAY_CONCURRENCY as u64, value_parser = clap::value_parser!(u64).range(1..=64))]
        concurrency: u64,
    },
    /// Put a corrected payload in place of a poisoned one (a bad producer's
    /// message), closing the old record as replaced.
    #[command(
        after_help = "The corrected payload must derive a key; a key already done is reported and nothing is put.\n\nExamples:\n  aqw poison fix credits --id ID --payload '{\"account\":\"a4\",\"credits\":5}' --wait 00:01:00\n  aqw poison show credits ID --output json | jq -c '.payload | .account = .acount | del(.acount)' | aqw poison fix credits --id ID -"
    )]
    Fix {
        /// Source queue of the poisoned message.
        queue: String,
        /// The record to replace.
        #[arg(long)]
        id: String,
        /// The corrected payload as text.
        #[arg(long, conflicts_with = "file")]
        payload: Option<String>,
        /// Read the corrected payload from a file.
        #[arg(long)]
        file: Option<PathBuf>,
        /// `-` reads the corrected payload from standard input.
        #[arg(value_name = "-")]
        stdin: Option<String>,
        /// Who is doing it, kept on the record (default: $USER; needed).
        #[arg(long, env = "USER")]
        by: String,
        /// Wait (hh:mm:ss) until the corrected job's key is done.
        #[arg(long)]
        wait: Option<String>,
    },
    /// Close a record without replaying it.
    #[command(
        after_help = "Example:\n  aqw poison discard credits --id ID --reason 'account closed, must never run'"
    )]
    Discard {
        /// Source queue of the poisoned message.
        queue: String,
        /// The record to close.
        #[arg(long)]
        id: String,
        /// Why it must not run, kept on the record.
        #[arg(long)]
        reason: String,
        /// Who is doing it, kept on the record (default: $USER; needed).
        #[arg(long, env = "USER")]
        by: String,
        /// Also close the job's key (status cancelled): a later delivery of
        /// the same job is settled as a duplicate without running.
        #[arg(long)]
        close_key: bool,
    },
}

#[derive(Subcommand)]
enum KeysCmd {
    /// Show the idempotency record of one key.
    #[command(after_help = "Example:\n  aqw keys show SendReceipt receipt:o-1")]
    Show {
        /// The function the key belongs to.
        function: String,
        /// The full key, as `poison list` or `poison show` prints it.
        key: String,
    },
}

/// A failure with its exit code.
struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    fn usage(m: impl Into<String>) -> Self {
        Failure {
            code: 2,
            message: m.into(),
        }
    }
    fn runtime(m: impl Into<String>) -> Self {
        Failure {
            code: 3,
            message: m.into(),
        }
    }
}

impl From<OpsError> for Failure {
    fn from(e: OpsError) -> Self {
        match e {
            OpsError::Usage(m) => Failure::usage(m),
            OpsError::Storage(e) => Failure::runtime(format!("storage: {e}")),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    telemetry::init_logging(cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("aqw: cannot start the async runtime: {e}");
            return ExitCode::from(3);
        }
    };
    match runtime.block_on(dispatch(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            eprintln!("aqw: {}", telemetry::scrub(&f.message));
            ExitCode::from(f.code)
        }
    }
}

fn load(app: &std::path::Path) -> Result<Arc<AppConfig>, Failure> {
    config::load(app)
        .map(Arc::new)
        .map_err(|e| Failure::usage(format!("{e:#}")))
}

fn queue_ops(app: &Arc<AppConfig>, queue: &str) -> Result<QueueOps, Failure> {
    let connection = app
        .function_for_queue(queue)
        .map(|f| &f.connection)
        .ok_or_else(|| {
            let known: Vec<&str> = app.functions.iter().map(|f| f.queue.as_str()).collect();
            Failure::usage(format!(
                "queue \"{queue}\" is not consumed by any function of this app (known: {})",
                known.join(", ")
            ))
        })?;
    let storage = aqw::storage::connect(connection).map_err(|e| Failure::usage(e.to_string()))?;
    Ok(QueueOps::new(app.clone(), queue, &storage))
}

fn parse_time(s: &str) -> Result<time::OffsetDateTime, Failure> {
    if let Ok(t) = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339) {
        return Ok(t);
    }
    config::parse_timespan(s)
        .map(|d| time::OffsetDateTime::now_utc() - d)
        .map_err(|_| {
            Failure::usage(format!(
                "\"{s}\" is neither an RFC 3339 time nor a duration ago (hh:mm:ss)"
            ))
        })
}

fn print_json(v: &impl serde::Serialize) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

async fn dispatch(cli: Cli) -> Result<u8, Failure> {
    let output = cli.output;
    match cli.command {
        Command::Run => {
            let app = load(&cli.app)?;
            let registry = aqw::Registry::new();
            aqw::worker::preflight(&app, &registry).map_err(Failure::usage)?;
            let shutdown = CancellationToken::new();
            spawn_signal_handler(shutdown.clone());
            aqw::worker::run(app, registry, shutdown)
                .await
                .map_err(|e| Failure::runtime(format!("{e:#}")))?;
            Ok(0)
        }
        Command::Serve => {
            let app = load(&cli.app)?;
            let registry = aqw::Registry::new();
            aqw::worker::preflight(&app, &registry).map_err(Failure::usage)?;
            let port =
                aqw::serve::port_from_env(std::env::var("FUNCTIONS_CUSTOMHANDLER_PORT").ok())
                    .map_err(Failure::usage)?;
            let shutdown = CancellationToken::new();
            spawn_signal_handler(shutdown.clone());
            aqw::serve::serve(app, registry, port, shutdown)
                .await
                .map_err(|e| Failure::runtime(format!("{e:#}")))?;
            Ok(0)
        }
        Command::Enqueue(a) => enqueue(&cli.app, a, output).await,
        Command::Status => {
            let app = load(&cli.app)?;
            let mut lines = Vec::new();
            for f in &app.functions {
                lines.push(ops::status(&queue_ops(&app, &f.queue)?).await?);
            }
            let open: usize = lines.iter().map(|l| l.open_records).sum();
            if output == Output::Json {
                print_json(&serde_json::json!({"queues": lines, "openPoisonRecords": open}));
            } else {
                println!(
                    "{:<20} {:<24} {:>8} {:>8} {:>6}  OLDEST OPEN",
                    "FUNCTION", "QUEUE", "DEPTH", "POISON", "OPEN"
                );
                for l in &lines {
                    println!(
                        "{:<20} {:<24} {:>8} {:>8} {:>6}  {}",
                        l.function,
                        l.queue,
                        l.depth.map(|d| d.to_string()).unwrap_or("-".into()),
                        l.poison_depth.map(|d| d.to_string()).unwrap_or("-".into()),
                        l.open_records,
                        l.oldest_open.as_deref().unwrap_or("-")
                    );
                }
            }
            Ok(if open > 0 { 1 } else { 0 })
        }
        Command::Poison(cmd) => poison(&cli.app, cmd, output).await,
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "aqw", &mut std::io::stdout());
            Ok(0)
        }
        Command::Keys(KeysCmd::Show { function, key }) => {
            let app = load(&cli.app)?;
            let f = app
                .function(&function)
                .ok_or_else(|| Failure::usage(format!("no function named {function}")))?;
            let storage =
                aqw::storage::connect(&f.connection).map_err(|e| Failure::usage(e.to_string()))?;
            let keys = aqw::idempotency::KeyStore::new(aqw::storage::Storage::table(
                &storage,
                &app.keys_table,
            ));
            let k = aqw::idempotency::IdempotencyKey::new(key.clone()).map_err(Failure::usage)?;
            let rec = match keys.get(&function, &k).await {
                Ok(r) => r,
                Err(aqw::storage::StorageError::NotFound) => None,
                Err(e) => return Err(Failure::runtime(format!("storage: {e}"))),
            };
            match rec {
                None => {
                    if output == Output::Json {
                        print_json(
                            &serde_json::json!({"key": key, "function": function, "record": null}),
                        );
                    } else {
                        println!("no record for key {key:?} of {function} (never claimed)");
                    }
                    Ok(0)
                }
                Some(r) => {
                    if output == Output::Json {
                        print_json(&r);
                    } else {
                        println!("key:          {}", r.key);
                        println!("function:     {}", r.function);
                        println!("status:       {}", r.status.as_str());
                        println!("providerKey:  {}", r.provider_key);
                        println!("state:        {}", key_state_line(&r));
                        println!("messageId:    {}", r.message_id.as_deref().unwrap_or("-"));
                        println!("firstSeen:    {}", r.first_seen.as_deref().unwrap_or("-"));
                        println!("completedAt:  {}", r.completed_at.as_deref().unwrap_or("-"));
                        println!("replayCount:  {}", r.replay_count);
                        if let Some(by) = &r.cancelled_by {
                            println!(
                                "cancelled:    {} by {by}: {} (a delivery of this job is a duplicate)",
                                r.cancelled_at.as_deref().unwrap_or("-"),
                                r.cancel_reason.as_deref().unwrap_or("-")
                            );
                        }
                        println!(
                            "lease:        {} until {}",
                            r.lease_owner.as_deref().unwrap_or("-"),
                            r.lease_until.as_deref().unwrap_or("-")
                        );
                        println!("row:          {} / {}", r.partition_key, r.row_key);
                        print_history(&r.history, "              ");
                    }
                    Ok(0)
                }
            }
        }
    }
}

/// One line on a key's state. A done key's earlier errors are history, not
/// a current error, so they are not repeated here.
fn key_state_line(k: &aqw::idempotency::KeyRecord) -> String {
    use aqw::idempotency::KeyStatus;
    let tries = format!("{} attempt(s)", k.attempts);
    match k.status {
        KeyStatus::Done => format!(
            "done at {} after {tries}; provider key {}",
            k.completed_at.as_deref().unwrap_or("-"),
            k.provider_key
        ),
        KeyStatus::Cancelled => format!("cancelled (never runs again) after {tries}"),
        s => format!(
            "{} after {tries}; provider key {}; last error: {}",
            s.as_str(),
            k.provider_key,
            k.last_error.as_deref().unwrap_or("-")
        ),
    }
}

/// The key's attempt history, oldest first, flagging attempts that may have
/// taken effect (their provider key is what keeps a retry from doubling).
fn print_history(history: &[aqw::idempotency::Attempt], indent: &str) {
    if history.is_empty() {
        return;
    }
    println!(
        "attempts:      (last {}, oldest first)",
        aqw::idempotency::HISTORY_LEN
    );
    for a in history {
        let flag = if a.may_have_taken_effect {
            "  [may have taken effect]"
        } else {
            ""
        };
        println!(
            "{indent}{}  dq {}  {}  {:<9} {}{flag}",
            a.at,
            a.dequeue_count,
            a.message_id,
            a.outcome,
            a.error.as_deref().unwrap_or("")
        );
    }
}

/// The poison list for a person: every id and key in full (columns as wide
/// as their longest value), the error's first line in full beneath each row.
fn print_record_list(records: &[aqw::poison::PoisonRecord]) {
    let width = |f: &dyn Fn(&aqw::poison::PoisonRecord) -> usize, title: &str| {
        records.iter().map(f).max().unwrap_or(0).max(title.len())
    };
    let id_w = width(&|r| r.message_id.chars().count(), "ID");
    let key_w = width(&|r| r.key.as_deref().unwrap_or("-").chars().count(), "KEY");
    println!(
        "{:<id_w$}  {:<9}  {:<20}  {:>3}  {:<10}  KEY",
        "ID", "STATUS", "POISONED AT", "DQ", "KIND"
    );
    println!("{:<id_w$}  ERROR", "");
    for r in records {
        println!(
            "{:<id_w$}  {:<9}  {:<20}  {:>3}  {:<10}  {:<key_w$}",
            r.message_id,
            r.status.as_str(),
            r.poisoned_at.chars().take(19).collect::<String>(),
            r.dequeue_count,
            r.error.kind.as_str(),
            r.key.as_deref().unwrap_or("-"),
        );
        let mut lines = r.error.message.lines();
        let first = lines.next().unwrap_or("");
        let more = lines.count();
        let tail = if more > 0 {
            format!("  (+{more} more line(s): aqw poison show)")
        } else {
            String::new()
        };
        println!("{:<id_w$}  {first}{tail}", "");
    }
}

/// The payload of `enqueue` and `poison fix`: exactly one of `--payload`,
/// `--file` or `-` (stdin).
fn read_payload(
    payload: Option<String>,
    file: Option<PathBuf>,
    stdin: Option<&str>,
) -> Result<String, Failure> {
    match (payload, file, stdin) {
        (Some(p), None, None) => Ok(p),
        (None, Some(f), None) => {
            std::fs::read_to_string(&f).map_err(|e| Failure::usage(format!("{}: {e}", f.display())))
        }
        (None, None, Some("-")) => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .map_err(|e| Failure::usage(format!("stdin: {e}")))?;
            Ok(s)
        }
        _ => Err(Failure::usage(
            "give exactly one of --payload TEXT, --file PATH or -",
        )),
    }
}

async fn enqueue(app_dir: &std::path::Path, a: EnqueueArgs, output: Output) -> Result<u8, Failure> {
    let app = load(app_dir)?;
    let payload = read_payload(a.payload, a.file, a.stdin.as_deref())?;
    let f = app.function_for_queue(&a.queue).ok_or_else(|| {
        Failure::usage(format!(
            "queue \"{}\" is not consumed by any function of this app",
            a.queue
        ))
    })?;
    let key = match aqw::worker::derive_key(&f.key, &payload) {
        Ok(k) => k,
        Err(e) if !a.force => {
            return Err(Failure::usage(format!(
                "the worker would poison this job at once: {e} (use --force to enqueue anyway)"
            )))
        }
        Err(_) => None,
    };
    let text =
        aqw::message::encode_checked(&payload, app.message_encoding).map_err(Failure::usage)?;
    let storage =
        aqw::storage::connect(&f.connection).map_err(|e| Failure::usage(e.to_string()))?;
    let queue = aqw::storage::Storage::queue(&storage, &a.queue);
    let receipt = aqw::poison::put_creating(queue.as_ref(), &text, aqw::storage::Ttl::Default)
        .await
        .map_err(|e| Failure::runtime(format!("storage: {e}")))?;
    let enc = match app.message_encoding {
        MessageEncoding::Base64 => "base64",
        MessageEncoding::None => "none",
    };
    if output == Output::Json {
        print_json(
            &serde_json::json!({"queue": a.queue, "messageId": receipt.id, "key": key.map(|k| k.to_string()), "encoding": enc}),
        );
    } else {
        println!(
            "enqueued {} to {} (key {}, encoding {enc})",
            receipt.id,
            a.queue,
            key.map(|k| format!("{:?}", k.as_str()))
                .unwrap_or("none".into())
        );
    }
    Ok(0)
}

async fn poison(app_dir: &std::path::Path, cmd: PoisonCmd, output: Output) -> Result<u8, Failure> {
    let app = load(app_dir)?;
    match cmd {
        PoisonCmd::List {
            queue,
            status,
            since,
            until,
            function,
            error,
        } => {
            let filter = Filter {
                status: match status {
                    StatusFilter::Open => Some(RecordStatus::Open),
                    StatusFilter::Replayed => Some(RecordStatus::Replayed),
                    StatusFilter::Discarded => Some(RecordStatus::Discarded),
                    StatusFilter::Replaced => Some(RecordStatus::Replaced),
                    StatusFilter::All => None,
                },
                since: since.as_deref().map(parse_time).transpose()?,
                until: until.as_deref().map(parse_time).transpose()?,
                function,
                error: error
                    .as_deref()
                    .map(regex::Regex::new)
                    .transpose()
                    .map_err(|e| Failure::usage(format!("--error: {e}")))?,
                ids: vec![],
            };
            let ops = queue_ops(&app, &queue)?;
            let records = ops::list(&ops, &filter).await?;
            let open = records
                .iter()
                .filter(|r| r.status == RecordStatus::Open)
                .count();
            if output == Output::Json {
                print_json(&records);
            } else if records.is_empty() {
                println!("no poison records for {queue}");
            } else {
                print_record_list(&records);
                println!("{} record(s), {open} open", records.len());
            }
            Ok(if open > 0 { 1 } else { 0 })
        }
        PoisonCmd::Show { queue, id } => {
            let ops = queue_ops(&app, &queue)?;
            let report = ops::show(&ops, &id).await?;
            if output == Output::Json {
                print_json(&report);
            } else {
                let r = &report.record;
                println!(
                    "record:        {} ({}, origin {})",
                    r.message_id,
                    r.status.as_str(),
                    r.origin
                );
                println!("queue:         {} (function {})", r.queue, r.function);
                println!(
                    "error:         [{}] {}",
                    r.error.kind.as_str(),
                    r.error.message
                );
                println!("attempts:      dequeued {} time(s)", r.dequeue_count);
                println!("inserted:      {}", r.inserted_at);
                println!("first attempt: {}", r.first_attempt_at);
                println!("poisoned:      {}", r.poisoned_at);
                println!("key:           {}", r.key.as_deref().unwrap_or("-"));
                match &report.key_record {
                    Some(k) => {
                        println!("key state:     {}", key_state_line(k));
                        print_history(&k.history, "               ");
                    }
                    None => println!("key state:     no record"),
                }
                if let Some(by) = &r.replayed_by {
                    println!(
                        "replayed:      {} by {by} as {}",
                        r.replayed_at.as_deref().unwrap_or("-"),
                        r.replay_message_id.as_deref().unwrap_or("-")
                    );
                }
                if let Some(by) = &r.replaced_by {
                    println!(
                        "replaced:      {} by {by} with {} (key {}, payload {:+} bytes)",
                        r.replaced_at.as_deref().unwrap_or("-"),
                        r.replacement_message_id.as_deref().unwrap_or("-"),
                        r.replacement_key.as_deref().unwrap_or("-"),
                        r.replacement_size_diff.unwrap_or(0)
                    );
                }
                if let Some(by) = &r.discarded_by {
                    println!(
                        "discarded:     {} by {by}: {}",
                        r.discarded_at.as_deref().unwrap_or("-"),
                        r.discard_reason.as_deref().unwrap_or("-")
                    );
                }
                println!(
                    "encoding:      {} ({} bytes of message text)",
                    r.encoding.as_str(),
                    r.message.len()
                );
                match (&report.payload, &report.payload_text, &report.decode_error) {
                    (Some(v), _, _) => println!(
                        "payload:\n{}",
                        serde_json::to_string_pretty(v).unwrap_or_default()
                    ),
                    (None, Some(t), _) => println!("payload (not JSON):\n{t}"),
                    (_, _, Some(e)) => println!(
                        "payload:       undecodable: {e}\nraw text:      {}",
                        r.message
                    ),
                    _ => {}
                }
            }
            Ok(0)
        }
        PoisonCmd::Fix {
            queue,
            id,
            payload,
            file,
            stdin,
            by,
            wait,
        } => {
            if by.trim().is_empty() {
                return Err(Failure::usage("--by must not be empty"));
            }
            let payload = read_payload(payload, file, stdin.as_deref())?;
            let wait = wait
                .as_deref()
                .map(|w| {
                    config::parse_timespan(w).map_err(|e| Failure::usage(format!("--wait: {e}")))
                })
                .transpose()?;
            let ops = queue_ops(&app, &queue)?;
            let report = ops::fix(&ops, &id, &payload, &by, wait).await?;
            if output == Output::Json {
                print_json(&report);
            } else {
                match report.action.as_str() {
                    "replaced" => println!(
                        "replaced {id} by {} (key {} → {}, payload {:+} bytes, by {by}){}",
                        report.new_message_id.as_deref().unwrap_or("-"),
                        report.old_key.as_deref().unwrap_or("-"),
                        report.new_key.as_deref().unwrap_or("-"),
                        report.size_diff,
                        match report.confirmed {
                            Some(true) => "; the new key is done",
                            Some(false) => "; the new key is NOT done yet",
                            None => "",
                        }
                    ),
                    _ => println!(
                        "{id}: {}: {}",
                        report.action,
                        report.detail.as_deref().unwrap_or("-")
                    ),
                }
            }
            let ok = report.action == ops::FixAction::Replaced && report.confirmed != Some(false);
            Ok(if ok { 0 } else { 1 })
        }
        PoisonCmd::Discard {
            queue,
            id,
            reason,
            by,
            close_key,
        } => {
            if reason.trim().is_empty() || by.trim().is_empty() {
                return Err(Failure::usage("--reason and --by must not be empty"));
            }
            let ops = queue_ops(&app, &queue)?;
            let rec = ops::discard(&ops, &id, &reason, &by, close_key).await?;
            if output == Output::Json {
                print_json(&rec);
            } else {
                let key_note = match (close_key, rec.key.as_deref()) {
                    (true, Some(k)) => format!("; key {k} closed: a resend is a duplicate"),
                    (false, Some(k)) => format!("; key {k} left poisoned: a resend runs"),
                    _ => String::new(),
                };
                println!("discarded {id} ({reason}, by {by}){key_note}");
            }
            Ok(0)
        }
        PoisonCmd::Replay {
            queue,
            ids,
            all,
            error,
            since,
            limit,
            rate,
            dry_run,
            by,
            wait,
            concurrency,
        } => {
            if !all && ids.is_empty() {
                return Err(Failure::usage("give --id ID (repeatable) or --all"));
            }
            if rate.is_some_and(|r| !(r > 0.0 && r.is_finite())) {
                return Err(Failure::usage(
                    "--rate must be a positive number of messages per second",
                ));
            }
            let opts = ReplayOptions {
                filter: Filter {
                    status: None,
                    since: since.as_deref().map(parse_time).transpose()?,
                    until: None,
                    function: None,
                    error: error
                        .as_deref()
                        .map(regex::Regex::new)
                        .transpose()
                        .map_err(|e| Failure::usage(format!("--error: {e}")))?,
                    ids,
                },
                limit,
                rate,
                dry_run,
                by: by.unwrap_or_default(),
                wait: wait
                    .as_deref()
                    .map(|w| {
                        config::parse_timespan(w)
                            .map_err(|e| Failure::usage(format!("--wait: {e}")))
                    })
                    .transpose()?,
                concurrency: concurrency as usize,
            };
            let ops = queue_ops(&app, &queue)?;
            let bar = if std::io::stderr().is_terminal() && output == Output::Text {
                let b = indicatif::ProgressBar::new(0);
                b.set_style(
                    indicatif::ProgressStyle::with_template(
                        "{bar:40} {pos}/{len} replayed ({per_sec}, eta {eta})",
                    )
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
                );
                Some(b)
            } else {
                None
            };
            let progress = |done: usize, total: usize| {
                if let Some(b) = &bar {
                    if total > 5 {
                        b.set_length(total as u64);
                        b.set_position(done as u64);
                    }
                }
            };
            let report = ops::replay(&ops, &opts, &progress).await?;
            if let Some(b) = bar {
                b.finish_and_clear();
            }
            if output == Output::Json {
                print_json(&report);
            } else {
                for i in &report.items {
                    let extra = match (&i.new_message_id, &i.detail) {
                        (Some(n), _) => format!("as {n}"),
                        (None, Some(d)) => d.clone(),
                        _ => String::new(),
                    };
                    let conf = match i.confirmed {
                        Some(true) => " [done]",
                        Some(false) => " [NOT done yet]",
                        None => "",
                    };
                    println!("{:<38} {:<26} {}{conf}", i.id, i.action, extra);
                }
                println!(
                    "{}: {} selected, {} replayed, {} already done, {} not replayed{}",
                    if report.dry_run { "dry run" } else { "replay" },
                    report.selected,
                    report.replayed,
                    report.already_done,
                    report.failed,
                    if opts.wait.is_some() {
                        format!(", {} not confirmed done", report.unconfirmed)
                    } else {
                        String::new()
                    }
                );
            }
            Ok(if report.needs_a_person() { 1 } else { 0 })
        }
    }
}

fn spawn_signal_handler(shutdown: CancellationToken) {
    tokio::spawn(async move {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let mut term = match signal(SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return,
            };
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!(event = "aqw.worker.signal", "shutdown requested");
        shutdown.cancel();
    });
    let _ = Duration::ZERO;
}

#[cfg(test)]
mod tests {
    use super::*;

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
