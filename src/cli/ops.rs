//! `aqw ops …`: durable group operations (issue 40). `ops replay`,
//! `ops discard` and `ops fix` select the open records of a queue, create an operation
//! row for them (who, what, the fingerprint of the ids selected, the
//! rate) and carry it out in this process unless `--detach`; a process
//! that dies leaves it to the next executor (an idle `aqw run`, or `aqw ops
//! resume`) once its lease expires. `list`, `show` and `cancel` work from
//! any process.

use super::exit::{Exit, Failure};
use super::load::{load, parse_time, queue_ops};
use super::output::print_json;
use super::output::Output;
use aqw_core::config::AppConfig;
use aqw_core::ops::operation::{
    self as operation, ExecuteOptions, NewOperation, OpKind, OpState, Operation, OperationStore,
    Selection,
};
use aqw_core::ops::QueueOps;
use clap::{Args, Subcommand};
use std::path::Path;
use std::sync::Arc;

/// `aqw ops`.
#[derive(Subcommand)]
pub enum OpsCmd {
    /// Replay every open record a selection picks, as a durable operation.
    #[command(
        after_help = "Exit codes: 0 done (or created with --detach); 1 halted, cancelled or some records not handled; 2 bad arguments; 3 storage error.\n\nExamples:\n  aqw ops replay receipts --error 'HTTP 503' --dry-run\n  aqw ops replay receipts --error 'HTTP 503' --rate 20 --by alice\n  aqw ops replay receipts --since 02:00:00 --detach"
    )]
    Replay {
        #[command(flatten)]
        sel: SelectArgs,
        /// Go ahead although a provider key is older than the function's
        /// providerKeyWindow; kept on each record.
        #[arg(long)]
        past_provider_window: bool,
        /// The provider was checked for records whose attempt may have
        /// taken effect: replay them too.
        #[arg(long)]
        uncertain_checked: bool,
    },
    /// Discard every open record a selection picks, as a durable operation.
    #[command(
        after_help = "Examples:\n  aqw ops discard receipts --error 'HTTP 422' --reason 'refused for good' --dry-run\n  aqw ops discard receipts --error 'HTTP 422' --reason 'refused for good' --close-key"
    )]
    Discard {
        #[command(flatten)]
        sel: SelectArgs,
        /// Why they must not run, kept on each record.
        #[arg(long)]
        reason: String,
        /// Also close each record's key (a producer's resend is a duplicate).
        #[arg(long)]
        close_key: bool,
    },
    /// Correct every open record a selection picks with one JSON Patch
    /// (RFC 6902) and put each in its place, as a durable operation: a bad
    /// producer's batch fixed at once. A record the patch does not apply to
    /// is left open (skipped, with why).
    #[command(
        after_help = "Exit codes: 0 done (or created with --detach); 1 halted, cancelled, or records left open (the patch did not apply, a key already done); 2 bad arguments or patch; 3 storage error.\n\nEach record's payload (a claim-checked one's body) is read as JSON, patched, written as compact JSON and put as `aqw poison fix` puts it: it must derive a key, and a key already done is left alone.\nThe record is closed as replaced, keeping who, the operation and the new key.\n\nExamples (rename the misspelt field \"acount\"):\n  aqw ops fix credits --error 'missing field .account' --patch '[{\"op\":\"move\",\"from\":\"/acount\",\"path\":\"/account\"}]' --dry-run\n  aqw ops fix credits --error 'missing field .account' --patch-file rename.json --by alice"
    )]
    Fix {
        #[command(flatten)]
        sel: SelectArgs,
        /// The JSON Patch (RFC 6902) as text.
        #[arg(
            long,
            required_unless_present = "patch_file",
            conflicts_with = "patch_file"
        )]
        patch: Option<String>,
        /// Read the JSON Patch from a file.
        #[arg(long)]
        patch_file: Option<std::path::PathBuf>,
        /// Go ahead although a provider key is older than the function's
        /// providerKeyWindow; kept on each record.
        #[arg(long)]
        past_provider_window: bool,
    },
    /// Operations, newest first: state, progress, who.
    #[command(after_help = "Examples:\n  aqw ops list\n  aqw ops list --output json")]
    List {
        /// The account of this queue's function (default: the first function's).
        #[arg(long)]
        queue: Option<String>,
    },
    /// One operation: selection, fingerprint, rate, counts, lease, why it stopped.
    #[command(
        after_help = "Exit codes: 0 done, queued or running; 1 halted, cancelled or failed.\n\nExample:\n  aqw ops show 20261206T201500-1a2b3c4d"
    )]
    Show {
        /// The operation's id.
        id: String,
        /// The account of this queue's function (default: the first function's).
        #[arg(long)]
        queue: Option<String>,
    },
    /// Cancel an operation: its executor starts no more records.
    #[command(after_help = "Example:\n  aqw ops cancel 20261206T201500-1a2b3c4d --by alice")]
    Cancel {
        /// The operation's id.
        id: String,
        /// Who cancels (default: $USER).
        #[arg(long, env = "USER")]
        by: String,
        /// The account of this queue's function (default: the first function's).
        #[arg(long)]
        queue: Option<String>,
    },
    /// Carry out an operation whose executor died (its lease expired), here.
    #[command(
        after_help = "Exit codes: 0 done; 1 halted, cancelled or records not handled; 2 unknown, finished, or its lease is held.\n\nExamples:\n  aqw ops resume 20261206T201500-1a2b3c4d\n  aqw ops resume 20261206T201500-1a2b3c4d --take-over"
    )]
    Resume {
        /// The operation's id.
        id: String,
        /// Take the lease although its holder's has not expired (you know
        /// that process is gone); the holder, if alive, stops at its next record.
        #[arg(long)]
        take_over: bool,
        /// The account of this queue's function (default: the first function's).
        #[arg(long)]
        queue: Option<String>,
    },
}

