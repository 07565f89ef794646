//! The shipped monitoring, against the real thing: a running worker's
//! `/metrics` (bounded labels, the health gauges), the Grafana dashboard
//! and the alert rules under `deploy/monitoring/` (loadable, naming only
//! metrics aqw exports, runbooks that exist), and the chat alerts a worker
//! posts when it poisons a message on Azurite (Slack, Teams, generic;
//! signed; the secret never in a log).

use crate::common::*;
use regex::Regex;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(60);

fn monitoring_file(name: &str) -> String {
    let path = format!("{}/deploy/monitoring/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Metric names in a PromQL expression (`aqw_*`), histogram suffixes removed.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let re = Regex::new(r"\baqw_[a-z_]+\b").unwrap();
    re.find_iter(expr)
        .map(|m| {
            let n = m.as_str();
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| n.strip_suffix(s))
                .unwrap_or(n)
                .to_string()
        })
        .collect()
}

/// Every `"aqw_..."` metric name written in the sources of the workspace's
/// crates (the binary's `src/`, the engine's `crates/aqw-core/src/` and the
/// Azure adapter's `crates/aqw-azure/src/`).
fn names_in_source() -> BTreeSet<String> {
    let re = Regex::new(r#""(aqw_[a-z_]+)""#).unwrap();
    let mut names = BTreeSet::new();
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut dirs = vec![
        root.join("src"),
        root.join("crates/aqw-core/src"),
        root.join("crates/aqw-azure/src"),
    ];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                names.extend(re.captures_iter(&text).map(|c| c[1].to_string()));
            }
        }
    }
    names
}

/// Every `expr` of the dashboard's panels.
fn dashboard_exprs(d: &Value) -> Vec<String> {
    d["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| t["expr"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn the_grafana_dashboard_is_importable() {
    let d: Value = serde_json::from_str(&monitoring_file("aqw-grafana-dashboard.json")).unwrap();
    assert!(
        d["schemaVersion"].as_u64().unwrap() >= 36,
        "a current schema"
    );
    assert!(d["uid"].as_str().is_some_and(|u| !u.is_empty()));
    // Import asks for the data source: declared as an input, used by every panel.
    let inputs = d["__inputs"].as_array().unwrap();
    assert!(inputs
        .iter()
        .any(|i| i["name"] == "DS_PROMETHEUS" && i["pluginId"] == "prometheus"));
    let mut ids = BTreeSet::new();
    for p in d["panels"].as_array().unwrap() {
        assert!(ids.insert(p["id"].as_u64().unwrap()), "unique id: {p}");
        let g = &p["gridPos"];
        let (x, w) = (g["x"].as_u64().unwrap(), g["w"].as_u64().unwrap());
        assert!(
            x + w <= 24 && g["h"].as_u64().unwrap() > 0 && g["y"].is_u64(),
            "{g}"
        );
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${DS_PROMETHEUS}", "{}", p["title"]);
        for t in p["targets"].as_array().unwrap() {
            assert_eq!(t["datasource"]["uid"], "${DS_PROMETHEUS}");
            assert!(!t["expr"].as_str().unwrap().is_empty());
        }
    }
    let exported = names_in_source();
    for expr in dashboard_exprs(&d) {
        for name in metric_names(&expr) {
            assert!(
                exported.contains(&name),
                "{name} (in {expr}) is not exported by aqw"
            );
        }
    }
}

/// GitHub's anchor of a Markdown heading.
fn anchor(heading: &str) -> String {
    heading
        .trim_start_matches('#')
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings (`path` relative to the repository).
fn markdown_anchors(path: &str) -> BTreeSet<String> {
    let file = format!("{}/{path}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{file}: {e}"));
    text.lines()
        .filter(|l| l.starts_with('#'))
        .map(anchor)
        .collect()
}

#[test]
fn every_alert_rule_has_a_runbook_and_names_exported_metrics() {
    let rules = monitoring_file("aqw-alerts.yml");
    let alerts = rules.matches("- alert: ").count();
    let runbooks: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("runbook: "))
        .collect();
    assert_eq!(runbooks.len(), alerts, "one runbook per rule");
    assert!(
        !rules.contains("https://"),
        "no URL: aqw has no home page a rule could link to"
    );
    // A runbook names `aqw oncall` and the long form `<path>#<anchor>`: the
    // file must exist in this repository and have a heading with that anchor.
    for url in runbooks {
        assert!(url.contains("aqw oncall"), "{url}");
        let (_, target) = url
            .trim_end_matches('"')
            .split_once("long form: ")
            .unwrap_or_else(|| panic!("{url}: no long form"));
        let (path, section) = target
            .split_once('#')
            .unwrap_or_else(|| panic!("{url}: no #section"));
        assert!(
            markdown_anchors(path).contains(section),
            "{path} has no section #{section}"
        );
    }
    // Every name a rule uses must be one aqw exports today.
    let pending: BTreeSet<&str> = BTreeSet::new();
    let exported = names_in_source();
    let exprs = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr: "));
    for name in exprs.flat_map(metric_names) {
        assert!(
            exported.contains(&name) || pending.contains(name.as_str()),
            "{name} is not exported by aqw"
        );
    }
}

