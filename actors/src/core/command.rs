//! What comes into the core: the commands the API names, the new records and provider notices they
//! carry, and the [`Target`] that says which record a command is about.

use serde::{Deserialize, Serialize};

use crate::domain::links::LinkUsage;
use crate::domain::money::{Amount, Currency, FeeRule};
use crate::domain::phone::Phone;
use crate::domain::provider::ReturnUrl;
use crate::domain::records::ProviderCode;
use crate::domain::text::{Description, Email, Metadata, Name, Reason, Reference};
use crate::domain::time::Timestamp;

/// A payment as the API accepted it, before it exists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewPayment {
    pub reference: Option<Reference>,
    pub amount: Amount,
    pub currency: Currency,
    pub provider: ProviderCode,
    /// The provider's fee rule for this currency, fixed at initiation.
    pub fee: FeeRule,
    pub customer_phone: Phone,
    pub customer_email: Option<Email>,
    pub customer_name: Option<Name>,
    pub description: Option<Description>,
    pub metadata: Metadata,
    /// The payment link the customer pays through (its `lnk_` id): the link must take payments, and its
    /// counters move when this payment succeeds. The payment's metadata gets `lien_id`.
    pub link: Option<String>,
}

/// A payment link as the API accepted it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewLink {
    pub reference: Option<Reference>,
    pub amount: Amount,
    pub currency: Currency,
    pub description: Description,
    pub providers: Vec<ProviderCode>,
    pub usage: LinkUsage,
    pub expires_at: Option<Timestamp>,
    pub return_url: Option<ReturnUrl>,
    pub metadata: Metadata,
    /// `{public_url}/payer/`: the link's `url` is this followed by its id.
    pub page_base: String,
}

/// A payout as the API accepted it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewPayout {
    /// The merchant's own reference, unique among its payments, refunds and payouts.
    pub reference: Option<Reference>,
    pub amount: Amount,
    pub currency: Currency,
    pub provider: ProviderCode,
    pub fee: FeeRule,
    pub beneficiary_phone: Phone,
    pub beneficiary_name: Option<Name>,
    pub description: Option<Description>,
    pub metadata: Metadata,
}

/// What a provider (or our expiry timer) says about a payment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PaymentNotice {
    Processing,
    Confirmed,
    Declined {
        failure_code: String,
    },
    Expired,
    /// The provider opened the payment on a page of its own where the customer approves it (Wave's checkout,
    /// CinetPay's, Orange's): the payment is under way, and `url_paiement` says where.
    Opened {
        payment_url: ReturnUrl,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RefundOutcome {
    Completed,
    Refused,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PayoutOutcome {
    Sent,
    Refused { reason: String },
}

/// Every change the API names, as one enum.
// Serde: a command crosses between the nodes of a cluster, to the node that holds its merchant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    InitiatePayment(NewPayment),
    PaymentNotice {
        reference: Reference,
        notice: PaymentNotice,
    },
    RequestRefund {
        reference: Reference,
        amount: Option<Amount>,
        reason: Option<Reason>,
    },
    /// About the refund `refund` (its `rmb_` reference) of the payment `reference`.
    RefundNotice {
        reference: Reference,
        refund: String,
        outcome: RefundOutcome,
    },
    CreatePayout(NewPayout),
    PayoutNotice {
        id: String,
        outcome: PayoutOutcome,
    },
    CreateLink(NewLink),
    /// Deactivates the link `id` (its `lnk_` id).
    DeactivateLink {
        id: String,
    },
}

/// The record a command is about, which the actor looks up before calling [`super::decide`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A payment that must not exist yet (`None`: a generated reference, which cannot collide).
    NewPayment(Option<Reference>),
    Payment(Reference),
    /// A payout whose reference, when the merchant gave one, must not exist yet.
    NewPayout(Option<Reference>),
    Payout(String),
    /// A link whose reference, when the merchant gave one, must not exist yet.
    NewLink(Option<Reference>),
    Link(String),
}

impl Command {
    pub fn target(&self) -> Target {
        match self {
            Command::InitiatePayment(new) => Target::NewPayment(new.reference.clone()),
            Command::PaymentNotice { reference, .. }
            | Command::RequestRefund { reference, .. }
            | Command::RefundNotice { reference, .. } => Target::Payment(reference.clone()),
            Command::CreatePayout(new) => Target::NewPayout(new.reference.clone()),
            Command::PayoutNotice { id, .. } => Target::Payout(id.clone()),
            Command::CreateLink(new) => Target::NewLink(new.reference.clone()),
            Command::DeactivateLink { id } => Target::Link(id.clone()),
        }
    }

    /// The link a command also reads, when the command names it; a provider's notice about a payment made
    /// through a link names it through the payment ([`crate::domain::links::link_of`]).
    pub fn link(&self) -> Option<&str> {
        match self {
            Command::InitiatePayment(new) => new.link.as_deref(),
            _ => None,
        }
    }
}
