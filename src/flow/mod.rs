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
//!    still waiting is sent to its provider again ([`sweep`]).
//!
//! Providers' answers become engine commands in one function, [`notice::apply_provider_status`], used by all
//! three paths, so a status means the same thing wherever it comes from.

#[cfg(test)]
mod interleavings;
pub mod notice;
pub mod sweep;

use caisse_engine::core::Record;
use caisse_engine::domain::ids::MerchantId;
use caisse_engine::domain::phone::Phone;
use caisse_engine::domain::records::TransactionType;
use caisse_engine::store::Located;
use caisse_engine::{Command, Engine, EngineError, Executed, Idempotency, NewPayment, NewPayout};

use self::notice::apply_provider_status;
use crate::providers::{Adapter, ProviderError, ProviderStatus, Providers};

/// How long a merchant's request waits for the provider's answer to the request Caisse sends it. Beyond it the
/// answer goes out with the transaction as it is (created, durable), and the provider's answer comes later by
/// callback or status query; dropping the wait is safe because a retry or a query reuses the same id.
const REQUEST_BUDGET: std::time::Duration = std::time::Duration::from_secs(10);

/// The engine and the providers, which every step of a payment's life needs together. Cheap to clone.
#[derive(Clone)]
pub struct Flow {
    pub engine: Engine,
    pub providers: Providers,
}

impl Flow {
    pub fn new(engine: Engine, providers: Providers) -> Flow {
        Flow { engine, providers }
    }

    /// The adapter that carries `code` for this phone's country, when its route is active.
    pub fn adapter(&self, code: &str, phone: &Phone) -> Option<std::sync::Arc<dyn Adapter>> {
        self.providers.get(code).and_then(|p| p.adapter_for(phone))
    }

    /// Applies a provider's refusal of a request: the transaction fails with the provider's code. Answers
    /// the record after it, when it changed.
    async fn refused(
        &self,
        merchant: &MerchantId,
        record: &Record,
        kind: TransactionType,
        code: String,
    ) -> Option<Executed> {
        let key = match record {
            Record::Payment(p) if kind == TransactionType::Refund => p.refund.as_ref().map(|r| r.reference.clone()),
            other => Some(other.key().to_owned()),
        }?;
        let located = Located { kind, reference: key, record: record.clone() };
        match apply_provider_status(&self.engine, merchant, &located, &ProviderStatus::Failed { code }, false).await {
            Ok(executed) => executed,
            Err(e) => {
                tracing::warn!(error = %e, "could not apply the provider's refusal; the sweeps ask again");
                None
            }
        }
    }

    /// Waits for a request to the provider within [`REQUEST_BUDGET`].
    async fn within_budget(
        sent: impl std::future::Future<Output = Result<(), ProviderError>>,
    ) -> Result<(), ProviderError> {
        actix_web::rt::time::timeout(REQUEST_BUDGET, sent).await.unwrap_or_else(|_| {
            Err(ProviderError::Unreachable(format!("no answer within {REQUEST_BUDGET:?}; the sweeps ask again")))
        })
    }

    /// What a request to the provider came to: a refusal fails the transaction at once (and the answer shows
    /// it); anything else leaves it waiting, the sweeps asking again.
    async fn after_request(
        &self,
        merchant: &MerchantId,
        executed: Executed,
        kind: TransactionType,
        sent: Result<(), ProviderError>,
    ) -> Executed {
        let Executed::Done(record) = &executed else { return executed };
        match sent {
            Ok(()) => executed,
            Err(ProviderError::Rejected { code }) => {
                tracing::info!(key = %record.key(), %code, "the provider refused the request");
                self.refused(merchant, record, kind, code).await.unwrap_or(executed)
            }
            Err(e) => {
                tracing::warn!(key = %record.key(), error = %e, "request to the provider failed; the sweeps ask again");
                executed
            }
        }
    }

    /// Creates the payment, durably, then asks its provider for the customer's approval.
    pub async fn initiate_payment(
        &self,
        merchant: &MerchantId,
        new: NewPayment,
        idempotency: Option<Idempotency>,
    ) -> Result<Executed, EngineError> {
        let executed = self.engine.execute(merchant, Command::InitiatePayment(new), idempotency).await?;
        // The payment is durable; if the provider cannot be reached now, the TTL sweep settles it.
        let sent = match &executed {
            Executed::Done(Record::Payment(p)) => match self.adapter(p.provider.as_str(), &p.customer_phone) {
                Some(adapter) => Self::within_budget(adapter.request_to_pay(p)).await,
                None => Ok(()),
            },
            _ => Ok(()),
        };
        Ok(self.after_request(merchant, executed, TransactionType::Payment, sent).await)
    }

    /// Records the refund request (the amount reserved), durably, then asks the provider to send it.
    pub async fn request_refund(
        &self,
        merchant: &MerchantId,
        command: Command,
        idempotency: Option<Idempotency>,
    ) -> Result<Executed, EngineError> {
        let executed = self.engine.execute(merchant, command, idempotency).await?;
        // Reserved and durable; the reconciliation asks the provider again if this call is lost.
        let sent = match &executed {
            Executed::Done(Record::Payment(p)) => {
                match (self.adapter(p.provider.as_str(), &p.customer_phone), &p.refund) {
                    (Some(adapter), Some(refund)) => Self::within_budget(adapter.refund(p, refund)).await,
                    _ => Ok(()),
                }
            }
            _ => Ok(()),
        };
        Ok(self.after_request(merchant, executed, TransactionType::Refund, sent).await)
    }

    /// Records the payout (the amount reserved), durably, then asks the provider to send it.
    pub async fn create_payout(
        &self,
        merchant: &MerchantId,
        new: NewPayout,
        idempotency: Option<Idempotency>,
    ) -> Result<Executed, EngineError> {
        let executed = self.engine.execute(merchant, Command::CreatePayout(new), idempotency).await?;
        let sent = match &executed {
            Executed::Done(Record::Payout(o)) => match self.adapter(o.provider.as_str(), &o.beneficiary_phone) {
                Some(adapter) => Self::within_budget(adapter.payout(o)).await,
                None => Ok(()),
            },
            _ => Ok(()),
        };
        Ok(self.after_request(merchant, executed, TransactionType::Payout, sent).await)
    }
}
