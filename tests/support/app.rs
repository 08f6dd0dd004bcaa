//! One real server per test: built in-process as `main` builds it, on a random loopback port, with a fresh
//! temporary data directory and short sandbox delays, so tests run in parallel and leave nothing behind.

use std::ops::Deref;
use std::time::Duration;

use actix_web::web;
use caisse::app::Application;
use caisse::config::adapters::Secret;
use caisse::config::{Environment, Settings, StoreLocation};
use caisse::http::AppState;
use caisse::merchants::{self, Created, NewMerchant};
use caisse_engine::domain::ids::MerchantId;
use caisse_engine::domain::records::{Merchant, Notification};

use super::api::Api;
use super::wait::eventually;

/// Sandbox provider delay used by the tests (ms).
pub const SANDBOX_DELAY_MS: u64 = 100;
/// Payment TTL used by the tests (ms).
pub const PAYMENT_TTL_MS: u64 = 1_500;
/// Webhook retry schedule used by the tests: one retry, 100 ms after the first attempt.
pub const WEBHOOK_RETRY_MS: u64 = 100;

/// A running server and its demo merchant. Dereferences to the demo merchant's [`Api`] client, so
/// `app.send(app.get(..))`, `app.fund(..)`, `app.key` and `app.address` read as calls of the API.
pub struct TestApp {
    pub port: u16,
    /// The admin API's port, when the test set an admin token.
    pub admin_port: Option<u16>,
    pub state: web::Data<AppState>,
    /// The demo merchant made on first start, with its password.
    pub demo: Created,
    /// The API, called with the demo merchant's key.
    pub api: Api,
    server: actix_web::rt::task::JoinHandle<std::io::Result<()>>,
    _dir: tempfile::TempDir,
    /// The PostgreSQL database the server stores in, when it does; dropped after the server.
    _database: Option<super::postgres::TestDatabase>,
}

impl Drop for TestApp {
    /// Dropping the server task drops the server: listeners closed, workers stopped.
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl Deref for TestApp {
    type Target = Api;

    fn deref(&self) -> &Api {
        &self.api
    }
}

/// Settings for a test server: fast sandbox, short TTL, one quick webhook retry, few threads.
pub fn test_settings(dir: &std::path::Path) -> Settings {
    let mut settings = Settings::for_tests(dir).expect("test settings");
    settings.sandbox_delay_ms = SANDBOX_DELAY_MS;
    settings.payment_ttl_ms = PAYMENT_TTL_MS;
    settings.webhook_retry_schedule_ms = vec![WEBHOOK_RETRY_MS];
    settings.http_workers = 2;
    // A rolled key stops at once unless a test asks for the grace (the default is a day).
    settings.key_roll_grace_ms = 0;
    settings
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

/// A server in the production environment (secure cookies, https-only webhook URLs).
pub async fn spawn_production_app() -> TestApp {
    spawn_app_with(|s| s.environment = Environment::Production).await
}

/// A server storing in a fresh PostgreSQL database instead of the embedded store (cluster mode's store).
pub async fn spawn_app_on_postgres() -> TestApp {
    let database = super::postgres::database();
    let url = database.url.clone();
    let mut app = spawn_app_with(|s| s.store = StoreLocation::Postgres(Secret::new(url))).await;
    app._database = Some(database);
    app
}

/// A node of a cluster storing in `database` (which the test keeps), named `node`, on its own port, which is
/// also the URL it advertises to the other nodes.
pub async fn spawn_cluster_node(database: &super::postgres::TestDatabase, node: &str) -> TestApp {
    let url = database.url.clone();
    let port = super::wait::free_port();
    spawn_app_with(|s| {
        s.store = StoreLocation::Postgres(Secret::new(url));
        s.node_id = node.to_owned();
        s.listen = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        s.advertise_url = format!("http://127.0.0.1:{port}");
    })
    .await
}

/// The `caisse` command beside the nodes of a cluster on `database`, run from `work` without an admin token:
/// it works on the shared database directly.
pub fn caisse_beside(database: &super::postgres::TestDatabase, work: &std::path::Path) -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_caisse"));
    command
        .current_dir(work)
        .env("CAISSE_STORE", &database.url)
        .env("CAISSE_MASTER_KEY", caisse::config::TEST_MASTER_KEY)
        .env("CAISSE_DATA_DIR", work.join("data"))
        .env("CAISSE_LOG", "warn")
        .env_remove("CAISSE_ADMIN_TOKEN");
    command
}

/// Starts a server with the test settings changed by `tweak`.
pub async fn spawn_app_with(tweak: impl FnOnce(&mut Settings)) -> TestApp {
    let dir = tempfile::TempDir::new().expect("temp dir");
    let mut settings = test_settings(dir.path());
    tweak(&mut settings);
    let env = settings.environment;
    let app = Application::build(settings).await.expect("application starts");
    let port = app.port();
    let admin_port = app.admin_port();
    let state = app.state();
    // The sandbox makes a demo merchant on first start; production starts empty, so the test makes one.
    let demo = match app.demo.clone() {
        Some(demo) => demo,
        None => {
            let new = NewMerchant {
                name: "Boutique".into(),
                email: "boutique@example.com".into(),
                password: None,
                webhook_url: None,
            };
            merchants::create(&state.engine, env, new).await.expect("a first merchant")
        }
    };
    let api = Api::new(&format!("http://127.0.0.1:{port}"), &demo.merchant.secret_key);
    let server = actix_web::rt::spawn(app.run_until_stopped());
    TestApp { port, admin_port, state, demo, api, server, _dir: dir, _database: None }
}

impl TestApp {
    pub fn email(&self) -> &str {
        &self.demo.merchant.email
    }

