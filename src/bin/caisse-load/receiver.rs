//! The tool's webhook receiver: one actix-web server listening on several loopback ports, answering
//! `POST /hook/<merchant index>`.
//!
//! Every delivery is checked with [`caisse_engine::webhook::verify`] and the key of the merchant named by the
//! path; the first arrival time of each (event, reference) is recorded, and later ones count as duplicates
//! with their gap to the first. Several ports, because the server's delivery pool limits concurrency per
//! host:port (128, and 2 once a host is slow), as real merchants have their own hosts.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use actix_web::dev::ServerHandle;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use caisse_engine::domain::time::Timestamp;
use caisse_engine::webhook::{verify, SIGNATURE_HEADER, TIMESTAMP_HEADER};
use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use serde::Deserialize;

/// What the receiver records; shared with its worker threads.
pub struct Receiver {
    keys: Vec<String>,
    hanging: Vec<bool>,
    /// Whether succeeded payments are queued for refunds (mix scenario only, so the queue does not grow
    /// for nothing).
    queue_refunds: bool,
    /// First arrival (Unix ms) of each (event, reference).
    pub arrivals: DashMap<(String, String), u64>,
    pub verified: AtomicU64,
    pub unverified: AtomicU64,
    pub unparsed: AtomicU64,
    pub duplicates: AtomicU64,
    pub completed: AtomicU64,
    /// Milliseconds from the start of the load to the last first `payment.succeeded`.
    pub last_success_ms: AtomicU64,
    /// The same two figures for healthy merchants only (all of them outside the hanging scenario).
    pub healthy_completed: AtomicU64,
    pub last_healthy_success_ms: AtomicU64,
    pub healthy_latency_ms: Mutex<Vec<u64>>,
    pub hanging_latency_ms: Mutex<Vec<u64>>,
    pub refundable: Mutex<VecDeque<(usize, String)>>,
    /// For each repeated (event, reference): milliseconds since its first arrival, which tells a retry by
    /// schedule (seconds) from a resend racing the first attempt (milliseconds).
    pub duplicate_gap_ms: Mutex<Vec<u64>>,
    pub load_started: Mutex<Option<Instant>>,
}

impl Receiver {
    pub fn new(keys: Vec<String>, hanging: Vec<bool>, queue_refunds: bool) -> Receiver {
        Receiver {
            keys,
            hanging,
            queue_refunds,
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
        }
    }
}

/// Mutex poisoning only follows a panic elsewhere; the data is still plain numbers, so keep using it.
pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Starts the receiver on 127.0.0.1 at each of `ports` (0: any free port) and returns the ports it got, in
/// the same order, with the handle that stops it.
pub fn start(rx: web::Data<Receiver>, workers: usize, ports: &[u16]) -> Result<(Vec<u16>, ServerHandle), String> {
    let mut server = HttpServer::new(move || App::new().app_data(rx.clone()).route("/hook/{i}", web::post().to(hook)))
        .workers(workers.max(1))
        .backlog(4_096)
        .max_connections(100_000);
    for port in ports {
        server = server.bind(("127.0.0.1", *port)).map_err(|e| format!("receiver bind 127.0.0.1:{port}: {e}"))?;
    }
    let bound: Vec<u16> = server.addrs().iter().map(|a| a.port()).collect();
    if bound.len() < ports.len() {
        return Err("the receiver did not get all its ports".into());
    }
    let server = server.run();
    let handle = server.handle();
    actix_web::rt::spawn(server);
    Ok((bound, handle))
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
        Ok(h) => record(&rx, index, hanging, arrived, h),
    }
    if hanging {
        // A hanging receiver holds the connection and never answers; the server's own timeout ends it.
        std::future::pending::<()>().await;
    }
    HttpResponse::Ok().finish()
}

/// Records one verified delivery.
fn record(rx: &Receiver, index: usize, hanging: bool, arrived: Timestamp, h: Hook) {
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
        return;
    }
    if h.event != "payment.succeeded" {
        return;
    }
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
    // The provider's confirmation time is approximated by `paid_at`, written when the notice was applied.
    let paid = h.data.paid_at.as_deref().and_then(|p| Timestamp::parse_rfc3339(p).ok());
    if let Some(paid) = paid {
        let bucket = if hanging { &rx.hanging_latency_ms } else { &rx.healthy_latency_ms };
        lock(bucket).push(arrived.ms_since(paid));
    }
    if rx.queue_refunds {
        lock(&rx.refundable).push_back((index, h.data.reference));
    }
}
