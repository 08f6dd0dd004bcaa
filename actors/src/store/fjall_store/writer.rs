//! Group commit on fjall: one thread owns every write and makes each batch durable with one `fdatasync` of
//! fjall's journal.
//!
//! Writers enqueue a job (the operations of one change) on a bounded queue and get a ticket. The thread takes
//! the first waiting job, then everything else already queued up to [`MAX_BATCH_JOBS`], and commits all their
//! operations as one fjall batch whose journal record is synced before the batch reaches the memtables. So a
//! change is durable before any reader can see it, and its ticket completes only after that.
//!
//! Because there is a single writer, jobs commit in queue order, and a merchant's changes (queued by its actor
//! in decision order) land in order. When a batch fails, every job in it fails, and the guards of those jobs
//! are set so that later jobs from the same actors fail too (see [`FailureLatch`]). fjall stops accepting
//! writes after a failed sync (a journal whose tail is unknown cannot be appended to); the writer opens the
//! keyspace again once the disk has room and takes writes, which recovers the journal up to its last whole
//! record (see [`Current`] for what that means for the actors). While the disk is nearly full, batches are
//! refused before fjall sees them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self as std_mpsc, TrySendError};
use std::sync::Arc;
use std::time::Instant;

use fjall::PersistMode;

use super::Current;
use tokio::sync::{mpsc, oneshot};

use crate::domain::records::Notification;
use crate::store::layout::{journal_runs, APPLY_ORDER, JOURNAL, SNAPSHOTS};
use crate::store::op::Op;
use crate::store::op::TreeMap;
use crate::store::wait_polling;
use crate::store::{FailureLatch, Fence, StoreError, Ticket};

/// Jobs one batch takes at most; bounds the journal record's size and the latency of the first job in it.
const MAX_BATCH_JOBS: usize = 2048;
/// Jobs that may wait for the writer; beyond this, writes are refused (the API answers 503).
const QUEUE_CAPACITY: usize = 32 * 1024;
/// Batches are refused, untried, while the disk has less than this free (or a quarter of a smaller disk):
/// room for fjall's own writes (the memtables it writes out, up to 32 MiB, and the tables it compacts), which
/// then seldom meet a full disk. After a write of its fails it accepts none until the keyspace is opened again,
/// and a background write that fails stops its thread, which can leave a commit waiting for it.
const RESERVE_BYTES: u64 = 64 * 1024 * 1024;
/// How often an idle writer wakes while writes fail: to see whether the disk has room again.
const IDLE_TICK: std::time::Duration = std::time::Duration::from_secs(1);
/// How often sled writes the balance snapshots out, at most: what a crash may lose of them (a longer replay
/// at the merchant's next start, nothing more).
const SNAPSHOTS_FLUSH: std::time::Duration = std::time::Duration::from_secs(1);

struct Job {
    ops: Vec<Op>,
    guard: Option<FailureLatch>,
    /// The token the actor's state was read under (see [`Current`]); a job made under an older one is refused.
    fence: Option<Fence>,
    /// Notifications this job creates, handed to the webhook dispatcher once they are durable.
    notify: Vec<Notification>,
    done: oneshot::Sender<Result<(), StoreError>>,
    /// A close ([`Writer::close`]): once this job's batch is committed the writer flushes and stops.
    close: bool,
    /// A pause ([`Writer::pause`]): once this job's batch is committed the writer waits until the sender is
    /// dropped, so nothing commits while a consistent copy is read.
    hold: Option<std_mpsc::Receiver<()>>,
    /// Journal keys go in as they are, never joined into runs ([`Writer::submit_as_stored`]).
    as_stored: bool,
}

impl Job {
    /// A job that writes nothing: a close, or a pause holding the writer until `hold`'s sender is dropped.
    fn control(
        done: oneshot::Sender<Result<(), StoreError>>,
        close: bool,
        hold: Option<std_mpsc::Receiver<()>>,
    ) -> Job {
        Job { ops: Vec::new(), guard: None, fence: None, notify: Vec::new(), done, close, hold, as_stored: false }
    }
}

