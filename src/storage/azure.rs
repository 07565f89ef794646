//! The Azure SDK (0.21 line) behind [`QueueStore`] and [`TableStore`].
//!
//! Transport: one pooled reqwest client with connect and request timeouts,
//! wrapped in [`CountingTransport`] so every storage request is counted by
//! operation and status (the `aqw_storage_requests_total` metric and the
//! per-instance counters that tests and benchmarks read).

use super::*;
use super::{Connection, Credentials};
use azure_core::error::ErrorKind;
use azure_core::{
    ClientOptions, ExponentialRetryOptions, HttpClient, RetryOptions, TransportOptions,
};
use azure_data_tables::clients::TableServiceClientBuilder;
use azure_data_tables::prelude::*;
use azure_data_tables::IfMatchCondition;
use azure_storage::clients::ServiceType;
use azure_storage::{CloudLocation, StorageCredentials};
use azure_storage_queues::prelude::*;
use azure_storage_queues::QueueServiceClientBuilder;
use futures::StreamExt;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Counts requests by operation and status, then hands them to reqwest.
#[derive(Debug)]
pub struct CountingTransport {
    client: reqwest::Client,
    counts: Arc<Mutex<BTreeMap<String, u64>>>,
}

fn operation_name(method: &azure_core::Method, url: &url::Url) -> &'static str {
    use azure_core::Method as M;
    let path = url.path();
    let query = url.query().unwrap_or("");
    let is_table_port =
        url.port() == Some(10002) || url.host_str().is_some_and(|h| h.contains(".table."));
    if path.ends_with("/messages") || path.contains("/messages/") {
        let with_id = path.contains("/messages/");
        return match (method, with_id) {
            (M::Get, _) if query.contains("peekonly=true") => "queue.peek",
            (M::Get, _) => "queue.receive",
            (M::Post, _) => "queue.put",
            (M::Put, true) => "queue.update",
            (M::Delete, true) => "queue.delete",
            (M::Delete, false) => "queue.clear",
            _ => "queue.other",
        };
    }
    if path.ends_with("$batch") {
        return "table.batch";
    }
    if path.ends_with("/Tables") || path.contains("/Tables(") {
        return "table.admin";
    }
    if path.ends_with("()") {
        return "table.query";
    }
    if path.contains("(PartitionKey=") {
        return match method {
            M::Get => "table.get",
            M::Put | M::Merge => "table.update",
            M::Delete => "table.delete",
            _ => "table.other",
        };
    }
    if matches!(method, M::Post) && (is_table_port || !query.contains("comp=")) {
        return "table.insert";
    }
    if query.contains("comp=metadata") {
        return "queue.metadata";
    }
    match method {
        M::Put => "queue.create",
        M::Delete => "queue.delete_queue",
        _ => "other",
    }
}

#[async_trait]
impl HttpClient for CountingTransport {
    async fn execute_request(
        &self,
        request: &azure_core::Request,
    ) -> azure_core::Result<azure_core::Response> {
        let op = operation_name(request.method(), request.url());
        let result = self.client.execute_request(request).await;
        let status = match &result {
            Ok(r) => (r.status() as u16).to_string(),
            Err(_) => "error".to_string(),
        };
        metrics::counter!("aqw_storage_requests_total", "operation" => op, "status" => status)
            .increment(1);
        *self
            .counts
            .lock()
            .unwrap()
            .entry(op.to_string())
            .or_default() += 1;
        result
    }
}

/// Queues and tables of one account, sharing one pooled transport.
#[derive(Clone)]
pub struct AzureStorage {
    queues: QueueServiceClient,
    tables: TableServiceClient,
    counts: Arc<Mutex<BTreeMap<String, u64>>>,
}

impl AzureStorage {
    /// Storage requests made through this instance, by operation.
    pub fn request_counts(&self) -> BTreeMap<String, u64> {
        self.counts.lock().unwrap().clone()
    }
}

