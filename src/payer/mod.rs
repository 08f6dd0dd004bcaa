//! The payment page (docs/links.md): where a customer pays a merchant's payment link, served by Caisse itself
//! under `{public_url}/payer/...`, with no key, no JavaScript and nothing from another host.
//!
//! - `GET /payer/{id}`: the merchant's name, the description, the amount, and a form (fournisseur, country,
//!   phone number as people write it, optional name and e-mail). A link that no longer takes payments says
//!   why (410); an unknown one is 404.
//! - `POST /payer/{id}`: starts an ordinary payment through the merchant's actor, with `metadata.lien_id`, and
//!   answers 303 to the waiting page, or to the provider's page when it needs the customer's browser.
//! - `GET /payer/{id}/{reference}?cle=…`: the payment's status, refreshed by the page itself until it is
//!   final, then a receipt, or the failure with a way to try again. It shows only a payment made through this
//!   link, and only with the payment's own page key (`cle`): references are ordered ids, so a customer who
//!   knows theirs could otherwise guess the next customer's.
//!
//! - `GET /retour/{transaction id}`: where a provider that took the customer to its own page (Wave) sends the
//!   browser back. It forwards to the payment's `url_retour` with `reference` added, so merchants need no
//!   provider-specific code; without one it shows the payment's status and amount, nothing else.
//!
//! Abuse: the form carries a signed token ([`tokens`]) bound to a cookie set with the form, so a post comes
//! from a browser that loaded this link's form within the hour; the token's nonce is the payment's
//! idempotency key, so a double tap makes one payment and lands on the same page; each address may post
//! [`POSTS_PER_MINUTE`] forms a minute; forms are at most [`MAX_FORM_BYTES`]. Everything a customer or a
//! merchant typed is escaped by the templates.

mod pages;
mod tokens;

use std::time::Instant;

use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use caisse_engine::domain::ids::{new_id, random_base62, validate_id, IdKind, MerchantId};
use caisse_engine::domain::links::Link;
use caisse_engine::domain::phone::Phone;
use caisse_engine::domain::provider::{ProviderRoute, ReturnUrl};
use caisse_engine::domain::records::Payment;
use caisse_engine::domain::status::PaymentStatus;
use caisse_engine::domain::text::{Email, Name, Reference};
use caisse_engine::domain::time::Timestamp;
use caisse_engine::{EngineError, Executed, Idempotency, NewPayment, Part, Record, Rejection};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::{Environment, Operation};
use crate::dashboard::Form;
use crate::http::paiement::{check_route, provider_for, Ask};
use crate::http::{ApiError, AppState, PerMinute};

pub use tokens::FormKey;

/// Form posts one client address may make in a minute; beyond, a 429 page.
pub const POSTS_PER_MINUTE: u32 = 10;
/// The largest form accepted: the page's fields are short, so anything bigger is not this form.
pub const MAX_FORM_BYTES: usize = 4 * 1024;
/// How long a double tap waits for the first tap's payment before it is shown: the first tap's request holds
/// its key while it asks the provider for the payment's page (at most 10 s), and a little more.
const DOUBLE_TAP_WAIT_MS: u64 = 15_000;
/// Length of a payment page's key (base62, about 131 bits).
const PAGE_KEY_LEN: usize = 22;
/// The query parameter that carries a payment page's key.
const PAGE_KEY: &str = "cle";

/// What the payment page keeps between requests, shared by every worker.
pub struct PayerState {
    pub key: FormKey,
    /// Form posts per client address in the last minute.
    pub posts: PerMinute,
}

impl PayerState {
    pub fn new() -> PayerState {
        PayerState { key: FormKey::random(), posts: PerMinute::new(POSTS_PER_MINUTE) }
    }

    /// The state of a node of a cluster: forms signed under the key every node derives.
    pub fn in_cluster(key: [u8; 32]) -> PayerState {
        PayerState { key: FormKey::shared(key), posts: PerMinute::new(POSTS_PER_MINUTE) }
    }
}

impl Default for PayerState {
    fn default() -> Self {
        PayerState::new()
    }
}

