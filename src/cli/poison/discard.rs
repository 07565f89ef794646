//! `aqw poison discard`: close a record without replaying it (and, with
//! `--close-key`, its key), or with `--dry-run` say what would happen.

use super::list::Listed;
use crate::cli::exit::{Exit, Failure};
use crate::cli::load::queue_ops;
use crate::cli::output::{print_json, Output};
use aqw_core::config::AppConfig;
use aqw_core::ops::{self, DiscardRehearsal};
use aqw_core::poison::PoisonRecord;
use clap::Args;
use std::sync::Arc;

/// Close a record without replaying it.
#[derive(Args)]
#[command(
    after_help = "A job that must never run (a closed account): close its key too (--close-key), so a\nproducer's resend is settled as a duplicate. Without it the key stays poisoned and a resend runs.\n\nExamples:\n  aqw poison discard credits --id ID --reason 'account closed, must never run' --close-key --dry-run\n  aqw poison discard credits --id ID --reason 'account closed, must never run' --close-key"
)]
pub struct DiscardArgs {
    /// Source queue of the poisoned message.
    pub queue: String,
    /// The record to close.
    #[arg(long)]
    pub id: String,
    /// Why it must not run, kept on the record.
    #[arg(long)]
    pub reason: String,
    /// Who is doing it, kept on the record (default: $USER; needed).
    #[arg(long, env = "USER")]
    pub by: String,
    /// Also close the job's key (status cancelled): a later delivery of
    /// the same job is settled as a duplicate without running.
    #[arg(long)]
    pub close_key: bool,
    /// Show the record's key, its state and whether the discard would be
    /// refused; change nothing.
    #[arg(long)]
    pub dry_run: bool,
}

pub(super) async fn run(
    app: &Arc<AppConfig>,
    a: DiscardArgs,
    output: Output,
) -> Result<Exit, Failure> {
    let DiscardArgs {
        queue,
        id,
        reason,
        by,
        close_key,
        dry_run,
    } = a;
    if reason.trim().is_empty() || by.trim().is_empty() {
        return Err(Failure::usage("--reason and --by must not be empty"));
    }
    let ops = queue_ops(app, &queue)?;
    if dry_run {
        let rehearsal = ops::rehearse_discard(&ops, &id, close_key).await?;
        print_rehearsal(&rehearsal, output);
        return Ok(Exit::needs_a_person_if(rehearsal.refusal.is_some()));
    }
    let mut rec = ops::discard(&ops, &id, &reason, &by, close_key).await?;
    let redaction = super::list::redaction(app, &ops, &rec);
    let note = ops::mask_message(&mut rec, redaction);
    print_discard(
        &id,
        &reason,
        &by,
        close_key,
        (&rec, note.as_deref()),
        output,
    );
    Ok(Exit::Ok)
}

/// `poison discard`.
fn print_discard(
    id: &str,
    reason: &str,
    by: &str,
    close_key: bool,
    (rec, redacted): (&PoisonRecord, Option<&str>),
    output: Output,
) {
    if output == Output::Json {
        print_json(&Listed {
            record: rec,
            redacted,
        });
        return;
    }
    let key_note = match (close_key, rec.key.as_deref()) {
        (true, Some(k)) => format!("; key {k} closed: a resend is a duplicate"),
        (false, Some(k)) => format!("; key {k} left poisoned: a resend runs"),
        _ => String::new(),
    };
    outln!("discarded {id} ({reason}, by {by}){key_note}");
}

/// `poison discard --dry-run`.
fn print_rehearsal(r: &DiscardRehearsal, output: Output) {
    if output == Output::Json {
        print_json(&r);
        return;
    }
    outln!("dry run: poison discard {} (nothing changed)", r.id);
    outln!("key:       {}", r.key.as_deref().unwrap_or("-"));
    outln!("key state: {}", r.key_state.as_deref().unwrap_or("-"));
    let what = match (&r.refusal, r.close_key) {
        (Some(why), _) => format!("refuse: {why}"),
        (None, true) => "close the record and the key (a resend is a duplicate)".into(),
        (None, false) => "close the record; the key stays poisoned (a resend runs)".into(),
    };
    outln!("would:     {what}");
}
