//! Entra ID credentials for identity-based connections
//! (`<setting>__accountName` / `__queueServiceUri` / `__tableServiceUri`),
//! on `azure_identity` 1.x.
//!
//! The order aqw tries, first match wins:
//!
//! 1. **Workload identity** (AKS): `AZURE_FEDERATED_TOKEN_FILE` is set. Client
//!    id: `<setting>__clientId`, else `AZURE_CLIENT_ID`; tenant
//!    `AZURE_TENANT_ID`; authority `AZURE_AUTHORITY_HOST` (https only).
//! 2. **Managed identity**: `<setting>__credential=managedidentity`, or a
//!    user-assigned identity named by `<setting>__clientId` or
//!    `<setting>__managedIdentityResourceId`, or the platform's endpoint
//!    (`IDENTITY_ENDPOINT` + `IDENTITY_HEADER`: App Service, Container Apps,
//!    Functions). With `IDENTITY_ENDPOINT` the App Service protocol is used,
//!    else the VM instance metadata endpoint (IMDS). System-assigned unless
//!    `__clientId` / `__managedIdentityResourceId` names a user-assigned one
//!    (App Service takes only the client id, as `azure_identity` documents).
//! 3. **Developer tools** (a developer's machine): no `__credential`, no
//!    client or resource id, no platform endpoint: the Azure CLI, then the
//!    Azure Developer CLI (`az login` / `azd auth login`), then IMDS as a
//!    last resort (a VM with a system-assigned identity and no settings).
//!
//! The storage layer reads `__managedIdentityResourceId` and `__credential`
//! from the environment itself (by the connection's setting name), so the
//! configuration types above `crates/aqw-azure/src/` are unchanged.
//!
//! [`BearerPolicy`] puts the token on each try. Unlike `azure_core`'s
//! `BearerTokenAuthorizationPolicy` it also allows plain `http` to a
//! loopback host (a token sent to 127.0.0.1 never leaves the machine; the
//! local test doubles use it); to any other host it requires https.

use super::*;
use azure_core::credentials::{AccessToken, TokenCredential};
use azure_core::error::{Error, ErrorKind};
use azure_core::http::policies::{Policy, PolicyResult};
use azure_core::http::{ClientOptions, Context, Request, Transport};
use azure_identity::{
    DeveloperToolsCredential, ManagedIdentityCredential, ManagedIdentityCredentialOptions,
    UserAssignedId, WorkloadIdentityCredential, WorkloadIdentityCredentialOptions,
};

/// The scope of Azure Storage (queues, tables and blobs).
pub const STORAGE_SCOPE: &str = "https://storage.azure.com/.default";

fn var(n: &str) -> Option<String> {
    std::env::var(n).ok().filter(|v| !v.is_empty())
}

fn cred_err(what: &str, e: azure_core::Error) -> StorageError {
    StorageError::Other(format!(
        "{what}: {}",
        aqw_core::scrub::scrub(&e.to_string())
    ))
}

