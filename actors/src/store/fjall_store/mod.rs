//! The fjall engine ([`FjallKv`]): the store's trees as partitions of one fjall keyspace, an LSM tree with a
//! journal of its own. A group commit is one fjall batch whose journal record is synced before any reader
//! sees it ([`writer`]); a start recovers at most fjall's bounded journal, whatever the history, and the
//! tables are compressed.
//!
//! The merchants' balance snapshots are kept in sled (under `snapshots/`), as the engine's design asks: a
//! snapshot is a cache of what the journal already says, written to sled once the journal holds its event, so
//! a snapshot is never ahead of the journal, and one that a crash loses only makes recovery replay from an
//! older one. They are few (one per merchant, rewritten every thousand events), so sled's costs at scale (its
//! log replayed at each open, its disk per key) stay small.
//!
//! `open` takes the directory's lock (fjall has none), checks the format stamp and opens the keyspace;
//! `backup` copies a consistent moment of a running store, writes paused while it is read.

mod snapshots;
pub mod upgrade;
mod writer;

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Write;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicI64;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use fjall::{AbstractTree, Keyspace, PartitionCreateOptions, PartitionHandle, PersistMode};

use self::writer::{Writer, MAX_PAUSE, PAUSE_MARGIN};
use super::kv::{Kv, Scan};
use super::kv_store::KvStore;
use super::layout::{merchant_of, past_merchant, SNAPSHOTS, TREE_NAMES};
use super::op::Op;
use super::{BackupReport, FailureLatch, Fence, StoreError, Ticket};
use crate::domain::ids::MerchantId;
use crate::domain::records::Notification;

/// The embedded store: the roles over fjall.
pub type FjallStore = KvStore<FjallKv>;

/// The keyspace's directory inside the data directory.
const KEYSPACE_DIR: &str = "keyspace";
/// sled's directory for the balance snapshots, inside the data directory.
const SNAPSHOTS_DIR: &str = "snapshots";
/// sled's own page cache for the snapshots: they are read when an actor starts, not on a hot path.
const SNAPSHOTS_CACHE_BYTES: u64 = 4 * 1024 * 1024;
/// The lock file at the root of the data directory, held (`flock`) while a process has the store open.
const LOCK_FILE: &str = "LOCK";
/// How long an open waits for a lock that is being released (a process that closes and reopens the same
/// directory, as a test or a supervised restart does, may see its own old lock for a moment).
const LOCK_GRACE: std::time::Duration = std::time::Duration::from_secs(2);
/// Notifications waiting for the dispatcher beyond this are found by its scan of the due index instead.
const FEED_CAPACITY: usize = 64 * 1024;
/// The journal fjall keeps before it writes memtables out: what a start after a crash recovers at most.
///
/// A journal file goes only once every tree with writes in it has written them out, and fjall's monitor writes
/// out one tree per quarter second, so under load the journal runs well ahead of the memtables. Past its bound
/// fjall halts every commit, 100 ms at a time, until flushes catch up: at 64 MiB that halted the API for 1.7 s
/// at 2,000 payments/s and held the engine bench to 23 k events/s; at 512 MiB neither happened, and a start
/// after SIGKILL still opened the store, writing out what it recovered, in 0.6 s (docs/perf/README.md).
const MAX_JOURNAL_BYTES: u64 = 512 * 1024 * 1024;
/// The memtables of every tree together. fjall's monitor writes out the largest once they pass half of this,
/// and past 90 % fjall makes each commit sleep 100 ms, then 10 ms at a time until they are back under it.
///
/// A tree's memtable is written out at 16 MiB, so a few busy trees alone hold most of a small bound: at 32 MiB
/// the writer slept about a hundred times in ten seconds of the engine bench over 10,000 merchants (counted
/// with `perf record -e syscalls:sys_enter_clock_nanosleep`), and its figure rose from 44.8 and 46.5 k
/// events/s to 50.0 k at 128 MiB, where it never slept (docs/perf/history.md). This is memory the process
/// holds at most, not per tree.
const MAX_WRITE_BUFFER_BYTES: u64 = 128 * 1024 * 1024;
/// Memtables fjall's flush thread writes out in one turn (its `flush_workers`: one thread per memtable).
const FLUSH_TASKS_PER_TURN: usize = 16;
/// How long a start waits for the recovered memtables' writing out to make progress before it opens the
/// keyspace again (see [`recovered_written_out`]).
const RECOVERY_STILL: std::time::Duration = std::time::Duration::from_secs(2);
/// Keys a scan reads from fjall at a time, first, and at most (each read doubles until the maximum).
const FIRST_CHUNK: usize = 32;
const MAX_CHUNK: usize = 1024;

