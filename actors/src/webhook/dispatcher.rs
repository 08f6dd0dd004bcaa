//! The webhook dispatcher: decides which notification is attempted when, and by which delivery actor.
//!
//! It learns of notifications two ways: the store's feed (each notification as soon as its change is durable)
//! and a periodic scan of the due index (retries, and everything still due after a restart). It hands each
//! notification to the delivery actor of its merchant's shard and remembers it as in flight until that actor
//! reports the attempt persisted, so no notification has two attempts at once. Fresh notifications that find
//! no room wait in a bounded backlog; beyond it the due index holds them until a scan.
//!
//! It also deletes delivered notifications past their retention (`DeliveryConfig::retention`): it is the one
//! place that knows which notifications are in flight, and it makes resends, so a notification being resent is
//! never deleted under it (a resend read before a deletion is saved after it, and brings it back).

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use super::config::{DeliveryConfig, DeliveryError};
use super::messages::{Deliver, FeedOverflowed, ForgetStep, Fresh, InFlightCount, Provenance, Resend, Settled, Waits};
use super::schedule::resend;
use crate::domain::ids::MerchantId;
use crate::domain::records::{DeliveryState, Notification};
use crate::domain::time::Timestamp;
use crate::store::{Commits, Outbox, StoreError};

/// Fresh notifications the workers had no room for wait here (up to this many) instead of waiting for the
/// next scan; beyond it they stay in the store's due index, which the scan reads.
const MAX_DISPATCH_BACKLOG: usize = 65_536;

/// A scan starts this long before the first entry of this node's merchants that the previous scan took, not at
/// the beginning of the due index: delivered notifications leave deleted entries behind, which fjall (an LSM
/// tree) walks on every scan until its compactions drop them, and a scan from the beginning walked hundreds of
/// thousands of them under load. The margin covers a notification committed, or resent, that long after the
/// time it is due at.
const SCAN_LOOKBACK_MS: u64 = 2_000;

/// A scan starts at the beginning of the due index this often, and after this node took merchants over, or
/// its backlog or the store's feed overflowed: whatever the margin missed (a commit slower than it, a clock
/// set back) waits no longer.
const FULL_SCAN_EVERY: Duration = Duration::from_secs(30);

/// Where scans of the due index start: a little before the first entry of this node's merchants that the
/// previous scan met and did not pass over as in flight, or earlier when an attempt handed over saved nothing
/// (it waits under its old time), or at the beginning every [`FULL_SCAN_EVERY`], after a takeover and when
/// told to rewind. Entries being delivered do not hold it back: a receiver that hangs would otherwise make
/// every scan walk everything deleted since the attempt began.
#[derive(Debug)]
struct ScanStart {
    /// The due time (ms since the epoch) of the first entry the last scan took, or where it was cut short, or
    /// its end when it took none; `None`: the next scan starts at the beginning.
    floor: Option<u64>,
    /// The last scan was cut short at `floor`: the next continues exactly there.
    resume: bool,
    /// When a scan last started at the beginning, and this node's count of takeovers then.
    full_at: Instant,
    takeovers: u64,
}

impl ScanStart {
    fn new(now: Instant, takeovers: u64) -> ScanStart {
        ScanStart { floor: None, resume: false, full_at: now, takeovers }
    }

    /// Where a scan made at `now_ms` (and `now`) starts, in ms since the epoch; 0 is the beginning.
    fn from(&self, now_ms: u64, takeovers: u64, now: Instant) -> u64 {
        match self.floor {
            Some(floor) if takeovers == self.takeovers && now.duration_since(self.full_at) < FULL_SCAN_EVERY => {
                if self.resume {
                    floor
                } else {
                    floor.min(now_ms).saturating_sub(SCAN_LOOKBACK_MS)
                }
            }
            _ => 0,
        }
    }

    /// A scan made at `now_ms` from `from` took its first entry at `first_kept` (`None`: it took none), and was
    /// cut short at `cut_at` if given.
    fn scanned(
        &mut self,
        from: u64,
        first_kept: Option<u64>,
        cut_at: Option<u64>,
        now_ms: u64,
        takeovers: u64,
        now: Instant,
    ) {
        if from == 0 {
            (self.full_at, self.takeovers) = (now, takeovers);
        }
        self.resume = cut_at.is_some();
        self.floor = Some(cut_at.or(first_kept).unwrap_or(now_ms));
    }

