//! Claim-check references are input (issue 48 item 1), on Azurite with the
//! real binary and Blob client: the probes a producer with queue access
//! could write (`../<victim container>/doc.txt`, a missing one there, and
//! another queue's body read off a record page) are poisoned as
//! `claim_check_invalid` without running, say nothing of the victim, and
//! `aqw poison show` and replays (one record, then all) neither print the
//! other queue's body nor write the victim blob (its ETag unchanged). The
//! dashboard's record page shows a claim-checked record's body, redacted,
//! never the reference. The engine's tests count the blob requests
//! (crates/aqw-core/tests/engine/claim_check_refs.rs).

use crate::common::*;
use aqw_core::claim::Reference;
use aqw_core::handler::HandlerError;
use aqw_core::storage::Storage;
use serde_json::{json, Value};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(60);
const CARD: &str = "4111111111111111";

fn reference(blob: &str, length: u64, sha: &str) -> String {
    json!({ "aqw.claimCheck": { "v": 1, "blob": blob, "length": length, "sha256": sha } })
        .to_string()
}

/// An app whose claim-check container is its own (`container`), with
/// `/card/number` redacted.
fn app_with(container: &str) -> TestApp {
    TestApp::new(
        json!({"key": "job:{/id}", "redact": ["/card/number"]}),
        json!({}),
        json!({ "claimCheck": { "container": container, "threshold": 1024 } }),
    )
}

/// The victim blob's ETag (it changes with any write, Set Blob Metadata
/// included).
async fn etag_of(app: &TestApp, container: &str, name: &str) -> String {
    let listed = app.storage().blobs(container).list(name).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    listed[0].etag.0.clone()
}

fn out_text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_are_invalid_and_neither_show_nor_touch_another_blob() {
    let container = random_name("payloads");
    let victim = random_name("victim");
    let app = app_with(&container);
    let storage = app.storage();
    let (blobs, victims) = (storage.blobs(&container), storage.blobs(&victim));
    victims.create_if_missing().await.unwrap();
    victims
        .put("doc.txt", b"victim document 24 bytes")
        .await
        .unwrap();
    let before = etag_of(&app, &victim, "doc.txt").await;
    // Another function's body, as a record page of its queue would name it.
    let secret = json!({ "id": "c-1", "card": { "number": CARD } }).to_string();
    let charges = Reference::of("charges", &secret);
    blobs.create_if_missing().await.unwrap();
    blobs.put(&charges.blob, secret.as_bytes()).await.unwrap();
    let sha = charges.sha256.clone();
    let probes = [
        reference(&format!("../{victim}/doc.txt"), 1, &sha),
        reference(&format!("../{victim}/nope.txt"), 1, &sha),
        charges.to_payload(),
    ];
    let mut ids = Vec::new();
    for p in &probes {
        ids.push(app.enqueue(p).await);
    }
    let h = Scripted::new(|_, _| Ok(Default::default()));
    let w = app.start_worker(h.clone());
    eventually("three poisoned", DEADLINE, || async {
        (app.poison_messages().await.len() == probes.len()).then_some(())
    })
    .await;
    w.stop().await;
    assert_eq!(h.calls(), 0, "the handler never ran");
    for id in &ids {
        let rec = poison_record(&app, id).await;
        assert_eq!(
            rec.error.kind,
            aqw_core::message::ErrorKind::ClaimCheckInvalid
        );
        let m = &rec.error.message;
        assert!(
            !m.contains(&victim) && !m.contains("bytes,") && !m.contains("missing"),
            "{m}"
        );
    }

    // poison show of the other queue's reference: not its body.
    let charges_id = &ids[2];
    let out = aqw(
        app.path(),
        &["poison", "show", &app.queue, charges_id, "--output", "json"],
    );
    let text = out_text(&out);
    assert!(!text.contains(CARD) && !text.contains("c-1"), "{text}");
    let shown: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(shown["payloadText"].is_null(), "{shown}");
    assert!(
        shown["decodeError"]
            .as_str()
            .unwrap()
            .contains("this queue's"),
        "{shown}"
    );

    // One replay, then all: each refused, nothing re-put, the victim unwritten.
    let out = aqw(
        app.path(),
        &[
            "poison", "replay", &app.queue, "--id", &ids[0], "--by", "oncall",
        ],
    );
    assert_ne!(out.status.code(), Some(0), "{}", out_text(&out));
    assert!(
        out_text(&out).contains("claim_check_invalid"),
        "{}",
        out_text(&out)
    );
    let out = aqw(
        app.path(),
        &["poison", "replay", &app.queue, "--all", "--by", "oncall"],
    );
    assert_ne!(out.status.code(), Some(0), "{}", out_text(&out));
    assert_eq!(app.source_count().await, 0, "nothing re-put");
    assert_eq!(
        etag_of(&app, &victim, "doc.txt").await,
        before,
        "the victim blob was written"
    );
    let charges_etag = etag_of(&app, &container, &charges.blob).await;
    let out = aqw(
        app.path(),
        &[
            "poison", "replay", &app.queue, "--id", charges_id, "--by", "oncall",
        ],
    );
    assert_ne!(out.status.code(), Some(0), "{}", out_text(&out));
    assert_eq!(
        etag_of(&app, &container, &charges.blob).await,
        charges_etag,
        "another queue's blob was written"
    );

    victims.delete_container().await.unwrap();
    blobs.delete_container().await.unwrap();
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_record_page_shows_a_claim_checked_body_redacted() {
    let container = random_name("payloads");
    let app = app_with(&container);
    let id = random_name("page");
    let body =
        json!({ "id": id, "card": { "number": CARD }, "pad": "visible-".repeat(600) }).to_string();
    let file = app.path().join("job.json");
    std::fs::write(&file, &body).unwrap();
    let out = aqw(
        app.path(),
        &["enqueue", &app.queue, "--file", file.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(0), "{}", out_text(&out));
    let h = Scripted::new(|_, _| Err(HandlerError::permanent("HTTP 422")));
    let w = app.start_worker(h);
    eventually("poisoned", DEADLINE, || async {
        (app.poison_messages().await.len() == 1).then_some(())
    })
    .await;
    w.stop().await;
    let ops = aqw_core::ops::QueueOps::new(app.config.clone(), &app.queue, &app.storage());
    let rec = ops.records().await.unwrap().remove(0);
    let r = crate::dashboard::dashboard(&app, true);
    let enc: String = url::form_urlencoded::byte_serialize(rec.message_id.as_bytes()).collect();
    let page = crate::dashboard::bget(&r, &format!("/q/{}/record?id={enc}", app.queue)).await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(
        page.body.contains("visible-visible-") && page.body.contains(&id),
        "the body is shown"
    );
    assert!(page.body.contains(aqw_core::redact::MASK), "masked");
    assert!(!page.body.contains(CARD), "a redacted value is shown");
    assert!(
        !page.body.contains("aqw.claimCheck"),
        "the reference is shown, not the body"
    );
    assert!(page.body.contains("payload-redacted"), "the redaction note");
    app.storage()
        .blobs(&container)
        .delete_container()
        .await
        .unwrap();
    app.cleanup().await;
}
