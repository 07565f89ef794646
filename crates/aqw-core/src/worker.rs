//! `aqw run`: a poll loop per function feeds [`crate::job::process`]
//! (permits before receiving, so at most `batchSize + newBatchThreshold`
//! jobs are in flight), backs off on empty polls and storage failures, and
//! drains in-flight jobs on shutdown. The retention sweep
//! ([`crate::retention::sweep`]) runs beside the loops at its own low rate.

use crate::breaker::Admission;
use crate::config::AppConfig;
pub use crate::job::QueueSettle;
use crate::job::{process, producer_context, record_outcome};
use crate::retry::polling_delay;
use crate::runtime::{ensure_resources, FunctionRuntime};
use crate::storage::{ReceivedMessage, StorageError};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn, Instrument};

/// Poll one function's queue until `shutdown`; in-flight jobs run on `tracker`.
pub async fn poll_loop(
    rt: Arc<FunctionRuntime>,
    shutdown: CancellationToken,
    hard_stop: CancellationToken,
    tracker: TaskTracker,
    health: Arc<Health>,
) {
    let app = rt.app.clone();
    let (batch, threshold) = app.batch_for(&rt.function);
    let capacity = batch + threshold;
    let permits = Arc::new(Semaphore::new(capacity as usize));
    let mut empty_polls = 0u32;
    let mut failures = 0u32;
    let mut heartbeat = crate::heartbeat::Pacer::default();
    let mut last_rescue = first_look();
    loop {
        // Paused, or the breaker open: receive nothing (in-flight jobs go on).
        let Some(want) = admitted(&rt, batch, &shutdown, &mut last_rescue).await else {
            break;
        };
        let in_flight = capacity.saturating_sub(permits.available_permits() as u32);
        let Some(want) = within_ramp(&rt, want, in_flight) else {
            tokio::select! { biased;
                _ = tokio::time::sleep(RAMP_POLL) => continue,
                _ = shutdown.cancelled() => break,
            }
        };
        // Take the permits before receiving: poll only when in-flight ≤ newBatchThreshold.
        let mut owned = tokio::select! {
            biased;
            p = permits.clone().acquire_many_owned(want) => p.expect("semaphore never closed"),
            _ = shutdown.cancelled() => break,
        };
        // Waiting for permits can outlast a pause taking hold: ask again
        // (nothing is received once a pause is visible).
        if rt.gate.paused() {
            continue;
        }
        let delay = match receive_within_limits(&rt, want, &shutdown).await {
            Received::Messages(msgs, tickets) => {
                failures = 0;
                polled(&rt, &health, &mut heartbeat);
                empty_polls = if msgs.is_empty() { empty_polls + 1 } else { 0 };
                spawn_jobs(&tracker, &rt, (msgs, tickets), &mut owned, &hard_stop);
                next_poll(empty_polls, app.max_polling_interval)
            }
            Received::Failed(e) => receive_failed(&rt, &health, &mut failures, e).await,
            Received::OverLimit(wait) => over_limit(&rt, &mut last_rescue, wait).await,
            Received::Shutdown => break,
        };
        drop(owned);
        if !delay.is_zero() {
            tokio::select! {
                biased;
                _ = tokio::time::sleep(delay) => {}
                _ = shutdown.cancelled() => break,
            }
        }
    }
}

/// What one receive under the function's flow limits gave.
enum Received {
    /// Messages (maybe none), each with its ticket when the function has limits.
    Messages(Vec<ReceivedMessage>, Vec<crate::flow::Ticket>),
    /// The receive failed.
    Failed(StorageError),
    /// A fleet-wide limit is reached: receive nothing for this long.
    OverLimit(Duration),
    /// Shutdown came first.
    Shutdown,
}

