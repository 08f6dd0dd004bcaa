//! The fjall engine ([`FjallKv`]): the store's trees as partitions of one fjall keyspace, an LSM tree with a
//! journal of its own. A group commit is one fjall batch whose journal record is synced before any reader
//! sees it ([`writer`]); a start recovers at most fjall's bounded journal, whatever the history, and the
//! tables are compressed.
//!
//! `open` takes the directory's lock (fjall has none), checks the format stamp and opens the keyspace;
//! `backup` copies a consistent moment of a running store without pausing writes.

mod writer;

use std::collections::BTreeSet;
use std::fs::File;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use fjall::{Keyspace, PartitionCreateOptions, PartitionHandle, PersistMode};

use self::writer::Writer;
use super::kv::{Kv, Scan};
use super::kv_store::KvStore;
use super::layout::{merchant_of, past_merchant, TREE_NAMES};
use super::op::Op;
use super::{BackupReport, FailureLatch, Fence, StoreError, Ticket};
use crate::domain::ids::MerchantId;
use crate::domain::records::Notification;

/// The embedded store: the roles over fjall.
pub type FjallStore = KvStore<FjallKv>;

/// The keyspace's directory inside the data directory.
const KEYSPACE_DIR: &str = "keyspace";
/// The lock file at the root of the data directory, held (`flock`) while a process has the store open.
const LOCK_FILE: &str = "LOCK";
/// How long an open waits for a lock that is being released (a process that closes and reopens the same
/// directory, as a test or a supervised restart does, may see its own old lock for a moment).
const LOCK_GRACE: std::time::Duration = std::time::Duration::from_secs(2);
/// Notifications waiting for the dispatcher beyond this are found by its scan of the due index instead.
const FEED_CAPACITY: usize = 64 * 1024;
/// The journal fjall keeps before it writes memtables out: what a start after a crash recovers at most.
const MAX_JOURNAL_BYTES: u64 = 64 * 1024 * 1024;
/// The memtables of every tree together, before the largest is written out.
const MAX_WRITE_BUFFER_BYTES: u64 = 32 * 1024 * 1024;
/// Keys a scan reads from fjall at a time, first, and at most (each read doubles until the maximum).
const FIRST_CHUNK: usize = 32;
const MAX_CHUNK: usize = 1024;

/// fjall's block cache unless the operator sets `store_cache_mib`.
pub const DEFAULT_CACHE_BYTES: u64 = 16 * 1024 * 1024;

pub struct FjallKv {
    // Dropped in this order: the writer (which flushes and joins its thread), the partitions and keyspace,
    // and the directory's lock last, once nothing of fjall's is open.
    writer: Writer,
    partitions: Vec<PartitionHandle>,
    keyspace: Keyspace,
    healthy: Arc<AtomicBool>,
    _lock: File,
}

fn io(context: &'static str) -> impl Fn(fjall::Error) -> StoreError {
    move |e| StoreError::Io(format!("{context}: {e}"))
}

/// Takes the directory's lock, waiting out one being released.
fn lock(dir: &Path) -> Result<File, StoreError> {
    use std::os::fd::AsRawFd;
    let path = dir.join(LOCK_FILE);
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| StoreError::Io(format!("open {}: {e}", path.display())))?;
    let started = Instant::now();
    loop {
        // SAFETY: `flock` on a descriptor this function owns; it touches no memory.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(file);
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::WouldBlock {
            return Err(StoreError::Io(format!("lock {}: {err}", path.display())));
        }
        if started.elapsed() >= LOCK_GRACE {
            return Err(StoreError::Locked(format!("{}: held by another process", path.display())));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

impl FjallStore {
    /// Opens (or creates) the store under `dir` with the default cache and starts its writer. Does not
    /// audit: call [`Audit::audit`](crate::store::Audit::audit).
    pub fn open(dir: &Path) -> Result<FjallStore, StoreError> {
        FjallStore::open_with_cache(dir, DEFAULT_CACHE_BYTES)
    }

    /// [`FjallStore::open`] with fjall's block cache set to `cache_bytes`.
    pub fn open_with_cache(dir: &Path, cache_bytes: u64) -> Result<FjallStore, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| StoreError::Io(format!("create {}: {e}", dir.display())))?;
        // The directory holds the merchants' keys and the ledger: its owner only.
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| StoreError::Io(format!("chmod 0700 {}: {e}", dir.display())))?;
        }
        let lock = lock(dir)?;
        crate::store::sled_store::check_or_stamp(dir)?;
        let started = Instant::now();
        if !holds_store(dir) {
            create(dir, cache_bytes)?;
        }
        let (keyspace, partitions) = open_keyspace(&keyspace_dir(dir), cache_bytes)?;
        // Trees a newer build added since the keyspace was made were just created: reachable after a power cut.
        keyspace.persist(PersistMode::SyncAll).map_err(io("sync the keyspace"))?;
        tracing::info!(elapsed_ms = started.elapsed().as_millis() as u64, "opened the keyspace");
        let healthy = Arc::new(AtomicBool::new(true));
        let (feed_tx, feed_rx) = tokio::sync::mpsc::channel(FEED_CAPACITY);
        let writer = Writer::spawn(keyspace.clone(), partitions.clone(), healthy.clone(), feed_tx)?;
        Ok(KvStore::new(FjallKv { writer, partitions, keyspace, healthy, _lock: lock }, feed_rx))
    }
}

