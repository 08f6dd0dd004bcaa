//! Turning what a provider says into engine commands, in one place for the notice endpoint, the TTL sweep
//! and the restart resubmission.

use caisse_engine::core::Record;
use caisse_engine::domain::ids::MerchantId;
use caisse_engine::domain::records::TransactionType;
use caisse_engine::store::Located;
use caisse_engine::{Command, Engine, EngineError, Executed, PaymentNotice, PayoutOutcome, RefundOutcome};

use crate::providers::ProviderStatus;

/// Applies a confirmed provider status to the record it is about. `expire` is set by the TTL sweep: a
/// payment with no final answer then expires. Returns `None` when the status asks for nothing.
pub async fn settle(
    engine: &Engine,
    merchant: &MerchantId,
    located: &Located,
    status: &ProviderStatus,
    expire: bool,
) -> Result<Option<Executed>, EngineError> {
    let command = match (&located.record, located.kind) {
        (Record::Payment(p), TransactionType::Paiement) => {
            let notice = match status {
                ProviderStatus::Succeeded => Some(PaymentNotice::Confirmed),
                ProviderStatus::Failed { code } => Some(PaymentNotice::Declined { failure_code: code.clone() }),
                _ if expire => Some(PaymentNotice::Expired),
                ProviderStatus::Processing => Some(PaymentNotice::Processing),
                ProviderStatus::Pending => None,
            };
            notice.map(|notice| Command::PaymentNotice { reference: p.reference.clone(), notice })
        }
        (Record::Payment(p), _) => {
            let outcome = match status {
                ProviderStatus::Succeeded => Some(RefundOutcome::Completed),
                ProviderStatus::Failed { .. } => Some(RefundOutcome::Refused),
                _ => None,
            };
            outcome.map(|outcome| Command::RefundNotice { reference: p.reference.clone(), outcome })
        }
        (Record::Payout(o), _) => {
            let outcome = match status {
                ProviderStatus::Succeeded => Some(PayoutOutcome::Sent),
                ProviderStatus::Failed { code } => Some(PayoutOutcome::Refused { motif: code.clone() }),
                _ => None,
            };
            outcome.map(|outcome| Command::PayoutNotice { id: o.id.clone(), outcome })
        }
    };
    match command {
        Some(command) => engine.execute(merchant, command, None).await.map(Some),
        None => Ok(None),
    }
}
