//! Claim-check references are input (issue 48 item 1), on the memory
//! store: a producer who can put one message on the queue writes the
//! reference, so one that names a blob outside the container (`../`),
//! another queue's body, or more than `aqw.claimCheck.maxBytes` is poisoned
//! as `claim_check_invalid` without a single blob request, shown, replayed
//! and previewed without one either; and a blob larger than its reference
//! says is corrupt, refused by its size.

use crate::common::*;
use aqw_core::claim::{Reference, DEFAULT_CONTAINER, DEFAULT_MAX_BYTES};
use aqw_core::message::{encode, ErrorKind};
use aqw_core::ops::{self, ReplayAction};
use aqw_core::producer::Producer;
use aqw_core::storage::{Storage, Ttl};
use serde_json::json;
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::Duration;

/// Blob requests made since the last reset (any `blob.*` operation).
fn blob_requests(env: &Env) -> u64 {
    env.storage
        .request_counts()
        .iter()
        .filter(|(op, _)| op.starts_with("blob."))
        .map(|(_, n)| n)
        .sum()
}

/// A reference as a producer could write it.
fn reference(blob: &str, length: u64, sha: &str) -> String {
    json!({ "aqw.claimCheck": { "v": 1, "blob": blob, "length": length, "sha256": sha } })
        .to_string()
}

/// Put `payload` on the test's queue as a producer with queue access would.
async fn put_raw(env: &Env, payload: &str) {
    let queue = env.storage.queue(&env.queue);
    aqw_core::poison::put_creating(queue.as_ref(), &encode(payload, ENCODING), Ttl::Default)
        .await
        .unwrap();
}

/// The probes of issue 48 against this queue, with blobs that exist: the
/// victim outside the container (as the name a `../` would reach), another
/// queue's valid body, and this queue's body with a length over the bound.
async fn probes(env: &Env) -> Vec<String> {
    let blobs = env.storage.blobs(DEFAULT_CONTAINER);
    blobs.create_if_missing().await.unwrap();
    let secret = json!({ "card": { "number": "4111111111111111" }, "id": "c-1" }).to_string();
    let charges = Reference::of("charges", &secret);
    blobs.put(&charges.blob, secret.as_bytes()).await.unwrap();
    blobs
        .put("../victim/doc.txt", b"victim document, 24 bytes")
        .await
        .unwrap();
    let own = Reference::of(&env.queue, &secret);
    blobs.put(&own.blob, secret.as_bytes()).await.unwrap();
    let sha = &charges.sha256;
    vec![
        reference("../victim/doc.txt", 1, sha),
        reference("../victim/nope.txt", 1, sha),
        charges.to_payload(),
        reference(&own.blob, DEFAULT_MAX_BYTES + 1, &own.sha256),
    ]
}

