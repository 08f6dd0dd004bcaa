//! The records Caisse keeps (payment with its refund, payout, merchant) and the views derived from them: the
//! API's transaction object and the webhook body (docs/api.md § Transactions, Webhook body).
//!
//! The payment and payout structs serialize to exactly the API's objects (docs/api.md § Payments, Refunds,
//! Payouts), so the stored record, the API answer and the idempotent replay of that answer are one shape and
//! cannot drift. Refunds and payouts take their transaction id from their own identifier (`rmb_X` and `ret_X`
//! move as `tx_X`), which keeps the API's refund object free of extra fields.

use serde::{Deserialize, Serialize};

use super::ids::MerchantId;
use super::money::{Amount, Currency};
use super::phone::Phone;
use super::status::{EventKind, PaymentStatus, PayoutStatus, RefundStatus};
use super::text::{Description, Email, Metadata, Name, Reason, Reference};
use super::time::Timestamp;

/// A provider's code as published by `GET /v1/fournisseurs` (`mtn_momo`, `wave`, ...).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ProviderCode(String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a provider code is 1 to 32 characters of a-z, 0-9 and _")]
pub struct InvalidProviderCode;

/// The grammar of Caisse's short codes (fournisseurs, adapters): 1 to 32 of a-z, 0-9 and `_`.
pub(crate) fn is_short_code(text: &str) -> bool {
    (1..=32).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

impl ProviderCode {
    pub fn parse(text: &str) -> Result<ProviderCode, InvalidProviderCode> {
        if is_short_code(text) {
            Ok(ProviderCode(text.to_owned()))
        } else {
            Err(InvalidProviderCode)
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `test`: the `fournisseur` of a test notification, which names no provider.
    pub(crate) fn test_event() -> ProviderCode {
        ProviderCode("test".to_owned())
    }
}

impl TryFrom<String> for ProviderCode {
    type Error = InvalidProviderCode;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        ProviderCode::parse(&value)
    }
}

impl From<ProviderCode> for String {
    fn from(value: ProviderCode) -> String {
        value.0
    }
}

impl std::fmt::Display for ProviderCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A refund of a payment. A payment has several, one at a time, their sum never above its amount.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refund {
    pub reference: String,
    #[serde(rename = "montant")]
    pub amount: Amount,
    #[serde(rename = "motif")]
    pub reason: Option<Reason>,
    #[serde(rename = "statut")]
    pub status: RefundStatus,
    pub created_at: Timestamp,
    pub completed_at: Option<Timestamp>,
}

impl Refund {
    pub fn transaction_id(&self) -> String {
        sibling_transaction_id(&self.reference)
    }
}

/// A payment, exactly the API's object.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payment {
    pub reference: Reference,
    pub transaction_id: String,
    #[serde(rename = "statut")]
    pub status: PaymentStatus,
    #[serde(rename = "montant")]
    pub amount: Amount,
    #[serde(rename = "devise")]
    pub currency: Currency,
    #[serde(rename = "frais")]
    pub fee: Amount,
    #[serde(rename = "montant_net")]
    pub net_amount: Amount,
    #[serde(rename = "fournisseur")]
    pub provider: ProviderCode,
    #[serde(rename = "client_telephone")]
    pub customer_phone: Phone,
    #[serde(rename = "client_email")]
    pub customer_email: Option<Email>,
    #[serde(rename = "client_nom")]
    pub customer_name: Option<Name>,
    pub description: Option<Description>,
    pub metadata: Metadata,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub paid_at: Option<Timestamp>,
    pub failure_code: Option<String>,
    /// The latest of [`Payment::refunds`], or null: the one a merchant with a single refund looks at.
    #[serde(rename = "remboursement")]
    pub refund: Option<Refund>,
    /// ISO 3166 alpha-2 country of the customer's phone, which routes the payment; null for a calling code
    /// Caisse does not know.
    #[serde(rename = "pays")]
    pub country: Option<String>,
    /// Where the customer approves the payment, for providers that need the browser; null for those that
    /// prompt the phone (USSD push), which are all the adapters built so far.
    #[serde(rename = "url_paiement")]
    pub payment_url: Option<String>,
    // The two fields below come last because the stored encoding is positional: a record written before
    // them is a prefix of one written after, which is how the store tells the two apart when it upgrades.
    /// The sum of the completed refunds.
    #[serde(rename = "montant_rembourse")]
    pub refunded_amount: Amount,
    /// Every refund, oldest first; only the last may be `en_cours`.
    #[serde(rename = "remboursements")]
    pub refunds: Vec<Refund>,
}

/// How many refunds one payment takes, whatever became of them: a bound on the record's size.
pub const MAX_REFUNDS_PER_PAYMENT: usize = 50;

impl Payment {
    /// The refund named `reference`, among all of this payment's.
    pub fn refund_named(&self, reference: &str) -> Option<&Refund> {
        self.refunds.iter().find(|r| r.reference == reference)
    }

    /// What is left to refund: the amount less every refund that is not `echec` (a refund under way holds
    /// its part until it ends).
    pub fn refundable(&self) -> Amount {
        let held: i64 =
            self.refunds.iter().filter(|r| r.status != RefundStatus::Failed).map(|r| r.amount.minor()).sum();
        Amount::try_from(self.amount.minor().saturating_sub(held).max(0)).unwrap_or(Amount::ZERO)
    }

    /// Adds a refund as the latest.
    pub fn push_refund(&mut self, refund: Refund) {
        self.refunds.push(refund.clone());
        self.refund = Some(refund);
    }

    /// Replaces the refund of the same reference, keeping [`Payment::refund`] the latest.
    pub fn replace_refund(&mut self, refund: Refund) {
        if let Some(slot) = self.refunds.iter_mut().find(|r| r.reference == refund.reference) {
            *slot = refund;
        }
        self.refund = self.refunds.last().cloned();
    }
}

/// A payout, exactly the API's object.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payout {
    pub id: String,
    pub transaction_id: String,
    #[serde(rename = "statut")]
    pub status: PayoutStatus,
    #[serde(rename = "montant")]
    pub amount: Amount,
    #[serde(rename = "devise")]
    pub currency: Currency,
    #[serde(rename = "frais")]
    pub fee: Amount,
    #[serde(rename = "montant_net")]
    pub net_amount: Amount,
    #[serde(rename = "fournisseur")]
    pub provider: ProviderCode,
    #[serde(rename = "beneficiaire_telephone")]
    pub beneficiary_phone: Phone,
    #[serde(rename = "beneficiaire_nom")]
    pub beneficiary_name: Option<Name>,
    pub description: Option<Description>,
    pub metadata: Metadata,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub processed_at: Option<Timestamp>,
    #[serde(rename = "motif_rejet")]
    pub rejection_reason: Option<String>,
    /// The merchant's own reference, when it gave one. Last because the stored encoding is positional: a
    /// payout written before it is a prefix of one written after.
    pub reference: Option<Reference>,
}

