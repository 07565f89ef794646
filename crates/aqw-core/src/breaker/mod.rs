//! The circuit breaker of one function, as a pure state machine: closed →
//! open → half-open → closed (or open again, with a longer cool-down). Time
//! is passed in; nothing here reads a clock or does I/O, so every transition
//! is a row of the table test below. [`crate::worker`] asks it before each
//! receive and tells it how each attempt ended.
//!
//! What counts ([`evidence`]): retryable failures and successes, by
//! *distinct job* (its key, or its message id), whatever the attempt
//! number, this replica's own and what the rest of the fleet published on
//! the control table (`Breaker::observe_fleet`). Two rules trip it: the
//! volume rule (many outcomes, nearly all failures) and the quiet rule (a
//! streak of distinct jobs failing with no success anywhere in between),
//! so an outage trips it however the fleet is spread and however quiet the
//! function is, while a few keys failing again and again stay a few and
//! reach poison as before. Permanent failures are not counted at all.
//!
//! One breaker per function for the whole fleet: a replica whose own window
//! has not tripped *follows* a breaker another replica published as open or
//! half-open on the function's control row (`Breaker::follow`): it
//! receives nothing and parks what it holds, until the row says closed
//! (`Breaker::release`) or the publisher falls silent, and only then
//! probes itself (so the fleet probes through one or two replicas, not all).
//! After a close, concurrency ramps up from the probe count, doubling every `RAMP_STEP`.
//!
//! Half-open, the breaker does not stay open on the evidence of a few
//! jobs: until `consecutiveFailures` distinct jobs failed its probes, the
//! same job failing a probe again is no verdict, and its failure is its
//! own (`Breaker::record`), so a few keys failing alone still reach
//! poison and cannot hold the breaker open by themselves.

pub mod evidence;

pub use evidence::{job_id, Failing, Rule};
pub(crate) use evidence::{Evidence, FleetView, Tally};
use std::collections::BTreeSet;
use std::time::Duration;
use tokio::time::Instant;

/// `aqw.breaker` / `aqw.functions.<Name>.breaker`, validated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BreakerSettings {
    /// Trip when failures / attempts in the window reach this (0 < r ≤ 1).
    pub failure_ratio: f64,
    /// ... over at least this many attempts.
    pub minimum_attempts: u32,
    /// How far back attempts count.
    pub window: Duration,
    /// How long the first opening lasts.
    pub cool_down: Duration,
    /// The cool-down doubles on each failed probe, up to this.
    pub max_cool_down: Duration,
    /// Messages let through when the cool-down ends (half-open).
    pub probes: u32,
    /// The quiet rule: this many distinct jobs failing with no success in
    /// the fleet between them trips the breaker (0: off).
    pub consecutive_failures: u32,
    /// How far back the quiet rule looks.
    pub quiet_window: Duration,
}

impl Default for BreakerSettings {
    fn default() -> Self {
        Self {
            failure_ratio: 0.9,
            minimum_attempts: 20,
            window: Duration::from_secs(60),
            cool_down: Duration::from_secs(30),
            max_cool_down: Duration::from_secs(300),
            probes: 2,
            consecutive_failures: 5,
            quiet_window: Duration::from_secs(300),
        }
    }
}

/// Where the breaker stands.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum State {
    /// Messages are received and every attempt counts.
    Closed,
    /// Nothing is received until `until`; received messages are parked.
    Open {
        /// When the cool-down ends and probes may be let through.
        until: Instant,
    },
    /// Another replica's breaker is open or probing: nothing is received
    /// until `until`, when this replica, not having heard a verdict, probes
    /// itself; received messages are parked.
    Following {
        /// When to stop waiting for the fleet's verdict.
        until: Instant,
    },
    /// `probes_left` more messages may be received; no verdict yet.
    HalfOpen {
        /// How many more probes may be received.
        probes_left: u32,
        /// When the breaker went half-open (or last replaced its probes).
        since: Instant,
    },
}

