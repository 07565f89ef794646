//! A storage connection: its endpoints and credentials, and how a
//! connection string or the identity-based `<name>__*` settings resolve to
//! one (the settings are looked up by the binary's configuration).

use aqw_core::config::StorageAccount;
use std::collections::BTreeMap;
use std::fmt;

/// A value that must never reach a log line or an error message.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// A secret holding `value`.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }
    /// The value itself, for the code that authenticates with it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// How to authenticate to the storage account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    /// The account key (`AccountName` / `AccountKey` of a connection string).
    SharedKey {
        /// The storage account's name.
        account: String,
        /// The account key.
        key: Secret,
    },
    /// A shared access signature (`SharedAccessSignature`).
    Sas {
        /// The SAS token.
        token: Secret,
    },
    /// Identity-based (`<name>__accountName` etc.): Azure AD token credentials.
    Identity {
        /// `<name>__clientId`: the client id of a user-assigned identity;
        /// `None` = the system-assigned (or default) identity.
        client_id: Option<String>,
    },
}

/// A resolved storage connection: endpoints and credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connection {
    /// The setting it came from (`AzureWebJobsStorage`).
    pub setting: String,
    /// The storage account's name.
    pub account: String,
    /// The queue service's base URL.
    pub queue_endpoint: String,
    /// The table service's base URL.
    pub table_endpoint: String,
    /// The blob service's base URL (claim-check bodies).
    pub blob_endpoint: String,
    /// How to authenticate to the account.
    pub credentials: Credentials,
}

/// Well-known Azurite account and key (public, documented by Microsoft).
pub const DEV_ACCOUNT: &str = "devstoreaccount1";
/// The Azurite account's key (see [`DEV_ACCOUNT`]).
pub const DEV_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// The Azure connection an engine-side [`StorageAccount`] was resolved to
/// (by [`resolve_connection`] or [`parse_connection_string`], wrapped with
/// [`Connection::account`]); an error naming the setting otherwise.
pub fn connection_of(account: &StorageAccount) -> Result<&Connection, String> {
    account.resolved::<Connection>().ok_or_else(|| {
        format!(
            "{}: not an Azure storage connection (a worker built in code on its own storage)",
            account.setting
        )
    })
}

impl Connection {
    /// This connection as the engine's [`StorageAccount`] (the setting, and
    /// this connection held for [`connection_of`]).
    pub fn account(self) -> StorageAccount {
        StorageAccount::new(self.setting.clone(), self)
    }
}

/// Resolve a connection setting: a connection string in `name`, or the
/// identity-based `<name>__*` settings. `setting` looks a setting up (the
/// environment, in the binary's configuration); errors name settings, never a value.
pub fn resolve_connection(
    name: &str,
    setting: &dyn Fn(&str) -> Option<String>,
) -> Result<Connection, String> {
    if let Some(value) = setting(name) {
        return parse_connection_string(name, &value);
    }
    // Identity-based connection: <name>__accountName, or __queueServiceUri
    // (alias __serviceUri, as the queue extension reads it) with an optional
    // __tableServiceUri.
    let account = setting(&format!("{name}__accountName"));
    let queue_uri = setting(&format!("{name}__queueServiceUri"))
        .or_else(|| setting(&format!("{name}__serviceUri")));
    let table_uri = setting(&format!("{name}__tableServiceUri"));
    if account.is_none() && queue_uri.is_none() && table_uri.is_none() {
        return Err(format!(
            "not set: give {name} a connection string (UseDevelopmentStorage=true for Azurite) \
             or {name}__accountName / {name}__queueServiceUri for an identity-based connection"
        ));
    }
    if let Some(c) = setting(&format!("{name}__credential")) {
        if !c.eq_ignore_ascii_case("managedidentity") {
            return Err(format!(
                "{name}__credential: \"{c}\" is not supported (only managedidentity)"
            ));
        }
    }
    let client_id = setting(&format!("{name}__clientId"));
    let (queue_endpoint, table_endpoint, account) =
        identity_endpoints(name, account, queue_uri, table_uri)?;
    // Only claim-checked jobs need it: when it is neither set nor derivable,
    // a blob request fails naming the setting (the storage adapter).
    let blob_endpoint = setting(&format!("{name}__blobServiceUri"))
        .or_else(|| blob_endpoint_for(&queue_endpoint))
        .unwrap_or_default();
    Ok(Connection {
        setting: name.to_string(),
        account,
        queue_endpoint: trim_slash(queue_endpoint),
        table_endpoint: trim_slash(table_endpoint),
        blob_endpoint: trim_slash(blob_endpoint),
        credentials: Credentials::Identity { client_id },
    })
}

