//! `POST /v1/retraits`, `GET /v1/retraits`, `GET /v1/retraits/{id}` (docs/api.md § Payouts, Lists).

use serde_json::{json, Value};

use crate::support::{assert_error, assert_list_shape, data, field_values, int, payout_body, spawn_app, text};

const PAYOUT_FIELDS: [&str; 17] = [
    "beneficiaire_nom",
    "beneficiaire_telephone",
    "created_at",
    "description",
    "devise",
    "fournisseur",
    "frais",
    "id",
    "metadata",
    "montant",
    "montant_net",
    "motif_rejet",
    "processed_at",
    "reference",
    "statut",
    "transaction_id",
    "updated_at",
];

#[track_caller]
fn assert_payout_shape(o: &Value) {
    let mut keys: Vec<&str> = o.as_object().expect("payout is an object").keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, PAYOUT_FIELDS, "payout fields: {o}");
    let id = text(&o["id"]);
    assert!(id.starts_with("ret_") && id.len() == 30, "{id}");
    assert!(text(&o["transaction_id"]).starts_with("tx_"));
    assert_eq!(int(&o["montant_net"]), int(&o["montant"]) - int(&o["frais"]), "{o}");
}

#[actix_web::test]
async fn create_answers_201_reserves_and_processes() {
    let app = spawn_app().await;
    app.fund(100_000).await; // net 98500
    let body = json!({
        "montant": 10000,
        "devise": "XOF",
        "fournisseur": "wave",
        "beneficiaire_telephone": "+221770000099",
        "beneficiaire_nom": "Moussa Ndiaye",
        "description": "Retrait hebdomadaire",
        "metadata": {"semaine": "12"},
    });
    let resp = app.send(app.post("/v1/retraits").json(&body)).await;
    resp.expect(201);
    let o = resp.json;
    assert_payout_shape(&o);
    assert_eq!(o["statut"], "en_attente");
    assert_eq!(o["montant"], 10000);
    assert_eq!(o["frais"], 100, "wave: 100 bps");
    assert_eq!(o["montant_net"], 9900);
    assert_eq!(o["fournisseur"], "wave");
    assert_eq!(o["beneficiaire_telephone"], "+221770000099");
    assert_eq!(o["beneficiaire_nom"], "Moussa Ndiaye");
    assert_eq!(o["description"], "Retrait hebdomadaire");
    assert_eq!(o["metadata"], json!({"semaine": "12"}));
    assert_eq!(o["processed_at"], Value::Null);
    assert_eq!(o["motif_rejet"], Value::Null);
    let id = text(&o["id"]);

    // The whole montant leaves disponible at once.
    let (available, pending, total) = app.balance("XOF").await;
    assert_eq!(available, 88500);
    assert!(pending == 10000 || (pending == 0 && total == 88500), "{pending}");

    let done = app.wait_payout(id, "traite").await;
    assert_payout_shape(&done);
    assert!(done["processed_at"].is_string());
    assert_eq!(app.balance("XOF").await, (88500, 0, 88500));
    assert_eq!(app.get_ok(&format!("/v1/retraits/{id}")).await, done);
}

#[actix_web::test]
async fn a_payout_larger_than_disponible_is_refused() {
    let app = spawn_app().await;
    // No balance at all.
    let resp = app.send(app.post("/v1/retraits").json(&payout_body(1000, "99"))).await;
    assert_error(&resp, 409, "insufficient_balance", None);
    app.fund(10000).await; // net 9850
    let resp = app.send(app.post("/v1/retraits").json(&payout_body(9851, "99"))).await;
    assert_error(&resp, 409, "insufficient_balance", None);
    assert_eq!(app.balance("XOF").await, (9850, 0, 9850));
    // Exactly disponible is fine.
    let resp = app.send(app.post("/v1/retraits").json(&payout_body(9850, "99"))).await;
    resp.expect(201);
    // And then nothing is left for another.
    let resp = app.send(app.post("/v1/retraits").json(&payout_body(100, "99"))).await;
    assert_error(&resp, 409, "insufficient_balance", None);
    assert!(data(&app.get_ok("/v1/retraits").await).len() == 1);
}

