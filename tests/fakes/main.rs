//! Drives the `caisse-fakes` binary through each provider's protocol as an adapter would: tokens, creation,
//! duplicate ids, status queries, callbacks received by a receiver in the test, and the control knobs.
//!
//! # Layout
//! - `../support/`: the shared harness: the fake as a child process ([`support::Fake`]), the HTTP client
//!   ([`support::Api`], read with `fetch`), the callback receiver ([`support::Receiver`]), bounded waits.
//! - `pawapay.rs`: the pawaPay v2 protocol; `pawapay_knobs.rs`: signed callbacks and the knobs.
//! - `mtn.rs`: the MTN MoMo fake.

#[path = "../support/mod.rs"]
mod support;

mod mtn;
mod pawapay;
mod pawapay_knobs;

/// A fresh UUIDv4.
pub fn uuid() -> String {
    let bytes: [u8; 16] = rand::random();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let variant = ['8', '9', 'a', 'b'][usize::from(bytes[0] & 3)];
    format!("{}-{}-4{}-{variant}{}-{}", &hex[..8], &hex[8..12], &hex[13..16], &hex[17..20], &hex[20..32])
}
