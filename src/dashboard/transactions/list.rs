//! The list page, `GET /transactions`: reading and checking its filters, the filter form, the table, and the
//! links to the next page that keep the filters.

use std::collections::BTreeMap;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use caisse_engine::domain::ids::{validate_id, IdKind};
use caisse_engine::domain::money::{Currency, CURRENCIES};
use caisse_engine::domain::records::{Transaction, TransactionType};
use caisse_engine::domain::status::{PaymentStatus, PayoutStatus, RefundStatus};
use caisse_engine::domain::time::Timestamp;
use maud::{html, Markup};

use crate::dashboard::layout::{self, badge, cell, money, time, Nav};
use crate::dashboard::{html, paged, query, DashError, LoggedIn, PAGE_SIZE};
use crate::http::AppState;

/// The filters of the list, as typed (kept to refill the form) and as parsed.
#[derive(Default)]
struct Filters {
    raw: BTreeMap<String, String>,
    kind: Option<TransactionType>,
    status: Option<String>,
    currency: Option<Currency>,
    provider: Option<String>,
    from: Option<Timestamp>,
    to: Option<Timestamp>,
    cursor: Option<String>,
}

const FILTER_NAMES: [&str; 6] = ["type", "statut", "devise", "fournisseur", "du", "au"];

fn filters(state: &AppState, req: &HttpRequest) -> (Filters, Vec<String>) {
    let query = query(req);
    let mut f = Filters::default();
    let mut errors = Vec::new();
    let value = |name: &str| query.get(name).map(|v| v.trim()).filter(|v| !v.is_empty());
    for name in FILTER_NAMES {
        if let Some(v) = value(name) {
            f.raw.insert(name.to_owned(), v.to_owned());
        }
    }
    if let Some(t) = value("type") {
        f.kind = TransactionType::parse(t);
        if f.kind.is_none() {
            errors.push("Type : paiement, remboursement ou retrait.".into());
        }
    }
    if let Some(s) = value("statut") {
        if PaymentStatus::parse(s).is_some() || RefundStatus::parse(s).is_some() || PayoutStatus::parse(s).is_some() {
            f.status = Some(s.to_owned());
        } else {
            errors.push("Statut inconnu.".into());
        }
    }
    if let Some(d) = value("devise") {
        match Currency::parse(d) {
            Ok(c) => f.currency = Some(c),
            Err(_) => errors.push("Devise inconnue.".into()),
        }
    }
    if let Some(p) = value("fournisseur") {
        if state.providers.get(p).is_some() {
            f.provider = Some(p.to_owned());
        } else {
            errors.push("Fournisseur inconnu.".into());
        }
    }
    f.from = date(value("du"), "T00:00:00Z", "Du", &mut errors);
    f.to = date(value("au"), "T23:59:59.999Z", "Au", &mut errors);
    if let Some(c) = value("apres") {
        match validate_id(IdKind::Transaction, c) {
            Ok(()) => f.cursor = Some(c.to_owned()),
            Err(_) => errors.push("Curseur de page invalide.".into()),
        }
    }
    (f, errors)
}

/// A `YYYY-MM-DD` date (what `<input type="date">` sends) as the instant `suffix` names in that day, UTC.
pub fn date(text: Option<&str>, suffix: &str, label: &str, errors: &mut Vec<String>) -> Option<Timestamp> {
    let text = text?;
    let shaped = text.len() == 10
        && text.bytes().enumerate().all(|(i, b)| if i == 4 || i == 7 { b == b'-' } else { b.is_ascii_digit() });
    match shaped.then(|| Timestamp::parse_rfc3339(&format!("{text}{suffix}"))) {
        Some(Ok(at)) => Some(at),
        _ => {
            errors.push(format!("{label} : une date AAAA-MM-JJ."));
            None
        }
    }
}

/// The query string of the current filters plus `extra`, for links that keep them.
fn with_filters(raw: &BTreeMap<String, String>, extra: &[(&str, &str)]) -> String {
    let mut pairs: Vec<(&str, &str)> = raw.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    pairs.extend_from_slice(extra);
    serde_urlencoded::to_string(pairs).unwrap_or_default()
}

