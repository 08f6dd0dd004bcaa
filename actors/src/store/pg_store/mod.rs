//! The PostgreSQL engine ([`PgKv`]): the store's trees as tables of one database, which several nodes share
//! in cluster mode. A change is durable once the transaction holding it has committed, with whatever the
//! database promises for a commit (synchronous replication to a standby is what makes it survive the loss of
//! the primary: docs/cluster.md).
//!
//! `schema` creates and migrates the tables, `conn` holds the connections and the runtime they run on, and
//! `writer` makes each batch of queued changes one transaction (`doubt` learns the outcome of one whose
//! answer was lost). Reads go to the database each time: nothing is cached here, so what one node commits
//! every node reads.

mod cluster;
mod conn;
mod doubt;
mod kept;
mod schema;
mod sessions;
mod tls;
mod writer;

use std::ops::Bound;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use self::cluster::Membership;
pub use self::cluster::{shard_of, NodeIdentity, SHARDS};
use self::conn::{db_error, Bridge, Conn, Readers};
use self::schema::TreeSql;
use self::writer::{Job, WriterTask, QUEUE_CAPACITY, WRITERS};
use super::kv::{Kv, Scan};
use super::kv_store::KvStore;
use super::layout::{merchant_of, JOURNAL, MERCHANTS, TREE_NAMES};
use super::op::Op;
use super::wait_polling;
use super::{AccountLock, BackupReport, FailureLatch, Fence, Placement, StoreError, Ticket};
use crate::domain::ids::MerchantId;
use crate::domain::records::Notification;

/// The cluster store: the roles over PostgreSQL.
pub type PgStore = KvStore<PgKv>;

/// Notifications waiting for the dispatcher beyond this are found by its scan of the due index instead.
const FEED_CAPACITY: usize = 64 * 1024;

