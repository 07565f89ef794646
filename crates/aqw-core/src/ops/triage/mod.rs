//! `aqw triage QUEUE` (and the dashboard's front page): a queue's open
//! poison records grouped by cause, most urgent first, each group with what
//! aqw knows, what it means in one line, and the exact next commands with
//! the ids filled in.
//!
//! [`plan`] is a pure function over the queue's records, the key states
//! read for them, the function's facts and the provider lookup's answers:
//! the binary gathers those (reads, lookups) and renders the [`TriagePlan`].
//! [`lookups_wanted`] says which provider keys are worth asking about
//! before the plan is made.

mod classify;
mod steps;
#[cfg(test)]
mod tests;

use crate::idempotency::KeyRecord;
use crate::poison::{PoisonRecord, RecordStatus};
use std::collections::HashMap;
use std::time::Duration;
use time::OffsetDateTime;

pub use classify::{saves_failures, wants_payload};

/// Why records are open, in the order a person should act on them: the
/// kinds of the on-call runbook (`aqw oncall KIND`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Cause {
    /// The provider failed or did not answer (5xx, timeouts, crashes): the
    /// jobs pass once it is back.
    Outage,
    /// The producer sent a payload aqw or the provider cannot use: more
    /// messages fail the same way until the producer is fixed.
    BadProducer,
    /// An attempt may have taken effect and the provider's answer decides
    /// between replaying and closing.
    Uncertain,
    /// The provider answers the job's key with a failure it saved.
    SavedFailure,
    /// A business refusal that may pass once its cause is fixed.
    Refusal,
    /// The job's claim-check body is gone, altered, or its reference is bad.
    ClaimCheck,
    /// A refusal that will not change (a closed account): the job must never run.
    Closed,
}

impl Cause {
    /// Every cause, most urgent first.
    pub const ALL: [Cause; 7] = [
        Cause::Outage,
        Cause::BadProducer,
        Cause::Uncertain,
        Cause::SavedFailure,
        Cause::Refusal,
        Cause::ClaimCheck,
        Cause::Closed,
    ];

    /// The runbook kind: `aqw oncall SLUG` prints its page.
    pub const fn slug(self) -> &'static str {
        match self {
            Cause::Outage => "outage",
            Cause::BadProducer => "bad-producer",
            Cause::Uncertain => "uncertain",
            Cause::SavedFailure => "saved-failure",
            Cause::Refusal => "refusal",
            Cause::ClaimCheck => "claim-check",
            Cause::Closed => "closed",
        }
    }
}

/// What the provider lookup (`handler.lookup`) said of one provider key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// The provider has the effect under this key.
    Applied,
    /// The provider has no effect under this key.
    NotApplied,
    /// The provider could not tell, or could not be asked.
    Unknown,
    /// No lookup is configured, or it was not asked from here.
    NotAsked,
}

/// A lookup's answer: its verdict and the line an operator reads.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LookupAnswer {
    /// What it means for the decision.
    pub verdict: Verdict,
    /// The answer in one line (`not applied (the provider answered HTTP 404)`).
    pub line: String,
}

/// What aqw knows of the queue's function beyond its records.
#[derive(Debug, Clone, Default)]
pub struct FunctionFacts {
    /// The function's name.
    pub function: String,
    /// The published breaker: state, since when, why (`None`: none published).
    pub breaker: Option<crate::control::PublishedBreaker>,
    /// The operator's pause, if any.
    pub pause: Option<crate::control::Pause>,
    /// The newest success the breaker's evidence rows hold (RFC 3339).
    pub last_success: Option<String>,
    /// The function has a `handler.lookup`.
    pub has_lookup: bool,
    /// The lookup was asked for this plan (the CLI asks, the dashboard does not).
    pub lookup_asked: bool,
    /// `handler.idempotent`: a same-key replay cannot double the effect.
    pub idempotent: bool,
    /// `handler.savesFailures`: the provider replays a failure it saved.
    pub saves_failures: bool,
    /// `providerKeyWindow`.
    pub provider_key_window: Option<Duration>,
}

