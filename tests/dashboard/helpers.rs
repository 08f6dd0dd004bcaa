//! The dashboard tests' harness, shared with the browser tests: one real server per test (fresh data
//! directory, random loopback port, fast sandbox), an HTTP agent that keeps cookies like a browser and never
//! follows redirects (so each test sees them), a webhook receiver on loopback whose answer the test chooses,
//! and a few calls of the API with a secret key.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::TcpListener;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use caisse::app::Application;
use caisse::config::{Environment, Settings};
use caisse::http::AppState;
use caisse::merchants::{self, Created, NewMerchant};
use serde_json::{json, Value};

/// How long a test waits for something asynchronous (a sandbox outcome, a webhook) before failing.
pub const DEADLINE: Duration = Duration::from_secs(15);

pub struct TestApp {
    /// `http://127.0.0.1:PORT`
    pub address: String,
    pub state: web::Data<AppState>,
    /// The demo merchant, with its password.
    pub demo: Created,
    server: actix_web::rt::task::JoinHandle<std::io::Result<()>>,
    _dir: tempfile::TempDir,
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Starts a sandbox server with fast outcomes, its settings changed by `tweak`.
pub async fn spawn_app_with(tweak: impl FnOnce(&mut Settings)) -> TestApp {
    let dir = tempfile::TempDir::new().expect("temp dir");
    let mut settings = Settings::for_tests(dir.path()).expect("test settings");
    settings.sandbox_delay_ms = 100;
    settings.http_workers = 2;
    settings.webhook_retry_schedule_ms = vec![100];
    tweak(&mut settings);
    let app = Application::build(settings).await.expect("application starts");
    let address = format!("http://127.0.0.1:{}", app.port());
    let state = app.state();
    let demo = app.demo.clone().expect("a fresh store gets a demo merchant");
    let server = actix_web::rt::spawn(app.run_until_stopped());
    TestApp { address, state, demo, server, _dir: dir }
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

pub async fn spawn_production_app() -> TestApp {
    spawn_app_with(|s| s.environment = Environment::Production).await
}

impl TestApp {
    pub fn email(&self) -> &str {
        &self.demo.merchant.email
    }

    pub fn password(&self) -> &str {
        &self.demo.password
    }

    /// The demo merchant as stored now.
    pub fn merchant(&self) -> caisse_engine::domain::records::Merchant {
        self.state.engine.merchant(&self.demo.merchant.id).expect("store").expect("demo merchant")
    }

    pub fn agent(&self) -> Agent {
        Agent::new(&self.address)
    }

    /// An agent logged in as the demo merchant.
    pub async fn logged_in(&self) -> Agent {
        let mut agent = self.agent();
        let page = agent.login(self.email(), self.password()).await;
        assert_eq!(page.status, 303, "login: {}", page.body);
        agent
    }

    /// Another merchant of this server: (merchant, password).
    pub async fn other_merchant(&self, name: &str) -> Created {
        let new = NewMerchant {
            name: name.to_owned(),
            email: format!("{}@example.com", name.to_lowercase()),
            password: Some("another password".into()),
            webhook_url: None,
        };
        merchants::create(&self.state.engine, self.state.settings.environment, new).await.expect("merchant")
    }

    /// An API call with a secret key: (status, JSON body).
    pub async fn api(&self, key: &str, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let client = awc::Client::builder().timeout(Duration::from_secs(10)).finish();
        let url = format!("{}{}", self.address, path);
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
        let bytes = response.body().limit(1 << 20).await.expect("body");
        (response.status().as_u16(), serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    /// Initiates a payment and returns its reference.
    pub async fn pay(&self, key: &str, body: Value) -> String {
        let (status, answer) = self.api(key, "POST", "/v1/paiement/initier", Some(body)).await;
        assert_eq!(status, 201, "payment: {answer}");
        answer["reference"].as_str().expect("reference").to_owned()
    }

    /// Waits until the payment has `statut`.
    pub async fn wait_payment(&self, key: &str, reference: &str, statut: &str) {
        let path = format!("/v1/paiement/{reference}");
        eventually(&format!("{reference} {statut}"), || async {
            let (_, p) = self.api(key, "GET", &path, None).await;
            p["statut"] == statut
        })
        .await;
    }
}

/// An XOF payment through mtn_momo from a phone ending in `ending` (sandbox outcome by the last two digits).
pub fn xof_payment(montant: i64, ending: &str) -> Value {
    json!({"montant": montant, "devise": "XOF", "fournisseur": "mtn_momo", "client_telephone": format!("+229970000{ending}")})
}

/// Polls `check` until it holds, for at most [`DEADLINE`].
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < DEADLINE, "still not {what} after {DEADLINE:?}");
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An answer of the dashboard, read whole.
#[derive(Debug)]
pub struct Page {
    pub status: u16,
    pub location: Option<String>,
    pub set_cookies: Vec<String>,
    pub content_type: String,
    pub headers: actix_web::http::header::HeaderMap,
    pub body: String,
}

impl Page {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The CSRF token of the page's forms.
    pub fn csrf(&self) -> String {
        hidden(&self.body, "csrf").unwrap_or_else(|| panic!("no csrf field in: {}", self.body))
    }

    #[track_caller]
    pub fn expect(&self, status: u16) -> &Page {
        assert_eq!(self.status, status, "unexpected status; body: {}", self.body);
        self
    }

    #[track_caller]
    pub fn expect_redirect(&self, to: &str) -> &Page {
        assert_eq!(self.status, 303, "expected a redirect to {to}; body: {}", self.body);
        assert_eq!(self.location.as_deref(), Some(to));
        self
    }

    #[track_caller]
    pub fn contains(&self, text: &str) -> &Page {
        assert!(self.body.contains(text), "`{text}` not in page:\n{}", self.body);
        self
    }
}

/// The value of the hidden field `name` in an HTML page.
pub fn hidden(html: &str, name: &str) -> Option<String> {
    let marker = format!("name=\"{name}\" value=\"");
    let start = html.find(&marker)? + marker.len();
    let end = html[start..].find('"')?;
    Some(html[start..start + end].to_owned())
}

/// An HTTP client that keeps cookies like a browser and does not follow redirects.
pub struct Agent {
    client: awc::Client,
    base: String,
    pub cookies: BTreeMap<String, String>,
}

impl Agent {
    pub fn new(base: &str) -> Agent {
        let client = awc::Client::builder().disable_redirects().timeout(Duration::from_secs(10)).finish();
        Agent { client, base: base.to_owned(), cookies: BTreeMap::new() }
    }

    pub async fn get(&mut self, path: &str) -> Page {
        let request = self.client.get(format!("{}{}", self.base, path));
        self.send(request, None).await
    }

    /// Posts a form (`application/x-www-form-urlencoded`).
    pub async fn post(&mut self, path: &str, fields: &[(&str, &str)]) -> Page {
        let request = self.client.post(format!("{}{}", self.base, path));
        let body = serde_urlencoded::to_string(fields).expect("form");
        self.send(request, Some(body)).await
    }

    async fn send(&mut self, mut request: awc::ClientRequest, form: Option<String>) -> Page {
        if !self.cookies.is_empty() {
            let header: Vec<String> = self.cookies.iter().map(|(k, v)| format!("{k}={v}")).collect();
            request = request.insert_header(("Cookie", header.join("; ")));
        }
        let mut response = match form {
            Some(body) => {
                request.insert_header(("Content-Type", "application/x-www-form-urlencoded")).send_body(body).await
            }
            None => request.send().await,
        }
        .expect("dashboard answers");
        let set_cookies: Vec<String> =
            response.headers().get_all("set-cookie").filter_map(|v| v.to_str().ok()).map(str::to_owned).collect();
        for cookie in &set_cookies {
            let pair = cookie.split(';').next().unwrap_or("");
            if let Some((name, value)) = pair.split_once('=') {
                if value.is_empty() || cookie.contains("Max-Age=0") {
                    self.cookies.remove(name);
                } else {
                    self.cookies.insert(name.to_owned(), value.to_owned());
                }
            }
        }
        let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let location = header("location");
        let content_type = header("content-type").unwrap_or_default();
        let headers = response.headers().clone();
        let body = response.body().limit(4 << 20).await.expect("page body");
        Page {
            status: response.status().as_u16(),
            location,
            set_cookies,
            content_type,
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
    }

    /// Fetches the login form and posts it.
    pub async fn login(&mut self, email: &str, password: &str) -> Page {
        let form = self.get("/login").await;
        form.expect(200);
        let token = form.csrf();
        self.post("/login", &[("csrf", &token), ("email", email), ("password", password)]).await
    }
}

/// One webhook received.
#[derive(Debug, Clone)]
pub struct Hit {
    pub body: String,
    pub signature: String,
    pub timestamp: String,
}

impl Hit {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).expect("webhook body is JSON")
    }

    /// True when the signature is the one `key` makes (docs/api.md § Webhook signature).
    pub fn signed_with(&self, key: &str) -> bool {
        let timestamp: u64 = self.timestamp.parse().expect("timestamp");
        caisse_engine::webhook::signature::sign(key, timestamp, self.body.as_bytes()) == self.signature
    }
}

/// A webhook receiver on loopback: records every request and answers with the status the test sets.
pub struct Receiver {
    pub url: String,
    hits: Arc<Mutex<Vec<Hit>>>,
    status: Arc<AtomicU16>,
    server: actix_web::rt::task::JoinHandle<std::io::Result<()>>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl Receiver {
    pub async fn start(status: u16) -> Receiver {
        let hits = Arc::new(Mutex::new(Vec::new()));
        let answer = Arc::new(AtomicU16::new(status));
        let listener = TcpListener::bind("127.0.0.1:0").expect("receiver binds");
        let port = listener.local_addr().expect("receiver address").port();
        let (h, a) = (hits.clone(), answer.clone());
        let server = HttpServer::new(move || {
            let (h, a) = (h.clone(), a.clone());
            App::new().default_service(web::to(move |req: HttpRequest, body: web::Bytes| {
                let (h, a) = (h.clone(), a.clone());
                async move {
                    let header =
                        |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
                    h.lock().expect("hits").push(Hit {
                        body: String::from_utf8_lossy(&body).into_owned(),
                        signature: header("x-service-signature"),
                        timestamp: header("x-service-timestamp"),
                    });
                    let status = actix_web::http::StatusCode::from_u16(a.load(Ordering::SeqCst))
                        .unwrap_or(actix_web::http::StatusCode::OK);
                    HttpResponse::build(status).json(json!({"received": true}))
                }
            }))
        })
        .workers(1)
        .disable_signals()
        .listen(listener)
        .expect("receiver listens")
        .run();
        let server = actix_web::rt::spawn(server);
        Receiver { url: format!("http://127.0.0.1:{port}/hooks/caisse"), hits, status: answer, server }
    }

    pub fn answer(&self, status: u16) {
        self.status.store(status, Ordering::SeqCst);
    }

    pub fn hits(&self) -> Vec<Hit> {
        self.hits.lock().expect("hits").clone()
    }

    /// Waits for a webhook about `reference` with `event`, and returns it.
    pub async fn wait_for(&self, reference: &str, event: &str) -> Hit {
        let mut found = None;
        eventually(&format!("{event} for {reference} received"), || {
            found = self.hits().into_iter().find(|h| {
                let v = h.json();
                v["event"] == event && v["data"]["reference"] == reference
            });
            let done = found.is_some();
            async move { done }
        })
        .await;
        found.expect("found")
    }
}
