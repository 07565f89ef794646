//! Claim-check payloads (issue 42 item 1) on the memory store: a job over
//! the threshold is put as a reference to a blob and runs once on its
//! exact body; a missing blob and a corrupt blob poison the job with
//! their own kinds without running it; a poisoned claim-checked job is
//! shown with its body, replayed byte-exact (the same reference, its blob
//! refreshed) and fixed with a new large body (a new blob).

use crate::common::*;
use aqw_core::claim::{self, DEFAULT_CONTAINER};
use aqw_core::message::{decode, ErrorKind};
use aqw_core::ops::{self, Delivery};
use aqw_core::poison::RecordStatus;
use aqw_core::producer::Producer;
use aqw_core::storage::{BlobRead, Storage, Ttl};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// A JSON job of about `size` bytes for the test's function.
fn big_job(env: &Env, name: &str, size: usize) -> (String, String) {
    let id = format!("{}-{name}", env.id);
    let filler: String = (0..size)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    (
        json!({ "id": id, "blob": filler }).to_string(),
        format!("job:{id}"),
    )
}

/// The blob's bytes, read with no bound that matters.
async fn whole(env: &Env, blob: &str) -> Option<Vec<u8>> {
    let blobs = env.storage.blobs(DEFAULT_CONTAINER);
    match blobs.get(blob, u64::MAX).await.unwrap() {
        None => None,
        Some(BlobRead::Whole(b)) => Some(b),
        Some(other) => panic!("{other:?}"),
    }
}

async fn enqueue_big(env: &Env, payload: &str) -> String {
    let producer = Producer::new(env.app(), Arc::new(env.storage.clone()));
    let put = producer
        .enqueue_text(&env.queue, payload, Delivery::default())
        .await
        .expect("a large job is enqueued");
    put.blob.expect("claim-checked")
}