/// Receive up to `want` messages, within the fleet-wide limits when the
/// function has any ([`crate::flow`]): slots taken and calls reserved
/// first, and what the receive did not use handed back.
async fn receive_within_limits(
    rt: &FunctionRuntime,
    want: u32,
    shutdown: &CancellationToken,
) -> Received {
    // The adaptive rate first (local, free while the provider has not
    // throttled), then the fleet-wide limits.
    let want = match rt.adaptive.take(want) {
        Ok(n) => n,
        Err(wait) => {
            // Jittered, so replicas cut at the same throttle do not call
            // again in the same instant.
            let jitter = crate::entropy::gen_range(0.8..1.2);
            return Received::OverLimit(wait.mul_f64(jitter).min(MAX_LIMIT_WAIT));
        }
    };
    let grant = match &rt.flow {
        None => None,
        Some(flow) => match flow.before_receive(want).await {
            Ok(g) => Some(g),
            Err(wait) => {
                rt.adaptive.give_back(want);
                return Received::OverLimit(wait.min(MAX_LIMIT_WAIT));
            }
        },
    };
    let n = grant.as_ref().map_or(want, |g| g.receive);
    let received = tokio::select! {
        biased;
        r = rt.source.receive(n as u8, rt.app.lease) => Some(r),
        _ = shutdown.cancelled() => None,
    };
    let got = match &received {
        Some(Ok(msgs)) => msgs.len() as u32,
        _ => 0,
    };
    rt.adaptive.give_back(want.saturating_sub(got));
    let tickets = match (&rt.flow, grant) {
        (Some(flow), Some(grant)) => flow.after_receive(grant, got).await,
        _ => Vec::new(),
    };
    match received {
        None => Received::Shutdown,
        Some(Ok(msgs)) => Received::Messages(msgs, tickets),
        Some(Err(e)) => Received::Failed(e),
    }
}

/// The longest a poll loop over a limit sleeps before asking again.
const MAX_LIMIT_WAIT: Duration = Duration::from_secs(5);

/// How long to wait before the next receive: at once after messages came,
/// Functions' back-off after `empty_polls` empty receives in a row.
fn next_poll(empty_polls: u32, max_polling_interval: Duration) -> Duration {
    if empty_polls == 0 {
        return Duration::ZERO;
    }
    polling_delay(empty_polls, max_polling_interval, crate::entropy::gen())
}

/// `want` within the breaker's ramp after a close, whose allowance caps the
/// jobs in flight (not only one receive); `None` while at the allowance.
fn within_ramp(rt: &FunctionRuntime, want: u32, in_flight: u32) -> Option<u32> {
    match rt.gate.allowance() {
        Some(allowed) if in_flight >= allowed => None,
        Some(allowed) => Some(want.min(allowed - in_flight)),
        None => Some(want),
    }
}

/// Each received message on the tracker, with one of the loop's permits.
fn spawn_jobs(
    tracker: &TaskTracker,
    rt: &Arc<FunctionRuntime>,
    (msgs, tickets): (Vec<ReceivedMessage>, Vec<crate::flow::Ticket>),
    owned: &mut OwnedSemaphorePermit,
    hard_stop: &CancellationToken,
) {
    let mut tickets = tickets.into_iter();
    for msg in msgs {
        let permit = owned.split(1).expect("one permit per received message");
        let job = (msg, tickets.next());
        spawn_job(tracker, rt.clone(), job, permit, hard_stop.clone());
    }
}

/// A receive answered: ready again (unless draining), the liveness beat,
/// and the poll heartbeat when one is due.
fn polled(rt: &Arc<FunctionRuntime>, health: &Health, heartbeat: &mut crate::heartbeat::Pacer) {
    health
        .ready
        .store(!health.draining.load(Ordering::Relaxed), Ordering::Relaxed);
    health.beat();
    if heartbeat.due(Instant::now()) {
        spawn_heartbeat(rt);
    }
}

/// How many messages the gate lets this loop receive, once it lets any
/// (None at shutdown).
/// While held, the queue is looked at every [`EXPIRY_GUARD_INTERVAL`] for
/// messages about to expire ([`rescue_expiring`]); `last_rescue` is the
/// loop's, kept across holds, so a breaker whose probes come and go still
/// looks every interval.
async fn admitted(
    rt: &FunctionRuntime,
    batch: u32,
    shutdown: &CancellationToken,
    last_rescue: &mut Instant,
) -> Option<u32> {
    loop {
        match rt.gate.admit(batch) {
            Admission::Receive(n) => return Some(n),
            Admission::Wait(d) => {
                guard_expiry(rt, last_rescue).await;
                tokio::select! {
                    biased;
                    _ = tokio::time::sleep(d.min(GATE_POLL)) => {}
                    _ = shutdown.cancelled() => return None,
                }
            }
        }
    }
}

