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
//! | host.json / function.json / environment and `local.settings.json` → a validated config, exit 2 before any I/O | `src/config/` (`mod.rs` the ready `AppConfig` and `load`, `raw.rs` serde shapes, `breaker.rs` the breaker settings and their per-function override, `settings.rs` environment, `local.settings.json` and `%name%`, `timespan.rs`, `validate.rs` raw → validated values, `alert.rs` the alert's format, dashboard link and signing secret, `functions.rs` discovery and per-function config, `show.rs` the effective configuration for `aqw config show`, secrets masked, each setting's source, `retention.rs` `aqw.retention` and the key-purge safety floor) |
//! | wiring: one runtime per function, storage connected once per setting, queues and tables created | `src/app.rs` |
//! | the fate of a message as a pure function of its facts, in two typed stages (`next_step` → `NextStep`: claim, run, or settle `WithoutRunning`; `fate` → `Fate` after the attempt; `Policy` from config); the message-life tables as unit tests | `src/decide.rs` |
//! | the pipeline for one message, for `aqw run` and `aqw serve`: `process` gathers the facts and carries out each stage (`Settle`, the single poison exit), runs the handler (lease renewal, `functionTimeout`, hard stop), one outcome line and counters (`Outcome`) | `src/job/` (`mod.rs` `process`, `settle.rs`, `handler.rs`, `outcome.rs`) |
//! | `aqw run`: a poll loop per function, permits before receive, back-off, drain on shutdown | `src/worker.rs` |
//! | the circuit breaker of one function as a pure state machine (closed → open → half-open), what counts toward it, its settings and defaults | `src/breaker.rs` |
//! | the control row of each function in `aqwcontrol`: pause / resume by an operator, the breaker state a worker publishes; `ControlStore` | `src/control.rs` |
//! | what the poll loop asks before receiving: the pause and the breaker, watched and published per function (`Gate`) | `src/gate.rs` |
//! | retry delay (exponential + jitter, or fixed) and the Functions polling back-off, as pure values | `src/retry.rs` |
//! | idempotency: the key table's layout (RowKey = SHA-256 of the key) and the module's exports | `src/idempotency/mod.rs` |
//! | the key from business facts (template / `idempotencyKey` / `none`), `IdempotencyKey` | `src/idempotency/key.rs` |
//! | key first: claim by insert or `If-Match` take-over, pending → done | `src/idempotency/store.rs` |
//! | the key record's columns and status, its attempt history | `src/idempotency/record.rs` |
//! | what retention may read of the key table: a function's partitions, settled keys older than a cutoff (server-side filter) | `src/idempotency/purge.rs` |
//! | message encoding (base64/none), the 64 KiB limit, the kind and text of the error that poisons a message | `src/message.rs` |
//! | the poison path's write order, stated once, and the module's exports | `src/poison/mod.rs` |
//! | the poison envelope, `<queue>-poison` naming, the record id of a host copy | `src/poison/envelope.rs` |
//! | a poison record's table columns, and every update that closes one | `src/poison/record.rs` |
//! | `PoisonStore`: every read and write of poison records (list, find, close as replayed / replaced / discarded, the replay crash marker) and the crash-safe write order (record → copy → copy named) | `src/poison/store.rs` |
//! | the `<queue>-poison` copies: the scan that imports host copies and deletes strays, release, delete | `src/poison/copies.rs` |
//! | the worker's one poison call (record built, written through the store, alert raised) | `src/poison/sink.rs` |
//! | what retention may read of the record table: the keys open records refer to, closed records older than a cutoff | `src/poison/purge.rs` |
//! | redaction: the `redact` pointers masked wherever a person sees a payload (`poison show`, the dashboard), restored in a fix; the stored payload stays exact | `src/redact.rs` |
//! | retention: the purge's guards (filter, open records, `If-Match` batches of 100), counts, the request pacer | `src/retention/mod.rs` |
//! | the background sweep of `aqw run`: one sweeper per account by a lease row, bounded rate | `src/retention/sweep.rs` |
//! | the operator's commands, one file each, returning data, as procedures over `KeyStore`, `PoisonStore` and `ControlStore`: list, show, replay, fix, discard, status, enqueue, keys, pause / resume, purge; the provider's key window that replay and fix check | `src/ops/` (`mod.rs`, `control.rs`, `list.rs`, `show.rs`, `replay.rs`, `fix.rs`, `discard.rs`, `rehearse.rs` (the dry runs of fix and discard), `status.rs`, `enqueue.rs`, `keys.rs`, `purge.rs`, `window.rs`) |
//! | `Handler` with typed results (retryable, uncertain, permanent); built-in `http` and `exec` | `src/handlers/` (`mod.rs`, `http.rs`, `exec.rs`) |
//! | Functions custom handler (`aqw serve`): invocations read as the host encodes them, the same `job::process` with a host-side `Settle`, outcomes answered as status codes | `src/serve.rs` |
//! | one TLS client configuration (roots loaded once) shared by every HTTP client | `src/tls.rs` |
//! | `/healthz`, `/readyz`, `/metrics`, and the sampler that refreshes the health gauges every `aqw.http.metricsInterval` | `src/http.rs` |
//! | poll heartbeats: a worker's last poll per queue, written once a minute, read by `aqw status` | `src/heartbeat.rs` |
//! | `aqw dashboard`: status, poison list grouped as in the alert (paged, searchable), one record, replay/discard/fix, group replay/discard and pause/resume through `ops`; token (server-side sessions) or guarded platform-principal auth, CSRF, read-only, `Host` check, back-off on wrong tokens; its own listener, not the ops port | `src/dashboard/` (`mod.rs` router, headers and `/healthz`, `auth.rs`, `control.rs` pause / resume and the status page's receiving column, `guard.rs` (`Host`, principal guard), `throttle.rs`, `handlers.rs`, `selection.rs` (which records a list page shows and a group action touches: filter, search, alert group; no payloads without a search), `bulk.rs` (group replay / discard: dry run or review first, fingerprinted selection, one at a time, rate-limited), `request.rs` (what every route shares: extractor, pairs, page, `tri!`), `progress.rs`, `views.rs` (maud), `chart.rs` (the poisons-per-hour SVG), `payload.rs`, `assets/`) |
//! | logs (text/JSON, secrets scrubbed), metrics | `src/telemetry/mod.rs` |
//! | the JSON log line, written in one buffer (the span's stored fields copied, not parsed) | `src/telemetry/json_line.rs` |
//! | the poison alert: one line per record, one webhook POST per queue and window, grouped by cause, in the receiver's format, HMAC-signed | `src/telemetry/alerts.rs` |
//! | what every alert format shows: the poison event, its window grouped by cause, the commands and link to follow | `src/telemetry/groups.rs` |
//! | the alert as a Slack Block Kit message or a Teams Adaptive Card | `src/telemetry/chat.rs` |
//! | the health gauges: the oldest message's age, open poison records by error group (capped, rendered from the latest snapshot) | `src/telemetry/gauges.rs` |
//! | traces: the `aqw.job` span and its steps, W3C context in (`aqw.tracing.parent`, the host's `traceparent`) and out (handlers, `aqw enqueue`), ids on outcome lines | `src/traces/mod.rs` |
//! | trace exporters chosen by the environment (OTLP/HTTP, Application Insights), bounded and never blocking a job | `src/traces/export.rs` |
//! | OTLP/HTTP protobuf encoded straight from the SDK's span data (no copy of the batch), headers from `OTEL_EXPORTER_OTLP_[TRACES_]HEADERS` | `src/traces/otlp.rs` |
//! | every Azure import, behind `QueueStore` / `TableStore`; the 7-day visibility limit | `src/storage/mod.rs` |
//! | the connection types; connection strings and identity-based settings → a `Connection` | `src/storage/connection.rs` |
//! | queues on `azure_storage_queue` 1.x | `src/storage/azure.rs` |
//! | our Tables client on the `azure_core` 1.x pipeline | `src/storage/tables.rs` |
//! | SharedKey / SAS / bearer signing, retries and timeouts in the pipeline | `src/storage/pipeline.rs` |
//! | how a storage request reaches the wire: hyper directly, reqwest behind a proxy; pool and request timeouts | `src/storage/transport.rs` |
//! | SharedKey signing of each try (string to sign, HMAC) | `src/storage/shared_key.rs` |
//! | which identity signs (workload, managed, developer tools) | `src/storage/identity.rs` |
//! | test-only crash points, compiled out of release builds | `src/failpoint.rs` |
//! | the CLI: arguments and help, rendering, exit codes decided once; the purge commands | `src/cli/` (`mod.rs`, `args.rs`, `commands.rs`, `render.rs`, `exit.rs`, `purge.rs`) |
//! | the binary: parse, run, exit; nothing else | `src/main.rs` |
//! | this map, and the module list | `src/lib.rs` |
//! | benchmarks: aqw vs the minimal ceiling loop vs a Python worker on Microsoft's SDKs | `scripts/bench.sh` (driver) → `bench/aqw_bench.py` (`scenarios.py`, `figures.py`, `report.py`, `harness.py`; tests `test_aqw_bench.py`), `examples/bench_worker.rs`, `examples/ceiling.rs`, `bench/python_worker.py` → `BENCHMARKS.md` |
//!
//! The binary (`src/main.rs` over `src/cli/`) is a thin CLI over this library; shutdown is a
//! `CancellationToken` passed into [`worker::run`].

pub mod app;
pub mod breaker;
pub mod config;
pub mod control;
pub mod dashboard;
pub mod decide;
pub mod failpoint;
pub mod gate;
pub mod handlers;
pub mod heartbeat;
pub mod http;
pub mod idempotency;
pub mod job;
pub mod message;
pub mod ops;
pub mod poison;
pub mod redact;
pub mod retention;
pub mod retry;
pub mod serve;
pub mod storage;
pub mod telemetry;
pub mod tls;
pub mod traces;
pub mod worker;

pub use config::AppConfig;
pub use handlers::{Handler, HandlerError, Job, Registry, Success};
pub use job::{process, Outcome};
pub use worker::run;
