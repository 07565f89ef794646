//! One open record's cause and the decision its facts lead to.

use super::{Cause, FunctionFacts, LookupAnswer, RecordFacts, TriageInput, Verdict};
use crate::idempotency::KeyRecord;
use crate::message::ErrorKind;
use crate::ops::ProviderWindow;
use crate::poison::PoisonRecord;
use regex::Regex;
use std::collections::HashMap;
use std::sync::LazyLock;

/// What to do with a record: the decision a group shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Action {
    /// Replay with the original key.
    Replay,
    /// Replay, overriding `providerKeyWindow` (the provider says not applied).
    ReplayPastWindow,
    /// Ask the provider by hand, then replay with `--uncertain-checked`.
    CheckThenReplay,
    /// The provider has the effect and may have forgotten the key: close
    /// record and key.
    DiscardApplied,
    /// The provider says not applied under a key it saved a failure for:
    /// a new provider key, then replay.
    NewKeyThenReplay,
    /// As above, once the provider confirms no effect.
    ConfirmThenNewKey,
    /// Fix the business cause, then replay.
    FixCauseThenReplay,
    /// Close record and key: it must never run.
    DiscardCloseKey,
    /// Correct the payload.
    FixPayload,
    /// The claim-check body is gone: fix with the body, or discard.
    BodyMissing,
    /// The claim-check body or reference is not to be trusted: discard.
    DiscardUntrusted,
}

/// One record, decided.
pub(super) struct Decided {
    pub(super) cause: Cause,
    pub(super) action: Action,
    pub(super) facts: RecordFacts,
}

static STATUS: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?i)\b(?:HTTP|status)\W{0,3}([1-5]\d\d)\b").unwrap());
static GONE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)\b(closed|not found|no such|does not exist|deleted|gone|blocked|deactivated|cancell?ed)\b").unwrap()
});

fn status_of(r: &PoisonRecord) -> Option<u16> {
    STATUS
        .captures(&r.error.message)
        .and_then(|c| c[1].parse().ok())
}

/// The cause of a record from its own columns.
pub(super) fn cause_of(r: &PoisonRecord) -> Cause {
    let text = r.error.message.as_str();
    let status = status_of(r);
    let no_key = text.starts_with("key field ")
        || text.starts_with("payload is not valid JSON")
        || text.starts_with("payload has no idempotencyKey");
    match r.error.kind {
        ErrorKind::ClaimCheckMissing
        | ErrorKind::ClaimCheckCorrupt
        | ErrorKind::ClaimCheckInvalid => Cause::ClaimCheck,
        ErrorKind::ReplayedFailure => Cause::SavedFailure,
        ErrorKind::Decode => Cause::BadProducer,
        ErrorKind::Permanent if no_key || matches!(status, Some(400 | 422)) => Cause::BadProducer,
        ErrorKind::Permanent if matches!(status, Some(404 | 410)) || GONE.is_match(text) => {
            Cause::Closed
        }
        ErrorKind::Permanent => Cause::Refusal,
        _ => Cause::Outage,
    }
}

/// Some attempt of the record's job may have taken effect, and its key is
/// not settled (a done or cancelled key leaves nothing to decide).
pub(super) fn uncertain(r: &PoisonRecord, key: Option<&KeyRecord>) -> bool {
    if key.is_some_and(|k| k.status.is_settled()) {
        return false;
    }
    r.uncertain_attempts > 0
        || key.is_some_and(|k| k.history.iter().any(|a| a.may_have_taken_effect))
}

/// Why aqw knows the provider saves failures under a key (`None`: it does
/// not): declared, a `replayed_failure` record of the queue, or an attempt
/// answered with a saved failure in a key's history.
pub fn saves_failures(
    records: &[PoisonRecord],
    keys: &HashMap<String, KeyRecord>,
    facts: &FunctionFacts,
) -> Option<String> {
    if facts.saves_failures {
        return Some("declared (handler.savesFailures)".into());
    }
    if let Some(r) = records
        .iter()
        .find(|r| r.error.kind == ErrorKind::ReplayedFailure)
    {
        return Some(format!(
            "record {} ({}) is a replayed_failure: the provider answered a replay with the failure it saved",
            r.message_id,
            r.status.as_str()
        ));
    }
    let replayed = |a: &crate::idempotency::Attempt| {
        a.error
            .as_deref()
            .is_some_and(|e| e.contains("(replayed: the provider answered"))
    };
    keys.values()
        .find(|k| k.history.iter().any(replayed))
        .map(|k| format!("key {} was answered with a saved failure", k.key))
}

