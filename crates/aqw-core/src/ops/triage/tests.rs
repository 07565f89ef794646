//! The triage plan, kind by kind: each cause and decision gives its commands.

use super::steps::{exact_regex, sh};
use super::*;
use crate::idempotency::{Attempt, IdempotencyKey, KeyStatus};
use crate::message::{ErrorInfo, ErrorKind, MessageEncoding};
use crate::poison::envelope::{PoisonEnvelope, ENVELOPE_VERSION};

const Q: &str = "payouts";

fn rec(id: &str, kind: ErrorKind, error: &str, key: Option<&str>, at: u32) -> PoisonRecord {
    PoisonRecord::open(
        PoisonEnvelope {
            aqw: ENVELOPE_VERSION.into(),
            queue: Q.into(),
            function: "Payout".into(),
            message_id: id.into(),
            inserted_at: "2026-12-07T06:00:00Z".into(),
            dequeue_count: 5,
            first_attempt_at: "2026-12-07T06:00:00Z".into(),
            poisoned_at: format!("2026-12-07T06:00:{at:02}Z"),
            key: key.map(|k| IdempotencyKey::new(k).unwrap()),
            error: ErrorInfo {
                kind,
                message: error.into(),
            },
            message: Some(String::new()),
            record: None,
            encoding: MessageEncoding::None,
        },
        "aqw",
        None,
    )
}

fn key(k: &str, status: KeyStatus, uncertain: bool, minted: &str) -> KeyRecord {
    KeyRecord {
        key: k.into(),
        function: "Payout".into(),
        status,
        provider_key: format!("pk-{k}"),
        attempts: 5,
        last_error: None,
        lease_owner: None,
        lease_until: None,
        message_id: None,
        first_seen: Some(minted.into()),
        completed_at: None,
        replay_count: 0,
        cancelled_by: None,
        cancelled_at: None,
        cancel_reason: None,
        provider_key_changes: Vec::new(),
        history: vec![Attempt {
            at: minted.into(),
            message_id: "m".into(),
            dequeue_count: 1,
            outcome: "retried".into(),
            error: Some("HTTP 503".into()),
            may_have_taken_effect: uncertain,
            provider: None,
        }],
        carried_attempts: 0,
        run_attempts: 0,
        partition_key: String::new(),
        row_key: String::new(),
    }
}

fn answer(verdict: Verdict) -> LookupAnswer {
    LookupAnswer {
        verdict,
        line: format!("{verdict:?}"),
    }
}

struct World {
    records: Vec<PoisonRecord>,
    keys: HashMap<String, KeyRecord>,
    facts: FunctionFacts,
    lookups: HashMap<String, LookupAnswer>,
    payloads: HashMap<String, String>,
}

impl World {
    fn new() -> Self {
        World {
            records: vec![],
            keys: HashMap::new(),
            facts: FunctionFacts {
                function: "Payout".into(),
                has_lookup: true,
                lookup_asked: true,
                ..Default::default()
            },
            lookups: HashMap::new(),
            payloads: HashMap::new(),
        }
    }

    fn key(&mut self, k: KeyRecord, lookup: Option<Verdict>) {
        if let Some(v) = lookup {
            self.lookups.insert(k.provider_key.clone(), answer(v));
        }
        self.keys.insert(k.key.clone(), k);
    }

    fn plan(&self) -> TriagePlan {
        plan(&TriageInput {
            queue: Q,
            records: &self.records,
            keys: &self.keys,
            keys_unread: 0,
            facts: &self.facts,
            lookups: &self.lookups,
            payloads: &self.payloads,
            now: OffsetDateTime::parse(
                "2026-12-07T07:00:00Z",
                &time::format_description::well_known::Rfc3339,
            )
            .unwrap(),
        })
    }
}

fn runs(g: &TriageGroup) -> Vec<&str> {
    g.steps
        .iter()
        .filter(|s| s.kind == StepKind::Run)
        .map(|s| s.text.as_str())
        .collect()
}

const MINTED: &str = "2026-12-07T06:00:00Z";