/// `rmb_X` / `ret_X` -> `tx_X`.
pub fn sibling_transaction_id(id: &str) -> String {
    match id.split_once('_') {
        Some((_, ulid)) => format!("tx_{ulid}"),
        None => format!("tx_{id}"),
    }
}

/// Kind of a money movement in the transaction list.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransactionType {
    #[serde(rename = "paiement")]
    Payment,
    #[serde(rename = "remboursement")]
    Refund,
    #[serde(rename = "retrait")]
    Payout,
}

impl TransactionType {
    pub const ALL: [TransactionType; 3] = [TransactionType::Payment, TransactionType::Refund, TransactionType::Payout];

    pub fn as_str(self) -> &'static str {
        match self {
            TransactionType::Payment => "paiement",
            TransactionType::Refund => "remboursement",
            TransactionType::Payout => "retrait",
        }
    }

    pub fn parse(text: &str) -> Option<TransactionType> {
        Self::ALL.into_iter().find(|t| t.as_str() == text)
    }

    pub(crate) fn tag(self) -> u8 {
        match self {
            TransactionType::Payment => b'p',
            TransactionType::Refund => b'r',
            TransactionType::Payout => b'o',
        }
    }

    pub(crate) fn from_tag(tag: u8) -> Option<TransactionType> {
        Self::ALL.into_iter().find(|t| t.tag() == tag)
    }
}

