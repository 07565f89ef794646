//! Claim-check bodies (`aqw_core::claim`) on the official
//! `azure_storage_blob` 1.x clients, with the same transport, retry and
//! authorization as queues (SharedKey signs a blob request exactly as a
//! queue request: the same string to sign, `shared_key::Service::Queue`;
//! SAS and bearer tokens as for queues): no credential is handed to the
//! crate, authorization is our per-try policy (see `azure::connect`).
//!
//! What aqw calls: Create and Delete Container, Upload (one Put Blob: the
//! partition size is the body's length, so the crate never stages blocks),
//! Download (one ranged Get Blob, bounded: below), Set Blob Metadata (which
//! changes the blob's `Last-Modified` and ETag without its bytes: `touch`),
//! Delete Blob with `If-Match`, and List Blobs by prefix (the crate's pager
//! follows `NextMarker`). Errors map onto [`StorageError`] as queues' do
//! (`pipeline::map_err`); a 404 of get, delete, list or delete container is
//! "nothing there".
//!
//! Every blob request passes [`BlobRequests`], which marks it for the
//! counting transport (named `blob.put`, `blob.get`, `blob.update`,
//! `blob.delete`, `blob.list`, `blob.admin` whatever host and port the
//! account is on: the crate sends the queue crate's `x-ms-version`, so the
//! version no longer tells them apart) and carries a read's bound to the
//! transport, which reads no more of a response body than that.

use super::pipeline::{find_header, map_err, BLOB_REQUEST_HEADER};
use super::transport::BODY_LIMIT_HEADER;
use super::*;
use azure_core::http::headers::Headers;
use azure_core::http::policies::{Policy, PolicyResult};
use azure_core::http::{ClientMethodOptions, ClientOptions, Context, Request, RequestContent, Url};
use azure_storage_blob::models::{
    BlobClientDeleteOptions, BlobClientDownloadOptions, BlobClientUploadOptions,
    BlobContainerClientListBlobsOptions,
};
use azure_storage_blob::{
    BlobClient, BlobClientOptions, BlobContainerClient, BlobContainerClientOptions,
};
use futures::TryStreamExt;
use std::num::NonZero;

/// The bound of one read, as the context of a download: [`BlobRequests`]
/// hands it to the transport on each of the download's requests.
#[derive(Debug, Clone, Copy)]
struct ReadBound(u64);

/// The per-call policy of every blob client: marks the request as a blob
/// request for the counting transport, and asks the transport for a
/// bounded read when the call's context carries a [`ReadBound`].
#[derive(Debug)]
pub(crate) struct BlobRequests;

#[async_trait]
impl Policy for BlobRequests {
    async fn send(
        &self,
        ctx: &Context,
        request: &mut Request,
        next: &[Arc<dyn Policy>],
    ) -> PolicyResult {
        request.insert_header(BLOB_REQUEST_HEADER, "1");
        if let Some(ReadBound(limit)) = ctx.value::<ReadBound>() {
            request.insert_header(BODY_LIMIT_HEADER, limit.to_string());
        }
        next[0].send(ctx, request, &next[1..]).await
    }
}

/// The Blob service endpoint of one account.
#[derive(Clone)]
pub struct BlobsClient {
    /// `None` for an identity-based connection whose blob endpoint is
    /// neither set nor derivable: every request then fails naming the
    /// setting to give.
    endpoint: Option<Url>,
    options: ClientOptions,
    /// The connection setting, named when there is no endpoint.
    setting: Arc<str>,
}

impl BlobsClient {
    /// `options`: the account's transport, retries and authorization
    /// policy; [`BlobRequests`] is added here.
    pub fn new(endpoint: &str, mut options: ClientOptions, setting: &str) -> Self {
        options.per_call_policies.push(Arc::new(BlobRequests));
        Self {
            endpoint: Url::parse(endpoint).ok().filter(|u| !u.cannot_be_a_base()),
            options,
            setting: setting.into(),
        }
    }

    pub fn container(&self, name: &str) -> AzureBlobs {
        AzureBlobs {
            name: name.to_string(),
            url: self.container_url(name),
            options: self.options.clone(),
        }
    }

    fn container_url(&self, name: &str) -> Result<Url, String> {
        let Some(mut url) = self.endpoint.clone() else {
            return Err(format!(
                "{0}: no blob endpoint for claim-check payloads: set {0}__blobServiceUri \
                 (or BlobEndpoint in the connection string)",
                self.setting
            ));
        };
        url.path_segments_mut()
            .map_err(|_| "invalid blob endpoint".to_string())?
            .pop_if_empty()
            .push(name);
        Ok(url)
    }
}

