//! `aqw poison show`: one record, its key's state and history, the
//! provider's answer to an attempt that may have taken effect, its payload.

use crate::cli::exit::{Exit, Failure};
use crate::cli::load::queue_ops;
use crate::cli::output::{key_state_line, print_history, print_json, Output};
use aqw_core::config::AppConfig;
use aqw_core::idempotency::KeyRecord;
use aqw_core::ops::{self, ShowReport};
use aqw_core::poison::PoisonRecord;
use aqw_core::scrub::one_line;
use clap::Args;
use std::sync::Arc;

/// Show one record: error, attempts, key state and decoded payload.
#[derive(Args)]
#[command(
    after_help = "The payload is printed as its exact text, as a fix would start from it.\n\nExamples:\n  aqw poison show receipts 7d0f3c9e-1b7a-4f1e-9d7a-2a1f0c3e4b5d\n  aqw poison show receipts 7d0f3c9e-1b7a-4f1e-9d7a-2a1f0c3e4b5d --pretty"
)]
pub struct ShowArgs {
    /// Source queue of the poisoned message.
    pub queue: String,
    /// The record id: the source message id (as `poison list` shows it).
    pub id: String,
    /// Print a JSON payload indented (the default is its exact text).
    #[arg(long)]
    pub pretty: bool,
}

pub(super) async fn run(
    app: &Arc<AppConfig>,
    a: ShowArgs,
    output: Output,
) -> Result<Exit, Failure> {
    let ShowArgs { queue, id, pretty } = a;
    let mut report = ops::show(&queue_ops(app, &queue)?, &id).await?;
    if let Some(pk) = report.uncertain_provider_key() {
        let lookup = app
            .function_for_queue(&queue)
            .and_then(|f| aqw::handlers::lookup::of(&f.handler));
        report.provider_check = Some(aqw::handlers::lookup::ask(lookup, pk).await.line());
    }
    print_show(&report, pretty, output);
    Ok(Exit::Ok)
}

/// `poison show`.
fn print_show(report: &ShowReport, pretty: bool, output: Output) {
    if output == Output::Json {
        print_json(&report);
        return;
    }
    let r = &report.record;
    outln!(
        "record:        {} ({}, origin {})",
        r.message_id,
        r.status.as_str(),
        r.origin
    );
    outln!("queue:         {} (function {})", r.queue, r.function);
    outln!(
        "error:         [{}] {}",
        r.error.kind.as_str(),
        r.error.message
    );
    outln!("attempts:      dequeued {} time(s)", r.dequeue_count);
    outln!("inserted:      {}", r.inserted_at);
    outln!("first attempt: {}", r.first_attempt_at);
    outln!("poisoned:      {}", r.poisoned_at);
    outln!("key:           {}", r.key.as_deref().unwrap_or("-"));
    match &report.key_record {
        Some(k) => {
            outln!("key state:     {}", key_state_line(k));
            print_history(&k.history, "               ");
        }
        None => outln!("key state:     no record"),
    }
    print_window_and_copy(report);
    print_uncertain(report);
    if let Some(note) = &report.redacted {
        outln!("redacted:      {note}");
    }
    let exact = if report.redacted.is_some() {
        "redacted"
    } else {
        "exact text"
    };
    match (&report.payload, &report.payload_text, &report.decode_error) {
        (Some(v), _, _) if pretty => outln!(
            "payload (indented with --pretty; the exact text is in --output json's payloadText):\n{}",
            serde_json::to_string_pretty(v).unwrap_or_default()
        ),
        (Some(_), Some(t), _) => outln!("payload ({exact}):\n{t}"),
        (None, Some(t), _) => outln!("payload (not JSON):\n{t}"),
        (_, _, Some(e)) => outln!(
            "payload:       undecodable: {e}\nraw text:      {}",
            r.message
        ),
        _ => {}
    }
}

/// Attempts that may have taken effect, and what the provider said of them.
fn print_uncertain(report: &ShowReport) {
    let r = &report.record;
    if r.uncertain_attempts > 0 {
        outln!(
            "uncertain:     {} attempt(s) may have taken effect; the provider key {} keeps a retry from doubling it",
            r.uncertain_attempts,
            report.key_record.as_ref().map_or("-", |k| k.provider_key.as_str())
        );
    }
    if let Some(check) = &report.provider_check {
        outln!("provider says: {check}");
    }
    // Resolved: once the key is done, the uncertainty is answered.
    if let Some(k) = report
        .key_record
        .as_ref()
        .filter(|k| r.uncertain_attempts > 0 && k.status.is_settled())
    {
        let answer = k
            .completed_answer()
            .map(|a| format!(" ({})", a.summary()))
            .unwrap_or_default();
        outln!(
            "resolved:      the key is {}{answer}: the effect happened once",
            k.status.as_str()
        );
    }
}

/// The provider key against its window, how the record was closed, its
/// encoding and its poison copy (id and format).
fn print_window_and_copy(report: &ShowReport) {
    let r = &report.record;
    if let Some(w) = &report.provider_window {
        outln!("provider key:  {}", w.summary());
    }
    print_closing(r, report.replacement_key_record.as_ref());
    outln!(
        "encoding:      {} ({} bytes of message text)",
        r.encoding.as_str(),
        r.message.len()
    );
    outln!(
        "poison copy:   {} ({})",
        r.poison_message_id.as_deref().unwrap_or("-"),
        r.copy_format.as_str()
    );
}

/// How a record was closed: replayed, replaced or discarded, by whom.
fn print_closing(r: &PoisonRecord, replacement: Option<&KeyRecord>) {
    if let Some(by) = &r.past_provider_window_by {
        outln!(
            "past window:   overridden by {by} at {}: {}",
            r.past_provider_window_at.as_deref().unwrap_or("-"),
            r.past_provider_window_note.as_deref().unwrap_or("")
        );
    }
    if let Some(by) = &r.replayed_by {
        outln!(
            "replayed:      {} by {by} as {}",
            r.replayed_at.as_deref().unwrap_or("-"),
            r.replay_message_id.as_deref().unwrap_or("-")
        );
    }
    if let Some(by) = &r.replaced_by {
        outln!(
            "replaced:      {} by {by} with {} (key {}, payload {:+} bytes)",
            r.replaced_at.as_deref().unwrap_or("-"),
            r.replacement_message_id.as_deref().unwrap_or("-"),
            r.replacement_key.as_deref().unwrap_or("-"),
            r.replacement_size_diff.unwrap_or(0)
        );
        outln!(
            "new key:       {}",
            replacement.map_or("not claimed yet".into(), key_state_line)
        );
    }
    if let Some(by) = &r.discarded_by {
        outln!(
            "discarded:     {} by {}: {}",
            r.discarded_at.as_deref().unwrap_or("-"),
            one_line(by),
            one_line(r.discard_reason.as_deref().unwrap_or("-"))
        );
    }
}
