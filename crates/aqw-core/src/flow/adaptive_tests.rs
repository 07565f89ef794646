//! The adaptive rate's tests (see [`super::ClientRateLimiter`]).

use super::*;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-6
}

/// aws-sdk-go-v2's `adaptive_ratelimit_test.go` vectors (as ported to
/// smithy-rs): the time window for a last max rate of 10, and the
/// cubic curve back from a throttle at t = 5.
#[test]
fn the_cubic_curve_matches_the_aws_sdks() {
    let mut l = ClientRateLimiter::new(5.0, None);
    l.last_max_rate = 10.0;
    l.time_window = ((10.0 * (1.0 - BETA)) / SCALE_CONSTANT).cbrt();
    assert!(close(l.time_window, 1.9574338205844317));
    let cubic = |t: f64| SCALE_CONSTANT * (t - 5.0 - l.time_window).powi(3) + 10.0;
    for (t, want) in [
        (5.0, 7.0),
        (6.0, 9.64893600966),
        (7.0, 10.000030849917364),
        (8.0, 10.453284520772092),
        (9.0, 13.408697022224185),
        (10.0, 21.26626835427364),
        (11.0, 36.425998516920465),
    ] {
        assert!(close(cubic(t), want), "t {t}: {} vs {want}", cubic(t));
    }
}

/// Calls at `per_s` for `secs` from `t`, each answered throttled or not.
fn drive(l: &mut ClientRateLimiter, t: &mut f64, secs: f64, per_s: f64, throttled: bool) {
    let end = *t + secs;
    while *t < end {
        *t += 1.0 / per_s;
        l.update(*t, throttled, *t);
    }
}

#[test]
fn inactive_until_the_first_throttle() {
    let mut l = ClientRateLimiter::new(0.0, None);
    let mut t = 0.0;
    drive(&mut l, &mut t, 5.0, 20.0, false);
    assert_eq!(l.rate(), None);
    assert_eq!(l.take(t, 1000), Ok(1000), "no bucket while inactive");
    l.update(t, true, t);
    let r = l.rate().expect("active after a throttle");
    assert!((13.0..=14.5).contains(&r), "0.7 × ~20/s measured: {r}");
}

#[test]
fn a_throttle_cuts_the_rate_and_successes_bring_it_back() {
    let mut l = ClientRateLimiter::new(0.0, None);
    let mut t = 0.0;
    drive(&mut l, &mut t, 5.0, 10.0, false);
    l.update(t, true, t);
    let cut = l.rate().unwrap();
    drive(&mut l, &mut t, 1.0, cut, true);
    let cut_again = l.rate().unwrap();
    assert!(cut_again < cut, "{cut_again} < {cut}");
    drive(&mut l, &mut t, 10.0, 5.0, false);
    assert!(
        l.rate().unwrap() > cut_again,
        "grows back on success: {:?}",
        l.rate()
    );
    for _ in 0..200 {
        l.update(t, true, t);
        t += 0.5;
    }
    assert!(close(l.rate().unwrap(), MIN_FILL_RATE), "the floor");
}

#[test]
fn the_ceiling_holds() {
    let mut l = ClientRateLimiter::new(0.0, Some(4.0));
    let mut t = 0.0;
    drive(&mut l, &mut t, 5.0, 50.0, false);
    l.update(t, true, t);
    assert!(l.rate().unwrap() <= 4.0);
    drive(&mut l, &mut t, 60.0, 50.0, false);
    assert!(close(l.rate().unwrap(), 4.0), "{:?}", l.rate());
}

#[test]
fn tokens_pace_the_calls_once_active() {
    let mut l = ClientRateLimiter::new(0.0, None);
    let mut t = 0.0;
    drive(&mut l, &mut t, 3.0, 4.0, false);
    l.update(t, true, t);
    let r = l.rate().unwrap();
    // Drain, then the next token is 1/r away.
    while l.take(t, 16).is_ok() {}
    let wait = l.take(t, 1).unwrap_err();
    assert!(wait > 0.0 && wait <= 1.0 / r + 1e-9, "{wait} for {r}/s");
    let later = t + wait + 1e-6;
    assert_eq!(l.take(later, 16), Ok(1));
    l.give_back(1);
    assert_eq!(l.take(later, 16), Ok(1), "handed back");
    let mut none = ClientRateLimiter::new(0.0, Some(f64::NAN));
    none.update(1.0, true, 1.0);
    assert!(none.rate().unwrap().is_finite(), "a NaN ceiling is none");
}

#[test]
fn an_inactive_limiter_adopts_the_fleets_rate_once() {
    let mut l = ClientRateLimiter::new(0.0, Some(2.0));
    assert!(!l.adopt(1.0, f64::NAN), "no rate");
    assert!(!l.adopt(1.0, -1.0));
    assert!(l.adopt(1.0, 5.0));
    assert!(close(l.rate().unwrap(), 2.0), "the ceiling holds");
    assert!(!l.adopt(2.0, 0.5), "once active it keeps its own");
    let mut t = 1.0;
    drive(&mut l, &mut t, 30.0, 2.0, false);
    assert!(close(l.rate().unwrap(), 2.0));
    let mut free = ClientRateLimiter::new(0.0, None);
    assert!(free.adopt(0.0, 0.2));
    drive(&mut free, &mut t, 60.0, 0.2, false);
    assert!(free.rate().unwrap() > 0.2, "grows back: {:?}", free.rate());
}

