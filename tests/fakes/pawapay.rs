//! The pawaPay v2 fake: auth, deposits and their magic numbers, idempotency, refunds, payouts, toolkit
//! endpoints, signed callbacks and the knobs.

use serde_json::{json, Value};

use crate::support::{eventually, get, post, uuid, Fake, Receiver};

pub const TOKEN: &str = "test-token";
pub const AUTH: (&str, &str) = ("Authorization", "Bearer test-token");

pub fn spawn(receiver: &Receiver) -> Fake {
    let (d, p, r) =
        (format!("{}/deposit", receiver.url), format!("{}/payout", receiver.url), format!("{}/refund", receiver.url));
    Fake::spawn(&[
        "pawapay",
        "--token",
        TOKEN,
        "--settle-ms",
        "100",
        "--deposit-callback-url",
        &d,
        "--payout-callback-url",
        &p,
        "--refund-callback-url",
        &r,
    ])
}

pub fn deposit(id: &str, phone: &str, provider: &str, amount: &str) -> Value {
    json!({
        "depositId": id, "amount": amount, "currency": "XOF",
        "payer": {"type": "MMO", "accountDetails": {"phoneNumber": phone, "provider": provider}},
        "clientReferenceId": "order-42", "customerMessage": "Caisse order",
    })
}

pub async fn create(fake: &Fake, kind: &str, body: &Value) -> (u16, Value) {
    post(&format!("{}/v2/{kind}", fake.url), &[AUTH], body).await
}

/// Waits for the transaction to reach `status` and answers its `data`.
pub async fn wait_status(fake: &Fake, kind: &str, id: &str, status: &str) -> Value {
    eventually(&format!("{kind} {id} {status}"), || async {
        let (_, body) = get(&format!("{}/v2/{kind}/{id}", fake.url), &[AUTH]).await;
        (body["data"]["status"] == status).then(|| body["data"].clone())
    })
    .await
}