/// What `ops replay` and `ops discard` select, and how they run.
#[derive(Args)]
pub struct SelectArgs {
    /// Source queue of the poisoned messages.
    pub queue: String,
    /// Only records whose error matches this regular expression.
    #[arg(long)]
    pub error: Option<String>,
    /// Only records poisoned at or after: RFC 3339 time or a duration ago.
    #[arg(long)]
    pub since: Option<String>,
    /// Only records poisoned at or before: RFC 3339 time or a duration ago.
    #[arg(long)]
    pub until: Option<String>,
    /// Only records of this function.
    #[arg(long)]
    pub function: Option<String>,
    /// Records per second (0.1 to 1000).
    #[arg(long, env = "AQW_OPERATION_RATE", default_value_t = operation::DEFAULT_RATE)]
    pub rate: f64,
    /// Halt once this many replayed jobs come back poisoned (0: never).
    #[arg(long, default_value_t = operation::DEFAULT_HALT_AFTER)]
    pub halt_after: u32,
    /// The fingerprint a dry run printed: refuse (exit 2) when the
    /// selection now picks other records.
    #[arg(long)]
    pub reviewed: Option<String>,
    /// Say how many records it selects and their fingerprint; create nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Create the operation and return: an idle `aqw run` (or `aqw ops
    /// resume ID`) carries it out.
    #[arg(long)]
    pub detach: bool,
    /// Who is doing it, kept on the operation and each record (default: $USER).
    #[arg(long, env = "USER")]
    pub by: String,
}