impl State {
    /// The state's name, as the state-machine tests write their rows.
    #[cfg(test)]
    pub(crate) fn name(&self) -> &'static str {
        match self {
            State::Closed => "closed",
            State::Open { .. } => "open",
            State::Following { .. } => "following",
            State::HalfOpen { .. } => "half-open",
        }
    }
    /// The `aqw_breaker_state` gauge: 0 closed, 1 half-open, 2 open.
    pub(crate) fn gauge(&self) -> f64 {
        match self {
            State::Closed => 0.0,
            State::HalfOpen { .. } => 1.0,
            State::Open { .. } | State::Following { .. } => 2.0,
        }
    }
}

/// How one attempt of the handler ended, as far as the breaker cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// The handler succeeded for job `0` ([`job_id`] of its key or message id).
    Succeeded(u64),
    /// A retryable failure (or a timeout) of job `0`, at any attempt.
    FailedRetryable(u64),
}

/// A change of state, to log, count and alert.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Transition {
    /// Closed → open: `failed` of `attempts` distinct jobs in the window
    /// failed (the volume rule), or `failed` in a row with no success (the
    /// quiet rule).
    Opened {
        /// Which rule tripped.
        rule: Rule,
        /// Distinct failing jobs (the streak, for the quiet rule).
        failed: u32,
        /// Outcomes counted (failing jobs + successes) in the window.
        attempts: u32,
        /// How long the breaker stays open.
        cool_down: Duration,
    },
    /// Open → half-open: the cool-down ended.
    HalfOpened,
    /// Half-open → closed: a probe succeeded.
    Closed,
    /// Half-open → open: a probe failed; the cool-down doubled.
    Reopened {
        /// How long the breaker now stays open.
        cool_down: Duration,
    },
    /// Closed → following: another replica's breaker is open or probing.
    Followed,
    /// Following → closed: the fleet's breaker closed.
    Released,
}

impl Transition {
    /// The name of the state the transition leads to.
    pub(crate) fn to(&self) -> &'static str {
        match self {
            Transition::Opened { .. } | Transition::Reopened { .. } => "open",
            Transition::HalfOpened => "half-open",
            Transition::Closed | Transition::Released => "closed",
            Transition::Followed => "following",
        }
    }

    /// Whether this replica made the change itself (and so publishes it on
    /// the control row and alerts), rather than following the fleet.
    pub(crate) fn own(&self) -> bool {
        !matches!(self, Transition::Followed | Transition::Released)
    }
}

/// What the poll loop may do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Receive at most this many messages.
    Receive(u32),
    /// Receive nothing; ask again after this long.
    Wait(Duration),
}

/// How long the poll loop waits while half-open probes are out.
const PROBE_POLL: Duration = Duration::from_millis(200);

/// How long a replica that is not first in line waits before it trips on
/// the fleet's evidence itself: three control reads, time for the first in
/// line to read the same evidence and for its `open` row to reach this
/// one (which then follows instead).
const LEADER_GRACE: Duration = Duration::from_secs(6);

/// The longest a job waits for the fleet's verdict ([`Breaker::suspects`]):
/// past the grace a replica second in line gives the first, it trips on
/// the evidence itself.
pub(crate) const SUSPECT_WAIT: Duration =
    Duration::from_secs(LEADER_GRACE.as_secs() + 2 * crate::control::WATCH_INTERVAL.as_secs());

/// After a close, the receive allowance doubles this often, from the probe
/// count up to a full batch.
const RAMP_STEP: Duration = Duration::from_secs(1);

/// Ramp steps after a close: from the probe count to 2^10 times it.
const RAMP_STEPS: u32 = 10;

/// The most jobs one opening remembers as having failed a probe: past it a
/// repeat counts as new (one more reopening), which only errs toward
/// holding.
const MAX_PROBED: usize = 64;

