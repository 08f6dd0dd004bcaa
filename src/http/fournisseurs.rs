//! `POST /v1/fournisseurs/{code}/notifications`: where providers (and the sandbox simulator) report what
//! happened. Not a merchant endpoint: the provider's own signature authenticates the notice.
//!
//! A notice is authenticated (401 and nothing changes if not), located (404 for an unknown transaction),
//! confirmed with a status query, and only then applied through the merchant's actor. Duplicates are
//! answered 200 and change nothing.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};

use super::error::{ApiError, ErrorBody};
use super::extract::read_body;
use super::AppState;
use crate::providers::ProviderError;
use crate::settlement::settle;

/// Provider notices (not a merchant endpoint): authenticated by the provider's signature.
#[utoipa::path(post, path = "/v1/fournisseurs/{code}/notifications", tag = "fournisseurs",
    params(("code" = String, Path, description = "Provider code")),
    request_body(content = String, content_type = "application/json", description = "The provider's signed notice"),
    responses((status = 200, description = "Accepted (duplicates too)", body = Object),
        (status = 400, description = "Malformed notice or inactive provider", body = ErrorBody),
        (status = 401, description = "Notice not authentic", body = ErrorBody),
        (status = 404, description = "Unknown provider or transaction", body = ErrorBody),
        (status = 413, description = "Body over 64 KiB", body = ErrorBody),
        (status = 503, description = "Provider or storage unavailable", body = ErrorBody)))]
pub async fn notification(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let provider = state.providers.get(&path).ok_or_else(|| ApiError::not_found("provider"))?;
    let adapter = provider.adapter.clone().ok_or_else(|| {
        ApiError::new(StatusCode::BAD_REQUEST, "unsupported_provider", format!("`{}` is not active", path.as_str()))
    })?;
    let body = read_body(&req, payload).await?;
    let notice = adapter.parse_notice(req.headers(), &body).map_err(|e| match e {
        ProviderError::Unauthenticated(why) => ApiError::unauthorized(format!("notice refused: {why}")),
        other => ApiError::invalid_json(other.to_string()),
    })?;
    let (merchant, located) = state
        .engine
        .store()
        .owner_of_transaction(&notice.transaction_id)?
        .ok_or_else(|| ApiError::not_found("transaction"))?;
    // Confirm with the provider before moving money (contract 13).
    let confirmed = adapter.status(notice.subject, &notice.transaction_id).await.map_err(|e| {
        tracing::warn!(tx = %notice.transaction_id, error = %e, "status query failed");
        ApiError::unavailable()
    })?;
    settle(&state.engine, &merchant, &located, &confirmed, false).await?;
    Ok(HttpResponse::Ok().json(serde_json::json!({ "received": true })))
}
