//! The control API under `/__fake/`, for tests and operators. It is the same on both fakes, needs no
//! credentials, and its own requests are not recorded in the request log.
//!
//! - `GET /__fake/requests`: every provider request received, oldest first (at most 10,000):
//!   `[{"method","path","headers":{lower-case name: value},"body": string}]`.
//! - `GET /__fake/transactions`: every transaction, oldest first (at most 10,000):
//!   `[{"kind","id","status","amount","currency","phone","provider","target","reason","created","parent"}]`.
//! - `GET /__fake/knobs`, `POST /__fake/knobs` with any subset of the knobs: answers the knobs now in force.
//! - `POST /__fake/complete/{id}` with `{"outcome":"success"|"failure","reason":"PAYER_NOT_FOUND"}` (reason
//!   optional): settles the transaction now and sends its callback per the `callbacks` knob; 404 when unknown,
//!   409 when already final.
//! - `POST /__fake/clock/advance` with `{"seconds":N}`: moves the fake clock forward; answers
//!   `{"now","offset_s"}`.
//!
//! Errors are `{"error": "..."}` with 400, 404 or 409.

use actix_web::http::Method;
use actix_web::HttpRequest;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::common::ADVANCE_S_MAX;
use crate::knobs::KnobsPatch;
use crate::server::{finish, Fake, Reply};

pub fn handle(fake: &Fake, req: &HttpRequest, body: &[u8]) -> Reply {
    let path = req.path().trim_start_matches("/__fake/");
    match (req.method(), path) {
        (&Method::GET, "requests") => Reply::json(200, json!(fake.lock().requests)),
        (&Method::GET, "transactions") => transactions(fake),
        (&Method::GET, "knobs") => Reply::json(200, json!(fake.lock().knobs)),
        (&Method::POST, "knobs") => knobs(fake, body),
        (&Method::POST, "clock/advance") => advance(fake, body),
        (&Method::POST, p) if p.starts_with("complete/") => complete(fake, &p["complete/".len()..], body),
        _ => error(404, "no such control endpoint"),
    }
}

fn error(status: u16, message: impl Into<String>) -> Reply {
    Reply::json(status, json!({"error": message.into()}))
}

fn transactions(fake: &Fake) -> Reply {
    let state = fake.lock();
    let list: Vec<Value> = state.txns.iter().map(|t| t.summary(fake.status_name(t), fake.is_pawapay())).collect();
    Reply::json(200, Value::Array(list))
}

fn knobs(fake: &Fake, body: &[u8]) -> Reply {
    let patch: KnobsPatch = match serde_json::from_slice(body) {
        Ok(patch) => patch,
        Err(e) => return error(400, format!("knobs: {e}")),
    };
    let mut state = fake.lock();
    match state.knobs.apply(patch) {
        Ok(()) => {
            tracing::info!(knobs = ?state.knobs, "knobs changed");
            Reply::json(200, json!(state.knobs))
        }
        Err(e) => error(400, e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Advance {
    seconds: u64,
}

fn advance(fake: &Fake, body: &[u8]) -> Reply {
    let advance: Advance = match serde_json::from_slice(body) {
        Ok(advance) => advance,
        Err(e) => return error(400, format!("clock/advance: {e}")),
    };
    if advance.seconds > ADVANCE_S_MAX {
        return error(400, format!("seconds must be at most {ADVANCE_S_MAX}"));
    }
    fake.clock.advance_s(advance.seconds);
    tracing::info!(seconds = advance.seconds, "clock advanced");
    Reply::json(200, json!({"now": fake.clock.rfc3339(), "offset_s": fake.clock.offset_s()}))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Complete {
    outcome: Outcome,
    reason: Option<String>,
}

#[derive(Deserialize, PartialEq)]
#[serde(rename_all = "lowercase")]
enum Outcome {
    Success,
    Failure,
}

/// The reason a forced failure carries when the test names none.
fn default_reason(fake: &Fake) -> &'static str {
    if fake.is_pawapay() {
        "UNSPECIFIED_FAILURE"
    } else {
        "INTERNAL_PROCESSING_ERROR"
    }
}

fn complete(fake: &Fake, id: &str, body: &[u8]) -> Reply {
    let complete: Complete = match serde_json::from_slice(body) {
        Ok(complete) => complete,
        Err(e) => return error(400, format!("complete: {e}")),
    };
    if complete.reason.as_ref().is_some_and(|r| r.is_empty() || r.len() > 64) {
        return error(400, "reason must be 1 to 64 characters");
    }
    let outgoing;
    let summary;
    {
        let mut state = fake.lock();
        let state = &mut *state;
        let Some(txn) = state.txns.get_mut(id) else { return error(404, format!("no transaction {id}")) };
        if txn.stage.is_final() {
            return error(409, format!("transaction {id} is already {}", fake.status_name(txn)));
        }
        let success = complete.outcome == Outcome::Success;
        let reason = complete.reason.unwrap_or_else(|| default_reason(fake).to_owned());
        finish(txn, success, (!success).then_some(reason));
        outgoing = fake.callbacks_for(&state.knobs, txn);
        summary = txn.summary(fake.status_name(txn), fake.is_pawapay());
    }
    tracing::info!(id, "transaction completed by the control API");
    fake.callbacks.send_all(outgoing);
    Reply::json(200, summary)
}
