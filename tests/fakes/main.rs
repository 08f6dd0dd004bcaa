//! Drives the `caisse-fakes` binary through each provider's protocol as an adapter would: tokens, creation,
//! duplicate ids, status queries, callbacks received by a receiver in the test, and the control knobs.
//!
//! # Layout
//! - `support.rs`: spawning the fake, the HTTP client, the callback receiver, bounded waits.
//! - `pawapay.rs`: the pawaPay v2 protocol; `pawapay_knobs.rs`: signed callbacks and the knobs.
//! - `mtn.rs`: the MTN MoMo fake.

mod mtn;
mod pawapay;
mod pawapay_knobs;
mod support;
