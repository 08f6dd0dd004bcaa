//! The test harness: one real server per test (fresh data directory, random loopback port, short sandbox
//! delays), an HTTP client speaking to it over the wire, and small helpers that keep the tests readable.
//!
//! Every answer read through [`TestApp::send`] is checked for a `Request-Id` header, so every test of the
//! suite also checks that rule of docs/api.md § Errors.

use std::time::{Duration, Instant};

use actix_web::http::header::HeaderMap;
use actix_web::http::Method;
use actix_web::web;
use caisse::app::Application;
use caisse::config::Settings;
use caisse::http::AppState;
use caisse::merchants::{self, NewMerchant};
use serde_json::{json, Value};

/// How long a test waits for a sandbox outcome before failing.
pub const DEADLINE: Duration = Duration::from_secs(10);
/// Sandbox provider delay used by the tests (ms).
pub const SANDBOX_DELAY_MS: u64 = 100;
/// Payment TTL used by the tests (ms).
pub const PAYMENT_TTL_MS: u64 = 1_500;

pub struct TestApp {
    /// `http://127.0.0.1:PORT`
    pub address: String,
    pub port: u16,
    /// The demo merchant's secret key.
    pub key: String,
    pub state: web::Data<AppState>,
    pub client: awc::Client,
    server: actix_web::rt::task::JoinHandle<std::io::Result<()>>,
    _dir: tempfile::TempDir,
}

impl Drop for TestApp {
    /// Dropping the server task drops the server: listeners closed, workers stopped.
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// An answer, read whole.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: web::Bytes,
    /// The body as JSON (`Value::Null` when it is not JSON).
    pub json: Value,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Asserts a status, showing the body when it differs.
    #[track_caller]
    pub fn expect(&self, status: u16) -> &Resp {
        assert_eq!(self.status, status, "unexpected status; body: {}", String::from_utf8_lossy(&self.body));
        self
    }
}

/// A request to send.
pub struct Req {
    pub method: Method,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Option<Vec<u8>>,
    pub auth: Option<String>,
}

