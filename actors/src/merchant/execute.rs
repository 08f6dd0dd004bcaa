//! The write path of the actor: finding the record a command is about, deciding and queueing the change
//! (answering at once when nothing changes or a key replays), and settling a change once its ticket completes.

use std::sync::atomic::Ordering;

use actix::prelude::*;

use super::{Execute, Executed, Idempotency, KeyUse, MerchantActor, Part};
use crate::core::{decide, Command, Decided, Record, Target};
use crate::domain::ids::new_id;
use crate::domain::links::{link_of, Link};
use crate::domain::text::IdempotencyKey;
use crate::domain::time::Timestamp;
use crate::error::EngineError;
use crate::store::{Change, IdempotencyRecord, Snapshot};

impl MerchantActor {
    /// The record a command is about: in-flight or recently settled state first, then the store.
    fn lookup(&self, target: &Target) -> Result<Option<Record>, EngineError> {
        let key = match target {
            Target::NewPayout(None) | Target::NewPayment(None) | Target::NewLink(None) => return Ok(None),
            Target::NewLink(Some(r)) => return Ok(self.link_named(r.as_str())?.map(Record::Link)),
            Target::Link(id) => return Ok(self.link_named(id)?.filter(|l| l.id == *id).map(Record::Link)),
            Target::NewPayment(Some(r)) | Target::NewPayout(Some(r)) | Target::Payment(r) => r.as_str(),
            Target::Payout(id) => id.as_str(),
        };
        let new = matches!(target, Target::NewPayment(_) | Target::NewPayout(_));
        // `dirty` also holds a payment under its refund's reference (and a payout under the merchant's); only a
        // reference that names the record itself counts for commands about an existing payment or payout.
        match self.held(key) {
            Some(record) if new => return Ok(Some(record.clone())),
            Some(record) if record.key() == key => return Ok(Some(record.clone())),
            _ => {}
        }
        let found = match target {
            // A new reference must not collide with any reference of this merchant, refunds and payouts too.
            Target::NewPayment(_) | Target::NewPayout(_) => self.store.locate(&self.id, key)?.map(|l| l.record),
            Target::Payment(_) => self.store.payment(&self.id, key)?.map(Record::Payment),
            Target::Payout(_) => self.store.payout(&self.id, key)?.map(Record::Payout),
            Target::NewLink(_) | Target::Link(_) => None,
        };
        Ok(found)
    }

    /// The link whose id or merchant reference is `key`: in-flight or recent state first, then the store.
    /// Links are held under [`link_key`], apart from payments and payouts, whose references they may share.
    pub(super) fn link_named(&self, key: &str) -> Result<Option<Link>, EngineError> {
        if let Some(Record::Link(link)) = self.held(&link_key(key)) {
            return Ok(Some(link.clone()));
        }
        Ok(self.store.link(&self.id, key)?)
    }

    /// The link a command also reads: the one a new payment names, or the one its payment was made through.
    fn linked(&self, command: &Command, current: Option<&Record>) -> Result<Option<Link>, EngineError> {
        let id = match (command, current) {
            (Command::InitiatePayment(_), _) => command.link(),
            (Command::PaymentNotice { .. }, Some(Record::Payment(p))) => link_of(&p.metadata),
            _ => None,
        };
        match id {
            Some(id) => Ok(self.link_named(id)?.filter(|l| l.id == id)),
            None => Ok(None),
        }
    }

