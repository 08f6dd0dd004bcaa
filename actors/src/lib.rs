//! Caisse's payment engine: the merchant actors, the ledger and the durable store.
//!
//! # Layout
//!
//! - [`domain`]: checked value types (money, currency, phone, references, ids, time), the state machines of
//!   payments, refunds, payouts and payment links as one table ([`domain::status`]), the double-entry ledger rules
//!   ([`domain::ledger`]) and the records with the webhook body ([`domain::records`]).
//! - [`core`]: the pure decision function, `decide(balances, record, link, command) -> decision`.
//! - [`merchant`]: the merchant actor, one per merchant: decides, queues the change, answers once durable.
//! - [`registry`] and [`engine`]: which actors run where; the front door the service calls.
//! - [`store`]: the [`store::Store`] trait, the embedded and PostgreSQL backends, group commit, recovery and the
//!   startup audit.
//! - [`webhook`]: signatures, the retry schedule, URL rules, and the supervised delivery pool.
//! - [`error`]: the engine's error type.
//!
//! A payment goes in through [`Engine::execute`] with a [`core::Command`], becomes a [`store::Change`] written
//! in one durable group commit, and leaves as a webhook notification in the store's outbox.

mod account_cache;
pub mod cluster;
pub mod core;
pub mod domain;
pub mod engine;
pub mod error;
pub mod merchant;
pub mod metrics;
#[cfg(feature = "openapi")]
mod openapi;
pub mod outbound;
pub mod registry;
pub mod store;
pub mod webhook;

pub use crate::core::{
    Command, NewLink, NewPayment, NewPayout, PaymentNotice, PayoutOutcome, Record, RefundOutcome, Rejection,
};
pub use crate::engine::{AuditSchedule, Engine, EngineConfig, KeyChange};
pub use crate::error::EngineError;
pub use crate::merchant::{ActorSettings, Executed, Idempotency, Part, ProviderNote};