    /// Something due may lie anywhere before the floor: the next scan starts at the beginning.
    fn rewind(&mut self) {
        self.floor = None;
    }

    /// Something is due at `due_ms`, maybe before the floor: the next scan starts before it (at the beginning
    /// for 0, a time not known).
    fn lower(&mut self, due_ms: u64) {
        if self.floor.is_some_and(|floor| due_ms < floor) {
            self.resume = false;
        }
        self.floor = self.floor.map(|floor| floor.min(due_ms)).filter(|_| due_ms > 0);
    }
}

/// A fresh copy from the feed is attempted as it is, without reading the stored version back, when its
/// notification was made at most this long ago and no scan or resend has dispatched it since: nothing else
/// changes a notification before its first attempt. An older copy (a feed that lagged) is read back.
pub(super) const AS_COMMITTED_WINDOW_MS: u64 = 10_000;

/// The notifications made within [`AS_COMMITTED_WINDOW_MS`] that a scan or a resend dispatched, with when
/// they were made: when their fresh copy arrives after that, it is stale. Bounded by the window: older
/// entries go at each scan, and a scan dispatches at most the workers' budget.
#[derive(Default)]
struct EarlyDispatches(std::collections::HashMap<String, u64>);

impl EarlyDispatches {
    fn recent(made_ms: u64, now_ms: u64) -> bool {
        made_ms.saturating_add(AS_COMMITTED_WINDOW_MS) >= now_ms
    }

    /// A scan or a resend took the notification `id` made at `made_ms`.
    fn note(&mut self, id: &str, made_ms: u64, now_ms: u64) {
        if Self::recent(made_ms, now_ms) {
            self.0.insert(id.to_owned(), made_ms);
        }
    }

    /// Whether the fresh copy of `id`, made at `made_ms`, is the stored version: recent, and taken by no scan
    /// or resend before it came.
    fn vouch(&mut self, id: &str, made_ms: u64, now_ms: u64) -> bool {
        self.0.remove(id).is_none() && Self::recent(made_ms, now_ms)
    }

    /// Forgets what was made before the window: its fresh copy came long ago, or is read back anyway.
    fn prune(&mut self, now_ms: u64) {
        self.0.retain(|_, made_ms| Self::recent(*made_ms, now_ms));
    }
}

pub(super) struct Dispatcher {
    store: Arc<dyn Outbox>,
    /// For the count of takeovers, after which a scan starts from the beginning.
    commits: Arc<dyn Commits>,
    config: Arc<DeliveryConfig>,
    workers: Vec<Recipient<Deliver>>,
    /// Notifications handed to a worker, with the time (ms since the epoch) they were due at then.
    in_flight: HashMap<String, u64>,
    feed: Option<tokio::sync::mpsc::Receiver<Notification>>,
    /// Fresh notifications waiting for room, oldest first, each with where its copy comes from, and their
    /// ids (so a scan or a resend does not take them too).
    backlog: VecDeque<(Notification, Provenance)>,
    backlog_ids: HashSet<String>,
    /// A scan is already scheduled soon; one is enough.
    scan_soon: bool,
    /// The due index may hold notifications the last scan could not take: it filled the workers' room or was
    /// cut short, a worker refused one, or something settled or overflowed waits there since. Only then does a
    /// freed slot bring the next scan forward; otherwise fresh notifications come from the feed and retries wait for the timer, and a scan
    /// every few milliseconds would read the index for nothing.
    more_due: bool,
    /// Where the next scan of the due index starts.
    scan_start: ScanStart,
    /// What scans and resends took before its fresh copy came.
    early: EarlyDispatches,
    /// The pass deleting delivered notifications past their retention, while one runs.
    retention: Option<RetentionPass>,
}

/// Where a pass deleting delivered notifications past their retention stands. It walks the merchants in id
/// order and each one's notifications oldest first, a bounded step per message, so deliveries and resends
/// are handled between steps.
struct RetentionPass {
    /// Notifications made before this go, if delivered.
    before: Timestamp,
    /// The merchant being read; `None`: the next one after `done`.
    merchant: Option<MerchantId>,
    done: Option<MerchantId>,
    /// The last notification of `merchant` read.
    after: Option<String>,
    forgotten: u64,
    /// A step's deletion is being made durable: the next step waits for it.
    busy: bool,
}

