//! The payment link transitions: creating and deactivating a link, and what a payment made through a link
//! does to it (checked when the payment starts, counted when it succeeds).

use super::{moved, Ctx, Decided, Decision, IdSource, NewLink, Record, Rejection};
use crate::domain::ids::IdKind;
use crate::domain::links::Link;
use crate::domain::money::Amount;
use crate::domain::records::Payment;
use crate::domain::status::{transition, LinkStatus, Status, Trigger};

impl Ctx<'_> {
    pub(super) fn create_link(&self, new: &NewLink, ids: IdSource<'_>) -> Result<Decided, Rejection> {
        let rule = moved(transition(None, Trigger::LinkCreated)?)
            .ok_or(Rejection::impossible("the rules table has no first move on LinkCreated"))?;
        let Status::Link(status) = rule.to else {
            return Err(Rejection::impossible("a link rule leads to another kind's status"));
        };
        let id = ids(IdKind::Link);
        let link = Link {
            url: format!("{}{id}", new.page_base),
            id,
            reference: new.reference.clone(),
            status,
            amount: new.amount,
            currency: new.currency,
            description: new.description.clone(),
            providers: new.providers.clone(),
            usage: new.usage,
            expire_at: new.expires_at,
            return_url: new.return_url.clone(),
            metadata: new.metadata.clone(),
            payments: 0,
            collected: Amount::ZERO,
            created_at: self.now,
            updated_at: self.now,
        };
        Ok(self.link_changed(rule.on, link))
    }

    pub(super) fn deactivate_link(&self, link: &Link) -> Result<Decided, Rejection> {
        let from = Status::Link(link.status_at(self.now));
        let rule = moved(transition(Some(from), Trigger::LinkDeactivated)?)
            .ok_or(Rejection::impossible("deactivating a link is a command, never a no-op"))?;
        let Status::Link(status) = rule.to else {
            return Err(Rejection::impossible("a link rule leads to another kind's status"));
        };
        Ok(self.link_changed(rule.on, Link { status, updated_at: self.now, ..link.clone() }))
    }

    /// A link change moves no money: its journal event has no entries, and the balances stay as they are.
    fn link_changed(&self, trigger: Trigger, link: Link) -> Decided {
        Decided::Changed(Box::new(Decision {
            journal: self.journal(trigger, &link.id, link.status.as_str(), link.currency, Vec::new()),
            balances: self.balances.clone(),
            record: Record::Link(link),
            created: None,
            outbox: Vec::new(),
            linked: None,
        }))
    }

    /// The link a new payment goes through must be the one it names, take payments now, and ask this amount in
    /// this currency.
    pub(super) fn check_link_open(&self, named: &str, link: Option<&Link>, payment: &Payment) -> Result<(), Rejection> {
        let link = match link {
            Some(link) if link.id == named => link,
            _ => return Err(Rejection::NotFound),
        };
        if !link.takes_payments(self.now) {
            return Err(Rejection::LinkClosed(link.status_at(self.now)));
        }
        if link.amount != payment.amount || link.currency != payment.currency {
            return Err(Rejection::InvalidState("the payment's amount is not the link's".into()));
        }
        Ok(())
    }

    /// The link after one of its payments reached `succes`: counted whatever the link's status (a payment
    /// started before a `unique` link was paid, deactivated or expired still happened), and a `unique` link
    /// that still took payments closes. The counters saturate: a counter never refuses a payment's credit.
    pub(super) fn link_after_success(&self, link: &Link, payment: &Payment) -> Result<Link, Rejection> {
        let mut next = link.clone();
        next.payments = next.payments.saturating_add(1);
        next.collected = next.collected.saturating_add(payment.amount);
        next.updated_at = self.now;
        if link.usage == crate::domain::links::LinkUsage::Once {
            if let Some(rule) = moved(transition(Some(Status::Link(link.status)), Trigger::LinkPaid)?) {
                let Status::Link(status) = rule.to else {
                    return Err(Rejection::impossible("a link rule leads to another kind's status"));
                };
                next.status = status;
            }
        }
        debug_assert!(next.status != LinkStatus::Expired, "expire is never stored");
        Ok(next)
    }
}
