//! The writer thread: its loop that gathers queued jobs into batches, the commit of a batch (log append, sled
//! apply, completing the tickets), handing full or old log files to the checkpoint thread, and the final
//! checkpoint when every handle is gone.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self as std_mpsc, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::apply::apply;
use super::checkpoint::Checkpoint;
use super::{Job, MAX_BATCH_JOBS};
use crate::domain::records::Notification;
use crate::store::wal::{self, Wal};
use crate::store::StoreError;

/// A log file this large is handed to a checkpoint, which bounds both the disk it takes and replay at start.
const ROTATE_BYTES: u64 = 64 * 1024 * 1024;
/// A log file with anything in it is handed to a checkpoint after this long, so a quiet store restarts fast.
const ROTATE_AFTER: Duration = Duration::from_secs(5);
/// How often an idle writer wakes: to probe the disk while unhealthy, and to rotate a quiet log.
const IDLE_TICK: Duration = Duration::from_secs(1);

pub(super) struct WriterThread {
    pub(super) trees: Vec<sled::Tree>,
    /// The order batches are applied in (see [`apply`]).
    pub(super) order: Vec<usize>,
    pub(super) generations: Arc<Vec<AtomicU64>>,
    pub(super) wal: Wal,
    pub(super) jobs: std_mpsc::Receiver<Job>,
    pub(super) healthy: Arc<AtomicBool>,
    /// Set when a failure could not be undone; every later write gets this error until a restart.
    pub(super) broken: Option<StoreError>,
    pub(super) feed: mpsc::Sender<Notification>,
    pub(super) to_checkpointer: Option<std_mpsc::SyncSender<u64>>,
    pub(super) checkpointer: Option<std::thread::JoinHandle<Checkpoint>>,
    pub(super) checkpoint_busy: Arc<AtomicBool>,
    pub(super) rotated_at: Instant,
    /// The log record being built, kept between batches so its allocation is reused.
    pub(super) buffer: Vec<u8>,
}

impl WriterThread {
    pub(super) fn run(&mut self) {
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
        wal::encode(batch.iter().flat_map(|job| job.ops.iter()), self.wal.seq(), &mut self.buffer)?;
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
