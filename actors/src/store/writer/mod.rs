//! Group commit: one thread owns every write and makes each batch durable with one sync of the write-ahead log.
//!
//! Writers enqueue a job (the sled operations of one change) on a bounded queue and get a ticket. The thread
//! takes the first waiting job, then everything else already queued up to [`MAX_BATCH_JOBS`], appends all
//! their operations to the write-ahead log as one record, calls `sync_data` on it, records them in the
//! overlay's open layer (in memory, visible to every reader), and only then completes the tickets. Reads
//! therefore see a change no later than its answer.
//!
//! sled receives the changes from the applier thread, a closed overlay layer at a time (see
//! [`super::overlay`]): the writer closes its open layer once it holds [`LAYER_OPS`] operations or is
//! [`LAYER_AGE`] old, and waits if the applier is more than [`APPLIER_QUEUE`] layers behind. sled's own files
//! are made durable later by a checkpoint thread: `flush`, then a real `sync_data` on sled's data file (sled
//! 0.34.7's `flush` stops at `sync_file_range`, which does not survive a power cut), then the blob files sled
//! writes for large values and never syncs. Only then are the log files the checkpoint covers deleted, but one
//! kept for the next log file to overwrite. This keeps sled's inserts and flushes out of every answer's path:
//! one append and one `fdatasync` per batch is the whole price of durability (see [`super::wal`] for why
//! replay is exact and reuse safe).
//!
//! Because there is a single writer, jobs commit in queue order, and a merchant's changes (queued by its
//! actor in decision order) land in order. When a batch fails, every job in it fails, and the guards of those
//! jobs are set so that later jobs from the same actors fail too (see [`super::FailureLatch`]). A failure the
//! writer can undo (the log append was cut back) leaves the store unhealthy until an append succeeds again; it
//! probes once a second while idle, so health comes back when the disk does. A failure it cannot undo, or sled
//! refusing a layer, stops all writing until a restart, which replays the log.
//!
//! This file holds the [`Writer`] handle that queues jobs and [`recover`], which replays the log at start;
//! `thread` holds the writer thread's loop and its commit of a batch, `applier` takes closed layers to sled,
//! `health` keeps the health flag in step with the disk and probes it while idle, and `checkpoint` makes
//! sled's files durable so that log files can be deleted.

mod applier;
mod checkpoint;
mod health;
mod thread;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self as std_mpsc, TrySendError};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc, oneshot};

use self::applier::{Applier, Failure, Task};
use self::checkpoint::Checkpoint;
use self::thread::WriterThread;
use super::op::Op;
use super::overlay::{ApplyStep, Overlay};
use super::wal::{self, Wal};
use super::{FailureLatch, StoreError, Ticket};
use crate::domain::records::Notification;

/// Jobs one batch takes at most; bounds the log record's size and the latency of the first job in it.
pub(crate) const MAX_BATCH_JOBS: usize = 2048;
/// Jobs that may wait for the writer; beyond this, writes are refused (the API answers 503).
pub(crate) const QUEUE_CAPACITY: usize = 32 * 1024;
/// The open overlay layer is closed once it holds this many operations, which bounds the overlay's memory:
/// with [`APPLIER_QUEUE`] closed layers waiting and one being applied, at most four layers are held at once,
/// and a writer that gets further ahead of sled waits. Under a steady load a layer closes by age
/// ([`LAYER_AGE`]) before it is full; twice this bound let the applier fall behind on a slow disk and the
/// server's memory peak far higher (docs/perf/history.md).
pub(crate) const LAYER_OPS: usize = 16 * 1024;
/// The open layer is closed after this long even if it is not full, so that sled receives a steady stream
/// rather than bursts (see `applier`). It is also about how long a short-lived key may live and never reach
/// sled: most do, since a webhook is delivered within milliseconds and the sandbox's notices come within
/// 200 ms; under load, longer layers left sled's file no smaller (docs/perf/history.md).
pub(crate) const LAYER_AGE: std::time::Duration = std::time::Duration::from_millis(250);
/// Closed layers waiting for the applier before the writer waits for it.
const APPLIER_QUEUE: usize = 2;

