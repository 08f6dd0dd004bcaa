//! `GET /v1/ping`, `GET /v1/devises`, `GET /v1/fournisseurs` (docs/api.md § Utility endpoints).

use std::collections::BTreeMap;

use actix_web::{web, HttpRequest, HttpResponse};
use caisse_engine::domain::money::{FeeRule, CURRENCIES};
use caisse_engine::domain::time::Timestamp;
use serde::Serialize;

use super::error::{ApiError, ErrorBody};
use super::extract::authenticate;
use super::AppState;
use crate::config::Operation;

#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct Ping {
    status: &'static str,
    environment: &'static str,
    version: &'static str,
    time: Timestamp,
}

/// Health check, no authentication.
#[utoipa::path(get, path = "/v1/ping", tag = "utility",
    responses((status = 200, description = "Up", body = Ping), (status = 503, description = "Storage unavailable", body = ErrorBody)))]
/// No authentication. 503 `unavailable` while the store reports that it cannot take writes: its last write, or
/// the probe it makes while unhealthy and idle, failed. Ping itself writes nothing, so it stays cheap and never
/// adds load to a failing disk.
pub async fn ping(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    if !state.engine.healthy() {
        return Err(ApiError::unavailable());
    }
    Ok(HttpResponse::Ok().json(Ping {
        status: "ok",
        environment: state.settings.environment.as_str(),
        version: env!("CARGO_PKG_VERSION"),
        time: Timestamp::now(),
    }))
}

/// A currency as `GET /v1/devises` lists it.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = Devise)]
pub(crate) struct CurrencyEntry {
    code: &'static str,
    #[serde(rename = "nom")]
    name: &'static str,
    #[serde(rename = "decimales")]
    decimals: u8,
}

#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct List<T> {
    data: Vec<T>,
}

/// Supported currencies.
#[utoipa::path(get, path = "/v1/devises", tag = "utility",
    responses((status = 200, description = "Currencies", body = List<CurrencyEntry>), (status = 400, description = "Invalid input", body = ErrorBody), (status = 401, description = "Missing, unknown or wrong-environment key", body = ErrorBody), (status = 429, description = "Rate limited", body = ErrorBody), (status = 503, description = "Storage unavailable", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn currencies(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    authenticate(&state, req.headers())?;
    let data = CURRENCIES.iter().map(|c| CurrencyEntry { code: c.code, name: c.name, decimals: c.decimals }).collect();
    Ok(HttpResponse::Ok().json(List { data }))
}

#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct Bounds {
    #[serde(rename = "montant_min")]
    amount_min: i64,
    #[serde(rename = "montant_max")]
    amount_max: i64,
}

/// A provider as `GET /v1/fournisseurs` lists it.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = Fournisseur)]
pub(crate) struct ProviderEntry<'a> {
    code: &'a str,
    #[serde(rename = "nom")]
    name: &'a str,
    #[serde(rename = "pays")]
    countries: Vec<String>,
    #[serde(rename = "devises")]
    currencies: Vec<&'a str>,
    operations: &'a [Operation],
    #[serde(rename = "frais")]
    fee: FeeRule,
    /// Bounds of the provider's first currency, as a single pair (docs/api.md § Utility endpoints).
    #[serde(rename = "montant_min")]
    amount_min: i64,
    #[serde(rename = "montant_max")]
    amount_max: i64,
    /// Bounds for every currency, in its smallest unit (the scalar pair above is the first one's).
    #[serde(rename = "limites")]
    limits: BTreeMap<&'a str, Bounds>,
    #[serde(rename = "actif")]
    active: bool,
}

/// Supported providers.
#[utoipa::path(get, path = "/v1/fournisseurs", tag = "utility",
    responses((status = 200, description = "Providers", body = List<ProviderEntry>), (status = 400, description = "Invalid input", body = ErrorBody), (status = 401, description = "Missing, unknown or wrong-environment key", body = ErrorBody), (status = 429, description = "Rate limited", body = ErrorBody), (status = 503, description = "Storage unavailable", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn providers(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    authenticate(&state, req.headers())?;
    let data: Vec<ProviderEntry> = state
        .providers
        .all()
        .map(|p| {
            let s = &p.settings;
            let first = s.currencies.first().and_then(|d| s.limits.get(d)).map(|(min, max)| (min.minor(), max.minor()));
            ProviderEntry {
                code: s.code.as_str(),
                name: &s.name,
                countries: p.published_countries(),
                currencies: s.currencies.iter().map(|d| d.code()).collect(),
                operations: &s.operations,
                fee: s.fee,
                amount_min: first.map_or(0, |b| b.0),
                amount_max: first.map_or(0, |b| b.1),
                limits: s
                    .limits
                    .iter()
                    .map(|(d, (min, max))| (d.code(), Bounds { amount_min: min.minor(), amount_max: max.minor() }))
                    .collect(),
                active: p.active(),
            }
        })
        .collect();
    Ok(HttpResponse::Ok().json(List { data }))
}