/// Build clients for a resolved connection. No network access happens here.
pub fn connect(connection: &Connection) -> Result<AzureStorage, StorageError> {
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(30))
        // Below Node's 5 s keep-alive (Azurite) so a pooled connection is
        // never reused just as the server closes it (a request lost as
        // "connection closed before message completed").
        .pool_idle_timeout(Duration::from_secs(4))
        .pool_max_idle_per_host(64)
        // Storage never redirects. Following one would re-send a signed
        // request to a URL the account did not name (and costs a URL parse
        // per request in reqwest's redirect layer): surface it as an error.
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| StorageError::Other(format!("cannot build HTTP client: {e}")))?;
    let counts = Arc::new(Mutex::new(BTreeMap::new()));
    let transport = CountingTransport {
        client: http,
        counts: counts.clone(),
    };
    // A few quick SDK-level retries smooth over blips; longer outages are the
    // worker's business (it backs off and keeps going).
    let options = ClientOptions::default()
        .retry(RetryOptions::exponential(
            ExponentialRetryOptions::default()
                .max_retries(3u32)
                .initial_delay(Duration::from_millis(100))
                .max_delay(Duration::from_secs(2))
                .max_total_elapsed(Duration::from_secs(10)),
        ))
        .transport(TransportOptions::new(Arc::new(transport)));
    let credentials = match &connection.credentials {
        Credentials::SharedKey { account, key } => {
            StorageCredentials::access_key(account.clone(), key.expose().to_string())
        }
        Credentials::Sas { token } => {
            StorageCredentials::sas_token(token.expose()).map_err(|_| {
                StorageError::Other(format!(
                    "{}: the SAS token could not be parsed",
                    connection.setting
                ))
            })?
        }
        Credentials::Identity { client_id } => {
            StorageCredentials::token_credential(identity_credential(client_id.as_deref())?)
        }
    };
    let queues = QueueServiceClientBuilder::with_location(
        CloudLocation::Custom {
            account: connection.account.clone(),
            uri: connection.queue_endpoint.clone(),
        },
        credentials.clone(),
    )
    .client_options(options.clone())
    .build();
    let tables = TableServiceClientBuilder::with_location(
        CloudLocation::Custom {
            account: connection.account.clone(),
            uri: connection.table_endpoint.clone(),
        },
        credentials,
    )
    .client_options(options)
    .build();
    let _ = ServiceType::Queue;
    Ok(AzureStorage {
        queues,
        tables,
        counts,
    })
}

impl Storage for AzureStorage {
    fn queue(&self, name: &str) -> Arc<dyn QueueStore> {
        Arc::new(AzureQueue {
            name: name.to_string(),
            client: self.queues.queue_client(name),
        })
    }
    fn table(&self, name: &str) -> Arc<dyn TableStore> {
        Arc::new(AzureTable {
            name: name.to_string(),
            client: self.tables.table_client(name),
        })
    }
}

/// The token credential for an identity-based connection, picked from the
/// environment the platform sets: AKS workload identity
/// (`AZURE_FEDERATED_TOKEN_FILE`, `AZURE_CLIENT_ID`, `AZURE_TENANT_ID`), App
/// Service / Container Apps / Functions (`IDENTITY_ENDPOINT`,
/// `IDENTITY_HEADER`), else the VM's instance metadata endpoint.
fn identity_credential(
    client_id: Option<&str>,
) -> Result<Arc<dyn azure_core::auth::TokenCredential>, StorageError> {
    use azure_identity::{
        AppServiceManagedIdentityCredential, TokenCredentialOptions,
        VirtualMachineManagedIdentityCredential, WorkloadIdentityCredential,
    };
    let options = TokenCredentialOptions::default();
    let var = |n: &str| std::env::var(n).ok().filter(|v| !v.is_empty());
    if var("AZURE_FEDERATED_TOKEN_FILE").is_some() {
        if let (Some(want), Some(have)) = (client_id, var("AZURE_CLIENT_ID")) {
            if want != have {
                tracing::warn!("__clientId differs from AZURE_CLIENT_ID; workload identity uses AZURE_CLIENT_ID");
            }
        }
        let c = WorkloadIdentityCredential::create(options).map_err(|e| {
            StorageError::Other(format!(
                "workload identity: {}",
                crate::telemetry::scrub(&e.to_string())
            ))
        })?;
        return Ok(Arc::new(c));
    }
    if client_id.is_some() {
        // The 0.21 SDK's managed identity credentials only ask for the
        // system-assigned identity (its client-id option is crate-private).
        tracing::warn!("__clientId is not supported by this SDK line's managed identity credential; using the system-assigned identity");
    }
    if var("IDENTITY_ENDPOINT").is_some() {
        let c = AppServiceManagedIdentityCredential::create(options).map_err(|e| {
            StorageError::Other(format!(
                "managed identity: {}",
                crate::telemetry::scrub(&e.to_string())
            ))
        })?;
        return Ok(Arc::new(c));
    }
    Ok(Arc::new(VirtualMachineManagedIdentityCredential::new(
        options,
    )))
}

