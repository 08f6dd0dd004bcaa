//! The store's roles implemented once over a key-value engine ([`Kv`]): the layout of [`super::layout`]
//! written and read the same way whichever engine holds it.
//!
//! One file per role, as the roles are split (`store/roles`): this file holds the [`KvStore`] handle, the
//! reads every role shares (a key, a range scan, the merchants of a tree), the write role ([`Commits`]) and
//! the [`Audit`] role; `records` reads records, lists and the journal, `outbox` handles notifications,
//! `accounts` merchant accounts, `sizes` what each tree holds. `write` turns a change into operations, and
//! `recovery` replays the journal for a merchant's recovery and for the audits.

mod accounts;
mod outbox;
mod records;
mod recovery;
mod sizes;
mod write;

pub use sizes::TreeSize;

use std::ops::Bound;
use std::sync::atomic::AtomicBool;

use serde::de::DeserializeOwned;

// The layout's trees, keys and encodings are this file's vocabulary.
use super::kv::{Kv, Scan};
use super::layout::*;
use super::{
    Audit, AuditReport, AuditScope, BackupReport, Change, Commits, ExpiredIdempotency, FailureLatch, Fence,
    IdempotencyRecord, Placement, Recovered, StoreError, Ticket,
};
use crate::domain::ids::MerchantId;
use crate::domain::records::Notification;
use crate::domain::text::IdempotencyKey;
use crate::store::op::Op;
use crate::store::sealing::MasterKey;

/// Scanning a filtered list stops after this many index entries, so one request's work is bounded.
const MAX_SCAN: usize = 5_000;

/// The store: the roles over the engine `K`.
pub struct KvStore<K> {
    pub(super) kv: K,
    feed: std::sync::Mutex<Option<tokio::sync::mpsc::Receiver<Notification>>>,
    /// Seals secret keys at rest when set ([`crate::store::sealing`]).
    master_key: Option<MasterKey>,
}

impl<K: Kv> KvStore<K> {
    /// The store over `kv`, whose durable notifications arrive on `feed`.
    pub(super) fn new(kv: K, feed: tokio::sync::mpsc::Receiver<Notification>) -> KvStore<K> {
        KvStore { kv, feed: std::sync::Mutex::new(Some(feed)), master_key: None }
    }

    /// Seals the merchants' secret keys under `key` from now on; keys written in clear still read.
    pub fn with_master_key(mut self, key: Option<MasterKey>) -> KvStore<K> {
        self.master_key = key;
        self
    }

    fn get<T: DeserializeOwned>(&self, tree: usize, key: &[u8]) -> Result<Option<T>, StoreError> {
        match self.raw(tree, key)? {
            Some(bytes) => decode(TREE_NAMES[tree], &bytes).map(Some),
            None => Ok(None),
        }
    }

    fn raw(&self, tree: usize, key: &[u8]) -> Result<Option<sled::IVec>, StoreError> {
        self.kv.raw(tree, key)
    }

    /// Queues a write that is not a merchant actor's change (those carry their fence: [`Commits::commit`]).
    fn submit(
        &self,
        ops: Vec<Op>,
        guard: Option<&FailureLatch>,
        notify: Vec<Notification>,
    ) -> Result<Ticket, StoreError> {
        self.kv.submit(ops, guard, notify, None)
    }

    /// The first merchant after `after` (in id order) with a key in `tree`, whose keys begin with the merchant's
    /// id: one seek past `after`'s keys, to walk the merchants of a tree.
    fn next_merchant(&self, tree: usize, after: Option<&MerchantId>) -> Result<Option<MerchantId>, StoreError> {
        let past = after.map(past_merchant);
        let Some(key) = self.kv.first_from(tree, past.as_deref())? else { return Ok(None) };
        let corrupt = |e: &dyn std::fmt::Display| StoreError::Corrupt(format!("{} key: {e}", TREE_NAMES[tree]));
        let id = key.get(..crate::domain::ids::MERCHANT_ID_LEN).ok_or_else(|| corrupt(&"too short"))?;
        MerchantId::from_bytes(id).map(Some).map_err(|e| corrupt(&e))
    }

    /// The keys of `tree` between `start` and `end`, in key order or, with `reverse`, from the end.
    fn scan(&self, tree: usize, start: Bound<&[u8]>, end: Bound<&[u8]>, reverse: bool) -> Result<Scan, StoreError> {
        self.kv.scan(tree, start, end, reverse)
    }
}

impl<K: Kv> Commits for KvStore<K> {
    fn commit(&self, change: Change, guard: &FailureLatch) -> Result<Ticket, StoreError> {
        let (ops, notify) = Self::change_ops(&change)?;
        self.kv.submit(ops, Some(guard), notify, change.fence)
    }

    fn rewrite_answer(
        &self,
        merchant: &MerchantId,
        key: &IdempotencyKey,
        answer: &IdempotencyRecord,
        guard: &FailureLatch,
        fence: Option<Fence>,
    ) -> Result<Ticket, StoreError> {
        // The entry's time index stays: the answer keeps the time it was first made at.
        let ops = vec![Op::Insert(IDEMPOTENCY, mkey(merchant, key.as_str().as_bytes()), encode(answer)?)];
        self.kv.submit(ops, Some(guard), Vec::new(), fence)
    }

    fn forget_idempotency(
        &self,
        merchant: &MerchantId,
        expired: &[ExpiredIdempotency],
        fence: Option<Fence>,
    ) -> Result<Ticket, StoreError> {
        let mut ops = Vec::with_capacity(2 * expired.len());
        for e in expired {
            ops.push(Op::Remove(IDEMPOTENCY_TIMES, idempotency_time_key(merchant, e.made_at, e.key.as_str())));
            if e.record {
                ops.push(Op::Remove(IDEMPOTENCY, mkey(merchant, e.key.as_str().as_bytes())));
            }
        }
        self.kv.submit(ops, None, Vec::new(), fence)
    }

    fn close(&self) -> Result<(), StoreError> {
        self.kv.close()
    }

    fn recover_merchant(&self, id: &MerchantId) -> Result<Recovered, StoreError> {
        // The claim comes first: what is read after it is everything the previous owner committed.
        let fence = self.kv.claim(id)?;
        Ok(Recovered { fence, ..self.recover_from_snapshot(id)? })
    }

    fn placement(&self, merchant: &MerchantId) -> Placement {
        self.kv.placement(merchant)
    }

    fn takeovers(&self) -> u64 {
        self.kv.takeovers()
    }

    fn fence_of(&self, merchant: &MerchantId) -> Option<Fence> {
        self.kv.fence_of(merchant)
    }
}

impl<K: Kv> Audit for KvStore<K> {
    fn audit_until(&self, scope: AuditScope, stop: &AtomicBool) -> Result<AuditReport, StoreError> {
        self.audit_journal(scope, stop)
    }

    fn healthy(&self) -> bool {
        self.kv.healthy()
    }

    fn backup(&self, to: &std::path::Path) -> Result<BackupReport, StoreError> {
        self.kv.backup(to)
    }
}
