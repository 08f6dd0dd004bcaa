//! `GET /transactions` (filters by type, statut, devise, fournisseur and creation dates; pages of
//! [`PAGE_SIZE`] following a cursor) and `GET /transactions/{reference}`, the detail of a payment, refund or
//! payout with its history and its webhook deliveries.
//!
//! The history is the merchant's journal filtered by reference. The journal is ordered by position, not by
//! reference, so reading it whole would grow with the merchant's age: instead a binary search over positions
//! (the journal's times only grow, one actor writes them) finds the first event at the record's creation, and
//! at most [`HISTORY_SCAN`] events from there are read. A change made after that many other events of the
//! same merchant is not shown, and the page says so.

use std::collections::BTreeMap;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use caisse_engine::core::{JournalEvent, Record};
use caisse_engine::domain::ids::{validate_id, IdKind, MerchantId};
use caisse_engine::domain::ledger::Account;
use caisse_engine::domain::money::{Currency, CURRENCIES};
use caisse_engine::domain::records::{Notification, Payment, Payout, Transaction, TransactionType};
use caisse_engine::domain::status::{PaymentStatus, PayoutStatus, RefundStatus, Trigger};
use caisse_engine::domain::time::Timestamp;
use caisse_engine::store::{Store, StoreError};
use maud::{html, Markup};

use super::layout::{self, badge, cell, money, time, time_opt, Nav};
use super::{html, paged, query, DashError, LoggedIn, PAGE_SIZE};
use crate::http::AppState;

/// Journal events read after a record's creation to find its history.
pub const HISTORY_SCAN: usize = 5_000;
/// Events shown in one record's history.
const HISTORY_MAX: usize = 100;
/// Notifications shown on a detail page.
const DELIVERIES_MAX: usize = 50;
/// Journal times may trail a record's `created_at` by a little (the record is stamped first).
const CLOCK_SLACK_MS: u64 = 1_000;
const HISTORY_CHUNK: usize = 500;

/// The filters of the list, as typed (kept to refill the form) and as parsed.
#[derive(Default)]
struct Filters {
    raw: BTreeMap<String, String>,
    kind: Option<TransactionType>,
    statut: Option<String>,
    devise: Option<Currency>,
    fournisseur: Option<String>,
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
            f.statut = Some(s.to_owned());
        } else {
            errors.push("Statut inconnu.".into());
        }
    }
    if let Some(d) = value("devise") {
        match Currency::parse(d) {
            Ok(c) => f.devise = Some(c),
            Err(_) => errors.push("Devise inconnue.".into()),
        }
    }
    if let Some(p) = value("fournisseur") {
        if state.providers.get(p).is_some() {
            f.fournisseur = Some(p.to_owned());
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
        let page =
            state.engine.store().transactions(&user.merchant.id, f.cursor.as_deref(), PAGE_SIZE + 1, &mut |tx| {
                f.kind.is_none_or(|k| tx.kind == k)
                    && f.statut.as_deref().is_none_or(|s| tx.statut == s)
                    && f.devise.is_none_or(|d| tx.devise == d)
                    && f.fournisseur.as_deref().is_none_or(|p| tx.fournisseur.as_str() == p)
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
        state.providers.all().map(|p| (p.settings.code.as_str().into(), p.settings.nom.clone())).collect();
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
                        (cell("Statut", badge(tx.statut)))
                        td.num data-label="Montant" { (money(tx.montant.minor(), tx.devise)) }
                        td.num data-label="Frais" { (money(tx.frais.minor(), tx.devise)) }
                        td.num data-label="Net" { (money(tx.montant_net.minor(), tx.devise)) }
                        (cell("Fournisseur", html! { (tx.fournisseur) }))
                    }
                }
            }
        }
    }
}