pub(super) async fn dispatch(app_dir: &Path, cmd: OpsCmd, output: Output) -> Result<Exit, Failure> {
    let app = load(app_dir)?;
    match cmd {
        OpsCmd::Replay {
            sel,
            past_provider_window,
            uncertain_checked,
        } => {
            let kind = OpKind::Replay {
                past_provider_window,
                uncertain_checked,
            };
            start(&app, sel, kind, output).await
        }
        OpsCmd::Discard {
            sel,
            reason,
            close_key,
        } => start(&app, sel, OpKind::Discard { reason, close_key }, output).await,
        OpsCmd::Fix {
            sel,
            patch,
            patch_file,
            past_provider_window,
        } => {
            let patch = patch_text(patch, patch_file.as_deref())?;
            let kind = OpKind::Fix {
                patch,
                past_provider_window,
            };
            start(&app, sel, kind, output).await
        }
        OpsCmd::List { queue } => {
            let (_, store) = stores(&app, queue.as_deref())?;
            let ops = store.list().await.map_err(storage)?;
            render_list(&app, &ops, output);
            Ok(Exit::Ok)
        }
        OpsCmd::Show { id, queue } => {
            let (_, store) = stores(&app, queue.as_deref())?;
            let op = store.get(&id).await.map_err(storage)?;
            let (op, _) = op.ok_or_else(|| Failure::usage(format!("no operation {id}")))?;
            render_one(&app, &op, output);
            Ok(exit_of(&op))
        }
        OpsCmd::Cancel { id, by, queue } => {
            let (_, store) = stores(&app, queue.as_deref())?;
            let op = store.cancel(&id, &by).await.map_err(storage)?;
            render_one(&app, &op.map_err(Failure::usage)?, output);
            Ok(Exit::Ok)
        }
        OpsCmd::Resume {
            id,
            take_over,
            queue,
        } => resume(&app, &id, queue.as_deref(), take_over, output).await,
    }
}

/// A group fix on `ops`'s function with `patch`: refused (exit 2) for a
/// keyless function or a patch that reads a redacted field.
fn fix_checks(ops: &QueueOps, kind: &OpKind) -> Result<(), Failure> {
    let OpKind::Fix { patch, .. } = kind else {
        return Ok(());
    };
    if let Some(why) = operation::fix_refused(ops) {
        return Err(Failure::usage(why));
    }
    let none = aqw_core::redact::Redaction::default();
    let redact = ops.function.as_ref().map_or(&none, |f| &f.redact);
    operation::parse_patch_for(patch, redact)
        .map(|_| ())
        .map_err(|e| Failure::usage(format!("--patch: {e}")))
}

/// The patch of `ops fix`, read and checked (exit 2 naming the flag).
fn patch_text(patch: Option<String>, file: Option<&Path>) -> Result<String, Failure> {
    let (flag, text) = match (patch, file) {
        (Some(p), _) => ("--patch", p),
        (None, Some(f)) => {
            let text = std::fs::read_to_string(f)
                .map_err(|e| Failure::usage(format!("--patch-file {}: {e}", f.display())))?;
            ("--patch-file", text)
        }
        (None, None) => return Err(Failure::usage("give --patch JSON or --patch-file FILE")),
    };
    operation::parse_patch(&text).map_err(|e| Failure::usage(format!("{flag}: {e}")))?;
    Ok(text)
}

fn storage(e: aqw_core::storage::StorageError) -> Failure {
    Failure::runtime(aqw_core::scrub::scrub(&format!("{e:#}")))
}

/// The operation rows of the account of `queue`'s function (default: the
/// first function's queue), with that queue's stores.
fn stores(
    app: &Arc<AppConfig>,
    queue: Option<&str>,
) -> Result<(QueueOps, OperationStore), Failure> {
    let queue = match queue {
        Some(q) => q.to_string(),
        None => app
            .functions
            .first()
            .map(|f| f.queue.clone())
            .ok_or_else(|| Failure::usage("the app has no function"))?,
    };
    let ops = queue_ops(app, &queue)?;
    let store = OperationStore::new(ops.control.table().clone());
    Ok((ops, store))
}

/// This process as an operation's executor.
pub(super) fn executor(take_over: bool) -> ExecuteOptions {
    let owner = format!(
        "cli-{}-{}",
        std::process::id(),
        &uuid::Uuid::new_v4().simple().to_string()[..6]
    );
    ExecuteOptions {
        take_over,
        ..ExecuteOptions::new(owner)
    }
}