/// Registers the payment page. The app must hold a `web::Data<PayerState>` shared by every worker.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/payer/{id}").route(web::get().to(show)).route(web::post().to(submit)))
        .service(web::resource("/payer/{id}/{reference}").route(web::get().to(status)))
        // CinetPay brings the browser back with a form POST; Wave with a GET.
        .service(web::resource("/retour/{transaction}").route(web::get().to(back)).route(web::post().to(back)))
        .service(web::resource("/assets/payer.css").route(web::get().to(pages::stylesheet)));
}

/// A page of the flow, with the headers every one carries: never cached, never framed, no script, nothing
/// from another host.
fn page(status: StatusCode, markup: maud::Markup) -> HttpResponse {
    let mut response = HttpResponse::build(status);
    secure(&mut response);
    response.content_type("text/html; charset=utf-8").body(markup.into_string())
}

/// `form-action` lets the form's answer take the customer to a provider's page (https; a local fake on the
/// loopback), which browsers check against the policy like the form's own target.
fn secure(response: &mut actix_web::HttpResponseBuilder) {
    crate::dashboard::secure_headers_with(
        response,
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self' https: http://127.0.0.1:* http://localhost:*; frame-ancestors 'none'; base-uri 'none'",
    );
}

fn see_other(location: &str) -> HttpResponse {
    let mut response = HttpResponse::SeeOther();
    secure(&mut response);
    response.insert_header((header::LOCATION, location.to_owned())).finish()
}

/// Why a page of the flow cannot be shown, as the customer reads it.
fn trouble(status: StatusCode, title: &str, message: &str) -> HttpResponse {
    page(status, pages::message(title, message, None))
}

fn unavailable() -> HttpResponse {
    trouble(
        StatusCode::SERVICE_UNAVAILABLE,
        "Service momentanément indisponible",
        "Le paiement ne peut pas être enregistré pour l'instant. Réessayez dans un moment.",
    )
}

fn internal(context: &str, detail: impl std::fmt::Display) -> HttpResponse {
    tracing::error!(target: "caisse::payer", context, error = %detail, "internal error");
    trouble(StatusCode::INTERNAL_SERVER_ERROR, "Erreur", "Une erreur est survenue. Réessayez dans un moment.")
}

/// The payment was asked for but not confirmed in time (in a cluster, the merchant's node did not answer): it
/// may have been made. Sending the same form again is safe (it carries its idempotency key) and shows which.
fn unconfirmed() -> HttpResponse {
    trouble(
        StatusCode::SERVICE_UNAVAILABLE,
        "Paiement non confirmé",
        "Le paiement n'a pas été confirmé à temps et a peut-être été enregistré. Renvoyez le même formulaire dans \
         un moment pour connaître son état, sans en remplir un nouveau.",
    )
}

fn engine_trouble(context: &str, err: EngineError) -> HttpResponse {
    match err {
        EngineError::OutcomeUnknown(_) => unconfirmed(),
        EngineError::Unavailable(_) | EngineError::Retired => unavailable(),
        other => internal(context, other),
    }
}

fn not_found() -> HttpResponse {
    trouble(StatusCode::NOT_FOUND, "Lien introuvable", "Ce lien de paiement n'existe pas. Vérifiez l'adresse reçue.")
}

/// A link and its merchant, found by the link's id alone; links are off, unknown, or (for `Wanted::ToPay`) a
/// suspended merchant's are answered as the customer should read them.
struct Found {
    merchant: MerchantId,
    merchant_name: String,
    link: Link,
}

/// What the customer comes for: a suspended merchant takes no new payment, but a payment already under way
/// completes, and its customer still sees how it ended.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wanted {
    ToPay,
    ToSeeAPayment,
}

