//! The late-success watch: payments the expiry sweep expired while their provider still showed them in
//! progress, asked about again for a day so that a late success whose notice was lost still credits the
//! merchant ([`LateWatch`]). The sweep's task owns it and runs a pass after each expiry pass.

use caisse_engine::core::Record;
use caisse_engine::domain::records::TransactionType;
use caisse_engine::domain::status::PaymentStatus;
use caisse_engine::domain::time::Timestamp;
use caisse_engine::store::AwaitingProvider;
use futures_util::stream::{self, StreamExt};

use super::notice::apply_provider_status;
use super::sweep::PROVIDER_CALLS_IN_FLIGHT;
use super::Flow;
use crate::providers::{ProviderStatus, Subject};

/// How long a payment expired while its provider still showed it in progress is asked about again.
const LATE_WATCH_MS: u64 = 24 * 60 * 60 * 1000;

/// The longest wait between two queries about a watched payment. The first wait is one sweep interval, and each
/// answer still in progress (or no answer) doubles it: about thirty queries a payment in its day by default.
const LATE_ASK_MAX_MS: u64 = 60 * 60 * 1000;

/// Payments the [`LateWatch`] keeps at most; beyond it the one whose watch ends first goes.
const LATE_WATCHED: usize = 10_000;

/// Watched payments asked about per pass at most: the pass shares its task with the expiry sweep and the
/// reconciliation, and a provider that does not answer holds each query for its time-out.
const LATE_BATCH: usize = 64;

/// Payments expired at their TTL while the provider still showed them in progress (pawaPay's `PROCESSING` or
/// `IN_RECONCILIATION`, MTN's `PENDING`). Such a payment may still complete, and the provider's notice of it may
/// be lost (MTN sends one once, pawaPay's retries are not published): each is asked about again, less and less
/// often, so a late success still credits the merchant (`expire -> succes`), for [`LATE_WATCH_MS`]. Kept in
/// memory by the node that expired them: a restart, or a merchant moving to another node, leaves them to the
/// provider's notice alone.
pub(super) struct LateWatch {
    pub(super) items: Vec<Watched>,
    /// The wait before a payment is first asked about again.
    first_wait_ms: u64,
}

pub(super) struct Watched {
    pub(super) item: AwaitingProvider,
    /// When its watch ends, when it is next asked about, and the wait after that (ms).
    until_ms: u64,
    pub(super) next_ms: u64,
    pub(super) wait_ms: u64,
}

impl LateWatch {
    pub(super) fn new(first_wait_ms: u64) -> LateWatch {
        LateWatch { items: Vec::new(), first_wait_ms }
    }

    pub(super) fn add(&mut self, expired: Vec<AwaitingProvider>) {
        let now = Timestamp::now().unix_ms();
        for item in expired {
            if self.items.len() >= LATE_WATCHED {
                let first_to_end = self.items.iter().enumerate().min_by_key(|(_, w)| w.until_ms).map(|(at, _)| at);
                if let Some(at) = first_to_end {
                    let dropped = self.items.swap_remove(at);
                    tracing::warn!(reference = %dropped.item.owner, "too many expired payments watched; this one no longer");
                }
            }
            let (until_ms, next_ms) = (now.saturating_add(LATE_WATCH_MS), now.saturating_add(self.first_wait_ms));
            let wait_ms = self.first_wait_ms.saturating_mul(2).min(LATE_ASK_MAX_MS);
            self.items.push(Watched { item, until_ms, next_ms, wait_ms });
        }
    }

    /// Asks about the watched payments that are due, [`LATE_BATCH`] at most, the longest due first.
    pub(super) async fn pass(&mut self, flow: &Flow) {
        let now = Timestamp::now().unix_ms();
        let ended = self.items.iter().filter(|w| w.until_ms <= now).count();
        if ended > 0 {
            tracing::warn!(ended, "expired payments still in progress at their provider after a day; no longer asked");
            self.items.retain(|w| w.until_ms > now);
        }
        self.items.sort_by_key(|w| w.next_ms);
        let due = self.items.iter().take_while(|w| w.next_ms <= now).count().min(LATE_BATCH);
        let batch: Vec<Watched> = self.items.drain(..due).collect();
        let kept: Vec<Watched> = stream::iter(batch)
            .map(|mut watched| async move {
                late_one(flow, &watched.item).await.then(|| {
                    watched.next_ms = Timestamp::now().unix_ms().saturating_add(watched.wait_ms);
                    watched.wait_ms = watched.wait_ms.saturating_mul(2).min(LATE_ASK_MAX_MS);
                    watched
                })
            })
            .buffer_unordered(PROVIDER_CALLS_IN_FLIGHT)
            .filter_map(std::future::ready)
            .collect()
            .await;
        self.items.extend(kept);
    }
}

/// Asks about one watched payment; answers whether to keep watching it.
async fn late_one(flow: &Flow, item: &AwaitingProvider) -> bool {
    // Held by another node for now (a lease's blip, or a move): not asked from here, and kept for when it is back.
    if !flow.engine.holds(&item.merchant) {
        return true;
    }
    let located = match flow.engine.locate(&item.merchant, &item.owner) {
        Ok(Some(located)) => located,
        Ok(None) => return false,
        Err(_) => return true,
    };
    let Record::Payment(payment) = &located.record else { return false };
    if payment.status != PaymentStatus::Expired {
        return false;
    }
    let carrier = match flow.try_carrier(&located.record, TransactionType::Payment) {
        Ok(Some(carrier)) => carrier,
        Ok(None) => return false,
        Err(_) => return true,
    };
    match carrier.adapter.status(Subject::Payment, &payment.transaction_id, Some(payment)).await {
        Ok(report) if report.status == ProviderStatus::Succeeded => {
            match apply_provider_status(&flow.engine, &item.merchant, &located, &report, false).await {
                Ok(Some(_)) => {
                    tracing::info!(reference = %item.owner, "a payment expired at its TTL completed at its provider since: credited");
                    false
                }
                // Not applied (a success of another amount, logged where it was refused): the operator decides.
                Ok(None) => false,
                Err(e) => {
                    tracing::warn!(error = %e, reference = %item.owner, "a late success could not be applied yet");
                    true
                }
            }
        }
        // Still in progress, or no answer now: asked again later. A final failure leaves it `expire`; a
        // provider that no longer knows it has nothing more to say.
        Ok(report) => report.status == ProviderStatus::Processing,
        Err(_) => true,
    }
}
