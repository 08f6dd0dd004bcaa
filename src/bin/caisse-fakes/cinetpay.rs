//! The CinetPay fake: Checkout v2 (`/v2/payment`, `/v2/payment/check`), the hosted page a customer pays on,
//! signed notifications, and the Transfer API (login, contacts, `money/send/contact`, `check/money`) with its
//! transfer notifications (docs.cinetpay.com/api/1.0-en/checkout and /transfert).
//!
//! A checkout is paid or refused on its page (`GET /pay/{token}`, whose buttons post `outcome=pay|decline` to
//! `POST /pay/{token}`): the notification follows (a GET ping, then the form POST with the sixteen `cpm_*`
//! fields and `x-token`, per the `callbacks` knob; `forged` signs with another key) and the page sends the
//! customer back to `return_url` with a form POST of `transaction_id`, as CinetPay does. A transfer goes NEW, then
//! after `--settle-ms` VAL, or REJ when the phone ends in `01`; when it ends in `02` it goes NOS (waiting for a
//! confirmation, a transition) first and VAL `--settle-ms` later. Each step is notified, unsigned.

use std::collections::BTreeMap;

use actix_web::http::Method;
use hmac::{Hmac, Mac};
use rand::Rng;
use serde_json::{json, Value};
use sha2::Sha256;

use crate::callbacks::{self, Outgoing, Variant};
use crate::knobs::Knobs;
use crate::server::{Call, Fake, Reply};

/// At most this many checkouts and transfers are kept each.
const KEPT_MAX: usize = 10_000;
/// A Transfer API token lives this long on the fake clock.
const TOKEN_LIFE_MS: u64 = 5 * 60 * 1000;
const FIELDS: [&str; 16] = [
    "cpm_site_id",
    "cpm_trans_id",
    "cpm_trans_date",
    "cpm_amount",
    "cpm_currency",
    "signature",
    "payment_method",
    "cel_phone_num",
    "cpm_phone_prefixe",
    "cpm_language",
    "cpm_version",
    "cpm_payment_config",
    "cpm_page_action",
    "cpm_custom",
    "cpm_designation",
    "cpm_error_message",
];
const CARD_FIELDS: [&str; 8] = [
    "customer_name",
    "customer_surname",
    "customer_email",
    "customer_address",
    "customer_city",
    "customer_country",
    "customer_state",
    "customer_zip_code",
];

pub struct Config {
    pub apikey: String,
    pub site_id: String,
    pub secret_key: String,
    pub transfer_login: String,
    pub transfer_password: String,
}

#[derive(Default)]
pub struct Book {
    /// By our `transaction_id`.
    checkouts: BTreeMap<String, Value>,
    /// Payment token → transaction id.
    tokens: BTreeMap<String, String>,
    /// Transfer API tokens and when they expire (fake clock).
    logins: BTreeMap<String, u64>,
    /// `prefix + phone` of each contact.
    contacts: std::collections::BTreeSet<String>,
    /// By `client_transaction_id`: the transfer, when it takes its next step, and the steps left (each a
    /// `treatment_status`, the last final).
    transfers: BTreeMap<String, (Value, Option<u64>, &'static [&'static str])>,
}

fn answer(code: &str, message: &str) -> Reply {
    Reply::json(200, json!({"code": code, "message": message, "data": null}))
}

fn transfer_answer(code: i64, message: &str) -> Reply {
    Reply::json(200, json!({"code": code, "message": message}))
}

