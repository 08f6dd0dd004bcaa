//! The engine's one error type, [`EngineError`]: what a caller of the engine can be told went wrong.
//!
//! Domain refusals ([`Rejection`]) pass through unchanged so the HTTP layer can map each to the API's
//! code. Storage trouble becomes `Unavailable` (the API's 503: retry later, nothing was changed or the outcome
//! is unknown and an idempotent retry settles it), except corruption, which is internal.

use crate::core::Rejection;
use crate::store::StoreError;

// Serde: an error crosses between the nodes of a cluster with the command it answers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum EngineError {
    #[error(transparent)]
    Rejected(#[from] Rejection),
    #[error("this idempotency key was already used with a different request")]
    IdempotencyKeyReused,
    #[error("a request with this idempotency key is still in progress")]
    IdempotencyKeyInUse,
    #[error("service unavailable: {0}")]
    Unavailable(String),
    /// The actor retired (idle or after a failure) between lookup and delivery; the engine retries.
    #[error("merchant actor retired")]
    Retired,
    #[error("internal error: {0}")]
    Internal(String),
    /// The store cannot be opened by this build (another on-disk format); only at start.
    #[error("{0}")]
    IncompatibleStore(String),
    /// Another merchant has this e-mail.
    #[error("a merchant with e-mail {0} already exists")]
    EmailTaken(String),
    /// A change forwarded to the node holding its merchant got no answer in time: it reached that node, which
    /// may still make it, so the caller cannot be told that nothing changed. Made by the forwarding node only,
    /// never sent between nodes. It must stay the last variant: the encoding between nodes numbers variants
    /// by place, and a skipped variant before others would shift how they are read.
    #[serde(skip)]
    #[error("no answer in time: {0}")]
    OutcomeUnknown(String),
}

impl From<StoreError> for EngineError {
    fn from(err: StoreError) -> EngineError {
        match err {
            StoreError::Corrupt(_) | StoreError::Conflict(_) => EngineError::Internal(err.to_string()),
            StoreError::Format(text) => EngineError::IncompatibleStore(text),
            StoreError::EmailTaken(email) => EngineError::EmailTaken(email),
            StoreError::Io(_)
            | StoreError::Overloaded
            | StoreError::Aborted
            | StoreError::Closed
            | StoreError::NotOwner(_)
            | StoreError::Locked(_) => EngineError::Unavailable(err.to_string()),
        }
    }
}
