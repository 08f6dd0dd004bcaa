//! `GET /`: the overview. Balances per currency (disponible, en_attente, total, as docs/api.md § Balances
//! defines them), read through the merchant's actor like `GET /v1/soldes` so they include every acknowledged
//! change; then the latest transactions and the number of webhook notifications that ended failed. A provider
//! whose calls are paused after repeated failures is named at the top.

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use caisse_engine::domain::records::{DeliveryState, Transaction};
use maud::html;

use super::layout::{self, badge, cell, money, time, Nav};
use super::{html, DashError, LoggedIn};
use crate::http::AppState;

const RECENT: usize = 5;
/// Failed notifications counted before the overview says "50 or more".
const FAILED_COUNTED: usize = 50;

pub async fn show(state: web::Data<AppState>, user: LoggedIn) -> Result<HttpResponse, DashError> {
    let id = &user.merchant.id;
    let balances = state.engine.balances(id).await?;
    let store = &state.engine;
    let recent = store.transactions(id, None, RECENT, &mut |_| true)?.data;
    let failed = store.notifications(id, None, FAILED_COUNTED, &mut |n| n.state == DeliveryState::Failed)?;
    let failed_text = if failed.has_more && failed.data.len() == FAILED_COUNTED {
        format!("{FAILED_COUNTED} ou plus")
    } else {
        failed.data.len().to_string()
    };
    let degraded = state.providers.degraded();
    let body = html! {
        h1 { "Vue d'ensemble" }
        @if !degraded.is_empty() {
            p.alert.warn role="status" {
                "Fournisseur en difficulté : " strong { (degraded.join(", ")) }
                ". Les paiements restent enregistrés ; leurs résultats arriveront dès qu'il répondra à nouveau."
            }
        }
        section {
            h2 { "Soldes" }
            @if balances.0.is_empty() {
                p.muted { "Aucun solde pour l'instant : les soldes apparaissent au premier paiement." }
            } @else {
                table.list {
                    thead { tr { th { "Devise" } th.num { "Disponible" } th.num { "En attente" } th.num { "Total" } th { "Mis à jour" } } }
                    tbody {
                        @for (currency, b) in &balances.0 {
                            tr {
                                (cell("Devise", html! { strong { (currency.code()) } " " span.muted { (currency.name()) } }))
                                td.num data-label="Disponible" { (money(b.available, *currency)) }
                                td.num data-label="En attente" { (money(b.pending, *currency)) }
                                td.num data-label="Total" { (money(b.total(), *currency)) }
                                (cell("Mis à jour", html! { (time(caisse_engine::domain::time::Timestamp::from_unix_ms(b.updated_at_ms))) }))
                            }
                        }
                    }
                }
            }
        }
        section {
            h2 { "Dernières transactions" }
            (recent_table(&recent))
            p { a href="/transactions" { "Toutes les transactions →" } }
        }
        section {
            h2 { "Webhooks" }
            p {
                "Notifications en échec : " strong #failed-count { (failed_text) } ". "
                a href="/webhooks" { "Voir les livraisons →" }
            }
            @if user.merchant.webhook_url.is_none() {
                p.alert.warn { "Aucune Webhook URL n'est configurée. " a href="/keys" { "La définir dans API keys" } "." }
            }
        }
    };
    Ok(html(StatusCode::OK, layout::page(&user, state.settings.environment, Nav::Overview, "Vue d'ensemble", body)))
}

fn recent_table(rows: &[Transaction]) -> maud::Markup {
    html! {
        @if rows.is_empty() {
            p.muted { "Aucune transaction." }
        } @else {
            table.list {
                thead { tr { th { "Date" } th { "Référence" } th { "Type" } th { "Statut" } th.num { "Montant" } } }
                tbody {
                    @for tx in rows {
                        tr {
                            (cell("Date", html! { (time(tx.created_at)) }))
                            (cell("Référence", html! { a href={ "/transactions/" (tx.reference) } { (tx.reference) } }))
                            (cell("Type", html! { (tx.kind.as_str()) }))
                            (cell("Statut", badge(tx.status)))
                            td.num data-label="Montant" { (money(tx.amount.minor(), tx.currency)) }
                        }
                    }
                }
            }
        }
    }
}