/// Longest a pause holds the writer, whatever its holder does.
pub(super) const MAX_PAUSE: std::time::Duration = std::time::Duration::from_secs(600);

/// How much earlier than [`MAX_PAUSE`] a pause's holder counts it over: the writer's clock starts a little
/// before the holder learns that the pause began.
pub(super) const PAUSE_MARGIN: std::time::Duration = std::time::Duration::from_secs(5);

/// The handle on the writer thread. Dropping it lets the thread finish what is queued and sync, then waits for
/// it, so that every write is in fjall's files when the store is dropped.
pub(super) struct Writer {
    queue: Option<std_mpsc::SyncSender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Per tree, bumped after each batch that changed it (see [`Writer::generation`]).
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

impl Writer {
    pub(super) fn spawn(
        current: Arc<Current>,
        healthy: Arc<AtomicBool>,
        feed: mpsc::Sender<Notification>,
    ) -> Result<Writer, StoreError> {
        let (queue, jobs) = std_mpsc::sync_channel(QUEUE_CAPACITY);
        let trees = crate::store::layout::TREE_NAMES.len();
        let generations: Arc<Vec<AtomicU64>> = Arc::new((0..trees).map(|_| AtomicU64::new(0)).collect());
        let mut rank = vec![usize::MAX; trees];
        for (at, &tree) in APPLY_ORDER.iter().enumerate() {
            if let Some(slot) = rank.get_mut(tree) {
                *slot = at;
            }
        }
        let mut thread = WriterThread {
            current,
            snapshots_flushed: Instant::now(),
            rank,
            generations: generations.clone(),
            jobs,
            healthy,
            broken: None,
            feed,
        };
        let thread = std::thread::Builder::new()
            .name("caisse-store-writer".into())
            .spawn(move || thread.run())
            .map_err(|e| StoreError::Io(format!("start writer thread: {e}")))?;
        Ok(Writer { queue: Some(queue), thread: Some(thread), generations })
    }

    /// Changes after every committed batch that touched `tree`, so readers can tell whether what they cached
    /// from it may be stale. A reader must take the number before it reads the tree.
    pub(super) fn generation(&self, tree: usize) -> u64 {
        self.generations.get(tree).map_or(0, |g| g.load(Ordering::Acquire))
    }

    /// Commits what is queued, syncs the journal and sled, and stops the writer: later writes are refused
    /// ([`StoreError::Closed`]). Waits (polling, so it may run on an async runtime's thread) until the writer
    /// has stopped.
    pub(super) fn close(&self) -> Result<(), StoreError> {
        let (done, ticket) = oneshot::channel();
        let job = Job::control(done, true, None);
        let Some(queue) = &self.queue else { return Err(StoreError::Closed) };
        // Waits for room: what is queued before the close is committed first.
        queue.send(job).map_err(|_| StoreError::Closed)?;
        wait_polling(ticket, None)
    }

    /// Stops the writer after everything queued before this call is committed: once the ticket completes
    /// (Ok), nothing commits until the returned sender is dropped (or [`MAX_PAUSE`] passes), and every read
    /// sees one moment of the store. Writes queue meanwhile, and are refused once the queue is full.
    pub(super) fn pause(&self) -> Result<(Ticket, std_mpsc::SyncSender<()>), StoreError> {
        let (release, hold) = std_mpsc::sync_channel(0);
        let (done, ticket) = oneshot::channel();
        let job = Job::control(done, false, Some(hold));
        let Some(queue) = &self.queue else { return Err(StoreError::Closed) };
        match queue.try_send(job) {
            Ok(()) => Ok((ticket, release)),
            Err(TrySendError::Full(_)) => Err(StoreError::Overloaded),
            Err(TrySendError::Disconnected(_)) => Err(StoreError::Closed),
        }
    }

