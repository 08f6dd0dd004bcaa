//! The HTTP client of calls this service makes to others (providers' APIs, the other nodes of a cluster): rustls
//! with the public web PKI's roots, HTTP/1.1, a bounded connect, redirects never followed (a redirect would
//! carry credentials or a signed body somewhere not chosen).

use std::sync::Arc;
use std::time::Duration;

/// How long opening a connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A client whose calls stop waiting for an answer's headers after `timeout` (awc's time-out ends there: a
/// caller bounds the body itself). `what` names the calls in the error logged when TLS cannot be set up; only
/// `http://` URLs work then, and every `https://` call fails with a clear error.
pub fn client(timeout: Duration, what: &str) -> awc::Client {
    // awc panics without a process-wide rustls provider; installing it twice is harmless.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map(|b| b.with_root_certificates(roots).with_no_client_auth());
    let connector = awc::Connector::new().timeout(CONNECT_TIMEOUT);
    let connector = match config {
        Ok(mut config) => {
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            connector.rustls_0_23(Arc::new(config))
        }
        Err(e) => {
            tracing::error!(error = %e, calls = what, "TLS setup failed");
            connector
        }
    };
    awc::Client::builder().connector(connector).disable_redirects().timeout(timeout).finish()
}
