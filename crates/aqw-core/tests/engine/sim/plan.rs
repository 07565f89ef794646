//! The seed's plan: the workload (jobs, a trickle or a burst, duplicates,
//! jobs that fail alone), the provider's faults (outages full, partial and
//! flapping; bare and Retry-After 429s under a limit that changes; 409 "in
//! progress"; slowness), the storage's faults, and the fleet's events
//! (replicas added, stopped, killed; jobs crashing at failpoints), in a
//! share of seeds each replica's wall clock off by up to 5 s and one
//! replica's clock jumping ([`Clocks`]), and in another share Azure's
//! throughput targets in the store, scaled down ([`Plan::azure_limits`]),
//! in a third an operator's pause and resume of the function
//! ([`Plan::pause`]), in a third a schedule ticking ([`Plan::ticks`]), in
//! a third a group discard, maybe cancelled ([`Plan::discard`]).
//! Every figure is drawn from the seed, bounded so a run stays short.

use super::world::StorageFaults;
use crate::common::Behave;
use aqw_core::handler::Job;
use aqw_core::storage::memory::AzureLimits;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use std::time::Duration;

/// What the provider does during one window of the run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Trouble {
    /// Every call fails (a 503).
    Outage,
    /// Calls for one key in `modulo` fail (a 503 from one shard).
    Partial { modulo: u64 },
    /// Down for `period`, up for `period`, and so on.
    Flapping { period: Duration },
    /// More than `limit` calls a second get a bare 429.
    Throttled { limit: u32 },
    /// More than `limit` calls a second get a 429 with `Retry-After`.
    RetryAfter { limit: u32, after: Duration },
    /// Every call answers 409 "in progress".
    InProgress,
    /// Every call takes `delay`.
    Slow { delay: Duration },
}

/// One provider fault, from `start` for `length` (since the run began).
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub start: Duration,
    pub length: Duration,
    pub trouble: Trouble,
}

impl Window {
    fn covers(&self, at: Duration) -> bool {
        at >= self.start && at < self.start + self.length
    }
}

/// A change to the fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FleetEvent {
    /// A replica more.
    Add,
    /// The oldest replica drains and stops (SIGTERM).
    Stop,
    /// The newest replica dies where it stands (kill -9).
    Kill,
    /// The next job to reach this failpoint crashes there.
    Crash(&'static str),
}

/// Each replica's wall clock in a run whose clocks are skewed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Clocks {
    /// How far replica `i`'s clock is off (ms), for `i` modulo the length.
    pub offsets_ms: Vec<i64>,
    /// Replica `.0`'s clock jumps by `.2` ms at `.1` since the run began.
    pub jump: Option<(usize, Duration, i64)>,
}

/// Most a replica's clock is off (either way).
pub const MAX_SKEW_MS: i64 = 5_000;

/// Most one jump moves a clock (either way).
pub const MAX_JUMP_MS: i64 = 10_000;

impl Clocks {
    /// The clock offset replica `index` starts with.
    pub fn offset_ms(&self, index: usize) -> i64 {
        match self.offsets_ms.len() {
            0 => 0,
            n => self.offsets_ms[index % n],
        }
    }

    /// Half the seeds, drawn apart from the rest of the plan (so a seed's
    /// workload and faults are the same whether or not its clocks are
    /// skewed, and seeds drawn before skew existed keep their schedules).
    fn from_seed(seed: u64, replicas: usize) -> Self {
        let mut r = StdRng::seed_from_u64(seed ^ 0xC10C_5CE4_0000_0001);
        if !r.gen_bool(0.5) {
            return Self::default();
        }
        let offsets_ms = (0..10)
            .map(|_| r.gen_range(-MAX_SKEW_MS..=MAX_SKEW_MS))
            .collect();
        let by = r.gen_range(1_000..=MAX_JUMP_MS) * if r.gen_bool(0.5) { 1 } else { -1 };
        let at = secs(&mut r, 10, FAULT_SPAN.as_secs() - 10);
        Self {
            offsets_ms,
            jump: Some((r.gen_range(0..replicas.max(1)), at, by)),
        }
    }
}

