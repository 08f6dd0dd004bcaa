//! The "API keys" section (docs/api.md § Dashboard and operator commands): the secret key, masked with a reveal control
//! and a roll control behind a confirmation, and the field "Webhook URL" with its save.
//!
//! Rolling writes the merchant with a new key in one durable write, and the page answers only once it is
//! durable. With no grace (`key_roll_grace = 0`) the same write drops the old key's index entry, so the API
//! refuses it at once; with a grace, the write keeps the entry and records until when the old key is valid
//! (`KeyChange::ValidUntil`), after which the API refuses it. From the roll on, the delivery pool,
//! which reads the merchant's current key at each attempt, signs with the new one. The Webhook URL is checked by the webhook URL rules for this server's environment; in production that
//! resolves the host, so the check runs on a blocking thread. The pool reads the URL at each attempt too,
//! so the next delivery goes to the saved URL.
//!
//! Revealing the key is a POST carrying the CSRF token, so the full key is only ever in a page the merchant
//! asked for, never in one another site can make the browser load.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use caisse_engine::domain::time::Timestamp;
use caisse_engine::webhook::url::{UrlError, WebhookUrl, MAX_URL_LEN};
use caisse_engine::KeyChange;
use maud::{html, Markup};

use super::layout::{self, csrf_field, Nav};
use super::{html, query, redirect, DashError, LoggedIn};
use crate::config::Environment;
use crate::http::AppState;
use crate::merchants;

/// Characters of the key left visible at its end when masked.
const VISIBLE_TAIL: usize = 4;

struct View<'a> {
    revealed: bool,
    webhook_value: &'a str,
    webhook_error: Option<String>,
    info: Option<Markup>,
}

pub async fn show(state: web::Data<AppState>, user: LoggedIn, req: HttpRequest) -> HttpResponse {
    let info = match query(&req).get("info").map(String::as_str) {
        // What the roll did to the old key follows the server's grace, as the confirmation said.
        Some("cle_changee") => Some(layout::notice(
            "ok",
            &match state.settings.key_roll_grace_ms {
                0 => "Nouvelle clé secrète active : l'ancienne est refusée par l'API et les webhooks sont signés \
                      avec la nouvelle."
                    .to_owned(),
                ms => format!(
                    "Nouvelle clé secrète active : l'ancienne reste valable pour l'API pendant {}, puis reçoit 401. \
                     Les webhooks sont signés avec la nouvelle.",
                    grace_text(ms)
                ),
            },
        )),
        Some("webhook_enregistre") => Some(layout::notice("ok", "Webhook URL enregistrée.")),
        _ => None,
    };
    let value = user.merchant.webhook_url.clone().unwrap_or_default();
    let view = View { revealed: false, webhook_value: &value, webhook_error: None, info };
    html(StatusCode::OK, render(&state, &user, view))
}

/// `POST /keys/reveal`: the same page with the key in full.
pub async fn reveal(
    state: web::Data<AppState>,
    user: LoggedIn,
    payload: web::Payload,
) -> Result<HttpResponse, DashError> {
    user.form(payload).await?;
    let value = user.merchant.webhook_url.clone().unwrap_or_default();
    let view = View { revealed: true, webhook_value: &value, webhook_error: None, info: None };
    Ok(html(StatusCode::OK, render(&state, &user, view)))
}

/// `sk_test_••••…••wXyZ`: the environment prefix says which key it is, the tail lets the merchant match it
/// with the one in their configuration, and neither helps anybody guess the rest.
fn masked(key: &str) -> String {
    let prefixes = [Environment::Sandbox.key_prefix(), Environment::Production.key_prefix()];
    let prefix = prefixes.into_iter().find(|p| key.starts_with(p)).unwrap_or("");
    let rest: Vec<char> = key.chars().skip(prefix.chars().count()).collect();
    let shown = if rest.len() > 2 * VISIBLE_TAIL { VISIBLE_TAIL } else { 0 };
    let tail: String = rest[rest.len() - shown..].iter().collect();
    format!("{prefix}{}{tail}", "•".repeat(rest.len() - shown))
}

