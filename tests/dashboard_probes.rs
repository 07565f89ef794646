//! The attacker's probes of issue 28, against the real `aqw dashboard`
//! binary over Azurite: each test is one weak spot the probes found (forged
//! principal headers, sessions that outlive sign-out, unthrottled guessing,
//! weak tokens, DNS rebinding, log forging, odd ids, endless refresh).

use crate::common::*;
use aqw_core::poison::RecordStatus;
use base64::Engine as _;
use serde_json::json;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(60);
const TOKEN: &str = "probe-token-7c1e9b04f2a8d653";
const SECRET: &str = "proxy-secret-5d0a8e3f61b7c942";

/// `aqw dashboard`, killed on drop; its stderr goes to a file.
pub(crate) struct Running {
    child: Child,
    pub(crate) url: String,
    pub(crate) port: u16,
    log: tempfile::NamedTempFile,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Running {
    fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }
}

pub(crate) fn command(app: &TestApp, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut c = Command::new(aqw_bin());
    c.arg("dashboard").args(args).arg("--app").arg(app.path());
    c.env("AzureWebJobsStorage", CONN);
    for k in [
        "AQW_DASHBOARD_TOKEN",
        "AQW_DASHBOARD_TRUST_PRINCIPAL",
        "AQW_DASHBOARD_PROXY_SECRET",
        "AQW_DASHBOARD_TRUSTED_PROXIES",
        "AQW_DASHBOARD_PUBLIC_URL",
        "AQW_DASHBOARD_ALLOW_WIDE_TRUSTED_PROXIES",
        "AQW_DASHBOARD_MAX_CONNECTIONS",
        "AQW_DASHBOARD_MAX_CONNECTIONS_PER_CLIENT",
    ] {
        c.env_remove(k);
    }
    c.envs(env.iter().copied());
    c
}

