//! Running the handler for one attempt: its span and duration metric, lease
//! renewal at half-life, `functionTimeout`, and the hard stop at shutdown.

use super::settle::{Settle, Settling};
use crate::handler::{HandlerError, Job, Success};
use crate::idempotency::ClaimedKey;
use crate::runtime::FunctionRuntime;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// How the handler's attempt ended, before it is read as an
/// [`crate::decide::AttemptResult`].
pub(super) enum HandlerRun {
    Finished(Result<Success, HandlerError>),
    TimedOut(Duration),
    Interrupted,
}

impl Settling<'_> {
    /// Run the handler under the claim; the success is kept for `complete`.
    pub(super) async fn run(
        &mut self,
        payload: String,
        hard_stop: &CancellationToken,
    ) -> (HandlerRun, Option<Success>) {
        let rt = self.rt;
        let claim = self.claim.as_ref();
        // The handler call is its own span; its context is what the handler
        // receives (traceparent header, TRACEPARENT), so its spans hang there.
        let span = crate::traces::step_span!("aqw.handler", otel.kind = "client", function = %rt.function.name,
            otel.status_code = tracing::field::Empty, otel.status_message = tracing::field::Empty);
        let job = Job {
            function: rt.function.name.clone(),
            message_id: self.msg.id.clone(),
            dequeue_count: self.msg.dequeue_count,
            payload,
            key: self.key.cloned(),
            provider_key: claim.map(|c| c.provider_key.clone()),
            previously_pending: claim.is_some_and(|c| c.previously_pending),
            key_partition: claim.map(|c| c.partition_key.clone()),
            trace: Some(self.trace.context_within(&span)),
        };
        let started = Instant::now();
        let handler = run_handler(rt, &job, self.settle, self.claim.as_mut(), hard_stop);
        let run = crate::traces::in_step(span.clone(), handler).await;
        match &run {
            HandlerRun::Finished(Err(e)) => crate::traces::fail_step(&span, &e.to_string()),
            HandlerRun::TimedOut(_) => crate::traces::fail_step(&span, "functionTimeout exceeded"),
            HandlerRun::Interrupted => crate::traces::fail_step(&span, "interrupted by shutdown"),
            HandlerRun::Finished(Ok(_)) => {}
        }
        metrics::histogram!("aqw_handler_duration_seconds", "function" => rt.function.name.clone())
            .record(started.elapsed().as_secs_f64());
        match run {
            HandlerRun::Finished(Ok(success)) => {
                (HandlerRun::Finished(Ok(Success::done())), Some(success))
            }
            other => (other, None),
        }
    }
}

/// Run the handler, renewing the message and key leases at half-life, under
/// `functionTimeout`, until it finishes or a hard stop interrupts it.
async fn run_handler(
    rt: &FunctionRuntime,
    job: &Job,
    settle: &dyn Settle,
    mut claim: Option<&mut ClaimedKey>,
    hard_stop: &CancellationToken,
) -> HandlerRun {
    let lease = rt.app.lease;
    let half = lease / 2;
    let handler = rt.handler.clone();
    let fut = handler.handle(job);
    tokio::pin!(fut);
    let deadline = rt
        .app
        .function_timeout
        // A timeout past what an instant holds is no timeout.
        .and_then(|t| tokio::time::Instant::now().checked_add(t));
    let mut renew_at = tokio::time::Instant::now() + half;
    loop {
        let timeout = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            r = &mut fut => return HandlerRun::Finished(r),
            _ = timeout => return HandlerRun::TimedOut(rt.app.function_timeout.unwrap_or_default()),
            _ = hard_stop.cancelled() => return HandlerRun::Interrupted,
            _ = tokio::time::sleep_until(renew_at) => {
                if let Err(e) = settle.renew(lease).await {
                    warn!(error = %e, "could not renew the message lease");
                }
                if let Some(c) = claim.as_deref_mut() {
                    if let Err(e) = rt.keys.extend(c, lease).await {
                        warn!(error = %e, "could not extend the key lease");
                    }
                }
                renew_at += half;
            }
        }
    }
}
