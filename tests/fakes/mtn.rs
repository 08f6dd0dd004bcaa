//! The MTN MoMo fake: per-product credentials and tokens, requesttopay with its 202/409/400/500 answers and
//! magic numbers, status queries, callbacks, transfers, refunds, and the knobs.

use serde_json::{json, Value};

use crate::support::{eventually, get, send, uuid, Answer, Fake, Receiver};

const COLLECTION_KEY: &str = "col-key";
const DISBURSEMENT_KEY: &str = "dis-key";
const COLLECTION_USER: &str = "0b0e5a2c-1d3f-4a5b-8c6d-7e8f9a0b1c2d";
const DISBURSEMENT_USER: &str = "1c1f6b3d-2e4a-4b6c-9d7e-8f9a0b1c2d3e";

struct Mtn {
    fake: Fake,
    collection_token: String,
    disbursement_token: String,
}

impl Mtn {
    fn headers<'a>(&'a self, product: &str, token: &'a str) -> Vec<(&'a str, String)> {
        let key = if product == "collection" { COLLECTION_KEY } else { DISBURSEMENT_KEY };
        vec![
            ("Ocp-Apim-Subscription-Key", key.to_owned()),
            ("Authorization", format!("Bearer {token}")),
            ("X-Target-Environment", "mtnbenin".to_owned()),
        ]
    }

    async fn call(&self, method: &str, path: &str, extra: &[(&str, &str)], body: Option<&Value>) -> Answer {
        let product = path.trim_start_matches('/').split('/').next().unwrap_or_default();
        let token = if product == "collection" { &self.collection_token } else { &self.disbursement_token };
        let owned = self.headers(product, token);
        let mut headers: Vec<(&str, &str)> = owned.iter().map(|(n, v)| (*n, v.as_str())).collect();
        headers.extend_from_slice(extra);
        send(method, &format!("{}{path}", self.fake.url), &headers, body).await
    }

    async fn create(&self, path: &str, id: &str, callback: Option<&str>, body: &Value) -> Answer {
        let mut extra = vec![("X-Reference-Id", id)];
        if let Some(url) = callback {
            extra.push(("X-Callback-Url", url));
        }
        self.call("POST", path, &extra, Some(body)).await
    }

    async fn wait_status(&self, path: &str, status: &str) -> Value {
        eventually(&format!("{path} {status}"), || async {
            let body = self.call("GET", path, &[], None).await.json();
            (body["status"] == status).then_some(body)
        })
        .await
    }
}

async fn token(fake: &Fake, product: &str, key: &str, user: &str, api_key: &str) -> Answer {
    use base64::Engine;
    let basic = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{api_key}")));
    let headers = [("Ocp-Apim-Subscription-Key", key), ("Authorization", basic.as_str())];
    send("POST", &format!("{}/{product}/token/", fake.url), &headers, None).await
}

fn rtp(phone: &str, amount: &str, currency: &str) -> Value {
    json!({"amount": amount, "currency": currency, "externalId": "order-42",
           "payer": {"partyIdType": "MSISDN", "partyId": phone}, "payerMessage": "Pay order 42", "payeeNote": "order 42"})
}

