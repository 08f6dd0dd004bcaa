//! The forwarding protocol's layout, pinned: a sample of every message and answer that crosses between the
//! nodes of a cluster, with every variant of the enums they carry, and the digests of their bytes.

use super::*;
use crate::core::Rejection;
use crate::core::{NewLink, NewPayment, NewPayout, PaymentNotice, PayoutOutcome, Record, RefundOutcome};
use crate::domain::ledger::{Account, Balance, Balances, LedgerError};
use crate::domain::links::{Link, LinkUsage};
use crate::domain::money::{Amount, Currency, FeeRule, MoneyError};
use crate::domain::phone::Phone;
use crate::domain::provider::{AdapterName, ProviderReference, ProviderRoute, ReturnUrl};
use crate::domain::records::ProviderCode;
use crate::domain::records::{Payment, Payout};
use crate::domain::status::{LinkStatus, PaymentStatus, PayoutStatus, RefundStatus};
use crate::domain::text::{Description, Email, IdempotencyKey, Metadata, Name, Reason, Reference};
use crate::domain::time::Timestamp;
use crate::merchant::Part;
use crate::store::layout::tests::{notification, payment, payout};

/// One message of each kind that crosses between nodes, every optional field set, named; and each answer,
/// with every variant of the enums they carry (postcard writes a variant as its position).
fn samples() -> Vec<(&'static str, Vec<u8>)> {
    let xof = Currency::parse("XOF").unwrap();
    let at = Timestamp::from_unix_ms(1_795_310_624_123);
    let url = ReturnUrl::parse("https://shop.example/merci", true).unwrap();
    let metadata = Metadata::new([("note".to_owned(), "é".to_owned())].into()).unwrap();
    let reference = || Reference::parse("cmd-42").unwrap();
    let new_payment = NewPayment {
        reference: Some(reference()),
        amount: Amount::positive(5_000).unwrap(),
        currency: xof,
        provider: ProviderCode::parse("mtn_momo").unwrap(),
        fee: FeeRule::new(150, Amount::ZERO).unwrap(),
        customer_phone: Phone::parse("+22997000055").unwrap(),
        customer_email: Some(Email::parse("awa@example.com").unwrap()),
        customer_name: Some(Name::parse("Awa Koné").unwrap()),
        description: Some(Description::parse("Commande").unwrap()),
        metadata: metadata.clone(),
        link: Some("lnk_01JD0000000000000000000000".into()),
    };
    let new_payout = NewPayout {
        reference: Some(Reference::parse("virement-7").unwrap()),
        amount: Amount::positive(1_000).unwrap(),
        currency: xof,
        provider: ProviderCode::parse("wave").unwrap(),
        fee: FeeRule::new(100, Amount::ZERO).unwrap(),
        beneficiary_phone: Phone::parse("+221770000001").unwrap(),
        beneficiary_name: Some(Name::parse("Awa").unwrap()),
        description: Some(Description::parse("Salaire").unwrap()),
        metadata: metadata.clone(),
    };
    let new_link = NewLink {
        reference: Some(Reference::parse("frais").unwrap()),
        amount: Amount::positive(5_000).unwrap(),
        currency: xof,
        description: Description::parse("Frais").unwrap(),
        providers: vec![ProviderCode::parse("mtn_momo").unwrap()],
        usage: LinkUsage::Once,
        expires_at: Some(at),
        return_url: Some(url.clone()),
        metadata: metadata.clone(),
        page_base: "https://pay.example/payer/".into(),
    };
    let link = Link {
        id: "lnk_01JD0000000000000000000000".into(),
        url: "https://pay.example/payer/lnk_01JD0000000000000000000000".into(),
        reference: Some(Reference::parse("frais").unwrap()),
        status: LinkStatus::Active,
        amount: Amount::positive(5_000).unwrap(),
        currency: xof,
        description: Description::parse("Frais").unwrap(),
        providers: vec![ProviderCode::parse("mtn_momo").unwrap()],
        usage: LinkUsage::Once,
        expire_at: Some(at),
        return_url: Some(url.clone()),
        metadata,
        payments: 1,
        collected: Amount::positive(5_000).unwrap(),
        created_at: at,
        updated_at: at,
    };
    let notice = |notice| Command::PaymentNotice { reference: reference(), notice };
    let refund_notice = |outcome| Command::RefundNotice {
        reference: reference(),
        refund: "rmb_01JD0000000000000000000001".into(),
        outcome,
    };
    let payout_notice = |outcome| Command::PayoutNotice { id: "po_01JD0000000000000000000001".into(), outcome };
    let commands = [
        ("initiate a payment", Command::InitiatePayment(new_payment)),
        ("a payment processing", notice(PaymentNotice::Processing)),
        ("a payment confirmed", notice(PaymentNotice::Confirmed)),
        ("a payment declined", notice(PaymentNotice::Declined { failure_code: "PAYER_NOT_FOUND".into() })),
        ("a payment expired", notice(PaymentNotice::Expired)),
        ("a payment opened", notice(PaymentNotice::Opened { payment_url: url.clone() })),
        (
            "request a refund",
            Command::RequestRefund {
                reference: reference(),
                amount: Some(Amount::positive(1_000).unwrap()),
                reason: Some(Reason::parse("retour").unwrap()),
            },
        ),
        ("a refund completed", refund_notice(RefundOutcome::Completed)),
        ("a refund refused", refund_notice(RefundOutcome::Refused)),
        ("create a payout", Command::CreatePayout(new_payout)),
        ("a payout sent", payout_notice(PayoutOutcome::Sent)),
        ("a payout refused", payout_notice(PayoutOutcome::Refused { reason: "compte fermé".into() })),
        ("create a link", Command::CreateLink(new_link.clone())),
        ("create a reusable link", Command::CreateLink(NewLink { usage: LinkUsage::Many, ..new_link })),
        ("deactivate a link", Command::DeactivateLink { id: "lnk_01JD0000000000000000000000".into() }),
    ];
    let note = ProviderNote {
        route: Some(ProviderRoute { adapter: AdapterName::parse("pawapay").unwrap(), return_url: Some(url) }),
        reference: Some(ProviderReference::parse("MP250101.1200.A00001").unwrap()),
    };
    let idempotency = Idempotency {
        key: IdempotencyKey::parse("key-1").unwrap(),
        fingerprint: "ab".repeat(32),
        earlier_fingerprint: Some("cd".repeat(32)),
        success_status: 201,
        part: Part::FirstHeld,
    };
    let merchant = MerchantId::parse("mch_01JD0000000000000000000000").unwrap();
    let message = |ask| postcard::to_allocvec(&Forwarded { merchant: merchant.clone(), ask }).unwrap();
    let mut samples: Vec<(&'static str, Vec<u8>)> = commands
        .into_iter()
        .map(|(name, command)| {
            let ask = Ask::Execute { command, idempotency: Some(idempotency.clone()), note: note.clone() };
            (name, message(ask))
        })
        .collect();
    samples.extend([
        ("read a payment", message(Ask::Payment("cmd-42".into()))),
        ("read a payout", message(Ask::Payout("po_01JD0000000000000000000001".into()))),
        ("read a link", message(Ask::Link("lnk_01JD0000000000000000000000".into()))),
        ("read the balances", message(Ask::Balances)),
        ("release a key", message(Ask::Release(IdempotencyKey::parse("key-1").unwrap()))),
        ("resend a notification", message(Ask::Resend("evt_01JD0000000000000000000004".into()))),
    ]);
    let balances =
        Balances([(xof, Balance { available: 4_925, pending: 1_000, updated_at_ms: 1_795_310_624_123 })].into());
    let answers = [
        ("a payment done", Answer::Executed(Executed::Done(Record::Payment(payment())))),
        ("a payout done", Answer::Executed(Executed::Done(Record::Payout(payout())))),
        ("a link done", Answer::Executed(Executed::Done(Record::Link(link.clone())))),
        ("a replay", Answer::Executed(Executed::Replayed { status: 201, body: "{}".into() })),
        ("a payment read", Answer::Payment(Some(payment()))),
        ("a payout read", Answer::Payout(Some(payout()))),
        ("a link read", Answer::Link(Some(link))),
        ("the balances read", Answer::Balances(balances)),
        ("a key released", Answer::Released),
        ("a notification resent", Answer::Resent(Ok(notification()))),
        ("a resend in flight", Answer::Resent(Err(ResendRefused::InFlight))),
        ("a resend of nothing", Answer::Resent(Err(ResendRefused::NotFound))),
    ];
    let overflow = |account| Rejection::Invariant(LedgerError::Overflow { currency: xof, account });
    let negative =
        LedgerError::Negative { currency: xof, account: Account::Available, balance_minor: 1, delta_minor: -2 };
    let rejections = [
        ("not found", Rejection::NotFound),
        ("a duplicate reference", Rejection::DuplicateReference),
        ("an invalid state", Rejection::InvalidState("déjà remboursé".into())),
        (
            "insufficient balance",
            Rejection::InsufficientBalance { currency: xof, available_minor: 10, requested_minor: 20 },
        ),
        ("an amount below the fee", Rejection::AmountBelowFee { fee_minor: 150 }),
        ("a refund above the amount", Rejection::RefundAboveAmount { amount_minor: 5_000, left_minor: 1_000 }),
        ("a link active", Rejection::LinkClosed(LinkStatus::Active)),
        ("a link paid", Rejection::LinkClosed(LinkStatus::Paid)),
        ("a link deactivated", Rejection::LinkClosed(LinkStatus::Deactivated)),
        ("a link expired", Rejection::LinkClosed(LinkStatus::Expired)),
        ("a negative amount", Rejection::Money(MoneyError::Negative)),
        ("an amount not positive", Rejection::Money(MoneyError::NotPositive)),
        ("an overflow", Rejection::Money(MoneyError::Overflow)),
        ("an unknown currency", Rejection::Money(MoneyError::UnknownCurrency("ABC".into()))),
        ("a fee rate too high", Rejection::Money(MoneyError::FeeRateTooHigh(20_000))),
        ("a negative account", Rejection::Invariant(negative)),
        ("the pending account overflowing", overflow(Account::Pending)),
        ("customer funds overflowing", overflow(Account::CustomerFunds)),
        ("fees overflowing", overflow(Account::Fees)),
        ("refunds out overflowing", overflow(Account::RefundsOut)),
        ("payouts out overflowing", overflow(Account::PayoutsOut)),
        ("unbalanced entries", Rejection::Invariant(LedgerError::Unbalanced { sum_minor: 1 })),
        ("inconsistent amounts", Rejection::Invariant(LedgerError::InconsistentAmounts { amount: 1, fee: 2, net: 3 })),
        ("an impossible state", Rejection::impossible("a refund without its payment")),
    ];
    let errors = rejections.into_iter().map(|(name, rejection)| (name, EngineError::Rejected(rejection))).chain([
        ("a key reused", EngineError::IdempotencyKeyReused),
        ("a key in use", EngineError::IdempotencyKeyInUse),
        ("unavailable", EngineError::Unavailable("moved".into())),
        ("retired", EngineError::Retired),
        ("internal", EngineError::Internal("bug".into())),
        ("an incompatible store", EngineError::IncompatibleStore("format 9".into())),
        ("an e-mail taken", EngineError::EmailTaken("awa@example.com".into())),
    ]);
    // Every status of the records the answers carry.
    let with_payment = |status| Answer::Payment(Some(Payment { status, ..payment() }));
    let with_payout = |status| Answer::Payout(Some(Payout { status, ..payout() }));
    let with_refund = |status| {
        let mut p = payment();
        if let Some(refund) = p.refund.as_mut() {
            refund.status = status;
        }
        Answer::Payment(Some(p))
    };
    let statuses = [
        ("read: a payment initiated", with_payment(PaymentStatus::Initiated)),
        ("read: a payment processing", with_payment(PaymentStatus::Processing)),
        ("read: a payment succeeded", with_payment(PaymentStatus::Succeeded)),
        ("read: a payment failed", with_payment(PaymentStatus::Failed)),
        ("read: a payment expired", with_payment(PaymentStatus::Expired)),
        ("read: a payment refunded", with_payment(PaymentStatus::Refunded)),
        ("read: a payment partly refunded", with_payment(PaymentStatus::PartlyRefunded)),
        ("read: a refund processing", with_refund(RefundStatus::Processing)),
        ("read: a refund succeeded", with_refund(RefundStatus::Succeeded)),
        ("read: a refund failed", with_refund(RefundStatus::Failed)),
        ("read: a payout pending", with_payout(PayoutStatus::Pending)),
        ("read: a payout sent", with_payout(PayoutStatus::Sent)),
        ("read: a payout rejected", with_payout(PayoutStatus::Rejected)),
    ];
    let answers = answers.into_iter().chain(statuses).map(|(name, answer)| (name, Ok(answer)));
    let results: Vec<(&'static str, Result<Answer, EngineError>)> =
        answers.chain(errors.map(|(name, error)| (name, Err(error)))).collect();
    samples.extend(results.into_iter().map(|(name, result)| (name, postcard::to_allocvec(&result).unwrap())));
    samples
}

/// The encoding is positional, so nodes that read each other's messages must lay them out alike: this
/// fails when a message or an answer changes shape. Raise [`PROTOCOL`] with such a change and pin the new
/// digests, so that nodes of the two builds refuse each other's messages instead of misreading them.
#[test]
fn forwarded_bytes_are_pinned() {
    use sha2::{Digest, Sha256};
    let digests: Vec<String> = samples()
        .into_iter()
        .map(|(name, bytes)| format!("{name}: {}", hex::encode(&Sha256::digest(bytes)[..8])))
        .collect();
    let pinned: &[&str] = &[
        "initiate a payment: d2740148d6aeb4d4",
        "a payment processing: 2cb8218dd54bf72b",
        "a payment confirmed: a57c820c99e45617",
        "a payment declined: 4e1ce2c876048765",
        "a payment expired: cea63752b702bc05",
        "a payment opened: 9a97df7664f9d5c7",
        "request a refund: b3374fc4d9351291",
        "a refund completed: be5b7376bde77c72",
        "a refund refused: db28b18f35be140d",
        "create a payout: a07eada31b2d406c",
        "a payout sent: 6a92296a047efa44",
        "a payout refused: b9df754c1614b23a",
        "create a link: 1234e832d1bb93f3",
        "create a reusable link: df24c2aa722a2a44",
        "deactivate a link: ca5cddc4394fae55",
        "read a payment: a7e918a775ed475a",
        "read a payout: aa2394e0960a3d17",
        "read a link: 09881d994881c620",
        "read the balances: 12ce88ec36cc3ad4",
        "release a key: 39cbdb2206b6019e",
        "resend a notification: 44dbba931128e402",
        "a payment done: d09f1f094a966112",
        "a payout done: 5ba76b3ac121dfe4",
        "a link done: cc4e8d7805793bf4",
        "a replay: 6061a491c28aa989",
        "a payment read: b20d7de56cbac7d6",
        "a payout read: 2071a8f8a144ab2b",
        "a link read: 93b2624ff2b2e076",
        "the balances read: ee155a20514afbc9",
        "a key released: 9f1afa4dc124cba7",
        "a notification resent: 0f64263ec88d9767",
        "a resend in flight: f8e50cb7ce14f712",
        "a resend of nothing: 959d65d705aee31b",
        "read: a payment initiated: ee46fd3b8b999dc7",
        "read: a payment processing: 7f41f524bea38036",
        "read: a payment succeeded: 4ed680132e27a9d2",
        "read: a payment failed: 279ab052eca98b58",
        "read: a payment expired: b6cb8d040e586382",
        "read: a payment refunded: b20d7de56cbac7d6",
        "read: a payment partly refunded: a9002d9df46c9d9e",
        "read: a refund processing: 698e946d07dc6cd6",
        "read: a refund succeeded: b20d7de56cbac7d6",
        "read: a refund failed: 115489d8c3deda06",
        "read: a payout pending: 3e5b3ac6e896dd5f",
        "read: a payout sent: 92f4eeb2e182d13e",
        "read: a payout rejected: 2071a8f8a144ab2b",
        "not found: fb50dc0717ff266c",
        "a duplicate reference: 85f90dfea1d8027e",
        "an invalid state: 33a752dd064ca3fe",
        "insufficient balance: bc697273b3e26e37",
        "an amount below the fee: a6c4e126fbdbc526",
        "a refund above the amount: 0f2792fd170fd18e",
        "a link active: 8a12133ee3586861",
        "a link paid: 53f9326e60896a2a",
        "a link deactivated: 7116b4bc31410ba6",
        "a link expired: 110b8f1a9a14daaf",
        "a negative amount: 57c59d17338aa748",
        "an amount not positive: 00ee79a164a651e1",
        "an overflow: f973442132d1e0f3",
        "an unknown currency: c98d94f992690d10",
        "a fee rate too high: fb1a4dedc4a4c5b8",
        "a negative account: 1f2b62e1e14633f8",
        "the pending account overflowing: 2c17f75e06f41697",
        "customer funds overflowing: e52953919e6f1a19",
        "fees overflowing: 7aadd23fa5cdade3",
        "refunds out overflowing: d1bbda61c61727c3",
        "payouts out overflowing: 94bf22cc5109f8ae",
        "unbalanced entries: d20d628e978bee66",
        "inconsistent amounts: d81757ceffffca2d",
        "an impossible state: df296f045d4df1ec",
        "a key reused: 9dcf97a184f32623",
        "a key in use: a12871fee210fb86",
        "unavailable: 480da08451db19e0",
        "retired: a8d5dd63fba471eb",
        "internal: d0f8ec8513f4ed0c",
        "an incompatible store: c77db50e8ed3fe85",
        "an e-mail taken: 2aa4e27216bb8344",
    ];
    assert_eq!(PROTOCOL, "caisse-forward/5");
    assert_eq!(digests, pinned, "the forwarded messages changed shape: raise PROTOCOL and pin them again");
}
