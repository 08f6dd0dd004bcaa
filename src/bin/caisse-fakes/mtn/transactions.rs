//! MTN requesttopay, transfer and refund: creation (`202` with an empty body), status queries and the refund
//! rules.
//!
//! Creation checks, in order (after the subscription key, the token and the target environment):
//! `X-Reference-Id` a UUIDv4 (400), `X-Callback-Url` an http(s) URL when present (400), the body (400: not
//! JSON, `amount` not a string matching MTN's amount pattern, no `currency`, a party whose `partyIdType` is not
//! MSISDN/EMAIL/PARTY_CODE or whose MSISDN is not digits only, `payerMessage`/`payeeNote` over 160 characters
//! or holding an apostrophe), the target environment's currency (`500 INVALID_CURRENCY`; EUR only in
//! `sandbox`), then a reused reference id (`409 RESOURCE_ALREADY_EXIST`). Validation errors carry an empty
//! body, as MTN documents none, and say why in an `X-Fake-Reason` header.
//!
//! A refund is accepted with 202 like the others and fails (FAILED, with a reason) when its
//! `referenceIdToRefund` is unknown (`RESOURCE_NOT_FOUND`), not SUCCESSFUL (`NOT_ALLOWED`), in another
//! currency (`INVALID_CURRENCY`) or asks more than what is left of the original once its earlier refunds
//! (pending or successful) are counted (`NOT_ALLOWED`).

use actix_web::http::Method;
use serde_json::{json, Map, Value};

use super::{error, magic, render, Config};
use crate::callbacks::Variant;
use crate::common::{is_digits, is_http_url, is_uuid_v4, Plan, Stage, Txn};
use crate::server::{Call, Fake, Reply};

const TEXT_MAX: usize = 160;

pub fn route(fake: &Fake, config: &Config, product: &str, rest: &[&str], call: &Call) -> Reply {
    match (product, call.method, rest) {
        ("collection", &Method::POST, ["v1_0", "requesttopay"]) => create(fake, config, "requesttopay", call),
        ("collection", &Method::GET, ["v1_0", "requesttopay", id]) => status(fake, "requesttopay", id),
        ("disbursement", &Method::POST, ["v1_0", "transfer"]) => create(fake, config, "transfer", call),
        ("disbursement", &Method::GET, ["v1_0", "transfer", id]) => status(fake, "transfer", id),
        ("disbursement", &Method::POST, ["v1_0" | "v2_0", "refund"]) => create(fake, config, "refund", call),
        ("disbursement", &Method::GET, ["v1_0" | "v2_0", "refund", id]) => status(fake, "refund", id),
        (_, &Method::GET, ["v1_0", "account", "balance"]) => {
            let currency = magic::currency_of(&config.target_environment).unwrap_or("EUR");
            Reply::json(200, json!({"availableBalance": "1000000", "currency": currency}))
        }
        (_, &Method::GET, ["v1_0", "accountholder", kind, _id, "active"]) if kind.eq_ignore_ascii_case("msisdn") => {
            Reply::json(200, json!({"result": true}))
        }
        _ => Reply::json(404, json!({"statusCode": 404, "message": "Resource not found"})),
    }
}

fn not_found() -> Reply {
    Reply::json(404, error("RESOURCE_NOT_FOUND", "Requested resource was not found."))
}

fn status(fake: &Fake, kind: &str, id: &str) -> Reply {
    let state = fake.lock();
    let Some(txn) = state.txns.get(id).filter(|t| t.kind == kind) else { return not_found() };
    // Right after a 202 MTN may not know the id yet: the window is the `not_found_after_create_ms` knob.
    if fake.clock.now_ms() < txn.created_ms.saturating_add(state.knobs.not_found_after_create_ms) {
        return not_found();
    }
    Reply::json(200, render(txn, Variant::Final))
}

/// MTN's amount pattern: `^([0]|([1-9][0-9]{0,17}))([.][0-9]{0,3}[0-9])?$`, as 1/10,000 units.
fn amount_units(raw: &str) -> Option<u128> {
    let (whole, fraction) = match raw.split_once('.') {
        Some((w, f)) => (w, Some(f)),
        None => (raw, None),
    };
    let whole_ok = whole == "0" || (is_digits(whole) && whole.len() <= 18 && !whole.starts_with('0'));
    let fraction_ok = fraction.is_none_or(|f| is_digits(f) && f.len() <= 4);
    if !whole_ok || !fraction_ok {
        return None;
    }
    let mut digits = fraction.unwrap_or("").to_owned();
    while digits.len() < 4 {
        digits.push('0');
    }
    Some(whole.parse::<u128>().ok()? * 10_000 + digits.parse::<u128>().ok()?)
}

/// The body's party (`payer` for requesttopay, `payee` for transfer): (partyIdType, partyId).
fn party(body: &Map<String, Value>, name: &str) -> Result<(String, String), String> {
    let party = body.get(name).and_then(Value::as_object).ok_or(format!("{name} is missing"))?;
    let kind = party.get("partyIdType").and_then(Value::as_str).ok_or(format!("{name}.partyIdType is missing"))?;
    let id = party.get("partyId").and_then(Value::as_str).ok_or(format!("{name}.partyId is missing"))?;
    match kind {
        "MSISDN" if !is_digits(id) => Err(format!("{name}.partyId must be an MSISDN, digits only without '+'")),
        "MSISDN" | "EMAIL" | "PARTY_CODE" => Ok((kind.to_owned(), id.to_owned())),
        _ => Err(format!("{name}.partyIdType must be MSISDN, EMAIL or PARTY_CODE")),
    }
}