/// fjall's block cache unless the operator sets `store_cache_mib`.
pub const DEFAULT_CACHE_BYTES: u64 = 16 * 1024 * 1024;

pub struct FjallKv {
    // Dropped in this order: the writer (which flushes and joins its thread), the keyspace, and the
    // directory's lock last, once nothing of fjall's is open.
    writer: Writer,
    current: Arc<Current>,
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
        // Before anything touches the directory (its lock file, its stamp, its mode): the store is refused as
        // it is, so the release that made it still opens it. One of a format no release since can read says so.
        if crate::store::holds_sled_store_only(dir) {
            crate::store::stamp::check_readable(dir)?;
            return Err(StoreError::Format(format!(
                "{} holds a store made on sled by an earlier release; this release keeps its store on fjall. \
                 Stop every server on it and run `caisse upgrade-store`, which copies it onto fjall, audits the \
                 copy and keeps the old store beside it (docs/operations.md § Upgrades)",
                dir.display()
            )));
        }
        std::fs::create_dir_all(dir).map_err(|e| StoreError::Io(format!("create {}: {e}", dir.display())))?;
        // The directory holds the merchants' keys and the ledger: its owner only.
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| StoreError::Io(format!("chmod 0700 {}: {e}", dir.display())))?;
        }
        let lock = lock(dir)?;
        crate::store::stamp::check_or_stamp(dir)?;
        let started = Instant::now();
        if !holds_store(dir) {
            create(dir, cache_bytes)?;
        }
        let current = Arc::new(Current {
            open: RwLock::new(Some(Arc::new(Open::at(dir, cache_bytes)?))),
            epoch: AtomicI64::new(1),
            dir: dir.to_path_buf(),
            cache_bytes,
        });
        tracing::info!(elapsed_ms = started.elapsed().as_millis() as u64, "opened the keyspace");
        sync_dir(dir)?;
        let healthy = Arc::new(AtomicBool::new(true));
        let (feed_tx, feed_rx) = tokio::sync::mpsc::channel(FEED_CAPACITY);
        let writer = Writer::spawn(current.clone(), healthy.clone(), feed_tx)?;
        Ok(KvStore::new(FjallKv { writer, current, healthy, _lock: lock }, feed_rx))
    }
}

/// True when `dir` holds a store of this engine.
pub(super) fn holds_store(dir: &Path) -> bool {
    keyspace_dir(dir).is_dir()
}

/// The keyspace as open now, with a handle on each tree, and sled's tree of balance snapshots.
pub(super) struct Open {
    pub(super) keyspace: Keyspace,
    pub(super) partitions: Vec<PartitionHandle>,
    pub(super) snapshots: sled::Tree,
    /// sled's directory, whose files the writer syncs at a stop.
    pub(super) snapshots_dir: PathBuf,
}

