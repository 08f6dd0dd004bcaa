//! Group commit: one thread owns every write and makes each batch durable with one sync of the write-ahead log.
//!
//! Writers enqueue a job (the sled operations of one change) on a bounded queue and get a ticket. The thread
//! takes the first waiting job, then everything else already queued up to [`MAX_BATCH_JOBS`], appends all
//! their operations to the write-ahead log as one record, calls `sync_data` on it, applies them to sled's trees
//! (in memory), and only then completes the tickets. Reads therefore see a change no later than its answer.
//!
//! sled's own files are made durable later by a checkpoint thread: `flush`, then a real `sync_data` on sled's
//! data file (sled 0.34.7's `flush` stops at `sync_file_range`, which does not survive a power cut), then the
//! blob files sled writes for large values and never syncs. Only then are the log files the checkpoint covers
//! deleted. This keeps sled's costly transactions and flushes out of every answer's path: one append and one
//! `fdatasync` per batch is the whole price of durability (see [`super::wal`] for why replay is exact).
//!
//! Because there is a single writer, jobs commit in queue order, and a merchant's changes (queued by its
//! actor in decision order) land in order. When a batch fails, every job in it fails, and the guards of those
//! jobs are set so that later jobs from the same actors fail too (see [`super::WriteGuard`]). A failure the
//! writer can undo (the log append was cut back) leaves the store unhealthy until an append succeeds again; it
//! probes once a second while idle, so health comes back when the disk does. A failure it cannot undo stops all
//! writing until a restart, which replays the log.

use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self as std_mpsc, RecvTimeoutError, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{mpsc, oneshot};

use super::wal::{self, AppendError, Wal};
use super::{StoreError, Ticket, WriteGuard};
use crate::domain::records::Notification;

/// Jobs one batch takes at most; bounds the log record's size and the latency of the first job in it.
pub(crate) const MAX_BATCH_JOBS: usize = 2048;
/// Jobs that may wait for the writer; beyond this, writes are refused (the API answers 503).
pub(crate) const QUEUE_CAPACITY: usize = 32 * 1024;
/// A log file this large is handed to a checkpoint, which bounds both the disk it takes and replay at start.
const ROTATE_BYTES: u64 = 64 * 1024 * 1024;
/// A log file with anything in it is handed to a checkpoint after this long, so a quiet store restarts fast.
const ROTATE_AFTER: Duration = Duration::from_secs(5);
/// How often an idle writer wakes: to probe the disk while unhealthy, and to rotate a quiet log.
const IDLE_TICK: Duration = Duration::from_secs(1);
/// What the probe of an unhealthy disk writes: more than most batches, so that health does not come back
/// while a real batch would still be refused.
const PROBE_BYTES: usize = 1024 * 1024;

pub(crate) enum Op {
    Insert(usize, Vec<u8>, Vec<u8>),
    Remove(usize, Vec<u8>),
}

struct Job {
    ops: Vec<Op>,
    guard: Option<WriteGuard>,
    /// Notifications this job creates, handed to the webhook dispatcher once they are durable.
    notify: Vec<Notification>,
    done: oneshot::Sender<Result<(), StoreError>>,
}

/// The handle on the writer thread. Dropping it lets the thread finish what is queued and checkpoint, then
/// waits for it, so that sled is closed (and its lock released) when the store is dropped.
pub(crate) struct Writer {
    queue: Option<std_mpsc::SyncSender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Per tree, bumped after each batch that changed it has been applied (see [`Writer::generation`]).
    generations: Arc<Vec<AtomicU64>>,
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.queue = None;
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("the store writer thread panicked");
            }
        }
    }
}

/// Replays the log files left by the last run into sled, makes sled durable, and deletes them. Returns the
/// sequence number the next log file takes. Must run before anything reads the trees.
pub(crate) fn recover(db: &sled::Db, trees: &[sled::Tree], order: &[usize], dir: &Path) -> Result<u64, StoreError> {
    let wal_dir = wal::wal_dir(dir);
    let files = wal::list(&wal_dir)?;
    let Some(&(last, _)) = files.last() else { return Ok(0) };
    let started = Instant::now();
    let (mut records, mut ops) = (0, 0);
    for (_, path) in &files {
        let found = wal::replay(path, |batch| apply(trees, order, batch.iter()).map(drop))?;
        if found.discarded > 0 {
            tracing::warn!(
                file = %path.display(),
                bytes = found.discarded,
                "dropped the unacknowledged tail of a write-ahead log file"
            );
        }
        records += found.records;
        ops += found.ops;
    }
    let mut checkpoint = Checkpoint::open(db.clone(), dir)?;
    checkpoint.run(last + 1)?;
    tracing::info!(
        files = files.len(),
        records,
        ops,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "replayed the write-ahead log"
    );
    Ok(last + 1)
}

