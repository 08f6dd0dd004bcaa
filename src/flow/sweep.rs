//! Background work that keeps pending transactions moving: the TTL sweep, the reconciliation of refunds and
//! payouts, and the resubmission of pending work after a restart (and, in a cluster, after this node took
//! merchants over from another); each pass also lets the adapters refresh
//! what they keep of their providers' published configuration (pawaPay's limits).
//!
//! The sweep reads the engine's list of work awaiting a provider (oldest first), so each pass touches only
//! payments whose TTL has passed. Each gets one last status query (docs/api.md § Payments): a final answer is
//! applied, anything else expires the payment. A late success after that still credits the merchant (`expire -> succes`).
//!
//! Refunds and payouts have no TTL (docs/api.md § Refunds and § Payouts): money is reserved for them until the provider
//! answers, so they are never given up. But a provider's notice can be lost, so the reconciliation asks the
//! provider's status of every refund and payout still waiting one TTL after it was made, and applies a final
//! answer; one the provider does not know is sent again under the same id (its request never left: the
//! process sending it died first), and one in progress waits for the next round. It walks the `pending` index with a
//! cursor, a bounded batch per pass, so a few that stay stuck forever cannot starve the others, and asks each
//! one at most once per round.
//!
//! Every pass talks to providers [`PROVIDER_CALLS_IN_FLIGHT`] calls at a time: one at a time, a batch of 500
//! status queries at a real provider's few hundred milliseconds each would hold a pass for minutes, while
//! the whole batch at once would look like an attack to the provider.

use std::time::Duration;

use caisse_engine::core::Record;
use caisse_engine::domain::records::TransactionType;
use caisse_engine::domain::status::{PaymentStatus, PayoutStatus, RefundStatus};
use caisse_engine::domain::time::Timestamp;
use caisse_engine::Executed;
use futures_util::stream::{self, StreamExt};

use caisse_engine::store::{AwaitingProvider, Located};

use super::late::LateWatch;
use super::notice::apply_provider_status;
use super::{Carrier, Flow};
use crate::config::{sweep_every_ms, RECONCILE_EVERY_PASSES};
use crate::providers::{ProviderStatus, Report, Subject};

/// Payments one sweep pass handles at most; the next pass continues.
const SWEEP_BATCH: usize = 500;

/// Provider calls (status queries, resubmissions) a pass has in flight at most.
pub(super) const PROVIDER_CALLS_IN_FLIGHT: usize = 16;

/// Starts the sweep on the current actix thread; it runs for the life of the server.
pub fn start(flow: Flow, ttl_ms: u64) {
    let every = Duration::from_millis(sweep_every_ms(ttl_ms));
    actix_web::rt::spawn(async move {
        refresh_adapters(&flow).await;
        let mut takeovers = flow.engine.takeovers();
        let mut took_over_at: Option<Timestamp> = None;
        match flow.engine.forwarding() {
            // Everything waiting now, what was created in this very millisecond included: asking twice is
            // harmless, and no other process can have a request of it in flight (the one before this died or
            // stopped).
            None => {
                resubmit_pending(&flow, Timestamp::from_unix_ms(Timestamp::now().unix_ms().saturating_add(1))).await
            }
            // A node starting takes its merchants over from the nodes that held them, whose requests may still be
            // in flight: its pending work is sent again after the same quiet time as after any takeover.
            Some(_) => took_over_at = Some(Timestamp::now()),
        }
        let mut cursors = Cursors::default();
        let mut late = LateWatch::new(every.as_millis().try_into().unwrap_or(u64::MAX));
        for pass in 1u64.. {
            actix_web::rt::time::sleep(every).await;
            refresh_adapters(&flow).await;
            // A node of a cluster that took merchants over picks up their pending work as after a restart:
            // the node that held them may have died with its requests in flight. Not at once: a request that
            // came in on another node may still have its first call to the provider in flight there, so what
            // was made before the takeover is sent again once that call is surely over.
            let now = flow.engine.takeovers();
            if now != takeovers {
                takeovers = now;
                took_over_at = Some(Timestamp::now());
            }
            if let Some(at) = took_over_at.filter(|at| at.unix_ms() + TAKEOVER_QUIET_MS <= Timestamp::now().unix_ms()) {
                took_over_at = None;
                resubmit_pending(&flow, Timestamp::from_unix_ms(at.unix_ms() + 1)).await;
            }
            let expired_in_progress = sweep(&flow, ttl_ms, &mut cursors.payments).await;
            late.pass(&flow).await;
            late.add(expired_in_progress);
            if pass % RECONCILE_EVERY_PASSES == 0 {
                reconcile(&flow, ttl_ms, &mut cursors).await;
            }
        }
    });
}

/// Lets each adapter refresh what it keeps of its provider's published configuration (each decides whether it
/// is due, and each call is bounded by the adapter's outbound timeout).
async fn refresh_adapters(flow: &Flow) {
    let refreshes: Vec<_> = flow.providers.adapters().map(|adapter| adapter.refresh()).collect();
    futures_util::future::join_all(refreshes).await;
}

/// How long after a takeover its pending work is sent again: longer than a provider call with its retries
/// (three attempts of up to 15 s, and their backoff), which may still be in flight on the node the request
/// came in on.
const TAKEOVER_QUIET_MS: u64 = 60_000;

/// Refunds and payouts the reconciliation remembers having sent again (it sends each again once per process).
const RESENT_KEPT: usize = 10_000;

/// Where the expiry sweep and the reconciliation stopped in the `pending` index, per kind; `None` starts from the
/// oldest. And what the reconciliation has sent again already.
#[derive(Default)]
struct Cursors {
    payments: Option<AwaitingProvider>,
    refunds: Option<AwaitingProvider>,
    payouts: Option<AwaitingProvider>,
    resent: std::collections::HashSet<Resent>,
}

