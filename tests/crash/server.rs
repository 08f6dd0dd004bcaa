//! The server under test: the real `caisse` binary as a child process on a fixed loopback port and one data
//! directory for the whole test, killed with SIGKILL and started again; and [`Target`], the HTTP client side
//! the load and the checks share, with the gate that stops new requests while the server is down.

use std::cell::{Cell, RefCell};
use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::sleep_ms;

const BIN: &str = env!("CARGO_BIN_EXE_caisse");
/// The sandbox provider's delay: short, so that payments, refunds and payouts complete between kills.
pub const SANDBOX_DELAY_MS: u64 = 200;
/// Short, so that payments that never get an answer (ending `02`) or lost their simulator state in a crash
/// settle within the test.
pub const PAYMENT_TTL: &str = "2s";
/// Ten quick attempts: a notification refused once, or interrupted by a kill, is sent again within a second.
const RETRY_SCHEDULE: &str = "300ms,300ms,500ms,500ms,1s,1s,1s,1s,1s";
/// How long a start may take before the test gives up on it.
const START_DEADLINE: Duration = Duration::from_secs(30);

/// `caisse` with the test's settings, on `data_dir`.
fn caisse(work_dir: &Path, data_dir: &Path) -> Command {
    let mut command = Command::new(BIN);
    command
        .current_dir(work_dir)
        .env("CAISSE_DATA_DIR", data_dir)
        .env("CAISSE_LOG", "warn")
        .env("CAISSE_HTTP_WORKERS", "2")
        .env("CAISSE_RATE_LIMIT_PER_S", "100000")
        .env("CAISSE_PAYMENT_TTL", PAYMENT_TTL)
        .env("CAISSE_WEBHOOK_RETRY_SCHEDULE", RETRY_SCHEDULE)
        .env("CAISSE_SANDBOX_DELAY_MS", SANDBOX_DELAY_MS.to_string());
    command
}

/// A merchant as `caisse merchant create --json` made it.
pub struct Created {
    pub id: String,
    pub secret_key: String,
}

/// Creates a merchant with the operator command (the server must be stopped: the store is single-process).
pub fn create_merchant(work_dir: &Path, data_dir: &Path, name: &str, webhook_url: &str) -> Created {
    create_merchant_with(work_dir, data_dir, &[], name, webhook_url)
}

/// [`create_merchant`] with more settings in the environment (a cluster's store, which nodes share while they
/// run).
pub fn create_merchant_with(
    work_dir: &Path,
    data_dir: &Path,
    env: &[(String, String)],
    name: &str,
    webhook_url: &str,
) -> Created {
    let output = caisse(work_dir, data_dir)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .args(["merchant", "create", "--name", name, "--email", &format!("{name}@example.com"), "--json"])
        .args(["--webhook-url", webhook_url])
        .output()
        .expect("caisse merchant create runs");
    assert!(output.status.success(), "merchant create: {}", String::from_utf8_lossy(&output.stderr));
    let created: Value = serde_json::from_slice(&output.stdout).expect("merchant create prints one JSON object");
    Created {
        id: created["id"].as_str().expect("id").to_owned(),
        secret_key: created["secret_key"].as_str().expect("secret_key").to_owned(),
    }
}

/// One run of `caisse serve`, killed (SIGKILL) when dropped so that a failing test leaves no process behind.
pub struct Server {
    child: Child,
    /// Its stdout and stderr lines, for the failure message when it does not start.
    output: Arc<Mutex<Vec<String>>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn collect(stream: impl Read + Send + 'static, sink: Arc<Mutex<Vec<String>>>) {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            sink.lock().expect("output lines").push(line);
        }
    });
}

impl Server {
    /// Starts `caisse serve` on `port` without waiting for it.
    pub fn spawn(work_dir: &Path, data_dir: &Path, port: u16) -> Server {
        Server::spawn_with(work_dir, data_dir, port, &[])
    }

