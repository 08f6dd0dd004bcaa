//! The merchant actor: one per merchant account, the only writer of that merchant's balances and records.
//!
//! A message is handled in three steps: look up the record the command is about, call the pure
//! [`crate::core::decide`], queue the resulting change for the store's group commit. The actor then moves on to
//! its next message while the disk catches up (pipelining), and the reply to the caller waits for the change's
//! ticket: nobody hears "yes" before the change is durable.
//!
//! Pipelining means the actor's memory runs ahead of the disk by the changes in flight. Three rules keep that
//! safe. Records with a write in flight are kept in `dirty`, so the next command sees them. Reads, and answers
//! that change nothing (duplicate notices, idempotent replays), wait until every change decided before them
//! is durable, so they never show what a crash could undo. And if a write
//! fails, the store refuses every later write of this actor (its [`FailureLatch`]), the actor refuses new work,
//! and once its in-flight writes have settled it stops; the next message starts a fresh actor from the store.
//!
//! Nothing in a handler panics: a panic would stop the actor for good and lose its mailbox.
//!
//! Records whose write has settled stay in memory a short while ([`Recent`]): the next command about a payment
//! usually comes seconds after the last (its provider's answer after its creation), and the actor, the only
//! writer of its merchant's records, knows them to be what the store holds. With PostgreSQL that saves a round
//! trip; with sled, a read of its cache.
//!
//! This file holds the actor's state, its life cycle and the read barrier; `messages` holds what callers send
//! and get back, `execute` decides and queues a change and settles it once its ticket completes, and
//! `handlers` holds one short handler per message.

mod execute;
mod handlers;
mod messages;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::watch;

use crate::core::Record;
use crate::domain::ids::MerchantId;
use crate::domain::ledger::Balances;
use crate::domain::text::IdempotencyKey;
use crate::error::EngineError;
use crate::registry::Registry;
use crate::store::{FailureLatch, Fence, Store};

pub use messages::{
    Execute, Executed, ForgetIdempotency, GetBalances, GetLink, GetPayment, GetPayout, Idempotency, Part, ProviderNote,
    ReleaseKey, KEY_HELD_AT_MOST,
};

/// Why a request's idempotency key is in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyUse {
    /// Its request's change is being made durable.
    Writing,
    /// Its request's change is written and the request goes on ([`Part::FirstHeld`]): until its
    /// release, or this instant at the latest.
    Held { until: Instant },
}

/// Tuning of every merchant actor.
#[derive(Debug, Clone, Copy)]
pub struct ActorSettings {
    /// Messages that may wait in one merchant's mailbox; senders wait beyond it (backpressure).
    pub mailbox_capacity: usize,
    /// A snapshot of the balances is written with every N-th journal event.
    pub snapshot_every: u64,
    /// An actor with nothing to do for this long stops, so idle merchants cost no memory.
    pub idle_stop: Duration,
}

impl Default for ActorSettings {
    fn default() -> Self {
        ActorSettings { mailbox_capacity: 256, snapshot_every: 1_000, idle_stop: Duration::from_secs(300) }
    }
}

pub struct MerchantActor {
    id: MerchantId,
    generation: u64,
    store: Arc<dyn Store>,
    registry: Registry<MerchantActor>,
    settings: ActorSettings,
    balances: Balances,
    /// Last journal position decided (durable or in flight).
    seq: u64,
    /// Records changed by writes still in flight, by payment reference, refund reference or payout id, with
    /// the journal position of their latest change.
    dirty: HashMap<String, (Record, u64)>,
    /// Records whose latest write has settled, for a short while.
    recent: Recent,
    /// Idempotency keys of requests still running: their write in flight, or written and going on.
    keys_in_use: HashMap<IdempotencyKey, KeyUse>,
    in_flight: usize,
    guard: FailureLatch,
    /// The ownership the actor's state was read under in a cluster; every change carries it, so a write made
    /// after another node took the merchant over fails instead of landing on state this actor never saw.
    fence: Option<Fence>,
    durable: watch::Sender<u64>,
    last_message: Instant,
    /// Set when the actor leaves the registry; from then on it refuses everything and the engine retries on
    /// a fresh actor, so two actors never write for one merchant.
    retired: bool,
}

