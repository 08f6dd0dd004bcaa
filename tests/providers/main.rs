//! Real provider adapters against local fakes of the providers (`caisse-fakes`): a production-mode server
//! collects, pays out and refunds through each adapter, and the fakes show what the providers received.

use serde_json::{json, Value};

#[path = "../support/mod.rs"]
mod support;

use support::TestApp;

#[path = "../dashboard/agent.rs"]
mod agent;
mod cinetpay;
mod mtn;
mod orange;
mod pawapay;
mod restart;
mod wave;

/// A mtn_momo payment of `amount` XOF from `phone` (the fake's outcome follows the number).
fn payment(amount: i64, phone: &str) -> Value {
    json!({"montant": amount, "devise": "XOF", "fournisseur": "mtn_momo", "client_telephone": phone})
}

/// Pays `amount` XOF from `phone` and waits until the payment has `status`; returns it.
async fn pay(app: &TestApp, amount: i64, phone: &str, status: &str) -> Value {
    let created = app.initiate(&payment(amount, phone)).await;
    app.wait_payment(created["reference"].as_str().expect("a reference"), status).await
}
