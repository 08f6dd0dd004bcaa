//! Persistence behind a few traits sized by role ([`roles`]: commits, records, outbox, accounts, audit), so
//! that the actors never see an engine and a second backend can be added without touching them. Each backend
//! passes the same conformance suite (`actors/tests/store_conformance.rs`).
//!
//! The unit of writing is a [`Change`]: everything one accepted command causes (journal event with its ledger
//! entries, the record after the change, the new transaction's indexes, the webhook notifications, the
//! idempotency record, and every N events a snapshot of the merchant's balances). A backend must make a change
//! atomic and durable before it completes the change's ticket; acknowledging earlier is the one bug these
//! traits exist to prevent. Reads return durable state only, though a read that spans several kinds of data
//! may find one change partly visible for a moment (the embedded store shows records before the indexes that
//! point at them, so an index never leads to nothing).
//!
//! Recovery rebuilds a merchant from its latest snapshot plus the journal after it
//! ([`Commits::recover_merchant`]); the startup audit ([`Audit::audit_since_checkpoints`]) recomputes every
//! balance from the ledger after the last audited checkpoint and refuses to start the service if anything
//! disagrees; [`Audit::audit`] does the same from the beginning of the ledger. `docs/storage.md` walks through the
//! embedded store's write path, recovery and on-disk format.
//!
//! Two engines hold the layout: fjall on one machine ([`fjall_store`], the embedded store) and PostgreSQL for a
//! cluster ([`pg_store`]). Stores made on sled by earlier releases are not opened: `caisse upgrade-store` moves
//! them onto fjall ([`fjall_store::upgrade`]), reading sled's files and the write-ahead log that made them
//! durable ([`sled_log`]).

pub mod fjall_store;
mod kv;
mod kv_store;
pub(crate) mod layout;
mod legacy;
mod op;
pub mod pg_store;
mod roles;
pub mod sealing;
mod sled_log;
mod stamp;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::core::{JournalEvent, NewTransaction, OutboxItem, Record};
use crate::domain::ids::MerchantId;
use crate::domain::ledger::Balances;
use crate::domain::links::Link;
use crate::domain::provider::{ProviderReference, ProviderRoute};
use crate::domain::records::TransactionType;
use crate::domain::text::IdempotencyKey;
use crate::domain::time::Timestamp;

pub use fjall_store::FjallStore;
pub use kv_store::{KvStore, TreeSize};
pub use pg_store::PgStore;
pub use roles::{Accounts, Audit, Commits, DueScan, Outbox, Records, Store};
pub use stamp::STAMP_FILE;

/// True when `dir` holds a store sled made, the embedded engine of earlier releases.
pub fn holds_sled_store(dir: &std::path::Path) -> bool {
    stamp::SLED_FILES.iter().any(|name| dir.join(name).exists())
}

/// True when `dir` holds a store sled made and none on fjall: one `caisse upgrade-store` moves.
pub fn holds_sled_store_only(dir: &std::path::Path) -> bool {
    holds_sled_store(dir) && !fjall_store::holds_store(dir)
}

/// Opens (or creates) the embedded store in `dir` with `cache_bytes` of cache and the secret keys sealed under
/// `master_key`. A store sled made is refused with what to do ([`FjallStore::open_with_cache`]): it is moved,
/// never opened.
pub fn open_embedded(
    dir: &std::path::Path,
    cache_bytes: u64,
    master_key: Option<sealing::MasterKey>,
) -> Result<Arc<dyn Store>, StoreError> {
    if dir.join(fjall_store::BACKUP_UNFINISHED).exists() {
        return Err(StoreError::Format(format!(
            "{} holds a copy that was not finished ({} is there: a backup or a restore cut short): it is not a \
             whole store. Take the backup again, or empty the directory and restore again",
            dir.display(),
            fjall_store::BACKUP_UNFINISHED
        )));
    }
    let (upgraded, kept) = fjall_store::upgrade::beside(dir);
    if !fjall_store::holds_store(dir) && !holds_sled_store(dir) && upgraded.exists() && kept.exists() {
        // The upgrade moved the old store aside and was stopped before the new one took its place: a fresh
        // store here would answer for merchants it does not know.
        return Err(StoreError::Format(format!(
            "{} holds no store, and an interrupted `caisse upgrade-store` left {} (the upgraded store) and {} \
             (the old one): run `caisse upgrade-store` again to finish it",
            dir.display(),
            upgraded.display(),
            kept.display()
        )));
    }
    Ok(Arc::new(FjallStore::open_with_cache(dir, cache_bytes)?.with_master_key(master_key)))
}

/// Waits for a ticket by polling it, so that it may run on an async runtime's thread (where blocking on it
/// would panic) as well as off one; past `deadline`, when given, it gives up with an I/O error.
pub(crate) fn wait_polling(mut ticket: Ticket, deadline: Option<Instant>) -> Result<(), StoreError> {
    loop {
        match ticket.try_recv() {
            Ok(result) => return result,
            Err(oneshot::error::TryRecvError::Closed) => return Err(StoreError::Closed),
            Err(oneshot::error::TryRecvError::Empty) if deadline.is_some_and(|d| Instant::now() >= d) => {
                return Err(StoreError::Io("a write was not durable in time".into()))
            }
            Err(oneshot::error::TryRecvError::Empty) => std::thread::sleep(std::time::Duration::from_millis(1)),
        }
    }
}

