//! Two tools of the webhooks page for a merchant checking its receiver: a signed test notification sent now
//! (`POST /webhooks/test`), and the replay of every notification of a time range (`POST /webhooks/replay`,
//! its progress at `GET /webhooks/replay`).
//!
//! The test notification goes through the delivery pool's own sending code (both signatures, the production
//! URL rules, the time-out, no redirect) and its attempt is shown at once; it is not stored, since it tells of
//! nothing that happened. A replay sends each notification of the range again through the delivery pool, like
//! the resend button, so every attempt is logged on its notification; it runs in the background, one at a
//! time per merchant, at most [`MAX_REPLAY`] notifications, and its page shows how far it got.

use std::collections::HashMap;
use std::sync::Mutex;

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use caisse_engine::domain::ids::MerchantId;
use caisse_engine::domain::records::DeliveryState;
use caisse_engine::domain::time::Timestamp;
use caisse_engine::webhook::delivery::{DeliveryError, TEST_EVENT};
use maud::{html, Markup};

use super::auth::DashboardState;
use super::layout::{self, csrf_field, prefix, time, Nav};
use super::transactions::date;
use super::{html, redirect, DashError, LoggedIn};
use crate::http::AppState;

/// The most notifications one replay sends again.
pub const MAX_REPLAY: usize = 10_000;
/// Notifications read per page while a range is collected, and the most pages read.
const PAGE: usize = 1_000;
const MAX_PAGES: usize = 200;
/// How long a finished replay's progress stays readable, and how many replays are held at most.
const KEEP_FINISHED_MS: u64 = 60 * 60 * 1000;
const MAX_KEPT: usize = 256;
/// How often the progress page reloads itself while a replay runs, in seconds.
const REFRESH_S: u32 = 2;

/// How far each merchant's latest replay got: a new replay replaces the merchant's previous one, and none
/// starts while one runs. Each entry holds up to [`MAX_REPLAY`] ids, so the table is bounded: a finished replay
/// is kept an hour ([`KEEP_FINISHED_MS`]) for its page, and at most [`MAX_KEPT`] replays are held at once.
#[derive(Default)]
pub struct Replays(Mutex<HashMap<MerchantId, Replay>>);

enum Start {
    Started,
    /// The merchant's previous replay still runs.
    Running,
    /// [`MAX_KEPT`] replays are held, none finished an hour ago.
    Full,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    pub from: String,
    pub to: String,
    pub ids: Vec<String>,
    /// Notifications handed to the delivery pool again so far.
    pub sent: usize,
    /// Being delivered already when their turn came: their current attempt goes on.
    pub in_flight: usize,
    pub errors: usize,
    pub started_at: Timestamp,
    pub finished_at: Option<Timestamp>,
}

impl Replays {
    fn get(&self, merchant: &MerchantId) -> Option<Replay> {
        self.0.lock().ok().and_then(|map| map.get(merchant).cloned())
    }

    /// Records a new replay, unless one of the merchant's is still running or the table is full.
    fn start(&self, merchant: &MerchantId, replay: Replay) -> Start {
        let Ok(mut map) = self.0.lock() else { return Start::Full };
        if map.get(merchant).is_some_and(|r| r.finished_at.is_none()) {
            return Start::Running;
        }
        let now = replay.started_at.unix_ms();
        map.retain(|_, r| r.finished_at.is_none_or(|at| now.saturating_sub(at.unix_ms()) < KEEP_FINISHED_MS));
        if map.len() >= MAX_KEPT && !map.contains_key(merchant) {
            return Start::Full;
        }
        map.insert(merchant.clone(), replay);
        Start::Started
    }

    fn update(&self, merchant: &MerchantId, change: impl FnOnce(&mut Replay)) {
        if let Some(replay) = self.0.lock().ok().as_mut().and_then(|map| map.get_mut(merchant)) {
            change(replay);
        }
    }
}

