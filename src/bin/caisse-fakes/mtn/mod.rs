//! The MTN MoMo Open API fake (momodeveloper.mtn.com).
//!
//! # Layout
//! - `mod.rs`: configuration, routing, the two gates every call passes (the APIM subscription key, then the
//!   bearer token), the token endpoint, the wire form of a transaction and its callbacks.
//! - `transactions.rs`: requesttopay, transfer and refund: creation, status queries, refund rules.
//! - `magic.rs`: the sandbox's magic MSISDNs.
//!
//! Each product (collection, disbursement) has its own subscription key and API users, as in production.
//! Tokens are opaque, belong to one product and expire on the fake clock (`token_ttl_s` knob, 3600 s by
//! default). Error bodies: a bad or missing subscription key is APIM's
//! `401 {"statusCode":401,"message":"Access denied due to invalid subscription key. ..."}`; a bad API
//! user/key on the token endpoint `500 {"error":"login_failed"}`; a missing, unknown, expired or other
//! product's token `401 {"error":"..."}`; business errors `{"code","message"}`.

mod magic;
mod transactions;

use std::collections::{HashMap, VecDeque};

use actix_web::http::Method;
use awc::http::Method as OutMethod;
use base64::engine::general_purpose::{STANDARD as BASE64, URL_SAFE_NO_PAD};
use base64::Engine;
use rand::RngCore;
use serde_json::{json, Value};

use crate::callbacks::{self, Outgoing, Variant};
use crate::common::{Stage, Txn};
use crate::knobs::Knobs;
use crate::server::{Call, Fake, Reply};

/// Tokens kept at once; issuing one more forgets the oldest.
const TOKENS_MAX: usize = 10_000;

/// One product's credentials.
pub struct Product {
    pub subscription_key: String,
    /// (API user, API key) pairs accepted on this product's token endpoint.
    pub users: Vec<(String, String)>,
}

pub struct Config {
    pub collection: Product,
    pub disbursement: Product,
    pub target_environment: String,
}

impl Config {
    fn product(&self, name: &str) -> Option<&Product> {
        match name {
            "collection" => Some(&self.collection),
            "disbursement" => Some(&self.disbursement),
            _ => None,
        }
    }
}

struct Token {
    product: &'static str,
    expires_ms: u64,
}

/// The tokens issued, bounded by [`TOKENS_MAX`].
#[derive(Default)]
pub struct Tokens {
    by_token: HashMap<String, Token>,
    order: VecDeque<String>,
}

impl Tokens {
    fn insert(&mut self, token: String, product: &'static str, expires_ms: u64) {
        if self.order.len() >= TOKENS_MAX {
            if let Some(oldest) = self.order.pop_front() {
                self.by_token.remove(&oldest);
            }
        }
        self.order.push_back(token.clone());
        self.by_token.insert(token, Token { product, expires_ms });
    }
}

/// `{"code","message"}`, the body of MTN's business errors.
pub fn error(code: &str, message: &str) -> Value {
    json!({"code": code, "message": message})
}

pub fn internal_error() -> Value {
    error("INTERNAL_PROCESSING_ERROR", "An internal error occurred while processing.")
}

/// APIM's rate-limit answer.
pub fn too_many_requests() -> Value {
    json!({"statusCode": 429, "message": "Rate limit is exceeded. Try again in 1 seconds."})
}

fn apim_401() -> Reply {
    let message =
        "Access denied due to invalid subscription key. Make sure to provide a valid key for an active subscription.";
    Reply::json(401, json!({"statusCode": 401, "message": message}))
}

pub fn handle(fake: &Fake, config: &Config, call: &Call) -> Reply {
    let segments: Vec<&str> = call.path.trim_start_matches('/').split('/').collect();
    let (product_name, rest) = match segments.split_first() {
        Some((&p @ ("collection" | "disbursement"), rest)) => (p, rest),
        _ => return Reply::json(404, json!({"statusCode": 404, "message": "Resource not found"})),
    };
    let Some(product) = config.product(product_name) else { return apim_401() };
    if call.header("ocp-apim-subscription-key") != Some(product.subscription_key.as_str()) {
        return apim_401();
    }
    if let (&Method::POST, ["token", ""]) = (call.method, rest) {
        return token(fake, product, product_name, call);
    }
    if let Err(reply) = bearer(fake, product_name, call) {
        return reply;
    }
    match call.header("x-target-environment") {
        None => return Reply::empty(400).because("X-Target-Environment is missing"),
        Some(env) if env != config.target_environment => {
            let message = "Access to target environment is forbidden.";
            return Reply::json(500, error("NOT_ALLOWED_TARGET_ENVIRONMENT", message));
        }
        Some(_) => {}
    }
    transactions::route(fake, config, product_name, rest, call)
}

