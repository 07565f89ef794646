//! What an operator and a schedule add to a seeded run: the function
//! paused and resumed through its control row ([`set_pause`]), and a
//! schedule ticking into a function of its own ([`Ticks`]), each with its
//! check over the event log:
//!
//! - no replica receives a message for the paused function from its first
//!   read of the control row that shows the pause until its first read
//!   after the resume (calls of messages it held before go on); that
//!   everything still completes after the resume is the run's own check;
//! - each tick due while a replica ran has its effect exactly once (its
//!   key done), and no tick more than once.

use crate::common::Env;
use aqw_core::config::{FunctionConfig, KeySpec};
use aqw_core::control::ControlStore;
use aqw_core::idempotency::KeyTemplate;
use aqw_core::schedule::{tick_text, CatchUp, Schedule, When, PARTITION};
use aqw_core::storage::Storage;
use std::collections::BTreeMap;
use std::time::Duration;

/// The log's event for an operator's pause or resume, once applied.
pub const PAUSE_ON: &str = "operator pause on";
pub const PAUSE_OFF: &str = "operator pause off";

/// Pause (`on`) or resume the run's function as `aqw pause` / `aqw resume`
/// do, trying again a refused write (Azure's limits may refuse it), and
/// log it once applied.
pub async fn set_pause(env: &Env, world: &super::world::World, on: bool) {
    let control = ControlStore::new(env.storage.table(&env.control_table));
    for _ in 0..50 {
        let done = match on {
            true => control.pause(&env.function, "sim", "staged pause").await,
            false => control.resume(&env.function, "sim").await,
        };
        if done.is_ok() {
            world.note(if on { PAUSE_ON } else { PAUSE_OFF }.into());
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    world.note(format!("operator pause {on} refused 50 times"));
}

/// Whether `line` is replica `r`'s answered read of the control rows.
fn control_read(line: &str, r: &str, control_table: &str) -> bool {
    line.contains(&format!(" {r} table.query {control_table} -> ok"))
        || line.contains(&format!(" {r} table.get "))
            && line.contains(&format!(" {control_table} -> ok"))
}

/// The pause check over the log (see the module's doc). A receive's line
/// names the log's length when it was sent (`sent#N`): a receive sent
/// after the replica's read that showed the pause, and before its read
/// that showed the resume, broke the pause.
pub fn check_pause(log: &[String], control_table: &str, queue: &str) -> Vec<String> {
    let at = |what: &str| log.iter().position(|l| l.ends_with(what));
    let (Some(on), off) = (at(PAUSE_ON), at(PAUSE_OFF)) else {
        return vec![];
    };
    let off = off.unwrap_or(log.len());
    let mut seen: BTreeMap<String, (Option<usize>, Option<usize>)> = BTreeMap::new();
    let mut out = vec![];
    for (i, line) in log.iter().enumerate() {
        let Some(r) = line
            .split_whitespace()
            .nth(1)
            .filter(|r| r.starts_with('r'))
        else {
            continue;
        };
        let e = seen.entry(r.to_string()).or_default();
        if control_read(line, r, control_table) {
            if i > on && e.0.is_none() {
                e.0 = Some(i);
            }
            if i > off && e.1.is_none() {
                e.1 = Some(i);
            }
            continue;
        }
        let Some(sent) = received_from(line, r, queue) else {
            continue;
        };
        let (Some(from), to) = *e else { continue };
        // `sent` lines were logged when it was sent: it came after line
        // `sent - 1`, the read that showed the pause being `from`.
        if sent > from && to.is_none_or(|to| sent <= to) {
            out.push(format!(
                "{r} received a message of the paused function (event {i}, sent after event \
                 {}; its read showing the pause was event {from})",
                sent - 1
            ));
        }
    }
    out
}

/// `Some(N)` when `line` is replica `r`'s receive of messages of `queue`
/// that was sent when the log held `N` lines.
fn received_from(line: &str, r: &str, queue: &str) -> Option<usize> {
    let rest = line.split_once(&format!(" {r} received {queue} "))?.1;
    rest.rsplit_once("sent#")?.1.trim().parse().ok()
}

/// The schedule of a run whose plan ticks, and its function.
#[derive(Clone)]
pub struct Ticks {
    pub schedule: Schedule,
    pub function: String,
    pub queue: String,
}

impl Ticks {
    pub fn new(env: &Env, every: Duration) -> Self {
        let function = format!("Tick{}", env.id);
        Self {
            schedule: Schedule {
                name: format!("s{}", env.id),
                function: function.clone(),
                when: When::every(every).expect("a valid interval"),
                payload: serde_json::Map::new(),
                // Every tick once, however long the fleet could not put it.
                catch_up: CatchUp::All,
            },
            function,
            queue: format!("t{}", env.id),
        }
    }

    /// The ticks' function: keyed by schedule and tick.
    pub fn function_config(&self) -> FunctionConfig {
        let mut f = FunctionConfig::new(&self.function, &self.queue);
        let key = KeyTemplate::parse("{/schedule}:{/tick}").expect("a valid template");
        f.key = KeySpec::Template(key);
        f
    }

    /// The key of each tick that must run: those after the schedule's row
    /// was first written (a schedule starts at its first write; a replica's
    /// clock may be ahead by a skew and a jump), up to the faults' end.
    pub fn due(&self, log: &[String], wall: time::OffsetDateTime) -> Vec<String> {
        let insert = format!("table.insert {PARTITION}/{} ", self.schedule.name);
        let started = log.iter().find(|l| {
            l.contains(&insert)
                && (l.ends_with("-> ok") || l.contains("already exists") || l.contains("lost"))
        });
        let Some(ms) = started.and_then(|l| l.split_whitespace().next()?.parse::<u64>().ok())
        else {
            return vec![];
        };
        let margin =
            Duration::from_millis((super::plan::MAX_SKEW_MS + super::plan::MAX_JUMP_MS) as u64);
        let mut at = wall + Duration::from_millis(ms) + margin;
        let end = wall + super::plan::FAULT_SPAN;
        let mut out = vec![];
        while let Some(t) = self.schedule.when.next_after(at).filter(|t| *t <= end) {
            out.push(self.key(t));
            at = t;
        }
        out
    }

    pub fn key(&self, tick: time::OffsetDateTime) -> String {
        format!("{}:{}", self.schedule.name, tick_text(tick))
    }

    /// Whether `key` is one of this schedule's ticks.
    pub fn owns(&self, key: &str) -> bool {
        key.starts_with(&format!("{}:", self.schedule.name))
    }

    /// Each due tick ran once (done, one effect); no tick ran twice.
    pub fn check(
        &self,
        due: &[String],
        effects: &BTreeMap<String, usize>,
        keys: &BTreeMap<String, String>,
    ) -> Vec<String> {
        let mut out = vec![];
        for key in due {
            let applied = effects.get(key).copied().unwrap_or(0);
            let status = keys.get(key).map(String::as_str).unwrap_or("none");
            if applied != 1 || status != "done" {
                out.push(format!(
                    "tick {key}: ran {applied} times (key {status}), not once"
                ));
            }
        }
        for (key, n) in effects.iter().filter(|(k, _)| self.owns(k)) {
            if *n > 1 {
                out.push(format!("tick {key}: its effect applied {n} times"));
            }
        }
        out
    }
}

/// The checks themselves, on logs written by hand: each can fail.
#[test]
fn the_pause_check_flags_a_receive_sent_after_the_pause_was_seen() {
    let log: Vec<String> = [
        "100 r0 table.query ctl -> ok",
        "200 operator pause on",
        "300 r1 received q m1#1 sent#2",
        "400 r0 table.query ctl -> ok",
        "500 r1 table.query ctl -> ok",
        "600 r0 received q m2#1 sent#3",
        "700 r1 received q m3#1 sent#5",
        "800 operator pause off",
        "900 r0 table.query ctl -> ok",
        "950 r0 received q m4#1 sent#9",
        "990 r1 received q m5#1 sent#7",
    ]
    .map(String::from)
    .to_vec();
    let found = check_pause(&log, "ctl", "q");
    // r1's first receive came before it read the pause, r0's m2 was sent
    // before its read showed the pause was applied (event 3 itself), r0's
    // m4 after its read showed the resume; r1's m3 and m5 broke it.
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].contains("r1") && found[0].contains("event 6"));
    assert!(found[1].contains("r1") && found[1].contains("event 10"));
}

#[test]
fn the_tick_check_flags_a_tick_missed_or_run_twice() {
    let env = Env::new(|_, _| crate::common::Behave::Succeed);
    let t = Ticks::new(&env, Duration::from_secs(30));
    let wall = time::macros::datetime!(2026-03-02 08:00:00.250 UTC);
    let log = vec![format!(
        "1000 r0 table.insert {PARTITION}/{} ctl -> ok",
        t.schedule.name
    )];
    let due = t.due(&log, wall);
    // Ticks from 08:00:30 (after 1 s + 15 s of clock margin) to 08:06:00.
    assert_eq!(due.len(), 12, "{due:?}");
    let mut effects: BTreeMap<String, usize> = due.iter().map(|k| (k.clone(), 1)).collect();
    let mut keys: BTreeMap<String, String> =
        due.iter().map(|k| (k.clone(), "done".into())).collect();
    assert!(t.check(&due, &effects, &keys).is_empty());
    effects.insert(due[3].clone(), 2);
    keys.remove(&due[5]);
    effects.insert(t.key(wall + Duration::from_secs(600)), 2);
    let found = t.check(&due, &effects, &keys);
    assert_eq!(found.len(), 4, "{found:?}");
}