async fn find(state: &AppState, id: &str, wanted: Wanted) -> Result<Found, HttpResponse> {
    if state.links_base.is_none() || validate_id(IdKind::Link, id).is_err() {
        return Err(not_found());
    }
    let owner = state.engine.link_owner(id).map_err(|e| engine_trouble("link owner", e))?;
    let Some(merchant) = owner else { return Err(not_found()) };
    let link = state.engine.link(&merchant, id).await.map_err(|e| engine_trouble("link", e))?;
    let Some(link) = link.filter(|l| l.id == id) else { return Err(not_found()) };
    let account = state.engine.merchant(&merchant).map_err(|e| engine_trouble("merchant", e))?;
    let Some(account) = account else { return Err(not_found()) };
    if wanted == Wanted::ToPay
        && state.engine.suspended_since(&merchant).map_err(|e| engine_trouble("suspension", e))?.is_some()
    {
        return Err(trouble(
            StatusCode::FORBIDDEN,
            "Paiement impossible",
            "Ce marchand n'accepte pas de paiement pour l'instant.",
        ));
    }
    Ok(Found { merchant, merchant_name: account.name, link })
}

/// The page of a link that no longer takes payments: 410 and why.
fn closed(found: &Found, now: Timestamp) -> HttpResponse {
    let why = match found.link.status_at(now).as_str() {
        "paye" => "Ce lien a déjà été payé.",
        "expire" => "Ce lien a expiré.",
        _ => "Ce lien n'est plus actif.",
    };
    page(StatusCode::GONE, pages::message("Paiement impossible", why, Some(&found.merchant_name)))
}

/// The fournisseurs a customer may choose on this link now: the link's, active, taking its amount.
fn choices(state: &AppState, link: &Link) -> Vec<pages::Choice> {
    link.providers
        .iter()
        .filter_map(|code| {
            let amount = link.amount.minor();
            let (provider, currency, amount) =
                provider_for(state, code.as_str(), link.currency.code(), amount, Operation::Payment).ok()?;
            // Its fee or its rules changed since the link was made: not offered rather than failing at the end.
            provider.takes_anyone(currency, amount).ok()?;
            Some(pages::Choice {
                code: code.as_str().to_owned(),
                name: provider.settings.name.clone(),
                countries: provider.published_countries(),
            })
        })
        .collect()
}

fn client_address(req: &HttpRequest, state: &AppState) -> Option<std::net::IpAddr> {
    crate::client_address::of_request(req, &state.settings.trusted_proxies)
}

/// `GET /payer/{id}`.
pub async fn show(
    state: web::Data<AppState>,
    payer: web::Data<PayerState>,
    req: HttpRequest,
    path: web::Path<String>,
) -> HttpResponse {
    let found = match find(&state, &path, Wanted::ToPay).await {
        Ok(found) => found,
        Err(answer) => return answer,
    };
    let now = Timestamp::now();
    if !found.link.takes_payments(now) {
        return closed(&found, now);
    }
    let browser = browser(&req);
    form_page(&state, &payer, &found, browser.as_deref(), &pages::Entered::default(), None, StatusCode::OK)
}

/// The browser id its cookie carries, if any.
fn browser(req: &HttpRequest) -> Option<String> {
    crate::dashboard::auth::cookie(req, tokens::COOKIE)
}

/// The form, with a fresh token and its cookie; `error` says what was wrong with what the customer sent.
fn form_page(
    state: &AppState,
    payer: &PayerState,
    found: &Found,
    browser: Option<&str>,
    entered: &pages::Entered,
    error: Option<(&str, String)>,
    status: StatusCode,
) -> HttpResponse {
    let choices = choices(state, &found.link);
    if choices.is_empty() {
        return page(
            StatusCode::SERVICE_UNAVAILABLE,
            pages::message(
                "Paiement momentanément impossible",
                "Aucun moyen de paiement de ce lien n'est disponible pour l'instant. Réessayez plus tard.",
                Some(&found.merchant_name),
            ),
        );
    }
    let issued = payer.key.issue(&found.link.id, browser, Timestamp::now());
    let sandbox = state.settings.environment == Environment::Sandbox;
    let view = pages::FormView { merchant: &found.merchant_name, link: &found.link, choices: &choices, sandbox };
    let mut response = HttpResponse::build(status);
    secure(&mut response);
    if issued.new_browser {
        let production = state.settings.environment == Environment::Production;
        response.insert_header((header::SET_COOKIE, tokens::set_cookie(&issued, production)));
    }
    response
        .content_type("text/html; charset=utf-8")
        .body(pages::form(&view, &issued.token, entered, error).into_string())
}