/// The queue endpoint, table endpoint and account of an identity-based
/// connection, from whichever of its settings are given.
fn identity_endpoints(
    name: &str,
    account: Option<String>,
    queue_uri: Option<String>,
    table_uri: Option<String>,
) -> Result<(String, String, String), String> {
    match (account, queue_uri, table_uri) {
        (_, Some(q), t) => {
            url::Url::parse(&q).map_err(|_| format!("{name}__queueServiceUri is not a URL"))?;
            let t = match t {
                Some(t) => t,
                None => table_endpoint_for(&q).ok_or_else(|| {
                    format!(
                        "{name}__tableServiceUri is not set and cannot be derived from \
                         {name}__queueServiceUri (its host is not <account>.queue.<suffix>); \
                         set {name}__tableServiceUri (aqw keeps its keys and records in Tables)"
                    )
                })?,
            };
            let acct = account_from_uri(&q)
                .ok_or_else(|| format!("{name}__queueServiceUri: no account in the URL"))?;
            Ok((q, t, acct))
        }
        (Some(a), None, t) => Ok((
            format!("https://{a}.queue.core.windows.net"),
            t.unwrap_or_else(|| format!("https://{a}.table.core.windows.net")),
            a,
        )),
        (None, None, _) => Err(format!(
            "{name}__tableServiceUri alone is not enough: set {name}__queueServiceUri (or {name}__accountName)"
        )),
    }
}

/// The account name in a service URL: the first label of
/// `<account>.queue.core.windows.net`, or the first path segment of an
/// emulator URL (`http://127.0.0.1:10001/devstoreaccount1`).
fn account_from_uri(uri: &str) -> Option<String> {
    let u = url::Url::parse(uri).ok()?;
    let host = u.host_str()?;
    if is_emulator_host(&u) {
        let seg = u.path_segments()?.find(|s| !s.is_empty())?;
        return Some(seg.to_string());
    }
    Some(host.split('.').next()?.to_string())
}

fn is_emulator_host(u: &url::Url) -> bool {
    matches!(
        u.host(),
        Some(url::Host::Ipv4(_)) | Some(url::Host::Ipv6(_))
    ) || u.host_str() == Some("localhost")
}

/// The Table endpoint of the account a Queue endpoint belongs to:
/// `<account>.queue.<suffix>` → `<account>.table.<suffix>`; an emulator on
/// loopback → the same host with the table port (10001 → 10002, Azurite's
/// defaults). `None` when the URL says neither.
pub fn table_endpoint_for(queue_endpoint: &str) -> Option<String> {
    sibling_endpoint(queue_endpoint, "table", 10002)
}

/// The Blob endpoint of the account a Queue endpoint belongs to, derived as
/// the table endpoint is: `<account>.blob.<suffix>`, or Azurite's blob
/// port 10000 on loopback. `None` when the URL says neither.
pub fn blob_endpoint_for(queue_endpoint: &str) -> Option<String> {
    sibling_endpoint(queue_endpoint, "blob", 10000)
}

