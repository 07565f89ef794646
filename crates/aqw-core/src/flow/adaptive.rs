//! The adaptive call rate (issue 49): a function's calls per second learn
//! the provider's limit from its throttling answers (a 429, a 503 with
//! `Retry-After`: [`crate::handler::HandlerError::Throttled`]).
//!
//! `ClientRateLimiter` is the AWS SDKs' adaptive retry mode's client rate
//! limiter, a token bucket whose fill rate follows CUBIC (RFC 9438): on a
//! throttle the rate drops to `BETA` (0.7) times the rate measured, and on
//! each success it grows back along a cubic curve scaled by
//! `SCALE_CONSTANT` (0.4), reaching the rate of the last throttle after
//! `cbrt(last_max × (1 − BETA) / SCALE_CONSTANT)` seconds, and never past
//! twice the rate measured (half-second buckets smoothed by `SMOOTH`, 0.8).
//! Ported from smithy-rs `rust-runtime/aws-smithy-runtime/src/client/
//! retries/client_rate_limiter.rs` and aws-sdk-go-v2
//! `aws/retry/adaptive_ratelimit.go` (whose test vectors the tests below
//! reuse). Like the AWS client's `enabled` flag, the bucket is inactive
//! until the first throttle: until then a call costs a mutex and a few
//! float operations to measure the rate, no wait and no storage request.
//!
//! aqw's departures, each for the fleet: the floor of the fill rate is
//! `MIN_FILL_RATE` (0.05/s) rather than AWS's 0.5/s, because a fleet
//! shares one provider limit between its replicas (50 replicas over a
//! 10/s provider need 0.2/s each, under AWS's floor); below 10 calls/s
//! the cubic curve's time is counted in calls rather than seconds
//! (`ClientRateLimiter::time_scale`: AWS's absolute growth, 0.4 calls/s³,
//! applied to each of 50 replicas at 0.2/s, drove the fleet past the
//! limit again within seconds of every cut: 38 % of the calls refused in
//! the engine's simulation, under 20 % with the scaled curve); the rate is
//! cut once per round trip, as TCP cuts: the refusal of a call sent
//! before the last cut, or within one call interval at the new rate after
//! it, does not cut it again (a replica's 16 concurrent calls refused,
//! however slowly they are answered, would otherwise cut it 16 times, to
//! the floor); a configured
//! `limits.callsPerSecond` is the ceiling; and tokens are taken for a
//! whole receive at once (`ClientRateLimiter::take`).
//!
//! Fleet-wide convergence without a shared row: each replica runs its own
//! limiter, as each AWS client does. A provider over its limit refuses
//! calls about in proportion to each replica's share of the traffic, so
//! every replica above its share is throttled and cut by 0.7 while it
//! grows back cubically: the sum of the replicas' rates falls under the
//! provider's limit after a few throttles and oscillates just below it
//! (the same argument as for many TCP CUBIC flows sharing one bottleneck).
//! So no storage request is spent on it.

use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// The floor of a replica's learned rate (calls per second).
const MIN_FILL_RATE: f64 = 0.05;
const MIN_CAPACITY: f64 = 1.0;
const SMOOTH: f64 = 0.8;
/// At and above this last max rate (calls/s) the cubic curve is AWS's in
/// seconds; below it, in calls ([`ClientRateLimiter::time_scale`]).
const REFERENCE_RATE: f64 = 10.0;
/// The slowest the cubic curve's time runs (at 0.3 calls/s and below): a
/// replica cut to a small share still finds a risen limit within minutes.
const MIN_TIME_SCALE: f64 = 0.03;
/// The longest a cut shields the rate from the next one (seconds).
const MAX_CUT_INTERVAL: f64 = 5.0;
/// How far the rate drops on a throttle.
const BETA: f64 = 0.7;
/// How fast the rate grows back after a throttle.
const SCALE_CONSTANT: f64 = 0.4;