/// Notifications read per step of a retention pass.
const FORGET_CHUNK: usize = 512;
/// Merchants without anything past retention looked at per step.
const MERCHANTS_PER_STEP: usize = 256;

impl Dispatcher {
    pub(super) fn new(
        store: Arc<dyn Outbox>,
        commits: Arc<dyn Commits>,
        config: Arc<DeliveryConfig>,
        workers: Vec<Recipient<Deliver>>,
        feed: Option<tokio::sync::mpsc::Receiver<Notification>>,
    ) -> Dispatcher {
        let takeovers = commits.takeovers();
        Dispatcher {
            store,
            commits,
            config,
            workers,
            in_flight: HashMap::new(),
            feed,
            backlog: VecDeque::new(),
            backlog_ids: HashSet::new(),
            scan_soon: false,
            more_due: true,
            scan_start: ScanStart::new(Instant::now(), takeovers),
            early: EarlyDispatches::default(),
            retention: None,
        }
    }

    fn budget(&self) -> usize {
        self.config.max_in_flight_per_worker * self.workers.len().max(1)
    }

    /// Hands `n` to its worker if there is room; gives it back otherwise (moved, not copied: the size of the
    /// error variant costs nothing here).
    #[allow(clippy::result_large_err)]
    fn dispatch(&mut self, n: Notification, from: Provenance) -> Result<(), Notification> {
        if self.in_flight.contains_key(&n.id) || n.state != DeliveryState::Pending || self.workers.is_empty() {
            return Ok(());
        }
        if self.in_flight.len() >= self.budget() {
            return Err(n);
        }
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        n.merchant.hash(&mut hasher);
        let worker = &self.workers[(hasher.finish() % self.workers.len() as u64) as usize];
        let id = n.id.clone();
        let made_ms = n.created_at.unix_ms();
        let due_ms = n.next_attempt_at.map_or(0, Timestamp::unix_ms);
        match worker.try_send(Deliver { n, from }) {
            Ok(()) => {
                if from == Provenance::Stored {
                    self.early.note(&id, made_ms, Timestamp::now().unix_ms());
                }
                self.in_flight.insert(id, due_ms);
                Ok(())
            }
            Err(SendError::Full(Deliver { n, .. }) | SendError::Closed(Deliver { n, .. })) => Err(n),
        }
    }

    /// Whether a fresh copy from the feed may be attempted as it is (see [`AS_COMMITTED_WINDOW_MS`]).
    fn provenance(&mut self, n: &Notification) -> Provenance {
        if self.early.vouch(&n.id, n.created_at.unix_ms(), Timestamp::now().unix_ms()) {
            Provenance::Feed(self.store.delivery_fence(&n.merchant))
        } else {
            Provenance::Stored
        }
    }

    /// A fresh notification: dispatched now, or queued in the backlog, or (backlog full) left to the scan.
    fn offer(&mut self, n: Notification) {
        let from = self.provenance(&n);
        if !self.backlog.is_empty() {
            self.queue(n, from);
        } else if let Err(n) = self.dispatch(n, from) {
            self.queue(n, from);
        }
        self.gauge();
    }

    /// A notification waits in the due index under `due_ms` (0: a time not known), maybe behind where scans
    /// start: the next scan starts before it, and comes soon when that time is past.
    fn waits_at(&mut self, due_ms: u64) {
        self.scan_start.lower(due_ms);
        self.more_due |= due_ms <= Timestamp::now().unix_ms();
    }

    /// Publishes how many notifications this dispatcher holds (`caisse_webhook_queue_depth`).
    fn gauge(&self) {
        let held = self.in_flight.len() + self.backlog.len();
        crate::metrics::METRICS.webhook_queue.store(held as i64, std::sync::atomic::Ordering::Relaxed);
    }

    fn queue(&mut self, n: Notification, from: Provenance) {
        if self.backlog.len() < MAX_DISPATCH_BACKLOG && self.backlog_ids.insert(n.id.clone()) {
            self.backlog.push_back((n, from));
        } else if self.backlog.len() >= MAX_DISPATCH_BACKLOG {
            // Left to the due index, maybe far behind where scans start now.
            self.scan_start.rewind();
            self.more_due = true;
        }
    }

