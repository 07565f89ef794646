//! `aqw poison report`: an incident as one table, the evidence the
//! recovery procedure's last step asks for ("confirm the effect happened
//! once"). Per record: what happened, the decision (open, replayed, fixed,
//! discarded), who, when, why, its key's final state, the provider's answer
//! to the attempt that completed it, and any attempt still uncertain; per
//! key a fix created, that key's state. Totals close it.
//!
//! Cost: the scan of `<queue>-poison` that `poison list` makes (it imports
//! raw host copies), one query of the queue's records without payloads
//! (`$select`, a request per 1,000 rows), then one point read per distinct
//! key (the records' keys and the fixes' new keys), eight at a time. Keys
//! are partitioned by their hash, so a batch by partition would read one
//! key per partition anyway.

use super::{list_summaries, Filter, OpsResult, QueueOps};
use crate::idempotency::{KeyRecord, KeyStatus, ProviderKeyChange};
use crate::poison::{PoisonRecord, RecordStatus};
use futures::StreamExt;
use std::collections::HashMap;

/// Key reads in flight at once.
const KEY_READS: usize = 8;

/// `aqw poison report`: the records of one queue and how each ended.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IncidentReport {
    /// The source queue.
    pub queue: String,
    /// The lower bound on `poisonedAt` (RFC 3339), when `--since` was given.
    pub since: Option<String>,
    /// One row per record, oldest poisoning first.
    pub records: Vec<ReportRow>,
    /// Every replacement of a reported key's provider key, oldest first:
    /// who, why, the old and the new provider key.
    pub provider_key_changes: Vec<ReportKeyChange>,
    /// What the rows add up to.
    pub totals: ReportTotals,
}

/// A provider-key replacement of a key in the report (`aqw keys
/// new-provider-key`).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportKeyChange {
    /// The business key.
    pub key: String,
    /// When, who, why, old and new.
    #[serde(flatten)]
    pub change: ProviderKeyChange,
}

/// One poison record in the report.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportRow {
    /// The record id (the source message id).
    pub id: String,
    /// The function that ran it.
    pub function: String,
    /// When it was poisoned (RFC 3339).
    pub poisoned_at: String,
    /// Its DequeueCount then.
    pub(crate) dequeue_count: u32,
    /// The last error's kind (`retryable`, `permanent`, …).
    pub error_kind: String,
    /// The last error, whole and scrubbed.
    pub error: String,
    /// `open`, `replayed`, `fixed` or `discarded`.
    pub decision: &'static str,
    /// Who decided (None while open).
    pub by: Option<String>,
    /// When (RFC 3339; None while open).
    pub at: Option<String>,
    /// Why: a discard's reason, a replay's note, a fix's new message.
    pub why: Option<String>,
    /// The job's key (None for a keyless job: nothing proves it ran once).
    pub key: Option<String>,
    /// The key's final state, its completing answer and its uncertainty.
    pub key_state: KeyOutcome,
    /// The key the fix's corrected payload derived, and its state.
    pub new_key: Option<NewKey>,
    /// The message this record's replay or fix put.
    pub put_as: Option<String>,
    /// The record that message became when it was poisoned again.
    pub created: Option<String>,
    /// The record whose replay or fix put this record's message.
    pub created_by: Option<String>,
}

/// Where a key ended, as its record says.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyOutcome {
    /// `done`, `pending`, `poisoned`, `cancelled`, or `absent` (keyless,
    /// never claimed, or purged).
    pub state: &'static str,
    /// Attempts that claimed the key.
    pub(crate) attempts: u32,
    /// Attempts the key's history shows completed (1 for a key done once).
    completed_attempts: u32,
    /// The provider's answer to the attempt that completed the key: None
    /// when it is not done, or its handler recorded no answer.
    pub provider: Option<ReportAnswer>,
    /// Attempts that may have taken effect (timeout, connection lost after
    /// sending), with the provider key to ask about.
    pub uncertain: Option<Uncertain>,
}