fn spawn_worker(app: &TestApp, env: &[(&str, &str)], log: &std::path::Path) -> Child {
    let mut c = Command::new(aqw_bin());
    c.args(["run", "--log-format", "json", "--app"])
        .arg(app.path())
        .env("AzureWebJobsStorage", CONN)
        .env("AQW_LOG", "debug")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    for (k, v) in env {
        c.env(k, v);
    }
    c.spawn().unwrap()
}

fn terminate(mut child: Child) {
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let _ = child.wait();
}

/// Rewrite the app's `aqw` section with `extra` merged in (for settings
/// that need the environment the worker will run with).
fn merge_aqw(app: &TestApp, extra: Value) {
    let path = app.path().join("host.json");
    let mut host: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    for (k, v) in extra.as_object().unwrap() {
        host["aqw"][k] = v.clone();
    }
    std::fs::write(path, host.to_string()).unwrap();
}

/// A handler that fails (retryable, 503) on payloads containing "bad".
fn failing_on_bad() -> Value {
    json!({"key": "job:{/id}", "handler": {"type": "exec", "command": ["sh", "-c",
        "p=$(cat); case \"$p\" in *bad*) echo 'HTTP 503 ledger unavailable' >&2; exit 75;; esac; exit 0"]}})
}

/// `/metrics` as (name, labels, value) samples.
fn samples(text: &str) -> Vec<(String, BTreeMap<String, String>, f64)> {
    let line = Regex::new(r#"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$"#).unwrap();
    let label = Regex::new(r#"([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)""#).unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let c = line.captures(l).unwrap_or_else(|| panic!("bad line {l}"));
            let labels = c.get(2).map_or(BTreeMap::new(), |m| {
                label
                    .captures_iter(m.as_str())
                    .map(|l| (l[1].to_string(), l[2].to_string()))
                    .collect()
            });
            (c[1].to_string(), labels, c[3].parse().unwrap())
        })
        .collect()
}

/// The label names each metric may carry: all bounded by configuration
/// (functions, queues, outcomes, operations) or by the group cap.
fn allowed_labels(name: &str) -> &'static [&'static str] {
    match name
        .trim_end_matches("_bucket")
        .trim_end_matches("_sum")
        .trim_end_matches("_count")
    {
        "aqw_messages_total" => &["function", "outcome"],
        "aqw_retries_total" | "aqw_duplicates_total" | "aqw_poisoned_total" => &["function"],
        "aqw_handler_duration_seconds" => &["function", "le"],
        "aqw_queue_depth" | "aqw_poison_depth" | "aqw_queue_oldest_age_seconds" => &["queue"],
        "aqw_poison_open_records" => &["queue", "error_kind", "error_group"],
        "aqw_storage_requests_total" => &["operation", "status"],
        "aqw_trace_exports_total" => &["target", "result"],
        "aqw_breaker_state" | "aqw_function_paused" => &["function"],
        "aqw_deferrals_total"
        | "aqw_adaptive_rate"
        | "aqw_fleet_adaptive_rate"
        | "aqw_throttles_total" => &["function"],
        "aqw_breaker_transitions_total" => &["function", "to"],
        other => panic!("{other} is not a known aqw metric: add it here with its labels"),
    }
}

async fn scrape(port: u16) -> Option<String> {
    let r = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .ok()?;
    r.text().await.ok()
}