fn render(state: &AppState, user: &LoggedIn, view: View<'_>) -> Markup {
    let key = &user.merchant.secret_key;
    let production = state.settings.environment == Environment::Production;
    let body = html! {
        h1 { "API keys" }
        @if let Some(info) = view.info { (info) }
        section.card #secret-key {
            h2 { "Clé secrète" }
            p.muted {
                "Authentifie vos appels à l'API (" code { "Authorization: Bearer …" } ") et signe les webhooks envoyés à votre Webhook URL."
            }
            @if view.revealed {
                p { code.key #key-value { (key) } }
                p.muted { "Ne la partagez pas ; elle ne doit jamais apparaître dans du code client." }
            } @else {
                p { code.key #key-masked { (masked(key)) } }
            }
            div.key-actions {
                @if !view.revealed {
                    form.inline method="post" action="/keys/reveal" {
                        (csrf_field(&user.csrf))
                        button #reveal type="submit" { "Afficher la clé" }
                    }
                }
                a.button.danger #roll href="/keys/roll" { "Changer la clé…" }
            }
        }
        section.card #webhook {
            h2 { "Webhooks" }
            form method="post" action="/keys/webhook" {
                (csrf_field(&user.csrf))
                label for="webhook_url" { "Webhook URL" }
                input #webhook_url type="url" name="webhook_url" value=(view.webhook_value)
                    maxlength=(MAX_URL_LEN) placeholder="https://exemple.com/webhooks/caisse"
                    aria-invalid=[view.webhook_error.as_ref().map(|_| "true")]
                    aria-describedby="webhook_url_help";
                @if let Some(error) = &view.webhook_error {
                    p.field-error #webhook_url_error role="alert" { (error) }
                }
                p.muted #webhook_url_help {
                    @if production {
                        "Production : https:// uniquement, et jamais une adresse non publique (bouclage, privée, link-local, non spécifiée, réservée ou multicast)."
                    } @else {
                        "Sandbox : http:// et https:// sont acceptées. Laissez vide pour ne plus recevoir de webhooks."
                    }
                }
                button.primary #save-webhook type="submit" { "Enregistrer" }
            }
        }
    };
    layout::page(user, state.settings.environment, Nav::Keys, "API keys", body)
}

/// `GET /keys/roll`: the confirmation.
pub async fn confirm_roll(state: web::Data<AppState>, user: LoggedIn) -> HttpResponse {
    let body = html! {
        h1 { "Changer la clé secrète ?" }
        section.card {
            @if state.settings.key_roll_grace_ms == 0 {
                p { "Une nouvelle clé est créée et " strong { "l'ancienne cesse de fonctionner immédiatement" } " : les appels à l'API qui l'utilisent reçoivent 401, et les webhooks suivants sont signés avec la nouvelle clé." }
                p { "Mettez à jour votre serveur juste après." }
            } @else {
                p { "Une nouvelle clé est créée. " strong { "L'ancienne reste valable pour l'API pendant " (grace_text(state.settings.key_roll_grace_ms)) } ", puis reçoit 401. Les webhooks suivants sont signés avec la nouvelle clé dès maintenant." }
                p { "Mettez à jour votre serveur pendant ce délai ; si la clé a fuité, changez-la puis contactez l'opérateur." }
            }
            form.inline method="post" action="/keys/roll" {
                (csrf_field(&user.csrf))
                input type="hidden" name="confirmer" value="oui";
                button.danger #confirm-roll type="submit" { "Oui, changer la clé" }
            }
            " " a.button href="/keys" { "Annuler" }
        }
    };
    html(StatusCode::OK, layout::page(&user, state.settings.environment, Nav::Keys, "Changer la clé", body))
}

/// A grace period in words ("24 h", "30 min", "45 s").
fn grace_text(ms: u64) -> String {
    match ms / 1_000 {
        s if s >= 3_600 && s % 3_600 == 0 => format!("{} h", s / 3_600),
        s if s >= 60 && s % 60 == 0 => format!("{} min", s / 60),
        s => format!("{s} s"),
    }
}