/// Select, check the review, create the row, and (unless `--detach`) run it here.
async fn start(
    app: &Arc<AppConfig>,
    a: SelectArgs,
    kind: OpKind,
    output: Output,
) -> Result<Exit, Failure> {
    check_rate(a.rate)?;
    let (ops, store) = stores(app, Some(&a.queue))?;
    fix_checks(&ops, &kind)?;
    let mut now = selection(&a)?;
    now.cutoff = aqw_core::idempotency::fmt_time(aqw_core::clock::now_utc());
    let open = operation::select_open(&ops, &now).await?;
    try_fix(&ops, &open, &kind, a.dry_run, output).await?;
    let ids: Vec<String> = open.into_iter().map(|(r, _)| r.message_id).collect();
    let fingerprint = operation::fingerprint(&ids);
    if a.dry_run {
        return dry_run(&a.queue, &now, &ids, &fingerprint, output);
    }
    if let Some(r) = a.reviewed.as_deref().filter(|r| *r != fingerprint) {
        return Err(Failure::usage(format!(
            "--reviewed {r}: the selection now picks other records ({} with fingerprint {fingerprint}); nothing was created: review again",
            ids.len()
        )));
    }
    let new = NewOperation {
        queue: a.queue.clone(),
        kind,
        by: a.by.clone(),
        selection: now,
        fingerprint,
        selected: ids.len() as u64,
        rate: a.rate,
        halt_after: a.halt_after,
    };
    let exec = executor(false);
    let op = create(&store, &new, (!a.detach).then_some(&exec)).await?;
    if a.detach {
        render_one(app, &op, output);
        return Ok(Exit::Ok);
    }
    if output == Output::Text {
        outln!(
            "operation {} created: {} of {} record(s) at {}/s; cancel with `aqw ops cancel {}`",
            op.id,
            op.kind.name(),
            op.selected,
            op.rate,
            op.id
        );
    }
    let end = operation::execute(&ops, &store, &op.id, &exec).await?;
    let end = end.unwrap_or(op);
    render_one(app, &end, output);
    Ok(exit_of(&end))
}

/// Insert the row: held by `exec` when this process carries it out, else
/// free for the next executor (`--detach`).
async fn create(
    store: &OperationStore,
    new: &NewOperation,
    exec: Option<&ExecuteOptions>,
) -> Result<Operation, Failure> {
    let op = match exec {
        Some(e) => store.create_held(new, &e.owner, e.lease).await,
        None => store.create(new).await,
    };
    op.map_err(storage)
}

fn check_rate(rate: f64) -> Result<(), Failure> {
    if rate.is_finite() && (operation::MIN_RATE..=operation::MAX_RATE).contains(&rate) {
        return Ok(());
    }
    Err(Failure::usage(format!(
        "--rate {rate}: records per second must be between {} and {}",
        operation::MIN_RATE,
        operation::MAX_RATE
    )))
}

fn selection(a: &SelectArgs) -> Result<Selection, Failure> {
    let time = |s: &Option<String>| -> Result<Option<String>, Failure> {
        s.as_deref()
            .map(|t| parse_time(t).map(aqw_core::idempotency::fmt_time))
            .transpose()
    };
    if let Some(re) = &a.error {
        regex::Regex::new(re).map_err(|e| Failure::usage(format!("--error: {e}")))?;
    }
    Ok(Selection {
        function: a.function.clone(),
        error: a.error.clone(),
        since: time(&a.since)?,
        until: time(&a.until)?,
        cutoff: String::new(),
        ..Selection::default()
    })
}