/// A refund or payout the reconciliation sent again: its kind, its owner and when it was made.
type Resent = (TransactionType, String, u64);

/// One reconciliation pass: a batch of refunds and one of payouts still waiting a TTL after they were made.
async fn reconcile(flow: &Flow, ttl_ms: u64, cursors: &mut Cursors) {
    let cutoff = Timestamp::from_unix_ms(Timestamp::now().unix_ms().saturating_sub(ttl_ms));
    for (kind, cursor) in
        [(TransactionType::Refund, &mut cursors.refunds), (TransactionType::Payout, &mut cursors.payouts)]
    {
        let mut batch = match flow.engine.awaiting_provider(kind, cutoff, cursor.as_ref(), SWEEP_BATCH) {
            Ok(batch) => batch,
            Err(e) => {
                tracing::error!(error = %e, ?kind, "reconciliation could not read the pending index");
                continue;
            }
        };
        // A short batch ends the round: the next pass starts again from the oldest.
        *cursor = if batch.len() < SWEEP_BATCH { None } else { batch.last().cloned() };
        // In a cluster each node reconciles the merchants it holds.
        batch.retain(|item| flow.engine.holds(&item.merchant));
        // As after a restart: a final answer is applied, and one the provider does not know is sent again under
        // the same id (the process that was to send it died first: in a cluster, the node a request came in on,
        // which need not be the node that holds the merchant). Once per process: later rounds only ask, so a
        // provider slow to show a transaction is not sent it round after round.
        if cursors.resent.len() >= RESENT_KEPT {
            cursors.resent.clear();
        }
        // A refund is one of its payment's several: known by its payment and when it was made.
        let resent = &cursors.resent;
        let sent: Vec<Resent> = stream::iter(batch)
            .map(|item| async move {
                let key = (item.kind, item.owner.clone(), item.created_at.unix_ms());
                let resend = !resent.contains(&key);
                resubmit_one(flow, item.kind, item, resend).await.then_some(key)
            })
            .buffer_unordered(PROVIDER_CALLS_IN_FLIGHT)
            .filter_map(std::future::ready)
            .collect()
            .await;
        // Recorded once sent: a query that failed (a provider down) leaves the resend for a later round.
        cursors.resent.extend(sent);
    }
}

/// One expiry pass: a batch of payments past their TTL, from where the last full batch ended (`cursor`), so that
/// a batch of payments whose provider cannot answer (they stay waiting) does not hold back those after it.
/// Answers the payments it expired while their provider still showed them in progress, for the [`LateWatch`].
async fn sweep(flow: &Flow, ttl_ms: u64, cursor: &mut Option<AwaitingProvider>) -> Vec<AwaitingProvider> {
    let cutoff = Timestamp::from_unix_ms(Timestamp::now().unix_ms().saturating_sub(ttl_ms));
    let mut due = match flow.engine.awaiting_provider(TransactionType::Payment, cutoff, cursor.as_ref(), SWEEP_BATCH) {
        Ok(due) => due,
        Err(e) => {
            tracing::error!(error = %e, "expiry sweep could not read the pending index");
            return Vec::new();
        }
    };
    // A short batch ends the round: the next pass starts again from the oldest.
    *cursor = if due.len() < SWEEP_BATCH { None } else { due.last().cloned() };
    // In a cluster each node expires the payments of the merchants it holds.
    due.retain(|item| flow.engine.holds(&item.merchant));
    stream::iter(due)
        .map(|item| expire_one(flow, item))
        .buffer_unordered(PROVIDER_CALLS_IN_FLIGHT)
        .filter_map(std::future::ready)
        .collect()
        .await
}

