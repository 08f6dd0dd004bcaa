//! Where providers report what happened: `POST /v1/notifications/{adapter}` for the real providers' callbacks,
//! `POST /v1/fournisseurs/{code}/notifications` for the sandbox simulator's notices. Not merchant endpoints.
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
use crate::providers::Callback;

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
    state.flow.provider_notice(&path, callback(&req, body)).await.map_err(notice_error)?;
    Ok(HttpResponse::Ok().json(serde_json::json!({ "received": true })))
}

/// Provider callbacks (not a merchant endpoint): the adapter authenticates what it can, and nothing moves
/// before the provider's own status answer confirms it. A callback about a transaction Caisse does not know is
/// answered 200 and changes nothing, so the provider stops sending it.
#[utoipa::path(post, path = "/v1/notifications/{adapter}", tag = "fournisseurs",
    params(("adapter" = String, Path, description = "Adapter name: pawapay, ...")),
    request_body(content = String, content_type = "application/json", description = "The provider's callback"),
    responses((status = 200, description = "Accepted (duplicates and unknown transactions too)", body = Object),
        (status = 400, description = "Malformed callback", body = ErrorBody),
        (status = 401, description = "Callback not authentic", body = ErrorBody),
        (status = 404, description = "Unknown or inactive adapter", body = ErrorBody),
        (status = 413, description = "Body over 64 KiB", body = ErrorBody),
        (status = 503, description = "Provider or storage unavailable", body = ErrorBody)))]
pub async fn adapter_notification(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body = read_body(&req, payload).await?;
    state.flow.adapter_notice(&path, None, callback(&req, body)).await.map_err(notice_error)?;
    Ok(HttpResponse::Ok().json(serde_json::json!({ "received": true })))
}

/// A provider callback at a URL with the adapter's own path segment (MTN MoMo's per-transaction token); MTN
/// sends some callbacks with PUT.
#[utoipa::path(post, path = "/v1/notifications/{adapter}/{token}", tag = "fournisseurs",
    params(("adapter" = String, Path, description = "Adapter name: mtn_momo, ..."),
        ("token" = String, Path, description = "The segment the adapter put in the callback URL")),
    request_body(content = String, content_type = "application/json", description = "The provider's callback"),
    responses((status = 200, description = "Accepted (duplicates and unknown transactions too)", body = Object),
        (status = 400, description = "Malformed callback", body = ErrorBody),
        (status = 401, description = "Callback not authentic", body = ErrorBody),
        (status = 404, description = "Unknown or inactive adapter", body = ErrorBody),
        (status = 413, description = "Body over 64 KiB", body = ErrorBody),
        (status = 503, description = "Provider or storage unavailable", body = ErrorBody)))]
pub async fn adapter_notification_with_token(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let (adapter, token) = path.into_inner();
    let body = read_body(&req, payload).await?;
    state.flow.adapter_notice(&adapter, Some(&token), callback(&req, body)).await.map_err(notice_error)?;
    Ok(HttpResponse::Ok().json(serde_json::json!({ "received": true })))
}

/// The callback as it arrived, for adapters that check a signature over the request.
fn callback(req: &HttpRequest, body: web::Bytes) -> Callback {
    Callback { method: req.method().to_string(), path: req.path().to_owned(), headers: req.headers().clone(), body }
}

fn notice_error(e: NoticeError) -> ApiError {
    match e {
        NoticeError::UnknownProvider(_) => ApiError::not_found("provider"),
        NoticeError::InactiveProvider(_) => {
            ApiError::new(StatusCode::BAD_REQUEST, "unsupported_provider", e.to_string())
        }
        NoticeError::Unauthenticated(_) => ApiError::unauthorized(e.to_string()),
        NoticeError::Malformed(why) => ApiError::invalid_json(why),
        NoticeError::UnknownTransaction => ApiError::not_found("transaction"),
        NoticeError::Unconfirmed(_) => ApiError::unavailable(),
        NoticeError::Engine(e) => ApiError::from(e),
    }
}

/// The same callback sent with PUT, as MTN MoMo does for some products.
#[utoipa::path(put, path = "/v1/notifications/{adapter}/{token}", tag = "fournisseurs",
    params(("adapter" = String, Path, description = "Adapter name: mtn_momo, ..."),
        ("token" = String, Path, description = "The segment the adapter put in the callback URL")),
    request_body(content = String, content_type = "application/json", description = "The provider's callback"),
    responses((status = 200, description = "Accepted (duplicates and unknown transactions too)", body = Object),
        (status = 400, description = "Malformed callback", body = ErrorBody),
        (status = 401, description = "Callback not authentic", body = ErrorBody),
        (status = 404, description = "Unknown or inactive adapter", body = ErrorBody),
        (status = 413, description = "Body over 64 KiB", body = ErrorBody),
        (status = 503, description = "Provider or storage unavailable", body = ErrorBody)))]
pub async fn adapter_notification_put(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    adapter_notification_with_token(state, req, path, payload).await
}

/// A provider checking that its notification URL answers (CinetPay pings it with a GET before it posts): 200
/// for an active adapter, nothing read, nothing changed.
#[utoipa::path(get, path = "/v1/notifications/{adapter}", tag = "fournisseurs",
    params(("adapter" = String, Path, description = "Adapter name: cinetpay, ...")),
    responses((status = 200, description = "The URL answers", body = Object),
        (status = 404, description = "Unknown or inactive adapter", body = ErrorBody)))]
pub async fn adapter_ping(state: web::Data<AppState>, path: web::Path<String>) -> Result<HttpResponse, ApiError> {
    pinged(&state, &path)
}

/// The same check of a per-transaction notification URL (CinetPay's Transfer API gives each transfer its own,
/// and asks that it answer a GET too): 200 for an active adapter, whatever the token; nothing read or changed.
#[utoipa::path(get, path = "/v1/notifications/{adapter}/{token}", tag = "fournisseurs",
    params(("adapter" = String, Path, description = "Adapter name: cinetpay, ..."),
        ("token" = String, Path, description = "The transaction's token")),
    responses((status = 200, description = "The URL answers", body = Object),
        (status = 404, description = "Unknown or inactive adapter", body = ErrorBody)))]
pub async fn adapter_ping_with_token(
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    pinged(&state, &path.0)
}

fn pinged(state: &AppState, adapter: &str) -> Result<HttpResponse, ApiError> {
    match state.providers.adapter(adapter) {
        Some(_) => Ok(HttpResponse::Ok().json(serde_json::json!({ "received": true }))),
        None => Err(ApiError::not_found("provider")),
    }
}