impl Open {
    /// Opens the keyspace of the data directory `dir` and the snapshots' sled.
    fn at(dir: &Path, cache_bytes: u64) -> Result<Open, StoreError> {
        let (keyspace, partitions) = open_keyspace(&keyspace_dir(dir), cache_bytes)?;
        // Trees a newer build added since the keyspace was made were just created: reachable after a power cut.
        keyspace.persist(PersistMode::SyncAll).map_err(io("sync the keyspace"))?;
        let snapshots_dir = dir.join(SNAPSHOTS_DIR);
        // No background flush: one that fails leaves sled refusing every write until it is opened again, so
        // the writer flushes it after its commits, and opens it again with the keyspace.
        let sled = snapshots::open_when_unlocked(&snapshots_dir, SNAPSHOTS_CACHE_BYTES)?;
        let snapshots = sled.open_tree(TREE_NAMES[SNAPSHOTS]).map_err(|e| StoreError::Io(format!("open sled: {e}")))?;
        Ok(Open { keyspace, partitions, snapshots, snapshots_dir })
    }

    fn partition(&self, tree: usize) -> Result<&PartitionHandle, StoreError> {
        self.partitions.get(tree).ok_or_else(|| StoreError::Corrupt(format!("no tree number {tree}")))
    }
}

/// The open keyspace, which the writer replaces after fjall refused a write: fjall accepts no write after a
/// failed sync of its journal, until the keyspace is opened again, which recovers the journal up to its last
/// whole record. Readers and the writer take the current one for each use.
///
/// A write fjall refused may still be in what the reopen recovers (its bytes were buffered when the sync
/// failed, and reach the disk as the old keyspace closes): its answer said it failed, and it may be there
/// after all, as after any database's failed sync. So a merchant's actor must not go on from what it read
/// before the reopen: every reopen raises the epoch, the token [`Kv::claim`] gives an actor's state, and the
/// writer refuses a change made under an older one. The engine then starts the merchant's actor again from
/// what the reopened store holds.
pub(super) struct Current {
    open: RwLock<Option<Arc<Open>>>,
    epoch: AtomicI64,
    dir: PathBuf,
    cache_bytes: u64,
}

/// The file [`Current::probe`] writes, in the data directory.
const PROBE_FILE: &str = "probe";
/// How long a reopen waits for readers to let go of the keyspace before it tries again later.
const REOPEN_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

impl Current {
    pub(super) fn get(&self) -> Result<Arc<Open>, StoreError> {
        self.open
            .read()
            .map_err(|_| StoreError::Io("the keyspace's lock is poisoned".into()))?
            .clone()
            .ok_or_else(|| StoreError::Io("the store is being opened again after a failed write".into()))
    }

