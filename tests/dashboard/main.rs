//! HTTP-level tests of the merchant dashboard (docs/api.md § Dashboard and operator commands), through real
//! HTTP against a real server.
//!
//! One test binary; each module covers one page family: [`actions`] (refunds and payouts from the
//! dashboard), [`links`] (payment links), [`auth`] (login, logout, cookies, CSRF on every
//! form, throttling), [`pages`] (overview, transactions with filters, pages and detail, payouts, amounts in
//! major units), [`keys`] (the "API keys" section: reveal, roll, the Webhook URL and its validation) and
//! [`webhooks`] (deliveries with their attempts, resend, and the saved URL receiving the next webhook).
//! Every test starts its own server ([`support::spawn_app`]), so tests run in parallel and leave nothing
//! behind; [`agent`] is the browser-like client of the pages.

#[path = "../support/mod.rs"]
mod support;

mod actions;
mod agent;
mod auth;
mod cluster;
mod keys;
mod links;
mod pages;
mod webhooks;