/// The whole run, drawn from one seed.
#[derive(Debug, Clone)]
pub struct Plan {
    pub seed: u64,
    pub replicas: usize,
    /// Jobs that succeed unless a window is in force.
    pub good: usize,
    /// Jobs the provider refuses permanently (a 4xx).
    pub bad: usize,
    /// Jobs whose calls always fail retryably (a key failing alone).
    pub failing: usize,
    /// Good jobs a producer sends twice.
    pub duplicates: usize,
    /// Arrivals spread over this span (zero: one burst).
    pub trickle: Duration,
    pub windows: Vec<Window>,
    pub storage: StorageFaults,
    /// Storage refuses everything from `.0` for `.1`, if drawn.
    pub storage_outage: Option<(Duration, Duration)>,
    pub fleet: Vec<(Duration, FleetEvent)>,
    /// Each replica's wall clock (all true when `offsets_ms` is empty).
    pub clocks: Clocks,
    /// Azure's scalability targets enforced by the store during the
    /// faults (`MemoryStorage::set_azure_limits`), scaled down to the
    /// run's size so they are met: a quarter of the seeds, drawn apart
    /// from the rest of the plan.
    pub azure_limits: Option<AzureLimits>,
    /// An operator pauses the function at `.0` and resumes it `.1` later
    /// (within the faults' span): a third of the seeds, drawn apart.
    pub pause: Option<(Duration, Duration)>,
    /// A schedule ticks every this long for the whole run, its ticks jobs
    /// of a function of their own (`catchUp: all`): a third of the seeds,
    /// drawn apart.
    pub ticks: Option<Duration>,
    /// An operator's group discard of the refused jobs' records at `.0`,
    /// cancelled `.1` later if drawn: a third of the seeds, drawn apart.
    pub discard: Option<(Duration, Option<Duration>)>,
}

/// What an operator and a schedule add to a plan ([`operator_from_seed`]).
type Operator = (
    Option<(Duration, Duration)>,
    Option<Duration>,
    Option<(Duration, Option<Duration>)>,
);

/// Faults are staged in the first `FAULT_SPAN` of a run; the rest settles.
pub const FAULT_SPAN: Duration = Duration::from_secs(6 * 60);

fn secs(r: &mut StdRng, lo: u64, hi: u64) -> Duration {
    Duration::from_secs(r.gen_range(lo..=hi))
}

fn trouble(r: &mut StdRng) -> (Trouble, Duration) {
    match r.gen_range(0..7) {
        0 => (Trouble::Outage, secs(r, 10, 200)),
        1 => (
            Trouble::Partial {
                modulo: r.gen_range(2..=4),
            },
            secs(r, 10, 150),
        ),
        2 => (
            Trouble::Flapping {
                period: secs(r, 2, 30),
            },
            secs(r, 30, 200),
        ),
        3 => (
            Trouble::Throttled {
                limit: r.gen_range(1..=10),
            },
            secs(r, 10, 200),
        ),
        4 => (
            Trouble::RetryAfter {
                limit: r.gen_range(1..=10),
                after: secs(r, 1, 5),
            },
            secs(r, 10, 200),
        ),
        // Shorter than `aqw.inProgressTimeout` (5 min): a 409 that long
        // is rightly poisoned as in_progress.
        5 => (Trouble::InProgress, secs(r, 5, 60)),
        _ => (
            Trouble::Slow {
                delay: Duration::from_millis(r.gen_range(100..=5_000)),
            },
            secs(r, 10, 120),
        ),
    }
}

/// A quarter of the seeds: a queue serving 64 to 256 messages a second, a
/// partition 20 to 100 entities, the account 40 to 150 requests (Azure's
/// 2,000, 2,000 and 20,000, scaled to a run of tens of jobs, a queue's
/// still two receives of 32 at least, as Azure's is 62), with whole-second
/// times.
fn limits_from_seed(seed: u64) -> Option<AzureLimits> {
    let mut r = StdRng::seed_from_u64(seed ^ 0xA211_3175_0000_0002);
    r.gen_bool(0.25).then(|| AzureLimits {
        queue_messages_per_sec: r.gen_range(64..=256),
        partition_entities_per_sec: r.gen_range(20..=100),
        account_requests_per_sec: r.gen_range(40..=150),
        whole_seconds: true,
    })
}

/// The seed's clocks and limits, less what `AQW_SIM_WITHOUT=clocks,limits`
/// drops (triage: which dimension a failure needs).
fn clocks_and_limits(seed: u64, replicas: usize) -> (Clocks, Option<AzureLimits>) {
    let without = std::env::var("AQW_SIM_WITHOUT").unwrap_or_default();
    let limits = limits_from_seed(seed).filter(|_| !without.contains("limits"));
    match without.contains("clocks") {
        true => (Clocks::default(), limits),
        false => (Clocks::from_seed(seed, replicas), limits),
    }
}

/// The seed's operator pause, schedule and group discard, drawn apart from
/// the rest (so seeds drawn before they existed keep their schedules),
/// less what `AQW_SIM_WITHOUT=pause,ticks,discard` drops.
fn operator_from_seed(seed: u64) -> Operator {
    let mut r = StdRng::seed_from_u64(seed ^ 0x9A05_E71C_0000_0003);
    let without = std::env::var("AQW_SIM_WITHOUT").unwrap_or_default();
    let pause = r
        .gen_bool(1.0 / 3.0)
        .then(|| (secs(&mut r, 5, 240), secs(&mut r, 5, 90)));
    let ticks = r
        .gen_bool(1.0 / 3.0)
        .then(|| Duration::from_secs([20, 30, 60][r.gen_range(0..3)]));
    let discard = r.gen_bool(1.0 / 3.0).then(|| {
        let cancel = r.gen_bool(0.5).then(|| secs(&mut r, 1, 20));
        (secs(&mut r, 30, 300), cancel)
    });
    (
        pause.filter(|_| !without.contains("pause")),
        ticks.filter(|_| !without.contains("ticks")),
        discard.filter(|_| !without.contains("discard")),
    )
}