/// Checks the body; answers (amount, currency, party type, party id) or why it is a 400.
fn check_body(kind: &str, body: &Map<String, Value>) -> Result<(String, String, String, String), String> {
    let amount = match body.get("amount") {
        Some(Value::String(a)) if amount_units(a).is_some() => a.clone(),
        Some(Value::String(_)) => return Err("amount does not match MTN's amount pattern".into()),
        Some(_) => return Err("amount must be a string".into()),
        None => return Err("amount is missing".into()),
    };
    let currency = body.get("currency").and_then(Value::as_str).filter(|c| !c.is_empty());
    let currency = currency.ok_or("currency is missing")?.to_owned();
    for field in ["payerMessage", "payeeNote", "externalId"] {
        match body.get(field) {
            None | Some(Value::Null) => {}
            Some(Value::String(text)) if field != "externalId" && text.chars().count() > TEXT_MAX => {
                return Err(format!("{field} is longer than {TEXT_MAX} characters"));
            }
            Some(Value::String(text)) if field != "externalId" && text.contains('\'') => {
                return Err(format!("{field} holds an apostrophe"));
            }
            Some(Value::String(_)) => {}
            Some(_) => return Err(format!("{field} must be a string")),
        }
    }
    let (party_type, party_id) = match kind {
        "requesttopay" => party(body, "payer")?,
        "transfer" => party(body, "payee")?,
        _ => {
            let reference = body.get("referenceIdToRefund").and_then(Value::as_str).unwrap_or("");
            if !is_uuid_v4(reference) {
                return Err("referenceIdToRefund must be a UUIDv4".into());
            }
            (String::new(), String::new())
        }
    };
    Ok((amount, currency, party_type, party_id))
}

fn create(fake: &Fake, config: &Config, kind: &'static str, call: &Call) -> Reply {
    let id = match call.header("x-reference-id") {
        Some(id) if is_uuid_v4(id) => id.to_owned(),
        _ => return Reply::empty(400).because("X-Reference-Id must be a UUIDv4"),
    };
    let callback_url = call.header("x-callback-url").map(str::to_owned);
    if callback_url.as_deref().is_some_and(|u| !is_http_url(u)) {
        return Reply::empty(400).because("X-Callback-Url is not an http(s) URL");
    }
    let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(call.body) else {
        return Reply::empty(400).because("the body is not a JSON object");
    };
    let (amount, currency, party_type, party_id) = match check_body(kind, &body) {
        Ok(checked) => checked,
        Err(why) => return Reply::empty(400).because(why),
    };
    if magic::currency_of(&config.target_environment).is_some_and(|c| c != currency) {
        return Reply::json(500, error("INVALID_CURRENCY", "Currency not supported."));
    }
    let now = fake.clock.now_ms();
    let mut state = fake.lock();
    if state.txns.contains(&id) {
        let message = "Duplicated reference id. Creation of resource failed.";
        return Reply::json(409, error("RESOURCE_ALREADY_EXIST", message));
    }
    let (plan, factor, phone, parent) = if kind == "refund" {
        let reference = body.get("referenceIdToRefund").and_then(Value::as_str).unwrap_or("").to_owned();
        let plan = refund_plan(&state.txns, &reference, &amount, &currency);
        let phone = state.txns.get(&reference).map(|t| t.phone.clone()).unwrap_or_default();
        (plan, 1, phone, Some(reference))
    } else {
        let (plan, factor) = magic::plan(&party_type, &party_id, kind == "requesttopay");
        (plan, factor, party_id, None)
    };
    let settle_at_ms = (plan != Plan::Stuck).then(|| now.saturating_add(fake.settle_ms.saturating_mul(factor)));
    let txn = Txn {
        kind,
        id: id.clone(),
        stage: Stage::Created,
        plan,
        amount,
        currency,
        phone,
        route: config.target_environment.clone(),
        reason: None,
        created_ms: now,
        created_at: fake.clock.rfc3339(),
        settle_at_ms,
        callback_url,
        request: Value::Object(body),
        provider_txn_id: None,
        parent,
    };
    tracing::info!(kind, id = %txn.id, plan = ?txn.plan, "created");
    state.txns.insert(txn);
    Reply::empty(202).created()
}

/// What a refund of `reference` for `amount` will do.
fn refund_plan(txns: &crate::common::Store, reference: &str, amount: &str, currency: &str) -> Plan {
    let fail = |reason: &str| Plan::Fail(Some(reason.to_owned()));
    let Some(original) = txns.get(reference).filter(|t| t.kind == "requesttopay") else {
        return fail("RESOURCE_NOT_FOUND");
    };
    if original.stage != Stage::Succeeded {
        return fail("NOT_ALLOWED");
    }
    if original.currency != currency {
        return fail("INVALID_CURRENCY");
    }
    let refunded: u128 = txns
        .iter()
        .filter(|t| t.kind == "refund" && t.parent.as_deref() == Some(reference) && t.stage != Stage::Failed)
        .filter_map(|t| amount_units(&t.amount))
        .sum();
    let left = amount_units(&original.amount).unwrap_or(0).saturating_sub(refunded);
    match amount_units(amount) {
        Some(asked) if asked > 0 && asked <= left => Plan::Succeed,
        _ => fail("NOT_ALLOWED"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amount_pattern() {
        assert_eq!(amount_units("100"), Some(1_000_000));
        assert_eq!(amount_units("0"), Some(0));
        assert_eq!(amount_units("12.5"), Some(125_000));
        assert_eq!(amount_units("12.3456"), Some(123_456));
        for bad in ["", "012", "1.", "1.23456", "-1", "1e3", "1 000", "1234567890123456789"] {
            assert_eq!(amount_units(bad), None, "{bad}");
        }
    }
}
