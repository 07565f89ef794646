//! `aqw poison fix`: a corrected payload in place of a poisoned one, or
//! with `--dry-run` the rehearsal (derived key, its state, refusal, diff).

use crate::cli::exit::{Exit, Failure};
use crate::cli::load::{parse_wait, queue_ops, read_payload};
use crate::cli::output::{print_json, Output};
use aqw_core::config::AppConfig;
use aqw_core::ops::{self, FixAction, FixRehearsal, FixReport};
use clap::Args;
use std::path::PathBuf;
use std::sync::Arc;

/// Put a corrected payload in place of a poisoned one (a bad producer's
/// message), closing the old record as replaced.
#[derive(Args)]
#[command(
    after_help = "The corrected payload must derive a key; a key already done is reported and nothing is put.\nRehearse first: --dry-run shows the derived key, its state, whether fix would refuse, and the diff.\n\nExamples (rename the misspelt field \"acount\" in the record's exact text):\n  aqw poison show credits ID --output json | jq -j .payloadText | sed 's/\"acount\":/\"account\":/' > fixed.json\n  aqw poison fix credits --id ID --file fixed.json --dry-run\n  aqw poison fix credits --id ID --file fixed.json --wait 00:01:00"
)]
pub struct FixArgs {
    /// Source queue of the poisoned message.
    pub queue: String,
    /// The record to replace.
    #[arg(long)]
    pub id: String,
    /// The corrected payload as text.
    #[arg(long, conflicts_with = "file")]
    pub payload: Option<String>,
    /// Read the corrected payload from a file.
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// `-` reads the corrected payload from standard input.
    #[arg(value_name = "-")]
    pub stdin: Option<String>,
    /// Who is doing it, kept on the record (default: $USER; needed).
    #[arg(long, env = "USER")]
    pub by: String,
    /// Wait (hh:mm:ss) until the corrected job's key is done.
    #[arg(long)]
    pub wait: Option<String>,
    /// Go ahead although the provider key is older than the function's
    /// providerKeyWindow (the provider may have forgotten it); kept on the record.
    #[arg(long)]
    pub past_provider_window: bool,
    /// Show the derived key, its state, whether fix would refuse, and
    /// the payload's diff; change nothing.
    #[arg(long, conflicts_with = "wait")]
    pub dry_run: bool,
}

pub(super) async fn run(app: &Arc<AppConfig>, a: FixArgs, output: Output) -> Result<Exit, Failure> {
    let FixArgs {
        queue,
        id,
        payload,
        file,
        stdin,
        by,
        wait,
        past_provider_window,
        dry_run,
    } = a;
    if by.trim().is_empty() {
        return Err(Failure::usage("--by must not be empty"));
    }
    let payload = read_payload(payload, file, stdin.as_deref())?;
    let wait = parse_wait(wait.as_deref())?;
    let ops = queue_ops(app, &queue)?;
    if dry_run {
        let rehearsal = ops::rehearse_fix(&ops, &id, &payload).await?;
        print_rehearsal(&rehearsal, output);
        return Ok(Exit::needs_a_person_if(rehearsal.refusal.is_some()));
    }
    let report = ops::fix(&ops, &id, &payload, &by, wait, past_provider_window).await?;
    print_fix(&id, &by, &report, output);
    let ok = report.action == FixAction::Replaced && report.confirmed != Some(false);
    Ok(Exit::needs_a_person_if(!ok))
}

/// `poison fix`.
fn print_fix(id: &str, by: &str, report: &FixReport, output: Output) {
    if output == Output::Json {
        print_json(&report);
        return;
    }
    match report.action {
        FixAction::Replaced => outln!(
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
        _ => outln!(
            "{id}: {}: {}",
            report.action.as_str(),
            report.detail.as_deref().unwrap_or("-")
        ),
    }
}

/// `poison fix --dry-run`.
fn print_rehearsal(r: &FixRehearsal, output: Output) {
    if output == Output::Json {
        print_json(&r);
        return;
    }
    outln!("dry run: poison fix {} (nothing changed)", r.id);
    outln!("old key:   {}", r.old_key.as_deref().unwrap_or("-"));
    outln!("new key:   {}", r.new_key.as_deref().unwrap_or("-"));
    outln!("key state: {}", r.key_state.as_deref().unwrap_or("-"));
    match &r.refusal {
        Some(why) => outln!("would:     refuse: {why}"),
        None => outln!("would:     put the corrected message and close the record as replaced"),
    }
    outln!("payload:   {:+} bytes", r.size_diff);
    for line in &r.diff {
        outln!("  {line}");
    }
}
