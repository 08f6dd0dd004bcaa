//! Startup: builds the application from settings (engine, providers, HTTP server, background sweeps) and
//! runs it. `main` and the integration tests build it the same way.

use std::net::TcpListener;
use std::sync::Arc;

use actix_web::dev::Server;
use actix_web::{web, App};
use caisse_engine::{Engine, EngineConfig, EngineError};

use caisse_engine::webhook::delivery::{DeliveryConfig, DeliveryError};
use caisse_engine::webhook::schedule::RetrySchedule;

use crate::admin;
use crate::config::{Environment, Settings, StoreLocation};
use crate::dashboard::{self, DashboardState};
use crate::flow::{sweep, Flow};
use crate::http::server::ServerOptions;
use crate::http::{self, AppState, FailedAuth, RateLimiter};
use crate::merchants::{self, CreateError, Created, NewMerchant};
use crate::providers::Providers;
use caisse_engine::store::pg_store::NodeIdentity;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot open the store: {0}")]
    Engine(#[from] EngineError),
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("cannot create the demo merchant: {0}")]
    Demo(#[from] CreateError),
    #[error("{}", crate::config::MASTER_KEY_MISSING)]
    MasterKey,
    #[error("cannot start webhook delivery: {0}")]
    Webhooks(#[from] DeliveryError),
}

/// The webhook pool's settings: production rules follow the environment; the rest is the pool's default.
pub fn delivery_config(settings: &Settings) -> DeliveryConfig {
    DeliveryConfig {
        production: settings.environment == Environment::Production,
        schedule: RetrySchedule { waits_ms: settings.webhook_retry_schedule_ms.clone(), jitter_permille: 200 },
        extra_roots_pem: settings.webhook_extra_ca.clone(),
        retention: settings.notification_retention,
        ..DeliveryConfig::default()
    }
}

/// How often the server deletes idempotency records past their 24 hours, and how many batches (of 512
/// records, one merchant's each) a pass deletes at most: a busy day's records go over a few passes.
const FORGET_IDEMPOTENCY_EVERY: std::time::Duration = std::time::Duration::from_secs(60 * 60);
const FORGET_IDEMPOTENCY_FIRST: std::time::Duration = std::time::Duration::from_secs(5 * 60);
const FORGET_IDEMPOTENCY_BATCHES: usize = 10_000;

/// Deletes idempotency records past their 24 hours (docs/api.md § Idempotency) every hour, for the life of
/// the server, each merchant's through its actor.
fn forget_idempotency_hourly(engine: Engine) {
    actix_web::rt::spawn(async move {
        // A first pass soon after the start, so a server restarted more often than hourly still deletes.
        let mut wait = FORGET_IDEMPOTENCY_FIRST;
        loop {
            actix_web::rt::time::sleep(wait).await;
            wait = FORGET_IDEMPOTENCY_EVERY;
            let ttl_ms = caisse_engine::store::IDEMPOTENCY_TTL_MS;
            let before = caisse_engine::domain::time::Timestamp::from_unix_ms(
                caisse_engine::domain::time::Timestamp::now().unix_ms().saturating_sub(ttl_ms),
            );
            if let Err(e) = engine.forget_idempotency_before(before, FORGET_IDEMPOTENCY_BATCHES).await {
                tracing::warn!(error = %e, "deleting expired idempotency records stopped; the next pass goes on");
            }
        }
    });
}

/// Seconds a stopping server gives requests in flight before it closes their connections.
pub const SHUTDOWN_GRACE_S: u64 = 10;

pub struct Application {
    server: Server,
    port: u16,
    /// The admin API's server (running on its own task) and port, when an admin token is set.
    admin: Option<(actix_web::dev::ServerHandle, u16)>,
    state: web::Data<AppState>,
    /// The merchant created on first start (store without merchants), with its password.
    pub demo: Option<Created>,
}

impl Application {
    /// Opens the store (running the startup audit), creates the demo merchant on first start, binds the
    /// listener and starts the background sweeps. Must run inside an actix System.
    pub async fn build(settings: Settings) -> Result<Application, StartError> {
        if settings.environment == Environment::Production && settings.master_key.is_none() {
            return Err(StartError::MasterKey);
        }
        let settings = Arc::new(settings);
        let mut config = EngineConfig::new(&settings.data_dir);
        config.store_cache_bytes = settings.store_cache_bytes;
        if let StoreLocation::Postgres(url) = &settings.store {
            config.postgres_url = Some(url.expose().to_owned());
            config.node = Some(NodeIdentity { id: settings.node_id.clone(), url: settings.advertise_url.clone() });
            let host = settings.advertise_url.split("://").nth(1).unwrap_or_default();
            if ["127.", "localhost", "0.0.0.0", "[::1]", "[::]"].iter().any(|local| host.starts_with(local)) {
                tracing::warn!(
                    advertise_url = %settings.advertise_url,
                    "advertise_url is a local address: nodes on other machines cannot forward to this one (set \
                     advertise_url, CAISSE_ADVERTISE_URL)"
                );
            }
        }
        config.master_key = settings.master_key.clone();
        let engine = Engine::open(config)?;
        engine.start_audits(settings.audits);
        // A demo account is for trying the sandbox; production starts empty (merchants come from the admin
        // API or `caisse merchant create`), and prints no key.
        let demo = if settings.environment == Environment::Sandbox && engine.merchant_count()? == 0 {
            let new = NewMerchant {
                name: "Boutique démo".into(),
                email: "demo@caisse.local".into(),
                password: None,
                webhook_url: None,
            };
            match merchants::create(&engine, settings.environment, new).await {
                Ok(created) => Some(created),
                // Another node of the cluster, starting at the same moment, made it first.
                Err(CreateError::Engine(EngineError::EmailTaken(_))) => None,
                Err(e) => return Err(e.into()),
            }
        } else {
            None
        };
        let listener = TcpListener::bind(settings.listen)
            .map_err(|source| StartError::Bind { addr: settings.listen.to_string(), source })?;
        let bound =
            listener.local_addr().map_err(|source| StartError::Bind { addr: settings.listen.to_string(), source })?;
        let public_url = match (settings.public_url.as_str(), settings.environment) {
            ("", Environment::Sandbox) => format!("http://{bound}"),
            (url, _) => url.to_owned(),
        };
        let providers = Providers::from_settings(&settings, &public_url);
        if let Some(sim) = &providers.simulator {
            sim.set_base_url(format!("http://{bound}"));
        }
        let webhooks = engine.start_webhooks(delivery_config(&settings))?;
        let flow = Flow::new(engine.clone(), providers.clone());
        let links_base = links_base(&settings, bound);
        let state = web::Data::new(AppState {
            links_base,
            webhooks,
            engine,
            rate_limiter: RateLimiter::new(settings.rate_limit_per_s),
            failed_auth: FailedAuth::new(settings.failed_auth_per_minute),
            providers,
            flow: flow.clone(),
            settings: settings.clone(),
        });
        let app_state = state.clone();
        // One dashboard state for every worker: sessions and login throttling must be seen by all of them.
        let dashboard_state = web::Data::new(
            DashboardState::new(settings.environment).with_shared_sessions(state.engine.shared_sessions()),
        );
        let dashboard_for_app = dashboard_state.clone();
        // One payment-page state for every worker: a form issued by one must be taken by all of them.
        let payer_state = web::Data::new(match state.engine.forwarding() {
            Some(cluster) => crate::payer::PayerState::in_cluster(cluster.derive_key("payment page forms")),
            None => crate::payer::PayerState::new(),
        });
        // Only a node of a cluster has the route the others forward merchants' messages to.
        let in_cluster = state.engine.forwarding().is_some();
        let options = ServerOptions {
            name: "caisse-api",
            workers: settings.http_workers,
            // A stop lets requests in flight finish for this long, then closes their connections.
            shutdown_grace_s: SHUTDOWN_GRACE_S,
        };
        let server = http::server::serve(listener, options, move || {
            App::new()
                .app_data(app_state.clone())
                .app_data(dashboard_for_app.clone())
                .app_data(payer_state.clone())
                .wrap_fn(http::request_log)
                .configure(|cfg| {
                    if in_cluster {
                        http::cluster::configure(cfg);
                    }
                })
                .configure(http::configure)
                .configure(crate::payer::configure)
                .configure(dashboard::configure)
        })
        .map_err(|source| StartError::Bind { addr: bound.to_string(), source })?;
        // The listener is bound and the audit passed: a node of a cluster now takes its share of the merchants.
        state.engine.join_cluster()?;
        let admin = match &settings.admin_token {
            Some(token) => {
                let (admin, port) = admin::start(settings.admin_listen, token.clone(), state.clone(), dashboard_state)
                    .map_err(|source| StartError::Bind { addr: settings.admin_listen.to_string(), source })?;
                tracing::info!(port, "admin API listening");
                // A server runs while its future is polled: the admin one gets a task of its own.
                let handle = admin.handle();
                actix_web::rt::spawn(admin);
                Some((handle, port))
            }
            None => {
                tracing::info!("no admin token set: the admin API and /metrics are off");
                None
            }
        };
        sweep::start(flow, settings.payment_ttl_ms);
        forget_idempotency_hourly(state.engine.clone());
        Ok(Application { server, port: bound.port(), admin, state, demo })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The admin API's port, when it runs.
    pub fn admin_port(&self) -> Option<u16> {
        self.admin.as_ref().map(|(_, port)| *port)
    }

    pub fn state(&self) -> web::Data<AppState> {
        self.state.clone()
    }

    /// Runs until the API server stops (a signal stops both servers).
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let served = self.server.await;
        if let Some((admin, _)) = self.admin {
            admin.stop(true).await;
        }
        served
    }
}

/// `{public_url}/payer/`, where payment links live. Without a `public_url` the sandbox uses the address it
/// listens on (a wildcard address reads as loopback), so links work on the machine that runs it; production
/// serves links only under an https `public_url`, the address customers' phones can trust.
fn links_base(settings: &Settings, bound: std::net::SocketAddr) -> Option<String> {
    let public = settings.public_url.trim_end_matches('/');
    match settings.environment {
        Environment::Production if public.starts_with("https://") => Some(format!("{public}/payer/")),
        Environment::Production => {
            tracing::warn!("payment links are off: they need an https public_url (CAISSE_PUBLIC_URL)");
            None
        }
        _ if !public.is_empty() => Some(format!("{public}/payer/")),
        _ => {
            let host = match bound.ip() {
                ip if ip.is_unspecified() => std::net::SocketAddr::new([127, 0, 0, 1].into(), bound.port()),
                _ => bound,
            };
            Some(format!("http://{host}/payer/"))
        }
    }
}
