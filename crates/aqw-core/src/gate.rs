//! What a function's poll loop asks before each receive: is it paused by an
//! operator (the control row, read every [`WATCH_INTERVAL`]), and what does
//! its circuit breaker ([`crate::breaker`]) allow. The [`Gate`] also hears
//! how each attempt ended, and makes every breaker transition visible: one
//! log line, the `aqw_function_paused` and `aqw_breaker_state` gauges and `aqw_breaker_transitions_total`
//! counter, an alert webhook event, and the state on the control row where
//! `aqw status` reads it.

use crate::alert::{error_group, Alerts};
use crate::breaker::evidence::row_written_at;
use crate::breaker::{job_id, FleetView};
use crate::breaker::{Admission, Attempt, Breaker, BreakerSettings, Transition, SUSPECT_WAIT};
use crate::control::{Control, ControlStore, EvidenceRow, WATCH_INTERVAL};
use crate::flow::adaptive::{fleet_rate, rate_due, AdaptiveRate};
use crate::scrub::scrub;
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// How long a paused poll loop waits before asking again.
const PAUSED_POLL: Duration = Duration::from_millis(250);

/// One function's pause and breaker.
pub struct Gate {
    function: String,
    worker_id: String,
    control: ControlStore,
    /// The storage account of the control table (gates on the same table
    /// name in one account share a watch query).
    control_account: String,
    alerts: Alerts,
    paused: AtomicBool,
    breaker: Option<Mutex<BreakerState>>,
    /// The function's adaptive rate: shared on this replica's evidence
    /// row while throttled, and the fleet's taken in at each watch read.
    adaptive: Option<std::sync::Arc<AdaptiveRate>>,
    /// Woken after each control read ([`Gate::wait_while_suspect`]).
    read: tokio::sync::Notify,
}

struct BreakerState {
    breaker: Breaker,
    /// The last counted failure's text, for the transition's message.
    last_error: Option<String>,
    /// When this replica's breaker last changed state by itself (a newer
    /// `closed` of another replica closes it too).
    own_at: Option<time::OffsetDateTime>,
    /// Whether this replica's evidence row exists (to delete it once empty).
    evidence_row: bool,
    /// The learned rate last published on it, and when.
    published_rate: Option<(f64, Instant)>,
    /// Each other replica's evidence row as last read: its `at_ms` and
    /// when it was written on this replica's clock ([`row_written_at`]).
    rows_seen: std::collections::BTreeMap<String, (i64, Instant)>,
    /// This replica's previous evidence read.
    last_read: Option<Instant>,
}

impl Gate {
    /// The control rows this gate reads (the schedules keep theirs there too).
    pub(crate) fn control(&self) -> &ControlStore {
        &self.control
    }

    /// The gate of `function` on this worker: unpaused until the control row
    /// says otherwise, with a breaker when `settings` is set (`None`: no
    /// breaker). Transitions are published through `control` and `alerts`.
    pub fn new(
        function: &str,
        worker_id: &str,
        settings: Option<BreakerSettings>,
        control: ControlStore,
        alerts: Alerts,
    ) -> Self {
        if settings.is_some() {
            metrics::gauge!("aqw_breaker_state", "function" => function.to_string()).set(0.0);
        }
        metrics::gauge!("aqw_function_paused", "function" => function.to_string()).set(0.0);
        Self {
            function: function.to_string(),
            worker_id: worker_id.to_string(),
            control,
            control_account: String::new(),
            alerts,
            paused: AtomicBool::new(false),
            breaker: settings.map(|s| {
                Mutex::new(BreakerState {
                    breaker: Breaker::new(s),
                    last_error: None,
                    own_at: None,
                    evidence_row: false,
                    published_rate: None,
                    rows_seen: Default::default(),
                    last_read: None,
                })
            }),
            adaptive: None,
            read: tokio::sync::Notify::new(),
        }
    }

    /// Share the function's adaptive rate with the fleet through this gate.
    pub(crate) fn with_adaptive(mut self, adaptive: std::sync::Arc<AdaptiveRate>) -> Self {
        self.adaptive = Some(adaptive);
        self
    }

    /// Name the storage account its control table is in (the connection
    /// setting), so gates on one table share one watch query.
    pub(crate) fn on_account(mut self, account: &str) -> Self {
        self.control_account = account.to_string();
        self
    }

