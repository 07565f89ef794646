//! On-call, fourth round (issue 39): the smaller fixes — `status --help`
//! names every exit-1 condition, a missing `$USER` is named in the error
//! that asks for `--by`, `keys show` of a key never claimed exits 1,
//! `poison show` of a replaced record shows the new key's state, and
//! `keys list` filters (prefix, status, time, limit) and follows every page.

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

/// `aqw keys list`: a function's keys by prefix, status and time, with a
/// limit, as text and JSON; exit 1 while a listed key is poisoned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_list_filters_by_prefix_status_and_time() {
    use crate::common::{eventually, Scripted};
    use aqw_core::handler::{HandlerError, Success};
    let app = TestApp::new(
        json!({"key": "order:{/orderId}"}),
        json!({"maxDequeueCount": 1}),
        json!({}),
    );
    for id in ["a1", "a2", "b1"] {
        app.enqueue(&json!({ "orderId": id }).to_string()).await;
    }
    let h = Scripted::new(|job, _| {
        if job.payload.contains("b1") {
            Err(HandlerError::permanent("HTTP 404: no such order"))
        } else {
            Ok(Success::default())
        }
    });
    let w = app.start_worker(h);
    eventually("every job settled", Duration::from_secs(60), || async {
        (app.source_count().await == 0 && app.poison_messages().await.len() == 1).then_some(())
    })
    .await;
    w.stop().await;
    let list = |args: &[&str]| {
        let mut all = vec!["keys", "list", "Job"];
        all.extend_from_slice(args);
        let out = aqw(app.path(), &all);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
        )
    };
    let (code, text) = list(&["--prefix", "order:a"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("order:a1") && text.contains("order:a2") && !text.contains("order:b1"),
        "{text}"
    );
    assert!(text.contains("2 key(s)"), "{text}");
    let (code, text) = list(&["--status", "poisoned", "--output", "json"]);
    assert_eq!(code, Some(1), "a poisoned key needs a person");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 1);
    assert_eq!(v[0]["key"], "order:b1");
    let (_, text) = list(&["--since", "01:00:00", "--limit", "2"]);
    assert!(text.contains("2 key(s)"), "{text}");
    let (code, text) = list(&["--until", "01:00:00"]);
    assert_eq!(code, Some(0));
    assert!(
        text.contains("0 key(s)"),
        "changed in the last hour: {text}"
    );
    let (code, _) = list(&["--status", "nonsense"]);
    assert_eq!(code, Some(2));
    app.cleanup().await;
}

/// `aqw keys list` follows every page: 1,100 keys of the function (the
/// service pages at 1,000 rows) among 100 of another function come back
/// whole through the service's filter, in one partition and across two,
/// and `--limit` stops early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_list_follows_every_page() {
    use aqw_core::storage::{Storage, TableOp};
    let app = TestApp::new(json!({"key": "order:{/orderId}"}), json!({}), json!({}));
    let table = app.storage().table(&app.keys_table);
    table.create_if_missing().await.unwrap();
    for batch in 0..12 {
        let ops = (0..100)
            .map(|i| {
                let n = batch * 100 + i;
                let function = if n % 12 == 5 { "Other" } else { "Job" };
                let entity = json!({
                    "Key": format!("order:{n:05}"),
                    "Function": function,
                    "Status": "done",
                    "ProviderKey": uuid::Uuid::new_v4().to_string(),
                    "Attempts": 1
                });
                TableOp::Insert {
                    row_key: format!("r{n:05}"),
                    entity: entity.as_object().unwrap().clone(),
                }
            })
            .collect();
        // Two partitions: the query crosses them as the key table's does.
        let partition = if batch < 6 { "p-a" } else { "p-b" };
        table.transaction(partition, ops).await.unwrap();
    }
    let list = |args: &[&str]| {
        let mut all = vec!["keys", "list", "Job", "--output", "json"];
        all.extend_from_slice(args);
        let out = aqw(app.path(), &all);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let keys = list(&[]);
    let keys = keys.as_array().unwrap();
    let distinct: std::collections::HashSet<&str> =
        keys.iter().map(|k| k["key"].as_str().unwrap()).collect();
    assert_eq!(
        (keys.len(), distinct.len()),
        (1100, 1100),
        "every page, each key once"
    );
    assert!(keys.iter().all(|k| k["function"] == "Job"));
    assert_eq!(list(&["--limit", "1050"]).as_array().unwrap().len(), 1050);
    assert_eq!(list(&["--status", "pending"]).as_array().unwrap().len(), 0);
    app.cleanup().await;
}
