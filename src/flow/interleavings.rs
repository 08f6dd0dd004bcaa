//! Property test: whatever order a provider's callbacks, status answers, errors, the TTL and restarts come in,
//! a payment ends in the provider's final state (or `expire`, then `succes` if the provider succeeds late) and
//! is credited at most once. Driven through [`apply_provider_status`] and a real engine, against a model.

use std::path::Path;

use caisse_engine::core::{Command, NewPayment, Record};
use caisse_engine::domain::ids::MerchantId;
use caisse_engine::domain::money::{Amount, Currency, FeeRule};
use caisse_engine::domain::phone::Phone;
use caisse_engine::domain::records::ProviderCode;
use caisse_engine::domain::status::PaymentStatus;
use caisse_engine::domain::text::{Metadata, Reference};
use caisse_engine::{Engine, EngineConfig, Executed};
use proptest::prelude::*;

use super::notice::apply_provider_status;
use crate::providers::ProviderStatus;

#[derive(Debug, Clone, Copy)]
enum Event {
    /// A callback claiming anything: confirmed by a status query, so the provider's current state applies.
    Callback,
    /// A status query of a sweep or a reconciliation.
    Poll,
    /// The provider moves on: not created -> processing -> final.
    Advance,
    /// A timeout or a 5xx: nothing is applied.
    Error,
    /// The TTL passed: the last status query's answer applies, and anything not final expires.
    Ttl,
    /// The server stops and starts again on the same store.
    Restart,
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        3 => Just(Event::Callback),
        3 => Just(Event::Poll),
        3 => Just(Event::Advance),
        1 => Just(Event::Error),
        1 => Just(Event::Ttl),
        1 => Just(Event::Restart),
    ]
}

/// The provider's answer at a stage, with its final outcome.
fn provider_status(stage: u8, succeeds: bool) -> ProviderStatus {
    match (stage, succeeds) {
        (0, _) => ProviderStatus::Pending,
        (1, _) => ProviderStatus::Processing,
        (_, true) => ProviderStatus::Succeeded,
        (_, false) => ProviderStatus::Failed { code: "payer_not_found".into() },
    }
}

/// The reference model: what a payment's status becomes when `status` is applied (`expire` at the TTL).
fn model(current: PaymentStatus, status: &ProviderStatus, expire: bool) -> PaymentStatus {
    use PaymentStatus::*;
    match (current, status) {
        (Initiated | Processing | Expired, ProviderStatus::Succeeded) => Succeeded,
        (Initiated | Processing, ProviderStatus::Failed { .. }) => Failed,
        (Initiated | Processing, _) if expire => Expired,
        (Initiated, ProviderStatus::Processing) => Processing,
        (other, _) => other,
    }
}

fn open(dir: &Path) -> Engine {
    Engine::open(EngineConfig::new(dir)).expect("the engine opens and its audit passes")
}

async fn run(events: Vec<Event>, succeeds: bool) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().map_err(|e| TestCaseError::fail(e.to_string()))?;
    let merchant = MerchantId::new();
    let mut engine = open(dir.path());
    let new = NewPayment {
        reference: Some(Reference::parse("order-1").expect("a reference")),
        amount: Amount::positive(1_000).expect("an amount"),
        currency: Currency::XOF,
        provider: ProviderCode::parse("mtn_momo").expect("a code"),
        fee: FeeRule::new(150, Amount::ZERO).expect("a fee"),
        customer_phone: Phone::parse("+22951345789").expect("a phone"),
        customer_email: None,
        customer_name: None,
        description: None,
        metadata: Metadata::empty(),
        link: None,
    };
    let created = engine.execute(&merchant, Command::InitiatePayment(new), None).await;
    prop_assert!(matches!(created, Ok(Executed::Done(_))), "{created:?}");
    let (mut stage, mut expected) = (0u8, PaymentStatus::Initiated);
    let apply = |engine: Engine, status: ProviderStatus, expire: bool| {
        let merchant = merchant.clone();
        async move {
            let located = engine.locate(&merchant, "order-1").ok().flatten().expect("the payment is stored");
            apply_provider_status(&engine, &merchant, &located, &status.into(), expire).await.map(drop)
        }
    };
    for event in events.into_iter().chain([Event::Advance, Event::Advance, Event::Poll]) {
        let status = provider_status(stage, succeeds);
        match event {
            Event::Callback | Event::Poll => {
                apply(engine.clone(), status.clone(), false).await.map_err(|e| TestCaseError::fail(e.to_string()))?;
                expected = model(expected, &status, false);
            }
            Event::Ttl => {
                apply(engine.clone(), status.clone(), true).await.map_err(|e| TestCaseError::fail(e.to_string()))?;
                expected = model(expected, &status, true);
            }
            Event::Advance => stage = (stage + 1).min(2),
            Event::Error => {}
            Event::Restart => {
                drop(engine);
                engine = open(dir.path());
            }
        }
    }
    let payment = engine.payment(&merchant, "order-1").await.map_err(|e| TestCaseError::fail(e.to_string()))?;
    let payment = payment.expect("the payment");
    prop_assert_eq!(payment.status, expected);
    let available = engine.balances(&merchant).await.map_err(|e| TestCaseError::fail(e.to_string()))?;
    let credited = if expected == PaymentStatus::Succeeded { 985 } else { 0 };
    prop_assert_eq!(available.get(Currency::XOF).available, credited, "credited at most once");
    let journal = engine.journal(&merchant, 1, 100).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let credits = journal.iter().filter(|e| e.status == "succes").count();
    prop_assert!(credits <= 1, "{credits} credits");
    if let Some(Record::Payment(p)) = engine.locate(&merchant, "order-1").ok().flatten().map(|l| l.record) {
        prop_assert_eq!(p.status, expected);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn every_interleaving_ends_in_the_providers_final_state_credited_at_most_once(
        events in prop::collection::vec(event(), 0..14),
        succeeds in any::<bool>(),
    ) {
        actix::System::new().block_on(run(events, succeeds))?;
    }
}
