//! `caisse-load`: an open-loop load generator for Caisse (issue 6).
//!
//! By default it starts a Caisse server in this process (loopback, temporary data directory, test settings
//! with a short sandbox delay, no rate limit and a short webhook retry schedule) and creates N merchants whose
//! webhook URLs point at a receiver run by the tool itself. With `--target URL` it drives a `caisse serve`
//! already running in its own process instead, with merchants written beforehand by `--prepare DIR` (see
//! `target.rs` for why they cannot be created against a running server); that server's memory is then read
//! from its own `/proc/<pid>/status`.
//!
//! Either way it offers a fixed rate of arrivals for a fixed time. Each arrival is one API call issued on
//! schedule whether or not earlier calls have finished (open loop); a payment arrival starts a "life" that
//! ends when `payment.succeeded` reaches the receiver with a valid signature.
//!
//! It prints one progress line on stderr and, at the end, ONE JSON line on stdout (see "The load tool" in
//! docs/perf/README.md).
//!
//! # Layout
//! - `main.rs`: flags, the two ways of getting a server and merchants, the run.
//! - `driver.rs`: the open-loop arrivals and the API calls.
//! - `receiver.rs`: the webhook receiver that verifies and records every delivery.
//! - `report.rs`: the JSON line.
//! - `target.rs`: `--prepare`, the merchants file, the server's pid and memory.

mod driver;
mod receiver;
mod report;
mod target;

use std::path::PathBuf;
use std::process::ExitCode;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use actix_web::dev::ServerHandle;
use actix_web::rt::task::JoinHandle;
use actix_web::web;
use caisse::app::Application;
use caisse::config::{parse_schedule, Environment, Settings};
use caisse::merchants;
use caisse_engine::domain::ids::MerchantId;
use caisse_engine::domain::records::Merchant;
use caisse_engine::domain::time::Timestamp;
use clap::{Parser, ValueEnum};
use serde_json::{json, Value};

use driver::Ctx;
use receiver::Receiver;

/// The same allocator as the `caisse` binary, so in-process runs measure what production runs.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
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
#[command(name = "caisse-load", about = "Open-loop load generator for Caisse, in-process or against a running server")]
struct Args {
    #[arg(long, value_enum, default_value = "spread")]
    scenario: Scenario,
    /// Number of merchants, each with its own key and webhook URL (default 1,000; with --target, every
    /// merchant of the merchants file).
    #[arg(long)]
    merchants: Option<usize>,
    /// Offered arrivals per second.
    #[arg(long, default_value_t = 1_000.0)]
    rate: f64,
    /// Seconds during which arrivals are offered.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Drive this running `caisse serve` (http://host:port) instead of starting one in-process; needs
    /// --merchants-file. The server's own settings apply: start it with CAISSE_RATE_LIMIT_PER_S=0. Several
    /// URLs separated by commas (the nodes of a cluster) take the arrivals in turn.
    #[arg(long, value_name = "URL", requires = "merchants_file", conflicts_with = "prepare")]
    target: Option<String>,
    /// Write --merchants sandbox merchants into the new data directory DIR (no server running on it), or into
    /// the PostgreSQL database a `postgres://` URL names (nodes may run on it), and their keys to
    /// --merchants-file, then exit; start `caisse serve` on that store afterwards.
    #[arg(long, value_name = "DIR|URL", requires = "merchants_file")]
    prepare: Option<PathBuf>,
    /// One merchant per line as `caisse merchant create --json` prints it; line i's webhook URL must be
    /// http://127.0.0.1:<port>/hook/i. Written by --prepare, read by --target.
    #[arg(long, value_name = "FILE")]
    merchants_file: Option<PathBuf>,
    /// With --prepare: the first receiver port; webhook URLs use this one and the next 2 × --receiver-ports − 1.
    #[arg(long, default_value_t = 9_100)]
    receiver_port: u16,
    /// With --target: the server process whose memory is reported (default: the one listening on the
    /// (first) target's port, found through /proc).
    #[arg(long)]
    server_pid: Option<u32>,
    /// In-process: the sandbox provider's delay before it sends its notices (ms).
    #[arg(long, default_value_t = 200)]
    sandbox_delay_ms: u64,
    /// Seconds to wait after the last arrival for the remaining `payment.succeeded` webhooks.
    #[arg(long, default_value_t = 15)]
    grace: u64,
    /// Most API calls in flight at once; arrivals beyond it are dropped and counted.
    #[arg(long, default_value_t = 20_000)]
    max_outstanding: usize,
    /// In-process: Caisse HTTP workers (0: one per core).
    #[arg(long, default_value_t = 0)]
    http_workers: usize,
    /// Receiver HTTP workers.
    #[arg(long, default_value_t = 2)]
    receiver_workers: usize,
    /// Receiver ports (webhook hosts) shared by the healthy merchants; hanging merchants get as many others.
    /// With --target the ports are those of the merchants file.
    #[arg(long, default_value_t = 16)]
    receiver_ports: usize,
    /// In-process: the webhook retry schedule given to the server.
    #[arg(long, default_value = "1s,2s,5s,10s")]
    retry_schedule: String,
}

