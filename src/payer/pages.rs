//! The markup of the payment page: the form, the waiting screen and receipt, and the short messages (closed
//! link, not found, too many tries). French, labels on every field, one column that reads at 320 px.

use actix_web::HttpResponse;
use caisse_engine::domain::links::Link;
use caisse_engine::domain::money::{format_major, Currency};
use caisse_engine::domain::records::Payment;
use caisse_engine::domain::status::PaymentStatus;
use caisse_engine::domain::time::Timestamp;
use maud::{html, Markup, DOCTYPE};

use crate::dashboard::Form;

pub const CSS: &str = include_str!("payer.css");

/// `GET /assets/payer.css`.
pub async fn stylesheet() -> HttpResponse {
    crate::dashboard::layout::css(CSS)
}

/// A fournisseur the customer may choose, with the countries whose numbers it takes.
pub struct Choice {
    pub code: String,
    pub name: String,
    pub countries: Vec<String>,
}

/// What the customer typed, kept when the form comes back with an error.
#[derive(Default)]
pub struct Entered {
    pub provider: String,
    pub country: String,
    pub phone: String,
    pub name: String,
    pub email: String,
}

/// Longest value kept from a field: the form's fields are short, and what comes back is shown again.
const MAX_FIELD: usize = 200;

impl Entered {
    pub fn from_form(form: &Form) -> Entered {
        let field = |name: &str| form.get(name).unwrap_or("").chars().take(MAX_FIELD).collect::<String>();
        Entered {
            provider: field("fournisseur"),
            country: field("pays"),
            phone: field("telephone"),
            name: field("nom"),
            email: field("email"),
        }
    }

    /// What makes this form's payment what it is (the idempotency fingerprint).
    pub fn fingerprint(&self, link: &str) -> String {
        super::fingerprint(link, &[&self.provider, &self.country, &self.phone, &self.name, &self.email])
    }
}

/// The countries the page offers, with their names in French.
const COUNTRIES: &[(&str, &str)] = &[
    ("BJ", "Bénin"),
    ("BF", "Burkina Faso"),
    ("CM", "Cameroun"),
    ("CG", "Congo"),
    ("CI", "Côte d'Ivoire"),
    ("GA", "Gabon"),
    ("GH", "Ghana"),
    ("GN", "Guinée"),
    ("ML", "Mali"),
    ("NE", "Niger"),
    ("NG", "Nigeria"),
    ("CD", "RD Congo"),
    ("SN", "Sénégal"),
    ("TG", "Togo"),
    ("FR", "France"),
];

/// An amount as people read it here: `5 000 FCFA`.
pub fn amount(minor: i64, currency: Currency) -> String {
    let text = format_major(minor, currency);
    match currency.code() {
        "XOF" | "XAF" => text.replace(currency.code(), "FCFA"),
        _ => text,
    }
}

fn shell(title: &str, refresh: bool, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="fr" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="referrer" content="no-referrer";
                @if refresh { meta http-equiv="refresh" content="3"; }
                title { (title) }
                link rel="stylesheet" href="/assets/payer.css";
            }
            body {
                main {
                    (body)
                    footer { "Paiement sécurisé par Caisse" }
                }
            }
        }
    }
}

/// A short page: a title, what happened, and the merchant when known.
pub fn message(title: &str, text: &str, merchant: Option<&str>) -> Markup {
    shell(
        title,
        false,
        html! {
            div.card {
                @if let Some(merchant) = merchant { p.who { (merchant) } }
                h1 { (title) }
                p { (text) }
            }
        },
    )
}

pub struct FormView<'a> {
    pub merchant: &'a str,
    pub link: &'a Link,
    pub choices: &'a [Choice],
    pub sandbox: bool,
}

/// The form; `error` is the field at fault (or "") and what to do about it.
pub fn form(view: &FormView<'_>, token: &str, entered: &Entered, error: Option<(&str, String)>) -> Markup {
    let link = view.link;
    let price = amount(link.amount.minor(), link.currency);
    let mut countries: Vec<&(&str, &str)> = COUNTRIES
        .iter()
        .filter(|(code, _)| view.choices.iter().any(|c| c.countries.iter().any(|k| k == code)))
        .collect();
    if countries.is_empty() {
        countries = COUNTRIES.iter().collect();
    }
    let chosen_country = if entered.country.is_empty() {
        view.choices.first().and_then(|c| c.countries.first()).map(String::as_str).unwrap_or("")
    } else {
        entered.country.as_str()
    };
    let chosen_provider = if entered.provider.is_empty() {
        view.choices.first().map(|c| c.code.as_str()).unwrap_or("")
    } else {
        entered.provider.as_str()
    };
    let error_at = |field: &str| error.as_ref().is_some_and(|(f, _)| *f == field);
    shell(
        &format!("Payer {price}"),
        false,
        html! {
            div.card {
                p.who { (view.merchant) }
                h1 { (link.description) }
                p.amount { (price) }
                @if view.sandbox {
                    p.sandbox {
                        "Mode test : aucun argent ne circule. Un numéro finissant par 01 est refusé, 02 n'aboutit jamais, tout autre est accepté."
                    }
                }
                @if let Some((_, text)) = &error {
                    p.error role="alert" id="erreur" { (text) }
                }
                form method="post" action={ "/payer/" (link.id) } {
                    input type="hidden" name="jeton" value=(token);
                    label for="fournisseur" { "Moyen de paiement" }
                    select id="fournisseur" name="fournisseur" required aria-invalid=[error_at("fournisseur").then_some("true")] {
                        @for choice in view.choices {
                            option value=(choice.code) selected[choice.code == chosen_provider] { (choice.name) }
                        }
                    }
                    div.row {
                        div {
                            label for="pays" { "Pays" }
                            select id="pays" name="pays" {
                                @for (code, name) in &countries {
                                    option value=(code) selected[*code == chosen_country] { (name) }
                                }
                            }
                        }
                        div {
                            label for="telephone" { "Téléphone" }
                            input id="telephone" name="telephone" type="tel" inputmode="tel" autocomplete="tel"
                                required maxlength="40" value=(entered.phone) placeholder="97 00 00 01"
                                aria-describedby="telephone-aide" aria-invalid=[error_at("telephone").then_some("true")];
                        }
                    }
                    p.hint id="telephone-aide" { "Le numéro qui recevra la demande de paiement." }
                    label for="nom" { "Nom " span.hint { "(facultatif)" } }
                    input id="nom" name="nom" type="text" autocomplete="name" maxlength="200" value=(entered.name)
                        aria-invalid=[error_at("nom").then_some("true")];
                    label for="email" { "E-mail " span.hint { "(facultatif)" } }
                    input id="email" name="email" type="email" autocomplete="email" maxlength="200" value=(entered.email)
                        aria-invalid=[error_at("email").then_some("true")];
                    button type="submit" { "Payer " (price) }
                }
            }
        },
    )
}

