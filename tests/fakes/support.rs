//! The harness of the fakes suite: spawn `caisse-fakes` and read its listening line, a tiny HTTP client over
//! awc, a callback receiver on loopback, and a bounded wait.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use serde_json::Value;

/// Every wait in the suite gives up after this.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// A running fake, killed when dropped.
pub struct Fake {
    child: Child,
    pub url: String,
}

impl Fake {
    pub fn spawn(args: &[&str]) -> Fake {
        let mut command = Command::new(env!("CARGO_BIN_EXE_caisse-fakes"));
        command.args(args).stdout(Stdio::piped());
        // The fake's log is noise in a passing run; FAKES_LOG=1 shows it.
        command.stderr(if std::env::var_os("FAKES_LOG").is_some() { Stdio::inherit() } else { Stdio::null() });
        let mut child = command.spawn().expect("caisse-fakes starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(DEADLINE).expect("a listening line within the deadline");
        let url = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("first line {line:?}"));
        assert!(url.starts_with("http://127.0.0.1:"), "{url}");
        Fake { child, url: url.to_owned() }
    }

    pub async fn control(&self, path: &str, body: Value) -> Value {
        let (status, body) = post(&format!("{}/__fake/{path}", self.url), &[], &body).await;
        assert_eq!(status, 200, "control {path}: {body}");
        body
    }

    pub async fn transactions(&self) -> Vec<Value> {
        let (_, body) = get(&format!("{}/__fake/transactions", self.url), &[]).await;
        body.as_array().cloned().unwrap_or_default()
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn client() -> awc::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    awc::Client::builder().timeout(Duration::from_secs(5)).finish()
}

/// Status, headers (lower-case names) and raw body.
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

pub async fn send(method: &str, url: &str, headers: &[(&str, &str)], body: Option<&Value>) -> Answer {
    let method = awc::http::Method::from_bytes(method.as_bytes()).expect("a method");
    let mut request = client().request(method, url);
    for (name, value) in headers {
        request = request.insert_header((*name, *value));
    }
    let sent = match body {
        Some(body) => request.insert_header(("Content-Type", "application/json")).send_body(body.to_string()).await,
        None => request.send().await,
    };
    let mut response = sent.unwrap_or_else(|e| panic!("{url}: {e}"));
    let headers =
        response.headers().iter().map(|(n, v)| (n.as_str().to_owned(), v.to_str().unwrap_or("").to_owned())).collect();
    let body = response.body().limit(1 << 20).await.expect("a body").to_vec();
    Answer { status: response.status().as_u16(), headers, body }
}

pub async fn post(url: &str, headers: &[(&str, &str)], body: &Value) -> (u16, Value) {
    let answer = send("POST", url, headers, Some(body)).await;
    (answer.status, answer.json())
}

pub async fn get(url: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let answer = send("GET", url, headers, None).await;
    (answer.status, answer.json())
}

/// One request the receiver got.
#[derive(Clone, Debug)]
pub struct Hit {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Hit {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// A callback receiver on 127.0.0.1 that answers 200 to everything and keeps what it got.
pub struct Receiver {
    pub url: String,
    hits: Arc<Mutex<Vec<Hit>>>,
}

impl Receiver {
    pub fn start() -> Receiver {
        let hits = Arc::new(Mutex::new(Vec::new()));
        let kept = hits.clone();
        let server = HttpServer::new(move || {
            let kept = kept.clone();
            App::new().default_service(web::to(move |req: HttpRequest, body: web::Bytes| {
                let kept = kept.clone();
                async move {
                    let headers = req
                        .headers()
                        .iter()
                        .map(|(n, v)| (n.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
                        .collect();
                    let hit = Hit {
                        method: req.method().to_string(),
                        path: req.path().to_owned(),
                        headers,
                        body: body.to_vec(),
                    };
                    kept.lock().unwrap().push(hit);
                    HttpResponse::Ok().finish()
                }
            }))
        })
        .workers(1)
        .bind("127.0.0.1:0")
        .expect("the receiver binds");
        let address = server.addrs()[0];
        actix_web::rt::spawn(server.run());
        Receiver { url: format!("http://{address}"), hits }
    }

    pub fn hits(&self) -> Vec<Hit> {
        self.hits.lock().unwrap().clone()
    }

    /// The hits whose body names `id` anywhere.
    pub fn hits_for(&self, id: &str) -> Vec<Hit> {
        self.hits().into_iter().filter(|h| String::from_utf8_lossy(&h.body).contains(id)).collect()
    }

    /// Waits until `count` hits name `id`.
    pub async fn wait_for(&self, id: &str, count: usize) -> Vec<Hit> {
        eventually(&format!("{count} callback(s) for {id}"), || {
            let hits = self.hits_for(id);
            async move { (hits.len() >= count).then_some(hits) }
        })
        .await
    }
}

/// Polls `check` every 20 ms until it gives a value, or panics after [`DEADLINE`].
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let started = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(started.elapsed() < DEADLINE, "gave up waiting for {what}");
        actix_web::rt::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A fresh UUIDv4.
pub fn uuid() -> String {
    let bytes: [u8; 16] = rand::random();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let variant = ['8', '9', 'a', 'b'][usize::from(bytes[0] & 3)];
    format!("{}-{}-4{}-{variant}{}-{}", &hex[..8], &hex[8..12], &hex[13..16], &hex[17..20], &hex[20..32])
}
