//! A provider's answer: authenticated, located, confirmed with a status query, then applied through the
//! merchant's actor. Duplicates and stale answers change nothing.

use std::time::Duration;

use caisse_engine::core::Record;
use caisse_engine::domain::ids::MerchantId;
use caisse_engine::domain::money::{Amount, Currency};
use caisse_engine::domain::records::TransactionType;
use caisse_engine::domain::status::{PayoutStatus, RefundStatus};
use caisse_engine::store::Located;
use caisse_engine::{
    Command, Engine, EngineError, Executed, Idempotency, PaymentNotice, PayoutOutcome, ProviderNote, RefundOutcome,
};

use super::Flow;
use std::sync::Arc;

use crate::providers::{Adapter, Callback, ProviderError, ProviderStatus, Report, Subject};

/// Status queries one adapter makes at once to confirm callbacks, of the calls it may have in flight (32): a
/// flood of callbacks (anyone may post one naming a transaction they know, and unsigned ones are confirmed)
/// leaves the rest to new payments, payouts and the sweeps.
pub(crate) const CONFIRMING_AT_ONCE: usize = 8;

/// How long a callback waits for one of those queries before it is answered 503, for its provider to send
/// again (and the reconciliation sweep to ask in any case).
const CONFIRM_WAIT: Duration = Duration::from_secs(5);

/// Why a provider's notice was not applied.
#[derive(Debug, thiserror::Error)]
pub enum NoticeError {
    #[error("no provider `{0}`")]
    UnknownProvider(String),
    #[error("`{0}` is not active")]
    InactiveProvider(String),
    #[error("notice refused: {0}")]
    Unauthenticated(String),
    #[error("{0}")]
    Malformed(String),
    #[error("no such transaction")]
    UnknownTransaction,
    #[error("the provider could not confirm the notice: {0}")]
    Unconfirmed(String),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl Flow {
    /// Handles one notice of the sandbox simulator, sent to `/v1/fournisseurs/{code}/notifications`.
    pub async fn provider_notice(&self, code: &str, callback: Callback) -> Result<(), NoticeError> {
        self.providers.get(code).ok_or_else(|| NoticeError::UnknownProvider(code.to_owned()))?;
        let adapter =
            self.providers.adapter("sandbox").ok_or_else(|| NoticeError::InactiveProvider(code.to_owned()))?;
        self.confirm_and_apply(adapter, Door::Provider(code), callback, None, false).await
    }

    /// Handles one callback of a provider's adapter, sent to `/v1/notifications/{adapter}`. A callback about a
    /// transaction that is not Caisse's is answered 200 and changes nothing, so the provider stops sending it.
    pub async fn adapter_notice(&self, name: &str, token: Option<&str>, callback: Callback) -> Result<(), NoticeError> {
        let adapter = self.providers.adapter(name).ok_or_else(|| NoticeError::UnknownProvider(name.to_owned()))?;
        self.confirm_and_apply(adapter, Door::Adapter(name), callback, token, true).await
    }

    /// True when the transaction is one that this door's provider carries: the fournisseur named in the path,
    /// or the adapter that carries the transaction ([`Flow::carrier`]).
    fn came_through(&self, door: &Door<'_>, located: &Located) -> bool {
        match door {
            Door::Provider(path_code) => {
                let code = match &located.record {
                    Record::Payment(p) => p.provider.as_str(),
                    Record::Payout(o) => o.provider.as_str(),
                    Record::Link(_) => return false,
                };
                *path_code == code
            }
            Door::Adapter(name) => {
                self.carrier(&located.record, located.kind).is_some_and(|carrier| carrier.name.as_str() == *name)
            }
        }
    }

    async fn confirm_and_apply(
        &self,
        adapter: Arc<dyn Adapter>,
        door: Door<'_>,
        callback: Callback,
        token: Option<&str>,
        unknown_is_fine: bool,
    ) -> Result<(), NoticeError> {
        adapter.authenticate(callback.clone()).await.map_err(|e| match e {
            ProviderError::Unauthenticated(why) => NoticeError::Unauthenticated(why),
            ProviderError::Unreachable(why) => NoticeError::Unconfirmed(why),
            other => NoticeError::Malformed(other.to_string()),
        })?;
        let notice = match adapter.parse_notice(&callback.headers, token, &callback.body) {
            Ok(notice) => notice,
            Err(ProviderError::Unauthenticated(why)) => return Err(NoticeError::Unauthenticated(why)),
            Err(ProviderError::NotOurs(id)) if unknown_is_fine => {
                tracing::info!(id = %id, "callback about a transaction that is not ours; ignored");
                return Ok(());
            }
            Err(other) => return Err(NoticeError::Malformed(other.to_string())),
        };
        let Some((merchant, located)) = self.engine.owner_of_transaction(&notice.transaction_id)? else {
            return if unknown_is_fine { Ok(()) } else { Err(NoticeError::UnknownTransaction) };
        };
        // A notice at another provider's door changes nothing, whatever the provider it reached would answer.
        if !self.came_through(&door, &located) {
            tracing::warn!(tx = %notice.transaction_id, "notice about a transaction of another provider; ignored");
            return Ok(());
        }
        if settled(&located) {
            tracing::debug!(tx = %notice.transaction_id, "notice about a transaction that has ended; nothing to ask");
            adapter.notice_handled(&callback.headers, &callback.body);
            return Ok(());
        }
        // A notice says only that something changed: what changed is asked of the provider.
        let payment = match (&located.record, notice.subject) {
            (Record::Payment(p), Subject::Payment | Subject::Refund) => Some(p),
            _ => None,
        };
        let lane = match &door {
            Door::Adapter(name) => *name,
            Door::Provider(_) => "sandbox",
        };
        let confirmed = {
            // Held for the query alone: applying its answer waits for the store, which is not the provider's.
            let _confirming = self.confirming_permit(lane).await?;
            adapter.status(notice.subject, &notice.transaction_id, payment).await.map_err(|e| {
                tracing::warn!(tx = %notice.transaction_id, error = %e, "status query failed");
                NoticeError::Unconfirmed(e.to_string())
            })?
        };
        apply_provider_status(&self.engine, &merchant, &located, &confirmed, false).await?;
        adapter.notice_handled(&callback.headers, &callback.body);
        Ok(())
    }
}

impl Flow {
    /// One of the adapter's [`CONFIRMING_AT_ONCE`] status queries for callbacks, waited for at most
    /// [`CONFIRM_WAIT`].
    async fn confirming_permit(&self, adapter: &str) -> Result<tokio::sync::OwnedSemaphorePermit, NoticeError> {
        let permits = self
            .confirming
            .entry(adapter.to_owned())
            .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(CONFIRMING_AT_ONCE)))
            .clone();
        match actix_web::rt::time::timeout(CONFIRM_WAIT, permits.acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(NoticeError::Unconfirmed(format!("too many {adapter} callbacks being confirmed; send it again"))),
        }
    }
}

