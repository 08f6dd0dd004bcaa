//! Real provider adapters against local fakes of the providers (`caisse-fakes`): a production-mode server
//! collects, pays out and refunds through each adapter, and the fakes show what the providers received.

#[path = "../support/mod.rs"]
mod support;

mod fake;
mod mtn;
mod pawapay;
mod restart;
