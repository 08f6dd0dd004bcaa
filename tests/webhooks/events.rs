//! Every status change of a payment, a refund and a payout sends its event, with the documented body and a valid
//! signature, and the delivery log records it.

use std::collections::BTreeSet;

use caisse_engine::domain::ids::MerchantId;
use caisse_engine::domain::records::{DeliveryState, Notification};
use serde_json::{json, Value};

use crate::delivery::{assert_shape, assert_signed};
use crate::support::*;

/// (event, reference, statut, paid_at expected non-null)
type Expected = (&'static str, String, &'static str, bool);

/// What one merchant's run made, each record as the API shows it once final: payments `a` (with an e-mail and
/// metadata), `b` (refunded) and `c` (declined), a processed payout and a rejected one.
struct Lives {
    a: Value,
    b: Value,
    c: Value,
    processed: Value,
    rejected: Value,
}

impl Lives {
    /// Every event the run must send, in the order of its changes.
    fn expected(&self) -> Vec<Expected> {
        let (ra, rb, rc) = (reference_of(&self.a), reference_of(&self.b), reference_of(&self.c));
        let (po, pr) = (text(&self.processed["id"]).to_owned(), text(&self.rejected["id"]).to_owned());
        vec![
            ("payment.initiated", ra.clone(), "initie", false),
            ("payment.processing", ra.clone(), "en_cours", false),
            ("payment.succeeded", ra, "succes", true),
            ("payment.initiated", rb.clone(), "initie", false),
            ("payment.processing", rb.clone(), "en_cours", false),
            ("payment.succeeded", rb.clone(), "succes", true),
            ("payment.refunded", rb, "rembourse", true),
            ("payment.initiated", rc.clone(), "initie", false),
            ("payment.processing", rc.clone(), "en_cours", false),
            ("payment.failed", rc, "echec", false),
            ("payout.processed", po, "traite", true),
            ("payout.rejected", pr, "rejete", false),
        ]
    }

    /// The record an event's reference names (a payout by its id).
    fn record(&self, reference: &str) -> &Value {
        match reference {
            r if r == text(&self.a["reference"]) => &self.a,
            r if r == text(&self.b["reference"]) => &self.b,
            r if r == text(&self.c["reference"]) => &self.c,
            r if r == text(&self.processed["id"]) => &self.processed,
            _ => &self.rejected,
        }
    }
}

#[actix_web::test]
async fn payment_refund_and_payout_lives_send_their_events_signed_and_shaped_as_the_spec_says() {
    let app = spawn_app().await;
    let receiver = Receiver::start(always(200));
    let merchant = app.create_merchant("Lifecycle", Some(&receiver.url())).await.merchant;
    let key = merchant.secret_key.as_str();
    let lives = live_every_story(&app.with_key(key)).await;
    let expected = lives.expected();

    let (hits, notifications) = wait_for_every_delivery(&app, &receiver, &merchant.id, &expected).await;
    for (event, reference, status, paid) in &expected {
        let hit = hits.iter().find(|h| h.event() == *event && h.reference() == *reference).expect("delivered");
        assert_eq!(hit.path, "/hooks/caisse");
        assert_signed(hit, key);
        check_payload(hit, event, status, *paid, lives.record(reference));
        check_logged_once(&notifications, hit, event, reference);
    }
    check_customer_details(&hits, &reference_of(&lives.a));
}

/// Three payments (one with an e-mail and metadata, one refunded in full, one declined by its phone ending
/// 01) and two payouts (processed, and rejected by ending 01), each awaited to its final status.
async fn live_every_story(api: &Api) -> Lives {
    let mut first = payment_body(10_000, "99");
    first["client_email"] = json!("awa@example.com");
    first["metadata"] = json!({"commande": "42", "note": "café"});
    let a = api.initiate(&first).await;
    let b = api.initiate(&payment_body(5_000, "98")).await;
    let c = api.initiate(&payment_body(3_000, "01")).await;
    let (ra, rb, rc) = (reference_of(&a), reference_of(&b), reference_of(&c));
    let a = api.wait_payment(&ra, "succes").await;
    api.wait_payment(&rb, "succes").await;
    let c = api.wait_payment(&rc, "echec").await;

    api.post_refund(&rb, &json!({})).await.expect(200);
    let b = api.wait_payment(&rb, "rembourse").await;

    let ok = api.payout(&payout_body(2_000, "99")).await;
    let ko = api.payout(&payout_body(1_000, "01")).await;
    let processed = api.wait_payout(text(&ok["id"]), "traite").await;
    let rejected = api.wait_payout(text(&ko["id"]), "rejete").await;
    Lives { a, b, c, processed, rejected }
}

/// Waits until every expected event has reached the receiver and every notification is stored as
/// delivered; all of them once each, as every answer was a 200. Returns the requests and the stored log.
async fn wait_for_every_delivery(
    app: &TestApp,
    receiver: &Receiver,
    merchant: &MerchantId,
    expected: &[Expected],
) -> (Vec<Hit>, Vec<Notification>) {
    let wanted: BTreeSet<(String, String)> = expected.iter().map(|(e, r, _, _)| (e.to_string(), r.clone())).collect();
    let hits = receiver
        .wait("every event delivered", DEADLINE, |hits| {
            hits.iter().map(|h| (h.event(), h.reference())).collect::<BTreeSet<_>>() == wanted
        })
        .await;
    let notifications =
        app.wait_notifications(merchant, expected.len(), DEADLINE, |n| n.state == DeliveryState::Delivered).await;
    let hits_now = receiver.hits();
    assert_eq!(hits_now.len(), expected.len(), "one request per event: {:?}", hits_now.iter().map(|h| h.event()));
    (hits, notifications)
}

/// The body of one delivery: the spec's shape, the status after the change, and the record's own values.
fn check_payload(hit: &Hit, event: &str, status: &str, paid: bool, record: &Value) {
    let body = hit.json();
    let data = assert_shape(&body, event);
    assert_eq!(data["statut"], status, "{event}: statut after the change: {body}");
    assert_eq!(!data["paid_at"].is_null(), paid, "{event}: paid_at: {body}");
    assert_eq!(data["devise"], "XOF");
    assert_eq!(data["fournisseur"], "mtn_momo");
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
        if paid {
            assert_eq!(data["paid_at"], record["paid_at"], "{body}");
        }
    }
}

/// The body sent is the stored one, byte for byte, and its log says one 200.
fn check_logged_once(notifications: &[Notification], hit: &Hit, event: &str, reference: &str) {
    let n = notifications.iter().find(|n| n.event.as_str() == event && n.reference == reference).expect("stored");
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

/// The customer's e-mail and metadata of payment `a` travel as given; a refund carries the payment's amount.
fn check_customer_details(hits: &[Hit], a: &str) {
    let a_first = hits.iter().find(|h| h.reference() == a).expect("a").json();
    assert_eq!(a_first["data"]["client_email"], "awa@example.com");
    assert_eq!(a_first["data"]["metadata"], json!({"commande": "42", "note": "café"}));
    let refunded = hits.iter().find(|h| h.event() == "payment.refunded").expect("refund event").json();
    assert_eq!(refunded["data"]["montant"], 5_000, "payment.refunded carries the payment's amount");
    assert_eq!(refunded["data"]["montant_rembourse"], 5_000, "and the sum refunded");
    assert_eq!(refunded["data"]["metadata"], json!({}), "empty metadata is {{}}");
}
