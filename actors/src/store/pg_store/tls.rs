//! Where the store connects and how: the PostgreSQL URL, and TLS when the URL asks for it.
//!
//! The URL is libpq's: `sslmode=require` (or `verify-ca`, `verify-full`) encrypts every connection with rustls
//! and, whatever the mode says, verifies the server's certificate and name: against the CA certificates of
//! `sslrootcert` (a PEM file: a managed database's CA, or a private one) and those only, as libpq does, or
//! against the public web PKI's roots when no `sslrootcert` is given. An
//! encrypted connection whose server cannot be verified is one an attacker on the path could be answering, and
//! the store's connection carries every balance. Without `sslmode`, or with `disable` or `prefer`, connections
//! are plain, as the operations guide says: keep the database on a private network then.
//!
//! tokio-postgres knows neither `sslrootcert` nor the two `verify-*` modes, so they are read here and taken out
//! of the URL before it parses the rest.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::config::{SslMode, TargetSessionAttrs};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};

use crate::store::StoreError;

/// A parsed store URL: the driver's configuration, and the TLS client when the URL asks for TLS.
#[derive(Clone)]
pub(super) struct Endpoint {
    pub(super) config: tokio_postgres::Config,
    pub(super) tls: Option<Rustls>,
}

impl Endpoint {
    pub(super) fn parse(url: &str) -> Result<Endpoint, StoreError> {
        let invalid = |why: String| StoreError::Io(format!("the PostgreSQL URL is not valid: {why}"));
        let (rest, root_cert) = take_parameter(url, "sslrootcert");
        let (rest, mode) = take_parameter(&rest, "sslmode");
        let verify = matches!(mode.as_deref(), Some("verify-ca" | "verify-full"));
        // The driver reads the mode it knows; the verifying ones are `require` to it.
        let rest = match mode.as_deref() {
            Some("verify-ca" | "verify-full") => with_parameter(&rest, "sslmode", "require"),
            Some(mode) => with_parameter(&rest, "sslmode", mode),
            None => rest,
        };
        let mut config: tokio_postgres::Config = rest.parse().map_err(|e| invalid(format!("{e}")))?;
        // Of the hosts a URL names (a primary and its standbys), only the one that takes writes: a standby may
        // answer from behind the primary, and a node that loaded a merchant from there would decide on a stale
        // balance. Every connection of the store writes, or reads what its writes build on.
        config.target_session_attrs(TargetSessionAttrs::ReadWrite);
        let wants_tls = verify || config.get_ssl_mode() == SslMode::Require;
        if !wants_tls {
            if root_cert.is_some() {
                return Err(invalid("sslrootcert is given but sslmode does not ask for TLS (sslmode=require)".into()));
            }
            return Ok(Endpoint { config, tls: None });
        }
        Ok(Endpoint { config, tls: Some(Rustls::new(root_cert.as_deref())?) })
    }
}

/// Removes `name=value` from a URL's query string or a key-value connection string; returns what is left and
/// the value.
fn take_parameter(url: &str, name: &str) -> (String, Option<String>) {
    let prefix = format!("{name}=");
    let split = |pairs: &mut dyn Iterator<Item = &str>| -> (Vec<String>, Option<String>) {
        let mut value = None;
        let mut kept = Vec::new();
        for pair in pairs {
            match pair.strip_prefix(&prefix) {
                Some(v) => value = Some(v.to_owned()),
                None => kept.push(pair.to_owned()),
            }
        }
        (kept, value)
    };
    if let Some((base, query)) = url.split_once('?') {
        let (kept, value) = split(&mut query.split('&'));
        let rest = if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
        return (rest, value);
    }
    if url.contains("://") {
        return (url.to_owned(), None);
    }
    let (kept, value) = split(&mut url.split_whitespace());
    (kept.join(" "), value)
}

fn with_parameter(url: &str, name: &str, value: &str) -> String {
    if url.contains("://") {
        let joiner = if url.contains('?') { '&' } else { '?' };
        format!("{url}{joiner}{name}={value}")
    } else {
        format!("{url} {name}={value}")
    }
}

