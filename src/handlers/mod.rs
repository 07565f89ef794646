//! Handlers: the code that performs a job's effect.
//!
//! A handler returns a typed result: success (optionally with entities to
//! write in the same transaction as the key's `done` mark), retryable
//! (optionally with a retry-after) or permanent. Built-ins: [`http`] and
//! [`exec`]; an embedding binary registers its own by function name.

pub mod exec;
pub mod http;

pub use crate::idempotency::ProviderAnswer;
use crate::storage::Entity;
use async_trait::async_trait;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// One attempt of one job, as a handler sees it.
#[derive(Debug, Clone)]
pub struct Job {
    pub function: String,
    pub message_id: String,
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
    pub same_store_effects: Vec<(String, Entity)>,
    /// What the provider answered, kept in the key's attempt history.
    pub provider: Option<ProviderAnswer>,
}

impl Success {
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
    pub fn with_entity(mut self, row_key: impl Into<String>, entity: Entity) -> Self {
        self.same_store_effects.push((row_key.into(), entity));
        self
    }
}

/// A failed attempt, by whether trying again can help.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandlerError {
    #[error("{message}")]
    Retryable {
        message: String,
        retry_after: Option<Duration>,
        /// The attempt may have taken effect anyway (a timeout, a connection
        /// lost after the request was sent, a 5xx after the provider took
        /// the body). Kept in the key's attempt history.
        may_have_taken_effect: bool,
    },
    #[error("{message}")]
    Permanent { message: String },
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
    pub fn permanent(message: impl Into<String>) -> Self {
        HandlerError::Permanent {
            message: message.into(),
        }
    }
}

#[async_trait]
pub trait Handler: Send + Sync {
    async fn handle(&self, job: &Job) -> Result<Success, HandlerError>;
}

/// What runs a function's job.
#[derive(Debug, Clone)]
pub enum HandlerSpec {
    Http {
        url: url::Url,
        timeout: Duration,
        /// How the provider's answers are read (replay header, refusals).
        answers: http::ProviderAnswers,
    },
    Exec {
        command: Vec<String>,
        timeout: Option<Duration>,
    },
    /// Registered in code by the embedding binary under the function's name.
    Registered,
}

/// Handlers registered in code, by function name.
#[derive(Clone, Default)]
pub struct Registry {
    handlers: HashMap<String, Arc<dyn Handler>>,
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn register(mut self, function: impl Into<String>, handler: Arc<dyn Handler>) -> Self {
        self.handlers.insert(function.into(), handler);
        self
    }

    /// The handler of `function`: registered in code, else built from host.json.
    /// The handler of function `name`: registered in code, or built from
    /// its `spec` (relative paths against `app_dir`).
    pub fn resolve(
        &self,
        name: &str,
        spec: &HandlerSpec,
        app_dir: &std::path::Path,
    ) -> Result<Arc<dyn Handler>, String> {
        if let Some(h) = self.handlers.get(name) {
            return Ok(h.clone());
        }
        match spec {
            HandlerSpec::Http {
                url,
                timeout,
                answers,
            } => Ok(Arc::new(
                http::HttpHandler::new(url.clone(), *timeout)?.reading_answers(answers.clone()),
            )),
            HandlerSpec::Exec { command, timeout } => Ok(Arc::new(exec::ExecHandler::new(
                command.clone(),
                *timeout,
                // Relative commands and paths resolve against the app folder,
                // like a Functions app's working directory.
                app_dir.to_path_buf(),
            ))),
            HandlerSpec::Registered => Err(format!(
                "aqw.functions.{name}.handler: missing (give {{\"type\": \"http\"|\"exec\", ...}} or register a handler in code)"
            )),
        }
    }
}
