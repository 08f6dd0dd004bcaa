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

use serde::{Deserialize, Serialize};

use crate::domain::ids::IdKind;
use crate::domain::ledger::{postings, Account, Balances, Entry, LedgerError, Movement};
use crate::domain::money::{Amount, Currency, FeeRule, MoneyError};
use crate::domain::phone::Phone;
use crate::domain::records::{
    sibling_transaction_id, Payment, Payout, ProviderCode, Refund, TransactionType, WebhookBody, WebhookData,
};
use crate::domain::status::{
    payment_refund_allowed, transition, EventKind, InvalidTransition, PaymentStatus, PayoutStatus, RefundStatus,
    Status, Step, Trigger,
};
use crate::domain::text::{Description, Email, Metadata, Motif, Name, Reference};
use crate::domain::time::Timestamp;

/// A payment as the API accepted it, before it exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewPayment {
    pub reference: Option<Reference>,
    pub montant: Amount,
    pub devise: Currency,
    pub fournisseur: ProviderCode,
    /// The provider's fee rule for this currency, fixed at initiation (contract 6).
    pub fee: FeeRule,
    pub client_telephone: Phone,
    pub client_email: Option<Email>,
    pub client_nom: Option<Name>,
    pub description: Option<Description>,
    pub metadata: Metadata,
}

/// A payout as the API accepted it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewPayout {
    pub montant: Amount,
    pub devise: Currency,
    pub fournisseur: ProviderCode,
    pub fee: FeeRule,
    pub beneficiaire_telephone: Phone,
    pub beneficiaire_nom: Option<Name>,
    pub description: Option<Description>,
    pub metadata: Metadata,
}

/// What a provider (or our expiry timer) says about a payment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PaymentNotice {
    Processing,
    Confirmed,
    Declined { failure_code: String },
    Expired,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RefundOutcome {
    Completed,
    Refused,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PayoutOutcome {
    Sent,
    Refused { motif: String },
}

/// Every change the contract names, as one enum.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    InitiatePayment(NewPayment),
    PaymentNotice {
        reference: Reference,
        notice: PaymentNotice,
    },
    RequestRefund {
        reference: Reference,
        montant: Option<Amount>,
        motif: Option<Motif>,
    },
    /// About the refund of the payment `reference`.
    RefundNotice {
        reference: Reference,
        outcome: RefundOutcome,
    },
    CreatePayout(NewPayout),
    PayoutNotice {
        id: String,
        outcome: PayoutOutcome,
    },
}

/// The record a command is about, which the actor looks up before calling [`decide`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A payment that must not exist yet (`None`: a generated reference, which cannot collide).
    NewPayment(Option<Reference>),
    Payment(Reference),
    NewPayout,
    Payout(String),
}

impl Command {
    pub fn target(&self) -> Target {
        match self {
            Command::InitiatePayment(new) => Target::NewPayment(new.reference.clone()),
            Command::PaymentNotice { reference, .. }
            | Command::RequestRefund { reference, .. }
            | Command::RefundNotice { reference, .. } => Target::Payment(reference.clone()),
            Command::CreatePayout(_) => Target::NewPayout,
            Command::PayoutNotice { id, .. } => Target::Payout(id.clone()),
        }
    }
}

/// A record of one of the two kinds a merchant owns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Record {
    Payment(Payment),
    Payout(Payout),
}

impl Record {
    pub fn key(&self) -> &str {
        match self {
            Record::Payment(p) => p.reference.as_str(),
            Record::Payout(o) => &o.id,
        }
    }
}

/// One line of a merchant's journal: what changed, and the money it moved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalEvent {
    /// Position in this merchant's journal, from 1, without gaps.
    pub seq: u64,
    pub at: Timestamp,
    pub trigger: Trigger,
    /// Payment reference or payout id.
    pub reference: String,
    /// Status after the change, as its contract name.
    pub statut: String,
    pub devise: Currency,
    pub entries: Vec<Entry>,
}

/// A webhook notification caused by a change, with the exact body bytes that will be signed and sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxItem {
    pub id: String,
    pub event: EventKind,
    pub reference: String,
    pub body: String,
}