/// One container.
pub struct AzureBlobs {
    name: String,
    /// The container's URL, or why there is none.
    url: Result<Url, String>,
    options: ClientOptions,
}

impl AzureBlobs {
    fn url(&self) -> StorageResult<&Url> {
        self.url
            .as_ref()
            .map_err(|e| StorageError::Other(e.clone()))
    }

    fn container_client(&self) -> StorageResult<BlobContainerClient> {
        let options = BlobContainerClientOptions {
            client_options: self.options.clone(),
            ..Default::default()
        };
        BlobContainerClient::new(self.url()?.clone(), None, Some(options)).map_err(map_err)
    }

    /// The blob `name`'s client. Its URL keeps the name's `/` as path
    /// separators, as Azure and Azurite show and sign blob paths
    /// (`BlobContainerClient::blob_client` would send them as `%2F`).
    fn blob_client(&self, name: &str) -> StorageResult<BlobClient> {
        let mut url = self.url()?.clone();
        url.path_segments_mut()
            .map_err(|_| StorageError::Other("invalid blob endpoint".into()))?
            .extend(name.split('/'));
        let options = BlobClientOptions {
            client_options: self.options.clone(),
            ..Default::default()
        };
        BlobClient::new(url, None, Some(options)).map_err(map_err)
    }
}

fn etag_of(headers: &Headers) -> StorageResult<Etag> {
    find_header(headers, "etag")
        .map(|e| Etag(e.to_string()))
        .ok_or_else(|| StorageError::Other("unexpected response from storage: no ETag".into()))
}

fn gone_is_ok<T>(r: StorageResult<T>) -> StorageResult<()> {
    match r {
        Ok(_) | Err(StorageError::NotFound) => Ok(()),
        Err(e) => Err(e),
    }
}

/// The blob's whole size from a ranged answer's `Content-Range`
/// (`bytes 0-9/42`), else the answer's `Content-Length` (a whole answer).
fn declared_size(headers: &Headers) -> Option<u64> {
    let total = find_header(headers, "content-range")
        .and_then(|r| r.rsplit_once('/'))
        .and_then(|(_, total)| total.trim().parse::<u64>().ok());
    total.or_else(|| find_header(headers, "content-length").and_then(|l| l.parse().ok()))
}

/// The options of a read of at most `max_bytes`: one request for the
/// first `max_bytes + 1` bytes (one more than the bound tells a larger
/// blob), the transport reading no more of the answer than the bound.
/// The partition size is the whole range, capped at the largest bound the
/// engine reads with (`aqw_core::claim::MAX_BYTES_CAP`), so the crate
/// never splits a read of a claim-check body, and never allocates a
/// partition past that cap for an answer that covers less than it asked.
///
/// At least 2 bytes are asked for: Azurite (3.35, `BlobHandler`'s
/// download) answers `bytes=0-0` of an empty blob 206 with
/// `Content-Range: bytes 0--1/0`, which the crate cannot parse; any longer
/// range of an empty blob is a 416, on which the crate reads it unranged
/// (as Azure answers every range of an empty blob).
fn bounded_download(max_bytes: u64) -> BlobClientDownloadOptions<'static> {
    let want = max_bytes.saturating_add(1).max(2);
    let cap = aqw_core::claim::MAX_BYTES_CAP + 1;
    let partition = usize::try_from(want.min(cap)).unwrap_or(usize::MAX);
    BlobClientDownloadOptions {
        range: Some((0..want).into()),
        partition_size: NonZero::new(partition),
        parallel: NonZero::new(1),
        method_options: ClientMethodOptions {
            context: Context::new().with_value(ReadBound(max_bytes)),
        },
        ..Default::default()
    }
}

/// A listed blob as the port's, its ETag spelled as headers spell it.
fn listed(item: azure_storage_blob::models::BlobItem) -> StorageResult<BlobItem> {
    let bad = |what: &str| StorageError::Other(format!("unexpected blob listing: no {what}"));
    let name = item.name.ok_or_else(|| bad("Name"))?;
    let properties = item.properties.ok_or_else(|| bad("Properties"))?;
    let etag = properties.etag.ok_or_else(|| bad("Etag"))?.to_string();
    Ok(BlobItem {
        name,
        length: properties
            .content_length
            .ok_or_else(|| bad("Content-Length"))?,
        last_modified: properties
            .last_modified
            .ok_or_else(|| bad("Last-Modified"))?,
        etag: Etag(quoted(etag)),
    })
}

