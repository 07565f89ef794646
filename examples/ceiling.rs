//! Benchmark companion of `bench/aqw_bench.py` (run by `scripts/bench.sh`):
//! the *ceiling* loop and the bench's storage utilities, all through aqw's own
//! storage layer (`aqw_azure`), so they pay the same SDK and transport
//! costs as aqw.
//!
//! ```text
//! ceiling run --queue Q --table T [--batch 16] [--threshold 16] [--expect N] [--idle-exit 1]
//! ceiling enqueue --queue Q --count N [--tag T] [--max-depth 900] [--ready-file F] [--rate R]
//! ceiling replay-loop --from Q1 --to Q2 [--expect N]
//! ceiling count --queue Q
//! ceiling cleanup [--queue Q]... [--table T]...
//! ```
//!
//! `run` is the least a keyed worker can do per message, with aqw's
//! concurrency shape: take `batch` permits out of `batch + threshold`, receive
//! up to `batch` messages with a 30 s visibility, and per message: insert the
//! key entity (409 = duplicate → delete the message), merge it to done with
//! If-Match, delete the message. No lease renewal, no timeouts, no retry
//! bookkeeping, no poison path, no metrics, no logs. It stops when `--expect`
//! messages are settled, or when the queue stayed empty for `--idle-exit`
//! seconds, and prints one JSON line.
//!
//! `enqueue` puts `{"id": "<tag>-<i>", "t": <ms since the epoch>}` messages
//! (base64, as aqw expects by default) with 32 concurrent puts, never letting
//! the queue's approximate depth exceed `--max-depth` (Azurite slows down as a
//! queue deepens). The ready file is written once the first wave is on the
//! queue. With `--rate R` it instead puts one message every 1/R s (pickup
//! latency under a steady load) and writes the ready file at the end.
//!
//! `replay-loop` is the minimal replay: receive up to 32 (120 s visibility),
//! then for each message, one at a time like `aqw poison replay`, put its text
//! on the target queue and delete it from the source.
//!
//! The connection is the `AzureWebJobsStorage` environment setting, default
//! `UseDevelopmentStorage=true` (Azurite).

use anyhow::{bail, Context};
use aqw_azure::{connect, AzureStorage};
use aqw_core::storage::{QueueStore, Storage, StorageError, TableStore, Ttl};
use base64::Engine;
use clap::Parser;
use futures::StreamExt;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;
use tokio::sync::Semaphore;

/// The ceiling loop and the bench's storage utilities.
#[derive(Parser)]
#[command(name = "ceiling")]
enum Cmd {
    /// The ceiling worker: the least a keyed worker can do per message.
    Run(RunArgs),
    /// Put `{"id": "<tag>-<i>", "t": <ms>}` messages, in waves or at a rate.
    Enqueue(EnqueueArgs),
    /// The minimal replay: receive, then put + delete one at a time.
    ReplayLoop(ReplayArgs),
    /// Print `{"queue": Q, "count": N}` (the approximate depth; 0 if missing).
    Count {
        #[arg(long)]
        queue: String,
    },
    /// Delete queues and tables (a missing table is fine).
    Cleanup {
        #[arg(long)]
        queue: Vec<String>,
        #[arg(long)]
        table: Vec<String>,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    #[arg(long)]
    queue: String,
    #[arg(long)]
    table: String,
    /// Messages per receive (1..=32).
    #[arg(long, default_value_t = 16)]
    batch: u32,
    /// Extra permits beyond the batch (aqw's newBatchThreshold).
    #[arg(long, default_value_t = 16)]
    threshold: u32,
    /// Stop once N messages are settled.
    #[arg(long, value_name = "N")]
    expect: Option<u64>,
    /// Stop when the queue stayed empty for SECS.
    #[arg(long = "idle-exit", value_name = "SECS", default_value_t = 1.0)]
    idle_exit: f64,
    /// Give up after SECS.
    #[arg(long, value_name = "SECS", default_value_t = 600.0)]
    timeout: f64,
}

#[derive(clap::Args)]
struct EnqueueArgs {
    #[arg(long)]
    queue: String,
    #[arg(long, default_value_t = 0)]
    count: u64,
    /// The first job's index.
    #[arg(long, default_value_t = 0)]
    start: u64,
    /// Never let the queue's approximate depth exceed this.
    #[arg(long = "max-depth", default_value_t = 900)]
    max_depth: u64,
    /// Concurrent puts.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Job ids are `<tag>-<i>`.
    #[arg(long, default_value = "job")]
    tag: String,
    /// `base64` (aqw's default) or plain text.
    #[arg(long, default_value = "base64")]
    encoding: String,
    /// Written once the first wave is on the queue (at the end with --rate).
    #[arg(long = "ready-file", value_name = "FILE")]
    ready_file: Option<PathBuf>,
    /// Put one message every 1/R s instead of in waves.
    #[arg(long, value_name = "R", default_value_t = 0.0)]
    rate: f64,
    /// Pad each job to this many bytes and put it as aqw's producer puts a
    /// job over `aqw.claimCheck.threshold`: the body to a blob in
    /// `aqw-payloads`, a reference on the queue (0: inline jobs). Waves only.
    #[arg(long = "claim-check", value_name = "BYTES", default_value_t = 0)]
    claim_check: usize,
}

#[derive(clap::Args)]
struct ReplayArgs {
    #[arg(long)]
    from: String,
    #[arg(long)]
    to: String,
    /// Stop once N messages are moved.
    #[arg(long, value_name = "N")]
    expect: Option<u64>,
}

fn storage() -> anyhow::Result<AzureStorage> {
    let value = std::env::var("AzureWebJobsStorage")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "UseDevelopmentStorage=true".into());
    let conn = aqw_azure::parse_connection_string("AzureWebJobsStorage", &value)
        .map_err(|e| anyhow::anyhow!("AzureWebJobsStorage {e}"))?;
    Ok(connect(&conn)?)
}

