//! The payout transitions: creating a payout, which reserves its amount, and the provider's answer.

use super::{
    moved, split_fee, Ctx, Decided, Decision, IdSource, NewPayout, NewTransaction, PayoutOutcome, Record, Rejection,
};
use crate::domain::ids::IdKind;
use crate::domain::ledger::{postings, Movement};
use crate::domain::records::{sibling_transaction_id, Payout, TransactionType, WebhookData};
use crate::domain::status::{transition, PayoutStatus, Status, Trigger};

impl Ctx<'_> {
    pub(super) fn create_payout(&self, new: &NewPayout, ids: IdSource<'_>) -> Result<Decided, Rejection> {
        let (fee, net_amount) = split_fee(new.amount, &new.fee)?;
        let rule = moved(transition(None, Trigger::PayoutRequested)?)
            .ok_or(Rejection::impossible("the rules table has no first move on PayoutRequested"))?;
        let Status::Payout(status) = rule.to else {
            return Err(Rejection::impossible("a payout rule leads to another kind's status"));
        };
        let entries = postings(rule.effect, Movement { currency: new.currency, amount: new.amount, fee, net_amount })
            .map_err(Rejection::Invariant)?;
        let balances = self.balances_after(&entries, new.currency, new.amount)?;
        let id = ids(IdKind::Payout);
        let payout = Payout {
            transaction_id: sibling_transaction_id(&id),
            id,
            status,
            amount: new.amount,
            currency: new.currency,
            fee,
            net_amount,
            provider: new.provider.clone(),
            beneficiary_phone: new.beneficiary_phone.clone(),
            beneficiary_name: new.beneficiary_name.clone(),
            description: new.description.clone(),
            metadata: new.metadata.clone(),
            created_at: self.now,
            updated_at: self.now,
            processed_at: None,
            rejection_reason: None,
            reference: new.reference.clone(),
        };
        let created = NewTransaction {
            kind: TransactionType::Payout,
            transaction_id: payout.transaction_id.clone(),
            reference: payout.id.clone(),
            owner: payout.id.clone(),
            alias: new.reference.as_ref().map(|r| r.as_str().to_owned()),
        };
        Ok(Decided::Changed(Box::new(Decision {
            journal: self.journal(rule.on, &payout.id, status.as_str(), new.currency, entries),
            record: Record::Payout(payout),
            balances,
            created: Some(created),
            outbox: Vec::new(),
            linked: None,
        })))
    }

    pub(super) fn payout_notice(
        &self,
        o: &Payout,
        outcome: &PayoutOutcome,
        ids: IdSource<'_>,
    ) -> Result<Decided, Rejection> {
        let trigger = match outcome {
            PayoutOutcome::Sent => Trigger::PayoutSent,
            PayoutOutcome::Refused { .. } => Trigger::PayoutRefused,
        };
        let Some(rule) = moved(transition(Some(Status::Payout(o.status)), trigger)?) else {
            return Ok(Decided::Unchanged(Record::Payout(o.clone())));
        };
        let Status::Payout(status) = rule.to else {
            return Err(Rejection::impossible("a payout rule leads to another kind's status"));
        };
        let mut next = o.clone();
        next.status = status;
        next.updated_at = self.now;
        match outcome {
            PayoutOutcome::Sent if status == PayoutStatus::Sent => next.processed_at = Some(self.now),
            PayoutOutcome::Refused { reason } => next.rejection_reason = Some(reason.clone()),
            PayoutOutcome::Sent => {}
        }
        let m = Movement { currency: o.currency, amount: o.amount, fee: o.fee, net_amount: o.net_amount };
        let entries = postings(rule.effect, m).map_err(Rejection::Invariant)?;
        let balances = self.balances_after(&entries, o.currency, o.amount)?;
        let outbox = self.outbox(rule.event, WebhookData::of_payout(&next), ids)?;
        Ok(Decided::Changed(Box::new(Decision {
            journal: self.journal(trigger, &next.id, status.as_str(), o.currency, entries),
            record: Record::Payout(next),
            balances,
            created: None,
            outbox,
            linked: None,
        })))
    }
}
