//! `aqw keys …`: show, list, check (the provider's lookup) and
//! new-provider-key.

use super::exit::{Exit, Failure};
use super::keys_args::{KeyStatusFilter, KeysCmd};
use super::load::{connect, function_named, load, parse_time};
use super::output as render;
use super::output::Output;
use aqw_core::ops;
use std::path::Path;

pub(super) async fn keys_show(
    app_dir: &Path,
    function: &str,
    key: &str,
    output: Output,
) -> Result<Exit, Failure> {
    let app = load(app_dir)?;
    let f = function_named(&app, function)?;
    let storage = connect(&f.connection)?;
    let rec = ops::key_record(&app, storage.as_ref(), function, key).await?;
    render::key_record(function, key, rec.as_ref(), output);
    // A key never claimed is worth a look: a typo, or a job not yet run.
    Ok(Exit::needs_a_person_if(rec.is_none()))
}

/// `keys list`: the function's keys the filters select.
pub(super) async fn keys_list(
    app_dir: &Path,
    cmd: KeysCmd,
    output: Output,
) -> Result<Exit, Failure> {
    let KeysCmd::List {
        function,
        prefix,
        status,
        since,
        until,
        limit,
    } = cmd
    else {
        unreachable!("keys_list is called with keys list only");
    };
    let app = load(app_dir)?;
    let f = function_named(&app, &function)?;
    let query = aqw_core::idempotency::KeyQuery {
        prefix,
        status: status.map(|s| match s {
            KeyStatusFilter::Pending => aqw_core::idempotency::KeyStatus::Pending,
            KeyStatusFilter::Done => aqw_core::idempotency::KeyStatus::Done,
            KeyStatusFilter::Poisoned => aqw_core::idempotency::KeyStatus::Poisoned,
            KeyStatusFilter::Cancelled => aqw_core::idempotency::KeyStatus::Cancelled,
        }),
        since: since.as_deref().map(parse_time).transpose()?,
        until: until.as_deref().map(parse_time).transpose()?,
        limit,
    };
    let storage = connect(&f.connection)?;
    let keys = aqw_core::idempotency::KeyStore::new(aqw_core::storage::Storage::table(
        storage.as_ref(),
        &app.keys_table,
    ));
    let listed = keys
        .list(&function, &query)
        .await
        .map_err(|e| Failure::runtime(format!("{e:#}")))?;
    render::key_list(&listed, output);
    let unsettled = listed.iter().any(|k| {
        matches!(
            k.status,
            aqw_core::idempotency::KeyStatus::Pending | aqw_core::idempotency::KeyStatus::Poisoned
        )
    });
    Ok(Exit::needs_a_person_if(unsettled))
}

/// `keys check`: the key's record, then the provider's answer for its
/// provider key.
pub(super) async fn keys_check(
    app_dir: &Path,
    function: &str,
    key: &str,
    output: Output,
) -> Result<Exit, Failure> {
    let app = load(app_dir)?;
    let f = function_named(&app, function)?;
    let storage = connect(&f.connection)?;
    let Some(rec) = ops::key_record(&app, storage.as_ref(), function, key).await? else {
        render::key_record(function, key, None, output);
        return Ok(Exit::NeedsAPerson);
    };
    let lookup = aqw::handlers::lookup::of(&f.handler);
    let answer = aqw::handlers::lookup::ask(lookup, &rec.provider_key).await;
    render::key_check(&rec, &answer, output);
    Ok(Exit::needs_a_person_if(!matches!(
        answer,
        aqw::handlers::lookup::LookupAnswer::Applied { .. }
            | aqw::handlers::lookup::LookupAnswer::NotApplied { .. }
    )))
}

/// `keys new-provider-key`: a fresh provider key for a key not yet done;
/// with `--dry-run`, what would change, nothing changed.
pub(super) async fn new_provider_key(
    app_dir: &Path,
    cmd: KeysCmd,
    output: Output,
) -> Result<Exit, Failure> {
    let KeysCmd::NewProviderKey {
        function,
        key,
        reason,
        by,
        dry_run,
    } = cmd
    else {
        unreachable!("new_provider_key is called with KeysCmd::NewProviderKey only");
    };
    if reason.trim().is_empty() || by.trim().is_empty() {
        return Err(Failure::usage(
            "give --reason (the provider's confirmation) and --by (or set $USER)",
        ));
    }
    let app = load(app_dir)?;
    let f = function_named(&app, &function)?;
    let key = aqw_core::idempotency::IdempotencyKey::new(key).map_err(Failure::usage)?;
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
        render::print_json(&json);
    } else {
        outln!("{text}");
    }
    Ok(code)
}

type Said = (Exit, serde_json::Value, String);

/// What a replacement did: the new provider key, or why none.
fn replacement(
    key: &aqw_core::idempotency::IdempotencyKey,
    replaced: Result<String, String>,
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
        Err(why) => refused(key, why, false),
    }
}

/// What a replacement would do: the key's state and the provider key it
/// would replace, or why it would be refused.
fn rehearsal(
    key: &aqw_core::idempotency::IdempotencyKey,
    reason: &str,
    by: &str,
    rehearsed: Result<aqw_core::idempotency::KeyRecord, String>,
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
        Err(why) => refused(key, why, true),
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
