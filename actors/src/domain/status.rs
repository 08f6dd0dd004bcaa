//! The four state machines of the API (payments, refunds, payouts, payment links) as one table of rules, and the one
//! pure function, [`transition`], that every caller uses to move a status.
//!
//! Why a table: the allowed moves are the product's promise to merchants (docs/api.md § Payments, Refunds, Payouts), so
//! they live as data a reviewer can read top to bottom, and the property tests drive [`transition`] directly,
//! without actors or storage. The merchant actor never decides a status on its own; it asks this module.
//!
//! Two kinds of trigger exist. Provider notices (and our own expiry timer) describe facts that happened
//! elsewhere and may arrive duplicated, late or out of order: when no rule matches, they leave the status
//! unchanged ([`Step::Unchanged`]) instead of failing, so a duplicate "success" is acknowledged but never
//! credits twice. Merchant commands (a refund request) are intents: when no rule matches they are refused with
//! [`InvalidTransition`], which the API reports as 409 `invalid_state`.

use serde::{Deserialize, Serialize};

/// Status of a payment. The serialized names are the API's.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PaymentStatus {
    #[serde(rename = "initie")]
    Initiated,
    #[serde(rename = "en_cours")]
    Processing,
    #[serde(rename = "succes")]
    Succeeded,
    #[serde(rename = "echec")]
    Failed,
    #[serde(rename = "expire")]
    Expired,
    #[serde(rename = "rembourse")]
    Refunded,
    /// Some of the payment went back to the customer, not all of it; more refunds may follow. Declared last
    /// because the store encodes a variant by its position.
    #[serde(rename = "rembourse_partiellement")]
    PartlyRefunded,
}

/// Status of a refund.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefundStatus {
    #[serde(rename = "en_cours")]
    Processing,
    #[serde(rename = "succes")]
    Succeeded,
    #[serde(rename = "echec")]
    Failed,
}

/// Status of a payout.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PayoutStatus {
    #[serde(rename = "en_attente")]
    Pending,
    #[serde(rename = "traite")]
    Sent,
    #[serde(rename = "rejete")]
    Rejected,
}

impl PaymentStatus {
    pub const ALL: [PaymentStatus; 7] = [
        PaymentStatus::Initiated,
        PaymentStatus::Processing,
        PaymentStatus::Succeeded,
        PaymentStatus::Failed,
        PaymentStatus::Expired,
        PaymentStatus::PartlyRefunded,
        PaymentStatus::Refunded,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PaymentStatus::Initiated => "initie",
            PaymentStatus::Processing => "en_cours",
            PaymentStatus::Succeeded => "succes",
            PaymentStatus::Failed => "echec",
            PaymentStatus::Expired => "expire",
            PaymentStatus::PartlyRefunded => "rembourse_partiellement",
            PaymentStatus::Refunded => "rembourse",
        }
    }

    pub fn parse(text: &str) -> Option<PaymentStatus> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// Final statuses never change again on a provider's notice about the payment itself (`expire` is not
    /// final: a late success may still arrive). Only the payment's own refunds move a `succes` or
    /// `rembourse_partiellement` payment on.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            PaymentStatus::Succeeded | PaymentStatus::Failed | PaymentStatus::PartlyRefunded | PaymentStatus::Refunded
        )
    }

    /// The customer's money arrived: the statuses a payment can be refunded from, unless a refund is under way
    /// or nothing is left.
    pub fn is_paid(self) -> bool {
        matches!(self, PaymentStatus::Succeeded | PaymentStatus::PartlyRefunded)
    }
}

impl RefundStatus {
    pub const ALL: [RefundStatus; 3] = [RefundStatus::Processing, RefundStatus::Succeeded, RefundStatus::Failed];

    pub fn as_str(self) -> &'static str {
        match self {
            RefundStatus::Processing => "en_cours",
            RefundStatus::Succeeded => "succes",
            RefundStatus::Failed => "echec",
        }
    }

    pub fn parse(text: &str) -> Option<RefundStatus> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