/// Applies operations to sled's trees, one atomic batch per tree, the trees in `order`. Within a tree a later
/// operation on the same key wins, as it would applied one by one. Returns which trees changed, one bit per
/// tree index.
///
/// The batches of different trees become visible one after the other, so a reader between two of them sees
/// part of a change. `order` puts the trees that hold records before the indexes that point at them, so what
/// a reader finds through an index is always there (a due entry never points at a notification whose body is
/// not yet written).
fn apply<'a>(trees: &[sled::Tree], order: &[usize], ops: impl Iterator<Item = &'a Op>) -> Result<u64, StoreError> {
    let mut batches: Vec<Option<sled::Batch>> = trees.iter().map(|_| None).collect();
    for op in ops {
        let tree = match op {
            Op::Insert(tree, ..) | Op::Remove(tree, _) => *tree,
        };
        let batch = batches
            .get_mut(tree)
            .ok_or_else(|| StoreError::Corrupt(format!("no tree {tree}")))?
            .get_or_insert_with(sled::Batch::default);
        match op {
            Op::Insert(_, key, value) => batch.insert(key.as_slice(), value.as_slice()),
            Op::Remove(_, key) => batch.remove(key.as_slice()),
        }
    }
    let mut touched = 0;
    for &index in order {
        let (Some(tree), Some(batch)) = (trees.get(index), batches.get_mut(index).and_then(Option::take)) else {
            continue;
        };
        tree.apply_batch(batch).map_err(|e| StoreError::Io(format!("apply to sled: {e}")))?;
        touched |= 1u64.checked_shl(index as u32).unwrap_or(0);
    }
    if batches.iter().any(Option::is_some) {
        return Err(StoreError::Corrupt("a tree missing from the apply order".into()));
    }
    Ok(touched)
}

impl Writer {
    pub(crate) fn spawn(
        db: sled::Db,
        trees: Vec<sled::Tree>,
        order: Vec<usize>,
        dir: &Path,
        next_seq: u64,
        healthy: Arc<AtomicBool>,
        feed: mpsc::Sender<Notification>,
    ) -> Result<Writer, StoreError> {
        let wal = Wal::create(&wal::wal_dir(dir), next_seq)?;
        let checkpoint = Checkpoint::open(db, dir)?;
        let (queue, jobs) = std_mpsc::sync_channel(QUEUE_CAPACITY);
        let (to_checkpointer, requests) = std_mpsc::sync_channel::<u64>(1);
        let generations: Arc<Vec<AtomicU64>> = Arc::new(trees.iter().map(|_| AtomicU64::new(0)).collect());
        let busy = Arc::new(AtomicBool::new(false));
        let checkpointer = {
            let (mut checkpoint, busy) = (checkpoint, busy.clone());
            std::thread::Builder::new()
                .name("caisse-store-checkpoint".into())
                .spawn(move || {
                    while let Ok(before) = requests.recv() {
                        if let Err(err) = checkpoint.run(before) {
                            // The log files stay; the next checkpoint covers them too.
                            tracing::error!(error = %err, "checkpoint failed; the write-ahead log keeps the changes");
                        }
                        busy.store(false, Ordering::Release);
                    }
                    checkpoint
                })
                .map_err(|e| StoreError::Io(format!("start checkpoint thread: {e}")))?
        };
        let mut thread = WriterThread {
            trees,
            order,
            generations: generations.clone(),
            wal,
            jobs,
            healthy,
            broken: None,
            feed,
            to_checkpointer: Some(to_checkpointer),
            checkpointer: Some(checkpointer),
            checkpoint_busy: busy,
            rotated_at: Instant::now(),
            buffer: Vec::new(),
        };
        let thread = std::thread::Builder::new()
            .name("caisse-store-writer".into())
            .spawn(move || thread.run())
            .map_err(|e| StoreError::Io(format!("start writer thread: {e}")))?;
        Ok(Writer { queue: Some(queue), thread: Some(thread), generations })
    }

    /// Changes after every applied batch that touched `tree`, so readers can tell whether what they cached
    /// from it may be stale. A reader must take the number before it reads the tree.
    pub(crate) fn generation(&self, tree: usize) -> u64 {
        self.generations.get(tree).map_or(0, |g| g.load(Ordering::Acquire))
    }

    pub(crate) fn submit(
        &self,
        ops: Vec<Op>,
        guard: Option<&WriteGuard>,
        notify: Vec<Notification>,
    ) -> Result<Ticket, StoreError> {
        if guard.is_some_and(|g| g.load(Ordering::Acquire)) {
            return Err(StoreError::Aborted);
        }
        let (done, ticket) = oneshot::channel();
        let job = Job { ops, guard: guard.cloned(), notify, done };
        let Some(queue) = &self.queue else { return Err(StoreError::Closed) };
        match queue.try_send(job) {
            Ok(()) => Ok(ticket),
            Err(TrySendError::Full(_)) => Err(StoreError::Overloaded),
            Err(TrySendError::Disconnected(_)) => Err(StoreError::Closed),
        }
    }
}

