//! The attacker's probes of issue 48, item 3, each a regression test: a
//! wide trusted-proxy list, free text with bidi overrides and ESC in every
//! column, unauthenticated bodies and connections that hold memory, an
//! operation id with `/`, a reviewed form posted twice. (Weak tokens:
//! `dashboard_probes::a_low_entropy_token_is_refused_at_start_up_saying_why`;
//! a schedule named `a/b`: `schedules`.)

use crate::common::*;
use crate::dashboard::{bget, bpost, csrf_of, dashboard, enc, insert_record, keyed_app};
use crate::dashboard_probes::{command, exit_of, send, start};
use aqw_core::handler::HandlerError;
use aqw_core::message::MessageEncoding;
use axum::http::StatusCode;
use std::time::Duration;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const DEADLINE: Duration = Duration::from_secs(60);
const TOKEN: &str = "hardening-token-4f9c2e7a1b8d0356";
/// A right-to-left override and a colour escape.
const HOSTILE: &str = "ledger \u{202E}nwod\u{1b}[31m red";

fn assert_neutral(what: &str, page: &str) {
    for raw in ['\u{202E}', '\u{1b}'] {
        assert!(!page.contains(raw), "{what}: a raw {raw:?} in {page}");
    }
    assert!(
        page.contains("\\u{202e}nwod"),
        "{what}: not shown escaped: {page}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wide_trusted_proxy_list_is_refused_unless_overridden_and_healthz_says_so() {
    azurite();
    let app = keyed_app(serde_json::json!({}));
    let wide = [
        ("AQW_DASHBOARD_TRUST_PRINCIPAL", "1"),
        ("AQW_DASHBOARD_TRUSTED_PROXIES", "0.0.0.0/1,128.0.0.0/1"),
    ];
    let out =
        exit_of(command(&app, &["--listen", "127.0.0.1:0"], &wide)).expect("refused, not serving");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("AQW_DASHBOARD_TRUSTED_PROXIES")
            && err.contains("--allow-wide-trusted-proxies"),
        "{err}"
    );
    // With the override it starts, and /healthz names the guard in force.
    let d = start(&app, &["--allow-wide-trusted-proxies"], &wide);
    let health = send(&d, "GET", "/healthz", &[], None).await;
    let h: serde_json::Value = serde_json::from_str(&health.body).unwrap();
    let guard = h["principal_guard"].as_str().unwrap_or_default();
    assert!(
        guard.contains("wide trusted-proxy range allowed by override")
            && guard.contains("0.0.0.0/1"),
        "{h}"
    );
    // A narrow list needs no override and says nothing of one.
    let narrow = [
        ("AQW_DASHBOARD_TRUST_PRINCIPAL", "1"),
        ("AQW_DASHBOARD_TRUSTED_PROXIES", "10.0.0.0/8"),
    ];
    let d = start(&app, &[], &narrow);
    let h: serde_json::Value =
        serde_json::from_str(&send(&d, "GET", "/healthz", &[], None).await.body).unwrap();
    let guard = h["principal_guard"].as_str().unwrap_or_default();
    assert!(
        guard.contains("AQW_DASHBOARD_TRUSTED_PROXIES") && !guard.contains("override"),
        "{h}"
    );
    app.cleanup().await;
}

/// A record poisoned by the worker with a hostile error (so the key's last
/// error and attempt history hold it too), and one inserted with a hostile
/// key: every page that shows them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bidi_overrides_and_escapes_are_neutralised_in_every_free_text_column() {
    let app = keyed_app(serde_json::json!({"maxDequeueCount": 1}));
    let id = app.enqueue(r#"{"orderId":"o-1"}"#).await;
    let h = Scripted::new(|_, _| Err(HandlerError::permanent(HOSTILE)));
    let w = app.start_worker(h);
    eventually("the poison copy", DEADLINE, || async {
        (app.poison_messages().await.len() == 1).then_some(())
    })
    .await;
    w.stop().await;
    let payload = r#"{"orderId":"o-2"}"#;
    insert_record(&app, "raw-1", payload, MessageEncoding::None, HOSTILE).await;
    let r = dashboard(&app, false);
    let q = &app.queue;
    let list = bget(&r, &format!("/q/{q}")).await.body;
    assert!(
        list.contains("id=\"groups\"") && list.contains("<title>"),
        "{list}"
    );
    assert!(list.contains("class=\"legend\""), "{list}");
    assert_neutral(
        "the list: error column, group list, chart titles and legend",
        &list,
    );
    let record = bget(&r, &format!("/q/{q}/record?id={}", enc(&id)))
        .await
        .body;
    assert!(record.contains("id=\"key-last-error\"") && record.contains("id=\"history\""));
    assert_neutral("the record: key-state error and attempt history", &record);
    let csrf = csrf_of(&list);
    let review = bpost(
        &r,
        &format!("/q/{q}/group/discard"),
        &format!("csrf={csrf}&mode=dry-run"),
    )
    .await;
    assert_neutral("the group-discard review", &review.body);
    // The corrected job's key, derived from a patched payload, is free text too.
    let patch = enc(r#"[{"op":"replace","path":"/orderId","value":"x\u202Enwod\u001b[31m"}]"#);
    let form = format!("csrf={csrf}&mode=preview&patch={patch}");
    let preview = bpost(&r, &format!("/q/{q}/group/fix"), &form).await.body;
    assert!(preview.contains("id=\"fix-preview\""), "{preview}");
    for raw in ['\u{202E}', '\u{1b}'] {
        assert!(!preview.contains(raw), "the fix preview: a raw {raw:?}");
    }
    assert!(preview.contains("order:x\\u{202e}nwod"), "{preview}");
    app.cleanup().await;
}

/// Headers of a POST that declares a 1 MiB body, as raw HTTP/1.1.
fn big_post(path: &str, host: &str, extra: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/x-www-form-urlencoded\r\n\
         Content-Length: {}\r\n{extra}\r\n",
        1 << 20
    )
}

