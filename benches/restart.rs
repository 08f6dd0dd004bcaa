//! Restart bench: how long the real `caisse serve` takes to answer `GET /v1/ping` on a store holding N payment
//! lives, after the process that wrote them was killed with SIGKILL and again after a graceful stop, with the
//! disk each life costs and the time of the full audit, at several sizes written into one store in one run.
//!
//! Run with `cargo bench --bench restart`. `CAISSE_BENCH_RESTART_LIVES` lists the sizes, cumulative, in lives
//! (default `1000000,2000000,4000000`; a life is `InitiatePayment` then `Confirmed`, two journal events, as in
//! the engine bench), spread over `CAISSE_BENCH_RESTART_MERCHANTS` merchants (default 1,000). The store lives
//! under the target directory and is deleted at the start of each run.
//!
//! Each size is written by a child process (this binary again, as a writer: the engine with the server's
//! background audits on their default schedule, lives through `Engine::execute`), which is killed with SIGKILL
//! once every life is durable. Then `caisse serve` starts on the store (timed to its first `200` on
//! `/v1/ping`), stops on SIGTERM, starts again (timed), stops, and `caisse audit` runs the full audit on the
//! stopped store. The server's log lines give the parts of each start: the engine's open (fjall recovers its
//! journal there) and the audit since the checkpoints. Last, each tree's keys and bytes per life, and what the
//! engine adds (or saves, compressing).
//!
//! Without `--bench` (as `cargo test --benches` runs it) the sizes are 2,000, 4,000 and 8,000 lives over 50
//! merchants, as a smoke test.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use caisse_engine::core::{Command as EngineCommand, PaymentNotice};
use caisse_engine::domain::ids::MerchantId;
use caisse_engine::domain::records::Merchant;
use caisse_engine::domain::time::Timestamp;
use caisse_engine::store::FjallStore;
use caisse_engine::{AuditSchedule, Engine, EngineConfig, Executed, Record};
use futures_util::stream::{FuturesUnordered, StreamExt};

mod common;
use common::{dir_bytes, new_payment};

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The writer child's arguments: data directory, lives already written, lives to reach, merchants.
const WRITER: &str = "--restart-writer";
/// Payment lives in flight at once in the writer.
const CONCURRENCY: usize = 4_096;
/// How long one start may take before the bench gives up on it.
const START_PATIENCE: Duration = Duration::from_secs(600);
/// How long a writer may take for one size.
const WRITE_PATIENCE: Duration = Duration::from_secs(4 * 3_600);
/// How long a server may take to stop after SIGTERM before the bench kills it and says so.
const STOP_PATIENCE: Duration = Duration::from_secs(60);

fn bench_mode() -> bool {
    std::env::args().any(|a| a == "--bench")
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == WRITER) {
        let value = |i: usize| args.get(at + i).unwrap_or_else(|| panic!("{WRITER} needs 4 arguments"));
        let number = |i: usize| value(i).parse::<usize>().unwrap_or_else(|_| panic!("{WRITER}: not a number"));
        write_lives(Path::new(value(1)), number(2), number(3), number(4));
        return;
    }
    let quick = !bench_mode();
    let sizes: Vec<usize> = match std::env::var("CAISSE_BENCH_RESTART_LIVES") {
        Ok(list) => list.split(',').map(|n| n.trim().parse().expect("CAISSE_BENCH_RESTART_LIVES: numbers")).collect(),
        Err(_) if quick => vec![2_000, 4_000, 8_000],
        Err(_) => vec![1_000_000, 2_000_000, 4_000_000],
    };
    let merchants: usize = match std::env::var("CAISSE_BENCH_RESTART_MERCHANTS") {
        Ok(n) => n.parse().expect("CAISSE_BENCH_RESTART_MERCHANTS: a number"),
        Err(_) if quick => 50,
        Err(_) => 1_000,
    };
    let work = Path::new(env!("CARGO_TARGET_TMPDIR")).join("caisse-bench-restart");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("create the bench's directory");
    let data = work.join("data");
    let mut written = 0;
    println!("restart: sizes {sizes:?} lives over {merchants} merchants, store {}", data.display());
    for size in sizes {
        assert!(size > written, "sizes must grow");
        let started = Instant::now();
        kill_writer_when_done(&data, written, size, merchants);
        let write_s = started.elapsed().as_secs_f64();
        written = size;
        let bytes = dir_bytes(&data);
        let after_kill = start_and_stop(&work, &data, "kill");
        let after_stop = start_and_stop(&work, &data, "stop");
        let audit = full_audit(&work, &data);
        println!(
            "restart: {size} lives ({} events), {:.0} MiB on disk = {:.0} bytes per life (written in {write_s:.0} s); \
             start after SIGKILL {}; after a graceful stop {}; full audit {audit}",
            2 * size,
            bytes as f64 / (1 << 20) as f64,
            bytes as f64 / size as f64,
            after_kill,
            after_stop,
        );
        println!("restart: {size} lives, what the store holds per life: {}", breakdown(&data, size, bytes));
    }
    let _ = std::fs::remove_dir_all(&work);
}