    /// Moves the backlog to the workers while they have room.
    fn drain_backlog(&mut self) {
        while let Some((n, from)) = self.backlog.pop_front() {
            let id = n.id.clone();
            match self.dispatch(n, from) {
                Ok(()) => {
                    self.backlog_ids.remove(&id);
                }
                Err(n) => {
                    self.backlog.push_front((n, from));
                    return;
                }
            }
        }
    }

    /// Starts a retention pass unless one runs.
    fn start_retention(&mut self, keep: Duration, ctx: &mut Context<Self>) {
        if self.retention.is_some() {
            return;
        }
        let keep_ms = u64::try_from(keep.as_millis()).unwrap_or(u64::MAX);
        let before = Timestamp::from_unix_ms(Timestamp::now().unix_ms().saturating_sub(keep_ms));
        self.retention =
            Some(RetentionPass { before, merchant: None, done: None, after: None, forgotten: 0, busy: false });
        ctx.notify(ForgetStep);
    }

    /// One step of the retention pass: the next notifications past retention of the current merchant (or of the
    /// next merchants that have any), those delivered and not being delivered picked to go. `Ok(None)` when
    /// the pass is over.
    fn retention_step(&self, pass: &mut RetentionPass) -> Result<Option<Vec<Notification>>, StoreError> {
        for _ in 0..MERCHANTS_PER_STEP {
            let merchant = match &pass.merchant {
                Some(m) => m.clone(),
                None => match self.store.next_merchant_with_notifications(pass.done.as_ref())? {
                    Some(m) => {
                        pass.merchant = Some(m.clone());
                        pass.after = None;
                        m
                    }
                    None => return Ok(None),
                },
            };
            // In a cluster the node that holds a merchant delivers its notifications and forgets them.
            if !self.store.delivers_for(&merchant) {
                pass.done = pass.merchant.take();
                continue;
            }
            let read =
                self.store.notifications_made_before(&merchant, pass.before, pass.after.as_deref(), FORGET_CHUNK)?;
            let Some(last) = read.last() else {
                pass.done = pass.merchant.take();
                continue;
            };
            pass.after = Some(last.id.clone());
            let (in_flight, backlog) = (&self.in_flight, &self.backlog_ids);
            // Kept for the retention after its last delivery too: one resent by hand late in its life stays.
            let before = pass.before;
            let forget = read
                .into_iter()
                .filter(|n| n.state == DeliveryState::Delivered && n.attempts.last().is_none_or(|a| a.at < before))
                .filter(|n| !in_flight.contains_key(&n.id) && !backlog.contains(&n.id))
                .collect();
            return Ok(Some(forget));
        }
        Ok(Some(Vec::new()))
    }

    fn scan(&mut self) {
        self.scan_soon = false;
        self.early.prune(Timestamp::now().unix_ms());
        let room = self.budget().saturating_sub(self.in_flight.len());
        if room == 0 {
            self.more_due = true;
            return;
        }
        let (now, started) = (Timestamp::now(), Instant::now());
        let takeovers = self.commits.takeovers();
        let from = self.scan_start.from(now.unix_ms(), takeovers, started);
        let (in_flight, backlog) = (&self.in_flight, &self.backlog_ids);
        let skip = &mut |id: &str| in_flight.contains_key(id) || backlog.contains(id);
        match self.store.due_notifications_skipping(Timestamp::from_unix_ms(from), now, room, skip) {
            Ok(scan) => {
                let first_kept = scan.first_kept.map(Timestamp::unix_ms);
                let cut_at = scan.cut_at.map(Timestamp::unix_ms);
                self.scan_start.scanned(from, first_kept, cut_at, now.unix_ms(), takeovers, started);
                self.more_due = scan.due.len() >= room || cut_at.is_some();
                for n in scan.due {
                    if self.dispatch(n, Provenance::Stored).is_err() {
                        self.more_due = true;
                        break;
                    }
                }
            }
            Err(e) => {
                // The timer's next scan tries again; a freed slot does not bring it forward.
                self.more_due = false;
                tracing::error!(error = %e, "webhook scan failed");
            }
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
                    // Full until this receive: the writer's sends may have failed meanwhile.
                    if feed.len() + 1 >= feed.max_capacity() && me.send(FeedOverflowed).await.is_err() {
                        break;
                    }
                    if me.send(Fresh(n)).await.is_err() {
                        break;
                    }
                }
            });
        }
        ctx.run_interval(self.config.scan_every, |act, _| act.scan());
        self.scan();
        if let Some(keep) = self.config.retention {
            // A first pass soon after the start, so a server restarted more often than the interval still
            // deletes; then at every interval.
            let first = self.config.retention_every.min(Duration::from_secs(5 * 60));
            ctx.run_later(first, move |act, ctx| act.start_retention(keep, ctx));
            ctx.run_interval(self.config.retention_every, move |act, ctx| act.start_retention(keep, ctx));
        }
    }
}

