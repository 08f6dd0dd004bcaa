//! Group commit on PostgreSQL: a task owns a writing connection and makes each batch of queued jobs one
//! transaction, acknowledged only after `COMMIT` returns.
//!
//! A task takes the first waiting job, then whatever else is already queued up to [`MAX_BATCH_JOBS`], folds
//! their operations into the last value of each key (a key written twice in a batch is written once), joins
//! each merchant's consecutive journal events into runs (one row each, as the embedded store keeps them), and
//! sends per table touched one multi-row insert of the keys the batch makes (`Op::Create`: new sequence
//! numbers and ids, which need no search for a row to update), one multi-row upsert of the other keys set and
//! one multi-row delete, pipelined on the connection inside one transaction. Should a key the batch makes be
//! held all the same, the batch is written again with upserts, its journal runs claimed: a run whose key is
//! held with another event means a change decided on a stale view of its merchant, and is refused. (Only the
//! run's own key is checked: a stale change whose run ends elsewhere than the row in its way is not caught
//! here, nor was it when every run was upserted.)
//!
//! There are [`WRITERS`] such tasks, and a merchant's changes always go to the same one (by shard). A
//! merchant's changes (queued by its actor in decision order) land in order; changes of different merchants
//! need no order between them.
//!
//! A task commits on up to [`LANES`] connections. With nothing in flight, the next batch takes the jobs in
//! queue order. While a batch commits and jobs pile up, a second is written beside it on another connection,
//! with the changes of merchants the first does not hold: the time one transaction spends in its commit and
//! its round trips, the other spends writing. A merchant with a change in flight has its later changes wait
//! until it lands, so they commit in order and never in two transactions at once. A job of no merchant (a
//! webhook's outcome, an account, a sweep, an actor's forgetting of old idempotency keys or writing a request's
//! answer again) is written only when
//! nothing is in flight, nothing is written beside its batch, and what follows it waits for it. A spare lane
//! connects when first needed, and a batch is written beside another only on a lane already connected.
//!
//! When a batch fails every job in it fails and their guards are set ([`FailureLatch`]), exactly as with
//! the embedded store. A commit whose answer is lost (the connection dropped, or went silent, while `COMMIT`
//! was in flight) is not answered until the database has said what became of it (`doubt`): its jobs are
//! acknowledged if it committed, and fail once it can no longer commit, so that their actors reload a final
//! view (or, with the database out of reach, after the time the server keeps such a transaction waiting for
//! its `COMMIT`). The connection is then replaced; while a writer is unhealthy and idle it checks the database
//! once a second, so health returns with it (the store is healthy while every writer is).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::{join_all, try_join_all};
use futures_util::stream::FuturesUnordered;
use futures_util::{StreamExt, TryStreamExt};
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use super::conn::{db_error, Conn, QUERY_TIMEOUT};
use super::doubt::{resolve, InDoubt};
use super::schema::TreeSql;
use crate::domain::ids::MERCHANT_ID_LEN;
use crate::domain::records::Notification;
use crate::store::layout::{
    journal_runs, CLAIMED, JOURNAL, MERCHANTS, MERCHANT_KEYS, MERCHANT_SUSPENSIONS, RETIRED_KEYS,
};
use crate::store::op::{Op, TreeMap};
use crate::store::{FailureLatch, Fence, StoreError};

/// Jobs one transaction takes at most.
pub(super) const MAX_BATCH_JOBS: usize = 2048;
/// Jobs that may wait in one writer's queue; beyond this, writes to its shards are refused (the API answers
/// 503). A writer also holds up to [`MAX_HELD`] taken off its queue to sort into batches, so a node's writers
/// together hold at most [`WRITERS`] times the sum.
pub(super) const QUEUE_CAPACITY: usize = 16 * 1024;

/// Writers, each with its own connections ([`LANES`]) and its own share of the shards (a merchant's changes all
/// go to one, so they commit in the order its actor queued them).
///
/// One, measured end to end: two nodes and their database on two cores, 800 lives/s offered, completed 713 to
/// 750 lives/s with one writer, 561 and 590 with two, 507 to 546 with four. Under real traffic a batch holds a
/// few changes, so more writers make more, smaller transactions, and each costs the database and the node
/// their round trips and wake-ups. The engine bench, which keeps 4,096 changes waiting, is the opposite case:
/// over 10,000 merchants four writers took it from 24.4 k events/s to 31.2 k (docs/perf/history.md). A
/// writer's second lane ([`LANES`]) serves both: it is used only once changes pile up.
pub(super) const WRITERS: usize = 1;

/// Connections a writer commits on at once. While one batch commits, a second may be written beside it once
/// changes pile up ([`SPILL_AT`]), taking only merchants the first does not write for.
const LANES: usize = 2;

/// Jobs waiting, with a batch in flight, before a second batch is written beside it. Under a light load the
/// jobs that arrive during one commit join the next: a batch per commit, as few transactions as one lane
/// makes. Only a writer that is behind (the engine bench keeps thousands of changes waiting) uses the second.
const SPILL_AT: usize = 256;

/// How often a writer with a batch in flight and a lane free looks whether enough jobs wait for a second.
const SPILL_CHECK: Duration = Duration::from_millis(1);

/// Jobs a writer takes off its queue to sort into batches; more stay in the queue ([`QUEUE_CAPACITY`]).
const MAX_HELD: usize = 2 * MAX_BATCH_JOBS;

