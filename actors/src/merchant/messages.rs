//! What callers send the merchant actor and what it answers: [`Execute`] for every change the API names,
//! with its [`Idempotency`] part and its [`Executed`] answer, and the reads of a payment, a payout and the
//! balances.

use actix::prelude::*;

use crate::core::{Command, Record};
use crate::domain::ledger::Balances;
use crate::domain::records::{Payment, Payout};
use crate::domain::text::IdempotencyKey;
use crate::error::EngineError;

/// The idempotency part of a request (docs/api.md § Idempotency): the key, what identifies the request, and the status the
/// API answers on success (stored with the body so that a replay is the first answer again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idempotency {
    pub key: IdempotencyKey,
    pub fingerprint: String,
    pub success_status: u16,
}

/// The answer to a change.
// Moved once per request, never stored in bulk: the size difference costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Executed {
    /// The change was applied (or was a no-op duplicate notice); the record as it now is.
    Done(Record),
    /// The idempotency key was seen with the same request: the first answer, as it was.
    Replayed { status: u16, body: String },
}

/// Every change the API names reaches the actor as this message; the variants of [`Command`] are the
/// individual changes (initiate, processing, confirm, decline, expire, late success, refund request /
/// complete / fail, payout create / process / reject).
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Executed, EngineError>")]
pub struct Execute {
    pub command: Command,
    pub idempotency: Option<Idempotency>,
}

/// Read a payment, as durable.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Option<Payment>, EngineError>")]
pub struct GetPayment(pub String);

/// Read a payout, as durable.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Option<Payout>, EngineError>")]
pub struct GetPayout(pub String);

/// Read every balance, as durable.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Balances, EngineError>")]
pub struct GetBalances;