impl MerchantActor {
    pub(crate) fn new(
        id: MerchantId,
        generation: u64,
        store: Arc<dyn Store>,
        registry: Registry<MerchantActor>,
        settings: ActorSettings,
        recovered: crate::store::Recovered,
    ) -> MerchantActor {
        let (durable, _) = watch::channel(recovered.seq);
        MerchantActor {
            id,
            generation,
            store,
            registry,
            settings,
            balances: recovered.balances,
            seq: recovered.seq,
            dirty: HashMap::new(),
            recent: Recent::default(),
            keys_in_use: HashMap::new(),
            in_flight: 0,
            guard: Arc::new(AtomicBool::new(false)),
            fence: recovered.fence,
            durable,
            last_message: Instant::now(),
            retired: false,
        }
    }

    /// The record held under `key` by a write in flight, or else by one that settled recently.
    fn held(&self, key: &str) -> Option<&Record> {
        self.dirty.get(key).map(|(record, _)| record).or_else(|| self.recent.get(key))
    }

    fn failed(&self) -> bool {
        self.guard.load(Ordering::Acquire)
    }

    /// Leaves the registry and stops. Only called with no write in flight.
    fn retire(&mut self, ctx: &mut Context<Self>) {
        self.retired = true;
        self.registry.forget(&self.id, self.generation);
        ctx.stop();
    }

    /// False once this node no longer holds the merchant with the token the actor's state was read under (in a
    /// cluster: the shard moved, or its lease may have ended during a pause). The actor then answers nothing
    /// from memory: the engine asks a fresh actor, or forwards.
    fn still_holds(&self) -> bool {
        self.store.fence_of(&self.id) == self.fence
    }

    /// Refuses work when retired or no longer the merchant's holder (the engine retries elsewhere) or after a
    /// failed write (503).
    fn check_open(&self) -> Result<(), EngineError> {
        if self.retired || !self.still_holds() {
            Err(EngineError::Retired)
        } else if self.failed() {
            Err(EngineError::Unavailable("an earlier write failed; retry".into()))
        } else {
            Ok(())
        }
    }

    /// A future that resolves once everything decided so far is durable. If one of those writes fails, the
    /// actor retires once the rest settle, and the future answers [`EngineError::Retired`]: what it was to
    /// show may rest on the lost write, and the engine asks a fresh actor, which reloads from the store.
    fn barrier(&self) -> impl std::future::Future<Output = Result<(), EngineError>> + 'static {
        let target = self.seq;
        let mut rx = self.durable.subscribe();
        async move { rx.wait_for(|durable| *durable >= target).await.map(|_| ()).map_err(|_| EngineError::Retired) }
    }

    /// Answers `value` once the writes it may reflect are durable. A read is never refused because a write
    /// failed: it waits for this actor to retire and is answered by the next one (see [`Self::barrier`]).
    fn read<T: 'static>(&mut self, value: Result<T, EngineError>) -> ResponseFuture<Result<T, EngineError>> {
        if self.retired || !self.still_holds() {
            return Box::pin(async move { Err(EngineError::Retired) });
        }
        let barrier = self.barrier();
        Box::pin(async move {
            let value = value?;
            barrier.await?;
            Ok(value)
        })
    }
}

/// Records the actor wrote and saw settle, by the keys `dirty` held them under, kept at most [`Recent::KEEP`]
/// and [`Recent::MAX`] of them: what one actor holds stays bounded whatever its merchant's rate (the process
/// holds about 30 s of its commits, at most 4,096 records per active merchant, a few megabytes for the busiest;
/// an idle actor drops its records at its next check, within a quarter of its idle time).
///
/// The bound is sized for a busy merchant: between a payment's creation settling and its provider's answer,
/// every other change the merchant makes settles too, and a record pushed out by them costs the answer a read
/// of the store, during which the actor waits. With PostgreSQL that round trip is what limited one busy
/// merchant: the engine bench's hot merchant (4,096 payments in flight) did about 27 k events/s when 256
/// records were kept, and about 35 k with 4,096.
///
/// They are what the store holds because nothing else writes a merchant's records: another actor for the same
/// merchant starts only once this one has left the registry, and in a cluster this one answers nothing once
/// its node no longer holds the merchant with the token its state was read under.
///
/// The records live behind a box made at the first settled write and dropped once they are all pruned: most
/// actors are idle, and an idle actor then pays one pointer for this cache instead of two empty collections.
#[derive(Default)]
struct Recent(Option<Box<RecentRecords>>);

