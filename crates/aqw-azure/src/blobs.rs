//! A small Blob client on the `azure_core` 1.x pipeline, for claim-check
//! bodies (`aqw_core::claim`): the same transport, retry and authorization
//! as queues and tables (SharedKey signs a blob request exactly as a queue
//! request: the same string to sign, `shared_key::Service::Queue`), and no
//! Azure SDK blob crate.
//!
//! It speaks the Blob service REST API for exactly what aqw calls: Create
//! and Delete Container (`restype=container`), Put Blob (one request, a
//! `BlockBlob`), Get Blob, Set Blob Metadata (`comp=metadata`, which
//! changes the blob's `Last-Modified` and ETag without its bytes: `touch`),
//! Delete Blob with `If-Match`, and List Blobs (`comp=list`, by prefix,
//! following `NextMarker`). Errors map onto [`StorageError`] as tables'
//! do; a 404 of get, delete, list or delete container is "nothing there".
//!
//! Requests carry `x-ms-version` [`BLOB_VERSION`], which the counting
//! transport also reads to name them (`blob.put`, `blob.get`,
//! `blob.update`, `blob.delete`, `blob.list`, `blob.admin`), whatever host
//! and port the account is on: the version and that naming live in
//! [`super::pipeline`], which this client imports and which imports
//! nothing of it.

use super::pipeline::{find_header, BLOB_VERSION};
use super::transport::BODY_LIMIT_HEADER;
use super::*;
use azure_core::http::{Method, Pipeline, RawResponse, Request};

/// The Blob service endpoint of one account.
#[derive(Clone)]
pub struct BlobsClient {
    endpoint: String,
    pipeline: Pipeline,
    /// The connection setting, named when there is no endpoint.
    setting: Arc<str>,
}

impl BlobsClient {
    /// `endpoint` may be empty (an identity-based connection whose blob
    /// endpoint is neither set nor derivable): every request then fails
    /// naming the setting to give.
    pub fn new(endpoint: &str, pipeline: Pipeline, setting: &str) -> Self {
        Self {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            pipeline,
            setting: setting.into(),
        }
    }

    pub fn container(&self, name: &str) -> AzureBlobs {
        AzureBlobs {
            name: name.to_string(),
            client: self.clone(),
        }
    }

    fn request(&self, method: Method, path_and_query: &str) -> StorageResult<Request> {
        if self.endpoint.is_empty() {
            return Err(StorageError::Other(format!(
                "{0}: no blob endpoint for claim-check payloads: set {0}__blobServiceUri \
                 (or BlobEndpoint in the connection string)",
                self.setting
            )));
        }
        let url = url::Url::parse(&format!("{}/{}", self.endpoint, path_and_query))
            .map_err(|_| StorageError::Other("invalid blob URL".into()))?;
        let mut r = Request::new(url, method);
        r.insert_header("x-ms-version", BLOB_VERSION);
        r.insert_header(
            "x-ms-client-request-id",
            super::pipeline::client_request_id(),
        );
        Ok(r)
    }

    async fn send(&self, mut request: Request) -> StorageResult<RawResponse> {
        super::pipeline::send_checked(&self.pipeline, &mut request).await
    }
}

fn etag_of(rsp: &RawResponse) -> StorageResult<Etag> {
    find_header(rsp.headers(), "etag")
        .map(|e| Etag(e.to_string()))
        .ok_or_else(|| StorageError::Other("unexpected response from storage: no ETag".into()))
}

/// Percent-encode a blob name's segments (keeping `/`).
fn blob_path(container: &str, name: &str) -> String {
    let mut out = String::with_capacity(container.len() + name.len() + 1);
    out.push_str(container);
    for seg in name.split('/') {
        out.push('/');
        for b in seg.bytes() {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
                out.push(b as char);
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        }
    }
    out
}

/// One container.
pub struct AzureBlobs {
    name: String,
    client: BlobsClient,
}

/// A Get Blob answer read with a bound: too large when its Content-Length
/// or the bytes that came are over it.
fn bounded(rsp: &RawResponse, max_bytes: u64) -> BlobRead {
    let declared = find_header(rsp.headers(), "content-length").and_then(|l| l.parse::<u64>().ok());
    let body = rsp.body();
    match declared {
        Some(n) if n > max_bytes => BlobRead::TooLarge(Some(n)),
        _ if body.len() as u64 > max_bytes => BlobRead::TooLarge(declared),
        _ => BlobRead::Whole(body.to_vec()),
    }
}

fn gone_is_ok(r: StorageResult<RawResponse>) -> StorageResult<()> {
    match r {
        Ok(_) | Err(StorageError::NotFound) => Ok(()),
        Err(e) => Err(e),
    }
}

#[async_trait]
impl BlobStore for AzureBlobs {
    fn name(&self) -> &str {
        &self.name
    }

