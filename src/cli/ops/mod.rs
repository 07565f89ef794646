//! `aqw ops …`: durable group operations (issue 40). `ops replay`,
//! `ops discard` and `ops fix` select the open records of a queue, create an operation
//! row for them (who, what, the fingerprint of the ids selected, the
//! rate) and carry it out in this process unless `--detach`; a process
//! that dies leaves it to the next executor (an idle `aqw run`, or `aqw ops
//! resume`) once its lease expires. `list`, `show` and `cancel` work from
//! any process.

mod start;
pub(super) mod store;
mod view;

use crate::cli::exit::{Exit, Failure};
use crate::cli::load::{load, queue_ops};
use crate::cli::output::Output;
use aqw_core::config::AppConfig;
use aqw_core::ops::operation::{self as operation, OpKind};
use clap::Subcommand;
use start::{patch_text, start, SelectArgs};
use std::path::Path;
use std::sync::Arc;
use store::{executor, storage, stores};
use view::{exit_of, render_list, render_one};

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

pub(super) async fn run(app_dir: &Path, cmd: OpsCmd, output: Output) -> Result<Exit, Failure> {
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
            let op = op.map_err(|e| Failure::usage(e.to_string()))?;
            render_one(&app, &op, output);
            Ok(Exit::Ok)
        }
        OpsCmd::Resume {
            id,
            take_over,
            queue,
        } => resume(&app, &id, queue.as_deref(), take_over, output).await,
    }
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
