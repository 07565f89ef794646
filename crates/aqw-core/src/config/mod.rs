//! The ready configuration of an app: what the engine runs with, validated.
//! The binary builds it from `host.json`, `function.json` and the
//! environment (crate `aqw`, `src/config/`); an embedding binary builds it
//! in code ([`crate::builder`]).

mod connection;
mod retention;
mod timespan;

use std::path::PathBuf;
use std::time::Duration;

pub use crate::message::MessageEncoding;
pub use crate::retry::RetryStrategy;

pub use crate::idempotency::KeySpec;

pub use crate::handler::{HandlerSpec, ProviderAnswers};
pub use connection::StorageAccount;
pub use retention::{
    check_key_retention, key_retention_floor, Retention, RetentionError, SweepSettings,
    DEFAULT_KEYS,
};
pub use timespan::{parse_timespan, TimespanError};

/// One function: a queue, a key rule and a handler.
#[derive(Debug, Clone)]
pub struct FunctionConfig {
    /// The function's name (its folder, or the name given in code).
    pub name: String,
    /// The source queue it consumes.
    pub queue: String,
    /// The storage account its queue, keys and poison records live in.
    pub connection: StorageAccount,
    /// How each message's idempotency key is derived.
    pub key: KeySpec,
    /// What runs each message.
    pub handler: HandlerSpec,
    /// The binding name in function.json (the custom-handler `Data` key).
    pub binding_name: String,
    /// function.json `dataType` is `binary`: the host passes the message
    /// bytes base64-encoded in `Data` and merges no payload fields into
    /// `Metadata` (see src/serve.rs).
    pub binary_data: bool,
    /// `providerKeyWindow`: how long the provider remembers an
    /// `Idempotency-Key` (Stripe: 24 h). A poisoned or pending key older
    /// than this is refused by replay and fix without an explicit override.
    pub provider_key_window: Option<Duration>,
    /// The function's circuit breaker; None when turned off.
    pub breaker: Option<crate::breaker::BreakerSettings>,
    /// `redact`: payload fields masked wherever a person sees a payload.
    pub redact: crate::redact::Redaction,
    /// Fleet-wide flow limits (`aqw.functions.<Name>.limits`); none by default.
    pub limits: crate::flow::FlowLimits,
    /// What the expiry guard does with a held message about to expire.
    pub expiry: Expiry,
    /// Per-function overrides of the queue settings; unset: the app's.
    pub overrides: QueueOverrides,
}

/// The queue settings one function may set for itself
/// (`aqw.functions.<Name>.maxDequeueCount`, `.visibilityTimeout`,
/// `.batchSize`, `.retry`); `None` keeps the app's (`extensions.queues`,
/// `aqw.retry`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QueueOverrides {
    /// The function's cap on attempts.
    pub max_dequeue_count: Option<u32>,
    /// The function's `visibilityTimeout` (the `fixed` retry's delay; shown
    /// as set, already folded into `retry`).
    pub visibility_timeout: Option<Duration>,
    /// Messages received at once for this function (`aqw run`).
    pub batch_size: Option<u32>,
    /// The function's retry strategy, resolved with its visibility timeout.
    pub retry: Option<RetryStrategy>,
}

/// What the expiry guard (`crate::worker::rescue_expiring`) does with a
/// message aqw holds back that would reach its time-to-live
/// (`aqw.functions.<Name>.expiry`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Expiry {
    /// `"rescue"` (the default): put it back as a fresh copy before it
    /// expires, and alert once an hour per replica: Azure deletes an
    /// expired message silently, and nothing may be lost unseen.
    #[default]
    Rescue,
    /// `"expected"`: the producer set a short time-to-live on purpose (the
    /// work is worthless when late): count the messages that expire, and
    /// neither rescue them nor alert.
    Expected,
}

impl FunctionConfig {
    /// A function of `queue` named `name` with the defaults a `host.json`
    /// without an `aqw.functions.<name>` entry gives: keys from the
    /// payload's `idempotencyKey` field, the default breaker, no redaction,
    /// no provider key window, a handler registered in code; its storage is
    /// the one the worker is built on (`StorageAccount::embedded`).
    pub fn new(name: impl Into<String>, queue: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            queue: queue.into(),
            connection: StorageAccount::embedded(),
            key: KeySpec::PayloadField,
            handler: HandlerSpec::Registered,
            binding_name: "message".to_string(),
            binary_data: false,
            provider_key_window: None,
            breaker: Some(crate::breaker::BreakerSettings::default()),
            redact: crate::redact::Redaction::default(),
            limits: crate::flow::FlowLimits::default(),
            expiry: Expiry::Rescue,
            overrides: QueueOverrides::default(),
        }
    }

    /// The function's poison queue: `<queue>-poison`.
    pub(crate) fn poison_queue(&self) -> String {
        crate::poison::poison_queue_name(&self.queue)
    }
}

