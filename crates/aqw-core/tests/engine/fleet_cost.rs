//! What a fleet costs the storage account against Azure's scalability
//! targets (issue 50): 100 replicas, each running the same 50 functions
//! (one queue each), on one memory store with
//! `MemoryStorage::set_azure_limits` on (2,000 messages/s a queue, 2,000
//! entities/s a partition, 20,000 requests/s the account, 503 ServerBusy
//! past them). Idle first, then offered load in steps, spread evenly over
//! the 50 queues; each step prints the account's requests a second, the
//! busiest queue and partition in their busiest second and the ServerBusy
//! answers by target, so the first limit met shows. Ignored (about a
//! minute of CPU): `cargo test -p aqw-core --test engine fleet_cost --
//! --ignored --nocapture`; the figures are in BENCHMARKS.md.
//! `AQW_COST_REPLICAS`, `AQW_COST_FUNCTIONS` and `AQW_COST_STEPS` (jobs a
//! second, comma-separated) change the fleet and the steps.

use crate::common::{start, Running, ENCODING};
use aqw_core::builder::{handler_fn, WorkerBuilder};
use aqw_core::config::{FunctionConfig, KeySpec};
use aqw_core::handler::Success;
use aqw_core::idempotency::KeyTemplate;
use aqw_core::message::encode;
use aqw_core::storage::memory::{AzureLimits, MemoryStorage};
use aqw_core::storage::{QueueStore, Ttl};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// How long each half of a load step offers its rate.
const STEP: Duration = Duration::from_secs(10);

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// One replica running every function, keyed by `{/id}`.
fn replica(storage: &MemoryStorage, functions: usize, id: &str) -> Running {
    let shared: Arc<dyn aqw_core::storage::Storage> = Arc::new(storage.clone());
    let mut b = WorkerBuilder::new(shared.clone()).configure(|app| {
        app.new_batch_threshold = 8;
        app.message_encoding = ENCODING;
    });
    for f in 0..functions {
        let mut fc = FunctionConfig::new(format!("F{f}x{id}"), format!("q{f}x{id}"));
        fc.key = KeySpec::Template(KeyTemplate::parse("job:{/id}").expect("a valid template"));
        b = b.function_on(
            fc,
            shared.clone(),
            Arc::new(handler_fn(|_job| async { Ok(Success::default()) })),
        );
    }
    start(b.build().expect("valid settings"))
}

/// The busiest scope of a kind (`queue `, `partition `) in its busiest
/// second, and the refusals of that kind.
fn busiest(peaks: &BTreeMap<String, u64>, kind: &str) -> (String, u64) {
    peaks
        .iter()
        .filter(|(k, _)| k.starts_with(kind))
        .max_by_key(|(_, n)| **n)
        .map(|(k, n)| (k.clone(), *n))
        .unwrap_or_default()
}

fn refused(busy: &BTreeMap<String, u64>, kind: &str) -> u64 {
    busy.iter()
        .filter(|(k, _)| k.starts_with(kind))
        .map(|(_, n)| n)
        .sum()
}

/// One line of the report over the last `span`: requests a second, peaks,
/// refusals.
fn report(label: &str, storage: &MemoryStorage, span: Duration) {
    let per_sec = storage.total_requests() as f64 / span.as_secs_f64();
    let (peaks, busy) = (storage.load_peaks(), storage.server_busy());
    let account = peaks.get("account").copied().unwrap_or(0);
    let (queue, queue_peak) = busiest(&peaks, "queue ");
    let (part, part_peak) = busiest(&peaks, "partition ");
    println!(
        "{label}: {per_sec:.0} requests/s on the account (peak {account}/s); busiest queue \
         {queue_peak} messages/s ({queue}); busiest partition {part_peak} entities/s ({part}); \
         ServerBusy: account {}, queues {}, partitions {}",
        refused(&busy, "account"),
        refused(&busy, "queue "),
        refused(&busy, "partition "),
    );
}

/// Offer `rate` jobs a second for [`STEP`], spread over `queues`, in
/// tenths of a second; puts refused as ServerBusy are counted, not retried.
async fn offer(queues: &[Arc<dyn QueueStore>], rate: usize, id: &str, step: usize) -> usize {
    let t0 = tokio::time::Instant::now();
    let (mut n, mut refused) = (0usize, 0usize);
    for tenth in 0..STEP.as_millis() / 100 {
        for _ in 0..rate / 10 {
            let payload = serde_json::json!({ "id": format!("{id}-{step}-{n}") }).to_string();
            let q = &queues[n % queues.len()];
            if q.put(&encode(&payload, ENCODING), Duration::ZERO, Ttl::Default)
                .await
                .is_err()
            {
                refused += 1;
            }
            n += 1;
        }
        tokio::time::sleep_until(t0 + Duration::from_millis(100 * (tenth as u64 + 1))).await;
    }
    refused
}

#[tokio::test(start_paused = true)]
#[ignore = "a report (about a minute of CPU): --ignored --nocapture prints it"]
async fn a_fleet_of_100_replicas_and_50_functions_against_azures_targets() {
    let (replicas, functions) = (
        env_or("AQW_COST_REPLICAS", 100),
        env_or("AQW_COST_FUNCTIONS", 50),
    );
    let steps: Vec<usize> = std::env::var("AQW_COST_STEPS")
        .unwrap_or_else(|_| "500,1000,2000,3000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let storage = MemoryStorage::new();
    let id = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let queues: Vec<Arc<dyn QueueStore>> = (0..functions)
        .map(|f| aqw_core::storage::Storage::queue(&storage, &format!("q{f}x{id}")))
        .collect();
    for q in &queues {
        q.create_if_missing().await.expect("a queue");
    }
    let fleet: Vec<Running> = (0..replicas)
        .map(|_| replica(&storage, functions, &id))
        .collect();
    // Past the start: polls backed off, heartbeats and control reads at
    // their steady pace.
    tokio::time::sleep(Duration::from_secs(300)).await;
    let idle = Duration::from_secs(120);
    storage.set_azure_limits(Some(AzureLimits::default()));
    storage.reset_request_counts();
    tokio::time::sleep(idle).await;
    println!("{replicas} replicas x {functions} functions, Azure's targets on:");
    report("idle", &storage, idle);
    for (i, rate) in steps.iter().enumerate() {
        // A step's first half fills the pipeline; its second is measured.
        storage.set_azure_limits(Some(AzureLimits::default()));
        offer(&queues, *rate, &id, 2 * i).await;
        storage.set_azure_limits(Some(AzureLimits::default()));
        storage.reset_request_counts();
        let puts_refused = offer(&queues, *rate, &id, 2 * i + 1).await;
        report(
            &format!("{rate} jobs/s offered ({puts_refused} puts refused)"),
            &storage,
            STEP,
        );
        // Drain the backlog before the next step.
        storage.set_azure_limits(None);
        tokio::time::sleep(Duration::from_secs(60)).await;
    }
    let left: u64 = futures::future::join_all(queues.iter().map(|q| q.approximate_count()))
        .await
        .into_iter()
        .map(|c| c.unwrap_or(0))
        .sum();
    println!("messages left after the last drain: {left}");
    for r in fleet {
        r.stop().await;
    }
}
