//! `POST /v1/paiement/initier`, `GET /v1/paiement/{reference}`, `POST /v1/paiement/{reference}/rembourser`
//! (docs/api.md § Payments, Refunds).

use serde_json::{json, Value};

use crate::support::{assert_error, data, int, payment_body, spawn_app, text, TestApp};

const PAYMENT_FIELDS: [&str; 22] = [
    "client_email",
    "client_nom",
    "client_telephone",
    "created_at",
    "description",
    "devise",
    "failure_code",
    "fournisseur",
    "frais",
    "metadata",
    "montant",
    "montant_net",
    "montant_rembourse",
    "paid_at",
    "pays",
    "reference",
    "remboursement",
    "remboursements",
    "statut",
    "transaction_id",
    "updated_at",
    "url_paiement",
];

#[track_caller]
fn assert_payment_shape(p: &Value) {
    let mut keys: Vec<&str> = p.as_object().expect("payment is an object").keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, PAYMENT_FIELDS, "payment fields: {p}");
    assert!(text(&p["transaction_id"]).starts_with("tx_"), "{p}");
    for t in ["created_at", "updated_at"] {
        assert!(text(&p[t]).ends_with('Z'), "{t} is RFC 3339 UTC: {p}");
    }
    assert_eq!(int(&p["montant_net"]), int(&p["montant"]) - int(&p["frais"]), "{p}");
}

#[actix_web::test]
async fn initiate_answers_201_with_the_whole_payment() {
    let app = spawn_app().await;
    let body = json!({
        "montant": 10000,
        "devise": "XOF",
        "fournisseur": "mtn_momo",
        "client_telephone": "+22997000002",
        "client_email": "awa@example.com",
        "client_nom": "Awa Diallo",
        "description": "Commande 42",
        "metadata": {"order_id": "42", "canal": "web"},
        "reference": "order-42_A",
    });
    let resp = app.send(app.post("/v1/paiement/initier").json(&body)).await;
    resp.expect(201);
    assert!(resp.header("content-type").unwrap_or("").starts_with("application/json"));
    assert!(resp.header("idempotent-replayed").is_none());
    let p = resp.json;
    assert_payment_shape(&p);
    assert_eq!(p["reference"], "order-42_A");
    assert_eq!(p["statut"], "initie");
    assert_eq!(p["montant"], 10000);
    assert_eq!(p["devise"], "XOF");
    // mtn_momo: 150 bps, no fixed part: (10000 * 150 + 5000) / 10000 = 150.
    assert_eq!(p["frais"], 150);
    assert_eq!(p["montant_net"], 9850);
    assert_eq!(p["fournisseur"], "mtn_momo");
    assert_eq!(p["client_telephone"], "+22997000002");
    assert_eq!(p["client_email"], "awa@example.com");
    assert_eq!(p["client_nom"], "Awa Diallo");
    assert_eq!(p["description"], "Commande 42");
    assert_eq!(p["metadata"], json!({"order_id": "42", "canal": "web"}));
    assert_eq!(p["paid_at"], Value::Null);
    assert_eq!(p["failure_code"], Value::Null);
    assert_eq!(p["remboursement"], Value::Null);

    // GET shows the same payment.
    let got = app.get_ok("/v1/paiement/order-42_A").await;
    assert_payment_shape(&got);
    for f in ["reference", "transaction_id", "montant", "frais", "montant_net", "metadata", "created_at"] {
        assert_eq!(got[f], p[f], "{f}");
    }
}

#[actix_web::test]
async fn absent_optional_values_are_null_and_a_pay_reference_is_made() {
    let app = spawn_app().await;
    let p = app.pay(5000, "02").await;
    assert_payment_shape(&p);
    let reference = text(&p["reference"]);
    assert!(reference.starts_with("pay_") && reference.len() == 30, "{reference}");
    for f in ["client_email", "client_nom", "description", "paid_at", "failure_code", "remboursement"] {
        assert_eq!(p[f], Value::Null, "{f}");
    }
    assert_eq!(p["metadata"], json!({}));
    // Two payments get two different references and transaction ids.
    let q = app.pay(5000, "02").await;
    assert_ne!(p["reference"], q["reference"]);
    assert_ne!(p["transaction_id"], q["transaction_id"]);
}

