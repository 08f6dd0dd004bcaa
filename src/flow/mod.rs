//! A payment's whole life, in one place between the HTTP layer and the engine.
//!
//! 1. **Start**: a payment, refund or payout is decided and made durable by the merchant's actor
//!    ([`Flow::initiate_payment`], [`Flow::request_refund`], [`Flow::create_payout`]); only then is the provider
//!    asked to move money. If the provider cannot be reached at that moment, nothing is lost: the record waits
//!    in the store and the sweeps below ask again.
//! 2. **Provider answer**: a notice is authenticated by the provider's adapter, located by our transaction id,
//!    confirmed with a status query (a notice alone never moves money, so a forged or replayed one credits
//!    nobody) and applied through the merchant's actor ([`notice`]).
//! 3. **No answer**: the TTL sweep gives a payment past its TTL one last status query and expires it
//!    otherwise; the reconciliation asks about refunds and payouts still waiting; after a restart, everything
//!    still waiting is sent to its provider again ([`sweep`]). A payment expired while its provider still
//!    showed it in progress is asked about again for a day (`late`).
//!
//! Providers' answers become engine commands in one function, [`notice::apply_provider_status`], used by all
//! three paths, so a status means the same thing wherever it comes from.

#[cfg(test)]
mod interleavings;
mod late;
pub mod notice;
pub mod sweep;

use caisse_engine::core::Record;
use caisse_engine::domain::ids::MerchantId;
use caisse_engine::domain::money::Amount;
use caisse_engine::domain::phone::Phone;
use caisse_engine::domain::provider::{AdapterName, ProviderRoute, ReturnUrl};
use caisse_engine::domain::records::Payment;
use caisse_engine::domain::records::TransactionType;
use caisse_engine::domain::status::payment_refund_allowed;
use caisse_engine::domain::text::IdempotencyKey;
use caisse_engine::store::Located;
use caisse_engine::{
    Command, Engine, EngineError, Executed, Idempotency, NewPayment, NewPayout, PaymentNotice, ProviderNote,
};

use self::notice::apply_provider_status_answering;
use crate::providers::{Adapter, ProviderError, ProviderStatus, Providers, Routed, Subject};

/// How long a merchant's request waits for the provider's answer to the request Caisse sends it. Beyond it the
/// answer goes out with the transaction as it is (created, durable), and the provider's answer comes later by
/// callback or status query; dropping the wait is safe because a retry or a query reuses the same id.
const REQUEST_BUDGET: std::time::Duration = std::time::Duration::from_secs(10);

/// Who carries one transaction ([`Flow::carrier`]).
pub struct Carrier {
    pub adapter: std::sync::Arc<dyn Adapter>,
    pub name: AdapterName,
    /// What the transaction is to its provider.
    pub subject: Subject,
    /// Our id for it, from which the provider's idempotency id is derived.
    pub transaction_id: String,
    /// The payment, when the transaction is one or one of its refunds.
    pub payment: Option<Payment>,
}

/// The engine and the providers, which every step of a payment's life needs together. Cheap to clone.
#[derive(Clone)]
pub struct Flow {
    pub engine: Engine,
    pub providers: Providers,
    /// Per adapter, the status queries that confirm callbacks ([`notice::CONFIRMING_AT_ONCE`]).
    confirming: dashmap::DashMap<String, std::sync::Arc<tokio::sync::Semaphore>>,
}

impl Flow {
    pub fn new(engine: Engine, providers: Providers) -> Flow {
        Flow { engine, providers, confirming: dashmap::DashMap::new() }
    }

    /// The route `code` takes for this phone's country now, when it is active: what a new transaction keeps.
    pub fn route(&self, code: &str, phone: &Phone) -> Option<ProviderRoute> {
        match self.providers.get(code)?.route(phone.country()) {
            Routed::Active { adapter_name, .. } => match AdapterName::parse(&adapter_name) {
                Ok(adapter) => Some(ProviderRoute { adapter, return_url: None }),
                Err(e) => {
                    tracing::error!(adapter = %adapter_name, error = %e, "adapter name refused");
                    None
                }
            },
            _ => None,
        }
    }

