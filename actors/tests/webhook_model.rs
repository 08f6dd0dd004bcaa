//! A model of webhook delivery around the pure schedule functions, with crashes.
//!
//! The world: a simulated clock, a simulated durable store (notifications by id, and a due index kept the way
//! the embedded store keeps it: `save` removes the entry of the version the caller read and adds the entry of the
//! version it writes), and a model dispatcher whose memory (attempts under way, outcomes decided but not yet
//! saved) a crash wipes. Receivers answer 200, 204, 302, 500 or time out. Every step of any interleaving of
//! new notifications, dispatches, answers, saves, resends, late answers for settled chains, clock moves and
//! crashes is followed by a check of every notification in the store; at the end the clock runs past the
//! schedule's end with no more crashes, and every notification must have settled.
//!
//! What is checked, against a ledger of the attempts each persisted version added:
//! - never lost: every created id is in the store;
//! - never an attempt recorded after a 200 in the same chain, and `delivered` only after a 200 that ends the
//!   chain, `failed` only after the schedule's last attempt;
//! - `chain_attempts <= schedule.attempts()`, `next_attempt_at` is `Some` exactly when `pending`;
//! - the attempts log is bounded by `MAX_LOGGED_ATTEMPTS`, is the latest attempts in order, and
//!   `total_attempts` counts them all (`>= attempts.len()`);
//! - the due index names exactly the pending notifications, at their `next_attempt_at`.

use std::collections::{BTreeMap, BTreeSet};

use caisse_engine::domain::ids::MerchantId;
use caisse_engine::domain::records::{DeliveryState, Notification};
use caisse_engine::domain::status::EventKind;
use caisse_engine::domain::time::Timestamp;
use caisse_engine::webhook::schedule::{
    after_attempt, resend, AttemptOutcome, RetrySchedule, DEFAULT_WAITS_MS, MAX_LOGGED_ATTEMPTS,
};
use proptest::prelude::*;

const T0: u64 = 1_700_000_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Status(u16),
    Timeout,
}

#[derive(Debug, Clone)]
enum Op {
    /// A change commits with its notification: durable at once, due now.
    Create,
    /// The dispatcher starts an attempt for every due notification it is not already handling.
    Dispatch,
    /// One attempt under way gets its answer; the outcome waits to be saved.
    Answer(usize, Answer, f64),
    /// One decided outcome (attempt or resend) becomes durable.
    Save(usize),
    /// The dashboard's resend of a stored notification (refused while it is being handled).
    Resend(usize),
    /// An attempt result arriving for a chain that has already settled.
    Late(usize, Answer, f64),
    Advance(u64),
    /// The process dies: attempts under way and unsaved outcomes are gone.
    Crash,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Attempt,
    Resend,
}

/// An outcome decided in memory, not yet durable.
#[derive(Debug, Clone)]
struct Unsaved {
    before: Notification,
    after: Notification,
    kind: Kind,
}

struct World {
    schedule: RetrySchedule,
    now: u64,
    next_id: u64,
    created: Vec<String>,
    /// Durable.
    store: BTreeMap<String, Notification>,
    due: BTreeSet<(u64, String)>,
    /// Checker's ledger, per id: the http status of every persisted attempt, one list per chain.
    chains: BTreeMap<String, Vec<Vec<Option<u16>>>>,
    /// Memory (lost on a crash): attempts under way (the version read, the start time) and unsaved outcomes.
    attempting: BTreeMap<String, (Notification, u64)>,
    unsaved: Vec<Unsaved>,
}

fn ts(ms: u64) -> Timestamp {
    Timestamp::from_unix_ms(ms)
}

impl World {
    fn new(schedule: RetrySchedule) -> World {
        World {
            schedule,
            now: T0,
            next_id: 0,
            created: Vec::new(),
            store: BTreeMap::new(),
            due: BTreeSet::new(),
            chains: BTreeMap::new(),
            attempting: BTreeMap::new(),
            unsaved: Vec::new(),
        }
    }