/// The one message on the source queue, decoded.
async fn the_message(env: &Env) -> String {
    let got = env.storage.queue(&env.queue).peek(32).await.unwrap();
    assert_eq!(got.len(), 1);
    decode(&got[0].text, ENCODING).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_large_job_runs_once_on_its_exact_body() {
    let env = Env::new(|_, _| Behave::Succeed);
    let (payload, key) = big_job(&env, "big", 300_000);
    // The handler fails any call whose payload is not the exact body.
    let want = payload.clone();
    env.provider.set_rule(move |job, _| {
        if job.payload == want {
            Behave::Succeed
        } else {
            Behave::Fail(format!("wrong body of {} bytes", job.payload.len()))
        }
    });
    let blob = enqueue_big(&env, &payload).await;
    let reference = the_message(&env).await;
    assert!(reference.len() < 300, "a small reference: {reference}");
    let parsed = claim::parse(&reference, env.app().claim_check.scope(&env.queue))
        .unwrap()
        .unwrap();
    assert_eq!(
        (parsed.blob.as_str(), parsed.length),
        (blob.as_str(), payload.len() as u64)
    );
    let stored = whole(&env, &blob).await;
    assert_eq!(
        stored.as_deref(),
        Some(payload.as_bytes()),
        "the body, exactly"
    );

    let w = start(env.worker());
    env.drained(Duration::from_secs(60)).await;
    w.stop().await;
    env.provider.assert_applied_once(std::slice::from_ref(&key));
    assert!(env.records().await.is_empty(), "{}", env.dump().await);
}

/// Enqueue a large job, spoil its blob with `spoil`, run a worker: the one
/// poison record, after the handler was never called.
async fn poisoned_by(spoil: impl AsyncFnOnce(&Env, &str)) -> aqw_core::poison::PoisonRecord {
    let env = Env::new(|_, _| Behave::Succeed);
    let (payload, _) = big_job(&env, "spoiled", 100_000);
    let blob = enqueue_big(&env, &payload).await;
    spoil(&env, &blob).await;
    let w = start(env.worker());
    env.wait_until("poisoned", Duration::from_secs(60), || async {
        env.records().await.len() == 1 && env.source_depth().await == 0
    })
    .await;
    w.stop().await;
    assert!(env.provider.calls().is_empty(), "the handler never runs");
    let rec = env.records().await.remove(0);
    assert_eq!(rec.dequeue_count, 1, "poisoned at its first delivery");
    let text = decode(&rec.message, rec.encoding).unwrap();
    assert!(claim::is_reference(&text), "the record keeps the reference");
    rec
}

#[tokio::test(start_paused = true)]
async fn a_missing_blob_poisons_with_its_own_kind() {
    let rec = poisoned_by(async |env, blob| {
        let blobs = env.storage.blobs(DEFAULT_CONTAINER);
        blobs.delete(blob, None).await.unwrap();
    })
    .await;
    assert_eq!(
        rec.error.kind,
        ErrorKind::ClaimCheckMissing,
        "{:?}",
        rec.error
    );
    assert!(
        rec.error.message.contains("missing"),
        "{}",
        rec.error.message
    );
}

#[tokio::test(start_paused = true)]
async fn a_corrupt_blob_poisons_with_its_own_kind() {
    let rec = poisoned_by(async |env, blob| {
        let blobs = env.storage.blobs(DEFAULT_CONTAINER);
        let mut bytes = whole(env, blob).await.unwrap();
        bytes[50_000] ^= 1; // same length, another hash
        blobs.put(blob, &bytes).await.unwrap();
    })
    .await;
    assert_eq!(
        rec.error.kind,
        ErrorKind::ClaimCheckCorrupt,
        "{:?}",
        rec.error
    );
    assert!(
        rec.error.message.contains("SHA-256"),
        "{}",
        rec.error.message
    );
}

#[tokio::test(start_paused = true)]
async fn a_blob_of_another_length_is_corrupt() {
    let rec = poisoned_by(async |env, blob| {
        let blobs = env.storage.blobs(DEFAULT_CONTAINER);
        blobs.put(blob, b"{}").await.unwrap();
    })
    .await;
    assert_eq!(rec.error.kind, ErrorKind::ClaimCheckCorrupt);
    assert!(
        rec.error.message.contains("2 bytes"),
        "{}",
        rec.error.message
    );
}

#[tokio::test(start_paused = true)]
async fn a_claim_checked_job_needs_a_time_to_live() {
    let env = Env::new(|_, _| Behave::Succeed);
    let (payload, _) = big_job(&env, "forever", 60_000);
    let producer = Producer::new(env.app(), Arc::new(env.storage.clone()));
    let never = Delivery::after(Duration::ZERO, Ttl::Never).unwrap();
    let e = producer
        .enqueue_text(&env.queue, &payload, never)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("time-to-live"), "{e}");
    assert_eq!(env.source_depth().await, 0, "nothing sent");
    // Small jobs are unchanged: inline, no blob.
    let put = producer
        .enqueue_text(&env.queue, &env.job("small").payload, never)
        .await
        .unwrap();
    assert!(put.blob.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_poisoned_large_job_is_shown_replayed_byte_exact_and_fixed() {
    let env = Env::new(|job, _| {
        if job.payload.contains("\"fail\":true") {
            Behave::Fail("refused".into())
        } else {
            Behave::Succeed
        }
    });
    let id = format!("{}-exact", env.id);
    let filler = "x".repeat(80_000);
    let payload = json!({ "id": id, "fail": true, "blob": filler }).to_string();
    enqueue_big(&env, &payload).await;
    let reference_text = env.storage.queue(&env.queue).peek(1).await.unwrap()[0]
        .text
        .clone();
    let w = start(env.worker());
    env.wait_until("poisoned", Duration::from_secs(60), || async {
        env.records().await.len() == 1
    })
    .await;
    let rec = env.records().await.remove(0);
    assert_eq!(
        rec.message, reference_text,
        "the record keeps the exact text"
    );

    let shown = ops::show(&env.ops(), &rec.message_id).await.unwrap();
    assert_eq!(
        shown.payload_text.as_deref(),
        Some(payload.as_str()),
        "show prints the body"
    );

    // Replay: the same reference, byte-exact (the handler fails it again).
    env.provider
        .set_rule(|_, _| Behave::Fail("still refused".into()));
    let report = env.replay_all().await;
    assert_eq!(report.items.len(), 1, "{report:?}");
    env.wait_until("poisoned again", Duration::from_secs(60), || async {
        env.records()
            .await
            .iter()
            .filter(|r| r.status == RecordStatus::Open)
            .count()
            == 1
    })
    .await;
    let again: Vec<_> = env
        .records()
        .await
        .into_iter()
        .filter(|r| r.status == RecordStatus::Open)
        .collect();
    assert_eq!(again[0].message, reference_text, "replayed byte-exact");

    // Fix with a new large body: a new blob, and it runs.
    env.provider.set_rule(|_, _| Behave::Succeed);
    let fixed = json!({ "id": format!("{id}-2"), "blob": filler }).to_string();
    let report = ops::fix(
        &env.ops(),
        &again[0].message_id,
        &fixed,
        "oncall",
        None,
        false,
    )
    .await
    .expect("fixed");
    assert!(report.new_message_id.is_some(), "{report:?}");
    env.drained(Duration::from_secs(60)).await;
    w.stop().await;
    env.provider.assert_applied_once(&[format!("job:{id}-2")]);
    let blobs = env.storage.blobs(DEFAULT_CONTAINER).list("").await.unwrap();
    assert_eq!(blobs.len(), 2, "the original body and the fix's: {blobs:?}");
}

const DAY: Duration = Duration::from_secs(24 * 3600);

/// One purge of the test queue's blobs, keeping what changed in `older_than`.
async fn purge(env: &Env, older_than: Duration) -> aqw_core::retention::PurgeReport {
    let mut pacer = aqw_core::retention::Pacer::new(None);
    let mut run = aqw_core::retention::PurgeRun {
        older_than,
        dry_run: false,
        pacer: &mut pacer,
        lease: None,
    };
    let blobs = env.storage.blobs(DEFAULT_CONTAINER);
    aqw_core::retention::blobs::purge_blobs(&env.poison_store(), blobs.as_ref(), &mut run)
        .await
        .expect("purged")
}

#[tokio::test(start_paused = true)]
async fn retention_deletes_a_blob_only_when_nothing_can_deliver_or_replay_it() {
    let env = Env::new(|job, _| {
        if job.payload.contains("\"refuse\":true") {
            Behave::Fail("refused".into())
        } else {
            Behave::Succeed
        }
    });
    let blobs = env.storage.blobs(DEFAULT_CONTAINER);
    // A crash between the blob's write and the enqueue: an orphan.
    let (orphan, _) = big_job(&env, "orphan", 60_000);
    aqw_core::failpoint::arm("claim_check.after_blob");
    let crashed = tokio::spawn({
        let producer = Producer::new(env.app(), Arc::new(env.storage.clone()));
        let queue = env.queue.clone();
        async move {
            producer
                .enqueue_text(&queue, &orphan, Delivery::default())
                .await
        }
    })
    .await;
    assert!(crashed.is_err(), "the enqueue crashed after the blob");
    assert_eq!(env.source_depth().await, 0, "no message");
    // One job done, one poisoned (its record stays open).
    let (done, _) = big_job(&env, "done", 60_000);
    let refused =
        json!({ "id": format!("{}-refused", env.id), "refuse": true, "pad": "r".repeat(60_000) });
    enqueue_big(&env, &done).await;
    let open_blob = enqueue_big(&env, &refused.to_string()).await;
    let w = start(env.worker());
    env.wait_until(
        "one done, one poisoned",
        Duration::from_secs(60),
        || async { env.source_depth().await == 0 && env.records().await.len() == 1 },
    )
    .await;
    w.stop().await;
    assert_eq!(blobs.list("").await.unwrap().len(), 3);

    // Within the retention: nothing goes.
    let r = purge(&env, 14 * DAY).await;
    assert_eq!((r.counts.scanned, r.counts.deleted), (0, 0), "{r:?}");
    tokio::time::sleep(15 * DAY).await;
    // A new job with the same body as the done one: its put refreshes the
    // blob, which the purge then keeps.
    let (again, _) = big_job(&env, "done", 60_000);
    enqueue_big(&env, &again).await;
    let r = purge(&env, 14 * DAY).await;
    assert_eq!(r.counts.deleted, 1, "the orphan: {r:?}");
    assert_eq!(r.counts.kept_open_record, 1, "the open record's: {r:?}");
    let left: Vec<String> = blobs
        .list("")
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.name)
        .collect();
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(
        left.contains(&open_blob),
        "an open record's blob is never deleted"
    );
}

/// A claim-checked job the provider keeps answering "later" is put back
/// as a fresh copy each time: each put-back refreshes its blob, so a job
/// kept alive that way longer than the retention still finds its body.
/// Without the refresh the blob's last write stays at the enqueue.
#[tokio::test(start_paused = true)]
async fn a_job_put_back_for_hours_refreshes_its_blob() {
    let env = Env::new(|_, n| {
        if n <= 3 {
            Behave::Later(Duration::from_secs(3600))
        } else {
            Behave::Succeed
        }
    });
    let (payload, key) = big_job(&env, "later", 100_000);
    let blob = enqueue_big(&env, &payload).await;
    let blobs = env.storage.blobs(DEFAULT_CONTAINER);
    let written = |items: Vec<aqw_core::storage::BlobItem>| {
        let item = items
            .into_iter()
            .find(|b| b.name == blob)
            .expect("the blob");
        item.last_modified
    };
    let at_enqueue = written(blobs.list("").await.unwrap());
    let w = start(env.worker());
    env.wait_until("the job applied", minutes(5 * 60), || async {
        env.provider.effects().get(&key) == Some(&1)
    })
    .await;
    w.stop().await;
    let refreshed = written(blobs.list("").await.unwrap());
    assert!(
        refreshed - at_enqueue >= time::Duration::hours(2),
        "written at {at_enqueue}, last refreshed at {refreshed}"
    );
    env.provider.assert_applied_once(std::slice::from_ref(&key));
}
