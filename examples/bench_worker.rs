//! Benchmark harness: aqw's real worker (`aqw::worker::run`) with an
//! in-process handler, so the figures measure aqw itself and not a child
//! process or an HTTP hop. Used by the benchmark (`scripts/bench.sh`, which runs
//! `bench/aqw_bench.py`).
//!
//! ```text
//! cargo run --release --example bench_worker -- --app DIR [--expect N]
//!     [--exit-when-idle SECS] [--handler ok|fail] [--log text|json] [--timeout SECS]
//!     [--latency-log FILE]
//! ```
//!
//! Every function of the app folder whose host.json entry has no `handler`
//! gets the in-process handler (`ok`: succeeds at once; `fail`: permanent
//! failure, so every job is poisoned). Functions with an `exec`/`http` handler
//! keep it. With `--latency-log FILE`, the handler appends `<id> <ms>` per
//! job whose payload carries `"t"` (ms since the epoch, stamped by `ceiling
//! enqueue` just before the put): the pickup latency, enqueue → handler start.
//!
//! Stops when `--expect N` messages have reached a final outcome (completed,
//! duplicate or poisoned, read from aqw's own `aqw_messages_total`), or when
//! nothing happened for `--exit-when-idle` seconds and the queues are empty.
//! Then it prints one JSON line on stdout:
//!
//! ```json
//! {"worker":"aqw","handled":1000,"outcomes":{"completed":1000},
//!  "seconds":3.2,"cpu_s":1.1,"requests":{"queue.receive:200":63,...},
//!  "requests_final":{...}}
//! ```
//!
//! `requests` is `aqw_storage_requests_total` by `operation:status` at the moment
//! the last expected message was settled (so idle polls after the end are not
//! counted); `requests_final` is the same at exit. Requests made by this harness
//! itself (queue-depth checks in `--exit-when-idle` mode) are subtracted.
//! `seconds` runs from just before `worker::run` (which creates the tables and
//! queue if missing) to that moment; `cpu_s` is this process's user+system CPU
//! over the same span (from /proc/self/stat).

use anyhow::{bail, Context};
use aqw::handlers::Registry;
use aqw_core::handler::{Handler, HandlerError, Job, Success};
use aqw_core::storage::Storage;
use async_trait::async_trait;
use clap::{Parser, ValueEnum};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

struct BenchHandler {
    fail: bool,
    handled: AtomicU64,
    /// `--latency-log`: one line `<id> <ms from enqueue to handler start>` per job.
    latency_log: Option<std::sync::Mutex<std::fs::File>>,
}

#[async_trait]
impl Handler for BenchHandler {
    async fn handle(&self, job: &Job) -> Result<Success, HandlerError> {
        self.handled.fetch_add(1, Ordering::Relaxed);
        if let Some(log) = &self.latency_log {
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs_f64() * 1000.0)
                .unwrap_or(0.0);
            let v: serde_json::Value = serde_json::from_str(&job.payload).unwrap_or_default();
            if let (Some(id), Some(t)) = (v["id"].as_str(), v["t"].as_f64()) {
                use std::io::Write;
                let mut f = log.lock().unwrap();
                let _ = writeln!(f, "{id} {:.1}", now_ms - t);
                let _ = f.flush();
            }
        }
        if self.fail {
            Err(HandlerError::permanent(
                "bench: permanent failure on purpose",
            ))
        } else {
            Ok(Success::done())
        }
    }
}

/// aqw's worker with the bench's in-process handler (run by
/// `bench/scenarios.py`).
#[derive(Parser)]
#[command(name = "bench_worker")]
struct Args {
    /// The app folder (host.json).
    #[arg(long, default_value = ".")]
    app: PathBuf,
    /// Stop once N messages have reached a final outcome.
    #[arg(long, value_name = "N")]
    expect: Option<u64>,
    /// Stop when nothing happened for SECS and the queues are empty (2 when
    /// neither this nor --expect is given).
    #[arg(long = "exit-when-idle", value_name = "SECS")]
    idle_exit: Option<f64>,
    /// `fail`: every job fails (the replay setup's poisoning).
    #[arg(long, value_enum, default_value_t = HandlerKind::Ok)]
    handler: HandlerKind,
    /// Install a log subscriber (none by default: no per-job logging).
    #[arg(long, value_enum)]
    log: Option<aqw::telemetry::LogFormat>,
    /// Give up after SECS.
    #[arg(long, value_name = "SECS", default_value_t = 600.0)]
    timeout: f64,
    /// Append `<id> <ms from enqueue to handler start>` per job to FILE.
    #[arg(long = "latency-log", value_name = "FILE")]
    latency_log: Option<PathBuf>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum HandlerKind {
    Ok,
    Fail,
}

fn parse_args() -> Args {
    let mut args = Args::parse();
    if args.expect.is_none() && args.idle_exit.is_none() {
        args.idle_exit = Some(2.0);
    }
    args
}

/// This process's user+system CPU seconds (all threads).
pub fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return f64::NAN;
    };
    // Fields after the command name (which is in parentheses and may hold spaces).
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
        return f64::NAN;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); utime is field 14, stime field 15.
    let ticks: f64 = f.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    ticks / clock_ticks()
}

fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// Parsed Prometheus text: metric name → (labels, value).
struct Scrape(Vec<(String, BTreeMap<String, String>, f64)>);

impl Scrape {
    fn take() -> Self {
        Self::parse(&aqw::telemetry::metrics_handle().render())
    }

    fn parse(text: &str) -> Self {
        let mut out = Vec::new();
        for line in text.lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let (head, value) = match line.rsplit_once(' ') {
                Some(x) => x,
                None => continue,
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let (name, labels) = match head.find('{') {
                Some(i) => (&head[..i], &head[i + 1..head.len() - 1]),
                None => (head, ""),
            };
            let mut map = BTreeMap::new();
            for pair in labels.split("\",") {
                if let Some((k, v)) = pair.split_once("=\"") {
                    map.insert(k.to_string(), v.trim_end_matches('"').to_string());
                }
            }
            out.push((name.to_string(), map, value));
        }
        Scrape(out)
    }

    /// Sum of `name` grouped by the given labels joined with ':'.
    fn by(&self, name: &str, labels: &[&str]) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for (n, l, v) in &self.0 {
            if n == name {
                let key: Vec<&str> = labels
                    .iter()
                    .map(|k| l.get(*k).map(String::as_str).unwrap_or(""))
                    .collect();
                *out.entry(key.join(":")).or_default() += *v as u64;
            }
        }
        out
    }

    fn settled(&self) -> u64 {
        self.by("aqw_messages_total", &["outcome"])
            .iter()
            .filter(|(k, _)| matches!(k.as_str(), "completed" | "duplicate" | "poisoned"))
            .map(|(_, v)| *v)
            .sum()
    }
}

fn subtract(a: &BTreeMap<String, u64>, own: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    let mut out = a.clone();
    for (op, n) in own {
        // The harness's own requests all answered 200 (else it would have said so).
        if let Some(v) = out.get_mut(&format!("{op}:200")) {
            *v = v.saturating_sub(*n);
        }
    }
    out.retain(|_, v| *v > 0);
    out
}

fn main() -> anyhow::Result<()> {
    // As `aqw` does (see the function): before any thread exists.
    aqw_azure::quiet_library_backtraces();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(bench())
}