/// The API's transaction object, derived from a payment, its refund or a payout.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Transaction {
    pub reference: String,
    pub transaction_id: String,
    #[serde(rename = "type")]
    pub kind: TransactionType,
    #[serde(rename = "statut")]
    pub status: &'static str,
    #[serde(rename = "montant")]
    pub amount: Amount,
    #[serde(rename = "devise")]
    pub currency: Currency,
    #[serde(rename = "frais")]
    pub fee: Amount,
    #[serde(rename = "montant_net")]
    pub net_amount: Amount,
    #[serde(rename = "fournisseur")]
    pub provider: ProviderCode,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub paid_at: Option<Timestamp>,
    #[serde(rename = "paiement_reference")]
    pub payment_reference: Option<String>,
}

impl Transaction {
    pub fn of_payment(p: &Payment) -> Transaction {
        Transaction {
            reference: p.reference.as_str().to_owned(),
            transaction_id: p.transaction_id.clone(),
            kind: TransactionType::Payment,
            status: p.status.as_str(),
            amount: p.amount,
            currency: p.currency,
            fee: p.fee,
            net_amount: p.net_amount,
            provider: p.provider.clone(),
            created_at: p.created_at,
            updated_at: p.updated_at,
            paid_at: p.paid_at,
            payment_reference: None,
        }
    }

    /// A refund moves its whole amount back to the customer: fees are not returned (docs/api.md § Refunds), so `frais`
    /// is zero and `montant_net` equals `montant`.
    pub fn of_refund(p: &Payment, r: &Refund) -> Transaction {
        Transaction {
            reference: r.reference.clone(),
            transaction_id: r.transaction_id(),
            kind: TransactionType::Refund,
            status: r.status.as_str(),
            amount: r.amount,
            currency: p.currency,
            fee: Amount::ZERO,
            net_amount: r.amount,
            provider: p.provider.clone(),
            created_at: r.created_at,
            updated_at: r.completed_at.unwrap_or(r.created_at),
            paid_at: if r.status == RefundStatus::Succeeded { r.completed_at } else { None },
            payment_reference: Some(p.reference.as_str().to_owned()),
        }
    }

    pub fn of_payout(o: &Payout) -> Transaction {
        Transaction {
            reference: o.id.clone(),
            transaction_id: o.transaction_id.clone(),
            kind: TransactionType::Payout,
            status: o.status.as_str(),
            amount: o.amount,
            currency: o.currency,
            fee: o.fee,
            net_amount: o.net_amount,
            provider: o.provider.clone(),
            created_at: o.created_at,
            updated_at: o.updated_at,
            paid_at: o.processed_at,
            payment_reference: None,
        }
    }
}

/// A merchant account: who may call the API and where its webhooks go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Merchant {
    pub id: MerchantId,
    pub name: String,
    pub email: String,
    /// PHC string (argon2) of the dashboard password.
    pub password_hash: String,
    /// The secret key: authenticates API calls and signs webhooks. Never logged.
    pub secret_key: String,
    pub webhook_url: Option<String>,
    pub created_at: Timestamp,
}

/// The body of a webhook notification, field for field as docs/api.md § Webhook body gives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookBody {
    pub event: EventKind,
    pub created_at: Timestamp,
    pub data: WebhookData,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookData {
    pub reference: String,
    pub transaction_id: String,
    #[serde(rename = "fournisseur")]
    pub provider: ProviderCode,
    #[serde(rename = "montant")]
    pub amount: Amount,
    #[serde(rename = "devise")]
    pub currency: Currency,
    #[serde(rename = "frais")]
    pub fee: Amount,
    #[serde(rename = "montant_net")]
    pub net_amount: Amount,
    #[serde(rename = "statut")]
    pub status: String,
    #[serde(rename = "client_email")]
    pub customer_email: Option<Email>,
    pub metadata: Metadata,
    pub paid_at: Option<Timestamp>,
    /// `payment.refunded` only: the sum of the payment's completed refunds (docs/api.md § Webhook body); absent from
    /// every other event, whose body is the spec's to the letter.
    #[serde(rename = "montant_rembourse", skip_serializing_if = "Option::is_none", default)]
    pub refunded_amount: Option<Amount>,
}