fn sibling_endpoint(queue_endpoint: &str, service: &str, emulator_port: u16) -> Option<String> {
    let mut u = url::Url::parse(queue_endpoint).ok()?;
    let host = u.host_str()?.to_string();
    if is_emulator_host(&u) {
        let port = u.port()?;
        if port != 10001 {
            return None;
        }
        u.set_port(Some(emulator_port)).ok()?;
        return Some(trim_slash(u.to_string()));
    }
    let mut labels: Vec<&str> = host.split('.').collect();
    if labels.len() < 3 || !labels[1].eq_ignore_ascii_case("queue") {
        return None;
    }
    labels[1] = service;
    u.set_host(Some(&labels.join("."))).ok()?;
    Some(trim_slash(u.to_string()))
}

fn trim_slash(s: String) -> String {
    s.trim_end_matches('/').to_string()
}

/// `UseDevelopmentStorage=true`: Azurite's well-known account on its
/// default ports (of `DevelopmentStorageProxyUri` when given).
fn development_storage(setting: &str, proxy: Option<&str>) -> Connection {
    let proxy = proxy.unwrap_or("http://127.0.0.1").trim_end_matches('/');
    Connection {
        setting: setting.to_string(),
        account: DEV_ACCOUNT.into(),
        queue_endpoint: format!("{proxy}:10001/{DEV_ACCOUNT}"),
        table_endpoint: format!("{proxy}:10002/{DEV_ACCOUNT}"),
        blob_endpoint: format!("{proxy}:10000/{DEV_ACCOUNT}"),
        credentials: Credentials::SharedKey {
            account: DEV_ACCOUNT.into(),
            key: Secret::new(DEV_KEY),
        },
    }
}

/// Parse a storage connection string (`k=v;k=v`), expanding `UseDevelopmentStorage=true`.
pub fn parse_connection_string(setting: &str, value: &str) -> Result<Connection, String> {
    let kv = connection_string_pairs(value)?;
    let get = |k: &str| kv.get(&k.to_ascii_lowercase()).cloned();
    if get("UseDevelopmentStorage").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Ok(development_storage(
            setting,
            get("DevelopmentStorageProxyUri").as_deref(),
        ));
    }
    let account = get("AccountName");
    let protocol = get("DefaultEndpointsProtocol").unwrap_or_else(|| "https".into());
    let suffix = get("EndpointSuffix").unwrap_or_else(|| "core.windows.net".into());
    let endpoint = |explicit: Option<String>, service: &str| -> Result<String, String> {
        match (explicit, &account) {
            (Some(e), _) => {
                url::Url::parse(&e)
                    .map_err(|_| format!("{}Endpoint is not a URL", capitalise(service)))?;
                Ok(trim_slash(e))
            }
            (None, Some(a)) => Ok(format!("{protocol}://{a}.{service}.{suffix}")),
            (None, None) => Err(format!(
                "needs AccountName or {}Endpoint",
                capitalise(service)
            )),
        }
    };
    let queue_endpoint = endpoint(get("QueueEndpoint"), "queue")?;
    // A queue-only connection string: the table endpoint of the same account.
    let table_endpoint = match (get("TableEndpoint"), &account) {
        (None, None) => table_endpoint_for(&queue_endpoint).ok_or_else(|| {
            "needs AccountName or TableEndpoint (the table endpoint cannot be derived \
             from QueueEndpoint)"
                .to_string()
        })?,
        (t, _) => endpoint(t, "table")?,
    };
    let blob_endpoint = match (get("BlobEndpoint"), &account) {
        (None, None) => blob_endpoint_for(&queue_endpoint).unwrap_or_default(),
        (b, _) => endpoint(b, "blob")?,
    };
    let credentials =
        string_credentials(&account, get("AccountKey"), get("SharedAccessSignature"))?;
    let account = account
        .or_else(|| account_from_uri(&queue_endpoint))
        .unwrap_or_else(|| DEV_ACCOUNT.into());
    Ok(Connection {
        setting: setting.to_string(),
        account,
        queue_endpoint,
        table_endpoint,
        blob_endpoint,
        credentials,
    })
}

