//! Engine benchmark: durable payment events per second, memory per idle merchant actor, and recovery time.
//!
//! A "payment life" is `InitiatePayment` then `PaymentNotice::Confirmed`: two journal events, each answered
//! only once its group commit is synced. Lives run concurrently through `Engine::execute` (a bounded
//! `FuturesUnordered`), spread round-robin over 1, 100 or 10,000 merchants, each group on a fresh store.
//!
//! Run with `cargo bench --bench engine`. Besides the criterion groups it prints:
//! - the memory of idle merchant actors: bytes per actor by RSS growth (`/proc/self/statm`, measured first,
//!   before other groups leave freed heap behind) and by live heap bytes (a counting global allocator);
//! - the time `Engine::open` takes (the store's open plus the full startup audit) on a store of
//!   `CAISSE_BENCH_RECOVERY_EVENTS` journal events (default 1,000,000; 0 skips it). The store is built once
//!   and cached under the target directory; `CAISSE_BENCH_RECOVERY_REBUILD=1` builds it again.
//!
//! `CAISSE_BENCH_CACHE_MIB` sets fjall's block cache for the throughput groups (default: the engine's, 16 MiB).
//!
//! The same throughput groups then run on PostgreSQL (`payment_events_postgresql`): a private cluster the
//! bench starts from the installed programs with fsync on, or `CAISSE_TEST_DATABASE_URL`, one node holding
//! every shard, a fresh database per group; `CAISSE_BENCH_POSTGRES=0` skips them.
//!
//! Targets (issue, 2 cores): >= 100,000 events/s over 10,000 merchants, >= 30,000 events/s on one hot
//! merchant, <= 2 KiB per idle actor, recovery of 1,000,000 events <= 5 s.
//!
//! Without `--bench` (as `cargo test --benches` runs it) every group runs once and the extra measurements
//! run on small sizes, as a smoke test.

use std::alloc::{GlobalAlloc, Layout};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use caisse_engine::core::{Command, PaymentNotice};
use caisse_engine::domain::ids::MerchantId;
use caisse_engine::domain::records::Merchant;
use caisse_engine::domain::time::Timestamp;
use caisse_engine::store::fjall_store::DEFAULT_CACHE_BYTES;
use caisse_engine::store::open_embedded;
use caisse_engine::store::pg_store::NodeIdentity;
use caisse_engine::{Engine, EngineConfig, EngineError, Executed, Record};
use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput};
use futures_util::stream::{FuturesUnordered, StreamExt};

mod common;
use common::{dir_bytes, new_payment};

#[path = "../actors/tests/support/postgres.rs"]
mod postgres;

/// Counts live heap bytes while `COUNTING` is set, to measure what starting actors allocates exactly (the RSS
/// also moves with allocator arenas and pages reused from earlier frees). Off, it costs one relaxed load.
struct CountingAlloc;

static COUNTING: AtomicBool = AtomicBool::new(false);
static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            LIVE_BYTES.fetch_add(layout.size() as i64, Ordering::Relaxed);
        }
        mimalloc::MiMalloc.alloc(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if COUNTING.load(Ordering::Relaxed) {
            LIVE_BYTES.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        }
        mimalloc::MiMalloc.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            LIVE_BYTES.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        }
        mimalloc::MiMalloc.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// Payment lives in flight at once.
const CONCURRENCY: usize = 4_096;

fn bench_mode() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// One payment life: two durable events.
async fn life(engine: &Engine, merchant: &MerchantId) -> Result<(), EngineError> {
    let reference = match engine.execute(merchant, Command::InitiatePayment(new_payment()), None).await? {
        Executed::Done(Record::Payment(p)) => p.reference,
        other => panic!("initiate answered {other:?}"),
    };
    let confirm = Command::PaymentNotice { reference, notice: PaymentNotice::Confirmed };
    engine.execute(merchant, confirm, None).await?;
    Ok(())
}

/// Runs `count` lives, life `i` on merchant `(offset + i) % merchants.len()`, at most `concurrency` at once.
/// Returns the number of events written.
async fn run_lives(engine: &Engine, merchants: &[MerchantId], offset: usize, count: usize, concurrency: usize) -> u64 {
    let mut in_flight = FuturesUnordered::new();
    let mut started = 0;
    let mut finished = 0;
    while finished < count {
        while started < count && in_flight.len() < concurrency {
            let merchant = &merchants[(offset + started) % merchants.len()];
            in_flight.push(life(engine, merchant));
            started += 1;
        }
        match in_flight.next().await {
            Some(Ok(())) => finished += 1,
            Some(Err(e)) => panic!("a payment life failed: {e}"),
            None => break,
        }
    }
    2 * finished as u64
}

/// The engine's settings for a throughput group: the defaults, with fjall's block cache from
/// `CAISSE_BENCH_CACHE_MIB` when set.
fn config(dir: &Path) -> EngineConfig {
    let mut config = EngineConfig::new(dir);
    if let Ok(mib) = std::env::var("CAISSE_BENCH_CACHE_MIB") {
        let mib: u64 = mib.parse().expect("CAISSE_BENCH_CACHE_MIB must be a number of MiB");
        config.store_cache_bytes = mib << 20;
    }
    config
}