/// One function's breaker.
#[derive(Debug, Clone)]
pub(crate) struct Breaker {
    settings: BreakerSettings,
    state: State,
    cool_down: Duration,
    /// This replica's outcomes.
    own: Evidence,
    /// The rest of the fleet's, as last read.
    fleet: FleetView,
    /// When the breaker last changed state: evidence from before does not count.
    since: Option<Instant>,
    /// Another replica is first in line to trip on the fleet's evidence:
    /// this one trips on it only after [`LEADER_GRACE`] (on its own, at once).
    deferred: bool,
    /// Since when the fleet's evidence has said "trip" while deferred.
    due_since: Option<Instant>,
    /// When the breaker last closed after an opening (the ramp's start).
    closed_at: Option<Instant>,
    /// This opening has let probes through: from then on the only jobs
    /// that run are probes.
    probing: bool,
    /// The jobs that failed since this opening let probes through: a
    /// failed probe of one of them again is no verdict ([`Breaker::record`]).
    probed: BTreeSet<u64>,
    /// Openings so far (a trip or a follow starts one; reopenings and
    /// probes are the same one's).
    openings: u64,
    /// The fleet's last probe close as the previous control read showed
    /// it, and the opening in force at that read ([`Breaker::observe_probe_close`]).
    close_seen: (Option<String>, Option<u64>),
    /// The fleet's latest success this breaker took in while open.
    fleet_success_seen: Option<Instant>,
}

impl Breaker {
    /// A closed breaker with `settings`.
    pub(crate) fn new(settings: BreakerSettings) -> Self {
        Self {
            settings,
            state: State::Closed,
            cool_down: settings.cool_down,
            own: Evidence::default(),
            fleet: FleetView::default(),
            since: None,
            deferred: false,
            due_since: None,
            closed_at: None,
            probing: false,
            probed: BTreeSet::new(),
            openings: 0,
            close_seen: (None, None),
            fleet_success_seen: None,
        }
    }

    /// Where the breaker stands now.
    pub(crate) fn state(&self) -> State {
        self.state
    }

    /// The settings it was built with.
    pub(crate) fn settings(&self) -> &BreakerSettings {
        &self.settings
    }

    /// True while open: a message received before the trip is parked
    /// instead of run.
    pub(crate) fn holds(&self) -> bool {
        matches!(self.state, State::Open { .. } | State::Following { .. })
    }

    /// Another replica published the function's breaker as open or
    /// half-open at `published` (on this replica's clock): a closed breaker
    /// follows it until `until` (a following one waits until the later of
    /// the two). A breaker of this replica's own that is open or probing
    /// keeps its course, and so does a closed one that saw a job of its
    /// own succeed after that row was written: the provider answers, and
    /// its evidence row, kept and published, tells the opener so
    /// ([`Breaker::observe_fleet`] forgets the probes' evidence). Following
    /// cleared that success unpublished, and an opener holding five
    /// distinct probe failures from the outage reopened on every failed
    /// probe of a job failing alone and parked it for ever (seed 3458,
    /// found with the suspect wait's timing).
    pub(crate) fn follow(&mut self, until: Instant, published: Instant) -> Option<Transition> {
        match self.state {
            State::Closed if self.own.last_success().is_some_and(|s| s > published) => None,
            State::Closed => {
                self.state = State::Following { until };
                self.own.clear();
                self.new_opening();
                Some(Transition::Followed)
            }
            State::Following { until: was } => {
                self.state = State::Following {
                    until: was.max(until),
                };
                None
            }
            State::Open { .. } | State::HalfOpen { .. } => None,
        }
    }

    /// Another replica's probe closed the fleet's breaker after this
    /// replica's own last transition: an own open or probing breaker closes
    /// too (as if its own probe had succeeded), as a following one does.
    pub(crate) fn release_any(&mut self, now: Instant) -> Option<Transition> {
        match self.state {
            State::Closed => None,
            _ => {
                self.close(now);
                Some(Transition::Released)
            }
        }
    }