/// Gives one payment past its TTL a last status query, then applies the answer or expires it. Answers the
/// payment when it expired while its provider still showed it in progress.
async fn expire_one(flow: &Flow, item: AwaitingProvider) -> Option<AwaitingProvider> {
    let located = match flow.engine.locate(&item.merchant, &item.owner) {
        Ok(Some(located)) => located,
        Ok(None) => return None,
        Err(e) => {
            tracing::error!(error = %e, reference = %item.owner, "expiry sweep lookup failed");
            return None;
        }
    };
    let Record::Payment(payment) = &located.record else { return None };
    // A route that cannot be read is not a carrier gone: the payment is not expired unasked.
    let carrier = match flow.try_carrier(&located.record, TransactionType::Payment) {
        Ok(carrier) => carrier,
        Err(e) => {
            tracing::warn!(error = %e, reference = %item.owner, "route unknown; asked again next pass");
            return None;
        }
    };
    let status = match &carrier {
        // A timeout or a 5xx decides nothing, not even an expiry: the provider may have taken the money. The next
        // pass asks again; only an answer (a final one, or "not created"/"still pending") settles it.
        Some(carrier) => match carrier.adapter.status(Subject::Payment, &payment.transaction_id, Some(payment)).await {
            Ok(status) => status,
            Err(e) => {
                tracing::warn!(error = %e, reference = %item.owner, "last status query failed; asked again next pass");
                return None;
            }
        },
        // No adapter to ask any more (the configuration changed): nothing can settle it but the TTL.
        None => ProviderStatus::Pending.into(),
    };
    // Still open at the provider: closed there first (where it can be), so the customer cannot pay a payment
    // Caisse gives up on, then asked once more, since a payment completed in the meantime wins.
    let status = match (&status.status, carrier) {
        (ProviderStatus::Pending | ProviderStatus::Processing, Some(carrier)) => {
            match carrier.adapter.close(payment).await {
                Ok(false) => status,
                Ok(true) => {
                    match carrier.adapter.status(Subject::Payment, &payment.transaction_id, Some(payment)).await {
                        Ok(after) => after,
                        Err(e) => {
                            tracing::warn!(error = %e, reference = %item.owner, "status after closing unknown; asked again next pass");
                            return None;
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, reference = %item.owner, "closing at the provider failed; tried again next pass");
                    return None;
                }
            }
        }
        _ => status,
    };
    let in_progress = status.status == ProviderStatus::Processing;
    match apply_provider_status(&flow.engine, &item.merchant, &located, &status, true).await {
        Ok(Some(Executed::Done(Record::Payment(p)))) if in_progress && p.status == PaymentStatus::Expired => Some(item),
        Ok(_) => None,
        Err(e) => {
            tracing::warn!(error = %e, reference = %item.owner, "expiry failed; the next pass retries");
            None
        }
    }
}

/// Whether `record` still waits for its provider as the pending entry `item` said when it was listed. A batch is
/// worked through a few calls at a time, so an entry's turn may come minutes after the listing: the transaction
/// may have ended since, and a payment's refund may be a later one than the entry's (refunds of a payment are
/// made one after another, each under the payment). Only the entry's own transaction, still waiting, is asked
/// about or sent again.
fn still_waiting(record: &Record, item: &AwaitingProvider) -> bool {
    match (record, item.kind) {
        (Record::Payment(p), TransactionType::Payment) => {
            matches!(p.status, PaymentStatus::Initiated | PaymentStatus::Processing)
        }
        (Record::Payment(p), TransactionType::Refund) => p.refund.as_ref().is_some_and(|r| {
            r.status == RefundStatus::Processing && r.created_at.unix_ms() == item.created_at.unix_ms()
        }),
        (Record::Payout(o), TransactionType::Payout) => o.status == PayoutStatus::Pending,
        _ => false,
    }
}

/// After a restart, asks the providers again for everything still pending: their answers may have been
/// lost with the process (the sandbox simulator keeps its state in memory). Providers deduplicate by our
/// transaction id, so asking twice is harmless.
async fn resubmit_pending(flow: &Flow, created_before: Timestamp) {
    for kind in [TransactionType::Payment, TransactionType::Refund, TransactionType::Payout] {
        let mut items = match flow.engine.awaiting_provider(kind, created_before, None, 100_000) {
            Ok(items) => items,
            Err(e) => return tracing::error!(error = %e, "could not read pending work"),
        };
        items.retain(|item| flow.engine.holds(&item.merchant));
        stream::iter(items)
            .for_each_concurrent(PROVIDER_CALLS_IN_FLIGHT, |item| async move {
                resubmit_one(flow, kind, item, true).await;
            })
            .await;
    }
}

/// Asks the provider about one pending payment, refund or payout whose request may have left before the
/// restart: a final answer is applied; a transaction the provider never created ("not found", or a simulator
/// that lost its memory) is sent again under the same id, so nothing is ever created twice. Without `resend`,
/// only a final answer is applied. Answers whether it sent the transaction again.
async fn resubmit_one(flow: &Flow, kind: TransactionType, item: AwaitingProvider, resend: bool) -> bool {
    let Ok(Some(located)) = flow.engine.locate(&item.merchant, &item.owner) else { return false };
    if !still_waiting(&located.record, &item) {
        return false;
    }
    let Some(carrier) = flow.carrier(&located.record, kind) else { return false };
    let Carrier { adapter, subject, .. } = &carrier;
    let located = Located { kind, ..located };
    let mut resent = false;
    let result = match kind {
        // A refund of a payment kept on an adapter that sends none (Orange Web Payment), with no route of its own
        // elsewhere, was never sent: one accepted while no adapter carried its payment fails here, rather than
        // waiting for ever on a status query that cannot answer about it.
        TransactionType::Refund
            if *subject == Subject::Refund && adapter.refunds_nothing() && kept_on(flow, &located, &carrier.name) =>
        {
            Err(crate::providers::ProviderError::Rejected { code: "refund_unsupported".into() })
        }
        _ => ask_and_resend(flow, &carrier, &located, &item, resend, &mut resent).await,
    };
    // Sent again only once it went out: one that failed (a time-out, the provider down) is sent again next round,
    // under the same id, rather than left waiting for an answer to a request the provider may never have had.
    let sent = resent && result.is_ok();
    match result {
        Err(crate::providers::ProviderError::Rejected { code }) => {
            let failed = ProviderStatus::Failed { code }.into();
            if let Err(e) = apply_provider_status(&flow.engine, &item.merchant, &located, &failed, false).await {
                tracing::warn!(owner = %item.owner, error = %e, "could not apply the provider's refusal");
            }
        }
        Err(e) => tracing::warn!(owner = %item.owner, error = %e, "resubmission failed; the sweeps ask again"),
        Ok(()) => {}
    }
    sent
}

/// Whether the payment of `located` is kept on `adapter` by its stored route: not a payment of a release that
/// kept no routes, whose refund may have gone another way and whose adapter today's routes only guess.
fn kept_on(flow: &Flow, located: &Located, adapter: &caisse_engine::domain::provider::AdapterName) -> bool {
    match &located.record {
        Record::Payment(p) => {
            flow.engine.route_of(&p.transaction_id).ok().flatten().is_some_and(|route| route.adapter == *adapter)
        }
        _ => false,
    }
}

/// [`resubmit_one`]'s question to the provider, and what follows its answer: a final status applied, a
/// transaction the provider never created sent again (`resend`; `resent` says it was).
async fn ask_and_resend(
    flow: &Flow,
    carrier: &Carrier,
    located: &Located,
    item: &AwaitingProvider,
    resend: bool,
    resent: &mut bool,
) -> Result<(), crate::providers::ProviderError> {
    let Carrier { adapter, subject, transaction_id, payment, .. } = carrier;
    match adapter.status(*subject, transaction_id, payment.as_ref()).await {
        Ok(Report { status: ProviderStatus::Pending, .. }) if !resend => Ok(()),
        Ok(Report { status: ProviderStatus::Pending, .. }) => {
            *resent = true;
            match &located.record {
                Record::Payment(p) => match (&p.refund, located.kind) {
                    // The provider does not know it, and its payment's adapter cannot send it (a card's money
                    // never goes to a phone): it was accepted while no adapter carried its payment. It fails
                    // rather than going out the only way the adapter can. Asked first, since what the adapter
                    // can do may have changed since a refund went out (its Transfer API settings removed).
                    (Some(r), TransactionType::Refund)
                        if carrier.subject == Subject::Refund && !adapter.can_refund(p, r.amount) =>
                    {
                        *resent = false;
                        Err(crate::providers::ProviderError::Rejected { code: "refund_unsupported".into() })
                    }
                    (Some(r), TransactionType::Refund) => crate::flow::send_refund(carrier, p, r).await,
                    _ => match adapter.request_to_pay(p).await {
                        Ok(Some(page)) => {
                            flow.opened(&item.merchant, p, page, None).await;
                            Ok(())
                        }
                        other => other.map(drop),
                    },
                },
                Record::Payout(o) => adapter.payout(o).await,
                Record::Link(_) => Ok(()),
            }
        }
        Ok(status) => apply_provider_status(&flow.engine, &item.merchant, located, &status, false)
            .await
            .map(drop)
            .map_err(|e| crate::providers::ProviderError::Unreachable(format!("applying the provider's answer: {e}"))),
        // A query that failed decides nothing, whatever the error: the adapter may lack the settings to ask (a
        // product taken out of its configuration after the money left), or the provider refused the query
        // itself. Only a final status, or a refusal of the transaction sent again, fails it.
        Err(e) => Err(crate::providers::ProviderError::Unreachable(format!("status query: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use actix_web::http::header::HeaderMap;
    use caisse_engine::core::{Command, NewPayment, PaymentNotice, RefundOutcome};
    use caisse_engine::domain::ids::MerchantId;
    use caisse_engine::domain::money::{Amount, Currency, FeeRule};
    use caisse_engine::domain::phone::Phone;
    use caisse_engine::domain::records::{Payment, Payout, ProviderCode, Refund};
    use caisse_engine::domain::status::{PaymentStatus, RefundStatus};
    use caisse_engine::domain::text::Metadata;
    use caisse_engine::Executed;
    use caisse_engine::{Engine, EngineConfig};

    use super::*;
    use crate::config::Settings;
    use crate::merchants::{self, NewMerchant};
    use crate::providers::{Adapter, LocalFuture, Notice, Provider, ProviderError, Providers};
    use caisse_engine::domain::provider::ReturnUrl;

    /// A provider that takes a while to answer anything, and counts how many calls it has at once.
    #[derive(Default)]
    struct SlowProvider {
        in_flight: AtomicUsize,
        most: AtomicUsize,
        calls: AtomicUsize,
        /// While set, status queries fail as a provider that is down does.
        down: std::sync::atomic::AtomicBool,
        /// While set, status queries are refused, as by an adapter that lacks the settings to ask.
        refuses_queries: std::sync::atomic::AtomicBool,
        /// While set, the adapter cannot send a payment's money back (a card's, at CinetPay).
        cannot_refund: std::sync::atomic::AtomicBool,
        /// While set, requests to pay time out.
        sends_time_out: std::sync::atomic::AtomicBool,
        /// While set, the adapter sends no refund at all (Orange Web Payment).
        refunds_nothing: std::sync::atomic::AtomicBool,
        /// When set, what status queries answer (else: not created).
        answer: std::sync::Mutex<Option<ProviderStatus>>,
    }

    impl SlowProvider {
        fn call<T: 'static>(self: &Arc<Self>, answer: T) -> LocalFuture<T> {
            let me = self.clone();
            Box::pin(async move {
                let now = me.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                me.most.fetch_max(now, Ordering::SeqCst);
                me.calls.fetch_add(1, Ordering::SeqCst);
                actix_web::rt::time::sleep(Duration::from_millis(20)).await;
                me.in_flight.fetch_sub(1, Ordering::SeqCst);
                answer
            })
        }
    }

    /// The adapter handed to the flow: the provider behind an `Arc` so that its futures can outlive a call.
    struct Slow(Arc<SlowProvider>);

    impl Adapter for Slow {
        fn request_to_pay(&self, _: &Payment) -> LocalFuture<Result<Option<ReturnUrl>, ProviderError>> {
            if self.0.sends_time_out.load(Ordering::SeqCst) {
                return self.0.call(Err(ProviderError::Unreachable("timed out".into())));
            }
            self.0.call(Ok(None))
        }
        fn status(&self, _: Subject, _: &str, _: Option<&Payment>) -> LocalFuture<Result<Report, ProviderError>> {
            if self.0.down.load(Ordering::SeqCst) {
                return self.0.call(Err(ProviderError::Unreachable("down".into())));
            }
            if self.0.refuses_queries.load(Ordering::SeqCst) {
                return self.0.call(Err(ProviderError::Rejected { code: "disbursement_not_configured".into() }));
            }
            let answer = self.0.answer.lock().unwrap().clone().unwrap_or(ProviderStatus::Pending);
            self.0.call(Ok(answer.into()))
        }
        fn refund(&self, _: &Payment, _: &Refund) -> LocalFuture<Result<(), ProviderError>> {
            self.0.call(Ok(()))
        }
        fn can_refund(&self, _: &Payment, _: Amount) -> bool {
            !self.0.cannot_refund.load(Ordering::SeqCst)
        }
        fn refunds_nothing(&self) -> bool {
            self.0.refunds_nothing.load(Ordering::SeqCst)
        }
        fn payout(&self, _: &Payout) -> LocalFuture<Result<(), ProviderError>> {
            self.0.call(Ok(()))
        }
        fn parse_notice(&self, _: &HeaderMap, _: Option<&str>, _: &[u8]) -> Result<Notice, ProviderError> {
            Err(ProviderError::Unauthenticated("not in this test".into()))
        }
    }

    const PAYMENTS: usize = 40;

    /// The oldest waiting payment, confirmed: its reference.
    async fn paid(flow: &Flow, merchant: &MerchantId) -> caisse_engine::domain::text::Reference {
        let item =
            flow.engine.awaiting_provider(TransactionType::Payment, Timestamp::now(), None, 1).unwrap().remove(0);
        let reference = caisse_engine::domain::text::Reference::parse(&item.owner).unwrap();
        let confirmed = Command::PaymentNotice { reference: reference.clone(), notice: PaymentNotice::Confirmed };
        flow.engine.execute(merchant, confirmed, None).await.unwrap();
        reference
    }

    /// A flow whose only provider is slow, with `PAYMENTS` payments waiting for it and already past their TTL.
    async fn flow_with_waiting_payments(dir: &std::path::Path) -> (Flow, Arc<SlowProvider>, MerchantId) {
        flow_with(dir, PAYMENTS).await
    }

    /// A payment of `amount` XOF by MTN MoMo from a Beninese number.
    fn mtn_payment(amount: i64) -> NewPayment {
        NewPayment {
            reference: None,
            amount: Amount::positive(amount).unwrap(),
            currency: Currency::parse("XOF").unwrap(),
            provider: ProviderCode::parse("mtn_momo").unwrap(),
            fee: FeeRule::new(150, Amount::ZERO).unwrap(),
            customer_phone: Phone::parse("+22997000055").unwrap(),
            customer_email: None,
            customer_name: None,
            description: None,
            metadata: Metadata::empty(),
            link: None,
        }
    }

    /// [`flow_with_waiting_payments`] with `payments` of them.
    async fn flow_with(dir: &std::path::Path, payments: usize) -> (Flow, Arc<SlowProvider>, MerchantId) {
        let mut settings = Settings::for_tests(dir).unwrap();
        settings.payment_ttl_ms = 0;
        let engine = Engine::open(EngineConfig::new(dir)).unwrap();
        let new =
            NewMerchant { name: "Slow".into(), email: "slow@example.com".into(), password: None, webhook_url: None };
        let merchant = merchants::create(&engine, settings.environment, new).await.unwrap().merchant.id;
        for n in 0..payments {
            let payment = mtn_payment(1_000 + n as i64);
            engine.execute(&merchant, Command::InitiatePayment(payment), None).await.unwrap();
        }
        let slow = Arc::new(SlowProvider::default());
        let provider =
            Provider::with_adapter(settings.provider("mtn_momo").unwrap().clone(), Arc::new(Slow(slow.clone())));
        let providers = Providers::new([provider], None);
        (Flow::new(engine, providers), slow, merchant)
    }

    #[actix_web::test]
    async fn the_sweep_asks_a_slow_provider_several_payments_at_a_time_and_expires_every_one() {
        let dir = tempfile::tempdir().unwrap();
        let (flow, slow, merchant) = flow_with_waiting_payments(dir.path()).await;
        // A TTL of 0 has passed once the clock has moved on from the last payment's millisecond.
        actix_web::rt::time::sleep(Duration::from_millis(2)).await;
        let waiting = flow.engine.awaiting_provider(TransactionType::Payment, Timestamp::now(), None, 1_000).unwrap();
        assert_eq!(waiting.len(), PAYMENTS);
        sweep(&flow, 0, &mut None).await;
        let most = slow.most.load(Ordering::SeqCst);
        assert!(most > 1 && most <= PROVIDER_CALLS_IN_FLIGHT, "{most} status queries at once");
        assert_eq!(slow.calls.load(Ordering::SeqCst), PAYMENTS);
        for item in waiting {
            let payment = flow.engine.payment(&merchant, &item.owner).await.unwrap().unwrap();
            assert_eq!(payment.status, PaymentStatus::Expired, "{}", item.owner);
        }
    }

    /// A provider that cannot answer decides nothing: the payments wait past their TTL until it answers.
    #[actix_web::test]
    async fn a_provider_that_cannot_answer_expires_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (flow, slow, merchant) = flow_with_waiting_payments(dir.path()).await;
        actix_web::rt::time::sleep(Duration::from_millis(2)).await;
        let waiting = flow.engine.awaiting_provider(TransactionType::Payment, Timestamp::now(), None, 1_000).unwrap();
        slow.down.store(true, Ordering::SeqCst);
        sweep(&flow, 0, &mut None).await;
        for item in &waiting {
            let payment = flow.engine.payment(&merchant, &item.owner).await.unwrap().unwrap();
            assert_eq!(payment.status, PaymentStatus::Initiated, "{}", item.owner);
        }
        slow.down.store(false, Ordering::SeqCst);
        sweep(&flow, 0, &mut None).await;
        for item in &waiting {
            let payment = flow.engine.payment(&merchant, &item.owner).await.unwrap().unwrap();
            assert_eq!(payment.status, PaymentStatus::Expired, "{}", item.owner);
        }
    }

    /// A payment expired at its TTL while its provider still showed it in progress is asked about again, and its
    /// late success credits the merchant even if the provider's notice of it never comes. One the provider did
    /// not know is not watched.
    #[actix_web::test]
    async fn a_payment_expired_while_in_progress_is_credited_when_it_completes_later() {
        let dir = tempfile::tempdir().unwrap();
        let (flow, slow, merchant) = flow_with(dir.path(), 3).await;
        actix_web::rt::time::sleep(Duration::from_millis(2)).await;
        *slow.answer.lock().unwrap() = Some(ProviderStatus::Processing);
        let expired = sweep(&flow, 0, &mut None).await;
        assert_eq!(expired.len(), 3, "each expired in progress");
        let mut late = LateWatch::new(60_000);
        late.add(expired);
        let status = |owner: String| {
            let (flow, merchant) = (&flow, &merchant);
            async move { flow.engine.payment(merchant, &owner).await.unwrap().unwrap().status }
        };
        let owners: Vec<String> = late.items.iter().map(|w| w.item.owner.clone()).collect();
        for owner in &owners {
            assert_eq!(status(owner.clone()).await, PaymentStatus::Expired);
        }
        // Not asked before its first wait is over.
        let calls = slow.calls.load(Ordering::SeqCst);
        late.pass(&flow).await;
        assert_eq!(slow.calls.load(Ordering::SeqCst), calls);
        // Still in progress: still watched, and asked again twice as late.
        let due_now = |late: &mut LateWatch| late.items.iter_mut().for_each(|w| w.next_ms = 0);
        due_now(&mut late);
        late.pass(&flow).await;
        assert_eq!(slow.calls.load(Ordering::SeqCst), calls + 3);
        assert!(late.items.iter().all(|w| w.wait_ms == 240_000 && w.next_ms > 0));
        *slow.answer.lock().unwrap() = Some(ProviderStatus::Succeeded);
        due_now(&mut late);
        late.pass(&flow).await;
        for owner in &owners {
            assert_eq!(status(owner.clone()).await, PaymentStatus::Succeeded, "{owner}");
        }
        assert!(late.items.is_empty(), "done with");
        let credited = flow.engine.balances(&merchant).await.unwrap().get(Currency::XOF);
        assert!(credited.available > 0, "{credited:?}");
        // A payment the provider never created expires without being watched.
        let other = tempfile::tempdir().unwrap();
        let (flow, slow, _) = flow_with(other.path(), 1).await;
        actix_web::rt::time::sleep(Duration::from_millis(2)).await;
        *slow.answer.lock().unwrap() = Some(ProviderStatus::Pending);
        assert!(sweep(&flow, 0, &mut None).await.is_empty());
    }

    /// A full batch of payments whose provider cannot answer (they stay waiting) does not hold back the payments
    /// after it: the next pass goes on from where the batch ended.
    #[actix_web::test]
    async fn a_batch_the_provider_cannot_answer_holds_back_no_later_payment() {
        let dir = tempfile::tempdir().unwrap();
        let (flow, slow, merchant) = flow_with(dir.path(), SWEEP_BATCH + 1).await;
        actix_web::rt::time::sleep(Duration::from_millis(2)).await;
        let waiting = flow.engine.awaiting_provider(TransactionType::Payment, Timestamp::now(), None, 1_000).unwrap();
        let (oldest, newest) = (&waiting[0], &waiting[SWEEP_BATCH]);
        let mut cursor = None;
        slow.down.store(true, Ordering::SeqCst);
        sweep(&flow, 0, &mut cursor).await;
        slow.down.store(false, Ordering::SeqCst);
        sweep(&flow, 0, &mut cursor).await;
        let status = |item: &AwaitingProvider| {
            let (flow, merchant, owner) = (&flow, &merchant, item.owner.clone());
            async move { flow.engine.payment(merchant, &owner).await.unwrap().unwrap().status }
        };
        assert_eq!(status(newest).await, PaymentStatus::Expired, "the payment after the batch");
        assert_eq!(status(oldest).await, PaymentStatus::Initiated, "its turn comes again next round");
        assert_eq!(cursor, None, "a short batch ends the round");
    }

    #[actix_web::test]
    async fn a_restart_resubmits_pending_payments_several_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let (flow, slow, _) = flow_with_waiting_payments(dir.path()).await;
        resubmit_pending(&flow, Timestamp::from_unix_ms(Timestamp::now().unix_ms() + 1)).await;
        let most = slow.most.load(Ordering::SeqCst);
        assert!(most > 1 && most <= PROVIDER_CALLS_IN_FLIGHT, "{most} resubmissions at once");
        // Each is asked about first; the provider knows none of them, so each is sent again, under its id.
        assert_eq!(slow.calls.load(Ordering::SeqCst), 2 * PAYMENTS);
    }

    /// A success is applied only for the amount Caisse asked: the provider's answer is untrusted input.
    #[actix_web::test]
    async fn a_success_of_another_amount_moves_no_money() {
        let dir = tempfile::tempdir().unwrap();
        let (flow, _, merchant) = flow_with_waiting_payments(dir.path()).await;
        actix_web::rt::time::sleep(Duration::from_millis(2)).await;
        let item =
            flow.engine.awaiting_provider(TransactionType::Payment, Timestamp::now(), None, 1).unwrap().remove(0);
        let located = flow.engine.locate(&merchant, &item.owner).unwrap().unwrap();
        let Record::Payment(payment) = &located.record else { panic!("a payment") };
        let asked = crate::providers::pawapay::amount_text(payment.amount, payment.currency);
        let success = |amount: &str, currency: &str| {
            Report::from(ProviderStatus::Succeeded).stating(&serde_json::json!(amount), &serde_json::json!(currency))
        };
        for (amount, currency) in [("1", "XOF"), (asked.as_str(), "XAF"), ("not an amount", "XOF")] {
            apply_provider_status(&flow.engine, &merchant, &located, &success(amount, currency), false).await.unwrap();
            let now = flow.engine.payment(&merchant, &item.owner).await.unwrap().unwrap();
            assert_ne!(now.status, PaymentStatus::Succeeded, "{amount} {currency}");
        }
        // Nor is it the end of the wait: the TTL's last query expires nothing on such an answer.
        apply_provider_status(&flow.engine, &merchant, &located, &success("1", "XOF"), true).await.unwrap();
        let now = flow.engine.payment(&merchant, &item.owner).await.unwrap().unwrap();
        assert_eq!(now.status, PaymentStatus::Initiated, "the customer may have paid");
        let written = format!("{asked}.00");
        apply_provider_status(&flow.engine, &merchant, &located, &success(&written, "XOF"), false).await.unwrap();
        let now = flow.engine.payment(&merchant, &item.owner).await.unwrap().unwrap();
        assert_eq!(now.status, PaymentStatus::Succeeded, "the amount asked, written with decimals");
    }

    /// A refund that reaches the flow with no way back (as one accepted while its payment was not yet paid,
    /// before any way back was looked for) is never sent through the payment's adapter when it cannot send
    /// that money back: it fails before any call, and its reservation is released.
    #[actix_web::test]
    async fn a_refund_the_payments_adapter_cannot_make_fails_before_any_call() {
        let dir = tempfile::tempdir().unwrap();
        let (flow, slow, merchant) = flow_with_waiting_payments(dir.path()).await;
        actix_web::rt::time::sleep(Duration::from_millis(2)).await;
        let reference = paid(&flow, &merchant).await;
        let before = flow.engine.balances(&merchant).await.unwrap().get(Currency::XOF);
        slow.cannot_refund.store(true, Ordering::SeqCst);
        let calls = slow.calls.load(Ordering::SeqCst);
        let refund = Command::RequestRefund { reference, amount: Some(Amount::positive(500).unwrap()), reason: None };
        let refunded = flow.request_refund(&merchant, refund, None).await;
        let Ok(Executed::Done(Record::Payment(payment))) = refunded else { panic!("a refund: {refunded:?}") };
        let refund = payment.refund.as_ref().unwrap();
        assert_eq!(refund.status, RefundStatus::Failed, "{refund:?}");
        assert_eq!(slow.calls.load(Ordering::SeqCst), calls, "nothing was asked of the provider");
        let after = flow.engine.balances(&merchant).await.unwrap().get(Currency::XOF);
        assert_eq!((after.available, after.pending), (before.available, before.pending), "nothing stays reserved");
    }

    /// A refund accepted while nothing carried its payment (its adapter's settings gone) waits with nothing sent.
    /// When the payment's adapter is back and cannot make it (a card's money never goes to a phone), the
    /// resubmission asks the provider, which does not know it, and fails it instead of sending it: the
    /// reservation goes back. One the provider knows (sent before what the adapter can do changed) waits.
    #[actix_web::test]
    async fn a_waiting_refund_the_payments_adapter_cannot_make_is_failed_never_sent() {
        let dir = tempfile::tempdir().unwrap();
        let (flow, slow, merchant) = flow_with_waiting_payments(dir.path()).await;
        let reference = paid(&flow, &merchant).await;
        let before = flow.engine.balances(&merchant).await.unwrap().get(Currency::XOF);
        slow.cannot_refund.store(true, Ordering::SeqCst);
        let item = accepted_refund(&flow, &merchant, reference, 500).await;
        let calls = slow.calls.load(Ordering::SeqCst);
        *slow.answer.lock().unwrap() = Some(ProviderStatus::Processing);
        assert!(!resubmit_one(&flow, TransactionType::Refund, item.clone(), true).await, "nothing sent");
        let waits = flow.engine.locate(&merchant, &item.owner).unwrap().map(|l| l.record);
        let Some(Record::Payment(payment)) = waits else { panic!("the payment") };
        assert_eq!(payment.refund.as_ref().map(|r| r.status), Some(RefundStatus::Processing), "known: it waits");
        *slow.answer.lock().unwrap() = None;
        assert!(!resubmit_one(&flow, TransactionType::Refund, item.clone(), true).await, "nothing sent");
        assert_eq!(slow.calls.load(Ordering::SeqCst), calls + 2, "two status queries, no refund sent");
        let Ok(Some(located)) = flow.engine.locate(&merchant, &item.owner) else { panic!("the payment") };
        let Record::Payment(payment) = located.record else { panic!("a payment") };
        assert_eq!(payment.refund.as_ref().map(|r| r.status), Some(RefundStatus::Failed));
        let after = flow.engine.balances(&merchant).await.unwrap().get(Currency::XOF);
        assert_eq!((after.available, after.pending), (before.available, before.pending), "nothing stays reserved");

        // On an adapter that sends no refund at all, whose status query cannot answer about one: a refund of a
        // payment kept on it by its stored route fails unasked; one of a payment with no stored route (an
        // earlier release's, whose refund may have gone another way) is asked about.
        slow.refunds_nothing.store(true, Ordering::SeqCst);
        let legacy = payment.reference.clone();
        let kept = mtn_payment(2_000);
        let route = caisse_engine::domain::provider::ProviderRoute {
            adapter: caisse_engine::domain::provider::AdapterName::parse("test").unwrap(),
            return_url: None,
        };
        let note = caisse_engine::ProviderNote { route: Some(route), reference: None };
        let made = flow.engine.execute_noted(&merchant, Command::InitiatePayment(kept), None, note).await;
        let Ok(Executed::Done(Record::Payment(kept))) = made else { panic!("a payment: {made:?}") };
        let confirmed = Command::PaymentNotice { reference: kept.reference.clone(), notice: PaymentNotice::Confirmed };
        flow.engine.execute(&merchant, confirmed, None).await.unwrap();
        for (reference, fails_unasked) in [(legacy, false), (kept.reference.clone(), true)] {
            let item = accepted_refund(&flow, &merchant, reference, 300).await;
            let calls = slow.calls.load(Ordering::SeqCst);
            *slow.answer.lock().unwrap() = Some(ProviderStatus::Processing);
            assert!(!resubmit_one(&flow, TransactionType::Refund, item.clone(), true).await);
            let asked = slow.calls.load(Ordering::SeqCst) - calls;
            let Ok(Some(located)) = flow.engine.locate(&merchant, &item.owner) else { panic!("the payment") };
            let Record::Payment(after) = located.record else { panic!("a payment") };
            let status = after.refund.as_ref().map(|r| r.status);
            match fails_unasked {
                true => assert_eq!((asked, status), (0, Some(RefundStatus::Failed)), "kept on it: failed unasked"),
                false => assert_eq!((asked, status), (1, Some(RefundStatus::Processing)), "no route kept: asked"),
            }
        }
    }

    /// A refund of `amount` of the payment `reference` accepted by the engine alone, as while no adapter carried
    /// its payment (nothing sent): its entry in the list of what waits for a provider.
    async fn accepted_refund(
        flow: &Flow,
        merchant: &MerchantId,
        reference: caisse_engine::domain::text::Reference,
        amount: i64,
    ) -> AwaitingProvider {
        let owner = reference.as_str().to_owned();
        let refund =
            Command::RequestRefund { reference, amount: Some(Amount::positive(amount).unwrap()), reason: None };
        let accepted = flow.engine.execute(merchant, refund, None).await;
        assert!(matches!(accepted, Ok(Executed::Done(_))), "{accepted:?}");
        actix_web::rt::time::sleep(Duration::from_millis(2)).await;
        let waiting = flow.engine.awaiting_provider(TransactionType::Refund, Timestamp::now(), None, 10).unwrap();
        waiting.into_iter().find(|i| i.owner == owner).expect("the refund waits")
    }

    /// A transaction sent again counts as sent only once the request went out: one that timed out is sent again
    /// at the next round rather than left waiting for an answer to a request the provider may never have had.
    #[actix_web::test]
    async fn a_resubmission_that_timed_out_is_not_counted_as_sent() {
        let dir = tempfile::tempdir().unwrap();
        let (flow, slow, _) = flow_with_waiting_payments(dir.path()).await;
        let item =
            flow.engine.awaiting_provider(TransactionType::Payment, Timestamp::now(), None, 1).unwrap().remove(0);
        slow.sends_time_out.store(true, Ordering::SeqCst);
        assert!(!resubmit_one(&flow, TransactionType::Payment, item.clone(), true).await);
        slow.sends_time_out.store(false, Ordering::SeqCst);
        assert!(resubmit_one(&flow, TransactionType::Payment, item, true).await);
    }

    /// A pending entry listed before its refund ended must not act on the payment's next refund: here that one
    /// was refused (its reservation given back), and asking about it or sending it again could pay the customer
    /// while the merchant keeps the money.
    #[actix_web::test]
    async fn an_entry_whose_refund_ended_since_its_listing_touches_the_next_refund_never() {
        let dir = tempfile::tempdir().unwrap();
        let (flow, slow, merchant) = flow_with_waiting_payments(dir.path()).await;
        let reference = paid(&flow, &merchant).await;
        let refund = |reference| Command::RequestRefund {
            reference,
            amount: Some(Amount::positive(100).unwrap()),
            reason: None,
        };
        let refunded = flow.request_refund(&merchant, refund(reference.clone()), None).await;
        let Ok(Executed::Done(Record::Payment(payment))) = refunded else { panic!("a refund: {refunded:?}") };
        let first = payment.refund.unwrap();
        actix_web::rt::time::sleep(Duration::from_millis(2)).await;
        // The reconciliation's listing, with the first refund still waiting.
        let listed = flow.engine.awaiting_provider(TransactionType::Refund, Timestamp::now(), None, 10).unwrap();
        assert_eq!(listed.len(), 1);
        let notice = |refund: &Refund, outcome| Command::RefundNotice {
            reference: reference.clone(),
            refund: refund.reference.clone(),
            outcome,
        };
        flow.engine.execute(&merchant, notice(&first, RefundOutcome::Completed), None).await.unwrap();
        let refunded = flow.request_refund(&merchant, refund(reference.clone()), None).await;
        let Ok(Executed::Done(Record::Payment(payment))) = refunded else { panic!("a refund: {refunded:?}") };
        let second = payment.refund.unwrap();
        flow.engine.execute(&merchant, notice(&second, RefundOutcome::Refused), None).await.unwrap();
        let before = flow.engine.balances(&merchant).await.unwrap().get(Currency::XOF);
        let calls = slow.calls.load(Ordering::SeqCst);
        for item in listed {
            assert!(!resubmit_one(&flow, TransactionType::Refund, item, true).await, "nothing sent again");
        }
        assert_eq!(slow.calls.load(Ordering::SeqCst), calls, "nothing asked of the provider");
        let payment = flow.engine.payment(&merchant, reference.as_str()).await.unwrap().unwrap();
        assert_eq!(payment.refund.map(|r| r.status), Some(RefundStatus::Failed));
        let after = flow.engine.balances(&merchant).await.unwrap().get(Currency::XOF);
        assert_eq!((after.available, after.pending), (before.available, before.pending));
    }

    /// A status query refused (an adapter that cannot ask) is no answer: the money may have left, so nothing
    /// fails and nothing is sent again.
    #[actix_web::test]
    async fn a_refused_status_query_fails_nothing_on_resubmission() {
        let dir = tempfile::tempdir().unwrap();
        let (flow, slow, merchant) = flow_with_waiting_payments(dir.path()).await;
        slow.refuses_queries.store(true, Ordering::SeqCst);
        actix_web::rt::time::sleep(Duration::from_millis(2)).await;
        let waiting = flow.engine.awaiting_provider(TransactionType::Payment, Timestamp::now(), None, 1_000).unwrap();
        resubmit_pending(&flow, Timestamp::from_unix_ms(Timestamp::now().unix_ms() + 1)).await;
        assert_eq!(slow.calls.load(Ordering::SeqCst), PAYMENTS, "asked once each, sent again never");
        for item in &waiting {
            let payment = flow.engine.payment(&merchant, &item.owner).await.unwrap().unwrap();
            assert_eq!(payment.status, PaymentStatus::Initiated, "{}", item.owner);
        }
    }
}
