//! Every status change of a payment, a refund and a payout sends its event, with the documented body and a valid
//! signature, and the delivery log records it.

use std::collections::BTreeSet;

use caisse_engine::domain::records::DeliveryState;
use serde_json::{json, Value};

use crate::support::*;

/// (event, reference, statut, paid_at expected non-null)
type Expected = (&'static str, String, &'static str, bool);

#[actix_web::test]
async fn payment_refund_and_payout_lives_send_their_events_signed_and_shaped_as_the_spec_says() {
    let app = start_app(|_| {}).await;
    let receiver = Receiver::start(always(200));
    let merchant = app.merchant("Lifecycle", &format!("{}/hooks/caisse", receiver.base)).await;
    let key = merchant.secret_key.as_str();

    // A payment with an e-mail and metadata, one to refund, one declined (phone ending 01).
    let mut first = payment(10_000, "99");
    first["client_email"] = json!("awa@example.com");
    first["metadata"] = json!({"commande": "42", "note": "café"});
    let a = app.pay(key, first).await;
    let b = app.pay(key, payment(5_000, "98")).await;
    let c = app.pay(key, payment(3_000, "01")).await;
    let reference = |p: &Value| p["reference"].as_str().expect("reference").to_owned();
    let (ra, rb, rc) = (reference(&a), reference(&b), reference(&c));
    let a = app.wait_payment(key, &ra, "succes").await;
    app.wait_payment(key, &rb, "succes").await;
    let c = app.wait_payment(key, &rc, "echec").await;

    let (status, refund) = app.call(key, "POST", &format!("/v1/paiement/{rb}/rembourser"), Some(json!({}))).await;
    assert_eq!(status, 200, "{refund}");
    let b = app.wait_payment(key, &rb, "rembourse").await;

    let (status, ok) = app.call(key, "POST", "/v1/retraits", Some(payout(2_000, "99"))).await;
    assert_eq!(status, 201, "{ok}");
    let (status, ko) = app.call(key, "POST", "/v1/retraits", Some(payout(1_000, "01"))).await;
    assert_eq!(status, 201, "{ko}");
    let (po, pr) = (ok["id"].as_str().expect("id").to_owned(), ko["id"].as_str().expect("id").to_owned());
    let base = (&app.client, app.address.as_str());
    let ok = wait_json(base.0, base.1, key, &format!("/v1/retraits/{po}"), |o| o["statut"] == "traite").await;
    let ko = wait_json(base.0, base.1, key, &format!("/v1/retraits/{pr}"), |o| o["statut"] == "rejete").await;

    let expected: Vec<Expected> = vec![
        ("payment.initiated", ra.clone(), "initie", false),
        ("payment.processing", ra.clone(), "en_cours", false),
        ("payment.succeeded", ra.clone(), "succes", true),
        ("payment.initiated", rb.clone(), "initie", false),
        ("payment.processing", rb.clone(), "en_cours", false),
        ("payment.succeeded", rb.clone(), "succes", true),
        ("payment.refunded", rb.clone(), "rembourse", true),
        ("payment.initiated", rc.clone(), "initie", false),
        ("payment.processing", rc.clone(), "en_cours", false),
        ("payment.failed", rc.clone(), "echec", false),
        ("payout.processed", po.clone(), "traite", true),
        ("payout.rejected", pr.clone(), "rejete", false),
    ];
    let wanted: BTreeSet<(String, String)> = expected.iter().map(|(e, r, _, _)| (e.to_string(), r.clone())).collect();
    let hits = receiver
        .wait("every event delivered", DEADLINE, |hits| {
            hits.iter().map(|h| (h.event(), h.reference())).collect::<BTreeSet<_>>() == wanted
        })
        .await;
    // All of them, once each: every answer was a 200.
    let notifications =
        app.wait_notifications(&merchant.id, expected.len(), DEADLINE, |n| n.state == DeliveryState::Delivered).await;
    let hits_now = receiver.hits();
    assert_eq!(hits_now.len(), expected.len(), "one request per event: {:?}", hits_now.iter().map(|h| h.event()));

    for (event, reference, statut, paid) in &expected {
        let hit = hits.iter().find(|h| h.event() == *event && h.reference() == *reference).expect("delivered");
        assert_eq!(hit.path, "/hooks/caisse");
        assert_signed(hit, key);
        let body = hit.json();
        let data = assert_shape(&body, event);
        assert_eq!(data["statut"], *statut, "{event}: statut after the change: {body}");
        assert_eq!(!data["paid_at"].is_null(), *paid, "{event}: paid_at: {body}");
        assert_eq!(data["devise"], "XOF");
        assert_eq!(data["fournisseur"], "mtn_momo");
        let record = match reference {
            r if *r == ra => &a,
            r if *r == rb => &b,
            r if *r == rc => &c,
            r if *r == po => &ok,
            _ => &ko,
        };
        for field in ["transaction_id", "montant", "frais", "montant_net"] {
            assert_eq!(data[field], record[field], "{event} {field}: {body} vs {record}");
        }
        if event.starts_with("payout.") {
            assert_eq!(data["reference"], record["id"], "payout events carry the payout id: {body}");
            assert!(data["client_email"].is_null(), "payout events have no e-mail: {body}");
            assert_eq!(data["paid_at"], record["processed_at"], "{body}");
        } else {
            assert_eq!(data["reference"], record["reference"]);
            assert_eq!(data["client_email"], record["client_email"], "{body}");
            assert_eq!(data["metadata"], record["metadata"], "{body}");
            if *paid {
                assert_eq!(data["paid_at"], record["paid_at"], "{body}");
            }
        }
        // The body sent is the stored one, byte for byte, and its log says one 200.
        let n = notifications.iter().find(|n| n.event.as_str() == *event && n.reference == *reference).expect("stored");
        assert_eq!(n.body.as_bytes(), hit.body.as_slice());
        assert_eq!(
            (n.attempts.len(), n.total_attempts, n.next_attempt_at),
            (1, 1, None),
            "{}",
            describe(std::slice::from_ref(n))
        );
        let attempt = &n.attempts[0];
        assert_eq!((attempt.http_status, &attempt.error), (Some(200), &None));
        assert!(attempt.latency_ms < 5_000, "latency {}", attempt.latency_ms);
    }
    let a_first = hits.iter().find(|h| h.reference() == ra).expect("a").json();
    assert_eq!(a_first["data"]["client_email"], "awa@example.com");
    assert_eq!(a_first["data"]["metadata"], json!({"commande": "42", "note": "café"}));
    let refunded = hits.iter().find(|h| h.event() == "payment.refunded").expect("refund event").json();
    assert_eq!(refunded["data"]["montant"], 5_000, "payment.refunded carries the payment's amount");
    assert_eq!(refunded["data"]["metadata"], json!({}), "empty metadata is {{}}");
}
