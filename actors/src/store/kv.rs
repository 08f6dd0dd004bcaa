//! What a key-value engine gives the store: the trees of [`super::layout`], read by key and by range, and
//! written by batches of absolute operations that become durable together. The roles are implemented once,
//! over this ([`super::kv_store::KvStore`]), and each engine implements it: fjall on one machine
//! ([`super::fjall_store`]), PostgreSQL for a cluster ([`super::pg_store`]). One layout and one
//! implementation of the roles means both engines store, index and audit the same way, which the conformance
//! suite checks.
//!
//! The trait is public only so that the store types built on it can be; nothing outside the crate can reach
//! it, so an engine is added here or not at all.

use std::ops::Bound;
use std::path::Path;

use super::op::Op;
use super::{AccountLock, BackupReport, FailureLatch, Fence, Placement, StoreError, Ticket};
use crate::domain::ids::MerchantId;
use crate::domain::records::Notification;

/// A range scan's items, in the order asked for.
pub type Scan = Box<dyn Iterator<Item = Result<(sled::IVec, sled::IVec), StoreError>> + Send>;

/// A key-value engine behind the store.
pub trait Kv: Send + Sync + 'static {
    /// The value of `key` in tree number `tree`, as durably written.
    fn raw(&self, tree: usize, key: &[u8]) -> Result<Option<sled::IVec>, StoreError>;
    /// The keys of `tree` between `start` and `end`, in key order or, with `reverse`, from the end.
    fn scan(&self, tree: usize, start: Bound<&[u8]>, end: Bound<&[u8]>, reverse: bool) -> Result<Scan, StoreError>;
    /// Queues operations to be applied all or nothing with the next group commit. Fails at once when the queue
    /// is full or `guard` is set; a failed write sets `guard`. Once durable, `notify` goes to the feed. A
    /// `fence` is checked in the same commit by an engine several nodes share (the others have no use for it).
    fn submit(
        &self,
        ops: Vec<Op>,
        guard: Option<&FailureLatch>,
        notify: Vec<Notification>,
        fence: Option<Fence>,
    ) -> Result<Ticket, StoreError>;
    /// Called before a merchant's state is read for its actor: the ownership the actor will write under, or
    /// [`StoreError::NotOwner`] when this process may not write for the merchant. One process: always itself.
    fn claim(&self, _merchant: &MerchantId) -> Result<Option<Fence>, StoreError> {
        Ok(None)
    }
    /// See [`super::Accounts::lock_account`]. One process: nothing to hold.
    fn lock_account(&self, _merchant: &MerchantId) -> Result<AccountLock, StoreError> {
        Ok(AccountLock::default())
    }
    /// Where the merchant's writes are made. One process: here.
    fn placement(&self, _merchant: &MerchantId) -> Placement {
        Placement::Here
    }
    /// See [`super::Commits::fence_of`].
    fn fence_of(&self, _merchant: &MerchantId) -> Option<Fence> {
        None
    }
    /// See [`super::Commits::takeovers`].
    fn takeovers(&self) -> u64 {
        0
    }
    /// A number that changes after any write to `tree` becomes visible.
    fn generation(&self, tree: usize) -> u64;
    /// How many keys `tree` holds.
    fn count(&self, tree: usize) -> Result<u64, StoreError>;
    /// Everything durable in the engine's own files, later writes refused.
    fn close(&self) -> Result<(), StoreError>;
    /// True when a durable write currently succeeds.
    fn healthy(&self) -> bool;
    /// A consistent copy of every tree into `to` (see [`super::Audit::backup`]).
    fn backup(&self, to: &Path) -> Result<BackupReport, StoreError>;
    /// Every merchant with a key in `tree` (whose keys begin with a merchant's id), in id order.
    fn merchants(&self, tree: usize) -> Result<Vec<MerchantId>, StoreError>;
    /// The first key of `tree` from `from` on (every key when `None`), for walks that seek from key to key.
    fn first_from(&self, tree: usize, from: Option<&[u8]>) -> Result<Option<sled::IVec>, StoreError> {
        let start = match from {
            Some(key) => Bound::Included(key),
            None => Bound::Unbounded,
        };
        match self.scan(tree, start, Bound::Unbounded, false)?.next() {
            Some(item) => Ok(Some(item?.0)),
            None => Ok(None),
        }
    }
}
