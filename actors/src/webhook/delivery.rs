//! The webhook delivery pool's handle: it starts the dispatcher and the delivery actors and is what the rest
//! of the engine holds.
//!
//! One dispatcher actor ([`super::dispatcher`]) decides what is sent when; a supervised delivery actor per
//! Arbiter ([`super::worker`]) makes the attempts. The dispatcher learns of notifications from the store's feed
//! and from its scans of the due index, and hands each to the delivery actor of its merchant's shard; the
//! delivery actor reports back once the attempt's outcome is persisted, so no notification has two attempts
//! at once. The messages between them are in [`super::messages`], the pool's settings in [`super::config`].

use std::path::PathBuf;
use std::sync::Arc;

use actix::prelude::*;

pub use super::config::{DeliveryConfig, DeliveryError};
use super::dispatcher::Dispatcher;
use super::messages::{InFlightCount, Resend};
use super::schedule::AttemptOutcome;
use super::worker::Worker;
use crate::domain::ids::{new_id, IdKind};
use crate::domain::money::{Amount, Currency};
use crate::domain::records::{ProviderCode, WebhookData};
use crate::domain::text::Metadata;
use crate::domain::time::Timestamp;
use crate::store::Store;

/// Handle on the running pool.
pub struct WebhookPool {
    dispatcher: Addr<Dispatcher>,
    arbiters: Vec<Arbiter>,
    config: Arc<DeliveryConfig>,
    tls: Arc<rustls::ClientConfig>,
}

impl Drop for WebhookPool {
    fn drop(&mut self) {
        for arbiter in &self.arbiters {
            arbiter.stop();
        }
    }
}

impl WebhookPool {
    /// Starts the dispatcher and the delivery actors, each on an Arbiter of its own. Needs a running actix
    /// System.
    pub fn start(store: Arc<dyn Store>, config: DeliveryConfig) -> Result<WebhookPool, DeliveryError> {
        // awc builds a default rustls config on its own and panics without a process-wide provider.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let tls = Arc::new(tls_config(config.extra_roots_pem.as_ref())?);
        let config = Arc::new(config);
        let workers = match config.workers {
            0 => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2),
            n => n,
        };
        // The dispatcher's address is made first, as each delivery actor reports to it; its mailbox is handed to
        // its own Arbiter once the delivery actors' addresses are known.
        let (sender, mailbox) = actix::dev::channel::channel::<Dispatcher>(16);
        let dispatcher_addr = Addr::new(sender);
        let mut arbiters = Vec::with_capacity(workers + 1);
        let mut addrs = Vec::with_capacity(workers);
        for _ in 0..workers {
            let arbiter = Arbiter::new();
            let (outbox, accounts, config, tls) = (store.clone(), store.clone(), config.clone(), tls.clone());
            let dispatcher = dispatcher_addr.clone().recipient();
            let addr = Supervisor::start_in_arbiter(&arbiter.handle(), move |_| {
                Worker::new(outbox, accounts, config, tls, dispatcher)
            });
            addrs.push(addr.recipient());
            arbiters.push(arbiter);
        }
        let feed = store.outbox_feed();
        let dispatcher = Dispatcher::new(store.clone(), store, config.clone(), addrs, feed);
        // A thread of its own: the dispatcher's scans read the store synchronously, and on PostgreSQL a database
        // that does not answer holds a read for up to its time-out. Only the dispatcher waits then, not what
        // else runs on the caller's thread (the server's signal handling, the sweep, the admin API).
        let arbiter = Arbiter::new();
        let started = arbiter.spawn_fn(move || {
            Context::with_receiver(mailbox).run(dispatcher);
        });
        arbiters.push(arbiter);
        if !started {
            // The delivery actors' threads go with it: no pool holds them.
            for arbiter in &arbiters {
                arbiter.stop();
            }
            return Err(DeliveryError::Stopped);
        }
        Ok(WebhookPool { dispatcher: dispatcher_addr, arbiters, config, tls })
    }

    /// Sends one signed test notification to `url` now, by the rules of every delivery (both signatures, the
    /// production URL checks, the time-out, no redirect followed), and answers how the attempt went. It is not
    /// stored and never retried: it moves no money and tells of nothing that happened. Runs on the caller's
    /// thread (the dashboard's), which needs a running actix System.
    pub async fn send_test(&self, url: &str, secret_key: &str) -> (TestEvent, AttemptOutcome) {
        let event = TestEvent::new();
        let outcome = super::worker::attempt(
            super::worker::delivery_client(self.tls.clone(), &self.config, 1),
            url.to_owned(),
            secret_key.to_owned(),
            event.id.clone(),
            event.body.clone(),
            self.config.clone(),
        )
        .await;
        (event, outcome)
    }

    /// Where this pool takes resends ([`Engine::resend_notification`](crate::Engine::resend_notification)
    /// sends them, here or on the node that delivers the merchant's notifications).
    pub(crate) fn resender(&self) -> Recipient<Resend> {
        self.dispatcher.clone().recipient()
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

/// The event of a test notification: not one of the API's events, so a receiver that acts on events by name
/// does nothing with it, and a body of the usual shape, so a receiver's parser and both signature checks are
/// tried for real.
pub const TEST_EVENT: &str = "webhook.test";

/// One test notification: its `evt_` id and the exact body sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestEvent {
    pub id: String,
    pub body: String,
}

impl TestEvent {
    fn new() -> TestEvent {
        #[derive(serde::Serialize)]
        struct Body {
            event: &'static str,
            created_at: Timestamp,
            data: WebhookData,
        }
        let id = new_id(IdKind::Event);
        // Eleven fields like every notification's `data`, naming nothing real: a zero amount, status `test`.
        let data = WebhookData {
            reference: "test".into(),
            transaction_id: id.replacen("evt_", "tx_", 1),
            provider: ProviderCode::test_event(),
            amount: Amount::ZERO,
            currency: Currency::XOF,
            fee: Amount::ZERO,
            net_amount: Amount::ZERO,
            status: "test".into(),
            customer_email: None,
            metadata: Metadata::empty(),
            paid_at: None,
            refunded_amount: None,
        };
        let body = Body { event: TEST_EVENT, created_at: Timestamp::now(), data };
        // Plain strings and integers always serialize; an empty body would simply fail the receiver's check.
        TestEvent { id, body: serde_json::to_string(&body).unwrap_or_default() }
    }
}
