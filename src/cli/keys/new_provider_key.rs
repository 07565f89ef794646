//! `aqw keys new-provider-key`: a fresh provider key for a key not yet
//! done (a provider that replays a saved failure under the old one); with
//! `--dry-run`, what would change.

use crate::cli::exit::{Exit, Failure};
use crate::cli::load::{connect, function_named, load};
use crate::cli::output::{print_json, Output};
use clap::Args;
use std::path::Path;

/// Give a key a new provider key, for a provider that replays a saved
/// failure under the old one (replayed_failure). Only once the provider
/// confirms the old key took no effect: a retry under a new key is a new
/// request to it. Kept in the key's history with who and why.
#[derive(Args)]
#[command(
    after_help = "Exit codes: 0 replaced (or, with --dry-run, would be), 1 refused (never claimed, done, or held by a running attempt), 2 bad arguments, 3 storage error.\n\nExamples:\n  aqw keys new-provider-key SendReceipt receipt:o-1 --reason \"ledger support: no charge\" --dry-run\n  aqw keys new-provider-key SendReceipt receipt:o-1 --reason \"ledger support: no charge under the old key (ticket 4411)\""
)]
pub struct NewProviderKeyArgs {
    /// The function the key belongs to.
    pub function: String,
    /// The full key.
    pub key: String,
    /// Why, with the provider's confirmation (kept in the history).
    #[arg(long)]
    pub reason: String,
    /// Who is doing it (default: $USER; needed).
    #[arg(long, env = "USER")]
    pub by: String,
    /// Show what would change (the key, its state, the provider key
    /// that would be replaced); change nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// `keys new-provider-key`: a fresh provider key for a key not yet done;
/// with `--dry-run`, what would change, nothing changed.
pub(super) async fn run(
    app_dir: &Path,
    a: NewProviderKeyArgs,
    output: Output,
) -> Result<Exit, Failure> {
    let NewProviderKeyArgs {
        function,
        key,
        reason,
        by,
        dry_run,
    } = a;
    if reason.trim().is_empty() || by.trim().is_empty() {
        return Err(Failure::usage(
            "give --reason (the provider's confirmation) and --by (or set $USER)",
        ));
    }
    let app = load(app_dir)?;
    let f = function_named(&app, &function)?;
    let key = aqw_core::idempotency::IdempotencyKey::new(key)
        .map_err(|e| Failure::usage(e.to_string()))?;
    let storage = connect(&f.connection)?;
    let keys = aqw_core::idempotency::KeyStore::new(aqw_core::storage::Storage::table(
        storage.as_ref(),
        &app.keys_table,
    ));
    let (code, json, text) = if dry_run {
        let rehearsed = keys
            .rehearse_provider_key(&function, &key)
            .await
            .map_err(|e| Failure::runtime(format!("{e:#}")))?;
        rehearsal(&key, &reason, &by, rehearsed)
    } else {
        let replaced = keys
            .replace_provider_key(&function, &key, &by, &reason)
            .await
            .map_err(|e| Failure::runtime(format!("{e:#}")))?;
        replacement(&key, replaced)
    };
    if output == Output::Json {
        print_json(&json);
    } else {
        outln!("{text}");
    }
    Ok(code)
}

type Said = (Exit, serde_json::Value, String);

/// What a replacement did: the new provider key, or why none.
fn replacement(
    key: &aqw_core::idempotency::IdempotencyKey,
    replaced: Result<String, aqw_core::idempotency::KeyRefusal>,
) -> Said {
    match replaced {
        Ok(new) => (
            Exit::Ok,
            serde_json::json!({"key": key.as_str(), "replaced": true, "providerKey": new}),
            format!(
                "key {}: new provider key {new}; replay its record to run it under the new key",
                key.as_str()
            ),
        ),
        Err(why) => refused(key, why.to_string(), false),
    }
}

/// What a replacement would do: the key's state and the provider key it
/// would replace, or why it would be refused.
fn rehearsal(
    key: &aqw_core::idempotency::IdempotencyKey,
    reason: &str,
    by: &str,
    rehearsed: Result<aqw_core::idempotency::KeyRecord, aqw_core::idempotency::KeyRefusal>,
) -> Said {
    match rehearsed {
        Ok(rec) => (
            Exit::Ok,
            serde_json::json!({"key": key.as_str(), "dryRun": true, "wouldReplace": true, "replaced": false,
                "providerKey": rec.provider_key, "keyState": rec.state_summary(),
                "by": by, "reason": reason}),
            format!(
                "dry run: key {} ({}): provider key {} would be replaced by a new one, \
                 kept in its history with by {by} and reason {reason:?}; nothing changed. \
                 A new provider key is a new request to the provider: only where it confirms \
                 no effect under the old one (aqw keys check)",
                key.as_str(),
                rec.state_summary(),
                rec.provider_key
            ),
        ),
        Err(why) => refused(key, why.to_string(), true),
    }
}

fn refused(key: &aqw_core::idempotency::IdempotencyKey, why: String, dry_run: bool) -> Said {
    let mut json = serde_json::json!({"key": key.as_str(), "replaced": false, "why": why});
    if dry_run {
        json["dryRun"] = serde_json::json!(true);
        json["wouldReplace"] = serde_json::json!(false);
    }
    let text = if dry_run {
        format!("dry run: would not be replaced: {why}")
    } else {
        format!("not replaced: {why}")
    };
    (Exit::NeedsAPerson, json, text)
}
