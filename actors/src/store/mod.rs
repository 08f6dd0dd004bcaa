//! Persistence behind one narrow trait, [`Store`], so that the actors never see sled and a second backend
//! (PostgreSQL, later) can be added without touching them.
//!
//! The unit of writing is a [`Change`]: everything one accepted command causes (journal event with its ledger
//! entries, the record after the change, the new transaction's indexes, the webhook notifications, the
//! idempotency record, and every N events a snapshot of the merchant's balances). A backend must make a change
//! atomic and durable before it completes the change's ticket; acknowledging earlier is the one bug this trait
//! exists to prevent. Reads return durable state only, though a read that spans several kinds of data may find
//! one change partly visible for a moment (the sled backend shows records before the indexes that point at
//! them, so an index never leads to nothing).
//!
//! Recovery rebuilds a merchant from its latest snapshot plus the journal after it ([`Store::recover_merchant`]);
//! the startup audit ([`Store::audit`]) recomputes every balance from the whole ledger and refuses to start the
//! service if anything disagrees.

mod layout;
mod overlay;
pub mod sled_store;
mod wal;
mod writer;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::core::{JournalEvent, NewTransaction, OutboxItem, Record};
use crate::domain::ids::MerchantId;
use crate::domain::ledger::Balances;
use crate::domain::records::{Merchant, Notification, Payment, Payout, TransactionType};
use crate::domain::text::IdempotencyKey;
use crate::domain::time::Timestamp;

pub use sled_store::SledStore;

/// How long an idempotency record answers for its key (contract 4).
pub const IDEMPOTENCY_TTL_MS: u64 = 24 * 60 * 60 * 1000;

/// The answer stored with an idempotency key: the first answer, replayed as it was.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdempotencyRecord {
    /// SHA-256 of what identifies the request (method, path, body), hex.
    pub fingerprint: String,
    pub status: u16,
    pub body: String,
    pub created_at: Timestamp,
}

impl IdempotencyRecord {
    pub fn is_live(&self, now: Timestamp) -> bool {
        now.unix_ms().saturating_sub(self.created_at.unix_ms()) < IDEMPOTENCY_TTL_MS
    }
}

/// A merchant's balances as of journal position `seq`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub seq: u64,
    pub balances: Balances,
}

/// One accepted change of one merchant, written all or nothing.
#[derive(Debug, Clone)]
pub struct Change {
    pub merchant: MerchantId,
    pub journal: JournalEvent,
    pub record: Record,
    pub created: Option<NewTransaction>,
    pub outbox: Vec<OutboxItem>,
    pub idempotency: Option<(IdempotencyKey, IdempotencyRecord)>,
    pub snapshot: Option<Snapshot>,
}

/// Set by the store when one of an actor's writes failed: the store refuses every later write carrying the
/// same guard, so an actor whose memory is ahead of the disk can never commit a change built on a lost one.
pub type WriteGuard = Arc<AtomicBool>;

/// Completes when the change is durable (Ok) or known not to be (Err).
pub type Ticket = oneshot::Receiver<Result<(), StoreError>>;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("storage I/O failed: {0}")]
    Io(String),
    #[error("the write queue is full")]
    Overloaded,
    #[error("an earlier write of this merchant failed; the merchant reloads from storage")]
    Aborted,
    #[error("the store is closed")]
    Closed,
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    #[error("the store is locked by another process (is `caisse serve` running?): {0}")]
    Locked(String),
    #[error("{0}")]
    Conflict(String),
}

/// A merchant as recovered from storage.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Last journal position.
    pub seq: u64,
    pub balances: Balances,
}

/// What the startup audit found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditReport {
    pub merchants: u64,
    pub events: u64,
    pub elapsed_ms: u64,
}

/// A transaction found by one of its references, and the record that holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    pub kind: TransactionType,
    pub reference: String,
    pub record: Record,
}

/// Something that still waits for a provider's answer: a payment `initie`/`en_cours`, a refund `en_cours` or a
/// payout `en_attente`. `owner` is the payment reference or the payout id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub merchant: MerchantId,
    pub kind: TransactionType,
    pub owner: String,
    pub created_at: Timestamp,
}

/// A page of a list, newest first (contract 5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T> {
    pub data: Vec<T>,
    pub has_more: bool,
    pub next_cursor: Option<String>,
}