/// The expiry guard's "last look" as a poll loop starts: long enough ago
/// that the first hold looks at once (a message may be near its expiry
/// already).
fn first_look() -> Instant {
    Instant::now()
        .checked_sub(EXPIRY_GUARD_INTERVAL)
        .unwrap_or_else(Instant::now)
}

/// Over a flow limit, the backlog waits too: guard it from expiry, then
/// wait `wait`.
async fn over_limit(rt: &FunctionRuntime, last_rescue: &mut Instant, wait: Duration) -> Duration {
    guard_expiry(rt, last_rescue).await;
    wait
}

/// Look for held messages about to expire ([`rescue_expiring`]) when the
/// loop's last look is [`EXPIRY_GUARD_INTERVAL`] old.
async fn guard_expiry(rt: &FunctionRuntime, last_rescue: &mut Instant) {
    if last_rescue.elapsed() >= EXPIRY_GUARD_INTERVAL {
        rescue_expiring(rt).await;
        *last_rescue = Instant::now();
    }
}

/// The longest a gated poll loop sleeps before asking again, so a resume
/// or the end of a cool-down is noticed at once.
const GATE_POLL: Duration = Duration::from_millis(500);

/// How long a ramping loop at its allowance waits before looking again.
const RAMP_POLL: Duration = Duration::from_millis(100);

/// The most messages one look of the expiry guard puts back (rounds of a
/// peek of 32), so a held backlog is walked front to back, bounded.
const RESCUE_ROUNDS: usize = 20;

/// How often a held function (paused, breaker open or following) looks at
/// the front of its queue for messages about to expire: one peek per
/// interval per held function and replica.
const EXPIRY_GUARD_INTERVAL: Duration = Duration::from_secs(300);

/// A message whose time-to-live ends within this is rescued: three guard
/// intervals, so one missed look (a storage error) still leaves time.
const EXPIRY_MARGIN: Duration = Duration::from_secs(900);

/// No message expires unseen while aqw holds it back (issue 37): Azure
/// deletes an expired message silently, so while a function is held
/// (paused, breaker open or following, over a flow limit), the oldest
/// messages (the front of the queue, which expire first) are peeked. The
/// messages found whose time-to-live ends within [`EXPIRY_MARGIN`] set the
/// `aqw_messages_at_risk` gauge, and then, by the function's
/// [`Expiry`](crate::config::Expiry):
///
/// - `rescue` (the default): while the peek finds any, as many are
///   received and put back as fresh copies (the same text, the default
///   7-day time-to-live, DequeueCount 0), then the originals deleted; at
///   most [`RESCUE_ROUNDS`] rounds a look. A crash between the two leaves
///   both; the key makes the second a duplicate. Logged
///   `aqw.message.expiry_rescued`, counted `aqw_expiry_rescued_total`, and
///   the first rescue in an hour raises the `aqw.message.expiry_at_risk`
///   alert (per replica: the fleet's replicas each look).
/// - `expected`: the producer's time-to-live is deliberate. Those that will
///   expire before the next look are counted (`aqw_expired_expected_total`,
///   by each replica that looks) and left to expire, without an alert.
pub(crate) async fn rescue_expiring(rt: &FunctionRuntime) -> usize {
    let margin = time::Duration::try_from(EXPIRY_MARGIN).unwrap_or(time::Duration::MAX);
    let name = rt.function.name.clone();
    let mut rescued = 0;
    for round in 0..RESCUE_ROUNDS {
        let now = crate::clock::now_utc();
        let Ok(peeked) = rt.source.peek(32).await else {
            break;
        };
        let due = peeked
            .iter()
            .filter(|m| m.expiration_time - now <= margin)
            .count();
        if round == 0 {
            metrics::gauge!("aqw_messages_at_risk", "function" => name.clone()).set(due as f64);
        }
        if due == 0 {
            break;
        }
        if rt.function.expiry == crate::config::Expiry::Expected {
            count_expected(rt, &peeked, now);
            break;
        }
        let Some(n) = put_back_received(rt, due).await else {
            break;
        };
        rescued += n;
    }
    if rescued > 0 {
        alert_expiry_at_risk(rt, rescued);
    }
    rescued
}