/// Reads the posted form, at most [`MAX_FORM_BYTES`].
async fn read_form(payload: web::Payload) -> Result<Form, HttpResponse> {
    crate::dashboard::read_form_limited(payload, MAX_FORM_BYTES).await.map_err(|_| {
        trouble(StatusCode::BAD_REQUEST, "Formulaire illisible", "Le formulaire n'a pas pu être lu. Rechargez la page.")
    })
}

/// `POST /payer/{id}`.
pub async fn submit(
    state: web::Data<AppState>,
    payer: web::Data<PayerState>,
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
) -> HttpResponse {
    let now_instant = Instant::now();
    if let Some(address) = client_address(&req, &state).map(crate::client_address::counted) {
        if let Err(wait_s) = payer.posts.hit(address, now_instant) {
            let mut answer = trouble(
                StatusCode::TOO_MANY_REQUESTS,
                "Trop de tentatives",
                "Trop de formulaires envoyés depuis cette connexion. Patientez une minute puis réessayez.",
            );
            if let Ok(value) = HeaderValue::from_str(&wait_s.to_string()) {
                answer.headers_mut().insert(header::RETRY_AFTER, value);
            }
            return answer;
        }
    }
    let found = match find(&state, &path, Wanted::ToPay).await {
        Ok(found) => found,
        Err(answer) => return answer,
    };
    let now = Timestamp::now();
    // A closed link still takes a form it issued before it closed, so that a second tap on a form whose
    // payment closed the link lands on that payment; the engine refuses any new payment through it.
    let form = match read_form(payload).await {
        Ok(form) => form,
        Err(answer) => return answer,
    };
    let entered = pages::Entered::from_form(&form);
    let browser = browser(&req);
    let browser = browser.as_deref();
    let nonce = match payer.key.check(form.get("jeton").unwrap_or(""), browser, &found.link.id, now) {
        Ok(nonce) => nonce,
        Err(_) if !found.link.takes_payments(now) => return closed(&found, now),
        Err(why) => {
            let message = format!("{why} Vérifiez vos informations et envoyez de nouveau.");
            return form_page(&state, &payer, &found, browser, &entered, Some(("", message)), StatusCode::FORBIDDEN);
        }
    };
    let (new, route) = match checked_payment(&state, &found, &entered) {
        Ok(checked) => checked,
        Err(_) if !found.link.takes_payments(now) => return closed(&found, now),
        Err(e) => {
            let field = match e.field.as_deref() {
                Some("client_telephone") => "telephone",
                Some("fournisseur") => "fournisseur",
                Some("client_nom") => "nom",
                Some("client_email") => "email",
                _ => "",
            };
            let error = Some((field, e.message));
            return form_page(&state, &payer, &found, browser, &entered, error, StatusCode::BAD_REQUEST);
        }
    };
    let idempotency = Idempotency {
        key: match caisse_engine::domain::text::IdempotencyKey::parse(&format!("payer-{nonce}")) {
            Ok(key) => key,
            Err(e) => return internal("form nonce", e),
        },
        fingerprint: entered.fingerprint(&found.link.id),
        earlier_fingerprint: None,
        success_status: 201,
        part: Part::Only,
    };
    let started = start(&state, &found.merchant, new, route, idempotency).await;
    match started {
        // The provider's page only while the payment waits there; a finished one ends on its own page.
        Ok(payment) => match &payment.payment_url {
            Some(url) if matches!(payment.status, PaymentStatus::Initiated | PaymentStatus::Processing) => {
                see_other(url)
            }
            _ => to_waiting_page(&state, &payment),
        },
        Err(Started::Closed) => closed(&found, Timestamp::now()),
        Err(Started::Reused) => trouble(
            StatusCode::CONFLICT,
            "Formulaire déjà envoyé",
            "Ce formulaire a déjà servi pour un autre paiement. Rechargez la page du lien pour payer de nouveau.",
        ),
        Err(Started::Refused(e)) => {
            let e = unavailable_here(e);
            form_page(
                &state,
                &payer,
                &found,
                browser,
                &entered,
                Some(("fournisseur", e.message)),
                StatusCode::BAD_REQUEST,
            )
        }
        Err(Started::Failed(answer)) => answer,
    }
}

