//! `Idempotency-Key` on every POST (docs/api.md § Idempotency): replay, reuse with another body, keys in flight, scope.

use serde_json::json;

use crate::support::{assert_error, data, payment_body, payout_body, spawn_app, text};

#[actix_web::test]
async fn a_replay_returns_the_first_answer_with_the_replay_header() {
    let app = spawn_app().await;
    let body = payment_body(1000, "99");
    let first = app.send(app.post("/v1/paiement/initier").idem("order-1-attempt").json(&body)).await;
    first.expect(201);
    assert!(first.header("idempotent-replayed").is_none(), "a first answer is not a replay");
    let reference = text(&first.json["reference"]).to_owned();
    // Even after the payment has moved on, the replay is the first answer, byte for byte.
    app.wait_payment(&reference, "succes").await;
    for _ in 0..2 {
        let again = app.send(app.post("/v1/paiement/initier").idem("order-1-attempt").json(&body)).await;
        again.expect(201);
        assert_eq!(again.header("idempotent-replayed"), Some("true"));
        assert!(again.header("content-type").unwrap_or("").starts_with("application/json"));
        assert_eq!(again.json, first.json);
        assert_eq!(again.json["statut"], "initie");
    }
    // Only one payment exists, credited once.
    assert_eq!(data(&app.get_ok("/v1/transactions").await).len(), 1);
    assert_eq!(app.balance("XOF").await, (985, 0, 985));
}

#[actix_web::test]
async fn the_same_key_with_another_body_is_refused() {
    let app = spawn_app().await;
    let resp = app.send(app.post("/v1/paiement/initier").idem("k-1").json(&payment_body(1000, "02"))).await;
    resp.expect(201);
    let resp = app.send(app.post("/v1/paiement/initier").idem("k-1").json(&payment_body(2000, "02"))).await;
    assert_error(&resp, 409, "idempotency_key_reused", None);
    // Same key on another endpoint is another request too.
    let resp = app.send(app.post("/v1/retraits").idem("k-1").json(&payout_body(1000, "99"))).await;
    assert_error(&resp, 409, "idempotency_key_reused", None);
    assert_eq!(data(&app.get_ok("/v1/transactions").await).len(), 1);
}

/// Another request under a used key is 409 `idempotency_key_reused` even when its own checks would refuse it:
/// the key's answer decides, on every endpoint that takes one.
#[actix_web::test]
async fn another_request_the_checks_refuse_is_still_a_reused_key() {
    let app = spawn_app().await;
    let paid = app.fund(10_000).await;
    let refund_path = format!("/v1/paiement/{}/rembourser", text(&paid["reference"]));
    app.send(app.post("/v1/paiement/initier").idem("p-1").json(&payment_body(1000, "02"))).await.expect(201);
    app.send(app.post("/v1/retraits").idem("r-1").json(&payout_body(1000, "99"))).await.expect(201);
    app.send(app.post(&refund_path).idem("m-1").json(&json!({"montant": 100}))).await.expect(200);
    let mut bad_payment = payment_body(1000, "02");
    bad_payment["devise"] = json!("ZZZ");
    let mut bad_payout = payout_body(1000, "99");
    bad_payout["fournisseur"] = json!("nope");
    for (path, key, body) in [
        ("/v1/paiement/initier", "p-1", bad_payment),
        ("/v1/retraits", "r-1", bad_payout),
        (refund_path.as_str(), "m-1", json!({"montant": 0})),
    ] {
        assert_error(&app.send(app.post(path).idem(key).json(&body)).await, 409, "idempotency_key_reused", None);
        // Without the key, the same body gets the checks' refusal.
        assert_eq!(app.send(app.post(path).json(&body)).await.status, 400, "{path}");
    }
}

/// The key covers the parsed request, not its bytes: the same JSON with other whitespace and another key
/// order is a replay of the first answer, not a conflict.
#[actix_web::test]
async fn the_same_json_written_differently_is_a_replay() {
    let app = spawn_app().await;
    let body = payment_body(1000, "02");
    let first = app.send(app.post("/v1/paiement/initier").idem("k-2").json(&body)).await;
    first.expect(201);
    let fields = body.as_object().expect("an object").iter().rev();
    let written: Vec<String> = fields
        .map(|(k, v)| {
            format!("{}:   {}", serde_json::to_string(k).expect("a key"), serde_json::to_string(v).expect("a value"))
        })
        .collect();
    let reordered = format!("{{\n  {}\n}}\n", written.join(",\n  "));
    assert_ne!(reordered.as_bytes(), serde_json::to_vec(&body).expect("JSON").as_slice());
    let again = app.send(app.post("/v1/paiement/initier").idem("k-2").raw(Some("application/json"), reordered)).await;
    again.expect(201);
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.json, first.json);
    assert_eq!(data(&app.get_ok("/v1/transactions").await).len(), 1);
}

