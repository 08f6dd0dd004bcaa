//! The harness of the webhook tests: a real Caisse server per test, real local receivers that record every
//! request (headers, raw body, arrival time) and answer per a script, and the checks every delivery must pass
//! (docs/api.md § Webhook body, Webhook signature).

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use actix_web::dev::ServerHandle;
use actix_web::http::StatusCode;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use caisse::app::Application;
use caisse::config::Settings;
use caisse::http::AppState;
use caisse::merchants::{self, NewMerchant};
use caisse_engine::domain::ids::MerchantId;
use caisse_engine::domain::records::{Merchant, Notification};
use caisse_engine::domain::time::Timestamp;
use serde_json::{json, Value};

/// How long a test waits for something that should take well under a second.
pub const DEADLINE: Duration = Duration::from_secs(15);
/// The sandbox provider's delay in these tests.
pub const SANDBOX_DELAY_MS: u64 = 100;

pub fn unix_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

pub async fn sleep_ms(ms: u64) {
    actix_web::rt::time::sleep(Duration::from_millis(ms)).await;
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

/// Waits (bounded) until `check` returns `Ok`; its `Err` says what it saw, for the failure message.
pub async fn eventually<T>(what: &str, deadline: Duration, mut check: impl FnMut() -> Result<T, String>) -> T {
    let started = Instant::now();
    loop {
        match check() {
            Ok(value) => return value,
            Err(seen) => assert!(started.elapsed() < deadline, "{what}: still not so after {deadline:?}; {seen}"),
        }
        sleep_ms(25).await;
    }
}

// ----- the service -----

/// A Caisse server started in-process as `main` starts it.
pub struct TestApp {
    pub address: String,
    pub state: web::Data<AppState>,
    pub client: awc::Client,
    _dir: tempfile::TempDir,
    server: actix_web::rt::task::JoinHandle<std::io::Result<()>>,
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Starts a server with fast sandbox settings, changed by `tweak`.
pub async fn start_app(tweak: impl FnOnce(&mut Settings)) -> TestApp {
    let dir = tempfile::TempDir::new().expect("temp dir");
    let mut settings = Settings::for_tests(dir.path()).expect("test settings");
    settings.sandbox_delay_ms = SANDBOX_DELAY_MS;
    settings.http_workers = 1;
    tweak(&mut settings);
    let app = Application::build(settings).await.expect("application starts");
    assert!(app.demo.as_ref().is_some_and(|d| d.merchant.secret_key.starts_with("sk_test_")), "a demo merchant");
    let address = format!("http://127.0.0.1:{}", app.port());
    let state = app.state();
    let server = actix_web::rt::spawn(app.run_until_stopped());
    TestApp { address, state, client: api_client(), _dir: dir, server }
}

pub fn api_client() -> awc::Client {
    awc::Client::builder().timeout(Duration::from_secs(10)).finish()
}

/// A call to Caisse's API: (status, JSON answer).
pub async fn call(
    client: &awc::Client,
    base: &str,
    key: &str,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let url = format!("{base}{path}");
    let request = match method {
        "POST" => client.post(&url),
        _ => client.get(&url),
    }
    .insert_header(("Authorization", format!("Bearer {key}")));
    let mut response = match body {
        Some(body) => request.send_json(&body).await,
        None => request.send().await,
    }
    .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    let bytes = response.body().limit(1 << 20).await.expect("answer body");
    (response.status().as_u16(), serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// Polls `GET path` until `done` holds on its JSON.
pub async fn wait_json(
    client: &awc::Client,
    base: &str,
    key: &str,
    path: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let started = Instant::now();
    loop {
        let (status, value) = call(client, base, key, "GET", path, None).await;
        assert_eq!(status, 200, "GET {path}: {value}");
        if done(&value) {
            return value;
        }
        assert!(started.elapsed() < DEADLINE, "GET {path}: still not as expected after {DEADLINE:?}: {value}");
        sleep_ms(25).await;
    }
}

/// A payment body: XOF through mtn_momo from `+229970000<ending>`.
pub fn payment(montant: i64, ending: &str) -> Value {
    let phone = format!("+229970000{ending}");
    json!({"montant": montant, "devise": "XOF", "fournisseur": "mtn_momo", "client_telephone": phone})
}

/// A payout body: XOF through mtn_momo to `+229960000<ending>`.
pub fn payout(montant: i64, ending: &str) -> Value {
    let phone = format!("+229960000{ending}");
    json!({"montant": montant, "devise": "XOF", "fournisseur": "mtn_momo", "beneficiaire_telephone": phone})
}

impl TestApp {
    /// A merchant whose webhooks go to `url`.
    pub async fn merchant(&self, name: &str, url: &str) -> Merchant {
        let new = NewMerchant {
            name: name.to_owned(),
            email: format!("{}@example.com", name.to_lowercase().replace(' ', "-")),
            password: None,
            webhook_url: Some(url.to_owned()),
        };
        merchants::create(&self.state.engine, self.state.settings.environment, new)
            .await
            .expect("merchant created")
            .merchant
    }

    pub async fn call(&self, key: &str, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        call(&self.client, &self.address, key, method, path, body).await
    }

    /// Initiates a payment; expects 201.
    pub async fn pay(&self, key: &str, body: Value) -> Value {
        let (status, value) = self.call(key, "POST", "/v1/paiement/initier", Some(body)).await;
        assert_eq!(status, 201, "payment refused: {value}");
        value
    }

    pub async fn wait_payment(&self, key: &str, reference: &str, statut: &str) -> Value {
        wait_json(&self.client, &self.address, key, &format!("/v1/paiement/{reference}"), |p| p["statut"] == statut)
            .await
    }

    /// A successful payment; returns its reference once `succes`.
    pub async fn paid(&self, key: &str, montant: i64) -> String {
        let p = self.pay(key, payment(montant, "99")).await;
        let reference = p["reference"].as_str().expect("reference").to_owned();
        self.wait_payment(key, &reference, "succes").await;
        reference
    }

    /// The merchant's notifications in the store, oldest first.
    pub fn notifications(&self, merchant: &MerchantId) -> Vec<Notification> {
        let page = self.state.engine.notifications(merchant, None, 100, &mut |_| true).expect("notifications");
        let mut all = page.data;
        all.reverse();
        all
    }

    /// Waits until the merchant has `count` notifications and `done` holds for each.
    pub async fn wait_notifications(
        &self,
        merchant: &MerchantId,
        count: usize,
        deadline: Duration,
        done: impl Fn(&Notification) -> bool,
    ) -> Vec<Notification> {
        eventually("notifications settled", deadline, || {
            let all = self.notifications(merchant);
            if all.len() == count && all.iter().all(&done) {
                Ok(all)
            } else {
                Err(format!("{} notifications: {}", all.len(), describe(&all)))
            }
        })
        .await
    }
}

/// One line per notification: event, state, attempts' statuses.
pub fn describe(all: &[Notification]) -> String {
    all.iter()
        .map(|n| {
            let attempts: Vec<String> = n
                .attempts
                .iter()
                .map(|a| a.http_status.map(|s| s.to_string()).unwrap_or_else(|| format!("{:?}", a.error)))
                .collect();
            format!("{} {} {:?} [{}]", n.event.as_str(), n.reference, n.state, attempts.join(","))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

// ----- receivers -----

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
                Reply::Hang(_) => 200,
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

    pub fn set_script(&self, script: Script) {
        *self.log.script.lock().expect("script") = script;
    }

    pub fn hits(&self) -> Vec<Hit> {
        self.log.hits.lock().expect("hits").clone()
    }

    /// Waits until `done` holds on every request received so far.
    pub async fn wait(&self, what: &str, deadline: Duration, done: impl Fn(&[Hit]) -> bool) -> Vec<Hit> {
        eventually(what, deadline, || {
            let hits = self.hits();
            if done(&hits) {
                Ok(hits)
            } else {
                Err(format!("{} requests: {:?}", hits.len(), hits.iter().map(|h| h.event()).collect::<Vec<_>>()))
            }
        })
        .await
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

// ----- TLS -----

/// A self-signed certificate for `localhost` and 127.0.0.1: the receiver's config and the certificate's PEM.
pub fn self_signed(pem_path: &Path) -> rustls::ServerConfig {
    let rcgen::CertifiedKey { cert, key_pair } =
        rcgen::generate_simple_self_signed(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).expect("certificate");
    std::fs::write(pem_path, cert.pem()).expect("PEM written");
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(key_pair.serialize_der().into());
    rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], key)
        .expect("server certificate")
}

// ----- what every delivery must be -----

/// docs/api.md § Webhook signature: a POST of JSON, signed with `key` over the raw body, with a timestamp
/// taken when it was sent (within a second or two of its arrival).
#[track_caller]
pub fn assert_signed(hit: &Hit, key: &str) {
    assert_eq!(hit.method, "POST");
    assert_eq!(hit.header("content-type"), Some("application/json"), "{:?}", hit.headers);
    let signature = hit.header("x-service-signature").expect("X-Service-Signature");
    let timestamp = hit.header("x-service-timestamp").expect("X-Service-Timestamp");
    assert!(
        signature.starts_with("sha256=")
            && signature.len() == 71
            && signature[7..].bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "`sha256=` + lowercase hex: {signature}"
    );
    assert!(timestamp.bytes().all(|b| b.is_ascii_digit()), "Unix seconds as text: {timestamp}");
    assert_eq!(caisse_engine::webhook::verify(key, signature, timestamp, &hit.body, hit.at_unix_s), Ok(()));
    assert!(hit.timestamp().abs_diff(hit.at_unix_s) <= 2, "fresh timestamp: {timestamp} vs arrival {}", hit.at_unix_s);
}

/// docs/api.md § Webhook body: exactly `event`, `created_at`, `data`; `data` exactly the eleven fields, with
/// their types. Returns `data`.
#[track_caller]
pub fn assert_shape(body: &Value, event: &str) -> Value {
    let top = body.as_object().unwrap_or_else(|| panic!("not an object: {body}"));
    assert_eq!(
        top.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        BTreeSet::from(["event", "created_at", "data"])
    );
    assert_eq!(body["event"], event);
    assert_rfc3339(&body["created_at"]);
    let data = body["data"].as_object().unwrap_or_else(|| panic!("data is not an object: {body}"));
    let fields = [
        "reference",
        "transaction_id",
        "fournisseur",
        "montant",
        "devise",
        "frais",
        "montant_net",
        "statut",
        "client_email",
        "metadata",
        "paid_at",
    ];
    assert_eq!(data.keys().map(String::as_str).collect::<BTreeSet<_>>(), BTreeSet::from(fields), "{body}");
    for field in ["reference", "transaction_id", "fournisseur", "devise", "statut"] {
        assert!(data[field].as_str().is_some_and(|s| !s.is_empty()), "{field}: {body}");
    }
    let (montant, frais, net) = (data["montant"].as_i64(), data["frais"].as_i64(), data["montant_net"].as_i64());
    let (Some(montant), Some(frais), Some(net)) = (montant, frais, net) else { panic!("amounts are integers: {body}") };
    assert!(montant > 0 && frais >= 0 && net == montant - frais, "montant_net = montant - frais: {body}");
    assert!(data["client_email"].is_null() || data["client_email"].is_string(), "{body}");
    assert!(data["metadata"].is_object(), "{body}");
    if !data["paid_at"].is_null() {
        assert_rfc3339(&data["paid_at"]);
    }
    Value::Object(data.clone())
}

#[track_caller]
fn assert_rfc3339(v: &Value) {
    let text = v.as_str().unwrap_or_else(|| panic!("not a string: {v}"));
    assert!(text.ends_with('Z') && Timestamp::parse_rfc3339(text).is_ok(), "RFC 3339 UTC: {text}");
}

// ----- child processes -----

/// A child process killed when dropped, with its stdout lines collected.
pub struct ChildProcess {
    pub child: std::process::Child,
    pub lines: Arc<Mutex<Vec<String>>>,
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ChildProcess {
    pub fn spawn(mut command: std::process::Command) -> std::io::Result<ChildProcess> {
        let mut child = command.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::piped()).spawn()?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        if let Some(stdout) = child.stdout.take() {
            let sink = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    sink.lock().expect("lines").push(line);
                }
            });
        }
        Ok(ChildProcess { child, lines })
    }

    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().expect("lines").clone()
    }

    /// Waits until something accepts connections on `port`, failing if the process exits first.
    pub async fn wait_listening(&mut self, port: u16, what: &str) {
        let address = SocketAddr::from(([127, 0, 0, 1], port));
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("{what} exited before listening: {status}");
            }
            if TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok() {
                return;
            }
            assert!(started.elapsed() < DEADLINE, "{what} is not listening on {port} after {DEADLINE:?}");
            sleep_ms(25).await;
        }
    }
}
