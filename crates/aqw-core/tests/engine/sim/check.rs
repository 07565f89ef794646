//! The one checker every simulated run ends with, over the provider's
//! calls and the store's final state (Jepsen-style: the history judged
//! against what must hold whatever the schedule was):
//!
//! - each job's effect happened at most once (one provider key applied);
//! - each good job is done, with its effect, and was never poisoned: an
//!   outage, a throttle, a 409, a crash or a storage fault is no reason to
//!   poison a job that the provider takes once it is back;
//! - each bad or failing job has exactly one poison record and no effect;
//! - every open record has its payload and its copy on `<queue>-poison`,
//!   and every copy there has a record;
//! - nothing is left on the source queue.

use super::plan::{Plan, Trouble, Window};
use crate::common::{Call, CallOutcome, Env};
use aqw_core::breaker::evidence::SETTLE;
use aqw_core::poison::RecordStatus;
use std::collections::{BTreeMap, BTreeSet};

/// A full outage may poison the jobs that failed before the breaker could
/// know it was one: the quiet rule trips on the fifth distinct job failing
/// with no success between (`breaker.consecutiveFailures`, 5), so at most
/// four good jobs whose attempts all ran out first (docs/design.md), per
/// outage ([`outages_in`]: each long down phase of a flapping window is one).
const FIRST_OF_AN_OUTAGE: usize = 4;

/// The window kind a poisoned job's last error may be excused by: a
/// partial outage (some keys failing among successes) is by design
/// indistinguishable from those keys failing alone, and reaches poison;
/// a full or flapping outage may poison its first few jobs. Nothing else
/// (a 429, a 409, a crash, a storage fault) may poison a good job.
fn excuse(message: &str) -> Option<&'static str> {
    if message.contains("shard down") {
        Some("partial")
    } else if message.contains("provider down") {
        Some("full")
    } else if message.contains("flapping") {
        Some("flapping")
    } else {
        None
    }
}

/// A good job whose key is in the failing shard of a partial outage that
/// was in force during its attempts fails there whatever else happens
/// (seed 1442: a flapping outage over a partial one; the last error of such
/// a key can be the flapping one's): poisoned by the partial outage.
fn in_failing_shard(
    plan: &Plan,
    key: &str,
    r: &aqw_core::poison::PoisonRecord,
) -> Option<&'static str> {
    // The key's job number: `n` is its index in the plan plus one.
    let index: u64 = key
        .rsplit('-')
        .next()?
        .trim_start_matches(char::is_alphabetic)
        .parse()
        .ok()?;
    let n = index + 1;
    let since_wall = |t: &str| {
        let t =
            time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()?;
        std::time::Duration::try_from(t - super::WALL).ok()
    };
    let (first, last) = (
        since_wall(&r.first_attempt_at)?,
        since_wall(&r.poisoned_at)?,
    );
    plan.windows
        .iter()
        .any(|w| match w.trouble {
            Trouble::Partial { modulo } => {
                n.is_multiple_of(modulo) && w.start <= last && first < w.start + w.length
            }
            _ => false,
        })
        .then_some("partial")
}

/// A good job poisoned with a full outage's error that began failing in a
/// flapping window's down phase, before another job's success: the flap's
/// job, not the outage's (seed 5178: a 5 s flap from 29 s, a full outage
/// from 55 s; two jobs failing since 39 s and 49 s, among the flap's
/// successes up to 54 s, spent their last attempts in the outage). The
/// quiet rule's streak counts only jobs that began failing after the
/// fleet's last success (`breaker::evidence::tally`): a job failing since
/// before a success is, to the breaker, the tail of a partial outage,
/// which by design it cannot tell apart and lets reach poison. Such a job
/// is not one of the outage's first four (its streak is the four jobs
/// sent after 54 s, one short of tripping, as the trickle ended at 63 s);
/// it is charged to the flapping window that started it failing, under
/// that window's own allowance. Read from the provider's calls, in the
/// order they were made (one clock, whatever the replicas' skew).
fn began_in_a_flap(calls: &[Call], key: &str) -> bool {
    let Some(first) = calls
        .iter()
        .position(|c| c.key == key && matches!(c.outcome, CallOutcome::Failed(_)))
    else {
        return false;
    };
    let flapping =
        matches!(&calls[first].outcome, CallOutcome::Failed(m) if m.contains("flapping"));
    flapping
        && calls[first..]
            .iter()
            .any(|c| c.key != key && c.outcome == CallOutcome::Applied)
}

/// How many outages a window is for the quiet rule. A flapping window
/// whose down phases last at least the rule's settle time (6 s, so it can
/// trip within one) is one outage per down phase: the up phase between two
/// brings successes that end any streak (and close a tripped breaker's
/// probes), so each down phase starts a new streak of five distinct jobs
/// and may poison its own first four (seed 5794: a 29 s flap, poisoning
/// 1, 2 and 2 jobs in its three down phases). Shorter flaps never let a
/// streak settle: one allowance for the window, as for a full outage.
fn outages_in(w: &Window) -> usize {
    match w.trouble {
        Trouble::Flapping { period } if period >= SETTLE => {
            let cycle = (2 * period).as_millis().max(1);
            w.length.as_millis().div_ceil(cycle) as usize
        }
        _ => 1,
    }
}

