//! A provider fake (`caisse-fakes`, see docs/fakes.md) run as a child process for one test: started on a free
//! loopback port, driven through its control API, killed when dropped.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_caisse-fakes");
/// How long the fake may take to say where it listens.
const START_DEADLINE: Duration = Duration::from_secs(20);

pub struct Fake {
    child: Child,
    /// `http://127.0.0.1:PORT`
    pub base: String,
    client: awc::Client,
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Fake {
    /// Starts `caisse-fakes <args>` and waits for its `listening on http://...` line.
    pub fn start(args: &[&str]) -> Fake {
        let mut child = Command::new(BIN)
            .args(args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("caisse-fakes starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(START_DEADLINE).expect("the fake says where it listens");
        let base = line.trim().strip_prefix("listening on ").expect("a `listening on URL` line").to_owned();
        let client = awc::Client::builder().timeout(Duration::from_secs(10)).finish();
        Fake { child, base, client }
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}{path}", self.base);
        let request = match method {
            "GET" => self.client.get(&url),
            _ => self.client.post(&url),
        };
        let mut response = match body {
            Some(body) => request.send_json(&body).await,
            None => request.send().await,
        }
        .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
        let status = response.status();
        let bytes = response.body().limit(16 * 1024 * 1024).await.expect("the fake's answer");
        assert!(status.is_success(), "{method} {path}: {status} {}", String::from_utf8_lossy(&bytes));
        serde_json::from_slice(&bytes).unwrap_or(Value::Null)
    }

    /// Sets the fake's knobs (docs/fakes.md): latency, injected errors, the callback mode, ...
    pub async fn knobs(&self, knobs: Value) {
        self.call("POST", "/__fake/knobs", Some(knobs)).await;
    }

    /// Every transaction the fake holds.
    pub async fn transactions(&self) -> Vec<Value> {
        list(self.call("GET", "/__fake/transactions", None).await)
    }

    /// Every request the fake received, in order.
    pub async fn requests(&self) -> Vec<Value> {
        list(self.call("GET", "/__fake/requests", None).await)
    }

    /// Moves the fake's clock on (tokens expire, due transactions settle).
    pub async fn advance_clock(&self, seconds: u64) {
        self.call("POST", "/__fake/clock/advance", Some(serde_json::json!({"seconds": seconds}))).await;
    }

    /// Settles a transaction now.
    pub async fn complete(&self, id: &str, outcome: &str, reason: Option<&str>) {
        let body = serde_json::json!({"outcome": outcome, "reason": reason});
        self.call("POST", &format!("/__fake/complete/{id}"), Some(body)).await;
    }
}

/// The items of a list answer, bare or under `data`/`transactions`/`requests`.
fn list(value: Value) -> Vec<Value> {
    match value {
        Value::Array(items) => items,
        Value::Object(mut map) => {
            for key in ["data", "transactions", "requests"] {
                if let Some(Value::Array(items)) = map.remove(key) {
                    return items;
                }
            }
            Vec::new()
        }
        _ => Vec::new(),
    }
}