/// The AWS SDKs' client rate limiter as a pure value: time is passed in
/// (seconds on any monotonic scale), so tests drive it by hand.
#[derive(Debug, Clone)]
struct ClientRateLimiter {
    fill_rate: f64,
    max_capacity: f64,
    capacity: f64,
    last_refill: Option<f64>,
    measured_rate: f64,
    last_bucket: f64,
    request_count: u64,
    enabled: bool,
    last_max_rate: f64,
    last_throttle: f64,
    time_window: f64,
    ceiling: Option<f64>,
}

impl ClientRateLimiter {
    /// An inactive limiter at `now`, never above `ceiling` calls/s once active.
    pub(crate) fn new(now: f64, ceiling: Option<f64>) -> Self {
        Self {
            fill_rate: 0.0,
            max_capacity: f64::MAX,
            capacity: 0.0,
            last_refill: None,
            measured_rate: 0.0,
            last_bucket: (now * 2.0).floor() / 2.0,
            request_count: 0,
            enabled: false,
            last_max_rate: 0.0,
            last_throttle: now,
            time_window: 0.0,
            ceiling: ceiling.filter(|c| c.is_finite() && *c > 0.0),
        }
    }

    /// The learned rate, once a throttle made the limiter active.
    pub(crate) fn rate(&self) -> Option<f64> {
        self.enabled.then_some(self.fill_rate)
    }

    /// Start active at `rate` calls/s, the rate the rest of the fleet
    /// learned, as if this limiter had been cut to it at `now`: from there
    /// it grows back along the cubic curve and is cut by its own
    /// throttles. Only while inactive (a limiter that learned its own rate
    /// keeps it); a rate that is not a finite positive number is ignored.
    pub(crate) fn adopt(&mut self, now: f64, rate: f64) -> bool {
        if self.enabled || !rate.is_finite() || rate <= 0.0 {
            return false;
        }
        let mut rate = rate.max(MIN_FILL_RATE);
        if let Some(c) = self.ceiling {
            rate = rate.min(c);
        }
        self.enabled = true;
        self.last_max_rate = rate;
        self.time_window = 0.0;
        self.last_throttle = now;
        self.refill(now);
        self.fill_rate = rate;
        self.max_capacity = rate.max(MIN_CAPACITY);
        self.capacity = self.capacity.min(self.max_capacity);
        true
    }

    /// Take tokens for up to `want` calls at `now`: how many may go now
    /// (all while inactive), or how many seconds until one may.
    pub(crate) fn take(&mut self, now: f64, want: u32) -> Result<u32, f64> {
        if !self.enabled || want == 0 {
            return Ok(want);
        }
        self.refill(now);
        let available = self.capacity.floor();
        if available >= 1.0 {
            let n = (want as f64).min(available);
            self.capacity -= n;
            Ok(n as u32)
        } else {
            Err((1.0 - self.capacity) / self.fill_rate)
        }
    }

    /// Hand back tokens taken for calls that were not made.
    pub(crate) fn give_back(&mut self, n: u32) {
        if self.enabled {
            self.capacity = (self.capacity + n as f64).min(self.max_capacity);
        }
    }

    /// A response at `now` to a call sent at `sent`: a throttle or not
    /// (AWS's `update_rate_limiter`). A throttle of a call sent before the
    /// last cut cuts nothing more (TCP cuts once per round trip): a burst
    /// of refusals cuts once, however long its calls take to answer.
    pub(crate) fn update(&mut self, now: f64, throttled: bool, sent: f64) {
        self.measure(now);
        let before_the_cut = sent < self.last_throttle;
        if throttled
            && self.enabled
            && (before_the_cut || now - self.last_throttle < self.cut_interval())
        {
            // An answer to a call sent before the last cut: the rate was
            // cut for it already (TCP cuts once per round trip). Without
            // this, a backlog's first burst of refusals (16 calls in flight
            // on each replica) cut the rate 16 times over, to the floor.
            return;
        }
        let calculated = if throttled {
            // A throttle in the first half-second bucket has no measured
            // rate yet (AWS's would be 0, its floor then): the calls of
            // the bucket so far stand for it.
            let measured = if self.measured_rate > 0.0 {
                self.measured_rate
            } else {
                self.request_count as f64 * 2.0
            };
            let rate_to_use = if self.enabled {
                measured.min(self.fill_rate)
            } else {
                measured
            };
            self.last_max_rate = rate_to_use;
            let s = self.time_scale();
            self.time_window = ((self.last_max_rate * (1.0 - BETA)) / (SCALE_CONSTANT * s)).cbrt();
            self.last_throttle = now;
            self.enabled = true;
            rate_to_use * BETA
        } else {
            let s = self.time_scale();
            let dt = (now - self.last_throttle) * s - self.time_window;
            SCALE_CONSTANT * s * dt.powi(3) + self.last_max_rate
        };
        let mut new_rate = calculated.min(2.0 * self.measured_rate);
        if let Some(c) = self.ceiling {
            new_rate = new_rate.min(c);
        }
        self.refill(now);
        self.fill_rate = new_rate.max(MIN_FILL_RATE);
        self.max_capacity = new_rate.max(MIN_CAPACITY);
        self.capacity = self.capacity.min(self.max_capacity);
    }

