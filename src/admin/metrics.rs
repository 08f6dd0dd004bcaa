//! `GET /metrics` on the admin listener: the text of [`crate::metrics`], behind the admin token.

use actix_web::{web, HttpRequest, HttpResponse};

use super::{authorize, AdminState};
use crate::http::ApiError;

/// `GET /metrics`.
pub async fn render(state: web::Data<AdminState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    authorize(&state, &req)?;
    let actors = state.app.engine.running_actors();
    Ok(HttpResponse::Ok().content_type("text/plain; version=0.0.4; charset=utf-8").body(crate::metrics::text(actors)))
}
