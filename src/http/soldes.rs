//! `GET /v1/soldes`: the merchant's balances per currency (docs/api.md § Balances), read through its actor so that
//! they include every acknowledged change and nothing that is not yet durable.

use actix_web::{web, HttpRequest, HttpResponse};
use caisse_engine::domain::money::Currency;
use caisse_engine::domain::time::Timestamp;
use serde::Serialize;

use super::error::{ApiError, ErrorBody};
use super::extract::authenticate;
use super::AppState;

#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct Row {
    #[serde(rename = "devise")]
    currency: Currency,
    #[serde(rename = "disponible")]
    available: i64,
    #[serde(rename = "en_attente")]
    pending: i64,
    total: i64,
    updated_at: Timestamp,
}

#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct Rows {
    data: Vec<Row>,
}

/// Balances per currency.
#[utoipa::path(get, path = "/v1/soldes", tag = "soldes",
    responses((status = 200, description = "Balances", body = Rows), (status = 400, description = "Invalid input", body = ErrorBody), (status = 401, description = "Missing, unknown or wrong-environment key", body = ErrorBody), (status = 429, description = "Rate limited", body = ErrorBody), (status = 503, description = "Storage unavailable", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let merchant = authenticate(&state, req.headers())?;
    let balances = state.engine.balances(&merchant.id).await?;
    let data = balances
        .0
        .iter()
        .map(|(currency, b)| Row {
            currency: *currency,
            available: b.available,
            pending: b.pending,
            total: b.total(),
            updated_at: Timestamp::from_unix_ms(b.updated_at_ms),
        })
        .collect();
    Ok(HttpResponse::Ok().json(Rows { data }))
}
