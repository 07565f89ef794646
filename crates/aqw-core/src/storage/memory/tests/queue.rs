//! The queue semantics of the memory store.

use super::*;
use crate::storage::PeekedMessage;

#[tokio::test(start_paused = true)]
async fn a_lease_hides_the_message_and_moves_the_pop_receipt() {
    let s = MemoryStorage::new();
    let q = queue(&s).await;
    let put = q.put("a", Duration::ZERO, Ttl::Never).await.unwrap();
    let got = q.receive(32, Duration::from_secs(30)).await.unwrap();
    assert_eq!(got.len(), 1);
    let m = &got[0];
    assert_eq!((m.text.as_str(), m.dequeue_count), ("a", 1));
    assert_ne!(m.pop_receipt, put.pop_receipt);
    assert_eq!(m.next_visible, wire(s.now() + Duration::from_secs(30)));
    assert!(q
        .receive(32, Duration::from_secs(30))
        .await
        .unwrap()
        .is_empty());
    assert!(q.peek(32).await.unwrap().is_empty());
    assert_eq!(q.approximate_count().await.unwrap(), 1);

    // The put's receipt went stale when the message was received.
    let stale = q.delete(&m.id, &put.pop_receipt).await;
    assert!(matches!(stale, Err(StorageError::NotFound)), "{stale:?}");
    let r2 = q
        .update_visibility(&m.id, &m.pop_receipt, "ignored", Duration::from_secs(60))
        .await
        .unwrap();
    assert_ne!(r2, m.pop_receipt);
    // Updating replaced the receipt: the old one neither deletes nor updates.
    for stale in [
        q.delete(&m.id, &m.pop_receipt).await.err(),
        q.update_visibility(&m.id, &m.pop_receipt, "", Duration::ZERO)
            .await
            .err(),
    ] {
        assert!(matches!(stale, Some(StorageError::NotFound)), "{stale:?}");
    }
    // Azurite's answer, when asked for.
    s.set_stale_receipt(StaleReceipt::PopReceiptMismatch);
    let stale = q.delete(&m.id, &m.pop_receipt).await.unwrap_err();
    assert!(is_http(&stale, 400, "PopReceiptMismatch"), "{stale:?}");

    advance(Duration::from_secs(59)).await;
    assert!(q
        .receive(1, Duration::from_secs(30))
        .await
        .unwrap()
        .is_empty());
    advance(Duration::from_secs(1)).await;
    // Visible again: the receipt still deletes until someone receives it.
    assert_eq!(q.peek(1).await.unwrap()[0].dequeue_count, 1);
    q.delete(&m.id, &r2).await.unwrap();
    let gone = q.delete(&m.id, &r2).await;
    assert!(matches!(gone, Err(StorageError::NotFound)), "{gone:?}");
    assert_eq!(q.approximate_count().await.unwrap(), 0);
}

#[tokio::test(start_paused = true)]
async fn dequeue_count_grows_with_every_receive_and_text_is_kept() {
    let s = MemoryStorage::new();
    let q = queue(&s).await;
    q.put("payload", Duration::ZERO, Ttl::Never).await.unwrap();
    for n in 1..=5 {
        let got = q.receive(1, Duration::from_secs(10)).await.unwrap();
        assert_eq!(got[0].dequeue_count, n);
        assert_eq!(got[0].text, "payload");
        // update_visibility does not rewrite the text (the adapter sends none).
        q.update_visibility(
            &got[0].id,
            &got[0].pop_receipt,
            "other",
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        advance(Duration::from_secs(5)).await;
    }
    assert_eq!(q.peek(1).await.unwrap()[0].dequeue_count, 5);
}

#[tokio::test(start_paused = true)]
async fn messages_come_in_the_order_they_became_visible() {
    let s = MemoryStorage::new();
    let q = queue(&s).await;
    q.put("later", Duration::from_secs(20), Ttl::Never)
        .await
        .unwrap();
    for t in ["a", "b", "c"] {
        q.put(t, Duration::ZERO, Ttl::Never).await.unwrap();
    }
    let a = q.receive(1, Duration::from_secs(10)).await.unwrap();
    assert_eq!(a[0].text, "a");
    let texts = |v: Vec<PeekedMessage>| v.into_iter().map(|m| m.text).collect::<Vec<_>>();
    assert_eq!(texts(q.peek(32).await.unwrap()), ["b", "c"]);
    advance(Duration::from_secs(10)).await;
    assert_eq!(texts(q.peek(32).await.unwrap()), ["b", "c", "a"]);
    advance(Duration::from_secs(10)).await;
    assert_eq!(texts(q.peek(32).await.unwrap()), ["b", "c", "a", "later"]);
    // max is clamped to 1..=32, as the adapter does.
    assert_eq!(q.receive(0, Duration::from_secs(1)).await.unwrap().len(), 1);
    for i in 0..40 {
        q.put(&format!("m{i}"), Duration::ZERO, Ttl::Never)
            .await
            .unwrap();
    }
    assert_eq!(
        q.receive(u8::MAX, Duration::from_secs(1))
            .await
            .unwrap()
            .len(),
        32
    );
    assert_eq!(q.peek(u8::MAX).await.unwrap().len(), 11);
}

#[tokio::test(start_paused = true)]
async fn messages_expire_after_their_ttl_across_days() {
    let s = MemoryStorage::new();
    let q = queue(&s).await;
    let default = q
        .put("default", Duration::ZERO, Ttl::Default)
        .await
        .unwrap();
    q.put("never", Duration::ZERO, Ttl::Never).await.unwrap();
    q.put("one-day", Duration::ZERO, Ttl::After(DAY))
        .await
        .unwrap();
    // A TTL past 7 days is sent as 7 days (the adapter's clamp_secs).
    q.put("ten-days", Duration::ZERO, Ttl::After(10 * DAY))
        .await
        .unwrap();
    let got = q.receive(32, Duration::from_secs(1)).await.unwrap();
    let expiry = |t: &str| got.iter().find(|m| m.text == t).unwrap().expiration_time;
    let t0 = default.insertion_time;
    assert_eq!(expiry("default"), t0 + 7 * DAY);
    assert_eq!(expiry("never"), datetime!(9999-12-31 23:59:59 UTC));
    assert_eq!(expiry("one-day"), t0 + DAY);
    assert_eq!(expiry("ten-days"), t0 + 7 * DAY);
    assert_eq!(q.approximate_count().await.unwrap(), 4);

    advance(DAY).await;
    assert_eq!(q.approximate_count().await.unwrap(), 3);
    let one_day = got.iter().find(|m| m.text == "one-day").unwrap();
    let gone = q.delete(&one_day.id, &one_day.pop_receipt).await;
    assert!(matches!(gone, Err(StorageError::NotFound)), "{gone:?}");
    advance(6 * DAY).await;
    let left: Vec<String> = q
        .peek(32)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.text)
        .collect();
    assert_eq!(left, ["never"]);
    advance(365 * DAY).await;
    assert_eq!(
        q.receive(32, Duration::from_secs(1)).await.unwrap().len(),
        1
    );
    assert_eq!(q.approximate_count().await.unwrap(), 1);
}