/// Where the form sends the customer once the payment is made: its page, as kept in the payment's route (the
/// provider's return page is the same address), so a double tap that replays the first tap's payment lands on
/// the first tap's page, key included. Under `public_url` when one is set; without one (the sandbox) the path
/// alone keeps the customer on whatever address they opened the link at (a phone on the LAN, a remapped port).
fn to_waiting_page(state: &AppState, payment: &Payment) -> HttpResponse {
    let route = match state.engine.route_of(&payment.transaction_id) {
        Ok(route) => route,
        Err(e) => return engine_trouble("payment route", e),
    };
    let Some(page) = route.and_then(|r| r.return_url) else {
        return internal("payment route", format!("{} has no page", payment.reference));
    };
    let page = page.as_str();
    if !state.settings.public_url.is_empty() {
        return see_other(page);
    }
    match page.find("/payer/") {
        Some(at) => see_other(&page[at..]),
        None => internal("payment route", format!("{} has a page outside /payer/", payment.reference)),
    }
}

/// The key in a payment page's address as `checked_payment` made it (`…?cle=…`), if any.
fn page_key(url: &str) -> Option<String> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(url.split_once('?')?.1).ok()?;
    pairs.into_iter().find(|(name, _)| name == PAGE_KEY).map(|(_, key)| key)
}

/// A refusal that is about the server's setup or the link (a fournisseur no longer active, its limits or fee
/// changed since the link was made), not about what the customer typed: logged for the operator, and told to
/// the customer in French, without the setup's details.
fn unavailable_here(e: ApiError) -> ApiError {
    tracing::info!(code = e.code, field = ?e.field, message = %e.message, "a payment link's payment refused");
    ApiError::invalid("fournisseur", "Ce moyen de paiement ne peut pas prendre ce paiement. Choisissez-en un autre.")
}

/// The payment the form asks for, checked by the same rules as the API's, with the route it takes.
fn checked_payment(
    state: &AppState,
    found: &Found,
    entered: &pages::Entered,
) -> Result<(NewPayment, ProviderRoute), ApiError> {
    let link = &found.link;
    if !link.providers.iter().any(|p| p.as_str() == entered.provider) {
        return Err(ApiError::invalid("fournisseur", "Choisissez un moyen de paiement de la liste."));
    }
    let (provider, currency, amount) =
        provider_for(state, &entered.provider, link.currency.code(), link.amount.minor(), Operation::Payment)
            .map_err(unavailable_here)?;
    let phone = Phone::parse_national(&entered.phone, &entered.country).map_err(|_| {
        ApiError::invalid(
            "client_telephone",
            "Numéro de téléphone invalide : saisissez votre numéro, par exemple 97 00 00 01 ou +229 97 00 00 01.",
        )
    })?;
    let ask = Ask { operation: Operation::Payment, currency, amount };
    let reference = Reference::parse(&new_id(IdKind::Payment)).map_err(|e| ApiError::internal("payment id", e))?;
    let base = state.links_base.as_deref().unwrap_or_default();
    let production = state.settings.environment == Environment::Production;
    // The provider's page sends the customer back to this link's waiting page, which ends on the receipt. Its
    // key, drawn here and kept with the payment's route, is what opens that page.
    let key = random_base62(PAGE_KEY_LEN);
    let return_url = ReturnUrl::parse(&format!("{base}{}/{reference}?{PAGE_KEY}={key}", link.id), production)
        .map_err(|e| ApiError::internal("return url", e))?;
    let route = check_route(provider, &phone, "client_telephone", &ask).map_err(|e| match e.code {
        "unsupported_provider" => ApiError::invalid(
            "client_telephone",
            format!(
                "{} ne prend pas les numéros de ce pays. Choisissez un autre moyen de paiement.",
                provider.settings.name
            ),
        ),
        _ => unavailable_here(e),
    })?;
    let name = match entered.name.trim() {
        "" => None,
        text => Some(Name::parse(text).map_err(|_| ApiError::invalid("client_nom", "Nom trop long ou invalide."))?),
    };
    let email = match entered.email.trim() {
        "" => None,
        text => Some(Email::parse(text).map_err(|_| ApiError::invalid("client_email", "Adresse e-mail invalide."))?),
    };
    crate::http::paiement::card_holder(provider, email.as_ref(), name.as_ref()).map_err(|e| {
        match e.field.as_deref() {
            Some("client_nom") => {
                ApiError::invalid("client_nom", "Pour payer par carte, indiquez le nom du titulaire.")
            }
            _ => ApiError::invalid("client_email", "Pour payer par carte, indiquez une adresse e-mail."),
        }
    })?;
    let new = NewPayment {
        reference: Some(reference),
        amount,
        currency,
        provider: provider.settings.code.clone(),
        fee: provider.settings.fee,
        customer_phone: phone,
        customer_email: email,
        customer_name: name,
        description: Some(link.description.clone()),
        metadata: link.metadata.clone(),
        link: Some(link.id.clone()),
    };
    Ok((new, ProviderRoute { return_url: Some(return_url), ..route }))
}