/// Transactions one batch may take when shards move under it.
const MAX_ATTEMPTS: u32 = 3;

/// How often an unhealthy, idle writer checks the database.
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// A key's last value in a batch (`None`: removed), and whether the batch makes it (its first operation there
/// is an `Op::Create`).
type Slot<'a> = (Option<&'a [u8]>, bool);

/// The statements one table's part of a transaction uses.
struct Statements {
    insert: Option<tokio_postgres::Statement>,
    claim: Option<tokio_postgres::Statement>,
    upsert: Option<tokio_postgres::Statement>,
    delete: Option<tokio_postgres::Statement>,
}

/// The statement `sql` when the batch has `keys` for it; only those are prepared (once per connection: `Conn`
/// keeps them).
async fn prepare(conn: &Conn, keys: &[&[u8]], sql: &str) -> Result<Option<tokio_postgres::Statement>, Failed> {
    match keys.is_empty() {
        true => Ok(None),
        false => conn.statement(sql).await.map(Some).map_err(Failed::Store),
    }
}

/// One table's part of a transaction.
#[derive(Default)]
struct Columns<'a> {
    /// The keys the batch makes (`Op::Create`), inserted without looking for a row to update, and their values.
    made_keys: Vec<&'a [u8]>,
    made_values: Vec<&'a [u8]>,
    /// Keys set only where no other value is held (a claimed tree's, and in a batch written again after a key
    /// it makes was found held, its journal runs), and their values.
    claimed_keys: Vec<&'a [u8]>,
    claimed_values: Vec<&'a [u8]>,
    /// The other keys set, upserted, and their values.
    set_keys: Vec<&'a [u8]>,
    set_values: Vec<&'a [u8]>,
    removed: Vec<&'a [u8]>,
}

pub(super) struct Job {
    pub(super) ops: Vec<Op>,
    pub(super) guard: Option<FailureLatch>,
    pub(super) notify: Vec<Notification>,
    pub(super) done: oneshot::Sender<Result<(), StoreError>>,
    /// Commit what is queued before, then stop.
    pub(super) close: bool,
    /// The shard token a merchant actor's change was decided under, checked in the transaction.
    pub(super) fence: Option<Fence>,
}

/// What a group commit reads in its transaction, so that its outcome can be learnt should the answer to its
/// `COMMIT` be lost ([`doubt`](super::doubt)): the transaction's id and its server process.
const IDENTIFY: &str = "SELECT txid_current(), pg_backend_pid()";

/// Why a transaction was not committed.
enum Failed {
    /// The database or the connection failed.
    Store(StoreError),
    /// These shards are no longer held with the tokens their jobs carry; nothing was written.
    Fenced(BTreeSet<Fence>),
    /// These keys of claimed trees belong to other values in the database; nothing was written.
    Claimed(BTreeSet<(usize, Vec<u8>)>),
    /// A key the batch makes (`Op::Create`) is held already (the database's words, naming the table and the
    /// key); nothing was written.
    Held(String),
}

/// The keys of claimed trees (`layout::CLAIMED`) a job sets, with the values it gives them.
fn claims(job: &Job) -> impl Iterator<Item = (usize, &[u8], &[u8])> {
    job.ops.iter().filter_map(Op::set).filter(|(tree, ..)| CLAIMED.contains(tree))
}

/// Answers a job that was not written with `error`, first setting its guard: its actor's later changes may
/// build on this one, so they are refused too until the actor reloads.
fn fail(job: Job, error: StoreError) {
    if let Some(guard) = &job.guard {
        guard.store(true, Ordering::Release);
    }
    let _ = job.done.send(Err(error));
}

/// The jobs whose actor has seen none of its writes fail, the others refused: a job of no merchant an actor
/// queued (a request's answer written again) may build on a change of the same batch refused a moment ago.
fn refuse_guarded(jobs: Vec<Job>) -> Vec<Job> {
    let (aborted, kept): (Vec<Job>, Vec<Job>) =
        jobs.into_iter().partition(|j| j.guard.as_ref().is_some_and(|g| g.load(Ordering::Acquire)));
    for job in aborted {
        fail(job, StoreError::Aborted);
    }
    kept
}

/// Refuses a job that claimed a key another value holds: nothing of it is written.
fn refuse_claim(job: Job, key: &[u8]) {
    fail(job, StoreError::EmailTaken(String::from_utf8_lossy(key).into_owned()));
}

pub(super) struct WriterTask {
    pub(super) config: super::tls::Endpoint,
    pub(super) conn: Option<Conn>,
    pub(super) sql: Arc<Vec<TreeSql>>,
    pub(super) jobs: mpsc::Receiver<Job>,
    pub(super) generations: Arc<Vec<AtomicU64>>,
    pub(super) healthy: Arc<AtomicBool>,
    pub(super) closed: Arc<AtomicBool>,
    pub(super) feed: mpsc::Sender<Notification>,
    /// This node's id, which owns the shards its jobs' fences name.
    pub(super) node: Option<String>,
    /// Where what is committed to the trees written once is kept for this node's readers.
    pub(super) kept: Arc<super::kept::Kept>,
}