#[actix_web::test]
async fn fees_follow_each_providers_rule_rounded_half_up() {
    let app = spawn_app().await;
    // (montant, devise, fournisseur, expected frais)
    let cases = [
        (1000, "XOF", "mtn_momo", 15),     // 150 bps
        (12350, "XOF", "wave", 124),       // 100 bps: 123.5 rounds up
        (12345, "XOF", "moov_money", 123), // 123.45 rounds down
        (3000, "XAF", "orange_money", 45),
        (1050, "EUR", "carte", 30), // 290 bps of 10.50 EUR = 30.45 cents
    ];
    for (amount, currency, provider, fee) in cases {
        // A card payment needs the holder's name and e-mail.
        let p = app
            .initiate(&json!({
                "montant": amount, "devise": currency, "fournisseur": provider,
                "client_telephone": "+22997000002", "client_nom": "Awa Koné", "client_email": "awa@example.com",
            }))
            .await;
        assert_eq!(p["frais"], fee, "{provider} {amount} {currency}");
        assert_eq!(int(&p["montant_net"]), amount - fee);
        assert_eq!(p["devise"], currency);
    }
}

#[actix_web::test]
async fn unknown_payment_is_404() {
    let app = spawn_app().await;
    for path in ["/v1/paiement/pay_01ARZ3NDEKTSV4RRFFQ69G5FAV", "/v1/paiement/order-1", "/v1/paiement/bad%20ref!"] {
        let resp = app.send(app.get(path)).await;
        assert_error(&resp, 404, "not_found", None);
    }
    let resp = app.send(app.post("/v1/paiement/nope/rembourser")).await;
    assert_error(&resp, 404, "not_found", None);
}

/// `initier` is a reference like any other, though its path is also initiation's (by `POST`).
#[actix_web::test]
async fn a_payment_whose_reference_is_initier_is_read_back() {
    let app = spawn_app().await;
    let resp = app.send(app.get("/v1/paiement/initier")).await;
    assert_error(&resp, 404, "not_found", None);
    let mut body = payment_body(1000, "02");
    body["reference"] = json!("initier");
    app.initiate(&body).await;
    let read = app.get_ok("/v1/paiement/initier").await;
    assert_eq!((read["reference"].as_str(), read["montant"].as_i64()), (Some("initier"), Some(1000)));
}

#[actix_web::test]
async fn a_reference_is_unique_per_merchant() {
    let app = spawn_app().await;
    let mut body = payment_body(1000, "02");
    body["reference"] = json!("facture-7");
    app.initiate(&body).await;
    body["montant"] = json!(2000);
    let resp = app.send(app.post("/v1/paiement/initier").json(&body)).await;
    assert_error(&resp, 409, "duplicate_reference", Some("reference"));
    // The first payment is untouched.
    assert_eq!(app.get_ok("/v1/paiement/facture-7").await["montant"], 1000);
}

