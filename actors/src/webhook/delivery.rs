//! The webhook delivery pool: one dispatcher actor and a supervised delivery actor per Arbiter.
//!
//! The dispatcher learns of notifications two ways: the store's feed (each notification as soon as its
//! change is durable) and a periodic scan of the due index (retries, and everything still due after a
//! restart). It hands each notification to the delivery actor of its merchant's shard and remembers it as in
//! flight until that actor reports the attempt persisted, so no notification has two attempts at once.
//!
//! A delivery actor owns one awc client (awc is `!Send`, so each lives on its Arbiter's thread), with
//! rustls, redirects off and an outer timeout that covers connect, headers and body. It signs the stored body
//! bytes with the merchant's current secret key and a fresh timestamp, posts to the merchant's current URL
//! (re-checked in production, connecting to the very address it checked), and persists the outcome decided
//! by [`schedule::after_attempt`](super::schedule::after_attempt).
//!
//! Isolation: each actor has a bound on attempts in flight, and each receiver host a bound of its own, much
//! lower for a host whose last attempt timed out or could not connect. Deliveries beyond a host's bound wait
//! in that host's queue, so a thousand hanging receivers hold a few slots each while healthy receivers keep
//! theirs.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use awc::http::Uri;

use super::schedule::{after_attempt, jitter_unit, resend, AttemptOutcome, RetrySchedule};
use super::signature::{sign, SIGNATURE_HEADER, TIMESTAMP_HEADER};
use super::url::forbidden;
use crate::domain::ids::MerchantId;
use crate::domain::records::{DeliveryState, Notification};
use crate::domain::time::Timestamp;
use crate::store::{Store, StoreError};

/// Tuning of the pool; [`DeliveryConfig::default`] is the production setting.
#[derive(Debug, Clone)]
pub struct DeliveryConfig {
    /// Contract 12's production rules: https only, no private or loopback addresses, checked at delivery.
    pub production: bool,
    pub schedule: RetrySchedule,
    /// The whole attempt (connect, TLS, headers, body) must finish within this (spec 4.1: 10 s).
    pub timeout: Duration,
    /// Delivery actors; 0 means one per core.
    pub workers: usize,
    pub max_in_flight_per_worker: usize,
    pub max_per_host: usize,
    /// Bound for a host whose last attempt timed out or could not connect.
    pub max_per_slow_host: usize,
    /// Deliveries waiting for a busy host, per worker; beyond it they wait in the store for the next scan.
    pub max_waiting_per_worker: usize,
    pub scan_every: Duration,
    /// Extra trust anchors (PEM), for receivers behind an internal CA (and the tests' self-signed one).
    pub extra_roots_pem: Option<PathBuf>,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            production: false,
            schedule: RetrySchedule::default(),
            timeout: Duration::from_secs(10),
            workers: 0,
            max_in_flight_per_worker: 2_048,
            max_per_host: 128,
            max_per_slow_host: 2,
            max_waiting_per_worker: 50_000,
            scan_every: Duration::from_millis(500),
            extra_roots_pem: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeliveryError {
    #[error("TLS setup: {0}")]
    Tls(String),
    #[error("no such notification")]
    NotFound,
    #[error("this notification is being delivered right now")]
    InFlight,
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the delivery pool stopped")]
    Stopped,
}

/// Handle on the running pool.
pub struct WebhookPool {
    dispatcher: Addr<Dispatcher>,
    arbiters: Vec<Arbiter>,
}

impl Drop for WebhookPool {
    fn drop(&mut self) {
        for arbiter in &self.arbiters {
            arbiter.stop();
        }
    }
}

impl WebhookPool {
    /// Starts the dispatcher on the current Arbiter and the delivery actors on their own. Needs a running
    /// actix System.
    pub fn start(store: Arc<dyn Store>, config: DeliveryConfig) -> Result<WebhookPool, DeliveryError> {
        // awc builds a default rustls config on its own and panics without a process-wide provider.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let tls = Arc::new(tls_config(config.extra_roots_pem.as_ref())?);
        let config = Arc::new(config);
        let workers = match config.workers {
            0 => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2),
            n => n,
        };
        let dispatcher_ctx = Context::<Dispatcher>::new();
        let dispatcher_addr = dispatcher_ctx.address();
        let mut arbiters = Vec::with_capacity(workers);
        let mut addrs = Vec::with_capacity(workers);
        for _ in 0..workers {
            let arbiter = Arbiter::new();
            let (store, config, tls, dispatcher) =
                (store.clone(), config.clone(), tls.clone(), dispatcher_addr.clone());
            let addr =
                Supervisor::start_in_arbiter(&arbiter.handle(), move |_| Worker::new(store, config, tls, dispatcher));
            addrs.push(addr);
            arbiters.push(arbiter);
        }
        let feed = store.outbox_feed();
        let dispatcher = Dispatcher {
            store,
            config,
            workers: addrs,
            in_flight: HashSet::new(),
            feed,
            backlog: VecDeque::new(),
            backlog_ids: HashSet::new(),
            scan_soon: false,
        };
        let dispatcher = dispatcher_ctx.run(dispatcher);
        Ok(WebhookPool { dispatcher, arbiters })
    }

