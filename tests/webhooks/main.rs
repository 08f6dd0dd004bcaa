//! Integration tests of webhook delivery (docs/api.md § Webhooks), through real HTTP: a real
//! Caisse server (in-process, or the real binary for the crash test), real local receivers that record
//! every request and answer per a script, and the merchant examples of `examples/`.
//!
//! Loopback only, temporary directories, short retry schedules, bounded polling. The one case that must
//! wait out the 10 s acknowledgement time-out runs in parallel with the others.

mod events;
mod https;
mod receivers;
mod restart;
mod retries;
mod support;

/// The Rust example receiver, compiled in so its handler is tested as written (its `main` is not used here).
#[path = "../../examples/webhook_receiver.rs"]
#[allow(dead_code)]
mod rust_example;
