//! Hostile input (issue 7): what a fuzzer, a curious merchant or an abusive client can throw at the service,
//! through real HTTP against a real server.
//!
//! - [`schemathesis`]: the OpenAPI fuzzer from PyPI, installed into a cached virtual environment, runs against
//!   `/v1/openapi.json` with a valid key: no 5xx, no answer that breaks the document.
//! - [`isolation`]: two merchants; every API route and every dashboard page, walked from the route tables so
//!   that a new route cannot escape, refuses or hides the other merchant's records.
//! - [`secrets`]: the real binary logging at `trace` never writes a key, a password or a session cookie; the
//!   places that compare secrets use constant-time comparisons.
//! - [`limits`]: the per-key rate limit from configuration, bounded request heads, and request heads and
//!   bodies that never finish.
//!
//! Covered elsewhere and not repeated here: bodies over 64 KiB (`tests/api/errors.rs`,
//! `bodies_over_64_kib_are_413`), `limit` outside 1–100 (`tests/api/transactions.rs` and `retraits.rs`,
//! `bad_paging_parameters_name_their_field`), and the throttling of failed dashboard logins per address and
//! per account (`tests/dashboard/auth.rs`, `failed_logins_are_throttled_per_address_and_per_account`).

/// The dashboard suite's browser-like agent, for the pages.
#[path = "../dashboard/agent.rs"]
mod agent;
#[path = "../support/mod.rs"]
mod support;

mod isolation;
mod limits;
mod schemathesis;
mod secrets;