/// `POST /keys/roll`.
pub async fn roll(
    state: web::Data<AppState>,
    user: LoggedIn,
    payload: web::Payload,
) -> Result<HttpResponse, DashError> {
    let form = user.form(payload).await?;
    if form.get("confirmer") != Some("oui") {
        return Err(DashError::BadRequest("La confirmation manque : la clé n'a pas été changée.".into()));
    }
    let env = state.settings.environment;
    let grace_ms = state.settings.key_roll_grace_ms;
    let rolled = state.engine.update_merchant(&user.merchant.id, move |merchant| {
        let old = std::mem::replace(&mut merchant.secret_key, merchants::new_secret_key(env));
        if grace_ms == 0 {
            KeyChange::Revoked(old)
        } else {
            KeyChange::ValidUntil(old, Timestamp::from_unix_ms(Timestamp::now().unix_ms().saturating_add(grace_ms)))
        }
    });
    rolled.await?.ok_or(DashError::Login)?;
    tracing::info!(target: "caisse::dashboard", merchant = %user.merchant.id.as_str(), grace_ms, "secret key rolled");
    Ok(redirect("/keys?info=cle_changee"))
}

/// `POST /keys/webhook`: an empty field removes the URL.
pub async fn save_webhook(
    state: web::Data<AppState>,
    user: LoggedIn,
    payload: web::Payload,
) -> Result<HttpResponse, DashError> {
    let form = user.form(payload).await?;
    let text = form.get("webhook_url").unwrap_or("").trim().to_owned();
    let checked = if text.is_empty() {
        Ok(None)
    } else {
        let production = state.settings.environment == Environment::Production;
        let candidate = text.clone();
        web::block(move || WebhookUrl::parse(&candidate, production))
            .await
            .map_err(|e| DashError::internal("webhook URL check", e))?
            .map(Some)
    };
    let url = match checked {
        Ok(url) => url,
        Err(e) => {
            let view = View { revealed: false, webhook_value: &text, webhook_error: Some(reason(&e)), info: None };
            return Ok(html(StatusCode::BAD_REQUEST, render(&state, &user, view)));
        }
    };
    let url = url.map(|u| u.as_str().to_owned());
    let saved = state.engine.update_merchant(&user.merchant.id, move |m| {
        m.webhook_url = url;
        KeyChange::Kept
    });
    saved.await?.ok_or(DashError::Login)?;
    tracing::info!(target: "caisse::dashboard", merchant = %user.merchant.id.as_str(), "webhook URL changed");
    Ok(redirect("/keys?info=webhook_enregistre"))
}

/// Why a URL was refused, in the dashboard's language.
fn reason(e: &UrlError) -> String {
    match e {
        UrlError::Malformed => "Ce n'est pas une URL absolue valide (https://hôte/chemin).".into(),
        UrlError::TooLong => format!("L'URL dépasse {MAX_URL_LEN} caractères."),
        UrlError::Scheme => "L'URL doit commencer par https:// (ou http:// en sandbox).".into(),
        UrlError::HttpInProduction => "En production, la Webhook URL doit utiliser https:// (http:// est refusé).".into(),
        UrlError::ForbiddenAddress(host) => format!(
            "L'hôte {host} est ou désigne une adresse non publique (bouclage, privée, link-local, non spécifiée, réservée ou multicast) : refusé en production."
        ),
        UrlError::Unresolvable(host) => format!("L'hôte {host} ne se résout pas (DNS)."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_masked_but_for_prefix_and_tail() {
        let key = "sk_test_abcdefghijklmnopqrstuvwxyz012345";
        let shown = masked(key);
        assert!(shown.starts_with("sk_test_"));
        assert!(shown.ends_with("2345"));
        assert!(!shown.contains("abcd"));
        assert_eq!(shown.chars().count(), key.len());
        assert_eq!(masked("sk_live_short"), "sk_live_•••••", "a short key shows nothing of its own");
    }
}
