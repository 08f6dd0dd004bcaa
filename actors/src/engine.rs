//! The engine's front door: opens the store, audits it, starts one Arbiter per shard, and routes each call to
//! the merchant's actor, starting that actor on first use. The service reaches the store only through the
//! methods here: changes through [`Engine::execute`] (the merchant's actor), reads of durable state that need
//! no actor (lists, lookups, the sweeps' index, merchant accounts) directly, and the webhook pool through
//! [`Engine::start_webhooks`].
//!
//! Merchants are spread over the Arbiters by a hash of their id, so one merchant's actor always lives on the
//! same thread while different merchants run in parallel. Calls use `send`, which waits when a mailbox is
//! full: overload slows callers down instead of dropping messages.
//!
//! [`Engine::open`] needs a running actix `System` (actix-web's runtime, `#[actix::test]`, or
//! `actix::System::new().block_on`), because Arbiters belong to one.

use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::{Actor, Addr, Arbiter, MailboxError, Message};

use crate::cluster::{Forwarding, Remote, SharedSessions};
use crate::core::{Command, JournalEvent};
use crate::domain::ids::MerchantId;
use crate::domain::ledger::Balances;
use crate::domain::links::Link;
use crate::domain::provider::{ProviderRoute, ProviderTrail};
use crate::domain::records::{Merchant, Notification, Payment, Payout, Transaction, TransactionType};
use crate::domain::text::IdempotencyKey;
use crate::domain::time::Timestamp;
use crate::error::EngineError;
use crate::merchant::{
    ActorSettings, Execute, Executed, ForgetIdempotency, GetBalances, GetLink, GetPayment, GetPayout, Idempotency,
    MerchantActor, ProviderNote,
};
use crate::metrics::METRICS;
use crate::registry::Registry;
use crate::store::pg_store::NodeIdentity;
use crate::store::sealing::MasterKey;
use crate::store::{
    AuditReport, AuditScope, AwaitingProvider, BackupReport, Located, Page, PgStore, Placement, Store, StoreError,
};
use crate::webhook::delivery::{DeliveryConfig, DeliveryError, WebhookPool};

#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub data_dir: PathBuf,
    /// A PostgreSQL database to keep everything in instead of the embedded store under `data_dir` (cluster mode).
    pub postgres_url: Option<String>,
    /// This node, as the others of the cluster reach it (with `postgres_url`): its id and advertised URL.
    pub node: Option<NodeIdentity>,
    /// Arbiters (threads) the merchant actors are spread over; 0 means one per core.
    pub shards: usize,
    pub actors: ActorSettings,
    /// The embedded store's cache, in bytes.
    pub store_cache_bytes: u64,
    /// Seals the merchants' secret keys at rest (required in production, see the server's settings).
    pub master_key: Option<MasterKey>,
}

impl EngineConfig {
    pub fn new(data_dir: impl Into<PathBuf>) -> EngineConfig {
        EngineConfig {
            data_dir: data_dir.into(),
            postgres_url: None,
            node: None,
            shards: 0,
            actors: ActorSettings::default(),
            store_cache_bytes: crate::store::fjall_store::DEFAULT_CACHE_BYTES,
            master_key: None,
        }
    }
}

#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

/// What an account change ([`Engine::update_merchant`]) does to the secret key it replaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyChange {
    /// The key is not replaced.
    Kept,
    /// The key given stops working in the same write.
    Revoked(String),
    /// The key given keeps working until the time given.
    ValidUntil(String, Timestamp),
}

/// Locks merchant account writes are spread over (see `Inner::account_writes`).
const ACCOUNT_WRITE_LOCKS: usize = 64;

struct Inner {
    store: Arc<dyn Store>,
    registry: Registry<MerchantActor>,
    arbiters: Vec<Arbiter>,
    settings: ActorSettings,
    generations: AtomicU64,
    audit: AuditReport,
    /// The background audits' thread, once started: dropping the sender stops it.
    auditor: std::sync::Mutex<Option<(std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>)>>,
    /// One audit at a time: two would race to move the checkpoints, and share two cores.
    audits: Arc<Audits>,
    /// How to reach the other nodes, when this engine is a node of a cluster.
    forwarding: Option<Forwarding>,
    /// Where the nodes of the cluster keep the dashboard's sessions.
    sessions: Option<Arc<dyn SharedSessions>>,
    /// The cluster's store, until [`Engine::join_cluster`] has it take part in the placement.
    member: std::sync::Mutex<Option<Arc<PgStore>>>,
    /// The accounts every API request looks up.
    accounts: crate::account_cache::AccountCache,
    /// A gate per merchant whose actor is being started ([`Engine::actor`]).
    starting: dashmap::DashMap<MerchantId, Arc<std::sync::Mutex<()>>>,
    /// One is held, picked by the e-mail, while a merchant account is checked and written: the store checks
    /// that the e-mail is free before it queues the write, and this keeps two writes of one e-mail in this
    /// process from both passing that check, while writes of other e-mails still share commits. (The nodes
    /// of a cluster are kept apart by the database itself.)
    account_writes: Vec<tokio::sync::Mutex<()>>,
    /// Held while an account is read, changed and written back ([`Engine::update_merchant`]): account changes
    /// are rare, so one for all merchants is enough in this process. Other processes are kept off by the
    /// store's lock.
    account_updates: tokio::sync::Mutex<()>,
    /// The dispatcher of the first webhook pool started on this engine: where resends go on this node.
    resends: std::sync::OnceLock<actix::Recipient<crate::webhook::Resend>>,
}

