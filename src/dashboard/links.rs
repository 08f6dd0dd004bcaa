//! "Liens de paiement": the merchant's payment links (docs/links.md). `GET /links` lists them with their
//! payments and amount collected; `GET`/`POST /links/new` creates one by the API's rules
//! (`http::liens::checked_link`); `GET /links/{id}` shows its URL to copy, its QR code and its payments;
//! `GET /links/{id}/qr.svg` is the QR code (`?telecharger=1` to download it); `POST /links/{id}/deactivate`
//! closes it.
//!
//! Creating a link moves no money, so it needs no review page; its form carries a one-time key that goes to the
//! engine as an idempotency key, so a double click makes one link.

use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use caisse_engine::domain::ids::{random_base62, validate_id, IdKind};
use caisse_engine::domain::links::Link;
use caisse_engine::domain::money::CURRENCIES;
use caisse_engine::domain::records::Payment;
use caisse_engine::domain::status::LinkStatus;
use caisse_engine::domain::time::Timestamp;
use caisse_engine::{Command, EngineError, Executed, Record};
use maud::{html, Markup, PreEscaped};
use qrcodegen::{QrCode, QrCodeEcc};

use super::layout::{self, badge, cell, csrf_field, money, time, Nav};
use super::{html, paged, query, redirect_to, DashError, Form, LoggedIn, PAGE_SIZE};
use crate::config::Operation;
use crate::http::liens::{checked_link, page_base, CreateBody};
use crate::http::AppState;

/// Length of the one-time key the creation form carries.
const KEY_LEN: usize = 32;

/// `GET /links`.
pub async fn list(state: web::Data<AppState>, user: LoggedIn, req: HttpRequest) -> Result<HttpResponse, DashError> {
    let query = query(&req);
    let cursor = query.get("apres").filter(|c| validate_id(IdKind::Link, c).is_ok()).cloned();
    let now = Timestamp::now();
    let page = state.engine.links(&user.merchant.id, cursor.as_deref(), PAGE_SIZE + 1, &mut |_| true)?;
    let (rows, next) = paged(page, PAGE_SIZE, |l: &Link| l.id.clone());
    let off = page_base(&state).is_err();
    let body = html! {
        h1 { "Liens de paiement" }
        p.muted { "Un lien se partage par message ou en QR code : le client paie sur une page de Caisse, sans que vous écriviez de code." }
        @if off {
            (layout::notice("error", "Les liens de paiement sont désactivés sur ce serveur : son adresse publique (public_url) doit être en https."))
        } @else {
            p { a.button href="/links/new" { "Nouveau lien…" } }
        }
        @if rows.is_empty() { p.muted { "Aucun lien pour l'instant." } } @else {
            table.list #links {
                thead { tr {
                    th { "Créé" } th { "Lien" } th { "Statut" } th.num { "Montant" } th.num { "Paiements" } th.num { "Encaissé" } th { "Usage" }
                } }
                tbody {
                    @for l in &rows {
                        tr {
                            (cell("Créé", html! { (time(l.created_at)) }))
                            (cell("Lien", html! {
                                a href={ "/links/" (l.id) } { (layout::prefix(l.description.as_str(), 60)) }
                                @if let Some(r) = &l.reference { " " span.muted { (r.as_str()) } }
                            }))
                            (cell("Statut", badge(l.status_at(now).as_str())))
                            td.num data-label="Montant" { (money(l.amount.minor(), l.currency)) }
                            td.num data-label="Paiements" { (l.payments) }
                            td.num data-label="Encaissé" { (money(l.collected.minor(), l.currency)) }
                            (cell("Usage", html! { (l.usage.as_str()) }))
                        }
                    }
                }
            }
        }
        nav.pages {
            @if cursor.is_some() { a href="/links" { "← Première page" } }
            @if let Some(next) = &next { a.next href={ "/links?apres=" (next) } { "Page suivante →" } }
        }
    };
    Ok(html(StatusCode::OK, layout::page(&user, state.settings.environment, Nav::Links, "Liens de paiement", body)))
}

/// The creation form's fields, as typed.
const FIELDS: [(&str, &str); 7] = [
    ("description", "Description (ce que le client paie)"),
    ("montant", "Montant (plus petite unité de la devise)"),
    ("devise", "Devise"),
    ("usage", "Usage"),
    ("expire_le", "Expire le (facultatif, UTC)"),
    ("reference", "Votre référence (facultative)"),
    ("url_retour", "Adresse de retour après paiement (facultative)"),
];

