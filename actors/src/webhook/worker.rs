//! The delivery actors: one per Arbiter, supervised, each making the attempts of its merchants' notifications.
//!
//! A delivery actor owns one awc client (awc is `!Send`, so each lives on its Arbiter's thread), with rustls,
//! redirects off and an outer timeout that covers connect and headers (a body is drained briefly after). It signs the stored body bytes
//! with the merchant's current secret key and a fresh timestamp, posts to the merchant's current URL
//! (re-checked in production, connecting only to addresses it checked), and persists the outcome decided by
//! [`schedule::after_attempt`](super::schedule::after_attempt).
//!
//! Isolation: each actor has a bound on attempts in flight, and each receiver host a bound of its own, much
//! lower for a host whose last attempt timed out or could not connect. Deliveries beyond a host's bound wait
//! in that host's queue, so a thousand hanging receivers hold a few slots each while healthy receivers keep
//! theirs.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use awc::http::Uri;

use super::config::DeliveryConfig;
use super::messages::{Deliver, Provenance, Settled, Waits};
use super::schedule::{after_attempt, jitter_unit, AttemptOutcome};
use super::signature::{
    sign, sign_standard, SIGNATURE_HEADER, STANDARD_ID_HEADER, STANDARD_SIGNATURE_HEADER, STANDARD_TIMESTAMP_HEADER,
    TIMESTAMP_HEADER,
};
use super::url::forbidden;
use crate::domain::ids::MerchantId;
use crate::domain::records::{DeliveryState, Notification};
use crate::domain::time::Timestamp;
use crate::metrics::{DeliveryResult, METRICS};
use crate::store::{Accounts, Fence, Outbox, StoreError};

#[derive(Default)]
struct Host {
    in_flight: usize,
    slow: bool,
    /// Each with the fence its copy was read under (see [`Worker::record_attempt`]).
    waiting: VecDeque<(Notification, Option<Fence>)>,
    /// In [`Worker::ready`]: deliveries of this host wait for room in the worker, not for its own attempts.
    ready: bool,
}

pub(super) struct Worker {
    outbox: Arc<dyn Outbox>,
    accounts: Arc<dyn Accounts>,
    config: Arc<DeliveryConfig>,
    tls: Arc<rustls::ClientConfig>,
    dispatcher: Recipient<Settled>,
    client: Option<awc::Client>,
    in_flight: usize,
    waiting: usize,
    hosts: HashMap<String, Host>,
    /// Hosts whose waiting deliveries their own bound would let start, blocked by the worker's bound only:
    /// nothing of theirs may be in flight to start them when it finishes, so the room any finished attempt
    /// frees goes to them in turn.
    ready: VecDeque<String>,
    /// Ids of attempts under way, so a restart can hand them back to the dispatcher.
    flying: HashSet<String>,
    /// Restarts so far. An attempt reports the epoch it started in; one started before a restart finds its
    /// notification handed back to the dispatcher and its counts reset, and is ignored.
    epoch: u64,
    /// Merchants' delivery targets as read at `targets_generation`; emptied as soon as any merchant record
    /// changes, so a new URL or a rolled key is used by the very next attempt.
    targets: HashMap<MerchantId, Target>,
    targets_generation: u64,
}

/// The waits between saves of an attempt's outcome that could not be persisted, and then how long its
/// notification is kept from the dispatcher.
const MIN_UNSAVED_HOLD: Duration = Duration::from_secs(1);
const MAX_UNSAVED_HOLD: Duration = Duration::from_secs(60);