/// How long taking a merchant's account lock waits for another node's change to end.
const ACCOUNT_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The advisory lock key of a merchant's account: 64 bits of a digest of its id under a prefix of its own.
/// Another key of the same 64 bits (another merchant's, or the migrations' lock) is a chance of one in 2^64,
/// and would only make the two wait for each other.
fn account_lock_key(merchant: &MerchantId) -> i64 {
    use sha2::Digest;
    let digest =
        sha2::Sha256::new().chain_update(b"caisse account lock\0").chain_update(merchant.as_bytes()).finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

/// Rows one page of a range scan reads at most.
const SCAN_PAGE: i64 = 256;

/// Rows the first page of a scan of the journal reads: each next page reads twice as many, up to
/// [`SCAN_PAGE`]. A journal row may hold a run of up to 256 events, and many reads want one event (the
/// dashboard's history looks events up one at a time), so such a scan starts small; one that reads on (a
/// recovery, an audit) soon reads full pages. Other trees hold one record per row and start at full pages.
const FIRST_JOURNAL_PAGE: i64 = 4;

pub struct PgKv {
    inner: Arc<Inner>,
    /// What this node read or committed of the trees written once.
    kept: Arc<kept::Kept>,
    /// The group-commit writers' queues: a merchant's changes always go to the same one ([`PgKv::writer_of`]).
    writers: Vec<mpsc::Sender<Job>>,
    generations: Arc<Vec<AtomicU64>>,
    /// Each writer's health: the store is healthy while every writer's last commit succeeded.
    healthy: Vec<Arc<AtomicBool>>,
    closed: Arc<AtomicBool>,
    /// This node's place in the cluster, for a store opened as a node ([`PgStore::open_node`]).
    node: Option<Arc<Membership>>,
}

impl Drop for PgKv {
    fn drop(&mut self) {
        if let Some(node) = &self.node {
            node.stop();
        }
    }
}

/// What reads need, shared with the scans they hand out.
struct Inner {
    // Declared first so it drops first: the runtime goes before the connections it drives.
    bridge: Bridge,
    readers: Readers,
    sql: Arc<Vec<TreeSql>>,
}

impl PgStore {
    /// Connects to the database at `url` (a `postgres://` URL or a libpq key-value string), creates or migrates
    /// its schema and starts the writers, as a client that holds no shard: for the merchant commands and
    /// tools, which write accounts but never for a merchant's actor. Does not audit: call
    /// [`Audit::audit`](crate::store::Audit::audit).
    pub fn open(url: &str) -> Result<PgStore, StoreError> {
        PgStore::start(url, None)
    }

    /// [`PgStore::open`] as a node of the cluster: once it [joins](PgStore::join), it takes its share of the
    /// shards, writes for the merchants of those only, with their fencing tokens, and says where every other
    /// merchant's writes go ([`Commits::placement`](crate::store::Commits::placement)). Until then it holds
    /// nothing.
    pub fn open_node(url: &str, me: NodeIdentity) -> Result<PgStore, StoreError> {
        PgStore::start(url, Some(me))
    }

    /// Starts taking part in the placement and waits for the first round (a lone node then holds every
    /// shard). Called once the node can serve (its startup audit passed): a node holding shards it cannot
    /// serve yet would only make the others' forwarded requests fail. A second call changes nothing.
    pub fn join(&self) -> Result<(), StoreError> {
        let Some(node) = &self.kv.node else { return Ok(()) };
        if node.start() {
            self.kv.inner.bridge.handle()?.spawn(node.clone().run());
        }
        // A node that answers before its first round would forward everything for a moment.
        node.wait_first_round(cluster::RENEW_EVERY * 2);
        Ok(())
    }

    /// The secret the nodes of the cluster authenticate each other's forwarded messages with: made by the
    /// first node that asks (random, 256 bits), then read from the database by every other.
    pub fn cluster_secret(&self) -> Result<String, StoreError> {
        use rand::RngCore;
        let mut bytes = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut bytes);
        let candidate = hex::encode(bytes);
        let inner = self.kv.inner.clone();
        self.kv.inner.bridge.run(async move {
            let conn = inner.readers.conn().await?;
            conn.client
                .execute(
                    "INSERT INTO caisse_cluster (id, secret) VALUES (1, $1) ON CONFLICT (id) DO NOTHING",
                    &[&candidate],
                )
                .await
                .map_err(|e| db_error("make the cluster's secret", e))?;
            let row = conn
                .client
                .query_one("SELECT secret FROM caisse_cluster WHERE id = 1", &[])
                .await
                .map_err(|e| db_error("read the cluster's secret", e))?;
            row.try_get(0).map_err(|e| db_error("read the cluster's secret", e))
        })
    }

    /// How many shards this node holds now (none for a store opened as a client).
    pub fn shards_held(&self) -> usize {
        self.kv.node.as_ref().map_or(0, |n| n.held_count())
    }

    fn start(url: &str, me: Option<NodeIdentity>) -> Result<PgStore, StoreError> {
        let config = tls::Endpoint::parse(url)?;
        let bridge = Bridge::new()?;
        // Every writer's connection is opened here, the first running the migrations: a node that cannot
        // have them all fails to start, rather than start healthy and fail its merchants' first writes.
        let writer_conns = {
            let config = config.clone();
            bridge.run(async move {
                let mut first = Conn::open(&config).await?;
                schema::migrate(&mut first).await?;
                let mut conns = vec![first];
                while conns.len() < WRITERS {
                    conns.push(Conn::open(&config).await?);
                }
                Ok(conns)
            })?
        };
        let sql = Arc::new(schema::tree_sql());
        let generations: Arc<Vec<AtomicU64>> = Arc::new(TREE_NAMES.iter().map(|_| AtomicU64::new(0)).collect());
        let closed = Arc::new(AtomicBool::new(false));
        let (feed_tx, feed_rx) = mpsc::channel(FEED_CAPACITY);
        let kept = Arc::new(kept::Kept::new());
        let (mut writers, mut healthy) = (Vec::with_capacity(WRITERS), Vec::with_capacity(WRITERS));
        for conn in writer_conns {
            let (jobs_tx, jobs_rx) = mpsc::channel(QUEUE_CAPACITY);
            let writer_healthy = Arc::new(AtomicBool::new(true));
            let task = WriterTask {
                kept: kept.clone(),
                config: config.clone(),
                conn: Some(conn),
                sql: sql.clone(),
                jobs: jobs_rx,
                generations: generations.clone(),
                healthy: writer_healthy.clone(),
                closed: closed.clone(),
                feed: feed_tx.clone(),
                node: me.as_ref().map(|me| me.id.clone()),
            };
            bridge.handle()?.spawn(task.run());
            writers.push(jobs_tx);
            healthy.push(writer_healthy);
        }
        let node = me.map(|me| Arc::new(Membership::new(me, generations.clone(), config.clone())));
        let inner = Arc::new(Inner { bridge, readers: Readers::new(config), sql });
        let kv = PgKv { inner, kept, writers, generations, healthy, closed, node };
        Ok(PgStore::new(kv, feed_rx))
    }
}

