//! Claim-check payloads on Azurite (issue 42 item 1): a 5 MiB JSON job put
//! by `aqw enqueue` goes to a blob with a small reference on the queue,
//! runs on its exact body, is poisoned, shown with its body by `aqw poison
//! show`, replayed byte-exact (the same reference) and fixed with a new
//! large body; a corrupt blob poisons with its own kind without running.
//! The engine's tests cover the same on the memory store
//! (crates/aqw-core/tests/engine/claim_check.rs).

use crate::common::*;
use aqw_core::claim;
use aqw_core::handler::HandlerError;
use aqw_core::storage::Storage;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(60);

fn five_mib_job(id: &str) -> String {
    let rows: Vec<Value> = (0..95_000)
        .map(|i| json!({ "n": i, "sku": format!("sku-{i:08}"), "note": "ünïcode ✓" }))
        .collect();
    let job = json!({ "id": id, "rows": rows }).to_string();
    assert!(job.len() > 5 * 1024 * 1024, "{} bytes", job.len());
    job
}

fn sha(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

fn json_out(out: &std::process::Output) -> Value {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}

/// The one message on the source queue, decoded.
async fn the_payload(app: &TestApp) -> (String, String) {
    let m = eventually("one message", DEADLINE, || async {
        let got = app.source().peek(32).await.ok()?;
        (got.len() == 1).then(|| got[0].text.clone())
    })
    .await;
    let payload = aqw_core::message::decode(&m, app.config.message_encoding).unwrap();
    (m, payload)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5_mib_job_runs_is_poisoned_shown_replayed_byte_exact_and_fixed() {
    let app = TestApp::new(json!({"key": "job:{/id}"}), json!({}), json!({}));
    let id = random_name("big");
    let job = five_mib_job(&id);
    let file = app.path().join("job.json");
    std::fs::write(&file, &job).unwrap();
    let put = json_out(&aqw(
        app.path(),
        &[
            "enqueue",
            &app.queue,
            "--file",
            file.to_str().unwrap(),
            "--output",
            "json",
        ],
    ));
    let blob = put["blob"].as_str().expect("claim-checked").to_string();
    let (text, reference) = the_payload(&app).await;
    assert!(text.len() < 400, "a small message: {} bytes", text.len());
    let scope = app.config.claim_check.scope(&app.queue);
    let r = claim::parse(&reference, scope)
        .expect("a reference")
        .unwrap();
    assert_eq!(
        (r.blob.as_str(), r.length),
        (blob.as_str(), job.len() as u64)
    );
    assert_eq!(r.sha256, sha(&job));

    // The handler sees the exact body, and refuses it: poisoned.
    let h = Scripted::new(|_, _| Err(HandlerError::permanent("HTTP 422: too many rows")));
    let w = app.start_worker(h.clone());
    eventually("the poison copy", DEADLINE, || async {
        (app.poison_messages().await.len() == 1).then_some(())
    })
    .await;
    w.stop().await;
    let seen = h.jobs.lock().unwrap()[0].payload.clone();
    assert!(
        seen == job,
        "the handler got the body ({} bytes), not the reference",
        seen.len()
    );
    let msg_id = {
        let ops = aqw_core::ops::QueueOps::new(app.config.clone(), &app.queue, &app.storage());
        let recs = ops.records().await.unwrap();
        assert_eq!(recs.len(), 1);
        assert_eq!(
            recs[0].message, text,
            "the record keeps the reference byte-exact"
        );
        recs[0].message_id.clone()
    };

    // poison show prints the body.
    let shown = json_out(&aqw(
        app.path(),
        &["poison", "show", &app.queue, &msg_id, "--output", "json"],
    ));
    let body = shown["payloadText"].as_str().expect("the body shown");
    assert_eq!(sha(body), sha(&job), "show prints the exact body");

    // Replay: the same reference text goes back on the queue.
    let out = aqw(
        app.path(),
        &[
            "poison", "replay", &app.queue, "--id", &msg_id, "--by", "oncall",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (again, _) = the_payload(&app).await;
    assert_eq!(again, text, "replayed byte-exact");

    // It fails again, then a fix with a new large body runs once.
    let h = Scripted::new(|job, _| {
        if job.payload.contains("\"fixed\":true") {
            Ok(Default::default())
        } else {
            Err(HandlerError::permanent("HTTP 422: too many rows"))
        }
    });
    let w = app.start_worker(h.clone());
    let rec = eventually("poisoned again", DEADLINE, || async {
        let ops = aqw_core::ops::QueueOps::new(app.config.clone(), &app.queue, &app.storage());
        let recs = ops.records().await.ok()?;
        recs.into_iter()
            .find(|r| r.status == aqw_core::poison::RecordStatus::Open)
    })
    .await;
    let fixed = job.replacen(
        &format!("\"id\":\"{id}\""),
        &format!("\"fixed\":true,\"id\":\"{id}-fixed\""),
        1,
    );
    let ops = aqw_core::ops::QueueOps::new(app.config.clone(), &app.queue, &app.storage());
    let report = aqw_core::ops::fix(
        &ops,
        &rec.message_id,
        &fixed,
        "oncall",
        Some(DEADLINE),
        false,
    )
    .await
    .expect("fixed");
    assert_eq!(report.confirmed, Some(true), "{report:?}");
    app.drained(DEADLINE).await;
    w.stop().await;
    let runs = h
        .jobs
        .lock()
        .unwrap()
        .iter()
        .filter(|j| j.payload == fixed)
        .count();
    assert_eq!(runs, 1, "the fixed job ran once on its body");
    let blobs = app.storage().blobs(claim::DEFAULT_CONTAINER);
    let listed = blobs.list(&format!("{}/", app.queue)).await.unwrap();
    assert_eq!(
        listed.len(),
        2,
        "the original body and the fix's: {listed:?}"
    );
    for b in listed {
        blobs.delete(&b.name, None).await.unwrap();
    }
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_blob_poisons_with_its_own_kind_without_running() {
    let app = TestApp::new(json!({"key": "job:{/id}"}), json!({}), json!({}));
    let id = random_name("bad");
    let job = json!({ "id": id, "pad": "z".repeat(70_000) }).to_string();
    let file = app.path().join("job.json");
    std::fs::write(&file, &job).unwrap();
    let put = json_out(&aqw(
        app.path(),
        &[
            "enqueue",
            &app.queue,
            "--file",
            file.to_str().unwrap(),
            "--output",
            "json",
        ],
    ));
    let blob = put["blob"].as_str().expect("claim-checked").to_string();
    let blobs = app.storage().blobs(claim::DEFAULT_CONTAINER);
    blobs
        .put(&blob, job.replace('z', "y").as_bytes())
        .await
        .unwrap();
    let h = Scripted::new(|_, _| Ok(Default::default()));
    let w = app.start_worker(h.clone());
    eventually("the poison copy", DEADLINE, || async {
        (app.poison_messages().await.len() == 1).then_some(())
    })
    .await;
    w.stop().await;
    assert_eq!(h.calls(), 0, "the handler never ran on the wrong body");
    let ops = aqw_core::ops::QueueOps::new(app.config.clone(), &app.queue, &app.storage());
    let recs = ops.records().await.unwrap();
    assert_eq!(
        recs[0].error.kind,
        aqw_core::message::ErrorKind::ClaimCheckCorrupt,
        "{:?}",
        recs[0].error
    );
    assert_eq!(recs[0].dequeue_count, 1, "one delivery: permanent");
    blobs.delete(&blob, None).await.unwrap();
    app.cleanup().await;
}

/// Short retention (the testing override) and a container of the test's own.
#[cfg(feature = "failpoints")]
fn swept_app(container: &str) -> TestApp {
    TestApp::new(
        json!({"key": "job:{/id}"}),
        json!({"maxDequeueCount": 1}),
        json!({
            "claimCheck": { "container": container, "threshold": 1024 },
            "retention": {
                "keys": "00:00:01",
                "closedRecords": "00:00:01",
                "unsafeShortRetention": true,
                "sweep": { "requestsPerSecond": 100, "interval": "00:00:01", "lease": "00:00:05" }
            }
        }),
    )
}

#[cfg(feature = "failpoints")]
async fn purge_now(app: &TestApp) -> aqw_core::retention::PurgeReport {
    let ops = aqw_core::ops::QueueOps::new(app.config.clone(), &app.queue, &app.storage());
    let mut pacer = aqw_core::retention::Pacer::new(None);
    let mut run = aqw_core::retention::PurgeRun {
        older_than: Duration::from_secs(1),
        dry_run: false,
        pacer: &mut pacer,
        lease: None,
    };
    aqw_core::retention::blobs::purge_blobs(&ops.poison, ops.blobs.as_ref(), &mut run)
        .await
        .unwrap()
}

#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphan_is_swept_and_a_blob_is_purged_only_when_nothing_refers_to_it() {
    let container = random_name("blobs");
    let app = swept_app(&container);
    let blobs = app.storage().blobs(&container);
    // A crash between the blob's write and the enqueue leaves an orphan.
    let orphan = json!({ "id": random_name("orphan"), "pad": "o".repeat(4000) }).to_string();
    let file = app.path().join("orphan.json");
    std::fs::write(&file, &orphan).unwrap();
    let out = std::process::Command::new(aqw_bin())
        .args([
            "enqueue",
            &app.queue,
            "--file",
            file.to_str().unwrap(),
            "--app",
        ])
        .arg(app.path())
        .env("AzureWebJobsStorage", "UseDevelopmentStorage=true")
        .env("AQW_FAILPOINT", "claim_check.after_blob")
        .output()
        .unwrap();
    assert!(!out.status.success(), "the enqueue aborted after the blob");
    assert_eq!(blobs.list("").await.unwrap().len(), 1, "the orphan blob");
    assert_eq!(app.source_count().await, 0, "and no message");

    // A job poisoned for good: its open record refers to its blob.
    let refused = json!({ "id": random_name("refused"), "pad": "r".repeat(4000) }).to_string();
    let file = app.path().join("refused.json");
    std::fs::write(&file, &refused).unwrap();
    json_out(&aqw(
        app.path(),
        &[
            "enqueue",
            &app.queue,
            "--file",
            file.to_str().unwrap(),
            "--output",
            "json",
        ],
    ));
    let h = Scripted::new(|_, _| Err(HandlerError::permanent("HTTP 422")));
    let w = app.start_worker(h);
    // The worker's sweep collects the orphan (past the 1 s retention).
    let left = eventually("the orphan swept", DEADLINE, || async {
        let left = blobs.list("").await.ok()?;
        (left.len() == 1 && app.poison_messages().await.len() == 1).then_some(left)
    })
    .await;
    w.stop().await;
    let kept = &left[0].name;
    assert_eq!(
        claim::Reference::of(&app.queue, &refused).blob,
        *kept,
        "the open record's blob stays"
    );
    // Once it is past the retention too, a purge still keeps it.
    let r = eventually("the blob past the retention", DEADLINE, || async {
        let r = purge_now(&app).await;
        (r.counts.scanned == 1).then_some(r)
    })
    .await;
    assert_eq!(
        (r.counts.kept_open_record, r.counts.deleted),
        (1, 0),
        "{r:?}"
    );

    // Discarded, nothing refers to it any more: the next purge deletes it.
    let ops = aqw_core::ops::QueueOps::new(app.config.clone(), &app.queue, &app.storage());
    let id = ops.records().await.unwrap()[0].message_id.clone();
    let out = aqw(
        app.path(),
        &[
            "poison", "discard", &app.queue, "--id", &id, "--by", "me", "--reason", "test",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = purge_now(&app).await;
    assert_eq!(r.counts.deleted, 1, "{r:?}");
    assert!(blobs.list("").await.unwrap().is_empty());
    blobs.delete_container().await.unwrap();
    app.cleanup().await;
}