/// The TLS client of the store's connections.
#[derive(Clone)]
pub(super) struct Rustls {
    config: Arc<rustls::ClientConfig>,
}

impl Rustls {
    fn new(root_cert: Option<&str>) -> Result<Rustls, StoreError> {
        let mut roots = rustls::RootCertStore::empty();
        if root_cert.is_none() {
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        }
        if let Some(path) = root_cert {
            let bad = |why: String| StoreError::Io(format!("sslrootcert {path}: {why}"));
            let mut found = 0;
            for cert in CertificateDer::pem_file_iter(path).map_err(|e| bad(e.to_string()))? {
                roots.add(cert.map_err(|e| bad(e.to_string()))?).map_err(|e| bad(e.to_string()))?;
                found += 1;
            }
            if found == 0 {
                return Err(bad("no certificate in the file".into()));
            }
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| StoreError::Io(format!("TLS to PostgreSQL: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Rustls { config: Arc::new(config) })
    }
}

impl<S> MakeTlsConnect<S> for Rustls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = Stream<S>;
    type TlsConnect = Connect;
    type Error = rustls::pki_types::InvalidDnsNameError;

    fn make_tls_connect(&mut self, host: &str) -> Result<Connect, Self::Error> {
        Ok(Connect { config: self.config.clone(), name: ServerName::try_from(host.to_owned())? })
    }
}

/// One connection's handshake, with the name its certificate must carry.
pub(super) struct Connect {
    config: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
}

impl<S> TlsConnect<S> for Connect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = Stream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Stream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let connector = tokio_rustls::TlsConnector::from(self.config);
            Ok(Stream(connector.connect(self.name, stream).await?))
        })
    }
}

/// An encrypted connection.
pub(super) struct Stream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Stream<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Stream<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> tokio_postgres::tls::TlsStream for Stream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        // SCRAM then authenticates without binding to the channel; the certificate check is what binds it.
        ChannelBinding::none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_says_when_to_encrypt() {
        let plain = Endpoint::parse("postgres://caisse:pw@db.internal:5432/caisse").unwrap();
        assert!(plain.tls.is_none());
        let prefer = Endpoint::parse("postgres://caisse@db/caisse?sslmode=prefer").unwrap();
        assert!(prefer.tls.is_none(), "prefer allows plain connections: no TLS is asked");
        for mode in ["require", "verify-ca", "verify-full"] {
            let url = format!("postgres://caisse@db/caisse?application_name=x&sslmode={mode}");
            let endpoint = Endpoint::parse(&url).unwrap();
            assert!(endpoint.tls.is_some(), "{mode}");
            assert_eq!(endpoint.config.get_ssl_mode(), SslMode::Require);
            assert_eq!(endpoint.config.get_application_name(), Some("x"));
        }
        let kv = Endpoint::parse("host=db user=caisse sslmode=verify-full").unwrap();
        assert!(kv.tls.is_some());
    }

    #[test]
    fn a_root_certificate_must_be_readable_and_wanted() {
        let missing = Endpoint::parse("postgres://db/caisse?sslmode=require&sslrootcert=/nonexistent/ca.pem");
        assert!(matches!(missing, Err(StoreError::Io(ref e)) if e.contains("/nonexistent/ca.pem")));
        let unwanted = Endpoint::parse("postgres://db/caisse?sslrootcert=/etc/ca.pem");
        assert!(matches!(unwanted, Err(StoreError::Io(ref e)) if e.contains("sslmode")));
        assert!(Endpoint::parse("postgres://db/caisse?sslmode=sometimes").is_err());
    }

    #[test]
    fn parameters_are_taken_out_of_either_form() {
        assert_eq!(
            take_parameter("postgres://h/d?a=1&sslrootcert=/x.pem&b=2", "sslrootcert"),
            ("postgres://h/d?a=1&b=2".to_owned(), Some("/x.pem".to_owned()))
        );
        assert_eq!(take_parameter("postgres://h/d?sslmode=require", "sslmode").0, "postgres://h/d");
        assert_eq!(
            take_parameter("host=h sslmode=require user=u", "sslmode"),
            ("host=h user=u".to_owned(), Some("require".to_owned()))
        );
    }
}
