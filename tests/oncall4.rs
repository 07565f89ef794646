//! On-call, fourth round (issue 39): the smaller fixes — `status --help`
//! names every exit-1 condition, a missing `$USER` is named in the error
//! that asks for `--by`, `keys show` of a key never claimed exits 1, and
//! `poison show` of a replaced record shows the new key's state.

use crate::common::{aqw, aqw_bin, poisoned_by_worker, TestApp};
use serde_json::json;
use std::time::Duration;

#[test]
fn status_help_names_every_exit_1_condition() {
    let out = std::process::Command::new(aqw_bin())
        .args(["status", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for condition in [
        "poison record is open",
        "paused",
        "breaker is open or half-open",
    ] {
        assert!(help.contains(condition), "{condition}: {help}");
    }
}

#[test]
fn a_missing_user_is_named_where_by_is_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(aqw_bin())
        .args(["pause", "Job", "--app"])
        .arg(dir.path())
        .env_remove("USER")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("give --by NAME, or set $USER"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_record_shows_its_new_keys_state() {
    let app = TestApp::new(json!({"key": "order:{/orderId}"}), json!({}), json!({}));
    let id = poisoned_by_worker(&app, Duration::from_secs(60)).await;
    let out = aqw(
        app.path(),
        &[
            "poison",
            "fix",
            &app.queue,
            "--id",
            &id,
            "--payload",
            r#"{"orderId":"o-2"}"#,
            "--by",
            "tester",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = aqw(app.path(), &["poison", "show", &app.queue, &id]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("key order:o-2"), "{text}");
    assert!(text.contains("new key:       not claimed yet"), "{text}");
    let out = aqw(app.path(), &["keys", "show", "Job", "order:never"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a key never claimed needs a look"
    );
    app.cleanup().await;
}