/// How long the save of an attempt's outcome is tried again before the attempt is left to be made again.
const MAX_RESAVING: Duration = Duration::from_secs(10 * 60);

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
    pub(super) fn new(
        outbox: Arc<dyn Outbox>,
        accounts: Arc<dyn Accounts>,
        config: Arc<DeliveryConfig>,
        tls: Arc<rustls::ClientConfig>,
        dispatcher: Recipient<Settled>,
    ) -> Worker {
        Worker {
            outbox,
            accounts,
            config,
            tls,
            dispatcher,
            client: None,
            in_flight: 0,
            waiting: 0,
            hosts: HashMap::new(),
            ready: VecDeque::new(),
            flying: HashSet::new(),
            epoch: 0,
            targets: HashMap::new(),
            targets_generation: 0,
        }
    }

    fn client(&mut self) -> awc::Client {
        if let Some(client) = &self.client {
            return client.clone();
        }
        let client = delivery_client(self.tls.clone(), &self.config, 0);
        self.client = Some(client.clone());
        client
    }

    fn target(&mut self, n: &Notification) -> Result<Target, NoTarget> {
        // The number is taken before the read, so a change applied meanwhile empties the cache next time.
        let generation = self.accounts.merchants_generation();
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

    fn read_target(&self, n: &Notification) -> Result<Target, NoTarget> {
        let unusable = |why: &str| NoTarget::Unusable(why.to_owned());
        let merchant = self
            .accounts
            .merchant(&n.merchant)
            .map_err(|e| match e {
                // The store's passing trouble: asked again at the next scan.
                StoreError::Io(_)
                | StoreError::Overloaded
                | StoreError::Closed
                | StoreError::Aborted
                | StoreError::NotOwner(_) => NoTarget::Unread(e.to_string()),
                // An account that does not read (corrupt, or its key sealed under another master key) will not
                // read better next time: attempts are used up, with their waits, as for no URL.
                e => NoTarget::Unusable(format!("merchant lookup failed: {e}")),
            })?
            .ok_or_else(|| unusable("merchant not found"))?;
        let url = merchant.webhook_url.ok_or_else(|| unusable("no webhook URL configured"))?;
        let uri: Uri = url.parse().map_err(|_| unusable("webhook URL is not valid"))?;
        let host = uri.authority().map(|a| a.as_str().to_owned()).ok_or_else(|| unusable("webhook URL has no host"))?;
        Ok(Target { url, host, secret_key: merchant.secret_key })
    }

    /// Starts an attempt on a task of its own, which reports back with [`Attempted`].
    ///
    /// Not with `ctx.spawn`: an actix context polls every future spawned on it each time the actor wakes, and
    /// hanging receivers keep up to `max_in_flight_per_worker` attempts open for the whole timeout, so every
    /// message and every completed attempt paid for polling all of them, a large share of the CPU once some
    /// receivers hang (docs/perf/history.md). A task is polled only when its own I/O or timer wakes it.
    fn start(&mut self, n: Notification, fence: Option<Fence>, target: Target, ctx: &mut Context<Self>) {
        self.in_flight += 1;
        self.flying.insert(n.id.clone());
        self.hosts.entry(target.host.clone()).or_default().in_flight += 1;
        let attempt =
            attempt(self.client(), target.url, target.secret_key, n.id.clone(), n.body.clone(), self.config.clone());
        let (host, epoch, me) = (target.host, self.epoch, ctx.address());
        actix_rt::spawn(async move {
            let outcome = attempt.await;
            // Bounded by the attempts in flight, so the mailbox's bound is not needed here; if the actor is
            // gone, its restart has already handed the notification back to the dispatcher.
            me.do_send(Attempted { n, fence, host, epoch, outcome });
        });
    }

    /// Persists the attempt's outcome, then tells the dispatcher.
    ///
    /// When the outcome cannot be persisted (a full disk, the database out of reach), the stored copy is still
    /// due, and handing it back would have the dispatcher send it again, to a receiver that may have answered
    /// 200 already, for as long as the fault lasts. The outcome is kept instead and its save tried again, from
    /// a second apart to a minute apart, for up to [`MAX_RESAVING`]; the notification stays in flight
    /// meanwhile, so nothing sends it again. Past that, on an error no wait mends (a store closed, a record
    /// that does not encode), it is handed back after the wait the schedule gave this attempt, as if the save
    /// had worked, and may be delivered again: at least once.
    ///
    /// The save carries the fence under which the notification was read, and a store several nodes share
    /// refuses it once another node has taken the merchant's shard since: a node paused past its lease does
    /// not, on waking, write an older attempt's outcome over what the new holder saved. The notification then
    /// stays as the holder left it, due if it was, so the cost is at most a repeated delivery, never a lost
    /// one.
    fn record_attempt(&mut self, n: Notification, fence: Option<Fence>, outcome: AttemptOutcome) {
        let after = after_attempt(&n, &outcome, &self.config.schedule, jitter_unit());
        METRICS.delivery(match after.state {
            DeliveryState::Delivered => DeliveryResult::Delivered,
            DeliveryState::Failed => DeliveryResult::GivenUp,
            DeliveryState::Pending => DeliveryResult::Failed,
        });
        let hold = after
            .next_attempt_at
            .map_or(MAX_UNSAVED_HOLD, |at| {
                Duration::from_millis(at.unix_ms().saturating_sub(Timestamp::now().unix_ms()))
            })
            .clamp(MIN_UNSAVED_HOLD, MAX_UNSAVED_HOLD);
        let dispatcher = self.dispatcher.clone();
        let outbox = self.outbox.clone();
        let retry_at = after.next_attempt_at.map(Timestamp::unix_ms);
        // A task of its own, like the attempt (see `start`): it needs nothing of the actor, and a restart of the
        // actor's context, which drops what was spawned on it, must not drop the `Settled` the dispatcher waits
        // for (without it the notification would stay in flight there, never offered again).
        actix_rt::spawn(async move {
            let id = n.id.clone();
            let given_up_at = Instant::now() + MAX_RESAVING;
            let mut wait = MIN_UNSAVED_HOLD;
            let mut fence = fence;
            let failure = loop {
                let saved = match outbox.save_notification(&n, &after, fence) {
                    Ok(ticket) => match ticket.await {
                        Ok(Ok(())) => None,
                        Ok(Err(e)) => Some(e),
                        Err(_) => Some(StoreError::Closed),
                    },
                    Err(e) => Some(e),
                };
                let Some(error) = saved else { break None };
                let may_retry = Instant::now() + wait < given_up_at;
                match error {
                    // Refused by the fence. The embedded store opened its keyspace again after a fault (a new
                    // fence, this node still delivering): the outcome is saved under it, while the stored copy
                    // is still the one attempted. Otherwise another node holds the merchant now; the
                    // notification stays as stored there, and its holder delivers it.
                    StoreError::NotOwner(_) | StoreError::Aborted if may_retry => {
                        match still_this_nodes(outbox.as_ref(), &n, fence) {
                            Some(current) => fence = current,
                            None => {
                                tracing::info!(
                                    notification = %id,
                                    %error,
                                    "attempt's outcome not saved: the merchant's deliveries moved on"
                                );
                                break Some(error);
                            }
                        }
                    }
                    // A fault that may pass (a full disk, the database out of reach): saved again later.
                    StoreError::Io(_) | StoreError::Overloaded if may_retry => {
                        tracing::error!(
                            notification = %id,
                            %error,
                            wait_ms = wait.as_millis() as u64,
                            "attempt's outcome not persisted; saving it again"
                        );
                        actix_rt::time::sleep(wait).await;
                        wait = (wait * 2).min(MAX_UNSAVED_HOLD);
                    }
                    error => {
                        tracing::error!(
                            notification = %id,
                            %error,
                            "attempt's outcome not persisted; the attempt will be made again"
                        );
                        break Some(error);
                    }
                }
            };
            let waits = match (&failure, retry_at) {
                (Some(_), _) => Waits::AsBefore,
                (None, Some(at)) => Waits::At(at),
                (None, None) => Waits::No,
            };
            if failure.is_some() {
                actix_rt::time::sleep(hold).await;
            }
            dispatcher.do_send(Settled { id, waits });
        });
    }

    /// Starts waiting deliveries of `host` while it has room. Stopped by the worker's bound alone, the host
    /// joins [`Worker::ready`], to go on when any attempt finishes.
    fn pump(&mut self, host: &str, ctx: &mut Context<Self>) {
        loop {
            let worker_full = self.in_flight >= self.config.max_in_flight_per_worker;
            let Some(h) = self.hosts.get_mut(host) else { return };
            let limit = if h.slow { self.config.max_per_slow_host } else { self.config.max_per_host };
            if h.waiting.is_empty() {
                if h.in_flight == 0 {
                    self.hosts.remove(host);
                }
                return;
            }
            if h.in_flight >= limit {
                return;
            }
            if worker_full {
                if !h.ready {
                    h.ready = true;
                    self.ready.push_back(host.to_owned());
                }
                return;
            }
            let Some((next, fence)) = h.waiting.pop_front() else { return };
            self.waiting = self.waiting.saturating_sub(1);
            // It may have waited long: a merchant whose shard left this node since is the new holder's to
            // deliver, and an attempt made here would only be refused at its save after the receiver had it.
            if let Some(waits) = self.unless_held(&next.merchant, fence) {
                self.dispatcher.do_send(Settled { id: next.id, waits });
                continue;
            }
            match self.target(&next) {
                Ok(target) => self.start(next, fence, target, ctx),
                Err(no_target) => self.no_target(next, fence, no_target),
            }
        }
    }

    /// Puts `host` in line for the worker's room when it has deliveries waiting that its own bound would let
    /// start.
    fn wait_for_room(&mut self, host: &str) {
        let Some(h) = self.hosts.get_mut(host) else { return };
        let limit = if h.slow { self.config.max_per_slow_host } else { self.config.max_per_host };
        if h.waiting.is_empty() {
            if h.in_flight == 0 {
                self.hosts.remove(host);
            }
        } else if h.in_flight < limit && !h.ready {
            h.ready = true;
            self.ready.push_back(host.to_owned());
        }
    }

    /// Gives the worker's free room to the hosts waiting for it, in the order they began to wait.
    fn pump_ready(&mut self, ctx: &mut Context<Self>) {
        while self.in_flight < self.config.max_in_flight_per_worker {
            let Some(host) = self.ready.pop_front() else { return };
            if let Some(h) = self.hosts.get_mut(&host) {
                h.ready = false;
            }
            self.pump(&host, ctx);
        }
    }

    /// `None` while this node still delivers for `merchant` under `fence`, read before: the fence is read
    /// again after the placement, so a shard lost, or taken, since `fence` was read is seen. Otherwise where
    /// the notification, not attempted, waits: nowhere this node looks if another node holds its merchant;
    /// under its old time if this node holds it under another fence (taken again meanwhile), for the
    /// dispatcher to offer it again.
    fn unless_held(&self, merchant: &MerchantId, fence: Option<Fence>) -> Option<Waits> {
        if !self.outbox.delivers_for(merchant) {
            return Some(Waits::No);
        }
        (self.outbox.delivery_fence(merchant) != fence).then_some(Waits::AsBefore)
    }

    /// An attempt that could not even start (no URL, unknown merchant) counts as a failed attempt.
    /// A notification with nowhere to go: a failed attempt when the account has no usable URL; when the account
    /// could not be read (the store's trouble, not the merchant's), handed back for the next scan, no attempt
    /// used up.
    fn no_target(&mut self, n: Notification, fence: Option<Fence>, why: NoTarget) {
        match why {
            NoTarget::Unusable(error) => self.fail_now(n, fence, error),
            NoTarget::Unread(e) => {
                tracing::error!(notification = %n.id, error = %e, "merchant lookup failed; the next scan retries");
                self.dispatcher.do_send(Settled { id: n.id, waits: Waits::AsBefore });
            }
        }
    }

    fn fail_now(&mut self, n: Notification, fence: Option<Fence>, error: String) {
        let outcome = AttemptOutcome {
            at: Timestamp::now(),
            signed_at_s: None,
            http_status: None,
            error: Some(error),
            latency_ms: 0,
        };
        self.record_attempt(n, fence, outcome);
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
        self.ready.clear();
        self.epoch = self.epoch.wrapping_add(1);
        for id in self.flying.drain() {
            self.dispatcher.do_send(Settled { id, waits: Waits::AsBefore });
        }
        for (_, host) in self.hosts.drain() {
            for (n, _) in host.waiting {
                self.dispatcher.do_send(Settled { id: n.id, waits: Waits::AsBefore });
            }
        }
    }
}

