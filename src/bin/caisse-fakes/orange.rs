//! The Orange Money Web Payment fake: the OAuth2 client-credentials token, `webpayment`, the hosted page a
//! customer pays on, `transactionstatus`, and the unsigned notification (developer.orange.com, Orange Money
//! WebPay Dev).
//!
//! A payment is paid or refused on its page (`GET /payment/pay_token/{token}`, whose buttons post
//! `outcome=pay|decline` to the same path): the notification `{status, notif_token, txnid}` is POSTed to
//! `notif_url` per the `callbacks` knob (`forged` sends another `notif_token`), and the browser goes to
//! `return_url` or `cancel_url`. A payment left alone is `EXPIRED` after the `session_ttl_s` knob; tokens expire
//! after `token_ttl_s` (as a string `expires_in`, as Orange's current version writes it).

use std::collections::BTreeMap;

use actix_web::http::Method;
use rand::Rng;
use serde_json::{json, Value};

use crate::callbacks::{self, Outgoing, Variant};
use crate::server::{Call, Fake, Reply};

const KEPT_MAX: usize = 10_000;
/// Orange's limits on the fields of a webpayment (integrator documentation).
const ORDER_ID_MAX: usize = 30;
const URL_MAX: usize = 120;

pub struct Config {
    pub client_id: String,
    pub client_secret: String,
    pub merchant_key: String,
    /// The country path this fake answers (`dev`: the sandbox, where the currency is `OUV`).
    pub country: String,
}

#[derive(Default)]
pub struct Book {
    tokens: BTreeMap<String, u64>,
    /// By `pay_token`.
    payments: BTreeMap<String, Value>,
}

fn random(len: usize) -> String {
    let mut rng = rand::thread_rng();
    (0..len).map(|_| char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[rng.gen_range(0..36)])).collect()
}

fn refuse(status: u16, message: &str) -> Reply {
    Reply::json(status, json!({"status": status, "message": message}))
}

pub fn handle(fake: &Fake, config: &Config, call: &Call<'_>) -> Reply {
    if let Some(token) = call.path.strip_prefix("/payment/pay_token/") {
        return customer(fake, config, call, token);
    }
    if matches!(call.path, "/oauth/v3/token" | "/oauth/v2/token") && *call.method == Method::POST {
        return token(fake, config, call);
    }
    let prefix = format!("/orange-money-webpay/{}/v1/", config.country);
    let Some(operation) = call.path.strip_prefix(&prefix) else {
        return refuse(404, "not found (wrong country path?)");
    };
    let bearer = call.header("authorization").and_then(|a| a.strip_prefix("Bearer ")).unwrap_or_default().to_owned();
    let now = fake.clock.now_ms();
    let mut state = fake.lock();
    match state.orange.tokens.get(&bearer) {
        Some(until) if now < *until => {}
        _ => return refuse(401, "invalid or expired access token"),
    }
    let body: Value = serde_json::from_slice(call.body).unwrap_or(Value::Null);
    match (call.method.clone(), operation) {
        (Method::POST, "webpayment") => {
            if body["merchant_key"].as_str() != Some(config.merchant_key.as_str()) {
                return refuse(401, "invalid merchant_key");
            }
            let dev = config.country == "dev";
            let currency_ok = match body["currency"].as_str() {
                Some("OUV") => dev,
                Some(c) => !dev && c.len() == 3,
                None => false,
            };
            let urls_ok = ["return_url", "cancel_url", "notif_url"]
                .iter()
                .all(|f| body[*f].as_str().is_some_and(|u| crate::common::is_http_url(u) && u.len() <= URL_MAX));
            let order = body["order_id"].as_str().unwrap_or_default().to_owned();
            if !currency_ok
                || body["amount"].as_i64().is_none_or(|a| a <= 0)
                || !urls_ok
                || order.is_empty()
                || order.len() > ORDER_ID_MAX
            {
                return refuse(400, "invalid request: currency, integer amount, order_id (≤30) and URLs (≤120)");
            }
            if state.orange.payments.values().any(|p| p["order_id"] == order.as_str()) {
                return refuse(403, "order_id already used");
            }
            if state.orange.payments.len() >= KEPT_MAX {
                let oldest =
                    state.orange.payments.iter().min_by_key(|(_, p)| p["created_ms"].as_u64()).map(|(k, _)| k.clone());
                if let Some(oldest) = oldest {
                    state.orange.payments.remove(&oldest);
                }
            }
            let pay_token = random(32);
            let notif_token = random(32);
            let host = call.header("host").unwrap_or("127.0.0.1");
            let payment_url = format!("http://{host}/payment/pay_token/{pay_token}");
            let mut payment = body.clone();
            payment["status"] = json!("INITIATED");
            payment["pay_token"] = json!(pay_token);
            payment["notif_token"] = json!(notif_token);
            payment["created_ms"] = json!(now);
            payment["expires_ms"] = json!(now + state.knobs.session_ttl_s * 1000);
            state.orange.payments.insert(pay_token.clone(), payment);
            Reply::json(
                201,
                json!({"status": 201, "message": "OK", "pay_token": pay_token, "payment_url": payment_url,
                "notif_token": notif_token}),
            )
            .created()
        }
        (Method::POST, "transactionstatus") => {
            let found = body["pay_token"].as_str().and_then(|t| state.orange.payments.get(t));
            match found {
                Some(p) if p["order_id"] == body["order_id"] && p["amount"] == body["amount"] => {
                    Reply::json(201, json!({"status": p["status"], "order_id": p["order_id"], "txnid": p["txnid"]}))
                }
                _ => refuse(400, "order_id, amount and pay_token do not match a payment"),
            }
        }
        _ => refuse(404, "not found"),
    }
}

