//! The load: workers that initiate payments, refund payments whose success was notified, create payouts and
//! read balances, concurrently, through the HTTP API; and the [`Book`] in which they write down every request
//! and its answer, which the checks compare with what the server shows after each restart.
//!
//! Every request is written down before it is sent, so a request in flight at the kill is known to the checks
//! (it may or may not have happened). Requests with an `Idempotency-Key` (three in four) are sent again with
//! the same key and body when no answer came back, until one does: docs/api.md says the answer is then the
//! first one replayed or a fresh evaluation, never a second change. Payments without a key are sent again too:
//! their merchant `reference` makes a second attempt either the first success or `duplicate_reference`, which
//! proves the first attempt landed. Refunds and payouts without a key are left unknown when their answer was
//! lost.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::rc::Rc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use serde_json::{json, Value};

use crate::receiver::Receiver;
use crate::server::{Answer, Target};
use crate::support::sleep_ms;

/// Providers that take XOF for payments, refunds and payouts.
const PROVIDERS: [&str; 4] = ["mtn_momo", "orange_money", "moov_money", "wave"];
/// How long a retried request may keep getting `idempotency_key_in_use`: after a restart nothing is in
/// progress any more, so a key still "in use" this long is a failure.
const IN_USE_LIMIT: Duration = Duration::from_secs(20);
/// How long one request may go unanswered, or answered only "retry", while the target is open: a service that
/// serves nobody for this long fails the test rather than hanging it.
const SERVED_LIMIT: Duration = Duration::from_secs(180);

/// What became of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Sent, no answer yet (a keyed request waiting to be sent again, say).
    InFlight,
    /// Answered 2xx: the change must be there after any later crash.
    Acked,
    /// A payment sent again without a key was answered `duplicate_reference`: the first attempt landed.
    Landed,
    /// Answered with this status and error code: nothing may have changed.
    Refused(String),
    /// No answer and not sent again: may or may not have happened.
    Unknown,
}

/// One payment, refund or payout request.
#[derive(Debug, Clone)]
pub struct Op {
    pub amount: i64,
    pub keyed: bool,
    pub outcome: Outcome,
    /// The cycle in which the answer came.
    pub answered_in: u32,
    /// What the answer named: the refund's `rmb_` reference or the payout's `ret_` id.
    pub id: Option<String>,
}

impl Op {
    fn new(amount: i64, keyed: bool) -> Op {
        Op { amount, keyed, outcome: Outcome::InFlight, answered_in: 0, id: None }
    }

    pub fn must_exist(&self) -> bool {
        matches!(self.outcome, Outcome::Acked | Outcome::Landed)
    }

    pub fn refused(&self) -> bool {
        matches!(self.outcome, Outcome::Refused(_))
    }
}

/// What the test sent to one merchant and what it saw come back.
#[derive(Default)]
pub struct Book {
    /// By payment reference (the test chooses it).
    pub payments: BTreeMap<String, Op>,
    /// By the reference of the payment refunded (one refund request per payment).
    pub refunds: BTreeMap<String, Op>,
    /// By the tag the test puts in the payout's `metadata.op`.
    pub payouts: BTreeMap<String, Op>,
    /// Every status seen for a payment reference, refund reference or payout id, in an answer or a webhook:
    /// each was durable when seen, so what the server shows later must be reachable from each of them.
    pub seen: HashMap<String, BTreeSet<String>>,
}

impl Book {
    pub fn observe(&mut self, reference: &str, status: &str) {
        if !reference.is_empty() && !status.is_empty() {
            self.seen.entry(reference.to_owned()).or_default().insert(status.to_owned());
        }
    }

    /// Notes the statuses a payment object shows, its refund's included.
    pub fn observe_payment(&mut self, payment: &Value) {
        self.observe(payment["reference"].as_str().unwrap_or(""), payment["statut"].as_str().unwrap_or(""));
        let refund = &payment["remboursement"];
        self.observe(refund["reference"].as_str().unwrap_or(""), refund["statut"].as_str().unwrap_or(""));
    }
}

/// One merchant of the test, its receiver and its book.
pub struct Merchant {
    pub name: String,
    pub id: String,
    pub key: String,
    pub receiver: Receiver,
    pub book: RefCell<Book>,
    next: Cell<u64>,
    refundable: RefCell<VecDeque<String>>,
    succeeded_read: Cell<usize>,
}

