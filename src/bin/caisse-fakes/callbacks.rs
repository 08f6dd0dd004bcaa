//! The callback sender: delivers the final-state callbacks the provider modules prepare.
//!
//! Providers build [`Outgoing`] requests (URL, method, body, headers, delay) while they hold the state lock,
//! and push them into a bounded channel; this module owns the one awc client (awc is `!Send`, so it lives on
//! the main arbiter's thread) and sends each on its own task. Every delivery has a 5 s timeout and at most 3
//! attempts; at most [`IN_FLIGHT_MAX`] deliveries run at once; a full channel drops the callback with a log
//! line rather than growing without bound (a real provider's callback can be lost too).
//!
//! [`plan`] turns the `callbacks` knob into the list of deliveries for one final transaction.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use awc::http::Method;
use tokio::sync::{mpsc, Semaphore};

use crate::knobs::CallbackMode;

/// Callbacks waiting to be sent; beyond this the newest is dropped.
pub const QUEUE_MAX: usize = 1024;
/// Deliveries under way at once.
const IN_FLIGHT_MAX: usize = 32;
const ATTEMPTS_MAX: u32 = 3;
const TIMEOUT: Duration = Duration::from_secs(5);
const RETRY_DELAY: Duration = Duration::from_millis(500);
/// How long after the final state a `late` callback leaves.
pub const LATE_DELAY_MS: u64 = 2000;
/// The gap between the two deliveries of `duplicate` and `out_of_order`.
const SECOND_DELAY_MS: u64 = 100;

/// One HTTP request to send to a callback URL.
#[derive(Clone, Debug)]
pub struct Outgoing {
    pub url: String,
    pub method: Method,
    pub body: Vec<u8>,
    /// Besides Content-Type (always application/json) and Content-Length (set by awc).
    pub headers: Vec<(String, String)>,
    pub delay_ms: u64,
}

/// Which body a delivery carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// The transaction as it is.
    Final,
    /// Claims success whatever happened (and, for pawaPay, carries a signature that does not verify).
    Forged,
    /// An earlier, non-final status, sent after the final one.
    Stale,
}

/// The deliveries the `callbacks` knob asks for: `make` renders each variant (`None`: nothing to send).
pub fn plan(mode: CallbackMode, make: impl Fn(Variant) -> Option<Outgoing>) -> Vec<Outgoing> {
    let delayed = |variant, delay_ms| make(variant).map(|o| Outgoing { delay_ms, ..o });
    let list = match mode {
        CallbackMode::Never => vec![],
        CallbackMode::Once => vec![make(Variant::Final)],
        CallbackMode::Late => vec![delayed(Variant::Final, LATE_DELAY_MS)],
        CallbackMode::Duplicate => vec![make(Variant::Final), delayed(Variant::Final, SECOND_DELAY_MS)],
        CallbackMode::Forged => vec![make(Variant::Forged)],
        CallbackMode::OutOfOrder => vec![make(Variant::Final), delayed(Variant::Stale, SECOND_DELAY_MS)],
    };
    list.into_iter().flatten().collect()
}

/// The producer side, shared by the request handlers and the ticker.
#[derive(Clone)]
pub struct Sender(mpsc::Sender<Outgoing>);

impl Sender {
    pub fn send_all(&self, list: Vec<Outgoing>) {
        for outgoing in list {
            if let Err(e) = self.0.try_send(outgoing) {
                tracing::warn!(error = %e, "callback queue full or closed: callback dropped");
            }
        }
    }
}

pub fn channel() -> (Sender, mpsc::Receiver<Outgoing>) {
    let (tx, rx) = mpsc::channel(QUEUE_MAX);
    (Sender(tx), rx)
}

/// Runs until the channel closes; must be spawned on an actix arbiter (awc's client is `!Send`).
pub async fn run(mut queue: mpsc::Receiver<Outgoing>) {
    let client = Rc::new(client());
    let slots = Arc::new(Semaphore::new(IN_FLIGHT_MAX));
    while let Some(outgoing) = queue.recv().await {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let client = client.clone();
        actix_web::rt::spawn(async move {
            deliver(&client, outgoing).await;
            drop(slot);
        });
    }
}

async fn deliver(client: &awc::Client, outgoing: Outgoing) {
    if outgoing.delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(outgoing.delay_ms)).await;
    }
    for attempt in 1..=ATTEMPTS_MAX {
        let mut request = client
            .request(outgoing.method.clone(), outgoing.url.as_str())
            .timeout(TIMEOUT)
            .insert_header(("Content-Type", "application/json"));
        for (name, value) in &outgoing.headers {
            request = request.insert_header((name.as_str(), value.as_str()));
        }
        match request.send_body(outgoing.body.clone()).await {
            Ok(response) if response.status().is_success() => {
                tracing::info!(url = %outgoing.url, attempt, status = %response.status(), "callback delivered");
                return;
            }
            Ok(response) => {
                tracing::warn!(url = %outgoing.url, attempt, status = %response.status(), "callback refused")
            }
            Err(e) => tracing::warn!(url = %outgoing.url, attempt, error = %e, "callback failed"),
        }
        if attempt < ATTEMPTS_MAX {
            tokio::time::sleep(RETRY_DELAY).await;
        }
    }
    tracing::warn!(url = %outgoing.url, "callback abandoned after {ATTEMPTS_MAX} attempts");
}

/// An awc client for http and https callback URLs: rustls with the ring provider and the public web PKI roots.
fn client() -> awc::Client {
    // awc builds a default rustls config of its own and panics without a process-wide provider; installing it
    // twice is harmless.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let connector = awc::Connector::new().timeout(TIMEOUT);
    let connector =
        match rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
        {
            Ok(builder) => connector.rustls_0_23(Arc::new(builder.with_root_certificates(roots).with_no_client_auth())),
            Err(e) => {
                tracing::warn!(error = %e, "no TLS for callbacks: plain http only");
                connector
            }
        };
    awc::Client::builder().connector(connector).disable_redirects().finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(variant: Variant) -> Option<Outgoing> {
        let body = format!("{variant:?}").into_bytes();
        Some(Outgoing { url: "http://x/".into(), method: Method::POST, body, headers: vec![], delay_ms: 0 })
    }

    #[test]
    fn modes_make_the_documented_deliveries() {
        let shape = |mode| {
            plan(mode, out).into_iter().map(|o| (String::from_utf8(o.body).unwrap(), o.delay_ms)).collect::<Vec<_>>()
        };
        assert_eq!(shape(CallbackMode::Never), vec![]);
        assert_eq!(shape(CallbackMode::Once), vec![("Final".into(), 0)]);
        assert_eq!(shape(CallbackMode::Late), vec![("Final".into(), LATE_DELAY_MS)]);
        assert_eq!(shape(CallbackMode::Duplicate), vec![("Final".into(), 0), ("Final".into(), SECOND_DELAY_MS)]);
        assert_eq!(shape(CallbackMode::Forged), vec![("Forged".into(), 0)]);
        assert_eq!(shape(CallbackMode::OutOfOrder), vec![("Final".into(), 0), ("Stale".into(), SECOND_DELAY_MS)]);
    }
}