    /// Who carries one of our transactions: the adapter its route named when it was created (a refund takes
    /// its payment's), so that a later change of the routes cannot send its queries to another provider.
    /// A transaction created before routes were kept goes by the current route for its phone. `None` also when
    /// a route cannot be read ([`Flow::try_carrier`] tells the two apart).
    pub fn carrier(&self, record: &Record, kind: TransactionType) -> Option<Carrier> {
        self.try_carrier(record, kind).unwrap_or_else(|e| {
            tracing::warn!(key = %record.key(), error = %e, "could not read a transaction's route; asked again later");
            None
        })
    }

    /// [`Flow::carrier`], with a route that cannot be read as an error: guessing then could send a refund kept
    /// as a payout to the payer through the payment's adapter as well, so nothing is asked or sent until the
    /// store answers.
    pub fn try_carrier(&self, record: &Record, kind: TransactionType) -> Result<Option<Carrier>, EngineError> {
        let (subject, transaction_id, code, phone, parent) = match (record, kind) {
            (Record::Payment(p), TransactionType::Refund) => {
                let Some(refund) = p.refund.as_ref() else { return Ok(None) };
                (Subject::Refund, refund.transaction_id(), &p.provider, &p.customer_phone, Some(&p.transaction_id))
            }
            (Record::Payment(p), _) => {
                (Subject::Payment, p.transaction_id.clone(), &p.provider, &p.customer_phone, None)
            }
            (Record::Payout(o), _) => {
                (Subject::Payout, o.transaction_id.clone(), &o.provider, &o.beneficiary_phone, None)
            }
            (Record::Link(_), _) => return Ok(None),
        };
        let kept = |tx: &str| self.engine.route_of(tx).map(|route| route.map(|r| r.adapter));
        let own = kept(&transaction_id)?;
        let parents = match parent {
            Some(tx) => kept(tx)?,
            None => None,
        };
        // A refund kept on another adapter than its payment's is sent there as a payout to the payer.
        let subject = match (subject, &own, &parents) {
            (Subject::Refund, Some(own), Some(parents)) if own != parents => Subject::Payout,
            (subject, _, _) => subject,
        };
        let Some(name) = own.or(parents).or_else(|| self.route(code.as_str(), phone).map(|r| r.adapter)) else {
            return Ok(None);
        };
        let Some(adapter) = self.providers.adapter(name.as_str()) else {
            tracing::warn!(tx = %transaction_id, adapter = %name, "the transaction's adapter is not configured any more");
            return Ok(None);
        };
        let payment = match record {
            Record::Payment(p) => Some(p.clone()),
            _ => None,
        };
        Ok(Some(Carrier { adapter, name, subject, transaction_id, payment }))
    }

    /// Applies a provider's refusal of a request: the transaction fails with the provider's code. Answers
    /// the record after it, when it changed.
    async fn refused(
        &self,
        merchant: &MerchantId,
        record: &Record,
        kind: TransactionType,
        code: String,
        answer: Option<Idempotency>,
    ) -> Option<Executed> {
        let key = match record {
            Record::Payment(p) if kind == TransactionType::Refund => p.refund.as_ref().map(|r| r.reference.clone()),
            other => Some(other.key().to_owned()),
        }?;
        let located = Located { kind, reference: key, record: record.clone() };
        let refused = ProviderStatus::Failed { code }.into();
        match apply_provider_status_answering(&self.engine, merchant, &located, &refused, false, answer).await {
            Ok(executed) => executed,
            Err(e) => {
                tracing::warn!(error = %e, "could not apply the provider's refusal; the sweeps ask again");
                None
            }
        }
    }

    /// Waits for a request to the provider within [`REQUEST_BUDGET`].
    async fn within_budget<T>(
        sent: impl std::future::Future<Output = Result<T, ProviderError>>,
    ) -> Result<T, ProviderError> {
        actix_web::rt::time::timeout(REQUEST_BUDGET, sent).await.unwrap_or_else(|_| {
            Err(ProviderError::Unreachable(format!("no answer within {REQUEST_BUDGET:?}; the sweeps ask again")))
        })
    }

    /// What a request to the provider came to: a refusal fails the transaction at once (and the answer shows
    /// it, a replay too: `answer` is the request's idempotency, [`Idempotency::following`]); anything else
    /// leaves it waiting, the sweeps asking again.
    async fn after_request(
        &self,
        merchant: &MerchantId,
        executed: Executed,
        kind: TransactionType,
        sent: Result<(), ProviderError>,
        answer: Option<Idempotency>,
    ) -> Executed {
        let Executed::Done(record) = &executed else { return executed };
        match sent {
            Ok(()) => executed,
            Err(ProviderError::Rejected { code }) => {
                tracing::info!(key = %record.key(), %code, "the provider refused the request");
                self.refused(merchant, record, kind, code, answer).await.unwrap_or(executed)
            }
            Err(e) => {
                tracing::warn!(key = %record.key(), error = %e, "request to the provider failed; the sweeps ask again");
                executed
            }
        }
    }