/// The two tools, for the webhooks page.
pub fn tools(csrf: &str) -> Markup {
    html! {
        section #tools {
            h2 { "Tester le récepteur" }
            form.inline method="post" action="/webhooks/test" {
                (csrf_field(csrf))
                button type="submit" { "Envoyer un événement de test" }
            }
            form.filters method="post" action="/webhooks/replay" {
                (csrf_field(csrf))
                label for="replay-du" { "Renvoyer du" input #replay-du type="date" name="du" required; }
                label for="replay-au" { "au" input #replay-au type="date" name="au" required; }
                div.actions { button type="submit" { "Renvoyer toutes les notifications de la période" } }
            }
            p.muted { "Au plus " (MAX_REPLAY) " notifications à la fois ; chaque tentative est consignée sur sa notification." }
        }
    }
}

/// `POST /webhooks/test`: sends the test notification and shows its attempt.
pub async fn test(
    state: web::Data<AppState>,
    user: LoggedIn,
    payload: web::Payload,
) -> Result<HttpResponse, DashError> {
    user.form(payload).await?;
    let page = |status: StatusCode, body: Markup| {
        html(status, layout::page(&user, state.settings.environment, Nav::Webhooks, "Événement de test", body))
    };
    let Some(url) = user.merchant.webhook_url.clone() else {
        let body = html! {
            p { a href="/webhooks" { "← Webhooks" } }
            (layout::notice("error", "Aucune Webhook URL : enregistrez-en une dans « Clés API » d'abord."))
        };
        return Ok(page(StatusCode::BAD_REQUEST, body));
    };
    let (event, outcome) = state.webhooks.send_test(&url, &user.merchant.secret_key).await;
    tracing::info!(target: "caisse::dashboard", merchant = %user.merchant.id.as_str(), event = %event.id, status = ?outcome.http_status, "test webhook sent");
    let signed = format!("{}.{}", outcome.signed_at_s.unwrap_or_else(|| outcome.at.unix_s()), prefix(&event.body, 64));
    let body = html! {
        p { a href="/webhooks" { "← Webhooks" } }
        h1 { "Événement de test" }
        @if outcome.acknowledged() {
            (layout::notice("ok", "Votre récepteur a répondu 200 : il reçoit et accepte les notifications signées."))
        } @else {
            (layout::notice("error", "Votre récepteur n'a pas répondu 200 : une vraie notification serait réessayée plus tard."))
        }
        dl.summary #attempt {
            dt { "Webhook URL" } dd { code { (url) } }
            dt { "Événement" } dd { code { (TEST_EVENT) } " · " code { (event.id) } }
            dt { "Heure" } dd { (time(outcome.at)) }
            dt { "Statut HTTP" } dd { @match outcome.http_status { Some(s) => (s), None => "—" } }
            dt { "Latence" } dd { (outcome.latency_ms) " ms" }
            dt { "Erreur" } dd { (outcome.error.as_deref().unwrap_or("—")) }
            dt { "Chaîne signée (début)" } dd { code.signed { (signed) } }
        }
        details { summary { "Corps envoyé" } pre { code { (event.body) } } }
        p.muted { "Un événement de test n'est pas enregistré et n'est jamais réessayé ; il ne concerne aucun paiement." }
    };
    let status = if outcome.acknowledged() { StatusCode::OK } else { StatusCode::BAD_GATEWAY };
    Ok(page(status, body))
}