/// Run `c` to its exit, which a refused configuration reaches at once;
/// `None` (and killed) when it is still running after a few seconds, i.e.
/// it started serving.
pub(crate) fn exit_of(mut c: Command) -> Option<std::process::Output> {
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = c
        .stdout(Stdio::null())
        .stderr(log.reopen().unwrap())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        if let Some(status) = child.try_wait().unwrap() {
            let stderr = std::fs::read(log.path()).unwrap();
            let stdout = vec![];
            return Some(std::process::Output {
                status,
                stdout,
                stderr,
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

pub(crate) fn start(app: &TestApp, args: &[&str], env: &[(&str, &str)]) -> Running {
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = command(app, &[&["--listen", "127.0.0.1:0"], args].concat(), env)
        .stdout(Stdio::piped())
        .stderr(log.reopen().unwrap())
        .spawn()
        .expect("start aqw dashboard");
    let stdout = child.stdout.take().unwrap();
    let url = dashboard_url(stdout, DEADLINE);
    let port = url.rsplit(':').next().unwrap().parse().unwrap();
    Running {
        child,
        url,
        port,
        log,
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) headers: reqwest::header::HeaderMap,
    pub(crate) body: String,
}

pub(crate) async fn send(
    d: &Running,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    form: Option<&str>,
) -> Reply {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut req = client().request(method, format!("{}{path}", d.url));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if let Some(f) = form {
        req = req
            .header("content-type", "application/x-www-form-urlencoded")
            .body(f.to_string());
    }
    let resp = req.send().await.unwrap();
    Reply {
        status: resp.status().as_u16(),
        headers: resp.headers().clone(),
        body: resp.text().await.unwrap(),
    }
}

fn csrf_of(page: &str) -> String {
    let re = regex::Regex::new(r#"name="csrf" value="([0-9a-f]+)""#).unwrap();
    re.captures(page).expect("a form with a CSRF token")[1].to_string()
}

fn enc(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

fn keyed_app() -> TestApp {
    TestApp::new(
        json!({"key": "order:{/orderId}"}),
        json!({"maxDequeueCount": 1}),
        json!({}),
    )
}

/// Try a discard of `id` as whoever `headers` say: the record page's CSRF
/// token (if the page shows one), then the POST. The POST's status.
async fn try_discard(d: &Running, app: &TestApp, id: &str, headers: &[(&str, &str)]) -> u16 {
    let page = send(
        d,
        "GET",
        &format!("/q/{}/record?id={}", app.queue, enc(id)),
        headers,
        None,
    )
    .await;
    let csrf = regex::Regex::new(r#"name="csrf" value="([0-9a-f]+)""#)
        .unwrap()
        .captures(&page.body)
        .map(|c| c[1].to_string())
        .unwrap_or_default();
    let form = format!("id={}&reason=probe&csrf={csrf}", enc(id));
    send(
        d,
        "POST",
        &format!("/q/{}/discard", app.queue),
        headers,
        Some(&form),
    )
    .await
    .status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_principal_header_sent_straight_to_the_listener_is_nobody() {
    let app = keyed_app();
    let id = poisoned_by_worker(&app, DEADLINE).await;
    let env = [
        ("AQW_DASHBOARD_TRUST_PRINCIPAL", "1"),
        ("AQW_DASHBOARD_PROXY_SECRET", SECRET),
    ];
    let d = start(&app, &[], &env);
    let forged = [("x-ms-client-principal-name", "mallory@evil")];
    assert_eq!(try_discard(&d, &app, &id, &forged).await, 401);
    assert_eq!(poison_record(&app, &id).await.status, RecordStatus::Open);
    assert!(
        d.log().contains("aqw.dashboard.principal_refused"),
        "{}",
        d.log()
    );
    // Through the front end (it adds the secret), the same header is someone.
    let vouched = [
        ("x-ms-client-principal-name", "alice@contoso.com"),
        ("x-aqw-proxy-secret", SECRET),
    ];
    assert_eq!(try_discard(&d, &app, &id, &vouched).await, 303);
    let rec = poison_record(&app, &id).await;
    assert_eq!(rec.status, RecordStatus::Discarded);
    assert_eq!(rec.discarded_by.as_deref(), Some("alice@contoso.com"));
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_token_and_trust_a_forged_header_plus_any_cookie_gets_nothing_and_the_bearer_wins() {
    let app = keyed_app();
    let id = poisoned_by_worker(&app, DEADLINE).await;
    let env = [
        ("AQW_DASHBOARD_TOKEN", TOKEN),
        ("AQW_DASHBOARD_USER", "oncall"),
        ("AQW_DASHBOARD_TRUST_PRINCIPAL", "1"),
        ("AQW_DASHBOARD_PROXY_SECRET", SECRET),
    ];
    let d = start(&app, &[], &env);
    let forged = [
        ("x-ms-client-principal-name", "mallory@evil"),
        ("cookie", "aqw_session=anything; aqw_login=x"),
    ];
    assert_eq!(try_discard(&d, &app, &id, &forged).await, 401);
    assert_eq!(poison_record(&app, &id).await.status, RecordStatus::Open);
    // A bearer decides even next to vouched principal headers.
    let bearer = format!("Bearer {TOKEN}");
    let both = [
        ("authorization", bearer.as_str()),
        ("x-ms-client-principal-name", "alice@contoso.com"),
        ("x-aqw-proxy-secret", SECRET),
    ];
    assert_eq!(try_discard(&d, &app, &id, &both).await, 303);
    assert_eq!(
        poison_record(&app, &id).await.discarded_by.as_deref(),
        Some("oncall")
    );
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trust_without_a_guard_beyond_loopback_refuses_to_start_and_trust_is_announced() {
    azurite();
    let app = keyed_app();
    let trust = [("AQW_DASHBOARD_TRUST_PRINCIPAL", "1")];
    let c = command(&app, &["--listen", "0.0.0.0:0"], &trust);
    let out = exit_of(c).expect("refused, not serving");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("AQW_DASHBOARD_PROXY_SECRET"), "{err}");
    // On loopback it starts, says so at start-up and in /healthz.
    let d = start(&app, &[], &[("AQW_DASHBOARD_TRUST_PRINCIPAL", "1")]);
    let health = send(&d, "GET", "/healthz", &[], None).await;
    assert_eq!(health.status, 200, "{}", health.body);
    let h: serde_json::Value = serde_json::from_str(&health.body).unwrap();
    assert_eq!(h["mode"], "principal");
    assert!(
        h["warnings"][0]
            .as_str()
            .unwrap()
            .contains("TRUST_PRINCIPAL"),
        "{h}"
    );
    eventually("the start-up warning", DEADLINE, || async {
        d.log()
            .contains("X-MS-CLIENT-PRINCIPAL headers are believed")
            .then_some(())
    })
    .await;
    app.cleanup().await;
}

/// Sign in through the form: the session cookie (`aqw_session=…`).
async fn sign_in(d: &Running) -> String {
    let form = send(d, "GET", "/login", &[], None).await;
    let nonce = form.headers["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let body = format!("csrf={}&token={TOKEN}", csrf_of(&form.body));
    let ok = send(d, "POST", "/login", &[("cookie", &nonce)], Some(&body)).await;
    assert_eq!(ok.status, 303, "{}", ok.body);
    ok.headers
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().split(';').next().unwrap().to_string())
        .find(|c| c.starts_with("aqw_session="))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_sign_out_the_old_cookie_is_nobody_on_a_get_and_on_a_post() {
    let app = keyed_app();
    let id = poisoned_by_worker(&app, DEADLINE).await;
    let d = start(&app, &[], &[("AQW_DASHBOARD_TOKEN", TOKEN)]);
    let cookie = sign_in(&d).await;
    let session = [("cookie", cookie.as_str())];
    let record_uri = format!("/q/{}/record?id={}", app.queue, enc(&id));
    let page = send(&d, "GET", &record_uri, &session, None).await;
    assert_eq!(page.status, 200);
    let csrf = csrf_of(&page.body);
    let out = send(
        &d,
        "POST",
        "/logout",
        &session,
        Some(&format!("csrf={csrf}")),
    )
    .await;
    assert_eq!(out.status, 303);
    // The browser forgets the cookie; a replay of it must not work either.
    assert_eq!(
        send(&d, "GET", &record_uri, &session, None).await.status,
        401
    );
    let form = format!("id={}&reason=replayed-cookie&csrf={csrf}", enc(&id));
    let post = send(
        &d,
        "POST",
        &format!("/q/{}/discard", app.queue),
        &session,
        Some(&form),
    )
    .await;
    assert_eq!(post.status, 401, "{}", post.body);
    assert_eq!(poison_record(&app, &id).await.status, RecordStatus::Open);
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guessing_sign_ins_is_slowed_down_even_for_the_right_token_afterwards() {
    azurite();
    let app = keyed_app();
    let d = start(&app, &[], &[("AQW_DASHBOARD_TOKEN", TOKEN)]);
    let form = send(&d, "GET", "/login", &[], None).await;
    let nonce = form.headers["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let csrf = csrf_of(&form.body);
    let mut limited = None;
    for i in 0..60 {
        let body = format!("csrf={csrf}&token=guess-{i:04}-abcdefghijkl");
        let r = send(&d, "POST", "/login", &[("cookie", &nonce)], Some(&body)).await;
        if r.status == 429 {
            limited = Some(r);
            break;
        }
        assert_eq!(r.status, 401);
    }
    let limited = limited.expect("60 wrong sign-ins are throttled");
    let wait: u64 = limited.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=300).contains(&wait), "{wait}");
    let body = format!("csrf={csrf}&token={TOKEN}");
    let right = send(&d, "POST", "/login", &[("cookie", &nonce)], Some(&body)).await;
    assert_eq!(
        right.status, 429,
        "the token is not even checked while blocked"
    );
    tokio::time::sleep(Duration::from_secs(wait)).await;
    let later = send(&d, "POST", "/login", &[("cookie", &nonce)], Some(&body)).await;
    assert_eq!(later.status, 303, "after Retry-After the right token works");
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_bearers_are_throttled_and_logged_without_the_secret() {
    azurite();
    let app = keyed_app();
    let d = start(&app, &[], &[("AQW_DASHBOARD_TOKEN", TOKEN)]);
    let presented = "Bearer wrong-bearer-SECRET-GUESS-42";
    let mut statuses = vec![];
    for _ in 0..10 {
        statuses.push(
            send(&d, "GET", "/", &[("authorization", presented)], None)
                .await
                .status,
        );
    }
    assert_eq!(statuses[0], 401);
    assert!(statuses.contains(&429), "{statuses:?}");
    eventually("the failure log line", DEADLINE, || async {
        d.log().contains("aqw.dashboard.auth_failed").then_some(())
    })
    .await;
    let log = d.log();
    assert!(log.contains("bearer"), "{log}");
    assert!(
        !log.contains("SECRET-GUESS") && !log.contains(TOKEN),
        "{log}"
    );
    // Rate-limited: ten failures in well under a second, not ten lines.
    assert!(
        log.matches("aqw.dashboard.auth_failed").count() < 10,
        "{log}"
    );
    app.cleanup().await;
}

/// Sign-out is no token oracle (issue 40): a wrong bearer on `POST /logout`
/// (and on any route, read-only too) is a counted 401, so guesses meet 429
/// like anywhere else, whatever the right token would have been answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_bearer_on_sign_out_is_a_counted_401_not_an_oracle() {
    azurite();
    let app = keyed_app();
    for args in [&[][..], &["--read-only"][..]] {
        let d = start(&app, args, &[("AQW_DASHBOARD_TOKEN", TOKEN)]);
        let mut statuses = vec![];
        let mut last_counted = std::time::Instant::now();
        for i in 0..30 {
            let guess = format!("Bearer guess-{i:04}-0123456789abcdef");
            let r = send(
                &d,
                "POST",
                "/logout",
                &[("authorization", &guess)],
                Some("csrf=x"),
            )
            .await;
            if r.status == 401 {
                // A counted failure: the block (1 s at the shortest) starts here.
                last_counted = std::time::Instant::now();
            }
            statuses.push(r.status);
        }
        assert!(
            statuses.iter().all(|s| *s == 401 || *s == 429),
            "{args:?}: {statuses:?}"
        );
        assert_eq!(statuses[0], 401, "{args:?}");
        assert!(
            statuses.contains(&429),
            "{args:?}: guesses are throttled: {statuses:?}"
        );
        // Blocked: even the right token is not checked until the wait ends.
        // The shortest block is 1 s from the last counted failure: a request
        // after it is checked (a 403 for the fake CSRF), which is no leak.
        let right = format!("Bearer {TOKEN}");
        let r = send(
            &d,
            "POST",
            "/logout",
            &[("authorization", &right)],
            Some("csrf=x"),
        )
        .await;
        let block_over = r.status == 403 && last_counted.elapsed() >= Duration::from_secs(1);
        assert!(
            r.status == 429 || block_over,
            "{args:?}: the block holds for the right token too: {}",
            r.status
        );
        eventually("the failure log line", DEADLINE, || async {
            d.log().contains("aqw.dashboard.auth_failed").then_some(())
        })
        .await;
    }
    app.cleanup().await;
}

#[test]
fn a_low_entropy_token_is_refused_at_start_up_saying_why() {
    azurite();
    let app = keyed_app();
    // Issue 40, and issue 48's: runs up and down, a keyboard walk, repeated blocks.
    for weak in [
        "aaaaaaaaaaaaaaaaaaaaaaaa",
        "abababababababababababab",
        "1234567123456712345671",
        "abcdefghabcdefgh",
        "01234567890123456789",
        "98765432109876543210",
        "qwertyuiopasdfghjkl",
        "abcabcabcabcabcabc",
    ] {
        let c = command(
            &app,
            &["--listen", "127.0.0.1:0"],
            &[("AQW_DASHBOARD_TOKEN", weak)],
        );
        let out = exit_of(c).expect("refused, not serving");
        assert_eq!(out.status.code(), Some(2), "{weak}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("AQW_DASHBOARD_TOKEN is guessable"),
            "{weak}: {err}"
        );
        assert!(
            !err.contains(weak),
            "the token itself is not repeated: {err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_dashboard_refuses_a_foreign_host_dns_rebinding() {
    let app = keyed_app();
    let id = poisoned_by_worker(&app, DEADLINE).await;
    let d = start(&app, &["--read-only"], &[]);
    let uri = format!("/q/{}/record?id={}", app.queue, enc(&id));
    let rebound = send(
        &d,
        "GET",
        &uri,
        &[("host", &format!("evil.example:{}", d.port))],
        None,
    )
    .await;
    assert_eq!(rebound.status, 421, "{}", rebound.body);
    assert!(
        !rebound.body.contains("o-1"),
        "no payload for a foreign host"
    );
    for host in [
        format!("127.0.0.1:{}", d.port),
        format!("localhost:{}", d.port),
    ] {
        let ok = send(&d, "GET", &uri, &[("host", &host)], None).await;
        assert_eq!(ok.status, 200, "{host}");
    }
    // A configured public name is answered.
    let public = [("AQW_DASHBOARD_PUBLIC_URL", "https://ops.example.com")];
    let p = start(&app, &["--read-only"], &public);
    let r = send(&p, "GET", "/", &[("host", "ops.example.com")], None).await;
    assert_eq!(r.status, 200);
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_principal_name_with_a_newline_cannot_forge_log_lines_or_records() {
    let app = keyed_app();
    let id = poisoned_by_worker(&app, DEADLINE).await;
    let d = start(&app, &[], &[("AQW_DASHBOARD_TRUST_PRINCIPAL", "1")]);
    let name = "mallory\nINFO aqw.dashboard.discard by=admin";
    let principal =
        json!({"auth_typ": "aad", "name_typ": "name", "claims": [{"typ": "name", "val": name}]});
    let b64 = base64::engine::general_purpose::STANDARD.encode(principal.to_string());
    let headers = [("x-ms-client-principal", b64.as_str())];
    assert_eq!(try_discard(&d, &app, &id, &headers).await, 303);
    let by = poison_record(&app, &id).await.discarded_by.unwrap();
    assert!(!by.contains('\n'), "{by:?}");
    assert!(by.starts_with("mallory\\u{a}INFO"), "{by:?}");
    eventually("the discard log line", DEADLINE, || async {
        d.log()
            .contains("discarded from the dashboard")
            .then_some(())
    })
    .await;
    let log = d.log();
    assert!(
        !log.lines()
            .any(|l| l.starts_with("INFO aqw.dashboard.discard")),
        "{log}"
    );
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_with_a_slash_are_404_and_progress_stops_refreshing() {
    let app = keyed_app();
    let id = poisoned_by_worker(&app, DEADLINE).await;
    let d = start(&app, &["--read-only"], &[]);
    let q = &app.queue;
    let r = send(&d, "GET", &format!("/q/{q}/record?id=a%2Fb"), &[], None).await;
    assert_eq!(r.status, 404, "{}", r.body);
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let unknown = send(
        &d,
        "GET",
        &format!("/q/{q}/progress?id=nope&since={now}"),
        &[],
        None,
    )
    .await;
    assert_eq!(unknown.status, 200);
    assert!(
        !unknown.body.contains("http-equiv=\"refresh\""),
        "{}",
        unknown.body
    );
    assert!(unknown.body.contains("do not exist"), "{}", unknown.body);
    // An open record waits, but only until the deadline.
    let fresh = format!("/q/{q}/progress?id={}&since={now}", enc(&id));
    assert!(send(&d, "GET", &fresh, &[], None)
        .await
        .body
        .contains("http-equiv=\"refresh\""));
    let stale = format!("/q/{q}/progress?id={}&since={}", enc(&id), now - 3600);
    let old = send(&d, "GET", &stale, &[], None).await;
    assert!(!old.body.contains("http-equiv=\"refresh\""), "{}", old.body);
    assert!(old.body.contains("Stopped refreshing"), "{}", old.body);
    app.cleanup().await;
}

/// Issue 40: a client that never finishes its headers, or its body, is cut
/// off (the connection closes; a trickled body gets 408), instead of
/// holding a connection open without end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_cut_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let app = keyed_app();
    let d = start(&app, &["--read-only"], &[]);
    let host = format!("127.0.0.1:{}", d.port);
    let answer = |mut s: tokio::net::TcpStream| async move {
        let mut got = Vec::new();
        // Ends when the server closes the connection.
        let _ = s.read_to_end(&mut got).await;
        String::from_utf8_lossy(&got).into_owned()
    };
    let mut s = tokio::net::TcpStream::connect(&host).await.unwrap();
    s.write_all(format!("GET / HTTP/1.1\r\nHost: {host}\r\n").as_bytes())
        .await
        .unwrap();
    let closed = tokio::time::timeout(DEADLINE, answer(s)).await;
    assert!(
        closed.is_ok(),
        "a connection with partial headers stays open"
    );
    let mut s = tokio::net::TcpStream::connect(&host).await.unwrap();
    let head = format!(
        "POST /login HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\ntoken=ab"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let reply = tokio::time::timeout(DEADLINE, answer(s))
        .await
        .expect("a connection with a partial body stays open");
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    app.cleanup().await;
}