    /// Sends a notification again, starting a new attempt chain (the dashboard's resend button).
    pub async fn resend(&self, id: &str) -> Result<Notification, DeliveryError> {
        self.dispatcher.send(Resend(id.to_owned())).await.map_err(|_| DeliveryError::Stopped)?
    }

    /// Notifications currently handed to a delivery actor.
    pub async fn in_flight(&self) -> usize {
        self.dispatcher.send(InFlightCount).await.unwrap_or(0)
    }
}

fn tls_config(extra: Option<&PathBuf>) -> Result<rustls::ClientConfig, DeliveryError> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = extra {
        let certs =
            CertificateDer::pem_file_iter(path).map_err(|e| DeliveryError::Tls(format!("{}: {e}", path.display())))?;
        for cert in certs {
            let cert = cert.map_err(|e| DeliveryError::Tls(format!("{}: {e}", path.display())))?;
            roots.add(cert).map_err(|e| DeliveryError::Tls(format!("{}: {e}", path.display())))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| DeliveryError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

// ----- messages -----

#[derive(Message)]
#[rtype(result = "()")]
struct Fresh(Notification);

#[derive(Message)]
#[rtype(result = "()")]
struct Deliver(Notification);

/// The attempt on `0` is persisted (or given up); the dispatcher may schedule it again.
#[derive(Message)]
#[rtype(result = "()")]
struct Settled(String);

#[derive(Message)]
#[rtype(result = "Result<Notification, DeliveryError>")]
struct Resend(String);

#[derive(Message)]
#[rtype(result = "usize")]
struct InFlightCount;

// ----- dispatcher -----

/// Fresh notifications the workers had no room for wait here (up to this many) instead of waiting for the
/// next scan; beyond it they stay in the store's due index, which the scan reads.
const MAX_DISPATCH_BACKLOG: usize = 65_536;

struct Dispatcher {
    store: Arc<dyn Store>,
    config: Arc<DeliveryConfig>,
    workers: Vec<Addr<Worker>>,
    in_flight: HashSet<String>,
    feed: Option<tokio::sync::mpsc::Receiver<Notification>>,
    /// Fresh notifications waiting for room, oldest first, and their ids (so a scan does not take them too).
    backlog: VecDeque<Notification>,
    backlog_ids: HashSet<String>,
    /// A scan is already scheduled soon; one is enough.
    scan_soon: bool,
}

impl Dispatcher {
    fn budget(&self) -> usize {
        self.config.max_in_flight_per_worker * self.workers.len().max(1)
    }

    /// Hands `n` to its worker if there is room; gives it back otherwise (moved, not copied: the size of the
    /// error variant costs nothing here).
    #[allow(clippy::result_large_err)]
    fn dispatch(&mut self, n: Notification) -> Result<(), Notification> {
        if self.in_flight.contains(&n.id) || n.state != DeliveryState::Pending || self.workers.is_empty() {
            return Ok(());
        }
        if self.in_flight.len() >= self.budget() {
            return Err(n);
        }
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        n.merchant.hash(&mut hasher);
        let worker = &self.workers[(hasher.finish() % self.workers.len() as u64) as usize];
        let id = n.id.clone();
        match worker.try_send(Deliver(n)) {
            Ok(()) => {
                self.in_flight.insert(id);
                Ok(())
            }
            Err(SendError::Full(Deliver(n)) | SendError::Closed(Deliver(n))) => Err(n),
        }
    }

    /// A fresh notification: dispatched now, or queued in the backlog, or (backlog full) left to the scan.
    fn offer(&mut self, n: Notification) {
        if !self.backlog.is_empty() {
            self.queue(n);
            return;
        }
        if let Err(n) = self.dispatch(n) {
            self.queue(n);
        }
    }

    fn queue(&mut self, n: Notification) {
        if self.backlog.len() < MAX_DISPATCH_BACKLOG && self.backlog_ids.insert(n.id.clone()) {
            self.backlog.push_back(n);
        }
    }

    /// Moves the backlog to the workers while they have room.
    fn drain_backlog(&mut self) {
        while let Some(n) = self.backlog.pop_front() {
            let id = n.id.clone();
            match self.dispatch(n) {
                Ok(()) => {
                    self.backlog_ids.remove(&id);
                }
                Err(n) => {
                    self.backlog.push_front(n);
                    return;
                }
            }
        }
    }

    fn scan(&mut self) {
        self.scan_soon = false;
        let room = self.budget().saturating_sub(self.in_flight.len());
        if room == 0 {
            return;
        }
        let (in_flight, backlog) = (&self.in_flight, &self.backlog_ids);
        let skip = &mut |id: &str| in_flight.contains(id) || backlog.contains(id);
        match self.store.due_notifications_skipping(Timestamp::now(), room, skip) {
            Ok(due) => {
                for n in due {
                    if self.dispatch(n).is_err() {
                        break;
                    }
                }
            }
            Err(e) => tracing::error!(error = %e, "webhook scan failed"),
        }
    }
}

impl Actor for Dispatcher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(16_384);
        if let Some(mut feed) = self.feed.take() {
            let me = ctx.address();
            actix_rt::spawn(async move {
                while let Some(n) = feed.recv().await {
                    if me.send(Fresh(n)).await.is_err() {
                        break;
                    }
                }
            });
        }
        ctx.run_interval(self.config.scan_every, |act, _| act.scan());
        self.scan();
    }
}