/// Everything [`plan`] decides from.
pub struct TriageInput<'a> {
    /// The source queue.
    pub queue: &'a str,
    /// The queue's records, open and closed (closed ones tell what the
    /// provider did before).
    pub records: &'a [PoisonRecord],
    /// Key records read for open records, by business key.
    pub keys: &'a HashMap<String, KeyRecord>,
    /// Open records whose key state was not read (over the read budget).
    pub keys_unread: usize,
    /// The function's facts.
    pub facts: &'a FunctionFacts,
    /// The lookup's answers, by provider key.
    pub lookups: &'a HashMap<String, LookupAnswer>,
    /// Decoded payloads of the records [`wants_payload`] picks, by record id.
    pub payloads: &'a HashMap<String, String>,
    /// Now.
    pub now: OffsetDateTime,
}

/// One step of a group's plan.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    /// What kind of step it is.
    pub kind: StepKind,
    /// The command (`run`, `edit`) or the action (`do`).
    pub text: String,
    /// Why, in a few words.
    pub why: String,
}

/// Whether a step is a command to run as printed, one to complete first, or
/// something a person does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StepKind {
    /// Run as printed.
    Run,
    /// A command with a CAPITALISED placeholder to fill in first.
    Edit,
    /// Something a person does (ask the provider, fix the cause).
    Do,
}

/// One open record's facts in a group, where they decide something.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordFacts {
    /// The record id.
    pub id: String,
    /// Its key, if any.
    pub key: Option<String>,
    /// Its key's state (`poisoned after 5 attempt(s)`), if read.
    pub key_state: Option<String>,
    /// The provider key, if the key was read.
    pub provider_key: Option<String>,
    /// An attempt may have taken effect.
    pub uncertain: bool,
    /// The lookup's answer, where asked.
    pub lookup: Option<LookupAnswer>,
    /// The provider key against `providerKeyWindow`, where set.
    pub window: Option<String>,
    /// The provider key is past `providerKeyWindow`.
    pub past_window: bool,
}

/// Records of one cause and one decision.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TriageGroup {
    /// The cause.
    pub cause: Cause,
    /// `aqw oncall KIND`, the runbook page of the cause.
    pub runbook: String,
    /// The records' error kind.
    pub error_kind: String,
    /// The HTTP status in the error, if any.
    pub status: Option<u16>,
    /// The first record's error (first line, scrubbed).
    pub error: String,
    /// The error with what varies masked (the alert's grouping).
    pub(crate) error_group: String,
    /// How many open records.
    pub count: usize,
    /// Every record id, oldest first.
    pub ids: Vec<String>,
    /// Distinct keys, in the same order.
    pub keys: Vec<String>,
    /// The facts of each record (uncertain attempts, lookups, windows).
    pub records: Vec<RecordFacts>,
    /// What it means, in one line.
    pub meaning: String,
    /// The next steps, in order.
    pub steps: Vec<Step>,
}

/// Whether the provider answers again, and why aqw thinks so.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderState {
    /// `yes`, `no` or `unknown`.
    pub answering: &'static str,
    /// The evidence, in one line.
    pub why: String,
    /// The published breaker state (`closed`, `open since …: why`, or `none published`).
    pub breaker: String,
    /// The operator's pause, if any (`paused by … : why`).
    pub paused: Option<String>,
    /// The newest success the breaker evidence holds (RFC 3339).
    pub last_success: Option<String>,
    /// Why aqw knows the provider saves failures (`None`: not known to).
    pub saves_failures: Option<String>,
    /// `handler.idempotent` is declared.
    pub idempotent: bool,
    /// The function has a `handler.lookup`.
    pub lookup: bool,
    /// `providerKeyWindow`, as a timespan.
    pub provider_key_window: Option<String>,
}

/// A queue's triage.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TriagePlan {
    /// The source queue.
    pub queue: String,
    /// Its function.
    pub function: String,
    /// Open records.
    pub open: usize,
    /// The provider's state.
    pub provider: ProviderState,
    /// The groups, most urgent first.
    pub groups: Vec<TriageGroup>,
    /// What the plan could not see (key states over the read budget, …).
    pub notes: Vec<String>,
    /// How to confirm the end state once every group is done.
    pub confirm: Vec<Step>,
}