/// Each probe is poisoned as `claim_check_invalid` at its first delivery,
/// the handler never runs, and no blob is asked about: its error says which
/// rule failed and nothing of any blob. `poison show`, a replay of every
/// record, a group fix's preview and a fix's redaction restore make no blob
/// request either, and the replay refuses each record.
#[tokio::test(start_paused = true)]
async fn a_reference_outside_its_queue_is_invalid_without_a_storage_call() {
    let env = Env::new(|_, _| Behave::Succeed);
    let probes = probes(&env).await;
    for p in &probes {
        put_raw(&env, p).await;
    }
    env.storage.reset_request_counts();
    let w = start(env.worker());
    env.wait_until("all poisoned", Duration::from_secs(60), || async {
        env.records().await.len() == probes.len() && env.source_depth().await == 0
    })
    .await;
    w.stop().await;
    assert!(env.provider.calls().is_empty(), "the handler never ran");
    let counts = env.storage.request_counts();
    assert_eq!(blob_requests(&env), 0, "no blob request: {counts:?}");
    let records = env.records().await;
    for rec in &records {
        assert_eq!(
            rec.error.kind,
            ErrorKind::ClaimCheckInvalid,
            "{:?}",
            rec.error
        );
        assert_eq!(rec.dequeue_count, 1, "poisoned at once");
        let m = &rec.error.message;
        for leak in ["victim", "charges", "bytes,", "missing", "doc.txt"] {
            assert!(!m.contains(leak), "{m}");
        }
    }

    let ops = env.ops();
    for rec in &records {
        let shown = ops::show(&ops, &rec.message_id).await.unwrap();
        assert!(shown.payload_text.is_none(), "{shown:?}");
        let why = shown.decode_error.unwrap();
        assert!(!why.contains("4111"), "{why}");
        let patch =
            ops::operation::parse_patch(r#"[{"op":"copy","from":"/card/number","path":"/id"}]"#)
                .unwrap();
        let preview = ops::operation::preview_fix(&ops, rec, &patch).await;
        assert!(
            preview.is_err_and(|e| !e.to_string().contains("4111")),
            "{rec:?}"
        );
    }
    let report = env.replay_all().await;
    assert_eq!(report.items.len(), probes.len(), "{report:?}");
    for item in &report.items {
        assert_eq!(item.action, ReplayAction::Failed, "{item:?}");
        let why = item.detail.as_deref().unwrap_or_default();
        assert!(why.contains("claim_check_invalid"), "{why}");
    }
    assert_eq!(env.source_depth().await, 0, "nothing re-put");
    let counts = env.storage.request_counts();
    assert_eq!(blob_requests(&env), 0, "no blob request: {counts:?}");
}

/// A blob larger than its reference says (someone else wrote to the
/// container) is corrupt by its size: the store answers `TooLarge` without
/// the bytes, and the error says so.
#[tokio::test(start_paused = true)]
async fn a_blob_larger_than_its_reference_is_corrupt_by_its_size() {
    let env = Env::new(|_, _| Behave::Succeed);
    let id = format!("{}-grown", env.id);
    let payload = json!({ "id": id, "pad": "p".repeat(60_000) }).to_string();
    let producer = Producer::new(env.app(), Arc::new(env.storage.clone()));
    let put = producer
        .enqueue_text(&env.queue, &payload, Default::default())
        .await
        .unwrap();
    let blob = put.blob.expect("claim-checked");
    let grown = vec![b'g'; 5 * 1024 * 1024];
    let blobs = env.storage.blobs(DEFAULT_CONTAINER);
    blobs.put(&blob, &grown).await.unwrap();
    let w = start(env.worker());
    env.wait_until("poisoned", Duration::from_secs(60), || async {
        env.records().await.len() == 1
    })
    .await;
    w.stop().await;
    assert!(env.provider.calls().is_empty());
    let rec = env.records().await.remove(0);
    assert_eq!(
        rec.error.kind,
        ErrorKind::ClaimCheckCorrupt,
        "{:?}",
        rec.error
    );
    let want = format!(
        "is larger than the {} bytes the reference says",
        payload.len()
    );
    assert!(rec.error.message.contains(&want), "{}", rec.error.message);
}

/// A producer's body over `aqw.claimCheck.maxBytes` is refused before
/// anything is written: no worker would fetch it.
#[tokio::test(start_paused = true)]
async fn a_body_over_max_bytes_is_refused_at_the_enqueue() {
    let env = Env::new(|_, _| Behave::Succeed);
    let mut app = (*env.app()).clone();
    app.claim_check.max_bytes = 100_000;
    let producer = Producer::new(Arc::new(app), Arc::new(env.storage.clone()));
    let id = format!("{}-huge", env.id);
    let payload = json!({ "id": id, "pad": "h".repeat(100_000) }).to_string();
    env.storage.reset_request_counts();
    let e = producer
        .enqueue_text(&env.queue, &payload, Default::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("aqw.claimCheck.maxBytes"), "{e}");
    assert_eq!(blob_requests(&env), 0);
    assert_eq!(env.source_depth().await, 0);
    let digest = hex::encode(Sha256::digest(payload.as_bytes()));
    assert!(!e.contains(&digest));
}
