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
use crate::flow::notice::NoticeError;

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
    let body = read_body(&req, payload).await?;
    state.flow.provider_notice(&path, req.headers(), &body).await.map_err(|e| match e {
        NoticeError::UnknownProvider(_) => ApiError::not_found("provider"),
        NoticeError::InactiveProvider(_) => {
            ApiError::new(StatusCode::BAD_REQUEST, "unsupported_provider", e.to_string())
        }
        NoticeError::Unauthenticated(_) => ApiError::unauthorized(e.to_string()),
        NoticeError::Malformed(why) => ApiError::invalid_json(why),
        NoticeError::UnknownTransaction => ApiError::not_found("transaction"),
        NoticeError::Unconfirmed(_) => ApiError::unavailable(),
        NoticeError::Engine(e) => ApiError::from(e),
    })?;
    Ok(HttpResponse::Ok().json(serde_json::json!({ "received": true })))
}