impl Handler<ForgetStep> for Dispatcher {
    type Result = ResponseActFuture<Self, ()>;

    fn handle(&mut self, _: ForgetStep, ctx: &mut Self::Context) -> Self::Result {
        let Some(mut pass) = self.retention.take() else { return Box::pin(fut::ready(())) };
        if pass.busy {
            self.retention = Some(pass);
            return Box::pin(fut::ready(()));
        }
        let step = self.retention_step(&mut pass);
        let forget = match step {
            Ok(Some(forget)) => forget,
            Ok(None) => {
                if pass.forgotten > 0 {
                    tracing::info!(
                        forgotten = pass.forgotten,
                        before = %pass.before,
                        "deleted delivered notifications past their retention"
                    );
                }
                return Box::pin(fut::ready(()));
            }
            // One merchant's notifications that cannot be read are passed over, not every merchant after it.
            Err(e) => match pass.merchant.take() {
                Some(merchant) => {
                    tracing::error!(merchant = %merchant, error = %e, "notifications past retention not read; passed over");
                    pass.done = Some(merchant);
                    self.retention = Some(pass);
                    ctx.notify(ForgetStep);
                    return Box::pin(fut::ready(()));
                }
                None => {
                    tracing::error!(error = %e, "the notification retention pass stopped; the next one starts over");
                    return Box::pin(fut::ready(()));
                }
            },
        };
        let ticket = if forget.is_empty() { None } else { Some(self.store.forget_notifications(&forget)) };
        let count = forget.len() as u64;
        pass.busy = true;
        self.retention = Some(pass);
        Box::pin(
            async move {
                match ticket {
                    None => Ok(()),
                    Some(Err(e)) => Err(e),
                    Some(Ok(ticket)) => ticket.await.unwrap_or(Err(StoreError::Closed)),
                }
            }
            .into_actor(self)
            .map(move |result, act, ctx| match result {
                Ok(()) => {
                    crate::metrics::METRICS.notifications_forgotten.fetch_add(count, std::sync::atomic::Ordering::Relaxed);
                    if let Some(pass) = act.retention.as_mut() {
                        pass.forgotten += count;
                        pass.busy = false;
                    }
                    ctx.notify(ForgetStep);
                }
                Err(e) => {
                    act.retention = None;
                    tracing::error!(error = %e, "could not delete notifications past retention; the next pass tries again");
                }
            }),
        )
    }
}

impl Handler<Fresh> for Dispatcher {
    type Result = ();

    fn handle(&mut self, msg: Fresh, _: &mut Self::Context) {
        self.offer(msg.0);
    }
}

impl Handler<FeedOverflowed> for Dispatcher {
    type Result = ();

    fn handle(&mut self, _: FeedOverflowed, _: &mut Self::Context) {
        self.scan_start.rewind();
        self.more_due = true;
    }
}

impl Handler<Settled> for Dispatcher {
    type Result = ();