    /// Whether an operator paused the function (as last read from its control row).
    pub fn paused(&self) -> bool {
        self.paused.load(Ordering::Relaxed)
    }

    /// Before a receive of up to `want` messages.
    pub fn admit(&self, want: u32) -> Admission {
        if self.paused() {
            return Admission::Wait(PAUSED_POLL);
        }
        let Some(b) = &self.breaker else {
            return Admission::Receive(want);
        };
        let (admission, transition) = {
            let mut b = b.lock().unwrap();
            b.breaker.admit(Instant::now(), want)
        };
        if let Some(t) = transition {
            self.announce(&t);
        }
        admission
    }

    /// While the breaker is open, a received message is parked for this
    /// long instead of run (or its failure parked instead of counted).
    pub fn holds(&self) -> Option<Duration> {
        let b = self.breaker.as_ref()?.lock().unwrap();
        b.breaker.holds().then(|| b.breaker.cool_down())
    }

    /// Before a job runs, while the breaker suspects an outage ([`Breaker::suspects`]):
    /// wait for the next control read, one at a time, at most [`SUSPECT_WAIT`].
    /// True if it waited (the caller asks [`Gate::holds`] again).
    pub(crate) async fn wait_while_suspect(&self) -> bool {
        let Some(b) = &self.breaker else { return false };
        let deadline = Instant::now() + SUSPECT_WAIT;
        let mut waited = false;
        loop {
            let read = self.read.notified();
            let suspects = {
                let b = b.lock().unwrap();
                b.breaker.suspects(b.last_read)
            };
            let left = deadline.saturating_duration_since(Instant::now());
            if !suspects || left.is_zero() {
                return waited;
            }
            waited = true;
            let _ = tokio::time::timeout(left.min(WATCH_INTERVAL * 2), read).await;
        }
    }

    /// While the breaker ramps up after a close: the most jobs that may be
    /// in flight now (`None`: no limit beyond the batch).
    pub fn allowance(&self) -> Option<u32> {
        let b = self.breaker.as_ref()?.lock().unwrap();
        b.breaker.allowance(Instant::now())
    }

    /// How one attempt ended; `error` is the failure's text.
    pub fn record(&self, attempt: Attempt, error: Option<&str>) {
        let Some(b) = &self.breaker else { return };
        let transition = {
            let mut b = b.lock().unwrap();
            if let Some(e) = error {
                b.last_error = Some(e.to_string());
            }
            b.breaker.record(Instant::now(), attempt)
        };
        if let Some(t) = transition {
            self.announce(&t);
        }
    }

    /// One log line, the metrics, the webhook event and the control row.
    fn announce(&self, t: &Transition) {
        let function = self.function.clone();
        let (gauge, cause) = {
            let b = self.breaker.as_ref().expect("only a breaker transitions");
            let mut b = b.lock().unwrap();
            if t.own() {
                b.own_at = Some(crate::clock::now_utc());
            }
            (b.breaker.state().gauge(), b.last_error.clone())
        };
        let summary = summary(&function, t, cause.as_deref());
        metrics::gauge!("aqw_breaker_state", "function" => function.clone()).set(gauge);
        if !t.own() {
            // Following the fleet: the replica that tripped alerts and
            // publishes; this one only says so in its log.
            let event = format!("aqw.breaker.{}", t.to());
            info!(event = %event, function = %function, "{summary}");
            return;
        }
        metrics::counter!("aqw_breaker_transitions_total", "function" => function.clone(), "to" => t.to()).increment(1);
        let event = format!("aqw.breaker.{}", t.to().replace('-', "_"));
        match t {
            Transition::Closed => info!(event = %event, function = %function, "{summary}"),
            _ => warn!(event = %event, function = %function, "{summary}"),
        }
        self.alerts.breaker(json!({
            "event": event,
            "severity": if matches!(t, Transition::Closed) { "info" } else { "warning" },
            "function": function,
            "state": t.to(),
            "summary": summary,
            "worker": self.worker_id,
            "runbook": crate::alert::runbook_link(None, Some("outage")),
        }));
        let (control, worker, state) = (self.control.clone(), self.worker_id.clone(), t.to());
        let cool_down = match t {
            Transition::Opened { cool_down, .. } | Transition::Reopened { cool_down } => {
                Some(*cool_down)
            }
            _ => None,
        };
        crate::clock::spawn(async move {
            if let Err(e) = control
                .publish_breaker(&function, state, &summary, &worker, cool_down)
                .await
            {
                warn!(function = %function, error = %e, "could not publish the breaker state");
            }
        });
    }