/// The writer: opens the engine on `data`, creates the merchants on the first run, writes lives `from..to`,
/// says so on stdout, then waits to be killed.
fn write_lives(data: &Path, from: usize, to: usize, merchants: usize) {
    let system = actix::System::new();
    system.block_on(async {
        let engine = Engine::open(EngineConfig::new(data)).expect("the writer opens the engine");
        engine.start_audits(AuditSchedule::default());
        let ids = merchant_ids(data, merchants);
        if from == 0 {
            for (i, id) in ids.iter().enumerate() {
                let merchant = Merchant {
                    id: id.clone(),
                    name: format!("Restart {i}"),
                    email: format!("restart{i}@example.com"),
                    password_hash: String::new(),
                    secret_key: format!("sk_test_restart{i}"),
                    webhook_url: None,
                    created_at: Timestamp::now(),
                };
                engine.put_merchant(merchant, None).await.expect("merchant durable");
            }
        }
        let mut in_flight = FuturesUnordered::new();
        let (mut started, mut finished) = (from, from);
        while finished < to {
            while started < to && in_flight.len() < CONCURRENCY {
                in_flight.push(life(&engine, &ids[started % ids.len()]));
                started += 1;
            }
            if in_flight.next().await.is_some() {
                finished += 1;
            }
        }
        println!("written {to}");
        let _ = std::io::stdout().flush();
        // Every life is durable; the parent kills this process now, as a crash would.
        loop {
            actix::clock::sleep(Duration::from_secs(3_600)).await;
        }
    });
}

/// The merchants' ids, made on the first run and kept beside the store for the next writers.
fn merchant_ids(data: &Path, n: usize) -> Vec<MerchantId> {
    let file = data.parent().expect("the data directory has a parent").join("merchants.txt");
    if let Ok(text) = std::fs::read_to_string(&file) {
        return text.lines().map(|l| MerchantId::parse(l).expect("a merchant id")).collect();
    }
    let ids: Vec<MerchantId> = (0..n).map(|_| MerchantId::new()).collect();
    let text: String = ids.iter().map(|id| format!("{id}\n")).collect();
    std::fs::write(&file, text).expect("keep the merchants' ids");
    ids
}

/// One payment life: two durable events.
async fn life(engine: &Engine, merchant: &MerchantId) {
    let reference = match engine.execute(merchant, EngineCommand::InitiatePayment(new_payment()), None).await {
        Ok(Executed::Done(Record::Payment(p))) => p.reference,
        other => panic!("initiate answered {other:?}"),
    };
    let confirm = EngineCommand::PaymentNotice { reference, notice: PaymentNotice::Confirmed };
    engine.execute(merchant, confirm, None).await.expect("confirmed");
}

/// Runs a writer child up to `to` lives and kills it with SIGKILL once it says they are durable.
fn kill_writer_when_done(data: &Path, from: usize, to: usize, merchants: usize) {
    let exe = std::env::current_exe().expect("this bench's binary");
    let mut child = Command::new(exe)
        .args([WRITER, &data.to_string_lossy(), &from.to_string(), &to.to_string(), &merchants.to_string()])
        .env("CAISSE_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the writer");
    let stdout = child.stdout.take().expect("the writer's stdout");
    let (said, hear) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = said.send(BufReader::new(stdout).lines().next());
    });
    match hear.recv_timeout(WRITE_PATIENCE) {
        Ok(Some(Ok(line))) if line == format!("written {to}") => {}
        other => {
            let _ = child.kill();
            panic!("the writer did not write {to} lives within {WRITE_PATIENCE:?}: {other:?}");
        }
    }
    child.kill().expect("SIGKILL the writer");
    let _ = child.wait();
}