async fn bench() -> anyhow::Result<()> {
    let args = parse_args();
    // Traces as `aqw run` sets them up (OTEL_* / APPLICATIONINSIGHTS_*), so
    // the benchmark can compare export off and on.
    let traces = aqw::traces::export::targets_from_env(|k| std::env::var(k).ok())
        .and_then(|t| aqw::traces::export::install(&t))
        .map_err(|e| anyhow::anyhow!(e))?;
    if args.log.is_some() || traces.provider().is_some() {
        aqw::telemetry::init_logging(
            args.log.unwrap_or(aqw::telemetry::LogFormat::Text),
            traces.provider(),
        );
    }
    let app =
        Arc::new(aqw::config::load(&args.app).map_err(|e| anyhow::anyhow!("configuration: {e}"))?);
    // Install the Prometheus recorder before the worker counts anything.
    aqw::telemetry::metrics_handle();

    let handler = Arc::new(BenchHandler {
        fail: args.handler == HandlerKind::Fail,
        handled: AtomicU64::new(0),
        latency_log: match &args.latency_log {
            Some(p) => Some(std::sync::Mutex::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .with_context(|| format!("--latency-log {}", p.display()))?,
            )),
            None => None,
        },
    });
    let mut registry = Registry::new();
    for f in &app.functions {
        if matches!(f.handler, aqw_core::config::HandlerSpec::Registered) {
            registry = registry.register(f.name.clone(), handler.clone() as Arc<dyn Handler>);
        }
    }
    aqw::app::preflight(&app, &registry).map_err(|e| anyhow::anyhow!(e))?;

    // Queue-depth checks (idle mode only) go through our own storage instance,
    // whose requests are subtracted from the worker's counts.
    let probe = match app.functions.first() {
        Some(f) => aqw_azure::connect(
            aqw_azure::connection_of(&f.connection).map_err(anyhow::Error::msg)?,
        )?,
        None => bail!("the app defines no function"),
    };
    let queues: Vec<_> = app
        .functions
        .iter()
        .map(|f| probe.queue(&f.queue))
        .collect();

    let shutdown = CancellationToken::new();
    {
        let s = shutdown.clone();
        tokio::spawn(async move {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
            }
            s.cancel();
        });
    }

    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    let worker = tokio::spawn(aqw::worker::run(app.clone(), registry, shutdown.clone()));

    // Watch progress through aqw's own outcome counter. Rendering the
    // Prometheus text costs this process CPU that the figures would charge
    // to aqw, so with --expect it is read every 50 ms only once the handler
    // has run for the last expected job (or the handler count stopped
    // moving, as for duplicates), else every 500 ms.
    let mut done_at: Option<(f64, f64, Scrape)> = None;
    let mut last_settled = 0u64;
    let mut last_change = Instant::now();
    let mut last_scrape: Option<Instant> = None;
    let mut last_handled = 0u64;
    let mut handled_moved = Instant::now();
    let mut interrupted = false;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            _ = shutdown.cancelled() => { interrupted = true; break; }
        }
        if worker.is_finished() || t0.elapsed().as_secs_f64() > args.timeout {
            break;
        }
        let handled = handler.handled.load(Ordering::Relaxed);
        if handled != last_handled {
            last_handled = handled;
            handled_moved = Instant::now();
        }
        // Idle-exit mode needs each settle's time: it always reads at 50 ms.
        let tail = args.expect.is_none_or(|n| handled >= n)
            || handled_moved.elapsed() >= Duration::from_millis(200);
        if !tail && last_scrape.is_some_and(|t| t.elapsed() < Duration::from_millis(500)) {
            continue;
        }
        last_scrape = Some(Instant::now());
        let scrape = Scrape::take();
        let settled = scrape.settled();
        if settled != last_settled {
            last_settled = settled;
            last_change = Instant::now();
        }
        if let Some(n) = args.expect {
            if settled >= n {
                done_at = Some((t0.elapsed().as_secs_f64(), cpu_seconds() - cpu0, scrape));
                break;
            }
        }
        if let Some(idle) = args.idle_exit {
            if last_change.elapsed().as_secs_f64() >= idle {
                let mut empty = true;
                for q in &queues {
                    if q.approximate_count().await.unwrap_or(1) > 0 {
                        empty = false;
                    }
                }
                if empty {
                    // The last settle happened `idle` seconds ago.
                    let at = last_change.duration_since(t0).as_secs_f64();
                    done_at = Some((at, cpu_seconds() - cpu0, scrape));
                    break;
                }
                last_change = Instant::now();
            }
        }
    }
    shutdown.cancel();
    let run_result = worker.await.context("worker task panicked")?;
    let final_scrape = Scrape::take();
    let own = probe.request_counts();
    let complete = done_at.is_some();
    let (seconds, cpu_s, at_done) = match done_at {
        Some(d) => d,
        None => (
            t0.elapsed().as_secs_f64(),
            cpu_seconds() - cpu0,
            Scrape::take(),
        ),
    };
    let out = json!({
        "worker": "aqw",
        "handled": handler.handled.load(Ordering::Relaxed),
        "settled": at_done.settled(),
        "outcomes": final_scrape.by("aqw_messages_total", &["outcome"]),
        "seconds": seconds,
        "cpu_s": cpu_s,
        "requests": subtract(&at_done.by("aqw_storage_requests_total", &["operation", "status"]), &own),
        "requests_final": subtract(&final_scrape.by("aqw_storage_requests_total", &["operation", "status"]), &own),
        "harness_requests": own,
        "interrupted": interrupted,
        "complete": complete,
    });
    println!("{out}");
    run_result?;
    if let Some(n) = args.expect {
        if at_done.settled() < n {
            bail!(
                "stopped after {} of {n} expected messages",
                at_done.settled()
            );
        }
    }
    Ok(())
}