    /// Creates the payment with its route, durably, then asks its provider for the customer's approval.
    pub async fn initiate_payment(
        &self,
        merchant: &MerchantId,
        new: NewPayment,
        route: Option<ProviderRoute>,
        idempotency: Option<Idempotency>,
    ) -> Result<Executed, EngineError> {
        let note = ProviderNote { route, reference: None };
        let command = Command::InitiatePayment(new);
        let (executed, answer, held) = self.first_change(merchant, command, idempotency, note).await?;
        // The payment is durable; if the provider cannot be reached now, the TTL sweep settles it.
        let sent = match &executed {
            Executed::Done(record @ Record::Payment(p)) => match self.carrier(record, TransactionType::Payment) {
                Some(carrier) => Self::within_budget(carrier.adapter.request_to_pay(p)).await,
                None => Ok(None),
            },
            _ => Ok(None),
        };
        let executed = match (&executed, &sent) {
            // The provider's page is kept on the payment before the merchant hears of it, so the answer
            // carries `url_paiement`.
            (Executed::Done(Record::Payment(p)), Ok(Some(page))) => {
                self.opened(merchant, p, page.clone(), answer.clone()).await.unwrap_or(executed)
            }
            _ => executed,
        };
        let executed = self.after_request(merchant, executed, TransactionType::Payment, sent.map(drop), answer).await;
        self.release(merchant, held).await;
        Ok(executed)
    }

    /// Writes a request's first change, its idempotency key held ([`Part::FirstHeld`](caisse_engine::Part)) while the request goes
    /// on with its provider. Answers the change, the request's part in the changes that follow it
    /// ([`Idempotency::following`]), and the key to [`Flow::release`] once the request has its answer: only
    /// when this request made the change (a replay holds nothing).
    async fn first_change(
        &self,
        merchant: &MerchantId,
        command: Command,
        idempotency: Option<Idempotency>,
        note: ProviderNote,
    ) -> Result<(Executed, Option<Idempotency>, Option<IdempotencyKey>), EngineError> {
        let answer = idempotency.as_ref().map(Idempotency::following);
        let key = idempotency.as_ref().map(|i| i.key.clone());
        let executed =
            self.engine.execute_noted(merchant, command, idempotency.map(Idempotency::holding), note).await?;
        let held = match executed {
            Executed::Done(_) => key,
            Executed::Replayed { .. } => None,
        };
        Ok((executed, answer, held))
    }

    /// The end of a request that held its idempotency key: a retry is a replay of its answer from now on.
    /// Should the release fail, the key frees itself shortly after (the engine bounds every hold).
    async fn release(&self, merchant: &MerchantId, held: Option<IdempotencyKey>) {
        if let Some(key) = held {
            if let Err(e) = self.engine.release_key(merchant, key).await {
                tracing::warn!(%merchant, error = %e, "an idempotency key was not released; it frees itself shortly");
            }
        }
    }

    /// Keeps the page where the customer approves a payment (the payment moves to `en_cours`); answers the
    /// payment after it (`answer`: within the request that made it, [`Idempotency::following`]). A failure to
    /// write it is logged: the next status query that reports the page (Wave's does) keeps it then.
    pub async fn opened(
        &self,
        merchant: &MerchantId,
        payment: &Payment,
        page: ReturnUrl,
        answer: Option<Idempotency>,
    ) -> Option<Executed> {
        let notice = PaymentNotice::Opened { payment_url: page };
        let command = Command::PaymentNotice { reference: payment.reference.clone(), notice };
        match self.engine.execute(merchant, command, answer).await {
            Ok(executed) => Some(executed),
            Err(e) => {
                tracing::warn!(reference = %payment.reference, error = %e, "could not keep the provider's payment page");
                None
            }
        }
    }