/// What the audits share: the lock that runs them one at a time, and the flag that stops one in progress.
#[derive(Default)]
struct Audits {
    one_at_a_time: std::sync::Mutex<()>,
    stop: std::sync::atomic::AtomicBool,
}

/// When the engine audits the ledger in the background ([`Engine::start_audits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditSchedule {
    /// The audit since the checkpoints, which moves them forward so that the audit at the next start, even
    /// after a crash, replays only what was written since; `None`: never.
    pub since_checkpoints_every: Option<Duration>,
    /// The audit of the whole ledger, which also finds an event changed before its checkpoint; `None`: never.
    pub full_every: Option<Duration>,
}

impl Default for AuditSchedule {
    fn default() -> AuditSchedule {
        AuditSchedule {
            since_checkpoints_every: Some(Duration::from_secs(60)),
            full_every: Some(Duration::from_secs(24 * 60 * 60)),
        }
    }
}

/// Stopping the Arbiters drops the actors and with them their handles on the store; joining them (and the
/// background audits) before the store itself is dropped means that when the last `Engine` is gone, the store
/// is closed and its lock free.
impl Drop for Inner {
    fn drop(&mut self) {
        // An audit in progress gives up at its next merchant, so a stop does not wait for a long audit.
        self.audits.stop.store(true, Ordering::Release);
        let auditor = self.auditor.get_mut().map(Option::take).unwrap_or_else(|poisoned| poisoned.into_inner().take());
        if let Some((stop, thread)) = auditor {
            drop(stop);
            if thread.join().is_err() {
                tracing::error!("the background audit thread panicked");
            }
        }
        for arbiter in &self.arbiters {
            arbiter.stop();
        }
        for arbiter in std::mem::take(&mut self.arbiters) {
            if arbiter.join().is_err() {
                tracing::error!("an engine Arbiter panicked while stopping");
            }
        }
    }
}

impl Engine {
    /// Opens the store (PostgreSQL at `config.postgres_url`, else the embedded store under `config.data_dir`),
    /// audits it (refusing to start on any disagreement), and starts the Arbiters.
    pub fn open(config: EngineConfig) -> Result<Engine, EngineError> {
        if let Some(url) = &config.postgres_url {
            let node = config.node.clone().ok_or_else(|| {
                EngineError::Internal("a PostgreSQL store needs this node's id and advertised URL".into())
            })?;
            let store = Arc::new(PgStore::open_node(url, node)?.with_master_key(config.master_key.clone()));
            // An actor waits for the database when it reads a record it does not hold (a round trip, where the embedded
            // store answers from memory): more Arbiters keep the cores busy meanwhile.
            let mut config = config;
            if config.shards == 0 {
                config.shards = 4 * std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
            }
            let forwarding = Forwarding::new(&store.cluster_secret()?);
            let sessions: Arc<dyn SharedSessions> = store.clone();
            let engine = Engine::start(store.clone(), config, Some((forwarding, sessions)))?;
            *engine.inner.member.lock().unwrap_or_else(|p| p.into_inner()) = Some(store);
            return Ok(engine);
        }
        let store = crate::store::open_embedded(&config.data_dir, config.store_cache_bytes, config.master_key.clone())
            .map_err(|e| match e {
                crate::store::StoreError::Locked(text) => EngineError::Unavailable(format!("store locked: {text}")),
                other => EngineError::from(other),
            })?;
        Engine::with_store(store, config)
    }

    /// Starts the engine on any [`Store`] backend, once the audit since the checkpoints has passed: every
    /// balance a merchant would start with agrees with its ledger.
    pub fn with_store(store: Arc<dyn Store>, config: EngineConfig) -> Result<Engine, EngineError> {
        Engine::start(store, config, None)
    }