/// `GET /links/new`.
pub async fn new_form(state: web::Data<AppState>, user: LoggedIn) -> HttpResponse {
    let body = create_page(&state, &user.csrf, &Form::default(), None);
    html(StatusCode::OK, layout::page(&user, state.settings.environment, Nav::Links, "Nouveau lien", body))
}

/// `POST /links/new`.
pub async fn create(
    state: web::Data<AppState>,
    user: LoggedIn,
    payload: web::Payload,
) -> Result<HttpResponse, DashError> {
    let form = user.form(payload).await?;
    super::actions::refuse_if_suspended(&state, &user)?;
    let page = |status: StatusCode, body: Markup| {
        Ok(html(status, layout::page(&user, state.settings.environment, Nav::Links, "Nouveau lien", body)))
    };
    let text = |name: &str| form.get(name).unwrap_or("").trim().to_owned();
    let optional = |name: &str| Some(text(name)).filter(|v| !v.is_empty());
    let Ok(amount) = text("montant").parse::<i64>() else {
        let message = "Montant : un nombre entier positif, dans la plus petite unité de la devise.";
        return page(StatusCode::BAD_REQUEST, create_page(&state, &user.csrf, &form, Some(message)));
    };
    // The browser's datetime-local field has no zone: the page says it is UTC.
    let expire_at = optional("expire_le").map(|t| if t.len() == 16 { format!("{t}:00Z") } else { format!("{t}Z") });
    let providers: Vec<String> = form.all("fournisseurs").into_iter().map(str::to_owned).collect();
    let request = CreateBody {
        amount,
        currency: text("devise"),
        description: text("description"),
        providers: if providers.is_empty() { None } else { Some(providers) },
        reference: optional("reference"),
        usage: optional("usage"),
        expire_at,
        return_url: optional("url_retour"),
        metadata: None,
    };
    let new = match checked_link(&state, request) {
        Ok(new) => new,
        Err(e) => {
            let field = match e.field.as_deref() {
                Some("expire_at") => Some("expire_le"),
                other => other,
            };
            let label = FIELDS.iter().find(|(name, _)| Some(*name) == field).map(|(_, l)| *l);
            let label = label.or((field == Some("fournisseurs")).then_some("Moyens de paiement"));
            let message = format!("{} : {}", label.unwrap_or("Lien"), e.message);
            return page(e.status, create_page(&state, &user.csrf, &form, Some(&message)));
        }
    };
    let values: Vec<String> = FIELDS.iter().map(|(name, _)| text(name)).collect();
    let mut parts = vec!["link"];
    parts.extend(values.iter().map(String::as_str));
    let joined = form.all("fournisseurs").join(",");
    parts.push(&joined);
    let idempotency = super::actions::one_time_key(&form, &parts)?;
    match state.engine.execute(&user.merchant.id, Command::CreateLink(new), Some(idempotency)).await {
        Ok(executed) => {
            let id = match executed {
                Executed::Done(Record::Link(l)) => Some(l.id),
                Executed::Replayed { body, .. } => serde_json::from_str::<Link>(&body).ok().map(|l| l.id),
                _ => None,
            };
            tracing::info!(target: "caisse::dashboard", merchant = %user.merchant.id.as_str(), link = ?id, "payment link created from the dashboard");
            Ok(redirect_to(id.map_or_else(|| "/links".to_owned(), |id| format!("/links/{id}"))))
        }
        Err(e) => {
            let (status, message) = super::actions::refusal(e)?;
            page(status, create_page(&state, &user.csrf, &form, Some(&message)))
        }
    }
}