enum Started {
    Closed,
    Reused,
    Refused(ApiError),
    Failed(HttpResponse),
}

/// Starts the payment like the API does; a double tap (the same form again) gets the first tap's payment,
/// waiting a moment if the first tap is still being written.
async fn start(
    state: &AppState,
    merchant: &MerchantId,
    new: NewPayment,
    route: ProviderRoute,
    idempotency: Idempotency,
) -> Result<Payment, Started> {
    let deadline = Instant::now() + std::time::Duration::from_millis(DOUBLE_TAP_WAIT_MS);
    loop {
        let result =
            state.flow.initiate_payment(merchant, new.clone(), Some(route.clone()), Some(idempotency.clone())).await;
        match result {
            Ok(Executed::Done(Record::Payment(p))) => return Ok(p),
            // The first tap's payment, as it is now (a replay answers it as the first tap's request did).
            Ok(Executed::Replayed { body, .. }) => {
                let first = serde_json::from_str::<Payment>(&body)
                    .map_err(|e| Started::Failed(internal("replayed payment", e)))?;
                return match state.engine.payment(merchant, first.reference.as_str()).await {
                    Ok(now) => Ok(now.unwrap_or(first)),
                    Err(e) => Err(Started::Failed(engine_trouble("replayed payment", e))),
                };
            }
            Ok(other) => return Err(Started::Failed(internal("payment", format!("{other:?}")))),
            Err(EngineError::IdempotencyKeyInUse) if Instant::now() < deadline => {
                actix_web::rt::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            Err(EngineError::IdempotencyKeyReused) => return Err(Started::Reused),
            Err(EngineError::Rejected(Rejection::LinkClosed(_))) => return Err(Started::Closed),
            Err(e @ EngineError::Rejected(Rejection::AmountBelowFee { .. } | Rejection::Money(_))) => {
                return Err(Started::Refused(ApiError::from(e)))
            }
            Err(e) => return Err(Started::Failed(engine_trouble("payment", e))),
        }
    }
}

/// `GET /payer/{id}/{reference}?cle=…`.
pub async fn status(state: web::Data<AppState>, req: HttpRequest, path: web::Path<(String, String)>) -> HttpResponse {
    let (id, reference) = path.into_inner();
    let found = match find(&state, &id, Wanted::ToSeeAPayment).await {
        Ok(found) => found,
        Err(answer) => return answer,
    };
    let missing =
        || trouble(StatusCode::NOT_FOUND, "Paiement introuvable", "Ce paiement n'existe pas. Vérifiez l'adresse.");
    if Reference::parse(&reference).is_err() {
        return missing();
    }
    let payment = match state.engine.payment(&found.merchant, &reference).await {
        Ok(payment) => payment,
        Err(e) => return engine_trouble("payment", e),
    };
    // Only a payment made through this very link: the page never shows another of the merchant's payments.
    let Some(payment) = payment.filter(|p| caisse_engine::domain::links::link_of(&p.metadata) == Some(id.as_str()))
    else {
        return missing();
    };
    // Only with the page's key. A payment whose route names no key was made before pages had keys: its
    // address, already given to its customer and its provider, still opens it.
    let route = match state.engine.route_of(&payment.transaction_id) {
        Ok(route) => route,
        Err(e) => return engine_trouble("payment route", e),
    };
    let expected = route.as_ref().and_then(|r| r.return_url.as_ref()).and_then(|url| page_key(url.as_str()));
    if let Some(expected) = expected {
        let given = crate::dashboard::query(&req).remove(PAGE_KEY).unwrap_or_default();
        if !bool::from(expected.as_bytes().ct_eq(given.as_bytes())) {
            return missing();
        }
    }
    let provider_name = state
        .providers
        .get(payment.provider.as_str())
        .map_or_else(|| payment.provider.as_str().to_owned(), |p| p.settings.name.clone());
    let retry = found.link.takes_payments(Timestamp::now());
    page(StatusCode::OK, pages::status(&found.merchant_name, &found.link, &payment, &provider_name, retry))
}

/// SHA-256 of the fields that make a form what it is, so a double tap with the same fields is a replay and
/// one with other fields is refused.
fn fingerprint(link: &str, fields: &[&str]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"payer\0");
    hasher.update(link.as_bytes());
    for field in fields {
        hasher.update([0]);
        hasher.update(field.as_bytes());
    }
    hex::encode(hasher.finalize())
}