impl WriterTask {
    pub(super) async fn run(self) {
        let WriterTask { config, conn, sql, mut jobs, generations, healthy, closed, feed, node, kept } = self;
        let lane = |conn| Lane {
            config: config.clone(),
            conn,
            sql: sql.clone(),
            generations: generations.clone(),
            healthy: healthy.clone(),
            feed: feed.clone(),
            node: node.clone(),
            kept: kept.clone(),
            in_doubt: None,
        };
        // The spare lanes connect when first used; `pop` takes the first lane, connected at open, first.
        let mut idle: Vec<Lane> = (1..LANES).map(|_| lane(None)).collect();
        idle.push(lane(conn));
        let mut held: VecDeque<Job> = VecDeque::new();
        let mut flights = FuturesUnordered::new();
        // Each batch in flight, with the merchants it writes for: their later changes wait until it lands.
        // `None` for a batch with a job of no merchant, which nothing is written beside. A spare lane
        // connecting is in flight too, but no batch: the writer works on without it.
        let mut flying: Vec<(u64, Option<BTreeSet<Vec<u8>>>)> = Vec::new();
        // When a spare lane last tried to connect, so that a database refusing connections is asked again
        // only every [`PROBE_EVERY`].
        let mut connect_tried: Option<Instant> = None;
        let mut next_flight = 0u64;
        // A batch beside the one in flight found nothing to take (the jobs held were of its merchants, or the
        // first was of no merchant): the writer then waits for a batch to land, so that a queue of one
        // merchant's changes is not searched again and again.
        let mut tried_beside = false;
        // The last batch started held at least [`SPILL_AT`] jobs: the writer is behind, and while it commits
        // it looks whether a second batch can be written beside it. Under a light load it never does, and
        // nothing wakes it during a commit.
        let mut behind = false;
        let mut closing = false;
        let mut senders_gone = false;
        loop {
            while !closing {
                if !senders_gone {
                    take_queued(&mut jobs, &mut held);
                }
                let beside = !flying.is_empty();
                if held.is_empty() || (beside && (held.len() < SPILL_AT || tried_beside)) {
                    break;
                }
                let busy = if beside {
                    match beside_of(&flying) {
                        Some(busy) => Some(busy),
                        None => break,
                    }
                } else {
                    None
                };
                // A batch goes to a connected lane when there is one; one beside only to a connected lane, so
                // that a connection the database refuses fails no batch the first lane could have written.
                let connected = idle.iter().rposition(Lane::connected);
                let at = match (connected, beside) {
                    (Some(at), _) => at,
                    (None, false) => idle.len().saturating_sub(1),
                    (None, true) => {
                        if connect_tried.is_none_or(|at| at.elapsed() >= PROBE_EVERY) {
                            if let Some(lane) = idle.pop() {
                                connect_tried = Some(Instant::now());
                                let id = next_flight;
                                next_flight += 1;
                                flights.push(fly(lane, Work::Connect, id));
                            }
                        }
                        break;
                    }
                };
                if at >= idle.len() {
                    break;
                }
                let lane = idle.swap_remove(at);
                let batch = match &busy {
                    Some(busy) => take_beside(&mut held, busy),
                    None => take_in_order(&mut held),
                };
                if batch.is_empty() {
                    tried_beside = true;
                    idle.push(lane);
                    break;
                }
                closing = batch.last().is_some_and(|j| j.close);
                behind = batch.len() >= SPILL_AT;
                let id = next_flight;
                next_flight += 1;
                flying.push((id, merchants_of(&batch)));
                flights.push(fly(lane, Work::Batch(batch), id));
            }
            if (closing || senders_gone) && flights.is_empty() && (closing || held.is_empty()) {
                break;
            }
            tokio::select! {
                Some((id, lane)) = flights.next(), if !flights.is_empty() => {
                    flying.retain(|(flight, _)| *flight != id);
                    idle.push(lane);
                    tried_beside = false;
                }
                // With no batch in flight, each job is written as soon as it comes.
                job = jobs.recv(), if !closing && !senders_gone && held.len() < MAX_HELD && flying.is_empty() => {
                    match job {
                        Some(job) => held.push_back(job),
                        None => senders_gone = true,
                    }
                }
                // With a batch in flight, a lane free and the writer behind, the queue is looked at now and then
                // (above) rather than on every job.
                () = tokio::time::sleep(SPILL_CHECK), if behind && !tried_beside && !closing && !senders_gone
                    && !flying.is_empty() && !idle.is_empty() => {}
                () = tokio::time::sleep(PROBE_EVERY),
                    if !healthy.load(Ordering::Acquire) && flights.is_empty() && held.is_empty() =>
                {
                    if let Some(lane) = idle.last_mut() {
                        lane.probe().await;
                    }
                }
                else => break,
            }
        }
        if closing {
            closed.store(true, Ordering::Release);
        }
        jobs.close();
        // Jobs queued after the close are refused.
        for job in held.drain(..) {
            let _ = job.done.send(Err(StoreError::Closed));
        }
        while let Ok(job) = jobs.try_recv() {
            let _ = job.done.send(Err(StoreError::Closed));
        }
    }
}

/// What a lane does in flight.
enum Work {
    Batch(Vec<Job>),
    /// Connects a spare lane before a batch is written beside another on it.
    Connect,
}

/// Runs `work` on `lane` and hands the lane back with the flight's number.
async fn fly(mut lane: Lane, work: Work, id: u64) -> (u64, Lane) {
    match work {
        Work::Batch(batch) => lane.commit_batch(batch).await,
        Work::Connect => {
            // A failed connection is tried again later; the batches wait for the connected lane meanwhile.
            let connect = Conn::ensure(&mut lane.conn, &lane.config);
            if let Ok(Err(e)) = tokio::time::timeout(QUERY_TIMEOUT, connect).await {
                tracing::warn!(error = %e, "could not open a second writing connection to PostgreSQL");
            }
        }
    }
    (id, lane)
}

