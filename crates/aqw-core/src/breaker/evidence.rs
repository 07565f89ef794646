//! The breaker's evidence (issue 49): what this replica saw, what the rest
//! of the fleet published, and the two rules that read them together.
//!
//! Outcomes are counted by *distinct job* (its key, or its message id when
//! it has none), whatever its attempt number: a job failing five times is
//! one failing job, so a few bad keys failing again and again stay a few,
//! while many distinct jobs failing the same way is an outage. A job that
//! later succeeds leaves the failing set.
//!
//! - **Volume rule** (busy functions): over `window`, when failing jobs +
//!   successes reach `minimumAttempts` and failing jobs are at least
//!   `failureRatio` of them.
//! - **Quiet rule** (a trickle, a quiet night), at any volume (a partial
//!   outage with traffic keeps succeeding): `consecutiveFailures` distinct
//!   jobs began failing with no success anywhere in the fleet since the
//!   first of them, within `quietWindow`, and that first failure is at
//!   least [`SETTLE`] old, so the fleet's successes had time to be heard.
//!   Jobs that began failing before the last success (the tail of a
//!   partial outage, still retrying) are not in a streak.
//!
//! Pure values: time is passed in, nothing here reads a clock or does I/O.

use super::BreakerSettings;
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;
use tokio::time::Instant;

/// How old the first failure of a quiet streak must be before it trips:
/// three control reads, the longest a success on another replica takes to
/// reach this one (this replica publishes its failure at its next read,
/// the other publishes its successes at the read that brings it, and this
/// one reads them at its next). Under the default retry a job has had
/// three attempts by then, of five.
pub const SETTLE: Duration = Duration::from_secs(6);

/// The most failing jobs one replica tracks (and publishes): memory and the
/// row stay bounded whatever the outage; past it the oldest are dropped,
/// which only under-counts a streak already far over any sensible trip.
pub(crate) const MAX_TRACKED: usize = 64;

/// Success slices per window.
const SLICES: u32 = 20;

/// A job's identity for counting: FNV-1a of its key (or message id).
pub fn job_id(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// When another replica's evidence row (version `at_ms`, its writer's wall
/// clock) was written, on this replica's clock. Its writer's clock may be
/// off by seconds, which would move its times against this replica's by as
/// much: a success on a replica running ahead would look later than the
/// first failures of an outage on one running behind, and keep those jobs
/// out of the quiet rule's streak for good (seeds 1307, 5550). A version
/// not there at the previous read was written between the two: the
/// wall-clock estimate is kept inside that interval, so the error is at
/// most one watch interval (2 s), whatever the skew. An unchanged version
/// keeps its estimate; at this replica's first read, only the wall clocks
/// tell.
pub(crate) fn row_written_at(
    seen: Option<(i64, Instant)>,
    at_ms: i64,
    (now, wall_ms): (Instant, i64),
    last_read: Option<Instant>,
) -> Instant {
    if let Some((_, written)) = seen.filter(|(was, _)| *was == at_ms) {
        return written;
    }
    let ago = Duration::from_millis(u64::try_from(wall_ms - at_ms).unwrap_or(0));
    let by_wall = now.checked_sub(ago).unwrap_or(now);
    match last_read {
        Some(prev) => by_wall.clamp(prev.min(now), now),
        None => by_wall,
    }
}

/// This replica's own outcomes.
#[derive(Debug, Clone, Default)]
pub(crate) struct Evidence {
    /// Distinct jobs whose last attempt failed retryably: when each first
    /// failed (since it last left the set) and when it last failed.
    failing: BTreeMap<u64, Failing>,
    /// Successes per slice (start, count).
    successes: VecDeque<(Instant, u32)>,
    /// The last success of any job.
    last_success: Option<Instant>,
    /// Something changed since the last publication.
    changed: bool,
}

impl Evidence {
    /// A job succeeded.
    pub(crate) fn success(&mut self, now: Instant, job: u64, window: Duration) {
        self.failing.remove(&job);
        let slice = window / SLICES;
        match self.successes.back_mut() {
            Some((start, n)) if now.saturating_duration_since(*start) < slice => *n += 1,
            _ => self.successes.push_back((now, 1)),
        }
        self.last_success = Some(now);
        self.changed = true;
    }

    /// A job failed retryably.
    pub(crate) fn failure(&mut self, now: Instant, job: u64) {
        let f = self.failing.entry(job).or_insert(Failing {
            first: now,
            last: now,
        });
        f.last = now;
        if self.failing.len() > MAX_TRACKED {
            let oldest = self
                .failing
                .iter()
                .min_by_key(|(_, f)| f.last)
                .map(|(j, _)| *j);
            if let Some(j) = oldest {
                self.failing.remove(&j);
            }
        }
        self.changed = true;
    }

    /// Drop what is older than both rules look back.
    pub(crate) fn prune(&mut self, now: Instant, s: &BreakerSettings) {
        let keep = s.window.max(s.quiet_window);
        self.failing
            .retain(|_, f| now.saturating_duration_since(f.last) < keep);
        while let Some((start, _)) = self.successes.front() {
            if now.saturating_duration_since(*start) >= s.window {
                self.successes.pop_front();
            } else {
                break;
            }
        }
    }

    /// Forget everything (the breaker opened or closed: a new chapter).
    pub(crate) fn clear(&mut self) {
        *self = Self {
            changed: true,
            ..Self::default()
        };
    }

    /// Whether there is anything for the fleet to know.
    pub(crate) fn is_empty(&self) -> bool {
        self.failing.is_empty() && self.successes.is_empty()
    }

    /// Whether it changed since [`Evidence::published`].
    pub(crate) fn changed(&self) -> bool {
        self.changed
    }

    /// It was published as it stands.
    pub(crate) fn published(&mut self) {
        self.changed = false;
    }

    /// The failing jobs, when each first and last failed.
    pub(crate) fn failing(&self) -> impl Iterator<Item = (u64, Failing)> + '_ {
        self.failing.iter().map(|(j, f)| (*j, *f))
    }

    /// Successes in the window.
    pub(crate) fn success_count(&self) -> u32 {
        self.successes.iter().map(|(_, n)| n).sum()
    }

    /// The last success.
    pub(crate) fn last_success(&self) -> Option<Instant> {
        self.last_success
    }
}

