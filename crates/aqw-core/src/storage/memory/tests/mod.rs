//! Unit tests of the memory store: its clock, hooks and the contract suite
//! here; the queue and table semantics in [`queue`] and [`table`].

mod limits;
mod queue;
mod table;

use super::*;
use crate::storage::{Entity, TableOp, Ttl};
use serde_json::{json, Value};
use time::macros::datetime;
use tokio::time::advance;

const DAY: Duration = Duration::from_secs(24 * 3600);

fn entity(v: Value) -> Entity {
    v.as_object().cloned().unwrap_or_default()
}

fn is_http(e: &StorageError, want: u16, want_code: &str) -> bool {
    matches!(e, StorageError::Http { status, code } if *status == want && code == want_code)
}

async fn queue(s: &MemoryStorage) -> Arc<dyn QueueStore> {
    let q = s.queue("jobs");
    q.create_if_missing().await.unwrap();
    q
}

async fn table(s: &MemoryStorage) -> Arc<dyn TableStore> {
    let t = s.table("keys");
    t.create_if_missing().await.unwrap();
    t
}

#[tokio::test(start_paused = true)]
async fn the_clock_runs_on_tokio_time_and_clones_share_the_account() {
    let start = datetime!(2030-01-01 00:00 UTC);
    let s = MemoryStorage::starting_at(start);
    assert_eq!(s.now(), start);
    advance(30 * DAY).await;
    assert_eq!(s.now(), start + 30 * DAY);
    let replica = s.clone();
    replica.queue("jobs").create_if_missing().await.unwrap();
    let put = replica
        .queue("jobs")
        .put("hi", Duration::ZERO, Ttl::Never)
        .await
        .unwrap();
    assert_eq!(put.insertion_time, start + 30 * DAY);
    let got = s
        .queue("jobs")
        .receive(1, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(got[0].id, put.id);
    assert_eq!(s.queue_names(), vec!["jobs".to_string()]);
}

#[tokio::test(start_paused = true)]
async fn an_outage_fails_every_call_and_requests_are_counted() {
    let s = MemoryStorage::new();
    let q = queue(&s).await;
    let t = table(&s).await;
    s.reset_request_counts();
    s.set_unavailable(true);
    assert!(s.is_unavailable());
    let errs = [
        q.put("x", Duration::ZERO, Ttl::Never).await.err(),
        q.receive(1, Duration::from_secs(1)).await.err(),
        t.insert("p", "r", &Entity::new()).await.err(),
        t.get("p", "r").await.err(),
        s.queue("other").create_if_missing().await.err(),
    ];
    for e in errs {
        assert!(matches!(e, Some(StorageError::Transport(_))), "{e:?}");
    }
    s.set_unavailable(false);
    assert_eq!(q.approximate_count().await.unwrap(), 0, "nothing happened");
    assert!(t.get("p", "r").await.unwrap().is_none());
    let rows: Vec<TableOp> = (0..100)
        .map(|i| TableOp::Insert {
            row_key: format!("{i:03}"),
            entity: Entity::new(),
        })
        .collect();
    for b in 0..11 {
        t.transaction(&format!("p{b:02}"), rows.clone())
            .await
            .unwrap();
    }
    assert_eq!(t.query_rows(None).await.unwrap().len(), 1100);
    let counts = s.request_counts();
    let n = |op: &str| counts.get(op).copied().unwrap_or(0);
    assert_eq!(n("queue.put"), 1);
    assert_eq!(n("queue.receive"), 1);
    assert_eq!(n("queue.create"), 1);
    assert_eq!(n("queue.metadata"), 1);
    assert_eq!(n("table.insert"), 1);
    assert_eq!(n("table.get"), 2);
    assert_eq!(n("table.batch"), 11);
    assert_eq!(n("table.query"), 2, "1,100 rows are two pages");
    assert_eq!(s.total_requests(), 20);
}

#[tokio::test(start_paused = true)]
async fn latency_is_tokio_time() {
    let s = MemoryStorage::new();
    s.set_latency(Duration::from_millis(20));
    let started = tokio::time::Instant::now();
    let q = queue(&s).await;
    q.put("x", Duration::ZERO, Ttl::Never).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(40));
    let got = q.receive(1, Duration::from_secs(30)).await.unwrap();
    assert_eq!(
        got[0].insertion_time,
        wire(s.now() - Duration::from_millis(20))
    );
}

#[test]
fn the_store_and_the_suite_are_send() {
    fn send<T: Send + Sync>(_: &T) {}
    let s = MemoryStorage::new();
    send(&s);
    let run = crate::contract::run_all(&s);
    fn send_future<F: std::future::Future + Send>(_: &F) {}
    send_future(&run);
}

#[tokio::test(start_paused = true)]
async fn the_contract_suite_passes_on_the_memory_store() {
    let s = MemoryStorage::new();
    crate::contract::run_all(&s).await.unwrap();
    assert!(
        s.queue_names().is_empty() && s.table_names().is_empty(),
        "cleaned up"
    );
    // And with Azurite's answer to a stale pop receipt.
    s.set_stale_receipt(StaleReceipt::PopReceiptMismatch);
    crate::contract::run_all(&s).await.unwrap();
}
