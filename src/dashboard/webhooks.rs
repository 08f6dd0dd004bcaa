//! `GET /webhooks`: every webhook notification of the merchant with its attempts (time, HTTP status, latency,
//! error, the start of the signed string), the failed ones first; `POST /webhooks/{id}/resend` sends one
//! again through the delivery pool (docs/api.md § Webhook delivery: a failed notification can be sent again).
//!
//! The signed string of an attempt is `timestamp + "." + body` (docs/api.md § Webhook signature). The body is
//! stored once with the notification; each attempt records the timestamp it was signed with, so the page
//! shows the exact string (attempts logged before that field existed fall back to the attempt's time in whole
//! seconds).

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use caisse_engine::domain::ids::{validate_id, IdKind};
use caisse_engine::domain::records::{DeliveryState, Notification};
use caisse_engine::webhook::delivery::DeliveryError;
use maud::{html, Markup};

use super::layout::{self, badge, cell, csrf_field, prefix, time, time_opt, Nav};
use super::{html, paged, query, redirect, DashError, LoggedIn};
use crate::http::AppState;

/// Failed notifications shown at the top of the first page.
const FAILED_SHOWN: usize = 50;
/// Other notifications per page (each carries its attempts, so fewer than other lists).
const PER_PAGE: usize = 20;
/// Bytes of the body shown on a notification and in each attempt's signed string.
const BODY_PREVIEW: usize = 240;
const SIGNED_PREVIEW: usize = 64;

pub fn state_name(state: DeliveryState) -> &'static str {
    match state {
        DeliveryState::Pending => "pending",
        DeliveryState::Delivered => "delivered",
        DeliveryState::Failed => "failed",
    }
}

pub async fn list(state: web::Data<AppState>, user: LoggedIn, req: HttpRequest) -> Result<HttpResponse, DashError> {
    let query = query(&req);
    let only_failed = query.get("etat").is_some_and(|e| e == "echec");
    let cursor = query.get("apres").filter(|c| validate_id(IdKind::Event, c).is_ok()).cloned();
    let store = &state.engine;
    let id = &user.merchant.id;
    let failed = if cursor.is_none() && !only_failed {
        let page = store.notifications(id, None, FAILED_SHOWN + 1, &mut |n| n.state == DeliveryState::Failed)?;
        Some(paged(page, FAILED_SHOWN, |n: &Notification| n.id.clone()))
    } else {
        None
    };
    let (rows, next) = if only_failed {
        let page =
            store.notifications(id, cursor.as_deref(), PER_PAGE + 1, &mut |n| n.state == DeliveryState::Failed)?;
        paged(page, PER_PAGE, |n: &Notification| n.id.clone())
    } else {
        let page =
            store.notifications(id, cursor.as_deref(), PER_PAGE + 1, &mut |n| n.state != DeliveryState::Failed)?;
        paged(page, PER_PAGE, |n: &Notification| n.id.clone())
    };
    let info = match query.get("info").map(String::as_str) {
        Some("renvoye") => {
            Some(layout::notice("ok", "Notification renvoyée : une nouvelle tentative part maintenant."))
        }
        Some("en_cours") => {
            Some(layout::notice("warn", "Cette notification est en cours d'envoi ; réessayez dans un instant."))
        }
        _ => None,
    };
    let base = if only_failed { "/webhooks?etat=echec&apres=" } else { "/webhooks?apres=" };
    let body = html! {
        h1 { "Webhooks" }
        @if let Some(info) = info { (info) }
        p.muted {
            "Webhook URL : "
            @match &user.merchant.webhook_url { Some(url) => code { (url) }, None => "aucune" }
            " · " a href="/keys" { "modifier" }
        }
        (super::replay::tools(&user.csrf))
        @if let Some((failed, more)) = &failed {
            section #failed {
                h2 { "En échec (" (failed.len()) ")" }
                @if failed.is_empty() { p.muted { "Aucune notification en échec." } }
                @for n in failed { (card(n, &user.csrf)) }
                @if more.is_some() { p { a href="/webhooks?etat=echec" { "Toutes les notifications en échec →" } } }
            }
        }
        section #notifications {
            h2 { @if only_failed { "Notifications en échec" } @else { "Notifications" } }
            @if rows.is_empty() { p.muted { "Aucune notification." } }
            @for n in &rows { (card(n, &user.csrf)) }
            nav.pages {
                @if cursor.is_some() { a href=(if only_failed { "/webhooks?etat=echec" } else { "/webhooks" }) { "← Première page" } }
                @if let Some(next) = &next { a.next href={ (base) (next) } { "Page suivante →" } }
            }
        }
    };
    Ok(html(StatusCode::OK, layout::page(&user, state.settings.environment, Nav::Webhooks, "Webhooks", body)))
}