    /// Watch the control rows of every gate in `gates` with one partition
    /// query per [`WATCH_INTERVAL`] per control table, until `shutdown`:
    /// the cost of pause and breaker is one read per worker per interval,
    /// not one per function (100 replicas × 50 functions read 50 times a
    /// second, not 2,500).
    pub async fn watch_all(gates: Vec<std::sync::Arc<Gate>>, shutdown: CancellationToken) {
        // Gates on one control table share a query.
        let mut groups: Vec<Vec<std::sync::Arc<Gate>>> = Vec::new();
        for g in gates {
            let same = groups.iter_mut().find(|group| {
                std::sync::Arc::ptr_eq(group[0].control.table(), g.control.table())
                    || (group[0].control.table().name() == g.control.table().name()
                        && group[0].control_account == g.control_account)
            });
            match same {
                Some(group) => group.push(g),
                None => groups.push(vec![g]),
            }
        }
        loop {
            tokio::select! {
                biased;
                _ = tokio::time::sleep(WATCH_INTERVAL) => {}
                _ = shutdown.cancelled() => return,
            }
            for group in &groups {
                match group[0].control.all().await {
                    Ok(rows) => {
                        for g in group {
                            let c = rows.functions.get(&g.function).cloned().unwrap_or_default();
                            g.apply(&c);
                            g.exchange_evidence(&rows.evidence).await;
                            g.read.notify_waiters();
                        }
                    }
                    Err(e) => {
                        warn!(error = %e, "cannot read the control rows; keeping the last pause state")
                    }
                }
            }
        }
    }

    /// Read the control row every [`WATCH_INTERVAL`] until `shutdown`.
    pub async fn watch(&self, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                biased;
                _ = tokio::time::sleep(WATCH_INTERVAL) => {}
                _ = shutdown.cancelled() => return,
            }
            self.refresh().await;
        }
    }

    /// Read the control row once (also before the first receive).
    pub async fn refresh(&self) {
        let c = match self.control.get(&self.function).await {
            Ok(c) => c,
            Err(e) => {
                warn!(function = %self.function, error = %e, "cannot read the control row; keeping the last pause state");
                return;
            }
        };
        self.apply(&c);
        self.read.notify_waiters();
    }

    /// Take in the function's control row as read: the pause, and the
    /// breaker another replica published.
    pub(crate) fn apply(&self, c: &Control) {
        self.follow_fleet(c);
        let paused = c.pause.is_some();
        if self.paused.swap(paused, Ordering::Relaxed) == paused {
            return;
        }
        metrics::gauge!("aqw_function_paused", "function" => self.function.clone())
            .set(if paused { 1.0 } else { 0.0 });
        match &c.pause {
            Some(p) => {
                info!(event = "aqw.function.paused", function = %self.function, by = %p.by, reason = %scrub(&p.reason), "paused by an operator: receiving nothing")
            }
            None => {
                info!(event = "aqw.function.resumed", function = %self.function, "resumed by an operator")
            }
        }
    }
}