/// How long an idempotency record answers for its key (docs/api.md § Idempotency).
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

/// An idempotency record's entry in the index by time, past the records' 24 hours, as a merchant's actor
/// found it: the entry goes, and the record behind it too when `record` (the record was made at `made_at`
/// and is still the key's; a key used again since has a newer record, which stays).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiredIdempotency {
    pub key: IdempotencyKey,
    pub made_at: Timestamp,
    pub record: bool,
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
    /// A link the change also moves (a payment through it that succeeded).
    pub linked: Option<Link>,
    pub created: Option<NewTransaction>,
    pub outbox: Vec<OutboxItem>,
    pub idempotency: Option<(IdempotencyKey, IdempotencyRecord)>,
    pub snapshot: Option<Snapshot>,
    /// The route a created transaction takes to its provider, by transaction id.
    pub route: Option<(String, ProviderRoute)>,
    /// A provider's reference for a transaction, by transaction id.
    pub provider_reference: Option<(String, ProviderReference)>,
    /// The ownership the actor recovered under ([`Recovered::fence`]): a store several nodes share commits the
    /// change only while the merchant's shard still has this token.
    pub fence: Option<Fence>,
}

/// A node's ownership of a shard of merchants in a store several nodes share: the shard and the token it
/// was taken with. Every later taking raises the token, so a write checked against it fails once another
/// node has taken the shard, however long this node was paused or cut off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fence {
    pub shard: u32,
    pub token: i64,
}

/// Where a merchant's writes are made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// In this process: the only place with the embedded store, and a shard this node holds in a cluster.
    Here,
    /// On another node of the cluster, reachable at its advertised URL.
    Node { id: String, url: String },
    /// Nowhere just now: the merchant's shard is between two nodes (a node died or is being replaced).
    Nobody,
}

/// Set by the store when one of an actor's writes failed: the store refuses every later write carrying the
/// same guard, so an actor whose memory is ahead of the disk can never commit a change built on a lost one.
pub type FailureLatch = Arc<AtomicBool>;

/// Completes when the change is durable (Ok) or known not to be (Err).
pub type Ticket = oneshot::Receiver<Result<(), StoreError>>;

/// Keeps every other process from changing one merchant's account until dropped
/// ([`Accounts::lock_account`]). One process on an embedded store holds nothing: no other process can write
/// it, and the engine serializes its own account changes.
#[derive(Default)]
pub struct AccountLock {
    _held: Option<Box<dyn Send>>,
}

impl AccountLock {
    pub(crate) fn holding(held: impl Send + 'static) -> AccountLock {
        AccountLock { _held: Some(Box::new(held)) }
    }
}

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
    /// The e-mail (lower-cased) already belongs to another merchant: checked before the write, and again in
    /// the write itself where several processes share the store.
    #[error("a merchant with e-mail {0} already exists")]
    EmailTaken(String),
    /// The data directory was written in another on-disk format; the message says which and what to do.
    #[error("{0}")]
    Format(String),
    /// In a cluster: this node does not hold the merchant's shard (or no longer holds it with the token the
    /// write carries), so it may not write for the merchant.
    #[error("this node does not hold the merchant's shard: {0}")]
    NotOwner(String),
}

/// A merchant as recovered from storage.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Last journal position.
    pub seq: u64,
    pub balances: Balances,
    /// The ownership this state was read under, in a store several nodes share; the actor's changes carry it.
    pub fence: Option<Fence>,
}

/// What an audit found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditReport {
    pub merchants: u64,
    /// Journal events replayed.
    pub events: u64,
    pub elapsed_ms: u64,
    /// Merchants whose replay started from an audit checkpoint rather than from their first event.
    pub from_checkpoint: u64,
    /// Why the checkpoints could not be moved forward after the audit passed (a full disk, a writer held by a
    /// backup): the next audit starts from the old ones. `None` when they were written.
    pub checkpoint_error: Option<String>,
}

/// Which audit: from each merchant's first event, or from its audit checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AuditScope {
    Full,
    SinceCheckpoints,
}

impl AuditScope {
    pub const ALL: [AuditScope; 2] = [AuditScope::Full, AuditScope::SinceCheckpoints];

    /// The name logs and metrics give it.
    pub fn as_str(self) -> &'static str {
        match self {
            AuditScope::Full => "full",
            AuditScope::SinceCheckpoints => "since_checkpoints",
        }
    }
}

/// What a backup copied, and how long writes waited for it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackupReport {
    /// Keys copied, every tree together.
    pub keys: u64,
    /// How long the writer was paused while the copy was read.
    pub paused_ms: u64,
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
pub struct AwaitingProvider {
    pub merchant: MerchantId,
    pub kind: TransactionType,
    pub owner: String,
    pub created_at: Timestamp,
}

/// A page of a list, newest first (docs/api.md § Lists).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T> {
    pub data: Vec<T>,
    pub has_more: bool,
    pub next_cursor: Option<String>,
}
