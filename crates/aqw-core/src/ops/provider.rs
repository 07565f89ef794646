//! What aqw knows of a function's provider beyond one answer (issue 52):
//! whether it declares that it honours `Idempotency-Key`
//! (`handler.idempotent`), and whether it is known to save failures: it
//! declares so (`handler.savesFailures`), or it has already answered a job
//! of the function with a saved failure (a `replayed_failure` record in the
//! queue's record table, open or closed). Replay's dry run warns on the
//! second before a same-key replay of a refusal; `aqw triage` reads both.

use super::{OpsResult, QueueOps};
use crate::config::{FunctionConfig, HandlerSpec};
use crate::message::ErrorKind;
use crate::poison::PoisonRecord;

/// Whether `f`'s provider declares that it applies one `Idempotency-Key` at
/// most once (`handler.idempotent: true`): then a same-key replay after an
/// attempt that may have taken effect cannot double the effect.
pub fn is_idempotent(f: Option<&FunctionConfig>) -> bool {
    matches!(f.map(|f| &f.handler), Some(HandlerSpec::Http { answers, .. }) if answers.idempotent)
}

/// Why a provider is known to save failures under their key.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "source", rename_all = "camelCase")]
pub enum SavesFailures {
    /// The function declares it (`handler.savesFailures: true`).
    Declared,
    /// The provider answered a job of the function with a saved failure:
    /// the latest such record.
    #[serde(rename_all = "camelCase")]
    Evidenced {
        /// The `replayed_failure` record's id.
        record: String,
        /// When it was poisoned (RFC 3339).
        poisoned_at: String,
    },
}

impl SavesFailures {
    /// Why, in a few words.
    pub(crate) fn why(&self) -> String {
        match self {
            SavesFailures::Declared => "declared (handler.savesFailures)".into(),
            SavesFailures::Evidenced {
                record,
                poisoned_at,
            } => format!("it answered record {record} with a saved failure ({poisoned_at})"),
        }
    }
}

/// Whether `f`'s provider is known to save failures: declared, else the
/// latest `replayed_failure` record of `f` among `records` (any status).
/// Pure: the caller passes the records it has read (summaries will do).
fn saves_failures_in(
    f: Option<&FunctionConfig>,
    records: &[PoisonRecord],
) -> Option<SavesFailures> {
    let f = f?;
    if let HandlerSpec::Http { answers, .. } = &f.handler {
        if answers.saves_failures {
            return Some(SavesFailures::Declared);
        }
    }
    records
        .iter()
        .filter(|r| r.function == f.name && r.error.kind == ErrorKind::ReplayedFailure)
        .max_by(|a, b| a.poisoned_at.cmp(&b.poisoned_at))
        .map(|r| SavesFailures::Evidenced {
            record: r.message_id.clone(),
            poisoned_at: r.poisoned_at.clone(),
        })
}

/// `saves_failures_in` over the queue's records: no read when declared,
/// else one query of the record table without payloads.
pub async fn saves_failures(ops: &QueueOps) -> OpsResult<Option<SavesFailures>> {
    if let Some(declared) = saves_failures_in(ops.function.as_ref(), &[]) {
        return Ok(Some(declared));
    }
    if ops.function.is_none() {
        return Ok(None);
    }
    let records = match ops.poison.list_summaries().await {
        Err(crate::storage::StorageError::NotFound) => vec![],
        other => other?,
    };
    Ok(saves_failures_in(ops.function.as_ref(), &records))
}

/// Whether a same-key replay of a record of `kind` is a replay of a
/// refusal a saving provider answers with the saved failure: a permanent
/// refusal, or a saved failure itself.
pub(crate) fn is_refusal(kind: ErrorKind) -> bool {
    matches!(kind, ErrorKind::Permanent | ErrorKind::ReplayedFailure)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handler::ProviderAnswers;

    fn function(answers: Option<ProviderAnswers>) -> FunctionConfig {
        let mut f = FunctionConfig::new("Pay", "pay");
        f.handler = match answers {
            Some(answers) => HandlerSpec::Http {
                url: url::Url::parse("http://127.0.0.1:1/p").unwrap(),
                timeout: std::time::Duration::from_secs(1),
                answers,
            },
            None => HandlerSpec::Registered,
        };
        f
    }

    fn record(id: &str, function: &str, kind: ErrorKind, at: &str) -> PoisonRecord {
        let mut r = PoisonRecord::from_entity(&crate::storage::Entity::new());
        r.message_id = id.into();
        r.function = function.into();
        r.error.kind = kind;
        r.poisoned_at = at.into();
        r
    }

    #[test]
    fn declared_wins_then_the_latest_replayed_failure_of_the_function() {
        let declared = ProviderAnswers {
            saves_failures: true,
            ..Default::default()
        };
        let f = function(Some(declared));
        assert_eq!(
            saves_failures_in(Some(&f), &[]),
            Some(SavesFailures::Declared)
        );
        let f = function(Some(ProviderAnswers::default()));
        let name = f.name.clone();
        let records = [
            record(
                "a",
                &name,
                ErrorKind::ReplayedFailure,
                "2026-12-06T10:00:00Z",
            ),
            record(
                "b",
                &name,
                ErrorKind::ReplayedFailure,
                "2026-12-06T11:00:00Z",
            ),
            record(
                "c",
                "Other",
                ErrorKind::ReplayedFailure,
                "2026-12-06T12:00:00Z",
            ),
            record("d", &name, ErrorKind::Permanent, "2026-12-06T13:00:00Z"),
        ];
        let found = saves_failures_in(Some(&f), &records).unwrap();
        assert_eq!(
            found,
            SavesFailures::Evidenced {
                record: "b".into(),
                poisoned_at: "2026-12-06T11:00:00Z".into()
            }
        );
        assert!(found.why().contains("record b"), "{}", found.why());
        assert_eq!(saves_failures_in(Some(&f), &records[2..]), None);
        assert_eq!(saves_failures_in(None, &records), None);
    }

    #[test]
    fn only_a_declared_http_provider_is_idempotent() {
        let yes = ProviderAnswers {
            idempotent: true,
            ..Default::default()
        };
        assert!(is_idempotent(Some(&function(Some(yes)))));
        assert!(!is_idempotent(Some(&function(Some(
            ProviderAnswers::default()
        )))));
        assert!(!is_idempotent(Some(&function(None))));
        assert!(!is_idempotent(None));
    }
}