#[actix_web::test]
async fn mtn_protocol() {
    let receiver = Receiver::start();
    let fake = Fake::spawn(&[
        "mtn-momo",
        "--settle-ms",
        "100",
        "--target-environment",
        "mtnbenin",
        "--subscription-key-collection",
        COLLECTION_KEY,
        "--subscription-key-disbursement",
        DISBURSEMENT_KEY,
        "--api-user",
        COLLECTION_USER,
        "--api-key",
        "col-secret",
        "--api-user",
        DISBURSEMENT_USER,
        "--api-key",
        "dis-secret",
    ]);

    // Tokens: a bad subscription key is APIM's 401, bad credentials 500 login_failed, each product its own.
    assert_eq!(token(&fake, "collection", "wrong", COLLECTION_USER, "col-secret").await.status, 401);
    let failed = token(&fake, "collection", COLLECTION_KEY, DISBURSEMENT_USER, "dis-secret").await;
    assert_eq!((failed.status, failed.json()), (500, json!({"error": "login_failed"})));
    let issued = token(&fake, "collection", COLLECTION_KEY, COLLECTION_USER, "col-secret").await.json();
    assert_eq!((issued["token_type"].as_str(), issued["expires_in"].as_u64()), (Some("access_token"), Some(3600)));
    let disbursement = token(&fake, "disbursement", DISBURSEMENT_KEY, DISBURSEMENT_USER, "dis-secret").await.json();
    let mtn = Mtn {
        collection_token: issued["access_token"].as_str().unwrap_or_default().to_owned(),
        disbursement_token: disbursement["access_token"].as_str().unwrap_or_default().to_owned(),
        fake,
    };
    let wrong_product = send(
        "GET",
        &format!("{}/disbursement/v1_0/transfer/{}", mtn.fake.url, uuid()),
        &[
            ("Ocp-Apim-Subscription-Key", DISBURSEMENT_KEY),
            ("Authorization", &format!("Bearer {}", mtn.collection_token)),
            ("X-Target-Environment", "mtnbenin"),
        ],
        None,
    )
    .await;
    assert_eq!(wrong_product.status, 401, "a collection token does not open disbursement");

    // requesttopay: 202 with an empty body, 409 on a reused id, status, and the callback to X-Callback-Url.
    let id = uuid();
    let callback = format!("{}/momo/{id}", receiver.url);
    let created =
        mtn.create("/collection/v1_0/requesttopay", &id, Some(&callback), &rtp("22997000000", "1000", "XOF")).await;
    assert_eq!((created.status, created.body.len()), (202, 0));
    let again = mtn.create("/collection/v1_0/requesttopay", &id, None, &rtp("22997000000", "1000", "XOF")).await;
    let conflict =
        json!({"code": "RESOURCE_ALREADY_EXIST", "message": "Duplicated reference id. Creation of resource failed."});
    assert_eq!((again.status, again.json()), (409, conflict));
    let done = mtn.wait_status(&format!("/collection/v1_0/requesttopay/{id}"), "SUCCESSFUL").await;
    assert!(done["financialTransactionId"].is_string() && done["payer"]["partyId"] == "22997000000");
    let hit = eventually("the requesttopay callback", || async {
        receiver.hits().into_iter().find(|h| h.path == format!("/momo/{id}"))
    })
    .await;
    assert_eq!((hit.method.as_str(), hit.json()), ("POST", done.clone()));
    assert!(hit.header("signature").is_none(), "MTN callbacks are unsigned");

    // Refusals.
    for (body, id, why) in [
        (rtp("+22997000000", "1000", "XOF"), uuid(), "'+' in partyId"),
        (json!({"amount": 1000, "currency": "XOF"}), uuid(), "amount not a string"),
        (rtp("22997000000", "1000", "XOF"), "not-a-uuid".to_owned(), "X-Reference-Id not a UUIDv4"),
    ] {
        let answer = mtn.create("/collection/v1_0/requesttopay", &id, None, &body).await;
        assert_eq!(answer.status, 400, "{why}");
        assert!(answer.header("x-fake-reason").is_some(), "the fake says why: {why}");
    }
    let euro = mtn.create("/collection/v1_0/requesttopay", &uuid(), None, &rtp("22997000000", "1000", "EUR")).await;
    assert_eq!((euro.status, euro.json()["code"].as_str()), (500, Some("INVALID_CURRENCY")));

    // Magic numbers: the last two digits decide, whatever the country prefix.
    let failing = uuid();
    mtn.create("/collection/v1_0/requesttopay", &failing, None, &rtp("22997000055", "1000", "XOF")).await;
    let failed = mtn.wait_status(&format!("/collection/v1_0/requesttopay/{failing}"), "FAILED").await;
    assert_eq!(failed["reason"], "PAYER_NOT_FOUND");
    let payee = uuid();
    let transfer = json!({"amount": "500", "currency": "XOF", "externalId": "p1",
                          "payee": {"partyIdType": "MSISDN", "partyId": "22997000057"}, "payerMessage": "m", "payeeNote": "n"});
    assert_eq!(mtn.create("/disbursement/v1_0/transfer", &payee, None, &transfer).await.status, 202);
    let failed = mtn.wait_status(&format!("/disbursement/v1_0/transfer/{payee}"), "FAILED").await;
    assert_eq!(failed["reason"], "PAYEE_NOT_FOUND");

    // Refunds: within the original they succeed; beyond it they fail.
    let refund = |amount: &str| {
        json!({"amount": amount, "currency": "XOF", "externalId": "r", "payerMessage": "m",
                                        "payeeNote": "n", "referenceIdToRefund": id})
    };
    let partial = uuid();
    assert_eq!(mtn.create("/disbursement/v2_0/refund", &partial, None, &refund("600")).await.status, 202);
    mtn.wait_status(&format!("/disbursement/v1_0/refund/{partial}"), "SUCCESSFUL").await;
    let excess = uuid();
    mtn.create("/disbursement/v2_0/refund", &excess, None, &refund("500")).await;
    let failed = mtn.wait_status(&format!("/disbursement/v1_0/refund/{excess}"), "FAILED").await;
    assert_eq!(failed["reason"], "NOT_ALLOWED");
    assert_eq!(mtn.call("GET", &format!("/disbursement/v1_0/refund/{}", uuid()), &[], None).await.status, 404);

    // Knobs: not found right after creation, PUT callbacks, a stuck number settled by control, token expiry.
    mtn.fake.control("knobs", json!({"not_found_after_create_ms": 60000, "callback_method": "PUT"})).await;
    let late = uuid();
    let callback = format!("{}/momo/{late}", receiver.url);
    mtn.create("/collection/v1_0/requesttopay", &late, Some(&callback), &rtp("22997000053", "1000", "XOF")).await;
    let missing = mtn.call("GET", &format!("/collection/v1_0/requesttopay/{late}"), &[], None).await;
    assert_eq!((missing.status, missing.json()["code"].as_str()), (404, Some("RESOURCE_NOT_FOUND")));
    mtn.fake.control("knobs", json!({"not_found_after_create_ms": 0})).await;
    assert_eq!(mtn.wait_status(&format!("/collection/v1_0/requesttopay/{late}"), "PENDING").await["status"], "PENDING");
    mtn.fake.control(&format!("complete/{late}"), json!({"outcome": "success"})).await;
    let hit = eventually("the PUT callback", || async {
        receiver.hits().into_iter().find(|h| h.path == format!("/momo/{late}"))
    })
    .await;
    assert_eq!((hit.method.as_str(), hit.json()["status"].as_str()), ("PUT", Some("SUCCESSFUL")));
    // Out of order: the final callback, then a stale PENDING one the adapter must ignore.
    mtn.fake.control("knobs", json!({"callbacks": "out_of_order", "callback_method": "POST"})).await;
    let shuffled = uuid();
    let callback = format!("{}/momo/{shuffled}", receiver.url);
    mtn.create("/collection/v1_0/requesttopay", &shuffled, Some(&callback), &rtp("22997000000", "1000", "XOF")).await;
    let hits = eventually("two callbacks", || async {
        let hits: Vec<_> = receiver.hits().into_iter().filter(|h| h.path == format!("/momo/{shuffled}")).collect();
        (hits.len() >= 2).then_some(hits)
    })
    .await;
    let statuses: Vec<Value> = hits.iter().map(|h| h.json()["status"].clone()).collect();
    assert_eq!(statuses, [json!("SUCCESSFUL"), json!("PENDING")]);
    mtn.fake.control("clock/advance", json!({"seconds": 3600})).await;
    let expired = mtn.call("GET", &format!("/collection/v1_0/requesttopay/{id}"), &[], None).await;
    assert_eq!(expired.status, 401, "tokens expire on the fake clock");
    let (_, list) = get(&format!("{}/__fake/transactions", mtn.fake.url), &[]).await;
    assert!(list.as_array().is_some_and(|l| l.iter().any(|t| t["id"] == id && t["target"] == "mtnbenin")));
}