/// True when `dir` holds a store of this engine.
pub(super) fn holds_store(dir: &Path) -> bool {
    keyspace_dir(dir).is_dir()
}

fn open_keyspace(path: &Path, cache_bytes: u64) -> Result<(Keyspace, Vec<PartitionHandle>), StoreError> {
    let keyspace = fjall::Config::new(path)
        .cache_size(cache_bytes)
        .max_journaling_size(MAX_JOURNAL_BYTES)
        .max_write_buffer_size(MAX_WRITE_BUFFER_BYTES)
        .open()
        .map_err(io("open the keyspace"))?;
    let partitions = TREE_NAMES
        .iter()
        .map(|name| keyspace.open_partition(name, PartitionCreateOptions::default()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(io("open the trees"))?;
    Ok((keyspace, partitions))
}

/// Makes an empty keyspace with every tree beside the data directory's, then renames it into place: a
/// process killed while fjall lays out its files (a keyspace is several directories and marker files) leaves
/// a half-made directory under another name, which the next attempt removes, never a keyspace that does not
/// open.
fn create(dir: &Path, cache_bytes: u64) -> Result<(), StoreError> {
    let fresh = dir.join(format!("{KEYSPACE_DIR}.new"));
    let fs_error = |what: &str, e: std::io::Error| StoreError::Io(format!("{what} {}: {e}", fresh.display()));
    if fresh.exists() {
        std::fs::remove_dir_all(&fresh).map_err(|e| fs_error("remove", e))?;
    }
    {
        let (keyspace, partitions) = open_keyspace(&fresh, cache_bytes)?;
        keyspace.persist(PersistMode::SyncAll).map_err(io("sync the new keyspace"))?;
        // The partitions first: each holds the keyspace, whose last handle stops fjall's threads.
        drop(partitions);
        drop(keyspace);
    }
    std::fs::rename(&fresh, keyspace_dir(dir)).map_err(|e| fs_error("rename", e))?;
    sync_dir(dir)
}

fn keyspace_dir(dir: &Path) -> PathBuf {
    dir.join(KEYSPACE_DIR)
}

fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| StoreError::Io(format!("sync {}: {e}", dir.display())))
}

