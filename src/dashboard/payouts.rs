//! `GET /payouts`: the merchant's payouts, newest first, filtered by statut, devise and creation dates, in
//! pages following a cursor (a payout id). Each links to its detail on the transactions page.

use std::collections::BTreeMap;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use caisse_engine::domain::ids::{validate_id, IdKind};
use caisse_engine::domain::money::{Currency, CURRENCIES};
use caisse_engine::domain::records::Payout;
use caisse_engine::domain::status::PayoutStatus;
use maud::{html, Markup};

use super::layout::{self, badge, cell, money, time, time_opt, Nav};
use super::transactions::date;
use super::{html, paged, query, DashError, LoggedIn, PAGE_SIZE};
use crate::http::AppState;

pub async fn list(state: web::Data<AppState>, user: LoggedIn, req: HttpRequest) -> Result<HttpResponse, DashError> {
    let query = query(&req);
    let value = |name: &str| query.get(name).map(|v| v.trim()).filter(|v| !v.is_empty());
    let mut errors = Vec::new();
    let mut raw = BTreeMap::new();
    for name in ["statut", "devise", "du", "au"] {
        if let Some(v) = value(name) {
            raw.insert(name.to_owned(), v.to_owned());
        }
    }
    let status = value("statut").and_then(|s| {
        let parsed = PayoutStatus::parse(s);
        if parsed.is_none() {
            errors.push("Statut : en_attente, traite ou rejete.".to_owned());
        }
        parsed
    });
    let currency = value("devise").and_then(|d| {
        let parsed = Currency::parse(d).ok();
        if parsed.is_none() {
            errors.push("Devise inconnue.".to_owned());
        }
        parsed
    });
    let from = date(value("du"), "T00:00:00Z", "Du", &mut errors);
    let to = date(value("au"), "T23:59:59.999Z", "Au", &mut errors);
    let cursor = value("apres").map(str::to_owned);
    if cursor.as_deref().is_some_and(|c| validate_id(IdKind::Payout, c).is_err()) {
        errors.push("Curseur de page invalide.".to_owned());
    }
    let (rows, next) = if errors.is_empty() {
        let page = state.engine.payouts(&user.merchant.id, cursor.as_deref(), PAGE_SIZE + 1, &mut |o| {
            status.is_none_or(|s| o.status == s)
                && currency.is_none_or(|d| o.currency == d)
                && from.is_none_or(|f| o.created_at >= f)
                && to.is_none_or(|t| o.created_at <= t)
        })?;
        paged(page, PAGE_SIZE, |o: &Payout| o.id.clone())
    } else {
        (Vec::new(), None)
    };
    let link = |extra: Option<&str>| {
        let mut pairs: Vec<(&str, &str)> = raw.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        if let Some(c) = extra {
            pairs.push(("apres", c));
        }
        format!("/payouts?{}", serde_urlencoded::to_string(pairs).unwrap_or_default())
    };
    let status = if errors.is_empty() { StatusCode::OK } else { StatusCode::BAD_REQUEST };
    let body = html! {
        h1 { "Retraits" }
        p { a.button href="/payouts/new" { "Nouveau retrait…" } }
        (filter_form(&raw))
        @for e in &errors { (layout::notice("error", e)) }
        @if errors.is_empty() {
            @if rows.is_empty() { p.muted { "Aucun retrait ne correspond." } } @else { (table(&rows)) }
            nav.pages {
                @if cursor.is_some() { a href=(link(None)) { "← Première page" } }
                @if let Some(next) = &next { a.next href=(link(Some(next))) { "Page suivante →" } }
            }
        }
    };
    Ok(html(status, layout::page(&user, state.settings.environment, Nav::Payouts, "Retraits", body)))
}

fn filter_form(raw: &BTreeMap<String, String>) -> Markup {
    let current = |name: &str| raw.get(name).map(String::as_str);
    html! {
        form.filters method="get" action="/payouts" {
            label for="statut" { "Statut" select #status name="statut" {
                option value="" { "Tous" }
                @for s in PayoutStatus::ALL { option value=(s.as_str()) selected[current("statut") == Some(s.as_str())] { (s.as_str()) } }
            } }
            label for="devise" { "Devise" select #currency name="devise" {
                option value="" { "Toutes" }
                @for c in CURRENCIES { option value=(c.code) selected[current("devise") == Some(c.code)] { (c.code) } }
            } }
            label for="du" { "Du" input #du type="date" name="du" value=[current("du")]; }
            label for="au" { "Au" input #au type="date" name="au" value=[current("au")]; }
            div.actions { button.primary type="submit" { "Filtrer" } a href="/payouts" { "Effacer" } }
        }
    }
}

fn table(rows: &[Payout]) -> Markup {
    html! {
        table.list #payouts {
            thead { tr {
                th { "Date" } th { "Retrait" } th { "Statut" } th.num { "Montant" } th.num { "Frais" } th.num { "Net versé" }
                th { "Fournisseur" } th { "Bénéficiaire" } th { "Traité" }
            } }
            tbody {
                @for o in rows {
                    tr {
                        (cell("Date", html! { (time(o.created_at)) }))
                        (cell("Retrait", html! {
                            a href={ "/transactions/" (o.id) } { (o.id) }
                            @if let Some(r) = &o.reference { " " span.muted { (r.as_str()) } }
                        }))
                        (cell("Statut", html! {
                            (badge(o.status.as_str()))
                            @if let Some(m) = &o.rejection_reason { " " span.muted { (m) } }
                        }))
                        td.num data-label="Montant" { (money(o.amount.minor(), o.currency)) }
                        td.num data-label="Frais" { (money(o.fee.minor(), o.currency)) }
                        td.num data-label="Net versé" { (money(o.net_amount.minor(), o.currency)) }
                        (cell("Fournisseur", html! { (o.provider) }))
                        (cell("Bénéficiaire", html! {
                            (o.beneficiary_phone.as_str())
                            @if let Some(n) = &o.beneficiary_name { " " span.muted { (n.as_str()) } }
                        }))
                        (cell("Traité", html! { (time_opt(o.processed_at)) }))
                    }
                }
            }
        }
    }
}