/// The storage operations the engine and the API need, and nothing else.
pub trait Store: Send + Sync + 'static {
    /// Queues a change for the next group commit. Fails at once, changing nothing, when the queue is full or
    /// `guard` was set by an earlier failure.
    fn commit(&self, change: Change, guard: &WriteGuard) -> Result<Ticket, StoreError>;

    /// Creates or updates a merchant account, durably (the caller waits for the ticket).
    fn put_merchant(&self, merchant: Merchant, previous_key: Option<String>) -> Result<Ticket, StoreError>;

    /// Persists a notification after an attempt or a resend (`before` is what the caller read), moving its
    /// entry in the due index.
    fn save_notification(&self, before: &Notification, after: &Notification) -> Result<Ticket, StoreError>;
    /// This merchant's notifications, newest first, from after `cursor` (a notification id).
    fn notifications(
        &self,
        merchant: &MerchantId,
        cursor: Option<&str>,
        limit: usize,
        keep: &mut dyn FnMut(&Notification) -> bool,
    ) -> Result<Page<Notification>, StoreError>;
    /// Notifications as they become durable, for the webhook dispatcher; the first caller takes it.
    fn outbox_feed(&self) -> Option<tokio::sync::mpsc::Receiver<Notification>>;

    fn merchant(&self, id: &MerchantId) -> Result<Option<Merchant>, StoreError>;
    /// A number that changes after any merchant record changes, once the change is visible to reads: a
    /// cache of merchants read after seeing a number is current as long as the number stays the same.
    fn merchants_generation(&self) -> u64;
    fn merchant_by_key(&self, secret_key: &str) -> Result<Option<Merchant>, StoreError>;
    fn merchant_by_email(&self, email: &str) -> Result<Option<Merchant>, StoreError>;
    fn merchant_count(&self) -> Result<u64, StoreError>;

    fn recover_merchant(&self, id: &MerchantId) -> Result<Recovered, StoreError>;
    fn payment(&self, merchant: &MerchantId, reference: &str) -> Result<Option<Payment>, StoreError>;
    fn payout(&self, merchant: &MerchantId, id: &str) -> Result<Option<Payout>, StoreError>;
    /// A payment reference, refund reference or payout id of this merchant.
    fn locate(&self, merchant: &MerchantId, reference: &str) -> Result<Option<Located>, StoreError>;
    /// The merchant and reference behind a transaction id, for provider notices that carry only our id.
    fn owner_of_transaction(&self, transaction_id: &str) -> Result<Option<(MerchantId, Located)>, StoreError>;
    fn idempotency(&self, merchant: &MerchantId, key: &IdempotencyKey)
        -> Result<Option<IdempotencyRecord>, StoreError>;
    /// This merchant's transactions, newest first, from after `cursor` (a transaction id), at most `limit`.
    fn transactions(
        &self,
        merchant: &MerchantId,
        cursor: Option<&str>,
        limit: usize,
        keep: &mut dyn FnMut(&crate::domain::records::Transaction) -> bool,
    ) -> Result<Page<crate::domain::records::Transaction>, StoreError>;
    /// This merchant's payouts, newest first, from after `cursor` (a payout id).
    fn payouts(
        &self,
        merchant: &MerchantId,
        cursor: Option<&str>,
        limit: usize,
        keep: &mut dyn FnMut(&Payout) -> bool,
    ) -> Result<Page<Payout>, StoreError>;
    /// What of `kind` still waits for a provider and was created before `created_before`, oldest first,
    /// starting after `after` (an item an earlier call returned) when given, so a caller can walk the whole
    /// list a page at a time.
    fn pending(
        &self,
        kind: TransactionType,
        created_before: Timestamp,
        after: Option<&Pending>,
        limit: usize,
    ) -> Result<Vec<Pending>, StoreError>;
    /// This merchant's journal, in order, for a payment's history and for audits.
    fn journal(&self, merchant: &MerchantId, from_seq: u64, limit: usize) -> Result<Vec<JournalEvent>, StoreError>;
    /// A notification of this merchant (`None` for another merchant's id).
    fn notification(&self, merchant: &MerchantId, id: &str) -> Result<Option<Notification>, StoreError>;
    /// The notification, its body possibly left empty: its delivery state, which is all a delivery needs to
    /// read again, since a body never changes after the change that made it.
    fn notification_state(&self, merchant: &MerchantId, id: &str) -> Result<Option<Notification>, StoreError> {
        self.notification(merchant, id)
    }
    /// Notifications whose next attempt is due at or before `now`, oldest first, passing over the ids
    /// `skip` says yes to (those already being delivered) without counting them against `limit`.
    fn due_notifications_skipping(
        &self,
        now: Timestamp,
        limit: usize,
        skip: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Vec<Notification>, StoreError>;
    /// Notifications whose next attempt is due at or before `now`, oldest first.
    fn due_notifications(&self, now: Timestamp, limit: usize) -> Result<Vec<Notification>, StoreError> {
        self.due_notifications_skipping(now, limit, &mut |_| false)
    }

    /// Recomputes every balance from the ledger and checks every invariant; an error names what disagrees.
    fn audit(&self) -> Result<AuditReport, StoreError>;
    /// True when a durable write currently succeeds.
    fn healthy(&self) -> bool;
}
