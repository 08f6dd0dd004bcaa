//! Creating pawaPay deposits and payouts (`POST /v2/deposits`, `/v2/payouts`, `/v2/payouts/bulk`), and the
//! checks refunds (`refunds.rs`) share.
//!
//! The order of the checks follows pawaPay's split between technical failures and rejections: a body that
//! does not parse, a missing or unsupported field or a malformed id is a 400 (`INVALID_INPUT`,
//! `MISSING_PARAMETER`, `UNSUPPORTED_PARAMETER`, `INVALID_PARAMETER`); a well-formed request that cannot be
//! served is a 200 `REJECTED` with its `failureReason`, and is not stored (the same id may be sent again). An
//! id already stored answers `DUPLICATE_IGNORED` and changes nothing: no new transaction, no new callback.

use serde_json::{json, Map, Value};

use super::conf::{self, AMOUNT_MAX, AMOUNT_MIN};
use super::failure;
use crate::common::{is_uuid_v4, Plan, Stage, Txn};
use crate::server::{Fake, Reply};

/// pawaPay's per-request limit for bulk payouts.
const BULK_MAX: usize = 20;
const METADATA_MAX: usize = 10;

const DEPOSIT_FIELDS: &[&str] = &[
    "depositId",
    "amount",
    "currency",
    "payer",
    "clientReferenceId",
    "customerMessage",
    "preAuthorisationCode",
    "metadata",
    "successfulUrl",
    "failedUrl",
];
const PAYOUT_FIELDS: &[&str] =
    &["payoutId", "amount", "currency", "recipient", "clientReferenceId", "customerMessage", "metadata"];

/// A refusal before anything is stored.
pub(super) struct Refusal(pub(super) Reply);

pub(super) type Checked<T> = Result<T, Refusal>;

pub(super) fn bad(field: &str, id: Option<&str>, code: &str, message: String) -> Refusal {
    let mut body = failure(code, &message);
    if let (Some(id), Some(map)) = (id, body.as_object_mut()) {
        map.insert(field.into(), json!(id));
        map.insert("status".into(), json!("REJECTED"));
    }
    Refusal(Reply::json(400, body))
}

pub(super) fn rejected(field: &str, id: &str, code: &str, message: &str) -> Refusal {
    let body =
        json!({field: id, "status": "REJECTED", "failureReason": {"failureCode": code, "failureMessage": message}});
    Refusal(Reply::json(200, body))
}

pub(super) fn object(body: &[u8], field: &str) -> Checked<Map<String, Value>> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        _ => Err(bad(field, None, "INVALID_INPUT", "We were unable to parse the payload of the request.".into())),
    }
}

/// The id field: present, a string, a UUIDv4; and no field outside `allowed`.
pub(super) fn id_of<'a>(map: &'a Map<String, Value>, field: &str, allowed: &[&str]) -> Checked<&'a str> {
    let id = map.get(field).and_then(Value::as_str);
    if let Some(extra) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(bad(field, id, "UNSUPPORTED_PARAMETER", format!("Parameter '{extra}' is not supported.")));
    }
    match map.get(field) {
        None => Err(bad(field, None, "MISSING_PARAMETER", format!("Parameter '{field}' is missing."))),
        Some(Value::String(id)) if is_uuid_v4(id) => Ok(id),
        Some(_) => Err(bad(field, id, "INVALID_PARAMETER", format!("Parameter '{field}' must be a UUIDv4."))),
    }
}

/// An optional string field (400 when present but not a string).
pub(super) fn text<'a>(map: &'a Map<String, Value>, name: &str, field: &str, id: &str) -> Checked<Option<&'a str>> {
    match map.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(bad(field, Some(id), "INVALID_PARAMETER", format!("Parameter '{name}' must be a string."))),
    }
}

pub(super) fn required<'a>(map: &'a Map<String, Value>, name: &str, field: &str, id: &str) -> Checked<&'a str> {
    text(map, name, field, id)?
        .ok_or_else(|| bad(field, Some(id), "MISSING_PARAMETER", format!("Parameter '{name}' is missing.")))
}

