//! The pawaPay v2 fake: auth, deposits and their magic numbers, idempotency, refunds, payouts, toolkit
//! endpoints, signed callbacks and the knobs.

use serde_json::{json, Value};

use crate::support::{always, eventually, Api, Fake, Receiver, DEADLINE};
use crate::uuid;

pub const TOKEN: &str = "test-token";
pub const AUTH: (&str, &str) = ("Authorization", "Bearer test-token");

pub fn spawn(receiver: &Receiver) -> Fake {
    let (d, p, r) = (
        format!("{}/deposit", receiver.base),
        format!("{}/payout", receiver.base),
        format!("{}/refund", receiver.base),
    );
    Fake::start(&[
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

/// `POST /v2/{kind}` with the token: the status and the JSON answered.
pub async fn create(api: &Api, kind: &str, body: &Value) -> (u16, Value) {
    let answer = api.fetch(api.post(&format!("/v2/{kind}")).json(body)).await;
    (answer.status, answer.json)
}

/// Waits for the transaction to reach `status` and answers its `data`.
pub async fn wait_status(api: &Api, kind: &str, id: &str, status: &str) -> Value {
    eventually(&format!("{kind} {id} {status}"), DEADLINE, || async {
        let body = api.fetch(api.get(&format!("/v2/{kind}/{id}"))).await.json;
        if body["data"]["status"] == status {
            Ok(body["data"].clone())
        } else {
            Err(body.to_string())
        }
    })
    .await
}

#[actix_web::test]
async fn pawapay_protocol() {
    let receiver = Receiver::start(always(200));
    let fake = spawn(&receiver);
    let api = fake.api(TOKEN);

    // Auth: no token 401, another token 403, each with pawaPay's failureReason.
    let answer = api.fetch(api.post("/v2/deposits").no_auth().json(&json!({}))).await;
    assert_eq!((answer.status, answer.json["failureReason"]["failureCode"].as_str()), (401, Some("NO_AUTHENTICATION")));
    let answer = api.fetch(api.post("/v2/deposits").auth("nope").json(&json!({}))).await;
    assert_eq!(
        (answer.status, answer.json["failureReason"]["failureCode"].as_str()),
        (403, Some("AUTHENTICATION_ERROR"))
    );

    // A deposit that completes, its duplicate, its status and its one callback.
    let id = uuid();
    let (status, body) = create(&api, "deposits", &deposit(&id, "22951345789", "MTN_MOMO_BEN", "1000")).await;
    assert_eq!(status, 200);
    assert_eq!((body["status"].as_str(), body["nextStep"].as_str()), (Some("ACCEPTED"), Some("FINAL_STATUS")));
    let (_, body) = create(&api, "deposits", &deposit(&id, "22951345789", "MTN_MOMO_BEN", "1000")).await;
    assert_eq!(body, json!({"depositId": id, "status": "DUPLICATE_IGNORED"}));
    let data = wait_status(&api, "deposits", &id, "COMPLETED").await;
    assert!(data["providerTransactionId"].is_string() && data["country"] == "BEN" && data["amount"] == "1000");
    let hits = receiver.wait_hits_for(&id, 1).await;
    assert_eq!((hits[0].method.as_str(), hits[0].path.as_str()), ("POST", "/deposit"));
    assert_eq!(hits[0].json(), data, "the callback is the status object");

    // Magic numbers: a failure with its reason and callback; a stuck one with none until settled by control.
    let failing = uuid();
    create(&api, "deposits", &deposit(&failing, "22951345029", "MTN_MOMO_BEN", "1000")).await;
    let data = wait_status(&api, "deposits", &failing, "FAILED").await;
    assert_eq!(data["failureReason"]["failureCode"], "PAYER_NOT_FOUND");
    assert_eq!(receiver.wait_hits_for(&failing, 1).await[0].json()["status"], "FAILED");
    let stuck = uuid();
    create(&api, "deposits", &deposit(&stuck, "22951345129", "MTN_MOMO_BEN", "1000")).await;
    wait_status(&api, "deposits", &stuck, "PROCESSING").await;
    let body = api.fetch(api.post(&format!("/v2/deposits/resend-callback/{stuck}")).json(&json!({}))).await.json;
    assert_eq!(body["failureReason"]["failureCode"], "INVALID_STATE");
    assert!(receiver.hits_for(&stuck).is_empty(), "…129 sends no callback");
    fake.complete(&stuck, "failure", Some("PAYMENT_NOT_APPROVED")).await;
    assert_eq!(
        receiver.wait_hits_for(&stuck, 1).await[0].json()["failureReason"]["failureCode"],
        "PAYMENT_NOT_APPROVED"
    );
    let body = api.fetch(api.post(&format!("/v2/deposits/resend-callback/{stuck}")).json(&json!({}))).await.json;
    assert_eq!(body["status"], "ACCEPTED");
    receiver.wait_hits_for(&stuck, 2).await;

    // Refusals: a malformed id is a 400; a number with '+', another country's number and an unknown provider
    // are 200 REJECTED, and a rejected id is not stored.
    let (status, body) = create(&api, "deposits", &deposit("not-a-uuid", "22951345789", "MTN_MOMO_BEN", "1000")).await;
    assert_eq!((status, body["failureReason"]["failureCode"].as_str()), (400, Some("INVALID_PARAMETER")));
    for (phone, provider, code) in [
        ("+22951345789", "MTN_MOMO_BEN", "INVALID_PHONE_NUMBER"),
        ("237653456789", "MTN_MOMO_BEN", "INVALID_PHONE_NUMBER"),
        ("22951345789", "MTN_MOMO_XYZ", "INVALID_PROVIDER"),
    ] {
        let rejected = uuid();
        let (status, body) = create(&api, "deposits", &deposit(&rejected, phone, provider, "1000")).await;
        assert_eq!((status, body["status"].as_str()), (200, Some("REJECTED")), "{phone} {provider}");
        assert_eq!(body["failureReason"]["failureCode"], code, "{phone} {provider}");
        let body = api.fetch(api.get(&format!("/v2/deposits/{rejected}"))).await.json;
        assert_eq!(body, json!({"status": "NOT_FOUND"}));
    }
    let (_, body) = create(&api, "deposits", &deposit(&uuid(), "22951345789", "MTN_MOMO_BEN", "10.5")).await;
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
    let (_, body) = create(&api, "refunds", &first).await;
    assert_eq!(body["status"], "ACCEPTED");
    let (_, body) = create(&api, "refunds", &refund(Some("100"))).await;
    assert_eq!(body["failureReason"]["failureCode"], "REFUND_IN_PROGRESS");
    let first_id = first["refundId"].as_str().unwrap_or_default();
    let data = wait_status(&api, "refunds", first_id, "COMPLETED").await;
    assert_eq!((data["depositId"].as_str(), data["amount"].as_str()), (Some(id.as_str()), Some("400")));
    assert_eq!(receiver.wait_hits_for(first_id, 1).await[0].path, "/refund");
    let (_, body) = create(&api, "refunds", &refund(Some("700"))).await;
    assert_eq!(body["failureReason"]["failureCode"], "AMOUNT_TOO_LARGE");
    let rest = refund(None);
    create(&api, "refunds", &rest).await;
    let data = wait_status(&api, "refunds", rest["refundId"].as_str().unwrap_or_default(), "COMPLETED").await;
    assert_eq!(data["amount"], "600", "no amount refunds what is left");
    let (_, body) = create(&api, "refunds", &refund(Some("1"))).await;
    assert_eq!(body["failureReason"]["failureCode"], "DEPOSIT_ALREADY_REFUNDED");

    // Toolkit.
    let conf = api.fetch(api.get("/v2/active-conf")).await.json;
    let countries: Vec<&str> =
        conf["countries"].as_array().unwrap().iter().filter_map(|c| c["country"].as_str()).collect();
    assert_eq!(countries, ["BEN", "BFA", "CMR", "CIV", "SEN"]);
    let predict = api.post("/v2/predict-provider").json(&json!({"phoneNumber": "+237 693456789"}));
    let predicted = api.fetch(predict).await.json;
    assert_eq!(predicted, json!({"country": "CMR", "provider": "ORANGE_CMR", "phoneNumber": "237693456789"}));

    // The request log has every provider call with lower-case header names.
    let requests = fake.requests().await;
    let first = &requests[0];
    assert_eq!((first["method"].as_str(), first["path"].as_str()), (Some("POST"), Some("/v2/deposits")));
    assert!(requests.iter().any(|r| r["headers"]["authorization"] == "Bearer test-token"));
}
