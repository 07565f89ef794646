//! `aqw poison report` (issue 39) on a seeded incident against Azurite:
//! four records poisoned by a worker, then one replayed (its uncertain
//! attempt checked; the provider answers the replay from its idempotency
//! store), one fixed (a corrected payload under a new key, applied fresh),
//! one discarded with its key closed, and one left open with an attempt
//! that may have taken effect. The report, in text and JSON, names each
//! decision, who, the key's final state, the provider's answer and the
//! uncertain attempt's provider key, a line for the fix's new key, and
//! totals that confirm each effect once.

use crate::common::{aqw, eventually, Scripted, TestApp};
use aqw_core::handler::{HandlerError, ProviderAnswer, Success};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(60);

/// The provider as the handler sees it: per order, how many calls it got
/// and how many it applied.
#[derive(Default)]
struct Ledger {
    calls: HashMap<String, u32>,
    applied: HashMap<String, u32>,
}

fn order_of(payload: &str) -> String {
    let v: Value = serde_json::from_str(payload).unwrap_or_default();
    v["orderId"].as_str().unwrap_or_default().to_string()
}

/// o-r: the first call is applied but times out (uncertain), later ones are
/// answered from the provider's store (replayed). o-u: always times out.
/// o-d: refused for good. A non-numeric amount: refused (422). Anything
/// else: applied fresh (201).
fn provider(ledger: Arc<Mutex<Ledger>>) -> Arc<Scripted> {
    Scripted::new(move |job, _| {
        let order = order_of(&job.payload);
        let mut l = ledger.lock().unwrap();
        let n = {
            let c = l.calls.entry(order.clone()).or_insert(0);
            *c += 1;
            *c
        };
        let answer = |replayed| {
            Ok(Success::answered(ProviderAnswer {
                status: if replayed { 200 } else { 201 },
                body: String::new(),
                replayed,
            }))
        };
        match order.as_str() {
            "o-r" if n == 1 => {
                *l.applied.entry(order).or_insert(0) += 1;
                Err(HandlerError::uncertain("timed out after 00:00:10"))
            }
            "o-r" => answer(true),
            "o-u" => Err(HandlerError::uncertain("timed out after 00:00:10")),
            "o-d" => Err(HandlerError::permanent("HTTP 404: no such order")),
            _ if job.payload.contains("\"x\"") => {
                Err(HandlerError::permanent("HTTP 422: amount is not a number"))
            }
            _ => {
                *l.applied.entry(order).or_insert(0) += 1;
                answer(false)
            }
        }
    })
}