/// The optional fields every kind shares: customerMessage (4 to 22 characters) and metadata (a list of at
/// most ten objects).
pub(super) fn common_optional(map: &Map<String, Value>, field: &str, id: &str) -> Checked<()> {
    if let Some(message) = text(map, "customerMessage", field, id)? {
        if !(4..=22).contains(&message.chars().count()) {
            let text = "Parameter 'customerMessage' must be 4 to 22 characters.".to_owned();
            return Err(bad(field, Some(id), "INVALID_PARAMETER", text));
        }
    }
    text(map, "clientReferenceId", field, id)?;
    match map.get("metadata") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Array(list)) if list.len() <= METADATA_MAX && list.iter().all(Value::is_object) => Ok(()),
        Some(_) => {
            let text = format!("Parameter 'metadata' must be a list of at most {METADATA_MAX} objects.");
            Err(bad(field, Some(id), "INVALID_PARAMETER", text))
        }
    }
}

/// An amount string without decimals (every provider here has `decimalsInAmount: NONE`), within the limits.
fn amount(raw: &str, field: &str, id: &str) -> Checked<u64> {
    let invalid = || rejected(field, id, "INVALID_AMOUNT", "The amount is not valid for this provider.");
    let digits = raw.bytes().all(|b| b.is_ascii_digit()) && !raw.is_empty() && raw.len() <= 18;
    if !digits || (raw.starts_with('0') && raw.len() > 1) {
        return Err(invalid());
    }
    let value: u64 = raw.parse().map_err(|_| invalid())?;
    if value == 0 {
        return Err(invalid());
    }
    if !(AMOUNT_MIN..=AMOUNT_MAX).contains(&value) {
        let message = format!("The amount must be between {AMOUNT_MIN} and {AMOUNT_MAX}.");
        return Err(rejected(field, id, "AMOUNT_OUT_OF_BOUNDS", &message));
    }
    Ok(value)
}

/// What a deposit or a payout asks for, once it passed every check.
struct Party {
    phone: String,
    provider: &'static conf::ProviderInfo,
}

/// `payer` / `recipient`: `{"type":"MMO","accountDetails":{"phoneNumber","provider"}}`.
fn party(map: &Map<String, Value>, name: &str, field: &str, id: &str) -> Checked<Party> {
    let missing = |what: &str| bad(field, Some(id), "MISSING_PARAMETER", format!("Parameter '{what}' is missing."));
    let party = map.get(name).and_then(Value::as_object).ok_or_else(|| missing(name))?;
    if party.get("type").and_then(Value::as_str) != Some("MMO") {
        return Err(bad(field, Some(id), "INVALID_PARAMETER", format!("Parameter '{name}.type' must be MMO.")));
    }
    let details = party.get("accountDetails").and_then(Value::as_object).ok_or_else(|| missing("accountDetails"))?;
    let phone = details.get("phoneNumber").and_then(Value::as_str).ok_or_else(|| missing("phoneNumber"))?;
    let code = details.get("provider").and_then(Value::as_str).ok_or_else(|| missing("provider"))?;
    let provider = conf::provider_info(code)
        .ok_or_else(|| rejected(field, id, "INVALID_PROVIDER", "The provider is not available for this account."))?;
    if !conf::phone_fits(phone, provider) {
        let message = "The phone number is not valid for the provider's country (digits only, no '+').";
        return Err(rejected(field, id, "INVALID_PHONE_NUMBER", message));
    }
    Ok(Party { phone: phone.to_owned(), provider })
}

/// Stores the transaction unless its id is already known; the answer to the creation either way.
fn store(fake: &Fake, txn: Txn, accepted: Value) -> Reply {
    let field = super::id_field(txn.kind);
    let mut state = fake.lock();
    if state.txns.contains(&txn.id) {
        return Reply::json(200, json!({field: txn.id, "status": "DUPLICATE_IGNORED"}));
    }
    tracing::info!(kind = txn.kind, id = %txn.id, plan = ?txn.plan, "created");
    state.txns.insert(txn);
    Reply::json(200, accepted).created()
}

