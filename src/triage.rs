//! What `aqw triage` and the dashboard's front page read before the
//! engine's pure plan ([`aqw_core::ops::triage::plan`]): the queue's
//! records, the key state of its open records (bounded), the function's
//! control row and breaker evidence, the provider lookup's answers (the CLI
//! asks, the dashboard does not: a page view never calls the provider),
//! and the payloads of a bad producer's records (bounded).

use crate::handlers::lookup::{self, LookupAnswer as Answer};
use aqw_core::ops::triage::{self, FunctionFacts, LookupAnswer, TriageInput, TriagePlan, Verdict};
use aqw_core::ops::{OpsResult, QueueOps};
use aqw_core::poison::{PoisonRecord, RecordStatus};
use std::collections::HashMap;

/// At most this many key states are read (the rest are named in a note).
pub const KEY_READS: usize = 200;
/// At most this many provider keys are asked about.
pub const LOOKUPS: usize = 50;
/// At most this many payloads are decoded to find a misspelt field.
pub const PAYLOADS: usize = 50;
/// A decoded payload longer than this is not kept for the comparison.
pub const PAYLOAD_BYTES: usize = 256 * 1024;
/// At most this many payload bytes are held at once (a claim-checked body
/// may be up to `aqw.claimCheck.maxBytes`; 50 of them would not fit).
pub const PAYLOADS_HELD: usize = 4 * 1024 * 1024;

/// Gather what the plan decides from, then make it. `ask_provider`: ask
/// the function's `handler.lookup` about the provider keys that decide
/// something.
pub async fn gather(ops: &QueueOps, ask_provider: bool) -> OpsResult<TriagePlan> {
    ops.poison.scan(None).await?;
    let records = ops.records().await?;
    let open: Vec<&PoisonRecord> = records
        .iter()
        .filter(|r| r.status == RecordStatus::Open)
        .collect();
    let (keys, keys_unread) = read_keys(ops, &open).await?;
    let facts = function_facts(ops, ask_provider).await?;
    let mut lookups = HashMap::new();
    if facts.lookup_asked {
        let spec = ops.function.as_ref().and_then(|f| lookup::of(&f.handler));
        let wanted = triage::lookups_wanted(&records, &keys, &facts);
        let wanted: Vec<String> = wanted.into_iter().take(LOOKUPS).collect();
        // A few at a time, by join_all per chunk (stream combinators over
        // borrowing closures are not `Send` enough for axum's handlers).
        for chunk in wanted.chunks(8) {
            let asked = chunk.iter().map(|pk| lookup::ask(spec, pk));
            let answers = futures::future::join_all(asked).await;
            lookups.extend(chunk.iter().cloned().zip(answers.iter().map(verdict)));
        }
    }
    let mut payloads = HashMap::new();
    // Collected first: an iterator over borrowed records held across an
    // await is not `Send` enough for axum's handlers.
    let bad: Vec<&PoisonRecord> = open
        .iter()
        .copied()
        .filter(|r| triage::wants_payload(r))
        .take(PAYLOADS)
        .collect();
    let mut held = 0usize;
    for r in bad {
        if let Ok(body) = ops.body_of(r).await {
            // Only a payload's field names are compared: a body past
            // PAYLOAD_BYTES, or past PAYLOADS_HELD in all, is left out
            // (that record gets the skeleton to complete by hand).
            if body.len() > PAYLOAD_BYTES || held + body.len() > PAYLOADS_HELD {
                continue;
            }
            held += body.len();
            payloads.insert(r.message_id.clone(), body);
        }
    }
    Ok(triage::plan(&TriageInput {
        queue: &ops.queue,
        records: &records,
        keys: &keys,
        keys_unread,
        facts: &facts,
        lookups: &lookups,
        payloads: &payloads,
        now: aqw_core::clock::now_utc(),
    }))
}

/// The key records of the open records (at most [`KEY_READS`] distinct
/// keys, read 16 at a time), and how many open records' keys were not read.
async fn read_keys(
    ops: &QueueOps,
    open: &[&PoisonRecord],
) -> OpsResult<(HashMap<String, aqw_core::idempotency::KeyRecord>, usize)> {
    let mut names: Vec<&str> = Vec::new();
    for k in open.iter().filter_map(|r| r.key.as_deref()) {
        if !names.contains(&k) {
            names.push(k);
        }
    }
    let unread_keys: Vec<&str> = names.split_off(names.len().min(KEY_READS));
    let unread = open
        .iter()
        .filter(|r| r.key.as_deref().is_some_and(|k| unread_keys.contains(&k)))
        .count();
    let mut read = Vec::new();
    for chunk in names.chunks(16) {
        let reads = chunk.iter().map(|k| ops.key_named(Some(*k)));
        read.extend(futures::future::join_all(reads).await);
    }
    let mut keys = HashMap::new();
    for r in read {
        if let Some(k) = r? {
            keys.insert(k.key.clone(), k);
        }
    }
    Ok((keys, unread))
}

/// The function's facts: its breaker and pause, the newest success its
/// breaker evidence holds, its lookup, window and declarations.
async fn function_facts(ops: &QueueOps, ask_provider: bool) -> OpsResult<FunctionFacts> {
    let Some(f) = &ops.function else {
        return Ok(FunctionFacts::default());
    };
    let rows = ops.control.all().await?;
    let control = rows.functions.get(&f.name).cloned().unwrap_or_default();
    let last_success = rows
        .evidence
        .iter()
        .filter(|e| e.function == f.name)
        .filter_map(|e| e.last_success_ms)
        .max()
        .and_then(|ms| time::OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000).ok())
        .map(aqw_core::idempotency::fmt_time);
    let has_lookup = lookup::of(&f.handler).is_some();
    // Declared in `handler` (`idempotent`, `savesFailures`); the records
    // and key histories add what the provider showed (the plan's side).
    let (idempotent, saves_failures) = match &f.handler {
        aqw_core::handler::HandlerSpec::Http { answers, .. } => {
            (answers.idempotent, answers.saves_failures)
        }
        _ => (false, false),
    };
    Ok(FunctionFacts {
        function: f.name.clone(),
        breaker: control.breaker,
        pause: control.pause,
        last_success,
        has_lookup,
        lookup_asked: ask_provider && has_lookup,
        idempotent,
        saves_failures,
        provider_key_window: f.provider_key_window,
    })
}

fn verdict(a: &Answer) -> LookupAnswer {
    let verdict = match a {
        Answer::Applied { .. } => Verdict::Applied,
        Answer::NotApplied { .. } => Verdict::NotApplied,
        Answer::Unknown { .. } => Verdict::Unknown,
        Answer::NotAsked => Verdict::NotAsked,
    };
    LookupAnswer {
        verdict,
        line: a.line(),
    }
}