/// Receive up to `due` messages and put each back as a fresh copy; how
/// many were put back (`None` when nothing could be received).
async fn put_back_received(rt: &FunctionRuntime, due: usize) -> Option<usize> {
    let received = rt
        .source
        .receive(due as u8, Duration::from_secs(60))
        .await
        .ok()?;
    if received.is_empty() {
        return None;
    }
    let mut rescued = 0;
    // Every message received here is put back as a fresh copy, the due
    // ones and any other the receive returned: handing one back would
    // raise its DequeueCount, and rounds of that would walk it past the
    // cap without a run.
    for m in received {
        let scope = rt.app.claim_check.scope(&rt.function.queue);
        crate::claim::refresh_before_reput(
            rt.blobs.as_ref(),
            &m.text,
            rt.app.message_encoding,
            scope,
        )
        .await;
        if rt
            .source
            .put(&m.text, Duration::ZERO, crate::storage::Ttl::Default)
            .await
            .is_err()
        {
            continue;
        }
        let _ = rt.source.delete(&m.id, &m.pop_receipt).await;
        rescued += 1;
        warn!(event = "aqw.message.expiry_rescued", function = %rt.function.name, message_id = %m.id, expires = %m.expiration_time, "a held message was about to expire unseen: put back as a fresh copy");
        metrics::counter!("aqw_expiry_rescued_total", "function" => rt.function.name.clone())
            .increment(1);
    }
    Some(rescued)
}

/// `expected` expiry: count the peeked messages that will expire before
/// the next look, and say so once per look.
fn count_expected(
    rt: &FunctionRuntime,
    peeked: &[crate::storage::PeekedMessage],
    now: time::OffsetDateTime,
) {
    let next = time::Duration::try_from(EXPIRY_GUARD_INTERVAL).unwrap_or(time::Duration::MAX);
    let expiring = peeked
        .iter()
        .filter(|m| m.expiration_time - now <= next)
        .count();
    if expiring > 0 {
        info!(event = "aqw.message.expiring_as_declared", function = %rt.function.name, count = expiring, "held messages will expire before the next look, as their producer declared (expiry: expected)");
        metrics::counter!("aqw_expired_expected_total", "function" => rt.function.name.clone())
            .increment(expiring as u64);
    }
}

/// The `aqw.message.expiry_at_risk` alert, at most once an hour per
/// function on this replica.
fn alert_expiry_at_risk(rt: &FunctionRuntime, rescued: usize) {
    let now = Instant::now();
    {
        let mut last = rt.expiry_alerted.lock().unwrap();
        if last.is_some_and(|t| now.duration_since(t) < EXPIRY_ALERT_EVERY) {
            return;
        }
        *last = Some(now);
    }
    let summary = format!(
        "{rescued} held message(s) of {} were about to reach their time-to-live and were put back as fresh copies; the function is held (paused, breaker open or over a flow limit) longer than its messages live",
        rt.function.name
    );
    rt.alerts.notice(serde_json::json!({
        "event": "aqw.message.expiry_at_risk",
        "severity": "warning",
        "function": rt.function.name,
        "summary": summary,
        "worker": rt.worker_id,
        "runbook": crate::alert::runbook_link(None, Some("outage")),
    }));
}

/// The most often one replica raises the expiry alert for one function.
const EXPIRY_ALERT_EVERY: Duration = Duration::from_secs(3600);

/// Write this worker's poll heartbeat without holding up the loop; a failed
/// write only makes `aqw status` say the queue is not polled.
fn spawn_heartbeat(rt: &Arc<FunctionRuntime>) {
    let rt = rt.clone();
    crate::clock::spawn(async move {
        if let Err(e) = rt.heartbeats.beat(&rt.function.queue, &rt.worker_id).await {
            warn!(error = %e, "could not write the poll heartbeat");
        }
    });
}

