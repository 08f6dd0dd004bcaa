//! Money movements started from the dashboard: refunding a payment (`POST /transactions/{reference}/refund`)
//! and creating a payout (`GET`/`POST /payouts/new`).
//!
//! Each form is checked by the API's own rules (the engine's for a refund, `http::retraits::checked_payout`
//! for a payout), then shown again on a confirmation page that says what will move, and only the confirmation
//! sends it. The confirmation carries a one-time key that goes to the engine as an idempotency key: a double
//! click, a reload or a second tab replays the first answer instead of moving money twice.

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use caisse_engine::domain::ids::random_base62;
use caisse_engine::domain::money::{Amount, CURRENCIES};
use caisse_engine::domain::records::{Payment, Payout};
use caisse_engine::domain::status::RefundStatus;
use caisse_engine::domain::text::{IdempotencyKey, Reason};
use caisse_engine::{Command, EngineError, Executed, Idempotency, Part, Rejection};
use maud::{html, Markup};
use sha2::{Digest, Sha256};

use super::layout::{self, csrf_field, money, Nav};
use super::{html, redirect_to, DashError, Form, LoggedIn};
use crate::config::Operation;
use crate::http::retraits::{checked_payout, CreateBody};
use crate::http::AppState;

/// Length of the one-time key a confirmation page carries.
const KEY_LEN: usize = 32;

