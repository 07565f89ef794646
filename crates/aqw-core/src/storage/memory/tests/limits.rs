//! Azure's scalability targets in the store ([`AzureLimits`]).

use super::*;

/// Small targets, so a test meets them in a few requests.
fn small(queue: u64, partition: u64, account: u64) -> AzureLimits {
    AzureLimits {
        queue_messages_per_sec: queue,
        partition_entities_per_sec: partition,
        account_requests_per_sec: account,
        whole_seconds: true,
    }
}

fn busy(e: &StorageError) -> bool {
    is_http(e, 503, "ServerBusy")
}

#[tokio::test(start_paused = true)]
async fn a_queue_past_its_target_is_server_busy_until_the_next_second() {
    let s = MemoryStorage::starting_at(datetime!(2030-01-01 00:00:00.5 UTC));
    let q = queue(&s).await;
    s.set_azure_limits(Some(small(3, 100, 100)));
    for _ in 0..3 {
        q.put("m", Duration::ZERO, Ttl::Default).await.unwrap();
    }
    let e = q.put("m", Duration::ZERO, Ttl::Default).await.unwrap_err();
    assert!(busy(&e), "{e:?}");
    assert_eq!(q.approximate_count().await.map_err(|e| busy(&e)), Err(true));
    // Another queue and a table are not this queue.
    let other = s.queue("other");
    other.create_if_missing().await.unwrap();
    other.put("m", Duration::ZERO, Ttl::Default).await.unwrap();
    advance(Duration::from_millis(500)).await;
    // A receive of three is served, and counts three.
    assert_eq!(
        q.receive(32, Duration::from_secs(30)).await.unwrap().len(),
        3
    );
    let e = q.put("m", Duration::ZERO, Ttl::Default).await.unwrap_err();
    assert!(busy(&e), "{e:?}");
    assert_eq!(s.server_busy().get("queue jobs"), Some(&3));
    assert_eq!(s.load_peaks().get("queue jobs"), Some(&3));
    assert_eq!(
        s.load_peaks().get("account"),
        Some(&5),
        "a refusal is not served"
    );
}

#[tokio::test(start_paused = true)]
async fn a_partition_and_the_account_have_their_own_targets() {
    let s = MemoryStorage::starting_at(datetime!(2030-01-01 00:00 UTC));
    let t = table(&s).await;
    s.set_azure_limits(Some(small(100, 4, 5)));
    let row = entity(json!({ "v": 1 }));
    // A batch counts its operations against its partition.
    let ops = (0..3)
        .map(|i| TableOp::Insert {
            row_key: format!("r{i}"),
            entity: row.clone(),
        })
        .collect();
    t.transaction("a", ops).await.unwrap();
    t.get("a", "r0").await.unwrap();
    let e = t.get("a", "r1").await.unwrap_err();
    assert!(busy(&e), "{e:?}");
    // Partition b is not a; the account serves five (a refusal is not one).
    t.insert("b", "r0", &row).await.unwrap();
    t.get("b", "r0").await.unwrap();
    t.get("b", "r0").await.unwrap();
    let e = t.get("c", "r0").await.unwrap_err();
    assert!(busy(&e), "{e:?}");
    let refused = s.server_busy();
    assert_eq!(refused.get("partition keys/a"), Some(&1), "{refused:?}");
    assert_eq!(refused.get("account"), Some(&1), "{refused:?}");
    advance(Duration::from_secs(1)).await;
    assert!(t.get("a", "r1").await.unwrap().is_some());
    // Off again: nothing is refused.
    s.set_azure_limits(None);
    for _ in 0..20 {
        t.get("a", "r1").await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn whole_second_times_end_a_visibility_early_within_its_second() {
    let s = MemoryStorage::starting_at(datetime!(2030-01-01 00:00:00.9 UTC));
    let q = queue(&s).await;
    s.set_azure_limits(Some(AzureLimits::default()));
    q.put("m", Duration::ZERO, Ttl::Default).await.unwrap();
    let got = q.receive(1, Duration::from_secs(1)).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].next_visible, datetime!(2030-01-01 00:00:01 UTC));
    // Set at .9 s for one second: visible again at 1.0 s, 0.1 s later.
    advance(Duration::from_millis(150)).await;
    assert_eq!(q.receive(1, Duration::from_secs(1)).await.unwrap().len(), 1);
}
