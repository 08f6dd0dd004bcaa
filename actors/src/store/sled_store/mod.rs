//! The sled backend: the store's roles implemented over sled trees. Where things live is [`super::layout`]'s
//! business.
//!
//! One file per role, as the roles are split (`store/roles`): this file holds the [`SledStore`] handle, the
//! reads every role shares (a key through the overlay, a range scan merged with it), the write role
//! ([`Commits`]) and the [`Audit`] role; `records` reads records, lists and the journal, `outbox` handles
//! notifications, `accounts` merchant accounts. `open` opens the database (after checking the format `stamp`)
//! and starts the writer, `write` turns a change into sled operations, `recovery` replays the journal for a
//! merchant's recovery and for the audits, and `sizes` says what each tree holds.

mod accounts;
mod backup;
mod open;
mod outbox;
mod records;
mod recovery;
mod sizes;
mod stamp;
mod write;

use std::ops::Bound;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::de::DeserializeOwned;

// The layout's trees, keys and encodings are this file's vocabulary.
use super::layout::*;
use super::op::Op;
use super::overlay::{Merged, Overlay};
use super::writer::Writer;
use super::{
    Audit, AuditReport, AuditScope, BackupReport, Change, Commits, ExpiredIdempotency, FailureLatch, Recovered,
    StoreError, Ticket,
};
use crate::domain::ids::MerchantId;
use crate::domain::records::Notification;
use crate::store::sealing::MasterKey;

pub use open::DEFAULT_CACHE_BYTES;
pub use sizes::TreeSize;
pub use stamp::STAMP_FILE;

/// Scanning a filtered list stops after this many index entries, so one request's work is bounded.
const MAX_SCAN: usize = 5_000;

pub struct SledStore {
    trees: Vec<sled::Tree>,
    /// What is acknowledged but not yet in sled; every read looks here first (see [`super::overlay`]).
    overlay: Arc<Overlay>,
    writer: Writer,
    healthy: Arc<AtomicBool>,
    feed: std::sync::Mutex<Option<tokio::sync::mpsc::Receiver<Notification>>>,
    /// Seals secret keys at rest when set ([`crate::store::sealing`]).
    master_key: Option<MasterKey>,
}

fn io(context: &str) -> impl Fn(sled::Error) -> StoreError + '_ {
    move |e| StoreError::Io(format!("{context}: {e}"))
}

/// A range scan's items: the overlay merged with sled.
type Scan = Box<dyn Iterator<Item = Result<(sled::IVec, sled::IVec), StoreError>> + Send>;

impl SledStore {
    /// Seals the merchants' secret keys under `key` from now on; keys written in clear still read.
    pub fn with_master_key(mut self, key: Option<MasterKey>) -> SledStore {
        self.master_key = key;
        self
    }

    fn get<T: DeserializeOwned>(&self, tree: usize, key: &[u8]) -> Result<Option<T>, StoreError> {
        match self.raw(tree, key)? {
            Some(bytes) => decode(TREE_NAMES[tree], &bytes).map(Some),
            None => Ok(None),
        }
    }

    /// The value of `key`: the overlay's if it has the key, else sled's.
    fn raw(&self, tree: usize, key: &[u8]) -> Result<Option<sled::IVec>, StoreError> {
        match self.overlay.get(tree, key)? {
            Some(entry) => Ok(entry.map(sled::IVec::from)),
            None => self.trees[tree].get(key).map_err(io(TREE_NAMES[tree])),
        }
    }

    /// The first merchant after `after` (in id order) with a key in `tree`, whose keys begin with the merchant's
    /// id: one seek past `after`'s keys, to walk the merchants of a tree.
    fn next_merchant(&self, tree: usize, after: Option<&MerchantId>) -> Result<Option<MerchantId>, StoreError> {
        // Past every key of `after`: its id followed by the largest byte.
        let past = after.map(|m| mkey(m, &[0xff]));
        let start = match &past {
            Some(key) => Bound::Excluded(key.as_slice()),
            None => Bound::Unbounded,
        };
        let Some(item) = self.scan(tree, start, Bound::Unbounded, false)?.next() else { return Ok(None) };
        let (key, _) = item?;
        let corrupt = |e: &dyn std::fmt::Display| StoreError::Corrupt(format!("{} key: {e}", TREE_NAMES[tree]));
        let id = key.get(..crate::domain::ids::MERCHANT_ID_LEN).ok_or_else(|| corrupt(&"too short"))?;
        MerchantId::from_bytes(id).map(Some).map_err(|e| corrupt(&e))
    }

    /// The keys of `tree` between `start` and `end`, the overlay merged with sled, in key order or, with
    /// `reverse`, from the end. The overlay's part is read first, so a layer the applier releases meanwhile is
    /// still seen (sled holds it by then, and says the same).
    fn scan(&self, tree: usize, start: Bound<&[u8]>, end: Bound<&[u8]>, reverse: bool) -> Result<Scan, StoreError> {
        let overlay = self.overlay.range(tree, start, end)?;
        let range = self.trees[tree].range::<&[u8], _>((start, end));
        let name = TREE_NAMES[tree];
        Ok(if reverse {
            Box::new(Merged::new(range.rev(), overlay, true).map(move |item| item.map_err(io(name))))
        } else {
            Box::new(Merged::new(range, overlay, false).map(move |item| item.map_err(io(name))))
        })
    }
}

impl Commits for SledStore {
    fn commit(&self, change: Change, guard: &FailureLatch) -> Result<Ticket, StoreError> {
        let (ops, notify) = Self::change_ops(&change)?;
        self.writer.submit(ops, Some(guard), notify)
    }

    fn forget_idempotency(&self, merchant: &MerchantId, expired: &[ExpiredIdempotency]) -> Result<Ticket, StoreError> {
        let mut ops = Vec::with_capacity(2 * expired.len());
        for e in expired {
            ops.push(Op::Remove(IDEMPOTENCY_TIMES, idempotency_time_key(merchant, e.made_at, e.key.as_str())));
            if e.record {
                ops.push(Op::Remove(IDEMPOTENCY, mkey(merchant, e.key.as_str().as_bytes())));
            }
        }
        self.writer.submit(ops, None, Vec::new())
    }

    fn close(&self) -> Result<(), StoreError> {
        self.writer.close()
    }

    fn recover_merchant(&self, id: &MerchantId) -> Result<Recovered, StoreError> {
        self.recover_from_snapshot(id)
    }
}

impl Audit for SledStore {
    fn audit_until(&self, scope: AuditScope, stop: &AtomicBool) -> Result<AuditReport, StoreError> {
        self.audit_journal(scope, stop)
    }

    fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Acquire)
    }

    fn backup(&self, to: &std::path::Path) -> Result<BackupReport, StoreError> {
        self.copy_to(to)
    }
}