/// Moves what waits in the queue to `held`, up to [`MAX_HELD`].
fn take_queued(jobs: &mut mpsc::Receiver<Job>, held: &mut VecDeque<Job>) {
    while held.len() < MAX_HELD {
        match jobs.try_recv() {
            Ok(job) => held.push_back(job),
            Err(_) => break,
        }
    }
}

/// The merchant a job is a change of: the owner of its journal event. Other jobs (a webhook's outcome, an
/// account, a sweep's deletions) and the close have none, and are committed in order with every other job.
fn merchant_of_job(job: &Job) -> Option<&[u8]> {
    if job.close {
        return None;
    }
    job.ops.iter().find_map(|op| match op.set() {
        Some((JOURNAL, key, _)) => key.get(..MERCHANT_ID_LEN),
        _ => None,
    })
}

/// The merchants a batch writes for; `None` when it holds a job of no merchant.
fn merchants_of(batch: &[Job]) -> Option<BTreeSet<Vec<u8>>> {
    batch.iter().map(|job| merchant_of_job(job).map(<[u8]>::to_vec)).collect()
}

/// The merchants whose changes may not be written beside the batches in flight; `None` when nothing may be
/// (one of them holds a job of no merchant).
fn beside_of(flying: &[(u64, Option<BTreeSet<Vec<u8>>>)]) -> Option<BTreeSet<&[u8]>> {
    let mut busy = BTreeSet::new();
    for (_, merchants) in flying {
        busy.extend(merchants.as_ref()?.iter().map(Vec::as_slice));
    }
    Some(busy)
}

/// The next batch when nothing is in flight: the jobs in queue order, up to [`MAX_BATCH_JOBS`] and the close.
fn take_in_order(held: &mut VecDeque<Job>) -> Vec<Job> {
    let mut batch = Vec::new();
    while batch.len() < MAX_BATCH_JOBS {
        let Some(job) = held.pop_front() else { break };
        let close = job.close;
        batch.push(job);
        if close {
            break;
        }
    }
    batch
}

/// A batch to commit beside those in flight: the changes of merchants none of them writes for, in queue order,
/// up to the first job that belongs to no merchant (it waits for everything before it, and everything after it
/// waits for it). A merchant with a change in flight keeps its next ones waiting, so its changes still commit
/// in the order its actor queued them, and never in two transactions at once.
fn take_beside(held: &mut VecDeque<Job>, busy: &BTreeSet<&[u8]>) -> Vec<Job> {
    let mut batch = Vec::new();
    let mut waiting = VecDeque::with_capacity(held.len());
    while let Some(job) = held.pop_front() {
        match merchant_of_job(&job) {
            None => {
                waiting.push_back(job);
                break;
            }
            Some(merchant) if busy.contains(merchant) || batch.len() == MAX_BATCH_JOBS => waiting.push_back(job),
            Some(_) => batch.push(job),
        }
    }
    waiting.append(held);
    *held = waiting;
    batch
}

/// One writing connection and what a commit on it updates. A writer has [`LANES`] of them: a batch commits on
/// one while the next may be written on another.
struct Lane {
    config: super::tls::Endpoint,
    conn: Option<Conn>,
    sql: Arc<Vec<TreeSql>>,
    generations: Arc<Vec<AtomicU64>>,
    healthy: Arc<AtomicBool>,
    feed: mpsc::Sender<Notification>,
    node: Option<String>,
    kept: Arc<super::kept::Kept>,
    /// The transaction whose `COMMIT` was last sent on this lane's connection and has not been answered: set
    /// just before the `COMMIT` goes and cleared once it is answered, so it outlives a commit cut short by the
    /// writer's time-out.
    in_doubt: Option<InDoubt>,
}

impl Lane {
    fn connected(&self) -> bool {
        self.conn.as_ref().is_some_and(|c| !c.is_closed())
    }

    async fn probe(&mut self) {
        let probe = async {
            match Conn::ensure(&mut self.conn, &self.config).await {
                Ok(conn) => conn.client.simple_query("SELECT 1").await.is_ok(),
                Err(_) => false,
            }
        };
        // A silent database must not hold the writer: the jobs queued meanwhile wait for it.
        let ok = tokio::time::timeout(QUERY_TIMEOUT, probe).await.unwrap_or(false);
        if ok {
            self.healthy.store(true, Ordering::Release);
        } else {
            self.conn = None;
        }
    }