impl Merchant {
    pub fn new(name: String, id: String, key: String, receiver: Receiver) -> Merchant {
        Merchant {
            name,
            id,
            key,
            receiver,
            book: RefCell::new(Book::default()),
            next: Cell::new(0),
            refundable: RefCell::new(VecDeque::new()),
            succeeded_read: Cell::new(0),
        }
    }

    fn next(&self) -> u64 {
        let n = self.next.get();
        self.next.set(n + 1);
        n
    }

    /// A payment whose success was notified and that nobody tried to refund yet.
    fn refund_candidate(&self) -> Option<String> {
        let read = self.succeeded_read.get();
        let fresh = self.receiver.succeeded_from(read);
        self.succeeded_read.set(read + fresh.len());
        let mut queue = self.refundable.borrow_mut();
        queue.extend(fresh);
        let book = self.book.borrow();
        while let Some(reference) = queue.pop_front() {
            if book.payments.contains_key(&reference) && !book.refunds.contains_key(&reference) {
                return Some(reference);
            }
        }
        None
    }
}

/// Everything the load and the checks share.
pub struct Run {
    pub target: Target,
    pub merchants: Vec<Merchant>,
    /// The current kill cycle (0 before the first kill).
    pub cycle: Cell<u32>,
    /// Counts by kind, for the summary: `payment acked`, `payout refused 409 insufficient_balance`, ...
    pub tally: RefCell<BTreeMap<String, u64>>,
    /// Failures seen by the load itself (a negative balance, an unexpected answer).
    pub violations: RefCell<Vec<String>>,
}

impl Run {
    /// A run against `target` for `merchants`, with `workers_per_merchant` load workers each started (they
    /// wait at the target's gate), every worker's choices seeded from `rng`.
    pub fn start(
        target: Target,
        merchants: Vec<Merchant>,
        workers_per_merchant: usize,
        rng: &mut StdRng,
    ) -> (Rc<Run>, Vec<actix_web::rt::task::JoinHandle<()>>) {
        use rand::SeedableRng;
        let count = merchants.len();
        let run = Rc::new(Run {
            target,
            merchants,
            cycle: Default::default(),
            tally: Default::default(),
            violations: Default::default(),
        });
        let workers = (0..count * workers_per_merchant)
            .map(|w| actix_web::rt::spawn(worker(run.clone(), w % count, StdRng::seed_from_u64(rng.gen()))))
            .collect();
        (run, workers)
    }

    pub fn count(&self, what: impl Into<String>) {
        *self.tally.borrow_mut().entry(what.into()).or_default() += 1;
    }

    pub fn count_of(&self, what: &str) -> u64 {
        self.tally.borrow().get(what).copied().unwrap_or(0)
    }

    pub fn violation(&self, what: String) {
        self.violations.borrow_mut().push(what);
    }
}

fn code(answer: &Answer) -> String {
    format!("{} {}", answer.status, answer.json["error"]["code"].as_str().unwrap_or("-"))
}

/// Sends a POST until it gets an answer, as described in the module comment. `None`: no answer, not sent
/// again. The flag says whether an attempt went unanswered.
async fn submit(
    run: &Run,
    merchant: &Merchant,
    path: &str,
    body: &Value,
    idempotency_key: Option<&str>,
    again_without_key: bool,
) -> (Option<Answer>, bool) {
    let mut lost = false;
    let mut in_use_since: Option<Instant> = None;
    // Time spent on this request while the target was open (not behind the gate, during checks and restarts).
    let mut open_for = Duration::ZERO;
    loop {
        if run.target.wait_open().await {
            // The wait for a key in use counts only while the target is open.
            in_use_since = None;
        }
        assert!(
            open_for < SERVED_LIMIT,
            "POST {path} for {} was not served in {SERVED_LIMIT:?} of open time",
            merchant.name
        );
        let attempt = Instant::now();
        match run.target.send(&merchant.key, "POST", path, Some(body), idempotency_key).await {
            Ok(answer) if answer.status == 429 => sleep_ms(50).await,
            // In a cluster a 503 may come from a node whose forwarded request died with the node that held the
            // merchant: like no answer, the change may or may not have happened. A 408 comes from a node that was
            // frozen while the request waited on its socket: it read nothing, but an earlier attempt may have
            // landed, so it too is sent again.
            Ok(answer) if (answer.status == 503 || answer.status == 408) && run.target.is_cluster() => {
                lost = true;
                // The wait for a key in use counts from the last time the key was found in use.
                in_use_since = None;
                if idempotency_key.is_none() && !again_without_key {
                    return (None, lost);
                }
                run.count(format!("request sent again after {} from a cluster node", answer.status));
                sleep_ms(100).await;
            }
            Ok(answer) if answer.json["error"]["code"] == "idempotency_key_in_use" => {
                run.count("retry after idempotency_key_in_use");
                if in_use_since.get_or_insert_with(Instant::now).elapsed() > IN_USE_LIMIT {
                    return (Some(answer), lost);
                }
                sleep_ms(100).await;
            }
            Ok(answer) => {
                if answer.replayed {
                    run.count("answer replayed for a request sent again");
                }
                return (Some(answer), lost);
            }
            Err(_) => {
                lost = true;
                in_use_since = None;
                if idempotency_key.is_none() && !again_without_key {
                    return (None, lost);
                }
                run.count("request sent again after no answer");
                sleep_ms(20).await;
            }
        }
        open_for += attempt.elapsed();
    }
}

