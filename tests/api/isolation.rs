//! Merchants see only their own records: another merchant's reference is a 404 (docs/api.md § Errors).

use serde_json::json;

use crate::support::{assert_error, data, payment_body, payout_body, spawn_app, text};

#[actix_web::test]
async fn another_merchants_records_are_not_found() {
    let app = spawn_app().await;
    let other = app.create_merchant("Other Shop", None).await.merchant.secret_key;
    // The other merchant's succeeded payment, its refund and payout.
    let theirs = app.with_key(&other).fund(50000).await;
    let their_ref = text(&theirs["reference"]).to_owned();
    let resp = app
        .send(app.post(&format!("/v1/paiement/{their_ref}/rembourser")).auth(&other).json(&json!({"montant": 1000})))
        .await;
    resp.expect(200);
    let their_refund = text(&resp.json["remboursement"]["reference"]).to_owned();
    let resp = app.send(app.post("/v1/retraits").auth(&other).json(&payout_body(1000, "99"))).await;
    resp.expect(201);
    let their_payout = text(&resp.json["id"]).to_owned();
    app.with_key(&other).wait_payout(&their_payout, "traite").await;
    app.with_key(&other).wait_payment(&their_ref, "rembourse_partiellement").await;
    let their_balance = app.with_key(&other).balance("XOF").await;

    // The demo merchant cannot see or touch any of it.
    let not_found = [
        app.get(&format!("/v1/paiement/{their_ref}")),
        app.get(&format!("/v1/transactions/{their_ref}")),
        app.get(&format!("/v1/transactions/{their_refund}")),
        app.get(&format!("/v1/transactions/{their_payout}")),
        app.post(&format!("/v1/paiement/{their_ref}/rembourser")),
        app.post(&format!("/v1/paiement/{their_ref}/rembourser")).json(&json!({"montant": 100})),
        app.get(&format!("/v1/retraits/{their_payout}")),
    ];
    for req in not_found {
        let resp = app.send(req).await;
        assert_error(&resp, 404, "not_found", None);
    }
    assert_eq!(app.get_ok("/v1/transactions").await["data"], json!([]));
    assert_eq!(app.get_ok("/v1/retraits").await["data"], json!([]));
    assert_eq!(app.get_ok("/v1/soldes").await, json!({"data": []}));
    // Their cursor means nothing in my list.
    let page = app.get_ok(&format!("/v1/transactions?starting_after={}", text(&theirs["transaction_id"]))).await;
    assert_eq!(page["data"], json!([]));

    // Nothing of theirs changed.
    assert_eq!(app.with_key(&other).balance("XOF").await, their_balance);
    assert_eq!(data(&app.with_key(&other).get_ok("/v1/transactions").await).len(), 3);
}

#[actix_web::test]
async fn merchant_references_are_unique_per_merchant_only() {
    let app = spawn_app().await;
    let other = app.create_merchant("Other Shop", None).await.merchant.secret_key;
    let mut body = payment_body(1000, "02");
    body["reference"] = json!("commande-1");
    let mine = app.initiate(&body).await;
    body["montant"] = json!(2000);
    let theirs = app.with_key(&other).initiate(&body).await;
    assert_eq!(mine["reference"], theirs["reference"]);
    assert_ne!(mine["transaction_id"], theirs["transaction_id"]);
    assert_eq!(app.get_ok("/v1/paiement/commande-1").await["montant"], 1000);
    assert_eq!(app.with_key(&other).get_ok("/v1/paiement/commande-1").await["montant"], 2000);
}
