//! `caisse-load`: an open-loop load generator for Caisse (issue 6).
//!
//! It starts a Caisse server in this process (loopback, temporary data directory, test settings with a short
//! sandbox delay, no rate limit and a short webhook retry schedule), creates N merchants whose webhook URLs
//! point at a receiver run by the tool itself, then offers a fixed rate of arrivals for a fixed time. Each
//! arrival is one API call issued on schedule whether or not earlier calls have finished (open loop); a payment
//! arrival starts a "life" that ends when `payment.succeeded` reaches the receiver with a valid signature.
//!
//! The receiver verifies every delivery with [`caisse_engine::webhook::verify`] and the merchant's key (found
//! from the URL path `/hook/<merchant index>`), and records the first arrival time of each (event, reference).
//!
//! It prints one progress line on stderr and, at the end, ONE JSON line on stdout (see the README's "Load tool").
//! Only the in-process mode exists: a `--target` mode would need the merchants' keys from elsewhere, and is left
//! for later.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::process::ExitCode;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use caisse::app::Application;
use caisse::config::{parse_schedule, Environment, Settings};
use caisse::merchants;
use caisse_engine::domain::ids::MerchantId;
use caisse_engine::domain::records::Merchant;
use caisse_engine::domain::time::Timestamp;
use caisse_engine::webhook::{verify, SIGNATURE_HEADER, TIMESTAMP_HEADER};
use clap::{Parser, ValueEnum};
use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use rand::Rng;
use serde::Deserialize;
use serde_json::{json, Value};

/// The same allocator as the `caisse` binary, so in-process runs measure what production runs.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    /// Arrivals uniform over the merchants.
    Spread,
    /// Merchant 0 takes 90 % of the arrivals, the others share the rest.
    Hot,
    /// 80 % payments, 10 % refunds of succeeded payments, 10 % payouts, uniform over the merchants.
    Mix,
    /// Like spread, but every tenth merchant's receiver takes the webhook and never answers.
    Hanging,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Spread => "spread",
            Scenario::Hot => "hot",
            Scenario::Mix => "mix",
            Scenario::Hanging => "hanging",
        }
    }
}

#[derive(Debug, Parser)]
#[command(name = "caisse-load", about = "Open-loop load generator for an in-process Caisse server")]
struct Args {
    #[arg(long, value_enum, default_value = "spread")]
    scenario: Scenario,
    /// Number of merchants, each with its own key and webhook URL.
    #[arg(long, default_value_t = 1_000)]
    merchants: usize,
    /// Offered arrivals per second.
    #[arg(long, default_value_t = 1_000.0)]
    rate: f64,
    /// Seconds during which arrivals are offered.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// The sandbox provider's delay before it sends its notices (ms).
    #[arg(long, default_value_t = 200)]
    sandbox_delay_ms: u64,
    /// Seconds to wait after the last arrival for the remaining `payment.succeeded` webhooks.
    #[arg(long, default_value_t = 15)]
    grace: u64,
    /// Most API calls in flight at once; arrivals beyond it are dropped and counted.
    #[arg(long, default_value_t = 20_000)]
    max_outstanding: usize,
    /// Caisse HTTP workers (0: one per core).
    #[arg(long, default_value_t = 0)]
    http_workers: usize,
    /// Receiver HTTP workers.
    #[arg(long, default_value_t = 2)]
    receiver_workers: usize,
    /// Receiver ports (webhook hosts) shared by the healthy merchants; hanging merchants get as many others.
    #[arg(long, default_value_t = 16)]
    receiver_ports: usize,
    /// The webhook retry schedule given to the server.
    #[arg(long, default_value = "1s,2s,5s,10s")]
    retry_schedule: String,
}

