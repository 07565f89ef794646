//! `aqw.poison.format`: the same replay, fix and discard procedure over
//! aqw's envelope and over raw copies (the exact original text on
//! `<queue>-poison`, as the Functions host writes it), against Azurite. Raw
//! copies stay aqw's own: never imported as `host` records, even after a
//! crash between the copy's put and its record update, while a copy the
//! Functions host wrote itself still is.

use crate::common::*;
use serde_json::{json, Value};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(60);
const FORMATS: [&str; 2] = ["envelope", "raw"];

fn app_in(format: &str, sink: &Sink) -> TestApp {
    TestApp::new(
        json!({"key": "receipt:{/orderId}", "handler": {"type": "http", "url": format!("{}/effects", sink.url), "timeout": "00:00:05"}}),
        json!({"maxDequeueCount": 2}),
        json!({"poison": {"format": format}, "lease": "00:00:02"}),
    )
}

fn json_out(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Run the worker until `n` records exist and the source queue is empty.
async fn poison_all(app: &TestApp, n: usize) {
    let w = app.start_configured_worker();
    eventually("poison records", DEADLINE, || async {
        let rows = app
            .records()
            .query(Some(&app.queue))
            .await
            .unwrap_or_default();
        let named = rows
            .iter()
            .filter(|(_, _, e)| e["PoisonMessageId"] != "")
            .count();
        (named >= n && TestApp::exact_count(app.source().as_ref()).await == 0).then_some(())
    })
    .await;
    w.stop().await;
}

/// The poison queue's texts, sorted.
async fn poison_texts(app: &TestApp) -> Vec<String> {
    let mut t: Vec<String> = app
        .poison_messages()
        .await
        .into_iter()
        .map(|m| m.text)
        .collect();
    t.sort();
    t
}

/// What each format puts on the poison queue for these source texts.
fn assert_copies(format: &str, copies: &[String], sources: &[String]) {
    assert_eq!(
        copies.len(),
        sources.len(),
        "{format}: one copy per message"
    );
    if format == "raw" {
        let mut s = sources.to_vec();
        s.sort();
        assert_eq!(copies, s, "raw: the exact original bodies");
    } else {
        for c in copies {
            let env = aqw_core::poison::PoisonEnvelope::from_queue_text(c).expect("an envelope");
            assert!(sources.contains(env.message.as_ref().unwrap()));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_and_discard_work_the_same_in_both_formats() {
    for format in FORMATS {
        let sink = Sink::start().await;
        sink.fail_with(503);
        let app = app_in(format, &sink);
        let keyed = aqw_core::message::encode(r#"{"orderId":"r-1"}"#, app.config.message_encoding);
        let undecodable = "%%% not base64 %%%".to_string();
        let id = app.enqueue_raw(&keyed).await;
        let bad = app.enqueue_raw(&undecodable).await;
        poison_all(&app, 2).await;
        assert_copies(
            format,
            &poison_texts(&app).await,
            &[keyed.clone(), undecodable],
        );
        assert_listed_and_shown(&app, format, &id);
        sink.fail_with(200);
        replay_byte_exact(&app, format, &id, &keyed).await;
        assert_eq!(
            sink.applied_effects("/effects").len(),
            1,
            "{format}: one effect"
        );
        let out = aqw(
            app.path(),
            &[
                "poison", "discard", &app.queue, "--id", &bad, "--reason", "junk", "--by", "oncall",
            ],
        );
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            poison_texts(&app).await.is_empty(),
            "{format}: the discarded copy removed"
        );
        let status = aqw(app.path(), &["status"]);
        assert_eq!(status.status.code(), Some(0), "{format}: nothing open");
        app.cleanup().await;
    }
}

/// `poison list` shows aqw's two records (no host record), `poison show`
/// the keyed one's payload, error, copy format and key state.
fn assert_listed_and_shown(app: &TestApp, format: &str, id: &str) {
    let list = json_out(&aqw(
        app.path(),
        &["poison", "list", &app.queue, "--output", "json"],
    ));
    let origins: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["origin"].as_str().unwrap())
        .collect();
    assert_eq!(
        origins,
        ["aqw", "aqw"],
        "{format}: aqw's own copies are not host records: {list}"
    );
    let show = json_out(&aqw(
        app.path(),
        &["poison", "show", &app.queue, id, "--output", "json"],
    ));
    assert_eq!(show["payload"]["orderId"], "r-1");
    assert!(show["record"]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("503"));
    assert_eq!(show["record"]["copyFormat"], format);
    assert_eq!(show["keyRecord"]["status"], "poisoned");
}

/// Replay `id`: the source queue gets `text` byte-exact, its copy leaves the
/// poison queue, and the worker runs it.
async fn replay_byte_exact(app: &TestApp, format: &str, id: &str, text: &str) {
    let out = aqw(
        app.path(),
        &[
            "poison",
            "replay",
            "--uncertain-checked",
            &app.queue,
            "--id",
            id,
            "--by",
            "oncall",
            "--output",
            "json",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{format}: {}", json_out(&out));
    let msgs = app.source().peek(32).await.unwrap();
    assert_eq!(msgs.len(), 1);
    assert_eq!(msgs[0].text, text, "{format}: re-put byte-exact");
    eventually("the replayed copy removed", DEADLINE, || async {
        (poison_texts(app).await.len() == 1).then_some(())
    })
    .await;
    let w = app.start_configured_worker();
    app.drained(DEADLINE).await;
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fix_works_the_same_in_both_formats() {
    for format in FORMATS {
        let sink = Sink::start().await;
        let app = app_in(format, &sink);
        let text = aqw_core::message::encode(r#"{"orderid":"typo"}"#, app.config.message_encoding);
        let id = app.enqueue_raw(&text).await;
        poison_all(&app, 1).await;
        assert_copies(
            format,
            &poison_texts(&app).await,
            std::slice::from_ref(&text),
        );
        let w = app.start_configured_worker();
        let out = aqw(
            app.path(),
            &[
                "poison",
                "fix",
                &app.queue,
                "--id",
                &id,
                "--payload",
                r#"{"orderId":"typo"}"#,
                "--by",
                "oncall",
                "--wait",
                "00:00:30",
                "--output",
                "json",
            ],
        );
        let report = json_out(&out);
        assert_eq!(out.status.code(), Some(0), "{format}: {report}");
        assert_eq!(
            (report["action"].as_str(), report["confirmed"].as_bool()),
            (Some("replaced"), Some(true))
        );
        w.stop().await;
        assert!(
            poison_texts(&app).await.is_empty(),
            "{format}: the fixed copy removed"
        );
        assert_eq!(sink.applied_effects("/effects").len(), 1);
        app.cleanup().await;
    }
}

/// A raw copy put just before a crash (its record written, its id not yet
/// named there) is recognised as aqw's own: the next scan names it, the
/// resumed worker puts no second copy, and nothing becomes a `host` record.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_copy_put_before_a_crash_stays_aqws_own() {
    let sink = Sink::start().await;
    sink.fail_with(404);
    let app = app_in("raw", &sink);
    let text = aqw_core::message::encode(r#"{"orderId":"crash"}"#, app.config.message_encoding);
    let id = app.enqueue_raw(&text).await;
    let mut child = std::process::Command::new(aqw_bin())
        .args(["run", "--app"])
        .arg(app.path())
        .env("AzureWebJobsStorage", CONN)
        .env("AQW_FAILPOINT", "poison.after_put")
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let crashed = eventually("the worker aborts after the poison put", DEADLINE, || {
        let done = child.try_wait().unwrap();
        async move { done }
    })
    .await;
    assert!(!crashed.success());
    let (e, _) = app.records().get(&app.queue, &id).await.unwrap().unwrap();
    assert_eq!(
        (e["PoisonMessageId"].as_str(), e["CopyFormat"].as_str()),
        (Some(""), Some("raw"))
    );
    assert_eq!(poison_texts(&app).await, std::slice::from_ref(&text));

    let list = json_out(&aqw(
        app.path(),
        &["poison", "list", &app.queue, "--output", "json"],
    ));
    assert_eq!(
        list.as_array().unwrap().len(),
        1,
        "no host record for our own copy: {list}"
    );
    assert_eq!(list[0]["origin"], "aqw");
    let copy = app.poison_messages().await[0].id.clone();
    assert_eq!(
        list[0]["poisonMessageId"],
        copy.as_str(),
        "the scan named the copy"
    );

    let w = app.start_configured_worker();
    app.drained(DEADLINE).await;
    w.stop().await;
    assert_eq!(poison_texts(&app).await, [text], "one copy per message");
    app.cleanup().await;
}

/// A copy the Functions host wrote itself (the same raw body a WebJobs app
/// puts on `<queue>-poison`) is still imported as a `host` record beside
/// aqw's raw copies, and replays byte-exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_functions_host_copy_is_still_a_host_record_beside_raw_copies() {
    let sink = Sink::start().await;
    sink.fail_with(404);
    let app = app_in("raw", &sink);
    let ours = aqw_core::message::encode(r#"{"orderId":"ours"}"#, app.config.message_encoding);
    app.enqueue_raw(&ours).await;
    poison_all(&app, 1).await;
    let host_body =
        aqw_core::message::encode(r#"{"orderId":"from-host"}"#, app.config.message_encoding);
    let host_id = app
        .poison_queue()
        .put(&host_body, Duration::ZERO, aqw_core::storage::Ttl::Default)
        .await
        .unwrap()
        .id;
    let list = json_out(&aqw(
        app.path(),
        &["poison", "list", &app.queue, "--output", "json"],
    ));
    let mut origins: Vec<(String, String)> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["origin"].as_str().unwrap().into(),
                r["messageId"].as_str().unwrap().into(),
            )
        })
        .collect();
    origins.sort();
    assert_eq!(origins.len(), 2, "{list}");
    assert_eq!(origins[0].0, "aqw");
    assert_eq!(origins[1], ("host".to_string(), host_id.clone()));
    let out = aqw(
        app.path(),
        &[
            "poison",
            "replay",
            "--uncertain-checked",
            &app.queue,
            "--id",
            &host_id,
            "--by",
            "x",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let msgs = app.source().peek(32).await.unwrap();
    assert_eq!(
        msgs.iter().map(|m| m.text.as_str()).collect::<Vec<_>>(),
        [host_body.as_str()]
    );
    assert_eq!(
        poison_texts(&app).await,
        [ours],
        "only aqw's own copy is left"
    );
    app.cleanup().await;
}