    pub(super) fn submit(
        &self,
        ops: Vec<Op>,
        guard: Option<&FailureLatch>,
        notify: Vec<Notification>,
        fence: Option<Fence>,
    ) -> Result<Ticket, StoreError> {
        if guard.is_some_and(|g| g.load(Ordering::Acquire)) {
            return Err(StoreError::Aborted);
        }
        let job =
            |done| Job { ops, guard: guard.cloned(), fence, notify, done, close: false, hold: None, as_stored: false };
        self.queue_job(job)
    }

    /// Queues `ops` to be written exactly as given: a journal key holds the value given for it, and lone
    /// events are not joined into runs. For copying a store key for key (a backup, the upgrade from sled):
    /// joining there would move an event from its own key into a run under a later one, and what the upgrade
    /// then replays from sled's old log over that later key would drop it.
    pub(super) fn submit_as_stored(&self, ops: Vec<Op>) -> Result<Ticket, StoreError> {
        self.queue_job(|done| Job {
            ops,
            guard: None,
            fence: None,
            notify: Vec::new(),
            done,
            close: false,
            hold: None,
            as_stored: true,
        })
    }

    fn queue_job(
        &self,
        job: impl FnOnce(oneshot::Sender<Result<(), StoreError>>) -> Job,
    ) -> Result<Ticket, StoreError> {
        let (done, ticket) = oneshot::channel();
        let job = job(done);
        let Some(queue) = &self.queue else { return Err(StoreError::Closed) };
        match queue.try_send(job) {
            Ok(()) => Ok(ticket),
            Err(TrySendError::Full(_)) => Err(StoreError::Overloaded),
            Err(TrySendError::Disconnected(_)) => Err(StoreError::Closed),
        }
    }
}

struct WriterThread {
    current: Arc<Current>,
    /// When sled last wrote the balance snapshots out (see [`SNAPSHOTS_FLUSH`]).
    snapshots_flushed: Instant,
    /// Each tree's place in [`APPLY_ORDER`]: a batch reaches the memtables records first, then what points at
    /// them, so an index read while a batch is being applied never leads to nothing.
    rank: Vec<usize>,
    generations: Arc<Vec<AtomicU64>>,
    jobs: std_mpsc::Receiver<Job>,
    healthy: Arc<AtomicBool>,
    /// Set when fjall refused a commit; every later write gets this error until the keyspace is opened again.
    broken: Option<StoreError>,
    feed: mpsc::Sender<Notification>,
}

impl WriterThread {
    fn run(&mut self) {
        loop {
            let first = match self.jobs.recv_timeout(IDLE_TICK) {
                Ok(job) => job,
                Err(std_mpsc::RecvTimeoutError::Timeout) => {
                    self.idle();
                    continue;
                }
                Err(std_mpsc::RecvTimeoutError::Disconnected) => break,
            };
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
                let closed = self.shut_down();
                self.healthy.store(false, Ordering::Release);
                // The queue goes before the close is answered, so that every write from then on is refused at
                // once rather than queued for nobody.
                let (_, gone) = std_mpsc::sync_channel(0);
                drop(std::mem::replace(&mut self.jobs, gone));
                for close in closes {
                    let _ = close.done.send(closed.clone());
                }
                return;
            }
            // Paused: the batch (everything queued before the pause) is committed; nothing more until the
            // holder lets go.
            for hold in holds {
                let _ = hold.recv_timeout(MAX_PAUSE);
            }
        }
        // Nobody is told: the handles are gone. `shut_down` logs what went wrong.
        let _ = self.shut_down();
    }

