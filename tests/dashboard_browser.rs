//! The operator's procedure in a real browser: Debian's headless Chromium,
//! driven over WebDriver (chromedriver), against the real `aqw dashboard`
//! binary over a real Azurite, with a real worker whose HTTP handler fails
//! until the test "fixes the cause". Screenshots of every view go to
//! `$CARGO_TARGET_DIR/dashboard-screenshots/` (default `target/`).
//!
//! Needs `scripts/browser.sh install` (scripts/test.sh runs it).

use crate::common::webdriver;

use crate::common::*;
use aqw_core::ops::QueueOps;
use aqw_core::poison::RecordStatus;
use serde_json::json;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(60);
const TOKEN: &str = "browser-test-token-e83b05c7d2f1";

/// The dashboard binary, killed on drop.
struct DashboardProcess {
    child: Child,
    url: String,
}

impl Drop for DashboardProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start `aqw dashboard` on a free port; its first stdout line names the URL.
fn start_dashboard(app: &TestApp) -> DashboardProcess {
    let mut child = Command::new(aqw_bin())
        .args(["dashboard", "--listen", "127.0.0.1:0", "--app"])
        .arg(app.path())
        .env("AzureWebJobsStorage", CONN)
        .env("AQW_DASHBOARD_TOKEN", TOKEN)
        .env("AQW_DASHBOARD_USER", "alice")
        .env_remove("AQW_DASHBOARD_TRUST_PRINCIPAL")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start aqw dashboard");
    let stdout = child.stdout.take().unwrap();
    let url = dashboard_url(stdout, DEADLINE);
    DashboardProcess { child, url }
}

fn screenshots() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
        .join("dashboard-screenshots")
}