/// The validated, ready configuration of one app folder.
#[derive(Debug, Clone)]
pub struct AppConfig {
    /// The app folder (where `host.json` and the function folders are).
    pub app_dir: PathBuf,
    /// `extensions.queues.maxDequeueCount`: the delivery at which a failing
    /// message is poisoned.
    pub max_dequeue_count: u32,
    /// `extensions.queues.batchSize`: messages received at once per function.
    pub batch_size: u32,
    /// `extensions.queues.newBatchThreshold`: the next batch is received
    /// once no more than this many messages are still running.
    pub new_batch_threshold: u32,
    /// `extensions.queues.maxPollingInterval`: the longest wait between polls of an empty queue.
    pub max_polling_interval: Duration,
    /// `extensions.queues.messageEncoding`: how message text carries the payload.
    pub message_encoding: MessageEncoding,
    /// `functionTimeout`: how long one attempt may run; `None` = no limit.
    pub function_timeout: Option<Duration>,
    /// Lease on a received message (visibility while it runs).
    pub lease: Duration,
    /// `aqw.retry`: the delay before a failed message is seen again.
    pub retry: RetryStrategy,
    /// `aqw.tables.keys`: the idempotency key table.
    pub keys_table: String,
    /// `aqw.tables.poison`: the poison record table.
    pub poison_table: String,
    /// `aqw.tables.control`: pause and breaker state per function.
    pub control_table: String,
    /// Poll heartbeats (`aqw.tables.heartbeats`), read by `aqw status`.
    pub heartbeat_table: String,
    /// TTL of poison queue messages; `None` = never expires.
    pub poison_ttl: Option<Duration>,
    /// `aqw.poison.format`: aqw's envelope (default) or the raw body on
    /// `<queue>-poison`.
    pub poison_format: crate::poison::PoisonFormat,
    /// `aqw.alert.webhook`: where poison and breaker alerts are posted;
    /// `None` = logged only.
    pub alert_webhook: Option<url::Url>,
    /// `aqw.alert.window`: how long poison events are gathered into one alert.
    pub alert_window: Duration,
    /// `aqw.alert.format`: the webhook body's shape.
    pub alert_format: crate::alert::AlertFormat,
    /// `aqw.alert.dashboardUrl`: linked from every alert (`{queue}` filled in).
    pub alert_dashboard_url: Option<url::Url>,
    /// `aqw.alert.secret`, resolved: signs each webhook body.
    pub alert_secret: Option<crate::alert::SigningSecret>,
    /// `aqw.alert.runbookUrl`: the runbook link of every alert (an https
    /// URL); `None`: alerts name `aqw oncall`, the runbook in the binary.
    pub alert_runbook_url: Option<url::Url>,
    /// `aqw.http.port`: the port of the health and metrics endpoint; `None`
    /// = no endpoint.
    pub http_port: Option<u16>,
    /// `aqw.http.metricsInterval`: how often the health gauges are refreshed.
    pub metrics_interval: Duration,
    /// `aqw.tracing.parent`: where a JSON payload carries its producer's
    /// trace context (RFC 6901 pointer). Queue messages have no headers, so
    /// nothing is read or written there unless this is set.
    pub trace_parent: Option<String>,
    /// `aqw.shutdownTimeout`: how long in-flight jobs may run on after a
    /// shutdown signal before they are interrupted.
    pub shutdown_timeout: Duration,
    /// `aqw.maxDeferral`: how long a job may be put off by its provider's
    /// "later" (429, or any refusal with `Retry-After`) without spending an
    /// attempt, counted from its key's first attempt; then its later
    /// refusals count as failures again.
    pub max_deferral: Duration,
    /// `aqw.inProgressTimeout`: how long a provider's "in progress" (409)
    /// is waited out without spending an attempt, counted from its first
    /// such answer for the key; then each is an uncertain attempt.
    pub in_progress_timeout: Duration,
    /// `aqw.adaptiveRate`: a function's call rate adapts to its provider's
    /// throttling ([`crate::flow::adaptive`]); on unless `false`.
    pub adaptive_rate: bool,
    /// `aqw.alert.throttledFor`: a function throttled this long raises an
    /// alert.
    pub alert_throttled_for: Duration,
    /// `aqw.retention`: what the purge commands and the sweep may delete.
    pub retention: Retention,
    /// `concurrency.dynamicConcurrencyEnabled` in host.json. The Functions
    /// host applies it to its own queue listener (`aqw serve`); `aqw run`
    /// does not adapt its concurrency and says so at start-up, keeping
    /// `batchSize` and `newBatchThreshold`.
    pub dynamic_concurrency: bool,
    /// The functions aqw runs.
    pub functions: Vec<FunctionConfig>,
    /// Function folders aqw does not run: disabled, or not a queue trigger.
    /// `aqw run` warns about each; `aqw serve` answers their invocations 404.
    pub skipped: Vec<SkippedFunction>,
    /// `aqw.schedules`: ticks put as keyed jobs on a function's queue.
    pub schedules: Vec<crate::schedule::Schedule>,
    /// `aqw.claimCheck`: jobs too large for a message go to a blob.
    pub claim_check: crate::claim::ClaimCheck,
}