/// The provider's answer to the completing attempt.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportAnswer {
    /// `replayed` (answered from the provider's idempotency store: the
    /// effect had happened before) or `fresh` (applied by this attempt).
    pub answer: &'static str,
    /// The HTTP status it answered.
    pub status: u16,
}

/// Attempts of a key whose outcome is unknown.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Uncertain {
    /// How many (the key's history, or the record's count without a key record).
    pub attempts: u32,
    /// The provider key they were sent with.
    pub provider_key: Option<String>,
    /// The key has since settled (done or cancelled): its state says how.
    pub resolved: bool,
}

/// A key a fix created: the corrected payload's.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NewKey {
    /// The key.
    pub key: String,
    /// The corrected message's id.
    pub message_id: Option<String>,
    /// Its state, answer and uncertainty.
    pub state: KeyOutcome,
}

/// The report's totals: enough to say whether each effect happened once.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportTotals {
    /// Records in the report.
    pub records: usize,
    /// Still open.
    pub open: usize,
    /// Closed by a replay.
    pub replayed: usize,
    /// Closed by a fix.
    pub fixed: usize,
    /// Closed by a discard.
    pub discarded: usize,
    /// Distinct keys (records' and fixes') in the report: the sum of the
    /// five counts below, each key in exactly one.
    pub keys: usize,
    /// Keys done with exactly one completed attempt (the done mark is
    /// written only with its completed attempt).
    pub keys_done_once: usize,
    /// Keys done with more than one completed attempt in their history
    /// (never expected: each is a doubled effect to look into).
    pub keys_done_more_than_once: usize,
    /// Keys not done nor cancelled (pending, poisoned, absent), with no
    /// attempt that may have taken effect.
    pub keys_not_done: usize,
    /// Keys not done nor cancelled with an attempt that may have taken
    /// effect: ask the provider.
    pub uncertain: usize,
    /// Keys closed by an operator (`discard --close-key`): never run again.
    pub keys_cancelled: usize,
    /// Keyless records with an attempt that may have taken effect (no key
    /// settles them).
    pub keyless_uncertain: usize,
}

impl IncidentReport {
    /// Whether a person still has something to do: an open record, or an
    /// uncertain attempt not yet settled.
    pub fn needs_a_person(&self) -> bool {
        self.totals.open > 0 || self.totals.uncertain > 0 || self.totals.keyless_uncertain > 0
    }
}

/// `aqw poison report`: every record of the queue poisoned at or after
/// `since` (all when None), with its keys read.
pub async fn report(
    ops: &QueueOps,
    since: Option<time::OffsetDateTime>,
) -> OpsResult<IncidentReport> {
    let filter = Filter {
        since,
        ..Filter::default()
    };
    let mut records = list_summaries(ops, &filter).await?;
    records.reverse();
    let keys = read_keys(ops, &records).await?;
    let mut rows: Vec<ReportRow> = records.iter().map(|r| row(r, &keys)).collect();
    link(&mut rows);
    Ok(IncidentReport {
        queue: ops.queue.clone(),
        since: since.map(crate::idempotency::fmt_time),
        totals: totals(&rows),
        provider_key_changes: key_changes(&keys),
        records: rows,
    })
}

/// Each row linked to the record its replay or fix created (the put
/// message poisoned again: a record under its id) and back.
fn link(rows: &mut [ReportRow]) {
    let ids: HashMap<String, usize> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| (r.id.clone(), i))
        .collect();
    for i in 0..rows.len() {
        let Some(&j) = rows[i].put_as.as_ref().and_then(|m| ids.get(m)) else {
            continue;
        };
        if i != j {
            rows[i].created = Some(rows[j].id.clone());
            rows[j].created_by = Some(rows[i].id.clone());
        }
    }
}

/// Every provider-key replacement of the keys read, oldest first.
fn key_changes(keys: &HashMap<String, Option<KeyRecord>>) -> Vec<ReportKeyChange> {
    let mut all: Vec<ReportKeyChange> = keys
        .values()
        .flatten()
        .flat_map(|k| {
            k.provider_key_changes.iter().map(|c| ReportKeyChange {
                key: k.key.clone(),
                change: c.clone(),
            })
        })
        .collect();
    all.sort_by(|a, b| (&a.change.at, &a.key).cmp(&(&b.change.at, &b.key)));
    all
}

