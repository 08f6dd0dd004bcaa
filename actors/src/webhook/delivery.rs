//! The webhook delivery pool: its configuration, its handle, and the messages between its actors.
//!
//! One dispatcher actor ([`super::dispatcher`]) decides what is sent when; a supervised delivery actor per
//! Arbiter ([`super::worker`]) makes the attempts. The dispatcher learns of notifications from the store's feed
//! and from its scans of the due index, and hands each to the delivery actor of its merchant's shard; the
//! delivery actor reports back once the attempt's outcome is persisted, so no notification has two attempts
//! at once. [`WebhookPool`] starts them all and is the handle the rest of the engine holds.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;

use super::dispatcher::Dispatcher;
use super::schedule::RetrySchedule;
use super::worker::Worker;
use crate::domain::ids::MerchantId;
use crate::domain::records::Notification;
use crate::store::{Store, StoreError};

/// Tuning of the pool; [`DeliveryConfig::default`] is the production setting.
#[derive(Debug, Clone)]
pub struct DeliveryConfig {
    /// Contract 12's production rules: https only, no private or loopback addresses, checked at delivery.
    pub production: bool,
    pub schedule: RetrySchedule,
    /// The whole attempt (connect, TLS, headers, body) must finish within this (spec 4.1: 10 s).
    pub timeout: Duration,
    /// Delivery actors; 0 means one per core.
    pub workers: usize,
    pub max_in_flight_per_worker: usize,
    pub max_per_host: usize,
    /// Bound for a host whose last attempt timed out or could not connect.
    pub max_per_slow_host: usize,
    /// Deliveries waiting for a busy host, per worker; beyond it they wait in the store for the next scan.
    pub max_waiting_per_worker: usize,
    pub scan_every: Duration,
    /// Extra trust anchors (PEM), for receivers behind an internal CA (and the tests' self-signed one).
    pub extra_roots_pem: Option<PathBuf>,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            production: false,
            schedule: RetrySchedule::default(),
            timeout: Duration::from_secs(10),
            workers: 0,
            max_in_flight_per_worker: 2_048,
            max_per_host: 128,
            max_per_slow_host: 2,
            max_waiting_per_worker: 50_000,
            scan_every: Duration::from_millis(500),
            extra_roots_pem: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeliveryError {
    #[error("TLS setup: {0}")]
    Tls(String),
    #[error("no such notification")]
    NotFound,
    #[error("this notification is being delivered right now")]
    InFlight,
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the delivery pool stopped")]
    Stopped,
}

/// Handle on the running pool.
pub struct WebhookPool {
    dispatcher: Addr<Dispatcher>,
    arbiters: Vec<Arbiter>,
}

impl Drop for WebhookPool {
    fn drop(&mut self) {
        for arbiter in &self.arbiters {
            arbiter.stop();
        }
    }
}

impl WebhookPool {
    /// Starts the dispatcher on the current Arbiter and the delivery actors on their own. Needs a running
    /// actix System.
    pub fn start(store: Arc<dyn Store>, config: DeliveryConfig) -> Result<WebhookPool, DeliveryError> {
        // awc builds a default rustls config on its own and panics without a process-wide provider.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let tls = Arc::new(tls_config(config.extra_roots_pem.as_ref())?);
        let config = Arc::new(config);
        let workers = match config.workers {
            0 => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2),
            n => n,
        };
        let dispatcher_ctx = Context::<Dispatcher>::new();
        let dispatcher_addr = dispatcher_ctx.address();
        let mut arbiters = Vec::with_capacity(workers);
        let mut addrs = Vec::with_capacity(workers);
        for _ in 0..workers {
            let arbiter = Arbiter::new();
            let (store, config, tls, dispatcher) =
                (store.clone(), config.clone(), tls.clone(), dispatcher_addr.clone());
            let addr =
                Supervisor::start_in_arbiter(&arbiter.handle(), move |_| Worker::new(store, config, tls, dispatcher));
            addrs.push(addr);
            arbiters.push(arbiter);
        }
        let dispatcher = Dispatcher::new(store.clone(), config, addrs, store.outbox_feed());
        let dispatcher = dispatcher_ctx.run(dispatcher);
        Ok(WebhookPool { dispatcher, arbiters })
    }

    /// Sends a notification of `merchant` again, starting a new attempt chain (the dashboard's resend button).
    /// Another merchant's id is [`DeliveryError::NotFound`].
    pub async fn resend(&self, merchant: &MerchantId, id: &str) -> Result<Notification, DeliveryError> {
        let msg = Resend { merchant: merchant.clone(), id: id.to_owned() };
        self.dispatcher.send(msg).await.map_err(|_| DeliveryError::Stopped)?
    }

    /// Notifications currently handed to a delivery actor.
    pub async fn in_flight(&self) -> usize {
        self.dispatcher.send(InFlightCount).await.unwrap_or(0)
    }
}

fn tls_config(extra: Option<&PathBuf>) -> Result<rustls::ClientConfig, DeliveryError> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = extra {
        let certs =
            CertificateDer::pem_file_iter(path).map_err(|e| DeliveryError::Tls(format!("{}: {e}", path.display())))?;
        for cert in certs {
            let cert = cert.map_err(|e| DeliveryError::Tls(format!("{}: {e}", path.display())))?;
            roots.add(cert).map_err(|e| DeliveryError::Tls(format!("{}: {e}", path.display())))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| DeliveryError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

// ----- messages -----

#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct Fresh(pub(super) Notification);

#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct Deliver(pub(super) Notification);

/// The attempt on `0` is persisted (or given up); the dispatcher may schedule it again.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct Settled(pub(super) String);

#[derive(Message)]
#[rtype(result = "Result<Notification, DeliveryError>")]
pub(super) struct Resend {
    pub(super) merchant: MerchantId,
    pub(super) id: String,
}

#[derive(Message)]
#[rtype(result = "usize")]
pub(super) struct InFlightCount;