/// A function of the app folder that aqw leaves alone, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedFunction {
    /// The function folder's name.
    pub name: String,
    /// Why aqw does not run it.
    pub reason: String,
}

impl AppConfig {
    /// The configuration an empty `host.json` gives (Functions defaults:
    /// `maxDequeueCount` 5, `batchSize` 16, `newBatchThreshold` half the
    /// batch per core, base64 messages; aqw's: a 30 s lease, exponential
    /// retry from 1 s to 5 min, tables `aqwkeys`, `aqwpoison`, `aqwcontrol`,
    /// `aqwheartbeats`), with no functions. The binary's loader is checked
    /// against it (`config::tests` in crate `aqw`).
    pub(crate) fn defaults(app_dir: impl Into<PathBuf>) -> Self {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1);
        let batch_size = 16;
        Self {
            app_dir: app_dir.into(),
            max_dequeue_count: 5,
            batch_size,
            new_batch_threshold: (batch_size / 2) * cores,
            max_polling_interval: Duration::from_secs(60),
            message_encoding: MessageEncoding::Base64,
            function_timeout: None,
            lease: Duration::from_secs(30),
            retry: RetryStrategy::Exponential {
                initial_delay: Duration::from_secs(1),
                max_delay: Duration::from_secs(300),
            },
            keys_table: "aqwkeys".into(),
            poison_table: "aqwpoison".into(),
            control_table: "aqwcontrol".into(),
            heartbeat_table: "aqwheartbeats".into(),
            poison_ttl: None,
            poison_format: crate::poison::PoisonFormat::default(),
            alert_webhook: None,
            alert_window: Duration::from_secs(300),
            alert_format: crate::alert::AlertFormat::default(),
            alert_dashboard_url: None,
            alert_secret: None,
            alert_runbook_url: None,
            http_port: None,
            metrics_interval: Duration::from_secs(60),
            trace_parent: None,
            shutdown_timeout: Duration::from_secs(25),
            max_deferral: crate::decide::DEFAULT_MAX_DEFERRAL,
            in_progress_timeout: crate::decide::DEFAULT_IN_PROGRESS_TIMEOUT,
            adaptive_rate: true,
            alert_throttled_for: crate::flow::adaptive::DEFAULT_THROTTLED_FOR,
            retention: Retention::default(),
            dynamic_concurrency: false,
            functions: vec![],
            skipped: vec![],
            schedules: vec![],
            claim_check: crate::claim::ClaimCheck::defaults(MessageEncoding::Base64),
        }
    }

    /// Cap, retry delays, lease and timeout, as the engine's [`Policy`](crate::decide::Policy).
    pub(crate) fn policy(&self) -> crate::decide::Policy {
        crate::decide::Policy {
            max_dequeue_count: self.max_dequeue_count,
            retry: self.retry,
            lease: self.lease,
            timeout: self.function_timeout,
            host_poisons_failed_last_attempt: false,
            max_deferral: self.max_deferral,
            in_progress_timeout: self.in_progress_timeout,
        }
    }

    /// `policy` with `function`'s overrides
    /// ([`QueueOverrides`]): its cap and its retry strategy.
    pub fn policy_for(&self, function: &FunctionConfig) -> crate::decide::Policy {
        let o = &function.overrides;
        crate::decide::Policy {
            max_dequeue_count: o.max_dequeue_count.unwrap_or(self.max_dequeue_count),
            retry: o.retry.unwrap_or(self.retry),
            ..self.policy()
        }
    }

    /// `function`'s batch size and new-batch threshold under `aqw run`: the
    /// app's, or its own `batchSize` with the Functions default threshold
    /// for it (half the batch per core).
    pub fn batch_for(&self, function: &FunctionConfig) -> (u32, u32) {
        match function.overrides.batch_size {
            None => (self.batch_size, self.new_batch_threshold),
            Some(b) => {
                let cores = std::thread::available_parallelism()
                    .map(|n| n.get() as u32)
                    .unwrap_or(1);
                (b, (b / 2) * cores)
            }
        }
    }

    /// The function named `name`, if the app has one.
    pub fn function(&self, name: &str) -> Option<&FunctionConfig> {
        self.functions.iter().find(|f| f.name == name)
    }

    /// Where and how poison alerts are posted, when a webhook is set.
    pub fn alert_target(&self) -> Option<crate::alert::Webhook> {
        self.alert_webhook.clone().map(|url| crate::alert::Webhook {
            url,
            format: self.alert_format,
            dashboard_url: self.alert_dashboard_url.clone(),
            secret: self.alert_secret.clone(),
            runbook_url: self.alert_runbook_url.clone(),
            queues: self
                .functions
                .iter()
                .map(|f| (f.name.clone(), f.queue.clone()))
                .collect(),
        })
    }

    /// Functions consuming `queue` (the source queue of a poison record).
    pub fn function_for_queue(&self, queue: &str) -> Option<&FunctionConfig> {
        self.functions.iter().find(|f| f.queue == queue)
    }
}

