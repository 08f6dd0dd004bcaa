//! The admin API on its own listener (docs/operations.md § Admin API): merchant accounts while the server
//! runs, suspension seen by the API and the dashboard, new passwords, and `GET /metrics`; and the `caisse`
//! binary's production start and `caisse merchant` commands against it.

#[path = "../support/mod.rs"]
mod support;

#[path = "../dashboard/agent.rs"]
mod agent;

mod backup;
mod binary;
mod merchants;
mod metrics;

use support::{spawn_app_with, Api, TestApp};

/// The admin token of the test servers (at least 32 characters).
pub const TOKEN: &str = "admin-token-for-tests-0123456789abcdef";

/// A sandbox server with the admin API on, and a client of it.
pub async fn start() -> (TestApp, Api) {
    let app = spawn_app_with(|s| s.admin_token = Some(caisse::config::Secret::new(TOKEN.into()))).await;
    let admin = Api::new(&format!("http://127.0.0.1:{}", app.admin_port.expect("the admin API runs")), TOKEN);
    (app, admin)
}
