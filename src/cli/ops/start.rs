//! `ops replay`, `ops discard` and `ops fix`: the selection, its review
//! (fingerprint, dry run, a fix's patch tried first), the operation row
//! created, and (unless `--detach`) carried out here.

use super::store::{executor, storage, stores};
use super::view::{exit_of, render_one};
use crate::cli::exit::{Exit, Failure};
use crate::cli::load::parse_time;
use crate::cli::output::{print_json, Output};
use aqw_core::config::AppConfig;
use aqw_core::ops::operation::{
    self as operation, ExecuteOptions, NewOperation, OpKind, Operation, OperationStore, Selection,
};
use aqw_core::ops::QueueOps;
use clap::Args;
use std::path::Path;
use std::sync::Arc;

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
pub(super) fn patch_text(patch: Option<String>, file: Option<&Path>) -> Result<String, Failure> {
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

/// Select, check the review, create the row, and (unless `--detach`) run it here.
pub(super) async fn start(
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
    let patch = operation::parse_patch(patch).map_err(|e| Failure::usage(e.to_string()))?;
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
