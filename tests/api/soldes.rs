//! `GET /v1/soldes` (docs/api.md § Balances): one row per currency used, `total = disponible + en_attente`,
//! reservations.

use serde_json::json;

use crate::support::{int, payout_body, spawn_app, spawn_app_with, text};

#[actix_web::test]
async fn no_row_before_any_money() {
    let app = spawn_app().await;
    assert_eq!(app.get_ok("/v1/soldes").await, json!({"data": []}));
}

#[actix_web::test]
async fn one_row_per_currency_with_the_contract_fields() {
    let app = spawn_app().await;
    app.fund(10000).await; // XOF net 9850
    let xaf = app
        .initiate(&json!({"montant": 20000, "devise": "XAF", "fournisseur": "orange_money", "client_telephone": "+237690000050"}))
        .await;
    app.wait_payment(text(&xaf["reference"]), "succes").await; // net 19700
    let body = app.get_ok("/v1/soldes").await;
    assert_eq!(body.as_object().expect("object").keys().collect::<Vec<_>>(), ["data"]);
    let rows = body["data"].as_array().expect("rows").clone();
    assert_eq!(rows.len(), 2, "{body}");
    for row in &rows {
        let mut keys: Vec<&str> = row.as_object().expect("row").keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["devise", "disponible", "en_attente", "total", "updated_at"], "{row}");
        assert_eq!(int(&row["total"]), int(&row["disponible"]) + int(&row["en_attente"]));
        assert!(text(&row["updated_at"]).ends_with('Z'));
    }
    assert_eq!(app.balance("XOF").await, (9850, 0, 9850));
    assert_eq!(app.balance("XAF").await, (19700, 0, 19700));
    // Pending and declined payments credit nothing.
    app.pay(5000, "02").await;
    let declined = app.pay(5000, "01").await;
    app.wait_payment(text(&declined["reference"]), "echec").await;
    assert_eq!(app.balance("XOF").await, (9850, 0, 9850));
}

/// With a slower sandbox, a payout and a refund in progress are visible in `en_attente`.
#[actix_web::test]
async fn reservations_show_in_en_attente_until_settled() {
    let app = spawn_app_with(|s| s.sandbox_delay_ms = 800).await;
    let first = app.fund(20000).await; // 19700
    let resp = app.send(app.post("/v1/retraits").json(&payout_body(3000, "99"))).await;
    resp.expect(201);
    let payout = text(&resp.json["id"]).to_owned();
    let reference = text(&first["reference"]);
    let resp =
        app.send(app.post(&format!("/v1/paiement/{reference}/rembourser")).json(&json!({"montant": 4000}))).await;
    resp.expect(200);
    let balance = app.balance("XOF").await;
    assert_eq!(balance.0, 12700, "both amounts left disponible at once");
    // Read after the balance: if both are still pending now, they were when the balance was read.
    let still_pending = app.get_ok(&format!("/v1/retraits/{payout}")).await["statut"] == "en_attente"
        && app.get_ok(&format!("/v1/paiement/{reference}")).await["remboursement"]["statut"] == "en_cours";
    if still_pending {
        assert_eq!(balance, (12700, 7000, 19700));
    }
    app.wait_payout(&payout, "traite").await;
    app.wait_payment(reference, "rembourse_partiellement").await;
    assert_eq!(app.balance("XOF").await, (12700, 0, 12700));
}

#[actix_web::test]
async fn a_rejected_payout_gives_the_money_back() {
    let app = spawn_app().await;
    app.fund(10000).await;
    let resp = app.send(app.post("/v1/retraits").json(&payout_body(5000, "01"))).await;
    resp.expect(201);
    let rejected = app.wait_payout(text(&resp.json["id"]), "rejete").await;
    assert!(rejected["motif_rejet"].is_string(), "{rejected}");
    assert_eq!(rejected["processed_at"], serde_json::Value::Null);
    assert_eq!(app.balance("XOF").await, (9850, 0, 9850));
}