/// `POST /webhooks/replay`: collects the range's notifications and starts sending them again.
pub async fn start(
    state: web::Data<AppState>,
    dash: web::Data<DashboardState>,
    user: LoggedIn,
    payload: web::Payload,
) -> Result<HttpResponse, DashError> {
    let form = user.form(payload).await?;
    let mut errors = Vec::new();
    let text = |name: &str| form.get(name).map(str::trim).filter(|v| !v.is_empty());
    let from = date(text("du"), "T00:00:00Z", "Du", &mut errors);
    let to = date(text("au"), "T23:59:59.999Z", "Au", &mut errors);
    let refused = |message: String| {
        let body = html! {
            p { a href="/webhooks" { "← Webhooks" } }
            h1 { "Renvoyer une période" }
            (layout::notice("error", &message))
            (tools(&user.csrf))
        };
        Ok(html(
            StatusCode::BAD_REQUEST,
            layout::page(&user, state.settings.environment, Nav::Webhooks, "Renvoyer", body),
        ))
    };
    let (Some(from), Some(to)) = (from, to) else {
        let message = if errors.is_empty() { "Du et Au : deux dates AAAA-MM-JJ.".to_owned() } else { errors.join(" ") };
        return refused(message);
    };
    if from > to {
        return refused("La période finit avant de commencer.".into());
    }
    let ids = match notifications_between(&state, &user.merchant.id, from, to)? {
        Ok(ids) => ids,
        Err(Unreplayable::TooMany) => {
            return refused(format!(
                "La période compte plus de {MAX_REPLAY} notifications : choisissez-en une plus courte."
            ))
        }
        Err(Unreplayable::TooFarBack) => {
            return refused(
                "Trop de notifications plus récentes précèdent cette période pour la lire d'un coup : choisissez-en une plus récente."
                    .into(),
            )
        }
    };
    let replay = Replay {
        from: text("du").unwrap_or_default().to_owned(),
        to: text("au").unwrap_or_default().to_owned(),
        ids: ids.clone(),
        sent: 0,
        in_flight: 0,
        errors: 0,
        started_at: Timestamp::now(),
        finished_at: None,
    };
    let merchant = user.merchant.id.clone();
    match dash.replays.start(&merchant, replay) {
        Start::Started => {}
        Start::Running => return Ok(redirect("/webhooks/replay")),
        Start::Full => return Err(DashError::Unavailable),
    }
    tracing::info!(target: "caisse::dashboard", merchant = %merchant.as_str(), notifications = ids.len(), "webhook replay started");
    // The request answers at once; the replay goes on in the background, one notification at a time, each a
    // durable change of its notification (a new attempt chain) that the delivery pool then sends.
    let (app, dash) = (state.clone(), dash.clone());
    actix_web::rt::spawn(async move {
        for id in &ids {
            let result = app.engine.resend_notification(&merchant, id).await;
            dash.replays.update(&merchant, |r| match result {
                Ok(_) => r.sent += 1,
                Err(DeliveryError::InFlight) => r.in_flight += 1,
                Err(_) => r.errors += 1,
            });
        }
        dash.replays.update(&merchant, |r| r.finished_at = Some(Timestamp::now()));
        tracing::info!(target: "caisse::dashboard", merchant = %merchant.as_str(), "webhook replay finished");
    });
    Ok(redirect("/webhooks/replay"))
}

/// `GET /webhooks/replay`: the latest replay's progress, and how its notifications stand now.
pub async fn progress(
    state: web::Data<AppState>,
    dash: web::Data<DashboardState>,
    user: LoggedIn,
) -> Result<HttpResponse, DashError> {
    let Some(replay) = dash.replays.get(&user.merchant.id) else {
        let body = html! {
            p { a href="/webhooks" { "← Webhooks" } }
            p.muted { "Aucun renvoi de période depuis le démarrage du service." }
            (tools(&user.csrf))
        };
        return Ok(html(
            StatusCode::OK,
            layout::page(&user, state.settings.environment, Nav::Webhooks, "Renvoyer", body),
        ));
    };
    let (mut delivered, mut pending, mut failed) = (0, 0, 0);
    for id in &replay.ids {
        match state.engine.notification(&user.merchant.id, id)?.map(|n| n.state) {
            Some(DeliveryState::Delivered) => delivered += 1,
            Some(DeliveryState::Pending) => pending += 1,
            Some(DeliveryState::Failed) => failed += 1,
            None => {}
        }
    }
    let total = replay.ids.len();
    let handled = replay.sent + replay.in_flight + replay.errors;
    let running = replay.finished_at.is_none() || pending > 0;
    let body = html! {
        @if running { meta http-equiv="refresh" content=(REFRESH_S); }
        p { a href="/webhooks" { "← Webhooks" } }
        h1 { "Renvoi du " (replay.from) " au " (replay.to) }
        p #progress data-total=(total) data-handled=(handled) data-delivered=(delivered) {
            progress max=(total.max(1)) value=(handled) { (handled) " / " (total) }
            " " (handled) " / " (total) " notifications remises en envoi"
        }
        dl.summary {
            dt { "Commencé" } dd { (time(replay.started_at)) }
            dt { "Terminé" } dd { @match replay.finished_at { Some(at) => (time(at)), None => "en cours…" } }
            dt { "Remises en envoi" } dd { (replay.sent) }
            dt { "Déjà en cours d'envoi" } dd { (replay.in_flight) }
            dt { "Erreurs" } dd { (replay.errors) }
            dt { "Livrées (réponse 200)" } dd { (delivered) }
            dt { "En attente d'une tentative" } dd { (pending) }
            dt { "En échec" } dd { (failed) }
        }
        @if running { p.muted { "Cette page se recharge toutes les " (REFRESH_S) " secondes." } }
    };
    Ok(html(StatusCode::OK, layout::page(&user, state.settings.environment, Nav::Webhooks, "Renvoyer", body)))
}

