//! `/admin/merchants`: create, list, get, suspend, resume, and a new dashboard password. Secrets (the secret
//! key, a password) are shown once, in the answer that made them, and never again.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use caisse_engine::domain::ids::{random_base62, MerchantId};
use caisse_engine::domain::records::Merchant;
use caisse_engine::domain::time::Timestamp;
use caisse_engine::KeyChange;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{authorize, AdminState};
use crate::http::extract::{parse_json, read_body};
use crate::http::ApiError;
use crate::merchants::{self, CreateError, NewMerchant};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    name: String,
    email: String,
    password: Option<String>,
    webhook_url: Option<String>,
}

/// A merchant as the admin API (and `caisse merchant list`) shows it, without its secrets.
pub(crate) fn view(merchant: &Merchant, suspended_at: Option<Timestamp>) -> Value {
    json!({
        "id": merchant.id.as_str(),
        "name": merchant.name,
        "email": merchant.email,
        "webhook_url": merchant.webhook_url,
        "statut": if suspended_at.is_some() { "suspendu" } else { "actif" },
        "created_at": merchant.created_at,
        "suspended_at": suspended_at,
    })
}

fn merchant_id(path: &str) -> Result<MerchantId, ApiError> {
    MerchantId::parse(path).map_err(|_| ApiError::not_found("merchant"))
}

/// The merchant an authorized request's path names.
fn target(state: &AdminState, req: &HttpRequest, path: &str) -> Result<(MerchantId, Merchant), ApiError> {
    authorize(state, req)?;
    let id = merchant_id(path)?;
    let merchant = state.app.engine.merchant(&id)?.ok_or_else(|| ApiError::not_found("merchant"))?;
    Ok((id, merchant))
}

/// `POST /admin/merchants`: 201 with the secret key and the password, shown this once.
pub async fn create(
    state: web::Data<AdminState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    authorize(&state, &req)?;
    let body = read_body(&req, payload).await?;
    let b: CreateBody = parse_json(&req, &body, false)?;
    if state.app.engine.merchant_by_email(&b.email)?.is_some() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "duplicate_email",
            "a merchant with this e-mail already exists",
        )
        .with_field("email"));
    }
    let env = state.app.settings.environment;
    let new = NewMerchant { name: b.name, email: b.email, password: b.password, webhook_url: b.webhook_url };
    // Hashing the password takes a core for a moment: off the worker thread.
    let prepared = web::block(move || merchants::prepare(env, new))
        .await
        .map_err(|e| ApiError::internal("password hash", e))?
        .map_err(create_error)?;
    state.app.engine.put_merchant(prepared.merchant.clone(), None).await?;
    let m = &prepared.merchant;
    tracing::info!(merchant = %m.id, "merchant created through the admin API");
    Ok(HttpResponse::Created().json(json!({
        "id": m.id.as_str(),
        "name": m.name,
        "email": m.email,
        "password": prepared.password,
        "secret_key": m.secret_key,
        "webhook_url": m.webhook_url,
        "statut": "actif",
    })))
}

fn create_error(e: CreateError) -> ApiError {
    match e {
        CreateError::Name => ApiError::invalid("name", "1 to 200 characters"),
        CreateError::Email(why) => ApiError::invalid("email", why),
        CreateError::Password => ApiError::invalid("password", "8 to 128 characters"),
        CreateError::WebhookUrl(why) => ApiError::invalid("webhook_url", why.to_string()),
        CreateError::Hash(why) => ApiError::internal("password hash", why),
        CreateError::Engine(e) => e.into(),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    limit: Option<String>,
    starting_after: Option<String>,
}

/// `GET /admin/merchants`: newest first, paged like the API's lists.
pub async fn list(state: web::Data<AdminState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    authorize(&state, &req)?;
    let query = web::Query::<ListQuery>::from_query(req.query_string())
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", e.to_string()))?;
    let limit = match &query.limit {
        None => 20,
        Some(text) => text
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=100).contains(n))
            .ok_or_else(|| ApiError::invalid("limit", "a whole number from 1 to 100"))?,
    };
    let cursor = query
        .starting_after
        .as_deref()
        .map(|c| MerchantId::parse(c).map_err(|_| ApiError::invalid("starting_after", "not a merchant id")))
        .transpose()?;
    // One more than asked says whether there is a next page.
    let mut merchants = state.app.engine.merchants(cursor.as_ref(), limit + 1)?;
    let has_more = merchants.len() > limit;
    merchants.truncate(limit);
    let mut data = Vec::with_capacity(merchants.len());
    for m in &merchants {
        data.push(view(m, state.app.engine.suspended_since(&m.id)?));
    }
    let next_cursor = if has_more { merchants.last().map(|m| m.id.as_str().to_owned()) } else { None };
    Ok(HttpResponse::Ok().json(json!({"data": data, "has_more": has_more, "next_cursor": next_cursor})))
}

/// `GET /admin/merchants/{id}`.
pub async fn get(
    state: web::Data<AdminState>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let (id, merchant) = target(&state, &req, &path)?;
    Ok(HttpResponse::Ok().json(view(&merchant, state.app.engine.suspended_since(&id)?)))
}

/// `POST /admin/merchants/{id}/suspendre`: its key answers 403 `merchant_suspended` and its dashboard is
/// closed from now on; what it already started (payments at a provider, webhooks) carries on.
pub async fn suspend(
    state: web::Data<AdminState>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let (id, merchant) = target(&state, &req, &path)?;
    let since = match state.app.engine.suspended_since(&id)? {
        Some(since) => since,
        None => {
            let now = Timestamp::now();
            state.app.engine.set_suspended(&id, Some(now)).await?;
            tracing::warn!(merchant = %id, "merchant suspended");
            now
        }
    };
    state.dashboard.sessions.remove_merchant(&id);
    Ok(HttpResponse::Ok().json(view(&merchant, Some(since))))
}

/// `POST /admin/merchants/{id}/reactiver`.
pub async fn resume(
    state: web::Data<AdminState>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let (id, merchant) = target(&state, &req, &path)?;
    if state.app.engine.suspended_since(&id)?.is_some() {
        state.app.engine.set_suspended(&id, None).await?;
        tracing::warn!(merchant = %id, "merchant resumed");
    }
    Ok(HttpResponse::Ok().json(view(&merchant, None)))
}

/// `POST /admin/merchants/{id}/mot-de-passe`: a new generated dashboard password, shown once; the merchant's
/// open dashboard sessions end.
pub async fn reset_password(
    state: web::Data<AdminState>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let (id, _) = target(&state, &req, &path)?;
    let password = random_base62(16);
    let hashed = password.clone();
    let password_hash = web::block(move || merchants::hash_password(&hashed))
        .await
        .map_err(|e| ApiError::internal("password hash", e))?
        .map_err(create_error)?;
    // Read again and written as one account change: a key roll or a webhook URL change made while the
    // password was hashed, here or on another node, is kept, not overwritten with the account as it was.
    let reset = state.app.engine.update_merchant(&id, move |merchant| {
        merchant.password_hash = password_hash;
        KeyChange::Kept
    });
    let merchant = reset.await?.ok_or_else(|| ApiError::not_found("merchant"))?;
    state.dashboard.sessions.remove_merchant(&id);
    tracing::warn!(merchant = %id, "dashboard password reset through the admin API");
    Ok(HttpResponse::Ok().json(json!({"id": id.as_str(), "email": merchant.email, "password": password})))
}