impl PayoutStatus {
    pub const ALL: [PayoutStatus; 3] = [PayoutStatus::Pending, PayoutStatus::Sent, PayoutStatus::Rejected];

    pub fn as_str(self) -> &'static str {
        match self {
            PayoutStatus::Pending => "en_attente",
            PayoutStatus::Sent => "traite",
            PayoutStatus::Rejected => "rejete",
        }
    }

    pub fn parse(text: &str) -> Option<PayoutStatus> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

/// Status of a payment link (docs/api.md § Payment links). `expire` is never stored: a link is `expire` from its
/// `expire_at` on, which [`crate::domain::links::Link::as_of`] reads, so no timer has to move it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LinkStatus {
    #[serde(rename = "actif")]
    Active,
    #[serde(rename = "paye")]
    Paid,
    #[serde(rename = "desactive")]
    Deactivated,
    #[serde(rename = "expire")]
    Expired,
}

impl LinkStatus {
    pub const ALL: [LinkStatus; 4] =
        [LinkStatus::Active, LinkStatus::Paid, LinkStatus::Deactivated, LinkStatus::Expired];

    pub fn as_str(self) -> &'static str {
        match self {
            LinkStatus::Active => "actif",
            LinkStatus::Paid => "paye",
            LinkStatus::Deactivated => "desactive",
            LinkStatus::Expired => "expire",
        }
    }

    pub fn parse(text: &str) -> Option<LinkStatus> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

/// A status of any of the four machines; `None` in [`Rule::from`] stands for "the record does not exist yet".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    Payment(PaymentStatus),
    Refund(RefundStatus),
    Payout(PayoutStatus),
    Link(LinkStatus),
}

/// What asks for a status change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// The API accepted a new payment.
    PaymentAccepted,
    /// The provider accepted the request to pay.
    ProviderProcessing,
    /// The provider confirms the customer paid.
    ProviderConfirmed,
    /// The provider declines the payment.
    ProviderDeclined,
    /// No final answer within the TTL, after one last status query.
    TtlExpired,
    /// The merchant asks for a refund (a command, not a notice).
    RefundRequested,
    /// The provider completed the refund.
    RefundCompleted,
    /// The provider refused the refund.
    RefundRefused,
    /// The merchant asks for a payout (a command).
    PayoutRequested,
    /// The provider sent the payout.
    PayoutSent,
    /// The provider rejected the payout.
    PayoutRefused,
    // The two below are declared last because the journal encodes a trigger by its position.
    /// A completed refund leaves part of the payment with the merchant (the payment's trigger).
    RefundedInPart,
    /// A completed refund brings the refunded total to the payment's whole amount (the payment's trigger).
    RefundedInFull,
    // Payment links, declared after every earlier trigger for the same reason.
    /// The merchant creates a payment link (a command).
    LinkCreated,
    /// A payment made through a `unique` link succeeded: the link closes (the link's trigger).
    LinkPaid,
    /// The merchant deactivates a link (a command).
    LinkDeactivated,
}

impl Trigger {
    /// Notices report facts from outside and are replayed freely; commands are intents and may be refused.
    pub fn is_notice(self) -> bool {
        !matches!(
            self,
            Trigger::PaymentAccepted
                | Trigger::RefundRequested
                | Trigger::PayoutRequested
                | Trigger::LinkCreated
                | Trigger::LinkDeactivated
        )
    }
}

/// The webhook event a transition emits (docs/api.md § Webhook body).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EventKind {
    #[serde(rename = "payment.initiated")]
    PaymentInitiated,
    #[serde(rename = "payment.processing")]
    PaymentProcessing,
    #[serde(rename = "payment.succeeded")]
    PaymentSucceeded,
    #[serde(rename = "payment.failed")]
    PaymentFailed,
    #[serde(rename = "payment.refunded")]
    PaymentRefunded,
    #[serde(rename = "payout.processed")]
    PayoutProcessed,
    #[serde(rename = "payout.rejected")]
    PayoutRejected,
}