/// A `caisse serve` on the store, killed if the bench panics.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `caisse serve` on `data`, times it to its first answer to `GET /v1/ping`, stops it with SIGTERM, and
/// describes the start with what its log says of the store's open and the audit.
fn start_and_stop(work: &Path, data: &Path, label: &str) -> String {
    let port = free_port();
    let log = work.join(format!("serve-{label}.log"));
    let started = Instant::now();
    let mut server = Server(
        Command::new(env!("CARGO_BIN_EXE_caisse"))
            .arg("serve")
            .current_dir(work)
            .env("CAISSE_DATA_DIR", data)
            .env("CAISSE_LISTEN", format!("127.0.0.1:{port}"))
            .env("CAISSE_ENVIRONMENT", "sandbox")
            .env("CAISSE_LOG", "info")
            .env("CAISSE_LOG_FORMAT", "json")
            .env_remove("CAISSE_ADMIN_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("the server's log file"))
            .spawn()
            .expect("start caisse serve"),
    );
    loop {
        if let Some(status) = server.0.try_wait().expect("the server's state") {
            panic!("caisse serve exited at start ({status}); see {}", log.display());
        }
        if ping(port) {
            break;
        }
        assert!(started.elapsed() < START_PATIENCE, "caisse serve did not answer within {START_PATIENCE:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    let elapsed = started.elapsed();
    // SAFETY: kill(2) on our own child's pid sends it a signal and touches no memory.
    unsafe {
        libc::kill(server.0.id() as libc::pid_t, libc::SIGTERM);
    }
    let stopping = Instant::now();
    while server.0.try_wait().ok().flatten().is_none() {
        if stopping.elapsed() > STOP_PATIENCE {
            println!("restart: caisse serve did not stop within {STOP_PATIENCE:?} of SIGTERM; killed");
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let field = |message: &str, name: &str| -> String {
        text.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|l| l["message"] == message || l["fields"]["message"] == message)
            .and_then(|l| {
                let v = if l.get(name).is_some() { l[name].clone() } else { l["fields"][name].clone() };
                (!v.is_null()).then(|| v.to_string())
            })
            .unwrap_or_else(|| "?".into())
    };
    format!(
        "{:.2} s (store open {} ms, audit {} events in {} ms)",
        elapsed.as_secs_f64(),
        field("opened the keyspace", "elapsed_ms"),
        field("ledger audit passed", "events"),
        field("ledger audit passed", "elapsed_ms"),
    )
}

/// `caisse audit` on the stopped store: what it printed.
fn full_audit(work: &Path, data: &Path) -> String {
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_caisse"))
        .arg("audit")
        .current_dir(work)
        .env("CAISSE_DATA_DIR", data)
        .env("CAISSE_LOG", "warn")
        .env_remove("CAISSE_ADMIN_TOKEN")
        .output()
        .expect("run caisse audit");
    assert!(output.status.success(), "caisse audit failed: {}", String::from_utf8_lossy(&output.stderr));
    format!("{:.2} s: {}", started.elapsed().as_secs_f64(), String::from_utf8_lossy(&output.stdout).trim())
}

/// Each tree's keys and bytes per life on the stopped store, and what the engine adds to them.
fn breakdown(data: &Path, lives: usize, disk_bytes: u64) -> String {
    let sizes =
        FjallStore::open(data).and_then(|store| store.tree_sizes()).expect("read every tree of the stopped store");
    let per_life = |bytes: u64| bytes as f64 / lives as f64;
    let mut parts: Vec<String> = sizes
        .iter()
        .filter(|t| t.keys > 0)
        .map(|t| format!("{} {:.2} keys {:.0} B", t.name, per_life(t.keys), per_life(t.key_bytes + t.value_bytes)))
        .collect();
    let stored: u64 = sizes.iter().map(|t| t.key_bytes + t.value_bytes).sum();
    parts.push(format!("stored {:.0} B", per_life(stored)));
    parts.push(format!("the engine's own {:.0} B", (disk_bytes as f64 - stored as f64) / lives as f64));
    parts.join(", ")
}

/// True when `GET /v1/ping` answers 200.
fn ping(port: u16) -> bool {
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(mut stream) = TcpStream::connect_timeout(&address, Duration::from_millis(200)) else { return false };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream.write_all(b"GET /v1/ping HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").is_err() {
        return false;
    }
    let mut answer = String::new();
    let _ = stream.take(4096).read_to_string(&mut answer);
    answer.starts_with("HTTP/1.1 200")
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}