fn merchants(n: usize) -> Vec<MerchantId> {
    (0..n).map(|_| MerchantId::new()).collect()
}

/// The store a throughput group runs on.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Backend {
    /// fjall, the embedded default.
    Fjall,
    /// PostgreSQL on this machine, syncing its commits (a private cluster the bench starts, or
    /// `CAISSE_TEST_DATABASE_URL`), one node holding every shard.
    Postgres,
}

/// Events per second over 1, 100 and 10,000 merchants, each on a fresh store (directory or database).
fn throughput(c: &mut Criterion, backend: Backend) {
    let quick = !bench_mode();
    let name = match backend {
        Backend::Fjall => "payment_events",
        Backend::Postgres => "payment_events_postgresql",
    };
    for (n, lives) in [(1usize, 5_000usize), (100, 10_000), (10_000, 10_000)] {
        let lives = if quick { 200 } else { lives };
        let dir = tempfile::tempdir().expect("tempdir");
        let database = (backend == Backend::Postgres).then(postgres::durable_database);
        let mut config = config(dir.path());
        if let Some(database) = &database {
            config.postgres_url = Some(database.url.clone());
            config.node = Some(NodeIdentity { id: "bench".into(), url: "http://127.0.0.1:9".into() });
        }
        let system = actix::System::new();
        let engine = system.block_on(async { Engine::open(config) }).expect("open engine");
        engine.join_cluster().expect("join the cluster");
        let ids = merchants(n);
        let mut offset = 0;
        let mut group = c.benchmark_group(name);
        group
            .sampling_mode(SamplingMode::Flat)
            .sample_size(10)
            .warm_up_time(Duration::from_secs(2))
            .measurement_time(Duration::from_secs(20))
            .throughput(Throughput::Elements(2 * lives as u64));
        group.bench_function(BenchmarkId::new("merchants", n), |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    system.block_on(run_lives(&engine, &ids, offset, lives, CONCURRENCY));
                    offset += lives;
                }
                start.elapsed()
            })
        });
        group.finish();
        println!(
            "{name}/merchants/{n}: {} actors running, {} lives written on this store",
            engine.running_actors(),
            offset
        );
        drop(engine);
        drop(system);
    }
}

/// Resident set size of this process, from `/proc/self/statm` (pages of 4 KiB).
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("read /proc/self/statm");
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|s| s.parse().ok()).expect("statm resident");
    pages * 4096
}

/// Starts `ids.len()` merchant actors (one balances read each), 1,000 at a time.
async fn start_actors(engine: &Engine, ids: &[MerchantId]) {
    let mut reads = FuturesUnordered::new();
    let mut next = 0;
    loop {
        while next < ids.len() && reads.len() < 1_000 {
            reads.push(engine.balances(&ids[next]));
            next += 1;
        }
        match reads.next().await {
            Some(result) => {
                result.expect("balances");
            }
            None => break,
        }
    }
}

/// Memory per idle merchant actor: RSS growth over starting N actors, twice (the second batch shows the
/// steady cost, once allocator arenas and caches have grown).
fn idle_actor_memory() {
    let n = if bench_mode() { 10_000 } else { 500 };
    let dir = tempfile::tempdir().expect("tempdir");
    let system = actix::System::new();
    system.block_on(async {
        let engine = Engine::open(EngineConfig::new(dir.path())).expect("open engine");
        // Warm up: one actor per shard at least, so thread-local arenas exist before measuring.
        start_actors(&engine, &merchants(64)).await;
        for batch in 1..=2 {
            let ids = merchants(n);
            let before = rss_bytes();
            LIVE_BYTES.store(0, Ordering::SeqCst);
            COUNTING.store(true, Ordering::SeqCst);
            start_actors(&engine, &ids).await;
            // Let the actors' start-up settle (mailboxes drained, timers registered).
            actix::clock::sleep(Duration::from_millis(200)).await;
            COUNTING.store(false, Ordering::SeqCst);
            let heap = LIVE_BYTES.load(Ordering::SeqCst);
            let after = rss_bytes();
            println!(
                "idle_actor_memory: batch {batch}: {n} actors started ({} running): RSS {} -> {} KiB, \
                 {} bytes/actor by RSS, {} bytes/actor of live heap",
                engine.running_actors(),
                before / 1024,
                after / 1024,
                after.saturating_sub(before) / n as u64,
                heap / n as i64
            );
        }
    });
}

/// Where the recovery store is kept between runs.
fn recovery_dir(events: u64) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("caisse-bench-recovery-{events}"))
}

