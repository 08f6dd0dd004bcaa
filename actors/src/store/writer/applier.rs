//! The applier thread: it takes the overlay's closed layers in the order the writer closed them, applies each
//! to sled and drops it from the read path, and passes the writer's checkpoint requests on to the checkpoint
//! thread once every layer before them is in sled.
//!
//! A checkpoint covers the log files numbered below the one the writer rotated to, and the writer closes the
//! open layer when it rotates, before it asks for the checkpoint; since this thread handles both in order, sled
//! holds every change of the covered files when the checkpoint starts to make sled durable.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self as std_mpsc, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::checkpoint::Checkpoint;
use crate::store::overlay::{ApplyStep, Layer, Overlay};
use crate::store::StoreError;

/// What the writer hands the applier.
pub(super) enum Task {
    /// A closed layer to apply to sled.
    Apply(Arc<Layer>),
    /// Checkpoint the log files numbered below this one.
    Checkpoint(Covered),
}

/// A checkpoint request: the log files numbered below `before`. Built only by [`request_checkpoint`], which
/// queues it behind the layer holding those files' last changes, so a checkpoint can never start before sled
/// holds everything it covers.
pub(super) struct Covered {
    before: u64,
}

/// Queues a checkpoint of the log files numbered below `before` (the file the writer just rotated to), behind
/// `last_layer`: the open layer, closed now because it holds the last changes of those files (`None` when it
/// held nothing). The applier takes tasks in order and applies a layer before taking the next task, so when it
/// passes the request on, sled holds every change of the covered files. Answers false if the applier is gone.
pub(super) fn request_checkpoint(
    to_applier: &std_mpsc::SyncSender<Task>,
    last_layer: Option<Arc<Layer>>,
    before: u64,
) -> bool {
    if let Some(layer) = last_layer {
        if to_applier.send(Task::Apply(layer)).is_err() {
            return false;
        }
    }
    to_applier.send(Task::Checkpoint(Covered { before })).is_ok()
}

/// Set by the applier when sled refused a layer; the writer then refuses every write until a restart replays
/// the log. The layer stays in the overlay, so reads keep seeing everything that was acknowledged.
pub(super) type Failure = Arc<Mutex<Option<StoreError>>>;

pub(super) struct Applier {
    pub(super) trees: Vec<sled::Tree>,
    pub(super) order: Vec<ApplyStep>,
    pub(super) overlay: Arc<Overlay>,
    pub(super) failure: Failure,
    pub(super) healthy: Arc<AtomicBool>,
    /// Cleared by the checkpoint thread when it is done, or here when a request is not passed on.
    pub(super) checkpoint_busy: Arc<AtomicBool>,
}

