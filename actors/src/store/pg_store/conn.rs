//! Connections to PostgreSQL and the runtime they live on.
//!
//! The store's callers are synchronous (the roles' methods return values, as sled's reads do) and run on
//! actix's arbiters, each a runtime of its own. A connection is a task on one runtime and must not be shared
//! with another, so the store owns one multi-threaded runtime ([`Bridge`]) for all its connections: a caller
//! hands it a future and waits for the answer on a channel, from any thread, bounded by [`QUERY_TIMEOUT`].
//!
//! A [`Conn`] keeps the statements it prepared, so a query is one round trip after its first use. Readers
//! share a few connections ([`Readers`]): tokio-postgres pipelines the queries of concurrent callers on one
//! connection, so a pool would add little. A connection found closed is replaced on its next use.
//!
//! A connection can also go silent without closing: a network partition, or a database server that hangs,
//! leaves the socket open and the queries unanswered for as long as TCP keepalives take to notice (minutes).
//! So a connection used by a call that timed out is treated as broken: it is replaced on its next use, and
//! its task and socket are dropped with its last user. A reconnection is bounded as a whole (the TCP connect
//! and the start-up exchange), so a node cut off from the database keeps trying and rejoins once it is back.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_postgres::{Client, NoTls, Statement};

use super::tls::Endpoint;

use crate::store::StoreError;

/// The longest one query (or one attempt at a group commit: a batch whose shards moved, or that met a key it
/// makes already held, is written again) may take before the caller is told it failed.
pub(super) const QUERY_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the server keeps a transaction open with no statement from its client (the `COMMIT` included)
/// before it ends it, rolled back, with its session: a client that stopped waiting leaves no transaction
/// behind holding its locks, or able to commit much later.
pub(super) const IDLE_IN_TRANSACTION: Duration = Duration::from_secs(QUERY_TIMEOUT.as_secs() + 10);

/// How long a new connection may take to open, start-up exchange included.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

tokio::task_local! {
    /// The reader connections a call of [`Bridge::run`] used, to be marked broken if it times out.
    static USED: Arc<Mutex<Vec<Arc<Conn>>>>;
}

/// Connections shared by readers.
const READERS: usize = 2;

pub(super) fn db_error(context: &str, e: tokio_postgres::Error) -> StoreError {
    // The database's own message (a constraint, a lost connection) says more than the driver's summary.
    match e.as_db_error() {
        Some(db) => StoreError::Io(format!("{context}: {} ({})", db.message(), db.code().code())),
        None => StoreError::Io(format!("{context}: {e}")),
    }
}

/// The runtime every connection of one store runs on.
pub(super) struct Bridge {
    runtime: Option<tokio::runtime::Runtime>,
}

impl Bridge {
    pub(super) fn new() -> Result<Bridge, StoreError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("caisse-postgres")
            .enable_all()
            .build()
            .map_err(|e| StoreError::Io(format!("start the PostgreSQL runtime: {e}")))?;
        Ok(Bridge { runtime: Some(runtime) })
    }

    pub(super) fn handle(&self) -> Result<&tokio::runtime::Handle, StoreError> {
        self.runtime.as_ref().map(|r| r.handle()).ok_or(StoreError::Closed)
    }

    /// Runs `work` on the store's runtime and waits for its answer, at most [`QUERY_TIMEOUT`]. Blocks the
    /// calling thread, which may be any thread but one of this runtime's.
    pub(super) fn run<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let (answer, wait) = std::sync::mpsc::sync_channel(1);
        self.handle()?.spawn(async move {
            let used = Arc::new(Mutex::new(Vec::new()));
            let result = match tokio::time::timeout(QUERY_TIMEOUT, USED.scope(used.clone(), work)).await {
                Ok(result) => result,
                Err(_) => {
                    // Whatever it waited for, it may wait forever: the connections it used are not trusted again.
                    for conn in used.lock().map(|mut used| std::mem::take(&mut *used)).unwrap_or_default() {
                        conn.set_broken();
                    }
                    Err(StoreError::Io("PostgreSQL did not answer in time".into()))
                }
            };
            // The caller may have stopped waiting; nothing to do then.
            let _ = answer.send(result);
        });
        wait.recv().map_err(|_| StoreError::Closed)?
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        // Dropping a runtime waits for its tasks, which an async context forbids: the store may be dropped on
        // an actix thread. Its connections end with the runtime's threads.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// One connection and the statements it prepared.
