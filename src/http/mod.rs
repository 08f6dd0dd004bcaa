//! The merchant REST API under `/v1` (docs/api.md § Endpoints): one file per resource, the shared
//! state, the request-id and log middleware, and the route table.
//!
//! Every answer carries a `Request-Id` header; every error has the API's JSON shape (see [`error`]).
//! One log line per request says method, path, status, latency and request id, and never a header value,
//! so no key or cookie can reach the logs.

pub mod cluster;
pub mod error;
pub mod extract;
mod fournisseurs;
pub mod liens;
pub mod openapi;
pub mod paiement;
mod ratelimit;
pub mod retraits;
pub mod server;
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
pub use ratelimit::{FailedAuth, PerMinute, RateLimiter};

/// What every handler can reach.
pub struct AppState {
    pub engine: Engine,
    pub settings: Arc<Settings>,
    pub providers: Providers,
    /// A payment's life: starting it with the provider, applying the provider's answers.
    pub flow: Flow,
    pub rate_limiter: RateLimiter,
    /// Requests that failed authentication, per client address.
    pub failed_auth: FailedAuth,
    pub webhooks: WebhookPool,
    /// `{public_url}/payer/`, the base of every payment link's URL; `None` when links are off (production
    /// without an https `public_url`).
    pub links_base: Option<String>,
}

/// A route of the API that a merchant's key opens (`route` is the matched pattern): not the dashboard, not a
/// provider's notices (a provider whose signatures fail must not have its own callbacks refused for it), not
/// the routes that need no key (`/v1/ping`, which health checks behind the same address as a guesser keep
/// calling, and the OpenAPI document).
fn keyed(route: &str) -> bool {
    route.starts_with("/v1/")
        && !route.starts_with("/v1/notifications/")
        && !route.ends_with("/notifications")
        && route != "/v1/ping"
        && route != "/v1/openapi.json"
}

/// What the request log does with a request: hand it on, or answer it at once.
enum Next<F> {
    Call(F),
    Refused(actix_web::dev::ServiceResponse),
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
    ("POST", "/v1/liens"),
    ("GET", "/v1/liens"),
    ("GET", "/v1/liens/{id}"),
    ("POST", "/v1/liens/{id}/desactiver"),
    ("GET", "/v1/ping"),
    ("GET", "/v1/devises"),
    ("GET", "/v1/fournisseurs"),
    ("POST", "/v1/fournisseurs/{code}/notifications"),
    ("POST", "/v1/notifications/{adapter}"),
    ("GET", "/v1/notifications/{adapter}"),
    ("GET", "/v1/notifications/{adapter}/{token}"),
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
                    .route(web::get().to(paiement::get_initier))
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
            .service(
                web::resource("/liens")
                    .route(web::post().to(liens::create))
                    .route(web::get().to(liens::list))
                    .default_service(unknown_method()),
            )
            .service(web::resource("/liens/{id}").route(web::get().to(liens::get)).default_service(unknown_method()))
            .service(
                web::resource("/liens/{id}/desactiver")
                    .route(web::post().to(liens::deactivate))
                    .default_service(unknown_method()),
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
                    .route(web::get().to(fournisseurs::adapter_ping))
                    .route(web::post().to(fournisseurs::adapter_notification))
                    .default_service(unknown_method()),
            )
            .service(
                web::resource("/notifications/{adapter}/{token}")
                    .route(web::get().to(fournisseurs::adapter_ping_with_token))
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

/// The path a request is logged under. A provider's per-transaction callback token (the last segment of
/// `/v1/notifications/{adapter}/{token}`) is the callback's only credential, so it is not written to the logs.
fn logged_path(path: &str, route: &str) -> String {
    match (route.ends_with("/{token}"), path.rsplit_once('/')) {
        (true, Some((head, _))) => format!("{head}/…"),
        _ => path.to_owned(),
    }
}

/// Adds `Request-Id` to every answer and logs one line per request.
pub fn request_log<S, B>(
    req: actix_web::dev::ServiceRequest,
    srv: &S,
) -> impl std::future::Future<
    Output = Result<actix_web::dev::ServiceResponse<actix_web::body::EitherBody<B>>, actix_web::Error>,
>
where
    S: Service<actix_web::dev::ServiceRequest, Response = actix_web::dev::ServiceResponse<B>, Error = actix_web::Error>,
{
    let started = Instant::now();
    let request_id = new_id(IdKind::Event).replacen("evt_", "req_", 1);
    let method = req.method().clone();
    let route = req.match_pattern().unwrap_or_else(|| "unmatched".to_owned());
    let path = logged_path(req.path(), &route);
    let state = req.app_data::<web::Data<AppState>>().cloned();
    let trusted = state.as_ref().map_or(&[][..], |s| s.settings.trusted_proxies.as_slice());
    let client_ip = crate::client_address::of_request(req.request(), trusted);
    let client = client_ip.map_or_else(|| "unknown".to_owned(), |ip| ip.to_string());
    let counted_ip = client_ip.map(crate::client_address::counted);
    // An address that keeps failing authentication is answered 429 before any work.
    let blocked = match (&state, counted_ip) {
        (Some(state), Some(ip)) if keyed(&route) => state.failed_auth.check(ip, started).err(),
        _ => None,
    };
    let next = match blocked {
        None => Next::Call(srv.call(req)),
        Some(wait_s) => {
            let mut error = ApiError::new(
                actix_web::http::StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                "too many requests without a valid key from this address; slow down",
            );
            error.retry_after_s = Some(wait_s);
            Next::Refused(req.into_response(actix_web::ResponseError::error_response(&error)))
        }
    };
    async move {
        let mut response = match next {
            Next::Call(call) => call.await?.map_into_left_body(),
            Next::Refused(response) => response.map_into_right_body(),
        };
        if let Ok(value) = HeaderValue::from_str(&request_id) {
            response.headers_mut().insert(HeaderName::from_static("request-id"), value);
        }
        let status = response.status().as_u16();
        if let (401, true, Some(state), Some(ip)) = (status, keyed(&route), &state, counted_ip) {
            state.failed_auth.failed(ip, started);
        }
        let elapsed = started.elapsed();
        // The API's and the dashboard's requests (the admin listener, without the API's state, is not counted).
        if state.is_some() {
            crate::metrics::METRICS.request(&route, status, elapsed);
        }
        let latency_us = elapsed.as_micros() as u64;
        tracing::info!(target: "caisse::http", %method, %path, status, latency_us, %client, request_id = %request_id, "request");
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use super::logged_path;

    #[test]
    fn a_callback_token_is_not_logged() {
        let route = "/v1/notifications/{adapter}/{token}";
        assert_eq!(logged_path("/v1/notifications/mtn_momo/tok_secret", route), "/v1/notifications/mtn_momo/…");
        assert_eq!(logged_path("/v1/soldes", "/v1/soldes"), "/v1/soldes");
        assert_eq!(logged_path("/nowhere/x", "unmatched"), "/nowhere/x");
    }
}
