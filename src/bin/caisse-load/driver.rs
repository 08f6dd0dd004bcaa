//! The open-loop driver: arrivals are issued on the clock, each one API call spawned on this thread whether
//! or not earlier calls have answered, up to a cap of calls in flight (arrivals beyond it are dropped and
//! counted, so an overloaded server shows as drops rather than as a slower offered rate).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use actix_web::web;
use rand::Rng;
use serde_json::{json, Value};

use crate::receiver::{lock, Receiver};
use crate::Scenario;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Op {
    Payment,
    Refund,
    Payout,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Payment => "payment",
            Op::Refund => "refund",
            Op::Payout => "payout",
        }
    }
}

/// The driver's counters; it runs on one thread, so plain cells suffice.
#[derive(Default)]
pub struct Driver {
    pub issued: BTreeMap<Op, u64>,
    pub accepted: BTreeMap<Op, u64>,
    pub rejected: BTreeMap<Op, u64>,
    /// Non-2xx answers by "operation:status:error code", to tell a refused refund from an overloaded server.
    pub rejected_codes: BTreeMap<String, u64>,
    pub network_errors: u64,
    pub dropped: u64,
    pub refunds_unavailable: u64,
    pub api_latency_us: Vec<u64>,
    /// Accepted payments: reference -> merchant index.
    pub lives: Vec<(String, usize)>,
    /// Calls that got no answer or a 5xx, by the second of the run they were sent in: where a node was
    /// killed, the span of these seconds is how long its merchants could not be served (the failover).
    pub failures_by_second: BTreeMap<u64, u64>,
}

/// What every arrival needs; one per run, on the driver's thread.
pub struct Ctx {
    /// The server, or the nodes of a cluster, which take the arrivals in turn.
    bases: Vec<String>,
    turn: Cell<usize>,
    /// Until when each node is left out: one that did not answer is tried again a second later, as a load
    /// balancer's health check would, so a killed node costs the run what the cluster's failover costs.
    down_until: RefCell<Vec<Option<Instant>>>,
    started: Instant,
    pub keys: Vec<String>,
    pub client: awc::Client,
    pub rx: web::Data<Receiver>,
    pub driver: RefCell<Driver>,
    pub outstanding: Cell<usize>,
}

impl Ctx {
    pub fn new(bases: Vec<String>, keys: Vec<String>, rx: web::Data<Receiver>, max_outstanding: usize) -> Ctx {
        // One awc client on this thread; its pool may open as many connections as calls may be outstanding.
        let client = awc::Client::builder()
            .connector(awc::Connector::new().limit(max_outstanding))
            .timeout(Duration::from_secs(10))
            .finish();
        Ctx {
            down_until: RefCell::new(vec![None; bases.len()]),
            bases,
            turn: Cell::new(0),
            started: Instant::now(),
            keys,
            client,
            rx,
            driver: RefCell::new(Driver::default()),
            outstanding: Cell::new(0),
        }
    }

    /// The node the next call goes to (its index and base URL): the next one in turn not left out, or the
    /// next one in turn when all are.
    fn base(&self) -> (usize, String) {
        let count = self.bases.len().max(1);
        let now = Instant::now();
        let down = self.down_until.borrow();
        let first = self.turn.get();
        let at = (0..count)
            .map(|step| (first + step) % count)
            .find(|at| down.get(*at).copied().flatten().is_none_or(|until| until <= now))
            .unwrap_or(first % count);
        self.turn.set(at + 1);
        (at, self.bases.get(at).cloned().unwrap_or_default())
    }

    fn leave_out(&self, node: usize) {
        if let Some(slot) = self.down_until.borrow_mut().get_mut(node) {
            *slot = Some(Instant::now() + Duration::from_secs(1));
        }
    }
}

fn payment_body() -> Value {
    json!({"montant": 10_000, "devise": "XOF", "fournisseur": "mtn_momo", "client_telephone": "+22997000055"})
}

fn payout_body() -> Value {
    json!({"montant": 1_000, "devise": "XOF", "fournisseur": "mtn_momo", "beneficiaire_telephone": "+22996000055"})
}

