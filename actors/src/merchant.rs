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
//! fails, the store refuses every later write of this actor (its [`WriteGuard`]), the actor refuses new work,
//! and once its in-flight writes have settled it stops; the next message starts a fresh actor from the store.
//!
//! Nothing in a handler panics: a panic would stop the actor for good and lose its mailbox.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::watch;

use crate::core::{decide, Command, Decided, Record, Target};
use crate::domain::ids::{new_id, MerchantId};
use crate::domain::ledger::Balances;
use crate::domain::records::{Payment, Payout};
use crate::domain::text::IdempotencyKey;
use crate::domain::time::Timestamp;
use crate::error::EngineError;
use crate::registry::Registry;
use crate::store::{Change, IdempotencyRecord, Snapshot, Store, StoreError, WriteGuard};

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

/// The idempotency part of a request (contract 4): the key, what identifies the request, and the status the
/// API answers on success (stored with the body so that a replay is the first answer again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idempotency {
    pub key: IdempotencyKey,
    pub fingerprint: String,
    pub success_status: u16,
}

/// The answer to a change.
// Moved once per request, never stored in bulk: the size difference costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Executed {
    /// The change was applied (or was a no-op duplicate notice); the record as it now is.
    Done(Record),
    /// The idempotency key was seen with the same request: the first answer, as it was.
    Replayed { status: u16, body: String },
}

/// Every change the contract names reaches the actor as this message; the variants of [`Command`] are the
/// individual changes (initiate, processing, confirm, decline, expire, late success, refund request /
/// complete / fail, payout create / process / reject).
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Executed, EngineError>")]
pub struct Execute {
    pub command: Command,
    pub idempotency: Option<Idempotency>,
}

/// Read a payment, as durable.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Option<Payment>, EngineError>")]
pub struct GetPayment(pub String);

/// Read a payout, as durable.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Option<Payout>, EngineError>")]
pub struct GetPayout(pub String);

/// Read every balance, as durable.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Balances, EngineError>")]
pub struct GetBalances;

