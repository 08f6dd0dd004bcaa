//! The MTN MoMo fake: per-product credentials and tokens, requesttopay with its 202/409/400/500 answers and
//! magic numbers, status queries, callbacks, transfers, refunds, and the knobs.

use actix_web::http::Method;
use serde_json::{json, Value};

use crate::support::{always, eventually, Api, Fake, Receiver, Req, Resp, DEADLINE};
use crate::uuid;

const COLLECTION_KEY: &str = "col-key";
const DISBURSEMENT_KEY: &str = "dis-key";
const COLLECTION_USER: &str = "0b0e5a2c-1d3f-4a5b-8c6d-7e8f9a0b1c2d";
const DISBURSEMENT_USER: &str = "1c1f6b3d-2e4a-4b6c-9d7e-8f9a0b1c2d3e";

struct Mtn {
    fake: Fake,
    /// The collection product's client, with its token.
    collection: Api,
    /// The disbursement product's client, with its token.
    disbursement: Api,
}

impl Mtn {
    /// A request to `path` of the product it names, with that product's subscription key and token.
    fn req(&self, method: Method, path: &str) -> (&Api, Req) {
        let collection = path.trim_start_matches('/').starts_with("collection/");
        let (api, key) =
            if collection { (&self.collection, COLLECTION_KEY) } else { (&self.disbursement, DISBURSEMENT_KEY) };
        let req =
            api.req(method, path).header("Ocp-Apim-Subscription-Key", key).header("X-Target-Environment", "mtnbenin");
        (api, req)
    }

    async fn get(&self, path: &str) -> Resp {
        let (api, req) = self.req(Method::GET, path);
        api.fetch(req).await
    }

    async fn create(&self, path: &str, id: &str, callback: Option<&str>, body: &Value) -> Resp {
        let (api, mut req) = self.req(Method::POST, path);
        req = req.header("X-Reference-Id", id);
        if let Some(url) = callback {
            req = req.header("X-Callback-Url", url);
        }
        api.fetch(req.json(body)).await
    }

    async fn wait_status(&self, path: &str, status: &str) -> Value {
        eventually(&format!("{path} {status}"), DEADLINE, || async {
            let body = self.get(path).await.json;
            if body["status"] == status {
                Ok(body)
            } else {
                Err(body.to_string())
            }
        })
        .await
    }
}

async fn token(fake: &Fake, product: &str, key: &str, user: &str, api_key: &str) -> Resp {
    use base64::Engine;
    let basic = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{api_key}")));
    let api = fake.api("");
    let req = api.post(&format!("/{product}/token/")).no_auth();
    api.fetch(req.header("Ocp-Apim-Subscription-Key", key).header("Authorization", &basic)).await
}

fn rtp(phone: &str, amount: &str, currency: &str) -> Value {
    json!({"amount": amount, "currency": currency, "externalId": "order-42",
           "payer": {"partyIdType": "MSISDN", "partyId": phone}, "payerMessage": "Pay order 42", "payeeNote": "order 42"})
}

