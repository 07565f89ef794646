//! The payouts incident of issue 52, played against a real HTTP provider
//! on Azurite: seven poison records of five kinds (an outage of two, one of
//! them in fact paid; a refusal the provider saved under its key; a bad
//! producer's batch of three; a closed account). The provider keeps an
//! idempotency store (a key's first answer, success or failure, is the
//! answer to every later request of that key, marked
//! `Idempotent-Replayed`) and a lookup of the keys it applied. After the
//! provider recovers, running exactly the commands `aqw triage` prints, in
//! order, reaches the correct end state: each payout once, the closed
//! account never, every record closed, `poison report` exit 0.

use crate::common::{aqw, eventually, TestApp};
use crate::triage::{shell, triage_json};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(120);

#[derive(Default)]
struct Ledger {
    /// The `o-` shard is down: it answers 503 (o-1's first request is
    /// applied before the 503: paid, answer lost).
    shard_down: bool,
    /// s-1's account has no funds (402, saved under the key).
    funds_short: bool,
    /// Each key's first answer, replayed to every later request of it.
    saved: HashMap<String, (u16, String)>,
    /// Provider keys whose request was applied.
    applied: HashSet<String>,
    /// Payouts made, by payout id.
    paid: BTreeMap<String, u32>,
}

type Shared = Arc<Mutex<Ledger>>;

async fn pay(State(l): State<Shared>, headers: HeaderMap, body: String) -> Response {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let payout = serde_json::from_str::<Value>(&body)
        .ok()
        .and_then(|v| v["payoutId"].as_str().map(str::to_string))
        .unwrap_or_default();
    let mut l = l.lock().unwrap();
    // The shard is down for every request of its payouts, its idempotency
    // store included.
    if payout.starts_with("o-") && l.shard_down {
        if payout == "o-1" && l.paid.is_empty() {
            // o-1's first request is applied, then the shard fails before answering.
            l.applied.insert(key.clone());
            *l.paid.entry(payout).or_default() += 1;
            l.saved.insert(key, (200, r#"{"status":"paid"}"#.into()));
        }
        return (StatusCode::SERVICE_UNAVAILABLE, "ledger shard down").into_response();
    }
    if let Some((status, text)) = l.saved.get(&key).cloned() {
        let status = StatusCode::from_u16(status).unwrap();
        return (status, [("Idempotent-Replayed", "true")], text).into_response();
    }
    let (status, text) = if payout == "c-1" {
        (404, "account acct-9 is closed".to_string())
    } else if payout == "s-1" && l.funds_short {
        (402, "insufficient funds".to_string())
    } else {
        l.applied.insert(key.clone());
        *l.paid.entry(payout).or_default() += 1;
        (200, r#"{"status":"paid"}"#.to_string())
    };
    l.saved.insert(key, (status, text.clone()));
    (StatusCode::from_u16(status).unwrap(), text).into_response()
}

async fn lookup(State(l): State<Shared>, Path(pk): Path<String>) -> StatusCode {
    match l.lock().unwrap().applied.contains(&pk) {
        true => StatusCode::OK,
        false => StatusCode::NOT_FOUND,
    }
}

async fn provider(ledger: Shared) -> String {
    let app = axum::Router::new()
        .route("/pay", axum::routing::post(pay))
        .route("/idempotency/{pk}", axum::routing::get(lookup))
        .with_state(ledger);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

fn runnable(plan: &Value) -> Vec<String> {
    plan["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["steps"].as_array().unwrap().clone())
        .filter(|s| s["kind"] == "run")
        .map(|s| s["text"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_payouts_incident_closes_by_triages_commands_alone() {
    let ledger: Shared = Arc::new(Mutex::new(Ledger {
        shard_down: true,
        funds_short: true,
        ..Default::default()
    }));
    let base = provider(ledger.clone()).await;
    let app = TestApp::new(
        json!({"key": "payout:{/payoutId}",
               "handler": {"type": "http", "url": format!("{base}/pay"), "timeout": "00:00:05",
                           "replayHeader": "Idempotent-Replayed", "savesFailures": true,
                           "lookup": {"url": format!("{base}/idempotency/{{providerKey}}"), "timeout": "00:00:05"}}}),
        json!({"maxDequeueCount": 2}),
        json!({}),
    );
    for p in ["o-1", "o-2", "s-1", "c-1"] {
        app.enqueue(&json!({"payoutId": p, "amount": 5}).to_string())
            .await;
    }
    for b in ["b-1", "b-2", "b-3"] {
        app.enqueue(&json!({"payoutID": b, "amount": 5}).to_string())
            .await;
    }
    let w = app.start_configured_worker();
    eventually("seven records", DEADLINE, || async {
        (app.poison_messages().await.len() == 7).then_some(())
    })
    .await;
    w.stop().await;

    let (code, plan) = triage_json(&app);
    assert_eq!(
        (code, plan["open"].clone()),
        (Some(1), json!(7)),
        "{plan:#}"
    );
    let causes: Vec<&str> = plan["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["cause"].as_str().unwrap())
        .collect();
    assert_eq!(
        causes,
        ["outage", "bad-producer", "refusal", "closed"],
        "{plan:#}"
    );
    let commands = runnable(&plan);
    eprintln!("incident: triage printed {commands:#?}");
    assert!(
        commands.iter().any(|c| c.contains("keys new-provider-key")),
        "the saved refusal needs a new provider key: {commands:#?}"
    );

    // The provider recovers and the account is funded; run what triage printed.
    {
        let mut l = ledger.lock().unwrap();
        l.shard_down = false;
        l.funds_short = false;
    }
    let w = app.start_configured_worker();
    for command in &commands {
        let out = shell(&app, command);
        assert!(
            matches!(out.status.code(), Some(0)),
            "{command}\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    eventually("nothing open", DEADLINE, || async {
        (triage_json(&app).0 == Some(0)).then_some(())
    })
    .await;
    app.drained(DEADLINE).await;
    w.stop().await;

    let paid = ledger.lock().unwrap().paid.clone();
    let want: BTreeMap<String, u32> = ["b-1", "b-2", "b-3", "o-1", "o-2", "s-1"]
        .iter()
        .map(|p| (p.to_string(), 1))
        .collect();
    assert_eq!(paid, want, "each payout once, the closed account never");
    let report = aqw(
        app.path(),
        &["poison", "report", &app.queue, "--since", "01:00:00"],
    );
    assert_eq!(
        report.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&report.stdout)
    );
    app.cleanup().await;
}
