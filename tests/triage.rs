//! `aqw triage` and `aqw oncall` (issue 52) on Azurite: records of five
//! kinds seeded by a worker (an outage of two with uncertain attempts, one
//! of them applied at the provider; a saved failure; a business refusal; a
//! bad producer's batch of three; a closed account), a provider lookup
//! that knows which provider keys it applied. `triage` names each group's
//! cause and commands (text and JSON, exit 1), running exactly its printed
//! commands in order closes every record (exit 0), the dashboard's front
//! page shows the same plan, and `aqw oncall` prints every kind's page.

use crate::common::{aqw, aqw_bin, eventually, Scripted, TestApp, CONN};
use aqw_core::handler::{HandlerError, Success};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(90);

/// A provider's lookup: 200 for the provider keys it applied, 404 otherwise.
async fn lookup(applied: Arc<Mutex<HashSet<String>>>) -> String {
    async fn answer(
        State(a): State<Arc<Mutex<HashSet<String>>>>,
        Path(pk): Path<String>,
    ) -> StatusCode {
        match a.lock().unwrap().contains(&pk) {
            true => StatusCode::OK,
            false => StatusCode::NOT_FOUND,
        }
    }
    let app = axum::Router::new()
        .route("/idempotency/{pk}", axum::routing::get(answer))
        .with_state(applied);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

/// The seeded incident; returns the app and the lookup's applied set.
async fn seeded() -> (TestApp, Arc<Mutex<HashSet<String>>>) {
    let applied = Arc::new(Mutex::new(HashSet::new()));
    let base = lookup(applied.clone()).await;
    let app = TestApp::new(
        json!({"key": "payout:{/payoutId}",
               "handler": {"type": "http", "url": format!("{base}/effects"),
                           "lookup": {"url": format!("{base}/idempotency/{{providerKey}}"), "timeout": "00:00:05"}}}),
        json!({"maxDequeueCount": 2}),
        json!({}),
    );
    for p in ["o-1", "o-2", "s-1", "r-1", "c-1"] {
        app.enqueue(&json!({"payoutId": p, "amount": 5}).to_string())
            .await;
    }
    for b in ["b-1", "b-2", "b-3"] {
        app.enqueue(&json!({"payoutID": b, "amount": 5}).to_string())
            .await;
    }
    let h = Scripted::new(|job, _| {
        let p = &job.payload;
        Err(if p.contains("\"o-") {
            HandlerError::uncertain("HTTP 503 Service Unavailable: ledger down")
        } else if p.contains("s-1") {
            HandlerError::ReplayedFailure {
                message: "HTTP 402 Payment Required (replayed: the provider answered this Idempotency-Key with the failure it saved from an earlier attempt)".into(),
            }
        } else if p.contains("r-1") {
            HandlerError::permanent("HTTP 402 Payment Required: insufficient funds")
        } else {
            HandlerError::permanent("HTTP 404 Not Found: account acct-9 is closed")
        })
    });
    let w = app.start_worker(h);
    eventually("eight records", DEADLINE, || async {
        (app.poison_messages().await.len() == 8).then_some(())
    })
    .await;
    w.stop().await;
    // o-1 was in fact paid: the provider's lookup knows its provider key.
    let k = aqw_core::idempotency::IdempotencyKey::new("payout:o-1").unwrap();
    let rec = app.keys().get("Job", &k).await.unwrap().unwrap();
    applied.lock().unwrap().insert(rec.provider_key);
    (app, applied)
}

/// The dashboard's front page (read-only, no authentication), by oneshot.
async fn front_page(app: &TestApp) -> String {
    use tower::ServiceExt as _;
    let options = aqw::dashboard::Options {
        read_only: true,
        ..Default::default()
    };
    let d = aqw::dashboard::Dashboard::new(app.config.clone(), options).unwrap();
    let router = aqw::dashboard::app(Arc::new(d));
    let req = axum::http::Request::get("/")
        .body(axum::body::Body::empty())
        .unwrap();
    let resp = router.oneshot(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let bytes = axum::body::to_bytes(resp.into_body(), 16 << 20)
        .await
        .unwrap();
    String::from_utf8_lossy(&bytes).into_owned()
}

pub(crate) fn triage_json(app: &TestApp) -> (Option<i32>, Value) {
    let out = aqw(app.path(), &["triage", &app.queue, "--output", "json"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    (out.status.code(), v)
}

/// One printed command, run as a shell runs it, from the app folder's
/// settings (`AQW_APP`), `--by` left to `$USER`.
pub(crate) fn shell(app: &TestApp, command: &str) -> std::process::Output {
    let bin_dir = aqw_bin().parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    std::process::Command::new("sh")
        .args(["-c", command])
        .env("PATH", path)
        .env("AQW_APP", app.path())
        .env("AzureWebJobsStorage", CONN)
        .env("USER", "tester")
        .env_remove("AQW_LOG")
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn triage_groups_an_incident_and_its_printed_commands_close_it() {
    let (app, _applied) = seeded().await;
    let (code, plan) = triage_json(&app);
    assert_eq!(code, Some(1), "records are open: {plan:#}");
    assert_eq!(plan["open"], 8);
    let causes: Vec<&str> = plan["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["cause"].as_str().unwrap())
        .collect();
    assert_eq!(
        causes,
        [
            "outage",
            "bad-producer",
            "saved-failure",
            "refusal",
            "closed"
        ],
        "{plan:#}"
    );
    assert!(
        plan["provider"]["savesFailures"]
            .as_str()
            .unwrap()
            .contains("replayed_failure"),
        "{plan:#}"
    );
    let group = |cause: &str| {
        plan["groups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["cause"] == cause)
            .unwrap()
            .clone()
    };
    let runs = |g: &Value| -> Vec<String> {
        g["steps"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["kind"] == "run")
            .map(|s| s["text"].as_str().unwrap().to_string())
            .collect()
    };
    let outage = group("outage");
    assert_eq!(outage["count"], 2);
    let lookups: Vec<&str> = outage["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["lookup"]["verdict"].as_str().unwrap())
        .collect();
    assert!(
        lookups.contains(&"applied") && lookups.contains(&"not-applied"),
        "{outage:#}"
    );
    let q = &app.queue;
    assert_eq!(
        runs(&outage)[1],
        format!("aqw poison replay {q} --all --error '^HTTP 503 Service Unavailable: ledger down' --wait 00:05:00")
    );
    assert!(runs(&group("bad-producer"))[1]
        .contains(r#"--patch '[{"op":"move","from":"/payoutID","path":"/payoutId"}]'"#));
    for cause in ["saved-failure", "refusal"] {
        let r = runs(&group(cause));
        assert!(
            r[0].starts_with("aqw keys new-provider-key Job payout:"),
            "{cause}: {r:?}"
        );
        assert!(
            r[2].starts_with(&format!("aqw poison replay {q} --id ")),
            "{cause}: {r:?}"
        );
    }
    assert!(runs(&group("closed"))[1].ends_with("--close-key"));
    let text = aqw(app.path(), &["triage", q]);
    let text = String::from_utf8_lossy(&text.stdout).to_string();
    assert!(
        text.contains("1. outage: 2 × retryable") && text.contains("runbook: aqw oncall closed"),
        "{text}"
    );
    assert!(text.contains("provider says: applied"), "{text}");
    // The dashboard's front page: the same plan, at the top.
    let page = front_page(&app).await;
    let at = page.find("Triage: ").unwrap_or_else(|| panic!("{page}"));
    assert!(
        at < page.find("id=\"status\"").unwrap(),
        "the triage comes first"
    );
    assert!(
        page.contains("data-cause=\"bad-producer\"") && page.contains("aqw oncall closed"),
        "{page}"
    );

    // Recovery: the provider answers again; every printed command, in order.
    let w = app.start_worker(Scripted::new(|_, _| Ok(Success::default())));
    for g in plan["groups"].as_array().unwrap() {
        for command in runs(g) {
            let out = shell(&app, &command);
            assert_eq!(
                out.status.code(),
                Some(0),
                "{command}\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    let (code, after) = eventually("nothing open", DEADLINE, || async {
        let (code, v) = triage_json(&app);
        (code == Some(0)).then_some((code, v))
    })
    .await;
    w.stop().await;
    assert_eq!(
        (code, after["open"].clone(), after["groups"].clone()),
        (Some(0), json!(0), json!([]))
    );
    let out = aqw(app.path(), &["triage", q]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing open"));
    let k = aqw_core::idempotency::IdempotencyKey::new("payout:c-1").unwrap();
    let closed = app.keys().get("Job", &k).await.unwrap().unwrap();
    assert_eq!(
        closed.status,
        aqw_core::idempotency::KeyStatus::Cancelled,
        "the closed account never runs"
    );
    app.cleanup().await;
}

#[test]
fn triage_of_an_unknown_queue_is_a_usage_error() {
    let app = TestApp::new(json!({}), json!({}), json!({}));
    assert_eq!(
        aqw(app.path(), &["triage", "nosuchqueue"]).status.code(),
        Some(2)
    );
}

/// `aqw oncall`: every kind prints its page from the binary; an unknown
/// kind exits 2 naming the kinds.
#[test]
fn oncall_prints_every_kind_and_refuses_an_unknown_one() {
    let run = |args: &[&str]| {
        std::process::Command::new(aqw_bin())
            .args(args)
            .output()
            .unwrap()
    };
    let kinds = [
        "outage",
        "bad-producer",
        "uncertain",
        "saved-failure",
        "refusal",
        "claim-check",
        "closed",
    ];
    for k in kinds {
        let out = run(&["oncall", k]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{k}");
        assert!(text.contains(&format!("## {k}:")), "{k}: {text}");
        assert!(
            text.contains(env!("CARGO_PKG_VERSION")),
            "version-matched: {text}"
        );
    }
    let all = run(&["oncall"]);
    assert!(String::from_utf8_lossy(&all.stdout).contains("aqw triage QUEUE"));
    let out = run(&["oncall", "meteor-strike"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(kinds.iter().all(|k| err.contains(k)), "{err}");
}
