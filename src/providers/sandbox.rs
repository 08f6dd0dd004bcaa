//! The sandbox simulator: plays every configured provider, through the same path a real one uses.
//!
//! When Caisse asks it to collect a payment, it answers like a provider would: a signed notice "processing",
//! then after `delay_ms` a final notice, sent over HTTP to this server's own
//! `POST /v1/fournisseurs/{code}/notifications`. The notice handler authenticates it, confirms it with a
//! status query (answered from [`Simulator::known`]) and only then applies it. The outcome is chosen by the
//! last two digits of the phone number (contract 13):
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

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use actix_web::http::header::HeaderMap;
use caisse_engine::domain::records::{Payment, Payout, Refund};
use caisse_engine::domain::time::Timestamp;
use dashmap::DashMap;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use super::{Adapter, LocalFuture, Notice, ProviderError, ProviderStatus, Subject};

pub const SIGNATURE_HEADER: &str = "X-Sandbox-Signature";
pub const TIMESTAMP_HEADER: &str = "X-Sandbox-Timestamp";
/// Notices older or newer than this are refused, as merchants are told to do with webhooks (spec 5.2).
const TOLERANCE_S: u64 = 300;
/// Attempts to deliver one notice to our own endpoint before giving up (the TTL sweep then settles it).
const NOTICE_ATTEMPTS: u32 = 5;

pub struct Simulator {
    secret: String,
    delay_ms: u64,
    ttl_ms: u64,
    /// Where this server listens, known once it is bound.
    base_url: OnceLock<String>,
    /// What the simulated provider knows, by our transaction id; entries leave once their story is told.
    known: Arc<DashMap<String, ProviderStatus>>,
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
        Simulator { secret, delay_ms, ttl_ms, base_url: OnceLock::new(), known: Arc::new(DashMap::new()) }
    }

    /// Tells the simulator where to send its notices (this server's own address).
    pub fn set_base_url(&self, url: String) {
        let _ = self.base_url.set(url);
    }

    fn script(&self, provider: &str, subject: Subject, transaction_id: &str, steps: Vec<(u64, ProviderStatus, u32)>) {
        let Some(base) = self.base_url.get().cloned() else {
            tracing::warn!("sandbox simulator has no address yet; the TTL sweep will settle {transaction_id}");
            return;
        };
        let url = format!("{base}/v1/fournisseurs/{provider}/notifications");
        let secret = self.secret.clone();
        let tx = transaction_id.to_owned();
        let known = self.known.clone();
        known.insert(tx.clone(), ProviderStatus::Pending);
        actix_web::rt::spawn(async move {
            for (wait_ms, status, times) in steps {
                actix_web::rt::time::sleep(Duration::from_millis(wait_ms)).await;
                known.insert(tx.clone(), status.clone());
                let notice = Notice { subject, transaction_id: tx.clone(), status };
                for _ in 0..times {
                    send_notice(&url, &secret, &notice).await;
                }
            }
            known.remove(&tx);
        });
    }
}

thread_local! {
    /// One client per actix thread (awc is `!Send`), so notices reuse connections instead of opening one each.
    static CLIENT: awc::Client = awc::Client::builder().disable_redirects().finish();
}

async fn send_notice(url: &str, secret: &str, notice: &Notice) {
    let Ok(body) = serde_json::to_vec(notice) else { return };
    for attempt in 0..NOTICE_ATTEMPTS {
        let timestamp = Timestamp::now().unix_s();
        let signature = sign(secret, timestamp, &body);
        let sent = CLIENT
            .with(|client| client.clone())
            .post(url)
            .insert_header(("Content-Type", "application/json"))
            .insert_header((TIMESTAMP_HEADER, timestamp.to_string()))
            .insert_header((SIGNATURE_HEADER, signature))
            .timeout(Duration::from_secs(10))
            .send_body(body.clone())
            .await;
        match sent {
            Ok(response) if response.status().is_success() => return,
            Ok(response) => {
                tracing::debug!(status = %response.status(), tx = %notice.transaction_id, "sandbox notice refused")
            }
            Err(e) => tracing::debug!(error = %e, tx = %notice.transaction_id, "sandbox notice not delivered"),
        }
        actix_web::rt::time::sleep(Duration::from_millis(200 << attempt)).await;
    }
}

fn ending(phone: &str) -> &str {
    phone.get(phone.len().saturating_sub(2)..).unwrap_or("")
}

impl Adapter for Simulator {
    fn request_to_pay(&self, payment: &Payment) -> LocalFuture<Result<(), ProviderError>> {
        let d = self.delay_ms;
        let processing = (d / 4, ProviderStatus::Processing, 1);
        let steps = match ending(payment.client_telephone.as_str()) {
            "01" => vec![processing, (d, ProviderStatus::Failed { code: "insufficient_funds".into() }, 1)],
            // Never answers: the status stays "processing" until the TTL sweep expires the payment, and the
            // entry is forgotten only after that sweep has had time to ask.
            "02" => vec![processing, (self.ttl_ms + 2 * d.max(1_000), ProviderStatus::Processing, 0)],
            "03" => vec![processing, (d, ProviderStatus::Succeeded, 3)],
            "04" => vec![processing, (self.ttl_ms + d.max(1_000), ProviderStatus::Succeeded, 1)],
            _ => vec![processing, (d, ProviderStatus::Succeeded, 1)],
        };
        self.script(payment.fournisseur.as_str(), Subject::Payment, &payment.transaction_id, steps);
        Box::pin(async { Ok(()) })
    }

    fn status(&self, _subject: Subject, transaction_id: &str) -> LocalFuture<Result<ProviderStatus, ProviderError>> {
        let status = self.known.get(transaction_id).map(|s| s.clone()).unwrap_or(ProviderStatus::Pending);
        Box::pin(async move { Ok(status) })
    }

    fn refund(&self, payment: &Payment, refund: &Refund) -> LocalFuture<Result<(), ProviderError>> {
        let steps = vec![(self.delay_ms, ProviderStatus::Succeeded, 1)];
        self.script(payment.fournisseur.as_str(), Subject::Refund, &refund.transaction_id(), steps);
        Box::pin(async { Ok(()) })
    }

    fn payout(&self, payout: &Payout) -> LocalFuture<Result<(), ProviderError>> {
        let outcome = match ending(payout.beneficiaire_telephone.as_str()) {
            "01" => ProviderStatus::Failed { code: "beneficiary_rejected".into() },
            _ => ProviderStatus::Succeeded,
        };
        self.script(
            payout.fournisseur.as_str(),
            Subject::Payout,
            &payout.transaction_id,
            vec![(self.delay_ms, outcome, 1)],
        );
        Box::pin(async { Ok(()) })
    }

    fn parse_notice(&self, headers: &HeaderMap, body: &[u8]) -> Result<Notice, ProviderError> {
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
