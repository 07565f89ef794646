//! Schedules with real processes on Azurite (issue 42 item 4): three
//! `aqw run` processes over ten ticks of a 2-second schedule give one
//! effect per tick, none missing and none doubled; `aqw status` shows the
//! next tick and the last one's outcome; a schedule whose function's key
//! does not carry the tick is refused at start-up, naming the setting; two
//! `aqw serve` instances put each tick once. The
//! catch-up policy and a crashed claimer are proved on simulated time
//! (crates/aqw-core/tests/engine/schedules.rs).

use crate::common::*;
use crate::outage::Process;
use serde_json::json;
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

fn scheduled_app(sink: &Sink, key: &str) -> TestApp {
    scheduled_app_catching_up(sink, key, "latest")
}

fn scheduled_app_catching_up(sink: &Sink, key: &str, catch_up: &str) -> TestApp {
    TestApp::new(
        json!({"key": key, "handler": {"type": "http", "url": format!("{}/effects", sink.url), "timeout": "00:00:05"}}),
        json!({}),
        json!({"schedules": {"Tick": {"function": "Job", "every": "00:00:02", "catchUp": catch_up, "payload": {"report": "heartbeat"}}}}),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_over_ten_ticks_give_ten_effects() {
    let sink = Sink::start().await;
    // `catchUp: all`: a loaded CI machine can stall every process past a
    // tick, and the default (`latest`) then runs only the newest, by design;
    // with `all` each tick must still run once, the promise under test.
    let app = scheduled_app_catching_up(&sink, "{/schedule}:{/tick}", "all");
    let fleet: Vec<Process> = (0..3).map(|_| Process::start(&app)).collect();
    let ticks = |sink: &Sink| -> BTreeMap<String, HashSet<String>> {
        let mut by_tick: BTreeMap<String, HashSet<String>> = BTreeMap::new();
        for r in sink.to("/effects").into_iter().filter(|r| r.status < 300) {
            let body: serde_json::Value = serde_json::from_str(&r.body).unwrap_or_default();
            let tick = body["tick"].as_str().unwrap_or_default().to_string();
            by_tick
                .entry(tick)
                .or_default()
                .insert(r.idempotency_key.unwrap_or_default());
        }
        by_tick
    };
    eventually("ten ticks ran", Duration::from_secs(120), || async {
        (ticks(&sink).len() >= 10).then_some(())
    })
    .await;
    drop(fleet);
    app.drained(Duration::from_secs(30)).await;
    let by_tick = ticks(&sink);
    // Every tick from the first to the last, 2 s apart: none missing.
    let times: Vec<time::OffsetDateTime> = by_tick
        .keys()
        .map(|t| {
            time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).unwrap()
        })
        .collect();
    for pair in times.windows(2) {
        assert_eq!(
            (pair[1] - pair[0]).whole_seconds(),
            2,
            "no tick missing: {times:?}"
        );
    }
    // One provider key per tick, and one effect: a tick ran once however
    // many processes saw it.
    for (tick, keys) in &by_tick {
        assert_eq!(keys.len(), 1, "tick {tick}: {keys:?}");
    }
    let calls = sink.to("/effects").len();
    println!(
        "3 processes, {} ticks, {calls} handler calls",
        by_tick.len()
    );
    assert_eq!(calls, by_tick.len(), "no tick was called twice");
    let body: serde_json::Value = serde_json::from_str(&sink.to("/effects")[0].body).unwrap();
    assert_eq!(body["schedule"], "Tick");
    assert_eq!(body["report"], "heartbeat", "the schedule's payload fields");

    let out = aqw(app.path(), &["status", "--output", "json"]);
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    let s = &status["schedules"][0];
    assert_eq!(s["name"], "Tick");
    assert!(s["next"].is_string(), "{s}");
    assert!(
        ["done", "not run yet", "pending"].contains(&s["lastOutcome"].as_str().unwrap_or("")),
        "{s}"
    );
    app.cleanup().await;
}

#[tokio::test]
async fn a_key_without_the_schedule_and_tick_is_refused_naming_the_setting() {
    let sink = Sink::start().await;
    let app = scheduled_app(&sink, "{/schedule}:{/tick}");
    let host = app.path().join("host.json");
    let good = std::fs::read_to_string(&host).unwrap();
    // Without the tick every tick is one key; without the schedule, two
    // schedules ticking at one instant would share one.
    for bad in ["report:{/schedule}", "{/tick}"] {
        std::fs::write(&host, good.replace("{/schedule}:{/tick}", bad)).unwrap();
        let out = aqw(app.path(), &["config", "show"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains("aqw.schedules.Tick.function"), "{bad}: {err}");
        assert!(err.contains("{/schedule}:{/tick}"), "{bad}: {err}");
    }
    app.cleanup().await;
}

/// Under `aqw serve` (two in-process instances, as Flex may start, no `aqw
/// run` anywhere) the ticks still reach the queue, each once: the Functions
/// host would then deliver them like any message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_instances_put_each_tick_once() {
    let sink = Sink::start().await;
    let app = scheduled_app(&sink, "{/schedule}:{/tick}");
    let instances = start_serve_instances(&app, 2);
    let ticks = eventually(
        "three ticks on the queue",
        Duration::from_secs(60),
        || async {
            let peeked = app.source().peek(32).await.ok()?;
            let ticks: Vec<String> = peeked
                .iter()
                .map(|m| {
                    let text =
                        aqw_core::message::decode(&m.text, app.config.message_encoding).unwrap();
                    let job: serde_json::Value = serde_json::from_str(&text).unwrap();
                    job["tick"].as_str().unwrap_or_default().to_string()
                })
                .collect();
            (ticks.len() >= 3).then_some(ticks)
        },
    )
    .await;
    stop_serve_instances(instances).await;
    let distinct: HashSet<&String> = ticks.iter().collect();
    assert_eq!(distinct.len(), ticks.len(), "each tick put once: {ticks:?}");
    // The dashboard's status page shows the schedule and its newest tick.
    let d = crate::dashboard::dashboard(&app, true);
    let page = crate::dashboard::bget(&d, "/").await;
    assert_eq!(page.status, axum::http::StatusCode::OK);
    assert!(page.body.contains("id=\"schedules\""), "{}", page.body);
    assert!(page.body.contains("<td>Tick</td>"), "{}", page.body);
    assert!(page.body.contains("(catch-up latest)"), "{}", page.body);
    assert!(
        !page.body.contains("none yet"),
        "a tick was put: {}",
        page.body
    );
    app.cleanup().await;
}

/// Issue 48: a schedule's name is its row's key in the control table, so
/// `a/b` (or `\`, `#`, `?`, a control character, a name too long) is
/// refused at load, naming the setting, instead of failing `aqw status`.
#[tokio::test]
async fn a_schedule_name_no_table_key_can_hold_is_refused_naming_the_setting() {
    let sink = Sink::start().await;
    let app = scheduled_app(&sink, "{/schedule}:{/tick}");
    let host = app.path().join("host.json");
    let good = std::fs::read_to_string(&host).unwrap();
    let long = "T".repeat(101);
    for bad in ["a/b", "a\\\\b", "a#b", "a?b", "a\\u001bb", long.as_str()] {
        std::fs::write(&host, good.replace("\"Tick\"", &format!("\"{bad}\""))).unwrap();
        let out = aqw(app.path(), &["status"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains("aqw.schedules."), "{bad}: {err}");
    }
    std::fs::write(&host, good.replace("\"Tick\"", "\"a/b\"")).unwrap();
    let out = aqw(app.path(), &["status"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("aqw.schedules.a/b"), "{err}");
    app.cleanup().await;
}
