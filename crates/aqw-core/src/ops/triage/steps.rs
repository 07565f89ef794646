//! Records grouped by cause and decision, and each group's next commands:
//! runnable as printed (full ids, quoted arguments, `--by` left to its
//! `$USER` default).

use super::classify::{Action, Decided};
use super::{Cause, ProviderState, Step, StepKind, TriageGroup, TriageInput, Verdict};
use crate::poison::PoisonRecord;

/// `aqw poison replay --wait`: long enough for a replayed job's retries.
const WAIT: &str = "00:05:00";
/// Groups up to this size get a command per record; larger ones a selection.
const PER_RECORD: usize = 10;

/// `s` as one shell word: as it is when plain, else in single quotes.
pub(super) fn sh(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_./:@%+=,-".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

fn run(text: String, why: &str) -> Step {
    Step {
        kind: StepKind::Run,
        text,
        why: why.into(),
    }
}

fn edit(text: String, why: &str) -> Step {
    Step {
        kind: StepKind::Edit,
        text,
        why: why.into(),
    }
}

fn act(text: &str, why: &str) -> Step {
    Step {
        kind: StepKind::Do,
        text: text.into(),
        why: why.into(),
    }
}

/// What a group shares: cause, decision, error kind, masked error text.
type GroupKey = (Cause, Action, String, String);

/// The open records grouped by (cause, decision, error group), oldest
/// record first within each.
pub(super) fn groups(
    input: &TriageInput<'_>,
    open: &[&PoisonRecord],
    decided: &[Decided],
    provider: &ProviderState,
) -> Vec<TriageGroup> {
    let mut keyed: Vec<(GroupKey, Vec<usize>)> = Vec::new();
    for (i, (r, d)) in open.iter().zip(decided).enumerate() {
        let (_, text) = crate::alert::error_group(&r.error.message);
        let k = (d.cause, d.action, r.error.kind.as_str().to_string(), text);
        match keyed.iter_mut().find(|(g, _)| *g == k) {
            Some((_, members)) => members.push(i),
            None => keyed.push((k, vec![i])),
        }
    }
    keyed
        .into_iter()
        .map(|((cause, action, kind, text), members)| {
            let recs: Vec<&PoisonRecord> = members.iter().map(|&i| open[i]).collect();
            let first = recs[0];
            let (status, _) = crate::alert::error_group(&first.error.message);
            let mut keys: Vec<String> = Vec::new();
            for k in recs.iter().filter_map(|r| r.key.as_deref()) {
                if !keys.iter().any(|x| x == k) {
                    keys.push(k.to_string());
                }
            }
            let g = Members {
                input,
                open,
                recs: &recs,
                action,
                status,
            };
            TriageGroup {
                cause,
                runbook: format!("aqw oncall {}", cause.slug()),
                error_kind: kind,
                status,
                error: first_line(&first.error.message),
                error_group: text,
                count: recs.len(),
                ids: recs.iter().map(|r| r.message_id.clone()).collect(),
                keys,
                records: members.iter().map(|&i| decided[i].facts.clone()).collect(),
                meaning: meaning(cause, action, &first_line(&first.error.message)),
                steps: g.steps(provider),
            }
        })
        .collect()
}

fn first_line(error: &str) -> String {
    let line = crate::scrub::scrub(error.lines().next().unwrap_or("").trim());
    crate::scrub::printable(&line).chars().take(300).collect()
}

fn meaning(cause: Cause, action: Action, error: &str) -> String {
    let mut short: String = error.chars().take(80).collect();
    if short.len() < error.len() {
        short.push('…');
    }
    match (cause, action) {
        (_, Action::Replay) if cause != Cause::Outage => format!("its key is already settled ({short}): a replay closes the record without running the job"),
        (Cause::Outage, Action::ReplayPastWindow) => format!("the provider failed them ({short}) and their provider keys are past providerKeyWindow; no attempt may have taken effect, so a replay cannot double anything"),
        (Cause::Outage, _) => format!("the provider failed these jobs ({short}); they pass once it answers: replay them with their original keys (where an attempt may have taken effect, the provider's answer below allows it)"),
        (_, Action::CheckThenReplay) => "an attempt may have taken effect and the provider was not asked: ask it about the provider key before replaying".into(),
        (_, Action::DiscardApplied) => "the provider has the effect (its lookup says applied) and the key is past providerKeyWindow, so a replay could apply it twice: close the record and the key".into(),
        (_, Action::ReplayPastWindow) => "the provider says not applied, but the key is past providerKeyWindow: replay with the override".into(),
        (_, Action::NewKeyThenReplay) => format!("the provider saved this failure ({short}) under the job's key and answers every same-key replay with it; it says nothing was applied, so once the cause is fixed a new provider key lets the job run once"),
        (_, Action::ConfirmThenNewKey) => format!("the provider saved this failure ({short}) under the job's key and answers every same-key replay with it: ask it whether anything was applied; only if not, a new provider key"),
        (_, Action::FixCauseThenReplay) => format!("the provider refused it for a business reason ({short}): it runs once the cause is fixed; a job that must never run is discarded instead (aqw oncall closed)"),
        (_, Action::DiscardCloseKey) => format!("the provider refused it for a reason that will not change ({short}): it must never run; close the record and its key so a resend is a duplicate"),
        (_, Action::FixPayload) => format!("the producer sent a payload that cannot run ({short}): correct it; new messages fail the same way until the producer is fixed"),
        (_, Action::BodyMissing) => "the job's claim-check body is gone (the handler never ran): fix the record with the body from the producer, or discard it".into(),
        (_, Action::DiscardUntrusted) => "the claim-check body or reference is not what it should be (the handler never ran): never replay it; discard it and find who wrote it".into(),
        (_, Action::Replay) => format!("replay them ({short})"),
    }
}

/// One group's records and what its commands need.
struct Members<'a> {
    input: &'a TriageInput<'a>,
    open: &'a [&'a PoisonRecord],
    recs: &'a [&'a PoisonRecord],
    action: Action,
    status: Option<u16>,
}