fn random(len: usize) -> String {
    let mut rng = rand::thread_rng();
    (0..len).map(|_| char::from(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"[rng.gen_range(0..36)])).collect()
}

pub fn handle(fake: &Fake, config: &Config, call: &Call<'_>) -> Reply {
    if let Some(token) = call.path.strip_prefix("/pay/") {
        return customer(fake, config, call, token);
    }
    let query: Vec<(String, String)> = serde_urlencoded::from_str(call.query).unwrap_or_default();
    let param = |name: &str| query.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()).unwrap_or_default();
    match (call.method.clone(), call.path) {
        (Method::POST, "/v2/payment") => init(fake, config, call),
        (Method::POST, "/v2/payment/check") => check(fake, config, call),
        (Method::POST, "/v1/auth/login") => login(fake, config, call),
        (method, path) if path.starts_with("/v1/transfer/") => {
            let now = fake.clock.now_ms();
            let mut state = fake.lock();
            match state.cinetpay.logins.get(&param("token")) {
                None => return transfer_answer(706, "INVALID_TOKEN"),
                Some(until) if now >= *until => return transfer_answer(705, "EXPIRED_TOKEN"),
                Some(_) => {}
            }
            let form: Vec<(String, String)> = serde_urlencoded::from_bytes(call.body).unwrap_or_default();
            let data: Value = form
                .iter()
                .find(|(k, _)| k == "data")
                .and_then(|(_, v)| serde_json::from_str(v).ok())
                .unwrap_or(Value::Null);
            match (method, path) {
                (Method::POST, "/v1/transfer/contact") => {
                    let Some(items) = data.as_array() else { return transfer_answer(716, "DATA_NOT_VALID") };
                    for item in items {
                        let who = format!(
                            "{}{}",
                            item["prefix"].as_str().unwrap_or(""),
                            item["phone"].as_str().unwrap_or("")
                        );
                        state.cinetpay.contacts.insert(who);
                    }
                    Reply::json(
                        200,
                        json!({"code": 0, "message": "OPERATION_SUCCES", "data": [[{"status": "success"}]]}),
                    )
                }
                (Method::POST, "/v1/transfer/money/send/contact") => send_money(fake, &mut state.cinetpay, &data),
                (Method::GET, "/v1/transfer/check/money") => {
                    match state.cinetpay.transfers.get(&param("client_transaction_id")) {
                        Some((transfer, _, _)) => {
                            Reply::json(200, json!({"code": 0, "message": "OPERATION_SUCCES", "data": [transfer]}))
                        }
                        None => transfer_answer(723, "NOT_FOUND"),
                    }
                }
                _ => transfer_answer(-1, "OPERATION_ERROR"),
            }
        }
        _ => Reply::json(404, json!({"code": "404", "message": "NOT_FOUND"})),
    }
}

fn credentials_ok(config: &Config, body: &Value) -> Option<Reply> {
    if body["apikey"].as_str() != Some(config.apikey.as_str()) {
        return Some(answer("609", "AUTH_NOT_FOUND"));
    }
    if body["site_id"].as_str() != Some(config.site_id.as_str())
        && body["site_id"].as_i64().map(|s| s.to_string()) != Some(config.site_id.clone())
    {
        return Some(answer("613", "ERROR_SITE_ID_NOTVALID"));
    }
    None
}

fn init(fake: &Fake, config: &Config, call: &Call<'_>) -> Reply {
    let body: Value = serde_json::from_slice(call.body).unwrap_or(Value::Null);
    if let Some(refused) = credentials_ok(config, &body) {
        return refused;
    }
    let Some(amount) = body["amount"].as_i64() else { return answer("628", "ERROR_AMOUNT_FORMAT") };
    if amount % 5 != 0 {
        return answer("628", "ERROR_AMOUNT_FORMAT");
    }
    if amount < 100 {
        return answer("641", "ERROR_AMOUNT_TOO_LOW");
    }
    let card = body["channels"].as_str() == Some("CREDIT_CARD");
    let missing = |f: &&str| body[*f].as_str().is_none_or(str::is_empty);
    let needed = ["transaction_id", "currency", "description", "notify_url", "return_url"];
    if needed.iter().any(missing) || (card && CARD_FIELDS.iter().any(missing)) {
        return answer("608", "MINIMUM_REQUIRED_FIELDS");
    }
    if body["description"].as_str().is_some_and(|d| d.contains(['#', '$', '_', '&'])) {
        return answer("608", "MINIMUM_REQUIRED_FIELDS");
    }
    let tx = body["transaction_id"].as_str().unwrap_or_default().to_owned();
    let mut state = fake.lock();
    if state.cinetpay.checkouts.contains_key(&tx) {
        return answer("620", "ERROR_DOUBLE_PAYEMNT");
    }
    if state.cinetpay.checkouts.len() >= KEPT_MAX {
        let oldest = state.cinetpay.checkouts.keys().next().cloned();
        if let Some(oldest) = oldest {
            state.cinetpay.checkouts.remove(&oldest);
        }
    }
    let token = random(40).to_lowercase();
    let host = call.header("host").unwrap_or("127.0.0.1");
    let payment_url = format!("http://{host}/pay/{token}");
    let mut checkout = body.clone();
    checkout["status"] = json!("PENDING");
    checkout["payment_token"] = json!(token);
    checkout["created"] = json!(fake.clock.rfc3339());
    state.cinetpay.checkouts.insert(tx.clone(), checkout);
    state.cinetpay.tokens.insert(token.clone(), tx);
    Reply::json(
        200,
        json!({"code": "201", "message": "CREATED", "description": "Transaction created with success",
        "data": {"payment_token": token, "payment_url": payment_url}}),
    )
    .created()
}

fn check(fake: &Fake, config: &Config, call: &Call<'_>) -> Reply {
    let body: Value = serde_json::from_slice(call.body).unwrap_or(Value::Null);
    if let Some(refused) = credentials_ok(config, &body) {
        return refused;
    }
    let state = fake.lock();
    let Some(checkout) = body["transaction_id"].as_str().and_then(|tx| state.cinetpay.checkouts.get(tx)) else {
        return answer("624", "UNKNOWN_ERROR");
    };
    let data = json!({"amount": checkout["amount"], "currency": checkout["currency"], "status": checkout["status"],
        "payment_method": checkout["payment_method"], "operator_id": checkout["operator_id"],
        "description": checkout["description"], "metadata": checkout["metadata"]});
    let reply = |code: &str, message: &str| Reply::json(200, json!({"code": code, "message": message, "data": data}));
    match checkout["status"].as_str() {
        Some("ACCEPTED") => reply("00", "SUCCES"),
        Some("REFUSED") => reply("600", "PAYMENT_FAILED"),
        _ => reply("662", "WAITING_CUSTOMER_PAYMENT"),
    }
}

fn login(fake: &Fake, config: &Config, call: &Call<'_>) -> Reply {
    let form: Vec<(String, String)> = serde_urlencoded::from_bytes(call.body).unwrap_or_default();
    let field = |name: &str| form.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    if field("apikey") != Some(config.transfer_login.as_str())
        || field("password") != Some(config.transfer_password.as_str())
    {
        return transfer_answer(701, "INVALID_CREDENTIALS");
    }
    let token = random(48).to_lowercase();
    let until = fake.clock.now_ms() + TOKEN_LIFE_MS;
    let mut state = fake.lock();
    state.cinetpay.logins.retain(|_, until| *until > fake.clock.now_ms());
    state.cinetpay.logins.insert(token.clone(), until);
    Reply::json(200, json!({"code": 0, "message": "OPERATION_SUCCES", "data": {"token": token}}))
}

fn send_money(fake: &Fake, book: &mut Book, data: &Value) -> Reply {
    let Some(items) = data.as_array().filter(|a| !a.is_empty()) else { return transfer_answer(716, "DATA_NOT_VALID") };
    let mut answers = Vec::new();
    for item in items {
        let who = format!("{}{}", item["prefix"].as_str().unwrap_or(""), item["phone"].as_str().unwrap_or(""));
        if !book.contacts.contains(&who) {
            return transfer_answer(724, "ERROR_PHONE_NOT_MY_CONTACT");
        }
        let Some(reference) = item["client_transaction_id"].as_str().filter(|r| !r.is_empty()) else {
            return transfer_answer(716, "DATA_NOT_VALID");
        };
        if book.transfers.contains_key(reference) {
            return transfer_answer(805, "CLIENT_TRANSACTION_ID_EXIST");
        }
        let amount =
            item["amount"].as_i64().or_else(|| item["amount"].as_str().and_then(|a| a.parse().ok())).unwrap_or(0);
        if amount < 200 {
            return transfer_answer(719, "AMOUNT_TOO_SMALL");
        }
        if item["notify_url"].as_str().is_none_or(str::is_empty) {
            return transfer_answer(725, "MISSING_NOTIFY_URL");
        }
        let transfer = json!({
            "transaction_id": format!("TR{}", random(12)),
            "client_transaction_id": reference,
            "lot": random(8),
            "amount": amount,
            "receiver": who,
            "operator": "FAKE",
            "treatment_status": "NEW",
            "notify_url": item["notify_url"],
        });
        let plan: &'static [&'static str] = if who.ends_with("01") {
            &["REJ"]
        } else if who.ends_with("02") {
            &["NOS", "VAL"]
        } else {
            &["VAL"]
        };
        if book.transfers.len() >= KEPT_MAX {
            let oldest = book.transfers.keys().next().cloned();
            if let Some(oldest) = oldest {
                book.transfers.remove(&oldest);
            }
        }
        book.transfers
            .insert(reference.to_owned(), (transfer.clone(), Some(fake.clock.now_ms() + fake.settle_ms), plan));
        answers.push(transfer);
    }
    Reply::json(200, json!({"code": 0, "message": "OPERATION_SUCCES", "data": [answers]})).created()
}