fn row(replica: &str, rate: Option<f64>, at_ms: i64) -> crate::control::EvidenceRow {
    crate::control::EvidenceRow {
        function: "F".into(),
        replica: replica.into(),
        at_ms,
        rate,
        ..Default::default()
    }
}

#[test]
fn the_fleets_rate_counts_fresh_rows_of_the_function() {
    let now = 1_000_000;
    let rows = vec![
        row("a", Some(1.0), now - 1_000),
        row("b", Some(3.0), now - 5_000),
        row("c", Some(2.0), now),
        row("d", None, now),
        row("e", Some(9.0), now - RATE_FRESH.as_millis() as i64 - 1),
        crate::control::EvidenceRow {
            function: "G".into(),
            ..row("f", Some(7.0), now)
        },
    ];
    let f = fleet_rate(&rows, "F", None, now).unwrap();
    assert_eq!(f.replicas, 3);
    assert!(close(f.sum, 6.0) && close(f.min, 1.0) && close(f.max, 3.0));
    assert!(close(f.median, 2.0) && close(f.newest_age_s, 0.0));
    let f = fleet_rate(&rows, "F", Some("c"), now).unwrap();
    assert!(close(f.median, 2.0) && close(f.newest_age_s, 1.0), "{f:?}");
    assert_eq!(fleet_rate(&rows, "H", None, now), None);
}

#[tokio::test(start_paused = true)]
async fn a_rate_is_republished_when_it_moves_or_ages() {
    let t0 = Instant::now();
    let s = Duration::from_secs;
    assert!(!rate_due(None, None, t0));
    assert!(rate_due(None, Some(1.0), t0), "began sharing");
    assert!(rate_due(Some((1.0, t0)), None, t0), "stopped");
    assert!(!rate_due(Some((1.0, t0)), Some(0.5), t0 + s(2)), "too soon");
    assert!(rate_due(Some((1.0, t0)), Some(0.5), t0 + s(10)));
    assert!(
        !rate_due(Some((1.0, t0)), Some(1.1), t0 + s(30)),
        "moved little"
    );
    assert!(
        rate_due(Some((1.0, t0)), Some(1.1), t0 + s(60)),
        "refreshed"
    );
    let a = AdaptiveRate::new("F", true, None);
    assert_eq!(a.to_share(), None, "never throttled");
    a.record(true, Instant::now(), s(600));
    assert!(a.to_share().is_some());
    tokio::time::advance(SHARE_FOR).await;
    assert_eq!(a.to_share(), None, "the episode is over");
    let fresh = AdaptiveRate::new("F", true, None);
    let fleet = fleet_rate(&[row("a", Some(0.4), 0)], "F", None, 0).unwrap();
    assert!(fresh.adopt(&fleet));
    assert_eq!(fresh.rate(), Some(0.4));
    assert_eq!(
        fresh.to_share(),
        None,
        "an adopted rate is not shared again"
    );
    let off = AdaptiveRate::new("F", false, None);
    assert!(!off.adopt(&fleet));
}

#[tokio::test(start_paused = true)]
async fn the_alert_comes_once_per_episode() {
    let a = AdaptiveRate::new("F", true, None);
    let after = Duration::from_secs(600);
    assert_eq!(a.record(true, Instant::now(), after), None);
    for _ in 0..20 {
        tokio::time::advance(Duration::from_secs(30)).await;
        a.record(false, Instant::now(), after);
        if a.record(true, Instant::now(), after).is_some() {
            assert!(a.rate().is_some());
            assert_eq!(a.record(true, Instant::now(), after), None, "once");
            return;
        }
    }
    panic!("no alert after 10 minutes throttled");
}

/// A burst of refusals cuts once (TCP cuts once per round trip; the AWS
/// SDKs once per throttle window): 16 calls sent together, refused over
/// the next 3 s (slow answers, each further apart than one call at the new
/// rate), cut the rate once, not 16 times down to the floor. A call sent
/// after the cut and refused cuts again.
#[test]
fn a_burst_of_refusals_cuts_once() {
    let mut l = ClientRateLimiter::new(0.0, None);
    let mut t = 0.0;
    drive(&mut l, &mut t, 5.0, 10.0, false);
    let sent = t;
    for i in 1..=16 {
        l.update(sent + 0.2 * f64::from(i), true, sent);
    }
    let once = l.rate().expect("active after a throttle");
    assert!(
        (6.0..=9.0).contains(&once),
        "0.7 × the measured ~10-12/s, once: {once}"
    );
    // Without the rule: each answer past the cut interval cuts again.
    let mut again = ClientRateLimiter::new(0.0, None);
    let mut t2 = 0.0;
    drive(&mut again, &mut t2, 5.0, 10.0, false);
    for i in 1..=16 {
        let at = t2 + 0.2 * f64::from(i);
        again.update(at, true, at);
    }
    assert!(again.rate().unwrap() < once * 0.5, "{:?}", again.rate());
    // A call sent after the cut, refused: a new round trip, a new cut.
    let after = sent + 3.3;
    l.update(after + 0.1, true, after);
    assert!(l.rate().unwrap() < once, "{:?} < {once}", l.rate());
}