impl Handler<Fresh> for Dispatcher {
    type Result = ();

    fn handle(&mut self, msg: Fresh, _: &mut Self::Context) {
        self.offer(msg.0);
    }
}

impl Handler<Settled> for Dispatcher {
    type Result = ();

    /// A slot is free: feed the backlog first; when it is empty and the workers are half idle, look at the
    /// due index soon rather than at the next tick, so retries and overflow do not wait for the timer.
    fn handle(&mut self, msg: Settled, ctx: &mut Self::Context) {
        self.in_flight.remove(&msg.0);
        self.drain_backlog();
        if self.backlog.is_empty() && !self.scan_soon && self.in_flight.len() < self.budget() / 2 {
            self.scan_soon = true;
            ctx.run_later(Duration::from_millis(20), |act, _| act.scan());
        }
    }
}

impl Handler<InFlightCount> for Dispatcher {
    type Result = usize;

    fn handle(&mut self, _: InFlightCount, _: &mut Self::Context) -> usize {
        self.in_flight.len()
    }
}

impl Handler<Resend> for Dispatcher {
    type Result = ResponseActFuture<Self, Result<Notification, DeliveryError>>;

    fn handle(&mut self, msg: Resend, _: &mut Self::Context) -> Self::Result {
        let prepared = (|| {
            if self.in_flight.contains(&msg.0) || self.backlog_ids.contains(&msg.0) {
                return Err(DeliveryError::InFlight);
            }
            let before = self.store.notification(&msg.0)?.ok_or(DeliveryError::NotFound)?;
            let after = resend(&before, Timestamp::now());
            let ticket = self.store.save_notification(&before, &after)?;
            Ok((after, ticket))
        })();
        match prepared {
            Err(e) => Box::pin(fut::ready(Err(e))),
            Ok((after, ticket)) => {
                // Marked in flight until durable, so a scan cannot dispatch the old state meanwhile.
                self.in_flight.insert(after.id.clone());
                Box::pin(ticket.into_actor(self).map(move |result, act, _| {
                    act.in_flight.remove(&after.id);
                    match result {
                        Ok(Ok(())) => {
                            // No room now: the due index has it, and the next scan sends it.
                            let _ = act.dispatch(after.clone());
                            Ok(after)
                        }
                        Ok(Err(e)) => Err(DeliveryError::Store(e)),
                        Err(_) => Err(DeliveryError::Stopped),
                    }
                }))
            }
        }
    }
}

// ----- delivery workers -----