/// A fix's patch tried before anything is created: a dry run previews
/// every record; a real run tries the first, so a patch past a bound is
/// refused (exit 2) before the operation exists.
async fn try_fix(
    ops: &QueueOps,
    open: &[(
        aqw_core::poison::PoisonRecord,
        Option<aqw_core::storage::Etag>,
    )],
    kind: &OpKind,
    dry_run: bool,
    output: Output,
) -> Result<(), Failure> {
    let OpKind::Fix { patch, .. } = kind else {
        return Ok(());
    };
    let tried = if dry_run {
        open.len()
    } else {
        open.len().min(1)
    };
    preview_fix(ops, &open[..tried], patch, output, dry_run).await
}

/// `ops fix --dry-run`: per record, the key the corrected job derives or
/// why the patch leaves it open (`show`, text only: the JSON dry run stays
/// one object). Never the corrected body. A patch past a bound on any
/// record (the payload's growth, the bytes it copies) is refused: exit 2.
async fn preview_fix(
    ops: &QueueOps,
    open: &[(
        aqw_core::poison::PoisonRecord,
        Option<aqw_core::storage::Etag>,
    )],
    patch: &str,
    output: Output,
    show: bool,
) -> Result<(), Failure> {
    let show = show && output == Output::Text;
    let patch = operation::parse_patch(patch).map_err(Failure::usage)?;
    let mut fits = 0;
    for (rec, _) in open {
        match operation::preview_fix(ops, rec, &patch).await {
            Ok(k) => {
                fits += 1;
                if show {
                    outln!("{:<38} fix      -> {k}", rec.message_id);
                }
            }
            Err(operation::PatchError::Refused(why)) => {
                return Err(Failure::usage(format!(
                    "--patch: {why} (on record {}); nothing was created",
                    rec.message_id
                )));
            }
            Err(why) if show => outln!("{:<38} left open: {why}", rec.message_id),
            Err(_) => {}
        }
    }
    if show {
        outln!("the patch fits {fits} of {} record(s)", open.len());
    }
    Ok(())
}

fn dry_run(
    queue: &str,
    sel: &Selection,
    ids: &[String],
    fingerprint: &str,
    output: Output,
) -> Result<Exit, Failure> {
    if output == Output::Json {
        print_json(
            &serde_json::json!({"queue": queue, "selected": ids.len(), "fingerprint": fingerprint, "selection": sel, "ids": ids}),
        );
    } else {
        outln!(
            "dry run: {} open record(s) of {queue}: {}",
            ids.len(),
            sel.describe()
        );
        outln!("fingerprint {fingerprint} (pass --reviewed {fingerprint} to act on exactly these)");
    }
    Ok(Exit::Ok)
}

async fn resume(
    app: &Arc<AppConfig>,
    id: &str,
    queue: Option<&str>,
    take_over: bool,
    output: Output,
) -> Result<Exit, Failure> {
    let (_, store) = stores(app, queue)?;
    let (op, _) = store
        .get(id)
        .await
        .map_err(storage)?
        .ok_or_else(|| Failure::usage(format!("no operation {id}")))?;
    let ops = queue_ops(app, &op.queue)?;
    match operation::execute(&ops, &store, id, &executor(take_over)).await? {
        Some(end) => {
            render_one(app, &end, output);
            Ok(exit_of(&end))
        }
        None => {
            let why = if let OpKind::Unknown { name } = &op.kind {
                format!("operation {id} is of kind {name:?}, which this aqw does not know: a newer aqw carries it out")
            } else if op.state.is_final() {
                format!("operation {id} is already {}", op.state.as_str())
            } else {
                format!(
                    "operation {id} is held by {} until {}",
                    op.lease_owner.as_deref().unwrap_or("?"),
                    op.lease_until.as_deref().unwrap_or("?")
                )
            };
            render_one(app, &op, output);
            Err(Failure::usage(why))
        }
    }
}

/// 1 when it stopped short (halted, cancelled, failed), left records
/// unhandled, or (a fix) left records open the patch did not apply to.
fn exit_of(op: &Operation) -> Exit {
    let short = matches!(
        op.state,
        OpState::Halted | OpState::Cancelled | OpState::Failed
    );
    let left_open = matches!(op.kind, OpKind::Fix { .. }) && op.skipped > 0;
    Exit::needs_a_person_if(short || op.failed > 0 || left_open)
}

