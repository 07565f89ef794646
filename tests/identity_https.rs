//! Identity-based connections for real: a private Azurite serving HTTPS with
//! `--oauth basic` (certificate made by the test with openssl, trusted via
//! `SSL_CERT_FILE`), and a local fake managed-identity token endpoint (the
//! App Service / Container Apps protocol: `IDENTITY_ENDPOINT` +
//! `IDENTITY_HEADER`). The token must reach Azurite (which checks its issuer,
//! audience and lifetime) and jobs must be processed end to end, for the
//! system-assigned and the user-assigned (`__clientId`) identity.

use crate::common;
use crate::common::free_port;

use crate::common::aqw_bin;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use axum::Router;
use base64::Engine;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TOKEN_MARK: &str = "aqw-fake-signature";
const TENANT: &str = "72f988bf-86f1-41af-91ab-2d7cd011db47";
/// The federated service-account token (workload identity) the kubelet would mount.
const ASSERTION: &str = "eyJhbGciOiJSUzI1NiJ9.federated-sa-token.c2ln";

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl is needed for the HTTPS Azurite tests");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA and a server certificate for 127.0.0.1 signed by it.
fn make_certs(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=aqw test CA",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "key.pem",
            "-out",
            "leaf.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
    );
    std::fs::write(
        dir.join("leaf.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "leaf.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "cert.pem",
            "-days",
            "2",
            "-extfile",
            "leaf.ext",
        ],
    );
}

/// A private HTTPS Azurite with `--oauth basic`, stopped on drop.
struct HttpsAzurite {
    state: PathBuf,
    queue_port: u16,
    table_port: u16,
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    _dir: tempfile::TempDir,
}

impl HttpsAzurite {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        make_certs(dir.path());
        let state = dir.path().join("state");
        let (blob_port, queue_port, table_port) = (free_port(), free_port(), free_port());
        let a = Self {
            state,
            queue_port,
            table_port,
            ca: dir.path().join("ca.pem"),
            cert: dir.path().join("cert.pem"),
            key: dir.path().join("key.pem"),
            _dir: dir,
        };
        let status = a
            .script("start")
            .env("AQW_AZURITE_BLOB_PORT", blob_port.to_string())
            .env("AQW_AZURITE_CERT", &a.cert)
            .env("AQW_AZURITE_KEY", &a.key)
            .env("AQW_AZURITE_OAUTH", "basic")
            .status()
            .unwrap();
        assert!(status.success(), "HTTPS Azurite did not start");
        a
    }

    fn script(&self, cmd: &str) -> Command {
        let mut c = Command::new("bash");
        c.arg(format!("{}/scripts/azurite.sh", env!("CARGO_MANIFEST_DIR")))
            .arg(cmd)
            .env("AQW_AZURITE_STATE", &self.state)
            .env("AQW_AZURITE_QUEUE_PORT", self.queue_port.to_string())
            .env("AQW_AZURITE_TABLE_PORT", self.table_port.to_string());
        c
    }
}

impl Drop for HttpsAzurite {
    fn drop(&mut self) {
        let _ = self.script("stop").status();
    }
}

/// An unsigned JWT shaped like an Entra ID storage token (Azurite's
/// `--oauth basic` checks issuer, audience, nbf and exp, not the signature).
fn fake_jwt() -> String {
    let b64 = |v: serde_json::Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    };
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    format!(
        "{}.{}.{}",
        b64(serde_json::json!({"typ": "JWT", "alg": "RS256"})),
        b64(serde_json::json!({
            "aud": "https://storage.azure.com",
            "iss": "https://sts.windows.net/72f988bf-86f1-41af-91ab-2d7cd011db47/",
            "iat": now - 60,
            "nbf": now - 60,
            "exp": now + 3600,
            "oid": "00000000-0000-0000-0000-00000000a0a0",
            "tid": "72f988bf-86f1-41af-91ab-2d7cd011db47",
        })),
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(TOKEN_MARK)
    )
}

