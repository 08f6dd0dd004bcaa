//! The test harness every suite that talks to a running Caisse stands on (api, webhooks, dashboard,
//! hostile, browser, providers): one real server per test, one client of the merchant API, one webhook
//! receiver, and bounded waiting. Each test binary includes it with `#[path = "../support/mod.rs"] mod support;`,
//! and builds what only it needs (the dashboard's cookie-keeping agent, the webhook checks, the browser's
//! WebDriver session) on top of it. The faults and crash suites, which run the real binary with clients of
//! their own on purpose (one that never panics, one that survives kills), take its waiting helpers too; the
//! fakes suite, which tests the provider fakes without a Caisse, its fake, client, receiver and waits.
//!
//! - [`app`]: [`spawn_app`] / [`spawn_app_with`] start a server in-process on a random loopback port with a
//!   fresh temporary data directory and short sandbox delays; [`TestApp`] creates merchants and reads what the
//!   store holds.
//! - [`api`]: [`Api`], the merchant API over real HTTP with a secret key, its requests ([`Req`]), answers
//!   ([`Resp`], every one checked for a `Request-Id`, unless read with `Api::fetch` from a server that is not
//!   Caisse) and verbs (`initiate`, `fund`, `wait_payment`, `post_payout`, `balance`, ...). A [`TestApp`]
//!   dereferences to the demo merchant's [`Api`].
//! - [`checks`]: the checks many tests share (the error answer, the list shape) and small JSON readers.
//! - [`fake`]: [`Fake`], a provider fake (`caisse-fakes`) run as a child process and driven through its
//!   control API, for the suites that test the provider adapters or the fakes themselves.
//! - [`postgres`]: a fresh PostgreSQL database per test, on a private cluster the first one starts (or on
//!   `CAISSE_TEST_DATABASE_URL`); [`spawn_app_on_postgres`] starts a server storing there.
//! - [`proxy`]: a TCP proxy a test can cut, to cut a node off its database without an error it could see.
//! - [`receiver`]: a webhook receiver on loopback that records every request and answers per a script.
//! - [`wait`]: [`eventually`] and [`until`], polling with a bounded deadline; ports and clocks.

// Each test binary uses a different subset of the harness; what one binary leaves unused (a helper, or its
// re-export below) is used by another.
#![allow(dead_code, unused_imports)]

pub mod api;
pub mod app;
pub mod checks;
pub mod fake;
#[path = "../../actors/tests/support/postgres.rs"]
pub mod postgres;
pub mod proxy;
pub mod receiver;
pub mod wait;

pub use api::{payment_body, payout_body, Api, Req, Resp};
pub use app::{
    caisse_beside, describe, spawn_app, spawn_app_on_postgres, spawn_app_with, spawn_cluster_node,
    spawn_production_app, test_settings, TestApp, PAYMENT_TTL_MS, SANDBOX_DELAY_MS,
};
pub use checks::{assert_error, assert_list_shape, data, field_values, int, reference_of, text};
pub use fake::Fake;
pub use receiver::{always, script, Hit, Receiver, Reply, Script};
pub use wait::{eventually, free_port, sleep_ms, unix_s, until, DEADLINE};
