//! `POST /v1/paiement/initier`, `GET /v1/paiement/{reference}`, `POST /v1/paiement/{reference}/rembourser`
//! (docs/api.md § Payments, Refunds).
//!
//! A request body is first parsed into a plain struct (types and unknown fields checked by serde), then
//! turned into the engine's checked types one field at a time, so an error names the field at fault.

use std::collections::BTreeMap;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use caisse_engine::domain::links::LINK_METADATA_KEY;
use caisse_engine::domain::money::{Amount, Currency};
use caisse_engine::domain::phone::Phone;
use caisse_engine::domain::provider::{AdapterName, ProviderRoute, ReturnUrl};
use caisse_engine::domain::text::{Description, Email, Metadata, Name, Reason, Reference};
use caisse_engine::{Command, Executed, NewPayment};
use serde::Deserialize;

use super::error::{ApiError, ErrorBody};
use super::extract::{authenticate, idempotency, parse_json, read_body, respond, unless_answered};
use super::AppState;
use crate::config::{Environment, Operation};
use crate::providers::{Provider, Routed};
use caisse_engine::domain::records::Payment;

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct InitiateBody {
    #[serde(rename = "montant")]
    amount: i64,
    #[serde(rename = "devise")]
    currency: String,
    #[serde(rename = "fournisseur")]
    provider: String,
    #[serde(rename = "client_telephone")]
    customer_phone: String,
    #[serde(rename = "client_email")]
    customer_email: Option<String>,
    #[serde(rename = "client_nom")]
    customer_name: Option<String>,
    description: Option<String>,
    metadata: Option<BTreeMap<String, String>>,
    reference: Option<String>,
    /// Where a provider that needs the customer's browser sends it afterwards (https in production).
    #[serde(rename = "url_retour")]
    return_url: Option<String>,
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RefundBody {
    #[serde(rename = "montant")]
    amount: Option<i64>,
    #[serde(rename = "motif")]
    reason: Option<String>,
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

/// What a new transaction asks of its route: an operation on an amount.
pub(crate) struct Ask {
    pub operation: Operation,
    pub currency: Currency,
    pub amount: Amount,
}

/// Checks that the fournisseur has an active route for the phone's country, that the route's adapter carries
/// this fournisseur there, and that the provider's own limits take the amount; `field` names the phone in the
/// error. Answers the route, which the new transaction keeps.
pub(crate) fn check_route(
    provider: &Provider,
    phone: &Phone,
    field: &str,
    ask: &Ask,
) -> Result<ProviderRoute, ApiError> {
    let code = provider.settings.code.as_str();
    let unsupported = |message: String| {
        ApiError::new(StatusCode::BAD_REQUEST, "unsupported_provider", message).with_field(field.to_owned())
    };
    let country = phone.country();
    match provider.route(country) {
        Routed::Active { adapter, adapter_name } if adapter.serves(code, phone) => {
            tracing::debug!(provider = code, adapter = %adapter_name, "routed");
            adapter
                .check_amount(code, phone, ask.operation, ask.currency, ask.amount)
                .map_err(|why| ApiError::invalid("montant", why))?;
            let adapter = AdapterName::parse(&adapter_name).map_err(|e| ApiError::internal("route", e))?;
            Ok(ProviderRoute { adapter, return_url: None })
        }
        Routed::Active { adapter_name, .. } => Err(unsupported(format!(
            "`{code}` is not offered for {} numbers on this server ({adapter_name} does not carry it there); {}",
            country.unwrap_or("these"),
            serves(provider, country)
        ))),
        Routed::Inactive { .. } => Err(unsupported(format!(
            "`{code}` is not active for {} numbers on this server; {}",
            country.unwrap_or("these"),
            serves(provider, country)
        ))),
        Routed::Unserved => Err(unsupported(format!(
            "`{code}` does not serve {} numbers; {}",
            country.unwrap_or("these"),
            serves(provider, country)
        ))),
    }
}

/// The countries a provider takes numbers of here, as a refusal of a number of `refused` names them: that one
/// left out (a route to it may be active for other numbers, or other operations).
fn serves(provider: &Provider, refused: Option<&str>) -> String {
    let served: Vec<String> = provider.active_countries().into_iter().filter(|c| Some(c.as_str()) != refused).collect();
    match served.is_empty() {
        true => "it serves no other country on this server".to_owned(),
        false => format!("it serves {}", served.join(", ")),
    }
}

/// A card payment needs the holder's name and e-mail: card networks and CinetPay's checkout ask for them.
pub(crate) fn card_holder(provider: &Provider, email: Option<&Email>, name: Option<&Name>) -> Result<(), ApiError> {
    if provider.settings.code.as_str() != "carte" {
        return Ok(());
    }
    if name.is_none() {
        return Err(ApiError::invalid("client_nom", "a card payment needs the card holder's name (client_nom)"));
    }
    if email.is_none() {
        return Err(ApiError::invalid("client_email", "a card payment needs the card holder's e-mail (client_email)"));
    }
    Ok(())
}

/// The provider for an operation in a currency, with the amount checked against its bounds.
pub(crate) fn provider_for<'a>(
    state: &'a AppState,
    code: &str,
    currency: &str,
    amount: i64,
    operation: Operation,
) -> Result<(&'a Provider, Currency, Amount), ApiError> {
    let currency = Currency::parse(currency).map_err(|e| {
        ApiError::new(StatusCode::BAD_REQUEST, "unsupported_currency", e.to_string()).with_field("devise")
    })?;
    let unsupported = |message: String| {
        ApiError::new(StatusCode::BAD_REQUEST, "unsupported_provider", message).with_field("fournisseur")
    };
    let provider = state.providers.get(code).ok_or_else(|| unsupported(format!("unknown provider `{code}`")))?;
    if !provider.active() {
        return Err(unsupported(format!("`{code}` is not active on this server")));
    }
    if !provider.settings.operations.contains(&operation) {
        return Err(unsupported(format!("`{code}` does not offer `{}`", operation.as_str())));
    }
    if !provider.supports(operation, currency) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "unsupported_currency",
            format!("`{code}` does not work in {currency}"),
        )
        .with_field("devise"));
    }
    let amount = Amount::positive(amount).map_err(|e| ApiError::invalid("montant", e.to_string()))?;
    if let Some((min, max)) = provider.bounds(currency) {
        if amount < min || amount > max {
            return Err(ApiError::invalid(
                "montant",
                format!("{code} accepts {min} to {max} {currency} (in the smallest unit)"),
            ));
        }
    }
    Ok((provider, currency, amount))
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
    let (new, route) = match checked_payment(&state, b) {
        Ok(checked) => checked,
        Err(refused) => match unless_answered(&state, &merchant.id, idem.as_ref(), refused)? {
            Executed::Replayed { status, body } => return replay_with_page(&state, &merchant.id, status, body).await,
            executed => return respond(executed, StatusCode::CREATED),
        },
    };
    let executed = state.flow.initiate_payment(&merchant.id, new, Some(route), idem).await?;
    match executed {
        Executed::Replayed { status, body } => replay_with_page(&state, &merchant.id, status, body).await,
        executed => respond(executed, StatusCode::CREATED),
    }
}