/// The fence to save an attempt's outcome under again, after a save refused by `fence`: this node still
/// delivers for the merchant under another fence (the embedded store opened again after a fault), and the
/// stored notification is still the copy attempted. `None` when the outcome must not be saved.
fn still_this_nodes(outbox: &dyn Outbox, n: &Notification, fence: Option<Fence>) -> Option<Option<Fence>> {
    if !outbox.delivers_for(&n.merchant) {
        return None;
    }
    let current = outbox.delivery_fence(&n.merchant);
    let unchanged = outbox.notification(&n.merchant, &n.id).ok().flatten().is_some_and(|stored| stored == *n);
    (current != fence && unchanged).then_some(current)
}

/// An attempt's outcome, sent by its task to the worker that started it.
#[derive(Message)]
#[rtype(result = "()")]
struct Attempted {
    n: Notification,
    fence: Option<Fence>,
    host: String,
    epoch: u64,
    outcome: AttemptOutcome,
}

impl Handler<Attempted> for Worker {
    type Result = ();

    fn handle(&mut self, msg: Attempted, ctx: &mut Self::Context) {
        let Attempted { n, fence, host, epoch, outcome } = msg;
        // An attempt from before a restart: its notification went back to the dispatcher then, which may
        // have offered it again since; that later attempt is the one this worker settles.
        if epoch != self.epoch {
            return;
        }
        self.flying.remove(&n.id);
        self.in_flight = self.in_flight.saturating_sub(1);
        let slow = outcome.http_status.is_none();
        if let Some(h) = self.hosts.get_mut(&host) {
            h.in_flight = h.in_flight.saturating_sub(1);
            h.slow = slow;
        }
        self.record_attempt(n, fence, outcome);
        // The room this attempt frees goes to the hosts already waiting for room first: this host queues
        // behind them, so that hosts with long queues of their own do not keep the room among themselves.
        if self.ready.is_empty() {
            self.pump(&host, ctx);
        } else {
            self.wait_for_room(&host);
        }
        self.pump_ready(ctx);
    }
}