fn card(n: &Notification, csrf: &str) -> Markup {
    html! {
        article.notification #(n.id) data-state=(state_name(n.state)) {
            header {
                strong { (n.event.as_str()) } " " (badge(state_name(n.state)))
                " " a href={ "/transactions/" (n.reference) } { (n.reference) }
            }
            p.muted {
                "Créée " (time(n.created_at)) " · " (n.total_attempts) " tentative(s)"
                @if n.state == DeliveryState::Pending { " · prochaine : " (time_opt(n.next_attempt_at)) }
            }
            details {
                summary { "Corps (début)" }
                pre { code { (prefix(&n.body, BODY_PREVIEW)) } }
            }
            @if !n.attempts.is_empty() {
                table.list.attempts {
                    thead { tr { th { "Heure" } th { "Statut HTTP" } th.num { "Latence" } th { "Erreur" } th { "Chaîne signée (début)" } } }
                    tbody {
                        @for a in n.attempts.iter().rev() {
                            tr {
                                (cell("Heure", html! { (time(a.at)) }))
                                (cell("Statut HTTP", html! {
                                    @match a.http_status {
                                        Some(200) => span.badge.ok { "200" },
                                        Some(s) => span.badge.bad { (s) },
                                        None => span.muted { "—" },
                                    }
                                }))
                                td.num data-label="Latence" { (a.latency_ms) " ms" }
                                (cell("Erreur", html! { (a.error.as_deref().unwrap_or("—")) }))
                                (cell("Chaîne signée (début)", html! { code.signed { (a.signed_at_s.unwrap_or_else(|| a.at.unix_s())) "." (prefix(&n.body, SIGNED_PREVIEW)) } }))
                            }
                        }
                    }
                }
            }
            form.inline method="post" action={ "/webhooks/" (n.id) "/resend" } {
                (csrf_field(csrf))
                button type="submit" { "Renvoyer" }
            }
        }
    }
}

/// `POST /webhooks/{id}/resend`: only a notification of the logged-in merchant.
pub async fn resend(
    state: web::Data<AppState>,
    user: LoggedIn,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, DashError> {
    user.form(payload).await?;
    let id = path.into_inner();
    let not_found = || DashError::NotFound("Aucune notification de ce compte ne porte cet identifiant.");
    if validate_id(IdKind::Event, &id).is_err() {
        return Err(not_found());
    }
    // The store finds only this merchant's notifications; the check below says so again, for whoever
    // changes the lookup next.
    let notification = state.engine.notification(&user.merchant.id, &id)?.ok_or_else(not_found)?;
    if notification.merchant != user.merchant.id {
        return Err(not_found());
    }
    match state.engine.resend_notification(&user.merchant.id, &id).await {
        Ok(_) => {
            tracing::info!(target: "caisse::dashboard", notification = %id, "webhook resent from the dashboard");
            Ok(redirect("/webhooks?info=renvoye"))
        }
        Err(DeliveryError::InFlight) => Ok(redirect("/webhooks?info=en_cours")),
        Err(DeliveryError::NotFound) => Err(not_found()),
        Err(DeliveryError::Store(e)) => Err(e.into()),
        Err(DeliveryError::Stopped) => Err(DashError::Unavailable),
        Err(DeliveryError::Unavailable(why)) => {
            tracing::warn!(target: "caisse::dashboard", notification = %id, why, "webhook resend not made");
            Err(DashError::Unavailable)
        }
        Err(e @ DeliveryError::Tls(_)) => Err(DashError::internal("webhook resend", e)),
    }
}
