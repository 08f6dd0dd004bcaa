//! The pawaPay Merchant API v2 fake (docs.pawapay.io/v2).
//!
//! # Layout
//! - `mod.rs`: routing, the bearer token check, status queries, resend-callback, fail-enqueued, the wire
//!   form of a transaction and its callbacks.
//! - `create.rs`: deposits and payouts (single and bulk): validation, rejections, idempotency.
//! - `refunds.rs`: partial refunds and their rules.
//! - `conf.rs`: providers, limits, magic test numbers, active-conf and predict-provider.
//! - `signing.rs`: RFC 9421 callback signatures and the key served at `/v2/public-key/http`.
//!
//! Every call but `GET /v2/public-key/http` and `GET /v2/availability` needs `Authorization: Bearer <token>`:
//! none gives 401 NO_AUTHENTICATION, another token 403 AUTHENTICATION_ERROR, both as
//! `{"failureReason":{"failureCode","failureMessage"}}`.

mod conf;
mod create;
mod refunds;
pub mod signing;

use actix_web::http::Method;
use awc::http::Method as OutMethod;
use serde_json::{json, Value};

use crate::callbacks::{self, Outgoing, Variant};
use crate::common::{is_uuid_v4, Stage, Txn};
use crate::knobs::Knobs;
use crate::server::{Call, Fake, Reply};

pub struct Config {
    pub token: String,
    pub signer: signing::Signer,
}

/// The id field's name in each kind's wire form.
fn id_field(kind: &str) -> &'static str {
    match kind {
        "payout" => "payoutId",
        "refund" => "refundId",
        _ => "depositId",
    }
}

/// `{"failureReason":{...}}`, the body of pawaPay's technical errors.
pub fn failure(code: &str, message: &str) -> Value {
    json!({"failureReason": {"failureCode": code, "failureMessage": message}})
}

pub fn unknown_error() -> Value {
    failure("UNKNOWN_ERROR", "Unable to process request due to an unknown problem.")
}

/// pawaPay publishes no rate limit or its body; the fake answers 429 in its usual error shape.
pub fn too_many_requests() -> Value {
    failure("UNKNOWN_ERROR", "Too many requests.")
}

pub fn handle(fake: &Fake, config: &Config, call: &Call) -> Reply {
    let segments: Vec<&str> = call.path.trim_start_matches('/').split('/').collect();
    match (call.method, segments.as_slice()) {
        (&Method::GET, ["v2", "public-key", "http"]) => {
            return Reply::json(200, json!([{"id": signing::KEY_ID, "key": config.signer.public_pem()}]))
        }
        (&Method::GET, ["v2", "availability"]) => return Reply::json(200, conf::availability()),
        _ => {}
    }
    match call.header("authorization").map(str::trim) {
        None | Some("") => {
            return Reply::json(
                401,
                failure("NO_AUTHENTICATION", "We did not find the API token in the request headers."),
            )
        }
        Some(value) if value.strip_prefix("Bearer ").map(str::trim) != Some(config.token.as_str()) => {
            let message = "The API token specified for authentication is not valid or missing.";
            return Reply::json(403, failure("AUTHENTICATION_ERROR", message));
        }
        Some(_) => {}
    }
    match (call.method, segments.as_slice()) {
        (&Method::POST, ["v2", "deposits"]) => create::deposit(fake, call.body),
        (&Method::POST, ["v2", "payouts"]) => create::payout(fake, call.body),
        (&Method::POST, ["v2", "payouts", "bulk"]) => create::bulk(fake, call.body),
        (&Method::POST, ["v2", "refunds"]) => refunds::refund(fake, call.body),
        (&Method::GET, ["v2", "deposits", id]) => status(fake, "deposit", id),
        (&Method::GET, ["v2", "payouts", id]) => status(fake, "payout", id),
        (&Method::GET, ["v2", "refunds", id]) => status(fake, "refund", id),
        (&Method::POST, ["v2", "deposits", "resend-callback", id]) => resend(fake, config, "deposit", id),
        (&Method::POST, ["v2", "payouts", "resend-callback", id]) => resend(fake, config, "payout", id),
        (&Method::POST, ["v2", "refunds", "resend-callback", id]) => resend(fake, config, "refund", id),
        (&Method::POST, ["v2", "payouts", "fail-enqueued", id]) => fail_enqueued(fake, config, id),
        (&Method::GET, ["v2", "active-conf"]) => Reply::json(200, conf::active_conf(call.query)),
        (&Method::POST, ["v2", "predict-provider"]) => conf::predict_provider(call.body),
        (_, ["v2", "deposits" | "payouts" | "refunds" | "active-conf" | "predict-provider", ..]) => {
            Reply::empty(405).because("method not allowed")
        }
        _ => Reply::empty(404).because("no such endpoint"),
    }
}