/// A new money movement that must appear in the transaction list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTransaction {
    pub kind: TransactionType,
    pub transaction_id: String,
    /// The reference this transaction is found by (payment reference, `rmb_…` or `ret_…`).
    pub reference: String,
    /// The record that holds it (the payment for a refund).
    pub owner: String,
}

/// An accepted change, ready to be persisted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub record: Record,
    pub journal: JournalEvent,
    pub balances: Balances,
    pub created: Option<NewTransaction>,
    pub outbox: Vec<OutboxItem>,
}

// Moved once per command, never stored in bulk: the size difference costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decided {
    Changed(Box<Decision>),
    /// A duplicate, late or out-of-order notice: nothing to write.
    Unchanged(Record),
}

/// Why a command was refused, in the merchant's terms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("no such payment or payout")]
    NotFound,
    #[error("this reference is already used by another payment")]
    DuplicateReference,
    #[error("{0}")]
    InvalidState(String),
    #[error("insufficient balance: {disponible_minor} {devise} available, {requested_minor} needed")]
    InsufficientBalance { devise: Currency, disponible_minor: i64, requested_minor: i64 },
    #[error("montant must be greater than the fee of {frais_minor}")]
    AmountBelowFee { frais_minor: i64 },
    #[error("a refund cannot exceed the payment's montant of {montant_minor}")]
    RefundAboveAmount { montant_minor: i64 },
    #[error("amount out of range: {0}")]
    Money(#[from] MoneyError),
    /// A ledger invariant would break: a bug, reported loudly and never silently corrected.
    #[error("ledger invariant violated: {0}")]
    Invariant(LedgerError),
}

impl From<InvalidTransition> for Rejection {
    fn from(err: InvalidTransition) -> Rejection {
        Rejection::InvalidState(match (err.from, err.on) {
            (_, Trigger::RefundRequested) => "only a payment in status succes without a refund can be refunded".into(),
            (Some(from), on) => format!("{on:?} is not allowed in status {}", status_name(from)),
            (None, on) => format!("{on:?} needs an existing record"),
        })
    }
}

fn status_name(status: Status) -> &'static str {
    match status {
        Status::Payment(s) => s.as_str(),
        Status::Refund(s) => s.as_str(),
        Status::Payout(s) => s.as_str(),
    }
}

/// A source of fresh identifiers; the actor passes [`crate::domain::ids::new_id`], tests may pass a counter.
pub type IdSource<'a> = &'a mut dyn FnMut(IdKind) -> String;

/// Decides one command against the merchant's balances and the record it is about.
///
/// `seq` is the journal position this change will take if accepted.
pub fn decide(
    balances: &Balances,
    seq: u64,
    current: Option<&Record>,
    command: &Command,
    now: Timestamp,
    ids: IdSource<'_>,
) -> Result<Decided, Rejection> {
    let ctx = Ctx { balances, seq, now };
    match (command, current) {
        (Command::InitiatePayment(_), Some(_)) => Err(Rejection::DuplicateReference),
        (Command::InitiatePayment(new), None) => ctx.initiate(new, ids),
        (Command::PaymentNotice { notice, .. }, Some(Record::Payment(p))) => ctx.payment_notice(p, notice, ids),
        (Command::RequestRefund { montant, motif, .. }, Some(Record::Payment(p))) => {
            ctx.request_refund(p, *montant, motif.clone(), ids)
        }
        (Command::RefundNotice { outcome, .. }, Some(Record::Payment(p))) => ctx.refund_notice(p, *outcome, ids),
        (Command::CreatePayout(new), None) => ctx.create_payout(new, ids),
        (Command::PayoutNotice { outcome, .. }, Some(Record::Payout(o))) => ctx.payout_notice(o, outcome, ids),
        _ => Err(Rejection::NotFound),
    }
}

struct Ctx<'a> {
    balances: &'a Balances,
    seq: u64,
    now: Timestamp,
}

