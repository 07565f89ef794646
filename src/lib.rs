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
//! The binary; the engine is the `aqw-core` crate
//! (`crates/aqw-core/`, its own map on its crate page), which this crate names
//! as `aqw_core::…` (nothing of it is re-exported here), and the Azure adapter of its
//! storage port is the `aqw-azure` crate (`crates/aqw-azure/`, opened through
//! `aqw_azure::open`). Each rule and the one file that
//! owns it:
//!
//! | rule | file |
//! |---|---|
//! | host.json / function.json / environment and `local.settings.json` → a validated config, exit 2 before any I/O | `src/config/` (`mod.rs` `load` into the engine's ready `AppConfig`, `raw.rs` serde shapes, `breaker.rs` the breaker settings and their per-function override, `settings.rs` environment, `local.settings.json` and `%name%`, `timespan.rs`, `validate.rs` raw → validated values, `alert.rs` the alert's format, dashboard link and signing secret, `functions.rs` discovery and per-function config, `show.rs` the effective configuration for `aqw config show`, secrets masked, each setting's source, `retention.rs` `aqw.retention` and the key-purge safety floor, `limits.rs` `aqw.functions.<Name>.limits`, `queues.rs` the per-function `maxDequeueCount` / `visibilityTimeout` / `batchSize` / `retry`, `concurrency.dynamicConcurrencyEnabled`, and what `aqw serve` refuses or reports of them, `lookup.rs` the handler's `replayMarker` and `lookup`, `schedules.rs` `aqw.schedules` checked against each function's key, `claim_check.rs` `aqw.claimCheck`: the threshold within what a message holds, the container name, `maxBytes` between the threshold and 256 MiB) |
//! | wiring: storage connected once per setting, handlers resolved, every function's runtime built through the engine's `WorkerBuilder` | `src/app.rs` |
//! | `aqw run`: the engine's worker with the alert webhook and the ops port | `src/worker.rs` |
//! | the built-in `http` and `exec` handlers of the engine's `Handler` contract; handlers registered in code | `src/handlers/` (`mod.rs`, `http.rs`, `exec.rs`, `lookup.rs` asking the provider about a provider key, `rate_headers.rs` the delay a provider names: `Retry-After`, the RateLimit fields, `X-RateLimit-Reset`) |
//! | Functions custom handler (`aqw serve`): invocations read as the host encodes them, the same `job::process` with a host-side `Settle`, outcomes answered as status codes | `src/serve.rs` |
//! | `/healthz`, `/readyz`, `/metrics`, and the sampler that refreshes the health gauges every `aqw.http.metricsInterval` | `src/http.rs` |
//! | `aqw dashboard`: status, poison list grouped as in the alert (paged, searchable), one record, replay/discard/fix, group replay/discard and pause/resume through `ops`; token (server-side sessions) or guarded platform-principal auth, CSRF, read-only, `Host` check, back-off on wrong tokens; its own listener, not the ops port | `src/dashboard/` (`mod.rs` router, headers and `/healthz`, `auth.rs` (who is asking: bearer, sessions, principal headers, CSRF), `settings.rs` (the authentication settings: token strength by estimated guesses, trusted-proxy lists and their wide-range override), `listener.rs` (the accept loop: connection caps per client and in total, header and body timeouts, bodies read only after the checks and capped before sign-in), `text.rs` (free text on a page: the one neutralising `Text`), `control.rs` pause / resume and the status page's receiving column, `triage.rs` the front page's triage section (the engine's plan, the provider not asked), `guard.rs` (`Host`, principal guard), `throttle.rs`, `handlers.rs`, `selection.rs` (which records a list page shows and a group action touches: filter, search, alert group; no payloads without a search), `bulk.rs` (group replay / discard: dry run or review first, fingerprinted selection, then a durable operation at the rate the review chose), `operations.rs` (the operations' list and page, cancel, the background executor), `request.rs` (what every route shares: the `Reader` and `Act` extractors, page, redirects), `error.rs` (`DashboardError`, the one error type of the routes, its pages, and the `Form` / `Query` / `Path` extractors rejected as it), `forms.rs` (each route's form or query as a serde struct, repeated fields as lists, bounds checked after extraction), `progress.rs`, `views.rs` (maud), `chart.rs` (the poisons-per-hour SVG), `payload.rs`, `assets/`) |
//! | logs (text/JSON, every line through the engine's scrubber), metrics | `src/telemetry/mod.rs` |
//! | the JSON log line, written in one buffer (the span's stored fields copied, not parsed) | `src/telemetry/json_line.rs` |
//! | the poison alert's delivery: one webhook POST per queue and window, in the receiver's format, HMAC-signed; breaker events at once | `src/telemetry/alerts.rs` |
//! | the alert as a Slack Block Kit message or a Teams Adaptive Card | `src/telemetry/chat.rs` |
//! | the health gauges: the oldest message's age, open poison records by error group (capped, rendered from the latest snapshot) | `src/telemetry/gauges.rs` |
//! | traces: the exporters (the spans are the engine's `aqw_core::traces`) | `src/traces/mod.rs` |
//! | trace exporters chosen by the environment (OTLP/HTTP, Application Insights), bounded and never blocking a job | `src/traces/export.rs` |
//! | the exporters' HTTP client (blocking reqwest, failures counted and warned once a minute) | `src/traces/client.rs` |
//! | OTLP/HTTP protobuf encoded straight from the SDK's span data (no copy of the batch), headers from `OTEL_EXPORTER_OTLP_[TRACES_]HEADERS` | `src/traces/otlp.rs` |
//! | the CLI, one module per noun of the command tree: each subcommand's arguments, help, command and output together; exit codes decided once | `src/cli/` (`mod.rs` the dispatcher, the runtime and a refused command line's exit, `args.rs` the root command and the noun enum, `help_tests.rs` every argument's help and every example checked, `load.rs` the one load-and-connect every command opens with and the option parsers several share (a leaf: it imports no command), `output.rs` `outln!`, `Output` and the views two nouns share (a key's state and history, a purge report), `exit.rs`, `poison/` (`mod.rs` its enum and dispatch, `list.rs` (its JSON redacted unless `--unredacted`), `show.rs`, `report.rs`, `replay.rs`, `fix.rs`, `discard.rs`, `purge.rs`), `keys/` (`mod.rs` its enum and dispatch, `list.rs`, `check.rs`, `new_provider_key.rs`, `show.rs`, `purge.rs`), `ops/` durable group operations (`mod.rs` their arguments and dispatch, `start.rs` select, review, create and carry out, `store.rs` the operation rows and this process as executor, `view.rs` an operation printed and its exit code), `config.rs` `config show`, `control.rs` `pause` and `resume`, `status.rs`, `enqueue.rs`, `service.rs` `run`, `serve` and `dashboard`, `triage.rs` `aqw triage` rendered, `oncall.rs` `aqw oncall [KIND]`: the runbook `docs/oncall.md` embedded at build time, sliced per kind) |
//! | what `aqw triage` and the dashboard's front page read before the engine's pure triage plan: records, key states (bounded), the control row and breaker evidence, the provider lookup's answers (the CLI only), a bad producer's payloads | `src/triage.rs` |
//! | the binary: parse, run, exit; nothing else | `src/main.rs` |
//! | this map, and the module list | `src/lib.rs` |
//! | benchmarks: aqw vs the minimal ceiling loop vs a Python worker on Microsoft's SDKs | `scripts/bench.sh` (driver) → `bench/aqw_bench.py` (`scenarios.py`, `figures.py`, `report.py`, `harness.py`; tests `test_aqw_bench.py`), `examples/bench_worker.rs`, `examples/ceiling.rs`, `bench/python_worker.py` → `BENCHMARKS.md` |
//!
//! The binary (`src/main.rs` over `src/cli/`) is a thin CLI over this library; shutdown is a
//! `CancellationToken` passed into [`worker::run`].

pub mod app;
pub mod config;
pub mod dashboard;
pub mod handlers;
pub mod http;
pub mod serve;
pub mod telemetry;
pub mod traces;
pub mod triage;
pub mod worker;