    /// Decides and queues one change. Returns the ticket to wait for, or an immediate answer.
    pub(super) fn execute(&mut self, msg: Execute) -> Result<Reply, EngineError> {
        self.check_open()?;
        let now = Timestamp::now();
        if let Some(idem) = msg.idempotency.as_ref().filter(|i| i.part != Part::Following) {
            if self.key_in_use(&idem.key) {
                return Err(EngineError::IdempotencyKeyInUse);
            }
            if let Some(answer) = self.store.idempotency(&self.id, &idem.key)?.and_then(|first| idem.replay(first, now))
            {
                return answer.map(Reply::Now);
            }
        }
        let current = self.lookup(&msg.command.target())?;
        let link = self.linked(&msg.command, current.as_ref())?;
        let seq = self.seq + 1;
        let mut ids = new_id;
        let decided = decide(&self.balances, seq, current.as_ref(), link.as_ref(), &msg.command, now, &mut ids)
            .inspect_err(|r| {
                if r.is_bug() {
                    tracing::error!(merchant = %self.id, command = ?msg.command, rejection = %r, "invariant broken");
                }
            })?;
        let decision = match decided {
            Decided::Unchanged(record) => return self.unchanged(msg.idempotency.as_ref(), record, now),
            Decided::Changed(decision) => *decision,
        };
        let answer = || answer_of(&decision.record);
        let idempotency = match &msg.idempotency {
            // The stored answer, kept as long as it was to be, now says what this change made of the record.
            Some(idem) if idem.part == Part::Following => self
                .following_answer(idem, now)?
                .map(|first| Ok::<_, EngineError>((idem.key.clone(), IdempotencyRecord { body: answer()?, ..first })))
                .transpose()?,
            Some(idem) => {
                let record = IdempotencyRecord {
                    fingerprint: idem.fingerprint.clone(),
                    status: idem.success_status,
                    body: answer()?,
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
            linked: decision.linked.clone(),
            created: decision.created.clone(),
            outbox: decision.outbox,
            idempotency,
            snapshot,
            route: msg.note.route.and_then(|route| Some((decision.created.as_ref()?.transaction_id.clone(), route))),
            provider_reference: msg
                .note
                .reference
                .map(|reference| (answered_transaction(&msg.command, &decision.record), reference)),
            fence: self.fence,
        };
        // Queue first: if the store refuses, nothing in memory has changed.
        let ticket = self.store.commit(change, &self.guard)?;
        self.seq = seq;
        self.balances = decision.balances;
        let mut held: Vec<(String, Record)> = Vec::new();
        match &decision.record {
            Record::Link(link) => held.extend(link_keys(link)),
            record => {
                held.push((record.key().to_owned(), record.clone()));
                if let Some(created) = &decision.created {
                    for reference in std::iter::once(&created.reference).chain(&created.alias) {
                        if !held.iter().any(|(k, _)| k == reference) {
                            held.push((reference.clone(), record.clone()));
                        }
                    }
                }
            }
        }
        if let Some(link) = &decision.linked {
            held.extend(link_keys(link));
        }
        let keys: Vec<String> = held.iter().map(|(k, _)| k.clone()).collect();
        for (key, record) in held {
            self.dirty.insert(key, (record, seq));
        }
        let held = msg.idempotency.as_ref().is_some_and(|i| i.part == Part::FirstHeld);
        let key = msg.idempotency.filter(|i| i.part != Part::Following).map(|i| i.key);
        if let Some(k) = &key {
            self.keys_in_use.insert(k.clone(), KeyUse::Writing);
        }
        self.in_flight += 1;
        Ok(Reply::Wait { ticket, seq, keys, idempotency_key: key, held, record: decision.record, changed: true })
    }

    /// The stored answer of the request a later step ([`Part::Following`]) belongs to, while it is kept.
    fn following_answer(&self, idem: &Idempotency, now: Timestamp) -> Result<Option<IdempotencyRecord>, EngineError> {
        Ok(self
            .store
            .idempotency(&self.id, &idem.key)?
            .filter(|first| first.is_live(now) && first.fingerprint == idem.fingerprint))
    }

    /// A command that changes nothing answers the record as it is. When it is a later step of a request whose
    /// answer is stored and says otherwise (a provider's notice moved the record before this step came), that
    /// answer is written again first, so that a replay of the request answers what the request did.
    fn unchanged(
        &mut self,
        idempotency: Option<&Idempotency>,
        record: Record,
        now: Timestamp,
    ) -> Result<Reply, EngineError> {
        let Some(idem) = idempotency.filter(|i| i.part == Part::Following) else {
            return Ok(Reply::Now(Executed::Done(record)));
        };
        let Some(first) = self.following_answer(idem, now)? else {
            return Ok(Reply::Now(Executed::Done(record)));
        };
        let body = answer_of(&record)?;
        if first.body == body {
            return Ok(Reply::Now(Executed::Done(record)));
        }
        let ticket = self.store.rewrite_answer(
            &self.id,
            &idem.key,
            &IdempotencyRecord { body, ..first },
            &self.guard,
            self.fence,
        )?;
        self.in_flight += 1;
        let seq = self.seq;
        Ok(Reply::Wait { ticket, seq, keys: Vec::new(), idempotency_key: None, held: false, record, changed: false })
    }

    /// Whether a request with `key` is still running: its write in flight, or written and going on
    /// ([`Part::FirstHeld`](super::Part)). Holds past their time are dropped here.
    pub(super) fn key_in_use(&mut self, key: &IdempotencyKey) -> bool {
        let now = std::time::Instant::now();
        self.keys_in_use.retain(|_, used| !matches!(used, KeyUse::Held { until } if *until <= now));
        self.keys_in_use.contains_key(key)
    }

    /// A request that held its key is over: a request with the key is a replay from now on. A key being
    /// written is another request's, and stays.
    pub(super) fn release_key(&mut self, key: &IdempotencyKey) {
        if matches!(self.keys_in_use.get(key), Some(KeyUse::Held { .. })) {
            self.keys_in_use.remove(key);
        }
    }

    /// Called in order of completion of each ticket, on the actor's own thread.
    pub(super) fn finish_commit(
        &mut self,
        seq: u64,
        keys: &[String],
        idempotency_key: Option<&IdempotencyKey>,
        held: bool,
        ok: bool,
        ctx: &mut Context<Self>,
    ) {
        self.in_flight = self.in_flight.saturating_sub(1);
        let now = std::time::Instant::now();
        for key in keys {
            if self.dirty.get(key).is_some_and(|(_, s)| *s == seq) {
                if let Some((record, _)) = self.dirty.remove(key) {
                    if ok {
                        self.recent.settled(key.clone(), record, now);
                    }
                }
            }
        }
        if !ok {
            // The actor stops once its writes settle; until then it answers from what the store holds.
            self.recent.clear();
        }
        if let Some(k) = idempotency_key {
            // Its request goes on with its provider: the key stays in use until it is released.
            match held && ok {
                true => self.keys_in_use.insert(k.clone(), KeyUse::Held { until: now + super::KEY_HELD_AT_MOST }),
                false => self.keys_in_use.remove(k),
            };
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
}

/// What a request that made or moved `record` answers, as its idempotency record keeps it.
fn answer_of(record: &Record) -> Result<String, EngineError> {
    match record {
        Record::Payment(p) => serde_json::to_string(p),
        Record::Payout(o) => serde_json::to_string(o),
        Record::Link(l) => serde_json::to_string(l),
    }
    .map_err(|e| EngineError::Internal(format!("idempotent answer: {e}")))
}

/// The transaction a provider's answer is about: the refund's for a refund notice, else the record's own.
fn answered_transaction(command: &Command, record: &Record) -> String {
    match (command, record) {
        (Command::RefundNotice { refund, .. }, Record::Payment(p)) => match p.refund_named(refund) {
            Some(refund) => refund.transaction_id(),
            None => p.transaction_id.clone(),
        },
        (_, Record::Payment(p)) => p.transaction_id.clone(),
        (_, Record::Payout(o)) => o.transaction_id.clone(),
        (_, Record::Link(l)) => l.id.clone(),
    }
}

/// The key `dirty` holds a link under: `#` cannot start a payment reference or a payout id, so a link never
/// hides one of those, nor one of them a link.
fn link_key(id_or_reference: &str) -> String {
    format!("#{id_or_reference}")
}

/// Every key a link is found by in `dirty`: its id and its merchant reference.
fn link_keys(link: &Link) -> Vec<(String, Record)> {
    std::iter::once(link.id.as_str())
        .chain(link.reference.as_ref().map(|r| r.as_str()))
        .map(|key| (link_key(key), Record::Link(link.clone())))
        .collect()
}

pub(super) enum Reply {
    Now(Executed),
    Wait {
        ticket: crate::store::Ticket,
        seq: u64,
        keys: Vec<String>,
        idempotency_key: Option<IdempotencyKey>,
        /// The key stays in use once written ([`Part::FirstHeld`](super::Part)).
        held: bool,
        record: Record,
        /// Whether the write moves the record (`false`: only a stored answer written again).
        changed: bool,
    },
}
