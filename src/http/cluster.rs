//! The route the other nodes of a cluster forward a merchant's messages to (`caisse_engine::cluster`). Only a
//! node of a cluster has it; a request not signed under the cluster's secret is answered as an unknown path,
//! so the route says nothing to anyone else.

use actix_web::{web, HttpRequest, HttpResponse};
use caisse_engine::cluster::{CONTENT_TYPE, FORWARD_PATH, MAX_BODY, PROTOCOL, VERSION_HEADER};
use caisse_engine::domain::time::Timestamp;

use super::error::ApiError;
use super::AppState;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource(FORWARD_PATH).route(web::post().to(forwarded)));
}

/// The body is read only once the request carries a signature of ours made within the minute, within the
/// API's bounds of time and [`MAX_BODY`] bytes; then the signature must sign it. Anyone else is answered as an
/// unknown path.
async fn forwarded(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let authorization = req.headers().get("authorization").and_then(|v| v.to_str().ok());
    let version = req.headers().get(VERSION_HEADER).and_then(|v| v.to_str().ok());
    let now_ms = || Timestamp::now().unix_ms();
    let Some(forwarding) = state.engine.forwarding().filter(|f| f.fresh(authorization, now_ms())) else {
        return super::no_such_endpoint(&req);
    };
    let body = super::extract::read_body_within(&req, payload, MAX_BODY).await?;
    if !forwarding.admits(authorization, &body, now_ms()) {
        return super::no_such_endpoint(&req);
    }
    if version != Some(PROTOCOL) {
        tracing::warn!(theirs = ?version, ours = PROTOCOL, "a node on another forwarding protocol forwarded a message; refused");
        return Err(ApiError::unavailable());
    }
    let answer = state.engine.answer_forwarded(&body).await;
    Ok(HttpResponse::Ok().content_type(CONTENT_TYPE).body(answer))
}