    pub fn password(&self) -> &str {
        &self.demo.password
    }

    /// The demo merchant as stored now.
    pub fn demo_merchant(&self) -> Merchant {
        self.stored_merchant(&self.demo.merchant.id)
    }

    /// Creates another merchant in this server's store: `name`, an e-mail made from it, a dashboard password
    /// and, when given, a webhook URL.
    pub async fn create_merchant(&self, name: &str, webhook_url: Option<&str>) -> Created {
        let new = NewMerchant {
            name: name.to_owned(),
            email: format!("{}@example.com", name.to_lowercase().replace(' ', "-")),
            password: Some(format!("{name} password of the dashboard")),
            webhook_url: webhook_url.map(str::to_owned),
        };
        merchants::create(&self.state.engine, self.state.settings.environment, new).await.expect("merchant created")
    }

    /// Runs the store's ledger audit: every balance equals the sum of its ledger entries.
    pub fn audit(&self) {
        self.state.engine.audit().expect("every balance equals the sum of its ledger entries");
    }

    /// A merchant as stored now.
    pub fn stored_merchant(&self, id: &MerchantId) -> Merchant {
        self.state.engine.merchant(id).expect("store").expect("merchant exists")
    }

    /// The merchant's webhook notifications in the store, oldest first.
    pub fn notifications(&self, merchant: &MerchantId) -> Vec<Notification> {
        let mut all = self.notifications_where(merchant, &mut |_| true);
        all.reverse();
        all
    }

    /// The merchant's notification about `reference` with `event`, if there is one.
    pub fn notification(&self, merchant: &MerchantId, reference: &str, event: &str) -> Option<Notification> {
        let mut about = |n: &Notification| n.reference == reference && n.event.as_str() == event;
        self.notifications_where(merchant, &mut about).into_iter().next()
    }

    /// The merchant's latest 100 notifications that `filter` keeps, newest first.
    fn notifications_where(
        &self,
        merchant: &MerchantId,
        filter: &mut dyn FnMut(&Notification) -> bool,
    ) -> Vec<Notification> {
        self.state.engine.notifications(merchant, None, 100, filter).expect("notifications").data
    }

    /// One stored notification, by its id.
    pub fn notification_by_id(&self, merchant: &MerchantId, id: &str) -> Notification {
        self.state.engine.notification(merchant, id).expect("read").expect("stored")
    }

    /// Waits until the merchant has `count` notifications and `done` holds for each.
    pub async fn wait_notifications(
        &self,
        merchant: &MerchantId,
        count: usize,
        deadline: Duration,
        done: impl Fn(&Notification) -> bool,
    ) -> Vec<Notification> {
        eventually("notifications settled", deadline, || {
            let all = self.notifications(merchant);
            let seen = if all.len() == count && all.iter().all(&done) {
                Ok(all)
            } else {
                Err(format!("{} notifications: {}", all.len(), describe(&all)))
            };
            std::future::ready(seen)
        })
        .await
    }
}

/// One line per notification: event, state, attempts' statuses.
pub fn describe(all: &[Notification]) -> String {
    all.iter()
        .map(|n| {
            let attempts: Vec<String> = n
                .attempts
                .iter()
                .map(|a| a.http_status.map(|s| s.to_string()).unwrap_or_else(|| format!("{:?}", a.error)))
                .collect();
            format!("{} {} {:?} [{}]", n.event.as_str(), n.reference, n.state, attempts.join(","))
        })
        .collect::<Vec<_>>()
        .join("; ")
}
