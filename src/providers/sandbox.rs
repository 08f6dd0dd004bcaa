//! The sandbox simulator: plays every configured provider, through the same path a real one uses.
//!
//! When Caisse asks it to collect a payment, it answers like a provider would: a signed notice "processing",
//! then after `delay_ms` a final notice, sent over HTTP to this server's own
//! `POST /v1/fournisseurs/{code}/notifications`. The notice handler authenticates it, confirms it with a
//! status query (answered from [`Simulator::known`]) and only then applies it. The outcome is chosen by the
//! last two digits of the phone number (docs/api.md § Providers and the sandbox):
//!
//! | ending | payment | payout |
//! |---|---|---|
//! | `01` | declined, `insufficient_funds` | rejected |
//! | `02` | never answers, ends `expire` | processed |
//! | `03` | succeeds, final notice sent three times | processed |
//! | `04` | no answer until the TTL has passed (`expire`), then a late success | processed |
//! | other | succeeds after `delay_ms` | processed |
//!
//! Refunds always complete after `delay_ms`. Notices are signed with HMAC-SHA256 over `timestamp.body` under
//! the simulator's secret, in `X-Sandbox-Signature: sha256=<hex>` and `X-Sandbox-Timestamp`.
//!
//! Each story is written as [`chaos::Step`]s and run from the [`chaos::Plan`] that the chaos modes make of it
//! (the `sandbox.chaos` setting, or the record's `sandbox_chaos` metadata): notices duplicated, late, out of
//! order, contradicting the provider or lost, while the status a query answers keeps its honest timeline. A story's
//! entry in `known` leaves only once its last notice has been answered, so even a late notice is confirmed
//! against the provider's final status rather than an empty "pending".

use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use actix_web::http::header::HeaderMap;
use actix_web::rt::time::{sleep_until, Instant};
use caisse_engine::domain::provider::ReturnUrl;
use caisse_engine::domain::records::{Payment, Payout, Refund};
use caisse_engine::domain::time::Timestamp;
use caisse_engine::domain::Metadata;
use dashmap::DashMap;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;
use tokio::sync::Semaphore;

use super::chaos::{self, Action, Batch, Chaos, Mode, Step};
use super::{Adapter, LocalFuture, Notice, ProviderError, ProviderStatus, Report, Subject};
use crate::config::{reconcile_every_ms, sweep_every_ms};

pub const SIGNATURE_HEADER: &str = "X-Sandbox-Signature";
pub const TIMESTAMP_HEADER: &str = "X-Sandbox-Timestamp";
/// Notices older or newer than this are refused: the window merchants are told to apply to webhooks
/// (docs/api.md § Webhook signature).
const TOLERANCE_S: u64 = 300;
/// Attempts to deliver one notice to our own endpoint before giving up (the TTL sweep then settles it).
const NOTICE_ATTEMPTS: u32 = 5;
/// Stories told at once. Each is a task holding its plan and, while it sends, an HTTP request to this very
/// server; a server that falls behind its load would otherwise pile them up without limit, gigabytes of them
/// (docs/perf/history.md gives the run). Beyond it a new payment's story is not told, a warning says so, and
/// the TTL sweep settles the payment as the provider's silence deserves (`expire`). Refunds and payouts are
/// told regardless: nothing but a restart would settle them otherwise, and each is bounded by a balance.
const MAX_STORIES: usize = 20_000;

pub struct Simulator {
    secret: String,
    delay_ms: u64,
    ttl_ms: u64,
    /// Chaos modes for records that do not choose their own (`sandbox.chaos`).
    chaos: Chaos,
    /// Where this server listens, known once it is bound.
    base_url: OnceLock<String>,
    /// What the simulated provider knows, by our transaction id; entries leave once their story is told.
    known: Arc<DashMap<String, ProviderStatus>>,
    /// Notices our endpoint has answered 2xx, every copy counted: lets tests see that chaos happened.
    delivered: Arc<AtomicU64>,
    /// Attempts our endpoint answered otherwise (or not at all), each one retried: a duplicate or stale notice
    /// must be acknowledged, so under chaos this stays 0.
    refused: Arc<AtomicU64>,
    /// Payments left without a story since the start, because [`MAX_STORIES`] were being told.
    silenced: AtomicU64,
}

pub fn sign(secret: &str, timestamp: u64, body: &[u8]) -> String {
    // HMAC accepts keys of any length, so this cannot fail; the fallback keeps the code panic-free.
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret.as_bytes()) else { return String::new() };
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