#[derive(Default)]
struct Host {
    in_flight: usize,
    slow: bool,
    waiting: VecDeque<Notification>,
}

struct Worker {
    store: Arc<dyn Store>,
    config: Arc<DeliveryConfig>,
    tls: Arc<rustls::ClientConfig>,
    dispatcher: Addr<Dispatcher>,
    client: Option<awc::Client>,
    in_flight: usize,
    waiting: usize,
    hosts: HashMap<String, Host>,
    /// Ids of attempts under way, so a restart can hand them back to the dispatcher.
    flying: HashSet<String>,
    /// Merchants' delivery targets as read at `targets_generation`; emptied as soon as any merchant record
    /// changes, so a new URL or a rolled key is used by the very next attempt.
    targets: HashMap<MerchantId, Target>,
    targets_generation: u64,
}

/// How long a notification whose attempt could not be persisted is kept from the dispatcher.
const MIN_UNSAVED_HOLD: Duration = Duration::from_secs(1);
const MAX_UNSAVED_HOLD: Duration = Duration::from_secs(60);

/// Targets a worker remembers at most; past this the cache starts again empty.
const MAX_CACHED_TARGETS: usize = 10_000;

/// What one attempt needs, read when it starts: the merchant's URL and key may have changed since the
/// notification was written, and the latest ones are the merchant's wish.
#[derive(Clone)]
struct Target {
    url: String,
    host: String,
    secret_key: String,
}

impl Worker {
    fn new(
        store: Arc<dyn Store>,
        config: Arc<DeliveryConfig>,
        tls: Arc<rustls::ClientConfig>,
        dispatcher: Addr<Dispatcher>,
    ) -> Worker {
        Worker {
            store,
            config,
            tls,
            dispatcher,
            client: None,
            in_flight: 0,
            waiting: 0,
            hosts: HashMap::new(),
            flying: HashSet::new(),
            targets: HashMap::new(),
            targets_generation: 0,
        }
    }

    fn client(&mut self) -> awc::Client {
        if let Some(client) = &self.client {
            return client.clone();
        }
        let connector = awc::Connector::new()
            .rustls_0_23(self.tls.clone())
            .limit(0)
            .timeout(self.config.timeout)
            .handshake_timeout(self.config.timeout);
        let client =
            awc::Client::builder().connector(connector).disable_redirects().timeout(self.config.timeout).finish();
        self.client = Some(client.clone());
        client
    }

    fn target(&mut self, n: &Notification) -> Result<Target, String> {
        // The number is taken before the read, so a change applied meanwhile empties the cache next time.
        let generation = self.store.merchants_generation();
        if generation != self.targets_generation || self.targets.len() >= MAX_CACHED_TARGETS {
            self.targets.clear();
            self.targets_generation = generation;
        }
        if let Some(target) = self.targets.get(&n.merchant) {
            return Ok(target.clone());
        }
        let target = self.read_target(n)?;
        self.targets.insert(n.merchant.clone(), target.clone());
        Ok(target)
    }

    fn read_target(&self, n: &Notification) -> Result<Target, String> {
        let merchant = self
            .store
            .merchant(&n.merchant)
            .map_err(|e| format!("merchant lookup failed: {e}"))?
            .ok_or_else(|| "merchant not found".to_owned())?;
        let url = merchant.webhook_url.ok_or_else(|| "no webhook URL configured".to_owned())?;
        let uri: Uri = url.parse().map_err(|_| "webhook URL is not valid".to_owned())?;
        let host =
            uri.authority().map(|a| a.as_str().to_owned()).ok_or_else(|| "webhook URL has no host".to_owned())?;
        Ok(Target { url, host, secret_key: merchant.secret_key })
    }

    fn start(&mut self, n: Notification, target: Target, ctx: &mut Context<Self>) {
        self.in_flight += 1;
        self.flying.insert(n.id.clone());
        self.hosts.entry(target.host.clone()).or_default().in_flight += 1;
        let attempt = attempt(self.client(), target.url, target.secret_key, n.body.clone(), self.config.clone());
        let host = target.host;
        ctx.spawn(attempt.into_actor(self).map(move |outcome, act, ctx| {
            act.in_flight = act.in_flight.saturating_sub(1);
            act.flying.remove(&n.id);
            let slow = outcome.http_status.is_none();
            if let Some(h) = act.hosts.get_mut(&host) {
                h.in_flight = h.in_flight.saturating_sub(1);
                h.slow = slow;
            }
            act.settle(n, outcome, ctx);
            act.pump(&host, ctx);
        }));
    }

