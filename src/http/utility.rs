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

#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct Devise {
    code: &'static str,
    nom: &'static str,
    decimales: u8,
}

#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct List<T> {
    data: Vec<T>,
}

/// Supported currencies.
#[utoipa::path(get, path = "/v1/devises", tag = "utility",
    responses((status = 200, description = "Currencies", body = List<Devise>), (status = 400, description = "Invalid input", body = ErrorBody), (status = 401, description = "Missing, unknown or wrong-environment key", body = ErrorBody), (status = 429, description = "Rate limited", body = ErrorBody), (status = 503, description = "Storage unavailable", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn devises(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    authenticate(&state, req.headers())?;
    let data = CURRENCIES.iter().map(|c| Devise { code: c.code, nom: c.name, decimales: c.decimals }).collect();
    Ok(HttpResponse::Ok().json(List { data }))
}

#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct Bounds {
    montant_min: i64,
    montant_max: i64,
}

#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct Fournisseur<'a> {
    code: &'a str,
    nom: &'a str,
    pays: &'a [String],
    devises: Vec<&'a str>,
    operations: &'a [Operation],
    frais: FeeRule,
    /// Bounds of the provider's first currency, as a single pair (docs/api.md § Utility endpoints).
    montant_min: i64,
    montant_max: i64,
    /// Bounds for every currency, in its smallest unit (the scalar pair above is the first one's).
    limites: BTreeMap<&'a str, Bounds>,
    actif: bool,
}

/// Supported providers.
#[utoipa::path(get, path = "/v1/fournisseurs", tag = "utility",
    responses((status = 200, description = "Providers", body = List<Fournisseur>), (status = 400, description = "Invalid input", body = ErrorBody), (status = 401, description = "Missing, unknown or wrong-environment key", body = ErrorBody), (status = 429, description = "Rate limited", body = ErrorBody), (status = 503, description = "Storage unavailable", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn fournisseurs(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    authenticate(&state, req.headers())?;
    let data: Vec<Fournisseur> = state
        .providers
        .all()
        .map(|p| {
            let s = &p.settings;
            let first = s.devises.first().and_then(|d| s.limites.get(d)).map(|(min, max)| (min.minor(), max.minor()));
            Fournisseur {
                code: s.code.as_str(),
                nom: &s.nom,
                pays: &s.pays,
                devises: s.devises.iter().map(|d| d.code()).collect(),
                operations: &s.operations,
                frais: s.frais,
                montant_min: first.map_or(0, |b| b.0),
                montant_max: first.map_or(0, |b| b.1),
                limites: s
                    .limites
                    .iter()
                    .map(|(d, (min, max))| (d.code(), Bounds { montant_min: min.minor(), montant_max: max.minor() }))
                    .collect(),
                actif: p.active(),
            }
        })
        .collect();
    Ok(HttpResponse::Ok().json(List { data }))
}