impl WebhookData {
    /// Payment events, including `payment.refunded`, carry the payment's own fields (docs/api.md § Webhook body).
    pub fn of_payment(p: &Payment) -> WebhookData {
        WebhookData {
            reference: p.reference.as_str().to_owned(),
            transaction_id: p.transaction_id.clone(),
            provider: p.provider.clone(),
            amount: p.amount,
            currency: p.currency,
            fee: p.fee,
            net_amount: p.net_amount,
            status: p.status.as_str().to_owned(),
            customer_email: p.customer_email.clone(),
            metadata: p.metadata.clone(),
            paid_at: p.paid_at,
            refunded_amount: None,
        }
    }

    /// `payment.refunded`: the payment's fields and the sum refunded so far.
    pub fn of_refunded_payment(p: &Payment) -> WebhookData {
        WebhookData { refunded_amount: Some(p.refunded_amount), ..WebhookData::of_payment(p) }
    }

    /// Payout events: `reference` is the payout id, no customer e-mail, `paid_at` when the payout was sent.
    pub fn of_payout(o: &Payout) -> WebhookData {
        WebhookData {
            reference: o.id.clone(),
            transaction_id: o.transaction_id.clone(),
            provider: o.provider.clone(),
            amount: o.amount,
            currency: o.currency,
            fee: o.fee,
            net_amount: o.net_amount,
            status: o.status.as_str().to_owned(),
            customer_email: None,
            metadata: o.metadata.clone(),
            paid_at: o.processed_at,
            refunded_amount: None,
        }
    }
}

/// Where a notification is in its delivery life (docs/api.md § Webhook delivery).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    /// Waiting for its next attempt at `next_attempt_at`.
    Pending,
    /// A receiver answered 200.
    Delivered,
    /// Every scheduled attempt failed; it can be sent again on demand.
    Failed,
}

/// One delivery attempt, as the dashboard shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    pub at: Timestamp,
    /// The `X-Service-Timestamp` it was signed with, so the dashboard shows the exact signed string.
    #[serde(default)]
    pub signed_at_s: Option<u64>,
    pub http_status: Option<u16>,
    pub error: Option<String>,
    pub latency_ms: u64,
}

