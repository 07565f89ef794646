//! A storage connection as the configuration names it: the account, its
//! endpoints and credentials (resolved by the binary from a connection
//! string or identity-based settings; opened by its storage adapter).

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

impl Connection {
    /// The connection of a worker built in code on a storage it was given
    /// (no account to resolve): the setting is named `embedded`.
    pub fn embedded() -> Self {
        Self {
            setting: "embedded".to_string(),
            account: "embedded".to_string(),
            queue_endpoint: String::new(),
            table_endpoint: String::new(),
            blob_endpoint: String::new(),
            credentials: Credentials::Identity { client_id: None },
        }
    }
}

/// Well-known Azurite account and key (public, documented by Microsoft).
pub const DEV_ACCOUNT: &str = "devstoreaccount1";
/// The Azurite account's key (see [`DEV_ACCOUNT`]).
pub const DEV_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
