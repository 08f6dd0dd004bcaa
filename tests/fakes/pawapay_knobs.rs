//! The pawaPay fake's signed callbacks, verified here independently with the served public key, and the
//! knobs an adapter's failure handling is tested with.

use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use p256::ecdsa::signature::Verifier;
use p256::ecdsa::{Signature, VerifyingKey};
use p256::pkcs8::DecodePublicKey;
use serde_json::json;
use sha2::{Digest, Sha512};

use crate::pawapay::{create, deposit, spawn, wait_status, AUTH, TOKEN};
use crate::support::{always, Hit, Receiver};
use crate::uuid;

/// Verifies a callback as a merchant would (RFC 9421 with pawaPay's covered components).
fn verifies(hit: &Hit, receiver: &Receiver, key: &VerifyingKey) -> bool {
    let header = |name: &str| hit.header(name).unwrap_or_default().to_owned();
    let digest = format!("sha-512=:{}:", BASE64.encode(Sha512::digest(&hit.body)));
    if header("content-digest") != digest {
        return false;
    }
    let params = header("signature-input").strip_prefix("sig-pp=").unwrap_or_default().to_owned();
    assert!(params.contains(r#";alg="ecdsa-p256-sha256";keyid="HTTP_EC_P256_KEY:1""#), "{params}");
    let authority = receiver.base.trim_start_matches("http://");
    let base = format!(
        "\"@method\": {}\n\"@authority\": {authority}\n\"@path\": {}\n\"signature-date\": {}\n\"content-digest\": {}\n\
\"content-type\": {}\n\"content-length\": {}\n\"@signature-params\": {params}",
        hit.method,
        hit.path,
        header("signature-date"),
        digest,
        header("content-type"),
        hit.body.len()
    );
    let signature = header("signature");
    let encoded = signature.strip_prefix("sig-pp=:").and_then(|s| s.strip_suffix(':')).unwrap_or_default();
    let bytes = BASE64.decode(encoded).unwrap_or_default();
    let parsed = Signature::from_slice(&bytes).or_else(|_| Signature::from_der(&bytes));
    parsed.is_ok_and(|s| key.verify(base.as_bytes(), &s).is_ok())
}

#[actix_web::test]
async fn pawapay_signed_callbacks() {
    let receiver = Receiver::start(always(200));
    let fake = spawn(&receiver);
    let api = fake.api(TOKEN);
    let answer = api.fetch(api.get("/v2/public-key/http").no_auth()).await;
    let keys = answer.json;
    assert_eq!((answer.status, keys[0]["id"].as_str()), (200, Some("HTTP_EC_P256_KEY:1")), "served without a token");
    let key = VerifyingKey::from_public_key_pem(keys[0]["key"].as_str().unwrap_or_default()).expect("a PEM key");

    fake.knobs(json!({"signed": true})).await;
    let raw = uuid();
    create(&api, "deposits", &deposit(&raw, "22951345789", "MTN_MOMO_BEN", "1000")).await;
    let hit = receiver.wait_hits_for(&raw, 1).await.remove(0);
    assert!(verifies(&hit, &receiver, &key), "raw r||s signature verifies");
    let encoded = hit.header("signature").unwrap_or_default().len();
    assert_eq!(encoded, "sig-pp=::".len() + 88, "64 bytes of r||s in base64");

    fake.knobs(json!({"signature_encoding": "der"})).await;
    let der = uuid();
    create(&api, "deposits", &deposit(&der, "22951345789", "MTN_MOMO_BEN", "1000")).await;
    assert!(verifies(&receiver.wait_hits_for(&der, 1).await[0], &receiver, &key), "DER signature verifies");

    // Forged: claims success for a failed deposit, with a signature that does not verify.
    fake.knobs(json!({"callbacks": "forged", "signature_encoding": "raw"})).await;
    let forged = uuid();
    create(&api, "deposits", &deposit(&forged, "22951345039", "MTN_MOMO_BEN", "1000")).await;
    let hit = receiver.wait_hits_for(&forged, 1).await.remove(0);
    assert_eq!(hit.json()["status"], "COMPLETED");
    assert!(!verifies(&hit, &receiver, &key), "a forged callback's signature must not verify");
    assert_eq!(
        wait_status(&api, "deposits", &forged, "FAILED").await["failureReason"]["failureCode"],
        "PAYMENT_NOT_APPROVED"
    );
}

#[actix_web::test]
async fn pawapay_knobs() {
    let receiver = Receiver::start(always(200));
    let fake = spawn(&receiver);
    let api = fake.api(TOKEN);

    // 500 although created: the status says FOUND and a retry with the same id is DUPLICATE_IGNORED.
    fake.knobs(json!({"create_500_but_created": 1})).await;
    let id = uuid();
    let (status, body) = create(&api, "deposits", &deposit(&id, "22951345789", "MTN_MOMO_BEN", "1000")).await;
    assert_eq!((status, body["failureReason"]["failureCode"].as_str()), (500, Some("UNKNOWN_ERROR")));
    let body = api.fetch(api.get(&format!("/v2/deposits/{id}"))).await.json;
    assert_eq!(body["status"], "FOUND");
    let (_, body) = create(&api, "deposits", &deposit(&id, "22951345789", "MTN_MOMO_BEN", "1000")).await;
    assert_eq!(body["status"], "DUPLICATE_IGNORED");

    // 429, then back to normal.
    fake.knobs(json!({"too_many_requests": 1})).await;
    assert_eq!(api.fetch(api.get("/v2/active-conf")).await.status, 429);
    assert_eq!(api.fetch(api.get("/v2/active-conf")).await.status, 200);

    // Never answer: the client times out, yet the deposit exists.
    fake.knobs(json!({"never_answer": 1})).await;
    let hung = uuid();
    let body = deposit(&hung, "22951345789", "MTN_MOMO_BEN", "1000").to_string();
    let sent = awc::Client::default()
        .post(format!("{}/v2/deposits", fake.base))
        .insert_header(AUTH)
        .insert_header(("Content-Type", "application/json"))
        .timeout(Duration::from_millis(500))
        .send_body(body)
        .await;
    assert!(sent.is_err(), "no answer within the client's timeout");
    wait_status(&api, "deposits", &hung, "COMPLETED").await;

    // Duplicate callbacks.
    fake.knobs(json!({"callbacks": "duplicate"})).await;
    let twice = uuid();
    create(&api, "deposits", &deposit(&twice, "22951345789", "MTN_MOMO_BEN", "1000")).await;
    receiver.wait_hits_for(&twice, 2).await;

    // Late callbacks leave two seconds after the final state.
    fake.knobs(json!({"callbacks": "late"})).await;
    let late = uuid();
    create(&api, "deposits", &deposit(&late, "22951345789", "MTN_MOMO_BEN", "1000")).await;
    wait_status(&api, "deposits", &late, "COMPLETED").await;
    actix_web::rt::time::sleep(Duration::from_millis(1000)).await;
    assert!(receiver.hits_for(&late).is_empty(), "not yet");
    receiver.wait_hits_for(&late, 1).await;

    // In reconciliation until settled by the control API.
    fake.knobs(json!({"callbacks": "once", "in_reconciliation": true})).await;
    let held = uuid();
    create(&api, "deposits", &deposit(&held, "22951345789", "MTN_MOMO_BEN", "1000")).await;
    wait_status(&api, "deposits", &held, "IN_RECONCILIATION").await;
    fake.complete(&held, "success", None).await;
    wait_status(&api, "deposits", &held, "COMPLETED").await;

    // Payouts: a magic failure; then ENQUEUED and cancelled with fail-enqueued.
    let payout = |id: &str, phone: &str| {
        json!({"payoutId": id, "amount": "500", "currency": "XOF",
               "recipient": {"type": "MMO", "accountDetails": {"phoneNumber": phone, "provider": "MTN_MOMO_BEN"}}})
    };
    let missing = uuid();
    create(&api, "payouts", &payout(&missing, "22951345089")).await;
    let data = wait_status(&api, "payouts", &missing, "FAILED").await;
    assert_eq!(data["failureReason"]["failureCode"], "RECIPIENT_NOT_FOUND");
    assert_eq!(receiver.wait_hits_for(&missing, 1).await[0].path, "/payout");
    fake.knobs(json!({"payouts_enqueued": true})).await;
    let queued = uuid();
    create(&api, "payouts", &payout(&queued, "22951345789")).await;
    wait_status(&api, "payouts", &queued, "ENQUEUED").await;
    let body = api.fetch(api.post(&format!("/v2/payouts/fail-enqueued/{queued}")).json(&json!({}))).await.json;
    assert_eq!(body["status"], "ACCEPTED");
    let data = wait_status(&api, "payouts", &queued, "FAILED").await;
    assert_eq!(data["failureReason"]["failureCode"], "MANUALLY_CANCELLED");

    // Control API errors are plain.
    let answer = fake.control_answer("knobs", json!({"no_such_knob": 1})).await;
    assert_eq!(answer.status, 400);
    let transactions = fake.transactions().await;
    assert!(transactions.iter().any(|t| t["id"] == queued && t["kind"] == "payout" && t["status"] == "FAILED"));
}
