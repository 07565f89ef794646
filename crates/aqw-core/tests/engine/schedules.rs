//! Schedules (issue 42 item 4) on the memory store and simulated time:
//! three workers over ten ticks give ten effects, each once; ticks missed
//! while every worker was down follow the catch-up policy (`latest`: the
//! newest once; `all`: each, oldest first); a claim a crashed replica left
//! is put again, and its tick still runs once.

use crate::common::*;
use aqw_core::builder::WorkerBuilder;
use aqw_core::idempotency::{KeySpec, KeyTemplate};
use aqw_core::schedule::{tick_text, CatchUp, Schedule, When, PARTITION};
use aqw_core::storage::{Entity, Storage};
use std::sync::Arc;
use std::time::Duration;
use time::OffsetDateTime;

const MINUTE: Duration = Duration::from_secs(60);

fn every_minute(name: &str, function: &str, catch_up: CatchUp) -> Schedule {
    Schedule {
        name: name.to_string(),
        function: function.to_string(),
        when: When::every(MINUTE).unwrap(),
        payload: serde_json::Map::new(),
        catch_up,
    }
}

/// A worker whose function is keyed by the tick, running `schedule`.
fn scheduled(env: &Env, schedule: &Schedule) -> WorkerBuilder {
    let schedule = schedule.clone();
    env.builder_on(Arc::new(env.storage.clone()), |f| {
        f.key = KeySpec::Template(KeyTemplate::parse("{/schedule}:{/tick}").unwrap());
    })
    .configure(move |app| app.schedules = vec![schedule])
}

fn tick_key(schedule: &str, t: OffsetDateTime) -> String {
    format!("{schedule}:{}", tick_text(t))
}

/// The ticks of a one-minute schedule in (from, to].
fn minute_ticks(from: OffsetDateTime, to: OffsetDateTime) -> Vec<OffsetDateTime> {
    let when = When::every(MINUTE).unwrap();
    let mut out = vec![];
    let mut at = from;
    while let Some(t) = when.next_after(at).filter(|t| *t <= to) {
        out.push(t);
        at = t;
    }
    out
}

fn now() -> OffsetDateTime {
    aqw_core::clock::now_utc()
}

/// Sleep until 1 s past the next minute tick, so a test's windows hold a
/// known number of ticks whatever time the simulated clock starts at.
async fn align() {
    let next = When::every(MINUTE).unwrap().next_after(now()).unwrap();
    let wait = Duration::try_from(next - now()).unwrap() + Duration::from_secs(1);
    tokio::time::sleep(wait).await;
}

#[tokio::test(start_paused = true)]
async fn three_workers_over_ten_ticks_give_ten_effects() {
    let env = Env::new(|_, _| Behave::Succeed);
    let name = format!("s{}", env.id);
    let s = every_minute(&name, &env.function, CatchUp::Latest);
    align().await;
    let start = now();
    let workers: Vec<Running> = (0..3).map(|_| start_worker(scheduled(&env, &s))).collect();
    let end = start + 10 * MINUTE + Duration::from_secs(30);
    tokio::time::sleep(Duration::try_from(end - now()).unwrap()).await;
    env.drained(MINUTE).await;
    for w in workers {
        w.stop().await;
    }
    let ticks = minute_ticks(start, end);
    assert_eq!(ticks.len(), 10, "ten ticks in the window");
    let keys: Vec<String> = ticks.iter().map(|t| tick_key(&name, *t)).collect();
    env.provider.assert_applied_once(&keys);
    assert_eq!(
        env.provider.calls().len(),
        10,
        "no tick was even offered twice"
    );
}

fn start_worker(b: WorkerBuilder) -> Running {
    start(b.build().expect("valid settings"))
}

/// Run one worker for `ticks` minutes, stop it, let `down` pass, start it
/// again and let it catch up: the keys that ran after the restart.
async fn outage(catch_up: CatchUp, down: u32) -> (Env, String, Vec<OffsetDateTime>) {
    let env = Env::new(|_, _| Behave::Succeed);
    let name = format!("s{}", env.id);
    let s = every_minute(&name, &env.function, catch_up);
    align().await;
    let w = start_worker(scheduled(&env, &s));
    tokio::time::sleep(3 * MINUTE + Duration::from_secs(10)).await;
    env.drained(MINUTE).await;
    w.stop().await;
    let before = env.provider.effects().len();
    assert_eq!(before, 3, "three ticks ran before the outage");
    let stopped = now();
    tokio::time::sleep(down * MINUTE).await;
    let restarted = now();
    let w = start_worker(scheduled(&env, &s));
    // Well before the next on-time tick.
    tokio::time::sleep(Duration::from_secs(15)).await;
    env.drained(MINUTE).await;
    w.stop().await;
    let missed = minute_ticks(stopped, restarted);
    (env, name, missed)
}