/// Send `head` and a few bytes of the body, never the rest, and read the
/// answer: it comes although the body never does, so nothing waited for it.
async fn answer_without_the_body(port: u16, head: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(b"token=aaaa").await.unwrap();
    let mut answer = vec![0u8; 4096];
    let n = tokio::time::timeout(DEADLINE, s.read(&mut answer))
        .await
        .expect("an answer before the body")
        .unwrap();
    String::from_utf8_lossy(&answer[..n]).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unauthenticated_large_body_is_refused_before_it_is_read() {
    let app = keyed_app(serde_json::json!({}));
    let d = start(&app, &[], &[("AQW_DASHBOARD_TOKEN", TOKEN)]);
    let port = d.port;
    let own = format!("127.0.0.1:{port}");
    for path in ["/login", &format!("/q/{}/discard", app.queue)] {
        let a = answer_without_the_body(port, &big_post(path, &own, "")).await;
        assert!(a.starts_with("HTTP/1.1 413"), "{path}: {a}");
    }
    // A foreign Host is refused before anything else, the body unread.
    let a = answer_without_the_body(port, &big_post("/login", "evil.example", "")).await;
    assert!(a.starts_with("HTTP/1.1 421"), "{a}");
    // A wrong bearer is refused before the body too.
    let wrong = "Authorization: Bearer wrong-wrong-wrong-wrong\r\n";
    let path = format!("/q/{}/discard", app.queue);
    let a = answer_without_the_body(port, &big_post(&path, &own, wrong)).await;
    assert!(a.starts_with("HTTP/1.1 401"), "{a}");
    // The sign-in form still fits; the right bearer may send a large body.
    let form = send(&d, "GET", "/login", &[], None).await;
    assert_eq!(form.status, 200);
    let bearer = format!("Authorization: Bearer {TOKEN}\r\n");
    let big = format!("csrf=x&pad={}", "a".repeat(64 << 10));
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {own}\r\nContent-Type: application/x-www-form-urlencoded\r\n{bearer}Content-Length: {}\r\nConnection: close\r\n\r\n",
        big.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(big.as_bytes()).await.unwrap();
    let mut answer = String::new();
    tokio::time::timeout(DEADLINE, s.read_to_string(&mut answer))
        .await
        .expect("an answer")
        .unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 403"),
        "CSRF refused, after the body was read: {answer}"
    );
    app.cleanup().await;
}

/// A connection from `source`, a loopback address of this machine.
async fn connect_from(source: &str, port: u16) -> tokio::net::TcpStream {
    let s = tokio::net::TcpSocket::new_v4().unwrap();
    s.bind(format!("{source}:0").parse().unwrap()).unwrap();
    s.connect(format!("127.0.0.1:{port}").parse().unwrap())
        .await
        .unwrap()
}

/// Ask for `/healthz` on `s`: the status line, or what ended the connection.
async fn healthz_on(mut s: tokio::net::TcpStream, port: u16) -> String {
    let req =
        format!("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    if let Err(e) = s.write_all(req.as_bytes()).await {
        return format!("closed: {e}");
    }
    let mut answer = String::new();
    match tokio::time::timeout(DEADLINE, s.read_to_string(&mut answer)).await {
        Ok(Ok(_)) => answer
            .lines()
            .next()
            .unwrap_or("closed: no answer")
            .to_string(),
        Ok(Err(e)) => format!("closed: {e}"),
        Err(_) => "no answer in time".into(),
    }
}

