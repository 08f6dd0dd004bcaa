//! The refund transitions: requesting a refund of a payment (several per payment, one at a time, their sum
//! never above the payment's amount), and the provider's answer, which also moves the payment when the refund
//! completes.

use super::{moved, Ctx, Decided, Decision, IdSource, NewTransaction, Record, RefundOutcome, Rejection};
use crate::domain::ids::IdKind;
use crate::domain::ledger::{postings, Movement};
use crate::domain::money::Amount;
use crate::domain::records::{Payment, Refund, TransactionType, WebhookData, MAX_REFUNDS_PER_PAYMENT};
use crate::domain::status::{
    payment_refund_allowed, transition, InvalidTransition, RefundStatus, Status, Step, Trigger,
};
use crate::domain::text::Reason;

impl Ctx<'_> {
    pub(super) fn request_refund(
        &self,
        p: &Payment,
        amount: Option<Amount>,
        reason: Option<Reason>,
        ids: IdSource<'_>,
    ) -> Result<Decided, Rejection> {
        let latest = p.refund.as_ref().map(|r| r.status);
        if !payment_refund_allowed(p.status, latest) {
            return Err(
                InvalidTransition { from: Some(Status::Payment(p.status)), on: Trigger::RefundRequested }.into()
            );
        }
        if p.refunds.len() >= MAX_REFUNDS_PER_PAYMENT {
            return Err(Rejection::InvalidState(format!(
                "this payment already has {MAX_REFUNDS_PER_PAYMENT} refunds, the most one payment takes"
            )));
        }
        // Without an amount, the merchant asks for what is left; a refused refund gave its part back.
        let left = p.refundable();
        let amount = amount.unwrap_or(left);
        if amount > left || amount == Amount::ZERO {
            return Err(Rejection::RefundAboveAmount { amount_minor: p.amount.minor(), left_minor: left.minor() });
        }
        let rule = moved(transition(None, Trigger::RefundRequested)?)
            .ok_or(Rejection::impossible("the rules table has no first move on RefundRequested"))?;
        let Status::Refund(status) = rule.to else {
            return Err(Rejection::impossible("a refund rule leads to another kind's status"));
        };
        let refund_move = Movement { currency: p.currency, amount, fee: Amount::ZERO, net_amount: amount };
        let entries = postings(rule.effect, refund_move).map_err(Rejection::Invariant)?;
        let balances = self.balances_after(&entries, p.currency, amount)?;
        let refund =
            Refund { reference: ids(IdKind::Refund), amount, reason, status, created_at: self.now, completed_at: None };
        let mut next = p.clone();
        next.updated_at = self.now;
        let created = NewTransaction {
            kind: TransactionType::Refund,
            transaction_id: refund.transaction_id(),
            reference: refund.reference.clone(),
            owner: p.reference.as_str().to_owned(),
            alias: None,
        };
        next.push_refund(refund);
        Ok(Decided::Changed(Box::new(Decision {
            journal: self.journal(rule.on, &created.reference, status.as_str(), p.currency, entries),
            record: Record::Payment(next),
            balances,
            created: Some(created),
            outbox: Vec::new(),
            linked: None,
        })))
    }

    pub(super) fn refund_notice(
        &self,
        p: &Payment,
        reference: &str,
        outcome: RefundOutcome,
        ids: IdSource<'_>,
    ) -> Result<Decided, Rejection> {
        // A notice about a refund that was never requested names nothing: not found, as for any reference.
        let Some(refund) = p.refund_named(reference) else { return Err(Rejection::NotFound) };
        let trigger = match outcome {
            RefundOutcome::Completed => Trigger::RefundCompleted,
            RefundOutcome::Refused => Trigger::RefundRefused,
        };
        let Some(rule) = moved(transition(Some(Status::Refund(refund.status)), trigger)?) else {
            return Ok(Decided::Unchanged(Record::Payment(p.clone())));
        };
        let Status::Refund(refund_status) = rule.to else {
            return Err(Rejection::impossible("a refund rule leads to another kind's status"));
        };
        let mut next = p.clone();
        next.updated_at = self.now;
        let mut event = None;
        if refund_status == RefundStatus::Succeeded {
            // Completing the refund also moves the payment; both machines must agree or nothing changes.
            let refunded = p.refunded_amount.checked_add(refund.amount)?;
            if refunded > p.amount {
                return Err(Rejection::impossible("completed refunds above the payment's amount"));
            }
            let on = if refunded == p.amount { Trigger::RefundedInFull } else { Trigger::RefundedInPart };
            match transition(Some(Status::Payment(p.status)), on)? {
                Step::Move(pay_rule) => {
                    if let Status::Payment(s) = pay_rule.to {
                        next.status = s;
                    }
                    event = pay_rule.event;
                }
                Step::Unchanged => return Ok(Decided::Unchanged(Record::Payment(p.clone()))),
            }
            next.refunded_amount = refunded;
        }
        let refund_move =
            Movement { currency: p.currency, amount: refund.amount, fee: Amount::ZERO, net_amount: refund.amount };
        let entries = postings(rule.effect, refund_move).map_err(Rejection::Invariant)?;
        let balances = self.balances_after(&entries, p.currency, refund.amount)?;
        let mut updated_refund = refund.clone();
        updated_refund.status = refund_status;
        updated_refund.completed_at = Some(self.now);
        let journal = self.journal(trigger, &refund.reference, refund_status.as_str(), p.currency, entries);
        next.replace_refund(updated_refund);
        let outbox = self.outbox(event, WebhookData::of_refunded_payment(&next), ids)?;
        Ok(Decided::Changed(Box::new(Decision {
            record: Record::Payment(next),
            journal,
            balances,
            created: None,
            outbox,
            linked: None,
        })))
    }
}