/// Why a range is not replayed.
enum Unreplayable {
    /// More than [`MAX_REPLAY`] notifications in it.
    TooMany,
    /// Its start lies behind more newer notifications than one request reads.
    TooFarBack,
}

/// The ids of the merchant's notifications created within `[from, to]`, newest first.
fn notifications_between(
    state: &AppState,
    merchant: &MerchantId,
    from: Timestamp,
    to: Timestamp,
) -> Result<Result<Vec<String>, Unreplayable>, DashError> {
    let mut ids = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..MAX_PAGES {
        // The list is newest first: once a notification older than the range shows, the rest are older too.
        let mut passed_the_range = false;
        let page = state.engine.notifications(merchant, cursor.as_deref(), PAGE, &mut |n| {
            passed_the_range |= n.created_at < from;
            n.created_at >= from && n.created_at <= to
        })?;
        ids.extend(page.data.into_iter().map(|n| n.id));
        if ids.len() > MAX_REPLAY {
            return Ok(Err(Unreplayable::TooMany));
        }
        if passed_the_range || !page.has_more {
            return Ok(Ok(ids));
        }
        cursor = page.next_cursor;
    }
    Ok(Err(Unreplayable::TooFarBack))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replay(at_ms: u64) -> Replay {
        Replay {
            from: String::new(),
            to: String::new(),
            ids: Vec::new(),
            sent: 0,
            in_flight: 0,
            errors: 0,
            started_at: Timestamp::from_unix_ms(at_ms),
            finished_at: None,
        }
    }

    #[test]
    fn the_table_holds_one_running_replay_per_merchant_and_a_bounded_number_in_all() {
        let replays = Replays::default();
        let merchants: Vec<MerchantId> = (0..=MAX_KEPT).map(|_| MerchantId::new()).collect();
        for m in &merchants[..MAX_KEPT] {
            assert!(matches!(replays.start(m, replay(1_000)), Start::Started));
        }
        assert!(matches!(replays.start(&merchants[0], replay(1_000)), Start::Running), "one at a time");
        assert!(matches!(replays.start(&merchants[MAX_KEPT], replay(1_000)), Start::Full), "bounded");
        // A replay finished over an hour ago makes room; one finished just now is kept for its page.
        replays.update(&merchants[1], |r| r.finished_at = Some(Timestamp::from_unix_ms(2_000)));
        replays.update(&merchants[2], |r| r.finished_at = Some(Timestamp::from_unix_ms(KEEP_FINISHED_MS)));
        let later = 2_000 + KEEP_FINISHED_MS;
        assert!(matches!(replays.start(&merchants[MAX_KEPT], replay(later)), Start::Started));
        assert!(replays.get(&merchants[1]).is_none());
        assert!(replays.get(&merchants[2]).is_some());
    }
}