/// Each distinct key the records name (their own and their fixes'), read once.
async fn read_keys(
    ops: &QueueOps,
    records: &[PoisonRecord],
) -> OpsResult<HashMap<String, Option<KeyRecord>>> {
    let mut names: Vec<&str> = records
        .iter()
        .flat_map(|r| [r.key.as_deref(), r.replacement_key.as_deref()])
        .flatten()
        .collect();
    names.sort_unstable();
    names.dedup();
    let read: Vec<OpsResult<(String, Option<KeyRecord>)>> = futures::stream::iter(names)
        .map(|k| async move { Ok((k.to_string(), ops.key_named(Some(k)).await?)) })
        .buffer_unordered(KEY_READS)
        .collect()
        .await;
    read.into_iter().collect()
}

fn row(r: &PoisonRecord, keys: &HashMap<String, Option<KeyRecord>>) -> ReportRow {
    let key_of = |k: Option<&str>| k.and_then(|k| keys.get(k)).and_then(Option::as_ref);
    let (decision, by, at, why) = decision(r);
    let new_key = r.replacement_key.as_deref().map(|k| NewKey {
        key: k.to_string(),
        message_id: r.replacement_message_id.clone(),
        state: outcome(key_of(Some(k)), 0),
    });
    ReportRow {
        id: r.message_id.clone(),
        function: r.function.clone(),
        poisoned_at: r.poisoned_at.clone(),
        dequeue_count: r.dequeue_count,
        error_kind: r.error.kind.as_str().to_string(),
        error: crate::scrub::scrub(&r.error.message),
        decision,
        by: by.map(|s| crate::scrub::scrub(s)),
        at: at.cloned(),
        why: why.map(|s| crate::scrub::scrub(&s)),
        key: r.key.as_deref().map(str::to_string),
        key_state: outcome(key_of(r.key.as_deref()), r.uncertain_attempts),
        new_key,
        put_as: match r.status {
            RecordStatus::Replayed => r.replay_message_id.clone(),
            RecordStatus::Replaced => r.replacement_message_id.clone(),
            _ => None,
        },
        created: None,
        created_by: None,
    }
}

/// The decision on a record: what, who, when, why.
fn decision(
    r: &PoisonRecord,
) -> (
    &'static str,
    Option<&String>,
    Option<&String>,
    Option<String>,
) {
    match r.status {
        RecordStatus::Open => ("open", None, None, None),
        RecordStatus::Replayed => (
            "replayed",
            r.replayed_by.as_ref(),
            r.replayed_at.as_ref(),
            r.replay_note.clone(),
        ),
        RecordStatus::Discarded => (
            "discarded",
            r.discarded_by.as_ref(),
            r.discarded_at.as_ref(),
            r.discard_reason.clone(),
        ),
        RecordStatus::Replaced => (
            "fixed",
            r.replaced_by.as_ref(),
            r.replaced_at.as_ref(),
            Some(format!(
                "corrected payload ({:+} bytes) put as {}",
                r.replacement_size_diff.unwrap_or(0),
                r.replacement_message_id.as_deref().unwrap_or("-")
            )),
        ),
    }
}

/// A key's outcome from its record; `record_uncertain` is the poison
/// record's count, for a key without a record.
fn outcome(k: Option<&KeyRecord>, record_uncertain: u32) -> KeyOutcome {
    let Some(k) = k else {
        return KeyOutcome {
            state: "absent",
            attempts: 0,
            completed_attempts: 0,
            provider: None,
            uncertain: (record_uncertain > 0).then_some(Uncertain {
                attempts: record_uncertain,
                provider_key: None,
                resolved: false,
            }),
        };
    };
    let uncertain = k.history.iter().filter(|a| a.may_have_taken_effect).count() as u32;
    KeyOutcome {
        state: k.status.as_str(),
        attempts: k.attempts,
        completed_attempts: k
            .history
            .iter()
            .filter(|a| a.outcome == "completed")
            .count() as u32,
        provider: (k.status == KeyStatus::Done)
            .then(|| k.completed_answer())
            .flatten()
            .map(|a| ReportAnswer {
                answer: if a.replayed { "replayed" } else { "fresh" },
                status: a.status,
            }),
        uncertain: (uncertain > 0).then(|| Uncertain {
            attempts: uncertain,
            provider_key: Some(k.provider_key.clone()),
            resolved: k.status.is_settled(),
        }),
    }
}