#[actix_web::test]
async fn initiate_rejects_bad_fields_naming_them() {
    let app = spawn_app().await;
    let good = payment_body(1000, "02");
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
    let cases: Vec<(Value, &str)> = vec![
        // montant: floats, strings, zero, negatives, out of bounds, overflow.
        (with("montant", json!(10.5)), "montant"),
        (with("montant", json!(1000.0)), "montant"),
        (with("montant", json!("1000")), "montant"),
        (with("montant", json!(0)), "montant"),
        (with("montant", json!(-500)), "montant"),
        (with("montant", json!(99)), "montant"),
        (with("montant", json!(2_000_001)), "montant"),
        (with("montant", json!(i64::MAX)), "montant"),
        (with("montant", json!(u64::MAX)), "montant"),
        (with("montant", json!(1e20)), "montant"),
        (with("montant", Value::Null), "montant"),
        (without("montant"), "montant"),
        (without("devise"), "devise"),
        (without("fournisseur"), "fournisseur"),
        (without("client_telephone"), "client_telephone"),
        (with("devise", json!(952)), "devise"),
        (with("client_telephone", json!("97000001")), "client_telephone"),
        (with("client_telephone", json!("+229 97 00 00 0x")), "client_telephone"),
        (with("client_telephone", json!(22997000001_i64)), "client_telephone"),
        (with("client_email", json!("not-an-email")), "client_email"),
        (with("description", json!("x".repeat(501))), "description"),
        (with("reference", json!("bad ref!")), "reference"),
        (with("reference", json!("r".repeat(65))), "reference"),
        (with("reference", json!("")), "reference"),
        (with("metadata", json!("text")), "metadata"),
        (with("metadata", json!({"k": "v".repeat(501)})), "metadata"),
        (
            with("metadata", (0..51).map(|i| (format!("k{i}"), json!("v"))).collect::<serde_json::Map<_, _>>().into()),
            "metadata",
        ),
        // Unknown fields are refused, named.
        (with("montant_net", json!(1000)), "montant_net"),
        (with("foo", json!(1)), "foo"),
    ];
    for (body, field) in cases {
        let resp = app.send(app.post("/v1/paiement/initier").json(&body)).await;
        assert_error(&resp, 400, "invalid_request", Some(field));
    }
    // A number as people write it is read into E.164 (and would be stored so; see the test below).
    let written =
        app.send(app.post("/v1/paiement/initier").json(&with("client_telephone", json!("00229 97-00-00-02")))).await;
    written.expect(201);
    assert_eq!(written.json["client_telephone"], "+22997000002");
    assert_eq!(written.json["pays"], "BJ");
    // A metadata value that is not a string names the key.
    let resp = app.send(app.post("/v1/paiement/initier").json(&with("metadata", json!({"n": 1})))).await;
    assert_eq!(resp.status, 400);
    assert_eq!(resp.json["error"]["code"], "invalid_request");
    assert!(text(&resp.json["error"]["field"]).starts_with("metadata"), "{}", resp.json);
    // Nothing was created but the one well-written payment.
    assert_eq!(app.get_ok("/v1/transactions").await["data"].as_array().map(Vec::len), Some(1));
}

#[actix_web::test]
async fn currency_and_provider_must_be_known_and_go_together() {
    let app = spawn_app().await;
    let cases = [
        ("ZZZ", "mtn_momo", 400, "unsupported_currency", "devise"),
        ("EUR", "mtn_momo", 400, "unsupported_currency", "devise"),
        ("XAF", "wave", 400, "unsupported_currency", "devise"),
        ("XOF", "paypal", 400, "unsupported_provider", "fournisseur"),
        ("XOF", "", 400, "unsupported_provider", "fournisseur"),
    ];
    for (currency, provider, status, code, field) in cases {
        let body = json!({
            "montant": 1000, "devise": currency, "fournisseur": provider, "client_telephone": "+22997000002",
        });
        let resp = app.send(app.post("/v1/paiement/initier").json(&body)).await;
        assert_error(&resp, status, code, Some(field));
    }
}

#[actix_web::test]
async fn refund_rules() {
    let app = spawn_app().await;
    only_a_succeeded_payment_can_be_refunded(&app).await;
    // A lone payment cannot be refunded in full: fees are not returned, so disponible is short.
    let paid = app.fund(10000).await;
    let reference = text(&paid["reference"]).to_owned();
    let refund_path = format!("/v1/paiement/{reference}/rembourser");
    assert_eq!(app.balance("XOF").await, (9850, 0, 9850));
    let resp = app.send(app.post(&refund_path)).await;
    assert_error(&resp, 409, "insufficient_balance", None);
    refused_refunds_name_their_field_and_reserve_nothing(&app, &refund_path).await;
    a_full_refund_with_other_funds_is_reserved_at_once(&app, &reference, &refund_path).await;

    // Refunded in full: another refund is invalid_state, whether the first is still under way or over.
    let resp = app.send(app.post(&refund_path).json(&json!({"montant": 10}))).await;
    assert_error(&resp, 409, "invalid_state", None);
    let done = app.wait_payment(&reference, "rembourse").await;
    assert_eq!(done["montant_rembourse"], 10000);
    assert_eq!(done["remboursement"]["statut"], "succes");
    assert!(done["remboursement"]["completed_at"].is_string());
    assert_eq!(app.balance("XOF").await, (835, 0, 835));
    let resp = app.send(app.post(&refund_path).json(&json!({"montant": 10}))).await;
    assert_error(&resp, 409, "invalid_state", None);
}