/// Checks a payment request by the API's rules (provider, currency, bounds, the payer's country, every field),
/// into the payment and the route it takes.
fn checked_payment(state: &AppState, b: InitiateBody) -> Result<(NewPayment, ProviderRoute), ApiError> {
    if b.metadata.as_ref().is_some_and(|m| m.contains_key(LINK_METADATA_KEY)) {
        return Err(ApiError::invalid(
            "metadata",
            format!("`{LINK_METADATA_KEY}` is set by Caisse on payments made through a payment link"),
        ));
    }
    let (provider, currency, amount) = provider_for(state, &b.provider, &b.currency, b.amount, Operation::Payment)?;
    let production = state.settings.environment == Environment::Production;
    let return_url = optional("url_retour", b.return_url, |text| ReturnUrl::parse(text, production))?;
    let phone =
        Phone::parse_written(&b.customer_phone).map_err(|e| ApiError::invalid("client_telephone", e.to_string()))?;
    let ask = Ask { operation: Operation::Payment, currency, amount };
    let route = ProviderRoute { return_url, ..check_route(provider, &phone, "client_telephone", &ask)? };
    let customer_email = optional("client_email", b.customer_email, Email::parse)?;
    let customer_name = optional("client_nom", b.customer_name, Name::parse)?;
    card_holder(provider, customer_email.as_ref(), customer_name.as_ref())?;
    let new = NewPayment {
        reference: optional("reference", b.reference, Reference::parse)?,
        amount,
        currency,
        provider: provider.settings.code.clone(),
        fee: provider.settings.fee,
        customer_phone: phone,
        customer_email,
        customer_name,
        description: optional("description", b.description, Description::parse)?,
        metadata: metadata(b.metadata)?,
        link: None,
    };
    Ok((new, route))
}

/// A replayed initiation: the stored answer, which is what the request answered. A payment whose page was kept
/// only after its request answered (the keeping failed, and a later status query kept it), or stored by an
/// earlier release (which kept the answer as first written), has no page in it; a replay of a payment that has
/// one now answers the payment as it is now (same status code, `Idempotent-Replayed`).
async fn replay_with_page(
    state: &AppState,
    merchant: &caisse_engine::domain::ids::MerchantId,
    status: u16,
    body: String,
) -> Result<HttpResponse, ApiError> {
    let stored: Option<Payment> = serde_json::from_str(&body).ok();
    let now = match stored.as_ref().filter(|p| p.payment_url.is_none()) {
        Some(p) => state.engine.payment(merchant, p.reference.as_str()).await?.filter(|now| now.payment_url.is_some()),
        None => None,
    };
    let body = match now {
        Some(now) => serde_json::to_string(&now).map_err(|e| ApiError::internal("replayed payment", e))?,
        None => body,
    };
    respond(Executed::Replayed { status, body }, StatusCode::CREATED)
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
    read(&state, &req, &path).await
}

/// `GET /v1/paiement/initier`: the payment whose reference is `initier`, a reference like any other, whose path
/// is also initiation's (by `POST`).
pub async fn get_initier(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    read(&state, &req, "initier").await
}

async fn read(state: &AppState, req: &HttpRequest, given: &str) -> Result<HttpResponse, ApiError> {
    let merchant = authenticate(state, req.headers())?;
    let reference = reference(given)?;
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
    let checked = async {
        let reference = reference(&path)?;
        let amount = b
            .amount
            .map(|m| Amount::positive(m).map_err(|e| ApiError::invalid("montant", e.to_string())))
            .transpose()?;
        let reason = optional("motif", b.reason, Reason::parse)?;
        if !state.flow.refund_possible(&merchant.id, reference.as_str(), amount).await? {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "unsupported_provider",
                "this payment's provider cannot send money back here: it has no refund API and no payout route to the \
                 payer",
            ));
        }
        Ok(Command::RequestRefund { reference, amount, reason })
    };
    let command = match checked.await {
        Ok(command) => command,
        Err(refused) => return respond(unless_answered(&state, &merchant.id, idem.as_ref(), refused)?, StatusCode::OK),
    };
    let executed = state.flow.request_refund(&merchant.id, command, idem).await?;
    respond(executed, StatusCode::OK)
}