/// The credential for an identity-based connection (order in the module docs).
pub fn identity_credential(
    setting: &str,
    client_id: Option<&str>,
    transport: &Transport,
) -> Result<Arc<dyn TokenCredential>, StorageError> {
    let client_options = ClientOptions {
        transport: Some(transport.clone()),
        ..Default::default()
    };
    let resource_id = var(&format!("{setting}__managedIdentityResourceId"));
    let explicit_mi = var(&format!("{setting}__credential"))
        .is_some_and(|c| c.eq_ignore_ascii_case("managedidentity"));
    if var("AZURE_FEDERATED_TOKEN_FILE").is_some() {
        let c = WorkloadIdentityCredential::new(Some(WorkloadIdentityCredentialOptions {
            credential_options: azure_identity::ClientAssertionCredentialOptions { client_options },
            client_id: client_id.map(str::to_string),
            ..Default::default()
        }))
        .map_err(|e| cred_err("workload identity", e))?;
        return Ok(c);
    }
    let user_assigned = match (client_id, resource_id) {
        (Some(id), _) => Some(UserAssignedId::ClientId(id.to_string())),
        (None, Some(r)) => Some(UserAssignedId::ResourceId(r)),
        (None, None) => None,
    };
    let managed = || {
        ManagedIdentityCredential::new(Some(ManagedIdentityCredentialOptions {
            user_assigned_id: user_assigned.clone(),
            client_options: client_options.clone(),
        }))
        .map_err(|e| cred_err("managed identity", e))
    };
    if explicit_mi || user_assigned.is_some() || var("IDENTITY_ENDPOINT").is_some() {
        return Ok(managed()?);
    }
    let dev = DeveloperToolsCredential::new(None).map_err(|e| cred_err("developer tools", e))?;
    Ok(Arc::new(Chain {
        sources: vec![dev, managed()?],
    }))
}

/// Tries each credential in turn; the first token wins.
#[derive(Debug)]
struct Chain {
    sources: Vec<Arc<dyn TokenCredential>>,
}

#[async_trait]
impl TokenCredential for Chain {
    async fn get_token(
        &self,
        scopes: &[&str],
        options: Option<azure_core::credentials::TokenRequestOptions<'_>>,
    ) -> azure_core::Result<AccessToken> {
        let mut last = None;
        for s in &self.sources {
            match s.get_token(scopes, options.clone()).await {
                Ok(t) => return Ok(t),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            Error::with_message(ErrorKind::Credential, "no credential available")
        }))
    }
}

/// Adds `Authorization: Bearer <token>` to each try, caching the token
/// until five minutes before it expires.
#[derive(Debug)]
pub struct BearerPolicy {
    credential: Arc<dyn TokenCredential>,
    cached: tokio::sync::Mutex<Option<AccessToken>>,
}

impl BearerPolicy {
    pub fn new(credential: Arc<dyn TokenCredential>) -> Self {
        Self {
            credential,
            cached: tokio::sync::Mutex::new(None),
        }
    }

    async fn token(&self) -> azure_core::Result<String> {
        let mut cached = self.cached.lock().await;
        let fresh = cached.as_ref().is_some_and(|t| {
            t.expires_on - time::OffsetDateTime::now_utc() > time::Duration::minutes(5)
        });
        if !fresh {
            *cached = Some(self.credential.get_token(&[STORAGE_SCOPE], None).await?);
        }
        Ok(cached
            .as_ref()
            .map(|t| t.token.secret().to_string())
            .unwrap_or_default())
    }
}

fn allows_bearer(url: &url::Url) -> bool {
    url.scheme() == "https"
        || match url.host() {
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
            Some(url::Host::Domain(d)) => d == "localhost",
            None => false,
        }
}

#[async_trait]
impl Policy for BearerPolicy {
    async fn send(
        &self,
        ctx: &Context,
        request: &mut Request,
        next: &[Arc<dyn Policy>],
    ) -> PolicyResult {
        if !allows_bearer(request.url()) {
            return Err(Error::with_message(
                ErrorKind::Other,
                "bearer tokens need an https storage endpoint",
            ));
        }
        let token = self.token().await?;
        request.insert_header("authorization", format!("Bearer {token}"));
        next[0].send(ctx, request, &next[1..]).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_needs_https_except_on_loopback() {
        let u = |s: &str| url::Url::parse(s).unwrap();
        assert!(allows_bearer(&u("https://acct.queue.core.windows.net/q")));
        assert!(allows_bearer(&u("http://127.0.0.1:10001/acct/q")));
        assert!(allows_bearer(&u("http://localhost:10001/acct/q")));
        assert!(!allows_bearer(&u("http://acct.queue.core.windows.net/q")));
        assert!(!allows_bearer(&u("http://10.0.0.1/acct/q")));
    }
}
