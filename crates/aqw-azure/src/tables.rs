//! A small typed Azure Tables client on the `azure_core` 1.x pipeline.
//!
//! There is no Tables crate on the 1.x line (azure-sdk-for-rust issue 4304),
//! so this file speaks the Table service REST API for exactly what aqw
//! calls: create/delete table; get, insert, replace (PUT) and merge (PATCH)
//! with `If-Match`; delete; a query with `$filter` following continuation
//! headers, with a server-side `$filter` and `$select`; and the entity-group
//! transaction (`$batch`: insert, merge, and delete with `If-Match`). Retry, timeout and
//! authorization are the pipeline's (see [`super::pipeline`]); errors map onto
//! [`StorageError`] exactly as the 0.21 client's did.
//!
//! Wire details follow the Table service REST reference and the 0.21
//! `azure_data_tables` crate that aqw used against Azure and Azurite
//! (`sdk/data_tables/src/operations/*.rs`, `transaction.rs`): `fullmetadata`
//! JSON (so `odata.etag` comes with every queried entity), `Prefer:
//! return-no-content` on insert (the ETag comes in the header), and the
//! multipart/mixed batch body with one changeset. Merge is `PATCH` outside a
//! batch (the `MERGE` verb is not in `azure_core` 1.x's `Method`; the service
//! and Azurite take `PATCH` as merge, as the current SDKs send it) and the
//! literal `MERGE` inside a batch body (plain text there).

use super::pipeline::find_header;
use super::*;
use azure_core::http::{Method, Pipeline, RawResponse, Request};

/// Table service version aqw speaks (JSON entities, `Prefer`).
const TABLE_VERSION: &str = "2019-02-02";
const FULL_METADATA: &str = "application/json;odata=fullmetadata";

/// The Table service endpoint of one account (`https://acct.table.core.windows.net`
/// or Azurite's `http://127.0.0.1:10002/devstoreaccount1`).
#[derive(Clone)]
pub struct TablesClient {
    endpoint: String,
    pipeline: Pipeline,
}

impl TablesClient {
    pub fn new(endpoint: &str, pipeline: Pipeline) -> Self {
        Self {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            pipeline,
        }
    }

    pub fn table(&self, name: &str) -> AzureTable {
        AzureTable {
            name: name.to_string(),
            client: self.clone(),
        }
    }

    fn url(&self, path_and_query: &str) -> StorageResult<url::Url> {
        url::Url::parse(&format!("{}/{}", self.endpoint, path_and_query))
            .map_err(|_| StorageError::Other("invalid table URL".into()))
    }

    fn request(&self, method: Method, path_and_query: &str) -> StorageResult<Request> {
        let mut r = Request::new(self.url(path_and_query)?, method);
        r.insert_header("x-ms-version", TABLE_VERSION);
        r.insert_header("dataserviceversion", "3.0");
        r.insert_header("maxdataserviceversion", "3.0;NetFx");
        r.insert_header("accept", FULL_METADATA);
        r.insert_header(
            "x-ms-client-request-id",
            super::pipeline::client_request_id(),
        );
        Ok(r)
    }

    /// Send through the pipeline; any non-2xx status becomes a [`StorageError`].
    async fn send(&self, mut request: Request) -> StorageResult<RawResponse> {
        super::pipeline::send_checked(&self.pipeline, &mut request).await
    }
}

fn etag_of(rsp: &RawResponse) -> StorageResult<Etag> {
    find_header(rsp.headers(), "etag")
        .map(|e| Etag(e.to_string()))
        .ok_or_else(|| StorageError::Other("unexpected response from storage: no ETag".into()))
}

/// Percent-encode everything but RFC 3986 unreserved characters.
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

/// `table(PartitionKey='pk',RowKey='rk')`, quotes doubled, values encoded.
fn entity_path(table: &str, pk: &str, rk: &str) -> String {
    format!(
        "{table}(PartitionKey='{}',RowKey='{}')",
        pct(&pk.replace('\'', "''")),
        pct(&rk.replace('\'', "''"))
    )
}

/// An entity with its keys, as the request body: serialized from the
/// caller's map, not a copy of it with two keys added (that copy was a
/// third of a job's map allocations). `pk` and `rk` win over the entity's own
/// `PartitionKey` / `RowKey`.
struct WithKeys<'a> {
    pk: &'a str,
    rk: &'a str,
    entity: &'a Entity,
}

