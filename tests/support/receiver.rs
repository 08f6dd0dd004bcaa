//! A merchant's webhook receiver on loopback: records every request (headers, raw body, arrival time) and
//! answers per a script the test chooses and may change while it runs. Over plain HTTP, over HTTPS, or as a
//! bare TCP server that can truly not answer.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::dev::ServerHandle;
use actix_web::http::StatusCode;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use serde_json::{json, Value};

use super::wait::{eventually, unix_s, DEADLINE};

/// One request a receiver got.
#[derive(Debug, Clone)]
pub struct Hit {
    pub method: String,
    pub path: String,
    /// Names lowercased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub at: Instant,
    pub at_unix_s: u64,
    /// The status the receiver answered (200 after a hang).
    pub answered: u16,
}

impl Hit {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    pub fn event(&self) -> String {
        self.json()["event"].as_str().unwrap_or("").to_owned()
    }

    pub fn reference(&self) -> String {
        self.json()["data"]["reference"].as_str().unwrap_or("").to_owned()
    }

    pub fn timestamp(&self) -> u64 {
        self.header("x-service-timestamp").and_then(|t| t.parse().ok()).expect("a numeric X-Service-Timestamp")
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// True when `X-Service-Signature` is the one `key` makes over the timestamp and the raw body (docs/api.md §
    /// Webhook signature), and so is the Standard Webhooks `webhook-signature` over the id, the same timestamp
    /// and the body.
    pub fn signed_with(&self, key: &str) -> bool {
        let signature = caisse_engine::webhook::sign(key, self.timestamp(), &self.body);
        let standard = caisse_engine::webhook::sign_standard(key, self.webhook_id(), self.timestamp(), &self.body);
        self.header("x-service-signature") == Some(signature.as_str())
            && self.header("webhook-timestamp") == self.header("x-service-timestamp")
            && self.header("webhook-signature") == Some(standard.as_str())
    }

    /// The Standard Webhooks `webhook-id`: the notification's `evt_` id, the same on every attempt.
    pub fn webhook_id(&self) -> &str {
        self.header("webhook-id").unwrap_or("")
    }
}

/// What a receiver answers.
#[derive(Debug, Clone)]
pub enum Reply {
    /// This status; 200 comes with `{"received": true}`.
    Status(u16),
    /// 302 to this location.
    Redirect(String),
    /// Nothing for this long, then 200.
    Hang(Duration),
    /// 200 and half its body at once, the other half after this long (raw receiver only).
    SlowBody(Duration),
}

/// Decides the answer from the request and how many earlier requests carried the same body (0 for the
/// first attempt of a notification).
pub type Script = Arc<dyn Fn(&Hit, usize) -> Reply + Send + Sync>;

pub fn script(f: impl Fn(&Hit, usize) -> Reply + Send + Sync + 'static) -> Script {
    Arc::new(f)
}

pub fn always(status: u16) -> Script {
    script(move |_, _| Reply::Status(status))
}

struct Log {
    hits: Mutex<Vec<Hit>>,
    script: Mutex<Script>,
}

impl Log {
    fn record(&self, hit: Hit) -> Reply {
        let script = self.script.lock().expect("script").clone();
        let mut hits = self.hits.lock().expect("hits");
        let earlier = hits.iter().filter(|h| h.body == hit.body).count();
        let reply = script(&hit, earlier);
        hits.push(Hit {
            answered: match &reply {
                Reply::Status(status) => *status,
                Reply::Redirect(_) => 302,
                Reply::Hang(_) | Reply::SlowBody(_) => 200,
            },
            ..hit
        });
        reply
    }
}

/// A local webhook receiver on 127.0.0.1.
pub struct Receiver {
    /// `http://127.0.0.1:PORT` (or `https://localhost:PORT`), without a path.
    pub base: String,
    log: Arc<Log>,
    handle: Option<ServerHandle>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(handle) = &self.handle {
            // The stop command is sent at once; its completion does not matter here.
            drop(handle.stop(false));
        }
    }
}