    /// Persists the attempt's outcome, then tells the dispatcher.
    ///
    /// When the outcome cannot be persisted, the stored copy is still due, and handing it back at once would
    /// have the dispatcher send it again within milliseconds, for as long as the disk fails. It is held back
    /// instead until the wait the schedule gave this attempt (at least a second), as if the save had worked.
    fn settle(&mut self, n: Notification, outcome: AttemptOutcome, ctx: &mut Context<Self>) {
        let after = after_attempt(&n, &outcome, &self.config.schedule, jitter_unit());
        let hold = after
            .next_attempt_at
            .map_or(MAX_UNSAVED_HOLD, |at| {
                Duration::from_millis(at.unix_ms().saturating_sub(Timestamp::now().unix_ms()))
            })
            .clamp(MIN_UNSAVED_HOLD, MAX_UNSAVED_HOLD);
        let id = n.id.clone();
        let dispatcher = self.dispatcher.clone();
        let saved = self.store.save_notification(&n, &after);
        ctx.spawn(
            async move {
                let failure = match saved {
                    Ok(ticket) => match ticket.await {
                        Ok(Ok(())) => None,
                        Ok(Err(e)) => Some(e.to_string()),
                        Err(_) => Some("the store stopped".to_owned()),
                    },
                    Err(e) => Some(e.to_string()),
                };
                if let Some(error) = failure {
                    tracing::error!(notification = %id, %error, hold_ms = hold.as_millis() as u64, "attempt not persisted; it will be retried");
                    actix_rt::time::sleep(hold).await;
                }
                dispatcher.do_send(Settled(id));
            }
            .into_actor(self),
        );
    }

    /// Starts waiting deliveries of `host` while it has room.
    fn pump(&mut self, host: &str, ctx: &mut Context<Self>) {
        loop {
            let Some(h) = self.hosts.get_mut(host) else { return };
            let limit = if h.slow { self.config.max_per_slow_host } else { self.config.max_per_host };
            if h.in_flight >= limit || self.in_flight >= self.config.max_in_flight_per_worker {
                return;
            }
            let Some(next) = h.waiting.pop_front() else {
                if h.in_flight == 0 {
                    self.hosts.remove(host);
                }
                return;
            };
            self.waiting = self.waiting.saturating_sub(1);
            match self.target(&next) {
                Ok(target) => self.start(next, target, ctx),
                Err(error) => self.fail_now(next, error, ctx),
            }
        }
    }

    /// An attempt that could not even start (no URL, unknown merchant) counts as a failed attempt.
    fn fail_now(&mut self, n: Notification, error: String, ctx: &mut Context<Self>) {
        let outcome = AttemptOutcome {
            at: Timestamp::now(),
            signed_at_s: None,
            http_status: None,
            error: Some(error),
            latency_ms: 0,
        };
        self.settle(n, outcome, ctx);
    }
}

impl Actor for Worker {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(4_096);
    }
}

impl Supervised for Worker {
    /// The attempts of the old context are gone: hand their notifications back to the dispatcher, whose
    /// next scan offers them again (they are still due in the store).
    fn restarting(&mut self, _: &mut Self::Context) {
        self.client = None;
        self.in_flight = 0;
        self.waiting = 0;
        for id in self.flying.drain() {
            self.dispatcher.do_send(Settled(id));
        }
        for (_, host) in self.hosts.drain() {
            for n in host.waiting {
                self.dispatcher.do_send(Settled(n.id));
            }
        }
    }
}

impl Handler<Deliver> for Worker {
    type Result = ();