/// The wire name of a transaction's status.
pub fn status_name(txn: &Txn) -> &'static str {
    match txn.stage {
        Stage::Created => "ACCEPTED",
        Stage::Processing => "PROCESSING",
        Stage::Held if txn.kind == "payout" => "ENQUEUED",
        Stage::Held => "IN_RECONCILIATION",
        Stage::Succeeded => "COMPLETED",
        Stage::Failed => "FAILED",
    }
}

/// The standard message of each failure code the fake emits.
pub fn failure_message(code: &str) -> &'static str {
    match code {
        "PAYER_NOT_FOUND" => "The phone number does not belong to the provider or the account is not active.",
        "PAYMENT_NOT_APPROVED" => "The customer did not approve the authorisation for this payment.",
        "INSUFFICIENT_BALANCE" => "The customer does not have enough funds.",
        "PAYER_LIMIT_REACHED" => "The customer has reached a wallet limit.",
        "RECIPIENT_NOT_FOUND" => "The recipient's phone number does not belong to the provider.",
        "MANUALLY_CANCELLED" => "The enqueued payout was cancelled.",
        _ => "Unable to process the payment; the provider gave no reason.",
    }
}

/// The transaction object of status answers and callbacks (`data` of `GET /v2/deposits/{id}`).
pub fn render(txn: &Txn, variant: Variant) -> Value {
    let (status, success, failed) = match variant {
        Variant::Final => (status_name(txn), txn.stage == Stage::Succeeded, txn.stage == Stage::Failed),
        Variant::Forged => ("COMPLETED", true, false),
        Variant::Stale => ("PROCESSING", false, false),
    };
    let country = conf::provider_info(&txn.route).map(|p| p.country).unwrap_or("");
    let party = json!({"type": "MMO", "accountDetails": {"phoneNumber": txn.phone, "provider": txn.route}});
    let party_field = if txn.kind == "deposit" { "payer" } else { "recipient" };
    let mut object = json!({
        id_field(txn.kind): txn.id,
        "status": status,
        "amount": txn.amount,
        "currency": txn.currency,
        "country": country,
        party_field: party,
        "created": txn.created_at,
    });
    let Some(map) = object.as_object_mut() else { return object };
    if let Some(parent) = &txn.parent {
        map.insert("depositId".into(), json!(parent));
    }
    for field in ["customerMessage", "clientReferenceId"] {
        if let Some(value) = txn.request.get(field).filter(|v| v.is_string()) {
            map.insert(field.into(), value.clone());
        }
    }
    if success {
        let id = txn.provider_txn_id.clone().unwrap_or_else(crate::common::provider_reference);
        map.insert("providerTransactionId".into(), json!(id));
    }
    if failed {
        let code = txn.reason.as_deref().unwrap_or("UNKNOWN_ERROR");
        map.insert("failureReason".into(), json!({"failureCode": code, "failureMessage": failure_message(code)}));
    }
    if txn.kind == "deposit"
        && status_name(txn) == "ACCEPTED"
        && conf::provider_info(&txn.route).is_some_and(|p| p.auth_type == "REDIRECT_AUTH")
    {
        map.insert("authorizationUrl".into(), json!(format!("https://pay.wave.example/fake/{}", txn.id)));
    }
    if let Some(metadata) = txn.request.get("metadata").and_then(Value::as_array) {
        // Sent as a list of one-field objects (plus an optional isPII flag); answered as one object.
        let mut flat = serde_json::Map::new();
        for entry in metadata.iter().filter_map(Value::as_object) {
            flat.extend(entry.iter().filter(|(k, _)| k.as_str() != "isPII").map(|(k, v)| (k.clone(), v.clone())));
        }
        map.insert("metadata".into(), Value::Object(flat));
    }
    object
}

