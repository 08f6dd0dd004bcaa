//! The sandbox simulator's scripted outcomes (docs/api.md § Providers and the sandbox), by the last two digits
//! of the phone number.

use std::time::Duration;

use serde_json::Value;

use crate::support::{data, payout_body, spawn_app, text, PAYMENT_TTL_MS};

#[actix_web::test]
async fn ending_01_is_declined_for_insufficient_funds() {
    let app = spawn_app().await;
    let p = app.pay(10000, "01").await;
    assert_eq!(p["statut"], "initie");
    let p = app.wait_payment(text(&p["reference"]), "echec").await;
    assert_eq!(p["failure_code"], "insufficient_funds");
    assert_eq!(p["paid_at"], Value::Null);
    assert_eq!(app.balance("XOF").await, (0, 0, 0));
}

#[actix_web::test]
async fn ending_02_never_answers_and_expires_after_the_ttl() {
    let app = spawn_app().await;
    let started = std::time::Instant::now();
    let p = app.pay(10000, "02").await;
    let reference = text(&p["reference"]).to_owned();
    app.wait_payment(&reference, "en_cours").await;
    let p = app.wait_payment(&reference, "expire").await;
    assert!(started.elapsed() >= Duration::from_millis(PAYMENT_TTL_MS), "not before the TTL");
    assert_eq!(p["paid_at"], Value::Null);
    assert_eq!(app.balance("XOF").await, (0, 0, 0));
    let tx = app.get_ok(&format!("/v1/transactions/{reference}")).await;
    assert_eq!(tx["statut"], "expire");
}

#[actix_web::test]
async fn ending_03_succeeds_once_despite_three_notices() {
    let app = spawn_app().await;
    let p = app.pay(10000, "03").await;
    let reference = text(&p["reference"]).to_owned();
    let p = app.wait_payment(&reference, "succes").await;
    let paid_at = p["paid_at"].clone();
    assert!(paid_at.is_string());
    // Let the duplicate notices land, then check the balance moved once.
    actix_web::rt::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(app.balance("XOF").await, (9850, 0, 9850));
    let again = app.get_ok(&format!("/v1/paiement/{reference}")).await;
    assert_eq!(again["statut"], "succes");
    assert_eq!(again["paid_at"], paid_at, "duplicates change nothing");
    assert_eq!(data(&app.get_ok("/v1/transactions").await).len(), 1);
}

#[actix_web::test]
async fn ending_04_expires_then_a_late_success_credits() {
    let app = spawn_app().await;
    let p = app.pay(10000, "04").await;
    let reference = text(&p["reference"]).to_owned();
    app.wait_payment(&reference, "expire").await;
    assert_eq!(app.balance("XOF").await, (0, 0, 0), "nothing while expired");
    let p = app.wait_payment(&reference, "succes").await;
    assert!(p["paid_at"].is_string());
    assert_eq!(app.balance("XOF").await, (9850, 0, 9850));
}

#[actix_web::test]
async fn any_other_ending_succeeds_after_the_delay() {
    let app = spawn_app().await;
    let mut refs = Vec::new();
    for ending in ["00", "05", "42", "99"] {
        let p = app.pay(1000, ending).await;
        assert_eq!(p["statut"], "initie");
        refs.push(text(&p["reference"]).to_owned());
    }
    for r in &refs {
        let p = app.wait_payment(r, "succes").await;
        assert!(p["paid_at"].is_string());
        assert_eq!(p["failure_code"], Value::Null);
    }
    assert_eq!(app.balance("XOF").await, (4 * 985, 0, 4 * 985));
}

#[actix_web::test]
async fn payouts_to_01_are_rejected_others_processed() {
    let app = spawn_app().await;
    app.fund(100_000).await; // 98500
    let mut cases = Vec::new();
    for (ending, status) in [("01", "rejete"), ("02", "traite"), ("03", "traite"), ("04", "traite"), ("77", "traite")] {
        let resp = app.send(app.post("/v1/retraits").json(&payout_body(1000, ending))).await;
        resp.expect(201);
        assert_eq!(resp.json["statut"], "en_attente");
        cases.push((text(&resp.json["id"]).to_owned(), status));
    }
    for (id, status) in &cases {
        let o = app.wait_payout(id, status).await;
        if *status == "rejete" {
            assert!(o["motif_rejet"].is_string());
            assert_eq!(o["processed_at"], Value::Null);
        } else {
            assert!(o["processed_at"].is_string());
            assert_eq!(o["motif_rejet"], Value::Null);
        }
    }
    assert_eq!(app.balance("XOF").await, (98500 - 4 * 1000, 0, 94500));
}