/// `op` as a person may see it: a fix's patch through
/// [`aqw_core::redact::patch_for_display`] with the redaction of the function of
/// its queue, values shown (whoever runs the CLI holds the account's keys
/// and may act), except where they write a redacted field; every value
/// masked when this app has no function for its queue, whose rules are
/// then unknown.
fn shown(app: &AppConfig, op: &Operation) -> Operation {
    let mut op = op.clone();
    if let OpKind::Fix { patch, .. } = &mut op.kind {
        let function = app.function_for_queue(&op.queue);
        let none = aqw_core::redact::Redaction::default();
        let redact = function.map_or(&none, |f| &f.redact);
        *patch = aqw_core::redact::patch_for_display(patch, redact, function.is_some());
    }
    op
}

fn render_list(app: &AppConfig, ops: &[Operation], output: Output) {
    if output == Output::Json {
        print_json(&ops.iter().map(|o| shown(app, o)).collect::<Vec<_>>());
        return;
    }
    if ops.is_empty() {
        outln!("no operations");
        return;
    }
    outln!(
        "{:<26} {:<9} {:<7} {:<16} {:>14} BY",
        "ID",
        "STATE",
        "KIND",
        "QUEUE",
        "DONE/SELECTED"
    );
    for op in ops {
        let progress = format!("{}/{}", op.done, op.selected);
        // Why a halted or failed one stopped: what someone must look at.
        let why = match (op.state, &op.stop_reason) {
            (OpState::Halted | OpState::Failed, Some(r)) => {
                format!(" ({})", r.chars().take(100).collect::<String>())
            }
            _ => String::new(),
        };
        outln!(
            "{:<26} {:<9} {:<7} {:<16} {:>14} {}{why}",
            op.id,
            op.state.as_str(),
            op.kind.name(),
            op.queue,
            progress,
            op.by
        );
    }
}

/// What only an operation of its kind has: a discard's reason, a fix's
/// patch (as [`shown`] left it), an unknown kind's name.
fn render_kind(kind: &OpKind) {
    match kind {
        OpKind::Discard { reason, close_key } => outln!(
            "  reason: {reason}{}",
            if *close_key { " (keys closed)" } else { "" }
        ),
        OpKind::Fix { patch, .. } => outln!("  patch: {}", aqw_core::scrub::one_line(patch)),
        OpKind::Unknown { name } => {
            outln!("  kind {name:?} is not known to this aqw: a newer one carries it out")
        }
        OpKind::Replay { .. } => {}
    }
}

fn render_one(app: &AppConfig, op: &Operation, output: Output) {
    let op = &shown(app, op);
    if output == Output::Json {
        print_json(op);
        return;
    }
    outln!(
        "operation {}: {} {} on {}",
        op.id,
        op.state.as_str(),
        op.kind.name(),
        op.queue
    );
    outln!(
        "  by {} at {}; {}",
        op.by,
        op.created_at,
        op.selection.describe()
    );
    render_kind(&op.kind);
    outln!(
        "  selected {} (fingerprint {}), rate {}/s",
        op.selected,
        op.fingerprint,
        op.rate
    );
    outln!(
        "  done {}, skipped {}, failed {}, replayed jobs back in poison {}",
        op.done,
        op.skipped,
        op.failed,
        op.returned_poisoned
    );
    if let Some(r) = &op.stop_reason {
        outln!("  stopped: {r}");
    }
    if op.takeovers > 0 {
        outln!(
            "  taken over from a dead executor {} time(s) since its last checkpoint (halted past {})",
            op.takeovers,
            operation::MAX_TAKEOVERS
        );
    }
    if let Some(e) = &op.last_error {
        outln!("  last error: {e}");
    }
    if let (Some(o), Some(u), false) = (&op.lease_owner, &op.lease_until, op.state.is_final()) {
        outln!("  lease: {o} until {u}");
    }
}
