//! The merchant dashboard (docs/api.md § Dashboard and operator commands): server-rendered HTML at `/`, beside
//! the API under `/v1`.
//!
//! Every page is a [`maud`] template compiled into the binary, styled by one hand-written stylesheet served
//! from `/assets/caisse.css`; nothing is fetched from elsewhere, so the dashboard works offline. One file per
//! page family: [`auth`] (login, logout, sessions, CSRF, throttling), [`overview`], [`transactions`],
//! [`payouts`], [`links`] (payment links), [`webhooks`], [`keys`] (the "API keys" section with the "Webhook URL" field) and [`layout`]
//! (the page shell and formatting). The shared pieces live here: the dashboard's own state, the route table,
//! the error type that turns every failure into an HTML page, and the bounded form reader.
//!
//! Reads go straight to the store, like the API's; a change to a merchant account goes through
//! `Engine::update_merchant`, so a key roll and a webhook URL change made at the same moment, on one node or
//! two, cannot overwrite each other.

mod actions;
pub mod auth;
mod checker;
mod keys;
pub mod layout;
mod links;
mod overview;
mod payouts;
mod replay;
mod transactions;
mod webhooks;

use std::collections::BTreeMap;

use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse, ResponseError};
use caisse_engine::store::StoreError;
use caisse_engine::{EngineError, Rejection};
use futures_util::StreamExt;
use maud::Markup;

pub use auth::{DashboardState, LoggedIn};

/// Largest form body accepted; the biggest form is a webhook URL (2 KiB) and a token.
pub const MAX_FORM_BYTES: usize = 16 * 1024;
/// Rows per page of every list.
pub const PAGE_SIZE: usize = 25;

/// Every route of the dashboard: method, path.
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/"),
    ("GET", "/login"),
    ("POST", "/login"),
    ("POST", "/logout"),
    ("GET", "/transactions"),
    ("GET", "/transactions/{reference}"),
    ("POST", "/transactions/{reference}/refund"),
    ("GET", "/payouts"),
    ("GET", "/payouts/new"),
    ("POST", "/payouts/new"),
    ("GET", "/links"),
    ("GET", "/links/new"),
    ("POST", "/links/new"),
    ("GET", "/links/{id}"),
    ("GET", "/links/{id}/qr.svg"),
    ("POST", "/links/{id}/deactivate"),
    ("GET", "/webhooks"),
    ("POST", "/webhooks/test"),
    ("GET", "/webhooks/replay"),
    ("POST", "/webhooks/replay"),
    ("POST", "/webhooks/{id}/resend"),
    ("GET", "/keys"),
    ("POST", "/keys/reveal"),
    ("GET", "/keys/roll"),
    ("POST", "/keys/roll"),
    ("POST", "/keys/webhook"),
    ("GET", "/assets/caisse.css"),
];

/// Registers the dashboard on an actix-web `App`. The app must also hold a `web::Data<DashboardState>`
/// shared by every worker (sessions and login throttling live there).
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/").route(web::get().to(overview::show)))
        .service(web::resource("/login").route(web::get().to(auth::login_form)).route(web::post().to(auth::login)))
        .service(web::resource("/logout").route(web::post().to(auth::logout)))
        .service(web::resource("/transactions").route(web::get().to(transactions::list)))
        .service(web::resource("/transactions/{reference}").route(web::get().to(transactions::detail)))
        .service(web::resource("/transactions/{reference}/refund").route(web::post().to(actions::refund)))
        .service(web::resource("/payouts").route(web::get().to(payouts::list)))
        .service(
            web::resource("/payouts/new")
                .route(web::get().to(actions::payout_form))
                .route(web::post().to(actions::payout)),
        )
        .service(web::resource("/links").route(web::get().to(links::list)))
        .service(web::resource("/links/new").route(web::get().to(links::new_form)).route(web::post().to(links::create)))
        .service(web::resource("/links/{id}").route(web::get().to(links::detail)))
        .service(web::resource("/links/{id}/qr.svg").route(web::get().to(links::qr)))
        .service(web::resource("/links/{id}/deactivate").route(web::post().to(links::deactivate)))
        .service(web::resource("/webhooks").route(web::get().to(webhooks::list)))
        .service(web::resource("/webhooks/test").route(web::post().to(replay::test)))
        .service(
            web::resource("/webhooks/replay")
                .route(web::get().to(replay::progress))
                .route(web::post().to(replay::start)),
        )
        .service(web::resource("/webhooks/{id}/resend").route(web::post().to(webhooks::resend)))
        .service(web::resource("/keys").route(web::get().to(keys::show)))
        .service(web::resource("/keys/reveal").route(web::post().to(keys::reveal)))
        .service(web::resource("/keys/roll").route(web::get().to(keys::confirm_roll)).route(web::post().to(keys::roll)))
        .service(web::resource("/keys/webhook").route(web::post().to(keys::save_webhook)))
        .service(web::resource("/assets/caisse.css").route(web::get().to(layout::stylesheet)));
}