fn owned(bound: Bound<&[u8]>) -> Bound<Vec<u8>> {
    match bound {
        Bound::Included(key) => Bound::Included(key.to_vec()),
        Bound::Excluded(key) => Bound::Excluded(key.to_vec()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

fn borrowed(bound: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match bound {
        Bound::Included(key) => Bound::Included(key.as_slice()),
        Bound::Excluded(key) => Bound::Excluded(key.as_slice()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

/// A range scan read from fjall a chunk at a time, each chunk from a fresh range past the last key returned.
/// fjall's iterators cannot cross threads, and a scan must (a page of a list is read on the store's reader
/// threads, the audit walks whole trees); like sled's iterators, a scan is not one moment of the tree, but
/// each key is seen once, in order.
struct Chunked {
    partition: PartitionHandle,
    name: &'static str,
    start: Bound<Vec<u8>>,
    end: Bound<Vec<u8>>,
    reverse: bool,
    chunk: usize,
    buffer: std::vec::IntoIter<(sled::IVec, sled::IVec)>,
    done: bool,
}

impl Chunked {
    fn fill(&mut self) -> Result<(), StoreError> {
        let range = self.partition.range::<&[u8], _>((borrowed(&self.start), borrowed(&self.end)));
        let items: Box<dyn Iterator<Item = fjall::Result<fjall::KvPair>>> =
            if self.reverse { Box::new(range.rev()) } else { Box::new(range) };
        let mut chunk = Vec::with_capacity(self.chunk);
        for item in items.take(self.chunk) {
            let (key, value) = item.map_err(|e| StoreError::Io(format!("{}: {e}", self.name)))?;
            chunk.push((sled::IVec::from(&*key), sled::IVec::from(&*value)));
        }
        match chunk.last() {
            Some((last, _)) if chunk.len() == self.chunk => {
                let last = last.to_vec();
                // The next chunk starts past the last key, unless that key was the range's bound.
                let (moving, other) =
                    if self.reverse { (&mut self.end, &self.start) } else { (&mut self.start, &self.end) };
                let at_bound = match other {
                    Bound::Included(b) | Bound::Excluded(b) => {
                        if self.reverse {
                            last.as_slice() <= b.as_slice()
                        } else {
                            last.as_slice() >= b.as_slice()
                        }
                    }
                    Bound::Unbounded => false,
                };
                *moving = Bound::Excluded(last);
                self.done = at_bound;
            }
            _ => self.done = true,
        }
        self.chunk = (self.chunk * 2).min(MAX_CHUNK);
        self.buffer = chunk.into_iter();
        Ok(())
    }
}

impl Iterator for Chunked {
    type Item = Result<(sled::IVec, sled::IVec), StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(item) = self.buffer.next() {
            return Some(Ok(item));
        }
        if self.done {
            return None;
        }
        if let Err(err) = self.fill() {
            self.done = true;
            return Some(Err(err));
        }
        self.buffer.next().map(Ok)
    }
}

impl FjallKv {
    fn partition(&self, tree: usize) -> Result<&PartitionHandle, StoreError> {
        self.partitions.get(tree).ok_or_else(|| StoreError::Corrupt(format!("no tree number {tree}")))
    }
}

impl Kv for FjallKv {
    fn raw(&self, tree: usize, key: &[u8]) -> Result<Option<sled::IVec>, StoreError> {
        let value = self.partition(tree)?.get(key).map_err(|e| StoreError::Io(format!("{}: {e}", TREE_NAMES[tree])))?;
        Ok(value.map(|v| sled::IVec::from(&*v)))
    }

    fn scan(&self, tree: usize, start: Bound<&[u8]>, end: Bound<&[u8]>, reverse: bool) -> Result<Scan, StoreError> {
        Ok(Box::new(Chunked {
            partition: self.partition(tree)?.clone(),
            name: TREE_NAMES[tree],
            start: owned(start),
            end: owned(end),
            reverse,
            chunk: FIRST_CHUNK,
            buffer: Vec::new().into_iter(),
            done: false,
        }))
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

    fn count(&self, tree: usize) -> Result<u64, StoreError> {
        let count = self.partition(tree)?.len().map_err(|e| StoreError::Io(format!("{}: {e}", TREE_NAMES[tree])))?;
        Ok(count as u64)
    }

    /// One seek per merchant, past the previous one's keys.
    fn merchants(&self, tree: usize) -> Result<Vec<MerchantId>, StoreError> {
        let mut merchants = BTreeSet::new();
        let mut after: Option<Vec<u8>> = None;
        while let Some(key) = self.first_from(tree, after.as_deref())? {
            let id = merchant_of(&key)?;
            after = Some(past_merchant(&id));
            merchants.insert(id);
        }
        Ok(merchants.into_iter().collect())
    }

    fn first_from(&self, tree: usize, from: Option<&[u8]>) -> Result<Option<sled::IVec>, StoreError> {
        let partition = self.partition(tree)?;
        let first = match from {
            Some(key) => partition.range::<&[u8], _>(key..).next(),
            None => partition.iter().next(),
        };
        match first {
            Some(item) => Ok(Some(sled::IVec::from(&*item.map_err(io("seek"))?.0))),
            None => Ok(None),
        }
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

/// Keys written into the copy per batch.
const BACKUP_BATCH_KEYS: usize = 10_000;

impl FjallKv {
    /// Copies the store as of one moment (every change acknowledged before the call, none that was not yet
    /// committed) into a new store at `to`, without pausing the writer: fjall reads a past moment of every
    /// tree while writes go on.
    fn copy_to(&self, to: &Path) -> Result<BackupReport, StoreError> {
        let started = Instant::now();
        let io_error = |what: &str, e: std::io::Error| StoreError::Io(format!("{what} {}: {e}", to.display()));
        if to.exists() && std::fs::read_dir(to).map_err(|e| io_error("read", e))?.next().is_some() {
            return Err(StoreError::Conflict(format!(
                "{} is not empty; a backup goes to a new directory",
                to.display()
            )));
        }
        let moment = self.keyspace.instant();
        let copy = FjallStore::open(to)?;
        let mut keys = 0u64;
        for (tree, partition) in self.partitions.iter().enumerate() {
            let snapshot = partition.snapshot_at(moment);
            let mut ops = Vec::with_capacity(BACKUP_BATCH_KEYS);
            for item in snapshot.iter() {
                let (key, value) = item.map_err(|e| StoreError::Io(format!("read for the copy: {e}")))?;
                ops.push(Op::Insert(tree, key.to_vec(), value.to_vec()));
                if ops.len() == BACKUP_BATCH_KEYS {
                    keys += ops.len() as u64;
                    copy.kv.write_now(std::mem::take(&mut ops))?;
                }
            }
            keys += ops.len() as u64;
            copy.kv.write_now(ops)?;
        }
        copy.kv.close()?;
        let report = BackupReport { keys, paused_ms: 0, elapsed_ms: started.elapsed().as_millis() as u64 };
        tracing::info!(to = %to.display(), keys, elapsed_ms = report.elapsed_ms, "backup written");
        Ok(report)
    }

    /// Commits `ops` and waits until they are durable.
    fn write_now(&self, ops: Vec<Op>) -> Result<(), StoreError> {
        if ops.is_empty() {
            return Ok(());
        }
        super::writer::wait_polling(self.writer.submit(ops, None, Vec::new())?, None)
    }
}
