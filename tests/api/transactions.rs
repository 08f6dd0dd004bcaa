//! `GET /v1/transactions` and `GET /v1/transactions/{reference}` (docs/api.md § Transactions, § Lists): the transaction object,
//! paging, and every filter.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::{assert_error, assert_list_shape, data, field_values, payout_body, spawn_app, text, TestApp};

const TRANSACTION_FIELDS: [&str; 13] = [
    "created_at",
    "devise",
    "fournisseur",
    "frais",
    "montant",
    "montant_net",
    "paid_at",
    "paiement_reference",
    "reference",
    "statut",
    "transaction_id",
    "type",
    "updated_at",
];

#[track_caller]
pub fn assert_transaction_shape(tx: &Value) {
    let mut keys: Vec<&str> = tx.as_object().expect("transaction is an object").keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, TRANSACTION_FIELDS, "transaction fields: {tx}");
    assert!(text(&tx["transaction_id"]).starts_with("tx_"), "{tx}");
}

#[actix_web::test]
async fn an_empty_list() {
    let app = spawn_app().await;
    let page = app.get_ok("/v1/transactions").await;
    assert_eq!(page, json!({"data": [], "has_more": false, "next_cursor": null}));
    let page = app.get_ok("/v1/transactions?type=retrait&limit=1").await;
    assert_eq!(page, json!({"data": [], "has_more": false, "next_cursor": null}));
}

#[actix_web::test]
async fn paging_newest_first_with_exact_edges() {
    let app = spawn_app().await;
    let mut made = Vec::new();
    for _ in 0..5 {
        made.push(app.pay(1000, "02").await["transaction_id"].clone());
    }
    made.reverse(); // newest first

    // Exactly one page: everything, no more.
    let page = app.get_ok("/v1/transactions?limit=5").await;
    assert_list_shape(&page);
    assert_eq!(page["has_more"], false);
    assert_eq!(page["next_cursor"], Value::Null);
    let ids: Vec<Value> = data(&page).iter().map(|t| t["transaction_id"].clone()).collect();
    assert_eq!(ids, made, "newest first");
    for tx in data(&page) {
        assert_transaction_shape(&tx);
        assert_eq!(tx["type"], "paiement");
    }

    // Default limit (20) covers them too.
    assert_eq!(data(&app.get_ok("/v1/transactions").await).len(), 5);

    // Pages of two: 2, 2, 1, in order, no duplicates.
    let p1 = app.get_ok("/v1/transactions?limit=2").await;
    assert_eq!(p1["has_more"], true);
    let c1 = text(&p1["next_cursor"]).to_owned();
    let p2 = app.get_ok(&format!("/v1/transactions?limit=2&starting_after={c1}")).await;
    assert_eq!(p2["has_more"], true);
    let c2 = text(&p2["next_cursor"]).to_owned();
    let p3 = app.get_ok(&format!("/v1/transactions?limit=2&starting_after={c2}")).await;
    assert_eq!(p3["has_more"], false);
    assert_eq!(p3["next_cursor"], Value::Null);
    let walked: Vec<Value> =
        [p1, p2, p3].iter().flat_map(|p| data(p)).map(|t| t["transaction_id"].clone()).collect::<Vec<_>>();
    assert_eq!(walked, made);
    assert_eq!(app.list_all("/v1/transactions", 1).await.len(), 5);

    // starting_after the oldest: nothing more.
    let oldest = text(&made[4]);
    let page = app.get_ok(&format!("/v1/transactions?starting_after={oldest}")).await;
    assert_eq!(page, json!({"data": [], "has_more": false, "next_cursor": null}));
}

