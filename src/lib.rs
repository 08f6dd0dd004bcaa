//! Caisse: a self-hostable payment collection and payout service.
//!
//! # Layout
//!
//! - [`app`]: builds the application from [`config::Settings`] and runs it (used by `main` and the tests).
//! - [`config`]: compiled-in commented defaults, then `caisse.toml`, then `CAISSE_*`, then flags.
//! - [`http`]: the REST API under `/v1`, one file per resource, errors mapped in one place.
//! - [`dashboard`]: the merchant dashboard, server-rendered HTML at `/` (login, balances, transactions,
//!   payouts, webhook deliveries, the "API keys" section), one file per page family.
//! - [`flow`]: a payment's whole life between the API and the engine: start, provider request, the provider's
//!   answer confirmed and applied, the TTL sweep, the reconciliation and the resubmission after a restart.
//! - [`providers`]: the provider adapter trait, the catalogue, the sandbox simulator.
//! - [`merchants`]: merchant accounts (keys, password hashes, webhook URLs).
//! - [`admin`]: the admin API on its own listener (merchant accounts while running, `GET /metrics`);
//!   [`metrics`] holds the server's counters and renders every metric.
//! - [`client_address`]: who the client is behind the operator's trusted proxies.
//! - [`sandbox_modes`]: the sandbox's chaos modes as a setting, below both the configuration and the simulator.
//!
//! The engine itself (merchant actors, ledger, store) is the `caisse-engine` crate in `actors/`. A payment
//! comes in at `POST /v1/paiement/initier` ([`http`]), becomes an engine command, is made durable by the
//! engine's group commit, goes to the provider ([`providers`]), and comes back as a provider notice that
//! [`flow`] confirms and applies; each status change leaves a webhook notification in the engine's outbox.

pub mod admin;
pub mod app;
pub mod client_address;
pub mod config;
pub mod dashboard;
pub mod flow;
pub mod http;
pub mod merchants;
pub mod metrics;
pub mod payer;
pub mod providers;
pub mod sandbox_modes;
