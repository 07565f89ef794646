//! The breaker's state machine, row by row (see [`super::Breaker`]).

use super::*;

fn settings() -> BreakerSettings {
    BreakerSettings {
        failure_ratio: 0.5,
        minimum_attempts: 4,
        window: Duration::from_secs(10),
        cool_down: Duration::from_secs(2),
        max_cool_down: Duration::from_secs(5),
        probes: 1,
        consecutive_failures: 0,
        quiet_window: Duration::from_secs(10),
    }
}

/// Job 0 stands for "a job of its own" in the steps below (each row a
/// new job); [`AGAIN`] is one job failing again and again.
const OK: Attempt = Attempt::Succeeded(0);
const FAIL: Attempt = Attempt::FailedRetryable(0);
const AGAIN: u64 = u64::MAX;
const FAIL_AGAIN: Attempt = Attempt::FailedRetryable(AGAIN);

fn distinct(a: Attempt, row: usize) -> Attempt {
    match a {
        Attempt::Succeeded(0) => Attempt::Succeeded(row as u64 + 1),
        Attempt::FailedRetryable(0) => Attempt::FailedRetryable(row as u64 + 1),
        other => other,
    }
}

/// One step of a scenario: at `t` seconds, record an attempt or ask to
/// receive `want`; then the expected state name and transition.
enum Step {
    Record(u64, Attempt, &'static str, Option<&'static str>),
    Admit(u64, u32, Admission, &'static str),
}
use Step::*;

fn run(rows: &[Step]) {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let mut b = Breaker::new(settings());
    for (i, row) in rows.iter().enumerate() {
        match row {
            Record(t, a, state, tr) => {
                let got = b.record(at(*t), distinct(*a, i));
                assert_eq!(got.as_ref().map(|t| t.to()), *tr, "row {i}: transition");
                assert_eq!(b.state().name(), *state, "row {i}: state");
            }
            Admit(t, want, adm, state) => {
                let (got, _) = b.admit(at(*t), *want);
                assert_eq!(got, *adm, "row {i}: admission");
                assert_eq!(b.state().name(), *state, "row {i}: state");
            }
        }
    }
}

fn wait(ms: u64) -> Admission {
    Admission::Wait(Duration::from_millis(ms))
}

#[test]
fn trips_only_over_the_minimum_and_the_ratio() {
    run(&[
        Record(0, FAIL, "closed", None),
        Record(100, FAIL, "closed", None),
        Record(200, FAIL, "closed", None),
        Admit(300, 8, Admission::Receive(8), "closed"),
        Record(400, FAIL, "open", Some("open")),
        Admit(500, 8, wait(1900), "open"),
    ]);
    run(&[
        Record(0, OK, "closed", None),
        Record(100, OK, "closed", None),
        Record(200, OK, "closed", None),
        Record(300, FAIL, "closed", None),
        Record(400, FAIL, "closed", None),
        Record(500, FAIL, "open", Some("open")),
    ]);
}

#[test]
fn retries_of_failing_messages_and_old_attempts_do_not_count() {
    run(&[
        Record(0, FAIL_AGAIN, "closed", None),
        Record(100, FAIL_AGAIN, "closed", None),
        Record(200, FAIL_AGAIN, "closed", None),
        Record(300, FAIL_AGAIN, "closed", None),
        Record(400, FAIL_AGAIN, "closed", None),
    ]);
    run(&[
        Record(0, FAIL, "closed", None),
        Record(100, FAIL, "closed", None),
        Record(200, FAIL, "closed", None),
        // 11 s later the first three are out of the 10 s window.
        Record(11000, FAIL, "closed", None),
        Record(11100, FAIL, "closed", None),
        Record(11200, FAIL, "closed", None),
        Record(11300, FAIL, "open", Some("open")),
    ]);
}

#[test]
fn half_open_lets_the_probe_budget_through_and_closes_on_success() {
    run(&[
        Record(0, FAIL, "closed", None),
        Record(0, FAIL, "closed", None),
        Record(0, FAIL, "closed", None),
        Record(0, FAIL, "open", Some("open")),
        // In-flight results while open change nothing.
        Record(500, OK, "open", None),
        Admit(2000, 8, Admission::Receive(1), "half-open"),
        Admit(2100, 8, Admission::Wait(PROBE_POLL), "half-open"),
        Record(2200, OK, "closed", Some("closed")),
        Admit(2300, 8, Admission::Receive(8), "closed"),
    ]);
}

#[test]
fn a_closed_breaker_follows_the_fleet_and_probes_only_when_no_verdict_comes() {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let mut b = Breaker::new(settings());
    // Another replica tripped: hold until the given time, park what is held.
    assert_eq!(b.follow(at(3000), at(0)), Some(Transition::Followed));
    assert!(b.holds());
    assert_eq!(b.admit(at(100), 8).0, wait(2900));
    // A later word extends the hold; an earlier one does not shorten it.
    assert_eq!(b.follow(at(4000), at(0)), None);
    assert_eq!(b.follow(at(1000), at(0)), None);
    assert_eq!(b.admit(at(3500), 8).0, wait(500));
    // Failures while following change nothing of its own.
    assert_eq!(b.record(at(3600), FAIL), None);
    // No verdict by then: probe as if its own.
    let (adm, t) = b.admit(at(4000), 8);
    assert_eq!(
        (adm, t),
        (Admission::Receive(1), Some(Transition::HalfOpened))
    );
    assert_eq!(b.record(at(4100), OK), Some(Transition::Closed));
}

#[test]
fn the_fleet_closing_releases_a_follower_which_ramps_up() {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let mut b = Breaker::new(settings());
    assert_eq!(
        b.release(at(0)),
        None,
        "a closed breaker has nothing to release"
    );
    b.follow(at(10_000), at(0));
    assert_eq!(b.release(at(1000)), Some(Transition::Released));
    assert_eq!(b.state(), State::Closed);
    // Concurrency ramps up after the close (issue 37): the jobs in
    // flight are capped by the probe count, doubling every RAMP_STEP.
    assert_eq!(b.allowance(at(1000)), Some(1));
    assert_eq!(b.allowance(at(2000)), Some(2));
    assert_eq!(b.allowance(at(4000)), Some(8));
    assert_eq!(b.allowance(at(1000 + 10_000)), None, "the ramp ends");
}

#[test]
fn an_own_open_breaker_does_not_follow() {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let mut b = Breaker::new(settings());
    for job in 1..=4 {
        b.record(at(0), Attempt::FailedRetryable(job));
    }
    assert_eq!(b.state().name(), "open");
    assert_eq!(b.follow(at(60_000), at(0)), None);
    assert_eq!(b.release(at(100)), None);
    assert_eq!(b.state().name(), "open");
}

#[test]
fn a_failed_probe_reopens_with_a_doubled_cool_down_up_to_the_cap() {
    run(&[
        Record(0, FAIL, "closed", None),
        Record(0, FAIL, "closed", None),
        Record(0, FAIL, "closed", None),
        Record(0, FAIL, "open", Some("open")),
        Admit(2000, 8, Admission::Receive(1), "half-open"),
        Record(2100, FAIL_AGAIN, "open", Some("open")),
        Admit(2200, 8, wait(3900), "open"),
        Admit(6200, 8, Admission::Receive(1), "half-open"),
        Record(6200, FAIL, "open", Some("open")),
        // 4 s doubled is 8 s, capped at 5 s.
        Admit(6300, 8, wait(4900), "open"),
    ]);
}

#[test]
fn probes_without_a_verdict_are_replaced_after_a_cool_down() {
    run(&[
        Record(0, FAIL, "closed", None),
        Record(0, FAIL, "closed", None),
        Record(0, FAIL, "closed", None),
        Record(0, FAIL, "open", Some("open")),
        Admit(2000, 8, Admission::Receive(1), "half-open"),
        Admit(3000, 8, Admission::Wait(PROBE_POLL), "half-open"),
        Admit(4000, 8, Admission::Receive(1), "half-open"),
    ]);
}

#[test]
fn closing_resets_the_cool_down() {
    let t0 = Instant::now();
    let mut b = Breaker::new(settings());
    for job in 1..=4 {
        b.record(t0, Attempt::FailedRetryable(job));
    }
    b.admit(t0 + Duration::from_secs(2), 1);
    b.record(t0 + Duration::from_secs(2), FAIL);
    assert_eq!(b.cool_down(), Duration::from_secs(4));
    b.admit(t0 + Duration::from_secs(7), 1);
    b.record(t0 + Duration::from_secs(7), OK);
    assert_eq!(b.cool_down(), Duration::from_secs(2));
}

/// Seed 668 of the simulation: after an outage the queue held only two
/// keys failing alone; every probe picked one of them, failed, reopened
/// the breaker and parked it as a fresh copy, so the breaker never closed
/// and they never reached poison. Until `consecutiveFailures` distinct jobs
/// failed the opening's probes, a job failing a probe again is no verdict:
/// the breaker stays half-open (that failure is the job's own: retried,
/// counted, poisoned at the cap), and a new job's failure still reopens
/// it. Past that many, an outage stands and every failed probe reopens.
#[test]
fn a_few_jobs_failing_their_probes_again_do_not_hold_the_breaker() {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let mut b = Breaker::new(BreakerSettings {
        consecutive_failures: 3,
        ..settings()
    });
    for job in 1..=4 {
        b.record(at(0), Attempt::FailedRetryable(job));
    }
    assert_eq!(b.state().name(), "open");
    // In flight at the trip, before any probe: not a probe's failure.
    assert_eq!(b.record(at(100), Attempt::FailedRetryable(7)), None);
    assert_eq!(b.admit(at(2000), 8).0, Admission::Receive(1));
    let reopened = |s| {
        Some(Transition::Reopened {
            cool_down: Duration::from_secs(s),
        })
    };
    assert_eq!(b.record(at(2100), Attempt::FailedRetryable(9)), reopened(4));
    assert_eq!(b.admit(at(6100), 8).0, Admission::Receive(1));
    // Job 9 again: no verdict, the breaker stays half-open (not holding).
    assert_eq!(b.record(at(6200), Attempt::FailedRetryable(9)), None);
    assert_eq!(b.state().name(), "half-open");
    assert!(!b.holds());
    // Job 7 failed only before the probing began: its probe is a verdict.
    assert_eq!(b.admit(at(10_100), 8).0, Admission::Receive(1));
    assert_eq!(
        b.record(at(10_200), Attempt::FailedRetryable(7)),
        reopened(5)
    );
    // Another probe's failure after that reopening counts too: 3 distinct.
    assert_eq!(b.record(at(10_300), Attempt::FailedRetryable(8)), None);
    // An outage on 3 distinct jobs: a repeat reopens again.
    assert_eq!(b.admit(at(15_200), 8).0, Admission::Receive(1));
    assert_eq!(
        b.record(at(15_300), Attempt::FailedRetryable(9)),
        reopened(5)
    );
    // A success closes it, and the next opening starts afresh.
    assert_eq!(b.admit(at(20_300), 8).0, Admission::Receive(1));
    assert_eq!(b.record(at(20_400), OK), Some(Transition::Closed));
    for job in 1..=4 {
        b.record(at(21_000), Attempt::FailedRetryable(job));
    }
    assert_eq!(b.admit(at(23_000), 8).0, Admission::Receive(1));
    assert!(matches!(
        b.record(at(23_100), Attempt::FailedRetryable(9)),
        Some(Transition::Reopened { .. })
    ));
    assert_eq!(b.admit(at(27_100), 8).0, Admission::Receive(1));
    assert_eq!(b.record(at(27_200), Attempt::FailedRetryable(9)), None);
}

/// A probe's close is taken from the control row by reads, not by times:
/// only a mark that changed between two reads of one opening closes it
/// (seed 6936); one already there at the first read, one that appeared
/// while the breaker was closed, and one this opening began after, do not.
#[test]
fn a_probe_close_seen_appearing_during_the_opening_closes_it() {
    let t0 = Instant::now();
    let t = |ms: u64| t0 + Duration::from_millis(ms);
    let mut b = Breaker::new(settings());
    // Already there at the first read: an old close.
    assert_eq!(b.observe_probe_close(t(0), Some("c1")), None);
    for i in 0..4 {
        b.record(t(100 + i), distinct(FAIL, i as usize));
    }
    assert_eq!(b.state().name(), "open");
    // A close that appeared in the read that first saw this opening: it
    // may be older than the opening.
    assert_eq!(b.observe_probe_close(t(200), Some("c2")), None);
    assert_eq!(b.observe_probe_close(t(300), Some("c2")), None);
    // One appearing between two reads of this opening: after it began.
    assert_eq!(
        b.observe_probe_close(t(400), Some("c3")),
        Some(Transition::Released)
    );
    assert_eq!(b.state(), State::Closed);
    // Closed: a change is nobody's news.
    assert_eq!(b.observe_probe_close(t(500), Some("c4")), None);
}

/// Seed 3458: an opening whose probes saw five distinct jobs fail keeps
/// reopening on a job failing alone, until another replica's success after
/// the opening is read: then that job failing a probe again is no verdict
/// (its failure its own) and the breaker stays half-open; a new job
/// failing still reopens. No success read, nothing is forgotten.
#[test]
fn a_fleet_success_after_the_opening_forgets_the_probes_evidence() {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let mut b = Breaker::new(BreakerSettings {
        consecutive_failures: 5,
        ..settings()
    });
    for i in 0..4 {
        b.record(at(i), distinct(FAIL, i as usize));
    }
    assert_eq!(b.state().name(), "open");
    // Five distinct jobs fail the probes, then the lone one.
    let clock = std::cell::Cell::new(0);
    let probe = |b: &mut Breaker, job: u64| {
        clock.set(clock.get() + 6_000);
        assert_eq!(b.admit(at(clock.get()), 1).0, Admission::Receive(1));
        b.record(at(clock.get()), Attempt::FailedRetryable(job))
    };
    for job in 10..15 {
        assert!(matches!(
            probe(&mut b, job),
            Some(Transition::Reopened { .. })
        ));
    }
    assert!(matches!(
        probe(&mut b, AGAIN),
        Some(Transition::Reopened { .. })
    ));
    assert!(
        matches!(probe(&mut b, AGAIN), Some(Transition::Reopened { .. })),
        "no success read: it stands"
    );
    // Another replica succeeded after the opening.
    let fleet = FleetView {
        successes: 1,
        last_success: Some(at(clock.get() + 1)),
        ..FleetView::default()
    };
    assert_eq!(
        b.observe_fleet(at(clock.get() + 2), fleet.clone(), false),
        None
    );
    assert!(
        matches!(probe(&mut b, AGAIN), Some(Transition::Reopened { .. })),
        "once new again"
    );
    assert_eq!(probe(&mut b, AGAIN), None, "then its failure is its own");
    assert_eq!(b.state().name(), "half-open");
    // The same success read again forgets nothing more.
    assert_eq!(b.observe_fleet(at(clock.get() + 3), fleet, false), None);
    assert_eq!(b.record(at(clock.get() + 4), FAIL_AGAIN), None);
}

/// Issue 49's first wave: a closed breaker suspects an outage once
/// `consecutiveFailures` distinct jobs of its own began failing since its
/// last control read and its last success, and stops suspecting at the
/// next read; a success in between clears it.
#[test]
fn own_failures_since_the_last_read_make_it_wait_for_the_next() {
    let t0 = Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    let mut b = Breaker::new(BreakerSettings {
        minimum_attempts: 100,
        consecutive_failures: 3,
        ..settings()
    });
    let read = Some(at(0));
    for job in 1..=2 {
        b.record(at(1), Attempt::FailedRetryable(job));
    }
    assert!(!b.suspects(read), "two failures are no streak of three");
    b.record(at(1), Attempt::FailedRetryable(3));
    assert!(
        b.suspects(read),
        "three distinct jobs failed since the read"
    );
    assert!(
        !b.suspects(Some(at(2))),
        "the next read brought the fleet's word"
    );
    b.record(at(1), Attempt::Succeeded(9));
    assert!(!b.suspects(read), "a success since: no outage to suspect");
    for _ in 0..3 {
        b.record(at(1), Attempt::FailedRetryable(AGAIN));
    }
    assert!(!b.suspects(read), "one job failing again is one job");
}

/// While the fleet's evidence says trip and another replica is first in
/// line, the breaker is closed but suspects; the consecutive rule off
/// (`consecutiveFailures: 0`) leaves only that.
#[test]
fn a_replica_second_in_line_suspects_until_the_fleet_opens() {
    let t0 = Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    let mut b = Breaker::new(settings());
    let failing = (1..=4)
        .map(|j| {
            (
                j,
                Failing {
                    first: at(0),
                    last: at(0),
                },
            )
        })
        .collect();
    let fleet = FleetView {
        failing,
        ..FleetView::default()
    };
    assert_eq!(
        b.observe_fleet(at(1), fleet.clone(), true),
        None,
        "deferred"
    );
    assert_eq!(b.state(), State::Closed);
    assert!(b.suspects(Some(at(1))));
    assert!(!Breaker::new(settings()).suspects(None), "nothing seen");
    let t = b.observe_fleet(at(1) + LEADER_GRACE, fleet, true);
    assert!(matches!(t, Some(Transition::Opened { .. })), "{t:?}");
    assert!(!b.suspects(Some(at(8))), "open: it holds, it does not wait");
}

/// A closed breaker whose own job succeeded after another replica's open
/// row was written keeps its course (and its evidence, to publish); one
/// whose last success is older follows.
#[test]
fn a_success_after_the_opening_is_not_followed() {
    let t0 = Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    let mut b = Breaker::new(settings());
    b.record(at(5), Attempt::Succeeded(1));
    assert_eq!(b.follow(at(60), at(3)), None, "its success came after");
    assert_eq!(b.state(), State::Closed);
    assert_eq!(b.evidence().last_success(), Some(at(5)), "kept to publish");
    assert_eq!(b.follow(at(60), at(7)), Some(Transition::Followed));
}