#[actix_web::test]
async fn bad_paging_parameters_name_their_field() {
    let app = spawn_app().await;
    for (query, field) in [
        ("limit=0", "limit"),
        ("limit=101", "limit"),
        ("limit=abc", "limit"),
        ("limit=-1", "limit"),
        ("limit=1.5", "limit"),
        ("limit=", "limit"),
        ("limit=1&limit=2", "limit"),
        ("starting_after=nope", "starting_after"),
        ("starting_after=pay_01ARZ3NDEKTSV4RRFFQ69G5FAV", "starting_after"),
        ("page=2", "page"),
    ] {
        let resp = app.send(app.get(&format!("/v1/transactions?{query}"))).await;
        assert_error(&resp, 400, "invalid_request", Some(field));
    }
    for limit in [1, 100] {
        assert_list_shape(&app.get_ok(&format!("/v1/transactions?limit={limit}")).await);
    }
}

/// A, B, C are payments, then a refund of A and a payout, created in that order a few ms apart.
struct Fixture {
    a: Value,
    b: Value,
    c: Value,
    refund: String,
    payout: String,
}

async fn fixture(app: &TestApp) -> Fixture {
    let gap = || actix_web::rt::time::sleep(Duration::from_millis(5));
    // A: mtn_momo XOF, succeeds (later refunded in part, so `rembourse_partiellement`).
    let a = app.pay(10000, "99").await;
    gap().await;
    // B: wave XOF, declined.
    let b = app
        .initiate(
            &json!({"montant": 5000, "devise": "XOF", "fournisseur": "wave", "client_telephone": "+221770000001"}),
        )
        .await;
    gap().await;
    // C: mtn_momo XAF, succeeds.
    let c = app
        .initiate(
            &json!({"montant": 3000, "devise": "XAF", "fournisseur": "mtn_momo", "client_telephone": "+237670000099"}),
        )
        .await;
    let a_ref = text(&a["reference"]).to_owned();
    app.wait_payment(&a_ref, "succes").await;
    app.wait_payment(text(&b["reference"]), "echec").await;
    let c = app.wait_payment(text(&c["reference"]), "succes").await;
    gap().await;
    let resp = app.send(app.post(&format!("/v1/paiement/{a_ref}/rembourser")).json(&json!({"montant": 1000}))).await;
    resp.expect(200);
    let refund = text(&resp.json["remboursement"]["reference"]).to_owned();
    app.wait_payment(&a_ref, "rembourse_partiellement").await;
    gap().await;
    let resp = app.send(app.post("/v1/retraits").json(&payout_body(2000, "99"))).await;
    resp.expect(201);
    let payout = text(&resp.json["id"]).to_owned();
    app.wait_payout(&payout, "traite").await;
    let a = app.get_ok(&format!("/v1/paiement/{a_ref}")).await;
    let b = app.get_ok(&format!("/v1/paiement/{}", text(&b["reference"]))).await;
    Fixture { a, b, c, refund, payout }
}

/// The references of a filtered list, oldest first.
async fn refs(app: &TestApp, query: &str) -> Vec<String> {
    let items = app.list_all(&format!("/v1/transactions?{query}"), 100).await;
    let mut r = field_values(&items, "reference");
    r.reverse();
    r
}

#[actix_web::test]
async fn every_filter() {
    let app = spawn_app().await;
    let f = fixture(&app).await;
    let (a, b, c) = (text(&f.a["reference"]), text(&f.b["reference"]), text(&f.c["reference"]));
    let (rmb, ret) = (f.refund.as_str(), f.payout.as_str());
    let all = vec![a, b, c, rmb, ret];
    assert_eq!(refs(&app, "").await, all);
    type_status_currency_and_provider_filter(&app, &all).await;
    creation_dates_filter(&app, &f, &all).await;
    filtered_pages_say_when_they_hold_every_match(&app, &all).await;
    each_type_has_the_contracts_fields_and_values(&app, &all).await;
}