/// `montant - fee(montant)`, refusing a fee that would leave nothing.
fn split_fee(montant: Amount, fee: &FeeRule) -> Result<(Amount, Amount), Rejection> {
    let frais = fee.fee(montant)?;
    if frais >= montant {
        return Err(Rejection::AmountBelowFee { frais_minor: frais.minor() });
    }
    Ok((frais, montant.checked_sub(frais)?))
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
        statut: &str,
        devise: Currency,
        entries: Vec<Entry>,
    ) -> JournalEvent {
        JournalEvent {
            seq: self.seq,
            at: self.now,
            trigger,
            reference: reference.to_owned(),
            statut: statut.to_owned(),
            devise,
            entries,
        }
    }

    /// Balances after `entries`; a reservation that would take `disponible` below zero is the merchant's
    /// `insufficient_balance`, any other negative result is a broken invariant.
    fn balances_after(&self, entries: &[Entry], devise: Currency, requested: Amount) -> Result<Balances, Rejection> {
        let mut next = self.balances.clone();
        next.touch(devise, self.now.unix_ms());
        match next.apply(entries, self.now.unix_ms()) {
            Ok(()) => Ok(next),
            Err(LedgerError::Negative { account: Account::Disponible, balance_minor, .. }) => {
                Err(Rejection::InsufficientBalance {
                    devise,
                    disponible_minor: balance_minor,
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

    fn initiate(&self, new: &NewPayment, ids: IdSource<'_>) -> Result<Decided, Rejection> {
        let (frais, montant_net) = split_fee(new.montant, &new.fee)?;
        let rule = moved(transition(None, Trigger::PaymentAccepted)?).ok_or(Rejection::NotFound)?;
        let Status::Payment(statut) = rule.to else { return Err(Rejection::NotFound) };
        let reference = match &new.reference {
            Some(r) => r.clone(),
            None => Reference::parse(&ids(IdKind::Payment))
                .map_err(|e| Rejection::InvalidState(format!("generated reference refused: {e}")))?,
        };
        let payment = Payment {
            reference,
            transaction_id: ids(IdKind::Transaction),
            statut,
            montant: new.montant,
            devise: new.devise,
            frais,
            montant_net,
            fournisseur: new.fournisseur.clone(),
            client_telephone: new.client_telephone.clone(),
            client_email: new.client_email.clone(),
            client_nom: new.client_nom.clone(),
            description: new.description.clone(),
            metadata: new.metadata.clone(),
            created_at: self.now,
            updated_at: self.now,
            paid_at: None,
            failure_code: None,
            remboursement: None,
        };
        let balances = self.balances_after(&[], new.devise, Amount::ZERO)?;
        let outbox = self.outbox(rule.event, WebhookData::of_payment(&payment), ids)?;
        let reference = payment.reference.as_str().to_owned();
        Ok(Decided::Changed(Box::new(Decision {
            journal: self.journal(rule.on, &reference, statut.as_str(), new.devise, Vec::new()),
            created: Some(NewTransaction {
                kind: TransactionType::Paiement,
                transaction_id: payment.transaction_id.clone(),
                reference: reference.clone(),
                owner: reference,
            }),
            record: Record::Payment(payment),
            balances,
            outbox,
        })))
    }

    fn payment_notice(&self, p: &Payment, notice: &PaymentNotice, ids: IdSource<'_>) -> Result<Decided, Rejection> {
        let trigger = match notice {
            PaymentNotice::Processing => Trigger::ProviderProcessing,
            PaymentNotice::Confirmed => Trigger::ProviderConfirmed,
            PaymentNotice::Declined { .. } => Trigger::ProviderDeclined,
            PaymentNotice::Expired => Trigger::TtlExpired,
        };
        let Some(rule) = moved(transition(Some(Status::Payment(p.statut)), trigger)?) else {
            return Ok(Decided::Unchanged(Record::Payment(p.clone())));
        };
        let Status::Payment(statut) = rule.to else { return Err(Rejection::NotFound) };
        let mut next = p.clone();
        next.statut = statut;
        next.updated_at = self.now;
        match (statut, notice) {
            (PaymentStatus::Succes, _) => {
                next.paid_at = Some(self.now);
                next.failure_code = None;
            }
            (PaymentStatus::Echec, PaymentNotice::Declined { failure_code }) => {
                next.failure_code = Some(failure_code.clone());
            }
            (PaymentStatus::Expire, _) => next.failure_code = Some("expired".into()),
            _ => {}
        }
        let entries = postings(rule.effect, movement(&next)).map_err(Rejection::Invariant)?;
        let balances = self.balances_after(&entries, next.devise, next.montant)?;
        let outbox = self.outbox(rule.event, WebhookData::of_payment(&next), ids)?;
        Ok(Decided::Changed(Box::new(Decision {
            journal: self.journal(trigger, next.reference.as_str(), statut.as_str(), next.devise, entries),
            record: Record::Payment(next),
            balances,
            created: None,
            outbox,
        })))
    }

    fn request_refund(
        &self,
        p: &Payment,
        montant: Option<Amount>,
        motif: Option<Motif>,
        ids: IdSource<'_>,
    ) -> Result<Decided, Rejection> {
        let existing = p.remboursement.as_ref().map(|r| r.statut);
        if !payment_refund_allowed(p.statut, existing) {
            return Err(
                InvalidTransition { from: Some(Status::Payment(p.statut)), on: Trigger::RefundRequested }.into()
            );
        }
        let montant = montant.unwrap_or(p.montant);
        if montant > p.montant {
            return Err(Rejection::RefundAboveAmount { montant_minor: p.montant.minor() });
        }
        let rule = moved(transition(None, Trigger::RefundRequested)?).ok_or(Rejection::NotFound)?;
        let Status::Refund(statut) = rule.to else { return Err(Rejection::NotFound) };
        let refund_move = Movement { devise: p.devise, montant, frais: Amount::ZERO, montant_net: montant };
        let entries = postings(rule.effect, refund_move).map_err(Rejection::Invariant)?;
        let balances = self.balances_after(&entries, p.devise, montant)?;
        let refund =
            Refund { reference: ids(IdKind::Refund), montant, motif, statut, created_at: self.now, completed_at: None };
        let mut next = p.clone();
        next.updated_at = self.now;
        let created = NewTransaction {
            kind: TransactionType::Remboursement,
            transaction_id: refund.transaction_id(),
            reference: refund.reference.clone(),
            owner: p.reference.as_str().to_owned(),
        };
        next.remboursement = Some(refund);
        Ok(Decided::Changed(Box::new(Decision {
            journal: self.journal(rule.on, &created.reference, statut.as_str(), p.devise, entries),
            record: Record::Payment(next),
            balances,
            created: Some(created),
            outbox: Vec::new(),
        })))
    }

    fn refund_notice(&self, p: &Payment, outcome: RefundOutcome, ids: IdSource<'_>) -> Result<Decided, Rejection> {
        let Some(refund) = &p.remboursement else { return Err(Rejection::NotFound) };
        let trigger = match outcome {
            RefundOutcome::Completed => Trigger::RefundCompleted,
            RefundOutcome::Refused => Trigger::RefundRefused,
        };
        let Some(rule) = moved(transition(Some(Status::Refund(refund.statut)), trigger)?) else {
            return Ok(Decided::Unchanged(Record::Payment(p.clone())));
        };
        let Status::Refund(refund_statut) = rule.to else { return Err(Rejection::NotFound) };
        let mut next = p.clone();
        next.updated_at = self.now;
        let mut event = None;
        if refund_statut == RefundStatus::Succes {
            // Completing the refund also moves the payment; both machines must agree or nothing changes.
            match transition(Some(Status::Payment(p.statut)), Trigger::RefundCompleted)? {
                Step::Move(pay_rule) => {
                    if let Status::Payment(s) = pay_rule.to {
                        next.statut = s;
                    }
                    event = pay_rule.event;
                }
                Step::Unchanged => return Ok(Decided::Unchanged(Record::Payment(p.clone()))),
            }
        }
        let refund_move =
            Movement { devise: p.devise, montant: refund.montant, frais: Amount::ZERO, montant_net: refund.montant };
        let entries = postings(rule.effect, refund_move).map_err(Rejection::Invariant)?;
        let balances = self.balances_after(&entries, p.devise, refund.montant)?;
        let mut updated_refund = refund.clone();
        updated_refund.statut = refund_statut;
        updated_refund.completed_at = Some(self.now);
        let journal = self.journal(trigger, &refund.reference, refund_statut.as_str(), p.devise, entries);
        next.remboursement = Some(updated_refund);
        let outbox = self.outbox(event, WebhookData::of_payment(&next), ids)?;
        Ok(Decided::Changed(Box::new(Decision {
            record: Record::Payment(next),
            journal,
            balances,
            created: None,
            outbox,
        })))
    }

    fn create_payout(&self, new: &NewPayout, ids: IdSource<'_>) -> Result<Decided, Rejection> {
        let (frais, montant_net) = split_fee(new.montant, &new.fee)?;
        let rule = moved(transition(None, Trigger::PayoutRequested)?).ok_or(Rejection::NotFound)?;
        let Status::Payout(statut) = rule.to else { return Err(Rejection::NotFound) };
        let entries = postings(rule.effect, Movement { devise: new.devise, montant: new.montant, frais, montant_net })
            .map_err(Rejection::Invariant)?;
        let balances = self.balances_after(&entries, new.devise, new.montant)?;
        let id = ids(IdKind::Payout);
        let payout = Payout {
            transaction_id: sibling_transaction_id(&id),
            id,
            statut,
            montant: new.montant,
            devise: new.devise,
            frais,
            montant_net,
            fournisseur: new.fournisseur.clone(),
            beneficiaire_telephone: new.beneficiaire_telephone.clone(),
            beneficiaire_nom: new.beneficiaire_nom.clone(),
            description: new.description.clone(),
            metadata: new.metadata.clone(),
            created_at: self.now,
            updated_at: self.now,
            processed_at: None,
            motif_rejet: None,
        };
        let created = NewTransaction {
            kind: TransactionType::Retrait,
            transaction_id: payout.transaction_id.clone(),
            reference: payout.id.clone(),
            owner: payout.id.clone(),
        };
        Ok(Decided::Changed(Box::new(Decision {
            journal: self.journal(rule.on, &payout.id, statut.as_str(), new.devise, entries),
            record: Record::Payout(payout),
            balances,
            created: Some(created),
            outbox: Vec::new(),
        })))
    }

    fn payout_notice(&self, o: &Payout, outcome: &PayoutOutcome, ids: IdSource<'_>) -> Result<Decided, Rejection> {
        let trigger = match outcome {
            PayoutOutcome::Sent => Trigger::PayoutSent,
            PayoutOutcome::Refused { .. } => Trigger::PayoutRefused,
        };
        let Some(rule) = moved(transition(Some(Status::Payout(o.statut)), trigger)?) else {
            return Ok(Decided::Unchanged(Record::Payout(o.clone())));
        };
        let Status::Payout(statut) = rule.to else { return Err(Rejection::NotFound) };
        let mut next = o.clone();
        next.statut = statut;
        next.updated_at = self.now;
        match outcome {
            PayoutOutcome::Sent if statut == PayoutStatus::Traite => next.processed_at = Some(self.now),
            PayoutOutcome::Refused { motif } => next.motif_rejet = Some(motif.clone()),
            PayoutOutcome::Sent => {}
        }
        let m = Movement { devise: o.devise, montant: o.montant, frais: o.frais, montant_net: o.montant_net };
        let entries = postings(rule.effect, m).map_err(Rejection::Invariant)?;
        let balances = self.balances_after(&entries, o.devise, o.montant)?;
        let outbox = self.outbox(rule.event, WebhookData::of_payout(&next), ids)?;
        Ok(Decided::Changed(Box::new(Decision {
            journal: self.journal(trigger, &next.id, statut.as_str(), o.devise, entries),
            record: Record::Payout(next),
            balances,
            created: None,
            outbox,
        })))
    }
}

fn movement(p: &Payment) -> Movement {
    Movement { devise: p.devise, montant: p.montant, frais: p.frais, montant_net: p.montant_net }
}