type Seen = Arc<Mutex<Vec<(HashMap<String, String>, Option<String>)>>>;

async fn token(
    State(seen): State<Seen>,
    Query(q): Query<HashMap<String, String>>,
    h: HeaderMap,
) -> (StatusCode, String) {
    let secret = h
        .get("x-identity-header")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    seen.lock().unwrap().push((q, secret));
    let expires = time::OffsetDateTime::now_utc().unix_timestamp() + 3600;
    (
        StatusCode::OK,
        format!(
            r#"{{"access_token":"{}","expires_on":"{expires}","resource":"https://storage.azure.com","token_type":"Bearer"}}"#,
            fake_jwt()
        ),
    )
}

async fn token_endpoint() -> (u16, Seen) {
    let seen = Seen::default();
    let app = Router::new()
        .route("/msi/token", get(token))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (port, seen)
}

/// Which credential the child process is set up for.
#[derive(Clone)]
enum Platform {
    /// App Service / Container Apps: IDENTITY_ENDPOINT on this port.
    ManagedIdentity(u16),
    /// AKS workload identity: token file, tenant, client id, authority port.
    Workload {
        token_file: PathBuf,
        env_client_id: String,
        authority_port: u16,
    },
    /// A developer's machine: a fake `az` first on PATH.
    DeveloperTools { bin_dir: PathBuf },
}

fn identity_env(
    c: &mut Command,
    azurite: &HttpsAzurite,
    platform: &Platform,
    client_id: Option<&str>,
) {
    match platform {
        Platform::ManagedIdentity(token_port) => {
            c.env(
                "IDENTITY_ENDPOINT",
                format!("http://127.0.0.1:{token_port}/msi/token"),
            )
            .env("IDENTITY_HEADER", "local-identity-secret")
            .env("AzureWebJobsStorage__credential", "managedidentity")
            .env_remove("AZURE_FEDERATED_TOKEN_FILE");
        }
        Platform::Workload {
            token_file,
            env_client_id,
            authority_port,
        } => {
            c.env("AZURE_FEDERATED_TOKEN_FILE", token_file)
                .env("AZURE_CLIENT_ID", env_client_id)
                .env("AZURE_TENANT_ID", TENANT)
                .env(
                    "AZURE_AUTHORITY_HOST",
                    format!("https://127.0.0.1:{authority_port}"),
                )
                .env_remove("IDENTITY_ENDPOINT")
                .env_remove("IDENTITY_HEADER")
                .env_remove("AzureWebJobsStorage__credential");
        }
        Platform::DeveloperTools { bin_dir } => {
            let path = std::env::var("PATH").unwrap_or_default();
            c.env("PATH", format!("{}:{path}", bin_dir.display()))
                .env_remove("AZURE_FEDERATED_TOKEN_FILE")
                .env_remove("IDENTITY_ENDPOINT")
                .env_remove("IDENTITY_HEADER")
                .env_remove("AzureWebJobsStorage__credential");
        }
    }
    c.env_remove("AzureWebJobsStorage")
        .env(
            "AzureWebJobsStorage__queueServiceUri",
            format!("https://127.0.0.1:{}/devstoreaccount1", azurite.queue_port),
        )
        .env(
            "AzureWebJobsStorage__tableServiceUri",
            format!("https://127.0.0.1:{}/devstoreaccount1", azurite.table_port),
        )
        .env("SSL_CERT_FILE", &azurite.ca)
        .env("AQW_LOG", "debug")
        .env_remove("AzureWebJobsStorage__managedIdentityResourceId");
    match client_id {
        Some(id) => c.env("AzureWebJobsStorage__clientId", id),
        None => c.env_remove("AzureWebJobsStorage__clientId"),
    };
}

