//! The maintained Azure SDK line (`azure_core` / `azure_identity` /
//! `azure_storage_queue` / `azure_storage_blob` 1.x) behind [`QueueStore`],
//! [`TableStore`] and [`BlobStore`].
//!
//! * Queues: the official `azure_storage_queue` 1.x `QueueClient`. It has
//!   every operation aqw calls (create, receive, peek, send with
//!   `messagettl=-1`, update visibility without rewriting the text, delete,
//!   properties for the approximate count, delete queue), and it costs no
//!   measurable CPU per message over the 0.21 stack, so there is no reason
//!   to call the Queue REST API ourselves. Measured (issue 12) on this 2-core
//!   machine, shared and loaded (load average 7-8, so absolute figures are
//!   about 2x BENCHMARKS.md's): `examples/bench_worker` on 2,000 keyed no-op
//!   jobs, default settings, one private Azurite restarted before each run,
//!   3 runs per stack alternating, medians; main (0.21) vs this stack:
//!   CPU 0.785 vs 0.75 ms/message (RUST_BACKTRACE unset), 0.92 vs 1.015 with
//!   `RUST_BACKTRACE=1`; storage requests 3.064 vs 3.064 per message; peak RSS
//!   12.1 vs 12.8 MiB. The residual cost under `RUST_BACKTRACE=1` is
//!   `azure_core`'s `ClientRequestIdPolicy`, which probes for its header with
//!   an erroring lookup (an `Error` captures a backtrace when that variable is
//!   set); our own code avoids that lookup (`pipeline::find_header`), and
//!   `aqw` turns library backtraces off unless asked
//!   ([`super::quiet_library_backtraces`]).
//! * Tables: our own client, [`super::tables`] (no 1.x Tables crate exists).
//! * Blobs (claim-check bodies): the official `azure_storage_blob` 1.x
//!   clients, [`super::blobs`].
//! * All three share one transport ([`super::pipeline::CountingTransport`]: pooled
//!   reqwest, timeouts, every request counted by operation and status), one
//!   retry configuration, and one authorization policy per connection:
//!   SharedKey (account key, also `UseDevelopmentStorage=true`), SAS, or an
//!   Entra ID bearer token ([`super::identity`]).

use super::blobs::BlobsClient;
use super::identity::{identity_credential, BearerPolicy};
use super::pipeline::{map_err, CountingTransport, SasPolicy, Service, SharedKeyPolicy};
use super::tables::TablesClient;
use super::*;
use super::{Connection, Credentials};
use azure_core::http::policies::Policy;
use azure_core::http::{
    ClientOptions, ExponentialRetryOptions, Pipeline, RetryOptions, Transport, Url,
};
use azure_storage_queue::models::{
    QueueClientGetPropertiesResultHeaders, QueueClientPeekMessagesOptions,
    QueueClientReceiveMessagesOptions, QueueClientSendMessageOptions,
};
use azure_storage_queue::{QueueClient, QueueClientOptions};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Queues, tables and blob containers of one account, sharing one pooled
/// transport.
#[derive(Clone)]
pub struct AzureStorage {
    queue_endpoint: String,
    queue_options: ClientOptions,
    tables: TablesClient,
    blobs: BlobsClient,
    counts: Arc<Mutex<BTreeMap<String, u64>>>,
}

impl AzureStorage {
    /// Storage requests made through this instance, by operation.
    pub fn request_counts(&self) -> BTreeMap<String, u64> {
        self.counts.lock().unwrap().clone()
    }
}

/// Pipeline options shared by queues, tables and blobs: our transport and a few
/// quick retries (longer outages are the worker's business: it backs off).
fn client_options(transport: &Transport, auth: Option<Arc<dyn Policy>>) -> ClientOptions {
    let mut o = ClientOptions {
        retry: RetryOptions::exponential(ExponentialRetryOptions {
            max_retries: 3,
            initial_delay: time::Duration::milliseconds(100),
            max_delay: time::Duration::seconds(2),
            max_total_elapsed: time::Duration::seconds(10),
        }),
        transport: Some(transport.clone()),
        ..Default::default()
    };
    if let Some(auth) = auth {
        o.per_try_policies.push(auth);
    }
    o
}

