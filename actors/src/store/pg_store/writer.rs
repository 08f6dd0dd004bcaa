//! Group commit on PostgreSQL: a task owns a writing connection and makes each batch of queued jobs one
//! transaction, acknowledged only after `COMMIT` returns.
//!
//! A task takes the first waiting job, then whatever else is already queued up to [`MAX_BATCH_JOBS`], folds
//! their operations into the last value of each key (a key written twice in a batch is written once), joins
//! each merchant's consecutive journal events into runs (one row each, as the embedded store keeps them), and
//! sends one multi-row upsert and one multi-row delete per table touched, pipelined on the connection inside
//! one transaction. There are [`WRITERS`] such tasks, each with its own connection, and a merchant's changes
//! always go to the same one (by shard): jobs commit in queue order, so a merchant's changes (queued by its
//! actor in decision order) land in order; changes of different merchants need no order between them.
//!
//! When a batch fails every job in it fails and their guards are set ([`FailureLatch`]), exactly as with
//! the embedded store. A commit whose answer is lost (the connection dropped while `COMMIT` was in flight) may
//! have committed: its jobs are still reported failed, their actors reload from the database, and a client's
//! retry with the same idempotency key finds the first answer if it was kept. The connection is then replaced;
//! while a writer is unhealthy and idle it checks the database once a second, so health returns with it (the
//! store is healthy while every writer is).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::try_join_all;
use futures_util::TryStreamExt;
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::types::ToSql;

use super::conn::{db_error, Conn, QUERY_TIMEOUT};
use super::schema::TreeSql;
use crate::domain::records::Notification;
use crate::store::layout::{
    journal_runs, CLAIMED, JOURNAL, MERCHANTS, MERCHANT_KEYS, MERCHANT_SUSPENSIONS, RETIRED_KEYS,
};
use crate::store::op::{Op, TreeMap};
use crate::store::{FailureLatch, Fence, StoreError};

/// Jobs one transaction takes at most.
pub(super) const MAX_BATCH_JOBS: usize = 2048;
/// Jobs that may wait for one writer; beyond this, writes to its shards are refused (the API answers 503). A
/// node's writers together hold at most [`WRITERS`] times this.
pub(super) const QUEUE_CAPACITY: usize = 16 * 1024;

/// Writers, each with its own connection and its own share of the shards (a merchant's changes all go to one,
/// so they commit in the order its actor queued them).
///
/// One, measured end to end: two nodes and their database on two cores, 800 lives/s offered, completed 713 to
/// 750 lives/s with one writer, 561 and 590 with two, 507 to 546 with four. Under real traffic a batch holds a
/// few changes, so more writers make more, smaller transactions, and each costs the database and the node
/// their round trips and wake-ups. The engine bench, which keeps 4,096 changes waiting, is the opposite case:
/// over 10,000 merchants four writers took it from 24.4 k events/s to 31.2 k (docs/perf/history.md). Sharing
/// the load only once one writer's queue backs up would serve both; it needs the dispatch to keep a shard with
/// the writer that has its changes in flight.
pub(super) const WRITERS: usize = 1;

/// Transactions one batch may take when shards move under it.
const MAX_ATTEMPTS: u32 = 3;

/// How often an unhealthy, idle writer checks the database.
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// One table's part of a transaction: the keys set, their values, and the keys removed.
type Columns<'a> = (Vec<&'a [u8]>, Vec<&'a [u8]>, Vec<&'a [u8]>);

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

/// Why a transaction was not committed.
enum Failed {
    /// The database or the connection failed.
    Store(StoreError),
    /// These shards are no longer held with the tokens their jobs carry; nothing was written.
    Fenced(BTreeSet<Fence>),
    /// These keys of claimed trees belong to other values in the database; nothing was written.
    Claimed(BTreeSet<(usize, Vec<u8>)>),
}

/// The keys of claimed trees (`layout::CLAIMED`) a job sets, with the values it gives them.
fn claims(job: &Job) -> impl Iterator<Item = (usize, &[u8], &[u8])> {
    job.ops.iter().filter_map(|op| match op {
        Op::Insert(tree, key, value) if CLAIMED.contains(tree) => Some((*tree, key.as_slice(), value.as_slice())),
        _ => None,
    })
}