/// `GET /transactions/{reference}`: a payment reference, a refund reference or a payout id.
pub async fn detail(
    state: web::Data<AppState>,
    user: LoggedIn,
    path: web::Path<String>,
) -> Result<HttpResponse, DashError> {
    let reference = path.into_inner();
    let not_found = || DashError::NotFound("Aucune transaction de ce compte ne porte cette référence.");
    if reference.is_empty() || reference.len() > 255 {
        return Err(not_found());
    }
    let store = state.engine.store();
    let located = store.locate(&user.merchant.id, &reference)?.ok_or_else(not_found)?;
    let (owner, created_at, summary) = match &located.record {
        Record::Payment(p) => (p.reference.as_str().to_owned(), p.created_at, payment_summary(p)),
        Record::Payout(o) => (o.id.clone(), o.created_at, payout_summary(o)),
    };
    let (events, truncated) = history(store.as_ref(), &user.merchant.id, &owner, created_at)?;
    let deliveries = store
        .notifications(&user.merchant.id, None, DELIVERIES_MAX, &mut |n: &Notification| n.reference == owner)?
        .data;
    let body = html! {
        p { a href="/transactions" { "← Transactions" } }
        h1 { (owner) }
        @if located.kind == TransactionType::Remboursement {
            (layout::notice("info", &format!("{reference} est le remboursement de ce paiement.")))
        }
        (summary)
        section #history {
            h2 { "Historique" }
            table.list {
                thead { tr { th { "Heure" } th { "Événement" } th { "Statut" } th { "Écritures" } } }
                tbody {
                    @for e in &events {
                        tr {
                            (cell("Heure", html! { (time(e.at)) }))
                            (cell("Événement", html! { (trigger_label(e.trigger)) }))
                            (cell("Statut", badge(&e.statut)))
                            (cell("Écritures", entries(e)))
                        }
                    }
                }
            }
            @if truncated {
                p.muted { "Seuls les " (HISTORY_SCAN) " événements du compte qui suivent la création sont parcourus." }
            }
        }
        section #deliveries {
            h2 { "Livraisons webhook" }
            @if deliveries.is_empty() {
                p.muted { "Aucune notification pour cette référence." }
            } @else {
                table.list {
                    thead { tr { th { "Créée" } th { "Événement" } th { "État" } th.num { "Tentatives" } th { "Dernier statut HTTP" } } }
                    tbody {
                        @for n in &deliveries {
                            tr {
                                (cell("Créée", html! { (time(n.created_at)) }))
                                (cell("Événement", html! { a href={ "/webhooks#" (n.id) } { (n.event.as_str()) } }))
                                (cell("État", badge(super::webhooks::state_name(n.state))))
                                td.num data-label="Tentatives" { (n.total_attempts) }
                                (cell("Dernier statut HTTP", html! { (n.attempts.last().and_then(|a| a.http_status).map(|s| s.to_string()).unwrap_or_else(|| "—".into())) }))
                            }
                        }
                    }
                }
                p { a href="/webhooks" { "Détail des tentatives et renvoi →" } }
            }
        }
    };
    Ok(html(StatusCode::OK, layout::page(&user, state.settings.environment, Nav::Transactions, &owner, body)))
}

fn field(label: &str, value: Markup) -> Markup {
    html! { div { dt { (label) } dd { (value) } } }
}

fn text(value: &str) -> Markup {
    html! { (value) }
}

fn payment_summary(p: &Payment) -> Markup {
    let opt = |v: Option<&str>| text(v.unwrap_or("—"));
    html! {
        dl.summary {
            (field("Type", text("paiement")))
            (field("Statut", badge(p.statut.as_str())))
            (field("Montant", money(p.montant.minor(), p.devise)))
            (field("Frais", money(p.frais.minor(), p.devise)))
            (field("Net", money(p.montant_net.minor(), p.devise)))
            (field("Fournisseur", text(p.fournisseur.as_str())))
            (field("Transaction", text(&p.transaction_id)))
            (field("Téléphone client", text(p.client_telephone.as_str())))
            (field("E-mail client", opt(p.client_email.as_ref().map(|e| e.as_str()))))
            (field("Nom client", opt(p.client_nom.as_ref().map(|n| n.as_str()))))
            (field("Description", opt(p.description.as_ref().map(|d| d.as_str()))))
            (field("Créé", text(&time(p.created_at))))
            (field("Mis à jour", text(&time(p.updated_at))))
            (field("Payé", text(&time_opt(p.paid_at))))
            @if let Some(code) = &p.failure_code { (field("Code d'échec", text(code))) }
            @if let Some(r) = &p.remboursement {
                (field("Remboursement", html! { (r.reference) " " (badge(r.statut.as_str())) " " (money(r.montant.minor(), p.devise)) }))
            }
        }
        @if let Ok(meta) = serde_json::to_string(&p.metadata) { @if meta != "{}" { p { "Metadata : " code { (meta) } } } }
    }
}