/// A connection string's `key=value` pairs, keys lowercased (they are
/// case-insensitive). The error never quotes the string: it holds the secret.
fn connection_string_pairs(value: &str) -> Result<BTreeMap<String, String>, String> {
    let mut kv: BTreeMap<String, String> = BTreeMap::new();
    for part in value.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((k, v)) = part.split_once('=') else {
            return Err(
                "is not a connection string (expected key=value pairs separated by ';')".into(),
            );
        };
        kv.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
    }
    Ok(kv)
}

/// A connection string's credentials: its account key, else its SAS.
fn string_credentials(
    account: &Option<String>,
    account_key: Option<String>,
    sas: Option<String>,
) -> Result<Credentials, String> {
    if let Some(key) = account_key {
        let Some(account) = account.clone() else {
            return Err("has AccountKey but no AccountName".into());
        };
        use base64::Engine;
        if base64::engine::general_purpose::STANDARD
            .decode(&key)
            .is_err()
        {
            return Err("AccountKey is not valid base64".into());
        }
        Ok(Credentials::SharedKey {
            account,
            key: Secret::new(key),
        })
    } else if let Some(sas) = sas {
        Ok(Credentials::Sas {
            token: Secret::new(sas.trim_start_matches('?')),
        })
    } else {
        Err("has neither AccountKey nor SharedAccessSignature".into())
    }
}

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_storage_expands() {
        let c =
            parse_connection_string("AzureWebJobsStorage", "UseDevelopmentStorage=true").unwrap();
        assert_eq!(c.queue_endpoint, "http://127.0.0.1:10001/devstoreaccount1");
        assert_eq!(c.table_endpoint, "http://127.0.0.1:10002/devstoreaccount1");
    }

    #[test]
    fn full_connection_string_with_endpoints() {
        let s = format!(
            "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={DEV_KEY};\
             QueueEndpoint=http://127.0.0.1:20001/devstoreaccount1;TableEndpoint=http://127.0.0.1:20002/devstoreaccount1;"
        );
        let c = parse_connection_string("X", &s).unwrap();
        assert_eq!(c.queue_endpoint, "http://127.0.0.1:20001/devstoreaccount1");
        assert_eq!(c.account, "devstoreaccount1");
        let c = parse_connection_string("X", &format!("AccountName=acct;AccountKey={DEV_KEY}"))
            .unwrap();
        assert_eq!(c.queue_endpoint, "https://acct.queue.core.windows.net");
    }

    #[test]
    fn connection_errors_never_echo_the_secret() {
        let secret = "c2VjcmV0LWtleS12YWx1ZQ==zz!";
        let e = parse_connection_string("X", &format!("AccountName=a;AccountKey={secret}"))
            .unwrap_err();
        assert!(!e.contains(secret), "{e}");
        let e = parse_connection_string("X", "garbage-with-secret").unwrap_err();
        assert!(!e.contains("garbage-with-secret"), "{e}");
        assert!(!format!("{:?}", Secret::new("abc")).contains("abc"));
    }

    #[test]
    fn identity_connection() {
        let mut env = BTreeMap::new();
        env.insert(
            "AzureWebJobsStorage__accountName".to_string(),
            "acct".to_string(),
        );
        let c = resolve_connection("AzureWebJobsStorage", &|k: &str| env.get(k).cloned()).unwrap();
        assert_eq!(c.queue_endpoint, "https://acct.queue.core.windows.net");
        assert_eq!(c.credentials, Credentials::Identity { client_id: None });
    }

    #[test]
    fn the_blob_endpoint_is_set_or_derived_like_the_table_endpoint() {
        let dev = parse_connection_string("X", "UseDevelopmentStorage=true").unwrap();
        assert_eq!(dev.blob_endpoint, "http://127.0.0.1:10000/devstoreaccount1");
        let named = parse_connection_string(
            "X",
            "AccountName=acct;AccountKey=a2V5;EndpointSuffix=core.chinacloudapi.cn",
        )
        .unwrap();
        assert_eq!(
            named.blob_endpoint,
            "https://acct.blob.core.chinacloudapi.cn"
        );
        let explicit = parse_connection_string(
            "X",
            "AccountName=a;AccountKey=a2V5;BlobEndpoint=http://127.0.0.1:20000/a/",
        )
        .unwrap();
        assert_eq!(explicit.blob_endpoint, "http://127.0.0.1:20000/a");
        let uri = |pairs: &[(&str, &str)]| resolve_connection("C", &env_of(pairs)).unwrap();
        let q = ("C__queueServiceUri", "https://acct.queue.core.windows.net");
        assert_eq!(
            uri(&[q]).blob_endpoint,
            "https://acct.blob.core.windows.net"
        );
        let set = ("C__blobServiceUri", "https://blobs.example.com/");
        assert_eq!(uri(&[q, set]).blob_endpoint, "https://blobs.example.com");
        let local = (
            "C__queueServiceUri",
            "http://127.0.0.1:10001/devstoreaccount1",
        );
        assert_eq!(
            uri(&[local]).blob_endpoint,
            "http://127.0.0.1:10000/devstoreaccount1"
        );
        // A custom domain without the setting: none, and only a blob request fails.
        let custom = ("C__queueServiceUri", "https://queues.example.com");
        let t = ("C__tableServiceUri", "https://tables.example.com");
        assert_eq!(uri(&[custom, t]).blob_endpoint, "");
    }

    /// A setting lookup over fixed pairs.
    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn service_uri_alias_and_queue_only_settings_derive_the_table_endpoint() {
        let c = resolve_connection(
            "Conn",
            &env_of(&[("Conn__serviceUri", "https://acct.queue.core.windows.net/")]),
        )
        .unwrap();
        assert_eq!(c.queue_endpoint, "https://acct.queue.core.windows.net");
        assert_eq!(c.table_endpoint, "https://acct.table.core.windows.net");
        assert_eq!(c.account, "acct");
        // Sovereign clouds keep their suffix.
        let c = resolve_connection(
            "Conn",
            &env_of(&[(
                "Conn__queueServiceUri",
                "https://a2.queue.core.chinacloudapi.cn",
            )]),
        )
        .unwrap();
        assert_eq!(c.table_endpoint, "https://a2.table.core.chinacloudapi.cn");
        // An emulator on loopback: the table port.
        let c = resolve_connection(
            "Conn",
            &env_of(&[(
                "Conn__queueServiceUri",
                "http://127.0.0.1:10001/devstoreaccount1",
            )]),
        )
        .unwrap();
        assert_eq!(c.table_endpoint, "http://127.0.0.1:10002/devstoreaccount1");
        assert_eq!(c.account, "devstoreaccount1");
        // A custom domain cannot be derived: a clear error naming the setting.
        let e = resolve_connection(
            "Conn",
            &env_of(&[("Conn__queueServiceUri", "https://queues.example.com")]),
        )
        .unwrap_err();
        assert!(e.contains("Conn__tableServiceUri"), "{e}");
        // A queue-only connection string.
        let c = parse_connection_string(
            "Conn",
            "QueueEndpoint=https://acct.queue.core.windows.net;SharedAccessSignature=sv=1&sig=s",
        )
        .unwrap();
        assert_eq!(c.table_endpoint, "https://acct.table.core.windows.net");
        assert!(parse_connection_string(
            "Conn",
            "QueueEndpoint=https://q.example.com;SharedAccessSignature=sv=1&sig=s"
        )
        .unwrap_err()
        .contains("TableEndpoint"));
    }

    proptest::proptest! {
        #[test]
        fn connection_parser_never_panics(s in "\\PC{0,60}") {
            let _ = parse_connection_string("X", &s);
        }
    }
}
