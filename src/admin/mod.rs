//! The admin API (docs/operations.md § Admin API): merchant accounts managed while the server runs, and
//! `GET /metrics`, on a listener of its own (`admin_listen`) that starts only when an admin token is set.
//!
//! Everything here needs `Authorization: Bearer <admin token>`, compared in constant time. Errors have the
//! API's shape (docs/api.md § Errors). The listener is meant for the operator's network only: it is never
//! routed from the public reverse proxy.

pub mod client;
mod merchants;
pub mod metrics;

use std::net::TcpListener;

use actix_web::dev::Server;
use actix_web::http::StatusCode;
use actix_web::{web, App, HttpRequest, HttpResponse};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use caisse_engine::store::StoreError;

use crate::config::Secret;
use crate::dashboard::DashboardState;
use crate::http::server::{serve, ServerOptions};
use crate::http::{ApiError, AppState};

/// What the admin handlers share: the service's state, the dashboard's (to end a merchant's sessions) and
/// the token.
pub struct AdminState {
    pub app: web::Data<AppState>,
    pub dashboard: web::Data<DashboardState>,
    token: Secret,
}

/// Binds the admin listener and starts its server (one worker: an operator's requests are few). Answers the
/// server and the port it listens on.
pub fn start(
    listen: std::net::SocketAddr,
    token: Secret,
    app: web::Data<AppState>,
    dashboard: web::Data<DashboardState>,
) -> std::io::Result<(Server, u16)> {
    let listener = TcpListener::bind(listen)?;
    let port = listener.local_addr()?.port();
    let state = web::Data::new(AdminState { app, dashboard, token });
    let options = ServerOptions { name: "caisse-admin", workers: 1, shutdown_grace_s: crate::app::SHUTDOWN_GRACE_S };
    // Logged and answered with a `Request-Id` like the API's requests: what an operator did is in the log.
    let server = serve(listener, options, move || {
        App::new().app_data(state.clone()).wrap_fn(crate::http::request_log).configure(configure)
    })?;
    Ok((server, port))
}

fn configure(cfg: &mut web::ServiceConfig) {
    // A method an endpoint does not take is answered in the API's shape, as an unknown endpoint is.
    let resource = |path: &str| web::resource(path).default_service(web::to(no_such_endpoint));
    cfg.service(
        resource("/admin/merchants").route(web::post().to(merchants::create)).route(web::get().to(merchants::list)),
    )
    .service(resource("/admin/merchants/{id}").route(web::get().to(merchants::get)))
    .service(resource("/admin/merchants/{id}/suspendre").route(web::post().to(merchants::suspend)))
    .service(resource("/admin/merchants/{id}/reactiver").route(web::post().to(merchants::resume)))
    .service(resource("/admin/merchants/{id}/mot-de-passe").route(web::post().to(merchants::reset_password)))
    .service(resource("/admin/backup").route(web::post().to(backup)))
    .service(resource("/admin/audit").route(web::post().to(audit)))
    .service(resource("/metrics").route(web::get().to(metrics::render)))
    .default_service(web::to(no_such_endpoint));
}

async fn no_such_endpoint(req: HttpRequest) -> HttpResponse {
    let message = format!("no admin endpoint {} {}", req.method(), req.path());
    ApiError::new(StatusCode::NOT_FOUND, "not_found", message).into_response()
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct BackupBody {
    /// An absolute directory on the server's machine, absent or empty.
    to: String,
}

/// `POST /admin/backup {"to": DIR}`: a consistent copy of the running store (docs/operations.md § Backups).
async fn backup(
    state: web::Data<AdminState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    authorize(&state, &req)?;
    let body = crate::http::extract::read_body(&req, payload).await?;
    let b: BackupBody = crate::http::extract::parse_json(&req, &body, false)?;
    let to = std::path::PathBuf::from(&b.to);
    if !to.is_absolute() {
        return Err(ApiError::invalid("to", "an absolute directory on the server's machine"));
    }
    if std::fs::read_dir(&to).is_ok_and(|mut entries| entries.next().is_some()) {
        return Err(ApiError::invalid("to", "the directory is not empty; a backup goes to a new directory"));
    }
    let engine = state.app.engine.clone();
    let target = to.clone();
    let made = web::block(move || engine.backup(&target)).await.map_err(|e| ApiError::internal("backup", e))?;
    // The operator needs the reason: a target the server cannot write (a read-only file system, a directory
    // the service's sandbox does not let it write to), or a store that is backed up with other tools.
    let report = made.map_err(|e| match e {
        StoreError::Io(why) => ApiError::invalid("to", format!("the backup could not be written: {why}")),
        StoreError::Conflict(why) => ApiError::new(StatusCode::CONFLICT, "invalid_state", why),
        other => ApiError::from(caisse_engine::EngineError::from(other)),
    })?;
    tracing::warn!(to = %to.display(), keys = report.keys, paused_ms = report.paused_ms, "backup made through the admin API");
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "to": b.to,
        "keys": report.keys,
        "paused_ms": report.paused_ms,
        "elapsed_ms": report.elapsed_ms,
    })))
}

/// `POST /admin/audit`: the audit of the whole ledger, now (docs/operations.md § The ledger audit). Answers
/// 200 with what it found whether it passed or not: a failed audit is news about the store, not a bad
/// request; `"audit": "failed"` and `error` say what disagrees, `"audit": "error"` that it could not run.
async fn audit(state: web::Data<AdminState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    authorize(&state, &req)?;
    let engine = state.app.engine.clone();
    let result = web::block(move || engine.audit()).await.map_err(|e| ApiError::internal("audit", e))?;
    Ok(HttpResponse::Ok().json(match result {
        Ok(report) => serde_json::json!({
            "audit": "passed",
            "merchants": report.merchants,
            "events": report.events,
            "elapsed_ms": report.elapsed_ms,
        }),
        Err(e) => audit_refused(&e),
    }))
}

/// What an audit that did not pass says: `failed` when the ledger disagrees, `error` when it could not run.
pub(crate) fn audit_refused(error: &caisse_engine::store::StoreError) -> serde_json::Value {
    let disagrees = matches!(error, caisse_engine::store::StoreError::Corrupt(_));
    serde_json::json!({"audit": if disagrees { "failed" } else { "error" }, "error": error.to_string()})
}

/// Checks `Authorization: Bearer <admin token>` in constant time. The two SHA-256 digests are compared, not
/// the texts: a comparison of slices ends at once when their lengths differ, which would tell the token's.
fn authorize(state: &AdminState, req: &HttpRequest) -> Result<(), ApiError> {
    let given = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(crate::http::extract::bearer_token)
        .ok_or_else(|| ApiError::unauthorized("missing Authorization: Bearer <admin token>"))?;
    let digest = |text: &str| Sha256::digest(text.as_bytes());
    if bool::from(digest(given).as_slice().ct_eq(digest(state.token.expose()).as_slice())) {
        Ok(())
    } else {
        tracing::warn!(peer = ?req.peer_addr(), "admin request with a wrong token");
        Err(ApiError::unauthorized("wrong admin token"))
    }
}

impl ApiError {
    fn into_response(self) -> HttpResponse {
        actix_web::ResponseError::error_response(&self)
    }
}