impl EventKind {
    pub const ALL: [EventKind; 7] = [
        EventKind::PaymentInitiated,
        EventKind::PaymentProcessing,
        EventKind::PaymentSucceeded,
        EventKind::PaymentFailed,
        EventKind::PaymentRefunded,
        EventKind::PayoutProcessed,
        EventKind::PayoutRejected,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::PaymentInitiated => "payment.initiated",
            EventKind::PaymentProcessing => "payment.processing",
            EventKind::PaymentSucceeded => "payment.succeeded",
            EventKind::PaymentFailed => "payment.failed",
            EventKind::PaymentRefunded => "payment.refunded",
            EventKind::PayoutProcessed => "payout.processed",
            EventKind::PayoutRejected => "payout.rejected",
        }
    }

    pub fn parse(text: &str) -> Option<EventKind> {
        Self::ALL.into_iter().find(|e| e.as_str() == text)
    }
}

/// The money a transition moves, as a named rule; [`crate::domain::ledger`] turns it into balanced entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Effect {
    None,
    /// Customer funds in: `montant_net` to the merchant's `disponible`, `frais` to fees.
    CreditPayment,
    /// Move the refund amount from `disponible` to `en_attente`.
    ReserveRefund,
    /// The reserved refund leaves to the customer.
    ConsumeRefund,
    /// The reserved refund goes back to `disponible`.
    ReleaseRefund,
    /// Move the payout amount from `disponible` to `en_attente`.
    ReservePayout,
    /// The reserved payout leaves: `montant_net` to the beneficiary, `frais` to fees.
    ConsumePayout,
    /// The reserved payout goes back to `disponible`.
    ReleasePayout,
}

/// One allowed move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub from: Option<Status>,
    pub on: Trigger,
    pub to: Status,
    pub event: Option<EventKind>,
    pub effect: Effect,
}

use EventKind as E;
use LinkStatus as L;
use PaymentStatus as P;
use PayoutStatus as O;
use RefundStatus as R;
use Status::{Link as Lnk, Payment as Pay, Payout as Out, Refund as Rmb};
use Trigger as T;

const fn rule(from: Option<Status>, on: Trigger, to: Status, event: Option<EventKind>, effect: Effect) -> Rule {
    Rule { from, on, to, event, effect }
}