fn enc(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

struct Jobs {
    replay: String,
    discard: String,
    typo: String,
    hostile: String,
}

/// Four jobs poisoned by a worker whose provider answers 503 (and one
/// producer's typo, poisoned at once).
async fn incident(app: &TestApp) -> Jobs {
    let jobs = Jobs {
        replay: app.enqueue(r#"{"orderId":"o-replay","amount":42}"#).await,
        discard: app.enqueue(r#"{"orderId":"o-discard","amount":7}"#).await,
        typo: app.enqueue(r#"{"orderID":"o-typo","amount":5}"#).await,
        hostile: app
            .enqueue(r#"{"orderId":"<script>alert(1)</script>","amount":1}"#)
            .await,
    };
    eventually("four poison records", DEADLINE, || async {
        (app.poison_messages().await.len() == 4).then_some(())
    })
    .await;
    jobs
}

async fn record_status(app: &TestApp, id: &str) -> RecordStatus {
    let ops = QueueOps::new(app.config.clone(), &app.queue, &app.storage());
    ops.record(id).await.unwrap().unwrap().0.status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_procedure_in_headless_chromium() {
    let sink = Sink::start().await;
    sink.fail_with(503);
    let app = TestApp::new(
        json!({"key": "order:{/orderId}", "handler": {"type": "http", "url": format!("{}/effects", sink.url), "timeout": "00:00:05"}}),
        json!({"maxDequeueCount": 2}),
        json!({}),
    );
    let worker = app.start_configured_worker();
    let jobs = incident(&app).await;
    let dash = start_dashboard(&app);
    let driver = webdriver::Driver::start().await;
    let profile = tempfile::tempdir().unwrap();
    let b = driver.session(profile.path()).await;
    let shots = screenshots();
    let base = &dash.url;
    let q = &app.queue;
    let record_url = |id: &str| format!("{base}/q/{q}/record?id={}", enc(id));

    // Sign in: the dashboard sends a browser without a session to /login.
    b.goto(&format!("{base}/")).await;
    assert!(b.current_url().await.ends_with("/login"));
    b.find("#token").await.send_keys(TOKEN).await;
    b.screenshot(&shots.join("0-login.png")).await;
    b.find("#login").await.click().await;

    // 1. The alert state.
    let alert = b
        .wait_text("#alert-state", DEADLINE, |t| t.contains("ALERT"))
        .await;
    assert!(alert.contains("4 open"), "{alert}");
    assert_eq!(b.find("#who").await.text().await, "alice");
    b.screenshot(&shots.join("1-status.png")).await;

    // 2. The poison list, grouped by cause.
    b.goto(&format!("{base}/q/{q}")).await;
    let groups = b.find("#groups").await.text().await;
    assert!(groups.contains("HTTP 503"), "{groups}");
    let records = b.find("#records").await.text().await;
    for id in [&jobs.replay, &jobs.discard, &jobs.typo, &jobs.hostile] {
        assert!(records.contains(id.as_str()), "{id} in {records}");
    }
    b.screenshot(&shots.join("2-list.png")).await;

    // 3. One record: error, key state, payload; the hostile one stays inert.
    b.goto(&record_url(&jobs.replay)).await;
    assert!(b.find("#record-error").await.text().await.contains("503"));
    assert_eq!(b.find("#key-status").await.text().await, "poisoned");
    assert!(b
        .find("#payload")
        .await
        .text()
        .await
        .contains("\"orderId\": \"o-replay\""));
    b.screenshot(&shots.join("3-record.png")).await;

    // 4. Fix the cause, replay with a dry run first, then for real.
    sink.fail_with(200);
    b.find("#replay").await.click().await;
    // A click that submits a form may return before the next page is
    // there: wait for the next page's element, with a deadline.
    b.wait_text("#dry-run", DEADLINE, |t| t.contains("would-replay"))
        .await;
    assert_eq!(
        record_status(&app, &jobs.replay).await,
        RecordStatus::Open,
        "a dry run changes nothing"
    );
    b.screenshot(&shots.join("4-dry-run.png")).await;
    b.find("#replay-real").await.click().await;
    b.wait_text("#progress-state", DEADLINE, |t| t.starts_with("Confirmed"))
        .await;
    b.screenshot(&shots.join("5-progress.png")).await;
    assert_eq!(
        record_status(&app, &jobs.replay).await,
        RecordStatus::Replayed
    );
    let applied: Vec<_> = sink
        .applied_effects("/effects")
        .into_iter()
        .filter(|r| r.body.contains("o-replay"))
        .collect();
    assert_eq!(applied.len(), 1, "the effect happened once");

    // 5. Discard with a reason: by is the signed-in principal.
    b.goto(&record_url(&jobs.discard)).await;
    b.find("#discard-reason")
        .await
        .send_keys("customer cancelled the order")
        .await;
    b.find("#discard").await.click().await;
    b.wait_text("#record-status", DEADLINE, |t| t == "discarded")
        .await;
    let audit = b.find("#audit").await.text().await;
    assert!(
        audit.contains("discarded by alice") && audit.contains("customer cancelled the order"),
        "{audit}"
    );
    b.screenshot(&shots.join("6-discarded.png")).await;

    // 6. Fix a producer's typo: the corrected payload runs and is confirmed.
    b.goto(&record_url(&jobs.typo)).await;
    let fix = b.find("#fix-payload").await;
    fix.clear().await;
    fix.send_keys(r#"{"orderId":"o-typo","amount":5}"#).await;
    b.find("#fix").await.click().await;
    b.wait_text("#progress-state", DEADLINE, |t| t.starts_with("Confirmed"))
        .await;
    assert_eq!(
        record_status(&app, &jobs.typo).await,
        RecordStatus::Replaced
    );

    // 7. A hostile payload is text, not script.
    b.goto(&record_url(&jobs.hostile)).await;
    assert!(b
        .find("#payload")
        .await
        .text()
        .await
        .contains("<script>alert(1)</script>"));
    assert_eq!(b.alert_text().await, None, "no script ran");

    // 8. Without credentials, an action is denied and changes nothing.
    b.delete_cookies().await;
    b.find("#discard-reason")
        .await
        .send_keys("no session")
        .await;
    b.find("#discard").await.click().await;
    b.wait_text("h1", DEADLINE, |t| t == "401 Unauthorized")
        .await;
    assert!(b
        .find("#message")
        .await
        .text()
        .await
        .contains("Nothing was changed"));
    b.screenshot(&shots.join("7-denied.png")).await;
    assert_eq!(record_status(&app, &jobs.hostile).await, RecordStatus::Open);

    b.close().await;
    drop(driver);
    drop(dash);
    worker.stop().await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_replay_and_a_search_in_headless_chromium() {
    let sink = Sink::start().await;
    sink.fail_with(503);
    let app = TestApp::new(
        json!({"key": "order:{/orderId}", "handler": {"type": "http", "url": format!("{}/effects", sink.url), "timeout": "00:00:05"}}),
        json!({"maxDequeueCount": 2}),
        json!({}),
    );
    let worker = app.start_configured_worker();
    let mut down = vec![];
    for n in 1..=3 {
        down.push(
            app.enqueue(&format!(r#"{{"orderId":"o-g{n}","amount":{n}}}"#))
                .await,
        );
    }
    let typo = app.enqueue(r#"{"orderID":"o-typo","amount":5}"#).await;
    eventually("four poison records", DEADLINE, || async {
        (app.poison_messages().await.len() == 4).then_some(())
    })
    .await;
    let dash = start_dashboard(&app);
    let driver = webdriver::Driver::start().await;
    let profile = tempfile::tempdir().unwrap();
    let b = driver.session(profile.path()).await;
    let shots = screenshots();
    let base = &dash.url;
    let q = &app.queue;
    b.goto(&format!("{base}/login")).await;
    b.find("#token").await.send_keys(TOKEN).await;
    b.find("#login").await.click().await;
    b.wait_text("#alert-state", DEADLINE, |t| t.contains("ALERT"))
        .await;

    // The list with its chart of poisons per hour, by error group.
    b.goto(&format!("{base}/q/{q}")).await;
    assert!(b.try_find("svg").await.is_some(), "the chart is there");
    b.screenshot(&shots.join("8-chart.png")).await;

    // Search by payload text finds the one record.
    b.find("input[name=search]").await.send_keys("o-g2").await;
    b.find("form.filters button").await.click().await;
    let found = b
        .wait_text("#total", DEADLINE, |t| t.starts_with("1 record(s)"))
        .await;
    assert!(found.contains("page 1 of 1"), "{found}");
    let rows = b.find("#records").await.text().await;
    assert!(
        rows.contains(down[1].as_str()) && !rows.contains(typo.as_str()),
        "{rows}"
    );
    b.screenshot(&shots.join("9-search.png")).await;

    // The 503 group (the larger one, listed first), then its group replay.
    b.goto(&format!("{base}/q/{q}")).await;
    b.find("#groups tbody tr:first-child a").await.click().await;
    b.wait_text("#group-replay", DEADLINE, |t| t.contains("Replay all 3"))
        .await;
    b.find("#group-replay").await.click().await;
    let review = b
        .wait_text("#group-review", DEADLINE, |t| {
            t.contains("3 open record(s)")
        })
        .await;
    assert!(review.contains("group="), "{review}");
    let dry = b.find("#dry-run").await.text().await;
    assert_eq!(dry.matches("would-replay").count(), 3, "{dry}");
    assert!(!dry.contains(typo.as_str()), "{dry}");
    for id in down.iter().chain([&typo]) {
        assert_eq!(
            record_status(&app, id).await,
            RecordStatus::Open,
            "a dry run changes nothing"
        );
    }
    b.screenshot(&shots.join("10-group-dry-run.png")).await;
    sink.fail_with(200);
    // The real replay is a durable operation at the rate chosen here (one
    // a second, so it is still running when the tab goes): the tab that
    // launched it is closed, and its progress is watched from another
    // browser session, through the operations list.
    let rate = b.find("#group-rate").await;
    rate.clear().await;
    rate.send_keys("1").await;
    b.find("#group-replay-real").await.click().await;
    let launched = b
        .wait_text("#op-state", DEADLINE, |t| t.starts_with("Operation "))
        .await;
    let op_id = launched["Operation ".len()..]
        .split(':')
        .next()
        .unwrap()
        .to_string();
    b.close().await;
    let profile2 = tempfile::tempdir().unwrap();
    let b = driver.session(profile2.path()).await;
    b.goto(&format!("{base}/login")).await;
    b.find("#token").await.send_keys(TOKEN).await;
    b.find("#login").await.click().await;
    b.wait_text("#alert-state", DEADLINE, |t| {
        t.contains("ALERT") || t.contains("OK")
    })
    .await;
    b.goto(&format!("{base}/ops")).await;
    let listed = b.find("#ops").await.text().await;
    assert!(listed.contains(&op_id), "{listed}");
    b.find("#ops tbody tr:first-child a").await.click().await;
    b.wait_text("#op-state", DEADLINE, |t| t.contains("done"))
        .await;
    let progress = b.find("#op-progress").await.text().await;
    assert!(
        progress.starts_with("3 done, 0 skipped, 0 failed of 3 selected"),
        "{progress}"
    );
    b.screenshot(&shots.join("11-group-replayed.png")).await;
    for id in &down {
        assert_eq!(record_status(&app, id).await, RecordStatus::Replayed);
    }
    assert_eq!(
        record_status(&app, &typo).await,
        RecordStatus::Open,
        "only that group"
    );
    eventually("each replayed order applied once", DEADLINE, || async {
        let applied = sink.applied_effects("/effects");
        let once = (1..=3).all(|n| {
            applied
                .iter()
                .filter(|r| r.body.contains(&format!("\"o-g{n}\"")))
                .count()
                == 1
        });
        once.then_some(())
    })
    .await;

    b.close().await;
    drop(driver);
    drop(dash);
    worker.stop().await;
    app.cleanup().await;
}
