//! The detail page, `GET /transactions/{reference}`: the summary of a payment or a payout, its history with
//! the balance entries of each event, and its webhook deliveries.

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use caisse_engine::core::{JournalEvent, Record};
use caisse_engine::domain::ledger::Account;
use caisse_engine::domain::records::{Notification, Payment, Payout, TransactionType};
use caisse_engine::domain::status::Trigger;
use maud::{html, Markup};

use super::history::{history, HISTORY_SCAN};
use crate::dashboard::layout::{self, badge, cell, money, time, time_opt, Nav};
use crate::dashboard::{actions, html, webhooks, DashError, LoggedIn};
use crate::http::AppState;

/// Notifications shown on a detail page.
const DELIVERIES_MAX: usize = 50;

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
    let store = &state.engine;
    let located = store.locate(&user.merchant.id, &reference)?.ok_or_else(not_found)?;
    let (owner, created_at, summary) = match &located.record {
        Record::Payment(p) => (p.reference.as_str().to_owned(), p.created_at, payment_summary(p)),
        Record::Payout(o) => (o.id.clone(), o.created_at, payout_summary(o)),
        Record::Link(_) => return Err(not_found()),
    };
    let providers = provider_side(&state, &located.record)?;
    let (events, truncated) = history(store, &user.merchant.id, &owner, created_at)?;
    let deliveries = store
        .notifications(&user.merchant.id, None, DELIVERIES_MAX, &mut |n: &Notification| n.reference == owner)?
        .data;
    let body = html! {
        p { a href="/transactions" { "← Transactions" } }
        h1 { (owner) }
        @if located.kind == TransactionType::Refund {
            (layout::notice("info", &format!("{reference} est le remboursement de ce paiement.")))
        }
        (summary)
        @if let Record::Payment(p) = &located.record { @if let Some(form) = actions::refund_form(&user.csrf, p) { (form) } }
        (providers)
        section #history {
            h2 { "Historique" }
            table.list {
                thead { tr { th { "Heure" } th { "Événement" } th { "Statut" } th { "Écritures" } } }
                tbody {
                    @for e in &events {
                        tr {
                            (cell("Heure", html! { (time(e.at)) }))
                            (cell("Événement", html! { (trigger_label(e.trigger)) }))
                            (cell("Statut", badge(&e.status)))
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
                                (cell("État", badge(webhooks::state_name(n.state))))
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
            (field("Statut", badge(p.status.as_str())))
            (field("Montant", money(p.amount.minor(), p.currency)))
            (field("Frais", money(p.fee.minor(), p.currency)))
            (field("Net", money(p.net_amount.minor(), p.currency)))
            (field("Fournisseur", text(p.provider.as_str())))
            (field("Transaction", text(&p.transaction_id)))
            (field("Téléphone client", text(p.customer_phone.as_str())))
            (field("E-mail client", opt(p.customer_email.as_ref().map(|e| e.as_str()))))
            (field("Nom client", opt(p.customer_name.as_ref().map(|n| n.as_str()))))
            (field("Description", opt(p.description.as_ref().map(|d| d.as_str()))))
            (field("Créé", text(&time(p.created_at))))
            (field("Mis à jour", text(&time(p.updated_at))))
            (field("Payé", text(&time_opt(p.paid_at))))
            @if let Some(code) = &p.failure_code { (field("Code d'échec", text(code))) }
            @if !p.refunds.is_empty() {
                (field("Remboursé", money(p.refunded_amount.minor(), p.currency)))
                (field("Remboursements", html! {
                    ol.refunds {
                        @for r in &p.refunds {
                            li { (r.reference) " " (badge(r.status.as_str())) " " (money(r.amount.minor(), p.currency))
                                @if let Some(reason) = &r.reason { " · " (reason.as_str()) } }
                        }
                    }
                }))
            }
        }
        @if let Ok(meta) = serde_json::to_string(&p.metadata) { @if meta != "{}" { p { "Metadata : " code { (meta) } } } }
    }
}

/// The provider side of the record's transactions (the payment and its refunds, or the payout): which adapter
/// carries each, and the provider's reference once an answer gave one. That reference is what the customer's
/// receipt and the provider's support desk quote.
fn provider_side(state: &AppState, record: &Record) -> Result<Markup, DashError> {
    let mut rows = Vec::new();
    match record {
        Record::Payment(p) => {
            rows.push(("paiement", p.transaction_id.clone()));
            for r in &p.refunds {
                rows.push(("remboursement", r.transaction_id()));
            }
        }
        Record::Payout(o) => rows.push(("retrait", o.transaction_id.clone())),
        Record::Link(_) => {}
    }
    let mut trails = Vec::with_capacity(rows.len());
    for (kind, tx) in rows {
        trails.push((kind, state.engine.provider_trail(&tx)?, tx));
    }
    Ok(html! {
        section #provider {
            h2 { "Côté fournisseur" }
            table.list {
                thead { tr { th { "Transaction" } th { "Adaptateur" } th { "Référence du fournisseur" } th { "URL de retour" } } }
                tbody {
                    @for (kind, trail, tx) in &trails {
                        tr {
                            (cell("Transaction", html! { (kind) " " code { (tx) } }))
                            (cell("Adaptateur", text(trail.route.as_ref().map(|r| r.adapter.as_str()).unwrap_or("—"))))
                            (cell("Référence du fournisseur", match &trail.reference {
                                Some(reference) => html! { code { (reference.as_str()) } },
                                None => text("— (pas encore donnée)"),
                            }))
                            (cell("URL de retour", text(trail.route.as_ref().and_then(|r| r.return_url.as_ref()).map(|u| u.as_str()).unwrap_or("—"))))
                        }
                    }
                }
            }
        }
    })
}

fn payout_summary(o: &Payout) -> Markup {
    html! {
        dl.summary {
            (field("Type", text("retrait")))
            (field("Statut", badge(o.status.as_str())))
            @if let Some(reference) = &o.reference { (field("Votre référence", text(reference.as_str()))) }
            (field("Montant", money(o.amount.minor(), o.currency)))
            (field("Frais", money(o.fee.minor(), o.currency)))
            (field("Net versé", money(o.net_amount.minor(), o.currency)))
            (field("Fournisseur", text(o.provider.as_str())))
            (field("Transaction", text(&o.transaction_id)))
            (field("Bénéficiaire", text(o.beneficiary_phone.as_str())))
            (field("Nom", text(o.beneficiary_name.as_ref().map(|n| n.as_str()).unwrap_or("—"))))
            (field("Créé", text(&time(o.created_at))))
            (field("Traité", text(&time_opt(o.processed_at))))
            @if let Some(m) = &o.rejection_reason { (field("Motif du rejet", text(m))) }
        }
    }
}

fn entries(e: &JournalEvent) -> Markup {
    html! {
        ul.entries {
            @for entry in e.entries.iter().filter(|en| matches!(en.account, Account::Available | Account::Pending)) {
                li { (account_label(entry.account)) " " (money(entry.amount_minor, entry.currency)) }
            }
        }
    }
}

fn account_label(account: Account) -> &'static str {
    match account {
        Account::Available => "disponible",
        Account::Pending => "en attente",
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
        Trigger::RefundedInPart => "Remboursé en partie",
        Trigger::RefundedInFull => "Remboursé en totalité",
        Trigger::PayoutRequested => "Retrait demandé",
        Trigger::PayoutSent => "Retrait envoyé",
        Trigger::PayoutRefused => "Retrait rejeté",
        Trigger::LinkCreated => "Lien de paiement créé",
        Trigger::LinkPaid => "Lien de paiement payé",
        Trigger::LinkDeactivated => "Lien de paiement désactivé",
    }
}