    async fn commit_batch(&mut self, batch: Vec<Job>) {
        // A job whose actor already saw a write fail is refused: its change may build on the lost one.
        let mut jobs = refuse_guarded(batch);
        // Two jobs of one batch claiming one key for different values: the later one is refused, as it would
        // be in a later batch.
        let mut first_claims: BTreeMap<(usize, Vec<u8>), Vec<u8>> = BTreeMap::new();
        let mut refused = Vec::new();
        for (i, job) in jobs.iter().enumerate() {
            let clash = claims(job).find(|(tree, key, value)| {
                first_claims.get(&(*tree, key.to_vec())).is_some_and(|held| held.as_slice() != *value)
            });
            match clash {
                Some((_, key, _)) => refused.push((i, key.to_vec())),
                None => {
                    for (tree, key, value) in claims(job) {
                        first_claims.entry((tree, key.to_vec())).or_insert_with(|| value.to_vec());
                    }
                }
            }
        }
        for (i, key) in refused.into_iter().rev() {
            refuse_claim(jobs.remove(i), &key);
        }
        // A batch with jobs of a shard that moved is written again without them, a bounded number of times.
        let mut attempts = 0;
        self.in_doubt = None;
        // Keys the batch makes are inserted without a search for a row to update (a third of PostgreSQL's work
        // in the engine bench) until one is found held; the batch is then written with upserts alone.
        let mut create = true;
        let result = loop {
            attempts += 1;
            match tokio::time::timeout(QUERY_TIMEOUT, self.write(&jobs, create)).await {
                Ok(Ok(())) => break Ok(()),
                Ok(Err(Failed::Held(held))) => {
                    // The engine makes no such key: one is worth an operator's look. A journal position held with
                    // another event refuses its merchant's changes in the next round (`Failed::Claimed`).
                    tracing::error!(
                        jobs = jobs.len(),
                        %held,
                        "a key a group commit makes was held already: the batch is written again with upserts"
                    );
                    create = false;
                    // Not counted: it happens once, as nothing is inserted plainly after it.
                    attempts -= 1;
                }
                Ok(Err(Failed::Store(e))) => break Err(e),
                Err(_) => break Err(StoreError::Io("PostgreSQL did not commit in time".into())),
                Ok(Err(Failed::Claimed(taken))) => {
                    // A journal run held with another value: its merchant's changes were decided on a stale view
                    // (a sequence number used twice). They are refused as after a failed write, so that its actor
                    // reloads what the store holds; nothing is written over it.
                    let stale: BTreeSet<&[u8]> = taken
                        .iter()
                        .filter(|(tree, _)| *tree == JOURNAL)
                        .filter_map(|(_, key)| key.get(..MERCHANT_ID_LEN))
                        .collect();
                    let (refused, kept): (Vec<Job>, Vec<Job>) =
                        jobs.into_iter().partition(|j| merchant_of_job(j).is_some_and(|m| stale.contains(m)));
                    if !refused.is_empty() {
                        tracing::error!(
                            jobs = refused.len(),
                            merchants = stale.len(),
                            "refused changes whose journal positions the store holds with other events"
                        );
                    }
                    for job in refused {
                        fail(job, StoreError::Aborted);
                    }
                    let (refused, kept): (Vec<Job>, Vec<Job>) = kept
                        .into_iter()
                        .partition(|j| claims(j).any(|(tree, key, _)| taken.contains(&(tree, key.to_vec()))));
                    for job in refused {
                        let key = claims(&job)
                            .find(|(tree, key, _)| taken.contains(&(*tree, key.to_vec())))
                            .map(|(_, key, _)| key.to_vec())
                            .unwrap_or_default();
                        refuse_claim(job, &key);
                    }
                    jobs = refuse_guarded(kept);
                    // Not counted against the moves of shards: every key found taken was claimed by a job of
                    // this batch (or is a journal run of its merchant), so each such round refuses at least one
                    // job, and the rounds end.
                    attempts -= 1;
                }
                Ok(Err(Failed::Fenced(moved))) => {
                    let (fenced, kept): (Vec<Job>, Vec<Job>) =
                        jobs.into_iter().partition(|j| j.fence.is_some_and(|f| moved.contains(&f)));
                    tracing::warn!(
                        jobs = fenced.len(),
                        shards = moved.len(),
                        "refused the writes of shards this node no longer holds"
                    );
                    for job in fenced {
                        fail(job, StoreError::NotOwner("another node took the merchant's shard".into()));
                    }
                    jobs = refuse_guarded(kept);
                    if attempts == MAX_ATTEMPTS {
                        break Err(StoreError::Io("the shards of a group commit kept moving".into()));
                    }
                }
            }
        };
        let result = match (result, self.in_doubt.take()) {
            (Err(e), Some(doubt)) => {
                // The connection cannot be trusted, and closing it may let the server notice sooner. The writer
                // is unhealthy until the outcome is known: this lane waits for it, up to `RESOLVE_FOR`.
                self.conn = None;
                self.healthy.store(false, Ordering::Release);
                tracing::warn!(
                    error = %e,
                    txid = doubt.txid,
                    jobs = jobs.len(),
                    "the answer to a group commit was lost: asking PostgreSQL what became of it"
                );
                let outcome = resolve(&self.config, &doubt).await;
                if outcome.is_ok() {
                    tracing::info!(txid = doubt.txid, "a group commit whose answer was lost had committed");
                }
                outcome
            }
            (result, _) => result,
        };
        match result {
            Ok(()) => {
                self.healthy.store(true, Ordering::Release);
                let touched: BTreeSet<usize> = jobs.iter().flat_map(|j| j.ops.iter().map(Op::tree)).collect();
                for tree in touched {
                    if let Some(generation) = self.generations.get(tree) {
                        generation.fetch_add(1, Ordering::AcqRel);
                    }
                }
                for (tree, key, value) in jobs.iter().flat_map(|j| &j.ops).filter_map(Op::set) {
                    self.kept.keep(tree, key, value);
                }
                for job in jobs {
                    for notification in job.notify {
                        // A full feed is fine: the dispatcher also scans the due index.
                        let _ = self.feed.try_send(notification);
                    }
                    let _ = job.done.send(Ok(()));
                }
            }
            Err(e) => {
                tracing::error!(error = %e, jobs = jobs.len(), "a PostgreSQL group commit failed");
                self.healthy.store(false, Ordering::Release);
                // The connection's state is unknown (a transaction may be open): the next batch opens another.
                self.conn = None;
                for job in jobs {
                    fail(job, e.clone());
                }
            }
        }
    }

