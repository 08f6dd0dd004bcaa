//! The pure core of a merchant: `decide(balances, record, command) -> decision`, with no actor, clock or
//! storage inside.
//!
//! A decision is everything one accepted change writes: the record after the change, the journal event with
//! its balanced ledger entries, the balances after it, and the webhook notifications it causes. The merchant
//! actor fetches the record a command is about, calls [`decide`], persists the decision in one durable write
//! and only then answers. The property tests call [`decide`] directly with thousands of command sequences and
//! compare the outcome with an independent reference model.
//!
//! Status moves come from [`crate::domain::status::transition`] and money moves from
//! [`crate::domain::ledger::postings`]; this module only wires them to records.
//!
//! The types live beside the logic that uses them: `command` holds what comes in, `decision` what an accepted
//! change produces, `rejection` why a command is refused; `payment`, `refund`, `payout` and `link` hold the
//! transitions of each kind of record, and this file holds [`decide`] and the helpers they share.

mod command;
mod decision;
mod link;
mod payment;
mod payout;
mod refund;
mod rejection;

pub use command::{Command, NewLink, NewPayment, NewPayout, PaymentNotice, PayoutOutcome, RefundOutcome, Target};
pub use decision::{Decided, Decision, JournalEvent, NewTransaction, OutboxItem, Record};
pub use rejection::Rejection;

use crate::domain::ids::IdKind;
use crate::domain::ledger::{Account, Balances, Entry, LedgerError};
use crate::domain::links::Link;
use crate::domain::money::{Amount, Currency, FeeRule};
use crate::domain::records::{WebhookBody, WebhookData};
use crate::domain::status::{EventKind, Step, Trigger};
use crate::domain::time::Timestamp;

/// A source of fresh identifiers; the actor passes [`crate::domain::ids::new_id`], tests may pass a counter.
pub type IdSource<'a> = &'a mut dyn FnMut(IdKind) -> String;

/// Decides one command against the merchant's balances and the record it is about.
///
/// `seq` is the journal position this change will take if accepted. `link` is the payment link the command
/// also reads: the one a new payment names ([`Command::link`]), or the one the payment a notice is about was
/// made through ([`crate::domain::links::link_of`]); `None` when there is none or it was not found.
pub fn decide(
    balances: &Balances,
    seq: u64,
    current: Option<&Record>,
    link: Option<&Link>,
    command: &Command,
    now: Timestamp,
    ids: IdSource<'_>,
) -> Result<Decided, Rejection> {
    let ctx = Ctx { balances, seq, now };
    match (command, current) {
        (Command::InitiatePayment(_), Some(_)) => Err(Rejection::DuplicateReference),
        (Command::InitiatePayment(new), None) => ctx.initiate(new, link, ids),
        (Command::PaymentNotice { notice, .. }, Some(Record::Payment(p))) => ctx.payment_notice(p, notice, link, ids),
        (Command::RequestRefund { amount, reason, .. }, Some(Record::Payment(p))) => {
            ctx.request_refund(p, *amount, reason.clone(), ids)
        }
        (Command::RefundNotice { refund, outcome, .. }, Some(Record::Payment(p))) => {
            ctx.refund_notice(p, refund, *outcome, ids)
        }
        (Command::CreatePayout(_), Some(_)) => Err(Rejection::DuplicateReference),
        (Command::CreatePayout(new), None) => ctx.create_payout(new, ids),
        (Command::PayoutNotice { outcome, .. }, Some(Record::Payout(o))) => ctx.payout_notice(o, outcome, ids),
        (Command::CreateLink(_), Some(_)) => Err(Rejection::DuplicateReference),
        (Command::CreateLink(new), None) => ctx.create_link(new, ids),
        (Command::DeactivateLink { .. }, Some(Record::Link(l))) => ctx.deactivate_link(l),
        _ => Err(Rejection::NotFound),
    }
}

struct Ctx<'a> {
    balances: &'a Balances,
    seq: u64,
    now: Timestamp,
}

/// `montant - fee(montant)`, refusing a fee that would leave nothing.
fn split_fee(amount: Amount, fee: &FeeRule) -> Result<(Amount, Amount), Rejection> {
    let fee = fee.fee(amount)?;
    if fee >= amount {
        return Err(Rejection::AmountBelowFee { fee_minor: fee.minor() });
    }
    Ok((fee, amount.checked_sub(fee)?))
}

fn moved(rule_step: Step) -> Option<crate::domain::status::Rule> {
    match rule_step {
        Step::Move(rule) => Some(rule),
        Step::Unchanged => None,
    }
}

impl Ctx<'_> {
    fn journal(
        &self,
        trigger: Trigger,
        reference: &str,
        status: &str,
        currency: Currency,
        entries: Vec<Entry>,
    ) -> JournalEvent {
        JournalEvent {
            seq: self.seq,
            at: self.now,
            trigger,
            reference: reference.to_owned(),
            status: status.to_owned(),
            currency,
            entries,
        }
    }

    /// Balances after `entries`; a reservation that would take `disponible` below zero is the merchant's
    /// `insufficient_balance`, any other negative result is a broken invariant.
    fn balances_after(&self, entries: &[Entry], currency: Currency, requested: Amount) -> Result<Balances, Rejection> {
        let mut next = self.balances.clone();
        next.touch(currency, self.now.unix_ms());
        match next.apply(entries, self.now.unix_ms()) {
            Ok(()) => Ok(next),
            Err(LedgerError::Negative { account: Account::Available, balance_minor, .. }) => {
                Err(Rejection::InsufficientBalance {
                    currency,
                    available_minor: balance_minor,
                    requested_minor: requested.minor(),
                })
            }
            Err(other) => Err(Rejection::Invariant(other)),
        }
    }

    fn outbox(
        &self,
        event: Option<EventKind>,
        data: WebhookData,
        ids: IdSource<'_>,
    ) -> Result<Vec<OutboxItem>, Rejection> {
        let Some(event) = event else { return Ok(Vec::new()) };
        let reference = data.reference.clone();
        let body = WebhookBody { event, created_at: self.now, data };
        // Serializing plain structs of strings and integers cannot fail; if it ever did, refusing the change
        // is right, because a change must never be accepted without its notification.
        let body = serde_json::to_string(&body)
            .map_err(|e| Rejection::InvalidState(format!("webhook body could not be built: {e}")))?;
        Ok(vec![OutboxItem { id: ids(IdKind::Event), event, reference, body }])
    }
}