struct WriterThread {
    trees: Vec<sled::Tree>,
    /// The order batches are applied in (see [`apply`]).
    order: Vec<usize>,
    generations: Arc<Vec<AtomicU64>>,
    wal: Wal,
    jobs: std_mpsc::Receiver<Job>,
    healthy: Arc<AtomicBool>,
    /// Set when a failure could not be undone; every later write gets this error until a restart.
    broken: Option<StoreError>,
    feed: mpsc::Sender<Notification>,
    to_checkpointer: Option<std_mpsc::SyncSender<u64>>,
    checkpointer: Option<std::thread::JoinHandle<Checkpoint>>,
    checkpoint_busy: Arc<AtomicBool>,
    rotated_at: Instant,
    /// The log record being built, kept between batches so its allocation is reused.
    buffer: Vec<u8>,
}

impl WriterThread {
    fn run(&mut self) {
        loop {
            match self.jobs.recv_timeout(IDLE_TICK) {
                Ok(first) => {
                    let mut batch = Vec::with_capacity(64);
                    batch.push(first);
                    while batch.len() < MAX_BATCH_JOBS {
                        match self.jobs.try_recv() {
                            Ok(job) => batch.push(job),
                            Err(_) => break,
                        }
                    }
                    self.commit(batch);
                }
                Err(RecvTimeoutError::Timeout) => self.idle(),
                Err(RecvTimeoutError::Disconnected) => break,
            }
            self.maybe_rotate();
        }
        self.shut_down();
    }

    fn commit(&mut self, batch: Vec<Job>) {
        // A job whose actor already saw a failure must not land: its decision may rest on the lost write.
        let (batch, aborted): (Vec<Job>, Vec<Job>) =
            batch.into_iter().partition(|job| !job.guard.as_ref().is_some_and(|g| g.load(Ordering::Acquire)));
        for job in aborted {
            let _ = job.done.send(Err(StoreError::Aborted));
        }
        if batch.is_empty() {
            return;
        }
        let result = self.write(&batch);
        if let Err(err) = &result {
            tracing::error!(error = %err, jobs = batch.len(), "group commit failed; its changes are refused");
        }
        for mut job in batch {
            if result.is_ok() {
                // A full feed only delays delivery: the dispatcher's scan of the due index finds the rest.
                for n in job.notify.drain(..) {
                    let _ = self.feed.try_send(n);
                }
            } else if let Some(guard) = &job.guard {
                guard.store(true, Ordering::Release);
            }
            // The waiter may have gone (request cancelled); the change is committed all the same.
            let _ = job.done.send(result.clone());
        }
    }

    fn write(&mut self, batch: &[Job]) -> Result<(), StoreError> {
        if let Some(err) = &self.broken {
            return Err(err.clone());
        }
        self.buffer.clear();
        wal::encode(batch.iter().flat_map(|job| job.ops.iter()), &mut self.buffer)?;
        self.append()?;
        // The batch is durable in the log; sled must now hold it too, or reads and later decisions would go
        // on without it while a restart would bring it back. If sled refuses, stop writing until then.
        match apply(&self.trees, &self.order, batch.iter().flat_map(|job| job.ops.iter())) {
            Ok(touched) => {
                for (index, generation) in self.generations.iter().enumerate() {
                    if touched & 1u64.checked_shl(index as u32).unwrap_or(0) != 0 {
                        generation.fetch_add(1, Ordering::Release);
                    }
                }
                Ok(())
            }
            Err(err) => {
                let err = StoreError::Io(format!("{err}; the store stopped writing until a restart replays the log"));
                self.broken = Some(err.clone());
                self.healthy.store(false, Ordering::Release);
                Err(err)
            }
        }
    }

    /// Appends `self.buffer` to the log and keeps the health flag in step with the outcome.
    fn append(&mut self) -> Result<(), StoreError> {
        match self.wal.append(&self.buffer) {
            Ok(()) => {
                self.healthy.store(true, Ordering::Release);
                Ok(())
            }
            Err(AppendError::Refused(err)) => {
                self.healthy.store(false, Ordering::Release);
                Err(err)
            }
            Err(AppendError::Broken(err)) => {
                self.healthy.store(false, Ordering::Release);
                self.broken = Some(err.clone());
                Err(err)
            }
        }
    }