/// One failing job: when it first failed (since it last succeeded or left
/// the window) and when it last failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failing {
    /// Its first failure.
    pub(crate) first: Instant,
    /// Its latest failure.
    pub(crate) last: Instant,
}

impl Failing {
    /// Both reports of one job taken together.
    pub(crate) fn merge(self, other: Failing) -> Failing {
        Failing {
            first: self.first.min(other.first),
            last: self.last.max(other.last),
        }
    }
}

/// What the other replicas published, on this replica's clock.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct FleetView {
    /// Their successes in the window.
    pub(crate) successes: u32,
    /// Their failing jobs.
    pub(crate) failing: BTreeMap<u64, Failing>,
    /// Their latest success.
    pub(crate) last_success: Option<Instant>,
}

impl FleetView {
    /// Whether any other replica reports a failing job.
    pub(crate) fn has_failures(&self) -> bool {
        !self.failing.is_empty()
    }
}

/// The fleet's evidence counted together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tally {
    /// Distinct jobs failing within the window.
    pub(crate) failing: u32,
    /// Successes within the window.
    pub(crate) successes: u32,
    /// Distinct jobs failing since the fleet's last success, within the quiet window.
    pub(crate) streak: u32,
    /// When the oldest of the streak failed.
    streak_since: Option<Instant>,
}

/// Which rule tripped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Many outcomes, nearly all failures.
    Volume,
    /// A streak of distinct failures with no success in between.
    Quiet,
}

/// Own and fleet evidence together, counting only what happened after
/// `since` (the breaker's last change of state).
pub(crate) fn tally(
    own: &Evidence,
    fleet: &FleetView,
    since: Option<Instant>,
    now: Instant,
    s: &BreakerSettings,
) -> Tally {
    let mut failing: BTreeMap<u64, Failing> = fleet.failing.clone();
    for (j, f) in own.failing() {
        let e = failing.entry(j).or_insert(f);
        *e = e.merge(f);
    }
    // Evidence from before the breaker's last change does not count.
    failing.retain(|_, f| since.is_none_or(|since| f.last >= since));
    let last_success = own.last_success.max(fleet.last_success);
    let in_window = |t: Instant| now.saturating_duration_since(t) < s.window;
    let in_quiet = |t: Instant| now.saturating_duration_since(t) < s.quiet_window;
    // A job is in the streak when it began failing after the fleet's last
    // success: new jobs failing from their first attempt, as in an outage,
    // not the tail of a partial outage (jobs that were failing among
    // successes, still retrying after the last of them).
    let began = |f: &Failing| match since {
        Some(since) if f.first < since => since,
        _ => f.first,
    };
    let streak: Vec<Instant> = failing
        .values()
        .filter(|f| in_quiet(f.last) && last_success.is_none_or(|ls| f.first > ls))
        .map(began)
        .collect();
    Tally {
        failing: failing.values().filter(|f| in_window(f.last)).count() as u32,
        successes: own.success_count() + fleet.successes,
        streak: streak.len() as u32,
        streak_since: streak.iter().min().copied(),
    }
}