/// What the dashboard says to a connection it turns away, unasked: a 503
/// the moment it is accepted (an admitted connection says nothing until it
/// is asked, and this one never asks).
async fn turned_away(mut s: tokio::net::TcpStream) -> String {
    let mut answer = String::new();
    tokio::time::timeout(DEADLINE, s.read_to_string(&mut answer))
        .await
        .expect("the connection answered and closed")
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_per_client_or_total_cap_are_turned_away() {
    let app = keyed_app(serde_json::json!({}));
    let args = [
        "--read-only",
        "--max-connections",
        "3",
        "--max-connections-per-client",
        "2",
    ];
    let d = start(&app, &args, &[]);
    let port = d.port;
    // Two idle connections from one address: its cap.
    let held = [
        connect_from("127.0.0.1", port).await,
        connect_from("127.0.0.1", port).await,
    ];
    let third = turned_away(connect_from("127.0.0.1", port).await).await;
    assert!(
        third.contains("too many connections from your address"),
        "{third}"
    );
    // Another address still gets in: the total cap is the third connection.
    let other = connect_from("127.0.0.2", port).await;
    let fourth = turned_away(connect_from("127.0.0.3", port).await).await;
    assert!(
        fourth.contains("as many connections as it allows"),
        "{fourth}"
    );
    let served = healthz_on(other, port).await;
    assert!(served.contains("200"), "{served}");
    // A closed connection's slot is free again.
    drop(held);
    eventually("a slot again", DEADLINE, || async {
        let a = healthz_on(connect_from("127.0.0.1", port).await, port).await;
        a.contains("200").then_some(())
    })
    .await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_id_with_a_slash_is_not_found_without_asking_storage() {
    let app = keyed_app(serde_json::json!({}));
    let r = dashboard(&app, false);
    for path in ["/ops/a%2Fb", "/ops/a%5Cb", "/ops/a%23b", "/ops/%E2%80%AE"] {
        let got = bget(&r, path).await;
        assert_eq!(got.status, StatusCode::NOT_FOUND, "{path}: {}", got.body);
    }
    let csrf = csrf_of(&bget(&r, &format!("/q/{}", app.queue)).await.body);
    let cancel = bpost(&r, "/ops/a%2Fb/cancel", &format!("csrf={csrf}")).await;
    assert_eq!(cancel.status, StatusCode::NOT_FOUND, "{}", cancel.body);
    let record = bget(&r, &format!("/q/{}/record?id=a%2Fb", app.queue)).await;
    assert_eq!(record.status, StatusCode::NOT_FOUND);
    let queue = bget(&r, "/q/a%2Fb").await;
    assert_eq!(queue.status, StatusCode::NOT_FOUND);
    app.cleanup().await;
}

fn hidden(page: &str, name: &str) -> String {
    let re = regex::Regex::new(&format!(r#"name="{name}" value="([^"]+)""#)).unwrap();
    re.captures(page).expect("the hidden field")[1].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reviewed_form_posted_twice_creates_one_operation() {
    let app = keyed_app(serde_json::json!({}));
    app.records().create_if_missing().await.unwrap();
    for i in 0..2 {
        let payload = format!(r#"{{"orderId":"twice-{i}"}}"#);
        insert_record(
            &app,
            &format!("twice-{i}"),
            &payload,
            MessageEncoding::None,
            "HTTP 404 gone",
        )
        .await;
    }
    let r = dashboard(&app, false);
    let q = &app.queue;
    let csrf = csrf_of(&bget(&r, &format!("/q/{q}")).await.body);
    let review = bpost(
        &r,
        &format!("/q/{q}/group/discard"),
        &format!("csrf={csrf}&mode=dry-run"),
    )
    .await;
    let (reviewed, op) = (hidden(&review.body, "reviewed"), hidden(&review.body, "op"));
    let form = format!("csrf={csrf}&mode=real&reviewed={reviewed}&op={op}&reason=gone&rate=1000");
    let first = bpost(&r, &format!("/q/{q}/group/discard"), &form).await;
    let second = bpost(&r, &format!("/q/{q}/group/discard"), &form).await;
    let to = |a: &crate::dashboard::Reply| {
        assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
        a.headers["location"].to_str().unwrap().to_string()
    };
    assert_eq!(to(&first), format!("/ops/{op}"));
    assert_eq!(
        to(&second),
        to(&first),
        "the second shows the first's operation"
    );
    let ops = aqw_core::ops::QueueOps::new(app.config.clone(), q, &app.storage());
    let store = aqw_core::ops::operation::OperationStore::new(ops.control.table().clone());
    let mine: Vec<_> = store
        .list()
        .await
        .unwrap()
        .into_iter()
        .filter(|o| &o.queue == q)
        .collect();
    assert_eq!(mine.len(), 1, "{mine:?}");
    // An id no operation can have is refused, not used.
    let forged = form.replace(&format!("op={op}"), "op=a%2Fb");
    let refused = bpost(&r, &format!("/q/{q}/group/discard"), &forged).await;
    assert_ne!(refused.status, StatusCode::SEE_OTHER, "{}", refused.body);
    app.cleanup().await;
}