impl Gate {
    /// The breaker another replica published on the control row: follow an
    /// open or probing one, release on a close. A row left by a replica
    /// that fell silent longer than the longest cool-down is ignored.
    fn follow_fleet(&self, c: &Control) {
        let Some(b) = &self.breaker else { return };
        // A probe's close since the last read, whoever wrote the row since.
        let mark = c
            .breaker
            .as_ref()
            .and_then(|p| p.probe_closed_at.as_deref());
        let closed = b
            .lock()
            .unwrap()
            .breaker
            .observe_probe_close(Instant::now(), mark);
        if let Some(t) = closed {
            return self.announce(&t);
        }
        let Some(p) = &c.breaker else { return };
        if p.worker == self.worker_id {
            return;
        }
        let now = Instant::now();
        let transition = {
            let mut b = b.lock().unwrap();
            let settings = *b.breaker.settings();
            let age = published_age(&p.at);
            match p.state.as_str() {
                "open" | "half-open" if age <= settings.max_cool_down + STALE_MARGIN => {
                    // An open row: as long as its publisher stays open (the
                    // cool-down it wrote; the longest one when it wrote none);
                    // a probing one: a cool-down for its verdict. Counted from
                    // the row's own time, so reading the same row again does
                    // not push the deadline further.
                    let base = match (p.state.as_str(), p.cool_down) {
                        ("open", Some(c)) => c,
                        ("open", None) => settings.max_cool_down,
                        _ => settings.cool_down,
                    };
                    let wait =
                        (base + spread(&self.worker_id, settings.cool_down)).saturating_sub(age);
                    b.breaker
                        .follow(now + wait, now.checked_sub(age).unwrap_or(now))
                }
                "closed" => {
                    let at = published_at(&p.at);
                    let newer = match (at, b.own_at) {
                        (Some(row), Some(own)) => row > own,
                        _ => false,
                    };
                    if newer {
                        b.breaker.release_any(now)
                    } else {
                        b.breaker.release(now)
                    }
                }
                _ => None,
            }
        };
        if let Some(t) = transition {
            self.announce(&t);
        }
    }
}

/// An evidence row older than this is a replica's that is gone (a live one
/// rewrites or deletes its row as its evidence changes): ignored, and
/// deleted by whoever reads it.
const EVIDENCE_STALE: Duration = Duration::from_secs(600);

impl Gate {
    /// This replica's id on evidence rows: a hash of its worker id.
    fn replica(&self) -> String {
        format!("{:016x}", job_id(&self.worker_id))
    }

    /// After a watch read: take in the rest of the fleet's evidence for
    /// this function (which may trip the breaker), then publish this
    /// replica's own when it is due, or delete its row once it is empty.
    /// Costs nothing while no replica reports a failure.
    async fn exchange_evidence(&self, rows: &[EvidenceRow]) {
        let (me, now, wall_ms) = (
            self.replica(),
            Instant::now(),
            unix_ms(crate::clock::now_utc()),
        );
        let share = self.take_in_fleet_rate(rows, &me, wall_ms);
        let Some(b) = &self.breaker else { return };
        let mut stale = Vec::new();
        let mut fleet = FleetView::default();
        // First in line to trip on the fleet's evidence: the lowest id of
        // the replicas reporting failures (this one, if it has any).
        let mut first_in_line = true;
        let written = self.rows_written_at(b, rows, &me, (now, wall_ms));
        for r in rows
            .iter()
            .filter(|r| r.function == self.function && r.replica != me)
        {
            if wall_ms - r.at_ms > EVIDENCE_STALE.as_millis() as i64 {
                stale.push(r.replica.clone());
                continue;
            }
            // The row's times, from its writer's clock to this replica's.
            let written = written.get(&r.replica).copied().unwrap_or(now);
            let on_my_clock = |ms: i64| {
                let before = Duration::from_millis(u64::try_from(r.at_ms - ms).unwrap_or(0));
                written.checked_sub(before).unwrap_or(written)
            };
            if !r.failing.is_empty() && r.replica < me {
                first_in_line = false;
            }
            fleet.successes = fleet.successes.saturating_add(r.successes);
            fleet.last_success = fleet.last_success.max(r.last_success_ms.map(on_my_clock));
            for (job, first, last) in &r.failing {
                let f = crate::breaker::Failing {
                    first: on_my_clock(*first),
                    last: on_my_clock(*last),
                };
                let e = fleet.failing.entry(*job).or_insert(f);
                *e = e.merge(f);
            }
        }
        let (transition, publish) = {
            let mut b = b.lock().unwrap();
            // A replica with no failure of its own is never first in line.
            let first_in_line = first_in_line && b.breaker.evidence().failing().next().is_some();
            let t = b.breaker.observe_fleet(now, fleet, !first_in_line);
            (
                t,
                self.evidence_to_publish(&mut b, (now, wall_ms), me.clone(), share),
            )
        };
        if let Some(t) = transition {
            self.announce(&t);
        }
        self.write_evidence(publish, &me, stale).await;
    }