    /// Whether `amount` of a payment (all that is left when `None`) can go back to the payer: see
    /// [`Flow::refund_route`]. A payment not found, or whose refund the engine refuses anyway (not paid, a refund
    /// under way, more than is left: a replay too), is left to the engine, whose answer says why. A payment no
    /// active adapter carries (its adapter's settings gone) cannot be refunded now: accepted, its refund would
    /// wait with no way out, and be sent whichever way that adapter can once it is back.
    pub async fn refund_possible(
        &self,
        merchant: &MerchantId,
        reference: &str,
        amount: Option<Amount>,
    ) -> Result<bool, EngineError> {
        let Some(payment) = self.engine.payment(merchant, reference).await? else { return Ok(true) };
        let latest = payment.refund.as_ref().map(|r| r.status);
        let amount = amount.unwrap_or_else(|| payment.refundable());
        if !payment_refund_allowed(payment.status, latest) || amount > payment.refundable() || amount == Amount::ZERO {
            return Ok(true);
        }
        if self.try_carrier(&Record::Payment(payment.clone()), TransactionType::Payment)?.is_none() {
            return Ok(false);
        }
        Ok(self.refund_route(&payment, amount).is_some())
    }

    /// The adapter a refund of `amount` of `payment` goes through: the payment's own when it can send it back
    /// (a refund API, or its own payout to the payer), else the first other active adapter that pays the
    /// payment's fournisseur at the payer's phone, where it goes as a payout (Orange Web Payment collects only;
    /// pawaPay or MTN pay Orange's and MTN's customers). `None`: no way back.
    pub fn refund_route(&self, payment: &Payment, amount: Amount) -> Option<AdapterName> {
        let carrier = self.carrier(&Record::Payment(payment.clone()), TransactionType::Payment)?;
        if carrier.adapter.can_refund(payment, amount) {
            return Some(carrier.name);
        }
        let (code, phone) = (payment.provider.as_str(), &payment.customer_phone);
        // Never the simulator: a real payment's money must really go back.
        let (name, _) = self.providers.named_adapters().find(|(name, adapter)| {
            name.as_str() != carrier.name.as_str()
                && name.as_str() != "sandbox"
                && adapter.pays_out(code, phone)
                && adapter.check_amount(code, phone, crate::config::Operation::Payout, payment.currency, amount).is_ok()
        })?;
        AdapterName::parse(name).ok()
    }

    /// Records the refund request (the amount reserved), durably, then asks the provider to send it.
    pub async fn request_refund(
        &self,
        merchant: &MerchantId,
        command: Command,
        idempotency: Option<Idempotency>,
    ) -> Result<Executed, EngineError> {
        // The refund goes the way its payment went, or as a payout through another adapter (refund_route).
        let route = match &command {
            Command::RequestRefund { reference, amount, .. } => {
                match self.engine.payment(merchant, reference.as_str()).await? {
                    Some(p) => {
                        let amount = amount.unwrap_or_else(|| p.refundable());
                        self.refund_route(&p, amount).map(|adapter| ProviderRoute { adapter, return_url: None })
                    }
                    None => None,
                }
            }
            _ => None,
        };
        let note = ProviderNote { route, reference: None };
        let (executed, answer, held) = self.first_change(merchant, command, idempotency, note).await?;
        // Reserved and durable; the reconciliation asks the provider again if this call is lost.
        let sent = match &executed {
            Executed::Done(record @ Record::Payment(p)) => {
                match (self.carrier(record, TransactionType::Refund), &p.refund) {
                    // The payment's own adapter, which cannot send this back (a card's money is never sent to
                    // a phone): the refund was accepted while its payment was not yet paid, before any way back
                    // was looked for. Refused before anything is sent, so its reservation is released.
                    (Some(carrier), Some(refund))
                        if carrier.subject == Subject::Refund && !carrier.adapter.can_refund(p, refund.amount) =>
                    {
                        Err(ProviderError::Rejected { code: "refund_unsupported".into() })
                    }
                    (Some(carrier), Some(refund)) => Self::within_budget(send_refund(&carrier, p, refund)).await,
                    _ => Ok(()),
                }
            }
            _ => Ok(()),
        };
        Ok(self.after_sending(merchant, executed, TransactionType::Refund, sent, answer, held).await)
    }