struct Job {
    ops: Vec<Op>,
    guard: Option<FailureLatch>,
    /// Notifications this job creates, handed to the webhook dispatcher once they are durable.
    notify: Vec<Notification>,
    done: oneshot::Sender<Result<(), StoreError>>,
    /// A pause ([`Writer::pause`]): once this job's batch is committed the writer waits until the sender is
    /// dropped, so nothing commits while a consistent copy is read.
    hold: Option<std_mpsc::Receiver<()>>,
    /// A close ([`Writer::close`]): once this job's batch is committed the writer checkpoints and stops.
    close: bool,
}

/// Longest a pause holds the writer, whatever its holder does.
pub(crate) const MAX_PAUSE: std::time::Duration = std::time::Duration::from_secs(600);

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
pub(crate) fn recover(db: &sled::Db, trees: &[sled::Tree], order: &[ApplyStep], dir: &Path) -> Result<u64, StoreError> {
    let wal_dir = wal::wal_dir(dir);
    // Retired files a crash left behind are already in sled; they are deleted (or one kept as the spare).
    wal::remove_retired(&wal_dir)?;
    let files = wal::list(&wal_dir)?;
    // A clean stop leaves no log file but the spare, whose old records carry its old number in their
    // checksums: numbering goes on after it, so that reusing it can never make those records look new.
    let after_spare = wal::spare_seq(&wal_dir)?.map_or(0, |seq| seq + 1);
    let Some(&(last, _)) = files.last() else { return Ok(after_spare) };
    let started = Instant::now();
    let (mut records, mut ops) = (0, 0);
    // Replayed through an overlay of its own, applied a layer at a time: every operation is absolute, so
    // applying only the last one on each key of a run of batches leaves sled as replaying them all would.
    let overlay = Overlay::new(trees.len());
    let apply_open = |overlay: &Overlay| -> Result<(), StoreError> {
        let layer = overlay.freeze()?;
        layer.apply(trees, order, false, &|_, _| {})?;
        overlay.release(&layer)
    };
    for (seq, path) in &files {
        let found = wal::replay(path, *seq, |batch| {
            overlay.record(batch.into_iter().map(Op::into_entry))?;
            if overlay.open_recorded() >= LAYER_OPS {
                apply_open(&overlay)?;
            }
            Ok(())
        })?;
        if found.discarded > 0 {
            // A write that failed or was cut short by the crash (never acknowledged), or what a reused file
            // held before.
            tracing::info!(
                file = %path.display(),
                bytes = found.discarded,
                "ignored the bytes after the last record of a write-ahead log file"
            );
        }
        records += found.records;
        ops += found.ops;
    }
    apply_open(&overlay)?;
    let mut checkpoint = Checkpoint::open(db.clone(), dir)?;
    checkpoint.run(last + 1)?;
    tracing::info!(
        files = files.len(),
        records,
        ops,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "replayed the write-ahead log"
    );
    Ok((last + 1).max(after_spare))
}

/// Waits for a ticket by polling it, so that it may run on an async runtime's thread (where blocking on it
/// would panic) as well as off one; past `deadline`, when given, it gives up with an I/O error.
pub(crate) fn wait_polling(mut ticket: Ticket, deadline: Option<Instant>) -> Result<(), StoreError> {
    loop {
        match ticket.try_recv() {
            Ok(result) => return result,
            Err(oneshot::error::TryRecvError::Closed) => return Err(StoreError::Closed),
            Err(oneshot::error::TryRecvError::Empty) if deadline.is_some_and(|d| Instant::now() >= d) => {
                return Err(StoreError::Io("a write was not durable in time".into()))
            }
            Err(oneshot::error::TryRecvError::Empty) => std::thread::sleep(std::time::Duration::from_millis(1)),
        }
    }
}

