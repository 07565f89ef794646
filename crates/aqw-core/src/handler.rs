//! The handler contract: the code that performs a job's effect returns a
//! typed result: success (optionally with entities to write in the same
//! transaction as the key's `done` mark), retryable (optionally with a
//! retry-after), uncertain, or permanent. The binary's built-in `http` and
//! `exec` handlers implement it; an embedding binary brings its own.

pub use crate::idempotency::ProviderAnswer;
use crate::storage::Entity;
use async_trait::async_trait;
use std::time::Duration;

/// One attempt of one job, as a handler sees it.
#[derive(Debug, Clone)]
pub struct Job {
    /// The function the job belongs to.
    pub function: String,
    /// The queue message's id.
    pub message_id: String,
    /// The message's DequeueCount: 1 on the first attempt.
    pub dequeue_count: u32,
    /// The decoded payload.
    pub payload: String,
    /// The business key (absent for `"key": "none"`).
    pub key: Option<crate::idempotency::IdempotencyKey>,
    /// The provider idempotency key (UUID v4 minted once per key): send it on
    /// every outside call so a retry or replay cannot double the effect.
    pub provider_key: Option<String>,
    /// An earlier attempt held this key and did not finish.
    pub previously_pending: bool,
    /// The partition of the key record, for same-store effects.
    pub key_partition: Option<String>,
    /// The trace context of the handler call: sent as `traceparent` /
    /// `tracestate` (HTTP) or `TRACEPARENT` / `TRACESTATE` (exec).
    pub trace: Option<crate::traces::TraceContext>,
}

/// What a successful handler asks aqw to write with the `done` mark.
#[derive(Debug, Default)]
pub struct Success {
    /// Entities (row key, properties) inserted into the key's table and
    /// partition in one entity-group transaction with the `done` mark.
    pub(crate) same_store_effects: Vec<(String, Entity)>,
    /// What the provider answered, kept in the key's attempt history.
    pub provider: Option<ProviderAnswer>,
}

impl Success {
    /// A plain success: nothing to write with the `done` mark.
    pub fn done() -> Self {
        Self::default()
    }
    /// A success with the provider's answer recorded.
    pub fn answered(provider: ProviderAnswer) -> Self {
        Self {
            provider: Some(provider),
            ..Self::default()
        }
    }
    /// Add an entity (`row_key`, properties) to write with the `done` mark
    /// (see `Success::same_store_effects`).
    pub fn with_entity(mut self, row_key: impl Into<String>, entity: Entity) -> Self {
        self.same_store_effects.push((row_key.into(), entity));
        self
    }
}

/// A failed attempt, by whether trying again can help.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandlerError {
    /// Trying again may succeed; the message is retried until the cap.
    #[error("{message}")]
    Retryable {
        /// What went wrong.
        message: String,
        /// How long to wait before the next attempt (the provider's
        /// `Retry-After`); `None` = the retry strategy's delay.
        retry_after: Option<Duration>,
        /// The attempt may have taken effect anyway (a timeout, a connection
        /// lost after the request was sent, a 5xx after the provider took
        /// the body). Kept in the key's attempt history.
        may_have_taken_effect: bool,
    },
    /// No retry can help (the provider rejected the job): the message is
    /// poisoned at once.
    #[error("{message}")]
    Permanent {
        /// What went wrong.
        message: String,
    },
    /// The provider is still processing an earlier request with this
    /// provider key (HTTP 409 from an idempotent provider: the IETF
    /// Idempotency-Key draft, Stripe's `idempotency_key_in_use`): the first
    /// request may yet complete, so the job is retried with the same key.
    /// Not counted toward the breaker; poisoned as `in_progress` if it
    /// lasts to the cap.
    #[error("{message}")]
    InProgress {
        /// What the provider said.
        message: String,
        /// The provider's `Retry-After`, if it gave one.
        retry_after: Option<Duration>,
    },
    /// The provider refused the call for now and did not apply it: a rate
    /// limit (HTTP 429, with or without `Retry-After`; a 503 with
    /// `Retry-After`). It spends no attempt: the job waits as a fresh copy
    /// for `retry_after`, or aqw's own backoff when the provider named no
    /// delay, until `aqw.maxDeferral`; and the function's adaptive rate
    /// ([`crate::flow::adaptive`]) slows down.
    #[error("{message}")]
    Throttled {
        /// What the provider said.
        message: String,
        /// The delay the provider named (`Retry-After`, the RateLimit
        /// fields); `None`: aqw's backoff.
        retry_after: Option<Duration>,
    },
    /// The provider answered from its idempotency store with a failure it
    /// saved from an earlier attempt (Stripe saves 500s too): no retry with
    /// this provider key can succeed inside the provider's window, so the
    /// job is poisoned at once as `replayed_failure`.
    #[error("{message}")]
    ReplayedFailure {
        /// What the provider answered.
        message: String,
    },
}

