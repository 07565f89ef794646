//! Dispatch: each command turns its arguments into a call of the library
//! (`aqw_core::ops`, `aqw::worker`, `aqw::serve`), renders the data it returns,
//! and says which exit code that means.

use super::args::{
    Cli, Command, ConfigCmd, DashboardArgs, EnqueueArgs, PauseArgs, PoisonCmd, ResumeArgs,
};
use super::exit::{Exit, Failure};
use super::keys_args::KeysCmd;
use super::load::{
    connect, function_storage, load, parse_error_regex, parse_time, parse_wait, queue_ops,
    read_payload,
};
use super::output as render;
use super::output::Output;
use aqw::config::{self};
use aqw_core::config::AppConfig;
use aqw_core::ops::{self, Filter, FixAction, QueueOps, ReplayOptions};
use clap::CommandFactory;
use std::io::IsTerminal;
use std::path::Path;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub async fn dispatch(cli: Cli) -> Result<Exit, Failure> {
    let output = cli.output;
    match cli.command {
        Command::Run => run(&cli.app).await,
        Command::Serve => serve(&cli.app).await,
        Command::Dashboard(a) => dashboard(&cli.app, a).await,
        Command::Enqueue(a) => enqueue(&cli.app, a, output).await,
        Command::Status => status(&cli.app, output).await,
        Command::Triage(a) => super::triage::run(&cli.app, a, output).await,
        Command::Oncall(a) => super::oncall::run(a, output),
        Command::Poison(cmd) => poison(&cli.app, cmd, output).await,
        Command::Pause(a) => pause(&cli.app, a, output).await,
        Command::Resume(a) => resume(&cli.app, a, output).await,
        Command::Ops(cmd) => super::ops::dispatch(&cli.app, cmd, output).await,
        Command::Completions { shell } => {
            // Into a buffer, then out as one line: a closed pipe exits
            // quietly (clap_complete panics on a write error).
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "aqw", &mut script);
            outln!("{}", String::from_utf8_lossy(&script).trim_end());
            Ok(Exit::Ok)
        }
        Command::Config(ConfigCmd::Show) => config_show(&cli.app, output),
        Command::Keys(KeysCmd::Show { function, key }) => {
            super::keys::keys_show(&cli.app, &function, &key, output).await
        }
        Command::Keys(cmd @ KeysCmd::List { .. }) => {
            super::keys::keys_list(&cli.app, cmd, output).await
        }
        Command::Keys(KeysCmd::Check { function, key }) => {
            super::keys::keys_check(&cli.app, &function, &key, output).await
        }
        Command::Keys(cmd @ KeysCmd::NewProviderKey { .. }) => {
            super::keys::new_provider_key(&cli.app, cmd, output).await
        }
        Command::Keys(KeysCmd::Purge(a)) => super::purge::keys(&load(&cli.app)?, a, output).await,
    }
}

async fn run(app_dir: &Path) -> Result<Exit, Failure> {
    let app = load(app_dir)?;
    let registry = aqw::handlers::Registry::new();
    aqw::app::preflight(&app, &registry).map_err(Failure::usage)?;
    let shutdown = CancellationToken::new();
    spawn_signal_handler(shutdown.clone());
    aqw::worker::run(app, registry, shutdown)
        .await
        .map_err(|e| Failure::runtime(format!("{e:#}")))?;
    Ok(Exit::Ok)
}

async fn serve(app_dir: &Path) -> Result<Exit, Failure> {
    let app = load(app_dir)?;
    let registry = aqw::handlers::Registry::new();
    aqw::app::preflight(&app, &registry).map_err(Failure::usage)?;
    aqw::config::queues::serve_refusals(&app).map_err(Failure::usage)?;
    let port = aqw::serve::port_from_env(std::env::var("FUNCTIONS_CUSTOMHANDLER_PORT").ok())
        .map_err(Failure::usage)?;
    let shutdown = CancellationToken::new();
    spawn_signal_handler(shutdown.clone());
    aqw::serve::serve(app, registry, port, shutdown)
        .await
        .map_err(|e| Failure::runtime(format!("{e:#}")))?;
    Ok(Exit::Ok)
}