impl Members<'_> {
    fn queue(&self) -> &str {
        self.input.queue
    }

    fn function(&self) -> &str {
        &self.input.facts.function
    }

    /// `--error REGEX` that selects exactly this group's open records, if
    /// the group is larger than a few and the error text allows one.
    fn error_selection(&self) -> Option<String> {
        let re = exact_regex(self.open, self.recs)?;
        Some(format!("--error {}", sh(&re)))
    }

    fn ids(&self) -> String {
        self.recs
            .iter()
            .map(|r| format!("--id {}", sh(&r.message_id)))
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn steps(&self, provider: &ProviderState) -> Vec<Step> {
        match self.action {
            Action::Replay => self.replay(provider, ""),
            Action::ReplayPastWindow => self.replay(provider, " --past-provider-window"),
            Action::CheckThenReplay => self.check_then_replay(),
            Action::DiscardApplied => self.discard(
                "the provider applied it (lookup) and its key is past providerKeyWindow: must not run again",
                true,
            ),
            Action::NewKeyThenReplay | Action::ConfirmThenNewKey => self.new_key(),
            Action::FixCauseThenReplay => {
                let mut s = vec![act(
                    "fix the cause with the job's owner (a limit raised, funds added, an account created)",
                    "the provider refuses it until then",
                )];
                s.extend(self.replay(provider, ""));
                s
            }
            Action::DiscardCloseKey => {
                let why = match self.status {
                    Some(code) => format!("refused for good by the provider (HTTP {code}): must never run"),
                    None => "refused for good by the provider: must never run".into(),
                };
                self.discard(&why, true)
            }
            Action::FixPayload => self.fix_payload(),
            Action::BodyMissing => self.body_missing(),
            Action::DiscardUntrusted => self.discard(
                "claim-check body or reference not what it should be: never replay",
                false,
            ),
        }
    }

    fn replay(&self, provider: &ProviderState, extra: &str) -> Vec<Step> {
        let q = sh(self.queue());
        let mut steps = Vec::new();
        if provider.answering == "no" {
            steps.push(act(
                "wait until the provider answers: the breaker probes every cool-down and closes on the first success",
                "a replay now fails again",
            ));
            steps.push(run("aqw status".into(), "the BREAKER line closes"));
        }
        // A group of several by its error (what `--all --error` selects is
        // checked to be exactly this group), a single record by its id.
        let sel = match self.recs.len() > 1 {
            true => self.error_selection().map(|e| format!("--all {e}")),
            false => None,
        }
        .unwrap_or_else(|| self.ids());
        steps.push(run(
            format!("aqw poison replay {q} {sel}{extra} --dry-run"),
            "what would be replayed, and any gate that refuses a record",
        ));
        steps.push(run(
            format!("aqw poison replay {q} {sel}{extra} --wait {WAIT}"),
            "replay with the original keys and wait for each to be done",
        ));
        steps
    }

    fn check_then_replay(&self) -> Vec<Step> {
        let mut steps = Vec::new();
        for r in self.recs {
            let key = r.key.as_deref().unwrap_or("-");
            if self.input.facts.has_lookup {
                steps.push(run(
                    format!("aqw keys check {} {}", self.function(), sh(key)),
                    "ask the provider (handler.lookup) whether the provider key took effect",
                ));
            } else {
                steps.push(act(
                    &format!("ask the provider whether the provider key of {key} took effect (its dashboard, API or support; `aqw poison show {} {}` names the provider key)", self.queue(), r.message_id),
                    "no handler.lookup is configured",
                ));
            }
        }
        steps.push(act(
            "applied and within the window, or not applied: replay (next); applied and past the window: discard with --close-key (aqw oncall uncertain)",
            "the provider's answer decides",
        ));
        steps.push(run(
            format!(
                "aqw poison replay {} {} --uncertain-checked --wait {WAIT}",
                sh(self.queue()),
                self.ids()
            ),
            "you asked the provider: kept on each record",
        ));
        steps
    }

    fn discard(&self, reason: &str, close_key: bool) -> Vec<Step> {
        let q = sh(self.queue());
        let reason = sh(reason);
        let has_keys = self.recs.iter().all(|r| r.key.is_some());
        let close = if close_key && has_keys {
            " --close-key"
        } else {
            ""
        };
        if self.recs.len() > PER_RECORD {
            if let Some(sel) = self.error_selection() {
                return vec![
                    run(
                        format!("aqw ops discard {q} {sel} --reason {reason}{close} --dry-run"),
                        "what would be discarded",
                    ),
                    run(
                        format!("aqw ops discard {q} {sel} --reason {reason}{close}"),
                        "close each record (and its key: a resend is a duplicate)",
                    ),
                ];
            }
        }
        let mut steps = Vec::new();
        for r in self.recs {
            let id = sh(&r.message_id);
            let c = if close_key && r.key.is_some() {
                " --close-key"
            } else {
                ""
            };
            steps.push(run(
                format!("aqw poison discard {q} --id {id} --reason {reason}{c} --dry-run"),
                "what the discard would close",
            ));
            steps.push(run(
                format!("aqw poison discard {q} --id {id} --reason {reason}{c}"),
                "close the record (and its key: a resend is a duplicate)",
            ));
        }
        steps
    }

    fn new_key(&self) -> Vec<Step> {
        let mut steps = vec![act(
            "fix the cause of the refusal first (with the job's owner), if it is a business refusal",
            "a new request under a new key is refused again otherwise",
        )];
        for r in self.recs {
            let key = sh(r.key.as_deref().unwrap_or("-"));
            let f = self.function();
            let answered = self.answer_of(r) == Verdict::NotApplied;
            if !answered {
                if self.input.facts.has_lookup {
                    steps.push(run(
                        format!("aqw keys check {f} {key}"),
                        "the provider must say: not applied",
                    ));
                }
                steps.push(act(
                    "go on only once the provider confirms no effect under the old provider key (lookup: not applied, or its support); otherwise wait out providerKeyWindow and replay",
                    "a new provider key is a new request: without that, it can double the effect",
                ));
            }
            let reason =
                sh("provider saved the failure under the old provider key; lookup: not applied");
            let replace = format!("aqw keys new-provider-key {f} {key} --reason {reason}");
            steps.push(run(
                format!("{replace} --dry-run"),
                "shows the old provider key and what changes; touches nothing",
            ));
            steps.push(run(
                replace,
                "the provider answers the old key with its saved failure",
            ));
            steps.push(run(
                format!(
                    "aqw poison replay {} --id {} --wait {WAIT}",
                    sh(self.queue()),
                    sh(&r.message_id)
                ),
                "run it once under the new provider key",
            ));
        }
        steps
    }

    fn answer_of(&self, r: &PoisonRecord) -> Verdict {
        let pk = r
            .key
            .as_deref()
            .and_then(|k| self.input.keys.get(k))
            .map(|k| k.provider_key.as_str());
        pk.and_then(|pk| self.input.lookups.get(pk))
            .map_or(Verdict::NotAsked, |a| a.verdict)
    }

    fn body_missing(&self) -> Vec<Step> {
        let q = sh(self.queue());
        let mut steps = Vec::new();
        for r in self.recs {
            let id = sh(&r.message_id);
            steps.push(run(
                format!("aqw poison show {q} {id}"),
                "names the missing blob",
            ));
            steps.push(edit(
                format!("aqw poison fix {q} --id {id} --file BODY.json --dry-run"),
                "with the body from the producer; or discard it (aqw oncall claim-check)",
            ));
        }
        steps
    }

    fn fix_payload(&self) -> Vec<Step> {
        let q = sh(self.queue());
        let patch = infer_patch(self.recs, self.input.payloads);
        let sel = self.error_selection();
        let note = act(
            "tell the producer's owner: new messages fail the same way until they fix it",
            "the cause is upstream",
        );
        let keynote = "a fix derives the key from the corrected payload: a new key gets a new provider key at its first attempt (nothing was sent under the old one)";
        match (patch, sel) {
            (Some(p), Some(sel)) => vec![
                note,
                run(
                    format!("aqw ops fix {q} {sel} --patch {} --dry-run", sh(&p)),
                    "each record's new key and diff",
                ),
                run(format!("aqw ops fix {q} {sel} --patch {}", sh(&p)), keynote),
            ],
            (None, Some(sel)) => {
                let first = sh(&self.recs[0].message_id);
                vec![
                    note,
                    run(format!("aqw poison show {q} {first}"), "the exact payload"),
                    edit(
                        format!("aqw ops fix {q} {sel} --patch '[{{\"op\":\"move\",\"from\":\"/WRONG\",\"path\":\"/RIGHT\"}}]' --dry-run"),
                        keynote,
                    ),
                ]
            }
            _ => {
                let mut steps = vec![note];
                for r in self.recs {
                    let id = sh(&r.message_id);
                    steps.push(run(
                        format!("aqw poison show {q} {id}"),
                        "the exact payload",
                    ));
                    steps.push(edit(
                        format!("aqw poison fix {q} --id {id} --file FIXED.json --dry-run"),
                        keynote,
                    ));
                }
                steps
            }
        }
    }
}