    /// How fast the cubic curve's time runs: 1 (the AWS curve) for a last
    /// max rate of [`REFERENCE_RATE`] or more; below it, slower in
    /// proportion, so that the curve is AWS's counted in calls rather than
    /// seconds: a replica holding a small share of a provider's limit grows
    /// back after as many calls as a client at 10/s does, not after as many
    /// seconds (which, over 50 replicas, would overshoot the limit 50 times
    /// as fast as one client).
    fn time_scale(&self) -> f64 {
        (self.last_max_rate / REFERENCE_RATE).clamp(MIN_TIME_SCALE, 1.0)
    }

    /// After a cut, throttles within the time of one call at the new
    /// rate (at most [`MAX_CUT_INTERVAL`] s) answer calls made before it.
    fn cut_interval(&self) -> f64 {
        (1.0 / self.fill_rate).min(MAX_CUT_INTERVAL)
    }

    fn refill(&mut self, now: f64) {
        if let Some(last) = self.last_refill {
            let fill = (now - last).max(0.0) * self.fill_rate;
            self.capacity = (self.capacity + fill).min(self.max_capacity);
        }
        self.last_refill = Some(now);
    }

    /// The rate of calls, over half-second buckets, smoothed.
    fn measure(&mut self, now: f64) {
        let bucket = (now * 2.0).floor() / 2.0;
        self.request_count += 1;
        if bucket > self.last_bucket {
            let current = self.request_count as f64 / (bucket - self.last_bucket);
            self.measured_rate = current * SMOOTH + self.measured_rate * (1.0 - SMOOTH);
            self.request_count = 0;
            self.last_bucket = bucket;
        }
    }
}

/// `aqw.alert.throttledFor` unless set: 10 minutes. A rate limit met for
/// a few minutes is the adaptive rate doing its work; one met for ten is
/// a provider limit below the work's arrival rate, and the backlog grows.
pub const DEFAULT_THROTTLED_FOR: Duration = Duration::from_secs(600);

/// How long without a throttle ends a "throttled" episode (for the alert
/// and the log).
const QUIET: Duration = Duration::from_secs(60);

/// How often at most the learned rate is logged per function.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// One function's adaptive rate on one replica: the limiter on the tokio
/// clock, its gauge, its rate-limited log, and how long the function has
/// been throttled.
pub(crate) struct AdaptiveRate {
    function: String,
    on: bool,
    start: Instant,
    state: Mutex<State>,
}

struct State {
    limiter: ClientRateLimiter,
    logged: Option<Instant>,
    throttled_since: Option<Instant>,
    last_throttle: Option<Instant>,
    alerted: bool,
}

impl AdaptiveRate {
    /// The adaptive rate of `function`, off when `on` is false (then it
    /// never waits), never above `ceiling` calls/s.
    pub(crate) fn new(function: &str, on: bool, ceiling: Option<f64>) -> Self {
        Self {
            function: function.to_string(),
            on,
            start: Instant::now(),
            state: Mutex::new(State {
                limiter: ClientRateLimiter::new(0.0, ceiling),
                logged: None,
                throttled_since: None,
                last_throttle: None,
                alerted: false,
            }),
        }
    }

    fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Tokens for up to `want` calls: how many may go now, or how long
    /// until one may.
    pub(crate) fn take(&self, want: u32) -> Result<u32, Duration> {
        if !self.on {
            return Ok(want);
        }
        let now = self.now();
        let mut s = self.state.lock().unwrap();
        s.limiter
            .take(now, want)
            .map_err(|secs| Duration::from_secs_f64(secs.clamp(0.001, 3600.0)))
    }

    /// Hand back tokens for calls not made.
    pub(crate) fn give_back(&self, n: u32) {
        if self.on && n > 0 {
            self.state.lock().unwrap().limiter.give_back(n);
        }
    }

    /// A provider's answer to a call sent at `sent`: throttled or not.
    /// Returns how long the function has been throttled when this throttle
    /// is the first past `alert_after` in its episode (then raise the alert once).
    pub(crate) fn record(
        &self,
        throttled: bool,
        sent: Instant,
        alert_after: Duration,
    ) -> Option<Duration> {
        if !self.on {
            return None;
        }
        let (now, at) = (self.now(), Instant::now());
        let sent = sent.saturating_duration_since(self.start).as_secs_f64();
        let mut s = self.state.lock().unwrap();
        let before = s.limiter.rate();
        s.limiter.update(now, throttled, sent);
        if throttled {
            metrics::counter!("aqw_throttles_total", "function" => self.function.clone())
                .increment(1);
            if s.last_throttle.is_none_or(|t| at - t > QUIET) {
                s.throttled_since = Some(at);
                s.alerted = false;
            }
            s.last_throttle = Some(at);
        }
        let rate = s.limiter.rate();
        if let Some(r) = rate {
            metrics::gauge!("aqw_adaptive_rate", "function" => self.function.clone()).set(r);
            if before != rate && s.logged.is_none_or(|t| at - t >= LOG_EVERY) {
                s.logged = Some(at);
                tracing::info!(event = "aqw.rate.adapted", function = %self.function, calls_per_second = r, throttled, "the provider's rate limit: calls per second adapted");
            }
        }
        let since = s.throttled_since?;
        let throttled_for = at - since;
        let due = throttled && !s.alerted && throttled_for >= alert_after;
        due.then(|| {
            s.alerted = true;
            throttled_for
        })
    }

    /// The learned rate on this replica, once throttled.
    pub(crate) fn rate(&self) -> Option<f64> {
        self.state.lock().unwrap().limiter.rate()
    }

    /// The learned rate to share with the fleet: while this replica's
    /// provider throttled it within [`SHARE_FOR`] (an adopted rate is not
    /// shared again: it is the fleet's, not this replica's finding).
    pub(crate) fn to_share(&self) -> Option<f64> {
        if !self.on {
            return None;
        }
        let s = self.state.lock().unwrap();
        let recent = s.last_throttle.is_some_and(|t| t.elapsed() < SHARE_FOR);
        s.limiter.rate().filter(|_| recent)
    }

    /// The fleet's learned rates, as read from the control rows: a replica
    /// its provider has not throttled yet starts at the fleet's median
    /// per-replica rate (a replica that joins a throttled fleet, or one
    /// that has not called yet) instead of at full speed, and learns on
    /// from there. Returns whether it adopted it.
    pub(crate) fn adopt(&self, fleet: &FleetRate) -> bool {
        if !self.on {
            return false;
        }
        let now = self.now();
        let adopted = self.state.lock().unwrap().limiter.adopt(now, fleet.median);
        if adopted {
            tracing::info!(event = "aqw.rate.adopted", function = %self.function, calls_per_second = fleet.median, replicas = fleet.replicas, "the provider throttles the fleet: starting at the rate the other replicas learned");
        }
        adopted
    }
}

/// How long after its provider's last throttle a replica keeps sharing
/// its learned rate on its evidence row: long enough to show an episode
/// in `aqw status`, short enough that a row does not outlive it by much.
pub(crate) const SHARE_FOR: Duration = Duration::from_secs(300);

