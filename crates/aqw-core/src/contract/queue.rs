//! The queue checks of the contract suite.

use super::{ensure, fails, not_found, ok, random_queue_name, status, CheckResult};
use crate::storage::{QueueStore, ReceivedMessage, Storage, StorageError, Ttl};
use std::time::Duration;
use time::OffsetDateTime;

/// A pop receipt that no longer holds the lease: Azure's 404 or Azurite's 400.
fn stale_receipt(e: &StorageError) -> bool {
    matches!(e, StorageError::NotFound)
        || matches!(e, StorageError::Http { status: 400, code } if code == "PopReceiptMismatch")
}

const STALE: &str = "NotFound or Http 400 PopReceiptMismatch";

/// The body's result, after removing the queue; a failed removal fails a
/// check that passed.
async fn with_queue_removed(q: &dyn QueueStore, result: CheckResult) -> CheckResult {
    let cleanup = q.delete_queue().await;
    result?;
    ok("delete_queue (cleanup)", cleanup)
}

/// A new, created queue.
async fn new_queue(storage: &dyn Storage) -> Result<std::sync::Arc<dyn QueueStore>, String> {
    let q = storage.queue(&random_queue_name());
    ok("create_if_missing", q.create_if_missing().await)?;
    ok("create_if_missing again", q.create_if_missing().await)?;
    Ok(q)
}

const LEASE: Duration = Duration::from_secs(30);

/// Receive leases a message (invisible, dequeue count up, a fresh pop
/// receipt); peek and the count change nothing; updating the visibility
/// replaces the receipt; a stale receipt neither deletes nor updates; a
/// deleted message is `NotFound`; a put's receipt deletes until a receive.
pub async fn queue_receive_and_pop_receipts(storage: &dyn Storage) -> CheckResult {
    let q = new_queue(storage).await?;
    let result = receive_and_pop_receipts(&*q).await;
    with_queue_removed(&*q, result).await
}

async fn receive_and_pop_receipts(q: &dyn QueueStore) -> CheckResult {
    peek_changes_nothing(q).await?;
    let got = receive_leases(q).await?;
    let a = &got[0];
    let a2 = update_replaces_the_receipt(q, a).await?;
    deleted_is_gone(q, a, &a2).await
}

/// Two messages put: counted, and peeked twice in insertion order without
/// being dequeued.
async fn peek_changes_nothing(q: &dyn QueueStore) -> CheckResult {
    ok(
        "put a",
        q.put("a <&> wörld", Duration::ZERO, Ttl::Never).await,
    )?;
    ok(
        "put b",
        q.put("b", Duration::ZERO, Ttl::After(Duration::from_secs(600)))
            .await,
    )?;
    ensure!(
        ok("count", q.approximate_count().await)? == 2,
        "two messages counted"
    );
    for _ in 0..2 {
        let peeked = ok("peek", q.peek(32).await)?;
        let texts: Vec<&str> = peeked.iter().map(|m| m.text.as_str()).collect();
        ensure!(
            texts == ["a <&> wörld", "b"],
            "peek in insertion order: {texts:?}"
        );
        ensure!(
            peeked.iter().all(|m| m.dequeue_count == 0),
            "peek does not dequeue: {peeked:?}"
        );
    }
    Ok(())
}

/// Both messages received, one at a time: leased (hidden from receive and
/// peek, still counted). The first receive: one message, `a`.
async fn receive_leases(q: &dyn QueueStore) -> Result<Vec<ReceivedMessage>, String> {
    let got = ok("receive", q.receive(1, LEASE).await)?;
    ensure!(got.len() == 1, "receive(1) gives one message: {got:?}");
    let a = &got[0];
    ensure!(
        a.text == "a <&> wörld" && a.dequeue_count == 1,
        "first receive: {a:?}"
    );
    let lease = a.next_visible - a.insertion_time;
    ensure!(
        lease >= time::Duration::seconds(29) && lease <= time::Duration::seconds(90),
        "next_visible about 30 s after insertion: {a:?}"
    );
    let rest = ok("receive rest", q.receive(32, LEASE).await)?;
    ensure!(
        rest.len() == 1 && rest[0].text == "b",
        "only b is visible: {rest:?}"
    );
    ensure!(
        ok("peek", q.peek(32).await)?.is_empty(),
        "both are leased: peek sees none"
    );
    ensure!(
        ok("count", q.approximate_count().await)? == 2,
        "leased messages still count"
    );
    Ok(got)
}