    async fn create_if_missing(&self) -> StorageResult<()> {
        let path = format!("{}?restype=container", self.name);
        let r = self.client.request(Method::Put, &path)?;
        match self.client.send(r).await {
            Ok(_) | Err(StorageError::Conflict) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn put(&self, name: &str, bytes: &[u8]) -> StorageResult<Etag> {
        let mut r = self
            .client
            .request(Method::Put, &blob_path(&self.name, name))?;
        r.insert_header("x-ms-blob-type", "BlockBlob");
        r.insert_header("content-type", "application/octet-stream");
        r.set_body(bytes.to_vec());
        etag_of(&self.client.send(r).await?)
    }

    async fn get(&self, name: &str, max_bytes: u64) -> StorageResult<Option<BlobRead>> {
        let mut r = self
            .client
            .request(Method::Get, &blob_path(&self.name, name))?;
        // The transport reads no more than the bound (and nothing of a body
        // whose Content-Length is over it): a blob's size is input.
        r.insert_header(BODY_LIMIT_HEADER, max_bytes.to_string());
        match self.client.send(r).await {
            Ok(rsp) => Ok(Some(bounded(&rsp, max_bytes))),
            Err(StorageError::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn touch(&self, name: &str) -> StorageResult<Etag> {
        let path = format!("{}?comp=metadata", blob_path(&self.name, name));
        let mut r = self.client.request(Method::Put, &path)?;
        // The write time, as metadata: a Set Blob Metadata needs no body.
        r.insert_header(
            "x-ms-meta-aqwtouched",
            time::OffsetDateTime::now_utc().unix_timestamp().to_string(),
        );
        etag_of(&self.client.send(r).await?)
    }

    async fn delete(&self, name: &str, if_match: Option<&Etag>) -> StorageResult<()> {
        let mut r = self
            .client
            .request(Method::Delete, &blob_path(&self.name, name))?;
        if let Some(e) = if_match {
            r.insert_header("if-match", e.0.clone());
        }
        gone_is_ok(self.client.send(r).await)
    }

    async fn list(&self, prefix: &str) -> StorageResult<Vec<BlobItem>> {
        let mut out = Vec::new();
        let mut marker = String::new();
        loop {
            let mut path = format!("{}?restype=container&comp=list", self.name);
            if !prefix.is_empty() {
                path.push_str(&format!("&prefix={}", pct(prefix)));
            }
            if !marker.is_empty() {
                path.push_str(&format!("&marker={}", pct(&marker)));
            }
            let r = self.client.request(Method::Get, &path)?;
            let rsp = match self.client.send(r).await {
                Ok(rsp) => rsp,
                Err(StorageError::NotFound) => return Ok(out),
                Err(e) => return Err(e),
            };
            let xml = String::from_utf8_lossy(rsp.body());
            out.extend(parse_listing(&xml)?);
            marker = element(&xml, "NextMarker").unwrap_or_default();
            if marker.is_empty() {
                return Ok(out);
            }
        }
    }

    async fn delete_container(&self) -> StorageResult<()> {
        let path = format!("{}?restype=container", self.name);
        let r = self.client.request(Method::Delete, &path)?;
        gone_is_ok(self.client.send(r).await)
    }
}

/// Percent-encode a query value.
fn pct(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The text of the first `<tag>…</tag>` in `xml`, unescaped.
fn element(xml: &str, tag: &str) -> Option<String> {
    let open = format!("<{tag}>");
    let start = xml.find(&open)? + open.len();
    let end = start + xml[start..].find(&format!("</{tag}>"))?;
    Some(unescape(&xml[start..end]))
}

fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

/// An RFC 1123 date (`Sun, 06 Dec 2026 21:00:00 GMT`).
fn http_date(text: &str) -> Option<time::OffsetDateTime> {
    let f = time::macros::format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    );
    time::PrimitiveDateTime::parse(text.trim(), &f)
        .ok()
        .map(|t| t.assume_utc())
}

/// The blobs of one List Blobs answer (`EnumerationResults/Blobs/Blob`).
fn parse_listing(xml: &str) -> StorageResult<Vec<BlobItem>> {
    let bad = |what: &str| StorageError::Other(format!("unexpected blob listing: no {what}"));
    let mut out = Vec::new();
    for part in xml.split("<Blob>").skip(1) {
        let part = part.split("</Blob>").next().unwrap_or_default();
        let name = element(part, "Name").ok_or_else(|| bad("Name"))?;
        let length = element(part, "Content-Length")
            .and_then(|l| l.parse().ok())
            .ok_or_else(|| bad("Content-Length"))?;
        let modified = element(part, "Last-Modified").ok_or_else(|| bad("Last-Modified"))?;
        let last_modified = http_date(&modified).ok_or_else(|| bad("readable Last-Modified"))?;
        let etag = element(part, "Etag").ok_or_else(|| bad("Etag"))?;
        // The listing leaves the quotes off (Azurite, and Azure's examples);
        // headers carry them: one spelling, so ETags compare and If-Match works.
        let etag = if etag.starts_with('"') || etag.starts_with("W/") {
            etag
        } else {
            format!("\"{etag}\"")
        };
        out.push(BlobItem {
            name,
            length,
            last_modified,
            etag: Etag(etag),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_is_read() {
        let xml = r#"<?xml version="1.0" encoding="utf-8"?><EnumerationResults ServiceEndpoint="x" ContainerName="c"><Prefix>q/</Prefix><Blobs><Blob><Name>q/a&amp;b</Name><Properties><Last-Modified>Sun, 06 Dec 2026 21:00:00 GMT</Last-Modified><Etag>"0x8D1"</Etag><Content-Length>12</Content-Length></Properties></Blob><Blob><Name>q/c</Name><Properties><Last-Modified>Sun, 06 Dec 2026 21:00:01 GMT</Last-Modified><Etag>0x8D2</Etag><Content-Length>0</Content-Length></Properties></Blob></Blobs><NextMarker /></EnumerationResults>"#;
        let items = parse_listing(xml).unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(items[0].name, "q/a&b");
        assert_eq!(items[0].length, 12);
        assert_eq!(items[0].etag, Etag("\"0x8D1\"".into()));
        assert_eq!(items[1].last_modified.second(), 1);
        assert_eq!(items[1].etag, Etag("\"0x8D2\"".into()));
        assert_eq!(element(xml, "NextMarker"), None);
    }
}