fn status(fake: &Fake, kind: &'static str, id: &str) -> Reply {
    if !is_uuid_v4(id) {
        return Reply::json(400, failure("INVALID_PARAMETER", &format!("{} must be a UUIDv4.", id_field(kind))));
    }
    let state = fake.lock();
    match state.txns.get(id).filter(|t| t.kind == kind) {
        Some(txn) => Reply::json(200, json!({"status": "FOUND", "data": render(txn, Variant::Final)})),
        None => Reply::json(200, json!({"status": "NOT_FOUND"})),
    }
}

/// The callback URL configured for a kind ("dashboard" configuration, here the knobs and CLI flags).
fn callback_url<'k>(knobs: &'k Knobs, kind: &str) -> Option<&'k String> {
    match kind {
        "payout" => knobs.payout_callback_url.as_ref(),
        "refund" => knobs.refund_callback_url.as_ref(),
        _ => knobs.deposit_callback_url.as_ref(),
    }
}

/// One callback delivery: the rendered object POSTed to the kind's URL, signed when the `signed` knob is on
/// and always (with a corrupted signature) when forged.
fn outgoing(config: &Config, knobs: &Knobs, txn: &Txn, variant: Variant) -> Option<Outgoing> {
    let url = callback_url(knobs, txn.kind)?.clone();
    let body = render(txn, variant).to_string().into_bytes();
    let forged = variant == Variant::Forged;
    let mut headers = vec![];
    if knobs.signed || forged {
        let now = std::time::SystemTime::now();
        let created_s = now.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let date = humantime::format_rfc3339_seconds(now).to_string();
        let message = signing::Message {
            method: "POST",
            url: &url,
            body: &body,
            content_type: "application/json",
            date: &date,
            created_s,
        };
        match config.signer.headers(&message, knobs.signature_encoding == "der", forged) {
            Ok(signed) => headers = signed,
            Err(e) => tracing::warn!(error = %e, "callback not signed"),
        }
    }
    Some(Outgoing { url, method: OutMethod::POST, body, headers, delay_ms: 0 })
}

/// The callbacks of a transaction that just became final. A stuck transaction settled by the control API
/// sends its callback like any other.
pub fn callbacks_for(config: &Config, knobs: &Knobs, txn: &Txn) -> Vec<Outgoing> {
    callbacks::plan(knobs.callbacks, |variant| outgoing(config, knobs, txn, variant))
}

fn resend(fake: &Fake, config: &Config, kind: &'static str, id: &str) -> Reply {
    let field = id_field(kind);
    if !is_uuid_v4(id) {
        return Reply::json(400, failure("INVALID_PARAMETER", &format!("{field} must be a UUIDv4.")));
    }
    let rejected = |code: &str, message: String| {
        Reply::json(
            200,
            json!({field: id, "status": "REJECTED", "failureReason": {"failureCode": code, "failureMessage": message}}),
        )
    };
    let list = {
        let state = fake.lock();
        let Some(txn) = state.txns.get(id).filter(|t| t.kind == kind) else {
            return rejected("NOT_FOUND", format!("{kind} with ID {id} not found"));
        };
        if !txn.stage.is_final() {
            return rejected("INVALID_STATE", format!("{kind} with ID {id} has not finished processing"));
        }
        outgoing(config, &state.knobs, txn, Variant::Final).into_iter().collect()
    };
    fake.callbacks.send_all(list);
    Reply::json(200, json!({field: id, "status": "ACCEPTED"}))
}

fn fail_enqueued(fake: &Fake, config: &Config, id: &str) -> Reply {
    if !is_uuid_v4(id) {
        return Reply::json(400, failure("INVALID_PARAMETER", "payoutId must be a UUIDv4."));
    }
    let rejected = |code: &str, message: String| {
        Reply::json(
            200,
            json!({"payoutId": id, "status": "REJECTED", "failureReason": {"failureCode": code, "failureMessage": message}}),
        )
    };
    let list = {
        let mut state = fake.lock();
        let state = &mut *state;
        let Some(txn) = state.txns.get_mut(id).filter(|t| t.kind == "payout") else {
            return rejected("NOT_FOUND", format!("Payout with ID {id} not found"));
        };
        if txn.stage != Stage::Held {
            return rejected("INVALID_STATE", format!("Payout with ID {id} is not enqueued"));
        }
        crate::server::finish(txn, false, Some("MANUALLY_CANCELLED".into()));
        callbacks_for(config, &state.knobs, txn)
    };
    fake.callbacks.send_all(list);
    Reply::json(200, json!({"payoutId": id, "status": "ACCEPTED"}))
}