impl PgKv {
    /// The writer a change goes to: by the merchant's shard, so that one merchant's changes, queued by its actor
    /// in decision order, are committed in that order by one connection; a change without a shard (merchant
    /// accounts, written by an operator's command) goes to the first.
    fn writer_of(&self, fence: Option<Fence>) -> &mpsc::Sender<Job> {
        let at = fence.map_or(0, |f| f.shard as usize % self.writers.len());
        &self.writers[at]
    }
}

impl Inner {
    fn sql(&self, tree: usize) -> Result<&TreeSql, StoreError> {
        self.sql.get(tree).ok_or_else(|| StoreError::Corrupt(format!("no tree number {tree}")))
    }

    /// Runs `query` (picked from the tree's statements) with `params` on a reader and returns the rows.
    fn rows(
        self: &Arc<Self>,
        tree: usize,
        query: fn(&TreeSql) -> &String,
        params: Vec<Param>,
    ) -> Result<Vec<tokio_postgres::Row>, StoreError> {
        let inner = self.clone();
        self.bridge.run(async move {
            let conn = inner.readers.conn().await?;
            let statement = conn.statement(query(inner.sql(tree)?)).await?;
            let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = params.iter().map(Param::as_sql).collect();
            conn.client.query(&statement, &refs).await.map_err(|e| db_error(TREE_NAMES[tree], e))
        })
    }
}

/// A query parameter owned by the query's future.
enum Param {
    Bytes(Vec<u8>),
    Int(i64),
}

impl Param {
    fn as_sql(&self) -> &(dyn tokio_postgres::types::ToSql + Sync) {
        match self {
            Param::Bytes(bytes) => bytes,
            Param::Int(n) => n,
        }
    }
}

fn column(row: &tokio_postgres::Row, at: usize, tree: usize) -> Result<Vec<u8>, StoreError> {
    row.try_get::<_, Vec<u8>>(at).map_err(|e| StoreError::Corrupt(format!("{}: {e}", TREE_NAMES[tree])))
}

impl Kv for PgKv {
    fn raw(&self, tree: usize, key: &[u8]) -> Result<Option<sled::IVec>, StoreError> {
        if let Some(value) = self.kept.get(tree, key) {
            return Ok(Some(value));
        }
        let rows = self.inner.rows(tree, |s| &s.get, vec![Param::Bytes(key.to_vec())])?;
        let value = rows.first().map(|row| column(row, 0, tree).map(sled::IVec::from)).transpose()?;
        if let Some(value) = &value {
            self.kept.keep(tree, key, value);
        }
        Ok(value)
    }

