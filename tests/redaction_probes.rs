//! Issue 48's redaction probes, against Azurite and the real binary: a
//! wildcard rule (`/items/*/pan`) keeps a card number masked after a group
//! fix shifted it to another index and the fixed job was poisoned again; a
//! group fix's patch shows no value it writes to a redacted field on
//! `/ops/{id}` or in `aqw ops show` / `list`, and none at all to a read-only
//! viewer; `poison list --output json` is masked unless `--unredacted`,
//! which is logged with who asked.

use crate::common::*;
use crate::dashboard::{bget, dashboard};
use crate::redaction::poisoned;
use aqw_core::handler::HandlerError;
use aqw_core::message::{decode, MessageEncoding};
use aqw_core::poison::RecordStatus;
use serde_json::{json, Value};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(60);
const PAN: &str = "4012888888881881";
const NEW_CARD: &str = "5555555555554444";

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `aqw args…`, required to exit `code`; its stdout.
fn run(app: &TestApp, args: &[&str], code: i32) -> String {
    let out = aqw(app.path(), args);
    assert_eq!(out.status.code(), Some(code), "{args:?}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Each record's message of `poison list --output json`, decoded.
fn listed_messages(json: &str) -> Vec<String> {
    let list: Vec<Value> = serde_json::from_str(json).unwrap();
    list.iter()
        .map(|r| decode(r["message"].as_str().unwrap(), MessageEncoding::Base64).unwrap())
        .collect()
}

/// The probe: a fix inserts an item before the one with the card number,
/// and the fixed job is poisoned again. With `/items/*/pan` the number
/// never shows in any view of the new record; `--unredacted` shows it (at
/// its shifted index, so the probe is real) and is logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_shift_cannot_unmask_a_wildcard_redacted_field() {
    let app = TestApp::new(
        json!({"key": "ord:{/orderId}", "redact": ["/items/*/pan"]}),
        json!({"maxDequeueCount": 1}),
        json!({}),
    );
    let payload = format!(r#"{{"orderId":"o-1","items":[{{"pan":"{PAN}","sku":"a"}}]}}"#);
    let first = poisoned(&app, &[&payload]).await.remove(0);
    let patch = r#"[{"op":"add","path":"/items/0","value":{"sku":"gift"}}]"#;
    let q = app.queue.clone();
    let fix = [
        "ops", "fix", &q, "--patch", patch, "--by", "oncall", "--output", "json",
    ];
    let op: Value = serde_json::from_str(&run(&app, &fix, 0)).unwrap();
    assert_eq!(
        (op["state"].as_str(), op["done"].as_u64()),
        (Some("done"), Some(1)),
        "{op}"
    );

    // The corrected job fails again: a new record, its card at /items/1.
    let h = Scripted::new(|_, _| Err(HandlerError::retryable("HTTP 503 card processor down")));
    let w = app.start_worker(h);
    let ops = aqw_core::ops::QueueOps::new(app.config.clone(), &app.queue, &app.storage());
    let again = eventually("the fixed job poisoned again", DEADLINE, || async {
        let all = ops.records().await.unwrap();
        all.into_iter()
            .find(|r| r.status == RecordStatus::Open && r.message_id != first)
            .map(|r| r.message_id)
    })
    .await;
    w.stop().await;

    let shown = run(&app, &["poison", "show", &q, &again], 0);
    assert!(
        !shown.contains(PAN) && shown.contains("[redacted]"),
        "{shown}"
    );
    let json = run(&app, &["poison", "show", &q, &again, "--output", "json"], 0);
    assert!(!json.contains(PAN), "{json}");
    let v: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["payload"]["items"][1]["pan"], "[redacted]", "{v}");
    assert_eq!(v["payload"]["items"][0]["sku"], "gift", "{v}");
    let page = bget(&dashboard(&app, true), &format!("/q/{q}/record?id={again}")).await;
    assert!(
        page.body.contains("payload-redacted") && !page.body.contains(PAN),
        "record page"
    );

    // poison list --output json: masked, saying so.
    let list = run(&app, &["poison", "list", &q, "--output", "json"], 1);
    let messages = listed_messages(&list);
    assert_eq!(messages.len(), 2, "{list}");
    assert!(
        messages
            .iter()
            .all(|m| !m.contains(PAN) && m.contains("[redacted]")),
        "{messages:?}"
    );
    let v: Vec<Value> = serde_json::from_str(&list).unwrap();
    assert!(
        v.iter()
            .all(|r| r["redacted"].as_str().unwrap().contains("/items/*/pan")),
        "{list}"
    );

    // --unredacted: exact, and logged with who asked.
    let args = [
        "poison",
        "list",
        &q,
        "--output",
        "json",
        "--unredacted",
        "--by",
        "mallory",
    ];
    let out = aqw(app.path(), &args);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let raw = listed_messages(&String::from_utf8_lossy(&out.stdout));
    let new: Value =
        serde_json::from_str(raw.iter().find(|m| m.contains("gift")).unwrap()).unwrap();
    assert_eq!(
        new["items"][1]["pan"], PAN,
        "the card moved to index 1: {new}"
    );
    let log = String::from_utf8_lossy(&out.stderr);
    let line = log.lines().find(|l| l.contains("aqw.poison.unredacted"));
    assert!(
        line.is_some_and(|l| l.contains("mallory") && l.contains(&q)),
        "{log}"
    );
    let none = [
        "poison",
        "list",
        &q,
        "--output",
        "json",
        "--unredacted",
        "--by",
        " ",
    ];
    assert!(run(&app, &none, 2).is_empty(), "refused without a name");

    // poison discard --output json: masked too.
    let args = [
        "poison", "discard", &q, "--id", &again, "--reason", "probe", "--by", "a", "--output",
        "json",
    ];
    let rec: Value = serde_json::from_str(&run(&app, &args, 0)).unwrap();
    let message = decode(rec["message"].as_str().unwrap(), MessageEncoding::Base64).unwrap();
    assert!(
        !message.contains(PAN) && message.contains("[redacted]"),
        "{message}"
    );
    app.cleanup().await;
}

/// A fix's patch that writes a new card number and a note: the number is
/// masked on `/ops/{id}` for one who may act and in `aqw ops show` / `list`
/// (text and JSON), the note shown; a read-only viewer sees no value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fix_patch_shows_no_redacted_value_and_no_values_to_viewers() {
    let app = TestApp::new(
        json!({"key": "pay:{/account}", "redact": ["/card/number", "/customer/email"]}),
        json!({"maxDequeueCount": 1}),
        json!({}),
    );
    let payload = r#"{"account":"A-1","card":{"number":"4242424242424242"}}"#;
    poisoned(&app, &[payload]).await;
    let patch = format!(
        r#"[{{"op":"replace","path":"/card/number","value":"{NEW_CARD}"}},{{"op":"add","path":"/note","value":"call ada"}}]"#
    );
    let q = app.queue.clone();
    let fix = [
        "ops", "fix", &q, "--patch", &patch, "--by", "oncall", "--output", "json",
    ];
    let created = aqw(app.path(), &fix);
    let created_out = String::from_utf8_lossy(&created.stdout).into_owned();
    assert!(!created_out.contains(NEW_CARD), "{created_out}");
    let op: Value = serde_json::from_str(&created_out).unwrap();
    let id = op["id"].as_str().unwrap().to_string();

    let shown = run(&app, &["ops", "show", &id, "--queue", &q], 0);
    assert!(!shown.contains(NEW_CARD), "{shown}");
    assert!(
        shown.contains(r#""path":"/card/number","value":"[redacted]""#),
        "{shown}"
    );
    assert!(
        shown.contains("call ada"),
        "what no rule covers shows: {shown}"
    );
    for args in [
        vec!["ops", "show", &id, "--queue", &q, "--output", "json"],
        vec!["ops", "list", "--queue", &q, "--output", "json"],
        vec!["ops", "list", "--queue", &q],
    ] {
        let out = aqw(app.path(), &args);
        let all = text(&out);
        assert!(!all.contains(NEW_CARD), "{args:?}: {all}");
    }
    let json = run(
        &app,
        &["ops", "show", &id, "--queue", &q, "--output", "json"],
        0,
    );
    let v: Value = serde_json::from_str(&json).unwrap();
    let shown_patch: Value = serde_json::from_str(v["kind"]["patch"].as_str().unwrap()).unwrap();
    assert_eq!(shown_patch[0]["value"], "[redacted]", "{v}");
    assert_eq!(shown_patch[1]["value"], "call ada", "{v}");

    let actor = bget(&dashboard(&app, false), &format!("/ops/{id}")).await;
    assert!(actor.body.contains("op-patch"), "{}", actor.body);
    assert!(!actor.body.contains(NEW_CARD), "{}", actor.body);
    assert!(actor.body.contains("call ada"), "{}", actor.body);
    let viewer = bget(&dashboard(&app, true), &format!("/ops/{id}")).await;
    assert!(
        viewer.body.contains("op-patch") && viewer.body.contains("/note"),
        "{}",
        viewer.body
    );
    assert!(
        !viewer.body.contains(NEW_CARD) && !viewer.body.contains("call ada"),
        "a read-only viewer sees no value: {}",
        viewer.body
    );
    assert!(viewer.body.contains("op-patch-values"), "{}", viewer.body);
    app.cleanup().await;
}