/// Updating `a`'s visibility to zero replaces its receipt (the old one is
/// stale) and makes it visible; receiving it again gives a fresh receipt,
/// which makes the update's stale too. The second receive of `a`.
async fn update_replaces_the_receipt(
    q: &dyn QueueStore,
    a: &ReceivedMessage,
) -> Result<ReceivedMessage, String> {
    let r2 = ok(
        "update_visibility",
        q.update_visibility(&a.id, &a.pop_receipt, &a.text, Duration::ZERO)
            .await,
    )?;
    ensure!(r2 != a.pop_receipt, "update returns a new receipt");
    fails(
        "delete with the replaced receipt",
        q.delete(&a.id, &a.pop_receipt).await,
        STALE,
        stale_receipt,
    )?;
    fails(
        "update with the replaced receipt",
        q.update_visibility(&a.id, &a.pop_receipt, &a.text, LEASE)
            .await,
        STALE,
        stale_receipt,
    )?;
    let again = ok("receive again", q.receive(32, LEASE).await)?;
    ensure!(
        again.len() == 1 && again[0].id == a.id,
        "visible again after update(0): {again:?}"
    );
    let a2 = &again[0];
    ensure!(
        a2.dequeue_count == 2 && a2.text == a.text,
        "second receive: {a2:?}"
    );
    ensure!(a2.pop_receipt != r2, "a receive gives a fresh receipt");
    fails(
        "delete with the receipt before the receive",
        q.delete(&a.id, &r2).await,
        STALE,
        stale_receipt,
    )?;
    Ok(a2.clone())
}

/// `a`, deleted with `a2`'s receipt, is `NotFound` to delete and update; a
/// put's receipt deletes its message.
async fn deleted_is_gone(
    q: &dyn QueueStore,
    a: &ReceivedMessage,
    a2: &ReceivedMessage,
) -> CheckResult {
    ok("delete", q.delete(&a.id, &a2.pop_receipt).await)?;
    fails(
        "delete again",
        q.delete(&a.id, &a2.pop_receipt).await,
        "NotFound",
        not_found,
    )?;
    fails(
        "update a deleted message",
        q.update_visibility(&a.id, &a2.pop_receipt, &a.text, LEASE)
            .await,
        "NotFound",
        not_found,
    )?;
    ensure!(
        ok("count", q.approximate_count().await)? == 1,
        "one message left"
    );

    let c = ok("put c", q.put("c", Duration::ZERO, Ttl::Never).await)?;
    ok(
        "delete with the put's receipt",
        q.delete(&c.id, &c.pop_receipt).await,
    )?;
    ensure!(ok("count", q.approximate_count().await)? == 1, "c is gone");
    Ok(())
}

/// A lease lapses after its visibility timeout: the message comes back with
/// its dequeue count up and a new receipt; the old receipt is stale. A
/// receipt whose lease lapsed still deletes while nobody received again.
pub async fn queue_visibility_timeout_lapses(storage: &dyn Storage) -> CheckResult {
    let q = new_queue(storage).await?;
    let result = visibility_timeout_lapses(&*q).await;
    with_queue_removed(&*q, result).await
}

async fn visibility_timeout_lapses(q: &dyn QueueStore) -> CheckResult {
    ok("put x", q.put("x", Duration::ZERO, Ttl::Never).await)?;
    ok("put y", q.put("y", Duration::ZERO, Ttl::Never).await)?;
    let first = ok("receive", q.receive(32, Duration::from_secs(2)).await)?;
    ensure!(first.len() == 2, "both received: {first:?}");
    ensure!(
        ok("receive", q.receive(32, LEASE).await)?.is_empty(),
        "both leased"
    );
    tokio::time::sleep(Duration::from_secs(4)).await;
    let x = ok("receive after the lease", q.receive(1, LEASE).await)?;
    ensure!(x.len() == 1 && x[0].text == "x", "x is back first: {x:?}");
    ensure!(x[0].dequeue_count == 2, "dequeue count 2: {x:?}");
    ensure!(x[0].pop_receipt != first[0].pop_receipt, "a new receipt");
    fails(
        "delete x with the lapsed receipt",
        q.delete(&x[0].id, &first[0].pop_receipt).await,
        STALE,
        stale_receipt,
    )?;
    ok("delete x", q.delete(&x[0].id, &x[0].pop_receipt).await)?;
    // y's lease lapsed, but nobody received it again: its receipt holds.
    ok(
        "delete y with its lapsed receipt",
        q.delete(&first[1].id, &first[1].pop_receipt).await,
    )?;
    ensure!(
        ok("count", q.approximate_count().await)? == 0,
        "queue empty"
    );
    Ok(())
}

