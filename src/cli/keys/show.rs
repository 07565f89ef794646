//! `aqw keys show`: the idempotency record of one key.

use crate::cli::exit::{Exit, Failure};
use crate::cli::load::{connect, function_named, load};
use crate::cli::output::{key_state_line, print_history, print_json, Output};
use aqw_core::idempotency::KeyRecord;
use aqw_core::ops;
use aqw_core::scrub::one_line;
use clap::Args;
use std::path::Path;

/// Show the idempotency record of one key.
#[derive(Args)]
#[command(
    after_help = "Exit codes: 0 shown, 1 the key was never claimed (no record), 2 bad arguments, 3 storage error.\n\nExample:\n  aqw keys show SendReceipt receipt:o-1"
)]
pub struct ShowArgs {
    /// The function the key belongs to.
    pub function: String,
    /// The full key, as `poison list` or `poison show` prints it.
    pub key: String,
}

pub(super) async fn run(app_dir: &Path, a: ShowArgs, output: Output) -> Result<Exit, Failure> {
    let (function, key) = (a.function.as_str(), a.key.as_str());
    let app = load(app_dir)?;
    let f = function_named(&app, function)?;
    let storage = connect(&f.connection)?;
    let rec = ops::key_record(&app, storage.as_ref(), function, key).await?;
    print_record(function, key, rec.as_ref(), output);
    // A key never claimed is worth a look: a typo, or a job not yet run.
    Ok(Exit::needs_a_person_if(rec.is_none()))
}

/// `keys show`.
pub(super) fn print_record(function: &str, key: &str, rec: Option<&KeyRecord>, output: Output) {
    let Some(r) = rec else {
        if output == Output::Json {
            print_json(&serde_json::json!({"key": key, "function": function, "record": null}));
        } else {
            outln!("no record for key {key:?} of {function} (never claimed)");
        }
        return;
    };
    if output == Output::Json {
        print_json(&r);
        return;
    }
    outln!("key:          {}", r.key);
    outln!("function:     {}", r.function);
    outln!("status:       {}", r.status.as_str());
    outln!("providerKey:  {}", r.provider_key);
    outln!("state:        {}", key_state_line(r));
    outln!("messageId:    {}", r.message_id.as_deref().unwrap_or("-"));
    outln!("firstSeen:    {}", r.first_seen.as_deref().unwrap_or("-"));
    outln!("completedAt:  {}", r.completed_at.as_deref().unwrap_or("-"));
    outln!("replayCount:  {}", r.replay_count);
    if let Some(by) = &r.cancelled_by {
        outln!(
            "cancelled:    {} by {}: {} (a delivery of this job is a duplicate)",
            r.cancelled_at.as_deref().unwrap_or("-"),
            one_line(by),
            one_line(r.cancel_reason.as_deref().unwrap_or("-"))
        );
    }
    outln!(
        "lease:        {} until {}",
        r.lease_owner.as_deref().unwrap_or("-"),
        r.lease_until.as_deref().unwrap_or("-")
    );
    outln!("row:          {} / {}", r.partition_key, r.row_key);
    print_history(&r.history, "              ");
}
