//! Identity-based connections (`AzureWebJobsStorage__queueServiceUri` …): a
//! token fetched from a local fake managed-identity endpoint is sent to
//! storage as a bearer header, and never reaches a log line.

use crate::common::aqw_bin;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{any, get};
use axum::Router;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

const TOKEN: &str = "eyJ0eXAiOiJKV1QifQ.fake-storage-token.c2ln";

/// A token request: its query and its secret header.
type TokenRequest = (HashMap<String, String>, Option<String>);

#[derive(Clone, Default)]
struct Seen {
    identity: Arc<Mutex<Vec<TokenRequest>>>,
    storage: Arc<Mutex<Vec<Option<String>>>>,
}

async fn token(
    State(s): State<Seen>,
    Query(q): Query<HashMap<String, String>>,
    h: HeaderMap,
) -> (StatusCode, String) {
    let secret = h
        .get("x-identity-header")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    s.identity.lock().unwrap().push((q, secret));
    let expires = time::OffsetDateTime::now_utc().unix_timestamp() + 3600;
    (
        StatusCode::OK,
        format!(
            r#"{{"access_token":"{TOKEN}","expires_on":"{expires}","resource":"https://storage.azure.com","token_type":"Bearer","client_id":"00000000-0000-0000-0000-000000000000"}}"#
        ),
    )
}

async fn storage(State(s): State<Seen>, h: HeaderMap) -> StatusCode {
    s.storage.lock().unwrap().push(
        h.get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
    );
    StatusCode::FORBIDDEN
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managed_identity_token_is_sent_as_bearer() {
    let seen = Seen::default();
    let app = Router::new()
        .route("/token", get(token))
        .route("/{*rest}", any(storage))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("host.json"),
        r#"{"aqw": {"functions": {"F": {"queue": "orders", "key": "none", "handler": {"type": "exec", "command": ["true"]}}}}}"#,
    )
    .unwrap();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(aqw_bin())
            .args(["enqueue", "orders", "--payload", "{}", "--app"])
            .arg(dir.path())
            .env_remove("AzureWebJobsStorage")
            .env(
                "AzureWebJobsStorage__queueServiceUri",
                format!("http://127.0.0.1:{port}/acct"),
            )
            .env(
                "AzureWebJobsStorage__tableServiceUri",
                format!("http://127.0.0.1:{port}/acct"),
            )
            .env("AzureWebJobsStorage__credential", "managedidentity")
            .env(
                "IDENTITY_ENDPOINT",
                format!("http://127.0.0.1:{port}/token"),
            )
            .env("IDENTITY_HEADER", "local-secret")
            .env("AQW_LOG", "trace")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(3),
        "storage refused (403): a runtime error, {stderr}"
    );
    let identity = seen.identity.lock().unwrap().clone();
    assert!(!identity.is_empty(), "the token endpoint was asked");
    assert_eq!(
        identity[0].0.get("resource").map(String::as_str),
        Some("https://storage.azure.com")
    );
    assert_eq!(identity[0].1.as_deref(), Some("local-secret"));
    let auth = seen.storage.lock().unwrap().clone();
    assert!(!auth.is_empty(), "storage was called");
    assert_eq!(auth[0].as_deref(), Some(format!("Bearer {TOKEN}").as_str()));
    assert!(
        !stderr.contains("fake-storage-token"),
        "the token never reaches a log line: {stderr}"
    );
}

#[test]
fn identity_settings_resolve_without_a_connection_string() {
    let mut env = std::collections::BTreeMap::new();
    env.insert("Store__accountName".to_string(), "acct".to_string());
    env.insert("Store__clientId".to_string(), "cid".to_string());
    let account = aqw::config::resolve_connection("Store", &env).unwrap();
    let c = aqw_azure::connection_of(&account).unwrap();
    assert_eq!(c.queue_endpoint, "https://acct.queue.core.windows.net");
    assert_eq!(c.table_endpoint, "https://acct.table.core.windows.net");
    assert_eq!(
        c.credentials,
        aqw_azure::Credentials::Identity {
            client_id: Some("cid".into())
        }
    );
    env.insert("Store__credential".to_string(), "clientsecret".to_string());
    assert!(aqw::config::resolve_connection("Store", &env)
        .unwrap_err()
        .contains("managedidentity"));
}