async fn receive(req: HttpRequest, body: web::Bytes, log: web::Data<Log>) -> HttpResponse {
    let headers = req
        .headers()
        .iter()
        .map(|(n, v)| (n.as_str().to_ascii_lowercase(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect();
    let hit = Hit {
        method: req.method().to_string(),
        path: req.path().to_owned(),
        headers,
        body: body.to_vec(),
        at: Instant::now(),
        at_unix_s: unix_s(),
        answered: 0,
    };
    match log.record(hit) {
        Reply::Status(200) => HttpResponse::Ok().json(json!({"received": true})),
        Reply::Status(status) => HttpResponse::build(StatusCode::from_u16(status).expect("a status")).finish(),
        Reply::Redirect(location) => HttpResponse::Found().insert_header(("Location", location)).finish(),
        Reply::Hang(d) => {
            actix_web::rt::time::sleep(d).await;
            HttpResponse::Ok().json(json!({"received": true}))
        }
        Reply::SlowBody(_) => panic!("Reply::SlowBody needs Receiver::start_raw"),
    }
}

impl Receiver {
    /// An actix-web receiver over plain HTTP.
    pub fn start(script: Script) -> Receiver {
        Receiver::start_with(script, None)
    }

    /// An actix-web receiver over HTTPS with `tls`, reached as `https://localhost:PORT`.
    pub fn start_tls(script: Script, tls: rustls::ServerConfig) -> Receiver {
        Receiver::start_with(script, Some(tls))
    }

    fn start_with(script: Script, tls: Option<rustls::ServerConfig>) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("receiver binds");
        let port = listener.local_addr().expect("address").port();
        let log = Arc::new(Log { hits: Mutex::new(Vec::new()), script: Mutex::new(script) });
        let data = web::Data::from(log.clone());
        let server = HttpServer::new(move || App::new().app_data(data.clone()).default_service(web::to(receive)))
            .workers(1)
            .disable_signals()
            .shutdown_timeout(1);
        let (server, base) = match tls {
            Some(tls) => (server.listen_rustls_0_23(listener, tls), format!("https://localhost:{port}")),
            None => (server.listen(listener), format!("http://127.0.0.1:{port}")),
        };
        let server = server.expect("receiver listens").run();
        let handle = server.handle();
        actix_web::rt::spawn(server);
        Receiver { base, log, handle: Some(handle) }
    }

    /// A bare-bones receiver on a std `TcpListener`, one thread per connection, `Connection: close`: the
    /// simplest server that can truly not answer (for [`Reply::Hang`]).
    pub fn start_raw(script: Script) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("receiver binds");
        let port = listener.local_addr().expect("address").port();
        let log = Arc::new(Log { hits: Mutex::new(Vec::new()), script: Mutex::new(script) });
        let accept_log = log.clone();
        // The accept loop lives as long as the test process; it holds nothing but the listener.
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let log = accept_log.clone();
                std::thread::spawn(move || serve_raw(stream, &log));
            }
        });
        Receiver { base: format!("http://127.0.0.1:{port}"), log, handle: None }
    }

    /// The URL a merchant would set: the receiver's address and a path.
    pub fn url(&self) -> String {
        format!("{}/hooks/caisse", self.base)
    }

    pub fn set_script(&self, script: Script) {
        *self.log.script.lock().expect("script") = script;
    }

    /// From now on, answers every request with `status`.
    pub fn answer(&self, status: u16) {
        self.set_script(always(status));
    }

    pub fn hits(&self) -> Vec<Hit> {
        self.log.hits.lock().expect("hits").clone()
    }

    /// Waits until `done` holds on every request received so far.
    pub async fn wait(&self, what: &str, deadline: Duration, done: impl Fn(&[Hit]) -> bool) -> Vec<Hit> {
        eventually(what, deadline, || {
            let hits = self.hits();
            let seen = if done(&hits) {
                Ok(hits)
            } else {
                Err(format!("{} requests: {:?}", hits.len(), hits.iter().map(|h| h.event()).collect::<Vec<_>>()))
            };
            std::future::ready(seen)
        })
        .await
    }

    /// The requests whose body names `id` anywhere (a provider's callbacks about one transaction), in order.
    pub fn hits_for(&self, id: &str) -> Vec<Hit> {
        self.hits().into_iter().filter(|h| h.text().contains(id)).collect()
    }

    /// Waits until `count` requests name `id` in their body, and returns them.
    pub async fn wait_hits_for(&self, id: &str, count: usize) -> Vec<Hit> {
        let names = |h: &Hit| h.text().contains(id);
        let hits = self
            .wait(&format!("{count} request(s) naming {id}"), DEADLINE, |hits| {
                hits.iter().filter(|h| names(h)).count() >= count
            })
            .await;
        hits.into_iter().filter(names).collect()
    }

    /// Waits for a webhook about `reference` with `event`, and returns it.
    pub async fn wait_for(&self, reference: &str, event: &str) -> Hit {
        let about = |h: &Hit| h.event() == event && h.reference() == reference;
        let hits =
            self.wait(&format!("{event} for {reference} received"), DEADLINE, |hits| hits.iter().any(about)).await;
        hits.into_iter().find(about).expect("found")
    }
}

fn serve_raw(stream: TcpStream, log: &Log) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let Ok(mut writer) = stream.try_clone() else { return };
    let mut reader = BufReader::new(stream);
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
        return;
    }
    let mut parts = request_line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or("").to_owned(), parts.next().unwrap_or("").to_owned());
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
    }
    let length = headers.iter().find(|(n, _)| n == "content-length").and_then(|(_, v)| v.parse().ok()).unwrap_or(0);
    let mut body = vec![0; length];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    let hit = Hit { method, path, headers, body, at: Instant::now(), at_unix_s: unix_s(), answered: 0 };
    let (status, extra) = match log.record(hit) {
        Reply::SlowBody(d) => {
            let body = r#"{"received":true}"#;
            let (first, rest) = body.split_at(body.len() / 2);
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = writer.write_all(format!("{head}{first}").as_bytes());
            let _ = writer.flush();
            std::thread::sleep(d);
            let _ = writer.write_all(rest.as_bytes());
            let _ = writer.shutdown(std::net::Shutdown::Both);
            return;
        }
        Reply::Status(status) => (status, String::new()),
        Reply::Redirect(location) => (302, format!("Location: {location}\r\n")),
        Reply::Hang(d) => {
            std::thread::sleep(d);
            (200, String::new())
        }
    };
    let body = if status == 200 { r#"{"received":true}"# } else { "" };
    let reason = StatusCode::from_u16(status).ok().and_then(|s| s.canonical_reason()).unwrap_or("Whatever");
    let answer = format!(
        "HTTP/1.1 {status} {reason}\r\n{extra}Content-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = writer.write_all(answer.as_bytes());
    let _ = writer.shutdown(std::net::Shutdown::Both);
}