impl Handler<Deliver> for Worker {
    type Result = ();

    fn handle(&mut self, msg: Deliver, ctx: &mut Self::Context) {
        // A copy handed over from a scan or a resend may be older than the store, so the stored version is
        // read, and attempted only while still pending and due; it is also the `before` of the save, so the
        // due index stays exact. A fresh copy from the feed is the stored version already, unless it waited
        // past the window in the dispatcher's backlog, or its merchant's shard left this node of a cluster
        // meanwhile (even to come back: another node's scans may have attempted it in between, and a shard
        // taken again carries a new fence).
        let Deliver { n: copy, from } = msg;
        let id = copy.id.clone();
        // Taken before the copy is trusted or read again: the outcome's save is checked against it. Then, in a
        // cluster, only the merchant's holder attempts (a resend made on another node is left to the holder's
        // scan). The fence is read on both sides of that check and must not change: a shard lost in between
        // fails the check, and one taken in between (no fence before, a fence after) would otherwise give an
        // attempt whose save nothing checks. The dispatcher's next scan offers it again.
        let fence = self.outbox.delivery_fence(&copy.merchant);
        if let Some(waits) = self.unless_held(&copy.merchant, fence) {
            return self.dispatcher.do_send(Settled { id, waits });
        }
        let window = copy.created_at.unix_ms().saturating_add(super::dispatcher::AS_COMMITTED_WINDOW_MS);
        let trusted = match from {
            Provenance::Stored => false,
            Provenance::Feed(fed_under) => window >= Timestamp::now().unix_ms() && fence == fed_under,
        };
        let stored = if trusted { Ok(Some(copy)) } else { self.outbox.notification(&copy.merchant, &id) };
        let n = match stored {
            Ok(Some(current))
                if current.state == DeliveryState::Pending
                    && current.next_attempt_at.is_some_and(|at| at <= Timestamp::now()) =>
            {
                current
            }
            Ok(_) => return self.dispatcher.do_send(Settled { id, waits: Waits::No }),
            Err(e) => {
                tracing::error!(notification = %id, error = %e, "notification lookup failed; the next scan retries");
                return self.dispatcher.do_send(Settled { id, waits: Waits::AsBefore });
            }
        };
        let target = match self.target(&n) {
            Ok(target) => target,
            Err(no_target) => return self.no_target(n, fence, no_target),
        };
        let host = self.hosts.entry(target.host.clone()).or_default();
        let limit = if host.slow { self.config.max_per_slow_host } else { self.config.max_per_host };
        let host_full = host.in_flight >= limit;
        let worker_full = self.in_flight >= self.config.max_in_flight_per_worker;
        if !host_full && !worker_full {
            return self.start(n, fence, target, ctx);
        }
        if self.waiting >= self.config.max_waiting_per_worker {
            if host.in_flight == 0 && host.waiting.is_empty() {
                self.hosts.remove(&target.host);
            }
            // Leave it in the store; the dispatcher's next scan offers it again.
            return self.dispatcher.do_send(Settled { id: n.id, waits: Waits::AsBefore });
        }
        self.waiting += 1;
        host.waiting.push_back((n, fence));
        // Waiting for the worker's room alone: an attempt of another host may be the next to free it.
        if !host_full && !host.ready {
            host.ready = true;
            self.ready.push_back(target.host);
        }
    }
}