/// A webhook notification in the durable outbox: written in the same transaction as the change that caused
/// it, so a crash can never lose one; `body` holds the exact bytes that every attempt signs and sends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notification {
    pub id: String,
    pub merchant: MerchantId,
    pub event: EventKind,
    pub reference: String,
    pub body: String,
    pub created_at: Timestamp,
    pub state: DeliveryState,
    pub next_attempt_at: Option<Timestamp>,
    /// The last attempts, oldest first, bounded (see `webhook::schedule::MAX_LOGGED_ATTEMPTS`).
    pub attempts: Vec<Attempt>,
    /// Attempts in the current chain (reset when sent again on demand); decides the next wait.
    #[serde(default)]
    pub chain_attempts: u32,
    /// Attempts ever made, including those dropped from `attempts`.
    #[serde(default)]
    pub total_attempts: u32,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample_payment() -> Payment {
        let at = Timestamp::from_unix_ms(1_700_000_000_000);
        Payment {
            reference: Reference::parse("cmd-42").unwrap(),
            transaction_id: "tx_01JD0000000000000000000000".into(),
            status: PaymentStatus::Succeeded,
            amount: Amount::new(5000).unwrap(),
            currency: Currency::parse("XOF").unwrap(),
            fee: Amount::new(75).unwrap(),
            net_amount: Amount::new(4925).unwrap(),
            provider: ProviderCode::parse("mtn_momo").unwrap(),
            customer_phone: Phone::parse("+22997000001").unwrap(),
            customer_email: Some(Email::parse("awa@example.com").unwrap()),
            customer_name: None,
            description: None,
            metadata: Metadata::empty(),
            created_at: at,
            updated_at: at,
            paid_at: Some(at),
            failure_code: None,
            refund: None,
            country: Some("BJ".into()),
            payment_url: None,
            refunded_amount: Amount::ZERO,
            refunds: Vec::new(),
        }
    }

    #[test]
    fn webhook_body_has_exactly_the_spec_fields_in_order() {
        let body = WebhookBody {
            event: EventKind::PaymentSucceeded,
            created_at: Timestamp::from_unix_ms(1_700_000_000_000),
            data: WebhookData::of_payment(&sample_payment()),
        };
        let text = serde_json::to_string(&body).unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        let top: Vec<_> = value.as_object().unwrap().keys().cloned().collect();
        assert_eq!(top.len(), 3);
        let data = value["data"].as_object().unwrap();
        assert_eq!(data.len(), 11);
        for field in [
            "reference",
            "transaction_id",
            "fournisseur",
            "montant",
            "devise",
            "frais",
            "montant_net",
            "statut",
            "client_email",
            "metadata",
            "paid_at",
        ] {
            assert!(data.contains_key(field), "{field}");
        }
        assert!(text.starts_with(
            r#"{"event":"payment.succeeded","created_at":"2023-11-14T22:13:20.000Z","data":{"reference":"cmd-42""#
        ));
        assert_eq!(value["data"]["montant"], 5000);
        assert_eq!(value["data"]["statut"], "succes");
        assert_eq!(value["data"]["metadata"], serde_json::json!({}));
    }

    #[test]
    fn payment_serializes_nulls_not_missing_fields() {
        let value = serde_json::to_value(sample_payment()).unwrap();
        assert_eq!(value.as_object().unwrap().len(), 22);
        assert!(value["client_nom"].is_null());
        assert_eq!(value["pays"], "BJ");
        assert!(value["url_paiement"].is_null());
        assert!(value["remboursement"].is_null());
        assert_eq!(value["montant_rembourse"], 0);
        assert_eq!(value["remboursements"], serde_json::json!([]));
        let back: Payment = serde_json::from_value(value).unwrap();
        assert_eq!(back, sample_payment());
    }

    fn refund(n: u8, minor: i64, status: RefundStatus) -> Refund {
        Refund {
            reference: format!("rmb_01JD00000000000000000000{n:02}"),
            amount: Amount::new(minor).unwrap(),
            reason: None,
            status,
            created_at: Timestamp::from_unix_ms(1_700_000_000_000),
            completed_at: None,
        }
    }

    #[test]
    fn what_is_left_to_refund_counts_every_refund_but_the_refused() {
        let mut p = sample_payment();
        assert_eq!(p.refundable(), p.amount);
        p.push_refund(refund(1, 2000, RefundStatus::Succeeded));
        p.push_refund(refund(2, 1000, RefundStatus::Failed));
        p.push_refund(refund(3, 500, RefundStatus::Processing));
        assert_eq!(p.refundable(), Amount::new(2500).unwrap());
        assert_eq!(p.refund.as_ref().map(|r| r.reference.as_str()), Some("rmb_01JD0000000000000000000003"));
        p.replace_refund(refund(3, 500, RefundStatus::Failed));
        assert_eq!(p.refundable(), Amount::new(3000).unwrap());
        assert_eq!(p.refund.as_ref().map(|r| r.status), Some(RefundStatus::Failed), "the latest follows");
        assert_eq!(p.refund_named("rmb_01JD0000000000000000000001").map(|r| r.amount.minor()), Some(2000));
        assert!(p.refund_named("rmb_01JD0000000000000000000009").is_none());
    }

    #[test]
    fn refunded_events_carry_the_refunded_total_and_others_do_not() {
        let mut p = sample_payment();
        p.refunded_amount = Amount::new(2000).unwrap();
        let refunded = serde_json::to_value(WebhookData::of_refunded_payment(&p)).unwrap();
        assert_eq!(refunded["montant_rembourse"], 2000);
        assert_eq!(refunded["montant"], 5000);
        let plain = serde_json::to_value(WebhookData::of_payment(&p)).unwrap();
        assert!(plain.get("montant_rembourse").is_none());
    }

    #[test]
    fn refund_transaction_ids_follow_their_reference() {
        assert_eq!(sibling_transaction_id("rmb_01ABC"), "tx_01ABC");
        assert_eq!(sibling_transaction_id("ret_01ABC"), "tx_01ABC");
    }

    #[test]
    fn provider_codes_are_checked() {
        assert!(ProviderCode::parse("orange_money").is_ok());
        assert!(ProviderCode::parse("").is_err());
        assert!(ProviderCode::parse("Orange").is_err());
        assert!(ProviderCode::parse(&"a".repeat(33)).is_err());
    }

    #[test]
    fn transaction_types_round_trip() {
        for t in TransactionType::ALL {
            assert_eq!(TransactionType::parse(t.as_str()), Some(t));
            assert_eq!(TransactionType::from_tag(t.tag()), Some(t));
        }
    }
}
