//! The built-in `exec` handler: run a command with the payload on stdin.
//!
//! Exit 0 success, 75 (EX_TEMPFAIL) retry later, 65 (EX_DATAERR) permanent,
//! anything else retryable; the stderr tail becomes the recorded error.

use super::{Handler, HandlerError, Job, Success};
use async_trait::async_trait;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const STDERR_TAIL: usize = 2048;

pub struct ExecHandler {
    command: Vec<String>,
    timeout: Option<Duration>,
    working_dir: PathBuf,
}

impl ExecHandler {
    pub fn new(command: Vec<String>, timeout: Option<Duration>, working_dir: PathBuf) -> Self {
        Self {
            command,
            timeout,
            working_dir,
        }
    }
}

fn tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim();
    if text.len() <= STDERR_TAIL {
        return text.to_string();
    }
    let mut start = text.len() - STDERR_TAIL;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &text[start..])
}

impl ExecHandler {
    /// The program with the job's facts in its environment; the payload goes
    /// to its stdin.
    fn command_for(&self, job: &Job) -> tokio::process::Command {
        let program = &self.command[0];
        // "./script.sh" means the app folder's script, whatever our own cwd.
        let resolved = if program.contains('/')
            && std::path::Path::new(program).is_relative()
            && !self.working_dir.as_os_str().is_empty()
        {
            self.working_dir.join(program)
        } else {
            PathBuf::from(program)
        };
        let mut cmd = tokio::process::Command::new(&resolved);
        cmd.args(&self.command[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .env("AQW_FUNCTION", &job.function)
            .env("AQW_MESSAGE_ID", &job.message_id)
            .env("AQW_DEQUEUE_COUNT", job.dequeue_count.to_string())
            .env("AQW_KEY", job.key.as_deref().unwrap_or(""))
            .env(
                "AQW_PROVIDER_KEY",
                job.provider_key.as_deref().unwrap_or(""),
            )
            .env(
                "AQW_PREVIOUSLY_PENDING",
                if job.previously_pending { "1" } else { "0" },
            );
        trace_env(&mut cmd, job);
        if !self.working_dir.as_os_str().is_empty() {
            cmd.current_dir(&self.working_dir);
        }
        cmd
    }
}

#[async_trait]
impl Handler for ExecHandler {
    async fn handle(&self, job: &Job) -> Result<Success, HandlerError> {
        let program = &self.command[0];
        let mut cmd = self.command_for(job);
        let mut child = cmd
            .spawn()
            .map_err(|e| HandlerError::retryable(format!("exec {program}: cannot start: {e}")))?;
        let mut stdin = child.stdin.take().expect("stdin is piped");
        let mut stderr = child.stderr.take().expect("stderr is piped");
        let payload = job.payload.clone();
        let run = async move {
            // A child that does not read stdin closes it early: not an error.
            let writer = async move {
                let _ = stdin.write_all(payload.as_bytes()).await;
                drop(stdin);
            };
            let mut err = Vec::new();
            let reader = stderr.read_to_end(&mut err);
            let (_, _) = tokio::join!(writer, reader);
            let status = child.wait().await;
            (status, err)
        };
        let (status, err) = match self.timeout {
            Some(t) => tokio::time::timeout(t, run).await.map_err(|_| {
                HandlerError::uncertain(format!("exec {program}: timed out after {t:?}"))
            })?,
            None => run.await,
        };
        let status = status.map_err(|e| HandlerError::retryable(format!("exec {program}: {e}")))?;
        exit_result(program, status.code(), &tail(&err))
    }
}

/// The exit code's meaning (sysexits): 0 done, 65 permanent, 75 retry later;
/// anything else (or a signal) may have done its work, so it is uncertain.
fn exit_result(
    program: &str,
    code: Option<i32>,
    stderr_tail: &str,
) -> Result<Success, HandlerError> {
    let describe = |what: &str| {
        if stderr_tail.is_empty() {
            format!("exec {program}: {what}")
        } else {
            format!("exec {program}: {what}: {stderr_tail}")
        }
    };
    match code {
        Some(0) => Ok(Success::done()),
        Some(65) => Err(HandlerError::permanent(describe("exit 65 (permanent)"))),
        Some(75) => Err(HandlerError::retryable(describe("exit 75 (retry later)"))),
        // Any other exit or a signal: the program may have done its work.
        Some(c) => Err(HandlerError::uncertain(describe(&format!("exit {c}")))),
        None => Err(HandlerError::uncertain(describe("killed by a signal"))),
    }
}

/// W3C trace context for the program's own tracing (the OpenTelemetry SDKs
/// read `TRACEPARENT` / `TRACESTATE` from the environment); never inherited
/// from aqw's own environment.
fn trace_env(cmd: &mut tokio::process::Command, job: &Job) {
    cmd.env_remove("TRACEPARENT").env_remove("TRACESTATE");
    if let Some(t) = &job.trace {
        cmd.env("TRACEPARENT", t.traceparent());
        if let Some(state) = &t.tracestate {
            cmd.env("TRACESTATE", state);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> Job {
        Job {
            function: "F".into(),
            message_id: "m1".into(),
            dequeue_count: 2,
            payload: "{\"a\":1}".into(),
            key: Some(aqw_core::idempotency::IdempotencyKey::new("k:1").unwrap()),
            provider_key: Some("pk".into()),
            previously_pending: true,
            key_partition: None,
            trace: None,
        }
    }

    fn sh(script: &str) -> ExecHandler {
        ExecHandler::new(
            vec!["sh".into(), "-c".into(), script.into()],
            Some(Duration::from_secs(20)),
            PathBuf::new(),
        )
    }

    #[tokio::test]
    async fn exit_codes_map_to_results() {
        assert!(sh("cat >/dev/null; exit 0").handle(&job()).await.is_ok());
        let e = sh("echo nope >&2; exit 65")
            .handle(&job())
            .await
            .unwrap_err();
        assert!(
            matches!(e, HandlerError::Permanent { .. }) && e.to_string().contains("nope"),
            "{e}"
        );
        assert!(matches!(
            sh("exit 75").handle(&job()).await,
            Err(HandlerError::Retryable { .. })
        ));
        assert!(matches!(
            sh("exit 3").handle(&job()).await,
            Err(HandlerError::Retryable { .. })
        ));
    }

    #[tokio::test]
    async fn payload_and_environment_reach_the_command() {
        let h = sh(
            r#"p=$(cat); [ "$p" = '{"a":1}' ] && [ "$AQW_KEY" = "k:1" ] && [ "$AQW_PROVIDER_KEY" = pk ] \
            && [ "$AQW_PREVIOUSLY_PENDING" = 1 ] && [ "$AQW_DEQUEUE_COUNT" = 2 ] && [ "$AQW_MESSAGE_ID" = m1 ]"#,
        );
        h.handle(&job()).await.unwrap();
    }

    #[tokio::test]
    async fn missing_program_is_a_clear_retryable_error() {
        let h = ExecHandler::new(
            vec!["/nonexistent/aqw-handler".into()],
            None,
            PathBuf::new(),
        );
        let e = h.handle(&job()).await.unwrap_err();
        assert!(e.to_string().contains("cannot start"), "{e}");
    }

    #[tokio::test]
    async fn stderr_is_tailed() {
        let e = sh("head -c 10000 /dev/zero | tr '\\0' x >&2; echo END >&2; exit 1")
            .handle(&job())
            .await
            .unwrap_err();
        let msg = e.to_string();
        assert!(msg.ends_with("END") && msg.len() < 2300, "{}", msg.len());
    }
}