/// The hosted page (`GET`) and the customer's choice (`POST`, form `outcome=pay|decline`).
fn customer(fake: &Fake, config: &Config, call: &Call<'_>, token: &str) -> Reply {
    let mut state = fake.lock();
    let knobs = state.knobs.clone();
    let Some(tx) = state.cinetpay.tokens.get(token).cloned() else {
        return Reply::json(404, json!({"code": "404", "message": "NOT_FOUND"}));
    };
    let Some(checkout) = state.cinetpay.checkouts.get_mut(&tx) else {
        return Reply::json(404, json!({"code": "404", "message": "NOT_FOUND"}));
    };
    let return_url = checkout["return_url"].as_str().unwrap_or_default().to_owned();
    if *call.method == Method::GET {
        let mut reply = Reply::empty(200);
        reply.html = Some(format!(
            "<!doctype html><html lang=\"fr\"><head><meta charset=\"utf-8\"><title>CinetPay (fake)</title></head><body>\
             <h1>Payer {} {}</h1><p>Statut : {}</p>\
             <form method=\"post\"><input type=\"hidden\" name=\"outcome\" value=\"pay\"><button id=\"pay\">Payer</button></form>\
             <form method=\"post\"><input type=\"hidden\" name=\"outcome\" value=\"decline\"><button id=\"decline\">Refuser</button></form>\
             </body></html>",
            checkout["amount"], checkout["currency"].as_str().unwrap_or_default(), checkout["status"].as_str().unwrap_or_default()
        ));
        return reply;
    }
    if checkout["status"] != "PENDING" {
        return Reply::json(409, json!({"code": "627", "message": "TRANSACTION_CANCEL"}));
    }
    let form: Vec<(String, String)> = serde_urlencoded::from_bytes(call.body).unwrap_or_default();
    let pay = form.iter().any(|(k, v)| k == "outcome" && v == "pay");
    checkout["status"] = json!(if pay { "ACCEPTED" } else { "REFUSED" });
    checkout["payment_method"] = json!(if checkout["channels"] == "CREDIT_CARD" { "VISAM" } else { "OM" });
    if pay {
        checkout["operator_id"] = json!(format!("MP{}", random(10)));
    }
    let notes = notifications(fake, config, &knobs, checkout, pay);
    drop(state);
    fake.callbacks.send_all(notes);
    let mut reply = Reply::empty(200);
    reply.html = Some(format!(
        "<!doctype html><html><body><form method=\"post\" action=\"{return_url}\">\
         <input type=\"hidden\" name=\"transaction_id\" value=\"{tx}\"><button id=\"back\">Retour au marchand</button></form></body></html>"
    ));
    reply
}

