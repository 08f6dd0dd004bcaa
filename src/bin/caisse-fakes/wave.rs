//! The Wave fake: Checkout sessions (create, get, search by `client_reference`, expire, refund of a whole
//! session), the hosted page a customer pays on, the Payout API with its `idempotency-key`, and signed
//! webhooks (docs.wave.com/checkout, /payout and /webhook).
//!
//! Sessions and payouts live in [`Book`], beside the other fakes' state. A session is paid or declined on its
//! hosted page (`GET /c/{id}`, whose buttons post to `POST /c/{id}` with `outcome=pay|decline`), which also
//! sends the customer back to `success_url` or `error_url`; it expires at `when_expires` on the fake clock
//! (`session_ttl_s` knob). A payout settles after `--settle-ms` by the last two digits of `mobile`: `01` fails
//! (`insufficient-funds`), `04` ends `reversed`, anything else succeeds.
//!
//! Webhooks go to the `webhook_url` knob as Wave sends them: `{id, type, data}`, signed as the
//! `wave_signature` knob says (`concatenated`: `v1 = HMAC(secret, t + body)` as Wave's own example;
//! `dot`: `t + "." + body`; `rotated`: a stale `v1` then the right one; `bearer`: the secret as a bearer token;
//! `stale`: a timestamp ten minutes old; `bad`: another secret), delivered per the `callbacks` knob.

use std::collections::BTreeMap;

use actix_web::http::Method;
use hmac::{Hmac, Mac};
use rand::Rng;
use serde_json::{json, Value};
use sha2::Sha256;

use crate::callbacks::{self, Outgoing, Variant};
use crate::knobs::Knobs;
use crate::server::{Call, Fake, Reply};

/// At most this many sessions and payouts are kept each; the oldest are forgotten first.
const KEPT_MAX: usize = 10_000;
/// How long a `stale` signature's timestamp lies in the past.
const STALE_S: u64 = 600;

pub struct Config {
    pub api_key: String,
    pub webhook_secret: String,
}

#[derive(Default)]
pub struct Book {
    sessions: BTreeMap<String, Value>,
    payouts: BTreeMap<String, Payout>,
    /// `idempotency-key` → (payout id, the body it came with).
    keys: BTreeMap<String, (String, Value)>,
    order: u64,
}

struct Payout {
    object: Value,
    settle_at_ms: Option<u64>,
    /// `succeeded`, `failed` or `reversed`, with the error code of a failure.
    plan: (&'static str, Option<&'static str>),
    order: u64,
}

fn error(status: u16, code: &str, message: &str) -> Reply {
    Reply::json(status, json!({"code": code, "message": message}))
}

fn id(prefix: &str) -> String {
    let n: u64 = rand::thread_rng().gen();
    format!("{prefix}{n:016x}")
}

/// A string amount in the smallest unit of a currency without decimals (XOF, XAF, GNF): digits only.
fn amount_ok(value: &Value) -> bool {
    value.as_str().is_some_and(|a| !a.is_empty() && a.len() <= 12 && a.bytes().all(|b| b.is_ascii_digit()))
}