#[actix_web::test]
async fn create_rejects_bad_fields_naming_them() {
    let app = spawn_app().await;
    app.fund(10000).await;
    let good = payout_body(1000, "99");
    let with = |field: &str, value: Value| {
        let mut b = good.clone();
        b[field] = value;
        b
    };
    let without = |field: &str| {
        let mut b = good.clone();
        b.as_object_mut().expect("object").remove(field);
        b
    };
    for (body, field) in [
        (with("montant", json!(100.5)), "montant"),
        (with("montant", json!("1000")), "montant"),
        (with("montant", json!(0)), "montant"),
        (with("montant", json!(-1000)), "montant"),
        (with("montant", json!(50)), "montant"),
        (without("montant"), "montant"),
        (without("beneficiaire_telephone"), "beneficiaire_telephone"),
        // A number without its country code cannot be read (one written with `00` or spaces is normalised).
        (with("beneficiaire_telephone", json!("96 00 00 99")), "beneficiaire_telephone"),
        (with("beneficiaire_nom", json!("")), "beneficiaire_nom"),
        (with("description", json!("d".repeat(501))), "description"),
        (with("client_telephone", json!("+22997000099")), "client_telephone"),
        (with("reference", json!("pas de blancs")), "reference"),
    ] {
        let resp = app.send(app.post("/v1/retraits").json(&body)).await;
        assert_error(&resp, 400, "invalid_request", Some(field));
    }
    let resp = app.send(app.post("/v1/retraits").json(&with("devise", json!("ABC")))).await;
    assert_error(&resp, 400, "unsupported_currency", Some("devise"));
    let resp = app.send(app.post("/v1/retraits").json(&with("devise", json!("XAF")).clone())).await;
    // mtn_momo works in XAF, but there is no XAF balance.
    assert_error(&resp, 409, "insufficient_balance", None);
    let resp = app.send(app.post("/v1/retraits").json(&with("fournisseur", json!("carte")))).await;
    assert_error(&resp, 400, "unsupported_provider", Some("fournisseur"));
    let resp = app.send(app.post("/v1/retraits").json(&with("fournisseur", json!("western")))).await;
    assert_error(&resp, 400, "unsupported_provider", Some("fournisseur"));
    let resp = app.send(app.post("/v1/retraits").raw(Some("text/plain"), serde_json::to_vec(&good).unwrap())).await;
    assert_error(&resp, 415, "unsupported_media_type", None);
    let resp = app.send(app.post("/v1/retraits").raw(Some("application/json"), "")).await;
    assert_error(&resp, 400, "invalid_json", None);
    assert_eq!(app.get_ok("/v1/retraits").await, json!({"data": [], "has_more": false, "next_cursor": null}));
    assert_eq!(app.balance("XOF").await, (9850, 0, 9850));
}

/// A payout takes the merchant's own reference like a payment: unique among its payments, refunds and payouts
/// (409 `duplicate_reference`), shown on the payout, and found by it.
#[actix_web::test]
async fn a_payout_carries_the_merchants_unique_reference() {
    let app = spawn_app().await;
    let paid = app.fund(100_000).await;
    let with = |reference: &str| {
        let mut body = payout_body(2_000, "99");
        body["reference"] = json!(reference);
        body
    };
    let resp = app.send(app.post("/v1/retraits").json(&with("virement-juin_7"))).await;
    resp.expect(201);
    assert_payout_shape(&resp.json);
    assert_eq!(resp.json["reference"], "virement-juin_7");
    let id = text(&resp.json["id"]).to_owned();
    // Taken: by this payout, by a payment, by the payout's own id.
    for taken in ["virement-juin_7", text(&paid["reference"]), id.as_str()] {
        let resp = app.send(app.post("/v1/retraits").json(&with(taken))).await;
        assert_error(&resp, 409, "duplicate_reference", Some("reference"));
    }
    // A payment cannot take it either.
    let mut payment = crate::support::payment_body(1_000, "99");
    payment["reference"] = json!("virement-juin_7");
    let resp = app.send(app.post("/v1/paiement/initier").json(&payment)).await;
    assert_error(&resp, 409, "duplicate_reference", Some("reference"));
    for bad in ["", "a b", "é", &"x".repeat(65)] {
        let resp = app.send(app.post("/v1/retraits").json(&with(bad))).await;
        assert_error(&resp, 400, "invalid_request", Some("reference"));
    }
    // Found by its reference and by its id; without one, the field is null.
    let by_reference = app.get_ok("/v1/retraits/virement-juin_7").await;
    assert_eq!(by_reference["id"], id.as_str());
    let tx = app.get_ok("/v1/transactions/virement-juin_7").await;
    assert_eq!((tx["type"].clone(), tx["reference"].clone()), (json!("retrait"), json!(id)));
    let resp = app.send(app.get(&format!("/v1/retraits/{}", text(&paid["reference"])))).await;
    assert_error(&resp, 404, "not_found", None);
    // A reference shaped like a payout id is still the merchant's and finds its payout.
    let shaped = app.send(app.post("/v1/retraits").json(&with("ret_01ARZ3NDEKTSV4RRFFQ69G5FAV"))).await;
    shaped.expect(201);
    let found = app.get_ok("/v1/retraits/ret_01ARZ3NDEKTSV4RRFFQ69G5FAV").await;
    assert_eq!(found["id"], shaped.json["id"]);
    let plain = app.send(app.post("/v1/retraits").json(&payout_body(1_000, "99"))).await;
    plain.expect(201);
    assert_eq!(plain.json["reference"], Value::Null);
    assert_eq!(app.balance("XOF").await.0, 98_500 - 2 * 2_000 - 1_000, "the refused ones reserved nothing");
}

#[actix_web::test]
async fn unknown_payout_is_404() {
    let app = spawn_app().await;
    for id in ["ret_01ARZ3NDEKTSV4RRFFQ69G5FAV", "pay_01ARZ3NDEKTSV4RRFFQ69G5FAV", "nope"] {
        let resp = app.send(app.get(&format!("/v1/retraits/{id}"))).await;
        assert_error(&resp, 404, "not_found", None);
    }
}