pub(super) struct Conn {
    pub(super) client: Client,
    statements: Mutex<HashMap<String, Statement>>,
    /// A call on it timed out: replaced on its next use.
    broken: AtomicBool,
    /// The task driving its socket, stopped when the connection is dropped: a connection waiting on a silent
    /// socket would otherwise keep it open until TCP gives up.
    task: tokio::task::AbortHandle,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Conn {
    /// Opens a connection; must run on the store's runtime, which then drives it.
    pub(super) async fn open(endpoint: &Endpoint) -> Result<Conn, StoreError> {
        let mut config = endpoint.config.clone();
        config
            .connect_timeout(CONNECT_TIMEOUT)
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(15))
            .keepalives_interval(Duration::from_secs(5))
            .keepalives_retries(3);
        if config.get_application_name().is_none() {
            config.application_name("caisse");
        }
        // The server gives up what a client stopped waiting for: a statement past the client's own time-out
        // (whose future was dropped, its connection with it) does not keep running and holding its locks, nor
        // does a transaction left open.
        let options = format!(
            "-c statement_timeout={} -c lock_timeout=5000 -c idle_in_transaction_session_timeout={}",
            (QUERY_TIMEOUT + Duration::from_secs(5)).as_millis(),
            IDLE_IN_TRANSACTION.as_millis()
        );
        let options = match config.get_options() {
            Some(theirs) => format!("{theirs} {options}"),
            None => options,
        };
        config.options(options);
        let late = || StoreError::Io("connect to PostgreSQL: no answer in time".into());
        // The driver tries the hosts of a URL in turn, each within CONNECT_TIMEOUT: so may the whole.
        let hosts = u32::try_from(config.get_hosts().len().max(1)).unwrap_or(u32::MAX);
        let bound = CONNECT_TIMEOUT.saturating_mul(hosts);
        // The two kinds of connection are two types: each is driven by a task of its own.
        let (client, task) = match &endpoint.tls {
            None => {
                let (client, connection) = tokio::time::timeout(bound, config.connect(NoTls))
                    .await
                    .map_err(|_| late())?
                    .map_err(|e| db_error("connect to PostgreSQL", e))?;
                (client, tokio::spawn(drive(connection)).abort_handle())
            }
            Some(tls) => {
                let (client, connection) = tokio::time::timeout(bound, config.connect(tls.clone()))
                    .await
                    .map_err(|_| late())?
                    .map_err(|e| db_error("connect to PostgreSQL over TLS", e))?;
                (client, tokio::spawn(drive(connection)).abort_handle())
            }
        };
        Ok(Conn { client, statements: Mutex::new(HashMap::new()), broken: AtomicBool::new(false), task })
    }

    /// The connection in `slot`, opened first when there is none or the one there is closed.
    pub(super) async fn ensure<'a>(
        slot: &'a mut Option<Conn>,
        endpoint: &Endpoint,
    ) -> Result<&'a mut Conn, StoreError> {
        if slot.as_ref().is_some_and(|c| c.is_closed()) {
            *slot = None;
        }
        if slot.is_none() {
            *slot = Some(Conn::open(endpoint).await?);
        }
        slot.as_mut().ok_or(StoreError::Closed)
    }

    /// `sql` prepared on this connection, once.
    pub(super) async fn statement(&self, sql: &str) -> Result<Statement, StoreError> {
        if let Some(statement) = self.statements.lock().map_err(|_| poisoned())?.get(sql) {
            return Ok(statement.clone());
        }
        let statement = self.client.prepare(sql).await.map_err(|e| db_error("prepare a statement", e))?;
        self.statements.lock().map_err(|_| poisoned())?.insert(sql.to_owned(), statement.clone());
        Ok(statement)
    }

    /// Closed, or not to be trusted since a call on it timed out.
    pub(super) fn is_closed(&self) -> bool {
        self.broken.load(Ordering::Acquire) || self.client.is_closed()
    }

    fn set_broken(&self) {
        self.broken.store(true, Ordering::Release);
    }
}

/// Runs a connection until it ends.
async fn drive<F: Future<Output = Result<(), tokio_postgres::Error>>>(connection: F) {
    if let Err(e) = connection.await {
        tracing::warn!(error = %e, "a PostgreSQL connection ended");
    }
}

fn poisoned() -> StoreError {
    StoreError::Io("a PostgreSQL statement cache was poisoned".into())
}

/// The connections readers share, each opened on first use and replaced once closed.
pub(super) struct Readers {
    endpoint: Endpoint,
    slots: Vec<tokio::sync::Mutex<Option<Arc<Conn>>>>,
    next: std::sync::atomic::AtomicUsize,
}

impl Readers {
    pub(super) fn new(endpoint: Endpoint) -> Readers {
        Readers {
            endpoint,
            slots: (0..READERS).map(|_| tokio::sync::Mutex::new(None)).collect(),
            next: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// A connection of the caller's own, closed when dropped: for a session-level lock, which must live
    /// exactly as long as its holder.
    pub(super) async fn dedicated(&self) -> Result<Conn, StoreError> {
        Conn::open(&self.endpoint).await
    }

    /// A connection to read on, the slots taken in turn.
    pub(super) async fn conn(&self) -> Result<Arc<Conn>, StoreError> {
        let at = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % self.slots.len();
        let mut slot = self.slots[at].lock().await;
        let conn = match slot.as_ref().filter(|c| !c.is_closed()) {
            Some(conn) => conn.clone(),
            None => {
                let conn = Arc::new(Conn::open(&self.endpoint).await?);
                *slot = Some(conn.clone());
                conn
            }
        };
        // Outside a bridged call (none today) there is nothing to mark.
        let _ = USED.try_with(|used| {
            if let Ok(mut used) = used.lock() {
                used.push(conn.clone());
            }
        });
        Ok(conn)
    }
}