    fn start(
        store: Arc<dyn Store>,
        config: EngineConfig,
        cluster: Option<(Forwarding, Arc<dyn SharedSessions>)>,
    ) -> Result<Engine, EngineError> {
        let (forwarding, sessions) = cluster.unzip();
        crate::store::sealing::check_opens(store.as_ref())?;
        let audits = Arc::new(Audits::default());
        let audit = run_audit(store.as_ref(), &audits, AuditScope::SinceCheckpoints)
            .map_err(|e| EngineError::Internal(format!("startup audit failed: {e}")))?;
        let shards = match config.shards {
            0 => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2),
            n => n,
        };
        let arbiters = (0..shards).map(|_| Arbiter::new()).collect();
        Ok(Engine {
            inner: Arc::new(Inner {
                store,
                registry: Registry::default(),
                arbiters,
                settings: config.actors,
                generations: AtomicU64::new(1),
                audit,
                auditor: std::sync::Mutex::new(None),
                audits,
                forwarding,
                sessions,
                member: std::sync::Mutex::new(None),
                accounts: Default::default(),
                starting: Default::default(),
                account_writes: (0..ACCOUNT_WRITE_LOCKS).map(|_| tokio::sync::Mutex::new(())).collect(),
                account_updates: tokio::sync::Mutex::new(()),
                resends: std::sync::OnceLock::new(),
            }),
        })
    }

    /// Starts the webhook delivery pool on this engine's outbox. Needs a running actix System; the first
    /// pool takes the store's feed of new notifications (a second one would find them only by its scans), and
    /// the resends asked of this engine ([`Engine::resend_notification`]).
    pub fn start_webhooks(&self, config: DeliveryConfig) -> Result<WebhookPool, DeliveryError> {
        let pool = WebhookPool::start(self.inner.store.clone(), config)?;
        let _ = self.inner.resends.set(pool.resender());
        Ok(pool)
    }

    /// Sends a notification of `merchant` again, starting a new attempt chain (the dashboard's resend), on the
    /// node that delivers the merchant's notifications: in a cluster, another node's resend is forwarded to
    /// it, since only it knows whether the notification is being attempted (an attempt's outcome saved after a
    /// resend would undo the resend). Another merchant's id is [`DeliveryError::NotFound`].
    pub async fn resend_notification(&self, merchant: &MerchantId, id: &str) -> Result<Notification, DeliveryError> {
        use crate::cluster::{Answer, Ask, Forwarded, ResendRefused};
        match self.inner.store.placement(merchant) {
            Placement::Here => self.resend_here(merchant, id).await,
            Placement::Node { id: node, url } => {
                let Some(forwarding) = &self.inner.forwarding else {
                    return Err(DeliveryError::Unavailable(format!("the merchant is held by node {node}")));
                };
                let forwarded = Forwarded { merchant: merchant.clone(), ask: Ask::Resend(id.to_owned()) };
                match forwarding.send(&url, &forwarded).await {
                    Ok(Answer::Resent(Ok(notification))) => Ok(notification),
                    Ok(Answer::Resent(Err(ResendRefused::InFlight))) => Err(DeliveryError::InFlight),
                    Ok(Answer::Resent(Err(ResendRefused::NotFound))) => Err(DeliveryError::NotFound),
                    Ok(_) => Err(DeliveryError::Unavailable(format!("node {node} answered another kind"))),
                    Err(e) => Err(DeliveryError::Unavailable(e.to_string())),
                }
            }
            Placement::Nobody => {
                Err(DeliveryError::Unavailable("the merchant is moving between nodes of the cluster; retry".into()))
            }
        }
    }

    /// A resend on this node's webhook pool.
    async fn resend_here(&self, merchant: &MerchantId, id: &str) -> Result<Notification, DeliveryError> {
        let resends = self.inner.resends.get().ok_or(DeliveryError::Stopped)?;
        resends.send(crate::webhook::Resend::new(merchant, id)).await.map_err(|_| DeliveryError::Stopped)?
    }

    /// Runs the audit of the whole ledger (the startup audit's checks from the first event, on demand).
    /// Blocks for a time that grows with the ledger: call it on a blocking thread.
    /// Answers the store's own error, so a caller can tell a ledger that disagrees ([`StoreError::Corrupt`])
    /// from an audit that could not run.
    pub fn audit(&self) -> Result<AuditReport, StoreError> {
        run_audit(self.inner.store.as_ref(), &self.inner.audits, AuditScope::Full)
    }

    /// Starts auditing in the background on `schedule`, on a thread of its own, until the engine is dropped.
    /// Each audit logs its result and updates the audit metrics; a failure is logged as an error and shown by
    /// `caisse_ledger_audit_failing` (the server keeps running: the next start refuses). A second call
    /// changes nothing.
    pub fn start_audits(&self, schedule: AuditSchedule) {
        let mut auditor = self.inner.auditor.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if auditor.is_some() || (schedule.since_checkpoints_every.is_none() && schedule.full_every.is_none()) {
            return;
        }
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let (store, audits) = (self.inner.store.clone(), self.inner.audits.clone());
        let spawned = std::thread::Builder::new()
            .name("caisse-audit".into())
            .spawn(move || background_audits(store.as_ref(), &audits, schedule, &stopped));
        match spawned {
            Ok(thread) => *auditor = Some((stop, thread)),
            Err(e) => tracing::error!(error = %e, "could not start the background audits"),
        }
    }

    /// Stops writing after making everything written durable in the store's own files, so that the next start
    /// replays nothing: for a server that has stopped serving, while the webhook actors and sweeps may still
    /// hold the engine (their later writes are refused). The background audits stop first. Blocks.
    pub fn close(&self) -> Result<(), EngineError> {
        self.inner.audits.stop.store(true, Ordering::Release);
        Ok(self.inner.store.close()?)
    }

    /// True when a durable write currently succeeds.
    pub fn healthy(&self) -> bool {
        self.inner.store.healthy()
    }

    /// What the startup audit found.
    pub fn audit_report(&self) -> &AuditReport {
        &self.inner.audit
    }

    /// Writes a consistent copy of the store into `to` (absent or empty). Writes wait while the copy is read.
    /// Blocks: call it on a blocking thread.
    /// Answers the store's own error, so that a caller can tell a target that cannot be written
    /// ([`StoreError::Io`], naming it) from a store that is not backed up this way ([`StoreError::Conflict`]).
    pub fn backup(&self, to: &std::path::Path) -> Result<BackupReport, StoreError> {
        self.inner.store.backup(to)
    }

    /// Merchant actors currently running.
    /// How many merchant actors this engine has started: a merchant's actor starts again after it stopped
    /// (idle, a failed write, its shard moved).
    pub fn actors_started(&self) -> u64 {
        // Generations start at 1.
        self.inner.generations.load(Ordering::Relaxed).saturating_sub(1)
    }

    pub fn running_actors(&self) -> usize {
        self.inner.registry.running()
    }

    fn shard(&self, id: &MerchantId) -> &Arbiter {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        id.hash(&mut hasher);
        let index = (hasher.finish() % self.inner.arbiters.len() as u64) as usize;
        &self.inner.arbiters[index]
    }

    /// The merchant's actor, started (and recovered from the store) if it is not running.
    ///
    /// In a cluster an actor is reused only while this node still holds the merchant's shard with the token the
    /// actor's state was read under: after the shard went to another node and came back, that state may miss
    /// the other node's writes, so a fresh actor reads it again (the old one gets no more messages and stops
    /// when idle).
    fn actor(&self, id: &MerchantId) -> Result<Addr<MerchantActor>, EngineError> {
        if let Some(addr) = self.running_actor(id) {
            return Ok(addr);
        }
        // One start per merchant at a time, so two callers cannot start two actors for one merchant. The
        // merchant's own gate is held while recovering, not the registry's lock: a slow store (a takeover
        // reading many merchants from the database) then delays only this merchant's callers.
        let gate = self.inner.starting.entry(id.clone()).or_default().clone();
        let turn = gate.lock().unwrap_or_else(|p| p.into_inner());
        let started = match self.running_actor(id) {
            Some(addr) => Ok(addr),
            None => self.start_actor(id),
        };
        drop(turn);
        drop(gate);
        // The gate goes once nobody else holds it; whoever takes one later finds the actor registered.
        self.inner.starting.remove_if(id, |_, gate| Arc::strong_count(gate) == 1);
        started
    }

    /// The merchant's actor when it runs and its state was read under the token this node holds now.
    fn running_actor(&self, id: &MerchantId) -> Option<Addr<MerchantActor>> {
        let current = self.inner.store.fence_of(id);
        let entry = self.inner.registry.actors.get(id)?;
        (entry.2.connected() && entry.1 == current).then(|| entry.2.clone())
    }

    /// Recovers the merchant from the store and starts its actor; only under the merchant's start gate.
    fn start_actor(&self, id: &MerchantId) -> Result<Addr<MerchantActor>, EngineError> {
        let recovered = self.inner.store.recover_merchant(id)?;
        let fence = recovered.fence;
        let generation = self.inner.generations.fetch_add(1, Ordering::Relaxed);
        let actor = MerchantActor::new(
            id.clone(),
            generation,
            self.inner.store.clone(),
            self.inner.registry.clone(),
            self.inner.settings,
            recovered,
        );
        let addr = MerchantActor::start_in_arbiter(&self.shard(id).handle(), move |_| actor);
        self.inner.registry.actors.insert(id.clone(), (generation, fence, addr.clone()));
        Ok(addr)
    }

    /// Sends `msg` to the merchant's actor: here when this process writes for the merchant, else to the node of
    /// the cluster that does ([`crate::cluster`]).
    async fn ask<M, T>(&self, merchant: &MerchantId, msg: M) -> Result<T, EngineError>
    where
        M: Message<Result = Result<T, EngineError>> + Remote<T> + Send + Clone + 'static,
        T: Send + 'static,
        MerchantActor: actix::Handler<M>,
    {
        match self.inner.store.placement(merchant) {
            Placement::Here => self.ask_here(merchant, msg).await,
            Placement::Node { id, url } => {
                let (Some(forwarding), Some(ask)) = (&self.inner.forwarding, msg.ask()) else {
                    return Err(EngineError::Unavailable(format!("the merchant is held by node {id}")));
                };
                let changes = matches!(ask, crate::cluster::Ask::Execute { .. });
                let forwarded = crate::cluster::Forwarded { merchant: merchant.clone(), ask };
                let answer = forwarding.send(&url, &forwarded).await?;
                // As for an answer that does not read: a change may have been made there.
                M::take(answer).ok_or_else(|| match changes {
                    true => EngineError::OutcomeUnknown(format!("node {id} answered another kind")),
                    false => EngineError::Internal(format!("node {id} answered another kind")),
                })
            }
            Placement::Nobody => {
                Err(EngineError::Unavailable("the merchant is moving between nodes of the cluster; retry".into()))
            }
        }
    }

    /// Sends `msg` to the merchant's actor in this process, once more on a fresh actor if the first one had
    /// just retired.
    async fn ask_here<M, T>(&self, merchant: &MerchantId, msg: M) -> Result<T, EngineError>
    where
        M: Message<Result = Result<T, EngineError>> + Send + Clone + 'static,
        T: Send + 'static,
        MerchantActor: actix::Handler<M>,
    {
        for _ in 0..3 {
            let addr = self.actor(merchant)?;
            match addr.send(msg.clone()).await {
                Ok(Err(EngineError::Retired)) | Err(MailboxError::Closed) => continue,
                Ok(result) => return result,
                Err(MailboxError::Timeout) => return Err(EngineError::Unavailable("merchant actor timed out".into())),
            }
        }
        Err(EngineError::Unavailable("merchant actor kept retiring".into()))
    }

    /// Answers a message another node forwarded (`body`, as [`crate::cluster`] encodes it) with its encoded
    /// result. Runs it only if this node holds the merchant: a message is forwarded once, never onwards.
    pub async fn answer_forwarded(&self, body: &[u8]) -> Vec<u8> {
        use crate::cluster::{Answer, Ask, Forwarded};
        use crate::merchant::{Execute, GetBalances, GetLink, GetPayment, GetPayout, ReleaseKey};
        let answer: Result<Answer, EngineError> = match postcard::from_bytes::<Forwarded>(body) {
            Err(e) => Err(EngineError::Internal(format!("a forwarded message that does not parse: {e}"))),
            Ok(Forwarded { merchant, .. }) if self.inner.store.placement(&merchant) != Placement::Here => {
                Err(EngineError::Unavailable("the merchant moved to another node; retry".into()))
            }
            Ok(Forwarded { merchant, ask }) => match ask {
                Ask::Execute { command, idempotency, note } => {
                    self.ask_here(&merchant, Execute { command, idempotency, note }).await.map(Answer::Executed)
                }
                Ask::Payment(reference) => self.ask_here(&merchant, GetPayment(reference)).await.map(Answer::Payment),
                Ask::Payout(id) => self.ask_here(&merchant, GetPayout(id)).await.map(Answer::Payout),
                Ask::Link(key) => self.ask_here(&merchant, GetLink(key)).await.map(Answer::Link),
                Ask::Balances => self.ask_here(&merchant, GetBalances).await.map(Answer::Balances),
                Ask::Release(key) => self.ask_here(&merchant, ReleaseKey(key)).await.map(|()| Answer::Released),
                Ask::Resend(id) => {
                    use crate::cluster::ResendRefused;
                    match self.resend_here(&merchant, &id).await {
                        Ok(notification) => Ok(Answer::Resent(Ok(notification))),
                        Err(DeliveryError::InFlight) => Ok(Answer::Resent(Err(ResendRefused::InFlight))),
                        Err(DeliveryError::NotFound) => Ok(Answer::Resent(Err(ResendRefused::NotFound))),
                        Err(DeliveryError::Store(e)) => Err(e.into()),
                        Err(e) => Err(EngineError::Unavailable(e.to_string())),
                    }
                }
            },
        };
        postcard::to_allocvec(&answer).unwrap_or_else(|e| {
            tracing::error!(error = %e, "a forwarded message's answer could not be encoded");
            let failed: Result<Answer, EngineError> =
                Err(EngineError::Internal("an answer that does not encode".into()));
            postcard::to_allocvec(&failed).unwrap_or_default()
        })
    }

    /// For a node of a cluster: starts taking its share of the merchants. Called once the node can serve them
    /// (its startup audit passed, its listener is bound): until then the other nodes hold them all, and a node
    /// holding merchants it cannot serve would only fail their forwarded requests. Does nothing outside a
    /// cluster, or a second time.
    pub fn join_cluster(&self) -> Result<(), EngineError> {
        let member = self.inner.member.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(store) = member {
            store.join()?;
        }
        Ok(())
    }

    /// Where the dashboard's sessions are kept when this engine is a node of a cluster (every node reads them).
    pub fn shared_sessions(&self) -> Option<Arc<dyn SharedSessions>> {
        self.inner.sessions.clone()
    }

    /// The cluster's forwarding, when this engine is a node of one.
    pub fn forwarding(&self) -> Option<&Forwarding> {
        self.inner.forwarding.as_ref()
    }

    /// Where the merchant's writes are made (always here outside a cluster).
    pub fn placement(&self, merchant: &MerchantId) -> Placement {
        self.inner.store.placement(merchant)
    }

    /// Changes each time this node of a cluster takes merchants over from another (never with one process).
    pub fn takeovers(&self) -> u64 {
        self.inner.store.takeovers()
    }

    /// True when this process writes for the merchant: always outside a cluster; in one, while this node
    /// holds the merchant's shard. Background work (sweeps, retention) is done by the holder only.
    pub fn holds(&self, merchant: &MerchantId) -> bool {
        self.placement(merchant) == Placement::Here
    }

    /// Applies one change for a merchant; answers once it is durable.
    pub async fn execute(
        &self,
        merchant: &MerchantId,
        command: Command,
        idempotency: Option<Idempotency>,
    ) -> Result<Executed, EngineError> {
        self.execute_noted(merchant, command, idempotency, ProviderNote::default()).await
    }

    /// Applies one change with what it says about the provider side of its transaction (the route of a
    /// transaction it creates, the provider's reference in an answer), written in the same durable write.
    pub async fn execute_noted(
        &self,
        merchant: &MerchantId,
        command: Command,
        idempotency: Option<Idempotency>,
        note: ProviderNote,
    ) -> Result<Executed, EngineError> {
        self.ask(merchant, Execute { command, idempotency, note }).await
    }

    /// Ends a request that held its idempotency key ([`crate::Part::FirstHeld`]): a request with the key is a
    /// replay from now on. Should this fail, the key is released [`crate::merchant::KEY_HELD_AT_MOST`] after it
    /// was written.
    pub async fn release_key(&self, merchant: &MerchantId, key: IdempotencyKey) -> Result<(), EngineError> {
        self.ask(merchant, crate::merchant::ReleaseKey(key)).await
    }

    // ----- Reads of durable state that need no actor: lists, lookups and the sweeps' index -----

    /// This merchant's transactions, newest first, after `cursor`, at most `limit` of those `keep` accepts.
    pub fn transactions(
        &self,
        merchant: &MerchantId,
        cursor: Option<&str>,
        limit: usize,
        keep: &mut dyn FnMut(&Transaction) -> bool,
    ) -> Result<Page<Transaction>, EngineError> {
        Ok(self.inner.store.transactions(merchant, cursor, limit, keep)?)
    }

    /// This merchant's payouts, newest first, after `cursor`.
    pub fn payouts(
        &self,
        merchant: &MerchantId,
        cursor: Option<&str>,
        limit: usize,
        keep: &mut dyn FnMut(&Payout) -> bool,
    ) -> Result<Page<Payout>, EngineError> {
        Ok(self.inner.store.payouts(merchant, cursor, limit, keep)?)
    }

    /// This merchant's payment links, newest first, after `cursor` (a link id).
    pub fn links(
        &self,
        merchant: &MerchantId,
        cursor: Option<&str>,
        limit: usize,
        keep: &mut dyn FnMut(&Link) -> bool,
    ) -> Result<Page<Link>, EngineError> {
        Ok(self.inner.store.links(merchant, cursor, limit, keep)?)
    }

    /// The payments made through a link, newest first, after `cursor` (a transaction id).
    pub fn link_payments(
        &self,
        merchant: &MerchantId,
        link_id: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Page<Payment>, EngineError> {
        Ok(self.inner.store.link_payments(merchant, link_id, cursor, limit)?)
    }

    /// The merchant a link id belongs to.
    pub fn link_owner(&self, link_id: &str) -> Result<Option<MerchantId>, EngineError> {
        Ok(self.inner.store.link_owner(link_id)?)
    }

    /// The stored answer of an earlier request with `idempotency`'s key, as [`Idempotency::replay`] gives it,
    /// read from the store: what a retry answers when the API's checks would now refuse it (settings or state
    /// changed since the first request). The store does not know whether the first request still goes on
    /// (the merchant's actor does, and answers 409 `idempotency_key_in_use` to a retry that reaches it); such a
    /// retry refused by the checks gets the answer written at the request's start.
    pub fn replay(&self, merchant: &MerchantId, idempotency: &Idempotency) -> Result<Option<Executed>, EngineError> {
        match self.inner.store.idempotency(merchant, &idempotency.key)? {
            Some(first) => idempotency.replay(first, Timestamp::now()).transpose(),
            None => Ok(None),
        }
    }

    /// The record behind a payment reference, refund reference or payout id of this merchant.
    pub fn locate(&self, merchant: &MerchantId, reference: &str) -> Result<Option<Located>, EngineError> {
        Ok(self.inner.store.locate(merchant, reference)?)
    }

    /// The merchant and record behind one of our transaction ids (what providers quote back).
    pub fn owner_of_transaction(&self, transaction_id: &str) -> Result<Option<(MerchantId, Located)>, EngineError> {
        Ok(self.inner.store.owner_of_transaction(transaction_id)?)
    }

    /// What is kept about a transaction's provider side: the route fixed at its creation and the provider's
    /// reference for it.
    pub fn provider_trail(&self, transaction_id: &str) -> Result<ProviderTrail, EngineError> {
        Ok(self.inner.store.provider_trail(transaction_id)?)
    }

    /// The route fixed at the transaction's creation (see [`Engine::provider_trail`]).
    pub fn route_of(&self, transaction_id: &str) -> Result<Option<ProviderRoute>, EngineError> {
        Ok(self.inner.store.route(transaction_id)?)
    }

    /// Work of `kind` still waiting for a provider, created before `created_before`, oldest first, after
    /// `after` when given: how the sweeps walk it a batch at a time.
    pub fn awaiting_provider(
        &self,
        kind: TransactionType,
        created_before: Timestamp,
        after: Option<&AwaitingProvider>,
        limit: usize,
    ) -> Result<Vec<AwaitingProvider>, EngineError> {
        Ok(self.inner.store.awaiting_provider(kind, created_before, after, limit)?)
    }

    /// This merchant's journal from position `from_seq`, at most `limit` events (a payment's history).
    pub fn journal(
        &self,
        merchant: &MerchantId,
        from_seq: u64,
        limit: usize,
    ) -> Result<Vec<JournalEvent>, EngineError> {
        Ok(self.inner.store.journal(merchant, from_seq, limit)?)
    }

    /// This merchant's webhook notifications, newest first, after `cursor`.
    pub fn notifications(
        &self,
        merchant: &MerchantId,
        cursor: Option<&str>,
        limit: usize,
        keep: &mut dyn FnMut(&Notification) -> bool,
    ) -> Result<Page<Notification>, EngineError> {
        Ok(self.inner.store.notifications(merchant, cursor, limit, keep)?)
    }

    /// One notification of this merchant (`None` for another merchant's id).
    pub fn notification(&self, merchant: &MerchantId, id: &str) -> Result<Option<Notification>, EngineError> {
        Ok(self.inner.store.notification(merchant, id)?)
    }

    /// Notifications whose next attempt is due at or before `now`, oldest first, at most `limit`.
    pub fn due_notifications(&self, now: Timestamp, limit: usize) -> Result<Vec<Notification>, EngineError> {
        Ok(self.inner.store.due_notifications(now, limit)?)
    }

    // ----- Merchant accounts -----

    pub fn merchant(&self, id: &MerchantId) -> Result<Option<Merchant>, EngineError> {
        Ok(self.inner.store.merchant(id)?)
    }

    /// The merchant holding this secret key; the caller still compares the whole key in constant time.
    pub fn merchant_by_key(&self, secret_key: &str) -> Result<Option<Merchant>, EngineError> {
        // The count is read before the store: a change made meanwhile moves it, and the next lookup reads again.
        let generation = self.inner.store.merchants_generation();
        if let Some(merchant) = self.inner.accounts.merchant_by_key(secret_key, generation) {
            return Ok(Some(merchant));
        }
        let found = self.inner.store.merchant_by_key(secret_key)?;
        if let Some(merchant) = &found {
            self.inner.accounts.keep_merchant(secret_key, generation, merchant);
        }
        Ok(found)
    }

    pub fn merchant_by_email(&self, email: &str) -> Result<Option<Merchant>, EngineError> {
        Ok(self.inner.store.merchant_by_email(email)?)
    }

    pub fn merchant_count(&self) -> Result<u64, EngineError> {
        Ok(self.inner.store.merchant_count()?)
    }

    /// Merchants newest first, from before `before` when given, at most `limit`.
    pub fn merchants(&self, before: Option<&MerchantId>, limit: usize) -> Result<Vec<Merchant>, EngineError> {
        Ok(self.inner.store.merchants(before, limit)?)
    }

    /// When the merchant was suspended by an operator; `None` while it is active.
    pub fn suspended_since(&self, id: &MerchantId) -> Result<Option<Timestamp>, EngineError> {
        let generation = self.inner.store.merchants_generation();
        if let Some(since) = self.inner.accounts.suspended_since(id, generation) {
            return Ok(since);
        }
        let since = self.inner.store.suspended_since(id)?;
        self.inner.accounts.keep_suspension(id, generation, since);
        Ok(since)
    }

    /// Suspends a merchant (`Some(at)`) or lifts its suspension (`None`); answers once durable. Work already
    /// accepted for the merchant goes on: only new requests are refused.
    pub async fn set_suspended(&self, id: &MerchantId, at: Option<Timestamp>) -> Result<(), EngineError> {
        let ticket = self.inner.store.set_suspended(id, at)?;
        durable(ticket).await
    }

    /// Changes whenever a merchant record changes, once the change is visible (for caches of merchants).
    pub fn merchants_generation(&self) -> u64 {
        self.inner.store.merchants_generation()
    }

    /// Creates or updates a merchant account and answers once it is durable. `previous_key` is the secret key
    /// being replaced, if any, which stops working in the same write.
    pub async fn put_merchant(&self, merchant: Merchant, previous_key: Option<String>) -> Result<(), EngineError> {
        let lock = {
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            merchant.email.to_lowercase().hash(&mut hasher);
            (hasher.finish() % ACCOUNT_WRITE_LOCKS as u64) as usize
        };
        let _one = self.inner.account_writes[lock].lock().await;
        let ticket = self.inner.store.put_merchant(merchant, previous_key)?;
        durable(ticket).await
    }

    /// Reads the merchant's account afresh, applies `change` and writes it back, answering once durable with
    /// the account as written (`None`: no such merchant). No other change of the account, in this process or
    /// another node's, comes between the read and the write, so none is overwritten by an older copy: a
    /// webhook URL change made while the key is rolled elsewhere keeps the new key. `change` answers what
    /// happens to the key the change replaces, if it replaces one.
    pub async fn update_merchant(
        &self,
        id: &MerchantId,
        change: impl FnOnce(&mut Merchant) -> KeyChange + 'static,
    ) -> Result<Option<Merchant>, EngineError> {
        // On a task of its own: a caller that stops waiting (a request cancelled, a server stopping) must not
        // drop the locks while the write is still in flight, when another change could read the account as it
        // was and write it back.
        let engine = self.clone();
        let id = id.clone();
        actix_rt::spawn(async move { engine.update_merchant_now(&id, change).await })
            .await
            .map_err(|e| EngineError::Internal(format!("an account change's task failed: {e}")))?
    }

    async fn update_merchant_now(
        &self,
        id: &MerchantId,
        change: impl FnOnce(&mut Merchant) -> KeyChange,
    ) -> Result<Option<Merchant>, EngineError> {
        let _here = self.inner.account_updates.lock().await;
        let store = self.inner.store.clone();
        let locked = id.clone();
        // The store's lock may wait for another node's change: on a thread of its own, not the actor system's.
        let _everywhere = tokio::task::spawn_blocking(move || store.lock_account(&locked))
            .await
            .map_err(|e| EngineError::Internal(format!("the account lock's thread failed: {e}")))??;
        // From the store, not this process's cache of accounts, which may predate another node's change.
        let Some(mut merchant) = self.inner.store.merchant(id)? else {
            return Ok(None);
        };
        let ticket = match change(&mut merchant) {
            KeyChange::Kept => self.inner.store.put_merchant(merchant.clone(), None)?,
            KeyChange::Revoked(previous) => self.inner.store.put_merchant(merchant.clone(), Some(previous))?,
            KeyChange::ValidUntil(previous, until) => {
                self.inner.store.put_merchant_keeping(merchant.clone(), previous, until)?
            }
        };
        durable(ticket).await?;
        Ok(Some(merchant))
    }

    /// Writes a merchant whose key was rolled, the previous key still valid until `until`; answers once
    /// durable.
    pub async fn put_merchant_keeping(
        &self,
        merchant: Merchant,
        previous_key: String,
        until: Timestamp,
    ) -> Result<(), EngineError> {
        let ticket = self.inner.store.put_merchant_keeping(merchant, previous_key, until)?;
        durable(ticket).await
    }

    /// Until when a rolled key still authenticates (`None`: never rolled with a grace).
    pub fn retired_key_until(&self, secret_key: &str) -> Result<Option<Timestamp>, EngineError> {
        Ok(self.inner.store.retired_key_until(secret_key)?)
    }

    // ----- Through the merchant's actor -----

    pub async fn payment(&self, merchant: &MerchantId, reference: &str) -> Result<Option<Payment>, EngineError> {
        self.ask(merchant, GetPayment(reference.to_owned())).await
    }

    pub async fn payout(&self, merchant: &MerchantId, id: &str) -> Result<Option<Payout>, EngineError> {
        self.ask(merchant, GetPayout(id.to_owned())).await
    }

    /// A link by its id or merchant reference, as durable (its counters with its payments').
    pub async fn link(&self, merchant: &MerchantId, key: &str) -> Result<Option<Link>, EngineError> {
        self.ask(merchant, GetLink(key.to_owned())).await
    }

    pub async fn balances(&self, merchant: &MerchantId) -> Result<Balances, EngineError> {
        self.ask(merchant, GetBalances).await
    }

    /// Deletes the idempotency records made before `before` (they answer for 24 hours, docs/api.md §
    /// Idempotency), every merchant's, each through its actor, a bounded batch at a time; at most
    /// `max_batches` batches, so one call is bounded. Merchants with nothing that old are passed over without
    /// starting their actors, and one whose records cannot be deleted now is logged and passed over. Answers
    /// how many index entries went.
    pub async fn forget_idempotency_before(&self, before: Timestamp, max_batches: usize) -> Result<u64, EngineError> {
        const BATCH: usize = 512;
        let store = &self.inner.store;
        let mut forgotten = 0;
        let mut batches = 0;
        let mut after: Option<MerchantId> = None;
        while batches < max_batches {
            let Some(merchant) = store.next_merchant_with_idempotency(after.as_ref())? else { break };
            after = Some(merchant.clone());
            if !self.holds(&merchant) || store.idempotency_made_before(&merchant, before, 1)?.is_empty() {
                continue;
            }
            while batches < max_batches {
                batches += 1;
                match self.ask(&merchant, ForgetIdempotency { before, limit: BATCH }).await {
                    // Fewer than a batch: this merchant is done (what is left waits for a request in progress).
                    Ok(gone) => {
                        forgotten += gone as u64;
                        if gone < BATCH {
                            break;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(merchant = %merchant, error = %e, "expired idempotency records not deleted; the next pass tries again");
                        break;
                    }
                }
            }
        }
        if forgotten > 0 {
            tracing::info!(forgotten, before = %before, "deleted idempotency records past their 24 hours");
        }
        Ok(forgotten)
    }
}

/// Waits until a store write is durable (Ok) or known not to be.
async fn durable(ticket: crate::store::Ticket) -> Result<(), EngineError> {
    match ticket.await {
        Ok(result) => Ok(result?),
        Err(_) => Err(EngineError::from(StoreError::Closed)),
    }
}

/// Runs one audit (waiting for one in progress), logs what it found and records it in the metrics.
fn run_audit(store: &dyn Store, audits: &Audits, kind: AuditScope) -> Result<AuditReport, StoreError> {
    let _one = audits.one_at_a_time.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let result = store.audit_until(kind, &audits.stop);
    match &result {
        Ok(report) => {
            METRICS.audits.passed(kind, report.events, Timestamp::now().unix_s());
            tracing::info!(
                kind = kind.as_str(),
                merchants = report.merchants,
                from_checkpoint = report.from_checkpoint,
                events = report.events,
                elapsed_ms = report.elapsed_ms,
                "ledger audit passed"
            );
            if let Some(e) = &report.checkpoint_error {
                tracing::warn!(kind = kind.as_str(), error = %e, "the audit checkpoints were not moved forward");
            }
        }
        Err(StoreError::Closed) if audits.stop.load(Ordering::Acquire) => {
            tracing::info!(kind = kind.as_str(), "ledger audit stopped with the engine");
        }
        Err(e @ StoreError::Corrupt(_)) => {
            METRICS.audits.failed(kind);
            tracing::error!(kind = kind.as_str(), error = %e, "ledger audit FAILED: the ledger disagrees");
        }
        Err(e) => {
            METRICS.audits.could_not_run(kind);
            tracing::error!(kind = kind.as_str(), error = %e, "ledger audit could not run");
        }
    }
    result
}

/// The background audits' loop: each kind when its interval has passed since it last ran, until `stopped`
/// hears the engine go (its sender dropped).
fn background_audits(
    store: &dyn Store,
    audits: &Audits,
    schedule: AuditSchedule,
    stopped: &std::sync::mpsc::Receiver<()>,
) {
    let started = std::time::Instant::now();
    let mut last = [
        (AuditScope::SinceCheckpoints, schedule.since_checkpoints_every, started),
        (AuditScope::Full, schedule.full_every, started),
    ];
    loop {
        let next = last.iter().filter_map(|(_, every, at)| every.map(|e| *at + e)).min();
        let Some(next) = next else { return };
        let wait = next.saturating_duration_since(std::time::Instant::now());
        match stopped.recv_timeout(wait) {
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        for (kind, every, at) in &mut last {
            if every.is_some_and(|e| at.elapsed() >= e) {
                // A failure is logged and counted by `run_audit`; the schedule goes on.
                let _ = run_audit(store, audits, *kind);
                *at = std::time::Instant::now();
            }
        }
    }
}
