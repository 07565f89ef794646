//! On-call, second round, against Azurite: the alert tells the whole story of
//! a mixed window; `poison list` never cuts an id, a key or an error's first
//! line; shell completions print.

use crate::common::*;
use aqw_core::handler::HandlerError;
use serde_json::{json, Value};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_window_alerts_once_with_every_cause_grouped() {
    let sink = Sink::start().await;
    let app = TestApp::new(
        json!({"key": "credits:{/account}:2026"}),
        json!({"maxDequeueCount": 2}),
        json!({"alert": {"webhook": format!("{}/alerts", sink.url), "window": "00:00:05"}}),
    );
    // The seeded incident: three ledger 503s, one closed account (404), one
    // producer that misspelled the key field.
    for account in ["a1", "a2", "a3", "acct-closed"] {
        app.enqueue(&format!(r#"{{"account":"{account}","credits":5}}"#))
            .await;
    }
    app.enqueue(r#"{"acount":"a4","credits":5}"#).await;
    let h = Scripted::new(|job, n| {
        if job.payload.contains("acct-closed") {
            Err(HandlerError::permanent(
                "HTTP 404 Not Found: account acct-closed is closed",
            ))
        } else {
            Err(HandlerError::retryable(format!(
                "HTTP 503 Service Unavailable (attempt {n})\nledger: upstream timeout"
            )))
        }
    });
    let w = app.start_worker(h.clone());
    let records = eventually("five records", DEADLINE, || async {
        let n = app.poison_messages().await.len();
        (n == 5).then_some(n)
    })
    .await;
    assert_eq!(records, 5);
    let alerts = eventually("every poisoning alerted", DEADLINE, || {
        let a = sink.to("/alerts");
        async move {
            let bodies: Vec<Value> = a
                .iter()
                .map(|r| serde_json::from_str(&r.body).unwrap())
                .collect();
            let total: u64 = bodies.iter().map(|b| b["count"].as_u64().unwrap()).sum();
            (total == 5).then_some(bodies)
        }
    })
    .await;
    w.stop().await;
    // Whatever the window split, no alert reports a group it does not have:
    // merge the groups of every alert and check the story.
    let mut by_cause: std::collections::BTreeMap<String, (u64, Vec<Value>)> = Default::default();
    for body in &alerts {
        assert_eq!(body["function"], "Job");
        assert_eq!(body["queue"], app.queue.as_str());
        assert_eq!(body["next"], format!("aqw triage {}", app.queue));
        assert_eq!(
            body["list"],
            format!("aqw poison list {} --status open", app.queue)
        );
        assert_eq!(body["runbook"], "aqw oncall");
        assert!(
            body["firstPoisonedAt"].as_str().unwrap() <= body["lastPoisonedAt"].as_str().unwrap()
        );
        let sum: u64 = body["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["count"].as_u64().unwrap())
            .sum();
        assert_eq!(sum, body["count"].as_u64().unwrap(), "{body}");
        for g in body["groups"].as_array().unwrap() {
            let cause = format!("{} {}", g["errorKind"], g["errorGroup"]);
            let e = by_cause.entry(cause).or_default();
            e.0 += g["count"].as_u64().unwrap();
            e.1.extend(g["keys"].as_array().unwrap().iter().cloned());
        }
    }
    assert_eq!(by_cause.len(), 3, "{by_cause:#?}");
    let (n503, keys503) = by_cause
        .iter()
        .find(|(c, _)| c.contains("HTTP 503"))
        .map(|(_, v)| v.clone())
        .unwrap();
    assert_eq!(n503, 3, "three ledger 503s, whatever their attempt numbers");
    assert_eq!(keys503.len(), 3);
    let (n404, keys404) = by_cause
        .iter()
        .find(|(c, _)| c.contains("HTTP 404"))
        .map(|(_, v)| v.clone())
        .unwrap();
    assert_eq!(
        (n404, keys404),
        (1, vec![json!("credits:acct-closed:2026")])
    );
    assert!(
        by_cause.keys().any(|c| c.contains("/account")),
        "{by_cause:#?}"
    );
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_list_shows_full_keys_ids_and_errors() {
    let app = TestApp::new(
        json!({"key": "credits:{/account}:{/period}:{/grant}"}),
        json!({"maxDequeueCount": 1}),
        json!({}),
    );
    let long_account = format!("acct-{}", "7".repeat(60));
    let id = app
        .enqueue(&format!(
            r#"{{"account":"{long_account}","period":"2026-12","grant":"welcome-bonus"}}"#
        ))
        .await;
    let error = format!(
        "HTTP 503 Service Unavailable from the ledger at https://ledger.example/grants/{long_account} after 3 retries"
    );
    let e2 = error.clone();
    let w = app.start_worker(Scripted::new(move |_, _| {
        Err(HandlerError::retryable(format!("{e2}\nsecond line")))
    }));
    eventually("poisoned", DEADLINE, || async {
        (app.poison_messages().await.len() == 1).then_some(())
    })
    .await;
    w.stop().await;
    let out = aqw(
        app.path(),
        &["poison", "list", &app.queue, "--status", "open"],
    );
    assert_eq!(out.status.code(), Some(1), "open records need a person");
    let text = String::from_utf8_lossy(&out.stdout);
    let key = format!("credits:{long_account}:2026-12:welcome-bonus");
    assert!(text.contains(&id), "{text}");
    assert!(text.contains(&key), "the whole key: {text}");
    assert!(
        text.contains(&error),
        "the whole first line of the error: {text}"
    );
    assert!(text.contains("+1 more line"), "says there is more: {text}");
    // --status lists its values in --help, and `all` is one of them.
    let help = aqw(app.path(), &["poison", "list", "--help"]);
    let help = String::from_utf8_lossy(&help.stdout);
    for v in ["open", "replayed", "discarded", "all"] {
        assert!(help.contains(v), "{help}");
    }
    let out = aqw(
        app.path(),
        &["poison", "list", &app.queue, "--status", "replayed"],
    );
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("no poison records"));
    let out = aqw(
        app.path(),
        &["poison", "list", &app.queue, "--status", "bogus"],
    );
    assert_eq!(out.status.code(), Some(2));
    // JSON stays complete.
    let out = aqw(
        app.path(),
        &["poison", "list", &app.queue, "--output", "json"],
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["key"], key.as_str());
    assert_eq!(v[0]["error"]["message"], format!("{error}\nsecond line"));
    app.cleanup().await;
}

#[test]
fn completions_print_for_each_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let out = std::process::Command::new(aqw_bin())
            .args(["completions", shell])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{shell}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("replay") && text.contains("discard"),
            "{shell}: {text}"
        );
    }
}

#[test]
fn help_ends_with_examples_and_exit_codes() {
    let out = std::process::Command::new(aqw_bin())
        .arg("--help")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Exit codes") && text.contains("NO_COLOR"),
        "{text}"
    );
    let out = std::process::Command::new(aqw_bin())
        .args(["poison", "replay", "--uncertain-checked", "--help"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("Examples:"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discard_close_key_turns_a_resend_into_a_duplicate_without_a_call() {
    let app = TestApp::new(
        json!({"key": "credits:{/account}:2026"}),
        json!({"maxDequeueCount": 1}),
        json!({}),
    );
    let closed = r#"{"account":"acct-closed","credits":5}"#;
    let other = r#"{"account":"acct-open","credits":5}"#;
    let id_closed = app.enqueue(closed).await;
    let id_other = app.enqueue(other).await;
    let w = app.start_worker(Scripted::new(|_, _| {
        Err(HandlerError::permanent(
            "HTTP 404 Not Found: account is closed",
        ))
    }));
    eventually("both poisoned", DEADLINE, || async {
        (app.poison_messages().await.len() == 2).then_some(())
    })
    .await;
    w.stop().await;
    // With --close-key: the key is cancelled, and the output says so.
    let out = aqw(
        app.path(),
        &[
            "poison",
            "discard",
            &app.queue,
            "--id",
            &id_closed,
            "--reason",
            "account closed",
            "--by",
            "oncall",
            "--close-key",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("closed: a resend is a duplicate"));
    // Without it: the key stays poisoned, and the output says a resend runs.
    let out = aqw(
        app.path(),
        &[
            "poison",
            "discard",
            &app.queue,
            "--id",
            &id_other,
            "--reason",
            "sent by hand",
            "--by",
            "oncall",
        ],
    );
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("left poisoned: a resend runs"));
    let keys = aqw(
        app.path(),
        &[
            "keys",
            "show",
            "Job",
            "credits:acct-closed:2026",
            "--output",
            "json",
        ],
    );
    let k: Value = serde_json::from_slice(&keys.stdout).unwrap();
    assert_eq!(k["status"], "cancelled");
    assert_eq!(k["cancelledBy"], "oncall");
    assert_eq!(k["cancelReason"], "account closed");
    let text = aqw(
        app.path(),
        &["keys", "show", "Job", "credits:acct-closed:2026"],
    );
    assert!(String::from_utf8_lossy(&text.stdout).contains("cancelled:"));
    // The producer resends both jobs.
    app.enqueue(closed).await;
    app.enqueue(other).await;
    let h = Scripted::new(|_, _| Ok(aqw_core::handler::Success::done()));
    let w = app.start_worker(h.clone());
    app.drained(DEADLINE).await;
    w.stop().await;
    let ran: Vec<String> = h
        .jobs
        .lock()
        .unwrap()
        .iter()
        .map(|j| j.payload.clone())
        .collect();
    assert_eq!(ran, vec![other.to_string()], "the closed job made no call");
    // A keyless record cannot close a key: a usage error, nothing changed.
    let out = aqw(
        app.path(),
        &[
            "poison",
            "discard",
            &app.queue,
            "--id",
            "no-such-record",
            "--reason",
            "x",
            "--close-key",
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempt_history_flags_an_attempt_that_may_have_taken_effect() {
    let app = TestApp::new(
        json!({"key": "credits:{/account}:2026"}),
        json!({"maxDequeueCount": 3}),
        json!({}),
    );
    let id = app.enqueue(r#"{"account":"a7","credits":5}"#).await;
    let w = app.start_worker(Scripted::new(|_, n| match n {
        2 => Err(HandlerError::uncertain(
            "HTTP 504 Gateway Timeout from the ledger",
        )),
        _ => Err(HandlerError::retryable("HTTP 503 Service Unavailable")),
    }));
    eventually("poisoned", DEADLINE, || async {
        (app.poison_messages().await.len() == 1).then_some(())
    })
    .await;
    w.stop().await;
    let show = aqw(
        app.path(),
        &["poison", "show", &app.queue, &id, "--output", "json"],
    );
    let v: Value = serde_json::from_slice(&show.stdout).unwrap();
    let history = v["keyRecord"]["history"].as_array().unwrap().clone();
    let outcomes: Vec<&str> = history
        .iter()
        .map(|a| a["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["retried", "retried", "poisoned"], "{history:#?}");
    let counts: Vec<u64> = history
        .iter()
        .map(|a| a["dequeueCount"].as_u64().unwrap())
        .collect();
    assert_eq!(counts, [1, 2, 3]);
    assert_eq!(history[1]["mayHaveTakenEffect"], true);
    assert!(history[1]["error"].as_str().unwrap().contains("504"));
    assert!(history[0].get("mayHaveTakenEffect").is_none());
    let text = aqw(app.path(), &["poison", "show", &app.queue, &id]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("[may have taken effect]"), "{text}");
    assert!(text.contains("HTTP 504 Gateway Timeout"), "{text}");
    // Fixed, replayed, done: the history stays, as history.
    let out = aqw(
        app.path(),
        &[
            "poison",
            "replay",
            "--uncertain-checked",
            &app.queue,
            "--id",
            &id,
            "--by",
            "t",
        ],
    );
    assert_eq!(out.status.code(), Some(0));
    let w = app.start_worker(Scripted::new(|_, _| Ok(aqw_core::handler::Success::done())));
    app.drained(DEADLINE).await;
    w.stop().await;
    let keys = aqw(app.path(), &["keys", "show", "Job", "credits:a7:2026"]);
    let keys = String::from_utf8_lossy(&keys.stdout);
    assert!(keys.contains("done at"), "{keys}");
    assert!(
        !keys.contains("last error"),
        "a done key shows no current error: {keys}"
    );
    assert!(
        keys.contains("[may have taken effect]") && keys.contains("completed"),
        "{keys}"
    );
    let json_keys = aqw(
        app.path(),
        &["keys", "show", "Job", "credits:a7:2026", "--output", "json"],
    );
    let k: Value = serde_json::from_slice(&json_keys.stdout).unwrap();
    assert_eq!(k["history"].as_array().unwrap().len(), 4);
    assert_eq!(k["lastError"], Value::Null, "cleared when done");
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fix_puts_the_corrected_payload_closes_the_record_and_confirms_the_key() {
    let app = TestApp::new(
        json!({"key": "credits:{/account}:2026"}),
        json!({"maxDequeueCount": 3}),
        json!({}),
    );
    // A producer misspelled the key field: poisoned at once, no key.
    let bad = r#"{"acount":"a4","credits":5}"#;
    let id = app.enqueue(bad).await;
    // And a job that already happened, for the second case.
    app.enqueue(r#"{"account":"a9","credits":5}"#).await;
    let h = Scripted::new(|_, _| Ok(aqw_core::handler::Success::done()));
    let w = app.start_worker(h.clone());
    eventually("poisoned", DEADLINE, || async {
        (app.poison_messages().await.len() == 1).then_some(())
    })
    .await;
    app.drained(DEADLINE).await;
    // Still bad: refused (exit 2), nothing changed.
    let out = aqw(
        app.path(),
        &[
            "poison",
            "fix",
            &app.queue,
            "--id",
            &id,
            "--payload",
            r#"{"acount":"a4"}"#,
            "--by",
            "oncall",
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/account"));
    // A corrected payload whose key is already done: reported, nothing put.
    let out = aqw(
        app.path(),
        &[
            "poison",
            "fix",
            &app.queue,
            "--id",
            &id,
            "--payload",
            r#"{"account":"a9","credits":5}"#,
            "--by",
            "oncall",
            "--output",
            "json",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["action"], "already-done");
    let (rec, _) = app.records().get(&app.queue, &id).await.unwrap().unwrap();
    assert_eq!(rec["Status"], "open");
    // The real fix, with the worker running: confirmed done.
    let fixed = r#"{"account":"a4","credits":5}"#;
    let out = aqw(
        app.path(),
        &[
            "poison",
            "fix",
            &app.queue,
            "--id",
            &id,
            "--payload",
            fixed,
            "--by",
            "oncall",
            "--wait",
            "00:01:00",
            "--output",
            "json",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["action"], "replaced");
    assert_eq!(v["newKey"], "credits:a4:2026");
    assert_eq!(v["confirmed"], true);
    assert_eq!(v["sizeDiff"], 1, "acount → account: one byte longer");
    w.stop().await;
    let ran: Vec<String> = h
        .jobs
        .lock()
        .unwrap()
        .iter()
        .map(|j| j.payload.clone())
        .collect();
    assert_eq!(
        ran.iter().filter(|p| p.as_str() == fixed).count(),
        1,
        "{ran:?}"
    );
    let (rec, _) = app.records().get(&app.queue, &id).await.unwrap().unwrap();
    assert_eq!(rec["Status"], "replaced");
    assert_eq!(rec["ReplacedBy"], "oncall");
    assert_eq!(rec["ReplacementKey"], "credits:a4:2026");
    assert_eq!(rec["ReplacementMessageId"], v["newMessageId"]);
    assert!(
        app.poison_messages().await.is_empty(),
        "the poison copy is gone"
    );
    let list = aqw(
        app.path(),
        &["poison", "list", &app.queue, "--status", "replaced"],
    );
    assert!(String::from_utf8_lossy(&list.stdout).contains(&id));
    app.cleanup().await;
}