impl Writer {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn spawn(
        db: sled::Db,
        trees: Vec<sled::Tree>,
        order: Vec<ApplyStep>,
        overlay: Arc<Overlay>,
        dir: &Path,
        next_seq: u64,
        healthy: Arc<AtomicBool>,
        feed: mpsc::Sender<Notification>,
    ) -> Result<Writer, StoreError> {
        let wal = Wal::create(&wal::wal_dir(dir), next_seq)?;
        let checkpoint = Checkpoint::open(db, dir)?;
        let (queue, jobs) = std_mpsc::sync_channel(QUEUE_CAPACITY);
        let (to_applier, tasks) = std_mpsc::sync_channel::<Task>(APPLIER_QUEUE);
        let generations: Arc<Vec<AtomicU64>> = Arc::new(trees.iter().map(|_| AtomicU64::new(0)).collect());
        let busy = Arc::new(AtomicBool::new(false));
        let failure: Failure = Arc::default();
        let applier = {
            let applier = Applier {
                trees,
                order,
                overlay: overlay.clone(),
                failure: failure.clone(),
                healthy: healthy.clone(),
                checkpoint_busy: busy.clone(),
            };
            std::thread::Builder::new()
                .name("caisse-store-applier".into())
                .spawn(move || applier.run(tasks, checkpoint))
                .map_err(|e| StoreError::Io(format!("start applier thread: {e}")))?
        };
        let mut thread = WriterThread {
            overlay,
            generations: generations.clone(),
            wal,
            jobs,
            healthy,
            broken: None,
            feed,
            to_applier: Some(to_applier),
            applier: Some(applier),
            apply_failure: failure,
            checkpoint_busy: busy,
            rotated_at: Instant::now(),
            layer_opened_at: Instant::now(),
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

    /// Stops the writer after everything queued before this call is committed: once the ticket completes
    /// (Ok), nothing commits until the returned sender is dropped (or [`MAX_PAUSE`] passes), and every read
    /// sees one moment of the store. Writes queue meanwhile, and are refused once the queue is full.
    pub(crate) fn pause(&self) -> Result<(Ticket, std_mpsc::SyncSender<()>), StoreError> {
        let (release, hold) = std_mpsc::sync_channel(0);
        let (done, ticket) = oneshot::channel();
        let job = Job { ops: Vec::new(), guard: None, notify: Vec::new(), done, hold: Some(hold), close: false };
        let Some(queue) = &self.queue else { return Err(StoreError::Closed) };
        match queue.try_send(job) {
            Ok(()) => Ok((ticket, release)),
            Err(TrySendError::Full(_)) => Err(StoreError::Overloaded),
            Err(TrySendError::Disconnected(_)) => Err(StoreError::Closed),
        }
    }

    /// Commits what is queued, applies everything to sled and checkpoints it, then stops the writer: later
    /// writes are refused ([`StoreError::Closed`]) and the next open has no log to replay. For a clean stop
    /// while other handles still hold the store. Waits (polling, so it may run on an async runtime's thread)
    /// until the writer has stopped.
    pub(crate) fn close(&self) -> Result<(), StoreError> {
        let (done, ticket) = oneshot::channel();
        let job = Job { ops: Vec::new(), guard: None, notify: Vec::new(), done, hold: None, close: true };
        let Some(queue) = &self.queue else { return Err(StoreError::Closed) };
        // Waits for room: what is queued before the close is committed first.
        queue.send(job).map_err(|_| StoreError::Closed)?;
        wait_polling(ticket, None)
    }

    pub(crate) fn submit(
        &self,
        ops: Vec<Op>,
        guard: Option<&FailureLatch>,
        notify: Vec<Notification>,
    ) -> Result<Ticket, StoreError> {
        if guard.is_some_and(|g| g.load(Ordering::Acquire)) {
            return Err(StoreError::Aborted);
        }
        let (done, ticket) = oneshot::channel();
        let job = Job { ops, guard: guard.cloned(), notify, done, hold: None, close: false };
        let Some(queue) = &self.queue else { return Err(StoreError::Closed) };
        match queue.try_send(job) {
            Ok(()) => Ok(ticket),
            Err(TrySendError::Full(_)) => Err(StoreError::Overloaded),
            Err(TrySendError::Disconnected(_)) => Err(StoreError::Closed),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    struct Fixture {
        _dir: tempfile::TempDir,
        trees: Vec<sled::Tree>,
        overlay: Arc<Overlay>,
        writer: Writer,
    }

    fn start() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().path(dir.path()).flush_every_ms(None).open().unwrap();
        let trees: Vec<sled::Tree> = (0..2).map(|i| db.open_tree(format!("t{i}")).unwrap()).collect();
        let overlay = Arc::new(Overlay::new(trees.len()));
        let (feed, _) = mpsc::channel(16);
        let healthy = Arc::new(AtomicBool::new(true));
        let writer = Writer::spawn(
            db,
            trees.clone(),
            vec![ApplyStep::plain(0), ApplyStep::plain(1)],
            overlay.clone(),
            dir.path(),
            0,
            healthy,
            feed,
        )
        .unwrap();
        Fixture { _dir: dir, trees, overlay, writer }
    }

    fn commit(writer: &Writer, ops: Vec<Op>) {
        writer.submit(ops, None, Vec::new()).unwrap().blocking_recv().unwrap().unwrap();
    }

    #[test]
    fn an_acknowledged_change_is_readable_at_once_and_reaches_sled_within_a_layer_age() {
        let f = start();
        commit(&f.writer, vec![Op::Insert(1, b"k".to_vec(), b"v".to_vec()), Op::Insert(0, b"gone".to_vec(), vec![])]);
        commit(&f.writer, vec![Op::Remove(0, b"gone".to_vec())]);
        assert_eq!(f.overlay.get(1, b"k").unwrap(), Some(Some(b"v".to_vec())));
        assert_eq!(f.overlay.get(0, b"gone").unwrap(), Some(None));
        assert!(f.writer.generation(1) > 0);
        // The open layer is closed after LAYER_AGE, at the writer's next batch or idle tick.
        let deadline = Instant::now() + LAYER_AGE + Duration::from_secs(5);
        while f.overlay.get(1, b"k").unwrap().is_some() {
            assert!(Instant::now() < deadline, "the layer never reached sled");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(f.trees[1].get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
        assert_eq!(f.trees[0].get(b"gone").unwrap(), None);
        assert_eq!(f.overlay.depth(), 1);
    }

    #[test]
    fn dropping_the_writer_applies_the_open_layer_and_leaves_nothing_to_replay() {
        let f = start();
        commit(&f.writer, vec![Op::Insert(0, b"a".to_vec(), b"1".to_vec())]);
        let Fixture { _dir: dir, trees, overlay, writer } = f;
        drop(writer);
        assert_eq!(trees[0].get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
        assert_eq!(overlay.depth(), 1);
        let leftover = wal::list(&wal::wal_dir(dir.path())).unwrap();
        assert!(leftover.is_empty(), "log files left after a clean stop: {leftover:?}");
    }

    /// Closing while the handle lives (as a server does, with webhook actors still holding the store) commits
    /// what was queued, applies and checkpoints it, and refuses every later write.
    #[test]
    fn closing_checkpoints_everything_and_refuses_later_writes() {
        let f = start();
        let queued = f.writer.submit(vec![Op::Insert(0, b"a".to_vec(), b"1".to_vec())], None, Vec::new()).unwrap();
        f.writer.close().unwrap();
        assert_eq!(queued.blocking_recv().unwrap(), Ok(()), "a write queued before the close is committed");
        assert_eq!(f.trees[0].get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
        let leftover = wal::list(&wal::wal_dir(f._dir.path())).unwrap();
        assert!(leftover.is_empty(), "log files left after a close: {leftover:?}");
        let later = f.writer.submit(vec![Op::Insert(0, b"b".to_vec(), b"2".to_vec())], None, Vec::new());
        assert!(matches!(later, Err(StoreError::Closed)), "{later:?}");
        assert_eq!(f.writer.close(), Err(StoreError::Closed));
    }

    /// A clean stop leaves no log file, only the spare with its old records; the next run must not number a
    /// file as the spare was numbered, or a crash could replay those records as new ones.
    #[test]
    fn numbering_after_a_clean_stop_goes_on_past_the_spare() {
        let f = start();
        commit(&f.writer, vec![Op::Insert(0, b"a".to_vec(), b"1".to_vec())]);
        let Fixture { _dir: dir, trees: _, overlay: _, writer } = f;
        drop(writer);
        let wal_dir = wal::wal_dir(dir.path());
        let spare = wal::spare_seq(&wal_dir).unwrap().expect("the covered file is kept as the spare");
        let other = tempfile::tempdir().unwrap();
        let db = sled::Config::new().path(other.path()).open().unwrap();
        let next = recover(&db, &[], &[], dir.path()).unwrap();
        assert!(next > spare, "the next log file is numbered {next}, the spare was {spare}");
    }

    #[test]
    fn recovery_replays_the_log_in_layers_and_the_last_operation_on_a_key_wins() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().path(dir.path()).flush_every_ms(None).open().unwrap();
        let trees: Vec<sled::Tree> = (0..2).map(|i| db.open_tree(format!("t{i}")).unwrap()).collect();
        trees[1].insert(b"stale", b"old").unwrap();
        let mut wal = Wal::create(&wal::wal_dir(dir.path()), 0).unwrap();
        let key = |i: u32| i.to_be_bytes().to_vec();
        // More than a layer, so the replay applies one in the middle and one at the end.
        let batches = [
            (0..LAYER_OPS as u32 + 10).map(|i| Op::Insert(0, key(i), b"first".to_vec())).collect::<Vec<_>>(),
            vec![Op::Remove(0, key(3)), Op::Insert(0, key(4), b"second".to_vec()), Op::Remove(1, b"stale".to_vec())],
        ];
        for batch in &batches {
            let mut bytes = Vec::new();
            wal::encode(batch.iter(), 0, &mut bytes).unwrap();
            wal.append(&bytes).map_err(|_| "append").unwrap();
        }
        drop(wal);
        assert_eq!(recover(&db, &trees, &[ApplyStep::plain(0), ApplyStep::plain(1)], dir.path()).unwrap(), 1);
        assert_eq!(trees[0].len(), LAYER_OPS + 10 - 1);
        assert_eq!(trees[0].get(key(3)).unwrap(), None);
        assert_eq!(trees[0].get(key(4)).unwrap().as_deref(), Some(&b"second"[..]));
        assert_eq!(trees[0].get(key(5)).unwrap().as_deref(), Some(&b"first"[..]));
        assert_eq!(trees[1].get(b"stale").unwrap(), None);
        assert!(wal::list(&wal::wal_dir(dir.path())).unwrap().is_empty());
    }

    #[test]
    fn a_full_layer_is_closed_at_once() {
        let f = start();
        let ops = (0..LAYER_OPS as u32 + 1).map(|i| Op::Insert(0, i.to_be_bytes().to_vec(), vec![1])).collect();
        commit(&f.writer, ops);
        // The writer closes a full layer right after its batch, so the next batch opens a layer of its own.
        commit(&f.writer, vec![Op::Insert(1, b"next".to_vec(), vec![2])]);
        assert_eq!(f.overlay.open_recorded(), 1);
    }
}