fn create_page(state: &AppState, csrf: &str, form: &Form, error: Option<&str>) -> Markup {
    let value = |name: &str| form.get(name).unwrap_or("").to_owned();
    let chosen = form.all("fournisseurs");
    let providers: Vec<_> =
        state.providers.all().filter(|p| p.active() && p.settings.operations.contains(&Operation::Payment)).collect();
    let currency = if value("devise").is_empty() { "XOF".to_owned() } else { value("devise") };
    let usage = value("usage");
    html! {
        p { a href="/links" { "← Liens de paiement" } }
        h1 { "Nouveau lien de paiement" }
        @if let Some(error) = error { (layout::notice("error", error)) }
        form.card method="post" action="/links/new" {
            (csrf_field(csrf))
            input type="hidden" name="cle" value=(form.get("cle").map_or_else(|| random_base62(KEY_LEN), str::to_owned));
            label for="description" { (FIELDS[0].1) input #description type="text" name="description" required maxlength="500" value=(value("description")); }
            label for="montant" { (FIELDS[1].1) input #montant type="number" name="montant" required min="1" step="1" inputmode="numeric" value=(value("montant")); }
            label for="devise" { (FIELDS[2].1) select #devise name="devise" {
                @for c in CURRENCIES { option value=(c.code) selected[currency == c.code] { (c.code) " · " (c.name) } }
            } }
            fieldset {
                legend { "Moyens de paiement (aucun coché : tous ceux de la devise)" }
                @for p in &providers {
                    label.check {
                        input type="checkbox" name="fournisseurs" value=(p.settings.code.as_str()) checked[chosen.contains(&p.settings.code.as_str())];
                        " " (p.settings.name)
                    }
                }
            }
            label for="usage" { (FIELDS[3].1) select #usage name="usage" {
                option value="unique" selected[usage != "multiple"] { "unique : se ferme au premier paiement réussi" }
                option value="multiple" selected[usage == "multiple"] { "multiple : reste ouvert" }
            } }
            label for="expire_le" { (FIELDS[4].1) input #expire_le type="datetime-local" name="expire_le" value=(value("expire_le")); }
            label for="reference" { (FIELDS[5].1) input #reference type="text" name="reference" maxlength="64" value=(value("reference")); }
            label for="url_retour" { (FIELDS[6].1) input #url_retour type="url" name="url_retour" maxlength="2048" value=(value("url_retour")); }
            div.actions { button.primary type="submit" { "Créer le lien" } a href="/links" { "Annuler" } }
        }
    }
}

async fn owned_link(state: &AppState, user: &LoggedIn, id: &str) -> Result<Link, DashError> {
    let not_found = || DashError::NotFound("Aucun lien de ce compte ne porte cet identifiant.");
    if validate_id(IdKind::Link, id).is_err() {
        return Err(not_found());
    }
    state.engine.link(&user.merchant.id, id).await?.filter(|l| l.id == id).ok_or_else(not_found)
}

/// `GET /links/{id}`.
pub async fn detail(
    state: web::Data<AppState>,
    user: LoggedIn,
    path: web::Path<String>,
    req: HttpRequest,
) -> Result<HttpResponse, DashError> {
    let link = owned_link(&state, &user, &path).await?;
    let query = query(&req);
    let cursor = query.get("apres").filter(|c| validate_id(IdKind::Transaction, c).is_ok()).cloned();
    let page = state.engine.link_payments(&user.merchant.id, &link.id, cursor.as_deref(), PAGE_SIZE + 1)?;
    let (payments, next) = paged(page, PAGE_SIZE, |p: &Payment| p.transaction_id.clone());
    let status = link.status_at(Timestamp::now());
    let body = html! {
        p { a href="/links" { "← Liens de paiement" } }
        h1 { (link.description.as_str()) }
        dl.summary {
            dt { "Statut" } dd { (badge(status.as_str())) }
            dt { "Montant" } dd { (money(link.amount.minor(), link.currency)) }
            dt { "Usage" } dd { (link.usage.as_str()) }
            dt { "Paiements réussis" } dd { (link.payments) }
            dt { "Encaissé" } dd { (money(link.collected.minor(), link.currency)) }
            dt { "Moyens de paiement" } dd { @for (n, p) in link.providers.iter().enumerate() { @if n > 0 { ", " } (p.as_str()) } }
            @if let Some(at) = link.expire_at { dt { "Expire" } dd { (time(at)) } }
            @if let Some(r) = &link.reference { dt { "Référence" } dd { (r.as_str()) } }
            dt { "Identifiant" } dd { code { (link.id) } }
        }
        section #partage {
            h2 { "Partager" }
            label for="url" { "Adresse du lien (sélectionnez-la pour la copier)" input #url type="text" readonly value=(link.url); }
            p { a href=(link.url) { "Ouvrir la page de paiement" } }
            img.qr src={ "/links/" (link.id) "/qr.svg" } alt={ "QR code du lien " (link.url) } width="200" height="200";
            p { a href={ "/links/" (link.id) "/qr.svg?telecharger=1" } download={ (link.id) ".svg" } { "Télécharger le QR code (SVG)" } }
        }
        @if status == LinkStatus::Active {
            form method="post" action={ "/links/" (link.id) "/deactivate" } {
                (csrf_field(&user.csrf))
                div.actions { button.danger type="submit" { "Désactiver ce lien" } }
                p.muted { "Un lien désactivé ne prend plus de paiement ; ceux déjà en cours se terminent." }
            }
        }
        h2 { "Paiements" }
        @if payments.is_empty() { p.muted { "Aucun paiement par ce lien pour l'instant." } } @else {
            table.list #link-payments {
                thead { tr { th { "Date" } th { "Paiement" } th { "Statut" } th.num { "Montant" } th { "Fournisseur" } } }
                tbody {
                    @for p in &payments {
                        tr {
                            (cell("Date", html! { (time(p.created_at)) }))
                            (cell("Paiement", html! { a href={ "/transactions/" (p.reference.as_str()) } { (p.reference.as_str()) } }))
                            (cell("Statut", badge(p.status.as_str())))
                            td.num data-label="Montant" { (money(p.amount.minor(), p.currency)) }
                            (cell("Fournisseur", html! { (p.provider) }))
                        }
                    }
                }
            }
        }
        nav.pages {
            @if cursor.is_some() { a href={ "/links/" (link.id) } { "← Premiers paiements" } }
            @if let Some(next) = &next { a.next href={ "/links/" (link.id) "?apres=" (next) } { "Page suivante →" } }
        }
    };
    let title = format!("Lien {}", link.id);
    Ok(html(StatusCode::OK, layout::page(&user, state.settings.environment, Nav::Links, &title, body)))
}

/// `POST /links/{id}/deactivate`.
pub async fn deactivate(
    state: web::Data<AppState>,
    user: LoggedIn,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, DashError> {
    user.form(payload).await?;
    let link = owned_link(&state, &user, &path).await?;
    match state.engine.execute(&user.merchant.id, Command::DeactivateLink { id: link.id.clone() }, None).await {
        // Already closed (paid, expired or deactivated in another tab): the page shows why.
        Ok(_) | Err(EngineError::Rejected(caisse_engine::Rejection::InvalidState(_))) => {
            tracing::info!(target: "caisse::dashboard", merchant = %user.merchant.id.as_str(), link = %link.id, "payment link deactivated from the dashboard");
            Ok(redirect_to(format!("/links/{}", link.id)))
        }
        Err(e) => Err(DashError::from(e)),
    }
}

/// `GET /links/{id}/qr.svg`: the link's URL as a QR code, drawn as one SVG path (quiet zone included).
pub async fn qr(
    state: web::Data<AppState>,
    user: LoggedIn,
    path: web::Path<String>,
    req: HttpRequest,
) -> Result<HttpResponse, DashError> {
    let link = owned_link(&state, &user, &path).await?;
    let svg =
        qr_svg(&link.url).ok_or_else(|| DashError::internal("qr code", "the link's URL does not fit a QR code"))?;
    let mut response = HttpResponse::Ok();
    response
        .insert_header((header::CACHE_CONTROL, HeaderValue::from_static("no-store")))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")))
        .insert_header((header::CONTENT_SECURITY_POLICY, HeaderValue::from_static("default-src 'none'")));
    if query(&req).contains_key("telecharger") {
        let disposition = format!("attachment; filename=\"{}.svg\"", link.id);
        if let Ok(value) = HeaderValue::from_str(&disposition) {
            response.insert_header((header::CONTENT_DISPOSITION, value));
        }
    }
    Ok(response.content_type("image/svg+xml").body(svg))
}

/// The QR code of `text` as SVG, or `None` if it does not fit the largest QR code.
pub fn qr_svg(text: &str) -> Option<String> {
    const QUIET: i32 = 4;
    let code = QrCode::encode_text(text, QrCodeEcc::Medium).ok()?;
    let size = code.size();
    let mut path = String::with_capacity((size * size) as usize * 8);
    for y in 0..size {
        for x in 0..size {
            if code.get_module(x, y) {
                path.push_str(&format!("M{},{}h1v1h-1z", x + QUIET, y + QUIET));
            }
        }
    }
    let full = size + 2 * QUIET;
    let svg = html! {
        svg xmlns="http://www.w3.org/2000/svg" viewBox={ "0 0 " (full) " " (full) } width="400" height="400" shape-rendering="crispEdges" {
            rect width="100%" height="100%" fill="#fff" {}
            path d=(PreEscaped(path)) fill="#000" {}
        }
    };
    Some(svg.into_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_qr_code_is_an_svg_of_the_url() {
        let svg = qr_svg("https://pay.example.com/payer/lnk_01JD0000000000000000000000").unwrap();
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(svg.contains("<path d=\"M4,4h1v1h-1z"), "the finder pattern's corner is dark");
        let decoded =
            QrCode::encode_text("https://pay.example.com/payer/lnk_01JD0000000000000000000000", QrCodeEcc::Medium)
                .unwrap();
        let modules = (0..decoded.size()).flat_map(|y| (0..decoded.size()).map(move |x| (x, y)));
        let dark = modules.filter(|(x, y)| decoded.get_module(*x, *y)).count();
        assert_eq!(svg.matches("h1v1h-1z").count(), dark, "one square per dark module");
        assert!(qr_svg(&"x".repeat(8_000)).is_none());
    }
}
