//! The merchant REST API under `/v1` (docs/api.md § Endpoints): one file per resource, the shared
//! state, the request-id and log middleware, and the route table.
//!
//! Every answer carries a `Request-Id` header; every error has the API's JSON shape (see [`error`]).
//! One log line per request says method, path, status, latency and request id, and never a header value,
//! so no key or cookie can reach the logs.

pub mod error;
pub mod extract;
mod fournisseurs;
pub mod openapi;
mod paiement;
mod ratelimit;
mod retraits;
mod soldes;
mod transactions;
mod utility;

use std::sync::Arc;
use std::time::Instant;

use actix_web::dev::Service;
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use caisse_engine::domain::ids::{new_id, IdKind};
use caisse_engine::webhook::delivery::WebhookPool;
use caisse_engine::Engine;

use crate::config::Settings;
use crate::flow::Flow;
use crate::providers::Providers;
pub use error::ApiError;
pub use ratelimit::RateLimiter;

/// What every handler can reach.
pub struct AppState {
    pub engine: Engine,
    pub settings: Arc<Settings>,
    pub providers: Providers,
    /// A payment's life: starting it with the provider, applying the provider's answers.
    pub flow: Flow,
    pub rate_limiter: RateLimiter,
    pub webhooks: WebhookPool,
}

/// Every route of the API: method, path, handler. The OpenAPI test walks this same list.
pub const ROUTES: &[(&str, &str)] = &[
    ("POST", "/v1/paiement/initier"),
    ("GET", "/v1/paiement/{reference}"),
    ("POST", "/v1/paiement/{reference}/rembourser"),
    ("GET", "/v1/transactions"),
    ("GET", "/v1/transactions/{reference}"),
    ("GET", "/v1/soldes"),
    ("POST", "/v1/retraits"),
    ("GET", "/v1/retraits"),
    ("GET", "/v1/retraits/{id}"),
    ("GET", "/v1/ping"),
    ("GET", "/v1/devises"),
    ("GET", "/v1/fournisseurs"),
    ("POST", "/v1/fournisseurs/{code}/notifications"),
    ("POST", "/v1/notifications/{adapter}"),
    ("POST", "/v1/notifications/{adapter}/{token}"),
    ("PUT", "/v1/notifications/{adapter}/{token}"),
    ("GET", "/v1/openapi.json"),
];

/// Registers the API on an actix-web `App`.
pub fn configure(cfg: &mut web::ServiceConfig) {
    let unknown_method = || web::to(|req: HttpRequest| async move { no_such_endpoint(&req) });
    cfg.service(
        web::scope("/v1")
            .service(
                web::resource("/paiement/initier")
                    .route(web::post().to(paiement::initiate))
                    .default_service(unknown_method()),
            )
            .service(
                web::resource("/paiement/{reference}")
                    .route(web::get().to(paiement::get))
                    .default_service(unknown_method()),
            )
            .service(
                web::resource("/paiement/{reference}/rembourser")
                    .route(web::post().to(paiement::refund))
                    .default_service(unknown_method()),
            )
            .service(
                web::resource("/transactions")
                    .route(web::get().to(transactions::list))
                    .default_service(unknown_method()),
            )
            .service(
                web::resource("/transactions/{reference}")
                    .route(web::get().to(transactions::get))
                    .default_service(unknown_method()),
            )
            .service(web::resource("/soldes").route(web::get().to(soldes::get)).default_service(unknown_method()))
            .service(
                web::resource("/retraits")
                    .route(web::post().to(retraits::create))
                    .route(web::get().to(retraits::list))
                    .default_service(unknown_method()),
            )
            .service(
                web::resource("/retraits/{id}").route(web::get().to(retraits::get)).default_service(unknown_method()),
            )
            .service(web::resource("/ping").route(web::get().to(utility::ping)).default_service(unknown_method()))
            .service(
                web::resource("/devises").route(web::get().to(utility::currencies)).default_service(unknown_method()),
            )
            .service(
                web::resource("/fournisseurs")
                    .route(web::get().to(utility::providers))
                    .default_service(unknown_method()),
            )
            .service(
                web::resource("/fournisseurs/{code}/notifications")
                    .route(web::post().to(fournisseurs::notification))
                    .default_service(unknown_method()),
            )
            .service(
                web::resource("/notifications/{adapter}")
                    .route(web::post().to(fournisseurs::adapter_notification))
                    .default_service(unknown_method()),
            )
            .service(
                web::resource("/notifications/{adapter}/{token}")
                    .route(web::post().to(fournisseurs::adapter_notification_with_token))
                    .route(web::put().to(fournisseurs::adapter_notification_put))
                    .default_service(unknown_method()),
            )
            .service(
                web::resource("/openapi.json")
                    .route(web::get().to(openapi::document))
                    .default_service(unknown_method()),
            )
            .default_service(web::to(|req: HttpRequest| async move { no_such_endpoint(&req) })),
    );
}

fn no_such_endpoint(req: &HttpRequest) -> Result<HttpResponse, ApiError> {
    Err(ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("no endpoint {} {}", req.method(), req.path())))
}

/// Adds `Request-Id` to every answer and logs one line per request.
pub fn request_log<S, B>(
    req: actix_web::dev::ServiceRequest,
    srv: &S,
) -> impl std::future::Future<Output = Result<actix_web::dev::ServiceResponse<B>, actix_web::Error>>
where
    S: Service<actix_web::dev::ServiceRequest, Response = actix_web::dev::ServiceResponse<B>, Error = actix_web::Error>,
{
    let started = Instant::now();
    let request_id = new_id(IdKind::Event).replacen("evt_", "req_", 1);
    let method = req.method().clone();
    let path = req.path().to_owned();
    let route = req.match_pattern().unwrap_or_else(|| "unmatched".to_owned());
    let trusted = req.app_data::<web::Data<AppState>>().map(|s| s.settings.trusted_proxies.as_slice()).unwrap_or(&[]);
    let forwarded = req.headers().get("x-forwarded-for").and_then(|v| v.to_str().ok());
    let client = crate::client_address::client_address(req.peer_addr().map(|a| a.ip()), forwarded, trusted)
        .map_or_else(|| "unknown".to_owned(), |ip| ip.to_string());
    let call = srv.call(req);
    async move {
        let mut response = call.await?;
        if let Ok(value) = HeaderValue::from_str(&request_id) {
            response.headers_mut().insert(HeaderName::from_static("request-id"), value);
        }
        let status = response.status().as_u16();
        let elapsed = started.elapsed();
        crate::metrics::METRICS.request(&route, status, elapsed);
        let latency_us = elapsed.as_micros() as u64;
        tracing::info!(target: "caisse::http", %method, %path, status, latency_us, %client, request_id = %request_id, "request");
        Ok(response)
    }
}
