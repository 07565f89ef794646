//! On-call, third round, against Azurite: an operator proves "exactly once"
//! from aqw's own records (the provider's replay header), sees which attempt
//! was really uncertain, rehearses every write command without changing a
//! row, and reads the effective configuration without a secret in it.

use crate::common::*;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(60);

/// A provider with an idempotency store: the first request of a key is
/// applied and then never answered (the caller times out: outcome
/// unknown); the second is refused with 503 (read-only); any later one is
/// answered from the store with `Idempotent-Replayed: true`.
#[derive(Clone, Default)]
struct Provider {
    seen: Arc<Mutex<BTreeMap<String, u32>>>,
    applied: Arc<Mutex<HashSet<String>>>,
}

impl Provider {
    async fn start(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new()
            .route("/pay", post(answer))
            .with_state(self.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        format!("http://{addr}/pay")
    }
}

async fn answer(
    axum::extract::State(p): axum::extract::State<Provider>,
    headers: HeaderMap,
) -> axum::response::Response {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let n = {
        let mut seen = p.seen.lock().unwrap();
        let n = seen.entry(key.clone()).or_insert(0);
        *n += 1;
        *n
    };
    match n {
        1 => {
            p.applied.lock().unwrap().insert(key);
            // Applied, never answered: aqw's timeout ends the attempt.
            std::future::pending::<()>().await;
            unreachable!()
        }
        2 => (StatusCode::SERVICE_UNAVAILABLE, "ledger is read-only").into_response(),
        _ => (
            StatusCode::OK,
            [("Idempotent-Replayed", "true")],
            r#"{"payment":"pay-1","status":"captured"}"#,
        )
            .into_response(),
    }
}

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Every row of the key and poison tables, and both queues' depths.
async fn snapshot(app: &TestApp) -> (Vec<(String, String, Value)>, u64, u64) {
    let mut rows = Vec::new();
    for t in [app.keys().table().clone(), app.records()] {
        for (pk, rk, e) in t.query(None).await.unwrap() {
            rows.push((pk, rk, Value::Object(e)));
        }
    }
    rows.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    let source = TestApp::exact_count(app.source().as_ref()).await;
    let poison = TestApp::exact_count(app.poison_queue().as_ref()).await;
    (rows, source, poison)
}

fn payment_app(url: &str) -> TestApp {
    TestApp::new(
        json!({
            "key": "pay:{/order}",
            "handler": {"type": "http", "url": url, "timeout": "00:00:01",
                        "replayHeader": "Idempotent-Replayed",
                        // This provider documents its 503 as "read-only,
                        // nothing applied"; a 503 is otherwise uncertain
                        // (a proxy answers it after a reset too).
                        "refusedStatuses": [503]}
        }),
        json!({"maxDequeueCount": 2}),
        json!({}),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_payment_is_proved_once_by_the_providers_replay() {
    let provider = Provider::default();
    let app = payment_app(&provider.start().await);
    let id = app.enqueue(r#"{"order":"o-77","amount":12}"#).await;
    let status = text(&aqw(app.path(), &["status"]));
    assert!(status.contains("never (no worker has polled)"), "{status}");
    let w = app.start_configured_worker();
    let q = app.queue.clone();
    eventually("the payment poisoned", DEADLINE, || async {
        let out = aqw(app.path(), &["poison", "list", &q, "--status", "open"]);
        text(&out).contains(&id).then_some(())
    })
    .await;
    // The worker marks the key poisoned after writing the record.
    let key = aqw_core::idempotency::IdempotencyKey::new("pay:o-77".to_string()).unwrap();
    eventually("the payment's key poisoned", DEADLINE, || async {
        let rec = app.keys().get("Job", &key).await.ok()??;
        (rec.status == aqw_core::idempotency::KeyStatus::Poisoned).then_some(())
    })
    .await;
    let status = text(&aqw(app.path(), &["status"]));
    assert!(status.contains("(1 worker(s) polling)"), "{status}");
    the_uncertain_attempt_stands_out(&app, &id);
    let before = snapshot(&app).await;
    every_write_command_rehearses(&app, &id);
    assert_eq!(snapshot(&app).await, before, "a dry run changed nothing");

    let wait = [
        "poison",
        "replay",
        "--uncertain-checked",
        &q,
        "--id",
        &id,
        "--by",
        "op",
        "--wait",
        "00:00:30",
    ];
    let out = aqw(app.path(), &wait);
    let report = text(&out);
    assert!(out.status.success(), "{report}");
    assert!(
        report.contains("[completed (provider: replayed)]"),
        "{report}"
    );
    let keys = text(&aqw(app.path(), &["keys", "show", "Job", "pay:o-77"]));
    assert!(keys.contains("(provider: replayed:"), "{keys}");
    assert_eq!(provider.applied.lock().unwrap().len(), 1, "applied once");
    let open = text(&aqw(
        app.path(),
        &["poison", "list", &q, "--status", "open"],
    ));
    assert!(open.contains("(0 open, 1 in all)"), "{open}");
    // Issue 39: the warning resolves once the key is done.
    let show = text(&aqw(app.path(), &["poison", "show", &q, &id]));
    assert!(
        show.contains("resolved:      the key is done (provider: replayed)"),
        "{show}"
    );
    let all = text(&aqw(app.path(), &["poison", "list", &q]));
    assert!(
        !all.contains("check the provider before replaying"),
        "{all}"
    );
    assert!(
        all.contains("record replayed: `aqw poison show` says how its key ended"),
        "{all}"
    );
    w.stop().await;
    app.cleanup().await;
}

/// `poison list` marks the record although its last error is a refusal;
/// `poison show` says which attempt may have taken effect and which did not.
fn the_uncertain_attempt_stands_out(app: &TestApp, id: &str) {
    let q = app.queue.as_str();
    let list = text(&aqw(app.path(), &["poison", "list", q]));
    assert!(
        list.contains("1 attempt(s) may have taken effect"),
        "{list}"
    );
    let show = text(&aqw(app.path(), &["poison", "show", q, id]));
    let line = |what: &str| show.lines().find(|l| l.contains(what)).unwrap();
    assert!(
        line("retried   POST").contains("[may have taken effect]"),
        "{show}"
    );
    let refused = line("poisoned  HTTP 503");
    assert!(refused.contains("[refused, not applied]"), "{show}");
    assert!(!refused.contains("may have taken effect"), "{show}");
    assert!(
        show.contains(r#"{"order":"o-77","amount":12}"#),
        "exact text: {show}"
    );
}

/// discard, fix and replay with --dry-run: what each would do, key and state.
fn every_write_command_rehearses(app: &TestApp, id: &str) {
    let q = app.queue.as_str();
    let discard = [
        "poison", "discard", q, "--id", id, "--reason", "r", "--by", "op",
    ];
    let dry = text(&aqw(
        app.path(),
        &[&discard[..], &["--close-key", "--dry-run"]].concat(),
    ));
    assert!(
        dry.contains("would:     close the record and the key"),
        "{dry}"
    );
    let fixed = app.path().join("fixed.json");
    std::fs::write(&fixed, r#"{"order":"o-77","amount":13}"#).unwrap();
    let fix = [
        "poison",
        "fix",
        q,
        "--id",
        id,
        "--by",
        "op",
        "--dry-run",
        "--file",
    ];
    let dry = text(&aqw(
        app.path(),
        &[&fix[..], &[fixed.to_str().unwrap()]].concat(),
    ));
    assert!(dry.contains("new key:   pay:o-77"), "{dry}");
    assert!(
        dry.contains("key state: poisoned after 2 attempt(s)"),
        "{dry}"
    );
    assert!(
        dry.contains("- /amount: 12") && dry.contains("+ /amount: 13"),
        "{dry}"
    );
    let replay = [
        "poison",
        "replay",
        "--uncertain-checked",
        q,
        "--id",
        id,
        "--dry-run",
    ];
    let dry = text(&aqw(app.path(), &replay));
    assert!(
        dry.contains("key pay:o-77 (poisoned after 2 attempt(s))"),
        "{dry}"
    );
}

/// `config show`, text and JSON, with every kind of secret in the settings.
#[test]
fn config_show_never_prints_a_secret() {
    let dir = tempfile::tempdir().unwrap();
    let host = json!({"version": "2.0", "aqw": {
        "functions": {"Pay": {"queue": "payments", "key": "pay:{/order}",
            "handler": {"type": "http", "url": "https://user:pw-secret@ledger.example/pay?code=url-secret",
                        "replayHeader": "Idempotent-Replayed", "refusedStatuses": [500]}}},
        "alert": {"webhook": "https://hooks.example/x?token=hook-secret"}}});
    std::fs::write(dir.path().join("host.json"), host.to_string()).unwrap();
    let secrets = [
        "c2VjcmV0LWFjY291bnQta2V5",
        "sas-secret",
        "pw-secret",
        "url-secret",
        "hook-secret",
        "dash-secret",
        "ikey-secret",
    ];
    let connections = [
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=c2VjcmV0LWFjY291bnQta2V5;EndpointSuffix=core.windows.net",
        "QueueEndpoint=https://acct.queue.core.windows.net;TableEndpoint=https://acct.table.core.windows.net;SharedAccessSignature=sv=2022-11-02&sig=sas-secret",
        "BlobEndpoint=https://acct.blob.core.windows.net;QueueEndpoint=https://acct.queue.core.windows.net/?sv=1&sig=sas-secret;TableEndpoint=https://acct.table.core.windows.net;SharedAccessSignature=sv=1&sig=sas-secret",
    ];
    for conn in connections {
        for output in ["text", "json"] {
            let out = std::process::Command::new(aqw_bin())
                .args(["config", "show", "--output", output, "--app"])
                .arg(dir.path())
                .env("AzureWebJobsStorage", conn)
                .env("AQW_DASHBOARD_TOKEN", "dash-secret")
                .env(
                    "APPLICATIONINSIGHTS_CONNECTION_STRING",
                    "InstrumentationKey=ikey-secret;IngestionEndpoint=https://dc.example/",
                )
                .output()
                .unwrap();
            let all = text(&out);
            assert!(out.status.success(), "{all}");
            for s in secrets {
                assert!(
                    !all.contains(s),
                    "{s} printed by config show ({output}): {all}"
                );
            }
            assert!(
                all.contains("payments") && all.contains("ledger.example"),
                "{all}"
            );
            assert!(
                all.contains("Idempotent-Replayed") && all.contains("425,429,500"),
                "{all}"
            );
            assert!(
                all.contains("environment") && all.contains("host.json"),
                "{all}"
            );
        }
    }
}
