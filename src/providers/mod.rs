//! Payment providers: one adapter trait ([`Adapter`]) for everything Caisse asks of a provider or hears from
//! it, the catalogue of configured providers ([`Providers`]), and the sandbox simulator behind the same trait.
//!
//! Outbound calls (request to pay, status query, refund, payout) start work at the provider; answers come
//! back later as signed notices to `POST /v1/fournisseurs/{code}/notifications`, which the adapter
//! authenticates and parses. Caisse never moves money on a notice alone: it confirms with a status query
//! first, so a forged or replayed notice cannot credit anybody.
//!
//! In the sandbox the simulator ([`sandbox`]) plays every provider; [`chaos`] makes it misbehave on demand
//! (duplicate, late, out-of-order and contradicting notices) so integrations can be tested against it.
//!
//! Futures here are not `Send`: the HTTP client (awc) lives on the actix thread that calls it.

pub mod chaos;
pub mod sandbox;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use actix_web::http::header::HeaderMap;
use caisse_engine::domain::money::{Amount, Currency};
use caisse_engine::domain::records::{Payment, Payout, Refund};
use serde::{Deserialize, Serialize};

use crate::config::{Environment, Operation, ProviderSettings, Settings};

pub type LocalFuture<T> = Pin<Box<dyn Future<Output = T>>>;

/// What a notice or a status query is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Subject {
    Payment,
    Refund,
    Payout,
}

/// A provider's view of one transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "statut", rename_all = "snake_case")]
pub enum ProviderStatus {
    /// The provider has not started, or does not know the transaction.
    Pending,
    /// Accepted, waiting for the customer.
    Processing,
    Succeeded,
    Failed {
        code: String,
    },
}

/// An authenticated notice: which transaction it is about (our transaction id).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notice {
    pub subject: Subject,
    pub transaction_id: String,
    #[serde(flatten)]
    pub status: ProviderStatus,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    #[error("the notice is not authentic: {0}")]
    Unauthenticated(String),
    #[error("the notice is malformed: {0}")]
    Malformed(String),
    #[error("the provider could not be reached: {0}")]
    Unreachable(String),
}

/// Everything Caisse asks of one provider.
pub trait Adapter: Send + Sync {
    fn request_to_pay(&self, payment: &Payment) -> LocalFuture<Result<(), ProviderError>>;
    fn status(&self, subject: Subject, transaction_id: &str) -> LocalFuture<Result<ProviderStatus, ProviderError>>;
    fn refund(&self, payment: &Payment, refund: &Refund) -> LocalFuture<Result<(), ProviderError>>;
    fn payout(&self, payout: &Payout) -> LocalFuture<Result<(), ProviderError>>;
    /// Authenticates and parses an inbound notice; anything unauthenticated is refused before parsing.
    fn parse_notice(&self, headers: &HeaderMap, body: &[u8]) -> Result<Notice, ProviderError>;
}

/// One configured provider: its published settings and, when active, its adapter.
pub struct Provider {
    pub settings: ProviderSettings,
    pub adapter: Option<Arc<dyn Adapter>>,
}

impl Provider {
    pub fn active(&self) -> bool {
        self.adapter.is_some()
    }

    pub fn supports(&self, operation: Operation, currency: Currency) -> bool {
        self.active() && self.settings.operations.contains(&operation) && self.settings.currencies.contains(&currency)
    }

    pub fn bounds(&self, currency: Currency) -> Option<(Amount, Amount)> {
        self.settings.limits.get(&currency).copied()
    }
}

/// The configured providers, by code.
#[derive(Clone)]
pub struct Providers {
    by_code: Arc<BTreeMap<String, Provider>>,
    pub simulator: Option<Arc<sandbox::Simulator>>,
}

impl Providers {
    /// In the sandbox every provider is simulated. In production a provider is active only with credentials;
    /// no real provider protocol ships yet, so production providers stay inactive (listed `actif: false`)
    /// unless the simulator is explicitly enabled.
    pub fn from_settings(settings: &Settings) -> Providers {
        let simulator = settings.sandbox_simulator.then(|| {
            Arc::new(
                sandbox::Simulator::new(
                    settings.sandbox_secret.clone(),
                    settings.sandbox_delay_ms,
                    settings.payment_ttl_ms,
                )
                .with_chaos(settings.sandbox_chaos),
            )
        });
        let by_code = settings
            .providers
            .iter()
            .map(|p| {
                let adapter: Option<Arc<dyn Adapter>> = match (&simulator, settings.environment) {
                    (Some(sim), _) => Some(sim.clone()),
                    (None, Environment::Production) if p.credentials.is_some() => {
                        tracing::warn!(provider = %p.code, "credentials set but no production adapter for this provider yet; it stays inactive");
                        None
                    }
                    _ => None,
                };
                (p.code.as_str().to_owned(), Provider { settings: p.clone(), adapter })
            })
            .collect();
        Providers { by_code: Arc::new(by_code), simulator }
    }

    /// A catalogue of exactly these providers (the tests build one around a provider of their own).
    pub fn new(providers: impl IntoIterator<Item = Provider>, simulator: Option<Arc<sandbox::Simulator>>) -> Providers {
        let by_code = providers.into_iter().map(|p| (p.settings.code.as_str().to_owned(), p)).collect();
        Providers { by_code: Arc::new(by_code), simulator }
    }

    pub fn get(&self, code: &str) -> Option<&Provider> {
        self.by_code.get(code)
    }

    pub fn all(&self) -> impl Iterator<Item = &Provider> {
        self.by_code.values()
    }
}
