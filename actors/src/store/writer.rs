//! Group commit: one thread owns every write to sled and makes each batch durable with one sync.
//!
//! Writers enqueue a job (the sled operations of one change) on a bounded queue and get a ticket. The thread
//! takes the first waiting job, then everything else already queued up to [`MAX_BATCH_JOBS`], applies them all
//! in one multi-tree sled transaction, calls `flush` and then `sync_data` on sled's data file, and only then
//! completes the tickets. sled 0.34.7's `flush` stops at `sync_file_range`, which does not make the data
//! durable on a power cut; the explicit `sync_data` does. Blobs (values too large for a log segment) are
//! separate files that sled never syncs, so new ones are synced here too.
//!
//! Because there is a single writer, jobs commit in queue order, and a merchant's changes (queued by its
//! actor in decision order) land in order. When a batch fails, every job in it fails, and the guards of those
//! jobs are set so that later jobs from the same actors fail too (see [`super::WriteGuard`]).

use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use sled::transaction::{ConflictableTransactionError, TransactionError};
use sled::Transactional;
use tokio::sync::{mpsc, oneshot};

use super::{StoreError, Ticket, WriteGuard};
use crate::domain::records::Notification;

/// Jobs one batch takes at most; bounds the transaction's size and the latency of the first job in it.
pub(crate) const MAX_BATCH_JOBS: usize = 2048;
/// Jobs that may wait for the writer; beyond this, writes are refused (the API answers 503).
pub(crate) const QUEUE_CAPACITY: usize = 32 * 1024;

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

/// The handle on the writer thread. Dropping it lets the thread finish what is queued, then waits for it, so
/// that sled is closed (and its lock released) when the store is dropped.
pub(crate) struct Writer {
    queue: Option<mpsc::Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
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

impl Writer {
    pub(crate) fn spawn(
        db: sled::Db,
        trees: Vec<sled::Tree>,
        dir: &Path,
        healthy: Arc<AtomicBool>,
        feed: mpsc::Sender<Notification>,
    ) -> Result<Writer, StoreError> {
        let data_file = File::open(dir.join("db")).map_err(|e| StoreError::Io(format!("open sled data file: {e}")))?;
        let (queue, jobs) = mpsc::channel(QUEUE_CAPACITY);
        let mut thread =
            WriterThread { db, trees, data_file, blobs: Blobs::new(dir.join("blobs")), jobs, healthy, feed };
        let thread = std::thread::Builder::new()
            .name("caisse-store-writer".into())
            .spawn(move || thread.run())
            .map_err(|e| StoreError::Io(format!("start writer thread: {e}")))?;
        Ok(Writer { queue: Some(queue), thread: Some(thread) })
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
            Err(mpsc::error::TrySendError::Full(_)) => Err(StoreError::Overloaded),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(StoreError::Closed),
        }
    }
}

struct WriterThread {
    db: sled::Db,
    trees: Vec<sled::Tree>,
    data_file: File,
    blobs: Blobs,
    jobs: mpsc::Receiver<Job>,
    healthy: Arc<AtomicBool>,
    feed: mpsc::Sender<Notification>,
}

impl WriterThread {
    fn run(&mut self) {
        while let Some(first) = self.jobs.blocking_recv() {
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
        tracing::debug!("store writer stopped: every handle is gone");
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
        let result = self.apply(&batch).and_then(|()| self.make_durable());
        self.healthy.store(result.is_ok(), Ordering::Release);
        if let Err(err) = &result {
            tracing::error!(error = %err, jobs = batch.len(), "group commit failed; its changes are refused");
        }
        for mut job in batch {
            if result.is_ok() {
                // A full feed only delays delivery: the dispatcher's scan of the due index finds the rest.
                for n in job.notify.drain(..) {
                    let _ = self.feed.try_send(n);
                }
            }
            if result.is_err() {
                if let Some(guard) = &job.guard {
                    guard.store(true, Ordering::Release);
                }
            }
            // The waiter may have gone (request cancelled); the change is committed all the same.
            let _ = job.done.send(result.clone());
        }
    }

    fn apply(&self, batch: &[Job]) -> Result<(), StoreError> {
        let result: Result<(), TransactionError<StoreError>> = self.trees.as_slice().transaction(|trees| {
            for job in batch {
                for op in &job.ops {
                    match op {
                        Op::Insert(tree, key, value) => {
                            let tree = trees.get(*tree).ok_or_else(|| {
                                ConflictableTransactionError::Abort(StoreError::Corrupt(format!("no tree {tree}")))
                            })?;
                            tree.insert(key.as_slice(), value.as_slice())?;
                        }
                        Op::Remove(tree, key) => {
                            let tree = trees.get(*tree).ok_or_else(|| {
                                ConflictableTransactionError::Abort(StoreError::Corrupt(format!("no tree {tree}")))
                            })?;
                            tree.remove(key.as_slice())?;
                        }
                    }
                }
            }
            Ok(())
        });
        result.map_err(|e| match e {
            TransactionError::Abort(err) => err,
            TransactionError::Storage(err) => StoreError::Io(err.to_string()),
        })
    }

    fn make_durable(&mut self) -> Result<(), StoreError> {
        self.db.flush().map_err(|e| StoreError::Io(format!("flush: {e}")))?;
        self.data_file.sync_data().map_err(|e| StoreError::Io(format!("sync_data: {e}")))?;
        self.blobs.sync_new().map_err(|e| StoreError::Io(format!("sync blobs: {e}")))
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