    /// At each read of the control row: `mark`, when a probe anywhere in
    /// the fleet last closed the breaker (kept on the row apart from its
    /// state, which the next writer overwrites). A mark that changed since
    /// the previous read while this opening was already in force then is a
    /// success of the provider after this opening began, whatever the
    /// replicas' clocks: an open, probing or following breaker closes, as
    /// if its own probe had succeeded. Without it a replica that published
    /// over a close it never read, and that sees no success of its own
    /// (only jobs failing alone left, once enough distinct jobs failed its
    /// probes during the outage), reopened on every failed probe and parked
    /// those jobs for ever (seed 6936). Compared by reads, not by times:
    /// a close just before this opening on a clock running ahead must not
    /// end it.
    pub(crate) fn observe_probe_close(
        &mut self,
        now: Instant,
        mark: Option<&str>,
    ) -> Option<Transition> {
        let changed = mark.is_some() && mark != self.close_seen.0.as_deref();
        let opening = (self.state != State::Closed).then_some(self.openings);
        let before = std::mem::replace(&mut self.close_seen, (mark.map(str::to_string), opening));
        if changed && opening.is_some() && before.1 == opening {
            self.close(now);
            self.close_seen.1 = None;
            return Some(Transition::Released);
        }
        None
    }

    /// The fleet's breaker closed: a following breaker closes too, and
    /// ramps up from the probe count.
    pub(crate) fn release(&mut self, now: Instant) -> Option<Transition> {
        match self.state {
            State::Following { .. } => {
                self.close(now);
                Some(Transition::Released)
            }
            _ => None,
        }
    }

    /// While a closed breaker ramps up after an opening: how many jobs
    /// may be in flight now, the probe count doubling every `RAMP_STEP`
    /// since the close; `None` once the ramp is over (after
    /// `RAMP_STEPS` steps) or when it never opened.
    pub(crate) fn allowance(&self, now: Instant) -> Option<u32> {
        let at = self.closed_at.filter(|_| self.state == State::Closed)?;
        let steps = now.saturating_duration_since(at).as_millis() / RAMP_STEP.as_millis().max(1);
        (steps < u128::from(RAMP_STEPS)).then(|| self.settings.probes.max(1) << steps)
    }

    /// Whether a job about to run should first wait for the next control
    /// read (issue 49: an outage's first wave). Closed, and either the
    /// fleet's evidence already says trip while another replica is first
    /// in line ([`LEADER_GRACE`]), or `consecutiveFailures` distinct jobs of
    /// this replica began failing since its last read (`last_read`) and its
    /// last success: the next read publishes them and brings the fleet's
    /// verdict. Without it, 16 replicas called nearly every one of 200 jobs
    /// queued at once, and retried them, in the 2 s before that verdict
    /// came. A wait, never a verdict: once it is over the job runs unless
    /// the breaker then holds.
    pub(crate) fn suspects(&self, last_read: Option<Instant>) -> bool {
        if self.state != State::Closed {
            return false;
        }
        if self.deferred && self.due_since.is_some() {
            return true;
        }
        let n = self.settings.consecutive_failures as usize;
        let after = last_read.max(self.own.last_success());
        n > 0
            && self
                .own
                .failing()
                .filter(|(_, f)| after.is_none_or(|t| f.first > t))
                .count()
                >= n
    }

    /// The cool-down of the current (or next) opening.
    pub(crate) fn cool_down(&self) -> Duration {
        self.cool_down
    }