pub async fn list(state: web::Data<AppState>, user: LoggedIn, req: HttpRequest) -> Result<HttpResponse, DashError> {
    let (f, errors) = filters(&state, &req);
    let (rows, next) = if errors.is_empty() {
        let page = state.engine.transactions(&user.merchant.id, f.cursor.as_deref(), PAGE_SIZE + 1, &mut |tx| {
            f.kind.is_none_or(|k| tx.kind == k)
                && f.status.as_deref().is_none_or(|s| tx.status == s)
                && f.currency.is_none_or(|d| tx.currency == d)
                && f.provider.as_deref().is_none_or(|p| tx.provider.as_str() == p)
                && f.from.is_none_or(|from| tx.created_at >= from)
                && f.to.is_none_or(|to| tx.created_at <= to)
        })?;
        paged(page, PAGE_SIZE, |tx: &Transaction| tx.transaction_id.clone())
    } else {
        (Vec::new(), None)
    };
    let status = if errors.is_empty() { StatusCode::OK } else { StatusCode::BAD_REQUEST };
    let body = html! {
        h1 { "Transactions" }
        (filter_form(&state, &f))
        @for e in &errors { (layout::notice("error", e)) }
        @if errors.is_empty() {
            @if rows.is_empty() {
                p.muted #no-transactions { "Aucune transaction ne correspond." }
            } @else {
                (table(&rows))
            }
            nav.pages {
                @if f.cursor.is_some() { a href={ "/transactions?" (with_filters(&f.raw, &[])) } { "← Première page" } }
                @if let Some(next) = &next { a.next href={ "/transactions?" (with_filters(&f.raw, &[("apres", next)])) } { "Page suivante →" } }
            }
        }
    };
    Ok(html(status, layout::page(&user, state.settings.environment, Nav::Transactions, "Transactions", body)))
}

fn select(name: &str, label: &str, current: Option<&String>, options: &[(String, String)]) -> Markup {
    html! {
        label for=(name) {
            (label)
            select #(name) name=(name) {
                option value="" { "Tous" }
                @for (value, text) in options {
                    option value=(value) selected[current == Some(value)] { (text) }
                }
            }
        }
    }
}

fn filter_form(state: &AppState, f: &Filters) -> Markup {
    let kinds: Vec<(String, String)> =
        TransactionType::ALL.iter().map(|t| (t.as_str().into(), t.as_str().into())).collect();
    let mut statuses: Vec<&str> = PaymentStatus::ALL.iter().map(|s| s.as_str()).collect();
    statuses.extend(PayoutStatus::ALL.iter().map(|s| s.as_str()));
    let statuses: Vec<(String, String)> = statuses.into_iter().map(|s| (s.into(), s.into())).collect();
    let currencies: Vec<(String, String)> = CURRENCIES.iter().map(|c| (c.code.into(), c.code.into())).collect();
    let providers: Vec<(String, String)> =
        state.providers.all().map(|p| (p.settings.code.as_str().into(), p.settings.name.clone())).collect();
    html! {
        form.filters method="get" action="/transactions" {
            (select("type", "Type", f.raw.get("type"), &kinds))
            (select("statut", "Statut", f.raw.get("statut"), &statuses))
            (select("devise", "Devise", f.raw.get("devise"), &currencies))
            (select("fournisseur", "Fournisseur", f.raw.get("fournisseur"), &providers))
            label for="du" { "Du" input #du type="date" name="du" value=[f.raw.get("du")]; }
            label for="au" { "Au" input #au type="date" name="au" value=[f.raw.get("au")]; }
            div.actions { button.primary type="submit" { "Filtrer" } a href="/transactions" { "Effacer" } }
        }
    }
}

fn table(rows: &[Transaction]) -> Markup {
    html! {
        table.list #transactions {
            thead { tr {
                th { "Date" } th { "Référence" } th { "Type" } th { "Statut" }
                th.num { "Montant" } th.num { "Frais" } th.num { "Net" } th { "Fournisseur" }
            } }
            tbody {
                @for tx in rows {
                    tr {
                        (cell("Date", html! { (time(tx.created_at)) }))
                        (cell("Référence", html! { a href={ "/transactions/" (tx.reference) } { (tx.reference) } }))
                        (cell("Type", html! { (tx.kind.as_str()) }))
                        (cell("Statut", badge(tx.status)))
                        td.num data-label="Montant" { (money(tx.amount.minor(), tx.currency)) }
                        td.num data-label="Frais" { (money(tx.fee.minor(), tx.currency)) }
                        td.num data-label="Net" { (money(tx.net_amount.minor(), tx.currency)) }
                        (cell("Fournisseur", html! { (tx.provider) }))
                    }
                }
            }
        }
    }
}
