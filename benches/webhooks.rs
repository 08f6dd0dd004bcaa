//! Webhook delivery benchmark: deliveries per second from the store's outbox to a local receiver.
//!
//! An actix-web receiver on 127.0.0.1 (one worker) answers 200 and counts requests, verifying the signature of
//! every 1,000th. A few merchants point their webhook URL at it; N payments initiated through the engine
//! write N `payment.initiated` notifications. Then the delivery pool starts with the default configuration,
//! and the clock runs until the receiver has counted N requests and the store's due index is empty (every
//! outcome persisted).
//!
//! Run with `cargo bench --bench webhooks`; `CAISSE_BENCH_WEBHOOKS` sets N (default 50,000), and
//! `CAISSE_BENCH_TRACE=1` prints the received count over time, `CAISSE_BENCH_SCAN_MS` overrides the pool's
//! `scan_every` (default: the production 500 ms). Target: >= 20,000 deliveries/s on 2 cores. Without `--bench` it runs 500 notifications, as a smoke test.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use caisse_engine::core::Command;
use caisse_engine::domain::ids::MerchantId;
use caisse_engine::domain::records::Merchant;
use caisse_engine::domain::time::Timestamp;
use caisse_engine::webhook::delivery::DeliveryConfig;
use caisse_engine::webhook::{verify, SIGNATURE_HEADER, TIMESTAMP_HEADER};
use caisse_engine::{Engine, EngineConfig};
use futures_util::stream::{FuturesUnordered, StreamExt};

mod common;
use common::new_payment;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

const MERCHANTS: usize = 4;
const TARGET_PER_S: f64 = 20_000.0;
/// The benchmark gives up after this long, so it always stops by itself.
const DEADLINE: Duration = Duration::from_secs(600);

struct Receiver {
    count: AtomicU64,
    verified: AtomicU64,
    bad_signatures: AtomicU64,
    keys: Vec<String>,
}

async fn hook(req: HttpRequest, body: web::Bytes, path: web::Path<usize>, rx: web::Data<Receiver>) -> HttpResponse {
    let seen = rx.count.fetch_add(1, Ordering::Relaxed);
    if seen.is_multiple_of(1_000) {
        let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or_default();
        let key = rx.keys.get(path.into_inner()).map(String::as_str).unwrap_or_default();
        let now = Timestamp::now().unix_s();
        match verify(key, header(SIGNATURE_HEADER), header(TIMESTAMP_HEADER), &body, now) {
            Ok(()) => rx.verified.fetch_add(1, Ordering::Relaxed),
            Err(_) => rx.bad_signatures.fetch_add(1, Ordering::Relaxed),
        };
    }
    HttpResponse::Ok().finish()
}

/// N initiations spread over `ids`, 4,096 in flight: one `payment.initiated` notification each.
async fn initiate(engine: &Engine, ids: &[MerchantId], n: usize) {
    let mut in_flight = FuturesUnordered::new();
    let mut started = 0;
    let mut finished = 0;
    while finished < n {
        while started < n && in_flight.len() < 4_096 {
            let merchant = &ids[started % ids.len()];
            in_flight.push(engine.execute(merchant, Command::InitiatePayment(new_payment()), None));
            started += 1;
        }
        match in_flight.next().await {
            Some(result) => {
                result.expect("initiate");
                finished += 1;
            }
            None => break,
        }
    }
}