    /// While unhealthy and idle, a probe tests the disk, so health returns without waiting for a write.
    fn idle(&mut self) {
        if self.broken.is_some() || self.healthy.load(Ordering::Acquire) {
            return;
        }
        match self.wal.probe(PROBE_BYTES.max(self.buffer.len())) {
            Ok(()) => {
                self.healthy.store(true, Ordering::Release);
                tracing::info!("the store accepts writes again");
            }
            Err(AppendError::Refused(_)) => {}
            Err(AppendError::Broken(err)) => {
                tracing::error!(error = %err, "the store stopped writing until a restart replays the log");
                self.broken = Some(err);
            }
        }
    }

    fn maybe_rotate(&mut self) {
        let due = self.wal.len() >= ROTATE_BYTES || (self.wal.len() > 0 && self.rotated_at.elapsed() >= ROTATE_AFTER);
        // No checkpoint while appends fail: sled keeps any write error until it is reopened, so it must not
        // touch a disk that is full or failing. The log holds everything meanwhile.
        let unhealthy = !self.healthy.load(Ordering::Acquire);
        if !due || unhealthy || self.broken.is_some() || self.checkpoint_busy.load(Ordering::Acquire) {
            return;
        }
        let Some(to_checkpointer) = &self.to_checkpointer else { return };
        match self.wal.rotate() {
            Ok(next) => {
                self.wal = next;
                self.rotated_at = Instant::now();
                self.checkpoint_busy.store(true, Ordering::Release);
                if to_checkpointer.try_send(self.wal.seq()).is_err() {
                    self.checkpoint_busy.store(false, Ordering::Release);
                }
            }
            // Appending to the current file goes on; the next batch tries again.
            Err(err) => tracing::warn!(error = %err, "could not start a new write-ahead log file"),
        }
    }

    /// Every handle is gone: checkpoint everything, so the next start has nothing to replay.
    fn shut_down(&mut self) {
        self.to_checkpointer = None;
        let Some(checkpointer) = self.checkpointer.take() else { return };
        let Ok(mut checkpoint) = checkpointer.join() else {
            tracing::error!("the checkpoint thread panicked; the next start replays the write-ahead log");
            return;
        };
        if self.broken.is_some() {
            return;
        }
        match checkpoint.run(self.wal.seq() + 1) {
            Ok(()) => tracing::debug!("store writer stopped after a final checkpoint"),
            Err(err) => tracing::warn!(error = %err, "final checkpoint failed; the next start replays the log"),
        }
    }
}

/// Makes sled's files durable, then deletes the log files that are no longer needed.
struct Checkpoint {
    db: sled::Db,
    data_file: File,
    blobs: Blobs,
    wal_dir: PathBuf,
}

impl Checkpoint {
    fn open(db: sled::Db, dir: &Path) -> Result<Checkpoint, StoreError> {
        let data_file = File::open(dir.join("db")).map_err(|e| StoreError::Io(format!("open sled data file: {e}")))?;
        Ok(Checkpoint { db, data_file, blobs: Blobs::new(dir.join("blobs")), wal_dir: wal::wal_dir(dir) })
    }

    /// Syncs everything sled holds, which includes every batch of log files numbered below `before`, then
    /// deletes those files.
    fn run(&mut self, before: u64) -> Result<(), StoreError> {
        self.db.flush().map_err(|e| StoreError::Io(format!("flush: {e}")))?;
        self.data_file.sync_data().map_err(|e| StoreError::Io(format!("sync_data: {e}")))?;
        self.blobs.sync_new().map_err(|e| StoreError::Io(format!("sync blobs: {e}")))?;
        let mut removed = false;
        for (seq, path) in wal::list(&self.wal_dir)? {
            if seq < before {
                std::fs::remove_file(&path).map_err(|e| StoreError::Io(format!("remove {}: {e}", path.display())))?;
                removed = true;
            }
        }
        if removed {
            wal::sync_dir(&self.wal_dir)?;
        }
        Ok(())
    }
}

/// sled writes values larger than a quarter segment as separate blob files and never syncs them.
struct Blobs {
    dir: PathBuf,
    seen_mtime: Option<SystemTime>,
    synced: HashSet<std::ffi::OsString>,
}

impl Blobs {
    fn new(dir: PathBuf) -> Blobs {
        Blobs { dir, seen_mtime: None, synced: HashSet::new() }
    }

    /// Syncs blob files that appeared since the last call, and the directory that names them. A stat per
    /// batch finds out whether there is anything to do: the directory's mtime changes when a file is added.
    fn sync_new(&mut self) -> std::io::Result<()> {
        let mtime = match std::fs::metadata(&self.dir) {
            Ok(meta) => meta.modified()?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        if self.seen_mtime == Some(mtime) {
            return Ok(());
        }
        let mut present = HashSet::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let name = entry.file_name();
            if !self.synced.contains(&name) {
                File::open(entry.path())?.sync_data()?;
            }
            present.insert(name);
        }
        File::open(&self.dir)?.sync_all()?;
        self.synced = present;
        self.seen_mtime = Some(mtime);
        Ok(())
    }
}
