//! Benchmark helper: fill an app's record table with N open poison records
//! (rows only, no `<queue>-poison` copies, so Azurite's queue stays shallow),
//! in the exact format aqw writes (`PoisonRecord::open(..).to_entity()`),
//! 100 to an entity-group transaction. Used by `scripts/bench.sh` scenario
//! (j), the dashboard's list at 10,000 open records.
//!
//! ```text
//! cargo run --release --example seed_poison -- --app DIR --count N
//! ```
//!
//! Every fourth record (`--not-found-every N`: every Nth) fails with a 404,
//! the others with a 503 (two error groups, numbers masked as in the
//! alert); each payload is ~1 KiB, so a view that read every payload would
//! show in the figures. `--with-copies` also puts each record's envelope on
//! `<queue>-poison` first and names it on the record, as the worker leaves
//! them (scenario (m): a durable group discard at a 10,000-deep poison queue).

use anyhow::Context;
use aqw_core::message::{ErrorInfo, ErrorKind, MessageEncoding};
use aqw_core::poison::{PoisonEnvelope, PoisonRecord};
use aqw_core::storage::{TableOp, MAX_BATCH_OPERATIONS};
use clap::Parser;
use futures::StreamExt as _;
use std::path::PathBuf;

#[derive(Parser)]
struct Args {
    /// The app folder (its first function's queue and record table are filled).
    #[arg(long)]
    app: PathBuf,
    /// How many open records to insert.
    #[arg(long)]
    count: usize,
    /// Every Nth record is a 404 (the others 503s).
    #[arg(long, default_value_t = 4)]
    not_found_every: usize,
    /// Also put each record's copy on `<queue>-poison`.
    #[arg(long)]
    with_copies: bool,
}

fn record(args: &Args, queue: &str, function: &str, i: usize) -> PoisonEnvelope {
    let error = if i.is_multiple_of(args.not_found_every.max(1)) {
        format!("HTTP 404 order {i} not found")
    } else {
        format!("HTTP 503 ledger shard {} read-only", i % 7)
    };
    let at = format!(
        "2026-12-03T{:02}:{:02}:{:02}Z",
        (i / 3600) % 24,
        (i / 60) % 60,
        i % 60
    );
    let payload = format!(r#"{{"orderId":"o-{i:06}","note":"{}"}}"#, "x".repeat(1000));
    PoisonEnvelope {
        aqw: "poison/1".into(),
        queue: queue.into(),
        function: function.into(),
        message_id: format!("seed-{i:06}"),
        inserted_at: at.clone(),
        dequeue_count: 5,
        first_attempt_at: at.clone(),
        poisoned_at: at,
        key: aqw_core::idempotency::IdempotencyKey::new(format!("order:o-{i:06}")).ok(),
        error: ErrorInfo {
            kind: ErrorKind::Retryable,
            message: error,
        },
        message: Some(payload),
        record: None,
        encoding: MessageEncoding::None,
    }
}

/// The envelope's copy on the poison queue, when asked for: its id and the
/// pop receipt the put returned (kept on the record, as the worker keeps it).
async fn put_copy(
    poison: &dyn aqw_core::storage::QueueStore,
    env: &PoisonEnvelope,
    table: &str,
    with_copies: bool,
) -> anyhow::Result<Option<aqw_core::storage::PutReceipt>> {
    if !with_copies {
        return Ok(None);
    }
    let text = env.to_queue_text(table);
    let put = poison.put(
        &text,
        std::time::Duration::ZERO,
        aqw_core::storage::Ttl::Default,
    );
    Ok(Some(put.await?))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let app = aqw::config::load(&args.app).map_err(|e| anyhow::anyhow!("configuration: {e}"))?;
    let f = app.functions.first().context("the app has no function")?;
    let storage = aqw_azure::open(&f.connection)?;
    let table = storage.table(&app.poison_table);
    table.create_if_missing().await?;
    let ids: Vec<usize> = (0..args.count).collect();
    let poison = storage.queue(&aqw_core::poison::poison_queue_name(&f.queue));
    if args.with_copies {
        poison.create_if_missing().await?;
    }
    for chunk in ids.chunks(MAX_BATCH_OPERATIONS) {
        let envs: Vec<PoisonEnvelope> = chunk
            .iter()
            .map(|&i| record(&args, &f.queue, &f.name, i))
            .collect();
        let copies = futures::stream::iter(
            envs.iter()
                .map(|e| put_copy(poison.as_ref(), e, &app.poison_table, args.with_copies)),
        )
        .buffered(16)
        .collect::<Vec<_>>()
        .await;
        let mut ops = Vec::with_capacity(envs.len());
        for (env, copy) in envs.into_iter().zip(copies) {
            let copy = copy?;
            let mut r = PoisonRecord::open(env, "aqw", copy.as_ref().map(|c| c.id.clone()));
            r.poison_pop_receipt = copy.map(|c| c.pop_receipt);
            ops.push(TableOp::Insert {
                row_key: r.message_id.clone(),
                entity: r.to_entity(),
            });
        }
        table.transaction(&f.queue, ops).await?;
    }
    println!("{}", serde_json::json!({"inserted": args.count}));
    Ok(())
}