/// Wait until `/metrics` shows both poisoned messages as one open group and
/// the oldest-age gauge of the queue.
async fn health_scrape(port: u16, queue: &str) -> String {
    let open = format!(r#"aqw_poison_open_records{{queue="{queue}",error_kind="retryable""#);
    eventually("health gauges refreshed", DEADLINE, || async {
        let text = scrape(port).await?;
        let opened = text
            .lines()
            .any(|l| l.starts_with(&open) && l.ends_with(" 2"));
        let aged = text.contains(&format!(
            r#"aqw_queue_oldest_age_seconds{{queue="{queue}"}}"#
        ));
        // The counter is incremented when the poison path ends, after the
        // record the gauge reads: wait for it too, or a scrape between the
        // two misses it.
        let counted = text.contains("aqw_poisoned_total{");
        (opened && aged && counted).then_some(text)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_worker_exports_health_gauges_with_bounded_labels() {
    let port = free_port();
    let app = TestApp::new(
        failing_on_bad(),
        json!({"maxDequeueCount": 2}),
        json!({"http": {"port": port, "metricsInterval": "00:00:01"}}),
    );
    let mut ids = vec![];
    for id in ["good1", "good2", "bad1", "bad2"] {
        ids.push(app.enqueue(&format!(r#"{{"id":"{id}"}}"#)).await);
    }
    let log = app.path().join("worker.log");
    let w = spawn_worker(&app, &[], &log);
    let text = health_scrape(port, &app.queue).await;
    terminate(w);
    let all = samples(&text);
    let keys = ["job:good1", "job:good2", "job:bad1", "job:bad2"];
    for (name, labels, _) in &all {
        if !name.starts_with("aqw_") {
            continue;
        }
        let allowed = allowed_labels(name);
        for (label, value) in labels {
            assert!(
                allowed.contains(&label.as_str()),
                "{name} has label {label}"
            );
            for secret_ish in ids.iter().map(String::as_str).chain(keys) {
                assert!(
                    !value.contains(secret_ish),
                    "{name}{{{label}={value}}} names a message"
                );
            }
        }
    }
    let le: BTreeSet<&str> = all
        .iter()
        .filter(|(n, _, _)| n == "aqw_handler_duration_seconds_bucket")
        .filter_map(|(_, l, _)| l.get("le").map(String::as_str))
        .collect();
    assert!(
        le.contains("600") && le.contains("120"),
        "minute-scale buckets: {le:?}"
    );
    // The dashboard's every metric is in a live scrape.
    let d: Value = serde_json::from_str(&monitoring_file("aqw-grafana-dashboard.json")).unwrap();
    let live: BTreeSet<String> = all.iter().flat_map(|(n, _, _)| metric_names(n)).collect();
    for name in dashboard_exprs(&d).iter().flat_map(|e| metric_names(e)) {
        assert!(live.contains(&name), "{name} is not in a live scrape");
    }
    let log = std::fs::read_to_string(log).unwrap();
    assert!(!log.contains("panicked"), "{log}");
    app.cleanup().await;
}

/// One POST an alert receiver got: its headers and exact body.
#[derive(Clone, Debug)]
struct Received {
    headers: axum::http::HeaderMap,
    body: bytes::Bytes,
}

/// A receiver of alert POSTs on a free port.
async fn receiver() -> (String, std::sync::Arc<std::sync::Mutex<Vec<Received>>>) {
    use axum::routing::post;
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Received>::new()));
    let sink = got.clone();
    let app = axum::Router::new().route(
        "/hook",
        post(move |headers: axum::http::HeaderMap, body: bytes::Bytes| {
            let sink = sink.clone();
            async move {
                sink.lock().unwrap().push(Received { headers, body });
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, got)
}

const SECRET: &str = "s3cr3t-for-alert-signing-only-in-tests";

/// Check the signature headers: HMAC-SHA256 over "<timestamp>.<body>".
fn verify_signature(r: &Received) {
    use hmac::Mac;
    let h = |n: &str| r.headers.get(n).unwrap().to_str().unwrap().to_string();
    let ts = h("x-aqw-timestamp");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(now.abs_diff(ts.parse().unwrap()) < 300, "a fresh timestamp");
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(format!("{ts}.").as_bytes());
    mac.update(&r.body);
    let expected = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
    assert_eq!(h("x-aqw-signature"), expected);
}

/// Poison one message with a worker posting alerts in `format`; the body the
/// receiver got and the poisoned message's id.
async fn poison_and_receive(format: &str) -> (Value, String, String) {
    let (url, got) = receiver().await;
    let app = TestApp::new(failing_on_bad(), json!({"maxDequeueCount": 1}), json!({}));
    merge_aqw(
        &app,
        json!({"alert": {"webhook": url, "window": "00:00:01", "format": format,
            "dashboardUrl": "https://aqw.example/q/{queue}", "secret": "%AQW_ALERT_SECRET%"}}),
    );
    let id = app.enqueue(r#"{"id":"bad-chat"}"#).await;
    let log = app.path().join("worker.log");
    let w = spawn_worker(&app, &[("AQW_ALERT_SECRET", SECRET)], &log);
    let received = eventually("the alert", DEADLINE, || {
        let first = got.lock().unwrap().first().cloned();
        async move { first }
    })
    .await;
    terminate(w);
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(log.contains("aqw.poison.alert"), "debug logs were written");
    assert!(
        !log.contains(SECRET),
        "the signing secret never reaches a log"
    );
    verify_signature(&received);
    let body = serde_json::from_slice(&received.body).unwrap();
    let queue = app.queue.clone();
    app.cleanup().await;
    (body, queue, id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slack_alert_is_block_kit_with_the_command_and_the_dashboard() {
    let (body, queue, id) = poison_and_receive("slack").await;
    // Block Kit (docs.slack.dev/reference/block-kit/blocks): a fallback
    // `text` and typed blocks; header plain_text <= 150, section text <= 3000.
    assert!(body["text"].as_str().unwrap().contains(&queue));
    let blocks = body["blocks"].as_array().unwrap();
    assert_eq!(blocks[0]["type"], "header");
    assert_eq!(blocks[0]["text"]["type"], "plain_text");
    let group = blocks
        .iter()
        .find(|b| b["type"] == "section" && b["text"]["type"] == "mrkdwn")
        .unwrap();
    let text = group["text"]["text"].as_str().unwrap();
    assert!(
        text.contains(&format!("`aqw poison show {queue} {id}`")),
        "{text}"
    );
    assert!(text.contains("HTTP 503"), "{text}");
    // Issue 52: every format starts the on-call from `aqw triage QUEUE`.
    let all = body.to_string();
    assert!(all.contains(&format!("`aqw triage {queue}`")), "{all}");
    assert!(
        all.contains("`aqw oncall`") && !all.contains("github.com"),
        "{all}"
    );
    let button = &blocks.last().unwrap()["elements"][0];
    assert_eq!(button["type"], "button");
    assert_eq!(button["url"], format!("https://aqw.example/q/{queue}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_teams_alert_is_an_adaptive_card_message() {
    let (body, queue, id) = poison_and_receive("teams").await;
    // The shape Teams incoming webhooks and Workflows take (learn.microsoft.com,
    // "Send Adaptive Cards using an Incoming Webhook"): a message with one
    // Adaptive Card attachment (adaptivecards.io schema, version 1.4).
    assert_eq!(body["type"], "message");
    let attachments = body["attachments"].as_array().unwrap();
    assert_eq!(attachments.len(), 1);
    assert_eq!(
        attachments[0]["contentType"],
        "application/vnd.microsoft.card.adaptive"
    );
    let card = &attachments[0]["content"];
    assert_eq!(card["type"], "AdaptiveCard");
    assert_eq!(
        card["$schema"],
        "http://adaptivecards.io/schemas/adaptive-card.json"
    );
    assert_eq!(card["version"], "1.4");
    let allowed = ["TextBlock", "FactSet", "Container"];
    for element in card["body"].as_array().unwrap() {
        assert!(
            allowed.contains(&element["type"].as_str().unwrap()),
            "{element}"
        );
    }
    assert!(card
        .to_string()
        .contains(&format!("aqw poison show {queue} {id}")));
    assert!(card.to_string().contains(&format!("aqw triage {queue}")));
    assert_eq!(card["actions"][0]["type"], "Action.OpenUrl");
    assert_eq!(
        card["actions"][0]["url"],
        format!("https://aqw.example/q/{queue}")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generic_alert_keeps_the_json_body_and_adds_the_command() {
    let (body, queue, id) = poison_and_receive("generic").await;
    assert_eq!(body["event"], "aqw.poison.new");
    assert_eq!(body["count"], 1);
    assert_eq!(body["next"], format!("aqw triage {queue}"));
    assert_eq!(body["runbook"], "aqw oncall");
    assert_eq!(body["groups"][0]["messageIds"], json!([id]));
    assert_eq!(
        body["groups"][0]["show"],
        format!("aqw poison show {queue} {id}")
    );
    assert_eq!(
        body["dashboardUrl"],
        format!("https://aqw.example/q/{queue}")
    );
}

#[test]
fn bad_alert_settings_exit_2_naming_the_setting() {
    let app = TestApp::new(failing_on_bad(), json!({}), json!({}));
    for (alert, setting) in [
        (json!({"format": "discord"}), "aqw.alert.format"),
        (
            json!({"secret": "%AQW_UNSET_ALERT_SECRET%"}),
            "aqw.alert.secret",
        ),
        (
            json!({"dashboardUrl": "not a url"}),
            "aqw.alert.dashboardUrl",
        ),
        (
            json!({"runbookUrl": "http://wiki.example/oncall"}),
            "aqw.alert.runbookUrl",
        ),
    ] {
        merge_aqw(&app, json!({ "alert": alert }));
        let out = aqw(app.path(), &["run"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(setting), "{stderr}");
    }
}