/// A payment not yet `succes` (the 02 phone never answers) or declined cannot be refunded: invalid_state.
async fn only_a_succeeded_payment_can_be_refunded(app: &TestApp) {
    let pending = app.pay(1000, "02").await;
    let pending_ref = text(&pending["reference"]);
    let resp = app.send(app.post(&format!("/v1/paiement/{pending_ref}/rembourser"))).await;
    assert_error(&resp, 409, "invalid_state", None);

    let declined = app.pay(1000, "01").await;
    let declined_ref = text(&declined["reference"]);
    app.wait_payment(declined_ref, "echec").await;
    let resp = app.send(app.post(&format!("/v1/paiement/{declined_ref}/rembourser"))).await;
    assert_error(&resp, 409, "invalid_state", None);
}

/// Above the payment's montant: 400 on montant. Bad bodies name their field; other media types and broken
/// JSON are refused. None of them reserves anything of the 9850 available.
async fn refused_refunds_name_their_field_and_reserve_nothing(app: &TestApp, refund_path: &str) {
    let resp = app.send(app.post(refund_path).json(&json!({"montant": 10001}))).await;
    assert_error(&resp, 400, "invalid_request", Some("montant"));
    for (body, field) in [
        (json!({"montant": 0}), "montant"),
        (json!({"montant": -1}), "montant"),
        (json!({"montant": 10.5}), "montant"),
        (json!({"montant": "100"}), "montant"),
        (json!({"motif": 3}), "motif"),
        (json!({"raison": "x"}), "raison"),
    ] {
        let resp = app.send(app.post(refund_path).json(&body)).await;
        assert_error(&resp, 400, "invalid_request", Some(field));
    }
    let resp = app.send(app.post(refund_path).raw(Some("text/plain"), "montant=100")).await;
    assert_error(&resp, 415, "unsupported_media_type", None);
    let resp = app.send(app.post(refund_path).raw(Some("application/json"), "{\"montant\": ")).await;
    assert_error(&resp, 400, "invalid_json", None);
    assert_eq!(app.balance("XOF").await, (9850, 0, 9850), "refused refunds reserve nothing");
}

/// With other funds, the full refund (no body) is accepted and reserved at once: out of disponible, in
/// en_attente until the provider confirms (then consumed).
async fn a_full_refund_with_other_funds_is_reserved_at_once(app: &TestApp, reference: &str, refund_path: &str) {
    app.fund(1000).await;
    assert_eq!(app.balance("XOF").await, (9850 + 985, 0, 10835));
    let resp = app.send(app.post(refund_path)).await;
    resp.expect(200);
    let p = &resp.json;
    assert_eq!(p["reference"], reference);
    assert_eq!(p["statut"], "succes");
    let r = &p["remboursement"];
    let mut keys: Vec<&str> = r.as_object().expect("refund object").keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["completed_at", "created_at", "montant", "motif", "reference", "statut"], "{r}");
    assert!(text(&r["reference"]).starts_with("rmb_"));
    assert_eq!(r["montant"], 10000, "defaults to the whole payment");
    assert_eq!(r["motif"], Value::Null);
    assert_eq!(r["statut"], "en_cours");
    assert_eq!(r["completed_at"], Value::Null);
    let (available, pending, _) = app.balance("XOF").await;
    assert_eq!(available, 835);
    assert!(pending == 10000 || pending == 0, "{pending}");
}

#[actix_web::test]
async fn partial_refund_with_motif() {
    let app = spawn_app().await;
    let paid = app.fund(20000).await; // net 19700
    let reference = text(&paid["reference"]);
    let resp = app
        .send(
            app.post(&format!("/v1/paiement/{reference}/rembourser"))
                .json(&json!({"montant": 5000, "motif": "article retourné"})),
        )
        .await;
    resp.expect(200);
    assert_eq!(resp.json["remboursement"]["montant"], 5000);
    assert_eq!(resp.json["remboursement"]["motif"], "article retourné");
    let done = app.wait_payment(reference, "rembourse_partiellement").await;
    assert_eq!(done["montant"], 20000, "the payment keeps its own montant");
    assert_eq!(done["montant_rembourse"], 5000);
    assert_eq!(app.balance("XOF").await, (14700, 0, 14700));
}