/// What the receiver records; shared with its worker threads.
struct Receiver {
    keys: Vec<String>,
    hanging: Vec<bool>,
    /// Whether succeeded payments are queued for refunds (mix scenario only, so the queue does not grow
    /// for nothing).
    queue_refunds: bool,
    /// First arrival (Unix ms) of each (event, reference).
    arrivals: DashMap<(String, String), u64>,
    verified: AtomicU64,
    unverified: AtomicU64,
    unparsed: AtomicU64,
    duplicates: AtomicU64,
    completed: AtomicU64,
    /// Milliseconds from the start of the load to the last first `payment.succeeded`.
    last_success_ms: AtomicU64,
    /// The same two figures for healthy merchants only (all of them outside the hanging scenario).
    healthy_completed: AtomicU64,
    last_healthy_success_ms: AtomicU64,
    healthy_latency_ms: Mutex<Vec<u64>>,
    hanging_latency_ms: Mutex<Vec<u64>>,
    refundable: Mutex<VecDeque<(usize, String)>>,
    /// For each repeated (event, reference): milliseconds since its first arrival, which tells a retry by
    /// schedule (seconds) from a resend racing the first attempt (milliseconds).
    duplicate_gap_ms: Mutex<Vec<u64>>,
    load_started: Mutex<Option<Instant>>,
}

#[derive(Deserialize)]
struct Hook {
    event: String,
    data: HookData,
}

#[derive(Deserialize)]
struct HookData {
    reference: String,
    paid_at: Option<String>,
}

/// Mutex poisoning only follows a panic elsewhere; the data is still plain numbers, so keep using it.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

async fn hook(req: HttpRequest, body: web::Bytes, path: web::Path<usize>, rx: web::Data<Receiver>) -> HttpResponse {
    let index = path.into_inner();
    let arrived = Timestamp::now();
    let Some(key) = rx.keys.get(index) else { return HttpResponse::NotFound().finish() };
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or_default();
    if verify(key, header(SIGNATURE_HEADER), header(TIMESTAMP_HEADER), &body, arrived.unix_s()).is_err() {
        rx.unverified.fetch_add(1, Ordering::Relaxed);
        return HttpResponse::Unauthorized().finish();
    }
    rx.verified.fetch_add(1, Ordering::Relaxed);
    let hanging = rx.hanging.get(index).copied().unwrap_or(false);
    match serde_json::from_slice::<Hook>(&body) {
        Err(_) => {
            rx.unparsed.fetch_add(1, Ordering::Relaxed);
        }
        Ok(h) => {
            let first = match rx.arrivals.entry((h.event.clone(), h.data.reference.clone())) {
                Entry::Occupied(seen) => {
                    lock(&rx.duplicate_gap_ms).push(arrived.unix_ms().saturating_sub(*seen.get()));
                    false
                }
                Entry::Vacant(slot) => {
                    slot.insert(arrived.unix_ms());
                    true
                }
            };
            if !first {
                rx.duplicates.fetch_add(1, Ordering::Relaxed);
            } else if h.event == "payment.succeeded" {
                rx.completed.fetch_add(1, Ordering::Relaxed);
                if let Some(started) = *lock(&rx.load_started) {
                    let since = started.elapsed().as_millis() as u64;
                    rx.last_success_ms.fetch_max(since, Ordering::Relaxed);
                    if !hanging {
                        rx.last_healthy_success_ms.fetch_max(since, Ordering::Relaxed);
                    }
                }
                if !hanging {
                    rx.healthy_completed.fetch_add(1, Ordering::Relaxed);
                }
                // The provider's confirmation time is approximated by `paid_at`, written when the notice
                // was applied.
                let paid = h.data.paid_at.as_deref().and_then(|p| Timestamp::parse_rfc3339(p).ok());
                if let Some(paid) = paid {
                    let bucket = if hanging { &rx.hanging_latency_ms } else { &rx.healthy_latency_ms };
                    lock(bucket).push(arrived.ms_since(paid));
                }
                if rx.queue_refunds {
                    lock(&rx.refundable).push_back((index, h.data.reference));
                }
            }
        }
    }
    if hanging {
        // A hanging receiver holds the connection and never answers; the server's own timeout ends it.
        std::future::pending::<()>().await;
    }
    HttpResponse::Ok().finish()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Op {
    Payment,
    Refund,
    Payout,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Payment => "payment",
            Op::Refund => "refund",
            Op::Payout => "payout",
        }
    }
}