/// The provider keys worth asking the lookup about: open records whose key
/// is not settled and whose decision turns on whether the provider has the
/// effect (an uncertain attempt, or a failure the provider saves).
pub fn lookups_wanted(
    records: &[PoisonRecord],
    keys: &HashMap<String, KeyRecord>,
    facts: &FunctionFacts,
) -> Vec<String> {
    let saves = saves_failures(records, keys, facts).is_some();
    let mut out: Vec<String> = Vec::new();
    for r in records.iter().filter(|r| r.status == RecordStatus::Open) {
        let Some(k) = r.key.as_deref().and_then(|k| keys.get(k)) else {
            continue;
        };
        let cause = classify::cause_of(r);
        let wanted = !k.status.is_settled()
            && (classify::uncertain(r, Some(k))
                || cause == Cause::SavedFailure
                || (saves && cause == Cause::Refusal));
        if wanted && !k.provider_key.is_empty() && !out.contains(&k.provider_key) {
            out.push(k.provider_key.clone());
        }
    }
    out
}

/// The triage of one queue: its open records grouped by cause and decision,
/// most urgent first, each with its facts, meaning and next commands.
pub fn plan(input: &TriageInput<'_>) -> TriagePlan {
    let saves = saves_failures(input.records, input.keys, input.facts);
    let mut open: Vec<&PoisonRecord> = input
        .records
        .iter()
        .filter(|r| r.status == RecordStatus::Open)
        .collect();
    open.sort_by(|a, b| {
        (a.poisoned_at.as_str(), a.message_id.as_str())
            .cmp(&(b.poisoned_at.as_str(), b.message_id.as_str()))
    });
    let decided: Vec<classify::Decided> = open
        .iter()
        .map(|r| classify::decide(r, input, saves.is_some()))
        .collect();
    let provider = provider_state(input, &open, saves);
    let mut groups = steps::groups(input, &open, &decided, &provider);
    groups.sort_by(|a, b| {
        let uncertain = |g: &TriageGroup| !g.records.iter().any(|r| r.uncertain);
        (a.cause, uncertain(a), std::cmp::Reverse(a.count)).cmp(&(
            b.cause,
            uncertain(b),
            std::cmp::Reverse(b.count),
        ))
    });
    let mut notes = Vec::new();
    if input.keys_unread > 0 {
        notes.push(format!(
            "{} record(s)' key state not read (over the read budget): `aqw poison show {} ID` shows one",
            input.keys_unread, input.queue
        ));
    }
    if input.facts.provider_key_window.is_none() {
        notes.push("the function sets no providerKeyWindow: aqw cannot tell whether the provider still remembers a key; ask it (its docs say how long it keeps keys) before replaying a record older than that".into());
    }
    TriagePlan {
        queue: input.queue.to_string(),
        function: input.facts.function.clone(),
        open: open.len(),
        provider,
        confirm: steps::confirm(input.queue, &open),
        groups,
        notes,
    }
}

/// Whether the provider answers again: the breaker, the newest success
/// after the newest record, the lookup's answers.
fn provider_state(
    input: &TriageInput<'_>,
    open: &[&PoisonRecord],
    saves: Option<String>,
) -> ProviderState {
    let f = input.facts;
    let breaker = match &f.breaker {
        None => "none published".to_string(),
        Some(b) if b.state == "closed" => format!("closed (since {})", b.at),
        Some(b) => format!("{} since {}: {}", b.state, b.at, b.reason),
    };
    let newest = open.iter().map(|r| r.poisoned_at.as_str()).max();
    let success_after = match (&f.last_success, newest) {
        (Some(s), Some(n)) => s.as_str() > n,
        _ => false,
    };
    let answered = input
        .lookups
        .values()
        .any(|a| matches!(a.verdict, Verdict::Applied | Verdict::NotApplied));
    let (answering, why) = if f.breaker.as_ref().is_some_and(|b| b.state != "closed") {
        ("no", format!("the breaker is {breaker}"))
    } else if success_after {
        let at = f.last_success.as_deref().unwrap_or_default();
        (
            "yes",
            format!("a job succeeded at {at}, after the newest open record"),
        )
    } else if answered {
        (
            "yes",
            "its lookup answers: a probe of the provider, not of the job's endpoint".to_string(),
        )
    } else {
        (
            "unknown",
            "no success seen since the newest open record; the first replay is the probe"
                .to_string(),
        )
    };
    ProviderState {
        answering,
        why,
        breaker,
        paused: f
            .pause
            .as_ref()
            .map(|p| format!("paused by {} at {}: {}", p.by, p.at, p.reason)),
        last_success: f.last_success.clone(),
        saves_failures: saves,
        idempotent: f.idempotent,
        lookup: f.has_lookup,
        provider_key_window: f.provider_key_window.map(crate::span::fmt_span),
    }
}
