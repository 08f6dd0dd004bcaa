//! The whole life of a merchant's money over the API: payment, credit, partial refund, payout, and the
//! balances and transaction list agreeing at the end.

use serde_json::{json, Value};

use crate::support::{int, payout_body, spawn_app, spawn_app_on_postgres, text, TestApp};
use crate::transactions::assert_transaction_shape;

#[actix_web::test]
async fn payment_refund_payout_and_the_books_agree() {
    the_life_of_the_money(&spawn_app().await).await;
}

/// The same life with everything stored in PostgreSQL, the store of a cluster.
#[actix_web::test]
async fn payment_refund_payout_and_the_books_agree_on_postgresql() {
    let app = spawn_app_on_postgres().await;
    the_life_of_the_money(&app).await;
    app.audit();
}

async fn the_life_of_the_money(app: &TestApp) {
    let reference = a_payment_is_credited_net(app).await;
    let refund_ref = a_partial_refund_is_reserved_then_completed(app, &reference).await;
    let payout_id = a_payout_is_debited(app).await;
    the_books_agree(app, &reference, &refund_ref, &payout_id).await;
}

/// 1. A payment of 10 000 XOF through mtn_momo (1.5 %: frais 150, net 9850). Returns its reference.
async fn a_payment_is_credited_net(app: &TestApp) -> String {
    let p = app.pay(10000, "55").await;
    assert_eq!(p["statut"], "initie");
    let reference = text(&p["reference"]).to_owned();
    let p = app.wait_payment(&reference, "succes").await;
    assert!(p["paid_at"].is_string());
    assert_eq!(app.balance("XOF").await, (9850, 0, 9850), "credited by montant_net");
    reference
}

/// 2. A partial refund of 4000: reserved at once, then completed. Returns the refund's reference.
async fn a_partial_refund_is_reserved_then_completed(app: &TestApp, reference: &str) -> String {
    let resp =
        app.send(app.post(&format!("/v1/paiement/{reference}/rembourser")).json(&json!({"montant": 4000}))).await;
    resp.expect(200);
    assert_eq!(resp.json["statut"], "succes");
    assert_eq!(resp.json["remboursement"]["statut"], "en_cours");
    let refund_ref = text(&resp.json["remboursement"]["reference"]).to_owned();
    let (available, _, _) = app.balance("XOF").await;
    assert_eq!(available, 5850);
    app.wait_refund(reference, "succes").await;
    let p = app.wait_payment(reference, "rembourse_partiellement").await;
    assert_eq!(p["remboursement"]["statut"], "succes");
    assert_eq!(p["montant_rembourse"], 4000);
    assert!(p["remboursement"]["completed_at"].is_string());
    assert_eq!(app.balance("XOF").await, (5850, 0, 5850));
    refund_ref
}

/// 3. A payout of 2000 (frais 30, the beneficiary gets 1970). Returns its id.
async fn a_payout_is_debited(app: &TestApp) -> String {
    let resp = app.send(app.post("/v1/retraits").json(&payout_body(2000, "88"))).await;
    resp.expect(201);
    let payout_id = text(&resp.json["id"]).to_owned();
    assert_eq!(app.balance("XOF").await.0, 3850);
    let o = app.wait_payout(&payout_id, "traite").await;
    assert_eq!((int(&o["frais"]), int(&o["montant_net"])), (30, 1970));
    payout_id
}

/// 4. The books: balances and the transaction list agree.
async fn the_books_agree(app: &TestApp, reference: &str, refund_ref: &str, payout_id: &str) {
    assert_eq!(app.balance("XOF").await, (3850, 0, 3850));
    let items = app.list_all("/v1/transactions", 100).await;
    assert_eq!(items.len(), 3, "{items:?}");
    for tx in &items {
        assert_transaction_shape(tx);
        assert_eq!(tx["devise"], "XOF");
        assert_eq!(tx["fournisseur"], "mtn_momo");
        assert!(tx["paid_at"].is_string(), "every movement happened: {tx}");
    }
    // Newest first: the payout, the refund, the payment.
    let summary: Vec<(Value, Value, Value, Value, Value)> = items
        .iter()
        .map(|t| {
            (t["type"].clone(), t["statut"].clone(), t["montant"].clone(), t["frais"].clone(), t["montant_net"].clone())
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (json!("retrait"), json!("traite"), json!(2000), json!(30), json!(1970)),
            (json!("remboursement"), json!("succes"), json!(4000), json!(0), json!(4000)),
            (json!("paiement"), json!("rembourse_partiellement"), json!(10000), json!(150), json!(9850)),
        ]
    );
    assert_eq!(items[0]["reference"], payout_id);
    assert_eq!(items[1]["reference"], refund_ref);
    assert_eq!(items[1]["paiement_reference"], reference);
    assert_eq!(items[2]["reference"], reference);
    // What the list says adds up to the balance: credited net, minus the refund, minus the payout.
    let sum: i64 = items
        .iter()
        .map(|t| match text(&t["type"]) {
            "paiement" => int(&t["montant_net"]),
            _ => -int(&t["montant"]),
        })
        .sum();
    assert_eq!(sum, app.balance("XOF").await.2);

    // The single-transaction view matches the list.
    for tx in &items {
        assert_eq!(&app.get_ok(&format!("/v1/transactions/{}", text(&tx["reference"]))).await, tx);
    }
}