/// The driver's counters; it runs on one thread, so plain cells suffice.
#[derive(Default)]
struct Driver {
    issued: BTreeMap<Op, u64>,
    accepted: BTreeMap<Op, u64>,
    rejected: BTreeMap<Op, u64>,
    /// Non-2xx answers by "operation:status:error code", to tell a refused refund from an overloaded server.
    rejected_codes: BTreeMap<String, u64>,
    network_errors: u64,
    dropped: u64,
    refunds_unavailable: u64,
    api_latency_us: Vec<u64>,
    /// Accepted payments: reference -> merchant index.
    lives: Vec<(String, usize)>,
}

fn payment_body() -> Value {
    json!({"montant": 10_000, "devise": "XOF", "fournisseur": "mtn_momo", "client_telephone": "+22997000055"})
}

fn payout_body() -> Value {
    json!({"montant": 1_000, "devise": "XOF", "fournisseur": "mtn_momo", "beneficiaire_telephone": "+22996000055"})
}

/// Sends one call and reads its answer; any failure to get an answer is a network error.
async fn call(client: &awc::Client, url: &str, key: &str, body: &Value) -> Result<(u16, Value), String> {
    let mut response = client
        .post(url)
        .insert_header(("Authorization", format!("Bearer {key}")))
        .send_json(body)
        .await
        .map_err(|e| e.to_string())?;
    let bytes = response.body().limit(1 << 20).await.map_err(|e| e.to_string())?;
    Ok((response.status().as_u16(), serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
}

/// One arrival: picks what to do, sends it, records the outcome.
/// What every arrival needs; one per run, on the driver's thread.
struct Ctx {
    base: String,
    keys: Vec<String>,
    client: awc::Client,
    rx: web::Data<Receiver>,
    driver: RefCell<Driver>,
    outstanding: Cell<usize>,
}

async fn arrival(op: Op, merchant: usize, ctx: Rc<Ctx>) {
    // A refund needs a succeeded payment; when none is waiting yet, the arrival becomes a payment so the
    // offered rate stays what was asked.
    let (op, merchant, url, body) = match op {
        Op::Refund => match lock(&ctx.rx.refundable).pop_front() {
            Some((m, reference)) => {
                (Op::Refund, m, format!("{}/v1/paiement/{reference}/rembourser", ctx.base), json!({}))
            }
            None => {
                ctx.driver.borrow_mut().refunds_unavailable += 1;
                (Op::Payment, merchant, format!("{}/v1/paiement/initier", ctx.base), payment_body())
            }
        },
        Op::Payment => (Op::Payment, merchant, format!("{}/v1/paiement/initier", ctx.base), payment_body()),
        Op::Payout => (Op::Payout, merchant, format!("{}/v1/retraits", ctx.base), payout_body()),
    };
    *ctx.driver.borrow_mut().issued.entry(op).or_default() += 1;
    let key = ctx.keys.get(merchant).cloned().unwrap_or_default();
    let started = Instant::now();
    let result = call(&ctx.client, &url, &key, &body).await;
    let elapsed = started.elapsed().as_micros() as u64;
    ctx.outstanding.set(ctx.outstanding.get().saturating_sub(1));
    let mut d = ctx.driver.borrow_mut();
    match result {
        Err(_) => d.network_errors += 1,
        Ok((status, answer)) => {
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

fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// A `/proc/self/status` figure in MiB (the server runs in this process, so this is its memory plus the tool's).
fn proc_status_mib(field: &str) -> f64 {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| (kb / 1024.0 * 10.0).round() / 10.0)
        .unwrap_or(0.0)
}

/// The server's temporary data directory, removed when the run ends. `tempfile` is only a dev-dependency of
/// the package, so the tool makes its own rather than add a dependency.
struct DataDir(PathBuf);

impl DataDir {
    fn create() -> Result<DataDir, String> {
        let name = format!("caisse-load-{}-{}", std::process::id(), Timestamp::now().unix_ms());
        let path = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&path).map_err(|e| format!("temp dir {}: {e}", path.display()))?;
        Ok(DataDir(path))
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        // Best effort: a leftover directory in /tmp is harmless and there is no one to tell.
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn by_op(map: &BTreeMap<Op, u64>) -> Value {
    Value::Object(map.iter().map(|(op, n)| (op.name().to_owned(), json!(n))).collect())
}

async fn run(args: Args) -> Result<(Value, bool), String> {
    let positive = |x: f64| x.is_finite() && x > 0.0;
    if args.merchants == 0 || !positive(args.rate) || !positive(args.duration) {
        return Err("--merchants, --rate and --duration must be above zero".into());
    }
    let dir = DataDir::create()?;
    let mut settings = Settings::for_tests(&dir.0).map_err(|e| e.to_string())?;
    settings.sandbox_delay_ms = args.sandbox_delay_ms;
    settings.rate_limit_per_s = 0;
    settings.http_workers = args.http_workers;
    settings.webhook_retry_schedule_ms =
        parse_schedule(&args.retry_schedule).map_err(|e| format!("--retry-schedule: {e}"))?;

    // The receiver first, so the merchants' webhook URLs can name its port.
    let keys: Vec<String> = (0..args.merchants).map(|_| merchants::new_secret_key(Environment::Sandbox)).collect();
    let hanging: Vec<bool> = (0..args.merchants).map(|i| args.scenario == Scenario::Hanging && i % 10 == 9).collect();
    let rx = web::Data::new(Receiver {
        keys: keys.clone(),
        hanging: hanging.clone(),
        queue_refunds: args.scenario == Scenario::Mix,
        arrivals: DashMap::new(),
        verified: AtomicU64::new(0),
        unverified: AtomicU64::new(0),
        unparsed: AtomicU64::new(0),
        duplicates: AtomicU64::new(0),
        completed: AtomicU64::new(0),
        last_success_ms: AtomicU64::new(0),
        healthy_completed: AtomicU64::new(0),
        last_healthy_success_ms: AtomicU64::new(0),
        healthy_latency_ms: Mutex::new(Vec::new()),
        hanging_latency_ms: Mutex::new(Vec::new()),
        refundable: Mutex::new(VecDeque::new()),
        duplicate_gap_ms: Mutex::new(Vec::new()),
        load_started: Mutex::new(None),
    });
    // The delivery pool limits concurrency per host:port (128, and 2 once a host is slow), as real merchants
    // have their own hosts. So the receiver listens on several ports: healthy merchants share the first
    // `--receiver-ports`, hanging merchants the same number of others, and a hanging receiver slows only
    // its own hosts, as it would in production.
    let mut receiver = {
        let rx = rx.clone();
        HttpServer::new(move || App::new().app_data(rx.clone()).route("/hook/{i}", web::post().to(hook)))
            .workers(args.receiver_workers.max(1))
            .backlog(4_096)
            .max_connections(100_000)
    };
    let ports_each = args.receiver_ports.max(1);
    for _ in 0..ports_each * 2 {
        receiver = receiver.bind(("127.0.0.1", 0)).map_err(|e| format!("receiver bind: {e}"))?;
    }
    let hook_ports: Vec<u16> = receiver.addrs().iter().map(|a| a.port()).collect();
    if hook_ports.len() < ports_each * 2 {
        return Err("the receiver did not get all its ports".into());
    }
    let receiver = receiver.run();
    let receiver_handle = receiver.handle();
    actix_web::rt::spawn(receiver);

    let app = Application::build(settings).await.map_err(|e| e.to_string())?;
    let base = format!("http://127.0.0.1:{}", app.port());
    let state = app.state();
    let server = actix_web::rt::spawn(app.run_until_stopped());

    // Merchants go straight into the store: `merchants::create` hashes a password per merchant, which would
    // take minutes for 10,000; one shared hash keeps the records realistic.
    let created = Instant::now();
    let password_hash = merchants::hash_password("load-test-password").map_err(|e| e.to_string())?;
    let store = state.engine.store().clone();
    let mut tickets = Vec::with_capacity(args.merchants);
    for (i, key) in keys.iter().enumerate() {
        let slot = i % ports_each + if hanging[i] { ports_each } else { 0 };
        let port = hook_ports[slot];
        let merchant = Merchant {
            id: MerchantId::new(),
            name: format!("Load {i}"),
            email: format!("load{i}@example.com"),
            password_hash: password_hash.clone(),
            secret_key: key.clone(),
            webhook_url: Some(format!("http://127.0.0.1:{port}/hook/{i}")),
            created_at: Timestamp::now(),
        };
        tickets.push(store.put_merchant(merchant, None).map_err(|e| format!("merchant {i}: {e}"))?);
    }
    for ticket in tickets {
        match ticket.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(format!("merchant not stored: {e}")),
            Err(_) => return Err("the store closed while creating merchants".into()),
        }
    }
    eprintln!("caisse-load: {} merchants created in {:.1} s", args.merchants, created.elapsed().as_secs_f64());

    // One awc client on this thread; its pool may open as many connections as calls may be outstanding.
    let client = awc::Client::builder()
        .connector(awc::Connector::new().limit(args.max_outstanding))
        .timeout(Duration::from_secs(10))
        .finish();
    let ctx = Rc::new(Ctx {
        base,
        keys,
        client,
        rx: rx.clone(),
        driver: RefCell::new(Driver::default()),
        outstanding: Cell::new(0),
    });
    let total = (args.rate * args.duration).round() as u64;
    let mut rng = rand::thread_rng();
    let started = Instant::now();
    *lock(&rx.load_started) = Some(started);
    let mut issued = 0u64;
    let mut tick = actix_web::rt::time::interval(Duration::from_millis(1));
    // Arrivals follow the clock, not the answers: each millisecond issues whatever is due by then.
    while issued < total {
        tick.tick().await;
        let due = ((started.elapsed().as_secs_f64() * args.rate) as u64).min(total);
        while issued < due {
            issued += 1;
            if ctx.outstanding.get() >= args.max_outstanding {
                ctx.driver.borrow_mut().dropped += 1;
                continue;
            }
            let n = args.merchants;
            let merchant = match args.scenario {
                Scenario::Hot if n > 1 && rng.gen::<f64>() >= 0.9 => rng.gen_range(1..n),
                Scenario::Hot => 0,
                _ => rng.gen_range(0..n),
            };
            let op = match args.scenario {
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
    let offered_for = started.elapsed();
    // Let the calls in flight finish (the client's own timeout bounds this), then give the webhooks the grace.
    while ctx.outstanding.get() > 0 && started.elapsed() < offered_for + Duration::from_secs(15) {
        actix_web::rt::time::sleep(Duration::from_millis(20)).await;
    }
    let lives_accepted = ctx.driver.borrow().lives.len() as u64;
    let grace_until = Instant::now() + Duration::from_secs(args.grace);
    while Instant::now() < grace_until && rx.completed.load(Ordering::Relaxed) < lives_accepted {
        actix_web::rt::time::sleep(Duration::from_millis(100)).await;
    }
    let rss = proc_status_mib("VmRSS:");
    let rss_peak = proc_status_mib("VmHWM:");

    // The report is built in its own block so the driver's borrow ends before the shutdown awaits.
    let (report, unverified) = {
        let d = ctx.driver.borrow();
        let (mut lost, mut lost_hanging) = (0u64, 0u64);
        for (reference, merchant) in &d.lives {
            if !rx.arrivals.contains_key(&("payment.succeeded".to_owned(), reference.clone())) {
                if hanging.get(*merchant).copied().unwrap_or(false) {
                    lost_hanging += 1;
                } else {
                    lost += 1;
                }
            }
        }
        let mut events: BTreeMap<String, u64> = BTreeMap::new();
        for entry in rx.arrivals.iter() {
            *events.entry(entry.key().0.clone()).or_default() += 1;
        }
        let mut api = d.api_latency_us.clone();
        api.sort_unstable();
        let mut healthy = lock(&rx.healthy_latency_ms).clone();
        healthy.sort_unstable();
        let mut gaps = lock(&rx.duplicate_gap_ms).clone();
        gaps.sort_unstable();
        let mut held = lock(&rx.hanging_latency_ms).clone();
        held.sort_unstable();
        let completed = rx.completed.load(Ordering::Relaxed);
        let last_success_s = rx.last_success_ms.load(Ordering::Relaxed) as f64 / 1000.0;
        let window_s = offered_for.as_secs_f64().max(last_success_s);
        let healthy_completed = rx.healthy_completed.load(Ordering::Relaxed);
        let last_healthy_s = rx.last_healthy_success_ms.load(Ordering::Relaxed) as f64 / 1000.0;
        let healthy_window_s = offered_for.as_secs_f64().max(last_healthy_s);
        let ms = |us: u64| (us as f64 / 100.0).round() / 10.0;
        let unverified = rx.unverified.load(Ordering::Relaxed);
        let accepted_payments = d.accepted.get(&Op::Payment).copied().unwrap_or(0);
        let report = json!({
            "scenario": args.scenario.name(),
            "merchants": args.merchants,
            "receiver_ports": ports_each,
            "duration_s": args.duration,
            "sandbox_delay_ms": args.sandbox_delay_ms,
            "offered_per_s": args.rate,
            "offered": total,
            "issued": by_op(&d.issued),
            "accepted": by_op(&d.accepted),
            "rejected": by_op(&d.rejected),
            "rejected_codes": d.rejected_codes,
            "network_errors": d.network_errors,
            "dropped_at_cap": d.dropped,
            "refunds_unavailable": d.refunds_unavailable,
            "accepted_per_s": (accepted_payments as f64 / offered_for.as_secs_f64()).round(),
            "lives_accepted": lives_accepted,
            "lives_completed": completed,
            "completed_lives_per_s": (completed as f64 / window_s).round(),
            "last_success_s": last_success_s,
            "healthy_lives_completed": healthy_completed,
            "healthy_completed_lives_per_s": (healthy_completed as f64 / healthy_window_s).round(),
            "api_latency_ms": {"p50": ms(percentile(&api, 0.50)), "p99": ms(percentile(&api, 0.99)), "p100": ms(percentile(&api, 1.0))},
            "notice_to_webhook_ms": {"p50": percentile(&healthy, 0.50), "p99": percentile(&healthy, 0.99), "count": healthy.len()},
            "notice_to_webhook_hanging_ms": {"p50": percentile(&held, 0.50), "p99": percentile(&held, 0.99), "count": held.len()},
            "rss_mib": rss,
            "rss_peak_mib": rss_peak,
            "lost_webhooks": lost,
            "lost_webhooks_hanging": lost_hanging,
            "unverified_webhooks": unverified,
            "verified_deliveries": rx.verified.load(Ordering::Relaxed),
            "duplicate_deliveries": rx.duplicates.load(Ordering::Relaxed),
            "duplicate_gap_ms": {"p50": percentile(&gaps, 0.50), "p100": percentile(&gaps, 1.0)},
            "unparsed_webhooks": rx.unparsed.load(Ordering::Relaxed),
            "events": events,
        });
        (report, unverified)
    };
    receiver_handle.stop(false).await;
    server.abort();
    Ok((report, unverified == 0))
}

fn main() -> ExitCode {
    let args = Args::parse();
    match actix_web::rt::System::new().block_on(run(args)) {
        Ok((report, clean)) => {
            println!("{report}");
            if clean {
                ExitCode::SUCCESS
            } else {
                eprintln!("caisse-load: some webhooks did not verify");
                ExitCode::from(2)
            }
        }
        Err(e) => {
            eprintln!("caisse-load: {e}");
            ExitCode::FAILURE
        }
    }
}