/// `type`, `statut`, `devise` and `fournisseur`, alone and together. `all` is the fixture's references,
/// oldest first: payments a, b, c, the refund, the payout.
async fn type_status_currency_and_provider_filter(app: &TestApp, all: &[&str]) {
    let &[a, b, c, rmb, ret] = all else { panic!("five transactions: {all:?}") };
    assert_eq!(refs(app, "type=paiement").await, [a, b, c]);
    assert_eq!(refs(app, "type=remboursement").await, [rmb]);
    assert_eq!(refs(app, "type=retrait").await, [ret]);

    assert_eq!(refs(app, "statut=rembourse_partiellement").await, [a]);
    assert_eq!(refs(app, "statut=echec").await, [b]);
    assert_eq!(refs(app, "statut=succes").await, [c, rmb]);
    assert_eq!(refs(app, "statut=traite").await, [ret]);
    assert!(refs(app, "statut=en_cours").await.is_empty());
    assert!(refs(app, "statut=rejete").await.is_empty());
    assert_eq!(refs(app, "type=remboursement&statut=succes").await, [rmb]);

    assert_eq!(refs(app, "devise=XAF").await, [c]);
    assert_eq!(refs(app, "devise=XOF").await, [a, b, rmb, ret]);
    assert!(refs(app, "devise=EUR").await.is_empty());

    assert_eq!(refs(app, "fournisseur=wave").await, [b]);
    assert_eq!(refs(app, "fournisseur=mtn_momo").await, [a, c, rmb, ret]);
    assert!(refs(app, "fournisseur=orange_money").await.is_empty());
}

/// `created_from` and `created_to`, inclusive, alone, together and with other filters.
async fn creation_dates_filter(app: &TestApp, f: &Fixture, all: &[&str]) {
    let &[a, b, c, rmb, ret] = all else { panic!("five transactions: {all:?}") };
    let b_at = text(&f.b["created_at"]);
    let c_at = text(&f.c["created_at"]);
    assert_eq!(refs(app, &format!("created_from={c_at}")).await, [c, rmb, ret]);
    assert_eq!(refs(app, &format!("created_to={b_at}")).await, [a, b]);
    assert_eq!(refs(app, &format!("created_from={b_at}&created_to={c_at}")).await, [b, c]);
    assert_eq!(refs(app, &format!("created_from={b_at}&type=paiement&devise=XOF")).await, [b]);
    assert!(refs(app, "created_to=2000-01-01T00:00:00Z").await.is_empty());
    assert_eq!(refs(app, "created_from=2000-01-01T00:00:00.000Z").await, all);
    // An offset names the same instant: 01:00 at +01:00 is midnight UTC, so nothing of 2000 is before it.
    assert_eq!(refs(app, "created_from=2000-01-01T01:00:00%2B01:00").await, all);
    assert!(refs(app, "created_to=2000-01-01T01:00:00%2B01:00").await.is_empty());
}

/// A filtered page that holds every match says so, even though older non-matching items follow; one is
/// full when more matches exist; filters and paging go together.
async fn filtered_pages_say_when_they_hold_every_match(app: &TestApp, all: &[&str]) {
    let &[a, _, c, rmb, ret] = all else { panic!("five transactions: {all:?}") };
    for (query, n) in [("type=retrait&limit=1", 1), ("type=paiement&limit=3", 3), ("statut=succes&limit=2", 2)] {
        let page = app.get_ok(&format!("/v1/transactions?{query}")).await;
        assert_eq!(data(&page).len(), n, "{query}: {page}");
        assert_eq!((page["has_more"].clone(), page["next_cursor"].clone()), (json!(false), Value::Null), "{query}");
    }
    let page = app.get_ok("/v1/transactions?fournisseur=mtn_momo&limit=3").await;
    assert_eq!(field_values(&data(&page), "reference"), [ret, rmb, c]);
    assert_eq!(page["has_more"], true);
    let page = app
        .get_ok(&format!("/v1/transactions?fournisseur=mtn_momo&limit=3&starting_after={}", text(&page["next_cursor"])))
        .await;
    assert_eq!(field_values(&data(&page), "reference"), [a]);
    assert_eq!(page["has_more"], false);

    // Filters and paging together: one item per page, all of them.
    let walked = app.list_all("/v1/transactions?fournisseur=mtn_momo", 1).await;
    assert_eq!(walked.len(), 4);
}