pub fn handle(fake: &Fake, config: &Config, call: &Call<'_>) -> Reply {
    // The hosted page: the customer's browser, no API key.
    if let Some(session) = call.path.strip_prefix("/c/") {
        return customer(fake, config, call, session);
    }
    match call.header("authorization").and_then(|a| a.strip_prefix("Bearer ")) {
        None => return error(401, "missing-auth-header", "Authorization header missing"),
        Some(key) if key != config.api_key => return error(401, "no-matching-api-key", "API key not recognised"),
        Some(_) => {}
    }
    let body: Value =
        if call.body.is_empty() { Value::Null } else { serde_json::from_slice(call.body).unwrap_or(Value::Null) };
    let query = |name: &str| {
        serde_urlencoded::from_str::<Vec<(String, String)>>(call.query)
            .ok()
            .and_then(|pairs| pairs.into_iter().find(|(k, _)| k == name).map(|(_, v)| v))
    };
    let segments: Vec<&str> = call.path.trim_start_matches('/').split('/').collect();
    let mut state = fake.lock();
    let ttl_s = state.knobs.session_ttl_s;
    let book = &mut state.wave;
    match (call.method.clone(), segments.as_slice()) {
        (Method::POST, ["v1", "checkout", "sessions"]) => create_session(fake, book, call, &body, ttl_s),
        (Method::GET, ["v1", "checkout", "sessions", "search"]) => {
            let reference = query("client_reference").unwrap_or_default();
            let found: Vec<Value> =
                book.sessions.values().filter(|s| s["client_reference"] == reference.as_str()).cloned().collect();
            Reply::json(200, json!({"result": found}))
        }
        (Method::GET, ["v1", "checkout", "sessions", id]) => match book.sessions.get(*id) {
            Some(session) => Reply::json(200, session.clone()),
            None => error(404, "checkout-session-not-found", "no such session"),
        },
        (Method::POST, ["v1", "checkout", "sessions", id, "expire"]) => match book.sessions.get_mut(*id) {
            Some(session) if session["checkout_status"] == "open" => {
                session["checkout_status"] = json!("expired");
                Reply::empty(200)
            }
            Some(_) => error(409, "checkout-session-not-open", "the session is complete or expired"),
            None => error(404, "checkout-session-not-found", "no such session"),
        },
        (Method::POST, ["v1", "checkout", "sessions", id, "refund"]) => match book.sessions.get_mut(*id) {
            Some(session) if session["payment_status"] == "succeeded" => {
                session["refunded"] = json!(true);
                Reply::empty(200)
            }
            Some(_) => error(400, "checkout-refund-failed", "only a paid session can be refunded"),
            None => error(404, "checkout-session-not-found", "no such session"),
        },
        (Method::POST, ["v1", "payout"]) => create_payout(fake, book, call, &body),
        (Method::GET, ["v1", "payout", id]) => match book.payouts.get(*id) {
            Some(p) => Reply::json(200, p.object.clone()),
            None => error(404, "payout-not-found", "no such payout"),
        },
        (Method::GET, ["v1", "payouts", "search"]) => {
            let reference = query("client_reference").unwrap_or_default();
            let found: Vec<Value> = book
                .payouts
                .values()
                .filter(|p| p.object["client_reference"] == reference.as_str())
                .map(|p| p.object.clone())
                .collect();
            Reply::json(200, json!({"result": found}))
        }
        _ => error(404, "not-found", "no such endpoint"),
    }
}

fn create_session(fake: &Fake, book: &mut Book, call: &Call<'_>, body: &Value, ttl_s: u64) -> Reply {
    let url_ok = |field: &str| body[field].as_str().is_some_and(crate::common::is_http_url);
    if !amount_ok(&body["amount"])
        || body["currency"].as_str().is_none()
        || !url_ok("success_url")
        || !url_ok("error_url")
    {
        return error(
            400,
            "request-validation-error",
            "amount (a string), currency, success_url and error_url are required",
        );
    }
    if body["client_reference"].as_str().is_some_and(|r| r.len() > 255)
        || body["restrict_payer_mobile"].as_str().is_some_and(|m| !m.starts_with('+'))
    {
        return error(400, "request-validation-error", "client_reference or restrict_payer_mobile is malformed");
    }
    let id = id("cos-");
    let host = call.header("host").unwrap_or("127.0.0.1");
    let now_ms = fake.clock.now_ms();
    book.order += 1;
    let session = json!({
        "id": id,
        "amount": body["amount"],
        "currency": body["currency"],
        "business_name": "Boutique (fake)",
        "checkout_status": "open",
        "payment_status": "processing",
        "client_reference": body["client_reference"],
        "restrict_payer_mobile": body["restrict_payer_mobile"],
        "transaction_id": null,
        "aggregated_merchant_id": null,
        "success_url": body["success_url"],
        "error_url": body["error_url"],
        "wave_launch_url": format!("http://{host}/c/{id}"),
        "when_created": fake.clock.rfc3339(),
        "when_completed": null,
        "when_expires": rfc3339_in(fake, ttl_s),
        "expires_at_ms": now_ms + ttl_s * 1000,
        "last_payment_error": null,
    });
    if book.sessions.len() >= KEPT_MAX {
        let oldest = book.sessions.keys().next().cloned();
        if let Some(oldest) = oldest {
            book.sessions.remove(&oldest);
        }
    }
    book.sessions.insert(id, session.clone());
    Reply::json(200, public(&session)).created()
}

/// The fake's clock `seconds` from now, RFC 3339.
fn rfc3339_in(fake: &Fake, seconds: u64) -> String {
    let now = humantime::parse_rfc3339(&fake.clock.rfc3339()).unwrap_or(std::time::SystemTime::now());
    humantime::format_rfc3339_seconds(now + std::time::Duration::from_secs(seconds)).to_string()
}

/// A session as Wave shows it (the fake's own bookkeeping removed).
fn public(session: &Value) -> Value {
    let mut shown = session.clone();
    if let Some(object) = shown.as_object_mut() {
        object.remove("expires_at_ms");
    }
    shown
}