/// This process's user+system CPU seconds (all threads), from /proc/self/stat.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return f64::NAN;
    };
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
        return f64::NAN;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    let hz = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .unwrap_or(100.0);
    ticks / hz
}

fn now() -> String {
    OffsetDateTime::now_utc()
        .format(&Rfc3339)
        .unwrap_or_default()
}

fn main() -> anyhow::Result<()> {
    // As `aqw` does (see the function): before any thread exists.
    aqw_azure::quiet_library_backtraces();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(ceiling())
}

async fn ceiling() -> anyhow::Result<()> {
    match Cmd::parse() {
        Cmd::Run(args) => run(&args).await,
        Cmd::Enqueue(args) => enqueue(&args).await,
        Cmd::ReplayLoop(args) => replay_loop(&args).await,
        Cmd::Count { queue: q } => {
            let s = storage()?;
            let n = match s.queue(&q).approximate_count().await {
                Ok(n) => n,
                Err(StorageError::NotFound) => 0,
                Err(e) => return Err(e.into()),
            };
            println!("{}", json!({"queue": q, "count": n}));
            Ok(())
        }
        Cmd::Cleanup { queue, table } => {
            let s = storage()?;
            for q in queue {
                s.queue(&q).delete_queue().await?;
            }
            for t in table {
                match s.table(&t).delete_table().await {
                    Ok(()) | Err(StorageError::NotFound) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Ok(())
        }
    }
}

// ---------------------------------------------------------------------------
// run: the ceiling worker
// ---------------------------------------------------------------------------

#[derive(Default)]
struct Counters {
    completed: AtomicU64,
    duplicates: AtomicU64,
    failed: AtomicU64,
    /// Microseconds since start of the last settle.
    last_settle_us: AtomicU64,
}

impl Counters {
    fn settled(&self) -> u64 {
        self.completed.load(Ordering::Relaxed) + self.duplicates.load(Ordering::Relaxed)
    }
}

async fn handle(
    queue: &dyn QueueStore,
    table: &dyn TableStore,
    msg: &aqw_core::storage::ReceivedMessage,
) -> anyhow::Result<bool> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(msg.text.as_bytes())
        .context("message is not base64")?;
    let payload: Value = serde_json::from_slice(&bytes).context("message is not JSON")?;
    let id = payload
        .get("id")
        .and_then(Value::as_str)
        .context("message has no id")?;
    let key = format!("bench:{id}");
    let rk = hex::encode(Sha256::digest(key.as_bytes()));
    let pk = format!("Bench-{}", &rk[..2]);
    let now = now();
    let entity = json!({
        "Key": key,
        "Function": "Bench",
        "Status": "pending",
        "ProviderKey": uuid::Uuid::new_v4().to_string(),
        "Attempts": 1,
        "LeaseOwner": format!("ceiling/{}/{}", msg.id, msg.dequeue_count),
        "LeaseUntil": OffsetDateTime::now_utc().saturating_add(time::Duration::seconds(30)).format(&Rfc3339).unwrap_or_default(),
        "MessageId": msg.id,
        "FirstSeen": now,
    });
    let Value::Object(entity) = entity else {
        unreachable!()
    };
    let duplicate = match table.insert(&pk, &rk, &entity).await {
        Ok(etag) => {
            let Value::Object(done) =
                json!({"Status": "done", "CompletedAt": now, "LeaseUntil": ""})
            else {
                unreachable!()
            };
            table.merge(&pk, &rk, &done, Some(&etag)).await?;
            false
        }
        Err(StorageError::Conflict) => true,
        Err(e) => return Err(e.into()),
    };
    match queue.delete(&msg.id, &msg.pop_receipt).await {
        Ok(()) | Err(StorageError::NotFound) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(duplicate)
}

async fn run(args: &RunArgs) -> anyhow::Result<()> {
    let RunArgs {
        batch,
        threshold,
        expect,
        idle_exit,
        timeout,
        ..
    } = *args;
    if !(1..=32).contains(&batch) {
        bail!("--batch must be 1..=32");
    }
    let storage = storage()?;
    let queue = storage.queue(&args.queue);
    let table = storage.table(&args.table);

    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    table.create_if_missing().await?;
    queue.create_if_missing().await?;
    let counters = Arc::new(Counters::default());
    let permits = Arc::new(Semaphore::new((batch + threshold) as usize));
    let mut empty_polls = 0u32;
    let mut last_activity = Instant::now();
    let mut receive_errors = 0u64;
    let tasks = tokio_util::task::TaskTracker::new();
    loop {
        if expect.is_some_and(|n| counters.settled() >= n) {
            break;
        }
        if t0.elapsed().as_secs_f64() > timeout {
            break;
        }
        let mut owned = permits
            .clone()
            .acquire_many_owned(batch)
            .await
            .expect("semaphore never closed");
        if expect.is_some_and(|n| counters.settled() >= n) {
            break;
        }
        let msgs = match queue.receive(batch as u8, Duration::from_secs(30)).await {
            Ok(m) => m,
            Err(e) => {
                receive_errors += 1;
                eprintln!("ceiling: receive failed: {e}");
                drop(owned);
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        if msgs.is_empty() {
            drop(owned);
            empty_polls += 1;
            let in_flight = (batch + threshold) as usize - permits.available_permits();
            if in_flight == 0 && last_activity.elapsed().as_secs_f64() >= idle_exit {
                break;
            }
            if in_flight > 0 {
                last_activity = Instant::now();
            }
            let d = aqw_core::retry::polling_delay(
                empty_polls,
                Duration::from_secs(1),
                rand::random::<f64>(),
            );
            tokio::time::sleep(d).await;
            continue;
        }
        empty_polls = 0;
        last_activity = Instant::now();
        for msg in msgs {
            let permit = owned.split(1).expect("one permit per message");
            let queue = queue.clone();
            let table = table.clone();
            let counters = counters.clone();
            tasks.spawn(async move {
                match handle(queue.as_ref(), table.as_ref(), &msg).await {
                    Ok(dup) => {
                        let c = if dup {
                            &counters.duplicates
                        } else {
                            &counters.completed
                        };
                        c.fetch_add(1, Ordering::Relaxed);
                        counters
                            .last_settle_us
                            .fetch_max(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
                    }
                    Err(e) => {
                        counters.failed.fetch_add(1, Ordering::Relaxed);
                        eprintln!("ceiling: message {} failed: {e:#}", msg.id);
                    }
                }
                drop(permit);
            });
        }
    }
    tasks.close();
    tasks.wait().await;
    let seconds = counters.last_settle_us.load(Ordering::Relaxed) as f64 / 1e6;
    let out = json!({
        "worker": "ceiling",
        "messages": counters.settled(),
        "completed": counters.completed.load(Ordering::Relaxed),
        "duplicates": counters.duplicates.load(Ordering::Relaxed),
        "failed": counters.failed.load(Ordering::Relaxed),
        "receive_errors": receive_errors,
        "seconds": seconds,
        "cpu_s": cpu_seconds() - cpu0,
        "requests": storage.request_counts(),
    });
    println!("{out}");
    if let Some(n) = expect {
        if counters.settled() < n {
            bail!("settled {} of {n} expected messages", counters.settled());
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// enqueue: feed a queue in waves
// ---------------------------------------------------------------------------

/// `{"id": "<tag>-<i>", "t": <ms since the epoch, just before the put>}`,
/// encoded for the queue. `t` lets a handler measure pickup latency.
fn stamped_body(tag: &str, i: u64, encoding: &str) -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let body = json!({"id": format!("{tag}-{i}"), "t": t}).to_string();
    if encoding == "none" {
        body
    } else {
        base64::engine::general_purpose::STANDARD.encode(body)
    }
}

/// A job padded to `pad` bytes, its body written to its blob: the
/// reference's message text (base64), as `aqw enqueue` puts it.
async fn claim_checked(
    blobs: &dyn aqw_core::storage::BlobStore,
    queue: &str,
    tag: &str,
    i: u64,
    pad: usize,
) -> anyhow::Result<String> {
    let filler = "x".repeat(pad.saturating_sub(tag.len() + 40));
    let body = json!({"id": format!("{tag}-{i}"), "pad": filler}).to_string();
    let enc = aqw_core::message::MessageEncoding::Base64;
    Ok(aqw_core::claim::put_as_reference(blobs, queue, &body, enc).await?)
}

async fn enqueue(args: &EnqueueArgs) -> anyhow::Result<()> {
    let EnqueueArgs {
        count,
        start,
        max_depth,
        concurrency,
        rate,
        ..
    } = *args;
    let tag = args.tag.clone();
    let encoding = args.encoding.clone();
    let ready_file = args.ready_file.clone();
    let storage = storage()?;
    let queue = storage.queue(&args.queue);
    queue.create_if_missing().await?;
    let t0 = Instant::now();
    if rate > 0.0 {
        // Paced: one put every 1/rate s, each on its own task so a slow put
        // does not delay the next one's start.
        let interval = Duration::from_secs_f64(1.0 / rate);
        let start_at = tokio::time::Instant::now();
        let mut puts = Vec::new();
        for i in start..start + count {
            tokio::time::sleep_until(start_at + interval * (i - start) as u32).await;
            let (queue, tag, encoding) = (queue.clone(), tag.clone(), encoding.clone());
            puts.push(tokio::spawn(async move {
                let text = stamped_body(&tag, i, &encoding);
                queue.put(&text, Duration::ZERO, Ttl::Default).await
            }));
        }
        for p in puts {
            p.await??;
        }
        if let Some(f) = &ready_file {
            std::fs::write(f, format!("{}\n", start + count))?;
        }
        println!(
            "{}",
            json!({"mode": "enqueue", "queue": queue.name(), "messages": count, "rate": rate,
                   "seconds": t0.elapsed().as_secs_f64(), "requests": storage.request_counts()})
        );
        return Ok(());
    }
    let pad = args.claim_check;
    let blobs = storage.blobs(aqw_core::claim::DEFAULT_CONTAINER);
    let mut next = start;
    let end = start + count;
    let mut waves = 0u32;
    let mut wrote_ready = false;
    while next < end {
        let depth = queue.approximate_count().await?;
        let room = max_depth.saturating_sub(depth);
        // Wait for the worker to make real room (avoid trickling puts one by one).
        if room < (max_depth / 4).max(1).min(end - next) {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let n = room.min(end - next);
        let ids: Vec<u64> = (next..next + n).collect();
        let results: Vec<anyhow::Result<()>> = futures::stream::iter(ids)
            .map(|i| {
                let queue = queue.clone();
                let tag = tag.clone();
                let encoding = encoding.clone();
                let blobs = blobs.clone();
                async move {
                    let text = match pad {
                        0 => stamped_body(&tag, i, &encoding),
                        _ => claim_checked(blobs.as_ref(), queue.name(), &tag, i, pad).await?,
                    };
                    queue.put(&text, Duration::ZERO, Ttl::Default).await?;
                    Ok(())
                }
            })
            .buffer_unordered(concurrency.max(1))
            .collect()
            .await;
        for r in results {
            r?;
        }
        next += n;
        waves += 1;
        if !wrote_ready {
            if let Some(f) = &ready_file {
                std::fs::write(f, format!("{next}\n"))?;
            }
            wrote_ready = true;
        }
    }
    if !wrote_ready {
        if let Some(f) = &ready_file {
            std::fs::write(f, format!("{next}\n"))?;
        }
    }
    println!(
        "{}",
        json!({"mode": "enqueue", "queue": queue.name(), "messages": count, "waves": waves,
               "seconds": t0.elapsed().as_secs_f64(), "requests": storage.request_counts()})
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// replay-loop: the minimal put + delete replay
// ---------------------------------------------------------------------------

async fn replay_loop(args: &ReplayArgs) -> anyhow::Result<()> {
    let expect = args.expect;
    let storage = storage()?;
    let from = storage.queue(&args.from);
    let to = storage.queue(&args.to);
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    to.create_if_missing().await?;
    let mut moved = 0u64;
    loop {
        if expect.is_some_and(|n| moved >= n) {
            break;
        }
        let msgs = from.receive(32, Duration::from_secs(120)).await?;
        if msgs.is_empty() {
            break;
        }
        for m in msgs {
            to.put(&m.text, Duration::ZERO, Ttl::Default).await?;
            match from.delete(&m.id, &m.pop_receipt).await {
                Ok(()) | Err(StorageError::NotFound) => {}
                Err(e) => return Err(e.into()),
            }
            moved += 1;
        }
    }
    println!(
        "{}",
        json!({"mode": "replay-loop", "messages": moved, "seconds": t0.elapsed().as_secs_f64(),
               "cpu_s": cpu_seconds() - cpu0, "requests": storage.request_counts()})
    );
    if let Some(n) = expect {
        if moved < n {
            bail!("moved {moved} of {n} expected messages");
        }
    }
    Ok(())
}
