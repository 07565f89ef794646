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
//!   key done), and no tick more than once;
//! - a group discard of the refused jobs' records ([`start_discard`],
//!   cancelled in a share of seeds) ends, closes each record it takes
//!   once, and, done, leaves none of its own open ([`check_discard`]).

use crate::common::Env;
use aqw_core::config::{FunctionConfig, KeySpec};
use aqw_core::control::ControlStore;
use aqw_core::idempotency::KeyTemplate;
use aqw_core::ops::operation::{NewOperation, OpKind, OpState, OperationStore, Selection};
use aqw_core::poison::RecordStatus;
use aqw_core::schedule::{tick_text, CatchUp, Schedule, When, PARTITION};
use aqw_core::storage::Storage;
use std::collections::BTreeMap;
use std::time::Duration;
use time::format_description::well_known::Rfc3339;

/// What the operator's tasks reach: the store (unwrapped: no replica's
/// faults) and the run's names. Its requests run on tasks of their own, so
/// the faults' timeline goes on while a request is refused.
#[derive(Clone)]
pub struct Operator {
    pub storage: aqw_core::storage::memory::MemoryStorage,
    pub control_table: String,
    pub function: String,
    pub queue: String,
    pub world: super::world::World,
}

impl Operator {
    pub fn new(env: &Env, world: &super::world::World) -> Self {
        Self {
            storage: env.storage.clone(),
            control_table: env.control_table.clone(),
            function: env.function.clone(),
            queue: env.queue.clone(),
            world: world.clone(),
        }
    }

    fn control(&self) -> ControlStore {
        ControlStore::new(self.storage.table(&self.control_table))
    }

    fn operations(&self) -> OperationStore {
        OperationStore::new(self.storage.table(&self.control_table))
    }

    /// Pause the function `after` from now, and resume it `len` later.
    pub fn spawn_pause(&self, after: Duration, len: Duration) {
        let op = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let paused = tokio::time::Instant::now();
            op.set_pause(true).await;
            tokio::time::sleep_until(paused + len).await;
            op.set_pause(false).await;
        });
    }

    /// Start the group discard `after` from now, and cancel it `cancel`
    /// later if drawn; the operation's id, once created.
    pub fn spawn_discard(
        &self,
        after: Duration,
        cancel: Option<Duration>,
    ) -> std::sync::Arc<std::sync::Mutex<Option<String>>> {
        let (op, id) = (
            self.clone(),
            std::sync::Arc::new(std::sync::Mutex::new(None)),
        );
        let created = id.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let started = tokio::time::Instant::now();
            let Some(new) = op.start_discard().await else {
                return;
            };
            *created.lock().unwrap() = Some(new.clone());
            if let Some(c) = cancel {
                tokio::time::sleep_until(started + c).await;
                op.cancel(&new).await;
            }
        });
        id
    }
}

/// The log's event for an operator's pause or resume, once applied.
pub const PAUSE_ON: &str = "operator pause on";
pub const PAUSE_OFF: &str = "operator pause off";