/// The 64 KiB limit (413), an initial visibility not below the TTL or a
/// zero TTL (400), a zero receive visibility (400), a delayed message
/// (counted, not visible), and `max` clamped to 1..=32.
pub async fn queue_put_limits(storage: &dyn Storage) -> CheckResult {
    let q = new_queue(storage).await?;
    let result = put_limits(&*q).await;
    with_queue_removed(&*q, result).await
}

async fn put_limits(q: &dyn QueueStore) -> CheckResult {
    size_limit(q).await?;
    ttl_and_visibility_limits(q).await?;
    max_is_clamped(q).await
}

/// 64 KiB of text is kept whole; one byte more is a 413.
async fn size_limit(q: &dyn QueueStore) -> CheckResult {
    let full = "x".repeat(64 * 1024);
    let put = ok("put 64 KiB", q.put(&full, Duration::ZERO, Ttl::Never).await)?;
    fails(
        "put 64 KiB + 1",
        q.put(&format!("{full}x"), Duration::ZERO, Ttl::Never).await,
        "Http 413 RequestBodyTooLarge",
        |e| matches!(e, StorageError::Http { status: 413, code } if code == "RequestBodyTooLarge"),
    )?;
    let got = ok("receive 64 KiB", q.receive(1, LEASE).await)?;
    ensure!(got.len() == 1 && got[0].text == full, "64 KiB kept whole");
    ok("delete", q.delete(&put.id, &got[0].pop_receipt).await)?;
    Ok(())
}

/// An initial visibility not below the TTL, a zero TTL and a zero receive
/// visibility are 400s; delayed messages count but are not visible.
async fn ttl_and_visibility_limits(q: &dyn QueueStore) -> CheckResult {
    let ten = Ttl::After(Duration::from_secs(10));
    fails(
        "visibility = TTL",
        q.put("v", Duration::from_secs(10), ten).await,
        "Http 400",
        status(400),
    )?;
    fails(
        "visibility > TTL",
        q.put("v", Duration::from_secs(11), ten).await,
        "Http 400",
        status(400),
    )?;
    fails(
        "TTL 0",
        q.put("v", Duration::ZERO, Ttl::After(Duration::ZERO)).await,
        "Http 400",
        status(400),
    )?;
    fails(
        "receive with visibility 0",
        q.receive(1, Duration::ZERO).await,
        "Http 400",
        status(400),
    )?;

    ok(
        "put delayed",
        q.put("delayed", Duration::from_secs(9), ten).await,
    )?;
    ok(
        "put later",
        q.put("later", Duration::from_secs(600), Ttl::Never).await,
    )?;
    ensure!(
        ok("peek", q.peek(32).await)?.is_empty(),
        "delayed messages are not visible"
    );
    ensure!(
        ok("count", q.approximate_count().await)? == 2,
        "delayed messages count"
    );
    Ok(())
}

/// `max` is clamped to 1..=32.
async fn max_is_clamped(q: &dyn QueueStore) -> CheckResult {
    for i in 0..34 {
        ok(
            "put",
            q.put(&format!("m{i}"), Duration::ZERO, Ttl::Never).await,
        )?;
    }
    ensure!(
        ok("receive(0)", q.receive(0, LEASE).await)?.len() == 1,
        "max 0 is 1"
    );
    ensure!(
        ok("receive(255)", q.receive(u8::MAX, LEASE).await)?.len() == 32,
        "max 255 is 32"
    );
    ensure!(
        ok("peek(255)", q.peek(u8::MAX).await)?.len() == 1,
        "one left visible"
    );
    Ok(())
}