    /// The dispatcher handles an id from dispatch until its outcome is saved.
    fn busy(&self, id: &str) -> bool {
        self.attempting.contains_key(id) || self.unsaved.iter().any(|u| u.after.id == id)
    }

    fn create(&mut self) {
        self.next_id += 1;
        let id = format!("evt_{:04}", self.next_id);
        let n = Notification {
            id: id.clone(),
            merchant: MerchantId::new(),
            event: EventKind::PaymentInitiated,
            reference: format!("pay_{}", self.next_id),
            body: "{}".into(),
            created_at: ts(self.now),
            state: DeliveryState::Pending,
            next_attempt_at: Some(ts(self.now)),
            attempts: Vec::new(),
            chain_attempts: 0,
            total_attempts: 0,
        };
        self.due.insert((self.now, id.clone()));
        self.store.insert(id.clone(), n);
        self.chains.insert(id.clone(), vec![Vec::new()]);
        self.created.push(id);
    }

    fn dispatch(&mut self) {
        let due: Vec<String> =
            self.due.iter().take_while(|(at, _)| *at <= self.now).map(|(_, id)| id.clone()).collect();
        for id in due {
            if self.busy(&id) {
                continue;
            }
            let n = self.store.get(&id).cloned().unwrap_or_else(|| panic!("due index names {id}, not in the store"));
            if n.state == DeliveryState::Pending {
                self.attempting.insert(id, (n, self.now));
            }
        }
    }

    fn outcome(&self, started: u64, answer: Answer) -> AttemptOutcome {
        let latency_ms = self.now - started;
        match answer {
            Answer::Status(s) => {
                AttemptOutcome { at: ts(started), signed_at_s: None, http_status: Some(s), error: None, latency_ms }
            }
            Answer::Timeout => AttemptOutcome {
                at: ts(started),
                signed_at_s: None,
                http_status: None,
                error: Some("no answer within 10 s".into()),
                latency_ms,
            },
        }
    }

    fn answer(&mut self, pick: usize, answer: Answer, unit: f64) {
        let Some(id) = self.attempting.keys().nth(pick).cloned() else { return };
        let (before, started) = self.attempting.remove(&id).expect("picked");
        let after = after_attempt(&before, &self.outcome(started, answer), &self.schedule, unit);
        check_one(&self.schedule, &after).unwrap_or_else(|e| panic!("after_attempt gave a bad notification: {e}"));
        self.unsaved.push(Unsaved { before, after, kind: Kind::Attempt });
    }

    fn resend(&mut self, pick: usize) {
        let Some(id) = self.created.get(pick).cloned() else { return };
        if self.busy(&id) {
            return; // `DeliveryError::InFlight`
        }
        let before = self.store[&id].clone();
        let after = resend(&before, ts(self.now));
        self.unsaved.push(Unsaved { before, after, kind: Kind::Resend });
    }

    fn late(&mut self, pick: usize, answer: Answer, unit: f64) {
        let settled: Vec<String> = self
            .store
            .values()
            .filter(|n| n.state != DeliveryState::Pending && !self.busy(&n.id))
            .map(|n| n.id.clone())
            .collect();
        if settled.is_empty() {
            return;
        }
        let before = self.store[&settled[pick % settled.len()]].clone();
        let after = after_attempt(&before, &self.outcome(self.now, answer), &self.schedule, unit);
        self.unsaved.push(Unsaved { before, after, kind: Kind::Attempt });
    }