    /// The token of states read now.
    pub(super) fn epoch(&self) -> i64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Closes the keyspace and opens it again. Only one instance may be open on the directory, so the old one
    /// goes first, once nothing else holds it (a scan in progress, a backup); readers wait only while it is
    /// closed, and get an error while the new one opens. When it is still held after [`REOPEN_PATIENCE`], or
    /// the new one does not open, the caller tries again later; in the second case reads fail until then.
    pub(super) fn reopen(&self) -> Result<(), StoreError> {
        let started = Instant::now();
        let mut open = loop {
            let guard = self.open.write().map_err(|_| StoreError::Io("the keyspace's lock is poisoned".into()))?;
            if guard.as_ref().is_none_or(|open| Arc::strong_count(open) == 1) {
                break guard;
            }
            drop(guard);
            if started.elapsed() >= REOPEN_PATIENCE {
                return Err(StoreError::Io("readers held the keyspace; it is opened again later".into()));
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        // Nothing else holds the old one, and nobody can take it while the lock is held: closing it stops
        // fjall's threads and releases sled's lock.
        drop(open.take());
        // Opened without the lock: the open writes out what fjall recovered, which can take seconds, and
        // readers meanwhile get a prompt error (503) rather than a wait. Only the writer thread opens again,
        // so nothing else can install a keyspace in between.
        drop(open);
        let reopened = Arc::new(Open::at(&self.dir, self.cache_bytes)?);
        *self.open.write().map_err(|_| StoreError::Io("the keyspace's lock is poisoned".into()))? = Some(reopened);
        // Raised once the new keyspace is in place: a state read under the new token was read from it.
        self.epoch.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// Writes, syncs and removes a small file beside the keyspace: Ok when the disk takes writes.
    pub(super) fn probe(&self) -> Result<(), StoreError> {
        use std::io::Write;
        let path = self.dir.join(PROBE_FILE);
        let written = File::create(&path).and_then(|mut file| {
            file.write_all(&[0u8; 4096])?;
            file.sync_data()
        });
        let _ = std::fs::remove_file(&path);
        written.map_err(|e| StoreError::Io(format!("write {}: {e}", path.display())))
    }

    /// The bytes free for fjall's files, and the size of their disk.
    pub(super) fn disk_bytes(&self) -> Result<(u64, u64), StoreError> {
        use std::os::unix::ffi::OsStrExt;
        let path = std::ffi::CString::new(self.dir.as_os_str().as_bytes())
            .map_err(|_| StoreError::Io(format!("{}: a path with a NUL byte", self.dir.display())))?;
        // SAFETY: `statvfs` reads the NUL-terminated path and writes only into `stat`, which is ours and
        // the size it expects.
        let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
            return Err(StoreError::Io(format!("statvfs {}: {}", self.dir.display(), std::io::Error::last_os_error())));
        }
        Ok((stat.f_bavail.saturating_mul(stat.f_frsize), stat.f_blocks.saturating_mul(stat.f_frsize)))
    }
}

fn open_keyspace(path: &Path, cache_bytes: u64) -> Result<(Keyspace, Vec<PartitionHandle>), StoreError> {
    // fjall's threads (writing memtables out, compacting) run at the default priority. At nice 10 they fell
    // behind under load, the journal reached its bound and every commit halted: the API's p99 went past a
    // second at 2,000 payments/s (docs/perf/history.md).
    let config = fjall::Config::new(path)
        .cache_size(cache_bytes)
        .max_journaling_size(MAX_JOURNAL_BYTES)
        .max_write_buffer_size(MAX_WRITE_BUFFER_BYTES)
        .flush_workers(FLUSH_TASKS_PER_TURN);
    // Each open writes out at least one recovered memtable while fjall's flush thread works, so the loop ends:
    // it stops as soon as an open writes out nothing.
    let mut left_before = usize::MAX;
    let mut open = 0usize;
    loop {
        open += 1;
        let keyspace = config.clone().open().map_err(io("open the keyspace"))?;
        let partitions = TREE_NAMES
            .iter()
            .map(|name| keyspace.open_partition(name, PartitionCreateOptions::default()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(io("open the trees"))?;
        let left = recovered_written_out(&partitions);
        if left == 0 {
            return Ok((keyspace, partitions));
        }
        if left >= left_before {
            return Err(StoreError::Io(format!(
                "fjall did not write out the {left} memtables it recovered from its journal (open {open}); see the \
                 log of its flush thread"
            )));
        }
        tracing::info!(open, memtables = left, "opening the keyspace again to write out what it recovered");
        left_before = left;
        drop(partitions);
        drop(keyspace);
    }
}

/// Waits until the memtables fjall recovered from its sealed journal files are written out; answers how many
/// are left when that stops moving (0: all of them).
///
/// fjall (2.11) gives its flush thread one turn per recovered tree at open, and a turn writes out at most
/// [`FLUSH_TASKS_PER_TURN`] memtables; later turns come only with new rotations, each writing out as many
/// memtables as it adds. What a crash leaves beyond that stays queued, counted against the write buffer, and
/// once the buffer is full every commit halts for good: the restart bench's writer hung so, after a `kill -9`
/// with a full journal. So a start waits here for the recovered memtables, and opens the keyspace again
/// (another turn per tree) while some are left; the journal's bound bounds that work. Sealed memtables are
/// counted, not journal files: a journal file whose writes are all in the tables already (a crash between a
/// flush and the file's deletion) recovers into nothing and is harmless.
fn recovered_written_out(partitions: &[PartitionHandle]) -> usize {
    let mut left = sealed_memtables(partitions);
    let mut fewest = left;
    let mut moved = Instant::now();
    while left > 0 && moved.elapsed() < RECOVERY_STILL {
        std::thread::sleep(std::time::Duration::from_millis(10));
        left = sealed_memtables(partitions);
        // fjall's monitor may seal a memtable meanwhile (it then queues it properly): progress is a new low.
        if left < fewest {
            fewest = left;
            moved = Instant::now();
        }
    }
    left
}

/// Memtables the trees hold sealed, queued to be written out.
fn sealed_memtables(partitions: &[PartitionHandle]) -> usize {
    partitions.iter().map(|p| p.tree.sealed_memtable_count()).sum()
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
/// each key is seen once, in order. Each chunk is read from the keyspace open at the time, so a scan does not
/// hold one that the writer is opening again.
struct Chunked {
    current: Arc<Current>,
    tree: usize,
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
        let open = self.current.get()?;
        let range = open.partition(self.tree)?.range::<&[u8], _>((borrowed(&self.start), borrowed(&self.end)));
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

impl Kv for FjallKv {
    fn raw(&self, tree: usize, key: &[u8]) -> Result<Option<sled::IVec>, StoreError> {
        if tree == SNAPSHOTS {
            return self.current.get()?.snapshots.get(key).map_err(|e| StoreError::Io(format!("snapshots: {e}")));
        }
        let value = self
            .current
            .get()?
            .partition(tree)?
            .get(key)
            .map_err(|e| StoreError::Io(format!("{}: {e}", TREE_NAMES[tree])))?;
        Ok(value.map(|v| sled::IVec::from(&*v)))
    }

    fn scan(&self, tree: usize, start: Bound<&[u8]>, end: Bound<&[u8]>, reverse: bool) -> Result<Scan, StoreError> {
        if tree == SNAPSHOTS {
            // Read at once (one key per merchant): an iterator would hold sled open, which a reopen closes.
            let range = self.current.get()?.snapshots.range::<&[u8], _>((start, end));
            let items: Vec<_> = if reverse { range.rev().collect() } else { range.collect() };
            let error = |e: sled::Error| StoreError::Io(format!("snapshots: {e}"));
            return Ok(Box::new(items.into_iter().map(move |item| item.map_err(error))));
        }
        Ok(Box::new(Chunked {
            current: self.current.clone(),
            tree,
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
        fence: Option<Fence>,
    ) -> Result<Ticket, StoreError> {
        self.writer.submit(ops, guard, notify, fence)
    }

    /// One process holds the directory's lock: the token says only which opening of the keyspace the state
    /// is read from (see [`Current`]).
    fn claim(&self, merchant: &MerchantId) -> Result<Option<Fence>, StoreError> {
        Ok(self.fence_of(merchant))
    }

    fn fence_of(&self, _merchant: &MerchantId) -> Option<Fence> {
        Some(Fence { shard: 0, token: self.current.epoch() })
    }

    fn generation(&self, tree: usize) -> u64 {
        self.writer.generation(tree)
    }

    fn count(&self, tree: usize) -> Result<u64, StoreError> {
        if tree == SNAPSHOTS {
            return Ok(self.current.get()?.snapshots.len() as u64);
        }
        let count = self
            .current
            .get()?
            .partition(tree)?
            .len()
            .map_err(|e| StoreError::Io(format!("{}: {e}", TREE_NAMES[tree])))?;
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
        let open = self.current.get()?;
        if tree == SNAPSHOTS {
            let first = match from {
                Some(key) => open.snapshots.range::<&[u8], _>(key..).next(),
                None => open.snapshots.iter().next(),
            };
            return first
                .transpose()
                .map(|kv| kv.map(|(key, _)| key))
                .map_err(|e| StoreError::Io(format!("snapshots: {e}")));
        }
        let partition = open.partition(tree)?;
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

/// Keys written into a copy per batch.
const COPY_BATCH_KEYS: usize = 10_000;

/// A file a backup writes first into its target and removes once the copy is whole and durable: a backup cut
/// short (the server killed, the disk full) leaves it, and such a directory is refused by `open_embedded` and
/// `caisse restore` rather than taken for a store.
pub const BACKUP_UNFINISHED: &str = "BACKUP-UNFINISHED";

impl FjallKv {
    /// Copies the store as of one moment (every change acknowledged before the call, none that was not yet
    /// committed) into a new store at `to`.
    fn copy_to(&self, to: &Path) -> Result<BackupReport, StoreError> {
        let started = Instant::now();
        let io_error = |what: &str, e: std::io::Error| StoreError::Io(format!("{what} {}: {e}", to.display()));
        if to.exists() && std::fs::read_dir(to).map_err(|e| io_error("read", e))?.next().is_some() {
            return Err(StoreError::Conflict(format!(
                "{} is not empty; a backup goes to a new directory",
                to.display()
            )));
        }
        std::fs::create_dir_all(to).map_err(|e| io_error("create", e))?;
        let unfinished = to.join(BACKUP_UNFINISHED);
        File::create(&unfinished)
            .and_then(|mut f| {
                f.write_all(b"a backup was being written here and did not finish: this is not a whole store\n")?;
                f.sync_all()
            })
            .map_err(|e| io_error("write the marker of an unfinished backup in", e))?;
        sync_dir(to)?;
        let copy = FjallStore::open(to)?;
        // The writer is paused behind everything acknowledged before the request, and the trees read while
        // nothing commits: one moment of the store. Not fjall's snapshots: a closed one can hold back its
        // cleanup of overwritten versions until many more are closed.
        let (ticket, release) = self.writer.pause()?;
        crate::store::wait_polling(ticket, None)?;
        let paused = Instant::now();
        let keys = copy.kv.copy_from(|tree| self.scan(tree, Bound::Unbounded, Bound::Unbounded, false))?;
        // The writer resumes by itself after MAX_PAUSE: a copy that took about as long may hold trees read
        // after changes went on, so it is not one moment. (The writer's clock started before `paused`.)
        let one_moment = paused.elapsed() + PAUSE_MARGIN < MAX_PAUSE;
        drop(release);
        let paused_ms = paused.elapsed().as_millis() as u64;
        copy.kv.close()?;
        if !one_moment {
            return Err(StoreError::Io(format!(
                "the copy took {} s, longer than writes may wait ({} s): it is not one moment of the store and is \
                 not a backup ({} stays in {})",
                paused_ms / 1000,
                MAX_PAUSE.as_secs(),
                BACKUP_UNFINISHED,
                to.display()
            )));
        }
        std::fs::remove_file(&unfinished).map_err(|e| io_error("finish the backup in", e))?;
        sync_dir(to)?;
        // The directory's own entry, made by this backup, is durable too.
        if let Some(parent) = to.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent)?;
        }
        let report = BackupReport { keys, paused_ms, elapsed_ms: started.elapsed().as_millis() as u64 };
        tracing::info!(to = %to.display(), keys, paused_ms, elapsed_ms = report.elapsed_ms, "backup written");
        Ok(report)
    }

    /// Writes every key of every tree of a store, as `scan` reads each tree whole, into this store (a new one),
    /// key for key as stored, a batch at a time, each durable before the next: for a backup and for an upgrade
    /// from sled. Answers the keys written.
    fn copy_from(&self, scan: impl Fn(usize) -> Result<Scan, StoreError>) -> Result<u64, StoreError> {
        let mut keys = 0u64;
        for tree in 0..TREE_NAMES.len() {
            let mut ops = Vec::with_capacity(COPY_BATCH_KEYS);
            for item in scan(tree)? {
                let (key, value) = item?;
                ops.push(Op::Insert(tree, key.to_vec(), value.to_vec()));
                if ops.len() == COPY_BATCH_KEYS {
                    keys += ops.len() as u64;
                    self.write_now(std::mem::take(&mut ops))?;
                }
            }
            keys += ops.len() as u64;
            self.write_now(ops)?;
        }
        Ok(keys)
    }

    /// Commits `ops` as given ([`Writer::submit_as_stored`]) and waits until they are durable.
    fn write_now(&self, ops: Vec<Op>) -> Result<(), StoreError> {
        if ops.is_empty() {
            return Ok(());
        }
        crate::store::wait_polling(self.writer.submit_as_stored(ops)?, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commit(store: &FjallStore, ops: Vec<Op>, fence: Option<Fence>) -> Result<(), StoreError> {
        let ticket = store.kv.submit(ops, None, Vec::new(), fence)?;
        crate::store::wait_polling(ticket, None)
    }

    fn key(i: u32) -> Vec<u8> {
        i.to_be_bytes().to_vec()
    }

    /// Writes `count` keys into the payments tree of a keyspace without a flush thread, sealing a memtable
    /// (and a journal file) after each: what a crash with a long journal leaves behind.
    fn sealed_journals(path: &Path, count: u32) {
        let keyspace = fjall::Config::new(path).flush_workers(0).open().unwrap();
        let partitions: Vec<_> = TREE_NAMES
            .iter()
            .map(|name| keyspace.open_partition(name, PartitionCreateOptions::default()).unwrap())
            .collect();
        let payments = &partitions[crate::store::layout::PAYMENTS];
        for i in 0..count {
            payments.insert(key(i), vec![7; 64]).unwrap();
            assert!(payments.rotate_memtable().unwrap(), "each rotation seals a memtable and a journal");
        }
        keyspace.persist(PersistMode::SyncAll).unwrap();
        assert_eq!(keyspace.journal_count(), count as usize + 1);
    }

    /// Waits, at most 10 s, until fjall has deleted the journal files whose memtables were written out; answers
    /// how many files are left, the active one included.
    fn journals_after_deletion(keyspace: &Keyspace) -> usize {
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        while keyspace.journal_count() > 1 && Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        keyspace.journal_count()
    }

    /// A keyspace left with more recovered memtables than fjall writes out at open (a crash with many sealed
    /// journal files) opens with all of them written out, so that the write buffer they count against is
    /// free again, and the journal files they came from go.
    #[test]
    fn a_start_writes_out_everything_fjall_recovered() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(KEYSPACE_DIR);
        let sealed = 3 * FLUSH_TASKS_PER_TURN as u32;
        sealed_journals(&path, sealed);
        let (keyspace, partitions) = open_keyspace(&path, DEFAULT_CACHE_BYTES).unwrap();
        assert_eq!(sealed_memtables(&partitions), 0, "every recovered memtable was written out");
        let payments = &partitions[crate::store::layout::PAYMENTS];
        for i in 0..sealed {
            assert_eq!(payments.get(key(i)).unwrap().as_deref(), Some(&[7u8; 64][..]));
        }
        // The files go once fjall's flush thread has noted the tables, just after.
        assert_eq!(journals_after_deletion(&keyspace), 1, "the recovered journal files were deleted");
    }

    /// A journal file whose writes are all in the tables already (a crash between a flush and the file's
    /// deletion, or a power cut that undid the deletion) recovers into nothing: the start goes on at once.
    #[test]
    fn a_start_passes_over_a_journal_file_already_written_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(KEYSPACE_DIR);
        sealed_journals(&path, 2);
        let journals = path.join("journals");
        let kept = dir.path().join("journals-before");
        std::fs::create_dir(&kept).unwrap();
        for entry in std::fs::read_dir(&journals).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), kept.join(entry.file_name())).unwrap();
        }
        {
            let (keyspace, _partitions) = open_keyspace(&path, DEFAULT_CACHE_BYTES).unwrap();
            assert_eq!(journals_after_deletion(&keyspace), 1);
        }
        let mut restored = 0;
        for entry in std::fs::read_dir(&kept).unwrap() {
            let entry = entry.unwrap();
            if !journals.join(entry.file_name()).exists() {
                std::fs::copy(entry.path(), journals.join(entry.file_name())).unwrap();
                restored += 1;
            }
        }
        assert_eq!(restored, 2, "both sealed journal files were deleted, and are back");
        let (_keyspace, partitions) = open_keyspace(&path, DEFAULT_CACHE_BYTES).unwrap();
        assert_eq!(sealed_memtables(&partitions), 0);
        assert_eq!(partitions[crate::store::layout::PAYMENTS].get(key(1)).unwrap().as_deref(), Some(&[7u8; 64][..]));
    }

    /// Scans across chunk boundaries (32, then 64, 128, ... keys) see every key once, in order, both ways,
    /// with each kind of bound, including one that falls on the last key of a chunk.
    #[test]
    fn scans_cross_chunks_in_order_with_every_kind_of_bound() {
        let dir = tempfile::tempdir().unwrap();
        let store = FjallStore::open(dir.path()).unwrap();
        let tree = crate::store::layout::PAYMENTS;
        commit(&store, (0..300u32).map(|i| Op::Insert(tree, key(i), vec![1])).collect(), None).unwrap();
        let read = |start: Bound<&[u8]>, end: Bound<&[u8]>, reverse: bool| -> Vec<u32> {
            store
                .kv
                .scan(tree, start, end, reverse)
                .unwrap()
                .map(|item| u32::from_be_bytes(item.unwrap().0.as_ref().try_into().unwrap()))
                .collect()
        };
        let all: Vec<u32> = (0..300).collect();
        assert_eq!(read(Bound::Unbounded, Bound::Unbounded, false), all);
        assert_eq!(read(Bound::Unbounded, Bound::Unbounded, true), all.iter().rev().copied().collect::<Vec<_>>());
        let (k31, k95, k250) = (key(31), key(95), key(250));
        assert_eq!(read(Bound::Unbounded, Bound::Included(&k31), false), (0..=31).collect::<Vec<_>>());
        assert_eq!(read(Bound::Unbounded, Bound::Excluded(&k31), false), (0..31).collect::<Vec<_>>());
        assert_eq!(read(Bound::Excluded(&k31), Bound::Included(&k95), false), (32..=95).collect::<Vec<_>>());
        assert_eq!(read(Bound::Included(&k250), Bound::Unbounded, true), (250..300).rev().collect::<Vec<_>>());
        assert_eq!(read(Bound::Included(&k95), Bound::Excluded(&k250), true), (95..250).rev().collect::<Vec<_>>());
        assert!(read(Bound::Included(&k95), Bound::Excluded(&k31), false).is_empty(), "an inverted range is empty");
    }

    /// Opening the keyspace again keeps what was committed, raises the epoch, and refuses a change made under
    /// the token of before (its actor read a state that may miss what the reopen recovered).
    #[test]
    fn a_reopen_keeps_the_data_and_refuses_changes_read_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = FjallStore::open(dir.path()).unwrap();
        let merchant = MerchantId::new();
        let tree = crate::store::layout::PAYMENTS;
        let before = store.kv.claim(&merchant).unwrap();
        commit(&store, vec![Op::Insert(tree, b"a".to_vec(), b"1".to_vec())], before).unwrap();
        commit(&store, vec![Op::Insert(SNAPSHOTS, b"m".to_vec(), b"s".to_vec())], before).unwrap();

        store.kv.current.reopen().unwrap();
        let after = store.kv.claim(&merchant).unwrap();
        assert_ne!(before, after, "the epoch is raised");
        assert_eq!(store.kv.fence_of(&merchant), after);
        assert_eq!(store.kv.raw(tree, b"a").unwrap().as_deref(), Some(&b"1"[..]));
        assert_eq!(store.kv.raw(SNAPSHOTS, b"m").unwrap().as_deref(), Some(&b"s"[..]));
        let stale = commit(&store, vec![Op::Insert(tree, b"b".to_vec(), b"2".to_vec())], before);
        assert_eq!(stale, Err(StoreError::Aborted));
        assert_eq!(store.kv.raw(tree, b"b").unwrap(), None);
        commit(&store, vec![Op::Insert(tree, b"b".to_vec(), b"3".to_vec())], after).unwrap();
        assert_eq!(store.kv.raw(tree, b"b").unwrap().as_deref(), Some(&b"3"[..]));
    }
}
