//! A resolved storage connection: endpoints and credentials (parsed from
//! the environment by [`crate::config`]).

use std::fmt;

/// A value that must never reach a log line or an error message.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }
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
    SharedKey {
        account: String,
        key: Secret,
    },
    Sas {
        token: Secret,
    },
    /// Identity-based (`<name>__accountName` etc.): Azure AD token credentials.
    Identity {
        client_id: Option<String>,
    },
}

/// A resolved storage connection: endpoints and credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connection {
    /// The setting it came from (`AzureWebJobsStorage`).
    pub setting: String,
    pub account: String,
    pub queue_endpoint: String,
    pub table_endpoint: String,
    pub credentials: Credentials,
}

/// Well-known Azurite account and key (public, documented by Microsoft).
pub const DEV_ACCOUNT: &str = "devstoreaccount1";
pub const DEV_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