/// `^` and the escaped common start of the group's errors, when it selects
/// exactly the group among the queue's open records.
pub(super) fn exact_regex(open: &[&PoisonRecord], group: &[&PoisonRecord]) -> Option<String> {
    let first = group[0].error.message.lines().next().unwrap_or("");
    let mut prefix: &str = first;
    for r in &group[1..] {
        let line = r.error.message.lines().next().unwrap_or("");
        let common = prefix
            .char_indices()
            .zip(line.chars())
            .find(|((_, a), b)| a != b)
            .map_or(prefix.len().min(line.len()), |((i, _), _)| i);
        prefix = &prefix[..common];
    }
    let mut cut: String = prefix.chars().take(60).collect();
    if cut.len() < first.len() {
        // End on a word: a half word would read as a typo.
        if let Some(i) = cut.rfind(|c: char| !c.is_alphanumeric()) {
            cut.truncate(i);
        }
    }
    let cut = cut.trim_end();
    if cut.chars().count() < 4 || cut.chars().any(char::is_control) {
        return None;
    }
    let re = format!("^{}", regex::escape(cut));
    let compiled = regex::Regex::new(&re).ok()?;
    let picked = open.iter().filter(|r| compiled.is_match(&r.error.message));
    let ids: Vec<&str> = picked.map(|r| r.message_id.as_str()).collect();
    let want: Vec<&str> = group.iter().map(|r| r.message_id.as_str()).collect();
    (ids.len() == want.len() && want.iter().all(|w| ids.contains(w))).then_some(re)
}

