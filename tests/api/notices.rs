//! `POST /v1/fournisseurs/{code}/notifications` (docs/api.md § Providers and the sandbox): a notice that fails
//! authentication gets 401 and changes nothing; an authentic notice is still confirmed with the provider before
//! money moves.

use std::time::Duration;

use caisse::providers::sandbox::{sign, SIGNATURE_HEADER, TIMESTAMP_HEADER};
use serde_json::{json, Value};

use crate::support::{assert_error, spawn_app_with, text, until, TestApp};

fn now_s() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs()
}

async fn notify(app: &TestApp, provider: &str, body: &Value, secret: &str, timestamp: u64) -> crate::support::Resp {
    let bytes = serde_json::to_vec(body).expect("json");
    let signature = sign(secret, timestamp, &bytes);
    app.send(
        app.post(&format!("/v1/fournisseurs/{provider}/notifications"))
            .no_auth()
            .header(TIMESTAMP_HEADER, &timestamp.to_string())
            .header(SIGNATURE_HEADER, &signature)
            .raw(Some("application/json"), bytes),
    )
    .await
}

#[actix_web::test]
async fn a_notice_with_a_bad_signature_is_401_and_changes_nothing() {
    let app = spawn_app_with(|s| s.payment_ttl_ms = 60_000).await;
    // The 02 phone never gets an answer from the simulator: the payment waits in en_cours.
    let p = app.pay(10000, "02").await;
    let reference = text(&p["reference"]).to_owned();
    let before = app.wait_payment(&reference, "en_cours").await;
    let forged = json!({"subject": "payment", "transaction_id": p["transaction_id"], "statut": "succeeded"});
    let secret = app.state.settings.sandbox_secret.clone();

    let resp = notify(&app, "mtn_momo", &forged, "not-the-simulator-secret", now_s()).await;
    assert_error(&resp, 401, "unauthorized", None);
    // The right secret but a stale or future timestamp.
    for ts in [now_s() - 3600, now_s() + 3600] {
        let resp = notify(&app, "mtn_momo", &forged, &secret, ts).await;
        assert_error(&resp, 401, "unauthorized", None);
    }
    // A signature over other bytes.
    let bytes = serde_json::to_vec(&forged).expect("json");
    let ts = now_s();
    let resp = app
        .send(
            app.post("/v1/fournisseurs/mtn_momo/notifications")
                .no_auth()
                .header(TIMESTAMP_HEADER, &ts.to_string())
                .header(SIGNATURE_HEADER, &sign(&secret, ts, b"{}"))
                .raw(Some("application/json"), bytes.clone()),
        )
        .await;
    assert_error(&resp, 401, "unauthorized", None);
    // No signature headers at all, or a merchant key instead.
    let resp = app
        .send(app.post("/v1/fournisseurs/mtn_momo/notifications").raw(Some("application/json"), bytes.clone()))
        .await;
    assert_error(&resp, 401, "unauthorized", None);

    let after = app.get_ok(&format!("/v1/paiement/{reference}")).await;
    assert_eq!(after, before, "the payment did not move");
    assert_eq!(app.balance("XOF").await, (0, 0, 0));
}

#[actix_web::test]
async fn an_authentic_notice_is_confirmed_with_the_provider_before_money_moves() {
    let app = spawn_app_with(|s| s.payment_ttl_ms = 60_000).await;
    let p = app.pay(10000, "02").await;
    let reference = text(&p["reference"]).to_owned();
    app.wait_payment(&reference, "en_cours").await;
    let secret = app.state.settings.sandbox_secret.clone();
    // Correctly signed, but the provider's status query still says "processing": no credit.
    let claim = json!({"subject": "payment", "transaction_id": p["transaction_id"], "statut": "succeeded"});
    let resp = notify(&app, "mtn_momo", &claim, &secret, now_s()).await;
    resp.expect(200);
    actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(app.get_ok(&format!("/v1/paiement/{reference}")).await["statut"], "en_cours");
    assert_eq!(app.balance("XOF").await, (0, 0, 0));

    // Unknown transaction, unknown provider, malformed notice.
    let unknown =
        json!({"subject": "payment", "transaction_id": "tx_01ARZ3NDEKTSV4RRFFQ69G5FAV", "statut": "succeeded"});
    assert_error(&notify(&app, "mtn_momo", &unknown, &secret, now_s()).await, 404, "not_found", None);
    assert_error(&notify(&app, "paypal", &claim, &secret, now_s()).await, 404, "not_found", None);
    let malformed = json!({"hello": "world"});
    assert_error(&notify(&app, "mtn_momo", &malformed, &secret, now_s()).await, 400, "invalid_json", None);
}

/// A notice at another provider's door changes nothing, even when the provider it reached would confirm it.
#[actix_web::test]
async fn a_notice_at_another_providers_path_changes_nothing() {
    let app = spawn_app_with(|s| s.payment_ttl_ms = 60_000).await;
    let secret = app.state.settings.sandbox_secret.clone();
    // Two payments the provider completes at the same time, their notices lost: only a notice (or the TTL)
    // settles them.
    let mut body = crate::support::payment_body(10_000, "00");
    body["metadata"] = json!({"sandbox_chaos": "lost"});
    let (a, b) = (app.initiate(&body).await, app.initiate(&body).await);
    let claim = |p: &Value| json!({"subject": "payment", "transaction_id": p["transaction_id"], "statut": "succeeded"});
    // The right door settles the first once the provider has completed it, so the second is complete too.
    let a_reference = text(&a["reference"]).to_owned();
    until("the first payment is confirmed", || async {
        notify(&app, "mtn_momo", &claim(&a), &secret, now_s()).await.expect(200);
        app.get_ok(&format!("/v1/paiement/{a_reference}")).await["statut"] == "succes"
    })
    .await;
    // The second, at the wrong door: nothing moves.
    let b_reference = text(&b["reference"]).to_owned();
    notify(&app, "wave", &claim(&b), &secret, now_s()).await.expect(200);
    assert_ne!(app.get_ok(&format!("/v1/paiement/{b_reference}")).await["statut"], "succes");
    assert_eq!(app.balance("XOF").await.0, 9_850, "only the first payment is credited");
    // At its own door it is confirmed and applied.
    until("the second payment is confirmed at its own door", || async {
        notify(&app, "mtn_momo", &claim(&b), &secret, now_s()).await.expect(200);
        app.get_ok(&format!("/v1/paiement/{b_reference}")).await["statut"] == "succes"
    })
    .await;
}