impl HandlerError {
    /// A failure that certainly did not take effect (refused, not reached).
    pub fn retryable(message: impl Into<String>) -> Self {
        HandlerError::Retryable {
            message: message.into(),
            retry_after: None,
            may_have_taken_effect: false,
        }
    }
    /// A failure whose effect is unknown: retry, but the provider key matters.
    pub fn uncertain(message: impl Into<String>) -> Self {
        HandlerError::Retryable {
            message: message.into(),
            retry_after: None,
            may_have_taken_effect: true,
        }
    }
    /// A refusal for now (a rate limit), with the delay the provider named.
    pub fn throttled(message: impl Into<String>, retry_after: Option<Duration>) -> Self {
        HandlerError::Throttled {
            message: message.into(),
            retry_after,
        }
    }
    /// A failure no retry can fix: the message is poisoned at once.
    pub fn permanent(message: impl Into<String>) -> Self {
        HandlerError::Permanent {
            message: message.into(),
        }
    }
}

/// The code that performs a function's job: each attempt of each message is
/// one call.
#[async_trait]
pub trait Handler: Send + Sync {
    /// Perform the job's effect once, and say how it went.
    async fn handle(&self, job: &Job) -> Result<Success, HandlerError>;
}

/// How a function reads its provider's answers, and what it declares of the
/// provider (`aqw.functions.<Name>.handler.replayHeader` / `.refusedStatuses`
/// / `.idempotent` / `.savesFailures`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderAnswers {
    /// The response header whose `true` means the provider
    /// answered from its idempotency store: the effect happened once, earlier.
    /// `None`: not read.
    pub replay_header: Option<String>,
    /// Statuses that mean "refused, not applied", besides 425 and 429.
    pub refused_statuses: Vec<u16>,
    /// A body marker by which the provider says it answered a replay: a
    /// JSON pointer into the response body and the value it holds then
    /// (`handler.replayMarker`); `None`: not read.
    pub replay_marker: Option<ReplayMarker>,
    /// How to ask the provider whether a provider key took effect
    /// (`handler.lookup`); `None`: it cannot be asked.
    pub lookup: Option<Lookup>,
    /// The provider honours `Idempotency-Key` (`handler.idempotent`): it
    /// applies a provider key at most once and answers a repeat from its
    /// store, so a same-key replay after an uncertain attempt cannot double
    /// the effect and needs no `--uncertain-checked`.
    pub idempotent: bool,
    /// The provider saves a failure under its key and answers a same-key
    /// repeat with it (`handler.savesFailures`, Stripe does): a same-key
    /// replay of a refusal comes back as `replayed_failure`, so the
    /// operator is warned before one.
    pub saves_failures: bool,
}

/// `handler.lookup`: an HTTP GET that tells whether the provider applied a
/// provider key. `{providerKey}` in the URL is replaced by the key
/// (percent-encoded), which also goes in `Idempotency-Key`. A 2xx means
/// applied, 404 or 410 not applied; anything else, a timeout or no answer
/// is unknown, with the reason.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Lookup {
    /// The URL template.
    pub url: String,
    /// How long one lookup may take.
    #[serde(with = "humantime_secs")]
    pub timeout: Duration,
}

mod humantime_secs {
    pub(super) fn serialize<S: serde::Serializer>(
        d: &std::time::Duration,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
}

/// `handler.replayMarker`: the provider's replay signal in its JSON body.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ReplayMarker {
    /// Where in the body (a JSON pointer, `/idempotent_replayed`).
    pub pointer: String,
    /// The value there that means "replayed" (`true`).
    pub value: serde_json::Value,
}

impl ReplayMarker {
    /// Whether `body` (JSON) holds the marker.
    pub fn found_in(&self, body: &str) -> bool {
        serde_json::from_str::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v.pointer(&self.pointer).cloned())
            .is_some_and(|v| v == self.value)
    }
}

/// The replay header read unless a function says otherwise: Stripe's,
/// which other providers implementing idempotency keys follow.
pub const DEFAULT_REPLAY_HEADER: &str = "Idempotent-Replayed";

impl Default for ProviderAnswers {
    /// `Idempotent-Replayed` read, no declared refusals.
    fn default() -> Self {
        Self {
            replay_header: Some(DEFAULT_REPLAY_HEADER.to_string()),
            refused_statuses: vec![],
            replay_marker: None,
            lookup: None,
            idempotent: false,
            saves_failures: false,
        }
    }
}

/// What runs a function's job.
// One per function, built once at load: the `http` variant's size costs
// nothing worth a box (and a box would change every match on it).
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum HandlerSpec {
    /// The built-in `http` handler: the payload is POSTed to `url`.
    Http {
        /// Where the job is posted.
        url: url::Url,
        /// How long one request may take.
        timeout: Duration,
        /// How the provider's answers are read (replay header, refusals).
        answers: ProviderAnswers,
    },
    /// The built-in `exec` handler: a command run with the payload on stdin.
    Exec {
        /// The program and its arguments.
        command: Vec<String>,
        /// How long the command may run; `None` = no limit.
        timeout: Option<Duration>,
    },
    /// Registered in code by the embedding binary under the function's name.
    Registered,
}