impl Simulator {
    pub fn new(secret: String, delay_ms: u64, ttl_ms: u64) -> Simulator {
        Simulator {
            secret,
            delay_ms,
            ttl_ms,
            chaos: Chaos::OFF,
            base_url: OnceLock::new(),
            known: Arc::new(DashMap::new()),
            delivered: Arc::new(AtomicU64::new(0)),
            refused: Arc::new(AtomicU64::new(0)),
            silenced: AtomicU64::new(0),
        }
    }

    /// The chaos modes of records whose metadata does not choose.
    pub fn with_chaos(mut self, chaos: Chaos) -> Simulator {
        self.chaos = chaos;
        self
    }

    /// Tells the simulator where to send its notices (this server's own address).
    pub fn set_base_url(&self, url: String) {
        let _ = self.base_url.set(url);
    }

    /// Stories still being told: once 0, no notice is on its way or still to come.
    pub fn stories_in_flight(&self) -> usize {
        self.known.len()
    }

    /// Notices answered 2xx by our endpoint since the start, every copy counted.
    pub fn notices_delivered(&self) -> u64 {
        self.delivered.load(Ordering::Relaxed)
    }

    /// Notice attempts not answered 2xx since the start (each was retried, up to a bound).
    pub fn notices_refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Runs one story for `transaction_id`: the provider's status changes on time, the notices follow the plan
    /// that the record's chaos modes make of it.
    fn tell(&self, provider: &str, subject: Subject, transaction_id: &str, metadata: &Metadata, steps: Vec<Step>) {
        let Some(base) = self.base_url.get().cloned() else {
            tracing::warn!("sandbox simulator has no address yet; the TTL sweep will settle {transaction_id}");
            return;
        };
        if subject == Subject::Payment && self.known.len() >= MAX_STORIES {
            // One line per thousand, so an overloaded server does not also flood its log.
            let silenced = self.silenced.fetch_add(1, Ordering::Relaxed) + 1;
            if silenced % 1_000 == 1 {
                tracing::warn!(
                    tx = %transaction_id,
                    silenced,
                    "sandbox simulator is telling {MAX_STORIES} stories already; payments beyond stay silent and the TTL sweep settles them"
                );
            }
            return;
        }
        let chaos = self.chaos.for_metadata(metadata, transaction_id);
        let mut steps = steps;
        if chaos.has(Mode::Lost) {
            // No notice will tell Caisse, so the final status stays known until its own status queries have
            // had time to ask: the TTL sweep for a payment, a reconciliation round for a refund or a payout.
            if let Some(last) = steps.last().cloned() {
                let keep_ms = self.ttl_ms + 2 * reconcile_every_ms(self.ttl_ms);
                steps.push(Step::new(last.at_ms.saturating_add(keep_ms), last.status, 0));
            }
        }
        let plan = chaos::plan(&steps, chaos, chaos::late_ms(self.delay_ms));
        if !chaos.is_off() {
            tracing::debug!(tx = %transaction_id, %chaos, notices = plan.notice_count(), "sandbox chaos");
        }
        let target = Target {
            url: format!("{base}/v1/fournisseurs/{provider}/notifications"),
            secret: self.secret.clone(),
            subject,
            transaction_id: transaction_id.to_owned(),
            delivered: self.delivered.clone(),
            refused: self.refused.clone(),
        };
        let known = self.known.clone();
        known.insert(target.transaction_id.clone(), ProviderStatus::Pending);
        let target = Arc::new(target);
        actix_web::rt::spawn(async move {
            let started = Instant::now();
            let mut sending = Vec::new();
            for event in plan.events {
                // A TTL too large for the clock ends the story instead of panicking; the sweep settles the rest.
                let Some(due) = started.checked_add(Duration::from_millis(event.at_ms)) else { break };
                sleep_until(due).await;
                match event.action {
                    Action::Status(status) => {
                        known.insert(target.transaction_id.clone(), status);
                    }
                    // Sent apart so that a slow or retried notice never delays the provider's own timeline.
                    Action::Send(batches) => sending.push(actix_web::rt::spawn(send_batches(target.clone(), batches))),
                }
            }
            for handle in sending {
                let _ = handle.await;
            }
            known.remove(&target.transaction_id);
        });
    }
}

/// Where one story's notices go, and what they are about.
struct Target {
    url: String,
    secret: String,
    subject: Subject,
    transaction_id: String,
    delivered: Arc<AtomicU64>,
    refused: Arc<AtomicU64>,
}

