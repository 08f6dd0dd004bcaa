//! Integration tests of the merchant REST API, through real HTTP against a real server.
//!
//! One test binary; each module covers one resource or one rule of docs/api.md. Every test starts its own
//! server ([`helpers::spawn_app`]) on a random loopback port with a fresh data directory, so tests run in
//! parallel and leave nothing behind. Sandbox outcomes are awaited by polling with a deadline, never by
//! fixed sleeps.

mod chaos;
mod errors;
mod helpers;
mod idempotency;
mod isolation;
mod lifecycle;
mod notices;
mod paiement;
mod retraits;
mod sandbox;
mod soldes;
mod transactions;
mod utility;
