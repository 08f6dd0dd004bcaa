//! `POST /v1/liens`, `GET /v1/liens`, `GET /v1/liens/{id}`, `POST /v1/liens/{id}/desactiver`
//! (docs/api.md § Payment links).
//!
//! A link is checked here by the rules a payment is that need no phone number (provider, currency, the
//! provider's bounds for the amount); what depends on the customer's number (the country's routes, an adapter's
//! own rules) is checked when the customer submits the payment page.

use std::collections::BTreeMap;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use caisse_engine::domain::ids::{validate_id, IdKind};
use caisse_engine::domain::links::{Link, LinkUsage, LINK_METADATA_KEY};
use caisse_engine::domain::provider::ReturnUrl;
use caisse_engine::domain::records::ProviderCode;
use caisse_engine::domain::status::LinkStatus;
use caisse_engine::domain::text::{Description, Metadata, Reference};
use caisse_engine::domain::time::Timestamp;
use caisse_engine::{Command, NewLink};
use serde::Deserialize;

use super::error::{ApiError, ErrorBody};
use super::extract::{authenticate, idempotency, parse_json, parse_query, read_body, respond, unless_answered};
use super::paiement::{metadata, optional, provider_for};
use super::transactions::{page_params, Listed};
use super::AppState;
use crate::config::{Environment, Operation};

/// Most fournisseurs one link names: more than any server configures, a bound on the record.
const MAX_LINK_PROVIDERS: usize = 20;

/// A link as a merchant asks for it: the API's JSON body, or the dashboard's form.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateBody {
    #[serde(rename = "montant")]
    pub amount: i64,
    #[serde(rename = "devise")]
    pub currency: String,
    pub description: String,
    /// Fournisseur codes; default: every fournisseur active for the devise that takes the amount.
    #[serde(rename = "fournisseurs")]
    pub providers: Option<Vec<String>>,
    pub reference: Option<String>,
    /// `unique` (default) or `multiple`.
    pub usage: Option<String>,
    /// RFC 3339, in the future.
    pub expire_at: Option<String>,
    #[serde(rename = "url_retour")]
    pub return_url: Option<String>,
    pub metadata: Option<BTreeMap<String, String>>,
}

/// Deactivating takes no fields: an empty body or `{}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoFields {}

/// The base of every link's URL, `{public_url}/payer/`, or why links are off on this server.
pub fn page_base(state: &AppState) -> Result<&str, ApiError> {
    state.links_base.as_deref().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "payment links are off on this server: its public_url (CAISSE_PUBLIC_URL) must be an https URL",
        )
    })
}