fn token(fake: &Fake, config: &Config, call: &Call<'_>) -> Reply {
    use base64::Engine as _;
    let expected =
        base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", config.client_id, config.client_secret));
    let basic = call.header("authorization").and_then(|a| a.strip_prefix("Basic ")).unwrap_or_default();
    let form: Vec<(String, String)> = serde_urlencoded::from_bytes(call.body).unwrap_or_default();
    if basic != expected || !form.iter().any(|(k, v)| k == "grant_type" && v == "client_credentials") {
        return Reply::json(401, json!({"error": "invalid_client"}));
    }
    let mut state = fake.lock();
    let ttl_s = state.knobs.token_ttl_s;
    let now = fake.clock.now_ms();
    state.orange.tokens.retain(|_, until| *until > now);
    let token = random(40);
    state.orange.tokens.insert(token.clone(), now + ttl_s * 1000);
    Reply::json(200, json!({"token_type": "Bearer", "access_token": token, "expires_in": ttl_s.to_string()}))
}

/// The hosted page (`GET`) and the customer's choice (`POST`, form `outcome=pay|decline`).
fn customer(fake: &Fake, _config: &Config, call: &Call<'_>, pay_token: &str) -> Reply {
    let mut state = fake.lock();
    let knobs = state.knobs.clone();
    let Some(payment) = state.orange.payments.get_mut(pay_token) else { return refuse(404, "unknown pay_token") };
    if *call.method == Method::GET {
        let mut reply = Reply::empty(200);
        reply.html = Some(format!(
            "<!doctype html><html lang=\"fr\"><head><meta charset=\"utf-8\"><title>Orange Money (fake)</title></head><body>\
             <h1>Payer {} {}</h1><p>Statut : {}</p>\
             <form method=\"post\"><input type=\"hidden\" name=\"outcome\" value=\"pay\"><button id=\"pay\">Payer</button></form>\
             <form method=\"post\"><input type=\"hidden\" name=\"outcome\" value=\"decline\"><button id=\"decline\">Refuser</button></form>\
             </body></html>",
            payment["amount"], payment["currency"].as_str().unwrap_or_default(), payment["status"].as_str().unwrap_or_default()
        ));
        return reply;
    }
    if payment["status"] != "INITIATED" {
        return refuse(409, "this payment is not waiting any more");
    }
    let form: Vec<(String, String)> = serde_urlencoded::from_bytes(call.body).unwrap_or_default();
    let pay = form.iter().any(|(k, v)| k == "outcome" && v == "pay");
    payment["status"] = json!(if pay { "SUCCESS" } else { "FAILED" });
    if pay {
        payment["txnid"] = json!(format!("MP{}.{}", random(6).to_uppercase(), random(8).to_uppercase()));
    }
    let back = payment[if pay { "return_url" } else { "cancel_url" }].as_str().unwrap_or("/").to_owned();
    let url = payment["notif_url"].as_str().unwrap_or_default().to_owned();
    let (status, notif_token, txnid) =
        (payment["status"].clone(), payment["notif_token"].clone(), payment["txnid"].clone());
    drop(state);
    let make = |variant: Variant| {
        let token = if variant == Variant::Forged { json!("forged-notif-token") } else { notif_token.clone() };
        let body = json!({"status": status, "notif_token": token, "txnid": txnid}).to_string().into_bytes();
        Some(Outgoing { url: url.clone(), method: awc::http::Method::POST, body, headers: Vec::new(), delay_ms: 0 })
    };
    fake.callbacks.send_all(callbacks::plan(knobs.callbacks, make));
    let mut reply = Reply::empty(303);
    reply.headers.push(("Location", back));
    reply
}

/// Payments left waiting past their time expire.
pub fn tick(fake: &Fake) {
    let now = fake.clock.now_ms();
    for payment in fake.lock().orange.payments.values_mut() {
        if payment["status"] == "INITIATED" && payment["expires_ms"].as_u64().is_some_and(|end| now >= end) {
            payment["status"] = json!("EXPIRED");
        }
    }
}
