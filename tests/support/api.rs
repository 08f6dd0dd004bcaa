//! A client of the merchant API over real HTTP: requests built with the key they are sent with, answers read
//! whole, and the verbs the tests use most. It speaks to any server by its address: an in-process
//! [`TestApp`](super::TestApp) (which dereferences to its demo merchant's client) or a real `caisse` process.
//!
//! Every answer read through [`Api::send`] is checked for a `Request-Id` header (every API answer carries
//! one, errors included), so every test that calls the API also checks that rule. [`Api::fetch`] checks
//! nothing: it speaks to servers that are not Caisse, such as a provider fake ([`Fake`](super::Fake)).

use std::time::Duration;

use actix_web::http::header::HeaderMap;
use actix_web::http::Method;
use actix_web::web;
use serde_json::{json, Value};

use super::checks::{assert_list_shape, int};
use super::wait::{eventually, DEADLINE};

/// Answers larger than this are a bug of the test or of the server.
const BODY_LIMIT: usize = 16 * 1024 * 1024;

/// The merchant API of one server, called with one merchant's secret key.
#[derive(Clone)]
pub struct Api {
    /// `http://127.0.0.1:PORT`
    pub address: String,
    /// The secret key sent as `Authorization: Bearer` (a request may change it: [`Req::auth`]).
    pub key: String,
    pub client: awc::Client,
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

    /// Sent with this secret key instead of the client's.
    pub fn auth(mut self, key: &str) -> Req {
        self.auth = Some(key.to_owned());
        self
    }

    /// Sent without an `Authorization` header (or with the one given by [`Req::header`]).
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

/// A valid payment body: XOF through mtn_momo, phone `+229970000XX` (the sandbox's outcome is chosen by the
/// last two digits).
pub fn payment_body(amount: i64, ending: &str) -> Value {
    json!({
        "montant": amount,
        "devise": "XOF",
        "fournisseur": "mtn_momo",
        "client_telephone": format!("+229970000{ending}"),
    })
}

/// A valid payout body: XOF through mtn_momo to `+229960000XX`.
pub fn payout_body(amount: i64, ending: &str) -> Value {
    json!({
        "montant": amount,
        "devise": "XOF",
        "fournisseur": "mtn_momo",
        "beneficiaire_telephone": format!("+229960000{ending}"),
    })
}

/// The JSON of an answer that must be `201 Created`.
#[track_caller]
fn created(resp: Resp) -> Value {
    resp.expect(201);
    resp.json
}

impl Api {
    /// The API at `address` (`http://host:port`), called with `key`.
    pub fn new(address: &str, key: &str) -> Api {
        let client = awc::Client::builder().timeout(Duration::from_secs(10)).finish();
        Api { address: address.to_owned(), key: key.to_owned(), client }
    }

    /// The same server, called with another merchant's key.
    pub fn with_key(&self, key: &str) -> Api {
        Api { address: self.address.clone(), key: key.to_owned(), client: self.client.clone() }
    }

    /// The same key, sent to another server (another node of a cluster).
    pub fn with_base(&self, address: &str) -> Api {
        Api { address: address.to_owned(), key: self.key.clone(), client: self.client.clone() }
    }

    pub fn req(&self, method: Method, path: &str) -> Req {
        Req { method, path: path.to_owned(), headers: Vec::new(), body: None, auth: Some(self.key.clone()) }
    }

    pub fn get(&self, path: &str) -> Req {
        self.req(Method::GET, path)
    }

    pub fn post(&self, path: &str) -> Req {
        self.req(Method::POST, path)
    }

    /// Sends a request and reads the whole answer; asserts the `Request-Id` header.
    pub async fn send(&self, req: Req) -> Resp {
        let (method, path) = (req.method.clone(), req.path.clone());
        let resp = self.fetch(req).await;
        let request_id = resp
            .header("request-id")
            .unwrap_or_else(|| panic!("{method} {path} answered {} without a Request-Id header", resp.status));
        assert!(request_id.starts_with("req_") && request_id.len() > 4, "Request-Id `{request_id}`");
        resp
    }