/// While sharing, a replica republishes its rate when it moved by this
/// share since the last publication, at most every [`REPUBLISH_EVERY`].
const REPUBLISH_CHANGE: f64 = 0.25;

/// See [`REPUBLISH_CHANGE`].
const REPUBLISH_EVERY: Duration = Duration::from_secs(10);

/// While sharing, a replica republishes its rate at least this often, so
/// a row's age says whether its replica is still throttled.
const REFRESH_EVERY: Duration = Duration::from_secs(60);

/// A published rate older than this is no longer counted: its replica
/// stopped sharing (or is gone) without saying so.
const RATE_FRESH: Duration = Duration::from_secs(150);

/// The learned rates the replicas of one function publish, counted
/// together (fresh rows only).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FleetRate {
    /// Replicas sharing a learned rate.
    pub replicas: u32,
    /// Their rates added up: the fleet's learned calls per second.
    pub sum: f64,
    /// The lowest per-replica rate.
    pub min: f64,
    /// The median per-replica rate.
    pub median: f64,
    /// The highest per-replica rate.
    pub max: f64,
    /// How old the newest of the rows is, in seconds.
    pub newest_age_s: f64,
}

impl FleetRate {
    /// For a person: "3.20 calls/s learned from the provider's throttling
    /// across 4 throttled replica(s) (each 0.61-1.10, median 0.80; newest
    /// 4s old)".
    pub fn describe(&self) -> String {
        format!(
            "{:.2} calls/s learned from the provider's throttling across {} throttled replica(s) (each {:.2}-{:.2}, median {:.2}; newest {:.0}s old)",
            self.sum, self.replicas, self.min, self.max, self.median, self.newest_age_s
        )
    }
}

/// The fleet's learned rate for `function` from its evidence rows (read at
/// wall time `now_ms`), rows of `except` left out; `None` when no replica
/// shares one.
pub(crate) fn fleet_rate<'a>(
    rows: impl IntoIterator<Item = &'a crate::control::EvidenceRow>,
    function: &str,
    except: Option<&str>,
    now_ms: i64,
) -> Option<FleetRate> {
    let fresh = RATE_FRESH.as_millis() as i64;
    let mut rates: Vec<(f64, i64)> = rows
        .into_iter()
        .filter(|r| r.function == function && Some(r.replica.as_str()) != except)
        .filter_map(|r| Some((r.rate?, now_ms.saturating_sub(r.at_ms).max(0))))
        .filter(|(_, age)| *age <= fresh)
        .collect();
    if rates.is_empty() {
        return None;
    }
    rates.sort_by(|a, b| a.0.total_cmp(&b.0));
    let n = rates.len();
    let median = if n % 2 == 1 {
        rates[n / 2].0
    } else {
        (rates[n / 2 - 1].0 + rates[n / 2].0) / 2.0
    };
    Some(FleetRate {
        replicas: n as u32,
        sum: rates.iter().map(|r| r.0).sum(),
        min: rates[0].0,
        median,
        max: rates[n - 1].0,
        newest_age_s: rates.iter().map(|r| r.1).min().unwrap_or(0) as f64 / 1000.0,
    })
}

/// Whether this replica's learned rate should be (re)published now: it
/// began or stopped sharing, moved by [`REPUBLISH_CHANGE`] (after
/// [`REPUBLISH_EVERY`]), or was last published [`REFRESH_EVERY`] ago.
pub(crate) fn rate_due(
    published: Option<(f64, Instant)>,
    share: Option<f64>,
    now: Instant,
) -> bool {
    match (published, share) {
        (None, None) => false,
        (None, Some(_)) | (Some(_), None) => true,
        (Some((p, at)), Some(r)) => {
            let since = now.saturating_duration_since(at);
            (since >= REPUBLISH_EVERY && (r - p).abs() >= REPUBLISH_CHANGE * p)
                || since >= REFRESH_EVERY
        }
    }
}

#[cfg(test)]
#[path = "adaptive_tests.rs"]
mod tests;