/// `POST /{product}/token/` with `Authorization: Basic base64(apiUser:apiKey)`.
fn token(fake: &Fake, product: &Product, product_name: &str, call: &Call) -> Reply {
    let credentials = call
        .header("authorization")
        .and_then(|h| h.strip_prefix("Basic "))
        .and_then(|b| BASE64.decode(b.trim()).ok())
        .and_then(|bytes| String::from_utf8(bytes).ok());
    let known = credentials
        .as_deref()
        .and_then(|c| c.split_once(':'))
        .is_some_and(|(user, key)| product.users.iter().any(|(u, k)| u == user && k == key));
    if !known {
        return Reply::json(500, json!({"error": "login_failed"}));
    }
    let product_name: &'static str = if product_name == "collection" { "collection" } else { "disbursement" };
    let mut state = fake.lock();
    let ttl_s = state.knobs.token_ttl_s;
    let token = opaque_token(product_name);
    let expires_ms = fake.clock.now_ms().saturating_add(ttl_s.saturating_mul(1000));
    state.tokens.insert(token.clone(), product_name, expires_ms);
    Reply::json(200, json!({"access_token": token, "token_type": "access_token", "expires_in": ttl_s}))
}

/// A JWT-shaped opaque token (MTN's are JWTs; clients must not read them).
fn opaque_token(product: &str) -> String {
    let mut random = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut random);
    let header = URL_SAFE_NO_PAD.encode(br#"{"typ":"JWT","alg":"R256"}"#);
    let claims = URL_SAFE_NO_PAD.encode(format!(r#"{{"sessionId":"fake","product":"{product}"}}"#));
    format!("{header}.{claims}.{}", URL_SAFE_NO_PAD.encode(random))
}

fn bearer(fake: &Fake, product: &str, call: &Call) -> Result<(), Reply> {
    let unauthorized = |why: &str| Reply::json(401, json!({"error": why}));
    let Some(token) = call.header("authorization").and_then(|h| h.strip_prefix("Bearer ")).map(str::trim) else {
        return Err(unauthorized("Access token is missing"));
    };
    let state = fake.lock();
    match state.tokens.by_token.get(token) {
        None => Err(unauthorized("Access token is invalid")),
        Some(t) if t.product != product => Err(unauthorized("Access token is not valid for this product")),
        Some(t) if fake.clock.now_ms() >= t.expires_ms => Err(unauthorized("Access token expired")),
        Some(_) => Ok(()),
    }
}

/// The wire name of a transaction's status.
pub fn status_name(txn: &Txn) -> &'static str {
    match txn.stage {
        Stage::Succeeded => "SUCCESSFUL",
        Stage::Failed => "FAILED",
        Stage::Created | Stage::Processing | Stage::Held => "PENDING",
    }
}

/// The body of status answers and callbacks.
pub fn render(txn: &Txn, variant: Variant) -> Value {
    let (status, success, failed) = match variant {
        Variant::Final => (status_name(txn), txn.stage == Stage::Succeeded, txn.stage == Stage::Failed),
        Variant::Forged => ("SUCCESSFUL", true, false),
        Variant::Stale => ("PENDING", false, false),
    };
    let party_type = txn.request.pointer("/payer/partyIdType").or(txn.request.pointer("/payee/partyIdType"));
    let party = json!({"partyIdType": party_type.cloned().unwrap_or(json!("MSISDN")), "partyId": txn.phone});
    let party_field = if txn.kind == "requesttopay" { "payer" } else { "payee" };
    let mut body = json!({
        "amount": txn.amount,
        "currency": txn.currency,
        "externalId": txn.request.get("externalId").cloned().unwrap_or(json!("")),
        party_field: party,
        "payerMessage": txn.request.get("payerMessage").cloned().unwrap_or(json!("")),
        "payeeNote": txn.request.get("payeeNote").cloned().unwrap_or(json!("")),
        "status": status,
    });
    if success {
        let id = txn.provider_txn_id.clone().unwrap_or_else(crate::common::provider_reference);
        body["financialTransactionId"] = json!(id);
    }
    if failed {
        if let Some(reason) = &txn.reason {
            body["reason"] = json!(reason);
        }
    }
    body
}

/// Callbacks go to the request's X-Callback-Url, unsigned, with the knob's method (POST or PUT).
pub fn callbacks_for(knobs: &Knobs, txn: &Txn) -> Vec<Outgoing> {
    let Some(url) = txn.callback_url.clone() else { return vec![] };
    let method = if knobs.callback_method == "PUT" { OutMethod::PUT } else { OutMethod::POST };
    callbacks::plan(knobs.callbacks, |variant| {
        let body = render(txn, variant).to_string().into_bytes();
        Some(Outgoing { url: url.clone(), method: method.clone(), body, headers: vec![], delay_ms: 0 })
    })
}