/// Enqueue three jobs and run a worker until their effects appear: every
/// storage call (queue and table) authenticated by the managed-identity token.
async fn jobs_run_with_managed_identity(client_id: Option<&str>) {
    let azurite = HttpsAzurite::start();
    let (token_port, seen) = token_endpoint().await;
    run_three_jobs(&azurite, &Platform::ManagedIdentity(token_port), client_id).await;
    let seen = seen.lock().unwrap().clone();
    assert!(!seen.is_empty(), "the token endpoint was asked");
    for (q, secret) in &seen {
        assert_eq!(
            q.get("resource").map(String::as_str),
            Some("https://storage.azure.com")
        );
        assert_eq!(secret.as_deref(), Some("local-identity-secret"));
        assert_eq!(
            q.get("client_id").map(String::as_str),
            client_id,
            "the user-assigned identity is asked for by client id (system-assigned: none)"
        );
    }
    // At least one token per process (three enqueues and the worker).
    assert!(seen.len() >= 4, "{seen:?}");
}

/// Enqueue three jobs with the aqw binary, then run a worker until their
/// effects appear; every storage call authenticated by a bearer token.
async fn run_three_jobs(azurite: &HttpsAzurite, platform: &Platform, client_id: Option<&str>) {
    let app = tempfile::tempdir().unwrap();
    let effects = app.path().join("effects");
    let queue = common::random_name("mi");
    std::fs::write(
        app.path().join("host.json"),
        serde_json::json!({
            "extensions": {"queues": {"maxPollingInterval": "00:00:00.200"}},
            "aqw": {
                "functions": {"Job": {
                    "queue": queue,
                    "key": "job:{/id}",
                    "handler": {"type": "exec", "command": ["sh", "-c", format!("cat >> {}; echo >> {}", effects.display(), effects.display())]}
                }},
                "shutdownTimeout": "00:00:02"
            }
        })
        .to_string(),
    )
    .unwrap();

    for i in 0..3 {
        let mut c = Command::new(aqw_bin());
        c.args([
            "enqueue",
            &queue,
            "--payload",
            &format!(r#"{{"id":{i}}}"#),
            "--app",
        ])
        .arg(app.path());
        identity_env(&mut c, azurite, platform, client_id);
        let out = tokio::task::spawn_blocking(move || c.output().unwrap())
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(
            out.status.code(),
            Some(0),
            "enqueue over HTTPS with a token: {stderr}"
        );
        assert!(
            !stderr.contains(TOKEN_MARK),
            "token in a log line: {stderr}"
        );
    }

    let mut c = Command::new(aqw_bin());
    c.args(["run", "--app"]).arg(app.path());
    identity_env(&mut c, azurite, platform, client_id);
    let log = app.path().join("run.log");
    c.stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(app.path().join("run.err")).unwrap());
    let mut child = c.spawn().unwrap();
    let t0 = Instant::now();
    let mut done = 0;
    while t0.elapsed() < Duration::from_secs(30) {
        done = std::fs::read_to_string(&effects)
            // Concurrent handlers append to one file: count payloads, not lines.
            .map(|s| s.matches("\"id\"").count())
            .unwrap_or(0);
        if done >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // SIGTERM: aqw drains and exits 0.
    unsafe_sigterm(child.id());
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    let stderr = std::fs::read_to_string(app.path().join("run.err")).unwrap_or_default()
        + &std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(done, 3, "three jobs processed with the token: {stderr}");
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains(TOKEN_MARK), "token in a log line");
    assert!(
        !stderr.contains("local-identity-secret") && !stderr.contains(ASSERTION),
        "identity secret or federated assertion in a log line"
    );
}