fn run_ok(app: &TestApp, args: &[&str]) {
    let out = aqw(app.path(), args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The incident: four records, then a replay, a fix and a discard.
/// Returns the record ids in the order r, f, d, u.
async fn seed_incident(app: &TestApp, ledger: Arc<Mutex<Ledger>>) -> [String; 4] {
    let r = app.enqueue(r#"{"orderId":"o-r","amount":1}"#).await;
    let f = app.enqueue(r#"{"orderId":"o-f","amount":"x"}"#).await;
    let d = app.enqueue(r#"{"orderId":"o-d","amount":3}"#).await;
    let u = app.enqueue(r#"{"orderId":"o-u","amount":4}"#).await;
    let w = app.start_worker(provider(ledger));
    eventually("four records", DEADLINE, || async {
        (app.poison_messages().await.len() == 4).then_some(())
    })
    .await;
    let q = app.queue.as_str();
    let replay = [
        "poison",
        "replay",
        q,
        "--id",
        &r,
        "--by",
        "alice",
        "--uncertain-checked",
        "--wait",
        "00:00:30",
    ];
    run_ok(app, &replay);
    let fix = [
        "poison",
        "fix",
        q,
        "--id",
        &f,
        "--payload",
        r#"{"orderId":"o-f2","amount":5}"#,
        "--by",
        "bob",
        "--wait",
        "00:00:30",
    ];
    run_ok(app, &fix);
    let discard = [
        "poison",
        "discard",
        q,
        "--id",
        &d,
        "--reason",
        "order cancelled by the customer",
        "--by",
        "carol",
        "--close-key",
    ];
    run_ok(app, &discard);
    w.stop().await;
    [r, f, d, u]
}

fn row<'a>(report: &'a Value, id: &str) -> &'a Value {
    report["records"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == id)
        .unwrap_or_else(|| panic!("no row {id}: {report:#}"))
}

fn check_json(report: &Value, [r, f, d, u]: &[String; 4], provider_key_u: &str) {
    let replayed = row(report, r);
    assert_eq!(replayed["decision"], "replayed");
    assert_eq!(replayed["by"], "alice");
    assert!(replayed["at"].as_str().is_some_and(|t| !t.is_empty()));
    // The acknowledgement is kept on the record, with who gave it.
    assert_eq!(
        replayed["why"],
        "uncertain attempt: the provider checked by alice (--uncertain-checked)"
    );
    assert_eq!(replayed["key"], "order:o-r");
    assert_eq!(replayed["keyState"]["state"], "done");
    assert_eq!(replayed["keyState"]["completedAttempts"], 1);
    assert_eq!(
        replayed["keyState"]["provider"],
        json!({"answer": "replayed", "status": 200})
    );
    assert_eq!(replayed["keyState"]["uncertain"]["resolved"], true);
    assert_eq!(replayed["errorKind"], "retryable");
    assert_eq!(replayed["error"], "timed out after 00:00:10");

    let fixed = row(report, f);
    assert_eq!(fixed["decision"], "fixed");
    assert_eq!(fixed["by"], "bob");
    assert_eq!(fixed["keyState"]["state"], "poisoned");
    assert_eq!(fixed["error"], "HTTP 422: amount is not a number");
    let new_key = &fixed["newKey"];
    assert_eq!(new_key["key"], "order:o-f2");
    assert_eq!(new_key["state"]["state"], "done");
    assert_eq!(
        new_key["state"]["provider"],
        json!({"answer": "fresh", "status": 201})
    );
    let new_message = new_key["messageId"].as_str().unwrap();
    assert!(
        fixed["why"].as_str().unwrap().contains(new_message),
        "{fixed:#}"
    );

    let discarded = row(report, d);
    assert_eq!(discarded["decision"], "discarded");
    assert_eq!(discarded["by"], "carol");
    assert_eq!(discarded["why"], "order cancelled by the customer");
    assert_eq!(discarded["keyState"]["state"], "cancelled");
    assert_eq!(discarded["keyState"]["provider"], Value::Null);

    let open = row(report, u);
    assert_eq!(open["decision"], "open");
    assert_eq!(open["by"], Value::Null);
    assert_eq!(open["keyState"]["state"], "poisoned");
    assert_eq!(
        open["keyState"]["uncertain"],
        json!({"attempts": 1, "providerKey": provider_key_u, "resolved": false})
    );
    let totals = json!({
        "records": 4, "open": 1, "replayed": 1, "fixed": 1, "discarded": 1,
        "keys": 5, "keysDoneOnce": 2, "keysDoneMoreThanOnce": 0, "keysNotDone": 1,
        "uncertain": 1, "keysCancelled": 1, "keylessUncertain": 0
    });
    assert_eq!(report["totals"], totals);
}

/// The text row of record `id`, and the lines beneath it.
fn text_block<'a>(text: &'a str, id: &str) -> Vec<&'a str> {
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with(id))
        .unwrap_or_else(|| panic!("no row {id}: {text}"));
    let pad = " ".repeat(id.len());
    let more = lines[at + 1..].iter().take_while(|l| l.starts_with(&pad));
    std::iter::once(lines[at]).chain(more.copied()).collect()
}

fn cells(line: &str) -> Vec<&str> {
    line.split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect()
}

fn check_text(text: &str, [r, f, d, u]: &[String; 4], provider_key_u: &str) {
    let head = cells(text.lines().next().unwrap());
    assert_eq!(
        head,
        [
            "ID",
            "FUNCTION",
            "POISONED AT",
            "DECISION",
            "BY",
            "AT",
            "KEY",
            "KEY STATE",
            "PROVIDER",
            "UNCERTAIN"
        ]
    );
    let expect = [
        (
            r,
            ["replayed", "alice"],
            ["order:o-r", "done", "replayed (HTTP 200)", "1 resolved"],
        ),
        (f, ["fixed", "bob"], ["order:o-f", "poisoned", "-", "-"]),
        (
            d,
            ["discarded", "carol"],
            ["order:o-d", "cancelled", "-", "-"],
        ),
    ];
    for (id, decision, key) in expect {
        let row = cells(text_block(text, id)[0]);
        assert_eq!(row[0], id);
        assert_eq!(row[3..5], decision, "{text}");
        assert_eq!(row[6..], key, "{text}");
    }
    let open = text_block(text, u);
    let row = cells(open[0]);
    assert_eq!(
        row[3..],
        ["open", "-", "-", "order:o-u", "poisoned", "-", "1 open"],
        "{text}"
    );
    assert!(open.iter().any(|l| l.contains(&format!(
        "uncertain: 1 attempt(s) may have taken effect under provider key {provider_key_u}: aqw keys check Job order:o-u"
    ))), "{text}");
    let fixed = text_block(text, f).join("\n");
    assert!(
        fixed.contains("happened:  permanent: HTTP 422: amount is not a number"),
        "{fixed}"
    );
    assert!(
        fixed.contains("new key:   order:o-f2 (fix, message "),
        "{fixed}"
    );
    assert!(
        fixed.contains("): done, provider fresh (HTTP 201), uncertain -"),
        "{fixed}"
    );
    let discarded = text_block(text, d).join("\n");
    assert!(
        discarded.contains("why:       order cancelled by the customer"),
        "{discarded}"
    );
    assert!(
        text.contains("4 record(s): 1 open, 1 replayed, 1 fixed, 1 discarded"),
        "{text}"
    );
    assert!(
        text.contains(
            "5 key(s): 2 done exactly once, 0 done more than once, 1 not done, 1 still uncertain, 1 cancelled"
        ),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_confirms_each_effect_once() {
    let app = TestApp::new(
        json!({"key": "order:{/orderId}"}),
        json!({"maxDequeueCount": 1}),
        json!({}),
    );
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let ids = seed_incident(&app, ledger.clone()).await;
    let key_u = aqw_core::idempotency::IdempotencyKey::new("order:o-u").unwrap();
    let provider_key_u = app
        .keys()
        .get("Job", &key_u)
        .await
        .unwrap()
        .unwrap()
        .provider_key;
    let q = app.queue.as_str();

    let out = aqw(app.path(), &["poison", "report", q, "--output", "json"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "an open, uncertain record needs a person"
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    check_json(&report, &ids, &provider_key_u);
    let out = aqw(app.path(), &["poison", "report", q]);
    assert_eq!(out.status.code(), Some(1));
    check_text(&String::from_utf8_lossy(&out.stdout), &ids, &provider_key_u);

    // What the provider itself saw: each applied effect once.
    let applied = ledger.lock().unwrap().applied.clone();
    let once: HashMap<String, u32> = [("o-r", 1), ("o-f2", 1)]
        .map(|(k, n)| (k.to_string(), n))
        .into();
    assert_eq!(applied, once);
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn report_since_is_validated_and_bounds_the_records() {
    let app = TestApp::new(json!({"key": "order:{/orderId}"}), json!({}), json!({}));
    let id = crate::common::poisoned_by_worker(&app, DEADLINE).await;
    let q = app.queue.as_str();
    let out = aqw(app.path(), &["poison", "report", q, "--since", "01:00:00"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&id) && text.contains("1 record(s): 1 open"),
        "{text}"
    );
    let later = ["poison", "report", q, "--since", "2999-01-01T00:00:00Z"];
    let out = aqw(app.path(), &later);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("no poison records for") && text.contains("since 2999-01-01T00:00:00Z"),
        "{text}"
    );
    let out = aqw(app.path(), &[&later[..], &["--output", "json"]].concat());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["records"], json!([]));
    assert_eq!(v["totals"]["records"], 0);
    let out = aqw(app.path(), &["poison", "report", q, "--since", "yesterday"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("\"yesterday\""), "names the value: {err}");
    app.cleanup().await;
}
