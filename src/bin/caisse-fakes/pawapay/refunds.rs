//! `POST /v2/refunds`: partial refunds of a completed deposit.
//!
//! pawaPay allows several refunds of one deposit, one in progress at a time, up to the deposit's amount. The
//! checks and the insertion happen under one lock, so two refunds sent at once cannot both pass them.
//! Rejections: `DEPOSIT_NOT_FOUND`, `DEPOSIT_NOT_COMPLETED` (names of the fake's own: pawaPay's are
//! unverified), `REFUND_IN_PROGRESS`, `DEPOSIT_ALREADY_REFUNDED`, `INVALID_CURRENCY`, `INVALID_AMOUNT`,
//! `AMOUNT_TOO_LARGE`.

use serde_json::{json, Map, Value};

use super::create::{answer, bad, common_optional, id_of, new_txn, object, rejected, required, text, Checked};
use crate::common::{is_uuid_v4, Plan, Stage};
use crate::server::{Fake, Reply};

const REFUND_FIELDS: &[&str] = &["refundId", "depositId", "amount", "currency", "metadata"];

pub fn refund(fake: &Fake, body: &[u8]) -> Reply {
    answer(object(body, "refundId").and_then(|map| refund_checked(fake, map)))
}

fn refund_checked(fake: &Fake, map: Map<String, Value>) -> Checked<Reply> {
    let field = "refundId";
    let id = id_of(&map, field, REFUND_FIELDS)?.to_owned();
    let deposit_id = required(&map, "depositId", field, &id)?.to_owned();
    if !is_uuid_v4(&deposit_id) {
        return Err(bad(field, Some(&id), "INVALID_PARAMETER", "Parameter 'depositId' must be a UUIDv4.".into()));
    }
    let asked = text(&map, "amount", field, &id)?.map(str::to_owned);
    let currency = text(&map, "currency", field, &id)?.map(str::to_owned);
    common_optional(&map, field, &id)?;
    let mut state = fake.lock();
    if state.txns.contains(&id) {
        return Ok(Reply::json(200, json!({field: id, "status": "DUPLICATE_IGNORED"})));
    }
    let Some(deposit) = state.txns.get(&deposit_id).filter(|t| t.kind == "deposit").cloned() else {
        return Err(rejected(field, &id, "DEPOSIT_NOT_FOUND", "The deposit to refund was not found."));
    };
    if deposit.stage != Stage::Succeeded {
        return Err(rejected(field, &id, "DEPOSIT_NOT_COMPLETED", "Only a completed deposit can be refunded."));
    }
    let siblings = || state.txns.iter().filter(|t| t.kind == "refund" && t.parent.as_deref() == Some(&deposit_id));
    if siblings().any(|t| !t.stage.is_final()) {
        return Err(rejected(field, &id, "REFUND_IN_PROGRESS", "Another refund of this deposit is in progress."));
    }
    let refunded: u64 =
        siblings().filter(|t| t.stage == Stage::Succeeded).filter_map(|t| t.amount.parse::<u64>().ok()).sum();
    let remaining = deposit.amount.parse::<u64>().unwrap_or(0).saturating_sub(refunded);
    if remaining == 0 {
        return Err(rejected(field, &id, "DEPOSIT_ALREADY_REFUNDED", "The deposit has already been fully refunded."));
    }
    if currency.as_ref().is_some_and(|c| *c != deposit.currency) {
        return Err(rejected(field, &id, "INVALID_CURRENCY", "The currency is not the deposit's."));
    }
    let value = match asked {
        None => remaining,
        Some(raw) => {
            // The limits of a refund are the deposit's remainder, not the provider's minimum.
            let valid = raw.bytes().all(|b| b.is_ascii_digit()) && !raw.is_empty() && raw.len() <= 18;
            match raw.parse::<u64>() {
                Ok(v) if valid && v > 0 => v,
                _ => return Err(rejected(field, &id, "INVALID_AMOUNT", "The amount is not valid for this provider.")),
            }
        }
    };
    if value > remaining {
        return Err(rejected(field, &id, "AMOUNT_TOO_LARGE", "The amount is larger than what is left to refund."));
    }
    // Stored under the same lock as the checks, so two refunds of one deposit cannot both pass them.
    let mut txn = new_txn(fake, "refund", &id, map, Plan::Succeed);
    txn.amount = value.to_string();
    txn.currency = deposit.currency;
    txn.phone = deposit.phone;
    txn.route = deposit.route;
    txn.parent = Some(deposit_id);
    let accepted = json!({field: id, "status": "ACCEPTED", "created": txn.created_at});
    tracing::info!(id = %txn.id, amount = %txn.amount, "refund created");
    state.txns.insert(txn);
    Ok(Reply::json(200, accepted).created())
}