/// The listing leaves an ETag's quotes off (Azurite, and Azure's examples);
/// headers carry them: one spelling, so ETags compare and If-Match works.
fn quoted(etag: String) -> String {
    if etag.starts_with('"') || etag.starts_with("W/") {
        etag
    } else {
        format!("\"{etag}\"")
    }
}

#[async_trait]
impl BlobStore for AzureBlobs {
    fn name(&self) -> &str {
        &self.name
    }

    async fn create_if_missing(&self) -> StorageResult<()> {
        match self.container_client()?.create(None).await.map_err(map_err) {
            Ok(_) | Err(StorageError::Conflict) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn put(&self, name: &str, bytes: &[u8]) -> StorageResult<Etag> {
        let options = BlobClientUploadOptions {
            // One Put Blob whatever the size (no staged blocks).
            partition_size: NonZero::new((bytes.len() as u64).max(1)),
            ..Default::default()
        };
        let done = self
            .blob_client(name)?
            .upload(RequestContent::from(bytes.to_vec()), Some(options))
            .await
            .map_err(map_err)?;
        etag_of(done.raw_response.headers())
    }

    async fn get(&self, name: &str, max_bytes: u64) -> StorageResult<Option<BlobRead>> {
        let client = self.blob_client(name)?;
        let read = match client.download(Some(bounded_download(max_bytes))).await {
            Ok(read) => read,
            Err(e) => return gone_is_none(map_err(e)),
        };
        let declared = declared_size(&read.headers);
        if declared.is_some_and(|n| n > max_bytes) {
            // Not read on: the rest of the download is never asked for.
            return Ok(Some(BlobRead::TooLarge(declared)));
        }
        let body = read.body.collect().await.map_err(map_err)?;
        if body.len() as u64 > max_bytes {
            return Ok(Some(BlobRead::TooLarge(declared)));
        }
        Ok(Some(BlobRead::Whole(body.to_vec())))
    }

    async fn touch(&self, name: &str) -> StorageResult<Etag> {
        // The write time, as metadata: a Set Blob Metadata needs no body.
        let now = time::OffsetDateTime::now_utc().unix_timestamp().to_string();
        let metadata = std::collections::HashMap::from([("aqwtouched".to_string(), now)]);
        let done = self
            .blob_client(name)?
            .set_metadata(&metadata, None)
            .await
            .map_err(map_err)?;
        etag_of(done.headers())
    }

    async fn delete(&self, name: &str, if_match: Option<&Etag>) -> StorageResult<()> {
        let options = BlobClientDeleteOptions {
            if_match: if_match.map(|e| azure_core::http::Etag::from(e.0.as_str())),
            ..Default::default()
        };
        let client = self.blob_client(name)?;
        gone_is_ok(client.delete(Some(options)).await.map_err(map_err))
    }

    async fn list(&self, prefix: &str) -> StorageResult<Vec<BlobItem>> {
        let options = BlobContainerClientListBlobsOptions {
            prefix: (!prefix.is_empty()).then(|| prefix.to_string()),
            ..Default::default()
        };
        let mut pages = self
            .container_client()?
            .list_blobs(Some(options))
            .map_err(map_err)?
            .into_pages();
        let mut out = Vec::new();
        loop {
            let page = match pages.try_next().await.map_err(map_err) {
                Ok(Some(page)) => page,
                Ok(None) | Err(StorageError::NotFound) => return Ok(out),
                Err(e) => return Err(e),
            };
            let page = page.into_model().map_err(map_err)?;
            for item in page.blob_items {
                out.push(listed(item)?);
            }
        }
    }

    async fn delete_container(&self) -> StorageResult<()> {
        gone_is_ok(self.container_client()?.delete(None).await.map_err(map_err))
    }
}

fn gone_is_none(e: StorageError) -> StorageResult<Option<BlobRead>> {
    match e {
        StorageError::NotFound => Ok(None),
        e => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> Headers {
        let mut h = Headers::new();
        for (k, v) in pairs {
            h.insert(*k, v.to_string());
        }
        h
    }

    #[test]
    fn a_reads_size_is_the_content_range_total_else_its_length() {
        let ranged = headers(&[("content-range", "bytes 0-9/42"), ("content-length", "10")]);
        assert_eq!(declared_size(&ranged), Some(42));
        let whole = headers(&[("content-length", "7")]);
        assert_eq!(declared_size(&whole), Some(7));
        let unknown = headers(&[("content-range", "bytes 0-9/*")]);
        assert_eq!(declared_size(&unknown), None);
    }

    #[test]
    fn a_bounded_read_asks_one_byte_past_the_bound_in_one_request() {
        let o = bounded_download(10);
        assert_eq!(
            o.range.map(|r| r.to_string()).as_deref(),
            Some("bytes=0-10")
        );
        assert_eq!(o.partition_size.map(NonZero::get), Some(11));
        assert_eq!(o.parallel.map(NonZero::get), Some(1));
        let bound = o.method_options.context.value::<ReadBound>().map(|b| b.0);
        assert_eq!(bound, Some(10));
        // A bound with no practical limit asks for all, in partitions no
        // larger than the engine's largest bound.
        let o = bounded_download(0);
        assert_eq!(o.range.map(|r| r.to_string()).as_deref(), Some("bytes=0-1"));
        let o = bounded_download(u64::MAX);
        let cap = aqw_core::claim::MAX_BYTES_CAP as usize + 1;
        assert_eq!(o.partition_size.map(NonZero::get), Some(cap));
    }

    #[test]
    fn listed_etags_are_spelled_as_headers_spell_them() {
        assert_eq!(quoted("0x8D2".into()), "\"0x8D2\"");
        assert_eq!(quoted("\"0x8D1\"".into()), "\"0x8D1\"");
        assert_eq!(quoted("W/\"x\"".into()), "W/\"x\"");
    }

    /// What the mock service below saw of one request.
    type Seen = Arc<std::sync::Mutex<Vec<(String, axum::http::HeaderMap)>>>;

    /// A Blob service that answers by path: `big` a 1 MiB body whatever
    /// the range (with its length), `chunked` the same without a length,
    /// `busy` 503 ServerBusy, `stale` 412, `denied` 403, anything else 404.
    async fn mock_service() -> (crate::AzureStorage, Seen) {
        use axum::http::StatusCode;
        use axum::response::IntoResponse;
        let seen: Seen = Arc::default();
        let log = seen.clone();
        let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
            let log = log.clone();
            async move {
                let path = req.uri().path().to_string();
                log.lock()
                    .unwrap()
                    .push((path.clone(), req.headers().clone()));
                let code = |s: StatusCode, c: &'static str| {
                    (s, [("x-ms-error-code", c), ("retry-after", "0")]).into_response()
                };
                match path.rsplit('/').next().unwrap_or_default() {
                    "big" => vec![7u8; 1 << 20].into_response(),
                    "chunked" => {
                        let chunks = (0..16).map(|_| Ok::<_, std::io::Error>(vec![7u8; 1 << 16]));
                        axum::body::Body::from_stream(futures::stream::iter(chunks)).into_response()
                    }
                    "busy" => code(StatusCode::SERVICE_UNAVAILABLE, "ServerBusy"),
                    "stale" => code(StatusCode::PRECONDITION_FAILED, "ConditionNotMet"),
                    "denied" => code(StatusCode::FORBIDDEN, "AuthenticationFailed"),
                    _ => code(StatusCode::NOT_FOUND, "BlobNotFound"),
                }
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let endpoint = format!("http://127.0.0.1:{port}/{}", crate::DEV_ACCOUNT);
        let conn = crate::Connection {
            setting: "AzureWebJobsStorage".into(),
            account: crate::DEV_ACCOUNT.into(),
            queue_endpoint: endpoint.clone(),
            table_endpoint: endpoint.clone(),
            blob_endpoint: endpoint,
            credentials: crate::Credentials::SharedKey {
                account: crate::DEV_ACCOUNT.into(),
                key: crate::Secret::new(crate::DEV_KEY),
            },
        };
        (crate::connect(&conn).unwrap(), seen)
    }

    /// A blob is input: a service that answers a ranged read with more
    /// than the bound (declared or not) gets a refusal, not the bytes, in
    /// one request named `blob.get`; the internal headers never reach the
    /// wire, the range and the SharedKey signature do.
    #[tokio::test]
    async fn a_read_over_its_bound_is_refused_in_one_request() {
        let (storage, seen) = mock_service().await;
        let c = storage.blobs("c");
        let got = c.get("q/big", 10).await.unwrap();
        assert_eq!(got, Some(BlobRead::TooLarge(Some(1 << 20))));
        let got = c.get("q/chunked", 10).await.unwrap();
        assert_eq!(got, Some(BlobRead::TooLarge(None)));
        assert_eq!(c.get("q/gone", 10).await.unwrap(), None);
        assert_eq!(storage.request_counts().get("blob.get"), Some(&3));
        let seen = seen.lock().unwrap();
        assert_eq!(seen[0].0, format!("/{}/c/q/big", crate::DEV_ACCOUNT));
        for (_, headers) in seen.iter() {
            assert_eq!(headers["range"], "bytes=0-10");
            assert!(headers["authorization"]
                .to_str()
                .unwrap()
                .starts_with("SharedKey "));
            assert!(headers.keys().all(|k| !k.as_str().starts_with("x-aqw-")));
        }
    }

    /// The service's answers as the port's errors: 404 not found (or
    /// "already gone" for a delete), 412 a failed precondition, 403 and a
    /// 503 ServerBusy (after the pipeline's retries) as HTTP errors with
    /// their codes.
    #[tokio::test]
    async fn answers_map_onto_the_ports_errors() {
        let (storage, _) = mock_service().await;
        let c = storage.blobs("c");
        assert!(matches!(
            c.put("q/x", b"x").await,
            Err(StorageError::NotFound)
        ));
        assert!(matches!(c.touch("q/x").await, Err(StorageError::NotFound)));
        c.delete("q/x", None).await.unwrap();
        assert!(c.list("q/").await.unwrap().is_empty());
        let stale = Etag("\"0x1\"".into());
        let got = c.delete("q/stale", Some(&stale)).await;
        assert!(
            matches!(got, Err(StorageError::PreconditionFailed)),
            "{got:?}"
        );
        let got = c.touch("q/denied").await;
        assert!(
            matches!(&got, Err(StorageError::Http { status: 403, code }) if code == "AuthenticationFailed"),
            "{got:?}"
        );
        let got = c.get("q/busy", 10).await;
        assert!(
            matches!(&got, Err(StorageError::Http { status: 503, code }) if code == "ServerBusy"),
            "{got:?}"
        );
        let counts = storage.request_counts();
        assert_eq!(counts.get("blob.get"), Some(&4), "retried: {counts:?}");
    }

    /// The request headers the policy after [`BlobRequests`] saw.
    #[derive(Debug, Default)]
    struct Capture(std::sync::Mutex<Vec<(String, String)>>);

    #[async_trait]
    impl Policy for Capture {
        async fn send(
            &self,
            _: &Context,
            request: &mut Request,
            _: &[Arc<dyn Policy>],
        ) -> PolicyResult {
            let headers = request.headers().iter();
            *self.0.lock().unwrap() = headers
                .map(|(k, v)| (k.as_str().to_string(), v.as_str().to_string()))
                .collect();
            let ok = azure_core::http::StatusCode::Ok;
            Ok(azure_core::http::AsyncRawResponse::from_bytes(
                ok,
                Headers::new(),
                Vec::new(),
            ))
        }
    }

    /// A bounded download's context becomes the transport's body limit on
    /// its request; every blob request is marked, and only a read bounded.
    #[tokio::test]
    async fn a_bounded_reads_context_reaches_the_transport_as_its_limit() {
        let capture = Arc::new(Capture::default());
        let next: Vec<Arc<dyn Policy>> = vec![capture.clone()];
        let url = Url::parse("http://h/a/c/q/x").unwrap();
        let header = |name: &str| {
            let seen = capture.0.lock().unwrap();
            seen.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        };
        let read = bounded_download(10).method_options.context;
        let mut request = Request::new(url.clone(), azure_core::http::Method::Get);
        BlobRequests.send(&read, &mut request, &next).await.unwrap();
        assert_eq!(header(BODY_LIMIT_HEADER).as_deref(), Some("10"));
        assert_eq!(header(BLOB_REQUEST_HEADER).as_deref(), Some("1"));
        let mut request = Request::new(url, azure_core::http::Method::Put);
        BlobRequests
            .send(&Context::new(), &mut request, &next)
            .await
            .unwrap();
        assert_eq!(header(BODY_LIMIT_HEADER), None);
        assert_eq!(header(BLOB_REQUEST_HEADER).as_deref(), Some("1"));
    }
}
