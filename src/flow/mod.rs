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

pub mod notice;
pub mod sweep;

use caisse_engine::core::Record;
use caisse_engine::domain::ids::MerchantId;
use caisse_engine::{Command, Engine, EngineError, Executed, Idempotency, NewPayment, NewPayout};

use crate::providers::{Adapter, Providers};

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

    fn adapter(&self, code: &str) -> Option<std::sync::Arc<dyn Adapter>> {
        self.providers.get(code).and_then(|p| p.adapter.clone())
    }

    /// Creates the payment, durably, then asks its provider for the customer's approval.
    pub async fn initiate_payment(
        &self,
        merchant: &MerchantId,
        new: NewPayment,
        idempotency: Option<Idempotency>,
    ) -> Result<Executed, EngineError> {
        let executed = self.engine.execute(merchant, Command::InitiatePayment(new), idempotency).await?;
        if let Executed::Done(Record::Payment(payment)) = &executed {
            if let Some(adapter) = self.adapter(payment.provider.as_str()) {
                // The payment is durable; if the provider cannot be reached now, the TTL sweep settles it.
                if let Err(e) = adapter.request_to_pay(payment).await {
                    tracing::warn!(reference = %payment.reference, error = %e, "request to pay failed");
                }
            }
        }
        Ok(executed)
    }

    /// Records the refund request (the amount reserved), durably, then asks the provider to send it.
    pub async fn request_refund(
        &self,
        merchant: &MerchantId,
        command: Command,
        idempotency: Option<Idempotency>,
    ) -> Result<Executed, EngineError> {
        let executed = self.engine.execute(merchant, command, idempotency).await?;
        if let Executed::Done(Record::Payment(payment)) = &executed {
            if let (Some(adapter), Some(refund)) = (self.adapter(payment.provider.as_str()), &payment.refund) {
                // Reserved and durable; the reconciliation asks the provider again if this call is lost.
                if let Err(e) = adapter.refund(payment, refund).await {
                    tracing::warn!(reference = %payment.reference, error = %e, "refund request to provider failed");
                }
            }
        }
        Ok(executed)
    }

    /// Records the payout (the amount reserved), durably, then asks the provider to send it.
    pub async fn create_payout(
        &self,
        merchant: &MerchantId,
        new: NewPayout,
        idempotency: Option<Idempotency>,
    ) -> Result<Executed, EngineError> {
        let executed = self.engine.execute(merchant, Command::CreatePayout(new), idempotency).await?;
        if let Executed::Done(Record::Payout(payout)) = &executed {
            if let Some(adapter) = self.adapter(payout.provider.as_str()) {
                if let Err(e) = adapter.payout(payout).await {
                    tracing::warn!(payout = %payout.id, error = %e, "payout request to provider failed");
                }
            }
        }
        Ok(executed)
    }
}