/// The delay after a failed receive: a missing queue is created, anything
/// else backs off (and three failures in a row make the worker not ready).
async fn receive_failed(
    rt: &FunctionRuntime,
    health: &Health,
    failures: &mut u32,
    error: StorageError,
) -> Duration {
    let fname = &rt.function.name;
    if let StorageError::NotFound = error {
        // The queue does not exist yet: create it and carry on.
        if let Err(e) = rt.source.create_if_missing().await {
            warn!(function = %fname, error = %e, "cannot create the queue");
        }
        return Duration::from_millis(500);
    }
    *failures += 1;
    if *failures >= 3 {
        health.ready.store(false, Ordering::Relaxed);
    }
    health.beat();
    let d = polling_delay(
        *failures,
        rt.app.max_polling_interval.max(Duration::from_secs(5)),
        crate::entropy::gen(),
    );
    warn!(event = "aqw.storage.unavailable", function = %fname, error = %error, retry_in_ms = d.as_millis() as u64, "receive failed; backing off");
    d
}

/// Process one received message on the tracker, holding its permit until done.
fn spawn_job(
    tracker: &TaskTracker,
    rt: Arc<FunctionRuntime>,
    (msg, ticket): (ReceivedMessage, Option<crate::flow::Ticket>),
    permit: tokio::sync::OwnedSemaphorePermit,
    hard_stop: CancellationToken,
) {
    let span = crate::traces::job_span(
        &rt.function.name,
        &rt.function.queue,
        &msg.id,
        msg.dequeue_count,
    );
    // Decoded once: the trace context and the job read the same payload.
    let payload = crate::message::Payload::decode(&msg.text, rt.app.message_encoding);
    let trace = crate::traces::start_job(&span, producer_context(&rt, &payload).as_ref());
    tracker.spawn(crate::clock::carry(
        async move {
            // A call reserved under the rate limit starts at its slot.
            if let Some(start) = ticket.as_ref().and_then(|t| t.start) {
                tokio::time::sleep_until(start).await;
            }
            let settle = QueueSettle::new(rt.source.clone(), &msg);
            let started = Instant::now();
            let outcome = process(&rt, &msg, &payload, &settle, &trace, &hard_stop).await;
            record_outcome(&rt.function.name, &outcome, started.elapsed(), &trace);
            drop((permit, ticket));
        }
        .instrument(span),
    ));
}

/// The retention sweep beside the poll loops, stopped by `shutdown`.
fn spawn_sweeper(
    app: &AppConfig,
    rts: &[Arc<FunctionRuntime>],
    shutdown: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    spawn_sweeper_after(app.retention.sweep.interval, app, rts, shutdown)
}

/// [`spawn_sweeper`], its first round after `first`.
fn spawn_sweeper_after(
    first: Duration,
    app: &AppConfig,
    rts: &[Arc<FunctionRuntime>],
    shutdown: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    crate::clock::spawn(crate::retention::sweep::run_after(
        first,
        crate::runtime::sweep_targets(rts),
        app.retention.clone(),
        rts.first()
            .map(|rt| rt.worker_id.clone())
            .unwrap_or_default(),
        shutdown.clone(),
    ))
}

/// How soon after start an `aqw serve` instance asks for the sweeper lease
/// (±50 %): Flex instances may live minutes, less than a sweep interval.
const SERVE_FIRST_SWEEP: Duration = Duration::from_secs(60);

/// What `aqw serve` runs beside the Functions host, which polls the queues
/// itself: the retention sweep (one per account at a time, whatever the
/// number of instances: the sweeper lease of [`crate::retention::sweep`]),
/// each function's heartbeat once a minute (the host polls for as long as
/// the custom handler runs), the renewal of fleet flow slots, and the
/// schedules ([`crate::schedule`]: a tick claimed once by the fleet). The
/// gates' watch (pause, the breaker's fleet state) is started by the
/// caller, as for `aqw run`. Ends at `shutdown`.
pub async fn serve_maintenance(
    app: &AppConfig,
    rts: &[Arc<FunctionRuntime>],
    shutdown: CancellationToken,
) {
    // Soon after start (jittered, so instances started together do not ask
    // at once), never later than `aqw run` would.
    let soon = SERVE_FIRST_SWEEP.mul_f64(crate::entropy::gen_range(0.5..1.5));
    let first = soon.min(app.retention.sweep.interval);
    let sweeper = spawn_sweeper_after(first, app, rts, &shutdown);
    crate::schedule::spawn(app, rts, &shutdown);
    let flows_stop = shutdown.child_token();
    for flow in rts.iter().filter_map(|rt| rt.flow.clone()) {
        crate::clock::spawn(flow.renew(flows_stop.clone()));
    }
    let mut tick = tokio::time::interval(crate::heartbeat::HEARTBEAT_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = tick.tick() => rts.iter().for_each(spawn_heartbeat),
            _ = shutdown.cancelled() => break,
        }
    }
    let _ = sweeper.await;
}