/// Whether the plan reads the record's payload: a bad producer's, to find
/// the field its error names.
pub fn wants_payload(r: &PoisonRecord) -> bool {
    cause_of(r) == Cause::BadProducer
}

/// The cause and decision of one open record.
pub(super) fn decide(r: &PoisonRecord, input: &TriageInput<'_>, saves: bool) -> Decided {
    let key = r.key.as_deref().and_then(|k| input.keys.get(k));
    let f = input.facts;
    let window = key.and_then(|k| ProviderWindow::of(f.provider_key_window, k, input.now));
    let lookup = key
        .filter(|k| !k.provider_key.is_empty())
        .and_then(|k| input.lookups.get(&k.provider_key))
        .cloned()
        .or_else(|| (!f.lookup_asked || !f.has_lookup).then(|| not_asked(f)));
    let facts = RecordFacts {
        id: r.message_id.clone(),
        key: r.key.as_deref().map(str::to_string),
        key_state: key.map(KeyRecord::state_summary),
        provider_key: key.map(|k| k.provider_key.clone()),
        uncertain: uncertain(r, key),
        lookup: None,
        window: window.as_ref().map(ProviderWindow::summary),
        past_window: window.as_ref().is_some_and(|w| w.past),
    };
    let verdict = lookup.as_ref().map_or(Verdict::NotAsked, |l| l.verdict);
    let cause = cause_of(r);
    let settled = key.is_some_and(|k| k.status.is_settled());
    let (cause, action) = match cause {
        _ if settled => (cause, Action::Replay),
        Cause::Outage => outage(&facts, verdict, f.idempotent),
        Cause::SavedFailure => (cause, saved(verdict)),
        Cause::Refusal if saves => (cause, saved(verdict)),
        Cause::Refusal => (cause, Action::FixCauseThenReplay),
        Cause::Closed => (cause, Action::DiscardCloseKey),
        Cause::BadProducer => (cause, Action::FixPayload),
        Cause::ClaimCheck if r.error.kind == ErrorKind::ClaimCheckMissing => {
            (cause, Action::BodyMissing)
        }
        Cause::ClaimCheck => (cause, Action::DiscardUntrusted),
        Cause::Uncertain => (cause, Action::CheckThenReplay),
    };
    let shows_lookup = facts.uncertain || matches!(cause, Cause::SavedFailure | Cause::Refusal);
    let facts = RecordFacts {
        lookup: lookup.filter(|_| shows_lookup && !settled),
        ..facts
    };
    Decided {
        cause,
        action,
        facts,
    }
}

fn not_asked(f: &FunctionFacts) -> LookupAnswer {
    let line = if f.has_lookup {
        "not asked from here: `aqw triage` on the command line asks the provider"
    } else {
        "not asked: the function has no handler.lookup; check the provider by hand"
    };
    LookupAnswer {
        verdict: Verdict::NotAsked,
        line: line.into(),
    }
}

/// An outage record: replay it, unless an uncertain attempt leaves a
/// question the provider must answer first.
fn outage(facts: &RecordFacts, verdict: Verdict, idempotent: bool) -> (Cause, Action) {
    let past = facts.past_window;
    if !facts.uncertain {
        let action = if past {
            Action::ReplayPastWindow
        } else {
            Action::Replay
        };
        return (Cause::Outage, action);
    }
    match (verdict, past) {
        (Verdict::Applied, true) => (Cause::Uncertain, Action::DiscardApplied),
        (Verdict::NotApplied, true) => (Cause::Uncertain, Action::ReplayPastWindow),
        (Verdict::Applied | Verdict::NotApplied, false) => (Cause::Outage, Action::Replay),
        // A provider that honours Idempotency-Key answers a same-key replay
        // from its store: no question to ask within its window.
        (_, false) if idempotent => (Cause::Outage, Action::Replay),
        _ => (Cause::Uncertain, Action::CheckThenReplay),
    }
}

/// A failure the provider saved under the key: a new provider key once it
/// says "not applied".
fn saved(verdict: Verdict) -> Action {
    match verdict {
        Verdict::NotApplied => Action::NewKeyThenReplay,
        _ => Action::ConfirmThenNewKey,
    }
}