fn totals(rows: &[ReportRow]) -> ReportTotals {
    let mut t = ReportTotals {
        records: rows.len(),
        ..ReportTotals::default()
    };
    let mut seen = std::collections::HashSet::new();
    for r in rows {
        match r.decision {
            "open" => t.open += 1,
            "replayed" => t.replayed += 1,
            "fixed" => t.fixed += 1,
            _ => t.discarded += 1,
        }
        let keys = [
            r.key.as_deref().map(|k| (k, &r.key_state)),
            r.new_key.as_ref().map(|n| (n.key.as_str(), &n.state)),
        ];
        for (key, state) in keys.into_iter().flatten() {
            if !seen.insert(key) {
                continue;
            }
            t.keys += 1;
            let uncertain = state.uncertain.as_ref().is_some_and(|u| !u.resolved);
            match (state.state, state.completed_attempts) {
                ("done", n) if n > 1 => t.keys_done_more_than_once += 1,
                // Done is written with its one completed attempt, newest in
                // the history, so 0 is a record older than the history.
                ("done", _) => t.keys_done_once += 1,
                ("cancelled", _) => t.keys_cancelled += 1,
                _ if uncertain => t.uncertain += 1,
                _ => t.keys_not_done += 1,
            }
        }
        // A keyless record's uncertainty counts too: nothing settles it.
        if r.key.is_none() && r.key_state.uncertain.is_some() {
            t.keyless_uncertain += 1;
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idempotency::{Attempt, ProviderAnswer};

    fn attempt(outcome: &str, uncertain: bool, provider: Option<ProviderAnswer>) -> Attempt {
        Attempt {
            at: "2026-12-06T10:00:00Z".into(),
            message_id: "m".into(),
            dequeue_count: 1,
            outcome: outcome.into(),
            error: (outcome != "completed").then(|| "timed out".into()),
            may_have_taken_effect: uncertain,
            provider,
        }
    }

    fn key(status: KeyStatus, history: Vec<Attempt>) -> KeyRecord {
        KeyRecord {
            key: "k".into(),
            function: "Job".into(),
            status,
            provider_key: "pk-1".into(),
            attempts: history.len() as u32,
            last_error: None,
            lease_owner: None,
            lease_until: None,
            message_id: None,
            first_seen: None,
            completed_at: None,
            replay_count: 0,
            carried_attempts: 0,
            run_attempts: 0,
            cancelled_by: None,
            cancelled_at: None,
            cancel_reason: None,
            history,
            provider_key_changes: vec![],
            partition_key: "p".into(),
            row_key: "r".into(),
        }
    }

    fn row(decision: &'static str, key: Option<&str>, state: KeyOutcome) -> ReportRow {
        ReportRow {
            id: "id".into(),
            function: "Job".into(),
            poisoned_at: String::new(),
            dequeue_count: 1,
            error_kind: "retryable".into(),
            error: String::new(),
            decision,
            by: None,
            at: None,
            why: None,
            key: key.map(str::to_string),
            key_state: state,
            new_key: None,
            put_as: None,
            created: None,
            created_by: None,
        }
    }

    #[test]
    fn an_uncertain_attempt_resolves_when_its_key_settles_and_the_answer_is_the_completing_ones() {
        let replayed = ProviderAnswer {
            status: 200,
            body: String::new(),
            replayed: true,
        };
        let history = vec![
            attempt("retried", true, None),
            attempt("completed", false, Some(replayed)),
        ];
        let done = outcome(Some(&key(KeyStatus::Done, history.clone())), 0);
        assert_eq!((done.state, done.completed_attempts), ("done", 1));
        let answer = done.provider.as_ref().unwrap();
        assert_eq!((answer.answer, answer.status), ("replayed", 200));
        let u = done.uncertain.as_ref().unwrap();
        assert!(u.resolved && u.provider_key.as_deref() == Some("pk-1"));
        let open = outcome(Some(&key(KeyStatus::Poisoned, history[..1].to_vec())), 1);
        assert!(open.provider.is_none() && !open.uncertain.unwrap().resolved);
        let absent = outcome(None, 2);
        assert_eq!(absent.state, "absent");
        assert_eq!(absent.uncertain.unwrap().attempts, 2);
    }

    #[test]
    fn totals_count_each_key_once_and_flag_a_doubled_effect() {
        let completed = || attempt("completed", false, None);
        let once = || outcome(Some(&key(KeyStatus::Done, vec![completed()])), 0);
        let twice = outcome(
            Some(&key(KeyStatus::Done, vec![completed(), completed()])),
            0,
        );
        let rows = [
            row("replayed", Some("a"), once()),
            // The same key on a second record: one key.
            row("replayed", Some("a"), once()),
            row("discarded", Some("b"), twice),
            row("open", None, outcome(None, 1)),
        ];
        let t = totals(&rows);
        let expect = ReportTotals {
            records: 4,
            open: 1,
            replayed: 2,
            discarded: 1,
            keys: 2,
            keys_done_once: 1,
            keys_done_more_than_once: 1,
            keyless_uncertain: 1,
            ..ReportTotals::default()
        };
        assert_eq!(t, expect);
    }

    /// Issue 52: every key in exactly one of done once, done more than
    /// once, not done, uncertain, cancelled (the cancelled key was left out).
    #[test]
    fn the_key_totals_add_up() {
        let completed = || attempt("completed", false, None);
        let state = |status, history| outcome(Some(&key(status, history)), 0);
        let rows = [
            row(
                "replayed",
                Some("once"),
                state(KeyStatus::Done, vec![completed()]),
            ),
            row(
                "replayed",
                Some("twice"),
                state(KeyStatus::Done, vec![completed(), completed()]),
            ),
            row(
                "open",
                Some("not-done"),
                state(KeyStatus::Poisoned, vec![attempt("poisoned", false, None)]),
            ),
            row(
                "open",
                Some("uncertain"),
                state(KeyStatus::Poisoned, vec![attempt("poisoned", true, None)]),
            ),
            row(
                "discarded",
                Some("closed"),
                state(KeyStatus::Cancelled, vec![attempt("poisoned", true, None)]),
            ),
            row("open", Some("absent"), outcome(None, 0)),
        ];
        let t = totals(&rows);
        assert_eq!(
            (
                t.keys_done_once,
                t.keys_done_more_than_once,
                t.keys_not_done
            ),
            (1, 1, 2)
        );
        assert_eq!(
            (t.uncertain, t.keys_cancelled, t.keyless_uncertain),
            (1, 1, 0)
        );
        let sum = t.keys_done_once
            + t.keys_done_more_than_once
            + t.keys_not_done
            + t.uncertain
            + t.keys_cancelled;
        assert_eq!((t.keys, sum), (6, 6), "{t:?}");
    }

    #[test]
    fn a_replayed_record_links_to_the_record_its_message_became_and_back() {
        let mut first = row("replayed", Some("k"), outcome(None, 0));
        first.id = "m-1".into();
        first.put_as = Some("m-2".into());
        let mut again = row("open", Some("k"), outcome(None, 0));
        again.id = "m-2".into();
        let mut alone = row("replayed", Some("j"), outcome(None, 0));
        alone.id = "m-3".into();
        alone.put_as = Some("m-9".into());
        let mut rows = [first, again, alone];
        link(&mut rows);
        assert_eq!(rows[0].created.as_deref(), Some("m-2"));
        assert_eq!(rows[1].created_by.as_deref(), Some("m-1"));
        assert_eq!(
            (rows[2].created.as_deref(), rows[2].created_by.as_deref()),
            (None, None)
        );
    }
}