impl serde::Serialize for WithKeys<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("PartitionKey", self.pk)?;
        m.serialize_entry("RowKey", self.rk)?;
        for (k, v) in self.entity {
            if k != "PartitionKey" && k != "RowKey" {
                m.serialize_entry(k, v)?;
            }
        }
        m.end()
    }
}

fn entity_body(pk: &str, rk: &str, entity: &Entity) -> StorageResult<Vec<u8>> {
    serde_json::to_vec(&WithKeys { pk, rk, entity })
        .map_err(|e| StorageError::Other(format!("cannot encode entity: {e}")))
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

fn json_body(v: &Value) -> StorageResult<Vec<u8>> {
    serde_json::to_vec(v).map_err(|e| StorageError::Other(format!("cannot encode entity: {e}")))
}

fn parse_json(rsp: &RawResponse) -> StorageResult<Value> {
    serde_json::from_slice(rsp.body())
        .map_err(|e| StorageError::Other(format!("unexpected response from storage: {e}")))
}

/// One table.
pub struct AzureTable {
    name: String,
    client: TablesClient,
}

impl AzureTable {
    async fn write(
        &self,
        method: Method,
        pk: &str,
        rk: &str,
        entity: &Entity,
        etag: Option<&Etag>,
    ) -> StorageResult<Etag> {
        let mut r = self
            .client
            .request(method, &entity_path(&self.name, pk, rk))?;
        r.insert_header("content-type", "application/json");
        r.insert_header(
            "if-match",
            etag.map(|e| e.0.clone()).unwrap_or_else(|| "*".into()),
        );
        r.set_body(entity_body(pk, rk, entity)?);
        etag_of(&self.client.send(r).await?)
    }
}

impl AzureTable {
    /// One operation of a changeset: request line, headers, blank line, body.
    ///
    /// A delete carries its `If-Match` ETag and no body, as the SDKs write it
    /// (azure-sdk-for-python `azure/data/tables/_base_client.py`,
    /// `_batch_send`; azure-sdk-for-net `TableTransactionalBatch`) and as
    /// Azurite parses it (`src/table/batch/TableBatchSerialization.ts`,
    /// `deserializeBatchRequest`: the sub-request's headers, then an
    /// optional JSON body).
    fn batch_part(&self, pk: &str, op: &TableOp) -> StorageResult<String> {
        let (verb, url, entity, if_match) = match op {
            TableOp::Insert { row_key, entity } => (
                "POST",
                self.client.url(&pct(&self.name))?,
                Some(entity_body(pk, row_key, entity)?),
                None,
            ),
            TableOp::Merge {
                row_key,
                entity,
                if_match,
            } => (
                "MERGE",
                self.client.url(&entity_path(&self.name, pk, row_key))?,
                Some(entity_body(pk, row_key, entity)?),
                Some(if_match.as_ref().map(|e| e.0.clone()).unwrap_or("*".into())),
            ),
            TableOp::Delete { row_key, if_match } => (
                "DELETE",
                self.client.url(&entity_path(&self.name, pk, row_key))?,
                None,
                Some(if_match.0.clone()),
            ),
        };
        let mut part = format!("{verb} {url} HTTP/1.1\naccept: {FULL_METADATA}\n");
        if entity.is_some() {
            part.push_str("content-type: application/json\n");
        }
        if let Some(m) = if_match {
            part.push_str(&format!("if-match: {m}\n"));
        }
        part.push('\n');
        if let Some(entity) = entity {
            part.push_str(
                std::str::from_utf8(&entity).map_err(|e| StorageError::Other(e.to_string()))?,
            );
            part.push('\n');
        }
        Ok(part)
    }
}

/// `$filter` (the partition and the query's own filter) and `$select`, as
/// query parameters; empty when the query has neither.
fn query_params(query: &TableQuery<'_>) -> String {
    let mut clauses = Vec::new();
    if let Some(pk) = query.partition {
        clauses.push(format!("PartitionKey eq {}", odata_string(pk)));
    }
    if let Some(f) = &query.filter {
        clauses.push(format!("({})", odata_filter(f)));
    }
    let mut params = Vec::new();
    if !clauses.is_empty() {
        params.push(format!("$filter={}", pct(&clauses.join(" and "))));
    }
    if !query.select.is_empty() {
        // The keys always come back, so a row can be deleted by what it names.
        let mut cols = vec!["PartitionKey", "RowKey"];
        cols.extend(query.select.iter().copied());
        params.push(format!("$select={}", pct(&cols.join(","))));
    }
    params.join("&")
}

/// A typed [`Filter`] as an OData `$filter` expression: the only place a
/// filter string is written.
fn odata_filter(filter: &Filter) -> String {
    match filter {
        Filter::Eq { column, value } => format!("{column} eq {}", odata_string(value)),
        Filter::OneOf { column, values } if values.is_empty() => {
            // Matches nothing, as an empty set should (OData has no `false`
            // for string columns; a key never equals the empty string and
            // a non-empty string at once).
            format!("({column} eq '' and {column} ne '')")
        }
        Filter::OneOf { column, values } => {
            let any: Vec<String> = values
                .iter()
                .map(|v| format!("{column} eq {}", odata_string(v)))
                .collect();
            format!("({})", any.join(" or "))
        }
        Filter::ChangedBefore(t) => format!("Timestamp lt {}", odata_datetime(*t)),
        Filter::ChangedSince(t) => format!("Timestamp ge {}", odata_datetime(*t)),
        Filter::StartsWith { column, prefix } => match prefix_end(prefix) {
            Some(end) => format!(
                "({column} ge {} and {column} lt {})",
                odata_string(prefix),
                odata_string(&end)
            ),
            None => format!("{column} ge {}", odata_string(prefix)),
        },
        Filter::And(all) if all.is_empty() => "PartitionKey ne ''".to_string(),
        Filter::And(all) => {
            let each: Vec<String> = all
                .iter()
                .map(|f| format!("({})", odata_filter(f)))
                .collect();
            each.join(" and ")
        }
    }
}

/// The first string after every string starting with `prefix`: the prefix
/// with its last character raised by one (`None` for an empty prefix, or a
/// last character that cannot be raised: then only the lower bound holds).
fn prefix_end(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    let last = chars.pop()?;
    let next = char::from_u32(last as u32 + 1)?;
    chars.push(next);
    Some(chars.into_iter().collect())
}

/// A queried entity with its ETag (`odata.etag`) and keys.
fn row_of(v: Value) -> Row {
    let etag = v
        .get("odata.etag")
        .and_then(Value::as_str)
        .map(|e| Etag(e.to_string()));
    let (partition_key, row_key, entity) = strip(v);
    Row {
        partition_key,
        row_key,
        entity,
        etag,
    }
}

#[async_trait]
impl TableStore for AzureTable {
    fn name(&self) -> &str {
        &self.name
    }

    async fn create_if_missing(&self) -> StorageResult<()> {
        let mut r = self.client.request(Method::Post, "Tables")?;
        r.insert_header("content-type", "application/json");
        r.insert_header("prefer", "return-no-content");
        r.set_body(json_body(&serde_json::json!({ "TableName": self.name }))?);
        match self.client.send(r).await {
            Ok(_) | Err(StorageError::Conflict) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn insert(&self, pk: &str, rk: &str, entity: &Entity) -> StorageResult<Etag> {
        let mut r = self.client.request(Method::Post, &pct(&self.name))?;
        r.insert_header("content-type", "application/json");
        r.insert_header("prefer", "return-no-content");
        r.set_body(entity_body(pk, rk, entity)?);
        etag_of(&self.client.send(r).await?)
    }

    async fn get(&self, pk: &str, rk: &str) -> StorageResult<Option<(Entity, Etag)>> {
        let r = self
            .client
            .request(Method::Get, &entity_path(&self.name, pk, rk))?;
        match self.client.send(r).await {
            Ok(rsp) => {
                let etag = etag_of(&rsp)?;
                Ok(Some((strip(parse_json(&rsp)?).2, etag)))
            }
            Err(StorageError::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn merge(
        &self,
        pk: &str,
        rk: &str,
        entity: &Entity,
        etag: Option<&Etag>,
    ) -> StorageResult<Etag> {
        self.write(Method::Patch, pk, rk, entity, etag).await
    }

    async fn delete(&self, pk: &str, rk: &str) -> StorageResult<()> {
        let mut r = self
            .client
            .request(Method::Delete, &entity_path(&self.name, pk, rk))?;
        r.insert_header("if-match", "*");
        match self.client.send(r).await {
            Ok(_) | Err(StorageError::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn query_where(&self, query: &TableQuery<'_>) -> StorageResult<Vec<Row>> {
        let mut out = Vec::new();
        let mut next: Option<(String, Option<String>)> = None;
        loop {
            let mut q = format!("{}()?{}", pct(&self.name), query_params(query));
            if let Some((npk, nrk)) = &next {
                q.push_str(&format!("&NextPartitionKey={}", pct(npk)));
                if let Some(nrk) = nrk {
                    q.push_str(&format!("&NextRowKey={}", pct(nrk)));
                }
            }
            let rsp = self
                .client
                .send(self.client.request(Method::Get, q.trim_end_matches('?'))?)
                .await?;
            let h = |n: &str| find_header(rsp.headers(), n).map(str::to_string);
            let npk = h("x-ms-continuation-nextpartitionkey");
            let nrk = h("x-ms-continuation-nextrowkey");
            // Taken, not cloned: a page is up to 1,000 entities.
            let mut body = parse_json(&rsp)?;
            let Some(Value::Array(values)) = body.get_mut("value").map(Value::take) else {
                return Err(StorageError::Other(
                    "unexpected response from storage: no value array".into(),
                ));
            };
            out.extend(values.into_iter().map(row_of));
            match npk {
                Some(npk) => next = Some((npk, nrk)),
                None => return Ok(out),
            }
        }
    }

    async fn transaction(&self, pk: &str, ops: Vec<TableOp>) -> StorageResult<()> {
        let batch = uuid::Uuid::new_v4().hyphenated().to_string();
        let changeset = uuid::Uuid::new_v4().hyphenated().to_string();
        let mut body = format!(
            "--batch_{batch}\nContent-Type: multipart/mixed; boundary=changeset_{changeset}\n\n"
        );
        for op in &ops {
            body.push_str(&format!(
                "--changeset_{changeset}\nContent-Type: application/http\nContent-Transfer-Encoding: binary\n\n"
            ));
            body.push_str(&self.batch_part(pk, op)?);
        }
        body.push_str(&format!("--changeset_{changeset}--\n--batch_{batch}\n"));
        let mut r = self.client.request(Method::Post, "$batch")?;
        r.insert_header(
            "content-type",
            format!("multipart/mixed; boundary=batch_{batch}"),
        );
        r.set_body(body.into_bytes());
        let rsp = self.client.send(r).await?;
        // The batch answers 202 even when an operation failed: look inside.
        batch_result(&String::from_utf8_lossy(rsp.body()))
    }

    async fn delete_table(&self) -> StorageResult<()> {
        let mut r = self
            .client
            .request(Method::Delete, &format!("Tables('{}')", pct(&self.name)))?;
        r.insert_header("accept", "application/json");
        match self.client.send(r).await {
            Ok(_) | Err(StorageError::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// The first failed operation of a batch response, if any.
fn batch_result(body: &str) -> StorageResult<()> {
    for line in body.lines() {
        let Some(rest) = line.trim().strip_prefix("HTTP/1.1 ") else {
            continue;
        };
        let status: u16 = rest
            .split_whitespace()
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        if !(200..300).contains(&status) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entity_paths_escape_quotes_and_encode() {
        assert_eq!(
            entity_path("t", "a'b", "c d"),
            "t(PartitionKey='a%27%27b',RowKey='c%20d')"
        );
    }

    #[test]
    fn batch_results_find_the_failed_operation() {
        let ok = "--batchresponse_1\nContent-Type: multipart/mixed\n\n--changesetresponse_1\n\
                  HTTP/1.1 204 No Content\n\n--changesetresponse_1\nHTTP/1.1 201 Created\n";
        assert!(batch_result(ok).is_ok());
        let failed = "--batchresponse_1\n--changesetresponse_1\nHTTP/1.1 412 Precondition Failed\n";
        assert!(matches!(
            batch_result(failed),
            Err(StorageError::PreconditionFailed)
        ));
    }

    #[test]
    fn an_entity_body_carries_its_keys_and_they_win() {
        let mut e = Entity::new();
        e.insert("State".into(), Value::from("pending"));
        e.insert("RowKey".into(), Value::from("stale"));
        e.insert("Attempts".into(), Value::from(2));
        let body: Value = serde_json::from_slice(&entity_body("p1", "r1", &e).unwrap()).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"PartitionKey": "p1", "RowKey": "r1", "State": "pending", "Attempts": 2})
        );
    }
}