    /// Before a receive of up to `want` messages: how many may be received.
    pub(crate) fn admit(&mut self, now: Instant, want: u32) -> (Admission, Option<Transition>) {
        match self.state {
            State::Closed => (Admission::Receive(want), None),
            State::Open { until } | State::Following { until } if now < until => {
                (Admission::Wait(until - now), None)
            }
            State::Following { .. } => {
                // No verdict heard from the fleet: probe as if our own.
                let granted = want.min(self.settings.probes);
                self.state = State::HalfOpen {
                    probes_left: self.settings.probes - granted,
                    since: now,
                };
                self.probing = true;
                (Admission::Receive(granted), Some(Transition::HalfOpened))
            }
            State::Open { .. } => {
                let granted = want.min(self.settings.probes);
                self.state = State::HalfOpen {
                    probes_left: self.settings.probes - granted,
                    since: now,
                };
                self.probing = true;
                (Admission::Receive(granted), Some(Transition::HalfOpened))
            }
            State::HalfOpen { probes_left, since } => {
                // Probes that end without a verdict (a duplicate, a
                // permanent failure) are replaced after a cool-down.
                let left = if probes_left == 0 && now >= since + self.cool_down {
                    self.settings.probes
                } else {
                    probes_left
                };
                let granted = want.min(left);
                let since = if left != probes_left { now } else { since };
                self.state = State::HalfOpen {
                    probes_left: left - granted,
                    since,
                };
                if granted == 0 {
                    (Admission::Wait(PROBE_POLL), None)
                } else {
                    (Admission::Receive(granted), None)
                }
            }
        }
    }

    /// After an attempt: count it, and change state if it says so.
    ///
    /// Half-open, while fewer distinct jobs than `consecutiveFailures` have
    /// failed since this opening let probes through, a job failing a probe
    /// again is no verdict on the provider (the queue may hold nothing but
    /// a few keys failing alone, which would otherwise be parked as fresh
    /// copies forever and keep the breaker open on their evidence alone).
    /// The breaker stays half-open, so that failure is the job's own,
    /// retried and counted as when closed, and the next probes go through
    /// after a cool-down. Once that many distinct jobs failed its probes,
    /// the outage stands on distinct evidence and every failed probe
    /// reopens, parked free, however long the outage.
    pub(crate) fn record(&mut self, now: Instant, attempt: Attempt) -> Option<Transition> {
        match (self.state, attempt) {
            (State::Open { .. } | State::Following { .. }, Attempt::FailedRetryable(job)) => {
                // After a reopening, the other probes' failures.
                if self.probing {
                    self.note_probed(job);
                }
                None
            }
            (State::Open { .. } | State::Following { .. }, Attempt::Succeeded(_)) => None,
            (State::HalfOpen { .. }, Attempt::Succeeded(_)) => {
                self.close(now);
                Some(Transition::Closed)
            }
            (State::HalfOpen { .. }, Attempt::FailedRetryable(job)) => {
                let again = !self.note_probed(job);
                if again && self.few_probed() {
                    return None;
                }
                self.cool_down = (self.cool_down * 2).min(self.settings.max_cool_down);
                self.state = State::Open {
                    until: now + self.cool_down,
                };
                Some(Transition::Reopened {
                    cool_down: self.cool_down,
                })
            }
            (State::Closed, Attempt::Succeeded(job)) => {
                self.own.success(now, job, self.settings.window);
                None
            }
            (State::Closed, Attempt::FailedRetryable(job)) => {
                self.own.failure(now, job);
                self.trip_if_due(now)
            }
        }
    }

    /// What the rest of the fleet published (read every control-row
    /// watch): kept for the next verdicts, and a verdict now.
    /// `deferred`: another replica reporting failures (the lowest id) is
    /// first in line, so one alert goes out and the rest follow its row;
    /// this one trips on the fleet's evidence after `LEADER_GRACE`.
    pub(crate) fn observe_fleet(
        &mut self,
        now: Instant,
        fleet: FleetView,
        deferred: bool,
    ) -> Option<Transition> {
        self.fleet = fleet;
        self.deferred = deferred;
        match self.state {
            State::Closed => self.trip_if_due(now),
            State::Open { .. } | State::HalfOpen { .. } => {
                self.forget_probes_after_fleet_success();
                None
            }
            State::Following { .. } => None,
        }
    }

