//! The pieces the fault tests stand on: the real `caisse` process, calls to its API that never panic, and
//! the findings collected along the way.
//!
//! Calls return an [`Answer`] even when no answer came (status 0): a server that crashes or hangs under a
//! fault is one more finding, and the test still reaches its restart and its durability check.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::{free_port, payment_body, sleep_ms};

pub const BIN: &str = env!("CARGO_BIN_EXE_caisse");
/// How long anything that should happen soon (a start, a payment's success) may take on a busy machine.
pub const DEADLINE: Duration = Duration::from_secs(30);
/// The sandbox provider confirms a payment this long after it is initiated.
const SANDBOX_DELAY_MS: u64 = 100;

/// Expectations that failed, reported together at the end so that one run tells the whole story.
#[derive(Default)]
pub struct Findings {
    failures: Vec<String>,
    logs: Vec<PathBuf>,
}

impl Findings {
    /// Records `what` as a failure unless `ok`; returns `ok`.
    pub fn check(&mut self, ok: bool, what: impl FnOnce() -> String) -> bool {
        if !ok {
            self.fail(what());
        }
        ok
    }

    pub fn fail(&mut self, what: String) {
        eprintln!("faults: FAILED: {what}");
        self.failures.push(what);
    }

    /// The server log to quote when the test fails.
    pub fn quote_log(&mut self, path: &Path) {
        self.logs.push(path.to_owned());
    }

    /// Panics with every failure, numbered, and an excerpt of each server log.
    pub fn finish(self) {
        if self.failures.is_empty() {
            return;
        }
        let mut report = format!("{} expectation(s) failed:\n", self.failures.len());
        for (i, failure) in self.failures.iter().enumerate() {
            report.push_str(&format!("  {}. {failure}\n", i + 1));
        }
        for log in &self.logs {
            report.push_str(&format!("--- {} ---\n{}\n", log.display(), log_excerpt(log)));
        }
        panic!("{report}");
    }
}

fn log_lines(path: &Path) -> Vec<String> {
    File::open(path).map(|file| BufReader::new(file).lines().map_while(Result::ok).collect()).unwrap_or_default()
}