async fn run(n: usize) -> f64 {
    let keys: Vec<String> = (0..MERCHANTS).map(|i| format!("sk_test_bench{i:02}{}", "x".repeat(32))).collect();
    let receiver = web::Data::new(Receiver {
        count: AtomicU64::new(0),
        verified: AtomicU64::new(0),
        bad_signatures: AtomicU64::new(0),
        keys: keys.clone(),
    });
    let server = {
        let receiver = receiver.clone();
        HttpServer::new(move || App::new().app_data(receiver.clone()).route("/hook/{i}", web::post().to(hook)))
            .workers(1)
            .backlog(4_096)
            .max_connections(100_000)
            .bind(("127.0.0.1", 0))
            .expect("bind receiver")
    };
    let port = server.addrs()[0].port();
    let server = server.run();
    let server_handle = server.handle();
    actix::spawn(server);

    let dir = tempfile::tempdir().expect("tempdir");
    let engine = Engine::open(EngineConfig::new(dir.path())).expect("open engine");
    let mut ids = Vec::with_capacity(MERCHANTS);
    for (i, key) in keys.iter().enumerate() {
        let merchant = Merchant {
            id: MerchantId::new(),
            name: format!("Bench {i}"),
            email: format!("bench{i}@example.com"),
            password_hash: String::new(),
            secret_key: key.clone(),
            webhook_url: Some(format!("http://127.0.0.1:{port}/hook/{i}")),
            created_at: Timestamp::now(),
        };
        ids.push(merchant.id.clone());
        engine.put_merchant(merchant, None).await.expect("merchant durable");
    }

    let started = Instant::now();
    initiate(&engine, &ids, n).await;
    println!(
        "webhooks: {n} notifications written over {MERCHANTS} merchants in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    let due = engine.due_notifications(Timestamp::now(), n + 1).expect("due").len();
    assert_eq!(due, n, "every initiation leaves one due notification");

    let far_future = Timestamp::from_unix_ms(4_102_444_800_000);
    let started = Instant::now();
    let mut config = DeliveryConfig::default();
    if let Some(ms) = std::env::var("CAISSE_BENCH_SCAN_MS").ok().and_then(|v| v.parse().ok()) {
        config.scan_every = Duration::from_millis(ms);
    }
    let pool = engine.start_webhooks(config).expect("start pool");
    let mut all_received = None;
    let trace = std::env::var("CAISSE_BENCH_TRACE").is_ok_and(|v| v == "1");
    let mut timeline = Vec::new();
    let total = loop {
        actix::clock::sleep(Duration::from_millis(10)).await;
        let received = receiver.count.load(Ordering::Relaxed);
        if trace {
            timeline.push((started.elapsed().as_millis(), received, pool.in_flight().await));
        }
        if received >= n as u64 && all_received.is_none() {
            all_received = Some(started.elapsed());
        }
        if all_received.is_some() && engine.due_notifications(far_future, 1).expect("due").is_empty() {
            break started.elapsed();
        }
        if started.elapsed() > DEADLINE {
            let left = engine.due_notifications(far_future, n).expect("due").len();
            panic!("webhooks: gave up after {DEADLINE:?}: {received} received, {left} still pending");
        }
    };
    let received = receiver.count.load(Ordering::Relaxed);
    let rate = n as f64 / total.as_secs_f64();
    for (ms, count, in_flight) in timeline.iter().step_by(5) {
        println!("webhooks: t={ms} ms received={count} dispatcher_in_flight={in_flight}");
    }
    println!(
        "webhooks: {n} delivered; all received after {:.3} s ({:.0}/s), all persisted after {:.3} s; \
         {} requests in all ({} duplicates); signatures sampled: {} good, {} bad",
        all_received.unwrap_or(total).as_secs_f64(),
        n as f64 / all_received.unwrap_or(total).as_secs_f64(),
        total.as_secs_f64(),
        received,
        received.saturating_sub(n as u64),
        receiver.verified.load(Ordering::Relaxed),
        receiver.bad_signatures.load(Ordering::Relaxed),
    );
    assert_eq!(receiver.bad_signatures.load(Ordering::Relaxed), 0, "every sampled signature verifies");
    drop(pool);
    drop(engine);
    server_handle.stop(false).await;
    rate
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let n = match std::env::var("CAISSE_BENCH_WEBHOOKS") {
        Ok(v) => v.parse().expect("CAISSE_BENCH_WEBHOOKS must be a number"),
        Err(_) if bench => 50_000,
        Err(_) => 500,
    };
    let rate = actix::System::new().block_on(run(n));
    let verdict = if rate >= TARGET_PER_S { "meets" } else { "MISSES" };
    println!(
        "webhooks summary: {rate:.0} deliveries/s for {n} notifications ({verdict} the target of {TARGET_PER_S:.0}/s)"
    );
}
