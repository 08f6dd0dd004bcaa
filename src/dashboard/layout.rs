//! The page shell every dashboard page shares (head, header with navigation and logout, main column), the
//! login and error pages, the stylesheet, and the small formatters that keep every page consistent: amounts
//! in major units with the currency's decimals, times in UTC, statuses as coloured badges.
//!
//! The stylesheet is `caisse.css` beside this file, compiled in with `include_str!` and served from
//! `/assets/caisse.css`: no CDN, no web font, no script, so the dashboard works offline and the content
//! security policy can forbid everything else.

use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::HttpResponse;
use caisse_engine::domain::money::{format_major, Currency};
use caisse_engine::domain::time::Timestamp;
use maud::{html, Markup, DOCTYPE};

use super::LoggedIn;
use crate::config::Environment;

pub const CSS: &str = include_str!("caisse.css");

/// `GET /assets/caisse.css`.
pub async fn stylesheet() -> HttpResponse {
    css(CSS)
}

/// A stylesheet compiled into the binary, cached an hour by browsers.
pub fn css(body: &'static str) -> HttpResponse {
    HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, HeaderValue::from_static("public, max-age=3600")))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")))
        .content_type("text/css; charset=utf-8")
        .body(body)
}

/// The navigation entries; the current page's is highlighted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nav {
    Overview,
    Transactions,
    Payouts,
    Links,
    Webhooks,
    Keys,
}

const NAV: [(Nav, &str, &str); 6] = [
    (Nav::Overview, "/", "Vue d'ensemble"),
    (Nav::Transactions, "/transactions", "Transactions"),
    (Nav::Payouts, "/payouts", "Retraits"),
    (Nav::Links, "/links", "Liens de paiement"),
    (Nav::Webhooks, "/webhooks", "Webhooks"),
    (Nav::Keys, "/keys", "API keys"),
];

fn head(title: &str) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            meta name="referrer" content="no-referrer";
            title { (title) " · Caisse" }
            link rel="stylesheet" href="/assets/caisse.css";
        }
    }
}

fn environment_badge(environment: Environment) -> Markup {
    html! {
        span.env.(environment.as_str()) { (environment.as_str()) }
    }
}

/// A page of a logged-in merchant.
pub fn page(user: &LoggedIn, environment: Environment, active: Nav, title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="fr" {
            (head(title))
            body {
                header.top {
                    div.bar {
                        a.brand href="/" { "Caisse" }
                        (environment_badge(environment))
                        span.who { (user.merchant.name) }
                        form.logout method="post" action="/logout" {
                            (csrf_field(&user.csrf))
                            button.link type="submit" { "Se déconnecter" }
                        }
                    }
                    nav {
                        @for (nav, href, label) in NAV {
                            a.active[nav == active] href=(href) { (label) }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

/// The hidden field every form of a logged-in page carries.
pub fn csrf_field(token: &str) -> Markup {
    html! { input type="hidden" name="csrf" value=(token); }
}

pub fn login_page(environment: Environment, token: &str, email: &str, error: Option<&str>) -> Markup {
    html! {
        (DOCTYPE)
        html lang="fr" {
            (head("Connexion"))
            body.center {
                main.narrow {
                    h1 { "Caisse " (environment_badge(environment)) }
                    p.muted { "Tableau de bord marchand" }
                    @if let Some(error) = error {
                        p.alert.error role="alert" { (error) }
                    }
                    form.card method="post" action="/login" {
                        input type="hidden" name="csrf" value=(token);
                        label for="email" { "E-mail" }
                        input #email type="email" name="email" value=(email) autocomplete="username" required autofocus;
                        label for="password" { "Mot de passe" }
                        input #password type="password" name="password" autocomplete="current-password" required;
                        button.primary type="submit" { "Se connecter" }
                    }
                }
            }
        }
    }
}

pub fn error_page(status: StatusCode, message: &str) -> Markup {
    html! {
        (DOCTYPE)
        html lang="fr" {
            (head(status.canonical_reason().unwrap_or("Erreur")))
            body.center {
                main.narrow {
                    h1 { (status.as_u16()) }
                    p.alert.error role="alert" { (message) }
                    p { a href="/" { "Retour au tableau de bord" } }
                }
            }
        }
    }
}

/// `1050` EUR as `10,50 EUR`, `5000` XOF as `5 000 XOF`, in a span the stylesheet keeps on one line, so an
/// amount never wraps between its digits.
pub fn money(amount_minor: i64, currency: Currency) -> Markup {
    html! { span.amount { (format_major(amount_minor, currency)) } }
}

/// `2026-05-01 12:34:56 UTC`: the stored RFC 3339 time, shortened for reading.
pub fn time(at: Timestamp) -> String {
    let text = at.to_rfc3339();
    let trimmed = text.split('.').next().unwrap_or(&text).trim_end_matches('Z');
    format!("{} UTC", trimmed.replacen('T', " ", 1))
}

pub fn time_opt(at: Option<Timestamp>) -> String {
    at.map(time).unwrap_or_else(|| "—".into())
}

/// A status as a badge coloured by what it means for the merchant.
pub fn badge(status: &str) -> Markup {
    let tone = match status {
        "succes" | "traite" | "delivered" | "actif" | "paye" => "ok",
        "echec" | "rejete" | "expire" | "failed" => "bad",
        "rembourse" | "rembourse_partiellement" | "desactive" => "info",
        _ => "wait",
    };
    let label = match status {
        "delivered" => "livré",
        "failed" => "en échec",
        "pending" => "en attente",
        other => other,
    };
    html! { span.badge.(tone) { (label) } }
}

/// A one-line message above a page's content.
pub fn notice(kind: &str, message: &str) -> Markup {
    html! { p.alert.(kind) role="status" { (message) } }
}

/// The first `max` bytes of `text`, cut on a character boundary, with `…` when something was cut.
pub fn prefix(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// A table cell that shows its column's name before the value on a phone, where rows become cards (the
/// content is one span, so the phone layout keeps it together on the right).
pub fn cell(label: &str, content: Markup) -> Markup {
    html! { td data-label=(label) { span { (content) } } }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_use_the_currency_decimals() {
        let eur = Currency::parse("EUR").expect("EUR");
        let xof = Currency::parse("XOF").expect("XOF");
        assert_eq!(money(1050, eur).into_string(), r#"<span class="amount">10,50 EUR</span>"#);
        assert_eq!(money(5000, xof).into_string(), r#"<span class="amount">5 000 XOF</span>"#);
    }

    #[test]
    fn times_read_as_utc() {
        assert_eq!(time(Timestamp::from_unix_ms(1_700_000_000_123)), "2023-11-14 22:13:20 UTC");
    }

    #[test]
    fn prefixes_cut_on_character_boundaries() {
        assert_eq!(prefix("abc", 5), "abc");
        assert_eq!(prefix("abcdef", 3), "abc…");
        assert_eq!(prefix("aéb", 2), "a…");
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(
            notice("info", "<script>").into_string(),
            r#"<p class="alert info" role="status">&lt;script&gt;</p>"#
        );
    }
}