fn phone_ending(rng: &mut StdRng) -> String {
    // The sandbox's endings: 01 declined, 02 never answered (expires after the TTL), 03 success notified three times,
    // anything else success. 04 (expiry then a late success) is left out: the simulator forgets the late
    // notice when the process dies, so whether it ever comes would depend on the kill moments.
    match rng.gen_range(0..100) {
        0..=9 => "01".to_owned(),
        10..=24 => "03".to_owned(),
        25..=29 => "02".to_owned(),
        _ => format!("{}", rng.gen_range(10..100)),
    }
}

async fn pay(run: &Run, merchant: &Merchant, rng: &mut StdRng) {
    let reference = format!("{}-p{}", merchant.name, merchant.next());
    let amount = rng.gen_range(1_000..=40_000);
    let ending = phone_ending(rng);
    let provider = PROVIDERS.choose(rng).copied().unwrap_or("mtn_momo");
    let body = json!({
        "montant": amount, "devise": "XOF", "fournisseur": provider,
        "client_telephone": format!("+229970000{ending}"), "reference": reference, "metadata": {"op": reference},
    });
    let keyed = rng.gen_ratio(3, 4);
    merchant.book.borrow_mut().payments.insert(reference.clone(), Op::new(amount, keyed));
    let key = format!("{reference}-key");
    let (answer, lost) =
        submit(run, merchant, "/v1/paiement/initier", &body, keyed.then_some(key.as_str()), true).await;
    let outcome = match &answer {
        Some(a) if a.status == 201 => {
            merchant.book.borrow_mut().observe_payment(&a.json);
            if a.json["reference"] != reference.as_str() || a.json["montant"] != amount {
                run.violation(format!("payment {reference}: the answer is another payment: {}", a.json));
            }
            Outcome::Acked
        }
        Some(a) if !keyed && lost && a.json["error"]["code"] == "duplicate_reference" => Outcome::Landed,
        Some(a) => Outcome::Refused(code(a)),
        None => Outcome::Unknown,
    };
    record(run, merchant, "payment", |book| book.payments.get_mut(&reference), outcome, None);
}

async fn refund(run: &Run, merchant: &Merchant, rng: &mut StdRng) -> bool {
    let Some(payment) = merchant.refund_candidate() else { return false };
    let Some(paid) = merchant.book.borrow().payments.get(&payment).map(|op| op.amount) else { return false };
    let (body, amount) = if rng.gen_ratio(1, 3) {
        (json!({}), paid)
    } else {
        let amount = rng.gen_range(100..=paid / 2);
        (json!({"montant": amount, "motif": "retour"}), amount)
    };
    let keyed = rng.gen_ratio(3, 4);
    merchant.book.borrow_mut().refunds.insert(payment.clone(), Op::new(amount, keyed));
    let key = format!("{payment}-refund-key");
    let path = format!("/v1/paiement/{payment}/rembourser");
    let (answer, _) = submit(run, merchant, &path, &body, keyed.then_some(key.as_str()), false).await;
    let mut id = None;
    let outcome = match &answer {
        Some(a) if a.status == 200 => {
            merchant.book.borrow_mut().observe_payment(&a.json);
            id = a.json["remboursement"]["reference"].as_str().map(str::to_owned);
            if a.json["reference"] != payment.as_str() || a.json["remboursement"]["montant"] != amount {
                run.violation(format!("refund of {payment} for {amount}: the answer is another refund: {}", a.json));
            }
            Outcome::Acked
        }
        Some(a) => Outcome::Refused(code(a)),
        None => Outcome::Unknown,
    };
    record(run, merchant, "refund", |book| book.refunds.get_mut(&payment), outcome, id);
    true
}

