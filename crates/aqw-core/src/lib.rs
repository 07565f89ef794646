//! # aqw-core — the aqw engine over a storage port
//!
//! The engine of aqw, the Azure Queue Storage worker
//! that makes background jobs safe to retry: each message's DequeueCount
//! against `maxDequeueCount`, an idempotency key claimed before the work
//! runs (pending → done) with one provider `Idempotency-Key` for every
//! attempt and replay, and a job that still fails at the cap, or fails
//! permanently, copied to `<queue>-poison` with its exact payload and last
//! error, then deleted. Operators replay it with its original key.
//!
//! It depends on no Azure, HTTP-server, exporter or TLS crate: storage is a
//! port ([`storage::QueueStore`], [`storage::TableStore`]) that the `aqw-azure`
//! crate implements on Azure and [`storage::memory::MemoryStorage`]
//! implements in memory, on tokio time.
//!
//! ## Embedding
//!
//! A handler in your own binary, on the memory store (swap in the Azure
//! adapter, `aqw_azure::open`, for production):
//!
//! ```
//! use aqw_core::builder::{handler_fn, WorkerBuilder};
//! use aqw_core::handler::{HandlerError, Success};
//! use aqw_core::idempotency::{KeySpec, KeyTemplate};
//! use aqw_core::storage::{memory::MemoryStorage, Storage, Ttl};
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//! use std::time::Duration;
//! use tokio_util::sync::CancellationToken;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let storage = MemoryStorage::new();
//! let credits = Arc::new(AtomicUsize::new(0));
//! let applied = credits.clone();
//! let worker = WorkerBuilder::new(Arc::new(storage.clone()))
//!     .max_dequeue_count(5)
//!     .function("ApplyCredit", "credits", handler_fn(move |job| {
//!         let applied = applied.clone();
//!         async move {
//!             // Send job.provider_key as the provider's Idempotency-Key:
//!             // the same on every attempt and replay of this key.
//!             assert!(job.provider_key.is_some());
//!             if job.payload.contains("closed") {
//!                 return Err(HandlerError::permanent("account is closed"));
//!             }
//!             applied.fetch_add(1, Ordering::SeqCst);
//!             Ok(Success::default())
//!         }
//!     }))
//!     .key(KeySpec::Template(KeyTemplate::parse("credit:{/account}:{/period}").unwrap()))
//!     .build()
//!     .unwrap();
//!
//! // The same business fact twice, as a producer's retry would send it.
//! let queue = storage.queue("credits");
//! queue.create_if_missing().await.unwrap();
//! let job = r#"{"account":"a-1","period":"2026-12"}"#;
//! let text = aqw_core::message::encode(job, aqw_core::message::MessageEncoding::Base64);
//! for _ in 0..2 {
//!     queue.put(&text, Duration::ZERO, Ttl::Default).await.unwrap();
//! }
//!
//! let shutdown = CancellationToken::new();
//! let running = tokio::spawn(worker.run(shutdown.clone()));
//! while queue.approximate_count().await.unwrap() > 0 {
//!     tokio::time::sleep(Duration::from_millis(100)).await;
//! }
//! shutdown.cancel();
//! running.await.unwrap();
//! assert_eq!(credits.load(Ordering::SeqCst), 1, "the credit is applied once");
//! # }
//! ```
//!
//! ## The public surface
//!
//! What is public is listed in `crates/aqw-core/public-api.txt`, checked in
//! CI (`scripts/public_api.py`); what only the engine uses is `pub(crate)`.
//! Three tiers:
//!
//! - **For embedders**, what the example above and `examples/` build on:
//!   [`builder`] (`WorkerBuilder`, `Worker`, `handler_fn`), [`handler`]
//!   (`Handler`, `Job`, `Success`, `HandlerError`), the storage port
//!   [`storage`] and the memory store [`storage::memory::MemoryStorage`],
//!   [`message`] (encoding, error kinds), [`idempotency`]'s key types
//!   (`KeySpec`, `KeyTemplate`, `IdempotencyKey`, `derive_key`), [`producer`]
//!   (with `ops::Delivery`), and [`config`]'s value types (`AppConfig`,
//!   `FunctionConfig`, `StorageAccount`, `RetryStrategy`).
//! - **For aqw's own binary, CLI and dashboard**, public so that they can be
//!   built on the engine, with no stability promise beyond the snapshot:
//!   [`ops`] (with `operation` and `triage`), [`poison`], the key store and
//!   records of [`idempotency`], [`control`], [`gate`], [`heartbeat`],
//!   [`alert`], [`breaker`] and [`flow`] settings, [`decide`]'s defaults,
//!   [`claim`], [`redact`], [`retention`], [`schedule`], [`scrub`],
//!   [`traces`], [`job`], [`runtime`], [`worker`], [`retry`].
//! - **Test seams**, for tests and simulations only: `contract` (the storage
//!   contract suite, feature `contract`), [`failpoint`] (crash points, live
//!   with feature `failpoints`), [`clock`] and [`entropy`] (a simulated
//!   clock, seeded randomness), and the memory store's fault switches
//!   (`set_unavailable`, `set_latency`, `set_azure_limits`,
//!   `set_stale_receipt`, the request counts).
//!
//! ## Layout
//!
//! | rule | file |
//! |---|---|
//! | the fate of a message as a pure function of its facts, in two typed stages (`next_step` → `NextStep`: claim, run, or settle `WithoutRunning`; `fate` → `Fate` after the attempt; `Policy` from config); the message-life tables as unit tests | `crates/aqw-core/src/decide.rs` |
//! | the pipeline for one message, for `aqw run` and `aqw serve`: `process` gathers the facts and carries out each stage (`Settle`, the single poison exit), runs the handler (lease renewal, `functionTimeout`, hard stop), one outcome line and counters (`Outcome`) | `crates/aqw-core/src/job/` (`mod.rs` `process`, `settle.rs`, `handler.rs`, `outcome.rs`, `later.rs` a throttle and an "in progress" waited out without spending an attempt, the adaptive rate told) |
//! | the circuit breaker of one function as a pure state machine (closed → open → half-open), its settings and defaults; what counts toward it, own and fleet-wide, and the volume and quiet rules (`evidence.rs`) | `crates/aqw-core/src/breaker/` (`mod.rs`, `evidence.rs`, `tests.rs` the state machine row by row) |
//! | the control row of each function in `aqwcontrol`: pause / resume by an operator, the breaker state a worker publishes; `ControlStore` | `crates/aqw-core/src/control.rs` |
//! | what the poll loop asks before receiving: the pause and the breaker, watched and published per function (`Gate`) | `crates/aqw-core/src/gate.rs` |
//! | flow control across the fleet: a function's calls per second (a GCRA row) and calls in flight (a lease-based semaphore row), and calls in flight per key value, in the control table's `limits` partition | `crates/aqw-core/src/flow/` (`mod.rs` `Flow`, `rate.rs` the GCRA row, `slots.rs` the semaphore row, `rows.rs` read-modify-write under the ETag, `adaptive.rs` the call rate learned from the provider's throttling: the AWS SDKs' CUBIC client rate limiter, per replica, its tests in `adaptive_tests.rs`) |
//! | retry delay (exponential + jitter, or fixed) and the Functions polling back-off, as pure values | `crates/aqw-core/src/retry.rs` |
//! | idempotency: the key table's layout (RowKey = SHA-256 of the key) and the module's exports | `crates/aqw-core/src/idempotency/mod.rs` |
//! | the key from business facts (template / `idempotencyKey` / `none`), `IdempotencyKey` | `crates/aqw-core/src/idempotency/key.rs` |
//! | key first: claim by insert or `If-Match` take-over, pending → done | `crates/aqw-core/src/idempotency/store.rs` |
//! | the key record's columns and status, its attempt history | `crates/aqw-core/src/idempotency/record.rs` |
//! | the operator's key commands: list a function's keys (server-side filter), a new provider key for a replayed failure, close a key, count a replay (a new run of attempts) | `crates/aqw-core/src/idempotency/operator.rs` |
//! | what retention may read of the key table: a function's partitions, settled keys older than a cutoff (server-side filter) | `crates/aqw-core/src/idempotency/purge.rs` |
//! | message encoding (base64/none), the 64 KiB limit, the kind and text of the error that poisons a message | `crates/aqw-core/src/message.rs` |
//! | the poison path's write order, stated once, and the module's exports | `crates/aqw-core/src/poison/mod.rs` |
//! | the poison envelope, `<queue>-poison` naming, the record id of a host copy | `crates/aqw-core/src/poison/envelope.rs` |
//! | a poison record's table columns, and every update that closes one | `crates/aqw-core/src/poison/record.rs` |
//! | `PoisonStore`: every read and write of poison records (list, find, a key's open records, close as replayed / replaced / discarded, the replay crash marker) and the crash-safe write order (record → copy → copy named) | `crates/aqw-core/src/poison/store.rs` |
//! | the `<queue>-poison` copies: the scan that imports host copies and deletes strays, release, delete | `crates/aqw-core/src/poison/copies.rs` |
//! | the worker's one poison call (record built, written through the store, alert raised) | `crates/aqw-core/src/poison/sink.rs` |
//! | what retention may read of the record table: the keys open records refer to, closed records older than a cutoff | `crates/aqw-core/src/poison/purge.rs` |
//! | redaction: the `redact` pointers masked wherever a person sees a payload (`poison show`, the dashboard), restored in a fix; the stored payload stays exact | `crates/aqw-core/src/redact.rs` |
//! | retention: the purge's guards (filter, open records, `If-Match` batches of 100), counts, the request pacer | `crates/aqw-core/src/retention/mod.rs` |
//! | retention of claim-check blobs: older than the keys' retention, no open record referring to it, `If-Match` delete | `crates/aqw-core/src/retention/blobs.rs` |
//! | the background sweep of `aqw run`: one sweeper per account by a lease row, bounded rate | `crates/aqw-core/src/retention/sweep.rs` |
//! | the operator's commands, one file each, returning data, as procedures over `KeyStore`, `PoisonStore` and `ControlStore`: list, show, replay, fix, discard, report (an incident as one table), status, enqueue, keys, pause / resume, purge; the provider's key window that replay and fix check | `crates/aqw-core/src/ops/` (`mod.rs`, `control.rs`, `list.rs`, `show.rs`, `replay.rs`, `replay_report.rs` (what replay did, record by record), `fix.rs`, `discard.rs`, `rehearse.rs` (the dry runs of fix and discard), `report.rs`, `status.rs`, `enqueue.rs`, `keys.rs`, `purge.rs`, `window.rs`, `provider.rs` what aqw knows of a provider: declared idempotent, known to save failures (declared or a `replayed_failure` record)) |
//! | `aqw triage` as a pure function: open records grouped by cause and decision, most urgent first, each with its facts, meaning and next commands (`plan` → `TriagePlan`; `lookups_wanted`); the CLI renders it, the dashboard's front page reuses it | `crates/aqw-core/src/ops/triage/` (`mod.rs` the types and `plan`, `classify.rs` one record's cause and decision, `steps.rs` groups and their commands, `tests.rs`) |
//! | durable group operations (issue 40): replay, discard, or fix by one JSON Patch; the operation row in the control table (who, selection, fingerprint, cutoff, limit, rate, state, counts, lease), written under its ETag, an unknown kind never run; the executor (lease, resume by re-selecting open records, cancel seen before the next record, halt on an open breaker or replayed jobs back in poison, each copy deleted by the receipt its record kept and one sweep of the poison queue for the rest); the idle watcher of `aqw run`; `poison replay --all` as an operation | `crates/aqw-core/src/ops/operation/` (`mod.rs` the model and the patch's checks, `patch.rs` the bounded JSON Patch (applied op by op, refused before an op grows the payload past max(4 ×, 1 MiB) or copies past it), `row.rs` `OperationStore` (the lease, take-overs counted and halted past 3), `run.rs` the executor and the watcher, `interactive.rs` `replay_group`) |
//! | poll heartbeats: a worker's last poll per queue, written once a minute, read by `aqw status` | `crates/aqw-core/src/heartbeat.rs` |
//! | test-only crash points, compiled out of release builds | `crates/aqw-core/src/failpoint.rs` |
//! | the storage port: queues, tables, blob containers (`BlobStore`), the typed query (`Filter`); only the Azure adapter writes OData | `crates/aqw-core/src/storage/mod.rs` |
//! | the in-memory store on tokio time (visibility, receipts, TTL, ETags, batches, pages), request counts, an outage switch and Azure's scalability targets (ServerBusy, whole-second times), switchable | `crates/aqw-core/src/storage/memory/` (`mod.rs` the store, its clock and hooks, `queue.rs`, `table.rs`, `blob.rs`, `limits.rs`, `tests/`) |
//! | the storage contract: one suite of checks, run on the memory store here and on Azurite in the binary's tests | `crates/aqw-core/src/contract/` (`mod.rs` the list and runner, `queue.rs`, `table.rs`, `query.rs`, `blob.rs`) |
//! | the engine's wall clock: the system's, or tokio's in a simulation (pinned per thread for a seeded one, skewed per simulated replica) | `crates/aqw-core/src/clock.rs` |
//! | the engine's randomness (jitter, ids, provider keys): the OS's, or one seeded generator per thread in a simulation | `crates/aqw-core/src/entropy.rs` |
//! | a worker built in code: settings and handlers in, `Worker::run(shutdown)`; `handler_fn` | `crates/aqw-core/src/builder.rs` |
//! | schedules: ticks as keyed jobs (`{/schedule}:{/tick}`), cron in a time zone or an interval, the catch-up policy; the task that claims each tick in the control row and puts it, and the status | `crates/aqw-core/src/schedule/` (`mod.rs` ticks and policy, `run.rs` the task and the row) |
//! | claim-check payloads: a body over `aqw.claimCheck.threshold` written to a content-addressed blob (`<queue>/<sha256>`) and a reference put on the queue; the reference checked against its queue before any storage call (`claim_check_invalid`), the worker's bounded fetch with its length and hash checked (`claim_check_missing`, `claim_check_corrupt`); the refresh before a replay | `crates/aqw-core/src/claim.rs` |
//! | the producer API: typed jobs put exactly as `aqw enqueue` puts them (key check, encoding, size, delay and time-to-live) | `crates/aqw-core/src/producer.rs` |
//! | the ready configuration (`AppConfig`, `FunctionConfig`, the `StorageAccount` a function names: its setting, the adapter's resolution held unread, no cloud's shape; retention, timespans, names) and its defaults | `crates/aqw-core/src/config/` (`mod.rs`, `connection.rs`, `retention.rs`, `timespan.rs`) |
//! | a duration printed as a Functions timespan (`fmt_span`): a leaf the config, the schedules and the operator's commands share | `crates/aqw-core/src/span.rs` |
//! | one function's runtime over any storage; queues and tables created before polling; sweep targets | `crates/aqw-core/src/runtime.rs` |
//! | the poll loops of `aqw run`: permits before receive, back-off, heartbeats, drain on shutdown; `Health` | `crates/aqw-core/src/worker.rs` |
//! | the handler contract: `Job`, `Success`, `HandlerError` (retryable, uncertain, permanent), `HandlerSpec` | `crates/aqw-core/src/handler.rs` |
//! | the poison alert's content (grouped by cause), the engine's `Alerts` handle and the delivery's windowing (`gather`: a burst gathered for a second into one alert, then one per queue per window) | `crates/aqw-core/src/alert.rs` |
//! | secrets scrubbed from every log line, error and record | `crates/aqw-core/src/scrub.rs` |
//! | the job's spans and the W3C context they carry (the API side; exporters are the binary's) | `crates/aqw-core/src/traces.rs` |
//! | this map, and the module list | `crates/aqw-core/src/lib.rs` |

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod alert;
pub mod breaker;
pub mod builder;
pub mod claim;
pub mod clock;
pub mod config;
#[cfg(any(test, feature = "contract"))]
pub mod contract;
pub mod control;
pub mod decide;
pub mod entropy;
pub mod failpoint;
pub mod flow;
pub mod gate;
pub mod handler;
pub mod heartbeat;
pub mod idempotency;
pub mod job;
pub mod message;
pub mod ops;
pub mod poison;
pub mod producer;
pub mod redact;
pub mod retention;
pub mod retry;
pub mod runtime;
pub mod schedule;
pub mod scrub;
pub(crate) mod span;
pub mod storage;
pub mod traces;
pub mod worker;
