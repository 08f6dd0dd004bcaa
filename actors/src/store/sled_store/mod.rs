//! The sled engine ([`SledKv`]): the store's trees in one sled database, made durable by the group-commit
//! writer's write-ahead log before sled holds them (see [`super::writer`]), and read through the overlay of
//! what is acknowledged but not yet applied. The embedded default: one process, one data directory.
//!
//! `open` opens the database (after checking the format `stamp`) and starts the writer, `backup` copies a
//! running store, and `sizes` says what each tree holds.

mod backup;
mod open;
mod sizes;
mod stamp;

use std::collections::BTreeSet;
use std::ops::Bound;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::kv::{Kv, Scan};
use super::kv_store::KvStore;
use super::layout::{merchant_of, past_merchant, TREE_NAMES};
use super::op::Op;
use super::overlay::{Merged, Overlay};
use super::writer::Writer;
use super::{BackupReport, FailureLatch, Fence, StoreError, Ticket};
use crate::domain::ids::MerchantId;
use crate::domain::records::Notification;

pub(super) use backup::sync_tree;
pub(super) use open::open_when_unlocked;
pub use open::DEFAULT_CACHE_BYTES;
pub use sizes::TreeSize;
pub(super) use stamp::check_or_stamp;
pub use stamp::STAMP_FILE;

/// True when `dir` holds a store of this engine.
pub(super) fn holds_store(dir: &Path) -> bool {
    stamp::SLED_FILES.iter().any(|name| dir.join(name).exists())
}

/// The embedded store: the roles over sled.
pub type SledStore = KvStore<SledKv>;

pub struct SledKv {
    pub(in crate::store) trees: Vec<sled::Tree>,
    /// What is acknowledged but not yet in sled; every read looks here first (see [`super::overlay`]).
    pub(in crate::store) overlay: Arc<Overlay>,
    pub(in crate::store) writer: Writer,
    healthy: Arc<AtomicBool>,
}

fn io(context: &str) -> impl Fn(sled::Error) -> StoreError + '_ {
    move |e| StoreError::Io(format!("{context}: {e}"))
}

impl Kv for SledKv {
    /// The overlay's value if it has the key, else sled's.
    fn raw(&self, tree: usize, key: &[u8]) -> Result<Option<sled::IVec>, StoreError> {
        match self.overlay.get(tree, key)? {
            Some(entry) => Ok(entry.map(sled::IVec::from)),
            None => self.trees[tree].get(key).map_err(io(TREE_NAMES[tree])),
        }
    }

    /// The overlay merged with sled. The overlay's part is read first, so a layer the applier releases
    /// meanwhile is still seen (sled holds it by then, and says the same).
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

    fn submit(
        &self,
        ops: Vec<Op>,
        guard: Option<&FailureLatch>,
        notify: Vec<Notification>,
        _fence: Option<Fence>,
    ) -> Result<Ticket, StoreError> {
        // One process holds the directory's lock: nothing to fence against.
        self.writer.submit(ops, guard, notify)
    }

    fn generation(&self, tree: usize) -> u64 {
        self.writer.generation(tree)
    }

    /// sled's count, corrected by what the overlay adds or removes. While the applier is inserting a new key,
    /// the count may miss it for that moment (sled's length was read before the insert, the key is found after
    /// it). The service counts merchants only at start, to decide on the demo merchant.
    fn count(&self, tree: usize) -> Result<u64, StoreError> {
        let stored = &self.trees[tree];
        let mut count = stored.len() as u64;
        for (key, entry) in self.overlay.range(tree, Bound::Unbounded, Bound::Unbounded)? {
            match (entry.is_some(), stored.contains_key(&key).map_err(io(TREE_NAMES[tree]))?) {
                (true, false) => count += 1,
                (false, true) => count = count.saturating_sub(1),
                _ => {}
            }
        }
        Ok(count)
    }

    /// One seek in sled per merchant, past the previous one's keys, and the merchants of the keys still in the
    /// overlay, read once.
    fn merchants(&self, tree: usize) -> Result<Vec<MerchantId>, StoreError> {
        let mut merchants = BTreeSet::new();
        for (key, _) in self.overlay.range(tree, Bound::Unbounded, Bound::Unbounded)? {
            merchants.insert(merchant_of(&key)?);
        }
        let stored = &self.trees[tree];
        let mut after: Option<Vec<u8>> = None;
        loop {
            let next = match &after {
                Some(past) => stored.range::<&[u8], _>(past.as_slice()..).next(),
                None => stored.iter().next(),
            };
            let Some(item) = next else { break };
            let (key, _) = item.map_err(io(TREE_NAMES[tree]))?;
            let id = merchant_of(&key)?;
            after = Some(past_merchant(&id));
            merchants.insert(id);
        }
        Ok(merchants.into_iter().collect())
    }

    fn close(&self) -> Result<(), StoreError> {
        self.writer.close()
    }

    fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Acquire)
    }

    fn backup(&self, to: &Path) -> Result<BackupReport, StoreError> {
        self.copy_to(to)
    }
}