pub struct MerchantActor {
    id: MerchantId,
    generation: u64,
    store: Arc<dyn Store>,
    registry: Registry,
    settings: ActorSettings,
    balances: Balances,
    /// Last journal position decided (durable or in flight).
    seq: u64,
    /// Records changed by writes still in flight, by payment reference, refund reference or payout id, with
    /// the journal position of their latest change.
    dirty: HashMap<String, (Record, u64)>,
    /// Idempotency keys of requests whose write is in flight.
    keys_in_flight: HashMap<IdempotencyKey, u64>,
    in_flight: usize,
    guard: WriteGuard,
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
        registry: Registry,
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
            keys_in_flight: HashMap::new(),
            in_flight: 0,
            guard: Arc::new(AtomicBool::new(false)),
            durable,
            last_message: Instant::now(),
            retired: false,
        }
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

    /// Refuses work when retired (the engine retries elsewhere) or after a failed write (503).
    fn check_open(&self) -> Result<(), EngineError> {
        if self.retired {
            Err(EngineError::Retired)
        } else if self.failed() {
            Err(EngineError::Unavailable("an earlier write failed; retry".into()))
        } else {
            Ok(())
        }
    }

    /// The record a command is about: in-flight state first, then the store.
    fn lookup(&self, target: &Target) -> Result<Option<Record>, EngineError> {
        let key = match target {
            Target::NewPayout => return Ok(None),
            Target::NewPayment(None) => return Ok(None),
            Target::NewPayment(Some(r)) | Target::Payment(r) => r.as_str(),
            Target::Payout(id) => id.as_str(),
        };
        // `dirty` also holds a payment under its refund's reference; only a reference that names the record
        // itself counts for commands about an existing payment or payout.
        match (self.dirty.get(key), target) {
            (Some((record, _)), Target::NewPayment(_)) => return Ok(Some(record.clone())),
            (Some((record, _)), _) if record.key() == key => return Ok(Some(record.clone())),
            _ => {}
        }
        let found = match target {
            // A new reference must not collide with any reference of this merchant, refunds and payouts too.
            Target::NewPayment(_) => self.store.locate(&self.id, key)?.map(|l| l.record),
            Target::Payment(_) => self.store.payment(&self.id, key)?.map(Record::Payment),
            Target::Payout(_) => self.store.payout(&self.id, key)?.map(Record::Payout),
            Target::NewPayout => None,
        };
        Ok(found)
    }

    /// Decides and queues one change. Returns the ticket to wait for, or an immediate answer.
    fn execute(&mut self, msg: Execute) -> Result<Pending, EngineError> {
        self.check_open()?;
        let now = Timestamp::now();
        if let Some(idem) = &msg.idempotency {
            if self.keys_in_flight.contains_key(&idem.key) {
                return Err(EngineError::IdempotencyKeyInUse);
            }
            if let Some(first) = self.store.idempotency(&self.id, &idem.key)?.filter(|r| r.is_live(now)) {
                return if first.fingerprint == idem.fingerprint {
                    Ok(Pending::Now(Executed::Replayed { status: first.status, body: first.body }))
                } else {
                    Err(EngineError::IdempotencyKeyReused)
                };
            }
        }
        let current = self.lookup(&msg.command.target())?;
        let seq = self.seq + 1;
        let mut ids = new_id;
        let decision = match decide(&self.balances, seq, current.as_ref(), &msg.command, now, &mut ids)? {
            Decided::Unchanged(record) => return Ok(Pending::Now(Executed::Done(record))),
            Decided::Changed(decision) => *decision,
        };
        let idempotency = match &msg.idempotency {
            Some(idem) => {
                let body = match &decision.record {
                    Record::Payment(p) => serde_json::to_string(p),
                    Record::Payout(o) => serde_json::to_string(o),
                }
                .map_err(|e| EngineError::Internal(format!("idempotent answer: {e}")))?;
                let record = IdempotencyRecord {
                    fingerprint: idem.fingerprint.clone(),
                    status: idem.success_status,
                    body,
                    created_at: now,
                };
                Some((idem.key.clone(), record))
            }
            None => None,
        };
        let snapshot = seq
            .is_multiple_of(self.settings.snapshot_every.max(1))
            .then(|| Snapshot { seq, balances: decision.balances.clone() });
        let change = Change {
            merchant: self.id.clone(),
            journal: decision.journal,
            record: decision.record.clone(),
            created: decision.created.clone(),
            outbox: decision.outbox,
            idempotency,
            snapshot,
        };
        // Queue first: if the store refuses, nothing in memory has changed.
        let ticket = self.store.commit(change, &self.guard)?;
        self.seq = seq;
        self.balances = decision.balances;
        let mut keys = vec![decision.record.key().to_owned()];
        if let Some(created) = &decision.created {
            if created.reference != keys[0] {
                keys.push(created.reference.clone());
            }
        }
        for key in &keys {
            self.dirty.insert(key.clone(), (decision.record.clone(), seq));
        }
        let key = msg.idempotency.map(|i| i.key);
        if let Some(k) = &key {
            self.keys_in_flight.insert(k.clone(), seq);
        }
        self.in_flight += 1;
        Ok(Pending::Wait { ticket, seq, keys, idempotency_key: key, record: decision.record })
    }

    /// Called in order of completion of each ticket, on the actor's own thread.
    fn settle(
        &mut self,
        seq: u64,
        keys: &[String],
        idempotency_key: Option<&IdempotencyKey>,
        ok: bool,
        ctx: &mut Context<Self>,
    ) {
        self.in_flight = self.in_flight.saturating_sub(1);
        for key in keys {
            if self.dirty.get(key).is_some_and(|(_, s)| *s == seq) {
                self.dirty.remove(key);
            }
        }
        if let Some(k) = idempotency_key {
            self.keys_in_flight.remove(k);
        }
        if ok {
            self.durable.send_if_modified(|d| {
                let advanced = seq > *d;
                *d = (*d).max(seq);
                advanced
            });
        } else {
            self.guard.store(true, Ordering::Release);
        }
        if self.failed() && self.in_flight == 0 {
            tracing::warn!(merchant = %self.id, "stopping after a failed write; the next message reloads from the store");
            self.retire(ctx);
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
        if self.retired {
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

enum Pending {
    Now(Executed),
    Wait {
        ticket: crate::store::Ticket,
        seq: u64,
        keys: Vec<String>,
        idempotency_key: Option<IdempotencyKey>,
        record: Record,
    },
}

impl Actor for MerchantActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(self.settings.mailbox_capacity);
        let every = (self.settings.idle_stop / 4).max(Duration::from_millis(50));
        ctx.run_interval(every, |act, ctx| {
            if act.in_flight == 0 && !act.retired && act.last_message.elapsed() >= act.settings.idle_stop {
                act.retire(ctx);
            }
        });
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        self.registry.forget(&self.id, self.generation);
    }
}

impl Handler<Execute> for MerchantActor {
    type Result = ResponseActFuture<Self, Result<Executed, EngineError>>;

    fn handle(&mut self, msg: Execute, _ctx: &mut Self::Context) -> Self::Result {
        self.last_message = Instant::now();
        match self.execute(msg) {
            Err(err) => Box::pin(fut::ready(Err(err))),
            // A duplicate notice or an idempotent replay changes nothing, but the state it reports may come
            // from writes still in flight: answer only once they are durable, like a read.
            Ok(Pending::Now(answer)) => {
                let barrier = self.barrier();
                Box::pin(fut::wrap_future(async move {
                    barrier.await?;
                    Ok(answer)
                }))
            }
            Ok(Pending::Wait { ticket, seq, keys, idempotency_key, record }) => {
                Box::pin(ticket.into_actor(self).map(move |result, act, ctx| {
                    let result = match result {
                        Ok(Ok(())) => Ok(()),
                        Ok(Err(err)) => Err(err),
                        Err(_) => Err(StoreError::Closed),
                    };
                    act.settle(seq, &keys, idempotency_key.as_ref(), result.is_ok(), ctx);
                    match result {
                        Ok(()) => Ok(Executed::Done(record)),
                        Err(err) => {
                            tracing::error!(merchant = %act.id, seq, error = %err, "change not durable");
                            Err(EngineError::from(err))
                        }
                    }
                }))
            }
        }
    }
}

impl Handler<GetPayment> for MerchantActor {
    type Result = ResponseFuture<Result<Option<Payment>, EngineError>>;

    fn handle(&mut self, msg: GetPayment, _ctx: &mut Self::Context) -> Self::Result {
        self.last_message = Instant::now();
        let found = match self.dirty.get(&msg.0) {
            Some((Record::Payment(p), _)) if p.reference.as_str() == msg.0 => Ok(Some(p.clone())),
            _ => self.store.payment(&self.id, &msg.0).map_err(EngineError::from),
        };
        self.read(found)
    }
}

impl Handler<GetPayout> for MerchantActor {
    type Result = ResponseFuture<Result<Option<Payout>, EngineError>>;

    fn handle(&mut self, msg: GetPayout, _ctx: &mut Self::Context) -> Self::Result {
        self.last_message = Instant::now();
        let found = match self.dirty.get(&msg.0) {
            Some((Record::Payout(o), _)) => Ok(Some(o.clone())),
            _ => self.store.payout(&self.id, &msg.0).map_err(EngineError::from),
        };
        self.read(found)
    }
}

impl Handler<GetBalances> for MerchantActor {
    type Result = ResponseFuture<Result<Balances, EngineError>>;

    fn handle(&mut self, _msg: GetBalances, _ctx: &mut Self::Context) -> Self::Result {
        self.last_message = Instant::now();
        let balances = self.balances.clone();
        self.read(Ok(balances))
    }
}
