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
//!
//! The roots themselves load on the first TLS handshake, not when a client
//! is built (`LazyRoots`): most deployments of `aqw run` next to Azurite,
//! a loopback handler or a collector sidecar speak plain HTTP and never need
//! them, and every CLI command paid ~18 M instructions (callgrind; 10 % of a
//! 300-job `aqw run`) to parse a bundle it did not use. Verification is
//! rustls's own `WebPkiServerVerifier` on the same roots, only built later.

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use std::sync::{Arc, OnceLock};

/// The process's TLS client configuration, built on first use.
pub fn client_config() -> rustls::ClientConfig {
    static CONFIG: OnceLock<rustls::ClientConfig> = OnceLock::new();
    CONFIG.get_or_init(build).clone()
}

fn build() -> rustls::ClientConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = Arc::new(LazyRoots {
        provider: provider.clone(),
        verifier: OnceLock::new(),
    });
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default TLS versions")
        // Not a weaker check: every call is handed to rustls's WebPki
        // verifier (below); "dangerous" is rustls's name for any verifier
        // that is not built in.
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config
}

/// The webpki roots plus the OS store, as reqwest trusts them.
fn root_store() -> rustls::RootCertStore {
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
    roots
}

/// rustls's `WebPkiServerVerifier`, built on the first certificate to
/// verify. The signature checks need no roots, so they go straight to the
/// provider's algorithms, as the WebPki verifier's own do.
#[derive(Debug)]
struct LazyRoots {
    provider: Arc<CryptoProvider>,
    verifier: OnceLock<Result<Arc<WebPkiServerVerifier>, String>>,
}

impl LazyRoots {
    fn verifier(&self) -> Result<&Arc<WebPkiServerVerifier>, rustls::Error> {
        self.verifier
            .get_or_init(|| {
                WebPkiServerVerifier::builder_with_provider(
                    Arc::new(root_store()),
                    self.provider.clone(),
                )
                .build()
                .map_err(|e| format!("cannot load the TLS root certificates: {e}"))
            })
            .as_ref()
            .map_err(|e| rustls::Error::General(e.clone()))
    }
}

impl ServerCertVerifier for LazyRoots {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.verifier()?.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
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

    #[test]
    fn an_untrusted_certificate_is_refused_by_the_webpki_verifier() {
        // Bytes that no root vouches for: the lazy verifier loads the roots
        // on this first check, then refuses them as rustls's own verifier
        // does.
        let verifier = LazyRoots {
            provider: Arc::new(rustls::crypto::ring::default_provider()),
            verifier: OnceLock::new(),
        };
        assert!(
            verifier.verifier.get().is_none(),
            "no roots before a handshake"
        );
        let bogus = CertificateDer::from(vec![0x30, 0x03, 0x02, 0x01, 0x00]);
        let name = ServerName::try_from("example.com").unwrap();
        let got = verifier.verify_server_cert(&bogus, &[], &name, &[], UnixTime::now());
        assert!(got.is_err());
        assert!(matches!(verifier.verifier.get(), Some(Ok(_))));
        assert!(!verifier.supported_verify_schemes().is_empty());
    }
}
