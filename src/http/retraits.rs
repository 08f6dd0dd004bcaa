//! `POST /v1/retraits`, `GET /v1/retraits`, `GET /v1/retraits/{id}` (docs/api.md § Payouts, Lists).

use std::collections::BTreeMap;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use caisse_engine::core::Record;
use caisse_engine::domain::ids::{validate_id, IdKind};
use caisse_engine::domain::money::Currency;
use caisse_engine::domain::phone::Phone;
use caisse_engine::domain::provider::ProviderRoute;
use caisse_engine::domain::status::PayoutStatus;
use caisse_engine::domain::text::{Description, Name, Reference};
use caisse_engine::store::Located;
use caisse_engine::NewPayout;
use serde::Deserialize;

use super::error::{ApiError, ErrorBody};
use super::extract::{authenticate, idempotency, parse_json, parse_query, read_body, respond, unless_answered};
use super::paiement::{check_route, metadata, optional, provider_for, Ask};
use super::transactions::{page_params, Listed};
use super::AppState;
use crate::config::Operation;
use caisse_engine::domain::records::Payout;

/// A payout as a merchant asks for it: the API's JSON body, or the dashboard's form.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateBody {
    #[serde(rename = "montant")]
    pub amount: i64,
    #[serde(rename = "devise")]
    pub currency: String,
    #[serde(rename = "fournisseur")]
    pub provider: String,
    #[serde(rename = "beneficiaire_telephone")]
    pub beneficiary_phone: String,
    #[serde(rename = "beneficiaire_nom")]
    pub beneficiary_name: Option<String>,
    pub description: Option<String>,
    pub metadata: Option<BTreeMap<String, String>>,
    /// The merchant's own reference: 1-64 of `[A-Za-z0-9_-]`, unique among its payments, refunds and payouts.
    pub reference: Option<String>,
}

/// Create a payout.
#[utoipa::path(post, path = "/v1/retraits", tag = "retraits", request_body = CreateBody,
    params(("Idempotency-Key" = Option<String>, Header, description = "1-255 printable ASCII; replays the first answer for 24 h")),
    responses((status = 201, description = "Payout created", body = Payout), (status = 400, description = "Invalid input", body = ErrorBody), (status = 401, description = "Missing, unknown or wrong-environment key", body = ErrorBody), (status = 429, description = "Rate limited", body = ErrorBody), (status = 503, description = "Storage unavailable", body = ErrorBody),
        (status = 409, description = "insufficient_balance, duplicate_reference, idempotency conflicts", body = ErrorBody),
        (status = 413, description = "Body over 64 KiB", body = ErrorBody), (status = 415, description = "Not JSON", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let merchant = authenticate(&state, req.headers())?;
    let body = read_body(&req, payload).await?;
    let b: CreateBody = parse_json(&req, &body, false)?;
    let idem = idempotency(&req, &body, StatusCode::CREATED)?;
    let (new, route) = match checked_payout(&state, b) {
        Ok(checked) => checked,
        Err(refused) => {
            return respond(unless_answered(&state, &merchant.id, idem.as_ref(), refused)?, StatusCode::CREATED)
        }
    };
    let executed = state.flow.create_payout(&merchant.id, new, Some(route), idem).await?;
    respond(executed, StatusCode::CREATED)
}

/// Checks a payout request by the API's rules (provider, currency, bounds, the beneficiary's country, every
/// field), into the payout and the route it takes. The dashboard's payout form goes through it too, so the
/// two refuse the same things with the same messages.
pub fn checked_payout(state: &AppState, b: CreateBody) -> Result<(NewPayout, ProviderRoute), ApiError> {
    let (provider, currency, amount) = provider_for(state, &b.provider, &b.currency, b.amount, Operation::Payout)?;
    let phone = Phone::parse_written(&b.beneficiary_phone)
        .map_err(|e| ApiError::invalid("beneficiaire_telephone", e.to_string()))?;
    let ask = Ask { operation: Operation::Payout, currency, amount };
    let route = check_route(provider, &phone, "beneficiaire_telephone", &ask)?;
    let new = NewPayout {
        reference: optional("reference", b.reference, Reference::parse)?,
        amount,
        currency,
        provider: provider.settings.code.clone(),
        fee: provider.settings.fee,
        beneficiary_phone: phone,
        beneficiary_name: optional("beneficiaire_nom", b.beneficiary_name, Name::parse)?,
        description: optional("description", b.description, Description::parse)?,
        metadata: metadata(b.metadata)?,
    };
    Ok((new, route))
}

/// List payouts, newest first.
#[utoipa::path(get, path = "/v1/retraits", tag = "retraits",
    params(("limit" = Option<u32>, Query, description = "1-100, default 20"),
        ("starting_after" = Option<String>, Query, description = "next_cursor of the previous page"),
        ("statut" = Option<PayoutStatus>, Query), ("devise" = Option<String>, Query)),
    responses((status = 200, description = "A page of payouts", body = Listed<Payout>), (status = 400, description = "Invalid input", body = ErrorBody), (status = 401, description = "Missing, unknown or wrong-environment key", body = ErrorBody), (status = 429, description = "Rate limited", body = ErrorBody), (status = 503, description = "Storage unavailable", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let merchant = authenticate(&state, req.headers())?;
    let query = parse_query(&req, &["limit", "starting_after", "statut", "devise"])?;
    let (limit, cursor) = page_params(&query, IdKind::Payout)?;
    let status = query
        .get("statut")
        .map(|s| PayoutStatus::parse(s).ok_or_else(|| ApiError::invalid("statut", "one of en_attente, traite, rejete")))
        .transpose()?;
    let currency = query
        .get("devise")
        .map(|d| Currency::parse(d).map_err(|e| ApiError::invalid("devise", e.to_string())))
        .transpose()?;
    // One more than the page, so `has_more` means another matching payout exists.
    let page = state.engine.payouts(&merchant.id, cursor.as_deref(), limit + 1, &mut |o| {
        status.is_none_or(|s| o.status == s) && currency.is_none_or(|d| o.currency == d)
    })?;
    Ok(HttpResponse::Ok().json(Listed::one_more(page, limit, |o: &Payout| o.id.clone())))
}

/// Retrieve a payout.
#[utoipa::path(get, path = "/v1/retraits/{id}", tag = "retraits",
    params(("id" = String, Path, description = "Payout id (ret_...) or the merchant's reference")),
    responses((status = 200, description = "The payout", body = Payout), (status = 400, description = "Invalid input", body = ErrorBody), (status = 401, description = "Missing, unknown or wrong-environment key", body = ErrorBody), (status = 429, description = "Rate limited", body = ErrorBody), (status = 503, description = "Storage unavailable", body = ErrorBody),
        (status = 404, description = "Unknown id", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let merchant = authenticate(&state, req.headers())?;
    let by_id =
        if validate_id(IdKind::Payout, &path).is_ok() { state.engine.payout(&merchant.id, &path).await? } else { None };
    // Else the merchant's own reference (which may even look like a payout id).
    let found = if by_id.is_some() {
        by_id
    } else if Reference::parse(&path).is_ok() {
        // The merchant's own reference, when it names a payout (and not a payment or a refund).
        match state.engine.locate(&merchant.id, &path)? {
            Some(Located { record: Record::Payout(payout), .. }) => Some(payout),
            _ => None,
        }
    } else {
        None
    };
    found.map(|payout| HttpResponse::Ok().json(payout)).ok_or_else(|| ApiError::not_found("payout"))
}