#[actix_web::test]
async fn refunds_and_payouts_replay_too() {
    let app = spawn_app().await;
    let paid = app.fund(50000).await; // 49250
    let reference = text(&paid["reference"]);
    let path = format!("/v1/paiement/{reference}/rembourser");
    let first = app.send(app.post(&path).idem("refund-1").json(&json!({"montant": 1000}))).await;
    first.expect(200);
    let again = app.send(app.post(&path).idem("refund-1").json(&json!({"montant": 1000}))).await;
    again.expect(200);
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.json, first.json);
    let other = app.send(app.post(&path).idem("refund-1").json(&json!({"montant": 999}))).await;
    assert_error(&other, 409, "idempotency_key_reused", None);
    // Without the key, the same body once the first refund is over is a second refund, not a replay.
    app.wait_payment(reference, "rembourse_partiellement").await;
    let second = app.send(app.post(&path).json(&json!({"montant": 1000}))).await;
    second.expect(200);
    assert_ne!(second.json["remboursement"]["reference"], first.json["remboursement"]["reference"]);
    assert_eq!(second.json["remboursements"].as_array().map(Vec::len), Some(2));

    let body = payout_body(2000, "99");
    let first = app.send(app.post("/v1/retraits").idem("payout-1").json(&body)).await;
    first.expect(201);
    let again = app.send(app.post("/v1/retraits").idem("payout-1").json(&body)).await;
    again.expect(201);
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.json, first.json);
    assert_eq!(data(&app.get_ok("/v1/retraits").await).len(), 1);
    app.wait_payout(text(&first.json["id"]), "traite").await;
    let done = app.wait_refund(reference, "succes").await;
    assert_eq!(done["montant_rembourse"], 2000);
    assert_eq!(app.balance("XOF").await, (49250 - 2 * 1000 - 2000, 0, 45250), "reserved and consumed once each");
}

#[actix_web::test]
async fn without_a_key_requests_are_not_deduplicated() {
    let app = spawn_app().await;
    let body = payment_body(1000, "02");
    let a = app.initiate(&body).await;
    let b = app.initiate(&body).await;
    assert_ne!(a["reference"], b["reference"]);
    assert_eq!(data(&app.get_ok("/v1/transactions").await).len(), 2);
}

#[actix_web::test]
async fn keys_are_per_merchant() {
    let app = spawn_app().await;
    let other = app.create_merchant("Second Shop", None).await.merchant.secret_key;
    let body = payment_body(1000, "02");
    let mine = app.send(app.post("/v1/paiement/initier").idem("shared-key").json(&body)).await;
    mine.expect(201);
    let theirs = app.send(app.post("/v1/paiement/initier").auth(&other).idem("shared-key").json(&body)).await;
    theirs.expect(201);
    assert!(theirs.header("idempotent-replayed").is_none());
    assert_ne!(mine.json["reference"], theirs.json["reference"]);
}

#[actix_web::test]
async fn bad_keys_are_400() {
    let app = spawn_app().await;
    for key in ["", &"k".repeat(256), "clé-accentuée", "tab\there"] {
        let resp = app.send(app.post("/v1/paiement/initier").idem(key).json(&payment_body(1000, "02"))).await;
        assert_error(&resp, 400, "invalid_request", Some("Idempotency-Key"));
    }
    let resp = app.send(app.post("/v1/paiement/initier").idem(&"k".repeat(255)).json(&payment_body(1000, "02"))).await;
    resp.expect(201);
}

/// Concurrent identical requests: whichever runs first creates the payment; every other one is either a replay
/// of it or `idempotency_key_in_use`. Which of the two a given request gets depends on timing, so the test
/// accepts both, but there is always exactly one payment.
#[actix_web::test]
async fn concurrent_identical_requests_create_one_payment() {
    let app = std::rc::Rc::new(spawn_app().await);
    for round in 0..3 {
        let key = format!("concurrent-{round}");
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let app = app.clone();
            let key = key.clone();
            tasks.push(actix_web::rt::spawn(async move {
                app.send(app.post("/v1/paiement/initier").idem(&key).json(&payment_body(1000, "02"))).await
            }));
        }
        let mut created = Vec::new();
        let mut replays = 0;
        let mut in_use = 0;
        for task in tasks {
            let resp = task.await.expect("task");
            match (resp.status, resp.header("idempotent-replayed")) {
                (201, None) => created.push(resp.json["reference"].clone()),
                (201, Some("true")) => {
                    replays += 1;
                    created.push(resp.json["reference"].clone());
                }
                (409, _) => {
                    assert_error(&resp, 409, "idempotency_key_in_use", None);
                    in_use += 1;
                }
                _ => panic!("unexpected answer {}: {:?}", resp.status, resp.json),
            }
        }
        assert_eq!(created.len() - replays, 1, "exactly one request created the payment");
        assert!(created.iter().all(|r| *r == created[0]), "replays name the same payment");
        assert_eq!(created.len() + in_use, 8);
    }
    assert_eq!(data(&app.get_ok("/v1/transactions").await).len(), 3);
}