    /// A slot is free: feed the backlog first; when it is empty, the workers are half idle and the last scan
    /// may have left notifications behind, look at the due index soon rather than at the next tick, so a
    /// backlog after a restart or an overflow does not wait for the timer.
    fn handle(&mut self, msg: Settled, ctx: &mut Self::Context) {
        let handed_over = self.in_flight.remove(&msg.id);
        // The next scan starts before the time it waits under, and comes soon when that time is past.
        let waits = match (msg.waits, handed_over) {
            (Waits::No, _) => None,
            (Waits::AsBefore, Some(due_ms)) | (Waits::At(due_ms), _) => Some(due_ms),
            (Waits::AsBefore, None) => Some(0),
        };
        if let Some(due_ms) = waits {
            self.waits_at(due_ms);
        }
        self.drain_backlog();
        self.gauge();
        if self.more_due && self.backlog.is_empty() && !self.scan_soon && self.in_flight.len() < self.budget() / 2 {
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
            if self.in_flight.contains_key(&msg.id) || self.backlog_ids.contains(&msg.id) {
                return Err(DeliveryError::InFlight);
            }
            let before = self.store.notification(&msg.merchant, &msg.id)?.ok_or(DeliveryError::NotFound)?;
            // Another node of the cluster delivers this merchant's notifications (the engine forwards resends to
            // it, so only when the merchant moved since), and what it has in flight is not seen here: a resend
            // saved while it attempts the notification would be overwritten by that attempt's outcome. One it
            // may be attempting is answered as in flight, as the holder would.
            if !self.store.delivers_for(&msg.merchant) && holder_may_be_attempting(&before, Timestamp::now()) {
                return Err(DeliveryError::InFlight);
            }
            let after = resend(&before, Timestamp::now());
            // Its fresh copy, should it still come, is older than this resend.
            self.early.note(&before.id, before.created_at.unix_ms(), Timestamp::now().unix_ms());
            // Not fenced: a resend is the merchant's request, made on whichever node received it; the holder
            // delivers it.
            let ticket = self.store.save_notification(&before, &after, None)?;
            // Where it still waits if the resend is not saved: under its old time, if it was pending.
            let waited = before.next_attempt_at.filter(|_| before.state == DeliveryState::Pending);
            Ok((after, ticket, waited))
        })();
        match prepared {
            Err(e) => Box::pin(fut::ready(Err(e))),
            Ok((after, ticket, waited)) => {
                // Marked in flight until durable, so a scan cannot dispatch the old state meanwhile; scans pass
                // over it meanwhile, so where it waits afterwards is reported below unless it is dispatched.
                let due_ms = after.next_attempt_at.map_or(0, Timestamp::unix_ms);
                self.in_flight.insert(after.id.clone(), due_ms);
                Box::pin(ticket.into_actor(self).map(move |result, act, _| {
                    act.in_flight.remove(&after.id);
                    let saved = match result {
                        Ok(Ok(())) => Ok(()),
                        Ok(Err(e)) => Err(DeliveryError::Store(e)),
                        Err(_) => Err(DeliveryError::Stopped),
                    };
                    match saved {
                        Ok(()) => {
                            // No room now: the due index has it, and a scan soon sends it.
                            if act.dispatch(after.clone(), Provenance::Stored).is_err() {
                                act.waits_at(due_ms);
                            }
                            Ok(after)
                        }
                        Err(e) => {
                            if let Some(waited) = waited {
                                act.waits_at(waited.unix_ms());
                            }
                            Err(e)
                        }
                    }
                }))
            }
        }
    }
}

/// How soon a pending notification must be due for the node that delivers it to be maybe attempting it: its
/// scans come every half second, and a resend takes a moment to be saved.
const ABOUT_TO_BE_DUE_MS: u64 = 2_000;