#[actix_web::test]
async fn pawapay_protocol() {
    let receiver = Receiver::start();
    let fake = spawn(&receiver);
    let url = |path: &str| format!("{}{path}", fake.url);

    // Auth: no token 401, another token 403, each with pawaPay's failureReason.
    let (status, body) = post(&url("/v2/deposits"), &[], &json!({})).await;
    assert_eq!((status, body["failureReason"]["failureCode"].as_str()), (401, Some("NO_AUTHENTICATION")));
    let (status, body) = post(&url("/v2/deposits"), &[("Authorization", "Bearer nope")], &json!({})).await;
    assert_eq!((status, body["failureReason"]["failureCode"].as_str()), (403, Some("AUTHENTICATION_ERROR")));

    // A deposit that completes, its duplicate, its status and its one callback.
    let id = uuid();
    let (status, body) = create(&fake, "deposits", &deposit(&id, "22951345789", "MTN_MOMO_BEN", "1000")).await;
    assert_eq!(status, 200);
    assert_eq!((body["status"].as_str(), body["nextStep"].as_str()), (Some("ACCEPTED"), Some("FINAL_STATUS")));
    let (_, body) = create(&fake, "deposits", &deposit(&id, "22951345789", "MTN_MOMO_BEN", "1000")).await;
    assert_eq!(body, json!({"depositId": id, "status": "DUPLICATE_IGNORED"}));
    let data = wait_status(&fake, "deposits", &id, "COMPLETED").await;
    assert!(data["providerTransactionId"].is_string() && data["country"] == "BEN" && data["amount"] == "1000");
    let hits = receiver.wait_for(&id, 1).await;
    assert_eq!((hits[0].method.as_str(), hits[0].path.as_str()), ("POST", "/deposit"));
    assert_eq!(hits[0].json(), data, "the callback is the status object");

    // Magic numbers: a failure with its reason and callback; a stuck one with none until settled by control.
    let failing = uuid();
    create(&fake, "deposits", &deposit(&failing, "22951345029", "MTN_MOMO_BEN", "1000")).await;
    let data = wait_status(&fake, "deposits", &failing, "FAILED").await;
    assert_eq!(data["failureReason"]["failureCode"], "PAYER_NOT_FOUND");
    assert_eq!(receiver.wait_for(&failing, 1).await[0].json()["status"], "FAILED");
    let stuck = uuid();
    create(&fake, "deposits", &deposit(&stuck, "22951345129", "MTN_MOMO_BEN", "1000")).await;
    wait_status(&fake, "deposits", &stuck, "PROCESSING").await;
    let (_, body) = post(&url(&format!("/v2/deposits/resend-callback/{stuck}")), &[AUTH], &json!({})).await;
    assert_eq!(body["failureReason"]["failureCode"], "INVALID_STATE");
    assert!(receiver.hits_for(&stuck).is_empty(), "…129 sends no callback");
    fake.control(&format!("complete/{stuck}"), json!({"outcome": "failure", "reason": "PAYMENT_NOT_APPROVED"})).await;
    assert_eq!(receiver.wait_for(&stuck, 1).await[0].json()["failureReason"]["failureCode"], "PAYMENT_NOT_APPROVED");
    let (_, body) = post(&url(&format!("/v2/deposits/resend-callback/{stuck}")), &[AUTH], &json!({})).await;
    assert_eq!(body["status"], "ACCEPTED");
    receiver.wait_for(&stuck, 2).await;

    // Refusals: a malformed id is a 400; a number with '+', another country's number and an unknown provider
    // are 200 REJECTED, and a rejected id is not stored.
    let (status, body) = create(&fake, "deposits", &deposit("not-a-uuid", "22951345789", "MTN_MOMO_BEN", "1000")).await;
    assert_eq!((status, body["failureReason"]["failureCode"].as_str()), (400, Some("INVALID_PARAMETER")));
    for (phone, provider, code) in [
        ("+22951345789", "MTN_MOMO_BEN", "INVALID_PHONE_NUMBER"),
        ("237653456789", "MTN_MOMO_BEN", "INVALID_PHONE_NUMBER"),
        ("22951345789", "MTN_MOMO_XYZ", "INVALID_PROVIDER"),
    ] {
        let rejected = uuid();
        let (status, body) = create(&fake, "deposits", &deposit(&rejected, phone, provider, "1000")).await;
        assert_eq!((status, body["status"].as_str()), (200, Some("REJECTED")), "{phone} {provider}");
        assert_eq!(body["failureReason"]["failureCode"], code, "{phone} {provider}");
        let (_, body) = get(&url(&format!("/v2/deposits/{rejected}")), &[AUTH]).await;
        assert_eq!(body, json!({"status": "NOT_FOUND"}));
    }
    let (_, body) = create(&fake, "deposits", &deposit(&uuid(), "22951345789", "MTN_MOMO_BEN", "10.5")).await;
    assert_eq!(body["failureReason"]["failureCode"], "INVALID_AMOUNT", "XOF has no decimals");

    // Partial refunds.
    let refund = |amount: Option<&str>| {
        let mut body = json!({"refundId": uuid(), "depositId": id});
        if let Some(amount) = amount {
            body["amount"] = json!(amount);
        }
        body
    };
    let first = refund(Some("400"));
    let (_, body) = create(&fake, "refunds", &first).await;
    assert_eq!(body["status"], "ACCEPTED");
    let (_, body) = create(&fake, "refunds", &refund(Some("100"))).await;
    assert_eq!(body["failureReason"]["failureCode"], "REFUND_IN_PROGRESS");
    let first_id = first["refundId"].as_str().unwrap_or_default();
    let data = wait_status(&fake, "refunds", first_id, "COMPLETED").await;
    assert_eq!((data["depositId"].as_str(), data["amount"].as_str()), (Some(id.as_str()), Some("400")));
    assert_eq!(receiver.wait_for(first_id, 1).await[0].path, "/refund");
    let (_, body) = create(&fake, "refunds", &refund(Some("700"))).await;
    assert_eq!(body["failureReason"]["failureCode"], "AMOUNT_TOO_LARGE");
    let rest = refund(None);
    create(&fake, "refunds", &rest).await;
    let data = wait_status(&fake, "refunds", rest["refundId"].as_str().unwrap_or_default(), "COMPLETED").await;
    assert_eq!(data["amount"], "600", "no amount refunds what is left");
    let (_, body) = create(&fake, "refunds", &refund(Some("1"))).await;
    assert_eq!(body["failureReason"]["failureCode"], "DEPOSIT_ALREADY_REFUNDED");

    // Toolkit.
    let (_, conf) = get(&url("/v2/active-conf"), &[AUTH]).await;
    let countries: Vec<&str> =
        conf["countries"].as_array().unwrap().iter().filter_map(|c| c["country"].as_str()).collect();
    assert_eq!(countries, ["BEN", "BFA", "CMR", "CIV", "SEN"]);
    let (_, predicted) = post(&url("/v2/predict-provider"), &[AUTH], &json!({"phoneNumber": "+237 693456789"})).await;
    assert_eq!(predicted, json!({"country": "CMR", "provider": "ORANGE_CMR", "phoneNumber": "237693456789"}));

    // The request log has every provider call with lower-case header names.
    let (_, requests) = get(&url("/__fake/requests"), &[]).await;
    let first = &requests[0];
    assert_eq!((first["method"].as_str(), first["path"].as_str()), (Some("POST"), Some("/v2/deposits")));
    assert!(requests.as_array().unwrap().iter().any(|r| r["headers"]["authorization"] == "Bearer test-token"));
}