#[derive(Default)]
struct RecentRecords {
    records: HashMap<String, (Record, Instant)>,
    /// Keys in the order they were settled, each with the time it was; a key settled again appears twice and
    /// is dropped only by its latest entry.
    order: VecDeque<(Instant, String)>,
}

impl Recent {
    const KEEP: Duration = Duration::from_secs(30);
    const MAX: usize = 4096;

    fn get(&self, key: &str) -> Option<&Record> {
        self.0.as_ref()?.records.get(key).map(|(record, _)| record)
    }

    fn settled(&mut self, key: String, record: Record, now: Instant) {
        let kept = self.0.get_or_insert_with(Box::default);
        kept.records.insert(key.clone(), (record, now));
        kept.order.push_back((now, key));
        self.prune(now);
    }

    /// Drops what is older than [`Recent::KEEP`], then the oldest beyond [`Recent::MAX`].
    fn prune(&mut self, now: Instant) {
        let Some(kept) = self.0.as_mut() else { return };
        while let Some((at, _)) = kept.order.front() {
            let old = now.saturating_duration_since(*at) >= Self::KEEP;
            if !old && kept.records.len() <= Self::MAX && kept.order.len() <= 2 * Self::MAX {
                break;
            }
            let Some((at, key)) = kept.order.pop_front() else { break };
            if kept.records.get(&key).is_some_and(|(_, settled)| *settled == at) {
                kept.records.remove(&key);
            }
        }
        if kept.order.is_empty() {
            self.0 = None;
        }
    }

    fn clear(&mut self) {
        self.0 = None;
    }
}

impl Actor for MerchantActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(self.settings.mailbox_capacity);
        let every = (self.settings.idle_stop / 4).max(Duration::from_millis(50));
        ctx.run_interval(every, |act, ctx| {
            act.recent.prune(Instant::now());
            if act.in_flight == 0 && !act.retired && act.last_message.elapsed() >= act.settings.idle_stop {
                act.retire(ctx);
            }
        });
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        self.registry.forget(&self.id, self.generation);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::records::tests::sample_payment;

    fn record() -> Record {
        Record::Payment(sample_payment())
    }

    #[test]
    fn recent_records_are_kept_for_a_while_and_a_bounded_number() {
        let mut recent = Recent::default();
        let t0 = Instant::now();
        recent.settled("a".into(), record(), t0);
        assert!(recent.get("a").is_some());
        recent.prune(t0 + Recent::KEEP - Duration::from_millis(1));
        assert!(recent.get("a").is_some(), "kept until its time");
        recent.prune(t0 + Recent::KEEP);
        assert!(recent.get("a").is_none(), "dropped after it");
        assert!(recent.0.is_none(), "nothing left: the memory is given back");

        for i in 0..Recent::MAX + 10 {
            recent.settled(format!("k{i}"), record(), t0 + Recent::KEEP);
        }
        assert_eq!(
            recent.0.as_ref().map(|kept| kept.records.len()),
            Some(Recent::MAX),
            "the oldest go beyond the maximum"
        );
        assert!(recent.get("k0").is_none() && recent.get(&format!("k{}", Recent::MAX + 9)).is_some());
    }

    #[test]
    fn a_key_settled_again_lives_from_its_latest_write() {
        let mut recent = Recent::default();
        let t0 = Instant::now();
        recent.settled("a".into(), record(), t0);
        let later = t0 + Duration::from_secs(20);
        recent.settled("a".into(), record(), later);
        recent.prune(t0 + Recent::KEEP);
        assert!(recent.get("a").is_some(), "the first entry's expiry does not drop the second write");
        recent.prune(later + Recent::KEEP);
        assert!(recent.get("a").is_none());
        assert!(recent.0.is_none());
    }

    /// Most actors are idle; what each of them holds inline is its cost. This is the actor's own part of the
    /// engine bench's memory per idle actor, so a field that grows it is seen here first.
    #[test]
    fn an_idle_actor_stays_small() {
        assert_eq!(std::mem::size_of::<Recent>(), 8);
        let size = std::mem::size_of::<MerchantActor>();
        assert!(size <= 300, "a merchant actor holds {size} bytes inline");
    }
}