#[tokio::test(start_paused = true)]
async fn message_text_holds_64_kib_of_utf8() {
    let s = MemoryStorage::new();
    let q = queue(&s).await;
    q.put(&"x".repeat(65_536), Duration::ZERO, Ttl::Never)
        .await
        .unwrap();
    q.put(&"é".repeat(32_768), Duration::ZERO, Ttl::Never)
        .await
        .unwrap();
    for text in ["x".repeat(65_537), "é".repeat(32_769)] {
        let e = q.put(&text, Duration::ZERO, Ttl::Never).await.unwrap_err();
        assert!(is_http(&e, 413, "RequestBodyTooLarge"), "{e:?}");
    }
    // The size is checked before the queue is looked up, as Azurite does.
    let e = s
        .queue("missing")
        .put(&"x".repeat(70_000), Duration::ZERO, Ttl::Never)
        .await
        .unwrap_err();
    assert!(is_http(&e, 413, "RequestBodyTooLarge"), "{e:?}");
    assert_eq!(q.approximate_count().await.unwrap(), 2);
}

#[tokio::test(start_paused = true)]
async fn visibility_and_ttl_are_checked_as_the_service_does() {
    let s = MemoryStorage::new();
    let q = queue(&s).await;
    let ten = Ttl::After(Duration::from_secs(10));
    for (vis, ttl) in [
        (Duration::from_secs(10), ten),
        (Duration::from_secs(11), ten),
        (Duration::from_millis(9_001), ten),
        (Duration::ZERO, Ttl::After(Duration::ZERO)),
    ] {
        let e = q.put("x", vis, ttl).await.unwrap_err();
        assert!(
            is_http(&e, 400, "InvalidQueryParameterValue"),
            "{vis:?} {ttl:?}: {e:?}"
        );
    }
    q.put("x", Duration::from_secs(9), ten).await.unwrap();
    // A week-long delay with the default TTL is accepted (never seen).
    q.put("y", MAX_VISIBILITY_TIMEOUT, Ttl::Default)
        .await
        .unwrap();
    // A sub-second TTL is one second.
    q.put("z", Duration::ZERO, Ttl::After(Duration::from_millis(1)))
        .await
        .unwrap();
    let e = q.receive(1, Duration::ZERO).await.unwrap_err();
    assert!(is_http(&e, 400, "OutOfRangeQueryParameterValue"), "{e:?}");
    // A visibility past 7 days is 7 days.
    q.put("w", Duration::ZERO, Ttl::Never).await.unwrap();
    let got = q.receive(32, 30 * DAY).await.unwrap();
    assert_eq!(got.len(), 2, "z and w");
    assert_eq!(got[1].next_visible, wire(s.now() + 7 * DAY));
}

#[tokio::test(start_paused = true)]
async fn missing_queues_and_bad_names() {
    let s = MemoryStorage::new();
    let q = s.queue("nothere");
    let id = "00000000-0000-0000-0000-000000000000";
    let errs = [
        q.receive(1, Duration::from_secs(1)).await.err(),
        q.peek(1).await.err(),
        q.put("x", Duration::ZERO, Ttl::Never).await.err(),
        q.update_visibility(id, id, "", Duration::ZERO).await.err(),
        q.delete(id, id).await.err(),
        q.approximate_count().await.err(),
    ];
    for e in errs {
        assert!(matches!(e, Some(StorageError::NotFound)), "{e:?}");
    }
    q.delete_queue().await.unwrap();
    q.create_if_missing().await.unwrap();
    q.create_if_missing().await.unwrap();
    q.put("x", Duration::ZERO, Ttl::Never).await.unwrap();
    q.delete_queue().await.unwrap();
    q.create_if_missing().await.unwrap();
    assert_eq!(
        q.approximate_count().await.unwrap(),
        0,
        "a new queue is empty"
    );
    for (name, code) in [
        ("ab", "OutOfRangeInput"),
        (&*"a".repeat(64), "OutOfRangeInput"),
        ("Jobs", "InvalidResourceName"),
        ("-jobs", "InvalidResourceName"),
        ("jobs-", "InvalidResourceName"),
        ("jo--bs", "InvalidResourceName"),
        ("jo_bs", "InvalidResourceName"),
    ] {
        let e = s.queue(name).create_if_missing().await.unwrap_err();
        assert!(is_http(&e, 400, code), "{name}: {e:?}");
    }
}
