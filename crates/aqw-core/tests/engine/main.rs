//! The engine's tests, in-process on the memory store (`MemoryStorage`) under
//! a paused tokio clock: the scenarios the Azurite suite of crate `aqw`
//! (`tests/reliability.rs`, `recovery.rs`, `outage.rs`, `failpoints.rs`,
//! `retention.rs`, `worker.rs`) runs against the emulator, asserted on the
//! store's final state: the key table, the poison records, `<queue>` and
//! `<queue>-poison`, and the effects a provider that deduplicates by
//! provider key applied.
//!
//! Every test is `#[tokio::test(start_paused = true)]`: a current-thread
//! runtime, so every task of a test runs on the test's thread (which the
//! thread-local `failpoint::arm` relies on), and simulated time, so minutes
//! of retries and days of retention pass in milliseconds. Nothing waits on a
//! real sleep: conditions are polled every 100 ms of tokio time until a
//! simulated deadline ([`common::Env::wait_until`]).
//!
//! - `verification.rs`: the article's four tests (duplicate, race, exhaust,
//!   recover) and fail-fail-succeed;
//! - `crashes.rs`: a crash at every failpoint of the job, poison and replay
//!   paths, kept running or restarted;
//! - `replay.rs`: a replayed poisoned key runs once;
//! - `claim_check.rs`: a large job through a blob: runs once on its exact
//!   body, a missing or corrupt blob poisons with its own kind, show,
//!   replay and fix;
//! - `claim_check_refs.rs`: a reference is input: one naming another
//!   queue's blob, `../` or too many bytes is invalid with no blob request
//!   (run, show, replay, preview); a blob larger than its reference is
//!   corrupt by its size; a body over maxBytes is refused at the enqueue;
//! - `retention.rs`: the purge and the sweep keep what an open record needs;
//! - `operations.rs`: durable group operations: killed mid-run and resumed
//!   (each record once), cancelled from another handle, halted by the
//!   breaker or by replayed jobs coming back poisoned;
//! - `later.rs`: a bare 429 and a 409 "in progress" waited out without
//!   spending attempts; the adaptive rate converging under a provider's limit;
//! - `outage.rs`: the breaker in a full and a partial provider outage, and a
//!   storage outage;
//! - `sim/`: the seeded swarm: a seed draws the workload, the provider's
//!   and the storage's faults and the fleet's events; the run replays bit
//!   for bit and one checker judges it (docs/design.md);
//! - `fleet_cost.rs` (ignored, a report): what 100 replicas of 50
//!   functions cost the account against Azure's scalability targets, idle
//!   and under offered load in steps, and the first limit met;
//! - `spread.rs`: the breaker on the fleet's evidence: an outage over 1, 2,
//!   12, 16 and 50 replicas, and a trickle through one, poisons nothing; a
//!   few keys failing alone still reach poison.

mod answers;
mod claim_check;
mod claim_check_refs;
mod common;
mod crashes;
mod fleet;
mod fleet_cost;
mod flow;
mod later;
mod operations;
mod outage;
mod producer;
mod replay;
mod retention;
mod schedules;
mod sim;
mod spread;
mod verification;