/// Refunds one at a time up to the whole payment: a part, one above what is left (refused, naming what is
/// left), one the provider refuses (its part comes back), then the rest; each completed one sends
/// `payment.refunded` with the running total, and the transaction list shows every refund.
#[actix_web::test]
async fn several_refunds_up_to_the_whole_payment() {
    let app = spawn_app().await;
    let paid = app.fund(20000).await; // net 19700
    app.fund(10000).await; // net 9850: the fees are not returned, so a full refund needs other funds
    let reference = text(&paid["reference"]).to_owned();
    let path = format!("/v1/paiement/{reference}/rembourser");
    let first = app.send(app.post(&path).json(&json!({"montant": 5000}))).await;
    first.expect(200);
    // One at a time: while the first is under way (or once it is over), the rest is 15 000.
    let above = app.send(app.post(&path).json(&json!({"montant": 15001}))).await;
    if above.status == 409 {
        assert_error(&above, 409, "invalid_state", None);
        app.wait_payment(&reference, "rembourse_partiellement").await;
        let above = app.send(app.post(&path).json(&json!({"montant": 15001}))).await;
        assert_error(&above, 400, "invalid_request", Some("montant"));
        assert!(text(&above.json["error"]["message"]).contains("15000"), "{}", above.json);
    } else {
        assert_error(&above, 400, "invalid_request", Some("montant"));
    }
    app.wait_payment(&reference, "rembourse_partiellement").await;

    // The rest, by default.
    let rest = app.send(app.post(&path).json(&json!({"motif": "le reste"}))).await;
    rest.expect(200);
    assert_eq!(rest.json["remboursement"]["montant"], 15000);
    assert_eq!(rest.json["remboursement"]["motif"], "le reste");
    let done = app.wait_payment(&reference, "rembourse").await;
    assert_eq!(done["montant_rembourse"], 20000);
    let refunds = done["remboursements"].as_array().expect("a list").clone();
    let amounts: Vec<(i64, &str)> = refunds.iter().map(|r| (int(&r["montant"]), text(&r["statut"]))).collect();
    assert_eq!(amounts, [(5000, "succes"), (15000, "succes")]);
    assert_eq!(done["remboursement"], refunds[1], "remboursement is the latest");
    assert_eq!(app.balance("XOF").await, (19700 + 9850 - 20000, 0, 9550));
    let resp = app.send(app.post(&path).json(&json!({"montant": 1}))).await;
    assert_error(&resp, 409, "invalid_state", None);

    // Each refund is a transaction of its own, found by its reference.
    for r in &refunds {
        let tx = app.get_ok(&format!("/v1/transactions/{}", text(&r["reference"]))).await;
        assert_eq!((tx["type"].clone(), tx["montant"].clone()), (json!("remboursement"), r["montant"].clone()));
        assert_eq!(tx["paiement_reference"], reference);
    }
    let listed = data(&app.get_ok("/v1/transactions?type=remboursement").await);
    assert_eq!(listed.len(), 2, "{listed:?}");
}

/// Refunds asked at once: one at a time holds, whatever the timing. Eight parallel refunds of 15 000 on a
/// 20 000 payment: exactly one is accepted (the others find it under way, or find 5 000 left); eight of 1 000:
/// each is accepted or finds another under way, and the refunds taken add up exactly.
#[actix_web::test]
async fn refunds_asked_at_once_never_overlap_nor_exceed_the_payment() {
    let app = std::rc::Rc::new(spawn_app().await);
    for (each, expected_at_most) in [(15_000, 1usize), (1_000, 8)] {
        let paid = app.fund(20_000).await;
        app.fund(20_000).await; // the fees are not returned: other funds pay for them
        let reference = text(&paid["reference"]).to_owned();
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (app, reference) = (app.clone(), reference.clone());
            tasks.push(actix_web::rt::spawn(async move {
                app.send(app.post(&format!("/v1/paiement/{reference}/rembourser")).json(&json!({"montant": each})))
                    .await
            }));
        }
        let mut accepted = 0;
        for task in tasks {
            let resp = task.await.expect("task");
            match resp.status {
                200 => accepted += 1,
                409 => assert_error(&resp, 409, "invalid_state", None),
                400 => assert_error(&resp, 400, "invalid_request", Some("montant")),
                other => panic!("answered {other}: {}", resp.json),
            }
        }
        assert!((1..=expected_at_most).contains(&accepted), "{accepted} accepted of {each}");
        let done = app.wait_refund(&reference, "succes").await;
        let refunds = done["remboursements"].as_array().expect("a list").clone();
        assert_eq!(refunds.len(), accepted, "{done}");
        assert_eq!(int(&done["montant_rembourse"]), each * accepted as i64, "{done}");
    }
}