impl Applier {
    /// Runs until the writer drops its end of `tasks`, then waits for the checkpoint thread and returns its
    /// [`Checkpoint`] for the writer's final one.
    pub(super) fn run(self, tasks: Receiver<Task>, checkpoint: Checkpoint) -> Result<Checkpoint, StoreError> {
        lower_priority();
        let (to_checkpointer, requests) = std_mpsc::sync_channel::<u64>(1);
        let checkpointer = {
            let (mut checkpoint, busy) = (checkpoint, self.checkpoint_busy.clone());
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
        while let Ok(task) = tasks.recv() {
            let failed = self.failure.lock().map_or(true, |f| f.is_some());
            match task {
                Task::Apply(layer) if !failed => self.apply(&layer),
                Task::Checkpoint(Covered { before }) if !failed => {
                    if to_checkpointer.try_send(before).is_err() {
                        self.checkpoint_busy.store(false, Ordering::Release);
                    }
                }
                // After a failure sled is not touched again: the log holds everything until a restart.
                Task::Apply(_) => {}
                Task::Checkpoint(_) => self.checkpoint_busy.store(false, Ordering::Release),
            }
        }
        drop(to_checkpointer);
        checkpointer.join().map_err(|_| StoreError::Io("the checkpoint thread panicked".into()))
    }

    /// Applies a layer, spread over [`APPLY_SPREAD`] unless the applier is behind (another closed layer
    /// waits): a layer applied at full speed has sled's IO threads write a second's worth of changes at once,
    /// and on a shared disk that burst held up the write-ahead log's `fdatasync`, which every answer waits
    /// for (docs/perf/history.md). Behind, it goes at full speed, on two threads for a large layer.
    fn apply(&self, layer: &Arc<Layer>) {
        let started = Instant::now();
        // The open layer, this one, and another closed one waiting.
        let behind = || self.overlay.depth() > 2;
        let pace = |done: usize, total: usize| {
            if total == 0 || behind() {
                return;
            }
            let due = APPLY_SPREAD.mul_f64(done as f64 / total as f64);
            if let Some(early) = due.checked_sub(started.elapsed()) {
                std::thread::sleep(early);
            }
        };
        let result = layer.apply(&self.trees, &self.order, behind(), &pace).and_then(|_| self.overlay.release(layer));
        if let Err(err) = result {
            let err = StoreError::Io(format!("{err}; the store stopped writing until a restart replays the log"));
            tracing::error!(error = %err, "applying the overlay to sled failed");
            self.healthy.store(false, Ordering::Release);
            if let Ok(mut failure) = self.failure.lock() {
                *failure = Some(err);
            }
        }
    }
}

/// The applier's work is never what an answer waits for: it has until the writer is [`super::APPLIER_QUEUE`]
/// layers ahead. At the default priority its bursts (a whole layer's inserts, on two threads) took the cores
/// from the HTTP workers and the merchant actors: under load the API's p99 grew several-fold, and provider
/// notices came so late that many payments skipped `payment.processing` (docs/perf/history.md). At nice 10 it
/// runs on what they leave; if that is not enough, the writer's wait on the full queue slows the writes
/// themselves. Threads it starts inherit the value.
fn lower_priority() {
    // SAFETY: `setpriority` takes plain integers and touches no memory of ours. On Linux, `PRIO_PROCESS`
    // with `who = 0` names the calling thread, not the whole process.
    let result = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, APPLIER_NICE) };
    if result != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "could not lower the applier's priority");
    }
}

/// How long the applier takes over a layer when it is not behind: most of [`super::LAYER_AGE`], so sled's
/// writes come as a steady stream and the applier is done before the next layer comes.
const APPLY_SPREAD: Duration = Duration::from_millis(200);

/// The applier's nice value.
const APPLIER_NICE: libc::c_int = 10;

#[cfg(test)]
mod tests {
    use super::*;

    /// A checkpoint request travels behind the layer holding the last changes of the files it covers, on the
    /// channel the applier takes in order.
    #[test]
    fn a_checkpoint_request_follows_the_layer_it_covers() {
        let overlay = Overlay::new(1);
        overlay.record([(0, b"k".to_vec(), Some(b"v".to_vec()))]).unwrap();
        let layer = overlay.freeze().unwrap();
        let (to_applier, tasks) = std_mpsc::sync_channel(4);
        assert!(request_checkpoint(&to_applier, Some(layer.clone()), 7));
        assert!(matches!(tasks.try_recv(), Ok(Task::Apply(l)) if Arc::ptr_eq(&l, &layer)));
        assert!(matches!(tasks.try_recv(), Ok(Task::Checkpoint(Covered { before: 7 }))));
        assert!(tasks.try_recv().is_err());
        // Nothing to close: the request goes alone, behind the layers already queued.
        assert!(request_checkpoint(&to_applier, None, 8));
        assert!(matches!(tasks.try_recv(), Ok(Task::Checkpoint(Covered { before: 8 }))));
        drop(tasks);
        assert!(!request_checkpoint(&to_applier, None, 9), "no applier, no checkpoint");
    }
}