#[actix_web::test]
async fn list_paging_and_filters() {
    let app = spawn_app().await;
    assert_eq!(app.get_ok("/v1/retraits").await, json!({"data": [], "has_more": false, "next_cursor": null}));
    app.fund(200_000).await;
    let xaf = app
        .initiate(&json!({"montant": 50000, "devise": "XAF", "fournisseur": "orange_money", "client_telephone": "+237690000099"}))
        .await;
    app.wait_payment(text(&xaf["reference"]), "succes").await;

    // Oldest first: traite XOF, rejete XOF, traite XAF, rejete XAF.
    let mut ids = Vec::new();
    for (currency, ending) in [("XOF", "99"), ("XOF", "01"), ("XAF", "42"), ("XAF", "01")] {
        let mut body = payout_body(1000, ending);
        body["devise"] = json!(currency);
        let resp = app.send(app.post("/v1/retraits").json(&body)).await;
        resp.expect(201);
        ids.push(text(&resp.json["id"]).to_owned());
    }
    for (id, status) in ids.iter().zip(["traite", "rejete", "traite", "rejete"]) {
        app.wait_payout(id, status).await;
    }
    let newest_first: Vec<String> = ids.iter().rev().cloned().collect();

    let page = app.get_ok("/v1/retraits").await;
    assert_eq!(field_values(&data(&page), "id"), newest_first);
    for o in data(&page) {
        assert_payout_shape(&o);
    }
    // Exactly one page; pages of one; starting_after the oldest.
    let page = app.get_ok("/v1/retraits?limit=4").await;
    assert_eq!((page["has_more"].clone(), page["next_cursor"].clone()), (json!(false), Value::Null));
    let p1 = app.get_ok("/v1/retraits?limit=3").await;
    assert_eq!(p1["has_more"], true);
    let cursor = text(&p1["next_cursor"]);
    assert!(cursor.starts_with("ret_"), "{cursor}");
    let p2 = app.get_ok(&format!("/v1/retraits?limit=3&starting_after={cursor}")).await;
    assert_eq!(field_values(&data(&p2), "id"), [ids[0].clone()]);
    assert_eq!(p2["has_more"], false);
    assert_eq!(field_values(&app.list_all("/v1/retraits", 1).await, "id"), newest_first);
    let page = app.get_ok(&format!("/v1/retraits?starting_after={}", ids[0])).await;
    assert_eq!(page, json!({"data": [], "has_more": false, "next_cursor": null}));

    assert_eq!(ids_of_paged(&app, "statut=traite", 100).await, [ids[2].clone(), ids[0].clone()]);
    assert_eq!(ids_of_paged(&app, "statut=rejete", 100).await, [ids[3].clone(), ids[1].clone()]);
    assert!(ids_of_paged(&app, "statut=en_attente", 100).await.is_empty());
    assert_eq!(ids_of_paged(&app, "devise=XAF", 100).await, [ids[3].clone(), ids[2].clone()]);
    assert_eq!(ids_of_paged(&app, "devise=XOF", 100).await, [ids[1].clone(), ids[0].clone()]);
    assert!(ids_of_paged(&app, "devise=GNF", 100).await.is_empty());
    assert_eq!(ids_of_paged(&app, "statut=traite&devise=XOF", 100).await, [ids[0].clone()]);
    // Filtered pages are full: the first traite payout comes on the first page even though newer payouts
    // were rejected, and paging one by one gives each traite payout once.
    let page = app.get_ok("/v1/retraits?statut=traite&limit=1").await;
    assert_eq!(field_values(&data(&page), "id"), [ids[2].clone()], "{page}");
    assert_eq!(page["has_more"], true);
    assert_eq!(ids_of_paged(&app, "statut=traite", 1).await, [ids[2].clone(), ids[0].clone()]);
}

async fn ids_of_paged(app: &crate::support::TestApp, query: &str, limit: usize) -> Vec<String> {
    field_values(&app.list_all(&format!("/v1/retraits?{query}"), limit).await, "id")
}

#[actix_web::test]
async fn bad_list_parameters_name_their_field() {
    let app = spawn_app().await;
    for (query, field) in [
        ("limit=0", "limit"),
        ("limit=101", "limit"),
        ("limit=abc", "limit"),
        ("starting_after=tx_01ARZ3NDEKTSV4RRFFQ69G5FAV", "starting_after"),
        ("statut=succes", "statut"),
        ("statut=paye", "statut"),
        ("devise=ZZZ", "devise"),
        ("type=retrait", "type"),
        ("fournisseur=wave", "fournisseur"),
    ] {
        let resp = app.send(app.get(&format!("/v1/retraits?{query}"))).await;
        assert_error(&resp, 400, "invalid_request", Some(field));
    }
    assert_list_shape(&app.get_ok("/v1/retraits?limit=100").await);
}
