//! The store's roles: one trait per kind of caller, each in its own file, so a reader sees which part of
//! the storage a caller depends on and a backend implements each role under its own names.
//!
//! - [`Commits`]: the merchant actors' writes (one [`Change`](super::Change) all or nothing) and a merchant's
//!   recovery from its snapshot and journal.
//! - [`Records`]: payments, payouts, references, idempotency records, paged lists and the journal.
//! - [`Outbox`]: webhook notifications: the feed of new ones, the due index, delivery state, lists.
//! - [`Accounts`]: merchant accounts and their lookups by secret key and e-mail.
//! - [`Audit`]: the ledger audit and the health of the write path.
//!
//! [`Store`] is all of them at once: what the engine opens and hands out, one role at a time.

mod accounts;
mod audit;
mod commits;
mod outbox;
mod records;

pub use accounts::Accounts;
pub use audit::Audit;
pub use commits::Commits;
pub use outbox::{DueScan, Outbox};
pub use records::Records;

/// A complete backend: every role. Implemented for anything that implements them all.
pub trait Store: Commits + Records + Outbox + Accounts + Audit + Send + Sync + 'static {}

impl<T: Commits + Records + Outbox + Accounts + Audit + Send + Sync + 'static> Store for T {}