fn create_payout(fake: &Fake, book: &mut Book, call: &Call<'_>, body: &Value) -> Reply {
    let Some(key) = call.header("idempotency-key").filter(|k| !k.is_empty() && k.len() <= 255) else {
        return error(400, "missing-idempotency-key", "the idempotency-key header is required");
    };
    if let Some((existing, first)) = book.keys.get(key) {
        if first != body {
            return error(409, "idempotency-key-reused", "this idempotency-key came with another request");
        }
        return match book.payouts.get(existing) {
            Some(p) => Reply::json(200, p.object.clone()),
            None => error(409, "idempotency-key-reused", "this idempotency-key's payout is gone"),
        };
    }
    let mobile = body["mobile"].as_str().unwrap_or_default();
    if !amount_ok(&body["receive_amount"]) || body["currency"].as_str().is_none() || !mobile.starts_with('+') {
        return error(
            400,
            "request-validation-error",
            "currency, receive_amount (a string) and mobile (E.164) are required",
        );
    }
    let plan = match mobile.get(mobile.len().saturating_sub(2)..) {
        Some("01") => ("failed", Some("insufficient-funds")),
        Some("04") => ("reversed", None),
        _ => ("succeeded", None),
    };
    let id = id("pt-");
    book.order += 1;
    let object = json!({
        "id": id,
        "currency": body["currency"],
        "receive_amount": body["receive_amount"],
        "fee": "0",
        "mobile": mobile,
        "name": body["name"],
        "client_reference": body["client_reference"],
        "status": "processing",
        "payout_error": null,
        "timestamp": fake.clock.rfc3339(),
    });
    if book.payouts.len() >= KEPT_MAX {
        let oldest = book.payouts.iter().min_by_key(|(_, p)| p.order).map(|(id, _)| id.clone());
        if let Some(oldest) = oldest {
            book.payouts.remove(&oldest);
            book.keys.retain(|_, (payout, _)| *payout != oldest);
        }
    }
    let settle_at_ms = Some(fake.clock.now_ms() + fake.settle_ms);
    book.payouts.insert(id.clone(), Payout { object: object.clone(), settle_at_ms, plan, order: book.order });
    book.keys.insert(key.to_owned(), (id, body.clone()));
    Reply::json(200, object).created()
}

/// The hosted page (`GET`) and the customer's choice on it (`POST`, form `outcome=pay|decline[&code=…]`).
fn customer(fake: &Fake, config: &Config, call: &Call<'_>, id: &str) -> Reply {
    let mut state = fake.lock();
    let knobs = state.knobs.clone();
    let Some(session) = state.wave.sessions.get_mut(id) else {
        return error(404, "checkout-session-not-found", "no such session");
    };
    if *call.method == Method::GET {
        let page = format!(
            "<!doctype html><html lang=\"fr\"><head><meta charset=\"utf-8\"><title>Wave (fake)</title></head><body>\
             <h1>Payer {} {}</h1><p>Statut : {}</p>\
             <form method=\"post\"><input type=\"hidden\" name=\"outcome\" value=\"pay\"><button id=\"pay\">Payer</button></form>\
             <form method=\"post\"><input type=\"hidden\" name=\"outcome\" value=\"decline\"><button id=\"decline\">Refuser</button></form>\
             </body></html>",
            session["amount"].as_str().unwrap_or_default(),
            session["currency"].as_str().unwrap_or_default(),
            session["checkout_status"].as_str().unwrap_or_default(),
        );
        let mut reply = Reply::empty(200);
        reply.html = Some(page);
        return reply;
    }
    let form: Vec<(String, String)> = serde_urlencoded::from_bytes(call.body).unwrap_or_default();
    let field = |name: &str| form.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    if session["checkout_status"] != "open" {
        return error(409, "checkout-session-not-open", "this session is complete or expired");
    }
    let (event_type, back) = match field("outcome").as_deref() {
        Some("pay") => {
            session["checkout_status"] = json!("complete");
            session["payment_status"] = json!("succeeded");
            session["transaction_id"] = json!(format!("T_{}", id.trim_start_matches("cos-").to_uppercase()));
            session["when_completed"] = json!(fake.clock.rfc3339());
            session["last_payment_error"] = Value::Null;
            ("checkout.session.completed", session["success_url"].clone())
        }
        Some("decline") => {
            let code = field("code").unwrap_or_else(|| "insufficient-funds".into());
            session["payment_status"] = json!("cancelled");
            session["last_payment_error"] = json!({"code": code, "message": "payment failed (fake)"});
            ("checkout.session.payment_failed", session["error_url"].clone())
        }
        _ => return error(400, "request-validation-error", "outcome is pay or decline"),
    };
    let data = public(session);
    drop(state);
    fake.callbacks.send_all(webhooks(fake, config, &knobs, event_type, &data));
    let mut reply = Reply::empty(303);
    reply.headers.push(("Location", back.as_str().unwrap_or("/").to_owned()));
    reply
}