/// Map an SDK error to [`StorageError`], keeping only status and error code:
/// SDK messages can carry URLs, and URLs can carry SAS signatures.
fn map_err(e: azure_core::Error) -> StorageError {
    match e.kind() {
        ErrorKind::HttpResponse { status, error_code } => {
            let status = *status as u16;
            let code = error_code.clone().unwrap_or_default();
            match status {
                404 => StorageError::NotFound,
                409 if code != "QueueBeingDeleted" && code != "TableBeingDeleted" => {
                    StorageError::Conflict
                }
                412 => StorageError::PreconditionFailed,
                _ => StorageError::Http { status, code },
            }
        }
        ErrorKind::Io => StorageError::Transport(crate::telemetry::scrub(&io_chain(&e))),
        ErrorKind::Credential => {
            StorageError::Other("credential error (check the connection setting)".into())
        }
        ErrorKind::DataConversion => StorageError::Other(format!(
            "unexpected response from storage: {}",
            crate::telemetry::scrub(&e.to_string())
        )),
        _ => StorageError::Other(crate::telemetry::scrub(&e.to_string())),
    }
}

fn io_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        out.push_str(": ");
        out.push_str(&s.to_string());
        src = s.source();
    }
    out
}

struct AzureQueue {
    name: String,
    client: QueueClient,
}

fn clamp_secs(d: Duration) -> Duration {
    // The service takes whole seconds; round sub-second delays up so a retry
    // delay of 0.5 s does not become "visible now".
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    Duration::from_secs(secs.min(7 * 24 * 3600))
}

#[async_trait]
impl QueueStore for AzureQueue {
    fn name(&self) -> &str {
        &self.name
    }