    /// `Store::save_notification`: writes `after` and moves the due entry from `before`'s time to `after`'s;
    /// then the ledger records what the new version added.
    fn save(&mut self, pick: usize) -> Result<(), String> {
        if self.unsaved.is_empty() {
            return Ok(());
        }
        let Unsaved { before, after, kind } = self.unsaved.remove(pick % self.unsaved.len());
        let id = after.id.clone();
        let stored = self.store.get(&id).cloned().ok_or_else(|| format!("{id} vanished"))?;
        if let Some(at) = before.next_attempt_at {
            self.due.remove(&(at.unix_ms(), id.clone()));
        }
        if let Some(at) = after.next_attempt_at {
            self.due.insert((at.unix_ms(), id.clone()));
        }
        self.store.insert(id.clone(), after.clone());
        let chains = self.chains.get_mut(&id).ok_or_else(|| format!("{id}: no ledger"))?;
        match kind {
            Kind::Resend => {
                if after.total_attempts != stored.total_attempts || after.attempts != stored.attempts {
                    return Err(format!("{id}: resend changed the attempt history"));
                }
                chains.push(Vec::new());
            }
            Kind::Attempt => {
                let added = after.total_attempts.checked_sub(stored.total_attempts);
                match added {
                    Some(0) if after == stored => {}
                    Some(0) => return Err(format!("{id}: a settled chain was changed by a late answer")),
                    Some(1) => {
                        let chain = chains.last_mut().ok_or_else(|| format!("{id}: no chain"))?;
                        if chain.contains(&Some(200)) {
                            return Err(format!("{id}: an attempt was recorded after a 200 in the same chain"));
                        }
                        let last = after.attempts.last().ok_or_else(|| format!("{id}: attempt not logged"))?;
                        chain.push(last.http_status);
                    }
                    _ => {
                        return Err(format!(
                            "{id}: total_attempts went from {} to {}",
                            stored.total_attempts, after.total_attempts
                        ))
                    }
                }
            }
        }
        Ok(())
    }

    fn crash(&mut self) {
        self.attempting.clear();
        self.unsaved.clear();
    }

    fn step(&mut self, op: &Op) -> Result<(), String> {
        match op {
            Op::Create => self.create(),
            Op::Dispatch => self.dispatch(),
            Op::Answer(pick, answer, unit) => {
                if !self.attempting.is_empty() {
                    self.answer(pick % self.attempting.len(), *answer, *unit);
                }
            }
            Op::Save(pick) => {
                if !self.unsaved.is_empty() {
                    self.save(pick % self.unsaved.len())?;
                }
            }
            Op::Resend(pick) => {
                if !self.created.is_empty() {
                    self.resend(pick % self.created.len());
                }
            }
            Op::Late(pick, answer, unit) => self.late(*pick, *answer, *unit),
            Op::Advance(ms) => self.now += ms,
            Op::Crash => self.crash(),
        }
        self.check()
    }

    /// Every invariant over the durable store, and over the outcomes waiting in memory.
    fn check(&self) -> Result<(), String> {
        for id in &self.created {
            let n = self.store.get(id).ok_or_else(|| format!("{id} was lost"))?;
            check_one(&self.schedule, n)?;
            let chains = &self.chains[id];
            let chain = chains.last().ok_or_else(|| format!("{id}: no chain"))?;
            if n.chain_attempts as usize != chain.len() {
                return Err(format!(
                    "{id}: chain_attempts {} but {} attempts in this chain",
                    n.chain_attempts,
                    chain.len()
                ));
            }
            let all: Vec<Option<u16>> = chains.iter().flatten().copied().collect();
            if n.total_attempts as usize != all.len() {
                return Err(format!("{id}: total_attempts {} but {} attempts persisted", n.total_attempts, all.len()));
            }
            let logged: Vec<Option<u16>> = n.attempts.iter().map(|a| a.http_status).collect();
            if logged[..] != all[all.len() - logged.len()..] || logged.len() < all.len().min(MAX_LOGGED_ATTEMPTS) {
                return Err(format!("{id}: the log {logged:?} is not the latest of {all:?}"));
            }
            match n.state {
                DeliveryState::Delivered if chain.last() != Some(&Some(200)) => {
                    return Err(format!("{id}: delivered without a 200 ending the chain {chain:?}"));
                }
                DeliveryState::Pending | DeliveryState::Failed if chain.contains(&Some(200)) => {
                    return Err(format!("{id}: {:?} after a 200 in the chain {chain:?}", n.state));
                }
                DeliveryState::Failed if chain.len() != self.schedule.attempts() => {
                    return Err(format!("{id}: failed after {} of {} attempts", chain.len(), self.schedule.attempts()));
                }
                _ => {}
            }
        }
        let derived: BTreeSet<(u64, String)> =
            self.store.values().filter_map(|n| n.next_attempt_at.map(|at| (at.unix_ms(), n.id.clone()))).collect();
        if derived != self.due {
            return Err(format!("the due index {:?} disagrees with the notifications {derived:?}", self.due));
        }
        for u in &self.unsaved {
            check_one(&self.schedule, &u.after)?;
        }
        Ok(())
    }