    /// When each other replica's evidence row of this function was written,
    /// on this replica's clock ([`row_written_at`]), remembered for the next read.
    fn rows_written_at(
        &self,
        b: &Mutex<BreakerState>,
        rows: &[EvidenceRow],
        me: &str,
        (now, wall_ms): (Instant, i64),
    ) -> std::collections::BTreeMap<String, Instant> {
        let mut b = b.lock().unwrap();
        let last_read = b.last_read.replace(now);
        let mut seen = std::collections::BTreeMap::new();
        for r in rows
            .iter()
            .filter(|r| r.function == self.function && r.replica != me)
        {
            let was = b.rows_seen.get(&r.replica).copied();
            let at = row_written_at(was, r.at_ms, (now, wall_ms), last_read);
            seen.insert(r.replica.clone(), (r.at_ms, at));
        }
        let out = seen.iter().map(|(k, (_, at))| (k.clone(), *at)).collect();
        b.rows_seen = seen;
        out
    }

    /// What to write now: `Some(Some(row))` to publish, `Some(None)` to
    /// delete this replica's row, `None` to leave it.
    fn evidence_to_publish(
        &self,
        b: &mut BreakerState,
        (now, wall_ms): (Instant, i64),
        replica: String,
        share: Option<f64>,
    ) -> Option<Option<EvidenceRow>> {
        let ev = b.breaker.evidence();
        if ev.is_empty() && share.is_none() {
            let delete = std::mem::take(&mut b.evidence_row);
            b.breaker.evidence_published();
            b.published_rate = None;
            return delete.then_some(None);
        }
        if !b.breaker.evidence_due() && !rate_due(b.published_rate, share, now) {
            return None;
        }
        let wall = |t: Instant| wall_ms - now.saturating_duration_since(t).as_millis() as i64;
        let row = EvidenceRow {
            function: self.function.clone(),
            replica,
            at_ms: wall_ms,
            successes: ev.success_count(),
            last_success_ms: ev.last_success().map(wall),
            failing: ev
                .failing()
                .map(|(j, f)| (j, wall(f.first), wall(f.last)))
                .collect(),
            rate: share,
        };
        b.published_rate = share.map(|r| (r, now));
        b.breaker.evidence_published();
        b.evidence_row = true;
        Some(Some(row))
    }

    /// The rest of the fleet's learned rates for this function: a replica
    /// not throttled yet adopts their median, and the gauge
    /// `aqw_fleet_adaptive_rate` shows their sum with this replica's. Returns
    /// this replica's own rate to share (while its provider throttles it).
    fn take_in_fleet_rate(&self, rows: &[EvidenceRow], me: &str, wall_ms: i64) -> Option<f64> {
        let a = self.adaptive.as_ref()?;
        let others = fleet_rate(rows, &self.function, Some(me), wall_ms);
        if let Some(f) = &others {
            a.adopt(f);
        }
        let own = a.to_share();
        let total = others.map_or(0.0, |f| f.sum) + own.unwrap_or(0.0);
        metrics::gauge!("aqw_fleet_adaptive_rate", "function" => self.function.clone()).set(total);
        own
    }

    async fn write_evidence(
        &self,
        publish: Option<Option<EvidenceRow>>,
        me: &str,
        stale: Vec<String>,
    ) {
        let result = match publish {
            Some(Some(row)) => self.control.publish_evidence(&row).await,
            Some(None) => self.control.delete_evidence(&self.function, me).await,
            None => Ok(()),
        };
        if let Err(e) = result {
            warn!(function = %self.function, error = %e, "could not publish the breaker's evidence; the fleet decides without it");
        }
        for replica in stale {
            // Best effort: another replica may delete it first.
            let _ = self.control.delete_evidence(&self.function, &replica).await;
        }
    }
}

/// Unix milliseconds.
fn unix_ms(t: time::OffsetDateTime) -> i64 {
    (t.unix_timestamp_nanos() / 1_000_000) as i64
}

/// Past a publisher's longest cool-down, this much more silence means it is
/// gone (it republishes at every half-open and reopening).
const STALE_MARGIN: Duration = Duration::from_secs(30);

/// A row's RFC 3339 time, if readable.
fn published_at(at: &str) -> Option<time::OffsetDateTime> {
    time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339).ok()
}