    /// One transaction: per table, one insert of the keys the batch makes (`Op::Create`; with `create`
    /// false they are upserted too), one upsert of the other keys set, and one delete of every key removed,
    /// sent together so they pipeline.
    async fn write(&mut self, jobs: &[Job], create: bool) -> Result<(), Failed> {
        // Per tree, each key's last value (`None`: removed), and whether the batch makes it: its first operation
        // in the batch is an `Op::Create`, so no row held it before, whatever the batch does to it after.
        let mut trees: BTreeMap<usize, BTreeMap<&[u8], Slot>> = BTreeMap::new();
        let mut fences: BTreeSet<Fence> = BTreeSet::new();
        // The journal's events, apart: a merchant's consecutive events in the batch become one row per run
        // (`layout::journal_runs`), as the embedded store keeps them, so a busy merchant's events cost the
        // database a row per run rather than per event (a long run is kept compressed, out of line, in a few
        // chunks of PostgreSQL's own). The runs are made by the batch when each of its events is.
        let mut events = TreeMap::new();
        // One journal write that is not an `Op::Create` (none of the engine's) has the whole batch's runs
        // upserted: a run is one row over several events, and this keeps the rule simple.
        let mut events_made = true;
        for job in jobs {
            fences.extend(job.fence);
            for op in &job.ops {
                let made = matches!(op, Op::Create(..));
                let (tree, key, value) = match op {
                    Op::Insert(tree, key, value) | Op::Create(tree, key, value) => (*tree, key, Some(value.as_slice())),
                    Op::Remove(tree, key) => (*tree, key, None),
                };
                if tree == JOURNAL {
                    events_made &= made;
                    events.insert(key.clone(), value.map(<[u8]>::to_vec));
                } else {
                    let keys = trees.entry(tree).or_default();
                    keys.entry(key.as_slice()).and_modify(|entry| entry.0 = value).or_insert((value, made));
                }
            }
        }
        let runs = journal_runs(&events).map_err(Failed::Store)?;
        for (key, entry) in &runs {
            trees.entry(JOURNAL).or_default().insert(key, (entry.as_deref(), events_made));
        }
        if trees.is_empty() {
            return Ok(());
        }
        let node = self.node.clone();
        let sql = self.sql.clone();
        // The row that tells whether this transaction committed, should the answer to its `COMMIT` be lost: a
        // journal run if the batch writes one (no other transaction writes its merchant's journal meanwhile),
        // else any key it sets.
        let witness = trees.get_key_value(&JOURNAL).into_iter().chain(&trees).find_map(|(tree, keys)| {
            let key = keys.iter().find_map(|(key, (value, _))| value.map(|_| key.to_vec()))?;
            Some((sql.get(*tree)?.table.clone(), key))
        });
        let conn = Conn::ensure(&mut self.conn, &self.config).await.map_err(Failed::Store)?;
        let mut columns: Vec<Columns> = Vec::with_capacity(trees.len());
        for (tree, keys) in &trees {
            let mut table = Columns::default();
            // A claimed tree's keys are all claimed: the claim tells which were taken. Once a key the batch makes
            // was found held, its journal runs are claimed too: a run's key held with another value means a
            // sequence number used twice, a change decided on a stale view of its merchant, which must not be
            // written over the event the store holds (see the module's note on what this does not catch).
            let claimed = CLAIMED.contains(tree);
            for (key, (value, made)) in keys {
                match value {
                    Some(value) if claimed || (*made && !create && *tree == JOURNAL) => {
                        table.claimed_keys.push(*key);
                        table.claimed_values.push(*value);
                    }
                    Some(value) if *made && create => {
                        table.made_keys.push(*key);
                        table.made_values.push(*value);
                    }
                    Some(value) => {
                        table.set_keys.push(*key);
                        table.set_values.push(*value);
                    }
                    None => table.removed.push(*key),
                }
            }
            columns.push(table);
        }
        let mut statements = Vec::new();
        for (tree, table) in trees.keys().zip(&columns) {
            let names =
                sql.get(*tree).ok_or_else(|| Failed::Store(StoreError::Corrupt(format!("no tree number {tree}"))))?;
            statements.push(Statements {
                insert: prepare(conn, &table.made_keys, &names.insert).await?,
                claim: prepare(conn, &table.claimed_keys, &names.claim).await?,
                upsert: prepare(conn, &table.set_keys, &names.upsert).await?,
                delete: prepare(conn, &table.removed, &names.delete).await?,
            });
        }
        let identify = conn.statement(IDENTIFY).await.map_err(Failed::Store)?;
        let tx = conn.client.transaction().await.map_err(|e| Failed::Store(db_error("begin a group commit", e)))?;
        // The fences are read first and their rows held shared until the commit: a node taking one of these
        // shards waits for this transaction, and one that took it before makes the check fail.
        let (shards, tokens): (Vec<i32>, Vec<i64>) = fences.iter().map(|f| (f.shard as i32, f.token)).unzip();
        let check = async {
            if fences.is_empty() {
                return Ok(Vec::new());
            }
            tx.query(
                "SELECT shard, fence FROM caisse_shards WHERE owner = $1 \
                 AND (shard, fence) IN (SELECT * FROM unnest($2::int[], $3::bigint[])) FOR SHARE",
                &[&node, &shards, &tokens],
            )
            .await
        };
        let (mut inserts, mut writes, mut claims) = (Vec::new(), Vec::new(), Vec::new());
        for ((table, statements), tree) in columns.iter().zip(&statements).zip(trees.keys()) {
            if let Some(insert) = &statements.insert {
                let params: Vec<&(dyn ToSql + Sync)> = vec![&table.made_keys, &table.made_values];
                inserts.push(tx.execute_raw(insert, params));
            }
            if let Some(claim) = &statements.claim {
                let claimed_keys = &table.claimed_keys;
                let params: Vec<&(dyn ToSql + Sync)> = vec![claimed_keys, &table.claimed_values];
                // The keys taken are those the upsert did not return.
                let tx = &tx;
                let claim = async move {
                    let rows: Vec<tokio_postgres::Row> = tx.query_raw(claim, params).await?.try_collect().await?;
                    let given: BTreeSet<&[u8]> = rows.iter().map(|row| row.get::<_, &[u8]>(0)).collect();
                    Ok::<_, tokio_postgres::Error>(
                        claimed_keys
                            .iter()
                            .filter(|k| !given.contains(**k))
                            .map(|k| (*tree, k.to_vec()))
                            .collect::<Vec<_>>(),
                    )
                };
                claims.push(claim);
            }
            if let Some(upsert) = &statements.upsert {
                let params: Vec<&(dyn ToSql + Sync)> = vec![&table.set_keys, &table.set_values];
                writes.push(tx.execute_raw(upsert, params));
            }
            if let Some(delete) = &statements.delete {
                let params: Vec<&(dyn ToSql + Sync)> = vec![&table.removed];
                writes.push(tx.execute_raw(delete, params));
            }
        }
        // Merchant accounts, keys and suspensions are cached by every node (`Accounts::merchants_generation`):
        // the version tells the others that theirs may be stale.
        let accounts = async {
            if [MERCHANTS, MERCHANT_KEYS, RETIRED_KEYS, MERCHANT_SUSPENSIONS].iter().any(|t| trees.contains_key(t)) {
                tx.execute("UPDATE caisse_accounts_version SET n = n + 1 WHERE id = 1", &[]).await.map(drop)
            } else {
                Ok(())
            }
        };
        let identity = tx.query_one(&identify, &[]);
        let (identity, (held, inserted, written, claimed, accounts)) = futures_util::future::join(
            identity,
            futures_util::future::join5(check, join_all(inserts), try_join_all(writes), try_join_all(claims), accounts),
        )
        .await;
        // A key the batch makes that a row holds all the same fails its insert, and the statements after it
        // fail with the transaction: the batch is written again with upserts, and its journal runs claimed
        // (see the columns above). The engine makes no such key, but a store must not depend on that for its
        // writes to succeed.
        let failed: Vec<tokio_postgres::Error> = inserted.into_iter().filter_map(Result::err).collect();
        if let Some(held) =
            failed.iter().find_map(|e| e.as_db_error().filter(|e| *e.code() == SqlState::UNIQUE_VIOLATION))
        {
            let what = format!("{}: {}", held.table().unwrap_or("?"), held.detail().unwrap_or(held.message()));
            return Err(Failed::Held(what));
        }
        if let Some(e) = failed.into_iter().next() {
            return Err(Failed::Store(db_error("write a group commit's new keys", e)));
        }
        accounts.map_err(|e| Failed::Store(db_error("count a change of merchant accounts", e)))?;
        let held = held.map_err(|e| Failed::Store(db_error("check the shard fences", e)))?;
        written.map_err(|e| Failed::Store(db_error("write a group commit", e)))?;
        let taken: BTreeSet<(usize, Vec<u8>)> = claimed
            .map_err(|e| Failed::Store(db_error("write a group commit's claims", e)))?
            .into_iter()
            .flatten()
            .collect();
        if held.len() != fences.len() {
            let still: BTreeSet<Fence> =
                held.iter().map(|row| Fence { shard: row.get::<_, i32>(0) as u32, token: row.get(1) }).collect();
            // Dropping the transaction rolls it back.
            return Err(Failed::Fenced(fences.difference(&still).copied().collect()));
        }
        if !taken.is_empty() {
            return Err(Failed::Claimed(taken));
        }
        let identity = identity.map_err(|e| Failed::Store(db_error("identify a group commit", e)))?;
        let (txid, pid) = identity
            .try_get::<_, i64>(0)
            .and_then(|txid| Ok((txid, identity.try_get::<_, i32>(1)?)))
            .map_err(|e| Failed::Store(db_error("read a group commit's identity", e)))?;
        // Any failure of the `COMMIT` leaves its outcome to be learnt: even an error the server sends may come
        // after the commit (a session ended while it waits for a synchronous standby).
        self.in_doubt = Some(InDoubt { txid, pid, witness });
        tx.commit().await.map_err(|e| Failed::Store(db_error("commit a group commit", e)))?;
        self.in_doubt = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ids::MerchantId;
    use crate::store::layout::{journal_key, PAYMENTS};

    /// A change of `merchant` (its journal event `seq`), or with `None` a job of no merchant.
    fn job(merchant: Option<&MerchantId>, seq: u64) -> Job {
        let ops = match merchant {
            Some(m) => vec![
                Op::Insert(PAYMENTS, m.as_bytes().to_vec(), vec![1]),
                Op::Create(JOURNAL, journal_key(m, seq), vec![2]),
            ],
            None => vec![Op::Insert(PAYMENTS, b"a webhook's outcome".to_vec(), vec![3])],
        };
        Job { ops, guard: None, notify: Vec::new(), done: oneshot::channel().0, close: false, fence: None }
    }

    /// What each job is, as (merchant or none, sequence number).
    fn names(jobs: &[Job]) -> Vec<(Option<Vec<u8>>, u64)> {
        jobs.iter()
            .map(|j| {
                let seq = j.ops.iter().find_map(|op| match op.set() {
                    Some((JOURNAL, key, _)) => key.get(MERCHANT_ID_LEN..).and_then(|s| s.try_into().ok()),
                    _ => None,
                });
                (merchant_of_job(j).map(<[u8]>::to_vec), seq.map_or(0, u64::from_be_bytes))
            })
            .collect()
    }

    #[test]
    fn a_job_belongs_to_the_merchant_of_its_journal_event() {
        let m = MerchantId::new();
        assert_eq!(merchant_of_job(&job(Some(&m), 1)), Some(m.as_bytes()));
        assert_eq!(merchant_of_job(&job(None, 0)), None);
        let close = Job { close: true, ..job(Some(&m), 2) };
        assert_eq!(merchant_of_job(&close), None, "the close waits for everything");
    }

    #[test]
    fn a_batch_beside_skips_the_merchants_in_flight_keeps_their_order_and_stops_at_a_job_of_no_merchant() {
        let (a, b, c) = (MerchantId::new(), MerchantId::new(), MerchantId::new());
        let mut held: VecDeque<Job> = VecDeque::from(vec![
            job(Some(&a), 1),
            job(Some(&b), 1),
            job(Some(&a), 2),
            job(Some(&c), 1),
            job(Some(&b), 2),
            job(None, 0),
            job(Some(&c), 2),
        ]);
        let busy: BTreeSet<&[u8]> = [a.as_bytes()].into_iter().collect();
        let batch = take_beside(&mut held, &busy);
        let (a, b, c) = (a.as_bytes().to_vec(), b.as_bytes().to_vec(), c.as_bytes().to_vec());
        assert_eq!(names(&batch), vec![(Some(b.clone()), 1), (Some(c.clone()), 1), (Some(b), 2)]);
        // What waits keeps its order: the busy merchant's changes, the job of no merchant, and what follows it.
        let waiting: Vec<Job> = held.into_iter().collect();
        assert_eq!(names(&waiting), vec![(Some(a.clone()), 1), (Some(a), 2), (None, 0), (Some(c), 2)]);
    }

    #[test]
    fn nothing_is_written_beside_a_batch_with_a_job_of_no_merchant() {
        let (a, b) = (MerchantId::new(), MerchantId::new());
        let of_merchants = merchants_of(&[job(Some(&a), 1), job(Some(&b), 1)]);
        assert_eq!(of_merchants.as_ref().map(BTreeSet::len), Some(2));
        // An actor forgetting its old idempotency keys, or a webhook's outcome, may touch what a later change
        // writes: nothing may overtake it.
        let with_one_of_none = merchants_of(&[job(Some(&a), 2), job(None, 0)]);
        assert_eq!(with_one_of_none, None);
        let flying = [(1, of_merchants.clone())];
        let busy = beside_of(&flying).expect("merchants only");
        assert!(busy.contains(a.as_bytes()) && busy.contains(b.as_bytes()));
        assert_eq!(beside_of(&[(1, of_merchants), (2, with_one_of_none)]), None);
        assert_eq!(beside_of(&[]), Some(BTreeSet::new()));
    }

    #[test]
    fn a_batch_beside_takes_at_most_a_batch_and_the_rest_wait_in_order() {
        let merchants: Vec<MerchantId> = (0..MAX_BATCH_JOBS + 3).map(|_| MerchantId::new()).collect();
        let mut held: VecDeque<Job> = merchants.iter().map(|m| job(Some(m), 1)).collect();
        let batch = take_beside(&mut held, &BTreeSet::new());
        assert_eq!(batch.len(), MAX_BATCH_JOBS);
        let rest: Vec<Option<&[u8]>> = held.iter().map(merchant_of_job).collect();
        let expected: Vec<Option<&[u8]>> = merchants[MAX_BATCH_JOBS..].iter().map(|m| Some(m.as_bytes())).collect();
        assert_eq!(rest, expected);
    }

    #[test]
    fn a_batch_in_order_takes_every_job_up_to_the_close() {
        let m = MerchantId::new();
        let close = Job { close: true, ops: Vec::new(), ..job(None, 0) };
        let mut held: VecDeque<Job> = VecDeque::from(vec![job(Some(&m), 1), job(None, 0), close, job(Some(&m), 2)]);
        let batch = take_in_order(&mut held);
        assert_eq!(batch.len(), 3);
        assert!(batch.last().is_some_and(|j| j.close));
        assert_eq!(names(&held.into_iter().collect::<Vec<_>>()), vec![(Some(m.as_bytes().to_vec()), 2)]);
    }
}
