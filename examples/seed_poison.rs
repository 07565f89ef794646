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
//! Every fourth record fails with a 404, the others with a 503 (two error
//! groups, numbers masked as in the alert); each payload is ~1 KiB, so a
//! view that read every payload would show in the figures.

use anyhow::Context;
use aqw::message::{ErrorInfo, ErrorKind, MessageEncoding};
use aqw::poison::{PoisonEnvelope, PoisonRecord};
use aqw::storage::{Storage, TableOp, MAX_BATCH_OPERATIONS};
use clap::Parser;
use std::path::PathBuf;

#[derive(Parser)]
struct Args {
    /// The app folder (its first function's queue and record table are filled).
    #[arg(long)]
    app: PathBuf,
    /// How many open records to insert.
    #[arg(long)]
    count: usize,
}

fn record(queue: &str, function: &str, i: usize) -> PoisonRecord {
    let error = if i.is_multiple_of(4) {
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
    PoisonRecord::open(
        PoisonEnvelope {
            aqw: "poison/1".into(),
            queue: queue.into(),
            function: function.into(),
            message_id: format!("seed-{i:06}"),
            inserted_at: at.clone(),
            dequeue_count: 5,
            first_attempt_at: at.clone(),
            poisoned_at: at,
            key: aqw::idempotency::IdempotencyKey::new(format!("order:o-{i:06}")).ok(),
            error: ErrorInfo {
                kind: ErrorKind::Retryable,
                message: error,
            },
            message: Some(payload),
            record: None,
            encoding: MessageEncoding::None,
        },
        "aqw",
        None,
    )
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let app = aqw::config::load(&args.app).map_err(|e| anyhow::anyhow!("configuration: {e}"))?;
    let f = app.functions.first().context("the app has no function")?;
    let storage = aqw::storage::connect(&f.connection)?;
    let table = storage.table(&app.poison_table);
    table.create_if_missing().await?;
    let ids: Vec<usize> = (0..args.count).collect();
    for chunk in ids.chunks(MAX_BATCH_OPERATIONS) {
        let ops = chunk
            .iter()
            .map(|&i| {
                let r = record(&f.queue, &f.name, i);
                TableOp::Insert {
                    row_key: r.message_id.clone(),
                    entity: r.to_entity(),
                }
            })
            .collect();
        table.transaction(&f.queue, ops).await?;
    }
    println!("{}", serde_json::json!({"inserted": args.count}));
    Ok(())
}