/// A message whose TTL passed is gone from peek, receive and delete; the
/// expiration times of `Ttl::Default` (7 days), `Ttl::After` and
/// `Ttl::Never` (9999-12-31).
pub async fn queue_ttl_expiry(storage: &dyn Storage) -> CheckResult {
    let q = new_queue(storage).await?;
    let result = ttl_expiry(&*q).await;
    with_queue_removed(&*q, result).await
}

/// A peek tells when each message expires, as a receive does (the
/// ten-minute message of `ttl_expiry`).
fn peek_tells_expiry(peeked: &[crate::storage::PeekedMessage]) -> CheckResult {
    let ten = peeked.iter().find(|m| m.text == "ten");
    ensure!(
        ten.is_some_and(
            |m| (m.expiration_time - m.insertion_time - time::Duration::minutes(10)).abs()
                <= time::Duration::seconds(1)
        ),
        "peeked expiration time: {ten:?}"
    );
    Ok(())
}

async fn ttl_expiry(q: &dyn QueueStore) -> CheckResult {
    let short = ok(
        "put short",
        q.put("short", Duration::ZERO, Ttl::After(Duration::from_secs(1)))
            .await,
    )?;
    ok(
        "put never",
        q.put("never", Duration::ZERO, Ttl::Never).await,
    )?;
    ok(
        "put default",
        q.put("default", Duration::ZERO, Ttl::Default).await,
    )?;
    ok(
        "put ten minutes",
        q.put("ten", Duration::ZERO, Ttl::After(Duration::from_secs(600)))
            .await,
    )?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let peeked_messages = ok("peek", q.peek(32).await)?;
    let peeked: Vec<String> = peeked_messages.iter().map(|m| m.text.clone()).collect();
    ensure!(
        peeked == ["never", "default", "ten"],
        "short expired: {peeked:?}"
    );
    peek_tells_expiry(&peeked_messages)?;
    ensure!(
        ok("count", q.approximate_count().await)? == 3,
        "expired messages do not count"
    );
    let got = ok("receive", q.receive(32, LEASE).await)?;
    ensure!(got.len() == 3, "three left: {got:?}");
    let close = |a: OffsetDateTime, b: OffsetDateTime| (a - b).abs() <= time::Duration::seconds(1);
    for m in &got {
        let ok_expiry = match m.text.as_str() {
            "never" => m.expiration_time.year() == 9999,
            "default" => close(
                m.expiration_time,
                m.insertion_time + time::Duration::days(7),
            ),
            "ten" => close(
                m.expiration_time,
                m.insertion_time + time::Duration::minutes(10),
            ),
            _ => false,
        };
        ensure!(ok_expiry, "expiration time: {m:?}");
    }
    fails(
        "delete an expired message",
        q.delete(&short.id, &short.pop_receipt).await,
        "NotFound",
        not_found,
    )?;
    Ok(())
}

/// Every operation on a queue that does not exist (or no longer does) is
/// `NotFound`; deleting it is not an error.
pub async fn queue_missing(storage: &dyn Storage) -> CheckResult {
    let q = storage.queue(&random_queue_name());
    let result = missing_queue(&*q).await;
    with_queue_removed(&*q, result).await
}

async fn missing_queue(q: &dyn QueueStore) -> CheckResult {
    let id = uuid::Uuid::new_v4().to_string();
    fails("receive", q.receive(1, LEASE).await, "NotFound", not_found)?;
    fails("peek", q.peek(1).await, "NotFound", not_found)?;
    fails(
        "put",
        q.put("x", Duration::ZERO, Ttl::Never).await,
        "NotFound",
        not_found,
    )?;
    fails(
        "update",
        q.update_visibility(&id, &id, "x", LEASE).await,
        "NotFound",
        not_found,
    )?;
    fails("delete", q.delete(&id, &id).await, "NotFound", not_found)?;
    fails("count", q.approximate_count().await, "NotFound", not_found)?;
    ok("delete_queue of a missing queue", q.delete_queue().await)?;
    ok("create", q.create_if_missing().await)?;
    ok("put", q.put("x", Duration::ZERO, Ttl::Never).await)?;
    ok("delete_queue", q.delete_queue().await)?;
    ok("delete_queue again", q.delete_queue().await)?;
    fails(
        "put after delete_queue",
        q.put("x", Duration::ZERO, Ttl::Never).await,
        "NotFound",
        not_found,
    )?;
    Ok(())
}