    async fn create_if_missing(&self) -> StorageResult<()> {
        match self.client.create().await.map_err(map_err) {
            Ok(_) | Err(StorageError::Conflict) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn receive(&self, max: u8, visibility: Duration) -> StorageResult<Vec<ReceivedMessage>> {
        let resp = self
            .client
            .get_messages()
            .number_of_messages(max.clamp(1, 32))
            .visibility_timeout(clamp_secs(visibility))
            .await
            .map_err(map_err)?;
        Ok(resp
            .messages
            .into_iter()
            .map(|m| ReceivedMessage {
                id: m.message_id,
                pop_receipt: m.pop_receipt,
                dequeue_count: m.dequeue_count.min(u32::MAX as u64) as u32,
                insertion_time: m.insertion_time,
                expiration_time: m.expiration_time,
                next_visible: m.time_next_visible,
                text: m.message_text,
            })
            .collect())
    }

    async fn peek(&self, max: u8) -> StorageResult<Vec<PeekedMessage>> {
        let resp = self
            .client
            .peek_messages()
            .number_of_messages(max.clamp(1, 32))
            .await
            .map_err(map_err)?;
        Ok(resp
            .messages
            .into_iter()
            .map(|m| PeekedMessage {
                id: m.message_id,
                dequeue_count: m.dequeue_count.min(u32::MAX as u64) as u32,
                insertion_time: m.insertion_time,
                text: m.message_text,
            })
            .collect())
    }

    async fn put(&self, text: &str, visibility: Duration, ttl: Ttl) -> StorageResult<PutReceipt> {
        let mut builder = self.client.put_message(text.to_string());
        if !visibility.is_zero() {
            builder = builder.visibility_timeout(clamp_secs(visibility));
        }
        builder = match ttl {
            Ttl::Default => builder,
            Ttl::After(d) => builder.ttl(clamp_secs(d)),
            // The 0.21 MessageTTL only takes a Duration (no -1); i32::MAX
            // seconds (68 years) is accepted by the service and Azurite and is
            // "never" for any practical purpose.
            Ttl::Never => builder.ttl(Duration::from_secs(i32::MAX as u64)),
        };
        let resp = builder.await.map_err(map_err)?;
        Ok(PutReceipt {
            id: resp.queue_message.message_id,
            pop_receipt: resp.queue_message.pop_receipt,
            insertion_time: resp.queue_message.insertion_time,
        })
    }

    async fn update_visibility(
        &self,
        id: &str,
        pop_receipt: &str,
        text: &str,
        visibility: Duration,
    ) -> StorageResult<String> {
        let resp = self
            .client
            .pop_receipt_client(PopReceipt::new(id, pop_receipt))
            .update(text.to_string(), clamp_secs(visibility))
            .await
            .map_err(map_err)?;
        Ok(resp.pop_receipt)
    }

    async fn delete(&self, id: &str, pop_receipt: &str) -> StorageResult<()> {
        self.client
            .pop_receipt_client(PopReceipt::new(id, pop_receipt))
            .delete()
            .await
            .map_err(map_err)?;
        Ok(())
    }

    async fn approximate_count(&self) -> StorageResult<u64> {
        let resp = self.client.get_metadata().await.map_err(map_err)?;
        Ok(resp.approximate_messages_count as u64)
    }

    async fn delete_queue(&self) -> StorageResult<()> {
        match self.client.delete().await.map_err(map_err) {
            Ok(_) | Err(StorageError::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

struct AzureTable {
    name: String,
    client: TableClient,
}

fn with_keys(pk: &str, rk: &str, entity: &Entity) -> Value {
    let mut m = entity.clone();
    m.insert("PartitionKey".into(), Value::String(pk.into()));
    m.insert("RowKey".into(), Value::String(rk.into()));
    Value::Object(m)
}

/// Drop service metadata (odata.*, Timestamp, keys) from a returned entity.
fn strip(v: Value) -> (String, String, Entity) {
    let Value::Object(mut m) = v else {
        return (String::new(), String::new(), Entity::new());
    };
    let pk = m
        .remove("PartitionKey")
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    let rk = m
        .remove("RowKey")
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    m.retain(|k, _| !k.starts_with("odata.") && !k.contains("@odata.") && k != "Timestamp");
    (pk, rk, m)
}

fn if_match(etag: Option<&Etag>) -> IfMatchCondition {
    match etag {
        Some(e) => IfMatchCondition::Etag(azure_core::Etag::from(e.0.clone())),
        None => IfMatchCondition::Any,
    }
}

#[async_trait]
impl TableStore for AzureTable {
    fn name(&self) -> &str {
        &self.name
    }

    async fn create_if_missing(&self) -> StorageResult<()> {
        match self.client.create().await.map_err(map_err) {
            Ok(_) | Err(StorageError::Conflict) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn insert(&self, pk: &str, rk: &str, entity: &Entity) -> StorageResult<Etag> {
        let resp = self
            .client
            .insert::<_, Value>(with_keys(pk, rk, entity))
            .map_err(map_err)?
            .await
            .map_err(map_err)?;
        Ok(Etag(resp.etag.to_string()))
    }

    async fn get(&self, pk: &str, rk: &str) -> StorageResult<Option<(Entity, Etag)>> {
        let client = self.client.partition_key_client(pk).entity_client(rk);
        match client.get::<Value>().await.map_err(map_err) {
            Ok(resp) => Ok(Some((strip(resp.entity).2, Etag(resp.etag.to_string())))),
            Err(StorageError::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn replace(
        &self,
        pk: &str,
        rk: &str,
        entity: &Entity,
        etag: Option<&Etag>,
    ) -> StorageResult<Etag> {
        let client = self.client.partition_key_client(pk).entity_client(rk);
        let builder = client
            .update(with_keys(pk, rk, entity), if_match(etag))
            .map_err(map_err)?;
        Ok(Etag(builder.await.map_err(map_err)?.etag.to_string()))
    }

    async fn merge(
        &self,
        pk: &str,
        rk: &str,
        entity: &Entity,
        etag: Option<&Etag>,
    ) -> StorageResult<Etag> {
        let client = self.client.partition_key_client(pk).entity_client(rk);
        let builder = client
            .merge(with_keys(pk, rk, entity), if_match(etag))
            .map_err(map_err)?;
        Ok(Etag(builder.await.map_err(map_err)?.etag.to_string()))
    }

    async fn delete(&self, pk: &str, rk: &str) -> StorageResult<()> {
        let client = self.client.partition_key_client(pk).entity_client(rk);
        match client.delete().await.map_err(map_err) {
            Ok(_) | Err(StorageError::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn query_rows(&self, pk: Option<&str>) -> StorageResult<Vec<Row>> {
        let mut builder = self.client.query();
        if let Some(pk) = pk {
            // Partition keys aqw writes are queue names or hex: no quote to escape,
            // but escape anyway (the 0.21 SDK does not).
            builder = builder.filter(format!("PartitionKey eq '{}'", pk.replace('\'', "''")));
        }
        let mut stream = builder.into_stream::<Value>();
        let mut out = Vec::new();
        while let Some(page) = stream.next().await {
            let page = page.map_err(map_err)?;
            out.extend(page.entities.into_iter().map(|mut v| {
                let etag = v
                    .get("odata.etag")
                    .and_then(Value::as_str)
                    .map(|e| Etag(e.to_string()));
                let (partition_key, row_key, entity) = strip(std::mem::take(&mut v));
                Row {
                    partition_key,
                    row_key,
                    entity,
                    etag,
                }
            }));
        }
        Ok(out)
    }

    async fn transaction(&self, pk: &str, ops: Vec<TableOp>) -> StorageResult<()> {
        let mut tx = self.client.partition_key_client(pk).transaction();
        for op in ops {
            tx = match op {
                TableOp::Insert { row_key, entity } => tx.insert(with_keys(pk, &row_key, &entity)),
                TableOp::Replace {
                    row_key,
                    entity,
                    if_match: m,
                } => {
                    let body = with_keys(pk, &row_key, &entity);
                    tx.update(row_key, body, Some(if_match(m.as_ref())))
                }
                TableOp::Merge {
                    row_key,
                    entity,
                    if_match: m,
                } => {
                    let body = with_keys(pk, &row_key, &entity);
                    tx.merge(row_key, body, Some(if_match(m.as_ref())))
                }
            }
            .map_err(map_err)?;
        }
        let resp = tx.await.map_err(map_err)?;
        // The batch answers 202 even when an operation failed: look inside.
        for r in &resp.operation_responses {
            let status = r.status_code as u16;
            if status >= 300 {
                return Err(match status {
                    404 => StorageError::NotFound,
                    409 => StorageError::Conflict,
                    412 => StorageError::PreconditionFailed,
                    _ => StorageError::Http {
                        status,
                        code: "BatchOperationFailed".into(),
                    },
                });
            }
        }
        Ok(())
    }

    async fn delete_table(&self) -> StorageResult<()> {
        match self.client.delete().await.map_err(map_err) {
            Ok(_) | Err(StorageError::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_redirect_is_an_error_not_followed() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let followed = Arc::new(AtomicUsize::new(0));
        let hits = followed.clone();
        let app = axum::Router::new()
            .route(
                "/devstoreaccount1/q/messages",
                axum::routing::get(|| async {
                    (
                        axum::http::StatusCode::TEMPORARY_REDIRECT,
                        [(axum::http::header::LOCATION, "/elsewhere")],
                    )
                }),
            )
            .route(
                "/elsewhere",
                axum::routing::get(move || {
                    hits.fetch_add(1, Ordering::SeqCst);
                    async { "" }
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let conn = crate::config::parse_connection_string(
            "AzureWebJobsStorage",
            &format!(
                "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;\
                 AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;\
                 QueueEndpoint=http://127.0.0.1:{port}/devstoreaccount1;\
                 TableEndpoint=http://127.0.0.1:{port}/devstoreaccount1;"
            ),
        )
        .unwrap();
        let storage = connect(&conn).unwrap();
        let got = storage.queue("q").receive(1, Duration::from_secs(30)).await;
        assert!(got.is_err(), "a 307 must not look like an answer: {got:?}");
        assert_eq!(followed.load(Ordering::SeqCst), 0, "redirect followed");
    }

    #[test]
    fn operations_are_named() {
        let u = |s: &str| url::Url::parse(s).unwrap();
        use azure_core::Method as M;
        assert_eq!(
            operation_name(
                &M::Get,
                &u("http://h:10001/acct/q/messages?numofmessages=32")
            ),
            "queue.receive"
        );
        assert_eq!(
            operation_name(&M::Get, &u("http://h:10001/acct/q/messages?peekonly=true")),
            "queue.peek"
        );
        assert_eq!(
            operation_name(&M::Post, &u("http://h:10001/acct/q/messages")),
            "queue.put"
        );
        assert_eq!(
            operation_name(
                &M::Delete,
                &u("http://h:10001/acct/q/messages/id?popreceipt=x")
            ),
            "queue.delete"
        );
        assert_eq!(
            operation_name(
                &M::Put,
                &u("http://h:10001/acct/q/messages/id?popreceipt=x")
            ),
            "queue.update"
        );
        assert_eq!(
            operation_name(&M::Post, &u("http://h:10002/acct/aqwkeys")),
            "table.insert"
        );
        assert_eq!(
            operation_name(
                &M::Put,
                &u("http://h:10002/acct/aqwkeys(PartitionKey='a',RowKey='b')")
            ),
            "table.update"
        );
        assert_eq!(
            operation_name(&M::Get, &u("http://h:10002/acct/aqwkeys()?$filter=x")),
            "table.query"
        );
        assert_eq!(
            operation_name(&M::Post, &u("http://h:10002/acct/$batch")),
            "table.batch"
        );
        assert_eq!(
            operation_name(&M::Get, &u("http://h:10001/acct/q?comp=metadata")),
            "queue.metadata"
        );
    }
}