    /// No more crashes: the dispatcher runs until nothing is pending, the clock jumping to each next attempt.
    /// Everything must settle within the schedule's longest span (every wait at +jitter) from now.
    fn drain(&mut self, answers: &[(Answer, f64)]) -> Result<(), String> {
        let start = self.now;
        let span: u64 = self.schedule.waits_ms.iter().map(|w| w + w * self.schedule.jitter_permille / 1000 + 1).sum();
        let rounds = self.created.len() * (self.schedule.attempts() + 1) + 2;
        let mut turn = 0;
        for _ in 0..rounds {
            while !self.unsaved.is_empty() {
                self.save(0)?;
                self.check()?;
            }
            self.dispatch();
            while !self.attempting.is_empty() {
                let (answer, unit) = answers[turn % answers.len()];
                turn += 1;
                self.answer(0, answer, unit);
                self.save(0)?;
                self.check()?;
            }
            match self.store.values().filter_map(|n| n.next_attempt_at).map(|t| t.unix_ms()).min() {
                None => break,
                Some(next) => self.now = self.now.max(next),
            }
        }
        for id in &self.created {
            let n = &self.store[id];
            if n.state == DeliveryState::Pending {
                return Err(format!("{id} still pending at {} ms after the drain began", self.now - start));
            }
        }
        if self.now - start > span {
            return Err(format!("settling took {} ms, beyond the schedule's span of {span} ms", self.now - start));
        }
        Ok(())
    }
}

/// The rules every single notification obeys, wherever it is.
fn check_one(schedule: &RetrySchedule, n: &Notification) -> Result<(), String> {
    let id = &n.id;
    if n.next_attempt_at.is_some() != (n.state == DeliveryState::Pending) {
        return Err(format!("{id}: state {:?} with next_attempt_at {:?}", n.state, n.next_attempt_at));
    }
    if n.chain_attempts as usize > schedule.attempts() {
        return Err(format!("{id}: {} attempts in a chain of at most {}", n.chain_attempts, schedule.attempts()));
    }
    if n.attempts.len() > MAX_LOGGED_ATTEMPTS {
        return Err(format!("{id}: {} attempts logged, more than {MAX_LOGGED_ATTEMPTS}", n.attempts.len()));
    }
    if (n.total_attempts as usize) < n.attempts.len() {
        return Err(format!("{id}: total_attempts {} below the {} logged", n.total_attempts, n.attempts.len()));
    }
    if n.chain_attempts > n.total_attempts {
        return Err(format!("{id}: chain_attempts {} above total_attempts {}", n.chain_attempts, n.total_attempts));
    }
    Ok(())
}

fn answer() -> impl Strategy<Value = Answer> {
    prop_oneof![
        3 => Just(Answer::Status(200)),
        1 => Just(Answer::Status(204)),
        1 => Just(Answer::Status(302)),
        3 => Just(Answer::Status(500)),
        2 => Just(Answer::Timeout),
    ]
}

fn unit() -> impl Strategy<Value = f64> {
    prop_oneof![Just(-1.0), Just(0.0), Just(1.0), -1.0f64..=1.0]
}