async fn dashboard(app_dir: &Path, a: DashboardArgs) -> Result<Exit, Failure> {
    let wide = aqw::dashboard::ALLOW_WIDE_SETTING;
    let auth = aqw::dashboard::AuthConfig::from_env(|k| match k {
        _ if k == wide && a.allow_wide_trusted_proxies => Some("1".into()),
        _ => std::env::var(k).ok(),
    })
    .map_err(Failure::usage)?;
    let public_hosts = aqw::dashboard::public_hosts(
        &std::env::var("AQW_DASHBOARD_PUBLIC_URL").unwrap_or_default(),
    )
    .map_err(Failure::usage)?;
    let options = aqw::dashboard::Options {
        read_only: a.read_only,
        auth,
        listen: Some(a.listen),
        public_hosts,
        limits: a.limits,
    };
    options.check().map_err(Failure::usage)?;
    for warning in options.warnings() {
        tracing::warn!(
            event = "aqw.dashboard.setup",
            mode = options.mode(),
            "{warning}"
        );
    }
    let app = load(app_dir)?;
    let state = aqw::dashboard::Dashboard::new(app, options).map_err(Failure::usage)?;
    let listener = tokio::net::TcpListener::bind(a.listen)
        .await
        .map_err(|e| Failure::runtime(format!("cannot listen on {} (--listen): {e}", a.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Failure::runtime(format!("{e}")))?;
    if !aqw::dashboard::is_loopback(&addr) {
        tracing::warn!(event = "aqw.dashboard.exposed", listen = %addr, "the dashboard listens beyond this machine: put TLS and authentication in front of it");
    }
    let mode = if a.read_only {
        "read-only"
    } else {
        "actions need authentication"
    };
    outln!("aqw dashboard: http://{addr}/ ({mode})");
    let shutdown = CancellationToken::new();
    spawn_signal_handler(shutdown.clone());
    aqw::dashboard::serve(listener, Arc::new(state), shutdown)
        .await
        .map_err(|e| Failure::runtime(format!("dashboard: {e}")))?;
    Ok(Exit::Ok)
}

async fn enqueue(app_dir: &Path, a: EnqueueArgs, output: Output) -> Result<Exit, Failure> {
    let app = load(app_dir)?;
    let payload = read_payload(a.payload, a.file, a.stdin.as_deref())?;
    // The producer span; its context goes into the payload where
    // aqw.tracing.parent says (joining TRACEPARENT from the environment).
    let span = aqw_core::traces::enqueue_span(&a.queue);
    let payload = ops::with_trace_context(&app, &payload, &span);
    let delivery = parse_delivery(a.delay.as_deref(), a.at.as_deref(), a.ttl.as_deref())?;
    let job = ops::prepare_enqueue(&app, &a.queue, &payload, a.force)?;
    let storage = connect(&job.connection)?;
    let done = ops::enqueue_with(job, delivery, storage.as_ref())
        .instrument(span)
        .await?;
    render::enqueued(&done, output);
    Ok(Exit::Ok)
}

async fn status(app_dir: &Path, output: Output) -> Result<Exit, Failure> {
    let app = load(app_dir)?;
    let mut lines = Vec::new();
    for f in &app.functions {
        lines.push(ops::status(&queue_ops(&app, &f.queue)?).await?);
    }
    let open: usize = lines.iter().map(|l| l.open_records).sum();
    let mut schedules = Vec::new();
    for s in &app.schedules {
        let f = app.function(&s.function).ok_or_else(|| {
            Failure::usage(format!(
                "schedule {}: no function named {}",
                s.name, s.function
            ))
        })?;
        let qo = queue_ops(&app, &f.queue)?;
        // One unreadable schedule (a bad row) is shown as such, not the
        // end of the whole status.
        let status = aqw_core::schedule::status(&app, s, qo.control.table().as_ref(), &qo.keys)
            .await
            .unwrap_or_else(|e| {
                let why = aqw_core::scrub::scrub(&e.to_string());
                aqw_core::schedule::ScheduleStatus::unread(s, why)
            });
        schedules.push(status);
    }
    render::status(&lines, &schedules, open, output);
    render::status_control(&lines, output);
    let held = lines.iter().any(|l| l.held());
    Ok(Exit::needs_a_person_if(open > 0 || held))
}

async fn pause(app_dir: &Path, a: PauseArgs, output: Output) -> Result<Exit, Failure> {
    let app = load(app_dir)?;
    let storage = function_storage(&app, &a.function)?;
    let store = ops::control_store(&app, &a.function, storage.as_ref())?;
    let row = ops::pause(&store, &a.function, &a.by, &a.reason).await?;
    render::control(&a.function, &row, output);
    Ok(Exit::Ok)
}

async fn resume(app_dir: &Path, a: ResumeArgs, output: Output) -> Result<Exit, Failure> {
    let app = load(app_dir)?;
    let storage = function_storage(&app, &a.function)?;
    let store = ops::control_store(&app, &a.function, storage.as_ref())?;
    let row = ops::resume(&store, &a.function, &a.by).await?;
    render::control(&a.function, &row, output);
    Ok(Exit::Ok)
}

/// `config show`: the effective configuration, secrets masked.
fn config_show(app_dir: &Path, output: Output) -> Result<Exit, Failure> {
    let app = load(app_dir)?;
    let look = config::show::lookup(app_dir).map_err(|e| Failure::usage(format!("{e:#}")))?;
    render::config_show(&config::show::effective(&app, &look), output);
    Ok(Exit::Ok)
}

/// Before a replay, where the function has a `handler.lookup`: the
/// provider's answers for the records whose key may have taken effect
/// (found by a dry run of the same selection), applied or not applied only;
/// an unknown answer leaves the record to `--uncertain-checked`.
async fn provider_answers(
    app: &AppConfig,
    ops: &QueueOps,
    opts: &ReplayOptions,
) -> Result<std::collections::HashMap<String, String>, Failure> {
    let mut answers = std::collections::HashMap::new();
    // A provider that dedupes Idempotency-Key needs no answer to pass the
    // uncertain gate: no lookups (an outage would make each one wait).
    if ops::is_idempotent(ops.function.as_ref()) {
        return Ok(answers);
    }
    let Some(lookup) = app
        .function_for_queue(&ops.queue)
        .and_then(|f| aqw::handlers::lookup::of(&f.handler))
    else {
        return Ok(answers);
    };
    let dry = ReplayOptions {
        dry_run: true,
        wait: None,
        provider_answers: Default::default(),
        ..opts.clone()
    };
    let report = ops::replay(ops, &dry, &|_: usize, _: usize| {}).await?;
    for pk in report
        .items
        .iter()
        .filter_map(|i| i.uncertain_provider_key.as_ref())
    {
        let answer = aqw::handlers::lookup::ask(Some(lookup), pk).await;
        if matches!(
            answer,
            aqw::handlers::lookup::LookupAnswer::Applied { .. }
                | aqw::handlers::lookup::LookupAnswer::NotApplied { .. }
        ) {
            answers.insert(pk.clone(), answer.line());
        }
    }
    Ok(answers)
}

/// For each dry-run item whose key may have taken effect, the provider's
/// answer from the function's lookup (or that it was not asked).
async fn check_uncertain(app: &AppConfig, queue: &str, report: &mut ops::ReplayReport) {
    let lookup = app
        .function_for_queue(queue)
        .and_then(|f| aqw::handlers::lookup::of(&f.handler));
    for item in report.items.iter_mut() {
        if let Some(pk) = &item.uncertain_provider_key {
            item.provider_check = Some(aqw::handlers::lookup::ask(lookup, pk).await.line());
        }
    }
}

async fn poison(app_dir: &Path, cmd: PoisonCmd, output: Output) -> Result<Exit, Failure> {
    let app = load(app_dir)?;
    match cmd {
        PoisonCmd::List(a) => super::poison_list::run(&app, a, output).await,
        PoisonCmd::Show { queue, id, pretty } => {
            let mut report = ops::show(&queue_ops(&app, &queue)?, &id).await?;
            if let Some(pk) = report.uncertain_provider_key() {
                let lookup = app
                    .function_for_queue(&queue)
                    .and_then(|f| aqw::handlers::lookup::of(&f.handler));
                report.provider_check = Some(aqw::handlers::lookup::ask(lookup, pk).await.line());
            }
            render::poison_show(&report, pretty, output);
            Ok(Exit::Ok)
        }
        PoisonCmd::Report { queue, since } => {
            super::report::poison_report(&app, &queue, since.as_deref(), output).await
        }
        cmd @ PoisonCmd::Fix { .. } => poison_fix(&app, cmd, output).await,
        cmd @ PoisonCmd::Discard { .. } => poison_discard(&app, cmd, output).await,
        cmd @ PoisonCmd::Replay { .. } => poison_replay(&app, cmd, output).await,
        PoisonCmd::Purge {
            queue,
            older_than,
            dry_run,
        } => {
            let q = queue_ops(&app, &queue)?;
            super::purge::records(q, older_than.as_deref(), dry_run, output).await
        }
    }
}

async fn poison_fix(app: &Arc<AppConfig>, cmd: PoisonCmd, output: Output) -> Result<Exit, Failure> {
    let PoisonCmd::Fix {
        queue,
        id,
        payload,
        file,
        stdin,
        by,
        wait,
        past_provider_window,
        dry_run,
    } = cmd
    else {
        unreachable!("poison_fix is called with PoisonCmd::Fix only");
    };
    if by.trim().is_empty() {
        return Err(Failure::usage("--by must not be empty"));
    }
    let payload = read_payload(payload, file, stdin.as_deref())?;
    let wait = parse_wait(wait.as_deref())?;
    let ops = queue_ops(app, &queue)?;
    if dry_run {
        let rehearsal = ops::rehearse_fix(&ops, &id, &payload).await?;
        render::fix_rehearsal(&rehearsal, output);
        return Ok(Exit::needs_a_person_if(rehearsal.refusal.is_some()));
    }
    let report = ops::fix(&ops, &id, &payload, &by, wait, past_provider_window).await?;
    render::poison_fix(&id, &by, &report, output);
    let ok = report.action == FixAction::Replaced && report.confirmed != Some(false);
    Ok(Exit::needs_a_person_if(!ok))
}

async fn poison_discard(
    app: &Arc<AppConfig>,
    cmd: PoisonCmd,
    output: Output,
) -> Result<Exit, Failure> {
    let PoisonCmd::Discard {
        queue,
        id,
        reason,
        by,
        close_key,
        dry_run,
    } = cmd
    else {
        unreachable!("poison_discard is called with PoisonCmd::Discard only");
    };
    if reason.trim().is_empty() || by.trim().is_empty() {
        return Err(Failure::usage("--reason and --by must not be empty"));
    }
    let ops = queue_ops(app, &queue)?;
    if dry_run {
        let rehearsal = ops::rehearse_discard(&ops, &id, close_key).await?;
        render::discard_rehearsal(&rehearsal, output);
        return Ok(Exit::needs_a_person_if(rehearsal.refusal.is_some()));
    }
    let mut rec = ops::discard(&ops, &id, &reason, &by, close_key).await?;
    let redaction = super::poison_list::redaction(app, &ops, &rec);
    let note = ops::mask_message(&mut rec, redaction);
    render::poison_discard(
        &id,
        &reason,
        &by,
        close_key,
        (&rec, note.as_deref()),
        output,
    );
    Ok(Exit::Ok)
}

async fn poison_replay(
    app: &Arc<AppConfig>,
    cmd: PoisonCmd,
    output: Output,
) -> Result<Exit, Failure> {
    let PoisonCmd::Replay { queue, all, .. } = &cmd else {
        unreachable!("poison_replay is called with PoisonCmd::Replay only");
    };
    let (queue, all) = (queue.clone(), *all);
    let mut opts = replay_options(cmd)?;
    let ops = queue_ops(app, &queue)?;
    if !opts.dry_run && !opts.uncertain_checked {
        opts.provider_answers = provider_answers(app, &ops, &opts).await?;
    }
    let bar = progress_bar(output);
    let progress = |done: usize, total: usize| {
        if let Some(b) = &bar {
            if total > 5 {
                b.set_length(total as u64);
                b.set_position(done as u64);
            }
        }
    };
    let mut report = if all && !opts.dry_run {
        replay_group(&ops, &opts, output, &progress).await?
    } else {
        ops::replay(&ops, &opts, &progress).await?
    };
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    if report.dry_run {
        check_uncertain(app, &queue, &mut report).await;
    }
    render::poison_replay(&report, opts.wait.is_some(), output);
    Ok(Exit::needs_a_person_if(report.needs_a_person()))
}

/// `poison replay --all`: the records are replayed by a durable operation
/// this process creates and carries out (a process killed mid-way leaves
/// it to `aqw ops resume` or an idle `aqw run`); the report is the same.
async fn replay_group(
    ops: &QueueOps,
    opts: &ReplayOptions,
    output: Output,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<ops::ReplayReport, Failure> {
    let store = aqw_core::ops::operation::OperationStore::new(ops.control.table().clone());
    let exec = super::ops::executor(false);
    let (op, report) =
        aqw_core::ops::operation::replay_group(ops, &store, opts, exec, progress).await?;
    if let (Output::Text, Some(op)) = (output, op) {
        outln!(
            "operation {}: {} ({} of {} record(s) handled); `aqw ops show {}`",
            op.id,
            op.state.as_str(),
            op.done + op.skipped + op.failed,
            op.selected,
            op.id
        );
        if let Some(why) = &op.stop_reason {
            outln!("  stopped: {why}");
        }
    }
    Ok(report)
}

/// The options of `poison replay`, checked.
fn replay_options(cmd: PoisonCmd) -> Result<ReplayOptions, Failure> {
    let PoisonCmd::Replay {
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
        past_provider_window,
        uncertain_checked,
        ..
    } = cmd
    else {
        unreachable!("replay_options is called with PoisonCmd::Replay only");
    };
    if !all && ids.is_empty() {
        return Err(Failure::usage("give --id ID (repeatable) or --all"));
    }
    if rate.is_some_and(|r| !(0.001..=10_000.0).contains(&r)) {
        return Err(Failure::usage(
            "--rate must be a number of messages per second from 0.001 to 10000",
        ));
    }
    Ok(ReplayOptions {
        filter: Filter {
            status: None,
            since: since.as_deref().map(parse_time).transpose()?,
            until: None,
            function: None,
            error: parse_error_regex(error.as_deref())?,
            ids,
        },
        limit,
        rate,
        dry_run,
        by: by.unwrap_or_default(),
        wait: parse_wait(wait.as_deref())?,
        concurrency: concurrency as usize,
        past_provider_window,
        uncertain_checked,
        provider_answers: Default::default(),
    })
}

/// A progress bar on a terminal, for text output only.
fn progress_bar(output: Output) -> Option<indicatif::ProgressBar> {
    if !(std::io::stderr().is_terminal() && output == Output::Text) {
        return None;
    }
    let b = indicatif::ProgressBar::new(0);
    b.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} replayed ({per_sec}, eta {eta})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    Some(b)
}

/// `enqueue --delay/--at/--ttl` as a [`ops::Delivery`]: each value checked,
/// and the pair against the service's rules, before anything is sent.
fn parse_delivery(
    delay: Option<&str>,
    at: Option<&str>,
    ttl: Option<&str>,
) -> Result<ops::Delivery, Failure> {
    let ttl = match ttl {
        None => aqw_core::storage::Ttl::Default,
        Some("never") => aqw_core::storage::Ttl::Never,
        Some(t) => aqw_core::storage::Ttl::After(
            aqw_core::config::parse_timespan(t)
                .map_err(|e| Failure::usage(format!("--ttl: {e}")))?,
        ),
    };
    let delivery = match (delay, at) {
        (Some(d), _) => {
            let d = aqw_core::config::parse_timespan(d)
                .map_err(|e| Failure::usage(format!("--delay: {e}")))?;
            ops::Delivery::after(d, ttl)
        }
        (None, Some(t)) => {
            let when =
                time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
                    .map_err(|_| {
                        Failure::usage(format!(
                            "--at: \"{t}\" is not an RFC 3339 time (2026-12-24T18:00:00Z)"
                        ))
                    })?;
            ops::Delivery::at(when, aqw_core::clock::now_utc(), ttl)
        }
        (None, None) => ops::Delivery::after(std::time::Duration::ZERO, ttl),
    };
    delivery.map_err(|e| Failure::usage(format!("--delay/--at/--ttl: {e}")))
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
}