/// Whether the tally trips the breaker, and by which rule.
pub(crate) fn verdict(t: &Tally, s: &BreakerSettings, now: Instant) -> Option<Rule> {
    let outcomes = t.failing + t.successes;
    if outcomes >= s.minimum_attempts
        && f64::from(t.failing) >= s.failure_ratio * f64::from(outcomes)
    {
        return Some(Rule::Volume);
    }
    // The quiet rule holds at any volume: its streak needs [`SETTLE`] with
    // no success anywhere in the fleet, which a partial outage at volume
    // never shows (its healthy keys keep succeeding). Gated on the window
    // holding few outcomes, it would stay blind for a whole `window` after
    // a burst of successes just before a quiet outage (seed 298 of the
    // simulation: 27 successes in the minute before, 11 jobs poisoned).
    let settled = t
        .streak_since
        .is_some_and(|first| now.saturating_duration_since(first) >= SETTLE);
    (s.consecutive_failures > 0 && t.streak >= s.consecutive_failures && settled)
        .then_some(Rule::Quiet)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> BreakerSettings {
        BreakerSettings {
            minimum_attempts: 10,
            consecutive_failures: 3,
            ..BreakerSettings::default()
        }
    }

    #[test]
    fn a_job_failing_again_and_again_is_one_failing_job() {
        let s = settings();
        let t0 = Instant::now();
        let mut own = Evidence::default();
        for i in 0..20 {
            own.failure(t0 + Duration::from_secs(i), job_id("k1"));
        }
        own.failure(t0 + Duration::from_secs(20), job_id("k2"));
        let now = t0 + Duration::from_secs(30);
        let t = tally(&own, &FleetView::default(), None, now, &s);
        assert_eq!((t.failing, t.streak), (2, 2));
        assert_eq!(verdict(&t, &s, now), None);
    }

    #[test]
    fn the_quiet_rule_needs_distinct_jobs_no_success_and_settled_evidence() {
        let s = settings();
        let t0 = Instant::now();
        let mut own = Evidence::default();
        for (i, k) in ["a", "b", "c"].iter().enumerate() {
            own.failure(t0 + Duration::from_secs(i as u64), job_id(k));
        }
        let early = t0 + Duration::from_secs(3);
        let t = tally(&own, &FleetView::default(), None, early, &s);
        assert_eq!(t.streak, 3);
        assert_eq!(verdict(&t, &s, early), None, "not settled yet");
        let later = t0 + SETTLE;
        assert_eq!(verdict(&t, &s, later), Some(Rule::Quiet));
        // Another replica's success after the first failure breaks the streak.
        let fleet = FleetView {
            successes: 1,
            last_success: Some(t0 + Duration::from_millis(1500)),
            ..FleetView::default()
        };
        let t = tally(&own, &fleet, None, later, &s);
        assert_eq!(t.streak, 1);
        assert_eq!(verdict(&t, &s, later), None);
        // The tail of a partial outage: jobs that began failing before the
        // last success and still retry are not a streak.
        for (i, k) in ["a", "b", "c"].iter().enumerate() {
            own.failure(t0 + Duration::from_secs(20 + i as u64), job_id(k));
        }
        let t = tally(&own, &fleet, None, t0 + Duration::from_secs(30), &s);
        assert_eq!(t.streak, 1, "only c began failing after the success");
    }

    /// Seed 298 of the simulation: a trickle whose last successes came in
    /// a burst just before the outage (27 in its last minute) held the
    /// window over `minimumAttempts`, and the quiet rule, then gated on a
    /// quiet window, stayed blind for a minute while 11 jobs spent their
    /// attempts. A streak trips at any volume; a partial outage at volume
    /// keeps succeeding between its failures, so it shows no streak.
    #[test]
    fn the_quiet_rule_trips_after_a_burst_of_successes() {
        let s = settings();
        let t0 = Instant::now();
        let mut own = Evidence::default();
        for i in 0..27 {
            own.success(t0, job_id(&format!("ok{i}")), s.window);
        }
        for i in 0..5 {
            own.failure(t0 + Duration::from_secs(1 + i), job_id(&format!("bad{i}")));
        }
        let now = t0 + Duration::from_secs(1) + SETTLE;
        let t = tally(&own, &FleetView::default(), None, now, &s);
        assert_eq!((t.streak, t.failing + t.successes), (5, 32));
        assert_eq!(verdict(&t, &s, now), Some(Rule::Quiet));
        // A partial outage at volume: successes between the failures.
        let mut own = Evidence::default();
        for i in 0..30u64 {
            let at = t0 + Duration::from_millis(300 * i);
            match i % 2 {
                0 => own.failure(at, job_id(&format!("bad{i}"))),
                _ => own.success(at, job_id(&format!("ok{i}")), s.window),
            }
        }
        let now = t0 + Duration::from_secs(9);
        let t = tally(&own, &FleetView::default(), None, now, &s);
        assert!(t.streak <= 1, "{t:?}");
        assert_eq!(verdict(&t, &s, now), None);
    }

    #[test]
    fn failures_spread_over_replicas_add_up() {
        let s = settings();
        let t0 = Instant::now();
        let mut own = Evidence::default();
        own.failure(t0, job_id("a"));
        let mut fleet = FleetView::default();
        let at = |s: u64| Failing {
            first: t0 + Duration::from_secs(s),
            last: t0 + Duration::from_secs(s),
        };
        fleet.failing.insert(job_id("a"), at(1));
        fleet.failing.insert(job_id("b"), at(1));
        fleet.failing.insert(job_id("c"), at(2));
        // The streak began with a's first failure, at 0 (here).
        let now = t0 + SETTLE;
        let t = tally(&own, &fleet, None, now, &s);
        assert_eq!((t.failing, t.streak), (3, 3), "a counted once");
        assert_eq!(verdict(&t, &s, now), Some(Rule::Quiet));
        // Evidence from before the breaker's last change does not count.
        let t = tally(
            &own,
            &fleet,
            Some(t0 + Duration::from_millis(1500)),
            now,
            &s,
        );
        assert_eq!(t.failing, 1);
    }

    #[test]
    fn volume_rule_over_distinct_jobs_and_successes() {
        let s = settings();
        let t0 = Instant::now();
        let mut own = Evidence::default();
        for i in 0..9 {
            own.failure(t0, job_id(&format!("j{i}")));
        }
        own.success(t0, job_id("ok"), s.window);
        let t = tally(&own, &FleetView::default(), None, t0, &s);
        assert_eq!((t.failing, t.successes), (9, 1));
        assert_eq!(verdict(&t, &s, t0), Some(Rule::Volume));
        own.success(t0, job_id("ok2"), s.window);
        let t = tally(&own, &FleetView::default(), None, t0, &s);
        assert_eq!(verdict(&t, &s, t0), None, "9 of 11 is under 90 %");
    }

    /// The boundary of a partial outage (docs/design.md, "How the breaker
    /// decides"): before a replica has read the others' rows, its tally is
    /// its own, and retries bring it failing jobs other replicas took first
    /// (under the default retry a failing job is attempted about three
    /// times in its first 4 s, on any replica) but none of their successes.
    /// At 3 jobs in 4 failing over 4 replicas its own view holds about 3/4
    /// of the failing jobs and 1/4 of the successes: 56 of 62, over the
    /// ratio, so it trips; with the others' rows read, the fleet's tally is
    /// 75 of 100, under it.
    #[test]
    fn a_heavy_partial_outage_trips_on_own_evidence_until_the_fleet_is_read() {
        let s = BreakerSettings::default();
        let t0 = Instant::now();
        let mut own = Evidence::default();
        for i in 0..6 {
            own.success(t0, job_id(&format!("ok{i}")), s.window);
        }
        for i in 0..56 {
            own.failure(t0 + Duration::from_secs(1), job_id(&format!("bad{i}")));
        }
        let now = t0 + Duration::from_secs(3);
        let alone = tally(&own, &FleetView::default(), None, now, &s);
        assert_eq!((alone.failing, alone.successes), (56, 6));
        assert_eq!(verdict(&alone, &s, now), Some(Rule::Volume), "90.3 %");
        let failing = (56..75)
            .map(|i| {
                let f = Failing {
                    first: t0,
                    last: t0 + Duration::from_secs(1),
                };
                (job_id(&format!("bad{i}")), f)
            })
            .collect();
        let fleet = FleetView {
            successes: 19,
            failing,
            last_success: Some(t0),
        };
        let t = tally(&own, &fleet, None, now, &s);
        assert_eq!((t.failing, t.successes), (75, 25));
        assert_eq!(verdict(&t, &s, now), None, "75 %: the ratio decides");
        // Two in three: 50 of 58 (86 %) at most in its own view, under it.
        let mut own = Evidence::default();
        for i in 0..8 {
            own.success(t0, job_id(&format!("ok{i}")), s.window);
        }
        for i in 0..50 {
            own.failure(t0 + Duration::from_secs(1), job_id(&format!("bad{i}")));
        }
        let alone = tally(&own, &FleetView::default(), None, now, &s);
        assert_eq!(verdict(&alone, &s, now), None);
    }

    #[test]
    fn memory_stays_bounded() {
        let s = settings();
        let t0 = Instant::now();
        let mut own = Evidence::default();
        for i in 0..10_000u64 {
            own.failure(t0 + Duration::from_millis(i), i);
            own.success(t0 + Duration::from_millis(i), u64::MAX - i, s.window);
        }
        assert!(own.failing().count() <= MAX_TRACKED);
        own.prune(t0 + Duration::from_secs(3600), &s);
        assert!(own.is_empty());
    }
}