    /// [`Server::spawn`] with more settings in the environment (a node of a cluster).
    pub fn spawn_with(work_dir: &Path, data_dir: &Path, port: u16, env: &[(String, String)]) -> Server {
        let mut command = caisse(work_dir, data_dir);
        command
            .envs(env.iter().map(|(k, v)| (k, v)))
            .arg("serve")
            .env("CAISSE_LISTEN", format!("127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("caisse serve starts");
        let output = Arc::new(Mutex::new(Vec::new()));
        if let Some(stdout) = child.stdout.take() {
            collect(stdout, output.clone());
        }
        if let Some(stderr) = child.stderr.take() {
            collect(stderr, output.clone());
        }
        Server { child, output }
    }

    /// Starts `caisse serve` and waits until it accepts connections. A server that exits instead (its startup
    /// audit refused the store, say) fails the test with its output.
    pub async fn start(work_dir: &Path, data_dir: &Path, port: u16) -> Server {
        Server::start_with(work_dir, data_dir, port, &[]).await
    }

    /// [`Server::start`] with more settings in the environment (a node of a cluster).
    pub async fn start_with(work_dir: &Path, data_dir: &Path, port: u16, env: &[(String, String)]) -> Server {
        let mut server = Server::spawn_with(work_dir, data_dir, port, env);
        let address = SocketAddr::from(([127, 0, 0, 1], port));
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                sleep_ms(100).await;
                panic!("caisse serve exited before listening ({status}):\n{}", server.output().join("\n"));
            }
            if TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok() {
                return server;
            }
            assert!(
                started.elapsed() < START_DEADLINE,
                "caisse serve is not listening on {port} after {START_DEADLINE:?}:\n{}",
                server.output().join("\n")
            );
            sleep_ms(10).await;
        }
    }

