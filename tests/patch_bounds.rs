//! Bounded JSON Patches (issue 48) with the real binary and the dashboard
//! on Azurite. The copy bomb (`add /a` of 1 KiB, then 40 copies of `/a`
//! into itself, doubling the payload each time) is refused by `aqw ops fix`
//! and its dry run, exit 2, nothing created; left on a row all the same, a
//! real `aqw run` takes it, leaves each record open with why, and lives on.
//! The dashboard's preview of it answers 400 with the reason and the
//! dashboard stays up; a review digest computed by a client (the unkeyed
//! SHA-256 prefix of before) is refused.

use crate::common::*;
use crate::dashboard::{bget, bpost, csrf_of, dashboard, enc, insert_record, reviewed_of};
use crate::durable_ops::{app_to, out_of, poisoned, records_in, spawn, store};
use aqw_core::message::MessageEncoding;
use aqw_core::ops::operation::{self, NewOperation, OpKind, OpState, Selection};
use aqw_core::poison::RecordStatus;
use axum::http::StatusCode;
use serde_json::json;
use std::time::Duration;

/// The patch of issue 48.
fn copy_bomb() -> String {
    let mut p = vec![json!({"op": "add", "path": "/a", "value": {"s": "x".repeat(1024)}})];
    for i in 0..40 {
        p.push(json!({"op": "copy", "from": "/a", "path": format!("/a/k{i}")}));
    }
    serde_json::Value::Array(p).to_string()
}

const REFUSAL: &str = "the patch would grow the payload past 1 MiB at op 10 (copy /a -> /a/k9)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_fix_refuses_a_copy_bomb_and_a_real_run_given_one_lives_on() {
    let sink = Sink::start().await;
    let app = app_to(&sink);
    poisoned(&app, 3).await;
    let q = app.queue.clone();
    let bomb = copy_bomb();
    for dry in [true, false] {
        let mut args = vec!["ops", "fix", &q, "--patch", &bomb, "--by", "a"];
        if dry {
            args.push("--dry-run");
        }
        let out = aqw(app.path(), &args);
        let text = out_of(&out);
        assert_eq!(out.status.code(), Some(2), "dry run {dry}: {text}");
        assert!(
            text.contains(REFUSAL) && text.contains("nothing was created"),
            "{text}"
        );
    }
    assert!(
        store(&app).list().await.unwrap().is_empty(),
        "nothing created"
    );

    // A row with the bomb all the same (written by an older aqw, or by
    // hand): an idle `aqw run` takes it, refuses the patch on each record
    // before it allocates, finishes it, and is still running.
    let new = NewOperation {
        queue: q.clone(),
        kind: OpKind::Fix {
            patch: bomb.clone(),
            past_provider_window: false,
        },
        by: "mallory".into(),
        selection: Selection::default(),
        fingerprint: "unreviewed".into(),
        selected: 3,
        rate: 10.0,
        halt_after: 3,
    };
    let op = store(&app).create(&new).await.unwrap();
    let mut run = spawn(&app, &["run"]);
    let end = eventually(
        "an idle aqw run finishes the bomb's operation",
        Duration::from_secs(120),
        || async {
            let (row, _) = store(&app).get(&op.id).await.unwrap()?;
            row.state.is_final().then_some(row)
        },
    )
    .await;
    let alive = run.try_wait().unwrap().is_none();
    let _ = run.kill();
    let _ = run.wait();
    assert!(alive, "the aqw run that took the bomb is still running");
    assert_eq!(end.state, OpState::Done, "{end:?}");
    assert_eq!((end.done, end.skipped, end.failed), (0, 3, 0), "{end:?}");
    let why = end.last_error.unwrap_or_default();
    assert!(why.contains(REFUSAL), "{why}");
    assert_eq!(records_in(&app, RecordStatus::Open).await.len(), 3);
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_refuses_a_copy_bomb_preview_and_a_forged_review() {
    let app = TestApp::new(json!({"key": "order:{/orderId}"}), json!({}), json!({}));
    app.records().create_if_missing().await.unwrap();
    app.source().create_if_missing().await.unwrap();
    let mut ids: Vec<String> = (0..2).map(|i| format!("bomb-{i}")).collect();
    for id in &ids {
        let payload = format!(r#"{{"orderId":"{id}"}}"#);
        insert_record(
            &app,
            id,
            &payload,
            MessageEncoding::None,
            "HTTP 422 no currency",
        )
        .await;
    }
    let r = dashboard(&app, false);
    let q = &app.queue;
    let csrf = csrf_of(&bget(&r, &format!("/q/{q}")).await.body);
    let query = format!("csrf={csrf}&error=currency");
    let uri = format!("/q/{q}/group/fix");
    let form = format!("{query}&mode=preview&patch={}", enc(&copy_bomb()));
    let refused = bpost(&r, &uri, &form).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.body);
    let shown = REFUSAL.replace('>', "&gt;");
    assert!(refused.body.contains(&shown), "{}", refused.body);
    assert!(
        !refused.body.contains("patch_reviewed"),
        "no digest to fix with"
    );
    let up = bget(&r, &format!("/q/{q}")).await;
    assert_eq!(up.status, StatusCode::OK, "the dashboard is still up");

    // A good patch, previewed: its digests are keyed by this process.
    let patch = r#"[{"op":"add","path":"/currency","value":"EUR"}]"#;
    let preview = bpost(
        &r,
        &uri,
        &format!("{query}&mode=preview&patch={}", enc(patch)),
    )
    .await;
    assert_eq!(preview.status, StatusCode::OK, "{}", preview.body);
    let reviewed = reviewed_of(&preview.body);
    let digest = regex::Regex::new(r#"name="patch_reviewed" value="([0-9a-f]+)""#)
        .unwrap()
        .captures(&preview.body)
        .expect("the previewed patch's digest")[1]
        .to_string();
    // What a client could compute before: the unkeyed SHA-256 prefixes.
    ids.sort();
    let forged_ids = operation::fingerprint(&ids);
    let forged_patch = operation::fingerprint(&[patch.to_string()]);
    let real = |reviewed: &str, digest: &str| {
        format!(
            "{query}&mode=real&reviewed={reviewed}&patch_reviewed={digest}&patch={}",
            enc(patch)
        )
    };
    for (rv, dg) in [(&forged_ids, &digest), (&reviewed, &forged_patch)] {
        let no = bpost(&r, &uri, &real(rv, dg)).await;
        assert_eq!(no.status, StatusCode::CONFLICT, "{}", no.body);
    }
    let discard = format!("{query}&mode=real&reviewed={forged_ids}&reason=r");
    let no = bpost(&r, &format!("/q/{q}/group/discard"), &discard).await;
    assert_eq!(no.status, StatusCode::CONFLICT, "{}", no.body);
    let ops = store(&app).list().await.unwrap();
    assert!(ops.is_empty(), "nothing created: {ops:?}");
    // The digests this process gave go through.
    let yes = bpost(&r, &uri, &real(&reviewed, &digest)).await;
    assert_eq!(yes.status, StatusCode::SEE_OTHER, "{}", yes.body);
    app.cleanup().await;
}