    /// Sends a request and reads the whole answer, checking nothing of it: for a server that is not Caisse
    /// (a provider fake, [`Fake`](super::Fake)), whose answers carry no `Request-Id`.
    pub async fn fetch(&self, req: Req) -> Resp {
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
        let body = response.body().limit(BODY_LIMIT).await.expect("answer body");
        Resp {
            status: response.status().as_u16(),
            headers: response.headers().clone(),
            json: serde_json::from_slice(&body).unwrap_or(Value::Null),
            body,
        }
    }

    /// GET, expecting 200; returns the JSON.
    pub async fn get_ok(&self, path: &str) -> Value {
        let resp = self.send(self.get(path)).await;
        resp.expect(200);
        resp.json
    }

    /// `POST /v1/paiement/initier`.
    pub async fn post_payment(&self, body: &Value) -> Resp {
        self.send(self.post("/v1/paiement/initier").json(body)).await
    }

    /// Initiates a payment; expects 201 and returns the payment.
    pub async fn initiate(&self, body: &Value) -> Value {
        created(self.post_payment(body).await)
    }

    /// A payment of `montant` XOF through mtn_momo from a phone with the given last two digits.
    pub async fn pay(&self, amount: i64, ending: &str) -> Value {
        self.initiate(&payment_body(amount, ending)).await
    }

    /// A successful XOF payment of `montant` (mtn_momo, 1.5 % fee); returns it once `succes`.
    pub async fn fund(&self, amount: i64) -> Value {
        let payment = self.pay(amount, "99").await;
        self.wait_payment(payment["reference"].as_str().expect("reference"), "succes").await
    }

    /// `GET /v1/paiement/{reference}`, expecting 200.
    pub async fn get_payment(&self, reference: &str) -> Value {
        self.get_ok(&format!("/v1/paiement/{reference}")).await
    }

    /// `POST /v1/paiement/{reference}/rembourser`.
    pub async fn post_refund(&self, reference: &str, body: &Value) -> Resp {
        self.send(self.post(&format!("/v1/paiement/{reference}/rembourser")).json(body)).await
    }

    /// `POST /v1/retraits`.
    pub async fn post_payout(&self, body: &Value) -> Resp {
        self.send(self.post("/v1/retraits").json(body)).await
    }

    /// Requests a payout; expects 201 and returns it.
    pub async fn payout(&self, body: &Value) -> Value {
        created(self.post_payout(body).await)
    }

    /// Polls `GET path` (each answer a 200) until `done` holds on its JSON, for at most [`DEADLINE`].
    pub async fn poll(&self, path: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        eventually(&format!("{path} {what}"), DEADLINE, || async {
            let resp = self.send(self.get(path)).await;
            resp.expect(200);
            if done(&resp.json) {
                Ok(resp.json)
            } else {
                Err(resp.json.to_string())
            }
        })
        .await
    }

    /// Waits until the payment has the given status.
    pub async fn wait_payment(&self, reference: &str, status: &str) -> Value {
        self.poll(&format!("/v1/paiement/{reference}"), status, |p| p["statut"] == status).await
    }

    /// Waits until the payment's refund has the given status.
    pub async fn wait_refund(&self, reference: &str, status: &str) -> Value {
        self.poll(&format!("/v1/paiement/{reference}"), status, |p| p["remboursement"]["statut"] == status).await
    }

    pub async fn wait_payout(&self, id: &str, status: &str) -> Value {
        self.poll(&format!("/v1/retraits/{id}"), status, |o| o["statut"] == status).await
    }

    /// The balance row of `devise`: (disponible, en_attente, total); zeros when the row is absent.
    pub async fn balance(&self, currency: &str) -> (i64, i64, i64) {
        let page = self.get_ok("/v1/soldes").await;
        let rows = page["data"].as_array().expect("data is a list").clone();
        match rows.iter().find(|r| r["devise"] == currency) {
            Some(r) => {
                let (d, e, t) = (int(&r["disponible"]), int(&r["en_attente"]), int(&r["total"]));
                assert_eq!(t, d + e, "total = disponible + en_attente: {r}");
                assert!(d >= 0 && e >= 0, "balances are never negative: {r}");
                (d, e, t)
            }
            None => (0, 0, 0),
        }
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