/// Every allowed transition, and nothing else (docs/api.md § Payments, Refunds, Payouts).
///
/// The refund of a payment is two records moving together: the refund's own status and, when it completes,
/// the payment's. Requesting a refund leaves the payment as it is (the refund record is created `en_cours`);
/// completion moves both: the payment to `rembourse_partiellement` while some of its amount is left, to
/// `rembourse` when the refunds reach its whole amount, each time with `payment.refunded`.
pub const RULES: &[Rule] = &[
    // Payments.
    rule(None, T::PaymentAccepted, Pay(P::Initiated), Some(E::PaymentInitiated), Effect::None),
    rule(Some(Pay(P::Initiated)), T::ProviderProcessing, Pay(P::Processing), Some(E::PaymentProcessing), Effect::None),
    rule(
        Some(Pay(P::Initiated)),
        T::ProviderConfirmed,
        Pay(P::Succeeded),
        Some(E::PaymentSucceeded),
        Effect::CreditPayment,
    ),
    rule(
        Some(Pay(P::Processing)),
        T::ProviderConfirmed,
        Pay(P::Succeeded),
        Some(E::PaymentSucceeded),
        Effect::CreditPayment,
    ),
    rule(Some(Pay(P::Initiated)), T::ProviderDeclined, Pay(P::Failed), Some(E::PaymentFailed), Effect::None),
    rule(Some(Pay(P::Processing)), T::ProviderDeclined, Pay(P::Failed), Some(E::PaymentFailed), Effect::None),
    rule(Some(Pay(P::Initiated)), T::TtlExpired, Pay(P::Expired), Some(E::PaymentFailed), Effect::None),
    rule(Some(Pay(P::Processing)), T::TtlExpired, Pay(P::Expired), Some(E::PaymentFailed), Effect::None),
    // The customer paid after we gave up: the money is real, so the merchant is credited.
    rule(
        Some(Pay(P::Expired)),
        T::ProviderConfirmed,
        Pay(P::Succeeded),
        Some(E::PaymentSucceeded),
        Effect::CreditPayment,
    ),
    rule(Some(Pay(P::Succeeded)), T::RefundedInPart, Pay(P::PartlyRefunded), Some(E::PaymentRefunded), Effect::None),
    rule(
        Some(Pay(P::PartlyRefunded)),
        T::RefundedInPart,
        Pay(P::PartlyRefunded),
        Some(E::PaymentRefunded),
        Effect::None,
    ),
    rule(Some(Pay(P::Succeeded)), T::RefundedInFull, Pay(P::Refunded), Some(E::PaymentRefunded), Effect::None),
    rule(Some(Pay(P::PartlyRefunded)), T::RefundedInFull, Pay(P::Refunded), Some(E::PaymentRefunded), Effect::None),
    // Refunds (several per payment, one at a time; [`payment_refund_allowed`] checks the payment's side).
    rule(None, T::RefundRequested, Rmb(R::Processing), None, Effect::ReserveRefund),
    rule(Some(Rmb(R::Processing)), T::RefundCompleted, Rmb(R::Succeeded), None, Effect::ConsumeRefund),
    rule(Some(Rmb(R::Processing)), T::RefundRefused, Rmb(R::Failed), None, Effect::ReleaseRefund),
    // Payouts.
    rule(None, T::PayoutRequested, Out(O::Pending), None, Effect::ReservePayout),
    rule(Some(Out(O::Pending)), T::PayoutSent, Out(O::Sent), Some(E::PayoutProcessed), Effect::ConsumePayout),
    rule(Some(Out(O::Pending)), T::PayoutRefused, Out(O::Rejected), Some(E::PayoutRejected), Effect::ReleasePayout),
    // Payment links: they move no money and send no webhook of their own; their payments do. An `expire` link
    // (past its `expire_at`) and a closed one take no command. A late success of a `unique` link's payment
    // moves its stored status (`actif` even past `expire_at`) to `paye`; a closed link stays as it is.
    rule(None, T::LinkCreated, Lnk(L::Active), None, Effect::None),
    rule(Some(Lnk(L::Active)), T::LinkPaid, Lnk(L::Paid), None, Effect::None),
    rule(Some(Lnk(L::Active)), T::LinkDeactivated, Lnk(L::Deactivated), None, Effect::None),
];

/// The result of asking for a move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The status changes; emit `event` (if any) and apply `effect`.
    Move(Rule),
    /// A notice that does not apply to the current status (duplicate, late or out of order): nothing changes.
    Unchanged,
}

/// A command that the current status does not allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{on:?} is not allowed from {from:?}")]
pub struct InvalidTransition {
    pub from: Option<Status>,
    pub on: Trigger,
}

/// The one pure transition function: looks `(from, on)` up in [`RULES`].
///
/// `from` must be a status of the machine the trigger belongs to (a refund trigger with the refund's status);
/// [`payment_refund_allowed`] covers the cross-machine precondition of a refund request.
pub fn transition(from: Option<Status>, on: Trigger) -> Result<Step, InvalidTransition> {
    match RULES.iter().find(|r| r.from == from && r.on == on) {
        Some(rule) => Ok(Step::Move(*rule)),
        None if on.is_notice() && from.is_some() => Ok(Step::Unchanged),
        None => Err(InvalidTransition { from, on }),
    }
}