/// Sends batches in order; within one, the first `burst` copies leave together, then the rest one by one.
async fn send_batches(target: Arc<Target>, batches: Vec<Batch>) {
    for batch in batches {
        let notice =
            Notice { subject: target.subject, transaction_id: target.transaction_id.clone(), status: batch.status };
        let burst = batch.burst.min(batch.copies);
        let together: Vec<_> = (0..burst)
            .map(|_| {
                let (target, notice) = (target.clone(), notice.clone());
                actix_web::rt::spawn(async move { send_notice(&target, &notice).await })
            })
            .collect();
        for handle in together {
            let _ = handle.await;
        }
        for _ in burst..batch.copies {
            send_notice(&target, &notice).await;
        }
    }
}

thread_local! {
    /// One client per actix thread (awc is `!Send`), so notices reuse connections instead of opening one each.
    static CLIENT: awc::Client = awc::Client::builder().disable_redirects().finish();
    /// Notices of this thread being sent at once: see [`NOTICES_IN_FLIGHT`].
    static NOTICE_SLOTS: Rc<Semaphore> = Rc::new(Semaphore::new(NOTICES_IN_FLIGHT));
}

/// Notices one actix thread sends at once. Past awc's own connection limit a request waits in its pool
/// already built, a few kilobytes each; when the server falls behind its load thousands of stories reached
/// that point together, hundreds of MiB of resident memory under `wrk` on `POST /v1/paiement/initier`
/// (docs/perf/history.md). A notice waiting here holds only its story's plan.
const NOTICES_IN_FLIGHT: usize = 64;

