//! The payment transitions: initiating a payment and applying what a provider (or the expiry timer) says
//! about it.

use super::{
    moved, split_fee, Ctx, Decided, Decision, IdSource, NewPayment, NewTransaction, PaymentNotice, Record, Rejection,
};
use crate::domain::ids::IdKind;
use crate::domain::ledger::{postings, Movement};
use crate::domain::links::{link_of, Link, LINK_METADATA_KEY};
use crate::domain::money::Amount;
use crate::domain::records::{Payment, TransactionType, WebhookData};
use crate::domain::status::{transition, PaymentStatus, Status, Trigger};
use crate::domain::text::Reference;

impl Ctx<'_> {
    pub(super) fn initiate(
        &self,
        new: &NewPayment,
        link: Option<&Link>,
        ids: IdSource<'_>,
    ) -> Result<Decided, Rejection> {
        let (fee, net_amount) = split_fee(new.amount, &new.fee)?;
        let rule = moved(transition(None, Trigger::PaymentAccepted)?)
            .ok_or(Rejection::impossible("the rules table has no first move on PaymentAccepted"))?;
        let Status::Payment(status) = rule.to else {
            return Err(Rejection::impossible("a payment rule leads to another kind's status"));
        };
        let reference = match &new.reference {
            Some(r) => r.clone(),
            None => Reference::parse(&ids(IdKind::Payment))
                .map_err(|e| Rejection::InvalidState(format!("generated reference refused: {e}")))?,
        };
        let payment = Payment {
            reference,
            transaction_id: ids(IdKind::Transaction),
            status,
            amount: new.amount,
            currency: new.currency,
            fee,
            net_amount,
            provider: new.provider.clone(),
            customer_phone: new.customer_phone.clone(),
            customer_email: new.customer_email.clone(),
            customer_name: new.customer_name.clone(),
            description: new.description.clone(),
            metadata: match &new.link {
                Some(id) => new.metadata.with(LINK_METADATA_KEY, id).map_err(|e| {
                    Rejection::InvalidState(format!("the link's metadata leaves no room for {LINK_METADATA_KEY}: {e}"))
                })?,
                None => new.metadata.clone(),
            },
            created_at: self.now,
            updated_at: self.now,
            paid_at: None,
            failure_code: None,
            refund: None,
            country: new.customer_phone.country().map(str::to_owned),
            payment_url: None,
            refunded_amount: Amount::ZERO,
            refunds: Vec::new(),
        };
        if let Some(named) = &new.link {
            self.check_link_open(named, link, &payment)?;
        }
        let balances = self.balances_after(&[], new.currency, Amount::ZERO)?;
        let outbox = self.outbox(rule.event, WebhookData::of_payment(&payment), ids)?;
        let reference = payment.reference.as_str().to_owned();
        Ok(Decided::Changed(Box::new(Decision {
            journal: self.journal(rule.on, &reference, status.as_str(), new.currency, Vec::new()),
            created: Some(NewTransaction {
                kind: TransactionType::Payment,
                transaction_id: payment.transaction_id.clone(),
                reference: reference.clone(),
                owner: reference,
                alias: None,
            }),
            record: Record::Payment(payment),
            balances,
            outbox,
            linked: None,
        })))
    }

    pub(super) fn payment_notice(
        &self,
        p: &Payment,
        notice: &PaymentNotice,
        link: Option<&Link>,
        ids: IdSource<'_>,
    ) -> Result<Decided, Rejection> {
        let trigger = match notice {
            PaymentNotice::Processing | PaymentNotice::Opened { .. } => Trigger::ProviderProcessing,
            PaymentNotice::Confirmed => Trigger::ProviderConfirmed,
            PaymentNotice::Declined { .. } => Trigger::ProviderDeclined,
            PaymentNotice::Expired => Trigger::TtlExpired,
        };
        let Some(rule) = moved(transition(Some(Status::Payment(p.status)), trigger)?) else {
            return self.payment_url_only(p, notice);
        };
        let Status::Payment(status) = rule.to else {
            return Err(Rejection::impossible("a payment rule leads to another kind's status"));
        };
        let mut next = p.clone();
        next.status = status;
        next.updated_at = self.now;
        if let PaymentNotice::Opened { payment_url } = notice {
            next.payment_url = Some(payment_url.as_str().to_owned());
        }
        match (status, notice) {
            (PaymentStatus::Succeeded, _) => {
                next.paid_at = Some(self.now);
                next.failure_code = None;
            }
            (PaymentStatus::Failed, PaymentNotice::Declined { failure_code }) => {
                next.failure_code = Some(failure_code.clone());
            }
            (PaymentStatus::Expired, _) => next.failure_code = Some("expired".into()),
            _ => {}
        }
        let entries = postings(rule.effect, movement(&next)).map_err(Rejection::Invariant)?;
        let balances = self.balances_after(&entries, next.currency, next.amount)?;
        let outbox = self.outbox(rule.event, WebhookData::of_payment(&next), ids)?;
        // Only the link the payment names is counted, and only in its own currency: a link of another id or
        // currency (never passed by the actor: a payment through a link asks its amount) is left as it is, and
        // the success is credited all the same.
        let linked = match (status, link_of(&next.metadata), link) {
            (PaymentStatus::Succeeded, Some(id), Some(link)) if link.id == id && link.currency == next.currency => {
                Some(self.link_after_success(link, &next)?)
            }
            _ => None,
        };
        Ok(Decided::Changed(Box::new(Decision {
            journal: self.journal(trigger, next.reference.as_str(), status.as_str(), next.currency, entries),
            record: Record::Payment(next),
            balances,
            created: None,
            outbox,
            linked,
        })))
    }
}

impl Ctx<'_> {
    /// A payment page given for a payment already under way (a status query saw it first): the page is kept,
    /// the status stays, no money moves and no webhook goes (`payment.processing` went with the move). Any other
    /// notice that moves nothing changes nothing.
    fn payment_url_only(&self, p: &Payment, notice: &PaymentNotice) -> Result<Decided, Rejection> {
        let PaymentNotice::Opened { payment_url } = notice else {
            return Ok(Decided::Unchanged(Record::Payment(p.clone())));
        };
        if p.status != PaymentStatus::Processing || p.payment_url.as_deref() == Some(payment_url.as_str()) {
            return Ok(Decided::Unchanged(Record::Payment(p.clone())));
        }
        let mut next = p.clone();
        next.payment_url = Some(payment_url.as_str().to_owned());
        next.updated_at = self.now;
        Ok(Decided::Changed(Box::new(Decision {
            journal: self.journal(
                Trigger::ProviderProcessing,
                next.reference.as_str(),
                next.status.as_str(),
                next.currency,
                Vec::new(),
            ),
            balances: self.balances.clone(),
            record: Record::Payment(next),
            created: None,
            outbox: Vec::new(),
            linked: None,
        })))
    }
}

fn movement(p: &Payment) -> Movement {
    Movement { currency: p.currency, amount: p.amount, fee: p.fee, net_amount: p.net_amount }
}
