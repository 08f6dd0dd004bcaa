//! `POST /v1/paiement/initier`, `GET /v1/paiement/{reference}`, `POST /v1/paiement/{reference}/rembourser`
//! (docs/api.md § Payments, Refunds).
//!
//! A request body is first parsed into a plain struct (types and unknown fields checked by serde), then
//! turned into the engine's checked types one field at a time, so an error names the field at fault.

use std::collections::BTreeMap;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use caisse_engine::domain::money::{Amount, Currency};
use caisse_engine::domain::phone::Phone;
use caisse_engine::domain::text::{Description, Email, Metadata, Motif, Name, Reference};
use caisse_engine::{Command, NewPayment};
use serde::Deserialize;

use super::error::{ApiError, ErrorBody};
use super::extract::{authenticate, idempotency, parse_json, read_body, respond};
use super::AppState;
use crate::config::Operation;
use crate::providers::Provider;
use caisse_engine::domain::records::Payment;

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct InitiateBody {
    montant: i64,
    devise: String,
    fournisseur: String,
    client_telephone: String,
    client_email: Option<String>,
    client_nom: Option<String>,
    description: Option<String>,
    metadata: Option<BTreeMap<String, String>>,
    reference: Option<String>,
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RefundBody {
    montant: Option<i64>,
    motif: Option<String>,
}

/// Parses an optional text field with its checked constructor, naming the field on error.
pub(super) fn optional<T, E: std::fmt::Display>(
    field: &str,
    value: Option<String>,
    parse: impl Fn(&str) -> Result<T, E>,
) -> Result<Option<T>, ApiError> {
    value.map(|v| parse(&v).map_err(|e| ApiError::invalid(field, e.to_string()))).transpose()
}

pub(super) fn metadata(value: Option<BTreeMap<String, String>>) -> Result<Metadata, ApiError> {
    match value {
        None => Ok(Metadata::empty()),
        Some(map) => Metadata::new(map).map_err(|e| ApiError::invalid("metadata", e.to_string())),
    }
}

/// The provider for an operation in a currency, with the amount checked against its bounds.
pub(super) fn provider_for<'a>(
    state: &'a AppState,
    fournisseur: &str,
    devise: &str,
    montant: i64,
    operation: Operation,
) -> Result<(&'a Provider, Currency, Amount), ApiError> {
    let devise = Currency::parse(devise).map_err(|e| {
        ApiError::new(StatusCode::BAD_REQUEST, "unsupported_currency", e.to_string()).with_field("devise")
    })?;
    let unsupported = |message: String| {
        ApiError::new(StatusCode::BAD_REQUEST, "unsupported_provider", message).with_field("fournisseur")
    };
    let provider =
        state.providers.get(fournisseur).ok_or_else(|| unsupported(format!("unknown provider `{fournisseur}`")))?;
    if !provider.active() {
        return Err(unsupported(format!("`{fournisseur}` is not active on this server")));
    }
    if !provider.settings.operations.contains(&operation) {
        return Err(unsupported(format!("`{fournisseur}` does not offer {operation:?}").to_lowercase()));
    }
    if !provider.supports(operation, devise) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "unsupported_currency",
            format!("`{fournisseur}` does not work in {devise}"),
        )
        .with_field("devise"));
    }
    let montant = Amount::positive(montant).map_err(|e| ApiError::invalid("montant", e.to_string()))?;
    if let Some((min, max)) = provider.bounds(devise) {
        if montant < min || montant > max {
            return Err(ApiError::invalid(
                "montant",
                format!("{fournisseur} accepts {min} to {max} {devise} (in the smallest unit)"),
            ));
        }
    }
    Ok((provider, devise, montant))
}