/// Refuses a job that claimed a key another value holds: nothing of it is written.
fn refuse_claim(job: Job, key: &[u8]) {
    if let Some(guard) = &job.guard {
        guard.store(true, Ordering::Release);
    }
    let _ = job.done.send(Err(StoreError::EmailTaken(String::from_utf8_lossy(key).into_owned())));
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
    pub(super) async fn run(mut self) {
        loop {
            let first = if self.healthy.load(Ordering::Acquire) {
                self.jobs.recv().await
            } else {
                match tokio::time::timeout(PROBE_EVERY, self.jobs.recv()).await {
                    Ok(job) => job,
                    Err(_) => {
                        self.probe().await;
                        continue;
                    }
                }
            };
            let Some(first) = first else { return };
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH_JOBS && !batch.last().is_some_and(|j| j.close) {
                match self.jobs.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            let close = batch.last().is_some_and(|j| j.close);
            self.commit_batch(batch).await;
            if close {
                self.closed.store(true, Ordering::Release);
                self.jobs.close();
                // Jobs queued after the close are refused.
                while let Ok(job) = self.jobs.try_recv() {
                    let _ = job.done.send(Err(StoreError::Closed));
                }
                return;
            }
        }
    }

    async fn probe(&mut self) {
        let probe = async {
            match self.connection().await {
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

    async fn connection(&mut self) -> Result<&mut Conn, StoreError> {
        if self.conn.as_ref().is_some_and(|c| c.is_closed()) {
            self.conn = None;
        }
        if self.conn.is_none() {
            self.conn = Some(Conn::open(&self.config).await?);
        }
        self.conn.as_mut().ok_or(StoreError::Closed)
    }

    async fn commit_batch(&mut self, batch: Vec<Job>) {
        // A job whose actor already saw a write fail is refused: its change may build on the lost one.
        let (aborted, mut jobs): (Vec<Job>, Vec<Job>) =
            batch.into_iter().partition(|j| j.guard.as_ref().is_some_and(|g| g.load(Ordering::Acquire)));
        for job in aborted {
            let _ = job.done.send(Err(StoreError::Aborted));
        }
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
        let result = loop {
            attempts += 1;
            match tokio::time::timeout(QUERY_TIMEOUT, self.write(&jobs)).await {
                Ok(Ok(())) => break Ok(()),
                Ok(Err(Failed::Store(e))) => break Err(e),
                Err(_) => break Err(StoreError::Io("PostgreSQL did not commit in time".into())),
                Ok(Err(Failed::Claimed(taken))) => {
                    let (refused, kept): (Vec<Job>, Vec<Job>) = jobs
                        .into_iter()
                        .partition(|j| claims(j).any(|(tree, key, _)| taken.contains(&(tree, key.to_vec()))));
                    for job in refused {
                        let key = claims(&job)
                            .find(|(tree, key, _)| taken.contains(&(*tree, key.to_vec())))
                            .map(|(_, key, _)| key.to_vec())
                            .unwrap_or_default();
                        refuse_claim(job, &key);
                    }
                    jobs = kept;
                    // Not counted against the moves of shards: every key found taken was claimed by a job of
                    // this batch, so each such round refuses at least one job, and the rounds end.
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
                        if let Some(guard) = &job.guard {
                            guard.store(true, Ordering::Release);
                        }
                        let moved = StoreError::NotOwner("another node took the merchant's shard".into());
                        let _ = job.done.send(Err(moved));
                    }
                    jobs = kept;
                    if attempts == MAX_ATTEMPTS {
                        break Err(StoreError::Io("the shards of a group commit kept moving".into()));
                    }
                }
            }
        };
        match result {
            Ok(()) => {
                self.healthy.store(true, Ordering::Release);
                let touched: BTreeSet<usize> = jobs
                    .iter()
                    .flat_map(|j| {
                        j.ops.iter().map(|op| match op {
                            Op::Insert(tree, ..) | Op::Remove(tree, _) => *tree,
                        })
                    })
                    .collect();
                for tree in touched {
                    if let Some(generation) = self.generations.get(tree) {
                        generation.fetch_add(1, Ordering::AcqRel);
                    }
                }
                for op in jobs.iter().flat_map(|j| &j.ops) {
                    if let Op::Insert(tree, key, value) = op {
                        self.kept.keep(*tree, key, value);
                    }
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
                    if let Some(guard) = &job.guard {
                        guard.store(true, Ordering::Release);
                    }
                    let _ = job.done.send(Err(e.clone()));
                }
            }
        }
    }

    /// One transaction: per table, one upsert of every key set and one delete of every key removed, sent
    /// together so they pipeline.
    async fn write(&mut self, jobs: &[Job]) -> Result<(), Failed> {
        let mut trees: BTreeMap<usize, BTreeMap<&[u8], Option<&[u8]>>> = BTreeMap::new();
        let mut fences: BTreeSet<Fence> = BTreeSet::new();
        // The journal's events, apart: a merchant's consecutive events in the batch become one row per run
        // (`layout::journal_runs`), as the embedded store keeps them, so a busy merchant's events cost the
        // database a row per run rather than per event (a long run is kept compressed, out of line, in a few
        // chunks of PostgreSQL's own).
        let mut events = TreeMap::new();
        for job in jobs {
            fences.extend(job.fence);
            for op in &job.ops {
                match op {
                    Op::Insert(JOURNAL, key, value) => drop(events.insert(key.clone(), Some(value.clone()))),
                    Op::Remove(JOURNAL, key) => drop(events.insert(key.clone(), None)),
                    Op::Insert(tree, key, value) => drop(trees.entry(*tree).or_default().insert(key, Some(value))),
                    Op::Remove(tree, key) => drop(trees.entry(*tree).or_default().insert(key, None)),
                }
            }
        }
        let runs = journal_runs(&events).map_err(Failed::Store)?;
        for (key, entry) in &runs {
            trees.entry(JOURNAL).or_default().insert(key, entry.as_deref());
        }
        if trees.is_empty() {
            return Ok(());
        }
        let node = self.node.clone();
        let sql = self.sql.clone();
        let conn = self.connection().await.map_err(Failed::Store)?;
        let mut statements = Vec::new();
        for tree in trees.keys() {
            let names =
                sql.get(*tree).ok_or_else(|| Failed::Store(StoreError::Corrupt(format!("no tree number {tree}"))))?;
            let upsert = if CLAIMED.contains(tree) { &names.claim } else { &names.upsert };
            let upsert = conn.statement(upsert).await.map_err(Failed::Store)?;
            let delete = conn.statement(&names.delete).await.map_err(Failed::Store)?;
            statements.push((upsert, delete));
        }
        let mut columns: Vec<Columns> = Vec::with_capacity(trees.len());
        for keys in trees.values() {
            let (mut set_keys, mut set_values, mut removed) = (Vec::new(), Vec::new(), Vec::new());
            for (key, value) in keys {
                match value {
                    Some(value) => {
                        set_keys.push(*key);
                        set_values.push(*value);
                    }
                    None => removed.push(*key),
                }
            }
            columns.push((set_keys, set_values, removed));
        }
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
        let (mut writes, mut claims) = (Vec::new(), Vec::new());
        for (((set_keys, set_values, removed), (upsert, delete)), tree) in
            columns.iter().zip(&statements).zip(trees.keys())
        {
            if !set_keys.is_empty() && CLAIMED.contains(tree) {
                let params: Vec<&(dyn ToSql + Sync)> = vec![set_keys, set_values];
                // The keys taken are those the upsert did not return.
                let tx = &tx;
                let claim = async move {
                    let rows: Vec<tokio_postgres::Row> = tx.query_raw(upsert, params).await?.try_collect().await?;
                    let given: BTreeSet<&[u8]> = rows.iter().map(|row| row.get::<_, &[u8]>(0)).collect();
                    Ok::<_, tokio_postgres::Error>(
                        set_keys
                            .iter()
                            .filter(|k| !given.contains(**k))
                            .map(|k| (*tree, k.to_vec()))
                            .collect::<Vec<_>>(),
                    )
                };
                claims.push(claim);
            } else if !set_keys.is_empty() {
                let params: Vec<&(dyn ToSql + Sync)> = vec![set_keys, set_values];
                writes.push(tx.execute_raw(upsert, params));
            }
            if !removed.is_empty() {
                let params: Vec<&(dyn ToSql + Sync)> = vec![removed];
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
        let (held, written, claimed, accounts) =
            futures_util::future::join4(check, try_join_all(writes), try_join_all(claims), accounts).await;
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
        tx.commit().await.map_err(|e| Failed::Store(db_error("commit a group commit", e)))
    }
}