/// A refund may be requested only from a paid payment (`succes` or `rembourse_partiellement`) whose latest
/// refund, if any, is over (docs/api.md § Refunds: several refunds, one at a time). What is left to refund
/// is the caller's check, in amounts.
pub fn payment_refund_allowed(payment: PaymentStatus, latest_refund: Option<RefundStatus>) -> bool {
    payment.is_paid() && latest_refund != Some(RefundStatus::Processing)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payment_triggers() -> [Trigger; 7] {
        [
            T::ProviderProcessing,
            T::ProviderConfirmed,
            T::ProviderDeclined,
            T::TtlExpired,
            T::RefundedInPart,
            T::RefundedInFull,
            T::PaymentAccepted,
        ]
    }

    #[test]
    fn new_payment_starts_initie_with_initiated_event() {
        let step = transition(None, T::PaymentAccepted).unwrap();
        let Step::Move(rule) = step else { panic!("expected a move") };
        assert_eq!(rule.to, Pay(P::Initiated));
        assert_eq!(rule.event, Some(E::PaymentInitiated));
    }

    #[test]
    fn every_allowed_payment_move_of_the_contract() {
        let allowed = [
            (P::Initiated, T::ProviderProcessing, P::Processing, E::PaymentProcessing),
            (P::Initiated, T::ProviderConfirmed, P::Succeeded, E::PaymentSucceeded),
            (P::Processing, T::ProviderConfirmed, P::Succeeded, E::PaymentSucceeded),
            (P::Initiated, T::ProviderDeclined, P::Failed, E::PaymentFailed),
            (P::Processing, T::ProviderDeclined, P::Failed, E::PaymentFailed),
            (P::Initiated, T::TtlExpired, P::Expired, E::PaymentFailed),
            (P::Processing, T::TtlExpired, P::Expired, E::PaymentFailed),
            (P::Expired, T::ProviderConfirmed, P::Succeeded, E::PaymentSucceeded),
            (P::Succeeded, T::RefundedInPart, P::PartlyRefunded, E::PaymentRefunded),
            (P::PartlyRefunded, T::RefundedInPart, P::PartlyRefunded, E::PaymentRefunded),
            (P::Succeeded, T::RefundedInFull, P::Refunded, E::PaymentRefunded),
            (P::PartlyRefunded, T::RefundedInFull, P::Refunded, E::PaymentRefunded),
        ];
        for (from, on, to, event) in allowed {
            let step = transition(Some(Pay(from)), on).unwrap();
            assert_eq!(
                step,
                Step::Move(Rule {
                    from: Some(Pay(from)),
                    on,
                    to: Pay(to),
                    event: Some(event),
                    effect: if to == P::Succeeded { Effect::CreditPayment } else { Effect::None }
                }),
                "{from:?} --{on:?}-->"
            );
        }
        // Exactly these moves exist for payments: every other pair is unchanged or refused.
        let mut moves = 0;
        for from in P::ALL {
            for on in payment_triggers() {
                if let Ok(Step::Move(_)) = transition(Some(Pay(from)), on) {
                    moves += 1;
                }
            }
        }
        assert_eq!(moves, allowed.len());
    }

    #[test]
    fn final_statuses_move_only_on_their_refunds() {
        for from in P::ALL.into_iter().filter(|s| s.is_final()) {
            for on in payment_triggers() {
                let step = transition(Some(Pay(from)), on);
                let refunded = from.is_paid() && matches!(on, T::RefundedInPart | T::RefundedInFull);
                assert!(refunded || !matches!(step, Ok(Step::Move(_))), "{from:?} moved on {on:?}");
            }
        }
        assert_eq!(transition(Some(Pay(P::Refunded)), T::RefundedInPart), Ok(Step::Unchanged));
        assert_eq!(transition(Some(Pay(P::Failed)), T::RefundedInFull), Ok(Step::Unchanged));
    }

    #[test]
    fn duplicate_and_late_notices_are_unchanged_not_errors() {
        assert_eq!(transition(Some(Pay(P::Succeeded)), T::ProviderConfirmed), Ok(Step::Unchanged));
        assert_eq!(transition(Some(Pay(P::Processing)), T::ProviderProcessing), Ok(Step::Unchanged));
        assert_eq!(transition(Some(Pay(P::Succeeded)), T::ProviderProcessing), Ok(Step::Unchanged));
        assert_eq!(transition(Some(Pay(P::Failed)), T::ProviderConfirmed), Ok(Step::Unchanged));
        assert_eq!(transition(Some(Pay(P::Expired)), T::ProviderDeclined), Ok(Step::Unchanged));
        assert_eq!(transition(Some(Pay(P::Expired)), T::TtlExpired), Ok(Step::Unchanged));
        assert_eq!(transition(Some(Pay(P::Refunded)), T::RefundedInFull), Ok(Step::Unchanged));
        assert_eq!(transition(Some(Rmb(R::Succeeded)), T::RefundCompleted), Ok(Step::Unchanged));
        assert_eq!(transition(Some(Rmb(R::Failed)), T::RefundCompleted), Ok(Step::Unchanged));
        assert_eq!(transition(Some(Out(O::Sent)), T::PayoutRefused), Ok(Step::Unchanged));
        assert_eq!(transition(Some(Out(O::Rejected)), T::PayoutSent), Ok(Step::Unchanged));
    }

    #[test]
    fn commands_on_existing_records_are_refused() {
        assert!(transition(Some(Pay(P::Initiated)), T::PaymentAccepted).is_err());
        assert!(transition(Some(Rmb(R::Processing)), T::RefundRequested).is_err());
        assert!(transition(Some(Out(O::Pending)), T::PayoutRequested).is_err());
        // A notice about a record that does not exist is refused too: there is nothing to leave unchanged.
        assert!(transition(None, T::ProviderConfirmed).is_err());
    }

    #[test]
    fn refunds_and_payouts_move_money_by_rule() {
        let effect = |from, on| match transition(from, on) {
            Ok(Step::Move(r)) => r.effect,
            other => panic!("{other:?}"),
        };
        assert_eq!(effect(None, T::RefundRequested), Effect::ReserveRefund);
        assert_eq!(effect(Some(Rmb(R::Processing)), T::RefundCompleted), Effect::ConsumeRefund);
        assert_eq!(effect(Some(Rmb(R::Processing)), T::RefundRefused), Effect::ReleaseRefund);
        assert_eq!(effect(None, T::PayoutRequested), Effect::ReservePayout);
        assert_eq!(effect(Some(Out(O::Pending)), T::PayoutSent), Effect::ConsumePayout);
        assert_eq!(effect(Some(Out(O::Pending)), T::PayoutRefused), Effect::ReleasePayout);
    }

    #[test]
    fn refund_precondition() {
        for paid in [P::Succeeded, P::PartlyRefunded] {
            assert!(payment_refund_allowed(paid, None));
            assert!(payment_refund_allowed(paid, Some(R::Failed)), "a refused refund can be asked again");
            assert!(payment_refund_allowed(paid, Some(R::Succeeded)), "a partial refund leaves room for another");
            assert!(!payment_refund_allowed(paid, Some(R::Processing)), "one at a time");
        }
        for s in P::ALL.into_iter().filter(|s| !s.is_paid()) {
            assert!(!payment_refund_allowed(s, None));
        }
    }

    #[test]
    fn names_round_trip() {
        for s in P::ALL {
            assert_eq!(PaymentStatus::parse(s.as_str()), Some(s));
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
        for s in R::ALL {
            assert_eq!(RefundStatus::parse(s.as_str()), Some(s));
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
        for s in O::ALL {
            assert_eq!(PayoutStatus::parse(s.as_str()), Some(s));
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
        for e in EventKind::ALL {
            assert_eq!(EventKind::parse(e.as_str()), Some(e));
            assert_eq!(serde_json::to_value(e).unwrap(), e.as_str());
        }
        assert_eq!(PaymentStatus::parse("SUCCES"), None);
    }
}