pub fn log_tail(path: &Path, lines: usize) -> String {
    let all = log_lines(path);
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The first warnings and errors of a server log (how the fault began), its size, and its last lines.
fn log_excerpt(path: &Path) -> String {
    let all = log_lines(path);
    let first: Vec<&str> =
        all.iter().filter(|l| l.contains(" WARN ") || l.contains(" ERROR ")).take(6).map(String::as_str).collect();
    let last = &all[all.len().saturating_sub(10)..];
    format!("{} lines; first warnings:\n{}\n...\nlast lines:\n{}", all.len(), first.join("\n"), last.join("\n"))
}

/// How to run `caisse` on one data directory; each [`Caisse::spawn`] is a new process with its own log.
pub struct Caisse {
    workdir: PathBuf,
    pub data_dir: PathBuf,
    runs: usize,
    /// Settings of one test on top of the common ones below.
    env: Vec<(String, String)>,
}

impl Caisse {
    /// `workdir` holds the logs and is the working directory (so no stray `caisse.toml` is read); it must not
    /// be on the faulty filesystem, or the logs would fail with the store.
    pub fn new(workdir: &Path, data_dir: PathBuf) -> Caisse {
        Caisse { workdir: workdir.to_owned(), data_dir, runs: 0, env: Vec::new() }
    }

    /// Sets a `CAISSE_*` variable for every later command.
    pub fn set(&mut self, name: &str, value: &str) {
        self.env.push((name.to_owned(), value.to_owned()));
    }

    fn command(&self) -> Command {
        let mut command = Command::new(BIN);
        command
            .current_dir(&self.workdir)
            .env("CAISSE_DATA_DIR", &self.data_dir)
            .env("CAISSE_LOG", "warn")
            .env("CAISSE_HTTP_WORKERS", "2")
            .env("CAISSE_SANDBOX_DELAY_MS", SANDBOX_DELAY_MS.to_string())
            // Payments whose provider notices were refused during the fault are settled by the expiry sweep
            // soon after, so the final balance check does not wait 30 minutes.
            .env("CAISSE_PAYMENT_TTL", "3s")
            // The merchant has no webhook URL: each notification fails once, then waits an hour, so no
            // background write runs while the test makes its fault.
            .env("CAISSE_WEBHOOK_RETRY_SCHEDULE", "1h")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null());
        command
    }

    /// `caisse merchant create --json` (the server must be stopped); returns the secret key.
    pub fn create_merchant(&self, webhook_url: Option<&str>) -> String {
        let mut command = self.command();
        command.args(["merchant", "create", "--name", "Pannes", "--email", "pannes@example.com", "--json"]);
        if let Some(url) = webhook_url {
            command.args(["--webhook-url", url]);
        }
        let output = command.output().expect("caisse merchant create runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "merchant create failed: {stderr}");
        let created: Value = serde_json::from_slice(&output.stdout).expect("merchant create prints one JSON object");
        created["secret_key"].as_str().expect("secret_key").to_owned()
    }

    /// Starts `caisse serve` on a free port, its stderr in `serve-N.log` under the work directory.
    pub fn spawn(&mut self) -> Server {
        self.runs += 1;
        let port = free_port();
        let log = self.workdir.join(format!("serve-{}.log", self.runs));
        let stderr = File::create(&log).expect("server log file");
        let child = self
            .command()
            .arg("serve")
            .env("CAISSE_LISTEN", format!("127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("caisse serve starts");
        Server { child, port, log, base: format!("http://127.0.0.1:{port}") }
    }
}

/// A running `caisse serve`, killed when dropped (so a failed test leaves no process holding the mount).
pub struct Server {
    child: Child,
    port: u16,
    pub log: PathBuf,
    pub base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What became of a server asked to start.
pub enum Started {
    Listening,
    Exited(ExitStatus),
    Neither,
}

impl Server {
    /// Waits until the server accepts connections or exits, at most `within`.
    pub async fn started(&mut self, within: Duration) -> Started {
        let address = SocketAddr::from(([127, 0, 0, 1], self.port));
        let begun = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Started::Exited(status);
            }
            if TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok() {
                return Started::Listening;
            }
            if begun.elapsed() >= within {
                return Started::Neither;
            }
            sleep_ms(25).await;
        }
    }

    /// Waits until the server listens; panics with its log if it does not.
    pub async fn listening(&mut self) {
        match self.started(DEADLINE).await {
            Started::Listening => {}
            Started::Exited(status) => {
                panic!("caisse serve exited before listening ({status}):\n{}", log_tail(&self.log, 25))
            }
            Started::Neither => {
                panic!("caisse serve is not listening after {DEADLINE:?}:\n{}", log_tail(&self.log, 25))
            }
        }
    }

    /// SIGTERM, then SIGKILL if the server has not exited 15 s later. Returns how it ended, for the report.
    pub async fn stop(mut self) -> String {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let begun = Instant::now();
        while begun.elapsed() < Duration::from_secs(15) {
            if let Ok(Some(status)) = self.child.try_wait() {
                return format!("exited on SIGTERM: {status}");
            }
            sleep_ms(50).await;
        }
        let _ = self.child.kill();
        let status = self.child.wait().map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
        format!("did not exit within 15 s of SIGTERM; killed ({status})")
    }
}

/// One answer of the API; status 0 when none came (refused connection, time-out).
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub body: Value,
}

impl Answer {
    pub fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }

    pub fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The API's answer to storage that cannot take writes: 503 `unavailable`.
    pub fn unavailable(&self) -> bool {
        self.status == 503 && self.code() == "unavailable"
    }
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status, self.body)
    }
}

/// The merchant API of one running server.
pub struct Api {
    client: awc::Client,
    base: String,
    key: String,
}

impl Api {
    pub fn new(server: &Server, key: &str) -> Api {
        let client = awc::Client::builder().timeout(Duration::from_secs(10)).finish();
        Api { client, base: server.base.clone(), key: key.to_owned() }
    }

    async fn send(&self, request: awc::ClientRequest, body: Option<&Value>) -> Answer {
        let sent = match body {
            Some(body) => request.send_json(body).await,
            None => request.send().await,
        };
        let mut response = match sent {
            Ok(response) => response,
            Err(e) => return Answer { status: 0, body: json!({ "no_answer": e.to_string() }) },
        };
        let body = match response.body().limit(4 << 20).await {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            Err(e) => json!({ "unreadable_body": e.to_string() }),
        };
        Answer { status: response.status().as_u16(), body }
    }

    pub async fn get(&self, path: &str) -> Answer {
        let request = self.client.get(format!("{}{path}", self.base)).bearer_auth(&self.key);
        self.send(request, None).await
    }

    /// `GET /v1/ping`, without a key.
    pub async fn ping(&self) -> Answer {
        self.send(self.client.get(format!("{}/v1/ping", self.base)), None).await
    }

    /// Initiates a payment under a reference of ours, with that reference as its Idempotency-Key too, so that
    /// a retry after a refusal is the same request.
    pub async fn pay(&self, reference: &str, amount: i64) -> Answer {
        let mut body = payment_body(amount, "99");
        body["reference"] = json!(reference);
        let request = self
            .client
            .post(format!("{}/v1/paiement/initier", self.base))
            .bearer_auth(&self.key)
            .insert_header(("Idempotency-Key", reference));
        self.send(request, Some(&body)).await
    }
}
