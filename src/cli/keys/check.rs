//! `aqw keys check`: ask the provider (the function's `handler.lookup`)
//! whether a key's provider key took effect.

use crate::cli::exit::{Exit, Failure};
use crate::cli::load::{connect, function_named, load};
use crate::cli::output::{print_json, Output};
use aqw_core::idempotency::KeyRecord;
use aqw_core::ops;
use clap::Args;
use std::path::Path;

/// Ask the provider (the function's handler.lookup) whether the key's
/// provider key took effect: applied, not applied or unknown.
#[derive(Args)]
#[command(
    after_help = "Exit codes: 0 the provider answered (applied or not applied), 1 unknown, not asked (no handler.lookup) or the key was never claimed, 2 bad arguments, 3 storage error.\n\nExample:\n  aqw keys check SendReceipt receipt:o-1"
)]
pub struct CheckArgs {
    /// The function the key belongs to.
    pub function: String,
    /// The full key, as `poison list` or `poison show` prints it.
    pub key: String,
}

/// `keys check`: the key's record, then the provider's answer for its
/// provider key.
pub(super) async fn run(app_dir: &Path, a: CheckArgs, output: Output) -> Result<Exit, Failure> {
    let (function, key) = (a.function.as_str(), a.key.as_str());
    let app = load(app_dir)?;
    let f = function_named(&app, function)?;
    let storage = connect(&f.connection)?;
    let Some(rec) = ops::key_record(&app, storage.as_ref(), function, key).await? else {
        super::show::print_record(function, key, None, output);
        return Ok(Exit::NeedsAPerson);
    };
    let lookup = aqw::handlers::lookup::of(&f.handler);
    let answer = aqw::handlers::lookup::ask(lookup, &rec.provider_key).await;
    print_check(&rec, &answer, output);
    Ok(Exit::needs_a_person_if(!matches!(
        answer,
        aqw::handlers::lookup::LookupAnswer::Applied { .. }
            | aqw::handlers::lookup::LookupAnswer::NotApplied { .. }
    )))
}

/// `keys check`: the key, its provider key, and the provider's answer.
fn print_check(rec: &KeyRecord, answer: &aqw::handlers::lookup::LookupAnswer, output: Output) {
    let uncertain = rec
        .history
        .iter()
        .filter(|a| a.may_have_taken_effect)
        .count();
    if output == Output::Json {
        print_json(&serde_json::json!({
            "key": rec.key,
            "function": rec.function,
            "status": rec.status.as_str(),
            "providerKey": rec.provider_key,
            "uncertainAttempts": uncertain,
            "provider": answer,
        }));
        return;
    }
    outln!("key:          {}", rec.key);
    outln!("status:       {}", rec.status.as_str());
    outln!("providerKey:  {}", rec.provider_key);
    outln!("uncertain:    {uncertain} attempt(s) may have taken effect");
    outln!("provider:     {}", answer.line());
}