/// Whether the node delivering `n` may be attempting it now: pending and due, or about to be (an attempt in
/// progress leaves it so until its outcome is saved).
fn holder_may_be_attempting(n: &Notification, now: Timestamp) -> bool {
    n.state == DeliveryState::Pending
        && n.next_attempt_at.is_some_and(|at| at.unix_ms() <= now.unix_ms().saturating_add(ABOUT_TO_BE_DUE_MS))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notification_its_holder_may_be_attempting_is_pending_and_due_or_nearly() {
        let now = Timestamp::from_unix_ms(1_800_000_000_000);
        let n = |state, next: Option<u64>| Notification {
            id: "evt_1".into(),
            merchant: MerchantId::new(),
            event: crate::domain::status::EventKind::PaymentSucceeded,
            reference: "r".into(),
            body: "{}".into(),
            created_at: now,
            state,
            next_attempt_at: next.map(Timestamp::from_unix_ms),
            attempts: Vec::new(),
            chain_attempts: 0,
            total_attempts: 0,
        };
        let ms = now.unix_ms();
        assert!(holder_may_be_attempting(&n(DeliveryState::Pending, Some(ms - 60_000)), now), "due");
        assert!(holder_may_be_attempting(&n(DeliveryState::Pending, Some(ms + 1_000)), now), "about to be");
        assert!(!holder_may_be_attempting(&n(DeliveryState::Pending, Some(ms + 60_000)), now), "waiting a retry");
        assert!(!holder_may_be_attempting(&n(DeliveryState::Failed, Some(ms)), now));
        assert!(!holder_may_be_attempting(&n(DeliveryState::Delivered, None), now));
    }

    #[test]
    fn a_fresh_copy_is_vouched_for_only_when_recent_and_taken_by_nothing_before_it() {
        let now = 1_800_000_000_000;
        let mut early = EarlyDispatches::default();
        assert!(early.vouch("evt_a", now - 5, now), "fresh, and nothing took it");
        assert!(!early.vouch("evt_b", now - AS_COMMITTED_WINDOW_MS - 1, now), "a copy the feed held too long");

        // A scan took it before its copy came: the copy is read back, once.
        early.note("evt_c", now - 5, now);
        assert!(!early.vouch("evt_c", now - 5, now));
        assert!(early.0.is_empty(), "a copy comes once: the entry goes with it");

        // Old notifications a scan retries are not remembered, and what was remembered goes with the window.
        early.note("evt_d", now - AS_COMMITTED_WINDOW_MS - 1, now);
        early.note("evt_e", now - 5, now);
        assert_eq!(early.0.len(), 1);
        early.prune(now + AS_COMMITTED_WINDOW_MS - 10);
        assert_eq!(early.0.len(), 1, "still within the window");
        early.prune(now + AS_COMMITTED_WINDOW_MS);
        assert!(early.0.is_empty());
    }

    #[test]
    fn scans_start_before_the_first_entry_met_and_at_the_beginning_when_anything_may_lie_before_it() {
        let (t0, ms) = (Instant::now(), 1_800_000_000_000);
        let mut start = ScanStart::new(t0, 0);
        assert_eq!(start.from(ms, 0, t0), 0, "the first scan reads everything");
        start.scanned(0, Some(ms - 60_000), None, ms, 0, t0);
        assert_eq!(start.from(ms + 500, 0, t0), ms - 60_000 - SCAN_LOOKBACK_MS, "before the entry it met");
        start.scanned(ms - 62_000, None, None, ms + 500, 0, t0);
        assert_eq!(
            start.from(ms + 1_000, 0, t0),
            ms + 500 - SCAN_LOOKBACK_MS,
            "before the end of a scan that met none"
        );
        // A floor ahead of the clock (set back) is not trusted beyond the clock.
        assert_eq!(start.from(ms - 10_000, 0, t0), ms - 10_000 - SCAN_LOOKBACK_MS);

        // Earlier for an attempt that saved nothing, and never later than the floor.
        start.lower(ms - 70_000);
        assert_eq!(start.from(ms + 1_000, 0, t0), ms - 70_000 - SCAN_LOOKBACK_MS);
        start.lower(ms);
        assert_eq!(start.from(ms + 1_000, 0, t0), ms - 70_000 - SCAN_LOOKBACK_MS);
        start.lower(0);
        assert_eq!(start.from(ms + 1_000, 0, t0), 0, "a time not known");
        start.scanned(0, Some(ms - 70_000), None, ms, 0, t0);

        // A scan cut short continues exactly where it stopped, until something lies before that.
        start.scanned(ms - 72_000, Some(ms - 71_000), Some(ms - 50_000), ms, 0, t0);
        assert_eq!(start.from(ms + 1_000, 0, t0), ms - 50_000);
        start.scanned(ms - 50_000, None, None, ms + 1_000, 0, t0);
        assert_eq!(start.from(ms + 1_500, 0, t0), ms + 1_000 - SCAN_LOOKBACK_MS, "then as before");
        start.scanned(ms - 72_000, None, Some(ms - 50_000), ms, 0, t0);
        start.lower(ms - 55_000);
        assert_eq!(start.from(ms + 1_000, 0, t0), ms - 55_000 - SCAN_LOOKBACK_MS);
        start.scanned(0, Some(ms - 70_000), None, ms, 0, t0);

        // From the beginning: after a takeover, after a rewind, and every FULL_SCAN_EVERY.
        assert_eq!(start.from(ms + 1_000, 1, t0), 0, "a takeover");
        start.rewind();
        assert_eq!(start.from(ms + 1_000, 0, t0), 0, "a rewind");
        start.scanned(0, None, None, ms + 1_000, 1, t0 + Duration::from_secs(1));
        assert_eq!(start.from(ms + 2_000, 1, t0 + Duration::from_secs(2)), ms + 1_000 - SCAN_LOOKBACK_MS);
        assert_eq!(start.from(ms + 2_000, 1, t0 + Duration::from_secs(1) + FULL_SCAN_EVERY), 0, "a while");
    }
}
