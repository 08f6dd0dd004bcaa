//! The writer thread: its loop that gathers queued jobs into batches, the commit of a batch (log append, the
//! overlay, completing the tickets), closing overlay layers for the applier, handing full or old log files to
//! a checkpoint, and the final checkpoint when every handle is gone.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self as std_mpsc, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::applier::{request_checkpoint, Failure, Task};
use super::checkpoint::Checkpoint;
use super::{Job, LAYER_AGE, LAYER_OPS, MAX_BATCH_JOBS};
use crate::domain::records::Notification;
use crate::store::op::Op;
use crate::store::overlay::Overlay;
use crate::store::wal::{self, Wal};
use crate::store::StoreError;

/// A log file this large is handed to a checkpoint, which bounds both the disk it takes and replay at start.
const ROTATE_BYTES: u64 = 64 * 1024 * 1024;
/// A log file with anything in it is handed to a checkpoint after this long, so a quiet store restarts fast.
const ROTATE_AFTER: Duration = Duration::from_secs(5);
/// How often an idle writer wakes: to probe the disk while unhealthy, and to rotate a quiet log.
const IDLE_TICK: Duration = Duration::from_secs(1);

pub(super) struct WriterThread {
    /// Where a durable batch becomes visible; the applier takes it to sled from there.
    pub(super) overlay: Arc<Overlay>,
    pub(super) generations: Arc<Vec<AtomicU64>>,
    pub(super) wal: Wal,
    pub(super) jobs: std_mpsc::Receiver<Job>,
    pub(super) healthy: Arc<AtomicBool>,
    /// Set when a failure could not be undone; every later write gets this error until a restart.
    pub(super) broken: Option<StoreError>,
    pub(super) feed: mpsc::Sender<Notification>,
    pub(super) to_applier: Option<std_mpsc::SyncSender<Task>>,
    pub(super) applier: Option<std::thread::JoinHandle<Result<Checkpoint, StoreError>>>,
    /// Set by the applier if sled refused a layer.
    pub(super) apply_failure: Failure,
    pub(super) checkpoint_busy: Arc<AtomicBool>,
    pub(super) rotated_at: Instant,
    /// When the overlay's open layer was opened.
    pub(super) layer_opened_at: Instant,
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
                    let holds: Vec<_> = batch.iter_mut().filter_map(|job| job.hold.take()).collect();
                    let (closes, batch): (Vec<Job>, Vec<Job>) = batch.into_iter().partition(|job| job.close);
                    self.commit(batch);
                    if !closes.is_empty() {
                        // Everything queued before the close is committed: apply it all, checkpoint, stop.
                        // Jobs queued after it are dropped with the queue, and their writers told it closed.
                        let closed = self.shut_down();
                        // Closed, whatever the checkpoint did: a write now would find no applier.
                        self.healthy.store(false, Ordering::Release);
                        // The queue goes before the close is answered, so that every write from then on is
                        // refused at once rather than queued for nobody.
                        let (_, gone) = std_mpsc::sync_channel(0);
                        drop(std::mem::replace(&mut self.jobs, gone));
                        for close in closes {
                            let _ = close.done.send(closed.clone());
                        }
                        return;
                    }
                    // Paused: the batch (everything queued before the pause) is committed; nothing more until
                    // the holder lets go.
                    for hold in holds {
                        let _ = hold.recv_timeout(super::MAX_PAUSE);
                    }
                }
                Err(RecvTimeoutError::Timeout) => self.idle(),
                Err(RecvTimeoutError::Disconnected) => break,
            }
            self.maybe_close_layer();
            self.maybe_rotate();
        }
        // Nobody is told: the handles are gone. `shut_down` logs what went wrong.
        let _ = self.shut_down();
    }

    fn commit(&mut self, batch: Vec<Job>) {
        // A job whose actor already saw a failure must not land: its decision may rest on the lost write.
        let (mut batch, aborted): (Vec<Job>, Vec<Job>) =
            batch.into_iter().partition(|job| !job.guard.as_ref().is_some_and(|g| g.load(Ordering::Acquire)));
        for job in aborted {
            let _ = job.done.send(Err(StoreError::Aborted));
        }
        if batch.is_empty() {
            return;
        }
        // A batch of nothing but pauses writes no log record.
        let result = if batch.iter().all(|job| job.ops.is_empty()) {
            self.broken.clone().map_or(Ok(()), Err)
        } else {
            self.write(&mut batch)
        };
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

    fn write(&mut self, batch: &mut [Job]) -> Result<(), StoreError> {
        if self.broken.is_none() {
            if let Some(err) = self.apply_failure.lock().ok().and_then(|failure| failure.clone()) {
                self.broken = Some(err);
            }
        }
        if let Some(err) = &self.broken {
            return Err(err.clone());
        }
        self.buffer.clear();
        wal::encode(batch.iter().flat_map(|job| job.ops.iter()), self.wal.seq(), &mut self.buffer)?;
        self.append()?;
        // The batch is durable in the log; from the overlay every reader sees it, and the applier takes it to
        // sled. Recording cannot fail for a batch the log took, short of a bug; if it does, stop writing until
        // a restart replays the log, which holds the batch.
        let ops = batch.iter_mut().flat_map(|job| std::mem::take(&mut job.ops)).map(Op::into_entry);
        match self.overlay.record(ops) {
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

    /// Closes the overlay's open layer and hands it to the applier once it is full or old enough. Waits while
    /// the applier is [`super::APPLIER_QUEUE`] layers behind: the overlay's bound, and the writer's
    /// backpressure when sled cannot keep up.
    fn maybe_close_layer(&mut self) {
        let recorded = self.overlay.open_recorded();
        if recorded >= LAYER_OPS || (recorded > 0 && self.layer_opened_at.elapsed() >= LAYER_AGE) {
            self.close_layer();
        }
    }

    fn close_layer(&mut self) {
        let Some(layer) = self.freeze_open_layer() else { return };
        let Some(to_applier) = &self.to_applier else { return };
        if to_applier.send(Task::Apply(layer)).is_err() {
            self.fail("the applier thread is gone");
        }
    }

    /// Closes the open layer if it holds anything; `None` when there is nothing to hand over or the writer is
    /// broken (then it has failed already).
    fn freeze_open_layer(&mut self) -> Option<std::sync::Arc<crate::store::overlay::Layer>> {
        if self.broken.is_some() || self.overlay.open_recorded() == 0 || self.to_applier.is_none() {
            return None;
        }
        match self.overlay.freeze() {
            Ok(layer) => {
                self.layer_opened_at = Instant::now();
                Some(layer)
            }
            Err(err) => {
                self.fail(&err.to_string());
                None
            }
        }
    }

    fn fail(&mut self, why: &str) {
        let err = StoreError::Io(format!("{why}; the store stopped writing until a restart replays the log"));
        tracing::error!(error = %err, "store writer");
        self.broken = Some(err);
        self.healthy.store(false, Ordering::Release);
    }

    fn maybe_rotate(&mut self) {
        let due = self.wal.len() >= ROTATE_BYTES || (self.wal.len() > 0 && self.rotated_at.elapsed() >= ROTATE_AFTER);
        // No checkpoint while appends fail: sled keeps any write error until it is reopened, so it must not
        // touch a disk that is full or failing. The log holds everything meanwhile.
        let unhealthy = !self.healthy.load(Ordering::Acquire);
        if !due || unhealthy || self.broken.is_some() || self.checkpoint_busy.load(Ordering::Acquire) {
            return;
        }
        match self.wal.rotate() {
            Ok(next) => {
                self.wal = next;
                self.rotated_at = Instant::now();
                // Every change of the older files is in the open layer or an earlier one: the open layer goes to
                // the applier ahead of the checkpoint (see `request_checkpoint`). If it could not be closed, no
                // checkpoint: it would retire log files whose changes sled does not hold.
                let last_layer = self.freeze_open_layer();
                if self.broken.is_some() {
                    return;
                }
                let Some(to_applier) = &self.to_applier else { return };
                self.checkpoint_busy.store(true, Ordering::Release);
                if !request_checkpoint(to_applier, last_layer, self.wal.seq()) {
                    self.checkpoint_busy.store(false, Ordering::Release);
                    self.fail("the applier thread is gone");
                }
            }
            // Appending to the current file goes on; the next batch tries again.
            Err(err) => tracing::warn!(error = %err, "could not start a new write-ahead log file"),
        }
    }

    /// Every handle is gone (or the store is closing): apply what the overlay holds and checkpoint everything,
    /// so the next start has nothing to replay. An error says the next start replays the log (nothing is lost:
    /// the log holds it).
    fn shut_down(&mut self) -> Result<(), StoreError> {
        self.close_layer();
        self.to_applier = None;
        let Some(applier) = self.applier.take() else {
            return Err(StoreError::Io("the applier had already stopped".into()));
        };
        let mut checkpoint = match applier.join() {
            Ok(Ok(checkpoint)) => checkpoint,
            Ok(Err(err)) => {
                tracing::error!(error = %err, "the applier stopped; the next start replays the write-ahead log");
                return Err(err);
            }
            Err(_) => {
                tracing::error!("the applier thread panicked; the next start replays the write-ahead log");
                return Err(StoreError::Io("the applier thread panicked".into()));
            }
        };
        let failure = self.apply_failure.lock().map_or(Some(StoreError::Io("poisoned".into())), |f| f.clone());
        if let Some(err) = self.broken.clone().or(failure) {
            return Err(err);
        }
        match checkpoint.run(self.wal.seq() + 1) {
            Ok(()) => {
                tracing::debug!("store writer stopped after a final checkpoint");
                Ok(())
            }
            Err(err) => {
                tracing::warn!(error = %err, "final checkpoint failed; the next start replays the log");
                Err(err)
            }
        }
    }
}