#[tokio::test(start_paused = true)]
async fn missed_ticks_run_the_latest_once_by_default() {
    let (env, name, missed) = outage(CatchUp::Latest, 5).await;
    assert_eq!(missed.len(), 5);
    let effects = env.provider.effects();
    assert_eq!(
        effects.len(),
        4,
        "three on time and the newest missed: {effects:?}"
    );
    let latest = tick_key(&name, *missed.last().unwrap());
    assert_eq!(effects.get(&latest), Some(&1));
    assert!(effects.values().all(|n| *n == 1));
}

#[tokio::test(start_paused = true)]
async fn missed_ticks_all_run_once_under_all() {
    let (env, name, missed) = outage(CatchUp::All, 5).await;
    let effects = env.provider.effects();
    assert_eq!(
        effects.len(),
        8,
        "three on time and five missed: {effects:?}"
    );
    for t in &missed {
        assert_eq!(effects.get(&tick_key(&name, *t)), Some(&1), "{t}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_claim_left_by_a_crashed_replica_is_put_again_and_runs_once() {
    let env = Env::new(|_, _| Behave::Succeed);
    let name = format!("s{}", env.id);
    let s = every_minute(&name, &env.function, CatchUp::Latest);
    align().await;
    // The row a replica left when it died between its claim and its put.
    let tick = When::every(MINUTE).unwrap().latest_at(now()).unwrap();
    let control = env.storage.table(&env.control_table);
    control.create_if_missing().await.unwrap();
    let mut row = Entity::new();
    row.insert("last".into(), tick_text(tick).into());
    row.insert("pending".into(), tick_text(tick).into());
    row.insert("claimedAt".into(), tick_text(now()).into());
    row.insert("claimedBy".into(), "crashed".into());
    control.insert(PARTITION, &name, &row).await.unwrap();

    let w = start_worker(scheduled(&env, &s));
    tokio::time::sleep(Duration::from_secs(45)).await;
    env.drained(MINUTE).await;
    w.stop().await;
    let key = tick_key(&name, tick);
    let effects = env.provider.effects();
    assert_eq!(effects.get(&key), Some(&1), "the claimed tick ran once");
    assert_eq!(effects.len(), 1, "before the next tick: {effects:?}");
    let (row, _) = control.get(PARTITION, &name).await.unwrap().unwrap();
    assert_eq!(row["pending"], "", "the claim was cleared");
}

/// The fleet: 50 replicas over 30 ticks of a one-minute schedule. Each tick
/// runs once, and what the schedule adds to the fleet's storage requests is
/// measured against the same fleet with no schedule: about one read per
/// replica per tick, plus the winner's claim, put and the job itself.
#[tokio::test(start_paused = true)]
async fn fifty_replicas_run_each_tick_once_at_one_read_per_replica_per_tick() {
    const REPLICAS: usize = 50;
    const TICKS: u32 = 30;
    async fn fleet(schedule: Option<&Schedule>, env: &Env) -> u64 {
        align().await;
        let before = env.storage.total_requests();
        let workers: Vec<Running> = (0..REPLICAS)
            .map(|_| match schedule {
                Some(s) => start_worker(scheduled(env, s)),
                None => start_worker(env.builder_on(Arc::new(env.storage.clone()), |f| {
                    f.key = KeySpec::Template(KeyTemplate::parse("{/schedule}:{/tick}").unwrap());
                })),
            })
            .collect();
        tokio::time::sleep(TICKS * MINUTE - Duration::from_secs(30)).await;
        env.drained(MINUTE).await;
        let used = env.storage.total_requests() - before;
        for w in workers {
            w.stop().await;
        }
        used
    }
    let idle = Env::new(|_, _| Behave::Succeed);
    let without = fleet(None, &idle).await;
    let env = Env::new(|_, _| Behave::Succeed);
    let name = format!("s{}", env.id);
    let s = every_minute(&name, &env.function, CatchUp::Latest);
    let with = fleet(Some(&s), &env).await;
    let effects = env.provider.effects();
    assert_eq!(
        effects.len(),
        TICKS as usize - 1,
        "each tick in the window ran: {effects:?}"
    );
    assert!(effects.values().all(|n| *n == 1), "once each");
    let per_tick = with.saturating_sub(without) as f64 / f64::from(TICKS - 1);
    println!(
        "{REPLICAS} replicas, {} ticks: {with} requests with the schedule, {without} without: {per_tick:.1} more per tick",
        TICKS - 1
    );
    assert!(
        per_tick <= 2.0 * REPLICAS as f64 + 20.0,
        "a tick costs about one read per replica: {per_tick:.1}"
    );
}
