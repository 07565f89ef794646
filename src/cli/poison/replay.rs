//! `aqw poison replay`: re-put poisoned messages with their original key;
//! `--all` as a durable operation (`aqw ops`), the provider's answers asked
//! first where the function has a `handler.lookup`.

use crate::cli::exit::{Exit, Failure};
use crate::cli::load::{parse_error_regex, parse_time, parse_wait, queue_ops};
use crate::cli::output::{print_json, Output};
use aqw_core::config::AppConfig;
use aqw_core::ops::{self, Filter, QueueOps, ReplayOptions, ReplayReport};
use aqw_core::scrub::one_line;
use clap::Args;
use std::io::IsTerminal;
use std::sync::Arc;

/// Re-put poisoned messages to their source queue with their original key.
#[derive(Args)]
#[command(
    after_help = "Examples:\n  aqw poison replay receipts --all --error 'HTTP 503' --dry-run\n  aqw poison replay receipts --id ID --wait 00:02:00"
)]
pub struct ReplayArgs {
    /// Source queue of the poisoned messages.
    pub queue: String,
    /// A record to replay (repeat for several).
    #[arg(long = "id", required_unless_present = "all")]
    pub ids: Vec<String>,
    /// Every open record (narrowed by --error, --since, --limit), as a
    /// durable operation at --rate (default 50/s; it sets how many are in flight),
    /// and a process killed mid-way leaves it to `aqw ops resume` or an
    /// idle `aqw run`.
    #[arg(long, conflicts_with = "ids")]
    pub all: bool,
    /// Only records whose error matches this regular expression.
    #[arg(long)]
    pub error: Option<String>,
    /// Only records poisoned at or after: RFC 3339 time or a duration ago.
    #[arg(long)]
    pub since: Option<String>,
    /// At most this many records.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Messages per second (with --all: 0.1 to 1000, default 50).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Say what would be replayed; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Who is doing it, kept on the record (default: $USER; needed
    /// unless --dry-run).
    #[arg(long, env = "USER", required_unless_present = "dry_run")]
    pub by: Option<String>,
    /// Wait (hh:mm:ss) until each replayed key is done, and report.
    #[arg(long)]
    pub wait: Option<String>,
    /// Records replayed at once (with --id; an --all operation sets its own).
    #[arg(long, default_value_t = aqw_core::ops::DEFAULT_REPLAY_CONCURRENCY as u64, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub concurrency: u64,
    /// Go ahead although the provider key is older than the function's
    /// providerKeyWindow (the provider may have forgotten it); kept on the record.
    #[arg(long)]
    pub past_provider_window: bool,
    /// The provider was checked for the records with an attempt that may
    /// have taken effect (`aqw keys check`): replay them too. Kept on
    /// each record. Not needed where the function's handler.lookup
    /// answered.
    #[arg(long)]
    pub uncertain_checked: bool,
}

pub(super) async fn run(
    app: &Arc<AppConfig>,
    a: ReplayArgs,
    output: Output,
) -> Result<Exit, Failure> {
    let (queue, all) = (a.queue.clone(), a.all);
    let mut opts = replay_options(a)?;
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
    print_replay(&report, opts.wait.is_some(), output);
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
    let exec = crate::cli::ops::store::executor(false);
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
fn replay_options(a: ReplayArgs) -> Result<ReplayOptions, Failure> {
    let ReplayArgs {
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
    } = a;
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

/// `poison replay`: a line per record, then the counts.
fn print_replay(report: &ReplayReport, waited: bool, output: Output) {
    if output == Output::Json {
        print_json(&report);
        return;
    }
    for i in &report.items {
        let extra = match (&i.new_message_id, &i.detail) {
            (Some(n), _) => format!("as {n}"),
            (None, Some(d)) => d.clone(),
            _ => String::new(),
        };
        let conf = match (i.confirmed, &i.provider, &i.poisoned_again) {
            (_, _, Some(p)) => format!(
                " [POISONED AGAIN as {} ({}): {}]",
                p.id,
                p.kind,
                one_line(&p.error)
            ),
            (Some(true), Some(p), _) => format!(" [completed ({p})]"),
            (Some(true), None, _) => " [done]".into(),
            (Some(false), _, _) => " [NOT done yet]".into(),
            (None, _, _) => String::new(),
        };
        let key = match (&i.key, &i.key_state) {
            (Some(k), Some(st)) if report.dry_run => format!("  key {k} ({st})"),
            _ => String::new(),
        };
        outln!(
            "{:<38} {:<26} {}{conf}{key}",
            i.id,
            i.action.as_str(),
            extra
        );
        print_replay_notes(i, report);
    }
    outln!(
        "{}: {} selected, {} replayed, {} already done, {} not replayed{}",
        if report.dry_run { "dry run" } else { "replay" },
        report.selected,
        report.replayed,
        report.already_done,
        report.failed,
        if waited {
            format!(
                ", {} poisoned again, {} not confirmed done",
                report.poisoned_again, report.unconfirmed
            )
        } else {
            String::new()
        }
    );
}

/// Beneath a replay row: the uncertain attempt (and whether the provider
/// dedupes it), and a saving provider's warning with the way out.
fn print_replay_notes(i: &aqw_core::ops::ReplayItem, report: &ReplayReport) {
    if let Some(pk) = &i.uncertain_provider_key {
        let dedupes = if i.provider_dedupes {
            ": the provider honours Idempotency-Key (handler.idempotent), a same-key replay cannot double it; no --uncertain-checked needed"
        } else {
            ""
        };
        outln!("    ! an attempt may have taken effect (provider key {pk}){dedupes}");
        if let Some(check) = &i.provider_check {
            outln!("      the provider says: {check}");
        }
    }
    if let Some(why) = &i.saved_failure {
        let key = i.key.as_deref().map_or("KEY".into(), one_line);
        let function = report
            .function
            .as_deref()
            .map_or("FUNCTION".into(), one_line);
        outln!("    ! the provider saves failures ({}): a same-key replay gets the saved failure back (replayed_failure)", one_line(why));
        outln!("      the way out, once the cause is fixed: aqw keys check {function} {key}");
        outln!("      if it says \"not applied\": aqw keys new-provider-key {function} {key} --reason \"…\" --dry-run, then without --dry-run");
        outln!(
            "      then: aqw poison replay {} --id {} --wait 00:02:00",
            one_line(&report.queue),
            one_line(&i.id)
        );
    }
}
