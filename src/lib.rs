//! # aqw — an Azure Queue Storage worker that makes background jobs safe to retry
//!
//! aqw reads jobs from Azure Queue Storage, checks each message's DequeueCount
//! against `maxDequeueCount` (Functions semantics), runs each job under an
//! idempotency key recorded in Table Storage (key first, pending → done), and
//! moves what still fails to `<queue>-poison` with its exact payload and last
//! error, where an operator can inspect, replay or discard it.
//!
//! ## Layout
//!
//! Each rule of the design (`DESIGN.md`) and where it lives:
//!
//! | rule | file |
//! |---|---|
//! | host.json / function.json / environment (then `local.settings.json`) → validated config, exit 2 before I/O; `%AppSetting%`, disabled and non-queue functions | [`config`] |
//! | every Azure SDK import, behind `QueueStore` / `TableStore` | [`storage`] (`storage/azure.rs`) |
//! | pooled transport with timeouts, storage requests counted by operation | `storage/azure.rs` |
//! | message encoding (base64/none), 64 KiB limit, poison envelope `poison/1` | [`message`] |
//! | key from business facts (template / `idempotencyKey` / `none`), claim by insert or `If-Match` take-over, pending → done | [`idempotency`] |
//! | retry delay (exponential + jitter, or fixed) and Functions polling backoff, as pure values | [`retry`] |
//! | one function decides a message's fate (`process` → `Outcome`); permits before receive; lease renewal; functionTimeout; drain on shutdown | [`worker`] |
//! | the one poison path (record → envelope → delete), crash-safe | [`poison`] |
//! | list / show / replay / discard / status (the operator's procedure) | [`ops`] |
//! | `Handler` trait with typed results; built-in `http` and `exec` | [`handlers`] |
//! | Functions custom handler (`aqw serve`) over the same `process`; invocations decoded as the host encodes them | [`serve`] |
//! | `/healthz`, `/readyz`, `/metrics` | [`http`] |
//! | logs (text/JSON, secrets scrubbed), metrics, alert webhook | [`telemetry`] |
//! | test-only crash points, compiled out of release builds | [`failpoint`] |
//! | benchmarks: aqw vs the minimal ceiling loop vs a Python worker on Microsoft's SDKs | `scripts/bench.sh` (driver) → `bench/aqw_bench.py` (`scenarios.py`, `figures.py`, `report.py`, `harness.py`; tests `test_aqw_bench.py`), `examples/bench_worker.rs`, `examples/ceiling.rs`, `bench/python_worker.py` → `BENCHMARKS.md` |
//!
//! The binary (`src/main.rs`) is a thin CLI over this library; shutdown is a
//! `CancellationToken` passed into [`worker::run`].

pub mod config;
pub mod failpoint;
pub mod handlers;
pub mod http;
pub mod idempotency;
pub mod message;
pub mod ops;
pub mod poison;
pub mod retry;
pub mod serve;
pub mod storage;
pub mod telemetry;
pub mod worker;

pub use config::AppConfig;
pub use handlers::{Handler, HandlerError, Job, Registry, Success};
pub use worker::{process, run, Outcome};