/// Pause (`on`) or resume the run's function as `aqw pause` / `aqw resume`
/// do, trying again a refused write until it applies (Azure's limits may
/// refuse many: seed 398's resume met the account's target 50 times in a
/// row), and log it once applied. Gives up after 10 simulated minutes.
impl Operator {
    async fn set_pause(&self, on: bool) {
        let (control, world) = (self.control(), &self.world);
        for _ in 0..3_000 {
            let done = match on {
                true => control.pause(&self.function, "sim", "staged pause").await,
                false => control.resume(&self.function, "sim").await,
            };
            if done.is_ok() {
                world.note(if on { PAUSE_ON } else { PAUSE_OFF }.into());
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        world.note(format!("operator pause {on}: refused for 10 minutes"));
    }
}

/// Whether `line` is replica `r`'s answered read of its functions' control
/// rows (the watch's query of their partition, or the start's read of the
/// function's row), not another read of the table (the operations' watch,
/// a schedule: seed 2738).
fn control_read(line: &str, r: &str, control_table: &str, function: &str) -> bool {
    let p = CONTROL_PARTITION;
    line.ends_with(&format!(" {r} table.query {p} {control_table} -> ok"))
        || line.ends_with(&format!(
            " {r} table.get {p}/{function} {control_table} -> ok"
        ))
}

/// The partition of the functions' control rows.
const CONTROL_PARTITION: &str = "function";

/// The pause check over the log (see the module's doc). A receive's line
/// names the log's length when it was sent (`sent#N`): a receive sent
/// after the replica's read that showed the pause, and before its read
/// that showed the resume, broke the pause.
pub fn check_pause(
    log: &[String],
    control_table: &str,
    function: &str,
    queue: &str,
) -> Vec<String> {
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
        if control_read(line, r, control_table, function) {
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

impl Operator {
    /// The operator's group discard of the refused jobs' records: created at
    /// a seed's chosen time (any replica's operations watch carries it out, a
    /// killed executor's lease taken over after it expires), and in a share
    /// cancelled a few seconds later.
    async fn start_discard(&self) -> Option<String> {
        let (store, world) = (self.operations(), &self.world);
        let new = NewOperation {
            queue: self.queue.clone(),
            kind: OpKind::Discard {
                reason: "refused for good (sim)".into(),
                close_key: false,
            },
            by: "sim".into(),
            selection: Selection {
                error: Some("refused".into()),
                ..Selection::default()
            },
            fingerprint: "sim".into(),
            selected: 0,
            rate: 2.0,
            halt_after: 3,
        };
        for _ in 0..3_000 {
            if let Ok(op) = store.create(&new).await {
                world.note(format!(
                    "operation {} created (cutoff {})",
                    op.id, op.selection.cutoff
                ));
                return Some(op.id);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        world.note("operation refused for 10 minutes".into());
        None
    }

    /// Cancel operation `id` as `aqw operation cancel` does.
    async fn cancel(&self, id: &str) {
        let (store, world) = (self.operations(), &self.world);
        for _ in 0..3_000 {
            if let Ok(r) = store.cancel(id, "sim").await {
                let state = r
                    .map(|op| op.state.as_str().to_string())
                    .unwrap_or_else(|e| e.to_string());
                world.note(format!("operation {id} cancel: {state}"));
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Whether operation `id` has ended (done, cancelled, halted, failed).
pub async fn ended(env: &Env, id: &str) -> bool {
    let store = OperationStore::new(env.storage.table(&env.control_table));
    matches!(store.get(id).await, Ok(Some((op, _))) if op.state.is_final())
}

/// How far apart two replicas' clocks (and the operator's) may be: a
/// record poisoned this close to the operation's cutoff may fall either side.
const CLOCKS_APART: Duration =
    Duration::from_millis((2 * super::plan::MAX_SKEW_MS + super::plan::MAX_JUMP_MS) as u64 + 2_000);

/// The operation ended, not failed; each record it closed is discarded and
/// counted once at most (its `done` never more than the records naming
/// it); done, it closed every refused record poisoned well before its
/// cutoff but those it counted failed, and none poisoned well after.
pub async fn check_discard(env: &Env, id: &str) -> Vec<String> {
    let store = OperationStore::new(env.storage.table(&env.control_table));
    let Ok(Some((op, _))) = store.get(id).await else {
        return vec![format!("operation {id}: its row is gone")];
    };
    let mut out = vec![];
    if !op.state.is_final() || op.state == OpState::Failed {
        out.push(format!(
            "operation {id} ended {}: {:?}",
            op.state.as_str(),
            op.stop_reason
        ));
    }
    let time = |t: &str| time::OffsetDateTime::parse(t, &Rfc3339).ok();
    let cutoff = time(&op.selection.cutoff);
    let records = env.records().await;
    let named: Vec<_> = records
        .iter()
        .filter(|r| r.discarded_by.as_deref().is_some_and(|b| b.contains(id)))
        .collect();
    for r in &named {
        if r.status != RecordStatus::Discarded {
            out.push(format!(
                "record {} names operation {id} but is {:?}",
                r.message_id, r.status
            ));
        }
    }
    // The counts may fall short (a checkpoint refused ends that run; the
    // records are the truth: seed 833), never over.
    let n = named.len() as u64;
    if op.done > n {
        out.push(format!(
            "operation {id}: {} records counted done, {n} closed by it",
            op.done
        ));
    }
    let mut left_open = 0;
    for r in records
        .iter()
        .filter(|r| r.error.message.contains("refused"))
    {
        let (Some(at), Some(cutoff)) = (time(&r.poisoned_at), cutoff) else {
            continue;
        };
        let by_op = named.iter().any(|n| n.message_id == r.message_id);
        if at > cutoff + CLOCKS_APART && by_op {
            out.push(format!(
                "record {} poisoned after operation {id}'s cutoff, closed by it",
                r.message_id
            ));
        }
        if op.state == OpState::Done && at + CLOCKS_APART < cutoff && r.status == RecordStatus::Open
        {
            left_open += 1;
        }
    }
    // A record whose close the store refused is counted failed, for the
    // operator to run again (seed 1313: a 500 on one record's write).
    if left_open > op.failed {
        out.push(format!(
            "operation {id} is done and left {left_open} of its records open, {} counted failed",
            op.failed
        ));
    }
    out
}

/// The checks themselves, on logs written by hand: each can fail.
#[test]
fn the_pause_check_flags_a_receive_sent_after_the_pause_was_seen() {
    let log: Vec<String> = [
        "100 r0 table.query function ctl -> ok",
        "200 operator pause on",
        "300 r1 received q m1#1 sent#2",
        "400 r0 table.query function ctl -> ok",
        "500 r1 table.query function ctl -> ok",
        "600 r0 received q m2#1 sent#3",
        "700 r1 received q m3#1 sent#5",
        "800 operator pause off",
        "900 r0 table.query function ctl -> ok",
        "950 r0 received q m4#1 sent#9",
        "990 r1 received q m5#1 sent#7",
    ]
    .map(String::from)
    .to_vec();
    let found = check_pause(&log, "ctl", "F", "q");
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