/// Merchants written at once when the load tool creates them in process: they share group commits.
const MERCHANT_BATCH: usize = 1_024;

const MERCHANTS_DEFAULT: usize = 1_000;

/// Where the server runs.
enum Server {
    /// In this process, on a temporary data directory removed at the end.
    InProcess { task: JoinHandle<std::io::Result<()>>, _dir: DataDir },
    /// In its own process, already running; its pid when known, for its memory.
    Target { url: String, pid: Option<u32> },
}

/// A server ready for load, its merchants, and the receiver their webhooks go to.
struct Setup {
    server: Server,
    /// Where the arrivals go, in turn.
    bases: Vec<String>,
    keys: Vec<String>,
    hanging: Vec<bool>,
    rx: web::Data<Receiver>,
    receiver: ServerHandle,
    receiver_ports: usize,
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

fn new_receiver(args: &Args, keys: &[String]) -> (Vec<bool>, web::Data<Receiver>) {
    let hanging: Vec<bool> = (0..keys.len()).map(|i| args.scenario == Scenario::Hanging && target::hangs(i)).collect();
    let rx = web::Data::new(Receiver::new(keys.to_vec(), hanging.clone(), args.scenario == Scenario::Mix));
    (hanging, rx)
}

/// Starts the receiver and a server in this process, then creates the merchants in its store.
async fn in_process(args: &Args) -> Result<Setup, String> {
    let count = args.merchants.unwrap_or(MERCHANTS_DEFAULT);
    let dir = DataDir::create()?;
    let mut settings = Settings::for_tests(&dir.0).map_err(|e| e.to_string())?;
    settings.sandbox_delay_ms = args.sandbox_delay_ms;
    settings.rate_limit_per_s = 0;
    settings.http_workers = args.http_workers;
    settings.webhook_retry_schedule_ms =
        parse_schedule(&args.retry_schedule).map_err(|e| format!("--retry-schedule: {e}"))?;

    // The receiver first, so the merchants' webhook URLs can name its ports.
    let keys: Vec<String> = (0..count).map(|_| merchants::new_secret_key(Environment::Sandbox)).collect();
    let (hanging, rx) = new_receiver(args, &keys);
    let ports_each = args.receiver_ports.max(1);
    let (hook_ports, receiver) = receiver::start(rx.clone(), args.receiver_workers, &vec![0; ports_each * 2])?;

    let app = Application::build(settings).await.map_err(|e| e.to_string())?;
    let base = format!("http://127.0.0.1:{}", app.port());
    let state = app.state();
    let task = actix_web::rt::spawn(app.run_until_stopped());

    // Merchants are written without `merchants::create`, which hashes a password per merchant and would take
    // minutes for 10,000; one shared hash keeps the records realistic. A batch is written at once, so the
    // writes share group commits.
    let created = Instant::now();
    let password_hash = merchants::hash_password("load-test-password").map_err(|e| e.to_string())?;
    let mut batch = Vec::with_capacity(MERCHANT_BATCH);
    for (i, key) in keys.iter().enumerate() {
        let port = hook_ports[target::port_slot(i, ports_each, hanging[i])];
        let merchant = Merchant {
            id: MerchantId::new(),
            name: format!("Load {i}"),
            email: format!("load{i}@example.com"),
            password_hash: password_hash.clone(),
            secret_key: key.clone(),
            webhook_url: Some(format!("http://127.0.0.1:{port}/hook/{i}")),
            created_at: Timestamp::now(),
        };
        batch.push(state.engine.put_merchant(merchant, None));
        if batch.len() == MERCHANT_BATCH || i + 1 == keys.len() {
            for result in futures_util::future::join_all(batch.drain(..)).await {
                result.map_err(|e| format!("merchant: {e}"))?;
            }
        }
    }
    eprintln!("caisse-load: {count} merchants created in {:.1} s", created.elapsed().as_secs_f64());
    let server = Server::InProcess { task, _dir: dir };
    Ok(Setup { server, bases: vec![base], keys, hanging, rx, receiver, receiver_ports: ports_each })
}

/// Reads the merchants file, starts the receiver on the ports it names and checks that the running server
/// knows the first merchant's key.
async fn targeted(args: &Args, url: &str) -> Result<Setup, String> {
    let file = args.merchants_file.as_deref().ok_or("--target needs --merchants-file")?;
    let found = target::read_merchants(file, args.merchants)?;
    let (hanging, rx) = new_receiver(args, &found.keys);
    let (_, receiver) = receiver::start(rx.clone(), args.receiver_workers, &found.ports)?;
    let bases: Vec<String> = url.split(',').map(|u| u.trim().trim_end_matches('/').to_owned()).collect();
    let port = target::url_port(&bases[0])?;
    let client = awc::Client::builder().timeout(Duration::from_secs(10)).finish();
    for base in &bases {
        // A node of a cluster that has just started may not hold its shards yet: it answers 503 for a moment.
        let mut answer = driver::call(&client, &format!("{base}/v1/soldes"), &found.keys[0], None).await;
        for _ in 0..50 {
            if !matches!(answer, Ok((503, _))) {
                break;
            }
            actix_web::rt::time::sleep(Duration::from_millis(200)).await;
            answer = driver::call(&client, &format!("{base}/v1/soldes"), &found.keys[0], None).await;
        }
        match answer {
            Ok((200, _)) => {}
            Ok((status, answer)) => {
                return Err(format!(
                    "{base} answered {status} {answer} to the first merchant's key: is `caisse serve` running \
                     on the store prepared with this merchants file?"
                ))
            }
            Err(e) => return Err(format!("{base} does not answer: {e}")),
        }
    }
    let pid = args.server_pid.or_else(|| target::listening_pid(port));
    if pid.is_none() {
        eprintln!("caisse-load: no server pid found (give --server-pid); its memory will not be reported");
    }
    eprintln!(
        "caisse-load: {} merchants from {}, receiver on {} ports, server pid {}",
        found.keys.len(),
        file.display(),
        found.ports.len(),
        pid.map_or("unknown".to_owned(), |p| p.to_string())
    );
    let server = Server::Target { url: bases.join(","), pid };
    Ok(Setup { server, bases, keys: found.keys, hanging, rx, receiver, receiver_ports: found.ports.len() })
}

async fn run(args: Args) -> Result<(Value, bool), String> {
    let positive = |x: f64| x.is_finite() && x > 0.0;
    if args.merchants == Some(0) || !positive(args.rate) || !positive(args.duration) {
        return Err("--merchants, --rate and --duration must be above zero".into());
    }
    let setup = match &args.target {
        Some(url) => targeted(&args, url).await?,
        None => in_process(&args).await?,
    };
    let rx = setup.rx.clone();
    let ctx = Rc::new(Ctx::new(setup.bases.clone(), setup.keys.clone(), rx.clone(), args.max_outstanding));
    let offered_for = driver::offer(&ctx, args.scenario, args.rate, args.duration, args.max_outstanding).await;
    // Let the calls in flight finish (the client's own timeout bounds this), then give the webhooks the grace.
    let drain_until = Instant::now() + Duration::from_secs(15);
    while ctx.outstanding.get() > 0 && Instant::now() < drain_until {
        actix_web::rt::time::sleep(Duration::from_millis(20)).await;
    }
    let lives_accepted = ctx.driver.borrow().lives.len() as u64;
    let grace_until = Instant::now() + Duration::from_secs(args.grace);
    while Instant::now() < grace_until && rx.completed.load(Ordering::Relaxed) < lives_accepted {
        actix_web::rt::time::sleep(Duration::from_millis(100)).await;
    }
    // In-process, this process is the server (with the receiver and driver); a target's memory is its own.
    let memory = match &setup.server {
        Server::InProcess { .. } => json!({
            "mode": "in_process",
            "rss_mib": target::status_mib(None, "VmRSS:"),
            "rss_peak_mib": target::status_mib(None, "VmHWM:"),
        }),
        Server::Target { url, pid } => json!({
            "mode": "target",
            "target": url,
            "server_pid": pid,
            "rss_mib": pid.and_then(|p| target::status_mib(Some(p), "VmRSS:")),
            "rss_peak_mib": pid.and_then(|p| target::status_mib(Some(p), "VmHWM:")),
            "tool_rss_mib": target::status_mib(None, "VmRSS:"),
        }),
    };
    let (mut report, unverified) = report::report(&args, &setup, &ctx, offered_for, lives_accepted);
    if let (Value::Object(report), Value::Object(memory)) = (&mut report, memory) {
        report.extend(memory);
    }
    setup.receiver.stop(false).await;
    if let Server::InProcess { task, .. } = setup.server {
        task.abort();
    }
    Ok((report, unverified == 0))
}

/// `--prepare`: the merchants go into the data directory, their keys into the file, and the operator is told
/// what to run next.
async fn prepare(args: &Args, dir: &std::path::Path) -> Result<(), String> {
    let file = args.merchants_file.as_deref().ok_or("--prepare needs --merchants-file")?;
    let count = args.merchants.unwrap_or(MERCHANTS_DEFAULT);
    let started = Instant::now();
    target::prepare(dir, file, count, args.receiver_port, args.receiver_ports).await?;
    eprintln!(
        "caisse-load: {count} merchants written to {} and {} in {:.1} s; webhooks to 127.0.0.1:{}-{}.\n\
         Next: CAISSE_RATE_LIMIT_PER_S=0 CAISSE_SANDBOX_DELAY_MS=200 CAISSE_WEBHOOK_RETRY_SCHEDULE=1s,2s,5s,10s \
         CAISSE_LOG=warn caisse serve --data-dir {} &\n      \
         caisse-load --target http://127.0.0.1:8080 --merchants-file {}",
        dir.display(),
        file.display(),
        started.elapsed().as_secs_f64(),
        args.receiver_port,
        usize::from(args.receiver_port) + 2 * args.receiver_ports - 1,
        dir.display(),
        file.display(),
    );
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    let system = actix_web::rt::System::new();
    if let Some(dir) = args.prepare.clone() {
        return match system.block_on(prepare(&args, &dir)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("caisse-load: {e}");
                ExitCode::FAILURE
            }
        };
    }
    match system.block_on(run(args)) {
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