impl Plan {
    pub fn from_seed(seed: u64) -> Self {
        let mut r = StdRng::seed_from_u64(seed);
        let windows = (0..r.gen_range(0..=3))
            .map(|_| {
                let (trouble, length) = trouble(&mut r);
                Window {
                    start: secs(&mut r, 0, 150),
                    length,
                    trouble,
                }
            })
            .collect();
        let storage = StorageFaults {
            refused: if r.gen_bool(0.5) {
                r.gen_range(0.0..0.03)
            } else {
                0.0
            },
            lost: if r.gen_bool(0.5) {
                r.gen_range(0.0..0.01)
            } else {
                0.0
            },
            latency_ms: [0, 5, 50, 300][r.gen_range(0..4)],
        };
        let storage_outage = r
            .gen_bool(0.2)
            .then(|| (secs(&mut r, 0, 240), secs(&mut r, 5, 60)));
        let points = aqw_core::failpoint::POINTS;
        let mut fleet: Vec<(Duration, FleetEvent)> = (0..r.gen_range(0..=5))
            .map(|_| {
                let event = match r.gen_range(0..4) {
                    0 => FleetEvent::Add,
                    1 => FleetEvent::Stop,
                    2 => FleetEvent::Kill,
                    _ => FleetEvent::Crash(points[r.gen_range(0..6)]),
                };
                (secs(&mut r, 0, FAULT_SPAN.as_secs()), event)
            })
            .collect();
        fleet.sort_by_key(|(at, _)| *at);
        let good = r.gen_range(5..=40);
        let replicas = r.gen_range(1..=4);
        let (clocks, azure_limits) = clocks_and_limits(seed, replicas);
        let (pause, ticks, discard) = operator_from_seed(seed);
        Self {
            seed,
            replicas,
            good,
            bad: r.gen_range(0..=3),
            failing: r.gen_range(0..=2),
            duplicates: r.gen_range(0..=good.min(5)),
            trickle: [Duration::ZERO, secs(&mut r, 10, 240)][r.gen_range(0..2)],
            windows,
            storage,
            storage_outage,
            fleet,
            clocks,
            azure_limits,
            pause,
            ticks,
            discard,
        }
    }

    /// What the provider does with a call at `at` since the run began:
    /// a job's own failure first, then the windows in force.
    pub fn behave(&self, job: &Job, at: Duration, calls_this_second: u32) -> Behave {
        let payload: Value = serde_json::from_str(&job.payload).unwrap_or(Value::Null);
        // A schedule's tick: the provider takes it (the ticks check that
        // each runs once through the storage's and the fleet's faults).
        if payload.get("schedule").is_some() {
            return Behave::Succeed;
        }
        match payload["class"].as_str() {
            Some("bad") => return Behave::Fail("HTTP 422 refused (bad job)".into()),
            Some("failing") => return Behave::Retry("HTTP 500 fails alone".into()),
            _ => {}
        }
        let n = payload["n"].as_u64().unwrap_or(0);
        for w in self.windows.iter().filter(|w| w.covers(at)) {
            let answer = match w.trouble {
                Trouble::Outage => Some(Behave::Retry("HTTP 503 provider down".into())),
                Trouble::Partial { modulo } => n
                    .is_multiple_of(modulo)
                    .then(|| Behave::Retry("HTTP 503 shard down".into())),
                Trouble::Flapping { period } => {
                    let phase = (at - w.start).as_millis() / period.as_millis().max(1);
                    phase
                        .is_multiple_of(2)
                        .then(|| Behave::Retry("HTTP 503 flapping".into()))
                }
                Trouble::Throttled { limit } => {
                    (calls_this_second > limit).then_some(Behave::Throttled)
                }
                Trouble::RetryAfter { limit, after } => {
                    (calls_this_second > limit).then_some(Behave::Later(after))
                }
                Trouble::InProgress => Some(Behave::InProgress),
                Trouble::Slow { .. } => None,
            };
            if let Some(a) = answer {
                return a;
            }
        }
        Behave::Succeed
    }

    /// How long a call at `at` takes (the slowest window in force).
    pub fn delay(&self, at: Duration) -> Duration {
        self.windows
            .iter()
            .filter(|w| w.covers(at))
            .filter_map(|w| match w.trouble {
                Trouble::Slow { delay } => Some(delay),
                _ => None,
            })
            .max()
            .unwrap_or_default()
    }
}
