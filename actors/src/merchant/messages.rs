//! What callers send the merchant actor and what it answers: [`Execute`] for every change the API names,
//! with its [`Idempotency`] part, its [`ProviderNote`] and its [`Executed`] answer, and the reads of a payment, a payout and the
//! balances.

use actix::prelude::*;
use serde::{Deserialize, Serialize};

use crate::core::{Command, Record};
use crate::domain::ledger::Balances;
use crate::domain::links::Link;
use crate::domain::provider::{ProviderReference, ProviderRoute};
use crate::domain::records::{Payment, Payout};
use crate::domain::text::IdempotencyKey;
use crate::domain::time::Timestamp;
use crate::error::EngineError;
use crate::store::IdempotencyRecord;

/// The idempotency part of a request (docs/api.md § Idempotency): the key, what identifies the request, and the status the
/// API answers on success (stored with the body so that a replay is the first answer again).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Idempotency {
    pub key: IdempotencyKey,
    pub fingerprint: String,
    /// The same request's fingerprint as an earlier version computed it (over the raw bytes), which records
    /// it stored still hold for their 24 hours: a retry across an upgrade is a replay, not a conflict.
    pub earlier_fingerprint: Option<String>,
    pub success_status: u16,
    /// Which of the request's changes this is.
    pub part: Part,
}

/// Which of a request's changes an [`Execute`] is, for its idempotency key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Part {
    /// The request's only change: its record is the stored answer, and the key is free once it is written.
    Only,
    /// The first change of a request that goes on before it answers (it asks the provider, then may make
    /// [`Part::Following`] changes): once the change is written the key stays in use (409
    /// `idempotency_key_in_use`) until the caller releases it ([`ReleaseKey`]), or [`KEY_HELD_AT_MOST`] has
    /// passed should it never do so.
    FirstHeld,
    /// A change the request makes after its first (a provider's refusal or answer applied before the request
    /// is answered): its record replaces the stored answer, so that a replay is the answer the request gave.
    /// Such a change is never itself a replay, and writes no answer once the first one's is gone.
    Following,
}

/// How long a held key ([`Part::FirstHeld`]) stays in use without its release: beyond what a request
/// spends with its provider in one call (at most 10 s), so that a request whose node died, or whose release was
/// lost, frees its key soon. A request still going on past it (two slow calls, for a refund or payout settled
/// at once) lets a retry replay its answer as first written, as a request of a node that moved the merchant.
pub const KEY_HELD_AT_MOST: std::time::Duration = std::time::Duration::from_secs(15);

impl Idempotency {
    /// What a request with this key answers given the key's stored answer `first`: the first answer again for
    /// the same request (its fingerprint now, or as an earlier version computed it), 409
    /// `idempotency_key_reused` for another; `None` once the answer is past its 24 hours.
    pub fn replay(&self, first: IdempotencyRecord, now: Timestamp) -> Option<Result<Executed, EngineError>> {
        if !first.is_live(now) {
            return None;
        }
        let same = first.fingerprint == self.fingerprint
            || self.earlier_fingerprint.as_ref().is_some_and(|f| *f == first.fingerprint);
        Some(match same {
            true => Ok(Executed::Replayed { status: first.status, body: first.body }),
            false => Err(EngineError::IdempotencyKeyReused),
        })
    }

    /// The same request's part in a change that follows its first ([`Part::Following`]).
    pub fn following(&self) -> Idempotency {
        Idempotency { part: Part::Following, ..self.clone() }
    }

    /// The same request's part in its first change when the caller goes on before answering
    /// ([`Part::FirstHeld`]).
    pub fn holding(self) -> Idempotency {
        Idempotency { part: Part::FirstHeld, ..self }
    }
}

/// The end of a request that held its key ([`Part::FirstHeld`]): a request with that key is now a replay.
#[derive(Message, Clone, Debug)]
#[rtype(result = "Result<(), EngineError>")]
pub struct ReleaseKey(pub IdempotencyKey);

/// The answer to a change.
// Moved once per request, never stored in bulk: the size difference costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
    pub note: ProviderNote,
}

/// What a command tells the store about the provider side of its transaction. The core decides nothing on it:
/// it is written in the same durable write as the change it comes with, and only when that change is written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderNote {
    /// With a command that creates a transaction: the route it takes to its provider.
    pub route: Option<ProviderRoute>,
    /// With a provider's answer: its reference for the transaction the answer is about.
    pub reference: Option<ProviderReference>,
}

/// Read a payment, as durable.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Option<Payment>, EngineError>")]
pub struct GetPayment(pub String);

/// Read a payout, as durable.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Option<Payout>, EngineError>")]
pub struct GetPayout(pub String);

/// Read a payment link by its id or merchant reference, as durable.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Option<Link>, EngineError>")]
pub struct GetLink(pub String);

/// Read every balance, as durable.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Balances, EngineError>")]
pub struct GetBalances;

/// Deletes this merchant's idempotency records made before `before` (at most `limit` index entries), which
/// only its actor may do: it knows which keys have a request in progress. Answers how many entries went.
#[derive(Message, Clone)]
#[rtype(result = "Result<usize, EngineError>")]
pub struct ForgetIdempotency {
    pub before: Timestamp,
    pub limit: usize,
}