/// Why a queue, table or function name is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// Not 3-63 lowercase letters, digits and dashes.
    #[error("\"{name}\" is not a valid queue name (3-63 lowercase letters, digits and dashes)")]
    QueueCharacters {
        /// The name as given.
        name: String,
    },
    /// A leading, trailing or double dash.
    #[error("\"{name}\" is not a valid queue name (no leading, trailing or double dash)")]
    QueueDashes {
        /// The name as given.
        name: String,
    },
    /// A `-poison` queue, which is replayed rather than consumed.
    #[error(
        "\"{name}\" is a poison queue; replay it with `aqw poison replay` instead of consuming it"
    )]
    PoisonQueue {
        /// The name as given.
        name: String,
    },
    /// No room for the `-poison` twin within 63 characters.
    #[error("\"{name}\" is too long for its -poison twin (at most 56 characters)")]
    QueueTooLongForPoisonTwin {
        /// The name as given.
        name: String,
    },
    /// Not a table name Azure takes.
    #[error(
        "\"{name}\" is not a valid table name (3-63 letters and digits, starting with a letter)"
    )]
    Table {
        /// The name as given.
        name: String,
    },
    /// Not a function name Functions takes.
    #[error("\"{name}\" is not a valid function name (letters, digits, _ and -, starting with a letter)")]
    Function {
        /// The name as given.
        name: String,
    },
}

/// Azure queue name rules, plus room for the `-poison` twin.
pub fn validate_queue_name(name: &str) -> Result<(), NameError> {
    let name_ = || name.to_string();
    let ok_chars = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if name.len() < 3 || name.len() > 63 || !ok_chars {
        return Err(NameError::QueueCharacters { name: name_() });
    }
    if name.starts_with('-') || name.ends_with('-') || name.contains("--") {
        return Err(NameError::QueueDashes { name: name_() });
    }
    if name.ends_with(crate::poison::POISON_SUFFIX) {
        return Err(NameError::PoisonQueue { name: name_() });
    }
    if name.len() + crate::poison::POISON_SUFFIX.len() > 63 {
        return Err(NameError::QueueTooLongForPoisonTwin { name: name_() });
    }
    Ok(())
}

/// A table name Azure takes (3-63 letters and digits, starting with a letter).
pub fn validate_table_name(name: &str) -> Result<(), NameError> {
    let ok = name.len() >= 3
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_alphanumeric())
        && name.as_bytes()[0].is_ascii_alphabetic();
    if ok {
        Ok(())
    } else {
        Err(NameError::Table {
            name: name.to_string(),
        })
    }
}

/// A function name as Functions takes it (letters, digits, `_` and `-`,
/// starting with a letter, at most 128).
pub fn validate_function_name(name: &str) -> Result<(), NameError> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        && name.as_bytes()[0].is_ascii_alphabetic();
    if ok {
        Ok(())
    } else {
        Err(NameError::Function {
            name: name.to_string(),
        })
    }
}