impl Req {
    pub fn header(mut self, name: &str, value: &str) -> Req {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    pub fn auth(mut self, key: &str) -> Req {
        self.auth = Some(key.to_owned());
        self
    }

    pub fn no_auth(mut self) -> Req {
        self.auth = None;
        self
    }

    pub fn idem(self, key: &str) -> Req {
        self.header("Idempotency-Key", key)
    }

    pub fn raw(mut self, content_type: Option<&str>, body: impl Into<Vec<u8>>) -> Req {
        if let Some(ct) = content_type {
            self.headers.push(("Content-Type".into(), ct.into()));
        }
        self.body = Some(body.into());
        self
    }

    pub fn json(self, value: &Value) -> Req {
        self.raw(Some("application/json"), serde_json::to_vec(value).expect("serializable"))
    }
}

/// Settings for a test server: fast sandbox, few threads.
pub fn test_settings(dir: &std::path::Path) -> Settings {
    let mut settings = Settings::for_tests(dir).expect("test settings");
    settings.sandbox_delay_ms = SANDBOX_DELAY_MS;
    settings.payment_ttl_ms = PAYMENT_TTL_MS;
    settings.http_workers = 2;
    settings
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

/// Starts a server with the test settings changed by `tweak`.
pub async fn spawn_app_with(tweak: impl FnOnce(&mut Settings)) -> TestApp {
    let dir = tempfile::TempDir::new().expect("temp dir");
    let mut settings = test_settings(dir.path());
    tweak(&mut settings);
    let app = Application::build(settings).await.expect("application starts");
    let port = app.port();
    let state = app.state();
    let key = app.demo.as_ref().expect("a fresh store gets a demo merchant").merchant.secret_key.clone();
    let server = actix_web::rt::spawn(app.run_until_stopped());
    let client = awc::Client::builder().timeout(Duration::from_secs(10)).finish();
    TestApp { address: format!("http://127.0.0.1:{port}"), port, key, state, client, server, _dir: dir }
}

impl TestApp {
    pub fn req(&self, method: Method, path: &str) -> Req {
        Req { method, path: path.to_owned(), headers: Vec::new(), body: None, auth: Some(self.key.clone()) }
    }

    pub fn get(&self, path: &str) -> Req {
        self.req(Method::GET, path)
    }

    pub fn post(&self, path: &str) -> Req {
        self.req(Method::POST, path)
    }

    /// Sends a request and reads the whole answer; asserts the `Request-Id` header every answer carries.
    pub async fn send(&self, req: Req) -> Resp {
        let url = format!("{}{}", self.address, req.path);
        let mut builder = self.client.request(req.method.clone(), &url);
        if let Some(key) = &req.auth {
            builder = builder.insert_header(("Authorization", format!("Bearer {key}")));
        }
        for (name, value) in &req.headers {
            builder = builder.append_header((name.as_str(), value.as_str()));
        }
        let mut response = match req.body {
            Some(body) => builder.send_body(body).await,
            None => builder.send().await,
        }
        .unwrap_or_else(|e| panic!("{} {}: {e}", req.method, req.path));
        let body = response.body().limit(16 * 1024 * 1024).await.expect("answer body");
        let resp = Resp {
            status: response.status().as_u16(),
            headers: response.headers().clone(),
            json: serde_json::from_slice(&body).unwrap_or(Value::Null),
            body,
        };
        let request_id = resp.header("request-id").unwrap_or_else(|| {
            panic!("{} {} answered {} without a Request-Id header", req.method, req.path, resp.status)
        });
        assert!(request_id.starts_with("req_") && request_id.len() > 4, "Request-Id `{request_id}`");
        resp
    }

    /// GET with the demo key, expecting 200; returns the JSON.
    pub async fn get_ok(&self, path: &str) -> Value {
        self.get_ok_as(&self.key.clone(), path).await
    }

    pub async fn get_ok_as(&self, key: &str, path: &str) -> Value {
        let resp = self.send(self.get(path).auth(key)).await;
        resp.expect(200);
        resp.json
    }

    /// Initiates a payment with the demo key; expects 201.
    pub async fn initiate(&self, body: &Value) -> Value {
        self.initiate_as(&self.key, body).await
    }

    pub async fn initiate_as(&self, key: &str, body: &Value) -> Value {
        let resp = self.send(self.post("/v1/paiement/initier").auth(key).json(body)).await;
        resp.expect(201);
        resp.json
    }

    /// A payment of `montant` XOF through mtn_momo from a phone with the given last two digits.
    pub async fn pay(&self, montant: i64, ending: &str) -> Value {
        self.initiate(&payment_body(montant, ending)).await
    }

    /// Polls `GET path` until `done` holds on its JSON, for at most [`DEADLINE`].
    pub async fn poll(&self, key: &str, path: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let started = Instant::now();
        loop {
            let resp = self.send(self.get(path).auth(key)).await;
            resp.expect(200);
            if done(&resp.json) {
                return resp.json;
            }
            assert!(started.elapsed() < DEADLINE, "{path}: still not {what} after {DEADLINE:?}: {}", resp.json);
            actix_web::rt::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Waits until the payment has the given status.
    pub async fn wait_payment(&self, reference: &str, statut: &str) -> Value {
        self.wait_payment_as(&self.key, reference, statut).await
    }

    pub async fn wait_payment_as(&self, key: &str, reference: &str, statut: &str) -> Value {
        self.poll(key, &format!("/v1/paiement/{reference}"), statut, |p| p["statut"] == statut).await
    }

    /// Waits until the payment's refund has the given status.
    pub async fn wait_refund(&self, reference: &str, statut: &str) -> Value {
        self.poll(&self.key, &format!("/v1/paiement/{reference}"), statut, |p| p["remboursement"]["statut"] == statut)
            .await
    }

    pub async fn wait_payout(&self, id: &str, statut: &str) -> Value {
        self.wait_payout_as(&self.key, id, statut).await
    }

    pub async fn wait_payout_as(&self, key: &str, id: &str, statut: &str) -> Value {
        self.poll(key, &format!("/v1/retraits/{id}"), statut, |o| o["statut"] == statut).await
    }

    /// A successful XOF payment of `montant` (mtn_momo, 1.5 % fee); returns it once `succes`.
    pub async fn fund(&self, montant: i64) -> Value {
        self.fund_as(&self.key, montant).await
    }

    pub async fn fund_as(&self, key: &str, montant: i64) -> Value {
        let payment = self.initiate_as(key, &payment_body(montant, "99")).await;
        self.wait_payment_as(key, payment["reference"].as_str().expect("reference"), "succes").await
    }

    /// The balance row of `devise`: (disponible, en_attente, total); zeros when the row is absent.
    pub async fn balance(&self, devise: &str) -> (i64, i64, i64) {
        self.balance_as(&self.key, devise).await
    }

    pub async fn balance_as(&self, key: &str, devise: &str) -> (i64, i64, i64) {
        let resp = self.send(self.get("/v1/soldes").auth(key)).await;
        resp.expect(200);
        let rows = resp.json["data"].as_array().expect("data is a list").clone();
        match rows.iter().find(|r| r["devise"] == devise) {
            Some(r) => {
                let (d, e, t) = (int(&r["disponible"]), int(&r["en_attente"]), int(&r["total"]));
                assert_eq!(t, d + e, "total = disponible + en_attente: {r}");
                assert!(d >= 0 && e >= 0, "balances are never negative: {r}");
                (d, e, t)
            }
            None => (0, 0, 0),
        }
    }

    /// Creates a second merchant in this server's store and returns its secret key.
    pub async fn new_merchant(&self, name: &str) -> String {
        let new = NewMerchant {
            name: name.to_owned(),
            email: format!("{}@example.com", name.to_lowercase().replace(' ', "-")),
            password: Some("correct horse battery".into()),
            webhook_url: None,
        };
        merchants::create(&self.state.engine, self.state.settings.environment, new)
            .await
            .expect("merchant created")
            .merchant
            .secret_key
    }

    /// Every item of a list, following `next_cursor` pages of `limit`.
    pub async fn list_all(&self, path: &str, limit: usize) -> Vec<Value> {
        let sep = if path.contains('?') { '&' } else { '?' };
        let mut items = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..1000 {
            let url = match &cursor {
                Some(c) => format!("{path}{sep}limit={limit}&starting_after={c}"),
                None => format!("{path}{sep}limit={limit}"),
            };
            let page = self.get_ok(&url).await;
            assert_list_shape(&page);
            items.extend(page["data"].as_array().expect("data").iter().cloned());
            if page["has_more"] == false {
                return items;
            }
            cursor = Some(page["next_cursor"].as_str().expect("cursor").to_owned());
        }
        panic!("{path}: the pages never end");
    }
}

/// A valid payment body: XOF through mtn_momo, phone `+229970000XX`.
pub fn payment_body(montant: i64, ending: &str) -> Value {
    json!({
        "montant": montant,
        "devise": "XOF",
        "fournisseur": "mtn_momo",
        "client_telephone": format!("+229970000{ending}"),
    })
}

/// A valid payout body: XOF through mtn_momo to `+229960000XX`.
pub fn payout_body(montant: i64, ending: &str) -> Value {
    json!({
        "montant": montant,
        "devise": "XOF",
        "fournisseur": "mtn_momo",
        "beneficiaire_telephone": format!("+229960000{ending}"),
    })
}

#[track_caller]
pub fn int(v: &Value) -> i64 {
    v.as_i64().unwrap_or_else(|| panic!("not an integer: {v}"))
}

#[track_caller]
pub fn text(v: &Value) -> &str {
    v.as_str().unwrap_or_else(|| panic!("not a string: {v}"))
}

/// Asserts the API's error answer: status, code, `field` (or its absence), and a body that is exactly
/// `{"error": {"code", "message"[, "field"]}}`.
#[track_caller]
pub fn assert_error(resp: &Resp, status: u16, code: &str, field: Option<&str>) {
    let shown = String::from_utf8_lossy(&resp.body);
    assert_eq!(resp.status, status, "status; body: {shown}");
    let ct = resp.header("content-type").unwrap_or("");
    assert!(ct.starts_with("application/json"), "errors are JSON, got content-type `{ct}`");
    let top = resp.json.as_object().unwrap_or_else(|| panic!("error body is not a JSON object: {shown}"));
    assert_eq!(top.keys().collect::<Vec<_>>(), vec!["error"], "only `error` at the top: {shown}");
    let error = top["error"].as_object().unwrap_or_else(|| panic!("`error` is not an object: {shown}"));
    let mut keys: Vec<&str> = error.keys().map(String::as_str).collect();
    keys.sort_unstable();
    let expected: Vec<&str> = if field.is_some() { vec!["code", "field", "message"] } else { vec!["code", "message"] };
    assert_eq!(keys, expected, "error keys: {shown}");
    assert_eq!(error["code"], code, "code: {shown}");
    let message = error["message"].as_str().unwrap_or_else(|| panic!("message is not a string: {shown}"));
    assert!(!message.is_empty(), "empty message: {shown}");
    if let Some(f) = field {
        assert_eq!(error["field"], f, "field: {shown}");
    }
}

/// Asserts `{"data": [...], "has_more", "next_cursor"}` with `next_cursor` null exactly when `has_more` is false.
#[track_caller]
pub fn assert_list_shape(page: &Value) {
    let obj = page.as_object().unwrap_or_else(|| panic!("list is not an object: {page}"));
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["data", "has_more", "next_cursor"], "{page}");
    assert!(page["data"].is_array(), "{page}");
    let has_more = page["has_more"].as_bool().unwrap_or_else(|| panic!("has_more not a bool: {page}"));
    assert_eq!(page["next_cursor"].is_null(), !has_more, "next_cursor null exactly when has_more is false: {page}");
    if has_more {
        assert!(page["next_cursor"].is_string(), "{page}");
    }
}

/// The `data` of a list answer, checked for shape.
#[track_caller]
pub fn data(page: &Value) -> Vec<Value> {
    assert_list_shape(page);
    page["data"].as_array().expect("data").clone()
}

/// The values of `field` in a list's items.
pub fn field_values(items: &[Value], field: &str) -> Vec<String> {
    items.iter().map(|i| i[field].as_str().map(str::to_owned).unwrap_or_else(|| i[field].to_string())).collect()
}