/// Checks a link request by the API's rules into the link to create. The dashboard's form goes through it too.
pub fn checked_link(state: &AppState, b: CreateBody) -> Result<NewLink, ApiError> {
    let page_base = page_base(state)?.to_owned();
    let description =
        Description::parse(&b.description).map_err(|e| ApiError::invalid("description", e.to_string()))?;
    let codes: Vec<String> = match b.providers {
        Some(codes) if codes.is_empty() => {
            return Err(ApiError::invalid("fournisseurs", "name at least one fournisseur, or leave the field out"))
        }
        Some(codes) if codes.len() > MAX_LINK_PROVIDERS => {
            return Err(ApiError::invalid("fournisseurs", format!("at most {MAX_LINK_PROVIDERS} fournisseurs")))
        }
        Some(codes) => codes,
        None => state
            .providers
            .all()
            .filter(|p| {
                provider_for(state, p.settings.code.as_str(), &b.currency, b.amount, Operation::Payment)
                    .is_ok_and(|(p, currency, amount)| p.takes_anyone(currency, amount).is_ok())
            })
            .map(|p| p.settings.code.as_str().to_owned())
            .collect(),
    };
    let mut providers: Vec<ProviderCode> = Vec::with_capacity(codes.len());
    let mut checked = None;
    for code in &codes {
        let (provider, currency, amount) = provider_for(state, code, &b.currency, b.amount, Operation::Payment)
            .map_err(|e| match e.field.as_deref() {
                Some("fournisseur") => e.with_field("fournisseurs"),
                _ => e,
            })?;
        // A link nobody can pay would be printed, shared, and fail every customer.
        provider.takes_anyone(currency, amount).map_err(|why| ApiError::invalid("montant", why))?;
        if !providers.contains(&provider.settings.code) {
            providers.push(provider.settings.code.clone());
        }
        checked = Some((currency, amount));
    }
    // No fournisseur named or found: the currency and amount are still checked, and then why none takes them.
    let (currency, amount) = match checked {
        Some(checked) => checked,
        None => {
            let currency = caisse_engine::domain::money::Currency::parse(&b.currency).map_err(|e| {
                ApiError::new(StatusCode::BAD_REQUEST, "unsupported_currency", e.to_string()).with_field("devise")
            })?;
            caisse_engine::domain::money::Amount::positive(b.amount)
                .map_err(|e| ApiError::invalid("montant", e.to_string()))?;
            // The currency is offered, only not for this amount: the amount is what to change.
            if state.providers.all().any(|p| p.supports(Operation::Payment, currency)) {
                return Err(ApiError::invalid(
                    "montant",
                    format!("no fournisseur of this server takes payments of this amount in {currency}"),
                ));
            }
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "unsupported_currency",
                format!("no fournisseur of this server takes payments of this amount in {currency}"),
            )
            .with_field("devise"));
        }
    };
    let usage = match b.usage.as_deref() {
        None => LinkUsage::Once,
        Some(text) => LinkUsage::parse(text).ok_or_else(|| ApiError::invalid("usage", "unique or multiple"))?,
    };
    let expires_at = optional("expire_at", b.expire_at, Timestamp::parse_rfc3339)?;
    if expires_at.is_some_and(|at| at <= Timestamp::now()) {
        return Err(ApiError::invalid("expire_at", "must be in the future"));
    }
    let production = state.settings.environment == Environment::Production;
    let return_url = optional("url_retour", b.return_url, |text| ReturnUrl::parse(text, production))?;
    let metadata = link_metadata(b.metadata)?;
    Ok(NewLink {
        reference: optional("reference", b.reference, Reference::parse)?,
        amount,
        currency,
        description,
        providers,
        usage,
        expires_at,
        return_url,
        metadata,
        page_base,
    })
}

/// A link's metadata goes on each of its payments beside `lien_id`, so it must leave that key free and room
/// for it.
fn link_metadata(map: Option<BTreeMap<String, String>>) -> Result<Metadata, ApiError> {
    if map.as_ref().is_some_and(|m| m.contains_key(LINK_METADATA_KEY)) {
        return Err(ApiError::invalid("metadata", format!("`{LINK_METADATA_KEY}` is set by Caisse on each payment")));
    }
    if map.as_ref().is_some_and(|m| m.len() >= Metadata::MAX_KEYS) {
        return Err(ApiError::invalid(
            "metadata",
            format!("at most {} keys, leaving room for `{LINK_METADATA_KEY}`", Metadata::MAX_KEYS - 1),
        ));
    }
    metadata(map)
}

/// Create a payment link.
#[utoipa::path(post, path = "/v1/liens", tag = "liens", request_body = CreateBody,
    params(("Idempotency-Key" = Option<String>, Header, description = "1-255 printable ASCII; replays the first answer for 24 h")),
    responses((status = 201, description = "Link created", body = Link), (status = 400, description = "Invalid input", body = ErrorBody), (status = 401, description = "Missing, unknown or wrong-environment key", body = ErrorBody), (status = 429, description = "Rate limited", body = ErrorBody),
        (status = 503, description = "Storage unavailable, or links off (no https public_url)", body = ErrorBody),
        (status = 409, description = "duplicate_reference, idempotency conflicts", body = ErrorBody),
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
    let new = match checked_link(&state, b) {
        Ok(checked) => checked,
        Err(refused) => {
            return respond(unless_answered(&state, &merchant.id, idem.as_ref(), refused)?, StatusCode::CREATED)
        }
    };
    let executed = state.engine.execute(&merchant.id, Command::CreateLink(new), idem).await?;
    respond(executed, StatusCode::CREATED)
}