/// Let in-flight jobs finish within `shutdown_timeout`, then interrupt and
/// release what is left.
async fn drain(tracker: &TaskTracker, hard_stop: &CancellationToken, shutdown_timeout: Duration) {
    tracker.close();
    info!(
        event = "aqw.worker.draining",
        in_flight = tracker.len(),
        timeout_s = shutdown_timeout.as_secs_f64(),
        "draining in-flight jobs"
    );
    if tokio::time::timeout(shutdown_timeout, tracker.wait())
        .await
        .is_err()
    {
        warn!(
            event = "aqw.worker.release",
            in_flight = tracker.len(),
            "shutdown timeout reached; releasing unfinished jobs"
        );
        hard_stop.cancel();
        // Releasing is a couple of storage calls per job.
        let _ = tokio::time::timeout(Duration::from_secs(10), tracker.wait()).await;
    }
}

/// What the ops endpoints report: readiness, draining, the last poll.
#[derive(Default)]
pub struct Health {
    /// `/readyz`: the queues and tables exist and receives are answered
    /// (three failed polls in a row clear it).
    pub ready: AtomicBool,
    /// Shutdown began: in-flight jobs finish, nothing new is received.
    pub draining: AtomicBool,
    /// Unix millis of the last completed poll (any function).
    pub last_poll_ms: AtomicU64,
}

impl Health {
    /// Note a completed poll now.
    pub fn beat(&self) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as u64;
        self.last_poll_ms.store(now, Ordering::Relaxed);
    }
}

/// Poll every runtime until `shutdown`, then drain: the queues and tables
/// created first (retried until storage answers), the gates watched, one
/// poll loop per function, the retention sweep beside them. `health` is
/// what the ops endpoints report.
pub(crate) async fn run_runtimes(
    app: &AppConfig,
    rts: &[Arc<FunctionRuntime>],
    health: Arc<Health>,
    shutdown: CancellationToken,
) {
    if !ensure_resources(rts, &shutdown).await {
        return;
    }
    health.ready.store(true, Ordering::Relaxed);
    info!(
        event = "aqw.worker.started",
        functions = rts.len(),
        "worker started"
    );
    let tracker = TaskTracker::new();
    let hard_stop = CancellationToken::new();
    for rt in rts {
        rt.gate.refresh().await;
    }
    let gates = rts.iter().map(|rt| rt.gate.clone()).collect();
    crate::clock::spawn(crate::gate::Gate::watch_all(gates, shutdown.clone()));
    let loops: Vec<_> = rts
        .iter()
        .map(|rt| {
            crate::clock::spawn(poll_loop(
                rt.clone(),
                shutdown.clone(),
                hard_stop.clone(),
                tracker.clone(),
                health.clone(),
            ))
        })
        .collect();
    let sweeper = spawn_sweeper(app, rts, &shutdown);
    // Slots held by jobs are renewed until the drain ends.
    let flows_stop = CancellationToken::new();
    for flow in rts.iter().filter_map(|rt| rt.flow.clone()) {
        crate::clock::spawn(flow.renew(flows_stop.clone()));
    }
    shutdown.cancelled().await;
    let _ = sweeper.await;
    health.draining.store(true, Ordering::Relaxed);
    health.ready.store(false, Ordering::Relaxed);
    for l in loops {
        let _ = l.await;
    }
    drain(&tracker, &hard_stop, app.shutdown_timeout).await;
    flows_stop.cancel();
    info!(event = "aqw.worker.stopped", "worker stopped");
}