async fn payout(run: &Run, merchant: &Merchant, rng: &mut StdRng) {
    let tag = format!("{}-o{}", merchant.name, merchant.next());
    let amount = rng.gen_range(500..=6_000);
    let ending = if rng.gen_ratio(1, 5) { "01".to_owned() } else { format!("{}", rng.gen_range(10..100)) };
    let provider = PROVIDERS.choose(rng).copied().unwrap_or("mtn_momo");
    let body = json!({
        "montant": amount, "devise": "XOF", "fournisseur": provider,
        "beneficiaire_telephone": format!("+229960000{ending}"), "metadata": {"op": tag},
    });
    let keyed = rng.gen_ratio(3, 4);
    merchant.book.borrow_mut().payouts.insert(tag.clone(), Op::new(amount, keyed));
    let key = format!("{tag}-key");
    let (answer, _) = submit(run, merchant, "/v1/retraits", &body, keyed.then_some(key.as_str()), false).await;
    let mut id = None;
    let outcome = match &answer {
        Some(a) if a.status == 201 => {
            let payout_id = a.json["id"].as_str().unwrap_or("").to_owned();
            merchant.book.borrow_mut().observe(&payout_id, a.json["statut"].as_str().unwrap_or(""));
            if a.json["metadata"]["op"] != tag.as_str() || a.json["montant"] != amount {
                run.violation(format!("payout {tag}: the answer is another payout: {}", a.json));
            }
            id = Some(payout_id);
            Outcome::Acked
        }
        Some(a) => Outcome::Refused(code(a)),
        None => Outcome::Unknown,
    };
    record(run, merchant, "payout", |book| book.payouts.get_mut(&tag), outcome, id);
}

/// Writes an answer into the book and the tally.
fn record(
    run: &Run,
    merchant: &Merchant,
    kind: &str,
    op: impl FnOnce(&mut Book) -> Option<&mut Op>,
    outcome: Outcome,
    id: Option<String>,
) {
    let label = match &outcome {
        Outcome::InFlight => "in flight".to_owned(),
        Outcome::Acked => "acknowledged".to_owned(),
        Outcome::Landed => "landed (duplicate_reference on a retry)".to_owned(),
        Outcome::Refused(code) => format!("refused {code}"),
        Outcome::Unknown => "unknown (no answer)".to_owned(),
    };
    run.count(format!("{kind} {label}"));
    let mut book = merchant.book.borrow_mut();
    if let Some(op) = op(&mut book) {
        if op.keyed {
            run.count(format!("{kind} with an Idempotency-Key"));
        }
        op.outcome = outcome;
        op.answered_in = run.cycle.get();
        op.id = id;
    }
}

/// Reads the balances (never negative, whatever is in flight) and one payment, noting its status.
async fn read(run: &Run, merchant: &Merchant, rng: &mut StdRng) {
    run.target.wait_open().await;
    if let Ok(answer) = run.target.send(&merchant.key, "GET", "/v1/soldes", None, None).await {
        for row in answer.json["data"].as_array().into_iter().flatten() {
            let (available, pending) = (row["disponible"].as_i64(), row["en_attente"].as_i64());
            if !matches!((available, pending), (Some(d), Some(e)) if d >= 0 && e >= 0) {
                run.violation(format!("{}: a balance under load is negative or missing: {row}", merchant.name));
            }
        }
    }
    let reference = {
        let book = merchant.book.borrow();
        let acked: Vec<&String> = book.payments.iter().filter(|(_, op)| op.must_exist()).map(|(r, _)| r).collect();
        acked.choose(rng).map(|r| (*r).clone())
    };
    let Some(reference) = reference else { return };
    if let Ok(answer) = run.target.send(&merchant.key, "GET", &format!("/v1/paiement/{reference}"), None, None).await {
        if answer.status == 200 {
            merchant.book.borrow_mut().observe_payment(&answer.json);
        }
    }
}

/// One worker: operations one after the other for one merchant until the run stops.
pub async fn worker(run: Rc<Run>, merchant: usize, mut rng: StdRng) {
    loop {
        run.target.wait_open().await;
        if run.target.stopping() {
            return;
        }
        let m = &run.merchants[merchant];
        match rng.gen_range(0..100) {
            0..=49 => pay(&run, m, &mut rng).await,
            50..=71 => {
                if !refund(&run, m, &mut rng).await {
                    pay(&run, m, &mut rng).await;
                }
            }
            72..=93 => payout(&run, m, &mut rng).await,
            _ => read(&run, m, &mut rng).await,
        }
    }
}