/// A JSON Patch moving the misspelt field to the one the error names (`key
/// field /orderId is missing`), when every payload read has the same one
/// near miss beside it.
pub(super) fn infer_patch(
    recs: &[&PoisonRecord],
    payloads: &std::collections::HashMap<String, String>,
) -> Option<String> {
    let target = recs[0]
        .error
        .message
        .strip_prefix("key field ")?
        .split(' ')
        .next()?
        .to_string();
    let (parent, leaf) = target.rsplit_once('/')?;
    let safe = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    };
    if !safe(leaf) || !parent.split('/').skip(1).all(safe) {
        return None;
    }
    let mut found: Option<String> = None;
    for r in recs {
        if !r.error.message.starts_with(&format!("key field {target} ")) {
            return None;
        }
        let Some(text) = payloads.get(&r.message_id) else {
            continue;
        };
        let v: serde_json::Value = serde_json::from_str(text).ok()?;
        let obj = v.pointer(parent).unwrap_or(&v).as_object()?;
        let near: Vec<&String> = obj
            .keys()
            .filter(|k| k.as_str() != leaf && safe(k) && near_miss(k, leaf))
            .collect();
        match (near.as_slice(), &found) {
            ([one], None) => found = Some(one.to_string()),
            ([one], Some(f)) if *one == f => {}
            _ => return None,
        }
    }
    let from = found?;
    Some(format!(
        "[{{\"op\":\"move\",\"from\":\"{parent}/{from}\",\"path\":\"{target}\"}}]"
    ))
}

/// The same name but for case and separators, or at most two edits away.
fn near_miss(a: &str, b: &str) -> bool {
    let norm = |s: &str| -> String {
        s.chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .map(|c| c.to_ascii_lowercase())
            .collect()
    };
    if norm(a) == norm(b) {
        return true;
    }
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    if a.len().min(b.len()) < 4 {
        return false;
    }
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != cb);
            cur.push((prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()] <= 2
}

/// How to confirm the end state once every group is done.
pub(super) fn confirm(queue: &str, open: &[&PoisonRecord]) -> Vec<Step> {
    let q = sh(queue);
    let mut steps = vec![run(format!("aqw triage {q}"), "exit 0: nothing open")];
    if let Some(oldest) = open.iter().map(|r| r.poisoned_at.as_str()).min() {
        steps.push(run(
            format!("aqw poison report {q} --since {}", sh(oldest)),
            "the incident as one table: exit 0 when every key is settled once",
        ));
    }
    steps
}