/// The refund form on a payment's page, when the payment can take one now.
pub fn refund_form(csrf: &str, p: &Payment) -> Option<Markup> {
    let under_way = p.refund.as_ref().is_some_and(|r| r.status == RefundStatus::Processing);
    if !p.status.is_paid() || under_way {
        return None;
    }
    let left = p.refundable();
    Some(html! {
        section #refund {
            h2 { "Rembourser" }
            p.muted { "Reste à rembourser : " (money(left.minor(), p.currency)) ". Les frais ne sont pas rendus : le montant sort du solde disponible." }
            form method="post" action={ "/transactions/" (p.reference.as_str()) "/refund" } {
                (csrf_field(csrf))
                label for="montant" { "Montant (vide : tout le reste)" input #montant type="number" name="montant" min="1" max=(left.minor()) step="1" inputmode="numeric"; }
                label for="motif" { "Motif (facultatif)" input #motif type="text" name="motif" maxlength="500"; }
                div.actions { button.primary type="submit" { "Vérifier le remboursement…" } }
            }
        }
    })
}

/// `POST /transactions/{reference}/refund`: first the review, then (with `etape=envoyer`) the refund.
pub async fn refund(
    state: web::Data<AppState>,
    user: LoggedIn,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, DashError> {
    let form = user.form(payload).await?;
    let reference = path.into_inner();
    let not_found = || DashError::NotFound("Aucun paiement de ce compte ne porte cette référence.");
    let Ok(parsed) = caisse_engine::domain::text::Reference::parse(&reference) else { return Err(not_found()) };
    let payment = state.engine.payment(&user.merchant.id, parsed.as_str()).await?.ok_or_else(not_found)?;
    let page = |status: StatusCode, body: Markup| {
        let title = format!("Rembourser {reference}");
        Ok(html(status, layout::page(&user, state.settings.environment, Nav::Transactions, &title, body)))
    };
    let amount_text = form.get("montant").unwrap_or("").trim();
    let reason_text = form.get("motif").unwrap_or("").trim();
    let amount = match amount_text {
        "" => None,
        text => match text.parse::<i64>().ok().and_then(|m| Amount::positive(m).ok()) {
            Some(amount) => Some(amount),
            None => {
                let message = "Montant : un nombre entier positif, dans la plus petite unité de la devise.";
                return page(StatusCode::BAD_REQUEST, refund_refused(&user.csrf, &payment, message));
            }
        },
    };
    let reason = match reason_text {
        "" => None,
        text => match Reason::parse(text) {
            Ok(reason) => Some(reason),
            Err(e) => {
                return page(StatusCode::BAD_REQUEST, refund_refused(&user.csrf, &payment, &format!("Motif : {e}.")))
            }
        },
    };
    refuse_if_suspended(&state, &user)?;
    if form.get("etape") != Some("envoyer") {
        // The review fixes the amount it shows: "all that is left" becomes a figure, so the confirmation moves
        // exactly what the merchant saw even if another refund ends meanwhile. A payment that cannot take a
        // refund now says why before any confirmation.
        if refund_form(&user.csrf, &payment).is_none() {
            let (status, message) = refusal(EngineError::Rejected(Rejection::InvalidState(String::new())))?;
            return page(status, refund_refused(&user.csrf, &payment, &message));
        }
        let asked = amount.unwrap_or_else(|| payment.refundable());
        return page(StatusCode::OK, refund_review(&user.csrf, &payment, asked, reason_text));
    }
    if !state.flow.refund_possible(&user.merchant.id, &reference, amount).await? {
        let message = "Ce paiement ne peut pas être remboursé ici : son fournisseur n'a pas de remboursement ni de retrait vers le payeur.";
        return page(StatusCode::BAD_REQUEST, refund_refused(&user.csrf, &payment, message));
    }
    let idempotency = one_time_key(&form, &["refund", &reference, amount_text, reason_text])?;
    let command = Command::RequestRefund { reference: parsed, amount, reason };
    match state.flow.request_refund(&user.merchant.id, command, Some(idempotency)).await {
        Ok(_) => {
            tracing::info!(target: "caisse::dashboard", merchant = %user.merchant.id.as_str(), payment = %reference, "refund asked from the dashboard");
            Ok(redirect_to(format!("/transactions/{reference}")))
        }
        Err(e) => {
            let (status, message) = refusal(e)?;
            // The payment as it is now: the form is shown again only if it can still take a refund.
            let now = state.engine.payment(&user.merchant.id, &reference).await?.unwrap_or(payment);
            page(status, refund_refused(&user.csrf, &now, &message))
        }
    }
}

fn refund_review(csrf: &str, p: &Payment, asked: Amount, reason_text: &str) -> Markup {
    let left_after = p.refundable().minor().saturating_sub(asked.minor());
    html! {
        p { a href={ "/transactions/" (p.reference.as_str()) } { "← Le paiement" } }
        h1 { "Confirmer le remboursement" }
        dl.summary {
            dt { "Paiement" } dd { (p.reference.as_str()) " · " (money(p.amount.minor(), p.currency)) }
            dt { "Client" } dd { (p.customer_phone.as_str()) }
            dt { "À rembourser" } dd { strong { (money(asked.minor(), p.currency)) } }
            dt { "Restera à rembourser" } dd { (money(left_after.max(0), p.currency)) }
            @if !reason_text.is_empty() { dt { "Motif" } dd { (reason_text) } }
        }
        p { "Le montant sort aussitôt du solde disponible et part chez le fournisseur, " (p.provider.as_str()) "." }
        form method="post" action={ "/transactions/" (p.reference.as_str()) "/refund" } {
            (csrf_field(csrf))
            input type="hidden" name="montant" value=(asked.minor());
            input type="hidden" name="motif" value=(reason_text);
            input type="hidden" name="etape" value="envoyer";
            input type="hidden" name="cle" value=(random_base62(KEY_LEN));
            div.actions {
                button.primary type="submit" { "Confirmer le remboursement" }
                a href={ "/transactions/" (p.reference.as_str()) } { "Annuler" }
            }
        }
    }
}

fn refund_refused(csrf: &str, p: &Payment, message: &str) -> Markup {
    html! {
        p { a href={ "/transactions/" (p.reference.as_str()) } { "← Le paiement" } }
        h1 { "Rembourser " (p.reference.as_str()) }
        (layout::notice("error", message))
        @if let Some(form) = refund_form(csrf, p) { (form) }
    }
}

/// The payout form's fields, as typed (shown again after a refusal and carried by the confirmation).
const PAYOUT_FIELDS: [(&str, &str); 7] = [
    ("montant", "Montant (plus petite unité de la devise)"),
    ("devise", "Devise"),
    ("fournisseur", "Fournisseur"),
    ("beneficiaire_telephone", "Téléphone du bénéficiaire"),
    ("beneficiaire_nom", "Nom du bénéficiaire (facultatif)"),
    ("description", "Description (facultative)"),
    ("reference", "Votre référence (facultative)"),
];

/// `GET /payouts/new`: the empty form.
pub async fn payout_form(state: web::Data<AppState>, user: LoggedIn) -> HttpResponse {
    let body = payout_page(&state, &user.csrf, &Form::default(), None);
    html(StatusCode::OK, layout::page(&user, state.settings.environment, Nav::Payouts, "Nouveau retrait", body))
}

/// `POST /payouts/new`: the review, then (with `etape=envoyer`) the payout.
pub async fn payout(
    state: web::Data<AppState>,
    user: LoggedIn,
    payload: web::Payload,
) -> Result<HttpResponse, DashError> {
    let form = user.form(payload).await?;
    let page = |status: StatusCode, body: Markup| {
        Ok(html(status, layout::page(&user, state.settings.environment, Nav::Payouts, "Nouveau retrait", body)))
    };
    let text = |name: &str| form.get(name).unwrap_or("").trim().to_owned();
    let optional = |name: &str| Some(text(name)).filter(|v| !v.is_empty());
    let Ok(amount) = text("montant").parse::<i64>() else {
        let message = "Montant : un nombre entier positif, dans la plus petite unité de la devise.";
        return page(StatusCode::BAD_REQUEST, payout_page(&state, &user.csrf, &form, Some(message)));
    };
    let request = CreateBody {
        amount,
        currency: text("devise"),
        provider: text("fournisseur"),
        beneficiary_phone: text("beneficiaire_telephone"),
        beneficiary_name: optional("beneficiaire_nom"),
        description: optional("description"),
        metadata: None,
        reference: optional("reference"),
    };
    let (new, route) = match checked_payout(&state, request) {
        Ok(checked) => checked,
        Err(e) => {
            let label = PAYOUT_FIELDS.iter().find(|(name, _)| Some(*name) == e.field.as_deref()).map(|(_, l)| *l);
            let message = format!("{} : {}", label.unwrap_or("Retrait"), e.message);
            return page(e.status, payout_page(&state, &user.csrf, &form, Some(&message)));
        }
    };
    refuse_if_suspended(&state, &user)?;
    if form.get("etape") != Some("envoyer") {
        return page(StatusCode::OK, payout_review(&user.csrf, &form, &new));
    }
    let values: Vec<String> = PAYOUT_FIELDS.iter().map(|(name, _)| text(name)).collect();
    let mut parts = vec!["payout"];
    parts.extend(values.iter().map(String::as_str));
    let idempotency = one_time_key(&form, &parts)?;
    match state.flow.create_payout(&user.merchant.id, new, Some(route), Some(idempotency)).await {
        Ok(executed) => {
            let id = match executed {
                Executed::Done(caisse_engine::Record::Payout(o)) => Some(o.id),
                Executed::Replayed { body, .. } => serde_json::from_str::<Payout>(&body).ok().map(|o| o.id),
                _ => None,
            };
            tracing::info!(target: "caisse::dashboard", merchant = %user.merchant.id.as_str(), payout = ?id, "payout created from the dashboard");
            Ok(redirect_to(id.map_or_else(|| "/payouts".to_owned(), |id| format!("/transactions/{id}"))))
        }
        Err(e) => {
            let (status, message) = refusal(e)?;
            page(status, payout_page(&state, &user.csrf, &form, Some(&message)))
        }
    }
}

fn payout_page(state: &AppState, csrf: &str, form: &Form, error: Option<&str>) -> Markup {
    let value = |name: &str| form.get(name).unwrap_or("").to_owned();
    let providers: Vec<_> =
        state.providers.all().filter(|p| p.active() && p.settings.operations.contains(&Operation::Payout)).collect();
    // In the order of Caisse's currency list (the CFA francs first), those some payout provider takes.
    let currencies: Vec<&str> = CURRENCIES
        .iter()
        .map(|c| c.code)
        .filter(|code| providers.iter().any(|p| p.settings.currencies.iter().any(|c| c.code() == *code)))
        .collect();
    html! {
        p { a href="/payouts" { "← Retraits" } }
        h1 { "Nouveau retrait" }
        @if let Some(message) = error { (layout::notice("error", message)) }
        p.muted { "Le montant sort aussitôt du solde disponible ; le bénéficiaire reçoit le montant moins les frais du fournisseur." }
        form.payout method="post" action="/payouts/new" {
            (csrf_field(csrf))
            label for="montant" { (PAYOUT_FIELDS[0].1) input #montant type="number" name="montant" min="1" step="1" inputmode="numeric" required value=(value("montant")); }
            label for="devise" { (PAYOUT_FIELDS[1].1) select #devise name="devise" required {
                @for c in &currencies { option value=(c) selected[value("devise") == *c] { (c) } }
            } }
            label for="fournisseur" { (PAYOUT_FIELDS[2].1) select #fournisseur name="fournisseur" required {
                @for p in &providers {
                    option value=(p.settings.code.as_str()) selected[value("fournisseur") == p.settings.code.as_str()] { (p.settings.name) " (" (p.settings.code.as_str()) ")" }
                }
            } }
            label for="beneficiaire_telephone" { (PAYOUT_FIELDS[3].1) input #beneficiaire_telephone type="tel" name="beneficiaire_telephone" required placeholder="+229 97 00 00 01" value=(value("beneficiaire_telephone")); }
            label for="beneficiaire_nom" { (PAYOUT_FIELDS[4].1) input #beneficiaire_nom type="text" name="beneficiaire_nom" maxlength="200" value=(value("beneficiaire_nom")); }
            label for="description" { (PAYOUT_FIELDS[5].1) input #description type="text" name="description" maxlength="500" value=(value("description")); }
            label for="reference" { (PAYOUT_FIELDS[6].1) input #reference type="text" name="reference" maxlength="64" value=(value("reference")); }
            div.actions { button.primary type="submit" { "Vérifier le retrait…" } }
        }
    }
}

fn payout_review(csrf: &str, form: &Form, new: &caisse_engine::NewPayout) -> Markup {
    let fee = new.fee.fee(new.amount).unwrap_or(Amount::ZERO);
    let net = new.amount.minor().saturating_sub(fee.minor());
    html! {
        p { a href="/payouts/new" { "← Modifier" } }
        h1 { "Confirmer le retrait" }
        dl.summary {
            dt { "Montant débité" } dd { strong { (money(new.amount.minor(), new.currency)) } }
            dt { "Frais" } dd { (money(fee.minor(), new.currency)) }
            dt { "Le bénéficiaire reçoit" } dd { (money(net, new.currency)) }
            dt { "Fournisseur" } dd { (new.provider.as_str()) }
            dt { "Bénéficiaire" } dd { (new.beneficiary_phone.as_str()) @if let Some(n) = &new.beneficiary_name { " · " (n.as_str()) } }
            @if let Some(r) = &new.reference { dt { "Votre référence" } dd { (r.as_str()) } }
        }
        form method="post" action="/payouts/new" {
            (csrf_field(csrf))
            @for (name, _) in PAYOUT_FIELDS { input type="hidden" name=(name) value=(form.get(name).unwrap_or("")); }
            input type="hidden" name="etape" value="envoyer";
            input type="hidden" name="cle" value=(random_base62(KEY_LEN));
            div.actions {
                button.primary type="submit" { "Confirmer le retrait" }
                a href="/payouts" { "Annuler" }
            }
        }
    }
}

/// The confirmation's one-time key as an idempotency key, its fingerprint over what the form asks.
pub(super) fn one_time_key(form: &Form, parts: &[&str]) -> Result<Idempotency, DashError> {
    let key = form.get("cle").unwrap_or("");
    let valid = key.len() == KEY_LEN && key.bytes().all(|b| b.is_ascii_alphanumeric());
    let key = IdempotencyKey::parse(&format!("dashboard-{key}")).ok().filter(|_| valid);
    let key =
        key.ok_or_else(|| DashError::BadRequest("Le formulaire de confirmation est incomplet : recommencez.".into()))?;
    let mut hash = Sha256::new();
    for part in parts {
        hash.update(part.as_bytes());
        hash.update(b"\n");
    }
    Ok(Idempotency {
        key,
        fingerprint: hex::encode(hash.finalize()),
        earlier_fingerprint: None,
        success_status: 200,
        part: Part::Only,
    })
}

/// A suspended merchant starts no new movement, from the dashboard as from the API.
pub(super) fn refuse_if_suspended(state: &AppState, user: &LoggedIn) -> Result<(), DashError> {
    if state.engine.suspended_since(&user.merchant.id)?.is_some() {
        return Err(DashError::Forbidden("Ce compte est suspendu. Contactez l'opérateur du service."));
    }
    Ok(())
}

/// A refusal of the engine in the merchant's words, with its status: the API's rules, said in French.
pub(super) fn refusal(err: EngineError) -> Result<(StatusCode, String), DashError> {
    let conflict = |m: String| Ok((StatusCode::CONFLICT, m));
    match err {
        EngineError::Rejected(Rejection::RefundAboveAmount { left_minor, .. }) => Ok((
            StatusCode::BAD_REQUEST,
            format!("Montant : plus que 0 et au plus {left_minor}, ce qui reste à rembourser."),
        )),
        EngineError::Rejected(Rejection::InsufficientBalance { currency, available_minor, requested_minor }) => {
            conflict(format!(
                "Solde disponible insuffisant : {available_minor} {currency} disponibles, {requested_minor} nécessaires."
            ))
        }
        EngineError::Rejected(Rejection::InvalidState(_)) => conflict(
            "Ce paiement ne peut pas être remboursé maintenant : un remboursement est en cours, ou il n'est pas payé, ou il est déjà remboursé en totalité."
                .into(),
        ),
        EngineError::Rejected(Rejection::DuplicateReference) => {
            conflict("Votre référence : elle est déjà prise par un paiement, un remboursement ou un retrait de ce compte.".into())
        }
        EngineError::Rejected(Rejection::AmountBelowFee { fee_minor }) => {
            Ok((StatusCode::BAD_REQUEST, format!("Montant : il doit dépasser les frais, {fee_minor}.")))
        }
        EngineError::IdempotencyKeyReused => conflict("Cette confirmation a déjà servi pour une autre demande : recommencez.".into()),
        EngineError::IdempotencyKeyInUse => conflict("Cette demande est en cours d'envoi : rechargez la page dans un instant.".into()),
        other => Err(other.into()),
    }
}
