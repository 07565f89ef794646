//! One TLS client configuration per process, shared by every HTTP client.
//!
//! Why: reqwest builds its rustls configuration anew for each client, and
//! with native roots that means reading and parsing the system's whole
//! certificate bundle (PEM, base64) every time. `aqw run` builds several
//! clients (storage, the `http` handler, the trace exporter, the alert
//! webhook), and the bundle dominated its start-up: callgrind put
//! `rustls_pki_types` PEM and base64 decoding at 17 % of a 300-job run's
//! instructions (scripts/profile.sh, BENCHMARKS.md). Loading the roots once,
//! on the first client that needs them, and handing the same configuration
//! to every client keeps the trust decisions identical to reqwest's own:
//! the bundled webpki roots plus the OS store (`SSL_CERT_FILE` honoured by
//! rustls-native-certs), TLS 1.2 and 1.3, ring, HTTP/1.1 by ALPN.

use std::sync::{Arc, OnceLock};

/// The process's TLS client configuration, built on first use.
pub fn client_config() -> rustls::ClientConfig {
    static CONFIG: OnceLock<rustls::ClientConfig> = OnceLock::new();
    CONFIG.get_or_init(build).clone()
}

fn build() -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    // As reqwest does: native stores often hold a few unparsable ancient
    // certificates; skip them rather than refuse the whole store.
    let native = rustls_native_certs::load_native_certs();
    let (added, ignored) = roots.add_parsable_certificates(native.certs);
    if ignored > 0 || !native.errors.is_empty() {
        tracing::debug!(
            added,
            ignored,
            errors = native.errors.len(),
            "some native root certificates were not loaded"
        );
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config
}

/// An async client builder on the shared configuration.
pub fn client_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder().use_preconfigured_tls(client_config())
}

/// A blocking client builder on the shared configuration.
pub fn blocking_client_builder() -> reqwest::blocking::ClientBuilder {
    reqwest::blocking::Client::builder().use_preconfigured_tls(client_config())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_configuration_with_roots_and_http11() {
        let c = client_config();
        assert_eq!(c.alpn_protocols, vec![b"http/1.1".to_vec()]);
        // Built once: a second call clones the same (Arc-shared) verifier.
        let again = client_config();
        assert_eq!(again.alpn_protocols, c.alpn_protocols);
        assert!(client_builder().build().is_ok());
        assert!(blocking_client_builder().build().is_ok());
    }
}