fn trouble_kind(t: Trouble) -> &'static str {
    match t {
        Trouble::Partial { .. } => "partial",
        Trouble::Outage => "full",
        Trouble::Flapping { .. } => "flapping",
        _ => "other",
    }
}

/// What a job was made to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    Good,
    Bad,
    Failing,
}

/// The violations found, one line each (empty: the run passed).
pub async fn check(
    plan: &Plan,
    env: &Env,
    jobs: &BTreeMap<String, Class>,
    ticks: Option<&super::operator::Ticks>,
) -> Vec<String> {
    let mut out = Vec::new();
    let effects = env.provider.effects();
    let calls = env.provider.calls();
    let records = env.records().await;
    let mut by_key: BTreeMap<String, Vec<_>> = BTreeMap::new();
    for r in &records {
        let key = r.key.as_ref().map(|k| k.to_string()).unwrap_or_default();
        by_key.entry(key).or_default().push(r);
    }
    let keys = env.key_rows().await;
    let mut excused: BTreeMap<&'static str, usize> = BTreeMap::new();
    for (key, class) in jobs {
        let applied = effects.get(key).copied().unwrap_or(0);
        let recs = by_key.get(key).map(Vec::as_slice).unwrap_or(&[]);
        if applied > 1 {
            out.push(format!("{key}: effect applied {applied} times"));
        }
        match class {
            Class::Good => {
                if let Some(r) = recs.first() {
                    let cause = format!("{}: {}", r.error.kind.as_str(), r.error.message);
                    let kind = in_failing_shard(plan, key, r)
                        .or_else(|| excuse(&r.error.message))
                        .map(|k| match k {
                            "full" if began_in_a_flap(&calls, key) => "flapping",
                            k => k,
                        });
                    match kind {
                        Some(kind) => *excused.entry(kind).or_default() += 1,
                        None => out.push(format!(
                            "{key}: a good job poisoned ({cause}) by the run's faults"
                        )),
                    }
                }
                let status = keys.get(key).map(String::as_str).unwrap_or("none");
                if recs.is_empty() && (applied != 1 || status != "done") {
                    out.push(format!(
                        "{key}: a good job not done (effects {applied}, key {status})"
                    ));
                }
            }
            Class::Bad | Class::Failing => {
                if applied != 0 {
                    out.push(format!("{key}: a {class:?} job had an effect"));
                }
                if recs.len() != 1 {
                    out.push(format!(
                        "{key}: a {class:?} job has {} poison records, not one",
                        recs.len()
                    ));
                }
            }
        }
    }
    for (kind, n) in &excused {
        let windows: Vec<&Window> = plan
            .windows
            .iter()
            .filter(|w| trouble_kind(w.trouble) == *kind)
            .collect();
        let outages: usize = windows.iter().map(|w| outages_in(w)).sum();
        let allowed = if *kind == "partial" {
            usize::MAX
        } else {
            FIRST_OF_AN_OUTAGE * outages
        };
        if *n > allowed {
            out.push(format!(
                "{n} good jobs poisoned by {} {kind} outage window(s), {outages} outage(s) for \
                 the quiet rule: more than the {FIRST_OF_AN_OUTAGE} an outage it may let through",
                windows.len()
            ));
        }
    }
    // A schedule's ticks are checked apart ([`super::operator::Ticks::check`]).
    let strays: BTreeSet<&String> = effects
        .keys()
        .filter(|k| !jobs.contains_key(*k) && !ticks.is_some_and(|t| t.owns(k)))
        .collect();
    if !strays.is_empty() {
        out.push(format!("effects for keys nobody sent: {strays:?}"));
    }
    out.extend(copies_match_records(env, &records).await);
    let depth = env.source_depth().await;
    if depth != 0 {
        out.push(format!("{depth} messages left on the source queue"));
    }
    out
}

/// Every open record has its payload and its copy; every copy a record.
/// A copy belongs to a record when the record names it, or when its
/// envelope names the record's source message (a crash between the put
/// and the record's update leaves the copy unnamed until an operator's
/// scan adopts it).
pub async fn copies_match_records(
    env: &Env,
    records: &[aqw_core::poison::PoisonRecord],
) -> Vec<String> {
    let mut out = Vec::new();
    let copies = env.poison_copies().await;
    let ids: BTreeSet<&String> = copies.iter().map(|(id, _)| id).collect();
    let sources: BTreeSet<&String> = copies.iter().map(|(_, e)| &e.message_id).collect();
    for r in records.iter().filter(|r| r.status == RecordStatus::Open) {
        if r.message.is_empty() {
            out.push(format!("open record {} without its payload", r.message_id));
        }
        let named = r
            .poison_message_id
            .as_ref()
            .is_some_and(|id| ids.contains(id));
        if !named && !sources.contains(&r.message_id) {
            out.push(format!(
                "open record {} without its copy ({:?} not on the poison queue)",
                r.message_id, r.poison_message_id
            ));
        }
    }
    let named: BTreeSet<&String> = records
        .iter()
        .filter_map(|r| r.poison_message_id.as_ref())
        .collect();
    let recorded: BTreeSet<&String> = records.iter().map(|r| &r.message_id).collect();
    for (id, envelope) in &copies {
        if !named.contains(id) && !recorded.contains(&envelope.message_id) {
            out.push(format!("poison copy {id} without a record"));
        }
    }
    out
}
