//! Why a command is refused: [`Rejection`], in the merchant's terms, and how an invalid status transition
//! becomes one.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::domain::ledger::LedgerError;
use crate::domain::money::{Currency, MoneyError};
use crate::domain::status::{InvalidTransition, LinkStatus, Status, Trigger};

/// Why a command was refused, in the merchant's terms.
// Serde: a rejection crosses between the nodes of a cluster with the command it answers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum Rejection {
    #[error("no such payment or payout")]
    NotFound,
    #[error("this reference is already used by another payment")]
    DuplicateReference,
    #[error("{0}")]
    InvalidState(String),
    #[error("insufficient balance: {available_minor} {currency} available, {requested_minor} needed")]
    InsufficientBalance { currency: Currency, available_minor: i64, requested_minor: i64 },
    #[error("montant must be greater than the fee of {fee_minor}")]
    AmountBelowFee { fee_minor: i64 },
    #[error(
        "a refund must be more than 0 and at most what is left to refund: {left_minor} of the payment's {amount_minor}"
    )]
    RefundAboveAmount { amount_minor: i64, left_minor: i64 },
    /// A payment through a link that no longer takes one (paid, deactivated or expired).
    #[error("this payment link is {}: it takes no more payments", .0.as_str())]
    LinkClosed(LinkStatus),
    #[error("amount out of range: {0}")]
    Money(#[from] MoneyError),
    /// A ledger invariant would break: a bug, reported loudly and never silently corrected.
    #[error("ledger invariant violated: {0}")]
    Invariant(LedgerError),
    /// A state the rules table makes impossible was met (a record without the part a command is about, a rule
    /// that moves a record to another kind's status): a bug, never a "not found".
    #[error("impossible state: {0}")]
    Impossible(Cow<'static, str>),
}

impl Rejection {
    /// [`Rejection::Impossible`] with a fixed text, for the core's rules.
    pub const fn impossible(what: &'static str) -> Rejection {
        Rejection::Impossible(Cow::Borrowed(what))
    }

    /// True for the refusals that mean a bug rather than a merchant's mistake: they are logged loudly and
    /// answered `500 internal_error`.
    pub fn is_bug(&self) -> bool {
        matches!(self, Rejection::Invariant(_) | Rejection::Impossible(_))
    }
}

impl From<InvalidTransition> for Rejection {
    fn from(err: InvalidTransition) -> Rejection {
        Rejection::InvalidState(match (err.from, err.on) {
            (Some(Status::Payment(s)), Trigger::RefundRequested) if s.is_paid() => {
                "a refund of this payment is under way: wait until it ends before asking for another".into()
            }
            (_, Trigger::RefundRequested) => {
                "only a payment in status succes or rembourse_partiellement can be refunded".into()
            }
            (Some(Status::Link(s)), Trigger::LinkDeactivated) => {
                format!("this link is already {}: only an actif link can be deactivated", s.as_str())
            }
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
        Status::Link(s) => s.as_str(),
    }
}
