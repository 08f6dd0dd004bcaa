//! Integration tests of the merchant REST API, through real HTTP against a real server.
//!
//! One test binary; each module covers one resource or one rule of the contract. Every test starts its own
//! server ([`support::spawn_app`], the harness the suites share) on a random loopback port with a fresh data directory, so tests run in
//! parallel and leave nothing behind. Sandbox outcomes are awaited by polling with a deadline, never by
//! fixed sleeps.

#[path = "../support/mod.rs"]
mod support;

mod chaos;
mod cluster;
mod errors;
mod idempotency;
mod isolation;
mod liens;
mod lifecycle;
mod notices;
mod paiement;
mod payer;
mod retraits;
mod sandbox;
mod soldes;
mod transactions;
mod utility;