    /// Another replica succeeded after this opening began (and after the
    /// last success taken in): the provider answers, so the distinct jobs
    /// that failed this opening's probes are no outage's evidence any more.
    /// Forgotten, a job failing a probe again is no verdict and its failure
    /// its own, so it reaches poison; a new job failing one still reopens.
    /// Without it a replica that opened in an outage and saw no success of
    /// its own (the rest of the fleet ran the good jobs with closed
    /// breakers) reopened on every failed probe of a job failing alone and
    /// parked it for ever (seed 3458). An outage brings no success: the
    /// probes' evidence stands however long it lasts.
    fn forget_probes_after_fleet_success(&mut self) {
        let Some(success) = self.fleet.last_success else {
            return;
        };
        let after = self.since.max(self.fleet_success_seen);
        if after.is_none_or(|t| success > t) {
            self.fleet_success_seen = Some(success);
            self.probed.clear();
        }
    }

    /// This replica's own evidence, to publish.
    pub(crate) fn evidence(&self) -> &Evidence {
        &self.own
    }

    /// Mark this replica's evidence as published.
    pub(crate) fn evidence_published(&mut self) {
        self.own.published();
    }

    /// The fleet's evidence counted together now (for `aqw status` and logs).
    fn tally(&self, now: Instant) -> Tally {
        evidence::tally(&self.own, &self.fleet, self.since, now, &self.settings)
    }

    /// Whether this replica should publish its evidence now: it has
    /// failures, or another replica has and this one's successes (or the
    /// emptying of its failures) must be heard; and it changed since.
    pub(crate) fn evidence_due(&self) -> bool {
        self.own.changed() && (self.own.failing().next().is_some() || self.fleet.has_failures())
    }

    /// Remember that `job` failed during this opening's probing; false if
    /// it had already.
    fn note_probed(&mut self, job: u64) -> bool {
        if self.probed.contains(&job) {
            return false;
        }
        if self.probed.len() < MAX_PROBED {
            self.probed.insert(job);
        }
        true
    }

    /// Fewer distinct jobs failed this opening's probes than the quiet rule
    /// needs to call it an outage (`consecutiveFailures`; 0: never few).
    fn few_probed(&self) -> bool {
        let n = self.settings.consecutive_failures as usize;
        n > 0 && self.probed.len() < n
    }

    /// A new opening: no probe let through, none failed.
    fn new_opening(&mut self) {
        self.openings += 1;
        self.probing = false;
        self.probed.clear();
    }

    fn close(&mut self, now: Instant) {
        self.new_opening();
        self.state = State::Closed;
        self.cool_down = self.settings.cool_down;
        self.own.clear();
        self.since = Some(now);
        self.closed_at = Some(now);
    }

    fn trip_if_due(&mut self, now: Instant) -> Option<Transition> {
        self.own.prune(now, &self.settings);
        let alone = evidence::tally(
            &self.own,
            &FleetView::default(),
            self.since,
            now,
            &self.settings,
        );
        let t = self.tally(now);
        let Some(rule) = evidence::verdict(&t, &self.settings, now) else {
            self.due_since = None;
            return None;
        };
        // Its own volume alone is what tripped a replica before the fleet
        // shared evidence: that trips at once, wherever it stands in line.
        let own_verdict = evidence::verdict(&alone, &self.settings, now) == Some(Rule::Volume);
        let due_since = *self.due_since.get_or_insert(now);
        if self.deferred && !own_verdict && now.saturating_duration_since(due_since) < LEADER_GRACE
        {
            return None;
        }
        self.due_since = None;
        let (failed, attempts) = match rule {
            Rule::Volume => (t.failing, t.failing + t.successes),
            Rule::Quiet => (t.streak, t.streak),
        };
        self.state = State::Open {
            until: now + self.cool_down,
        };
        self.own.clear();
        self.new_opening();
        self.since = Some(now);
        Some(Transition::Opened {
            rule,
            failed,
            attempts,
            cool_down: self.cool_down,
        })
    }
}

#[cfg(test)]
mod tests;
