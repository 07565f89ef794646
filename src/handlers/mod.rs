//! Handlers: the code that performs a job's effect.
//!
//! A handler returns a typed result: success (optionally with entities to
//! write in the same transaction as the key's `done` mark), retryable
//! (optionally with a retry-after) or permanent. Built-ins: [`http`] and
//! [`exec`]; an embedding binary registers its own by function name.

pub mod exec;
pub mod http;
pub mod lookup;
pub mod rate_headers;

use aqw_core::handler::{Handler, HandlerError, HandlerSpec, Job, ProviderAnswer, Success};
use std::collections::HashMap;
use std::sync::Arc;

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