    fn commit(&mut self, batch: Vec<Job>) {
        // Opened again first, if it is due, so that the epoch below is the one the batch is written under.
        if self.broken.is_some() {
            self.idle();
        }
        // A job whose actor already saw a failure must not land: its decision may rest on the lost write. Nor
        // one whose actor read its state before the keyspace was opened again: the reopened store may hold a
        // write that actor was told had failed.
        let epoch = self.current.epoch();
        let stale = |job: &Job| job.fence.is_some_and(|fence| fence.token != epoch);
        let (mut batch, aborted): (Vec<Job>, Vec<Job>) = batch
            .into_iter()
            .partition(|job| !job.guard.as_ref().is_some_and(|g| g.load(Ordering::Acquire)) && !stale(job));
        for job in aborted {
            if let Some(guard) = &job.guard {
                guard.store(true, Ordering::Release);
            }
            let _ = job.done.send(Err(StoreError::Aborted));
        }
        if batch.is_empty() {
            return;
        }
        let result = self.write(&mut batch);
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

    /// While writes fail: once the disk has room again, opens the keyspace again if fjall refused a write,
    /// and says the store is healthy.
    fn idle(&mut self) {
        if self.healthy.load(Ordering::Acquire) || !self.has_room() {
            return;
        }
        if self.broken.is_some() {
            if !self.disk_writes() {
                return;
            }
            match self.current.reopen() {
                Ok(()) => {
                    tracing::info!("the keyspace was opened again after a failed write; writes resume");
                    self.broken = None;
                    // What readers cached may predate a write the reopened keyspace recovered.
                    for generation in self.generations.iter() {
                        generation.fetch_add(1, Ordering::Release);
                    }
                }
                Err(err) => {
                    tracing::warn!(error = %err, "could not open the keyspace again; trying again later");
                    return;
                }
            }
        }
        self.healthy.store(true, Ordering::Release);
    }

    fn has_room(&self) -> bool {
        match self.current.disk_bytes() {
            Ok((free, total)) => free >= RESERVE_BYTES.min(total / 4),
            Err(err) => {
                tracing::warn!(error = %err, "could not read the disk's free space");
                false
            }
        }
    }

    /// True when a file can be written and synced beside fjall's: before the keyspace is closed to be opened
    /// again, which needs to write, so that a disk that refuses writes (read-only, failing) leaves the old
    /// keyspace serving reads.
    fn disk_writes(&self) -> bool {
        match self.current.probe() {
            Ok(()) => true,
            Err(err) => {
                tracing::debug!(error = %err, "the disk still refuses writes");
                false
            }
        }
    }

    fn write(&mut self, batch: &mut [Job]) -> Result<(), StoreError> {
        // The journal events that may be joined into runs (below), apart from every other operation.
        let mut ops: Vec<(usize, Vec<u8>, Option<Vec<u8>>)> = Vec::new();
        let mut events = TreeMap::new();
        for job in batch.iter_mut() {
            for op in std::mem::take(&mut job.ops) {
                match op.into_entry() {
                    (JOURNAL, key, entry) if !job.as_stored => drop(events.insert(key, entry)),
                    op => ops.push(op),
                }
            }
        }
        // A batch of nothing but pauses writes nothing, whatever the disk.
        if ops.is_empty() && events.is_empty() {
            return Ok(());
        }
        if let Some(err) = &self.broken {
            return Err(err.clone());
        }
        if !self.has_room() {
            self.healthy.store(false, Ordering::Release);
            return Err(StoreError::Io(format!(
                "the disk is full (less than {} MiB free, kept for the store's own work); writes resume when there \
                 is room",
                RESERVE_BYTES >> 20
            )));
        }
        self.healthy.store(true, Ordering::Release);
        let open = self.current.get()?;
        // A merchant's consecutive events in the batch become runs stored under the key of the last: a busy
        // merchant's events cost fjall one key per run rather than one per event.
        if !events.is_empty() {
            ops.extend(journal_runs(&events)?.into_iter().map(|(key, entry)| (JOURNAL, key, entry)));
        }
        // Records before the indexes that point at them; a stable sort, so several operations on one key keep
        // the order they were queued in, and only the last of them is committed.
        let rank = &self.rank;
        ops.sort_by(|a, b| {
            let rank_of = |tree: usize| rank.get(tree).copied().unwrap_or(usize::MAX);
            (rank_of(a.0), a.0, &a.1).cmp(&(rank_of(b.0), b.0, &b.1))
        });
        let mut fjall_batch = open.keyspace.batch().durability(Some(PersistMode::SyncData));
        let mut snapshots = sled::Batch::default();
        let mut any_snapshot = false;
        let mut touched = 0u64;
        let mut ops = ops.into_iter().peekable();
        while let Some((tree, key, entry)) = ops.next() {
            if ops.peek().is_some_and(|(next_tree, next_key, _)| *next_tree == tree && *next_key == key) {
                continue;
            }
            touched |= 1u64.checked_shl(tree as u32).unwrap_or(0);
            if tree == SNAPSHOTS {
                any_snapshot = true;
                match entry {
                    Some(value) => snapshots.insert(key, value),
                    None => snapshots.remove(key),
                }
                continue;
            }
            let Some(partition) = open.partitions.get(tree) else {
                return Err(StoreError::Corrupt(format!("a write to tree {tree}, which does not exist")));
            };
            match entry {
                Some(value) => fjall_batch.insert(partition, key, value),
                None => fjall_batch.remove(partition, key),
            }
        }
        if let Err(e) = fjall_batch.commit() {
            let err = StoreError::Io(format!(
                "commit: {e}; writes stop until the keyspace is opened again, once the disk has room"
            ));
            self.broken = Some(err.clone());
            self.healthy.store(false, Ordering::Release);
            return Err(err);
        }
        // Only once the journal holds their events: a snapshot is never ahead of the journal, whatever sled
        // keeps of it after a crash. One that is lost costs the merchant's next start a longer replay, nothing
        // else, so a failure here fails nothing that is already durable. sled writes them out at most once
        // every SNAPSHOTS_FLUSH; a failure leaves sled refusing writes until the keyspace is opened again.
        //
        // A batch with no snapshot skips sled altogether: sled logs a batch marker for every batch applied, even
        // an empty one, and writing those out cost its IO threads about 7 % of the machine's CPU at 1,300
        // payments/s, one marker per commit.
        let applied = if any_snapshot { open.snapshots.apply_batch(snapshots) } else { Ok(()) };
        let kept = applied.and_then(|()| {
            if self.snapshots_flushed.elapsed() >= SNAPSHOTS_FLUSH {
                self.snapshots_flushed = Instant::now();
                open.snapshots.flush().map(drop)
            } else {
                Ok(())
            }
        });
        if let Err(e) = kept {
            tracing::error!(error = %e, "balance snapshots not written; recovery replays from older ones");
            self.broken = Some(StoreError::Io(format!("snapshots: {e}")));
            self.healthy.store(false, Ordering::Release);
        }
        for (index, generation) in self.generations.iter().enumerate() {
            if touched & 1u64.checked_shl(index as u32).unwrap_or(0) != 0 {
                generation.fetch_add(1, Ordering::Release);
            }
        }
        Ok(())
    }

    /// Every handle is gone (or the store is closing): everything committed is synced in the journal, and the
    /// snapshots in sled's files.
    fn shut_down(&mut self) -> Result<(), StoreError> {
        if let Some(err) = self.broken.clone() {
            return Err(err);
        }
        let open = self.current.get()?;
        // The journal holds everything: the next start recovers it (at most MAX_JOURNAL_BYTES). Writing the
        // memtables out here would make that start shorter, but fjall's way to wait for it spins for as long
        // as its flush takes, without bound (a stop once hung there).
        let result = open
            .keyspace
            .persist(PersistMode::SyncAll)
            .map_err(|e| StoreError::Io(format!("final sync: {e}")))
            .and_then(|()| open.snapshots.flush().map(drop).map_err(|e| StoreError::Io(format!("flush sled: {e}"))))
            // sled's flush stops at `sync_file_range`, which a power cut does not respect.
            .and_then(|()| super::snapshots::sync_tree(&open.snapshots_dir));
        match &result {
            Ok(()) => tracing::debug!("store writer stopped after a final flush"),
            Err(err) => tracing::warn!(error = %err, "final flush failed; the next start recovers the journal"),
        }
        result
    }
}
