//! Delayed jobs on Azurite (issue 42 item 2): `aqw enqueue --delay/--at`
//! puts a message the service keeps invisible until its time, `--ttl` sets
//! the service's expiry (or none), and every value the service would refuse,
//! or that would expire the job before its delivery, exits 2 naming the flag
//! before anything is sent. The engine's own tests show a worker runs such a
//! job once, after its time (crates/aqw-core/tests/engine/producer.rs).

use crate::common::*;
use serde_json::{json, Value};
use std::time::Duration;

fn stdout_json(out: &std::process::Output) -> Value {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}

#[tokio::test]
async fn a_delayed_job_stays_invisible_until_its_time() {
    let app = TestApp::new(json!({"key": "job:{/id}"}), json!({}), json!({}));
    let q = app.queue.clone();
    // An hour away: certainly invisible at the peek below.
    let later = stdout_json(&aqw(
        app.path(),
        &[
            "enqueue",
            &q,
            "--payload",
            r#"{"id":"later"}"#,
            "--delay",
            "01:00:00",
            "--output",
            "json",
        ],
    ));
    let visible_at = later["visibleAt"].as_str().expect("visibleAt");
    let at =
        time::OffsetDateTime::parse(visible_at, &time::format_description::well_known::Rfc3339)
            .expect("an RFC 3339 time");
    assert!(at > time::OffsetDateTime::now_utc() + time::Duration::minutes(50));
    assert!(
        app.source().peek(32).await.unwrap().is_empty(),
        "invisible for an hour"
    );

    // Ten seconds away (room for the process to start): it turns up by itself.
    let soon = time::OffsetDateTime::now_utc() + time::Duration::seconds(10);
    let soon = soon
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    stdout_json(&aqw(
        app.path(),
        &[
            "enqueue",
            &q,
            "--payload",
            r#"{"id":"soon"}"#,
            "--at",
            &soon,
            "--output",
            "json",
        ],
    ));
    let seen = eventually(
        "the --at job becomes visible",
        Duration::from_secs(60),
        || async {
            let peeked = app.source().peek(32).await.unwrap();
            (!peeked.is_empty()).then_some(peeked)
        },
    )
    .await;
    assert_eq!(seen.len(), 1, "only the --at job, not the one an hour away");
    let text = aqw_core::message::decode(&seen[0].text, app.config.message_encoding).unwrap();
    assert_eq!(text, r#"{"id":"soon"}"#);
    app.cleanup().await;
}

#[tokio::test]
async fn ttl_sets_the_services_expiry_or_none() {
    let app = TestApp::new(json!({"key": "job:{/id}"}), json!({}), json!({}));
    let q = app.queue.clone();
    stdout_json(&aqw(
        app.path(),
        &[
            "enqueue",
            &q,
            "--payload",
            r#"{"id":"a"}"#,
            "--ttl",
            "02:00:00",
            "--output",
            "json",
        ],
    ));
    stdout_json(&aqw(
        app.path(),
        &[
            "enqueue",
            &q,
            "--payload",
            r#"{"id":"b"}"#,
            "--ttl",
            "never",
            "--output",
            "json",
        ],
    ));
    let peeked = app.source().peek(32).await.unwrap();
    assert_eq!(peeked.len(), 2);
    let mut lives: Vec<i64> = peeked
        .iter()
        .map(|m| (m.expiration_time - m.insertion_time).whole_hours())
        .collect();
    lives.sort();
    assert_eq!(lives[0], 2, "--ttl 02:00:00");
    assert!(
        lives[1] > 24 * 365 * 100,
        "--ttl never: the service's far-future expiry, got {} h",
        lives[1]
    );
    app.cleanup().await;
}

#[tokio::test]
async fn bad_delays_exit_2_naming_the_flag_before_anything_is_sent() {
    let app = TestApp::new(json!({"key": "job:{/id}"}), json!({}), json!({}));
    let q = app.queue.clone();
    let cases: [(&[&str], &str); 8] = [
        (&["--delay", "8.00:00:00"], "7 days"),
        (&["--delay", "7.00:00:00"], "expire before it is delivered"),
        (
            &["--delay", "00:10:00", "--ttl", "00:05:00"],
            "expire before it is delivered",
        ),
        (&["--ttl", "00:00:00"], "at least 1 second"),
        (&["--delay", "soon"], "--delay"),
        (&["--at", "yesterday"], "--at"),
        (&["--at", "2020-01-01T00:00:00Z"], "not in the future"),
        (
            &["--delay", "00:00:01", "--at", "2099-01-01T00:00:00Z"],
            "cannot be used with",
        ),
    ];
    for (flags, says) in cases {
        let mut args = vec!["enqueue", q.as_str(), "--payload", r#"{"id":"x"}"#];
        args.extend_from_slice(flags);
        let out = aqw(app.path(), &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {err}");
        assert!(err.contains(says), "{flags:?} should say {says:?}: {err}");
        assert!(!err.contains("panicked"), "{flags:?}: {err}");
    }
    assert!(
        app.source().peek(1).await.is_err(),
        "no queue was created: nothing was sent"
    );
    app.cleanup().await;
}