pub(super) fn new_txn(fake: &Fake, kind: &'static str, id: &str, map: Map<String, Value>, plan: Plan) -> Txn {
    let now = fake.clock.now_ms();
    let settle_at_ms = (plan != Plan::Stuck).then(|| now.saturating_add(fake.settle_ms));
    Txn {
        kind,
        id: id.to_owned(),
        stage: Stage::Created,
        plan,
        amount: String::new(),
        currency: String::new(),
        phone: String::new(),
        route: String::new(),
        reason: None,
        created_ms: now,
        created_at: fake.clock.rfc3339(),
        settle_at_ms,
        callback_url: None,
        request: Value::Object(map),
        provider_txn_id: None,
        parent: None,
    }
}

pub(super) fn answer(result: Checked<Reply>) -> Reply {
    result.unwrap_or_else(|Refusal(reply)| reply)
}

pub fn deposit(fake: &Fake, body: &[u8]) -> Reply {
    answer(object(body, "depositId").and_then(|map| money_out_or_in(fake, map, "deposit")))
}

pub fn payout(fake: &Fake, body: &[u8]) -> Reply {
    answer(object(body, "payoutId").and_then(|map| money_out_or_in(fake, map, "payout")))
}

/// Deposits and payouts differ only in field names, magic numbers and the payout's ENQUEUED knob.
fn money_out_or_in(fake: &Fake, map: Map<String, Value>, kind: &'static str) -> Checked<Reply> {
    let deposit = kind == "deposit";
    let (field, party_name, allowed) =
        if deposit { ("depositId", "payer", DEPOSIT_FIELDS) } else { ("payoutId", "recipient", PAYOUT_FIELDS) };
    let id = id_of(&map, field, allowed)?.to_owned();
    let raw_amount = match map.get("amount") {
        None => return Err(bad(field, Some(&id), "MISSING_PARAMETER", "Parameter 'amount' is missing.".into())),
        Some(Value::String(s)) => s.clone(),
        Some(_) => {
            return Err(bad(field, Some(&id), "INVALID_PARAMETER", "Parameter 'amount' must be a string.".into()))
        }
    };
    let currency = required(&map, "currency", field, &id)?.to_owned();
    common_optional(&map, field, &id)?;
    let party = party(&map, party_name, field, &id)?;
    if party.provider.currency != currency {
        return Err(rejected(field, &id, "INVALID_CURRENCY", "The currency is not supported by the provider."));
    }
    let value = amount(&raw_amount, field, &id)?;
    let plan = if deposit { conf::deposit_plan(&party.phone) } else { conf::payout_plan(&party.phone) };
    let mut txn = new_txn(fake, kind, &id, map, plan);
    txn.amount = value.to_string();
    txn.currency = currency;
    txn.phone = party.phone;
    txn.route = party.provider.code.to_owned();
    if !deposit && fake.lock().knobs.payouts_enqueued && txn.plan != Plan::Stuck {
        txn.stage = Stage::Held;
        txn.settle_at_ms = None;
    }
    let mut accepted = json!({field: id, "status": "ACCEPTED", "created": txn.created_at});
    if deposit {
        let next = if party.provider.auth_type == "REDIRECT_AUTH" { "GET_AUTH_URL" } else { "FINAL_STATUS" };
        accepted["nextStep"] = json!(next);
    }
    Ok(store(fake, txn, accepted))
}

/// `POST /v2/payouts/bulk`: a list of payouts, each answered in order as `POST /v2/payouts` would.
pub fn bulk(fake: &Fake, body: &[u8]) -> Reply {
    let list = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Array(list)) if !list.is_empty() && list.len() <= BULK_MAX => list,
        _ => {
            let message = format!("The body must be a list of 1 to {BULK_MAX} payouts.");
            return Reply::json(400, failure("INVALID_INPUT", &message));
        }
    };
    let mut created = false;
    let mut answers = Vec::with_capacity(list.len());
    for item in list {
        let reply = match item {
            Value::Object(map) => answer(money_out_or_in(fake, map, "payout")),
            _ => answer(Err(bad("payoutId", None, "INVALID_INPUT", "Each payout must be an object.".into()))),
        };
        created |= reply.created;
        answers.push(reply.body.unwrap_or(Value::Null));
    }
    let reply = Reply::json(200, Value::Array(answers));
    if created {
        reply.created()
    } else {
        reply
    }
}