fn hmac_hex(key: &str, message: &[u8]) -> String {
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key.as_bytes()) else { return String::new() };
    mac.update(message);
    hex::encode(mac.finalize().into_bytes())
}

/// The GET ping and the signed form POST of one checkout's notification, per the `callbacks` knob.
fn notifications(fake: &Fake, config: &Config, knobs: &Knobs, checkout: &Value, paid: bool) -> Vec<Outgoing> {
    let Some(url) = checkout["notify_url"].as_str().map(str::to_owned) else { return Vec::new() };
    let value = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    };
    let phone = value(&checkout["customer_phone_number"]);
    let fields: Vec<(&str, String)> = vec![
        ("cpm_site_id", config.site_id.clone()),
        ("cpm_trans_id", value(&checkout["transaction_id"])),
        ("cpm_trans_date", fake.clock.rfc3339()),
        ("cpm_amount", value(&checkout["amount"])),
        ("cpm_currency", value(&checkout["currency"])),
        ("signature", random(20)),
        ("payment_method", value(&checkout["payment_method"])),
        ("cel_phone_num", phone.trim_start_matches('+').to_owned()),
        ("cpm_phone_prefixe", String::new()),
        ("cpm_language", "fr".into()),
        ("cpm_version", "V4".into()),
        ("cpm_payment_config", "SINGLE".into()),
        ("cpm_page_action", "PAYMENT".into()),
        ("cpm_custom", value(&checkout["metadata"])),
        ("cpm_designation", value(&checkout["description"])),
        ("cpm_error_message", if paid { "SUCCES".into() } else { "PAYMENT_FAILED".into() }),
    ];
    debug_assert!(fields.iter().map(|(k, _)| *k).eq(FIELDS));
    let body = serde_urlencoded::to_string(&fields).unwrap_or_default().into_bytes();
    let message: String = fields.iter().map(|(_, v)| v.as_str()).collect();
    let make = |variant: Variant| {
        let key = if variant == Variant::Forged { "not the secret key" } else { config.secret_key.as_str() };
        let headers = vec![
            ("x-token".to_owned(), hmac_hex(key, message.as_bytes())),
            ("Content-Type".to_owned(), "application/x-www-form-urlencoded".to_owned()),
        ];
        Some(Outgoing { url: url.clone(), method: awc::http::Method::POST, body: body.clone(), headers, delay_ms: 50 })
    };
    let mut sends = vec![Outgoing {
        url: url.clone(),
        method: awc::http::Method::GET,
        body: Vec::new(),
        headers: Vec::new(),
        delay_ms: 0,
    }];
    sends.extend(callbacks::plan(knobs.callbacks, make));
    sends
}