fn build_recovery_store(dir: &Path, events: u64) {
    let _ = std::fs::remove_dir_all(dir);
    let lives = (events / 2) as usize;
    let ids = merchants(1_000.min(lives.max(1)));
    let started = Instant::now();
    let system = actix::System::new();
    system.block_on(async {
        let engine = Engine::open(EngineConfig::new(dir)).expect("open engine");
        // As in the service, every merchant has its record; the audit splits the journal at their median.
        for (i, id) in ids.iter().enumerate() {
            let merchant = Merchant {
                id: id.clone(),
                name: format!("Recovery {i}"),
                email: format!("recovery{i}@example.com"),
                password_hash: String::new(),
                secret_key: format!("sk_test_recovery{i}"),
                webhook_url: None,
                created_at: Timestamp::now(),
            };
            engine.put_merchant(merchant, None).await.expect("merchant durable");
        }
        let chunk = 100_000;
        let mut done = 0;
        while done < lives {
            let count = chunk.min(lives - done);
            run_lives(&engine, &ids, done, count, CONCURRENCY).await;
            done += count;
            eprintln!("recovery: built {done}/{lives} lives, {:.1} s", started.elapsed().as_secs_f64());
        }
    });
    drop(system);
    std::fs::write(dir.join("bench-complete"), store_marker(events)).expect("mark store complete");
    println!(
        "recovery: built {} events over {} merchants in {:.1} s ({:.0} events/s)",
        2 * lives,
        ids.len(),
        started.elapsed().as_secs_f64(),
        (2 * lives) as f64 / started.elapsed().as_secs_f64()
    );
}

/// What `bench-complete` holds in a cached store this build can use; stores cached before merchant records
/// were written are built again.
fn store_marker(events: u64) -> String {
    format!("{events} events, merchant records")
}

/// Bytes this process made the kernel read from storage (`read_bytes` of `/proc/self/io`): page-cache hits do
/// not count, so it tells a cold recovery from a warm one.
fn disk_read_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|io| io.lines().find_map(|l| l.strip_prefix("read_bytes:").and_then(|v| v.trim().parse().ok())))
        .unwrap_or(0)
}

/// Opens a store of N journal events (on the engine that made it): the store alone, the audit alone, then
/// `Engine::open` as a whole.
fn recovery() {
    let events: u64 = match std::env::var("CAISSE_BENCH_RECOVERY_EVENTS") {
        Ok(v) => v.parse().expect("CAISSE_BENCH_RECOVERY_EVENTS must be a number"),
        Err(_) if bench_mode() => 1_000_000,
        Err(_) => 2_000,
    };
    if events == 0 {
        return;
    }
    let dir = recovery_dir(events);
    let rebuild = std::env::var("CAISSE_BENCH_RECOVERY_REBUILD").is_ok_and(|v| v == "1");
    let cached = std::fs::read_to_string(dir.join("bench-complete")).is_ok_and(|m| m == store_marker(events));
    if rebuild || !cached {
        build_recovery_store(&dir, events);
    }
    let open_store = || {
        let started = Instant::now();
        let store = open_embedded(&dir, DEFAULT_CACHE_BYTES, None).expect("open the store");
        (store, started.elapsed())
    };
    let (mut store, mut store_open) = open_store();
    let read_before = disk_read_bytes();
    let mut audit_started = Instant::now();
    let report = match store.audit() {
        Ok(report) => report,
        Err(e) => {
            // A store cached by an older engine build; build it again.
            eprintln!("recovery: cached store refused ({e}); rebuilding");
            drop(store);
            build_recovery_store(&dir, events);
            (store, store_open) = open_store();
            audit_started = Instant::now();
            store.audit().expect("audit of a fresh store")
        }
    };
    let audit = audit_started.elapsed();
    let audit_read = disk_read_bytes().saturating_sub(read_before);
    drop(store);
    let system = actix::System::new();
    let (engine_open, audited) = system.block_on(async {
        let started = Instant::now();
        let engine = Engine::open(EngineConfig::new(&dir)).expect("open engine");
        let elapsed = started.elapsed();
        (elapsed, engine.audit_report().clone())
    });
    drop(system);
    let size = dir_bytes(&dir);
    println!(
        "recovery: {} events over {} merchants ({} MiB on disk): store open {:.3} s, audit {:.3} s reading {} MiB \
         from disk; then Engine::open {:.3} s (audit reports {} ms), {:.0} events/s (store open: the engine's \
         own open)",
        audited.events,
        report.merchants,
        size >> 20,
        store_open.as_secs_f64(),
        audit.as_secs_f64(),
        audit_read >> 20,
        engine_open.as_secs_f64(),
        audited.elapsed_ms,
        audited.events as f64 / engine_open.as_secs_f64()
    );
}

fn main() {
    // First, while the heap holds nothing freed that new actors could reuse unseen by the RSS.
    idle_actor_memory();
    let mut criterion = Criterion::default().configure_from_args();
    throughput(&mut criterion, Backend::Fjall);
    // `CAISSE_BENCH_POSTGRES=0` leaves PostgreSQL out (a machine without its programs).
    if std::env::var("CAISSE_BENCH_POSTGRES").map_or(true, |v| v != "0") {
        throughput(&mut criterion, Backend::Postgres);
    }
    criterion.final_summary();
    recovery();
}