/// List payment links, newest first.
#[utoipa::path(get, path = "/v1/liens", tag = "liens",
    params(("limit" = Option<u32>, Query, description = "1-100, default 20"),
        ("starting_after" = Option<String>, Query, description = "next_cursor of the previous page"),
        ("statut" = Option<LinkStatus>, Query)),
    responses((status = 200, description = "A page of links", body = Listed<Link>), (status = 400, description = "Invalid input", body = ErrorBody), (status = 401, description = "Missing, unknown or wrong-environment key", body = ErrorBody), (status = 429, description = "Rate limited", body = ErrorBody), (status = 503, description = "Storage unavailable", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let merchant = authenticate(&state, req.headers())?;
    let query = parse_query(&req, &["limit", "starting_after", "statut"])?;
    let (limit, cursor) = page_params(&query, IdKind::Link)?;
    let status = query
        .get("statut")
        .map(|s| {
            LinkStatus::parse(s).ok_or_else(|| ApiError::invalid("statut", "one of actif, paye, desactive, expire"))
        })
        .transpose()?;
    let now = Timestamp::now();
    let mut page = state
        .engine
        .links(&merchant.id, cursor.as_deref(), limit + 1, &mut |l| status.is_none_or(|s| l.status_at(now) == s))?;
    page.data = page.data.iter().map(|l| l.as_of(now)).collect();
    Ok(HttpResponse::Ok().json(Listed::one_more(page, limit, |l: &Link| l.id.clone())))
}

/// The merchant's link named by `key` (its id or its reference), as durable.
pub async fn find(
    state: &AppState,
    merchant: &caisse_engine::domain::ids::MerchantId,
    key: &str,
) -> Result<Link, ApiError> {
    if validate_id(IdKind::Link, key).is_err() && Reference::parse(key).is_err() {
        return Err(ApiError::not_found("link"));
    }
    state.engine.link(merchant, key).await?.ok_or_else(|| ApiError::not_found("link"))
}

/// Retrieve a payment link.
#[utoipa::path(get, path = "/v1/liens/{id}", tag = "liens",
    params(("id" = String, Path, description = "Link id (lnk_...) or the merchant's reference")),
    responses((status = 200, description = "The link", body = Link), (status = 400, description = "Invalid input", body = ErrorBody), (status = 401, description = "Missing, unknown or wrong-environment key", body = ErrorBody), (status = 429, description = "Rate limited", body = ErrorBody), (status = 503, description = "Storage unavailable", body = ErrorBody),
        (status = 404, description = "Unknown id", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let merchant = authenticate(&state, req.headers())?;
    let link = find(&state, &merchant.id, &path).await?;
    Ok(HttpResponse::Ok().json(link.as_of(Timestamp::now())))
}

/// Deactivate a payment link: it takes no more payments (final).
#[utoipa::path(post, path = "/v1/liens/{id}/desactiver", tag = "liens",
    params(("id" = String, Path, description = "Link id (lnk_...) or the merchant's reference"), ("Idempotency-Key" = Option<String>, Header, description = "1-255 printable ASCII; replays the first answer for 24 h")),
    responses((status = 200, description = "The link, desactive", body = Link), (status = 400, description = "Invalid input", body = ErrorBody), (status = 401, description = "Missing, unknown or wrong-environment key", body = ErrorBody), (status = 429, description = "Rate limited", body = ErrorBody), (status = 503, description = "Storage unavailable", body = ErrorBody),
        (status = 404, description = "Unknown id", body = ErrorBody),
        (status = 409, description = "invalid_state: the link is already paye, desactive or expire; idempotency conflicts", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn deactivate(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let merchant = authenticate(&state, req.headers())?;
    let body = read_body(&req, payload).await?;
    // An unknown link is 404 whatever the body says.
    let link = find(&state, &merchant.id, &path).await?;
    let _: NoFields = parse_json(&req, &body, true)?;
    let idem = idempotency(&req, &body, StatusCode::OK)?;
    let executed = state.engine.execute(&merchant.id, Command::DeactivateLink { id: link.id }, idem).await?;
    respond(executed, StatusCode::OK)
}