    fn handle(&mut self, msg: Deliver, ctx: &mut Self::Context) {
        // The copy handed over may be older than the store: a feed copy can arrive after a scan already
        // delivered the same notification. Only the stored version, still pending and due, is attempted; it
        // is also the `before` of the save, so the due index stays exact.
        let id = msg.0.id;
        // Every copy handed over carries its body; should one not, read it whole.
        let read =
            if msg.0.body.is_empty() { self.store.notification(&id) } else { self.store.notification_state(&id) };
        let n = match read {
            Ok(Some(mut current))
                if current.state == DeliveryState::Pending
                    && current.next_attempt_at.is_some_and(|at| at <= Timestamp::now()) =>
            {
                // Bodies never change once written; only the state is read again.
                if current.body.is_empty() {
                    current.body = msg.0.body;
                }
                current
            }
            Ok(_) => return self.dispatcher.do_send(Settled(id)),
            Err(e) => {
                tracing::error!(notification = %id, error = %e, "notification lookup failed; the next scan retries");
                return self.dispatcher.do_send(Settled(id));
            }
        };
        let target = match self.target(&n) {
            Ok(target) => target,
            Err(error) => return self.fail_now(n, error, ctx),
        };
        let host = self.hosts.entry(target.host.clone()).or_default();
        let limit = if host.slow { self.config.max_per_slow_host } else { self.config.max_per_host };
        let busy = host.in_flight >= limit || self.in_flight >= self.config.max_in_flight_per_worker;
        if !busy {
            return self.start(n, target, ctx);
        }
        if self.waiting >= self.config.max_waiting_per_worker {
            // Leave it in the store; the dispatcher's next scan offers it again.
            return self.dispatcher.do_send(Settled(n.id));
        }
        self.waiting += 1;
        if let Some(h) = self.hosts.get_mut(&target.host) {
            h.waiting.push_back(n);
        }
    }
}

/// One HTTP attempt, bounded as a whole by `config.timeout`. The timestamp is taken once, here, so the one
/// sent and the one recorded in the attempt log are the same.
async fn attempt(
    client: awc::Client,
    url: String,
    secret_key: String,
    body: String,
    config: Arc<DeliveryConfig>,
) -> AttemptOutcome {
    let at = Timestamp::now();
    let signed_at_s = at.unix_s();
    let started = Instant::now();
    let sending = send(client, url, secret_key, body, signed_at_s, config.production);
    let result = actix_rt::time::timeout(config.timeout, sending).await;
    let latency_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let signed_at_s = Some(signed_at_s);
    match result {
        Ok(Ok(status)) => AttemptOutcome { at, signed_at_s, http_status: Some(status), error: None, latency_ms },
        Ok(Err(error)) => AttemptOutcome { at, signed_at_s, http_status: None, error: Some(error), latency_ms },
        Err(_) => AttemptOutcome {
            at,
            signed_at_s,
            http_status: None,
            error: Some(format!("no answer within {} s", config.timeout.as_secs())),
            latency_ms,
        },
    }
}

async fn send(
    client: awc::Client,
    url: String,
    secret_key: String,
    body: String,
    timestamp: u64,
    production: bool,
) -> Result<u16, String> {
    let mut request = client.post(&url);
    if production {
        let address = checked_address(&url).await?;
        request = request.address(address);
    }
    let signature = sign(&secret_key, timestamp, body.as_bytes());
    let mut response = request
        .insert_header(("Content-Type", "application/json"))
        .insert_header((SIGNATURE_HEADER, signature))
        .insert_header((TIMESTAMP_HEADER, timestamp.to_string()))
        .send_body(body)
        .await
        .map_err(|e| format!("request failed: {e}"))?;
    let status = response.status().as_u16();
    // Read (and drop) a bounded body so the connection can be reused; its content does not matter.
    let _ = response.body().limit(64 * 1024).await;
    Ok(status)
}

/// Production rules at delivery time: https only, and the address we connect to is one we checked, so a
/// DNS answer that changed since the URL was saved cannot point us at a private address.
async fn checked_address(url: &str) -> Result<SocketAddr, String> {
    let uri: Uri = url.parse().map_err(|_| "webhook URL is not valid".to_owned())?;
    if uri.scheme_str() != Some("https") {
        return Err("production webhooks must use https".into());
    }
    let host = uri.host().ok_or("webhook URL has no host")?.trim_start_matches('[').trim_end_matches(']').to_owned();
    let port = uri.port_u16().unwrap_or(443);
    let addresses: Vec<SocketAddr> =
        actix_rt::task::spawn_blocking(move || (host.as_str(), port).to_socket_addrs().map(|a| a.collect::<Vec<_>>()))
            .await
            .map_err(|_| "DNS lookup failed".to_owned())?
            .map_err(|e| format!("DNS lookup failed: {e}"))?;
    if addresses.is_empty() || addresses.iter().any(|a| forbidden(&a.ip())) {
        return Err("the webhook host resolves to a forbidden address".into());
    }
    Ok(addresses[0])
}