/// Sends one call and reads its answer; any failure to get an answer is a network error.
pub async fn call(client: &awc::Client, url: &str, key: &str, body: Option<&Value>) -> Result<(u16, Value), String> {
    let request = match body {
        Some(_) => client.post(url),
        None => client.get(url),
    }
    .insert_header(("Authorization", format!("Bearer {key}")));
    let sent = match body {
        Some(body) => request.send_json(body).await,
        None => request.send().await,
    };
    let mut response = sent.map_err(|e| e.to_string())?;
    let bytes = response.body().limit(1 << 20).await.map_err(|e| e.to_string())?;
    Ok((response.status().as_u16(), serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
}

/// One arrival: picks what to do, sends it, records the outcome.
async fn arrival(op: Op, merchant: usize, ctx: Rc<Ctx>) {
    // A refund needs a succeeded payment; when none is waiting yet, the arrival becomes a payment so the
    // offered rate stays what was asked.
    let (node, base) = ctx.base();
    let (op, merchant, url, body) = match op {
        Op::Refund => match lock(&ctx.rx.refundable).pop_front() {
            Some((m, reference)) => (Op::Refund, m, format!("{base}/v1/paiement/{reference}/rembourser"), json!({})),
            None => {
                ctx.driver.borrow_mut().refunds_unavailable += 1;
                (Op::Payment, merchant, format!("{base}/v1/paiement/initier"), payment_body())
            }
        },
        Op::Payment => (Op::Payment, merchant, format!("{base}/v1/paiement/initier"), payment_body()),
        Op::Payout => (Op::Payout, merchant, format!("{base}/v1/retraits"), payout_body()),
    };
    *ctx.driver.borrow_mut().issued.entry(op).or_default() += 1;
    let key = ctx.keys.get(merchant).cloned().unwrap_or_default();
    let started = Instant::now();
    let second = started.saturating_duration_since(ctx.started).as_secs();
    let result = call(&ctx.client, &url, &key, Some(&body)).await;
    let elapsed = started.elapsed().as_micros() as u64;
    ctx.outstanding.set(ctx.outstanding.get().saturating_sub(1));
    let mut d = ctx.driver.borrow_mut();
    match result {
        Err(_) => {
            ctx.leave_out(node);
            d.network_errors += 1;
            *d.failures_by_second.entry(second).or_default() += 1;
        }
        Ok((status, answer)) => {
            if status >= 500 {
                *d.failures_by_second.entry(second).or_default() += 1;
            }
            d.api_latency_us.push(elapsed);
            if (200..300).contains(&status) {
                *d.accepted.entry(op).or_default() += 1;
                if op == Op::Payment {
                    if let Some(reference) = answer["reference"].as_str() {
                        d.lives.push((reference.to_owned(), merchant));
                    }
                }
            } else {
                *d.rejected.entry(op).or_default() += 1;
                let code = answer["error"]["code"].as_str().unwrap_or("-");
                *d.rejected_codes.entry(format!("{}:{status}:{code}", op.name())).or_default() += 1;
            }
        }
    }
}

/// Offers `rate` arrivals per second for `duration_s`, then returns the time it took (at least `duration_s`).
pub async fn offer(ctx: &Rc<Ctx>, scenario: Scenario, rate: f64, duration_s: f64, max_outstanding: usize) -> Duration {
    let total = (rate * duration_s).round() as u64;
    let n = ctx.keys.len();
    let mut rng = rand::thread_rng();
    let started = Instant::now();
    *lock(&ctx.rx.load_started) = Some(started);
    let mut issued = 0u64;
    let mut tick = actix_web::rt::time::interval(Duration::from_millis(1));
    // Arrivals follow the clock, not the answers: each millisecond issues whatever is due by then.
    while issued < total {
        tick.tick().await;
        let due = ((started.elapsed().as_secs_f64() * rate) as u64).min(total);
        while issued < due {
            issued += 1;
            if ctx.outstanding.get() >= max_outstanding {
                ctx.driver.borrow_mut().dropped += 1;
                continue;
            }
            let merchant = match scenario {
                Scenario::Hot if n > 1 && rng.gen::<f64>() >= 0.9 => rng.gen_range(1..n),
                Scenario::Hot => 0,
                _ => rng.gen_range(0..n),
            };
            let op = match scenario {
                Scenario::Mix => match rng.gen::<f64>() {
                    r if r < 0.8 => Op::Payment,
                    r if r < 0.9 => Op::Refund,
                    _ => Op::Payout,
                },
                _ => Op::Payment,
            };
            ctx.outstanding.set(ctx.outstanding.get() + 1);
            actix_web::rt::spawn(arrival(op, merchant, ctx.clone()));
        }
    }
    started.elapsed()
}