fn unsafe_sigterm(pid: u32) {
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn system_assigned_managed_identity_processes_jobs_over_https() {
    jobs_run_with_managed_identity(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_assigned_client_id_processes_jobs_over_https() {
    jobs_run_with_managed_identity(Some("5c2f0a43-63c6-4d6b-9b0c-1f0e0a1b2c3d")).await;
}

/// A one-route HTTPS Entra ID token endpoint (`POST /{tenant}/oauth2/v2.0/token`)
/// with the test's certificate: records each request's path and form body.
async fn https_authority(azurite: &HttpsAzurite) -> (u16, Arc<Mutex<Vec<(String, String)>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(&azurite.cert)
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(&azurite.key).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let record = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            let record = record.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let (head, body) = loop {
                    let n = tls.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    if let Some((head, body)) = text.split_once("\r\n\r\n") {
                        let len = head
                            .lines()
                            .find_map(|l| {
                                let (k, v) = l.split_once(':')?;
                                k.eq_ignore_ascii_case("content-length")
                                    .then(|| v.trim().parse::<usize>().ok())?
                            })
                            .unwrap_or(0);
                        if body.len() >= len {
                            break (head.to_string(), body.to_string());
                        }
                    }
                };
                let path = head
                    .split_whitespace()
                    .nth(1)
                    .unwrap_or_default()
                    .to_string();
                record.lock().unwrap().push((path, body));
                let json = format!(
                    r#"{{"token_type":"Bearer","expires_in":3600,"ext_expires_in":3600,"access_token":"{}"}}"#,
                    fake_jwt()
                );
                let rsp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{json}",
                    json.len()
                );
                let _ = tls.write_all(rsp.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    (port, seen)
}

async fn jobs_run_with_workload_identity(client_id: Option<&str>) {
    let azurite = HttpsAzurite::start();
    let (authority_port, seen) = https_authority(&azurite).await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("azure-identity-token");
    std::fs::write(&token_file, ASSERTION).unwrap();
    let env_client_id = "11111111-2222-3333-4444-555555555555".to_string();
    let platform = Platform::Workload {
        token_file,
        env_client_id: env_client_id.clone(),
        authority_port,
    };
    run_three_jobs(&azurite, &platform, client_id).await;
    let seen = seen.lock().unwrap().clone();
    assert!(seen.len() >= 4, "a token per process: {seen:?}");
    for (path, body) in &seen {
        assert_eq!(path, &format!("/{TENANT}/oauth2/v2.0/token"));
        let form: HashMap<String, String> = url::form_urlencoded::parse(body.as_bytes())
            .into_owned()
            .collect();
        assert_eq!(
            form.get("client_assertion").map(String::as_str),
            Some(ASSERTION)
        );
        assert_eq!(
            form.get("scope").map(String::as_str),
            Some("https://storage.azure.com/.default")
        );
        assert_eq!(
            form.get("client_id").map(String::as_str),
            Some(client_id.unwrap_or(&env_client_id)),
            "__clientId wins over AZURE_CLIENT_ID"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workload_identity_processes_jobs_over_https() {
    jobs_run_with_workload_identity(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workload_identity_honours_the_settings_client_id() {
    jobs_run_with_workload_identity(Some("99999999-8888-7777-6666-555555555555")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn developer_tools_credential_without_settings_uses_the_azure_cli() {
    let azurite = HttpsAzurite::start();
    let dir = tempfile::tempdir().unwrap();
    let calls = dir.path().join("az-calls");
    let expires = time::OffsetDateTime::now_utc().unix_timestamp() + 3600;
    // `az account get-access-token -o json --scope ...` as Azure CLI 2.54+ answers it.
    let az = dir.path().join("az");
    std::fs::write(
        &az,
        format!(
            "#!/bin/sh\necho \"$@\" >> '{}'\n\
             printf '%s' '{{\"accessToken\":\"{}\",\"expiresOn\":\"2030-01-02 03:04:05.000000\",\"expires_on\":{expires},\"tokenType\":\"Bearer\"}}'\n",
            calls.display(),
            fake_jwt()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&az, std::fs::Permissions::from_mode(0o755)).unwrap();
    let platform = Platform::DeveloperTools {
        bin_dir: dir.path().to_path_buf(),
    };
    run_three_jobs(&azurite, &platform, None).await;
    let calls = std::fs::read_to_string(&calls).unwrap();
    assert!(
        calls.lines().count() >= 4,
        "az asked once per process: {calls}"
    );
    for line in calls.lines() {
        assert!(
            line.starts_with("account get-access-token")
                && line.contains("https://storage.azure.com/.default"),
            "{line}"
        );
    }
}