/// Build clients for a resolved connection. No network access happens here.
pub fn connect(connection: &Connection) -> Result<AzureStorage, StorageError> {
    let counts = Arc::new(Mutex::new(BTreeMap::new()));
    let transport = Transport::new(Arc::new(
        CountingTransport::new(counts.clone()).map_err(StorageError::Other)?,
    ));
    let setting = &connection.setting;
    let (queue_auth, table_auth): (Arc<dyn Policy>, Arc<dyn Policy>) = match &connection.credentials
    {
        Credentials::SharedKey { account, key } => {
            let q = SharedKeyPolicy::new(account, key, Service::Queue)
                .map_err(|e| StorageError::Other(format!("{setting}: {e}")))?;
            let t = SharedKeyPolicy::new(account, key, Service::Table)
                .map_err(|e| StorageError::Other(format!("{setting}: {e}")))?;
            (Arc::new(q), Arc::new(t))
        }
        Credentials::Sas { token } => {
            let p = Arc::new(SasPolicy::new(token).map_err(|_| {
                StorageError::Other(format!("{setting}: the SAS token could not be parsed"))
            })?);
            (p.clone(), p)
        }
        Credentials::Identity { client_id } => {
            let credential = identity_credential(setting, client_id.as_deref(), &transport)?;
            let p = Arc::new(BearerPolicy::new(credential));
            (p.clone(), p)
        }
    };
    let blob_auth = queue_auth.clone();
    let queue_options = client_options(&transport, Some(queue_auth));
    let pipeline = |auth| {
        Pipeline::new(
            Some("aqw"),
            Some(env!("CARGO_PKG_VERSION")),
            client_options(&transport, Some(auth)),
            Vec::new(),
            Vec::new(),
            None,
        )
    };
    let tables_pipeline = pipeline(table_auth);
    // Blob requests sign as queue requests do (the same SharedKey string).
    let blobs_options = client_options(&transport, Some(blob_auth));
    Url::parse(&connection.queue_endpoint)
        .map_err(|_| StorageError::Other(format!("{setting}: the queue endpoint is not a URL")))?;
    Ok(AzureStorage {
        queue_endpoint: connection.queue_endpoint.trim_end_matches('/').to_string(),
        queue_options,
        tables: TablesClient::new(&connection.table_endpoint, tables_pipeline),
        blobs: BlobsClient::new(&connection.blob_endpoint, blobs_options, setting),
        counts,
    })
}

impl Storage for AzureStorage {
    fn queue(&self, name: &str) -> Arc<dyn QueueStore> {
        let url = Url::parse(&format!("{}/{}", self.queue_endpoint, name));
        let client = url.map_err(|_| ()).and_then(|url| {
            // The credential is not handed to the crate: authorization is our
            // per-try policy (SharedKey / SAS / bearer), see `connect`.
            QueueClient::new(
                url,
                None,
                Some(QueueClientOptions {
                    client_options: self.queue_options.clone(),
                    ..Default::default()
                }),
            )
            .map_err(|_| ())
        });
        Arc::new(AzureQueue {
            name: name.to_string(),
            client: client.ok(),
        })
    }
    fn table(&self, name: &str) -> Arc<dyn TableStore> {
        Arc::new(self.tables.table(name))
    }
    fn blobs(&self, name: &str) -> Arc<dyn BlobStore> {
        Arc::new(self.blobs.container(name))
    }
}

struct AzureQueue {
    name: String,
    /// None when the queue name does not make a valid URL.
    client: Option<QueueClient>,
}

fn clamp_secs(d: Duration) -> i32 {
    // The service takes whole seconds; round sub-second delays up so a retry
    // delay of 0.5 s does not become "visible now".
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    secs.min(super::MAX_VISIBILITY_TIMEOUT.as_secs()) as i32
}

