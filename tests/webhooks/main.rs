//! Integration tests of webhook delivery (docs/api.md § Webhooks), through real HTTP: a real
//! Caisse server (in-process, or the real binary for the crash test), real local receivers that record
//! every request and answer per a script, and the merchant examples of `examples/`.
//!
//! Loopback only, temporary directories, short retry schedules, bounded polling. The one case that must
//! wait out the 10 s acknowledgement time-out runs in parallel with the others. The server, the API client
//! and the receiver are the shared harness's ([`support`]); [`delivery`] holds what every delivery must be.

#[path = "../support/mod.rs"]
mod support;

mod delivery;
mod events;
mod https;
mod process;
mod receivers;
mod restart;
mod retries;

/// The Rust example receiver, compiled in so its handler is tested as written (its `main` is not used here).
#[path = "../../examples/webhook_receiver.rs"]
#[allow(dead_code)]
mod rust_example;