    fn scan(&self, tree: usize, start: Bound<&[u8]>, end: Bound<&[u8]>, reverse: bool) -> Result<Scan, StoreError> {
        // Bounds as the statements take them: a least key included, a greatest excluded. The least key after
        // `k` is `k` followed by a zero byte.
        let after = |key: &[u8]| {
            let mut next = key.to_vec();
            next.push(0);
            next
        };
        let low = match start {
            Bound::Included(key) => key.to_vec(),
            Bound::Excluded(key) => after(key),
            Bound::Unbounded => Vec::new(),
        };
        let high = match end {
            Bound::Included(key) => Some(after(key)),
            Bound::Excluded(key) => Some(key.to_vec()),
            Bound::Unbounded => None,
        };
        Ok(Box::new(PgScan {
            inner: self.inner.clone(),
            tree,
            low,
            high,
            reverse,
            page: Vec::new(),
            rows: if tree == JOURNAL { FIRST_JOURNAL_PAGE } else { SCAN_PAGE },
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
        if guard.is_some_and(|g| g.load(Ordering::Acquire)) {
            return Err(StoreError::Aborted);
        }
        if self.closed.load(Ordering::Acquire) {
            return Err(StoreError::Closed);
        }
        // A node writes for a merchant's actor (the writes that carry a guard) only under the shard's token.
        if self.node.is_some() && guard.is_some() && fence.is_none() {
            return Err(StoreError::NotOwner("a merchant's change without its shard's token".into()));
        }
        let (done, ticket) = oneshot::channel();
        let job = Job { ops, guard: guard.cloned(), notify, done, close: false, fence };
        match self.writer_of(fence).try_send(job) {
            Ok(()) => Ok(ticket),
            Err(mpsc::error::TrySendError::Full(_)) => Err(StoreError::Overloaded),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(StoreError::Closed),
        }
    }

    /// A node claims a merchant while it holds the merchant's shard; a client claims nothing and may not write
    /// for an actor.
    fn claim(&self, merchant: &MerchantId) -> Result<Option<Fence>, StoreError> {
        match &self.node {
            None => Ok(None),
            Some(node) => match node.fence(shard_of(merchant)) {
                Some(fence) => Ok(Some(fence)),
                None => Err(StoreError::NotOwner(format!("{merchant} is not on node {}", node.me.id))),
            },
        }
    }

    fn lock_account(&self, merchant: &MerchantId) -> Result<AccountLock, StoreError> {
        let inner = self.inner.clone();
        let key = account_lock_key(merchant);
        let conn = self.inner.bridge.run(async move {
            let conn = inner.readers.dedicated().await?;
            // The database gives up waiting before the bridge does, with an error that says what happened. And
            // it probes this connection's peer: a node that dies without closing its socket (power cut,
            // partition) loses the session, and so the lock, within about half a minute rather than after the
            // system's two-hour keepalive.
            conn.client
                .batch_execute(&format!(
                    "SET lock_timeout = {}; SET tcp_keepalives_idle = 10; SET tcp_keepalives_interval = 5; \
                     SET tcp_keepalives_count = 3; SET tcp_user_timeout = 30000",
                    ACCOUNT_LOCK_WAIT.as_millis()
                ))
                .await
                .map_err(|e| db_error("set the account lock's session", e))?;
            conn.client
                .execute("SELECT pg_advisory_lock($1)", &[&key])
                .await
                .map_err(|e| db_error("lock a merchant's account", e))?;
            Ok(conn)
        })?;
        // A session-level lock ends with its session: dropping the connection closes it, which releases the
        // lock on the database's side, and so does the death of this process.
        Ok(AccountLock::holding(conn))
    }

    fn placement(&self, merchant: &MerchantId) -> Placement {
        match &self.node {
            None => Placement::Here,
            Some(node) => node.placement(merchant),
        }
    }

    fn takeovers(&self) -> u64 {
        self.node.as_ref().map_or(0, |node| node.takeovers())
    }

    fn fence_of(&self, merchant: &MerchantId) -> Option<Fence> {
        self.node.as_ref().and_then(|node| node.fence(shard_of(merchant)))
    }

    fn generation(&self, tree: usize) -> u64 {
        let Some(generation) = self.generations.get(tree) else { return 0 };
        // A node that has not read the accounts' version lately counts every look at the accounts as a new
        // generation: its caches read the database again (and fail while it is out of reach).
        if tree == MERCHANTS && self.node.as_ref().is_some_and(|node| !node.accounts_fresh()) {
            return generation.fetch_add(1, Ordering::AcqRel).wrapping_add(1);
        }
        generation.load(Ordering::Acquire)
    }

    fn count(&self, tree: usize) -> Result<u64, StoreError> {
        let rows = self.inner.rows(tree, |s| &s.count, Vec::new())?;
        let count: i64 = rows
            .first()
            .and_then(|row| row.try_get(0).ok())
            .ok_or_else(|| StoreError::Corrupt(format!("{}: no count", TREE_NAMES[tree])))?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    fn merchants(&self, tree: usize) -> Result<Vec<MerchantId>, StoreError> {
        let rows = self.inner.rows(tree, |s| &s.merchants, Vec::new())?;
        rows.iter().map(|row| merchant_of(&column(row, 0, tree)?)).collect()
    }

    /// Commits what is queued, then refuses later writes. The database holds everything committed: nothing
    /// is left to replay at the next open.
    fn close(&self) -> Result<(), StoreError> {
        let handle = self.inner.bridge.handle()?.clone();
        let mut tickets = Vec::with_capacity(self.writers.len());
        for jobs in &self.writers {
            let (done, ticket) = oneshot::channel();
            let job = Job { ops: Vec::new(), guard: None, notify: Vec::new(), done, close: true, fence: None };
            // Waits for room: what is queued before the close is committed first.
            let jobs = jobs.clone();
            handle.spawn(async move {
                if let Err(mpsc::error::SendError(job)) = jobs.send(job).await {
                    let _ = job.done.send(Err(StoreError::Closed));
                }
            });
            tickets.push(ticket);
        }
        let mut closed = Ok(());
        for ticket in tickets {
            let this = match wait_polling(ticket, None) {
                Err(StoreError::Closed) if self.closed.load(Ordering::Acquire) => Ok(()),
                other => other,
            };
            closed = closed.and(this);
        }
        // Once everything queued is committed, the shards go back, so the next holders read it all.
        if let Some(node) = &self.node {
            // A round in progress, then the giving back, each bounded by two rounds.
            node.leave(cluster::RENEW_EVERY * 5);
        }
        closed
    }

    /// Every writer's last commit succeeded, and a node's rounds reach the database: a node that writes
    /// nothing (idle, or only reading) while cut off from it is unhealthy once its leases may have run out.
    fn healthy(&self) -> bool {
        self.healthy.iter().all(|writer| writer.load(Ordering::Acquire))
            && self.node.as_ref().is_none_or(|node| node.in_touch())
    }

    fn backup(&self, _to: &Path) -> Result<BackupReport, StoreError> {
        Err(StoreError::Conflict(
            "a PostgreSQL store is backed up with PostgreSQL's own tools (pg_dump, or base backups with WAL \
             archiving); see docs/cluster.md"
                .into(),
        ))
    }
}

/// A range scan read a page at a time, each page a query from where the last one stopped.
struct PgScan {
    inner: Arc<Inner>,
    tree: usize,
    /// The least key still to read (included).
    low: Vec<u8>,
    /// The key past the last still to read (excluded), when there is one.
    high: Option<Vec<u8>>,
    reverse: bool,
    /// The page being handed out, reversed so that `pop` gives the next item.
    page: Vec<(sled::IVec, sled::IVec)>,
    /// Rows the next page reads.
    rows: i64,
    done: bool,
}

impl PgScan {
    fn fetch(&mut self) -> Result<(), StoreError> {
        let mut params = vec![Param::Bytes(self.low.clone())];
        if let Some(high) = &self.high {
            params.push(Param::Bytes(high.clone()));
        }
        params.push(Param::Int(self.rows));
        let query: fn(&TreeSql) -> &String = match (self.reverse, self.high.is_some()) {
            (false, false) => |s| &s.forward,
            (false, true) => |s| &s.forward_to,
            (true, false) => |s| &s.reverse,
            (true, true) => |s| &s.reverse_to,
        };
        let rows = self.inner.rows(self.tree, query, params)?;
        self.done = (rows.len() as i64) < self.rows;
        self.rows = (self.rows * 2).min(SCAN_PAGE);
        let mut page = Vec::with_capacity(rows.len());
        for row in &rows {
            page.push((sled::IVec::from(column(row, 0, self.tree)?), sled::IVec::from(column(row, 1, self.tree)?)));
        }
        if let Some((last, _)) = page.last() {
            if self.reverse {
                self.high = Some(last.to_vec());
            } else {
                self.low = last.to_vec();
                self.low.push(0);
            }
        }
        page.reverse();
        self.page = page;
        Ok(())
    }
}

impl Iterator for PgScan {
    type Item = Result<(sled::IVec, sled::IVec), StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.page.is_empty() && !self.done {
            if let Err(e) = self.fetch() {
                self.done = true;
                return Some(Err(e));
            }
        }
        self.page.pop().map(Ok)
    }
}