fn missing(what: &str) -> StorageError {
    StorageError::Other(format!("unexpected response from storage: no {what}"))
}

impl AzureQueue {
    fn client(&self) -> StorageResult<&QueueClient> {
        self.client
            .as_ref()
            .ok_or_else(|| StorageError::Other(format!("invalid queue name {:?}", self.name)))
    }
}

#[async_trait]
impl QueueStore for AzureQueue {
    fn name(&self) -> &str {
        &self.name
    }

    async fn create_if_missing(&self) -> StorageResult<()> {
        match self.client()?.create(None).await.map_err(map_err) {
            Ok(_) | Err(StorageError::Conflict) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn receive(&self, max: u8, visibility: Duration) -> StorageResult<Vec<ReceivedMessage>> {
        let resp = self
            .client()?
            .receive_messages(Some(QueueClientReceiveMessagesOptions {
                number_of_messages: Some(i32::from(max.clamp(1, 32))),
                visibility_timeout: Some(clamp_secs(visibility)),
                ..Default::default()
            }))
            .await
            .map_err(map_err)?
            .into_model()
            .map_err(map_err)?;
        resp.items
            .unwrap_or_default()
            .into_iter()
            .map(|m| {
                Ok(ReceivedMessage {
                    id: m.message_id.ok_or_else(|| missing("MessageId"))?,
                    pop_receipt: m.pop_receipt.ok_or_else(|| missing("PopReceipt"))?,
                    dequeue_count: m.dequeue_count.unwrap_or(0).clamp(0, u32::MAX as i64) as u32,
                    insertion_time: m.insertion_time.ok_or_else(|| missing("InsertionTime"))?,
                    expiration_time: m.expiration_time.ok_or_else(|| missing("ExpirationTime"))?,
                    next_visible: m
                        .time_next_visible
                        .ok_or_else(|| missing("TimeNextVisible"))?,
                    text: m.message_text.unwrap_or_default(),
                })
            })
            .collect()
    }

    async fn peek(&self, max: u8) -> StorageResult<Vec<PeekedMessage>> {
        let resp = self
            .client()?
            .peek_messages(Some(QueueClientPeekMessagesOptions {
                number_of_messages: Some(i32::from(max.clamp(1, 32))),
                ..Default::default()
            }))
            .await
            .map_err(map_err)?
            .into_model()
            .map_err(map_err)?;
        resp.items
            .unwrap_or_default()
            .into_iter()
            .map(|m| {
                Ok(PeekedMessage {
                    id: m.message_id.ok_or_else(|| missing("MessageId"))?,
                    dequeue_count: m.dequeue_count.unwrap_or(0).clamp(0, u32::MAX as i64) as u32,
                    insertion_time: m.insertion_time.ok_or_else(|| missing("InsertionTime"))?,
                    expiration_time: m.expiration_time.ok_or_else(|| missing("ExpirationTime"))?,
                    text: m.message_text.unwrap_or_default(),
                })
            })
            .collect()
    }

    async fn put(&self, text: &str, visibility: Duration, ttl: Ttl) -> StorageResult<PutReceipt> {
        let message = azure_storage_queue::models::QueueMessage {
            message_text: Some(text.to_string()),
        };
        let options = QueueClientSendMessageOptions {
            visibility_timeout: (!visibility.is_zero()).then(|| clamp_secs(visibility)),
            message_time_to_live: match ttl {
                Ttl::Default => None,
                Ttl::After(d) => Some(clamp_secs(d)),
                Ttl::Never => Some(-1),
            },
            ..Default::default()
        };
        let sent = self
            .client()?
            .send_message(message.try_into().map_err(map_err)?, Some(options))
            .await
            .map_err(map_err)?
            .into_model()
            .map_err(map_err)?
            .into_message()
            .map_err(map_err)?;
        Ok(PutReceipt {
            id: sent.message_id.ok_or_else(|| missing("MessageId"))?,
            pop_receipt: sent.pop_receipt.ok_or_else(|| missing("PopReceipt"))?,
            insertion_time: sent
                .insertion_time
                .ok_or_else(|| missing("InsertionTime"))?,
        })
    }

    async fn update_visibility(
        &self,
        id: &str,
        pop_receipt: &str,
        _text: &str,
        visibility: Duration,
    ) -> StorageResult<String> {
        // 1.x updates the visibility alone (no message body), so the text
        // is not rewritten.
        let resp = self
            .client()?
            .update_message(id, pop_receipt, clamp_secs(visibility), None)
            .await
            .map_err(map_err)?;
        super::pipeline::find_header(resp.headers(), "x-ms-popreceipt")
            .map(str::to_string)
            .ok_or_else(|| missing("x-ms-popreceipt"))
    }

    async fn delete(&self, id: &str, pop_receipt: &str) -> StorageResult<()> {
        self.client()?
            .delete_message(id, pop_receipt, None)
            .await
            .map_err(map_err)?;
        Ok(())
    }

    async fn approximate_count(&self) -> StorageResult<u64> {
        let resp = self.client()?.get_properties(None).await.map_err(map_err)?;
        let n = resp
            .approximate_messages_count()
            .map_err(map_err)?
            .unwrap_or(0);
        Ok(n.max(0) as u64)
    }

    async fn delete_queue(&self) -> StorageResult<()> {
        match self.client()?.delete(None).await.map_err(map_err) {
            Ok(_) | Err(StorageError::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::operation_name;
    use crate::{DEV_ACCOUNT, DEV_KEY};

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
        let endpoint = format!("http://127.0.0.1:{port}/{DEV_ACCOUNT}");
        let conn = Connection {
            setting: "AzureWebJobsStorage".into(),
            account: DEV_ACCOUNT.into(),
            queue_endpoint: endpoint.clone(),
            table_endpoint: endpoint.clone(),
            blob_endpoint: endpoint,
            credentials: Credentials::SharedKey {
                account: DEV_ACCOUNT.into(),
                key: Secret::new(DEV_KEY),
            },
        };
        let storage = connect(&conn).unwrap();
        let got = storage.queue("q").receive(1, Duration::from_secs(30)).await;
        assert!(got.is_err(), "a 307 must not look like an answer: {got:?}");
        assert_eq!(followed.load(Ordering::SeqCst), 0, "redirect followed");
    }

    #[test]
    fn operations_are_named() {
        let u = |s: &str| url::Url::parse(s).unwrap();
        use azure_core::http::Method as M;
        assert_eq!(
            operation_name(
                M::Get,
                &u("http://h:10001/acct/q/messages?numofmessages=32")
            ),
            "queue.receive"
        );
        assert_eq!(
            operation_name(M::Get, &u("http://h:10001/acct/q/messages?peekonly=true")),
            "queue.peek"
        );
        assert_eq!(
            operation_name(M::Post, &u("http://h:10001/acct/q/messages")),
            "queue.put"
        );
        assert_eq!(
            operation_name(
                M::Delete,
                &u("http://h:10001/acct/q/messages/id?popreceipt=x")
            ),
            "queue.delete"
        );
        assert_eq!(
            operation_name(M::Put, &u("http://h:10001/acct/q/messages/id?popreceipt=x")),
            "queue.update"
        );
        assert_eq!(
            operation_name(M::Post, &u("http://h:10002/acct/aqwkeys")),
            "table.insert"
        );
        assert_eq!(
            operation_name(
                M::Put,
                &u("http://h:10002/acct/aqwkeys(PartitionKey='a',RowKey='b')")
            ),
            "table.update"
        );
        assert_eq!(
            operation_name(M::Get, &u("http://h:10002/acct/aqwkeys()?$filter=x")),
            "table.query"
        );
        assert_eq!(
            operation_name(M::Post, &u("http://h:10002/acct/$batch")),
            "table.batch"
        );
        assert_eq!(
            operation_name(M::Get, &u("http://h:10001/acct/q?comp=metadata")),
            "queue.metadata"
        );
    }
}
