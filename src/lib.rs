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
//! Each rule of the design and the one file that owns it:
//!
//! | rule | file |
//! |---|---|
//! | host.json / function.json / environment and `local.settings.json` → a validated config, exit 2 before any I/O | `src/config.rs` |
//! | wiring: one runtime per function, storage connected once per setting, queues and tables created | `src/app.rs` |
//! | the fate of a message as a pure function of its facts (`decide` → `Action`, `Policy` from config); the message-life table as unit tests | `src/decide.rs` |
//! | carrying actions out: permits before receive, lease renewal, `functionTimeout`, drain on shutdown, one outcome line and counters | `src/worker.rs` |
//! | retry delay (exponential + jitter, or fixed) and the Functions polling back-off, as pure values | `src/retry.rs` |
//! | the key from business facts (template / `idempotencyKey` / `none`), `IdempotencyKey` | `src/idempotency/key.rs` |
//! | key first: claim by insert or `If-Match` take-over, pending → done, attempt history | `src/idempotency/store.rs` |
//! | message encoding (base64/none), the 64 KiB limit, the poison envelope, `<queue>-poison` naming | `src/message.rs` |
//! | a poison record's table columns, and every update that closes one | `src/poison/record.rs` |
//! | the one poison path (record → envelope → delete), crash-safe | `src/poison/sink.rs` |
//! | the operator's commands, one file each, returning data: list, show, replay, fix, discard, status, enqueue, keys | `src/ops/` |
//! | `Handler` with typed results (retryable, uncertain, permanent); built-in `http` and `exec` | `src/handlers/` |
//! | Functions custom handler (`aqw serve`): invocations read as the host encodes them | `src/serve.rs` |
//! | `/healthz`, `/readyz`, `/metrics` | `src/http.rs` |
//! | `aqw dashboard`: status, poison list grouped as in the alert, one record, replay/discard/fix through `ops`; token (server-side sessions) or guarded platform-principal auth, CSRF, read-only, `Host` check, back-off on wrong tokens; its own listener, not the ops port | `src/dashboard/` (`mod.rs` router, headers and `/healthz`, `auth.rs`, `guard.rs` (`Host`, principal guard), `throttle.rs`, `handlers.rs`, `progress.rs`, `views.rs` (maud), `payload.rs`, `assets/`) |
//! | logs (text/JSON, secrets scrubbed), metrics, grouped alerts | `src/telemetry.rs` |
//! | traces: the `aqw.job` span and its steps, W3C context in (`aqw.tracing.parent`, the host's `traceparent`) and out (handlers, `aqw enqueue`), ids on outcome lines | `src/traces/mod.rs` |
//! | trace exporters chosen by the environment (OTLP/HTTP, Application Insights), bounded and never blocking a job | `src/traces/export.rs` |
//! | every Azure import, behind `QueueStore` / `TableStore`; the connection types | `src/storage/mod.rs` |
//! | queues on `azure_storage_queue` 1.x | `src/storage/azure.rs` |
//! | our Tables client on the `azure_core` 1.x pipeline | `src/storage/tables.rs` |
//! | SharedKey / SAS / bearer signing, retries and timeouts in the pipeline | `src/storage/pipeline.rs` |
//! | which identity signs (workload, managed, developer tools) | `src/storage/identity.rs` |
//! | test-only crash points, compiled out of release builds | `src/failpoint.rs` |
//! | the CLI: arguments and help, rendering, exit codes decided once | `src/cli/` |
//! | benchmarks: aqw vs the minimal ceiling loop vs a Python worker on Microsoft's SDKs | `scripts/bench.sh` (driver) → `bench/aqw_bench.py` (`scenarios.py`, `figures.py`, `report.py`, `harness.py`; tests `test_aqw_bench.py`), `examples/bench_worker.rs`, `examples/ceiling.rs`, `bench/python_worker.py` → `BENCHMARKS.md` |
//!
//! The binary (`src/main.rs` over `src/cli/`) is a thin CLI over this library; shutdown is a
//! `CancellationToken` passed into [`worker::run`].

pub mod app;
pub mod config;
pub mod dashboard;
pub mod decide;
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
pub mod traces;
pub mod worker;

pub use config::AppConfig;
pub use handlers::{Handler, HandlerError, Job, Registry, Success};
pub use worker::{process, run, Outcome};