/// The HTTP client of deliveries: rustls with the pool's trust anchors, every step within the attempt's
/// time-out, redirects never followed; at most `connections` open at once (0: no limit).
pub(super) fn delivery_client(
    tls: std::sync::Arc<rustls::ClientConfig>,
    config: &DeliveryConfig,
    connections: usize,
) -> awc::Client {
    let connector = awc::Connector::new()
        .rustls_0_23(tls)
        .limit(connections)
        .timeout(config.timeout)
        .handshake_timeout(config.timeout);
    awc::Client::builder().connector(connector).disable_redirects().timeout(config.timeout).finish()
}

/// One HTTP attempt: its answer is the status of a response whose headers came within `config.timeout` (DNS,
/// connect, TLS, request and headers). The body is then read and dropped, for at most [`BODY_DRAIN`], only so
/// the connection can be reused: a 200 whose body is slow is still a 200, not a failure to deliver again. The
/// timestamp is taken once, here, so the one sent and the one recorded in the attempt log are the same.
pub(super) async fn attempt(
    client: awc::Client,
    url: String,
    secret_key: String,
    id: String,
    body: String,
    config: Arc<DeliveryConfig>,
) -> AttemptOutcome {
    let at = Timestamp::now();
    let signed_at_s = at.unix_s();
    let started = Instant::now();
    let sending = send(client, url, secret_key, id, body, signed_at_s, config.production);
    let result = actix_rt::time::timeout(config.timeout, sending).await;
    let latency_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let signed_at_s = Some(signed_at_s);
    match result {
        Ok(Ok(mut response)) => {
            let status = response.status().as_u16();
            let _ = actix_rt::time::timeout(BODY_DRAIN, response.body().limit(64 * 1024)).await;
            AttemptOutcome { at, signed_at_s, http_status: Some(status), error: None, latency_ms }
        }
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

/// How long an answered attempt reads the response's body (to drop it) before it lets the connection go.
const BODY_DRAIN: Duration = Duration::from_secs(2);

/// Sends the signed request; the response once its headers are in. In production the request goes to an
/// address checked for the URL's host ([`checked_addresses`]), the next one when an address cannot be
/// connected to ([`first_reached`]).
async fn send(
    client: awc::Client,
    url: String,
    secret_key: String,
    id: String,
    body: String,
    timestamp: u64,
    production: bool,
) -> Result<awc::ClientResponse, String> {
    let addresses = match production {
        true => checked_addresses(&url).await?.into_iter().map(Some).collect(),
        false => vec![None],
    };
    let signature = sign(&secret_key, timestamp, body.as_bytes());
    let standard = sign_standard(&secret_key, &id, timestamp, body.as_bytes());
    first_reached(addresses, |address| {
        let mut request = client.post(&url);
        if let Some(address) = address {
            request = request.address(address);
        }
        let sent = request
            .insert_header(("Content-Type", "application/json"))
            .insert_header((SIGNATURE_HEADER, signature.clone()))
            .insert_header((TIMESTAMP_HEADER, timestamp.to_string()))
            .insert_header((STANDARD_ID_HEADER, id.clone()))
            .insert_header((STANDARD_TIMESTAMP_HEADER, timestamp.to_string()))
            .insert_header((STANDARD_SIGNATURE_HEADER, standard.clone()))
            .send_body(body.clone());
        async move {
            sent.await.map_err(|e| match e {
                awc::error::SendRequestError::Connect(e) => Tried::Unreached(format!("could not connect: {e}")),
                e => Tried::Failed(format!("request failed: {e}")),
            })
        }
    })
    .await
}

/// Why a notification has nowhere to go just now.
enum NoTarget {
    /// The merchant's account could not be read for a passing reason (the store's I/O, a full queue): asked
    /// again at the next scan, no attempt counted.
    Unread(String),
    /// The account has no usable webhook URL: a failed attempt, as a receiver that does not answer is.
    Unusable(String),
}

/// Addresses one attempt tries at most.
const MAX_ADDRESSES_TRIED: usize = 4;

/// Why one address gave no response.
#[derive(Debug, PartialEq)]
enum Tried {
    /// No connection (refused, unreachable, TLS handshake failed): nothing of the request left, so the next
    /// address may be tried without delivering twice.
    Unreached(String),
    /// The request may have been sent: no other address is tried.
    Failed(String),
}

/// The first response of `try_one` over `addresses` in order ([`MAX_ADDRESSES_TRIED`] at most), going on to the
/// next only while an address could not be reached. A host with an address this machine cannot reach (an IPv6
/// one without an IPv6 route) listed first would otherwise fail every attempt.
async fn first_reached<A, T, F, Fut>(addresses: Vec<A>, mut try_one: F) -> Result<T, String>
where
    F: FnMut(A) -> Fut,
    Fut: std::future::Future<Output = Result<T, Tried>>,
{
    let mut last = "no address to send to".to_owned();
    for address in addresses.into_iter().take(MAX_ADDRESSES_TRIED) {
        match try_one(address).await {
            Ok(answer) => return Ok(answer),
            Err(Tried::Unreached(why)) => last = why,
            Err(Tried::Failed(why)) => return Err(why),
        }
    }
    Err(last)
}

/// Production rules at delivery time: https only, and the addresses we connect to are ones we checked, so a
/// DNS answer that changed since the URL was saved cannot point us at a private address. Every address the
/// host has must be allowed.
async fn checked_addresses(url: &str) -> Result<Vec<SocketAddr>, String> {
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
    Ok(addresses)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// Tries `addresses` where each answers per `answers` (by address), recording the order they were tried in.
    fn reach(addresses: Vec<u8>, answers: impl Fn(u8) -> Result<u8, Tried>) -> (Result<u8, String>, Vec<u8>) {
        let tried = RefCell::new(Vec::new());
        let result = actix_rt::System::new().block_on(first_reached(addresses, |a| {
            tried.borrow_mut().push(a);
            std::future::ready(answers(a))
        }));
        (result, tried.into_inner())
    }

    #[test]
    fn an_address_that_cannot_be_reached_gives_way_to_the_next() {
        let unreached = |a: u8| Tried::Unreached(format!("{a} unreachable"));
        let (result, tried) = reach(vec![1, 2, 3], |a| if a == 1 { Err(unreached(a)) } else { Ok(a) });
        assert_eq!((result, tried), (Ok(2), vec![1, 2]));
        // A request that may have left is never sent to another address.
        let (result, tried) = reach(vec![1, 2], |a| Err(Tried::Failed(format!("{a} cut"))));
        assert_eq!((result, tried), (Err("1 cut".into()), vec![1]));
        // None reached: the last reason, and no more than the bound tried.
        let (result, tried) = reach((1..=9).collect(), |a| Err(unreached(a)));
        assert_eq!(result, Err(format!("{MAX_ADDRESSES_TRIED} unreachable")));
        assert_eq!(tried.len(), MAX_ADDRESSES_TRIED);
        assert_eq!(reach(Vec::new(), Ok).0, Err("no address to send to".into()));
    }
}