#[actix_web::test]
async fn mtn_protocol() {
    let receiver = Receiver::start(always(200));
    let fake = Fake::start(&[
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
    assert_eq!((failed.status, failed.json), (500, json!({"error": "login_failed"})));
    let issued = token(&fake, "collection", COLLECTION_KEY, COLLECTION_USER, "col-secret").await.json;
    assert_eq!((issued["token_type"].as_str(), issued["expires_in"].as_u64()), (Some("access_token"), Some(3600)));
    let disbursement = token(&fake, "disbursement", DISBURSEMENT_KEY, DISBURSEMENT_USER, "dis-secret").await.json;
    let mtn = Mtn {
        collection: fake.api(issued["access_token"].as_str().unwrap_or_default()),
        disbursement: fake.api(disbursement["access_token"].as_str().unwrap_or_default()),
        fake,
    };
    let wrong_product = mtn
        .collection
        .get(&format!("/disbursement/v1_0/transfer/{}", uuid()))
        .header("Ocp-Apim-Subscription-Key", DISBURSEMENT_KEY)
        .header("X-Target-Environment", "mtnbenin");
    let wrong_product = mtn.collection.fetch(wrong_product).await;
    assert_eq!(wrong_product.status, 401, "a collection token does not open disbursement");

    // requesttopay: 202 with an empty body, 409 on a reused id, status, and the callback to X-Callback-Url.
    let id = uuid();
    let callback = format!("{}/momo/{id}", receiver.base);
    let created =
        mtn.create("/collection/v1_0/requesttopay", &id, Some(&callback), &rtp("22997000000", "1000", "XOF")).await;
    assert_eq!((created.status, created.body.len()), (202, 0));
    let again = mtn.create("/collection/v1_0/requesttopay", &id, None, &rtp("22997000000", "1000", "XOF")).await;
    let conflict =
        json!({"code": "RESOURCE_ALREADY_EXIST", "message": "Duplicated reference id. Creation of resource failed."});
    assert_eq!((again.status, again.json), (409, conflict));
    let done = mtn.wait_status(&format!("/collection/v1_0/requesttopay/{id}"), "SUCCESSFUL").await;
    assert!(done["financialTransactionId"].is_string() && done["payer"]["partyId"] == "22997000000");
    let hit = eventually("the requesttopay callback", DEADLINE, || async {
        receiver.hits().into_iter().find(|h| h.path == format!("/momo/{id}")).ok_or_else(|| "not received".to_owned())
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
    assert_eq!((euro.status, euro.json["code"].as_str()), (500, Some("INVALID_CURRENCY")));

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
    assert_eq!(mtn.get(&format!("/disbursement/v1_0/refund/{}", uuid())).await.status, 404);

    // Knobs: not found right after creation, PUT callbacks, a stuck number settled by control, token expiry.
    mtn.fake.knobs(json!({"not_found_after_create_ms": 60000, "callback_method": "PUT"})).await;
    let late = uuid();
    let callback = format!("{}/momo/{late}", receiver.base);
    mtn.create("/collection/v1_0/requesttopay", &late, Some(&callback), &rtp("22997000053", "1000", "XOF")).await;
    let missing = mtn.get(&format!("/collection/v1_0/requesttopay/{late}")).await;
    assert_eq!((missing.status, missing.json["code"].as_str()), (404, Some("RESOURCE_NOT_FOUND")));
    mtn.fake.knobs(json!({"not_found_after_create_ms": 0})).await;
    assert_eq!(mtn.wait_status(&format!("/collection/v1_0/requesttopay/{late}"), "PENDING").await["status"], "PENDING");
    mtn.fake.complete(&late, "success", None).await;
    let hit = eventually("the PUT callback", DEADLINE, || async {
        receiver.hits().into_iter().find(|h| h.path == format!("/momo/{late}")).ok_or_else(|| "not received".to_owned())
    })
    .await;
    assert_eq!((hit.method.as_str(), hit.json()["status"].as_str()), ("PUT", Some("SUCCESSFUL")));
    // Out of order: the final callback, then a stale PENDING one the adapter must ignore.
    mtn.fake.knobs(json!({"callbacks": "out_of_order", "callback_method": "POST"})).await;
    let shuffled = uuid();
    let callback = format!("{}/momo/{shuffled}", receiver.base);
    mtn.create("/collection/v1_0/requesttopay", &shuffled, Some(&callback), &rtp("22997000000", "1000", "XOF")).await;
    let hits = receiver
        .wait("two callbacks", DEADLINE, |hits| {
            hits.iter().filter(|h| h.path == format!("/momo/{shuffled}")).count() >= 2
        })
        .await;
    let hits: Vec<_> = hits.into_iter().filter(|h| h.path == format!("/momo/{shuffled}")).collect();
    let statuses: Vec<Value> = hits.iter().map(|h| h.json()["status"].clone()).collect();
    assert_eq!(statuses, [json!("SUCCESSFUL"), json!("PENDING")]);
    mtn.fake.advance_clock(3600).await;
    let expired = mtn.get(&format!("/collection/v1_0/requesttopay/{id}")).await;
    assert_eq!(expired.status, 401, "tokens expire on the fake clock");
    let list = mtn.fake.transactions().await;
    assert!(list.iter().any(|t| t["id"] == id && t["target"] == "mtnbenin"));
}
