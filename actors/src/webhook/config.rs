//! The delivery pool's settings and its error type, below the actors that use them.

use std::path::PathBuf;
use std::time::Duration;

use super::schedule::RetrySchedule;
use crate::store::StoreError;

/// Tuning of the pool; [`DeliveryConfig::default`] is the production setting.
#[derive(Debug, Clone)]
pub struct DeliveryConfig {
    /// The production rules for webhook URLs: https only, no private or loopback addresses, checked at delivery.
    pub production: bool,
    pub schedule: RetrySchedule,
    /// The whole attempt (connect, TLS, headers, body) must finish within this (the interface's 10 s).
    pub timeout: Duration,
    /// Delivery actors; 0 means one per core.
    pub workers: usize,
    pub max_in_flight_per_worker: usize,
    pub max_per_host: usize,
    /// Bound for a host whose last attempt timed out or could not connect.
    pub max_per_slow_host: usize,
    /// Deliveries waiting for a busy host, per worker; beyond it they wait in the store for the next scan.
    pub max_waiting_per_worker: usize,
    pub scan_every: Duration,
    /// Extra trust anchors (PEM), for receivers behind an internal CA (and the tests' self-signed one).
    pub extra_roots_pem: Option<PathBuf>,
    /// Delivered notifications made longer ago than this are deleted, body and attempts; `None` keeps them.
    pub retention: Option<Duration>,
    /// How often the dispatcher looks for delivered notifications past `retention`.
    pub retention_every: Duration,
}

/// What merchants expect of a notification log: a month of history (docs/operations.md § Retention).
pub const DEFAULT_NOTIFICATION_RETENTION: Duration = Duration::from_secs(30 * 24 * 60 * 60);

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            production: false,
            schedule: RetrySchedule::default(),
            timeout: Duration::from_secs(10),
            workers: 0,
            max_in_flight_per_worker: 2_048,
            max_per_host: 128,
            max_per_slow_host: 2,
            max_waiting_per_worker: 50_000,
            scan_every: Duration::from_millis(500),
            extra_roots_pem: None,
            retention: Some(DEFAULT_NOTIFICATION_RETENTION),
            retention_every: Duration::from_secs(60 * 60),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeliveryError {
    #[error("TLS setup: {0}")]
    Tls(String),
    #[error("no such notification")]
    NotFound,
    #[error("this notification is being delivered right now")]
    InFlight,
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the delivery pool stopped")]
    Stopped,
    /// In a cluster: the node that delivers the merchant's notifications could not be reached, or none does now.
    #[error("service unavailable: {0}")]
    Unavailable(String),
}