fn payout_summary(o: &Payout) -> Markup {
    html! {
        dl.summary {
            (field("Type", text("retrait")))
            (field("Statut", badge(o.statut.as_str())))
            (field("Montant", money(o.montant.minor(), o.devise)))
            (field("Frais", money(o.frais.minor(), o.devise)))
            (field("Net versé", money(o.montant_net.minor(), o.devise)))
            (field("Fournisseur", text(o.fournisseur.as_str())))
            (field("Transaction", text(&o.transaction_id)))
            (field("Bénéficiaire", text(o.beneficiaire_telephone.as_str())))
            (field("Nom", text(o.beneficiaire_nom.as_ref().map(|n| n.as_str()).unwrap_or("—"))))
            (field("Créé", text(&time(o.created_at))))
            (field("Traité", text(&time_opt(o.processed_at))))
            @if let Some(m) = &o.motif_rejet { (field("Motif du rejet", text(m))) }
        }
    }
}

fn entries(e: &JournalEvent) -> Markup {
    html! {
        ul.entries {
            @for entry in e.entries.iter().filter(|en| matches!(en.account, Account::Disponible | Account::EnAttente)) {
                li { (account_label(entry.account)) " " (money(entry.amount_minor, entry.devise)) }
            }
        }
    }
}

fn account_label(account: Account) -> &'static str {
    match account {
        Account::Disponible => "disponible",
        Account::EnAttente => "en attente",
        Account::CustomerFunds => "fonds clients",
        Account::Fees => "frais",
        Account::RefundsOut => "remboursements",
        Account::PayoutsOut => "retraits",
    }
}

pub fn trigger_label(trigger: Trigger) -> &'static str {
    match trigger {
        Trigger::PaymentAccepted => "Paiement initié",
        Trigger::ProviderProcessing => "Pris en charge par le fournisseur",
        Trigger::ProviderConfirmed => "Confirmé par le fournisseur",
        Trigger::ProviderDeclined => "Refusé par le fournisseur",
        Trigger::TtlExpired => "Expiré",
        Trigger::RefundRequested => "Remboursement demandé",
        Trigger::RefundCompleted => "Remboursement effectué",
        Trigger::RefundRefused => "Remboursement refusé",
        Trigger::PayoutRequested => "Retrait demandé",
        Trigger::PayoutSent => "Retrait envoyé",
        Trigger::PayoutRefused => "Retrait rejeté",
    }
}

/// The journal events of `reference`, from its creation on, bounded (see the module documentation); the
/// flag says the scan stopped at its bound before the journal's end.
pub fn history(
    store: &dyn Store,
    merchant: &MerchantId,
    reference: &str,
    created_at: Timestamp,
) -> Result<(Vec<JournalEvent>, bool), StoreError> {
    let since = Timestamp::from_unix_ms(created_at.unix_ms().saturating_sub(CLOCK_SLACK_MS));
    // At or after `since`, or past the journal's end: true from some position on.
    let later = |seq: u64| -> Result<bool, StoreError> {
        Ok(store.journal(merchant, seq, 1)?.first().is_none_or(|e| e.seq != seq || e.at >= since))
    };
    let mut high = 1u64;
    while !later(high)? {
        high = high.saturating_mul(2);
    }
    let mut low = high / 2 + 1;
    while low < high {
        let mid = low + (high - low) / 2;
        if later(mid)? {
            high = mid;
        } else {
            low = mid + 1;
        }
    }
    let mut found = Vec::new();
    let mut scanned = 0;
    let mut next = high.max(1);
    while scanned < HISTORY_SCAN && found.len() < HISTORY_MAX {
        let chunk = store.journal(merchant, next, HISTORY_CHUNK.min(HISTORY_SCAN - scanned))?;
        let Some(last) = chunk.last().map(|e| e.seq) else { return Ok((found, false)) };
        scanned += chunk.len();
        found.extend(chunk.into_iter().filter(|e| e.reference == reference));
        next = last + 1;
    }
    found.truncate(HISTORY_MAX);
    let more = !store.journal(merchant, next, 1)?.is_empty();
    Ok((found, more))
}