fn schedule() -> impl Strategy<Value = RetrySchedule> {
    prop_oneof![
        1 => Just(RetrySchedule::default()),
        3 => (prop::collection::vec(1u64..20_000, 0..5), 0u64..=500)
            .prop_map(|(waits_ms, jitter_permille)| RetrySchedule { waits_ms, jitter_permille }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let day = DEFAULT_WAITS_MS[DEFAULT_WAITS_MS.len() - 1];
    prop_oneof![
        3 => Just(Op::Create),
        4 => Just(Op::Dispatch),
        6 => (any::<usize>(), answer(), unit()).prop_map(|(i, a, u)| Op::Answer(i, a, u)),
        6 => any::<usize>().prop_map(Op::Save),
        2 => any::<usize>().prop_map(Op::Resend),
        2 => (any::<usize>(), answer(), unit()).prop_map(|(i, a, u)| Op::Late(i, a, u)),
        3 => (0u64..25_000).prop_map(Op::Advance),
        1 => (0u64..=day).prop_map(Op::Advance),
        1 => Just(Op::Crash),
    ]
}

fn run(schedule: RetrySchedule, ops: &[Op], drain: &[(Answer, f64)]) -> Result<(), String> {
    let mut world = World::new(schedule);
    for (i, op) in ops.iter().enumerate() {
        world.step(op).map_err(|e| format!("after step {i} ({op:?}): {e}"))?;
    }
    world.drain(drain).map_err(|e| format!("while draining: {e}"))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn delivery_survives_any_interleaving_of_crashes_and_answers(
        schedule in schedule(),
        ops in prop::collection::vec(op(), 0..200),
        drain in prop::collection::vec((answer(), unit()), 1..6),
    ) {
        if let Err(e) = run(schedule, &ops, &drain) {
            return Err(TestCaseError::fail(e));
        }
    }

    /// One notification sent again and again: the log stays bounded and exact over many chains.
    #[test]
    fn the_log_stays_bounded_over_many_resends(
        waits in prop::collection::vec(1u64..1_000, 0..4),
        rounds in prop::collection::vec((answer(), unit()), 20..80),
    ) {
        let schedule = RetrySchedule { waits_ms: waits, jitter_permille: 200 };
        let mut ops = vec![Op::Create];
        for (answer, unit) in rounds {
            ops.extend([
                Op::Dispatch,
                Op::Answer(0, answer, unit),
                Op::Save(0),
                Op::Advance(2_000),
                Op::Resend(0),
                Op::Save(0),
            ]);
        }
        if let Err(e) = run(schedule, &ops, &[(Answer::Status(500), 0.0)]) {
            return Err(TestCaseError::fail(e));
        }
    }
}

/// A fixed story: fail, crash mid-attempt, fail again, get a 200, and a late 500 changes nothing.
#[test]
fn a_fixed_story_settles_as_delivered() {
    let schedule = RetrySchedule { waits_ms: vec![1_000, 2_000], jitter_permille: 0 };
    let first = 0;
    let ops = [
        Op::Create,
        Op::Dispatch,
        Op::Answer(first, Answer::Status(500), 0.0),
        Op::Save(first),
        Op::Advance(1_000),
        Op::Dispatch,
        Op::Crash,
        Op::Dispatch,
        Op::Answer(first, Answer::Timeout, 0.0),
        Op::Save(first),
        Op::Advance(2_000),
        Op::Dispatch,
        Op::Answer(first, Answer::Status(200), 0.0),
        Op::Save(first),
        Op::Late(first, Answer::Status(500), 0.0),
        Op::Save(first),
    ];
    let mut world = World::new(schedule);
    for op in &ops {
        world.step(op).unwrap_or_else(|e| panic!("{op:?}: {e}"));
    }
    let n = &world.store["evt_0001"];
    assert_eq!((n.state, n.chain_attempts, n.total_attempts), (DeliveryState::Delivered, 3, 3));
    assert!(world.due.is_empty());
}