/// Initiate a payment.
#[utoipa::path(post, path = "/v1/paiement/initier", tag = "paiement", request_body = InitiateBody,
    params(("Idempotency-Key" = Option<String>, Header, description = "1-255 printable ASCII; replays the first answer for 24 h")),
    responses((status = 201, description = "Payment created", body = Payment), (status = 400, description = "Invalid input", body = ErrorBody), (status = 401, description = "Missing, unknown or wrong-environment key", body = ErrorBody), (status = 429, description = "Rate limited", body = ErrorBody), (status = 503, description = "Storage unavailable", body = ErrorBody),
        (status = 409, description = "duplicate_reference, idempotency conflicts", body = ErrorBody),
        (status = 413, description = "Body over 64 KiB", body = ErrorBody), (status = 415, description = "Not JSON", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn initiate(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let merchant = authenticate(&state, req.headers())?;
    let body = read_body(&req, payload).await?;
    let b: InitiateBody = parse_json(&req, &body, false)?;
    let idem = idempotency(&req, &body, StatusCode::CREATED)?;
    let (provider, devise, montant) = provider_for(&state, &b.fournisseur, &b.devise, b.montant, Operation::Paiement)?;
    let new = NewPayment {
        reference: optional("reference", b.reference, Reference::parse)?,
        montant,
        devise,
        fournisseur: provider.settings.code.clone(),
        fee: provider.settings.frais,
        client_telephone: Phone::parse(&b.client_telephone)
            .map_err(|e| ApiError::invalid("client_telephone", e.to_string()))?,
        client_email: optional("client_email", b.client_email, Email::parse)?,
        client_nom: optional("client_nom", b.client_nom, Name::parse)?,
        description: optional("description", b.description, Description::parse)?,
        metadata: metadata(b.metadata)?,
    };
    let executed = state.flow.initiate_payment(&merchant.id, new, idem).await?;
    respond(executed, StatusCode::CREATED)
}

/// A reference that cannot exist is simply not found.
fn reference(path: &str) -> Result<Reference, ApiError> {
    Reference::parse(path).map_err(|_| ApiError::not_found("payment"))
}

/// Retrieve a payment.
#[utoipa::path(get, path = "/v1/paiement/{reference}", tag = "paiement",
    params(("reference" = String, Path, description = "Payment reference")),
    responses((status = 200, description = "The payment", body = Payment), (status = 400, description = "Invalid input", body = ErrorBody), (status = 401, description = "Missing, unknown or wrong-environment key", body = ErrorBody), (status = 429, description = "Rate limited", body = ErrorBody), (status = 503, description = "Storage unavailable", body = ErrorBody),
        (status = 404, description = "Unknown reference", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let merchant = authenticate(&state, req.headers())?;
    let reference = reference(&path)?;
    match state.engine.payment(&merchant.id, reference.as_str()).await? {
        Some(payment) => Ok(HttpResponse::Ok().json(payment)),
        None => Err(ApiError::not_found("payment")),
    }
}

/// Refund a payment, wholly or in part.
#[utoipa::path(post, path = "/v1/paiement/{reference}/rembourser", tag = "paiement", request_body(content = Option<RefundBody>),
    params(("reference" = String, Path, description = "Payment reference"), ("Idempotency-Key" = Option<String>, Header, description = "1-255 printable ASCII; replays the first answer for 24 h")),
    responses((status = 200, description = "The payment with its refund", body = Payment), (status = 400, description = "Invalid input", body = ErrorBody), (status = 401, description = "Missing, unknown or wrong-environment key", body = ErrorBody), (status = 429, description = "Rate limited", body = ErrorBody), (status = 503, description = "Storage unavailable", body = ErrorBody),
        (status = 404, description = "Unknown reference", body = ErrorBody),
        (status = 409, description = "invalid_state, insufficient_balance, idempotency conflicts", body = ErrorBody),
        (status = 413, description = "Body over 64 KiB", body = ErrorBody), (status = 415, description = "Not JSON", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn refund(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let merchant = authenticate(&state, req.headers())?;
    let body = read_body(&req, payload).await?;
    let b: RefundBody = parse_json(&req, &body, true)?;
    let idem = idempotency(&req, &body, StatusCode::OK)?;
    let reference = reference(&path)?;
    let montant =
        b.montant.map(|m| Amount::positive(m).map_err(|e| ApiError::invalid("montant", e.to_string()))).transpose()?;
    let motif = optional("motif", b.motif, Motif::parse)?;
    let command = Command::RequestRefund { reference, montant, motif };
    let executed = state.flow.request_refund(&merchant.id, command, idem).await?;
    respond(executed, StatusCode::OK)
}