/// The deliveries of one event, per the `callbacks` and `wave_signature` knobs.
fn webhooks(fake: &Fake, config: &Config, knobs: &Knobs, event_type: &str, data: &Value) -> Vec<Outgoing> {
    let Some(url) = knobs.webhook_url.clone() else { return Vec::new() };
    let event = json!({"id": id("EV_"), "type": event_type, "data": data});
    let body = event.to_string().into_bytes();
    let now_s = fake.clock.now_ms() / 1000 + wall_epoch_s(fake);
    let make = |variant: Variant| {
        let mode = if variant == Variant::Forged { "bad" } else { knobs.wave_signature.as_str() };
        Some(Outgoing {
            url: url.clone(),
            method: awc::http::Method::POST,
            body: body.clone(),
            headers: sign(mode, &config.webhook_secret, now_s, &body),
            delay_ms: 0,
        })
    };
    callbacks::plan(knobs.callbacks, make)
}

/// The Unix time at which the fake's clock read zero.
fn wall_epoch_s(fake: &Fake) -> u64 {
    let now = humantime::parse_rfc3339(&fake.clock.rfc3339()).unwrap_or(std::time::SystemTime::now());
    let wall = now.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    wall.saturating_sub(fake.clock.now_ms() / 1000)
}

fn hmac_hex(secret: &str, message: &[u8]) -> String {
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret.as_bytes()) else { return String::new() };
    mac.update(message);
    hex::encode(mac.finalize().into_bytes())
}

/// The authentication headers of one delivery.
fn sign(mode: &str, secret: &str, now_s: u64, body: &[u8]) -> Vec<(String, String)> {
    let signed = |t: u64, separator: &str, key: &str| {
        let mut message = format!("{t}{separator}").into_bytes();
        message.extend_from_slice(body);
        hmac_hex(key, &message)
    };
    let header = match mode {
        "bearer" => return vec![("Authorization".into(), format!("Bearer {secret}"))],
        "dot" => format!("t={now_s},v1={}", signed(now_s, ".", secret)),
        "rotated" => format!("t={now_s},v1={},v1={}", signed(now_s, "", "an old secret"), signed(now_s, "", secret)),
        "stale" => {
            let t = now_s.saturating_sub(STALE_S);
            format!("t={t},v1={}", signed(t, "", secret))
        }
        "bad" => format!("t={now_s},v1={}", signed(now_s, "", "not the secret")),
        _ => format!("t={now_s},v1={}", signed(now_s, "", secret)),
    };
    vec![("Wave-Signature".into(), header)]
}

/// Moves payouts that are due and expires sessions past `when_expires`.
pub fn tick(fake: &Fake) {
    let now = fake.clock.now_ms();
    let mut state = fake.lock();
    for payout in state.wave.payouts.values_mut() {
        if payout.settle_at_ms.is_some_and(|due| now >= due) {
            payout.settle_at_ms = None;
            let (status, code) = payout.plan;
            payout.object["status"] = json!(status);
            if let Some(code) = code {
                payout.object["payout_error"] = json!({"error_code": code, "error_message": "payout failed (fake)"});
            }
        }
    }
    for session in state.wave.sessions.values_mut() {
        if session["checkout_status"] == "open" && session["expires_at_ms"].as_u64().is_some_and(|end| now >= end) {
            session["checkout_status"] = json!("expired");
        }
    }
}

/// Wave's 429 body.
pub fn too_many_requests() -> Value {
    json!({"code": "rate-limit-exceeded", "message": "too many requests"})
}

pub fn internal_error() -> Value {
    json!({"code": "internal-server-error", "message": "internal error"})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_follow_the_mode() {
        let body = br#"{"id":"EV_1"}"#;
        let concatenated = sign("concatenated", "s", 100, body);
        assert_eq!(concatenated[0].1, format!("t=100,v1={}", hmac_hex("s", b"100{\"id\":\"EV_1\"}")));
        assert_eq!(sign("dot", "s", 100, body)[0].1, format!("t=100,v1={}", hmac_hex("s", b"100.{\"id\":\"EV_1\"}")));
        assert_eq!(sign("bearer", "s", 100, body)[0], ("Authorization".to_owned(), "Bearer s".to_owned()));
        assert!(sign("stale", "s", 1000, body)[0].1.starts_with("t=400,"));
        assert_eq!(sign("rotated", "s", 100, body)[0].1.matches("v1=").count(), 2);
    }
}