/// Each transaction type has the contract's fields and values; GET by payment reference, refund reference
/// and payout id gives the same objects as the list.
async fn each_type_has_the_contracts_fields_and_values(app: &TestApp, all: &[&str]) {
    let &[a, b, _, rmb, ret] = all else { panic!("five transactions: {all:?}") };
    let items = app.list_all("/v1/transactions", 100).await;
    for tx in &items {
        assert_transaction_shape(tx);
    }
    let by_ref = |r: &str| items.iter().find(|t| t["reference"] == r).expect("listed").clone();
    let tx_a = by_ref(a);
    assert_eq!(
        (tx_a["type"].clone(), tx_a["montant"].clone(), tx_a["frais"].clone()),
        (json!("paiement"), json!(10000), json!(150))
    );
    assert_eq!(tx_a["paiement_reference"], Value::Null);
    assert!(tx_a["paid_at"].is_string());
    let tx_b = by_ref(b);
    assert_eq!(tx_b["paid_at"], Value::Null, "no money moved");
    let tx_r = by_ref(rmb);
    assert_eq!(tx_r["type"], "remboursement");
    assert_eq!(tx_r["paiement_reference"], a);
    assert_eq!(tx_r["montant"], 1000);
    let tx_o = by_ref(ret);
    assert_eq!(tx_o["type"], "retrait");
    assert_eq!(tx_o["statut"], "traite");
    assert_eq!(tx_o["montant"], 2000);
    assert_eq!(tx_o["frais"], 30);
    assert_eq!(tx_o["montant_net"], 1970);

    for r in all {
        assert_eq!(app.get_ok(&format!("/v1/transactions/{r}")).await, by_ref(r), "{r}");
    }
}

#[actix_web::test]
async fn unknown_filter_values_name_their_field() {
    let app = spawn_app().await;
    for (query, field) in [
        ("type=achat", "type"),
        ("type=PAIEMENT", "type"),
        ("statut=paye", "statut"),
        ("statut=", "statut"),
        ("devise=ZZZ", "devise"),
        ("devise=xof", "devise"),
        ("fournisseur=paypal", "fournisseur"),
        ("created_from=yesterday", "created_from"),
        ("created_from=2024-01-01", "created_from"),
        ("created_to=2024-01-01T00:00:00", "created_to"),
        ("created_to=1700000000", "created_to"),
        ("montant=100", "montant"),
    ] {
        let resp = app.send(app.get(&format!("/v1/transactions?{query}"))).await;
        assert_error(&resp, 400, "invalid_request", Some(field));
    }
}

#[actix_web::test]
async fn unknown_transaction_is_404() {
    let app = spawn_app().await;
    for r in ["pay_01ARZ3NDEKTSV4RRFFQ69G5FAV", "rmb_01ARZ3NDEKTSV4RRFFQ69G5FAV", "ret_01ARZ3NDEKTSV4RRFFQ69G5FAV", "x"]
    {
        let resp = app.send(app.get(&format!("/v1/transactions/{r}"))).await;
        assert_error(&resp, 404, "not_found", None);
    }
}

/// A transaction is also found by its `tx_` id, the merchant's own only; a payment whose reference looks like
/// a transaction id is still found by its reference first.
#[actix_web::test]
async fn a_transaction_is_found_by_its_transaction_id() {
    let app = spawn_app().await;
    let paid = app.fund(5_000).await;
    let tx = text(&paid["transaction_id"]).to_owned();
    let found = app.get_ok(&format!("/v1/transactions/{tx}")).await;
    assert_transaction_shape(&found);
    assert_eq!((found["reference"].clone(), found["type"].clone()), (paid["reference"].clone(), json!("paiement")));
    let other = app.create_merchant("Autre", None).await.merchant.secret_key;
    let theirs = app.with_key(&other);
    let refused = theirs.send(theirs.get(&format!("/v1/transactions/{tx}"))).await;
    assert_error(&refused, 404, "not_found", None);
    let unknown = app.send(app.get("/v1/transactions/tx_01JD0000000000000000000000")).await;
    assert_error(&unknown, 404, "not_found", None);
}