/// `GET /retour/{transaction id}`: the customer's browser back from the provider's page.
pub async fn back(state: web::Data<AppState>, path: web::Path<String>) -> HttpResponse {
    let tx = path.into_inner();
    let missing = || trouble(StatusCode::NOT_FOUND, "Paiement introuvable", "Ce paiement n'existe pas.");
    if validate_id(IdKind::Transaction, &tx).is_err() {
        return missing();
    }
    let located = match state.engine.owner_of_transaction(&tx) {
        Ok(found) => found,
        Err(e) => return engine_trouble("return owner", e),
    };
    let Some((_, caisse_engine::store::Located { record: Record::Payment(payment), .. })) = located else {
        return missing();
    };
    if payment.transaction_id != tx {
        return missing();
    }
    let route = match state.engine.route_of(&tx) {
        Ok(route) => route,
        Err(e) => return engine_trouble("return route", e),
    };
    match route.and_then(|r| r.return_url) {
        Some(url) => see_other(&with_reference(url.as_str(), payment.reference.as_str())),
        None => page(StatusCode::OK, pages::returned(&payment)),
    }
}

/// `url` with `reference` added to its query, before any `#fragment` (which the merchant's server never sees).
fn with_reference(url: &str, reference: &str) -> String {
    let (address, fragment) = match url.split_once('#') {
        Some((address, fragment)) => (address, Some(fragment)),
        None => (url, None),
    };
    let separator = if address.contains('?') { '&' } else { '?' };
    match fragment {
        Some(fragment) => format!("{address}{separator}reference={reference}#{fragment}"),
        None => format!("{address}{separator}reference={reference}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_key_is_read_from_its_own_parameter_only() {
        assert_eq!(page_key("https://a.example/payer/lnk_1/pay_1?cle=abc").as_deref(), Some("abc"));
        assert_eq!(page_key("/payer/lnk_1/pay_1?reference=r&cle=abc").as_deref(), Some("abc"));
        assert_eq!(page_key("/payer/lnk_1/pay_1?clef=abc"), None);
        assert_eq!(page_key("/payer/lnk_1/pay_1"), None);
    }

    #[test]
    fn the_reference_goes_in_the_query_before_any_fragment() {
        assert_eq!(with_reference("https://a.example/merci", "r1"), "https://a.example/merci?reference=r1");
        assert_eq!(with_reference("https://a.example/m?x=1", "r1"), "https://a.example/m?x=1&reference=r1");
        assert_eq!(with_reference("https://a.example/m#fin", "r1"), "https://a.example/m?reference=r1#fin");
    }
}