/// A dashboard failure, answered as an HTML page (or, for a missing session, a redirect to the login page).
#[derive(Debug)]
pub enum DashError {
    /// No valid session: go and log in.
    Login,
    BadRequest(String),
    Forbidden(&'static str),
    NotFound(&'static str),
    TooLarge,
    Unavailable,
    /// Already logged with its context where it was made; the page says nothing more.
    Internal,
}

impl DashError {
    /// An unexpected failure: logged with its context, answered without details.
    pub fn internal(context: &str, detail: impl std::fmt::Display) -> DashError {
        tracing::error!(target: "caisse::dashboard", context, error = %detail, "internal error");
        DashError::Internal
    }
}

impl std::fmt::Display for DashError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DashError::Login => f.write_str("login required"),
            DashError::BadRequest(m) => write!(f, "bad request: {m}"),
            DashError::Forbidden(m) => write!(f, "forbidden: {m}"),
            DashError::NotFound(m) => write!(f, "not found: {m}"),
            DashError::TooLarge => f.write_str("form too large"),
            DashError::Unavailable => f.write_str("unavailable"),
            DashError::Internal => f.write_str("internal error"),
        }
    }
}

impl ResponseError for DashError {
    fn status_code(&self) -> StatusCode {
        match self {
            DashError::Login => StatusCode::SEE_OTHER,
            DashError::BadRequest(_) => StatusCode::BAD_REQUEST,
            DashError::Forbidden(_) => StatusCode::FORBIDDEN,
            DashError::NotFound(_) => StatusCode::NOT_FOUND,
            DashError::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            DashError::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            DashError::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let message = match self {
            DashError::Login => return redirect("/login"),
            DashError::BadRequest(m) => m.clone(),
            DashError::Forbidden(m) | DashError::NotFound(m) => (*m).to_owned(),
            DashError::TooLarge => format!("Le formulaire dépasse {MAX_FORM_BYTES} octets."),
            DashError::Unavailable => {
                "Le service ne peut pas enregistrer de changement pour l'instant ; réessayez.".into()
            }
            DashError::Internal => "Erreur interne. L'incident est consigné dans le journal du serveur.".into(),
        };
        html(self.status_code(), layout::error_page(self.status_code(), &message))
    }
}

impl From<EngineError> for DashError {
    fn from(err: EngineError) -> DashError {
        match err {
            EngineError::Rejected(Rejection::NotFound) => DashError::NotFound("Introuvable."),
            EngineError::Unavailable(_) | EngineError::Retired | EngineError::OutcomeUnknown(_) => {
                DashError::Unavailable
            }
            other => DashError::internal("engine", other),
        }
    }
}

impl From<StoreError> for DashError {
    fn from(err: StoreError) -> DashError {
        DashError::from(EngineError::from(err))
    }
}

/// An HTML answer with the headers every dashboard page carries: never cached (pages show balances and
/// keys), never framed, no script or outside resource allowed by the content security policy.
pub fn html(status: StatusCode, markup: Markup) -> HttpResponse {
    let mut response = HttpResponse::build(status);
    secure_headers(&mut response);
    response.content_type("text/html; charset=utf-8").body(markup.into_string())
}

/// `303 See Other` to a path of the dashboard, so that a form POST is followed by a GET.
pub fn redirect(location: &'static str) -> HttpResponse {
    redirect_to(location.to_owned())
}

pub fn redirect_to(location: String) -> HttpResponse {
    let mut response = HttpResponse::SeeOther();
    secure_headers(&mut response);
    response.insert_header((header::LOCATION, location)).finish()
}

fn secure_headers(response: &mut actix_web::HttpResponseBuilder) {
    secure_headers_with(
        response,
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    );
}

/// The headers every page Caisse serves carries (never cached, never framed, no sniffing, no referrer), with
/// its content security policy.
pub fn secure_headers_with(response: &mut actix_web::HttpResponseBuilder, policy: &'static str) {
    response
        .insert_header((header::CACHE_CONTROL, HeaderValue::from_static("no-store")))
        .insert_header((header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")))
        .insert_header((header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")))
        .insert_header((header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(policy)));
}

/// A submitted form (`application/x-www-form-urlencoded`); the first value of a name wins.
#[derive(Default)]
pub struct Form(Vec<(String, String)>);

impl Form {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// Every value of a name given several times (the checked boxes of a group), in order.
    pub fn all(&self, name: &str) -> Vec<&str> {
        self.0.iter().filter(|(k, _)| k == name).map(|(_, v)| v.as_str()).collect()
    }
}

/// Reads a form body, refusing more than [`MAX_FORM_BYTES`] as soon as it is exceeded.
pub async fn read_form(payload: web::Payload) -> Result<Form, DashError> {
    read_form_limited(payload, MAX_FORM_BYTES).await
}

/// Reads a form body, refusing more than `max_bytes` as soon as it is exceeded.
pub async fn read_form_limited(mut payload: web::Payload, max_bytes: usize) -> Result<Form, DashError> {
    // Bounded in time like the API's bodies: a form announced and never sent must not hold a connection.
    let timeout = std::time::Duration::from_millis(crate::http::extract::BODY_TIMEOUT_MS);
    let read = async move {
        let mut body = web::BytesMut::new();
        while let Some(chunk) = payload.next().await {
            let chunk = chunk.map_err(|_| DashError::BadRequest("Le formulaire n'a pas pu être lu.".into()))?;
            if body.len() + chunk.len() > max_bytes {
                return Err(DashError::TooLarge);
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    };
    let body = actix_web::rt::time::timeout(timeout, read)
        .await
        .unwrap_or_else(|_| Err(DashError::BadRequest("Le formulaire n'est pas arrivé à temps.".into())))?;
    serde_urlencoded::from_bytes(&body)
        .map(Form)
        .map_err(|_| DashError::BadRequest("Le formulaire est mal formé.".into()))
}

/// The query string of a page as a map. Pages are forgiving: unknown names are ignored, the first of a
/// repeated name wins, and an unreadable query string reads as empty.
pub fn query(req: &actix_web::HttpRequest) -> BTreeMap<String, String> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(req.query_string()).unwrap_or_default();
    let mut map = BTreeMap::new();
    for (k, v) in pairs {
        map.entry(k).or_insert(v);
    }
    map
}

/// The rows of a page and the cursor of the next one. The store is asked for one row more than shown: when
/// it comes, another matching row exists and the last row shown is the cursor; otherwise the store's own
/// cursor (its scan budget ran out before the end of the index) lets the reader go on.
pub fn paged<T>(
    mut page: caisse_engine::store::Page<T>,
    limit: usize,
    cursor_of: impl Fn(&T) -> String,
) -> (Vec<T>, Option<String>) {
    if page.data.len() > limit {
        page.data.truncate(limit);
        let next = page.data.last().map(cursor_of);
        return (page.data, next);
    }
    let next = if page.has_more { page.next_cursor } else { None };
    (page.data, next)
}