    /// SIGTERM, then waits for the process to exit on its own, at most `bound`. Answers how long it took and
    /// whether it exited successfully; `Err` when it was still running at the bound (it is then killed).
    pub fn terminate(mut self, bound: Duration) -> Result<(Duration, bool), String> {
        let sent = Instant::now();
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .map_err(|e| format!("kill -TERM: {e}"))?;
        if !status.success() {
            return Err(format!("kill -TERM answered {status}"));
        }
        loop {
            if let Some(status) = self.child.try_wait().map_err(|e| format!("waiting: {e}"))? {
                return Ok((sent.elapsed(), status.success()));
            }
            if sent.elapsed() > bound {
                return Err(format!("still running {bound:?} after SIGTERM:\n{}", self.output().join("\n")));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn output(&self) -> Vec<String> {
        self.output.lock().expect("output lines").clone()
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`): the process keeps its sockets and memory but runs nothing, as a
    /// machine that froze or a virtual machine that was paused.
    pub fn pause(&self, stopped: bool) {
        let signal = if stopped { "-STOP" } else { "-CONT" };
        let status = Command::new("kill").args([signal, &self.child.id().to_string()]).status();
        assert!(status.is_ok_and(|s| s.success()), "kill {signal} {}", self.child.id());
    }

    /// SIGKILL (what `Child::kill` sends on Unix), then reaps the process so its store lock is gone. `Err`
    /// with its output when it had already exited by itself: a server that stops on its own is a failure.
    pub fn kill(mut self) -> Result<(), String> {
        if let Ok(Some(status)) = self.child.try_wait() {
            std::thread::sleep(Duration::from_millis(100));
            return Err(format!("caisse serve exited by itself ({status}):\n{}", self.output().join("\n")));
        }
        self.child.kill().map_err(|e| format!("SIGKILL: {e}"))?;
        let status = self.child.wait().map_err(|e| format!("reaping: {e}"))?;
        if status.success() {
            return Err(format!("caisse serve exited normally instead of being killed:\n{}", self.output().join("\n")));
        }
        Ok(())
    }
}

/// An HTTP answer: status and JSON body (`Null` when the body is not JSON).
pub struct Answer {
    pub status: u16,
    pub json: Value,
    /// `Idempotent-Replayed: true`: the first answer to this key, given again.
    pub replayed: bool,
}

/// The client side of the server: its address, the current client, and the gate the load waits at.
///
/// The gate closes in the same synchronous step as the kill, so every request the load started before it went
/// to the process that was killed, and no new one starts until the server is back and the checks are done.
/// Each restart gets a fresh client, so no request reuses a pooled connection to the dead process.
///
/// A target may be several nodes of a cluster: requests then go to the live ones in turn, so that both the
/// node holding a merchant and one forwarding to it answer, and a node is taken out while it is down.
pub struct Target {
    bases: Vec<String>,
    alive: RefCell<Vec<bool>>,
    turn: Cell<usize>,
    client: RefCell<awc::Client>,
    open: Cell<bool>,
    stop: Cell<bool>,
    /// Requests sent and not yet answered (or failed).
    busy: Rc<Cell<usize>>,
}

fn new_client() -> awc::Client {
    awc::Client::builder().timeout(Duration::from_secs(10)).disable_redirects().finish()
}

impl Target {
    pub fn new(port: u16) -> Target {
        Target::nodes(&[port])
    }

    /// The nodes of a cluster, on these ports.
    pub fn nodes(ports: &[u16]) -> Target {
        Target {
            bases: ports.iter().map(|port| format!("http://127.0.0.1:{port}")).collect(),
            alive: RefCell::new(vec![true; ports.len()]),
            turn: Cell::new(0),
            client: RefCell::new(new_client()),
            open: Cell::new(false),
            stop: Cell::new(false),
            busy: Rc::new(Cell::new(0)),
        }
    }

    /// Waits until no request is in flight: with a cluster a node that was not killed answers what it was
    /// sent, so the checks wait for those answers before comparing what was acknowledged with what is stored.
    pub async fn quiesce(&self) {
        let started = Instant::now();
        while self.busy.get() > 0 {
            assert!(started.elapsed() < START_DEADLINE, "{} requests still in flight", self.busy.get());
            sleep_ms(10).await;
        }
    }

    /// More than one node: an answer `503` may then come from a node that forwarded the request to one that
    /// died with it, so it says nothing about whether the change happened (a lost answer, not a refusal).
    pub fn is_cluster(&self) -> bool {
        self.bases.len() > 1
    }

    /// Node `node` is down (killed) or up again.
    pub fn set_alive(&self, node: usize, alive: bool) {
        if let Some(slot) = self.alive.borrow_mut().get_mut(node) {
            *slot = alive;
        }
    }

    /// The next live node's base URL.
    fn base(&self) -> String {
        let alive = self.alive.borrow();
        for step in 0..self.bases.len() {
            let at = (self.turn.get() + step) % self.bases.len();
            if alive[at] {
                self.turn.set(at + 1);
                return self.bases[at].clone();
            }
        }
        self.bases[0].clone()
    }

    /// Lets the load run against a (new) server.
    pub fn open(&self) {
        *self.client.borrow_mut() = new_client();
        self.open.set(true);
    }

    pub fn close(&self) {
        self.open.set(false);
    }

    /// Asks the load to finish: each worker ends after its current operation.
    pub fn stop(&self) {
        self.stop.set(true);
    }

    pub fn stopping(&self) -> bool {
        self.stop.get()
    }

    /// Waits until the target is open; true if it was closed.
    pub async fn wait_open(&self) -> bool {
        let closed = !self.open.get();
        while !self.open.get() {
            sleep_ms(10).await;
        }
        closed
    }

    /// One request; `Err` when no complete answer came back (refused connection, reset, time-out).
    pub async fn send(
        &self,
        key: &str,
        method: &str,
        path: &str,
        body: Option<&Value>,
        idempotency_key: Option<&str>,
    ) -> Result<Answer, String> {
        let client = self.client.borrow().clone();
        let url = format!("{}{path}", self.base());
        // Counted until this function returns, whichever way.
        struct Busy(Rc<Cell<usize>>);
        impl Drop for Busy {
            fn drop(&mut self) {
                self.0.set(self.0.get() - 1);
            }
        }
        self.busy.set(self.busy.get() + 1);
        let _busy = Busy(self.busy.clone());
        let mut request = match method {
            "POST" => client.post(&url),
            _ => client.get(&url),
        }
        .insert_header(("Authorization", format!("Bearer {key}")));
        if let Some(idempotency_key) = idempotency_key {
            request = request.insert_header(("Idempotency-Key", idempotency_key));
        }
        let mut response = match body {
            Some(body) => request.send_json(body).await,
            None => request.send().await,
        }
        .map_err(|e| format!("{method} {path}: {e}"))?;
        let bytes = response.body().limit(1 << 22).await.map_err(|e| format!("{method} {path}: body: {e}"))?;
        let replayed = response.headers().get("Idempotent-Replayed").is_some_and(|v| v.as_bytes() == b"true");
        let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Ok(Answer { status: response.status().as_u16(), json, replayed })
    }

    /// A read for the checks (the gate is closed then): retried on transport errors, expected to answer 200.
    pub async fn get(&self, key: &str, path: &str) -> Answer {
        let started = Instant::now();
        loop {
            match self.send(key, "GET", path, None, None).await {
                Ok(answer) if answer.status == 429 => {}
                // In a cluster, a merchant's shard may be moving between two nodes for a few seconds.
                Ok(answer) if answer.status == 503 && self.is_cluster() => {
                    assert!(started.elapsed() < START_DEADLINE, "{path} still unavailable: {}", answer.json)
                }
                Ok(answer) => return answer,
                Err(e) => assert!(started.elapsed() < START_DEADLINE, "{e}"),
            }
            sleep_ms(20).await;
        }
    }
}

/// Runs a `caisse` command to its end on `data_dir` and answers its exit status and standard error.
pub fn run_to_end(work_dir: &Path, data_dir: &Path, args: &[&str]) -> (std::process::ExitStatus, String) {
    let output = caisse(work_dir, data_dir).args(args).output().expect("caisse runs");
    (output.status, String::from_utf8_lossy(&output.stderr).into_owned())
}