/// Whether no answer of a provider can change the transaction `located` any more: a payment in a final status
/// with no refund under way (`expire` is not final: a late success may come), or a payout that ended. A callback
/// about it is not confirmed with a status query, which would learn nothing, and which a stream of forged
/// callbacks naming it would otherwise turn into a stream of queries to the provider.
fn settled(located: &Located) -> bool {
    match &located.record {
        Record::Payment(p) => p.status.is_final() && p.refunds.iter().all(|r| r.status != RefundStatus::Processing),
        Record::Payout(o) => o.status != PayoutStatus::Pending,
        Record::Link(_) => false,
    }
}

/// Where a notice came in: the sandbox's path names a fournisseur, a provider's callback path an adapter.
enum Door<'a> {
    Provider(&'a str),
    Adapter(&'a str),
}

/// The amounts Caisse asked the provider to move for the transaction `located` names: a payment's amount, a
/// refund's, a payout's net amount (and its gross amount, which earlier releases sent through MTN and pawaPay).
fn asked(located: &Located) -> Vec<(Amount, Currency)> {
    match (&located.record, located.kind) {
        (Record::Payment(p), TransactionType::Payment) => vec![(p.amount, p.currency)],
        (Record::Payment(p), _) => {
            let refund = match p.refund_named(&located.reference) {
                Some(named) => Some(named),
                None if located.reference == p.reference.as_str() => p.refund.as_ref(),
                None => None,
            };
            refund.map(|r| vec![(r.amount, p.currency)]).unwrap_or_default()
        }
        (Record::Payout(o), _) => vec![(o.net_amount, o.currency), (o.amount, o.currency)],
        (Record::Link(_), _) => Vec::new(),
    }
}

/// Applies a confirmed provider status to the record it is about, keeping the provider's reference with the
/// change it causes. `expire` is set by the TTL sweep: a payment with no final answer then expires. Returns
/// `None` when the status asks for nothing.
pub async fn apply_provider_status(
    engine: &Engine,
    merchant: &MerchantId,
    located: &Located,
    report: &Report,
    expire: bool,
) -> Result<Option<Executed>, EngineError> {
    apply_provider_status_answering(engine, merchant, located, report, expire, None).await
}

/// [`apply_provider_status`] within the request that made the transaction, before it is answered: `answer` is
/// that request's idempotency ([`Idempotency::following`]), so that a replay answers what this change made.
pub async fn apply_provider_status_answering(
    engine: &Engine,
    merchant: &MerchantId,
    located: &Located,
    report: &Report,
    expire: bool,
    answer: Option<Idempotency>,
) -> Result<Option<Executed>, EngineError> {
    if let (ProviderStatus::Succeeded, Some(stated)) = (&report.status, &report.stated) {
        if !asked(located).iter().any(|(a, c)| stated.is(*a, *c)) {
            // A provider's answer is untrusted input: a success of another amount than Caisse asked is not this
            // transaction's (or not as asked), and moves no money. Nothing is applied, not even the TTL's
            // expiry (the customer may have paid): the transaction waits, for the operator to see.
            tracing::error!(
                reference = %located.reference,
                stated = %stated,
                asked = ?asked(located),
                "the provider reports a success of another amount than Caisse asked; not applied"
            );
            return Ok(None);
        }
    }
    let status = &report.status;
    let command = match (&located.record, located.kind) {
        (Record::Payment(p), TransactionType::Payment) => {
            let notice = match status {
                ProviderStatus::Succeeded => Some(PaymentNotice::Confirmed),
                ProviderStatus::Failed { code } => Some(PaymentNotice::Declined { failure_code: code.clone() }),
                ProviderStatus::Expired => Some(PaymentNotice::Expired),
                _ if expire => Some(PaymentNotice::Expired),
                // A page the payment lacks (its keeping failed) is kept now.
                ProviderStatus::Processing => match (&report.page, &p.payment_url) {
                    (Some(page), None) => Some(PaymentNotice::Opened { payment_url: page.clone() }),
                    _ => Some(PaymentNotice::Processing),
                },
                ProviderStatus::Pending => None,
            };
            notice.map(|notice| Command::PaymentNotice { reference: p.reference.clone(), notice })
        }
        (Record::Payment(p), _) => {
            let outcome = match status {
                ProviderStatus::Succeeded => Some(RefundOutcome::Completed),
                ProviderStatus::Failed { .. } | ProviderStatus::Expired => Some(RefundOutcome::Refused),
                _ => None,
            };
            // Located by the refund's own id, or by its payment (the sweep's pending work), whose refund
            // under way is always its latest; any other reference names no refund of this payment.
            let refund = match p.refund_named(&located.reference) {
                Some(named) => Some(named),
                None if located.reference == p.reference.as_str() => p.refund.as_ref(),
                None => None,
            }
            .map(|r| r.reference.clone());
            match (outcome, refund) {
                (Some(outcome), Some(refund)) => {
                    Some(Command::RefundNotice { reference: p.reference.clone(), refund, outcome })
                }
                _ => None,
            }
        }
        (Record::Payout(o), _) => {
            let outcome = match status {
                ProviderStatus::Succeeded => Some(PayoutOutcome::Sent),
                ProviderStatus::Failed { code } => Some(PayoutOutcome::Refused { reason: code.clone() }),
                ProviderStatus::Expired => Some(PayoutOutcome::Refused { reason: "expired".into() }),
                _ => None,
            };
            outcome.map(|outcome| Command::PayoutNotice { id: o.id.clone(), outcome })
        }
        // A link is never located by a transaction id; nothing a provider says is about one.
        (Record::Link(_), _) => None,
    };
    let note = ProviderNote { route: None, reference: report.reference.clone() };
    match command {
        Some(command) => engine.execute_noted(merchant, command, answer, note).await.map(Some),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use caisse_engine::domain::records::Payment;
    use serde_json::{json, Value};

    fn payment(status: &str, refunds: Value) -> Located {
        let payment: Payment = serde_json::from_value(json!({
            "reference": "pay_01M99FN8W49KA4XQ5ED8132K13", "transaction_id": "tx_01M99FN8W49KA4XQ5ED8132K14",
            "statut": status, "montant": 1000, "devise": "XOF", "frais": 15, "montant_net": 985,
            "fournisseur": "mtn_momo", "client_telephone": "+22997000055", "client_email": null, "client_nom": null,
            "description": null, "metadata": {}, "created_at": "2026-12-08T00:09:54.476Z",
            "updated_at": "2026-12-08T00:09:54.476Z", "paid_at": null, "failure_code": null, "remboursement": null,
            "pays": "BJ", "url_paiement": null, "montant_rembourse": 0, "remboursements": refunds
        }))
        .expect("a payment");
        Located {
            kind: TransactionType::Payment,
            reference: payment.reference.as_str().to_owned(),
            record: Record::Payment(payment),
        }
    }

    fn refund(status: &str) -> Value {
        json!([{"reference": "rmb_01M99FN8W49KA4XQ5ED8132K15", "montant": 500, "motif": null, "statut": status,
            "created_at": "2026-12-08T00:09:54.476Z", "completed_at": null}])
    }

    /// Only what no provider's answer can move any more is left unasked: a payment still open or expired (a late
    /// success), and one whose refund is under way, are asked about.
    #[test]
    fn only_what_no_answer_can_move_is_settled() {
        for open in ["initie", "en_cours", "expire"] {
            assert!(!settled(&payment(open, json!([]))), "{open}");
        }
        for ended in ["succes", "echec", "rembourse", "rembourse_partiellement"] {
            assert!(settled(&payment(ended, json!([]))), "{ended}");
        }
        assert!(!settled(&payment("succes", refund("en_cours"))), "a refund under way");
        assert!(!settled(&payment("rembourse_partiellement", refund("en_cours"))), "another refund under way");
        assert!(settled(&payment("rembourse_partiellement", refund("succes"))));
        assert!(settled(&payment("succes", refund("echec"))));
    }
}