/// How long ago a row's RFC 3339 time was (zero when unreadable or ahead).
fn published_age(at: &str) -> Duration {
    published_at(at)
        .map(|t| crate::clock::now_utc() - t)
        .and_then(|d| Duration::try_from(d).ok())
        .unwrap_or_default()
}

/// A follower's own wait beyond the publisher's cool-down, fixed per
/// replica and spread over half a cool-down plus two control reads: when
/// no verdict comes, the first follower to probe publishes `half-open`, and
/// the others, reading it within a watch interval, keep following.
fn spread(worker_id: &str, cool_down: Duration) -> Duration {
    // FNV-1a: a stable, well-spread number from the id, no dependency.
    let hash = worker_id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let range = cool_down / 2 + WATCH_INTERVAL * 2;
    let millis = range.as_millis().max(1) as u64;
    WATCH_INTERVAL + Duration::from_millis(hash % millis)
}

/// "GrantCredits paused: 95% of 40 attempts failed with HTTP 503".
fn summary(function: &str, t: &Transition, cause: Option<&str>) -> String {
    let cause = cause.map(|c| match error_group(c) {
        (Some(status), _) => format!("HTTP {status}"),
        (None, text) => scrub(&text),
    });
    let with = cause.map(|c| format!(" with {c}")).unwrap_or_default();
    match t {
        Transition::Opened {
            rule: crate::breaker::Rule::Volume,
            failed,
            attempts,
            cool_down,
        } => format!(
            "{function} paused: {}% of {attempts} attempts failed{with}; probing again in {:?}",
            failed * 100 / (*attempts).max(1),
            cool_down
        ),
        Transition::Opened {
            rule: crate::breaker::Rule::Quiet,
            failed,
            cool_down,
            ..
        } => format!(
            "{function} paused: {failed} distinct jobs failed in a row across the fleet, none succeeded{with}; probing again in {cool_down:?}"
        ),
        Transition::HalfOpened => {
            format!("{function}: cool-down over; letting probe messages through")
        }
        Transition::Closed => format!("{function} resumed: a probe succeeded"),
        Transition::Reopened { cool_down } => {
            format!("{function} paused again: a probe failed{with}; probing again in {cool_down:?}")
        }
        Transition::Followed => {
            format!("{function} held: another replica's breaker is open; following it")
        }
        Transition::Released => format!("{function} resumed: the fleet's breaker closed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_names_the_share_and_the_status() {
        let t = Transition::Opened {
            rule: crate::breaker::Rule::Volume,
            failed: 38,
            attempts: 40,
            cool_down: Duration::from_secs(30),
        };
        let s = summary("GrantCredits", &t, Some("HTTP 503 from https://x/y: down"));
        assert!(
            s.starts_with("GrantCredits paused: 95% of 40 attempts failed with HTTP 503"),
            "{s}"
        );
    }

    #[test]
    fn a_row_written_between_two_reads_is_placed_between_them_whatever_the_skew() {
        let t0 = Instant::now();
        let (prev, now) = (t0 + Duration::from_secs(10), t0 + Duration::from_secs(12));
        let wall_ms = 1_000_000;
        // Its writer's clock runs 8 s ahead (a time in the future) or 8 s
        // behind: new since the last read, it was written within (prev, now].
        assert_eq!(
            row_written_at(Some((1, t0)), wall_ms + 8_000, (now, wall_ms), Some(prev)),
            now
        );
        assert_eq!(
            row_written_at(Some((1, t0)), wall_ms - 8_000, (now, wall_ms), Some(prev)),
            prev
        );
        // Inside the interval the wall clocks decide.
        assert_eq!(
            row_written_at(None, wall_ms - 1_000, (now, wall_ms), Some(prev)),
            now - Duration::from_secs(1)
        );
        // An unchanged version keeps where it was placed.
        let placed = t0 + Duration::from_secs(3);
        assert_eq!(
            row_written_at(Some((7, placed)), 7, (now, wall_ms), Some(prev)),
            placed
        );
        // At the first read only the wall clocks tell.
        assert_eq!(
            row_written_at(None, wall_ms - 8_000, (now, wall_ms), None),
            now - Duration::from_secs(8)
        );
    }
}