/// Moves the transfers that are due one step on; answers their (unsigned) notifications.
pub fn tick(fake: &Fake) -> Vec<Outgoing> {
    let now = fake.clock.now_ms();
    let mut state = fake.lock();
    let knobs = state.knobs.clone();
    let mut out = Vec::new();
    for (transfer, due, plan) in state.cinetpay.transfers.values_mut() {
        if !due.is_some_and(|d| now >= d) {
            continue;
        }
        let Some((step, rest)) = plan.split_first() else { continue };
        transfer["treatment_status"] = json!(*step);
        *plan = rest;
        *due = (!rest.is_empty()).then(|| now + fake.settle_ms);
        let Some(url) = transfer["notify_url"].as_str().map(str::to_owned) else { continue };
        let fields: Vec<(&str, String)> =
            ["transaction_id", "client_transaction_id", "lot", "amount", "receiver", "operator", "treatment_status"]
                .iter()
                .map(|k| {
                    (
                        *k,
                        match &transfer[*k] {
                            Value::String(s) => s.clone(),
                            other => other.to_string(),
                        },
                    )
                })
                .collect();
        let body = serde_urlencoded::to_string(&fields).unwrap_or_default().into_bytes();
        let make = |_| {
            let headers = vec![("Content-Type".to_owned(), "application/x-www-form-urlencoded".to_owned())];
            Some(Outgoing {
                url: url.clone(),
                method: awc::http::Method::POST,
                body: body.clone(),
                headers,
                delay_ms: 0,
            })
        };
        out.extend(callbacks::plan(knobs.callbacks, make));
    }
    out
}