    /// Records the payout (the amount reserved) with its route, durably, then asks the provider to send it.
    pub async fn create_payout(
        &self,
        merchant: &MerchantId,
        new: NewPayout,
        route: Option<ProviderRoute>,
        idempotency: Option<Idempotency>,
    ) -> Result<Executed, EngineError> {
        let note = ProviderNote { route, reference: None };
        let (executed, answer, held) =
            self.first_change(merchant, Command::CreatePayout(new), idempotency, note).await?;
        let sent = match &executed {
            Executed::Done(record @ Record::Payout(o)) => match self.carrier(record, TransactionType::Payout) {
                Some(carrier) => Self::within_budget(carrier.adapter.payout(o)).await,
                None => Ok(()),
            },
            _ => Ok(()),
        };
        Ok(self.after_sending(merchant, executed, TransactionType::Payout, sent, answer, held).await)
    }

    /// What a refund's or a payout's request came to ([`Flow::after_request`]), settled at once when it was
    /// sent and its provider's answer is final at once ([`Flow::settle_now`]); then the request's key goes.
    async fn after_sending(
        &self,
        merchant: &MerchantId,
        executed: Executed,
        kind: TransactionType,
        sent: Result<(), ProviderError>,
        answer: Option<Idempotency>,
        held: Option<IdempotencyKey>,
    ) -> Executed {
        let settled = sent.is_ok();
        let executed = self.after_request(merchant, executed, kind, sent, answer.clone()).await;
        let executed = match settled {
            true => self.settle_now(merchant, executed, kind, answer).await,
            false => executed,
        };
        self.release(merchant, held).await;
        executed
    }

    /// For a provider whose answer to a request is final at once ([`Adapter::settles_at_once`]), asks its status
    /// right away and applies it; anything else (or a failed query) leaves it to the reconciliation.
    async fn settle_now(
        &self,
        merchant: &MerchantId,
        executed: Executed,
        kind: TransactionType,
        answer: Option<Idempotency>,
    ) -> Executed {
        let Executed::Done(record) = &executed else { return executed };
        let Some(carrier) = self.carrier(record, kind) else { return executed };
        if !carrier.adapter.settles_at_once(carrier.subject) {
            return executed;
        }
        let asked = carrier.adapter.status(carrier.subject, &carrier.transaction_id, carrier.payment.as_ref());
        let report = match Self::within_budget(asked).await {
            Ok(report) => report,
            Err(e) => {
                tracing::info!(key = %record.key(), error = %e, "status after the request unknown; the reconciliation asks again");
                return executed;
            }
        };
        let reference = match record {
            Record::Payment(p) if kind == TransactionType::Refund => p.refund.as_ref().map(|r| r.reference.clone()),
            other => Some(other.key().to_owned()),
        };
        let Some(reference) = reference else { return executed };
        let located = Located { kind, reference, record: record.clone() };
        match apply_provider_status_answering(&self.engine, merchant, &located, &report, false, answer).await {
            Ok(Some(after)) => after,
            Ok(None) => executed,
            Err(e) => {
                tracing::warn!(error = %e, "could not apply the provider's answer; the reconciliation asks again");
                executed
            }
        }
    }
}

/// Sends a refund the way its carrier says: a refund, or a payout to the payer ([`refund_as_payout`]).
pub fn send_refund(
    carrier: &Carrier,
    payment: &Payment,
    refund: &caisse_engine::domain::records::Refund,
) -> crate::providers::LocalFuture<Result<(), ProviderError>> {
    match carrier.subject {
        Subject::Payout => carrier.adapter.payout(&refund_as_payout(payment, refund)),
        _ => carrier.adapter.refund(payment, refund),
    }
}

/// A refund as the payout that carries it to the payer: the refund's own id and transaction id, its amount in
/// full (no fee on a refund), the payment's fournisseur, currency and customer.
pub fn refund_as_payout(
    payment: &Payment,
    refund: &caisse_engine::domain::records::Refund,
) -> caisse_engine::domain::records::Payout {
    caisse_engine::domain::records::Payout {
        id: refund.reference.clone(),
        transaction_id: refund.transaction_id(),
        status: caisse_engine::domain::status::PayoutStatus::Pending,
        amount: refund.amount,
        currency: payment.currency,
        fee: Amount::ZERO,
        net_amount: refund.amount,
        provider: payment.provider.clone(),
        beneficiary_phone: payment.customer_phone.clone(),
        beneficiary_name: payment.customer_name.clone(),
        description: None,
        metadata: caisse_engine::domain::text::Metadata::empty(),
        created_at: refund.created_at,
        updated_at: refund.created_at,
        processed_at: None,
        rejection_reason: None,
        reference: None,
    }
}