async fn send_notice(target: &Target, notice: &Notice) {
    let Ok(body) = serde_json::to_vec(notice) else { return };
    let slots = NOTICE_SLOTS.with(Rc::clone);
    for attempt in 0..NOTICE_ATTEMPTS {
        // The semaphore is never closed; a slot is held for one attempt, not across the pause before the next.
        let Ok(slot) = slots.acquire().await else { return };
        let timestamp = Timestamp::now().unix_s();
        let signature = sign(&target.secret, timestamp, &body);
        let sent = CLIENT
            .with(|client| client.clone())
            .post(&target.url)
            .insert_header(("Content-Type", "application/json"))
            .insert_header((TIMESTAMP_HEADER, timestamp.to_string()))
            .insert_header((SIGNATURE_HEADER, signature))
            .timeout(Duration::from_secs(10))
            .send_body(body.clone())
            .await;
        match sent {
            Ok(response) if response.status().is_success() => {
                target.delivered.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Ok(response) => {
                tracing::debug!(status = %response.status(), tx = %notice.transaction_id, "sandbox notice refused")
            }
            Err(e) => tracing::debug!(error = %e, tx = %notice.transaction_id, "sandbox notice not delivered"),
        }
        target.refused.fetch_add(1, Ordering::Relaxed);
        drop(slot);
        actix_web::rt::time::sleep(Duration::from_millis(200 << attempt)).await;
    }
}

fn ending(phone: &str) -> &str {
    phone.get(phone.len().saturating_sub(2)..).unwrap_or("")
}

impl Adapter for Simulator {
    fn request_to_pay(&self, payment: &Payment) -> LocalFuture<Result<Option<ReturnUrl>, ProviderError>> {
        let d = self.delay_ms;
        // The sweep expires a payment up to one pass after its TTL; answers meant to come "after the expiry"
        // wait for that pass too, so `04` really goes through `expire` first.
        let expired_ms = self.ttl_ms + sweep_every_ms(self.ttl_ms) + d.max(1_000);
        let processing = Step::new(d / 4, ProviderStatus::Processing, 1);
        let steps = match ending(payment.customer_phone.as_str()) {
            "01" => vec![processing, Step::new(d, ProviderStatus::Failed { code: "insufficient_funds".into() }, 1)],
            // Never answers: the status stays "processing" until the TTL sweep expires the payment, and the
            // entry is forgotten only after that sweep has had time to ask.
            "02" => vec![processing, Step::new(expired_ms + d.max(1_000), ProviderStatus::Processing, 0)],
            "03" => vec![processing, Step::new(d, ProviderStatus::Succeeded, 3)],
            "04" => vec![processing, Step::new(expired_ms, ProviderStatus::Succeeded, 1)],
            _ => vec![processing, Step::new(d, ProviderStatus::Succeeded, 1)],
        };
        self.tell(payment.provider.as_str(), Subject::Payment, &payment.transaction_id, &payment.metadata, steps);
        Box::pin(async { Ok(None) })
    }

    fn status(
        &self,
        _subject: Subject,
        transaction_id: &str,
        _payment: Option<&Payment>,
    ) -> LocalFuture<Result<Report, ProviderError>> {
        let status = self.known.get(transaction_id).map(|s| s.clone()).unwrap_or(ProviderStatus::Pending);
        Box::pin(async move { Ok(status.into()) })
    }

    /// A refund follows its payment's chaos modes: refunds carry no metadata of their own.
    fn refund(&self, payment: &Payment, refund: &Refund) -> LocalFuture<Result<(), ProviderError>> {
        let steps = vec![Step::new(self.delay_ms, ProviderStatus::Succeeded, 1)];
        let tx = refund.transaction_id();
        self.tell(payment.provider.as_str(), Subject::Refund, &tx, &payment.metadata, steps);
        Box::pin(async { Ok(()) })
    }

    fn payout(&self, payout: &Payout) -> LocalFuture<Result<(), ProviderError>> {
        let outcome = match ending(payout.beneficiary_phone.as_str()) {
            "01" => ProviderStatus::Failed { code: "beneficiary_rejected".into() },
            _ => ProviderStatus::Succeeded,
        };
        let steps = vec![Step::new(self.delay_ms, outcome, 1)];
        self.tell(payout.provider.as_str(), Subject::Payout, &payout.transaction_id, &payout.metadata, steps);
        Box::pin(async { Ok(()) })
    }

    fn parse_notice(
        &self,
        headers: &HeaderMap,
        _path_token: Option<&str>,
        body: &[u8],
    ) -> Result<Notice, ProviderError> {
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .ok_or_else(|| ProviderError::Unauthenticated(format!("missing {name}")))
        };
        let timestamp: u64 = header(TIMESTAMP_HEADER)?
            .parse()
            .map_err(|_| ProviderError::Unauthenticated(format!("{TIMESTAMP_HEADER} is not a number")))?;
        let expected = sign(&self.secret, timestamp, body);
        let given = header(SIGNATURE_HEADER)?;
        if !bool::from(expected.as_bytes().ct_eq(given.as_bytes())) {
            return Err(ProviderError::Unauthenticated("bad signature".into()));
        }
        if Timestamp::now().unix_s().abs_diff(timestamp) > TOLERANCE_S {
            return Err(ProviderError::Unauthenticated("stale timestamp".into()));
        }
        serde_json::from_slice(body).map_err(|e| ProviderError::Malformed(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::sync::atomic::AtomicBool;
    use std::time::Instant as StdInstant;

    use super::*;

    /// A provider endpoint that accepts connections and never answers: every notice sent to it stays in
    /// flight until its 10 s timeout, so the connections it accepted are the notices in flight.
    fn silent_endpoint() -> (String, Arc<AtomicU64>, Arc<AtomicBool>, std::thread::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let address = listener.local_addr().expect("address");
        listener.set_nonblocking(true).expect("nonblocking");
        let (accepted, stop) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
        let (counter, stopped) = (accepted.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut held = Vec::new();
            while !stopped.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        counter.fetch_add(1, Ordering::Relaxed);
                        held.push(stream);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        (format!("http://{address}"), accepted, stop, thread)
    }

    #[actix_web::test]
    async fn a_thread_sends_at_most_its_bound_of_notices_at_once() {
        let (base, accepted, stop, thread) = silent_endpoint();
        let simulator = Simulator::new("secret".into(), 0, 60_000);
        simulator.set_base_url(base);
        let stories = 3 * NOTICES_IN_FLIGHT;
        for i in 0..stories {
            let steps = vec![Step::new(0, ProviderStatus::Processing, 1)];
            simulator.tell("mtn_momo", Subject::Payment, &format!("tx_{i}"), &Metadata::default(), steps);
        }
        assert_eq!(simulator.stories_in_flight(), stories);
        // Long enough for every story to reach its send (they are due at once), well within the 10 s timeout.
        let started = StdInstant::now();
        while accepted.load(Ordering::Relaxed) < NOTICES_IN_FLIGHT as u64 && started.elapsed() < Duration::from_secs(5)
        {
            actix_web::rt::time::sleep(Duration::from_millis(20)).await;
        }
        actix_web::rt::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(accepted.load(Ordering::Relaxed), NOTICES_IN_FLIGHT as u64, "one connection per notice in flight");
        stop.store(true, Ordering::Relaxed);
        thread.join().expect("endpoint thread");
    }
}