/// The waiting screen while the payment is under way (it reloads itself every 3 s), then the receipt or the
/// failure.
pub fn status(merchant: &str, link: &Link, payment: &Payment, provider: &str, retry: bool) -> Markup {
    let price = amount(payment.amount.minor(), payment.currency);
    let waiting = matches!(payment.status, PaymentStatus::Initiated | PaymentStatus::Processing);
    let paid =
        matches!(payment.status, PaymentStatus::Succeeded | PaymentStatus::PartlyRefunded | PaymentStatus::Refunded);
    let title = if waiting && payment.payment_url.is_some() {
        "Terminez le paiement"
    } else if waiting {
        "Validez le paiement sur votre téléphone"
    } else if paid {
        "Paiement réussi"
    } else if payment.status == PaymentStatus::Expired {
        "Paiement expiré"
    } else {
        "Paiement refusé"
    };
    shell(
        title,
        waiting,
        html! {
            div.card {
                p.who { (merchant) }
                h1 { (title) }
                @if waiting {
                    p.status.wait role="status" { "En attente de votre validation…" }
                    @if let Some(page) = &payment.payment_url {
                        p { "Terminez le paiement de " strong { (price) } " sur la page de " (provider) ". Cette page se met à jour toute seule." }
                        a.button href=(page) { "Continuer vers " (provider) }
                    } @else {
                        p { "Une demande de paiement " (provider) " de " strong { (price) } " a été envoyée sur votre téléphone. "
                            "Ouvrez-la et validez avec votre code secret. Cette page se met à jour toute seule." }
                    }
                } @else if paid {
                    p.status.ok role="status" { "Merci, votre paiement est confirmé." }
                    dl {
                        dt { "Marchand" } dd { (merchant) }
                        dt { "Objet" } dd { (link.description) }
                        dt { "Montant" } dd { (price) }
                        dt { "Référence" } dd { (payment.reference) }
                        dt { "Date" } dd { (date(payment.paid_at.unwrap_or(payment.updated_at))) }
                        dt { "Moyen" } dd { (provider) }
                    }
                    @if let Some(back) = &link.return_url {
                        a.button href=(back.as_str()) { "Retour chez le marchand" }
                    }
                } @else {
                    p.status.bad role="status" {
                        @if payment.status == PaymentStatus::Expired {
                            "La demande n'a pas été validée à temps. Aucun montant n'a été prélevé."
                        } @else {
                            "Le paiement n'a pas abouti (solde insuffisant ou demande refusée). Aucun montant n'a été prélevé."
                        }
                    }
                    @if retry {
                        a.button href={ "/payer/" (link.id) } { "Réessayer" }
                    }
                }
            }
        },
    )
}

/// The page a customer lands on back from a provider's page when the payment has no `url_retour`: its status and
/// amount only (the merchant may be anyone, the visitor anybody holding the address).
pub fn returned(payment: &Payment) -> Markup {
    let price = amount(payment.amount.minor(), payment.currency);
    let (title, tone) = match payment.status {
        PaymentStatus::Succeeded | PaymentStatus::PartlyRefunded | PaymentStatus::Refunded => ("Paiement réussi", "ok"),
        PaymentStatus::Failed => ("Paiement refusé", "bad"),
        PaymentStatus::Expired => ("Paiement expiré", "bad"),
        PaymentStatus::Initiated | PaymentStatus::Processing => ("Paiement en cours de confirmation", "wait"),
    };
    let waiting = tone == "wait";
    shell(
        title,
        waiting,
        html! {
            div.card {
                h1 { (title) }
                p.status.(tone) role="status" { (price) }
                @if waiting { p { "Cette page se met à jour toute seule." } }
                p { "Vous pouvez fermer cette page." }
            }
        },
    )
}

/// `26/11/2026 à 14:05 (UTC)`.
fn date(at: Timestamp) -> String {
    let text = at.to_rfc3339();
    match (text.get(0..4), text.get(5..7), text.get(8..10), text.get(11..16)) {
        (Some(y), Some(m), Some(d), Some(hm)) => format!("{d}/{m}/{y} à {hm} (UTC)"),
        _ => text,
    }
}
