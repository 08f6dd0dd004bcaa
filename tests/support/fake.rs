//! A provider fake (`caisse-fakes`, see docs/fakes.md) run as a child process for one test: started on a free
//! loopback port, driven through its control API (`/__fake/*`), killed when dropped. Its provider API is
//! called with an [`Api`] from [`Fake::api`], whose answers are read with [`Api::fetch`] (a fake's answers
//! carry no `Request-Id`).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};

use super::api::{Api, Resp};

const BIN: &str = env!("CARGO_BIN_EXE_caisse-fakes");
/// How long the fake may take to say where it listens.
const START_DEADLINE: Duration = Duration::from_secs(20);

/// A running fake, killed when dropped.
pub struct Fake {
    child: Child,
    /// `http://127.0.0.1:PORT`
    pub base: String,
    /// The client of the control API, which needs no credentials.
    client: Api,
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Fake {
    /// Starts `caisse-fakes <args>` and waits for its `listening on http://127.0.0.1:PORT` line. The fake's log
    /// is noise in a passing run; FAKES_LOG=1 shows it.
    pub fn start(args: &[&str]) -> Fake {
        let mut child = Command::new(BIN)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(if std::env::var_os("FAKES_LOG").is_some() { Stdio::inherit() } else { Stdio::null() })
            .spawn()
            .expect("caisse-fakes starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(START_DEADLINE).expect("the fake says where it listens");
        let base = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("first line {line:?}"));
        assert!(base.starts_with("http://127.0.0.1:"), "{base}");
        Fake { child, base: base.to_owned(), client: Api::new(base, "") }
    }

    /// A client of the fake's provider API sending `token` as `Authorization: Bearer` (a request may go
    /// without: [`Req::no_auth`](super::Req::no_auth)).
    pub fn api(&self, token: &str) -> Api {
        Api::new(&self.base, token)
    }

    /// `POST /__fake/{path}` with `body`, whatever the answer.
    pub async fn control_answer(&self, path: &str, body: Value) -> Resp {
        self.client.fetch(self.client.post(&format!("/__fake/{path}")).no_auth().json(&body)).await
    }

    /// `POST /__fake/{path}` with `body`, expecting 200; the answer's JSON.
    pub async fn control(&self, path: &str, body: Value) -> Value {
        let resp = self.control_answer(path, body).await;
        assert_eq!(resp.status, 200, "control {path}: {}", String::from_utf8_lossy(&resp.body));
        resp.json
    }

    /// `GET /__fake/{what}`, a list.
    async fn list(&self, what: &str) -> Vec<Value> {
        let resp = self.client.fetch(self.client.get(&format!("/__fake/{what}")).no_auth()).await;
        assert_eq!(resp.status, 200, "GET /__fake/{what}: {}", String::from_utf8_lossy(&resp.body));
        resp.json.as_array().unwrap_or_else(|| panic!("/__fake/{what} is a list: {}", resp.json)).clone()
    }

    /// Sets the fake's knobs (docs/fakes.md): latency, injected errors, the callback mode, ...
    pub async fn knobs(&self, knobs: Value) {
        self.control("knobs", knobs).await;
    }

    /// Every transaction the fake holds.
    pub async fn transactions(&self) -> Vec<Value> {
        self.list("transactions").await
    }

    /// Every request the fake received, in order.
    pub async fn requests(&self) -> Vec<Value> {
        self.list("requests").await
    }

    /// The requests the fake received at `path` with `method`, in order.
    pub async fn received(&self, method: &str, path: &str) -> Vec<Value> {
        self.requests().await.into_iter().filter(|r| r["method"] == method && r["path"] == path).collect()
    }

    /// Moves the fake's clock on (tokens expire, due transactions settle).
    pub async fn advance_clock(&self, seconds: u64) {
        self.control("clock/advance", json!({"seconds": seconds})).await;
    }

    /// Settles a transaction now.
    pub async fn complete(&self, id: &str, outcome: &str, reason: Option<&str>) {
        self.control(&format!("complete/{id}"), json!({"outcome": outcome, "reason": reason})).await;
    }
}
