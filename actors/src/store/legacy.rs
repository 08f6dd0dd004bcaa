//! Record layouts of earlier store formats that this build still reads, and how each becomes today's record.
//!
//! The stored encoding is positional (see `layout`), so a record written by an earlier format is read with the
//! struct it was written from. Only appended fields are handled here: a record written before them is a
//! prefix of one written after, so decoding with today's struct runs out of bytes and decoding with the old one
//! leaves bytes over; each value is therefore read as exactly one of the two. Old records are not rewritten:
//! the next change of a payment stores it in today's layout.

use serde::Deserialize;

use super::layout::decode;
use super::StoreError;
use crate::domain::money::{Amount, Currency};
use crate::domain::phone::Phone;
use crate::domain::records::{Payment, Payout, ProviderCode, Refund};
use crate::domain::status::{PaymentStatus, PayoutStatus, RefundStatus};
use crate::domain::text::{Description, Email, Metadata, Name, Reference};
use crate::domain::time::Timestamp;

/// A stored payment of any format this build reads.
pub(super) fn decode_payment(what: &str, bytes: &[u8]) -> Result<Payment, StoreError> {
    match decode::<Payment>(what, bytes) {
        Ok(payment) => Ok(payment),
        Err(today) => match decode::<PaymentBeforeRefunds>(what, bytes) {
            Ok(old) => Ok(old.into()),
            // Neither layout: report the failure against today's, which is what the value should have been.
            Err(_) => Err(today),
        },
    }
}

/// A stored payout of any format this build reads.
pub(super) fn decode_payout(what: &str, bytes: &[u8]) -> Result<Payout, StoreError> {
    match decode::<Payout>(what, bytes) {
        Ok(payout) => Ok(payout),
        Err(today) => match decode::<PayoutBeforeReference>(what, bytes) {
            Ok(old) => Ok(old.into()),
            Err(_) => Err(today),
        },
    }
}

/// A payout as formats 2 and 3 stored it: without the merchant's reference.
#[derive(Deserialize)]
struct PayoutBeforeReference {
    id: String,
    transaction_id: String,
    status: PayoutStatus,
    amount: Amount,
    currency: Currency,
    fee: Amount,
    net_amount: Amount,
    provider: ProviderCode,
    beneficiary_phone: Phone,
    beneficiary_name: Option<Name>,
    description: Option<Description>,
    metadata: Metadata,
    created_at: Timestamp,
    updated_at: Timestamp,
    processed_at: Option<Timestamp>,
    rejection_reason: Option<String>,
}

impl From<PayoutBeforeReference> for Payout {
    fn from(old: PayoutBeforeReference) -> Payout {
        Payout {
            id: old.id,
            transaction_id: old.transaction_id,
            status: old.status,
            amount: old.amount,
            currency: old.currency,
            fee: old.fee,
            net_amount: old.net_amount,
            provider: old.provider,
            beneficiary_phone: old.beneficiary_phone,
            beneficiary_name: old.beneficiary_name,
            description: old.description,
            metadata: old.metadata,
            created_at: old.created_at,
            updated_at: old.updated_at,
            processed_at: old.processed_at,
            rejection_reason: old.rejection_reason,
            reference: None,
        }
    }
}

/// A payment as formats 2 and 3 stored it: one refund at most, no refunded total.
#[derive(Deserialize)]
struct PaymentBeforeRefunds {
    reference: Reference,
    transaction_id: String,
    status: PaymentStatus,
    amount: Amount,
    currency: Currency,
    fee: Amount,
    net_amount: Amount,
    provider: ProviderCode,
    customer_phone: Phone,
    customer_email: Option<Email>,
    customer_name: Option<Name>,
    description: Option<Description>,
    metadata: Metadata,
    created_at: Timestamp,
    updated_at: Timestamp,
    paid_at: Option<Timestamp>,
    failure_code: Option<String>,
    refund: Option<Refund>,
    country: Option<String>,
    payment_url: Option<String>,
}

impl From<PaymentBeforeRefunds> for Payment {
    /// The one refund becomes the list of refunds. Those formats marked a payment `rembourse` when its refund
    /// completed, whatever its amount; a refund of less than the whole payment now reads as what it was,
    /// `rembourse_partiellement`, which also lets the merchant refund the rest.
    fn from(old: PaymentBeforeRefunds) -> Payment {
        let refunded_amount = match &old.refund {
            Some(r) if r.status == RefundStatus::Succeeded => r.amount,
            _ => Amount::ZERO,
        };
        let status = match old.status {
            PaymentStatus::Refunded if refunded_amount < old.amount => PaymentStatus::PartlyRefunded,
            other => other,
        };
        Payment {
            reference: old.reference,
            transaction_id: old.transaction_id,
            status,
            amount: old.amount,
            currency: old.currency,
            fee: old.fee,
            net_amount: old.net_amount,
            provider: old.provider,
            customer_phone: old.customer_phone,
            customer_email: old.customer_email,
            customer_name: old.customer_name,
            description: old.description,
            metadata: old.metadata,
            created_at: old.created_at,
            updated_at: old.updated_at,
            paid_at: old.paid_at,
            failure_code: old.failure_code,
            refunds: old.refund.iter().cloned().collect(),
            refund: old.refund,
            country: old.country,
            payment_url: old.payment_url,
            refunded_amount,
        }
    }
}