/// The seeded payouts incident of issue 52: two outage records (one paid,
/// the lookup says applied), a refusal the provider saved, a bad producer's
/// batch of three, a closed account.
fn incident() -> World {
    let mut w = World::new();
    w.facts.saves_failures = true;
    let e503 = |r: &str| format!("HTTP 503 Service Unavailable (request {r})");
    w.records.push(rec(
        "o-1",
        ErrorKind::Retryable,
        &e503("a1"),
        Some("payout:1"),
        1,
    ));
    w.records[0].uncertain_attempts = 2;
    w.key(
        key("payout:1", KeyStatus::Poisoned, true, MINTED),
        Some(Verdict::Applied),
    );
    w.records.push(rec(
        "o-2",
        ErrorKind::Retryable,
        &e503("b7"),
        Some("payout:2"),
        2,
    ));
    w.key(key("payout:2", KeyStatus::Poisoned, false, MINTED), None);
    let e402 = "HTTP 402 Payment Required: insufficient funds";
    w.records
        .push(rec("r-1", ErrorKind::Permanent, e402, Some("payout:3"), 3));
    w.key(
        key("payout:3", KeyStatus::Poisoned, false, MINTED),
        Some(Verdict::NotApplied),
    );
    for (i, id) in ["b-1", "b-2", "b-3"].into_iter().enumerate() {
        let e = "key field /payoutId is missing from the payload";
        w.records
            .push(rec(id, ErrorKind::Permanent, e, None, 4 + i as u32));
        let body = format!(r#"{{"payoutID":"p-{i}","amount":5}}"#);
        w.payloads.insert(id.into(), body);
    }
    let closed = "HTTP 404 Not Found: account acct-9 is closed";
    w.records.push(rec(
        "c-1",
        ErrorKind::Permanent,
        closed,
        Some("payout:9"),
        9,
    ));
    w.key(key("payout:9", KeyStatus::Poisoned, false, MINTED), None);
    w
}

#[test]
fn the_seeded_incident_is_four_groups_most_urgent_first_with_their_commands() {
    let p = incident().plan();
    assert_eq!(p.open, 7);
    let causes: Vec<Cause> = p.groups.iter().map(|g| g.cause).collect();
    assert_eq!(
        causes,
        [
            Cause::Outage,
            Cause::BadProducer,
            Cause::Refusal,
            Cause::Closed
        ]
    );
    let outage = &p.groups[0];
    assert_eq!(
        (outage.count, outage.ids.clone()),
        (2, vec!["o-1".to_string(), "o-2".into()])
    );
    assert_eq!(outage.runbook, "aqw oncall outage");
    let re = r"'^HTTP 503 Service Unavailable \(request'";
    assert_eq!(
        runs(outage),
        [
            format!("aqw poison replay payouts --all --error {re} --dry-run"),
            format!("aqw poison replay payouts --all --error {re} --wait 00:05:00"),
        ]
    );
    let paid = &outage.records[0];
    assert!(paid.uncertain);
    assert_eq!(paid.lookup.as_ref().unwrap().verdict, Verdict::Applied);

    let bad = &p.groups[1];
    let sel = "--error '^key field /payoutId is missing from the payload'";
    let patch = r#"'[{"op":"move","from":"/payoutID","path":"/payoutId"}]'"#;
    assert_eq!(
        runs(bad),
        [
            format!("aqw ops fix payouts {sel} --patch {patch} --dry-run"),
            format!("aqw ops fix payouts {sel} --patch {patch}"),
        ]
    );
    assert!(bad.steps.iter().any(|s| s.why.contains("new provider key")));
}

/// The same incident's refusal the provider saved (a new provider key once
/// the lookup says not applied) and closed account (discard, key closed).
#[test]
fn the_seeded_incidents_refusal_and_closed_account_get_their_way_out() {
    let p = incident().plan();
    let refusal = &p.groups[2];
    assert!(
        refusal.meaning.contains("saved this failure"),
        "{}",
        refusal.meaning
    );
    assert_eq!(
        runs(refusal),
        [
            "aqw keys new-provider-key Payout payout:3 --reason 'provider saved the failure under the old provider key; lookup: not applied' --dry-run",
            "aqw keys new-provider-key Payout payout:3 --reason 'provider saved the failure under the old provider key; lookup: not applied'",
            "aqw poison replay payouts --id r-1 --wait 00:05:00",
        ]
    );
    assert_eq!(
        refusal.steps[0].kind,
        StepKind::Do,
        "the cause is fixed first"
    );

    let closed = &p.groups[3];
    assert_eq!(
        runs(closed),
        [
            "aqw poison discard payouts --id c-1 --reason 'refused for good by the provider (HTTP 404): must never run' --close-key --dry-run",
            "aqw poison discard payouts --id c-1 --reason 'refused for good by the provider (HTTP 404): must never run' --close-key",
        ]
    );
    assert_eq!(p.confirm[0].text, "aqw triage payouts");
    assert!(p.confirm[1]
        .text
        .starts_with("aqw poison report payouts --since 2026-12-07T06:00:01Z"));
    assert_eq!(
        p.provider.saves_failures.as_deref(),
        Some("declared (handler.savesFailures)")
    );
}

#[test]
fn an_uncertain_attempt_nobody_asked_about_is_checked_before_its_replay() {
    let mut w = World::new();
    w.facts.has_lookup = false;
    w.records
        .push(rec("u-1", ErrorKind::Retryable, "HTTP 500", Some("k:1"), 1));
    w.key(key("k:1", KeyStatus::Poisoned, true, MINTED), None);
    let p = w.plan();
    let g = &p.groups[0];
    assert_eq!(
        (g.cause, g.runbook.as_str()),
        (Cause::Uncertain, "aqw oncall uncertain")
    );
    assert_eq!(g.steps[0].kind, StepKind::Do, "ask the provider by hand");
    assert_eq!(
        runs(g),
        ["aqw poison replay payouts --id u-1 --uncertain-checked --wait 00:05:00"]
    );
    // With a lookup that could not tell: `keys check` first.
    w.facts.has_lookup = true;
    w.lookups.insert("pk-k:1".into(), answer(Verdict::Unknown));
    assert_eq!(runs(&w.plan().groups[0])[0], "aqw keys check Payout k:1");
    // A provider that honours Idempotency-Key: a same-key replay cannot double.
    w.facts.idempotent = true;
    let g = &w.plan().groups[0];
    assert_eq!(g.cause, Cause::Outage);
    assert_eq!(
        runs(g)[1],
        "aqw poison replay payouts --id u-1 --wait 00:05:00"
    );
}

#[test]
fn an_applied_attempt_past_the_window_is_closed_and_a_not_applied_one_replayed_with_the_override() {
    let mut w = World::new();
    w.facts.provider_key_window = Some(Duration::from_secs(600));
    let old = "2026-12-07T05:00:00Z";
    w.records
        .push(rec("a-1", ErrorKind::Timeout, "timed out", Some("k:a"), 1));
    w.key(
        key("k:a", KeyStatus::Poisoned, true, old),
        Some(Verdict::Applied),
    );
    w.records
        .push(rec("n-1", ErrorKind::Timeout, "timed out", Some("k:n"), 2));
    w.key(
        key("k:n", KeyStatus::Poisoned, true, old),
        Some(Verdict::NotApplied),
    );
    let p = w.plan();
    let applied = p.groups.iter().find(|g| g.ids == ["a-1"]).unwrap();
    assert_eq!(applied.cause, Cause::Uncertain);
    assert!(
        runs(applied)[1].ends_with("--close-key"),
        "{:?}",
        runs(applied)
    );
    assert!(applied.records[0].past_window);
    let not = p.groups.iter().find(|g| g.ids == ["n-1"]).unwrap();
    assert_eq!(
        runs(not)[1],
        "aqw poison replay payouts --id n-1 --past-provider-window --wait 00:05:00"
    );
    assert!(!p.notes.iter().any(|n| n.contains("no providerKeyWindow")));
}

#[test]
fn a_saved_failure_waits_for_the_providers_word_before_a_new_key() {
    let mut w = World::new();
    let e = "HTTP 402 (replayed: the provider answered this Idempotency-Key with the failure it saved from an earlier attempt)";
    w.records
        .push(rec("s-1", ErrorKind::ReplayedFailure, e, Some("k:s"), 1));
    w.key(
        key("k:s", KeyStatus::Poisoned, false, MINTED),
        Some(Verdict::Unknown),
    );
    // A refusal of the same function: the replayed_failure record says the
    // provider saves failures, so it gets the same way out.
    w.records.push(rec(
        "r-1",
        ErrorKind::Permanent,
        "HTTP 409 limit",
        Some("k:r"),
        2,
    ));
    w.key(
        key("k:r", KeyStatus::Poisoned, false, MINTED),
        Some(Verdict::NotApplied),
    );
    let p = w.plan();
    assert!(p
        .provider
        .saves_failures
        .as_deref()
        .unwrap()
        .contains("s-1"));
    let saved = p
        .groups
        .iter()
        .find(|g| g.cause == Cause::SavedFailure)
        .unwrap();
    assert_eq!(runs(saved)[0], "aqw keys check Payout k:s");
    assert!(saved
        .steps
        .iter()
        .any(|s| s.kind == StepKind::Do && s.text.contains("confirms no effect")));
    let refusal = p.groups.iter().find(|g| g.cause == Cause::Refusal).unwrap();
    assert!(runs(refusal)[0].starts_with("aqw keys new-provider-key Payout k:r"));
    let wanted = lookups_wanted(&w.records, &w.keys, &w.facts);
    assert_eq!(wanted, ["pk-k:s", "pk-k:r"]);
}

#[test]
fn a_refusal_from_a_provider_not_known_to_save_failures_is_fixed_then_replayed() {
    let mut w = World::new();
    w.records.push(rec(
        "r-1",
        ErrorKind::Permanent,
        "HTTP 402 no funds",
        Some("k:r"),
        1,
    ));
    w.key(key("k:r", KeyStatus::Poisoned, false, MINTED), None);
    let p = w.plan();
    let g = &p.groups[0];
    assert_eq!(g.cause, Cause::Refusal);
    assert!(p.provider.saves_failures.is_none());
    assert_eq!(
        runs(g),
        [
            "aqw poison replay payouts --id r-1 --dry-run",
            "aqw poison replay payouts --id r-1 --wait 00:05:00"
        ]
    );
    assert!(lookups_wanted(&w.records, &w.keys, &w.facts).is_empty());
    assert!(p.notes.iter().any(|n| n.contains("no providerKeyWindow")));
}

#[test]
fn an_open_breaker_says_the_provider_is_not_answering_and_waits_first() {
    let mut w = World::new();
    w.facts.breaker = Some(crate::control::PublishedBreaker {
        state: "open".into(),
        at: "2026-12-07T06:10:00Z".into(),
        reason: "95% of 40 attempts failed".into(),
        worker: "w".into(),
        cool_down: None,
        probe_closed_at: None,
    });
    w.records
        .push(rec("o-1", ErrorKind::Retryable, "HTTP 503", Some("k:1"), 1));
    let p = w.plan();
    assert_eq!(p.provider.answering, "no");
    assert_eq!(p.groups[0].steps[0].kind, StepKind::Do);
    assert_eq!(runs(&p.groups[0])[0], "aqw status");
    w.facts.breaker = None;
    w.facts.last_success = Some("2026-12-07T06:30:00Z".into());
    assert_eq!(w.plan().provider.answering, "yes");
}

#[test]
fn a_group_error_regex_that_would_pick_other_records_falls_back_to_ids() {
    let a = rec("a", ErrorKind::Retryable, "HTTP 503 x1", None, 1);
    let b = rec("b", ErrorKind::Retryable, "HTTP 503 x2", None, 2);
    let c = rec("c", ErrorKind::Permanent, "HTTP 503 x3", None, 3);
    let open = [&a, &b, &c];
    assert_eq!(exact_regex(&open, &[&a, &b]), None, "c would be picked too");
    assert_eq!(
        exact_regex(&open[..2], &[&a, &b]).as_deref(),
        Some("^HTTP 503")
    );
    let mut w = World::new();
    w.records = vec![a, b, c];
    let p = w.plan();
    let g = p.groups.iter().find(|g| g.cause == Cause::Outage).unwrap();
    assert_eq!(
        runs(g)[0],
        "aqw poison replay payouts --id a --id b --dry-run"
    );
}

#[test]
fn shell_words_are_quoted_so_a_key_cannot_run_anything() {
    assert_eq!(sh("payout:1"), "payout:1");
    assert_eq!(sh("a b"), "'a b'");
    assert_eq!(sh("it's; rm -rf /"), r"'it'\''s; rm -rf /'");
    assert_eq!(sh("$(x)"), "'$(x)'");
    assert_eq!(sh(""), "''");
}

#[test]
fn a_closed_record_and_a_claim_check_record_get_their_kinds() {
    let mut w = World::new();
    w.records.push(rec(
        "x",
        ErrorKind::ClaimCheckCorrupt,
        "blob hash differs",
        Some("k:x"),
        1,
    ));
    w.records.push(rec(
        "m",
        ErrorKind::ClaimCheckMissing,
        "blob gone",
        Some("k:m"),
        2,
    ));
    let mut replayed = rec("d", ErrorKind::Retryable, "HTTP 503", Some("k:d"), 3);
    replayed.status = RecordStatus::Replayed;
    w.records.push(replayed);
    let p = w.plan();
    assert_eq!(p.open, 2, "closed records are not triaged");
    assert!(p.groups.iter().all(|g| g.cause == Cause::ClaimCheck));
    let corrupt = p.groups.iter().find(|g| g.ids == ["x"]).unwrap();
    assert!(runs(corrupt)[1].contains("poison discard payouts --id x"));
    assert!(!runs(corrupt)[1].contains("--close-key"));
    let missing = p.groups.iter().find(|g| g.ids == ["m"]).unwrap();
    assert!(missing.steps.iter().any(|s| s.kind == StepKind::Edit));
    assert!(World::new().plan().groups.is_empty());
}
