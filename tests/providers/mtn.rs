//! A production-mode server routed to MTN MoMo, against the local MTN fake: what the merchant sees through the
//! API, and what MTN received.

use caisse::config::{Environment, MtnProduct, MtnSettings, Secret};
use caisse_engine::domain::ids::uuid_of;
use serde_json::{json, Value};

use crate::support::{assert_error, free_port, spawn_app_with, Fake, TestApp};
use crate::{pay, payment};

const TARGET: &str = "mtnbenin";
const API_USER: &str = "5f1f1b8e-6f0c-4d2a-9a57-0c5b6d7e8f90";

fn product(subscription_key: &str) -> MtnProduct {
    MtnProduct {
        subscription_key: Secret::new(subscription_key.into()),
        api_user: API_USER.into(),
        api_key: Secret::new("fake-api-key".into()),
    }
}

/// The fake, and a production server whose mtn_momo goes to it, calling back at its public URL.
async fn start() -> (Fake, TestApp) {
    let port = free_port();
    let fake =
        Fake::start(&["mtn-momo", "--listen", "127.0.0.1:0", "--target-environment", TARGET, "--settle-ms", "200"]);
    let base_url = fake.base.clone();
    let app = spawn_app_with(move |s| {
        s.environment = Environment::Production;
        s.listen = format!("127.0.0.1:{port}").parse().expect("a loopback address");
        s.public_url = format!("http://127.0.0.1:{port}");
        s.adapters.mtn_momo = Some(MtnSettings {
            base_url,
            target_environment: TARGET.into(),
            collection: product("fake-collection-subscription-key"),
            disbursement: Some(product("fake-disbursement-subscription-key")),
        });
        for p in &mut s.providers {
            if p.code.as_str() == "mtn_momo" {
                p.adapter = Some("mtn_momo".into());
            }
        }
    })
    .await;
    (fake, app)
}

#[actix_web::test]
async fn a_payment_completes_with_the_protocols_headers_and_a_put_callback() {
    let (fake, app) = start().await;
    fake.knobs(json!({"callback_method": "PUT", "callbacks": "duplicate"})).await;
    let paid = pay(&app, 1_000, "+22997000000", "succes").await;
    assert_eq!(app.balance("XOF").await, (985, 0, 985));

    let tokens = fake.received("POST", "/collection/token/").await;
    assert_eq!(tokens.len(), 1, "the token is cached");
    assert!(tokens[0]["headers"]["authorization"].as_str().is_some_and(|a| a.starts_with("Basic ")));
    let requests = fake.received("POST", "/collection/v1_0/requesttopay").await;
    assert_eq!(requests.len(), 1);
    let headers = &requests[0]["headers"];
    let tx = paid["transaction_id"].as_str().expect("a transaction id");
    assert_eq!(headers["x-reference-id"].as_str(), uuid_of(tx).as_deref());
    assert_eq!(headers["x-target-environment"], TARGET);
    assert_eq!(headers["ocp-apim-subscription-key"], "fake-collection-subscription-key");
    assert!(headers["authorization"].as_str().is_some_and(|a| a.starts_with("Bearer ")));
    let callback = headers["x-callback-url"].as_str().expect("a callback URL");
    assert!(callback.starts_with(&format!("{}/v1/notifications/mtn_momo/", app.address)), "{callback}");
    let sent: Value = serde_json::from_str(requests[0]["body"].as_str().expect("a body")).expect("JSON");
    assert_eq!(sent["amount"], "1000");
    assert_eq!(sent["payer"], json!({"partyIdType": "MSISDN", "partyId": "22997000000"}));
    assert_eq!(sent["externalId"], tx);
}

#[actix_web::test]
async fn a_payer_without_an_account_ends_echec_and_a_500_after_creating_still_succeeds() {
    let (fake, app) = start().await;
    let failed = pay(&app, 1_000, "+22997000055", "echec").await;
    assert_eq!(failed["failure_code"], "payer_not_found");
    fake.knobs(json!({"create_500_but_created": 1})).await;
    pay(&app, 2_000, "+22997000001", "succes").await;
    let requests = fake.received("POST", "/collection/v1_0/requesttopay").await;
    assert_eq!(requests.len(), 3, "the 500 was retried under the same id and answered 409");
    assert_eq!(fake.transactions().await.len(), 2);
    assert_eq!(app.balance("XOF").await.0, 1_970);
}

/// MTN refuses a currency its target environment does not take with a 500 and a code: once a status query
/// finds no such transaction, the payment fails with that code at once, in the first answer.
#[actix_web::test]
async fn a_refusal_answered_with_a_500_fails_the_payment_once_mtn_knows_no_such_transaction() {
    let (fake, app) = start().await;
    let request =
        json!({"montant": 1_000, "devise": "XAF", "fournisseur": "mtn_momo", "client_telephone": "+237650000001"});
    let first = app.send(app.post("/v1/paiement/initier").idem("xaf-1").json(&request)).await;
    let created = &first.expect(201).json;
    assert_eq!(created["statut"], "echec", "{created}");
    assert_eq!(created["failure_code"], "invalid_currency");
    let tx = created["transaction_id"].as_str().expect("a transaction id");
    let asked = fake.received("GET", &format!("/collection/v1_0/requesttopay/{}", uuid_of(tx).expect("a UUID"))).await;
    assert_eq!(asked.len(), 1, "MTN was asked whether the payment exists before it failed");
    assert!(fake.transactions().await.is_empty());
    // The same request again is the first answer again: the payment as the refusal left it.
    let again = app.send(app.post("/v1/paiement/initier").idem("xaf-1").json(&request)).await;
    assert_eq!(again.expect(201).header("Idempotent-Replayed"), Some("true"));
    assert_eq!(again.json, first.json);
    let attempts = fake.received("POST", "/collection/v1_0/requesttopay").await.len();
    assert_eq!(attempts, 3, "the request and its two retries, none after the refusal");
}

/// While the request still waits for MTN, its key is in use: a retry is told so, and once the request has
/// answered, a retry is its answer again.
#[actix_web::test]
async fn a_retry_while_the_request_waits_for_mtn_finds_its_key_in_use() {
    let (fake, app) = start().await;
    fake.knobs(json!({"latency_ms": 1_500})).await;
    let request = payment(1_000, "+22997000001");
    let send = || app.send(app.post("/v1/paiement/initier").idem("slow-1").json(&request));
    let retry = async {
        actix_web::rt::time::sleep(std::time::Duration::from_millis(500)).await;
        send().await
    };
    let (first, retry) = futures_util::future::join(send(), retry).await;
    assert_error(&retry, 409, "idempotency_key_in_use", None);
    first.expect(201);
    let again = send().await;
    assert_eq!(again.expect(201).header("Idempotent-Replayed"), Some("true"));
    assert_eq!(again.json, first.json);
    assert_eq!(fake.received("POST", "/collection/v1_0/requesttopay").await.len(), 1);
}

#[actix_web::test]
async fn callbacks_need_their_token_and_never_credit_on_their_own() {
    let (fake, app) = start().await;
    let created = app.initiate(&payment(1_000, "+22997000053")).await;
    let reference = created["reference"].as_str().expect("a reference").to_owned();
    let tx = created["transaction_id"].as_str().expect("a transaction id").to_owned();
    let requests = fake.received("POST", "/collection/v1_0/requesttopay").await;
    let url = requests[0]["headers"]["x-callback-url"].as_str().expect("a callback URL").to_owned();
    let path = url.trim_start_matches(&app.address).to_owned();
    let claim =
        json!({"externalId": tx, "status": "SUCCESSFUL", "payer": {"partyIdType": "MSISDN", "partyId": "22997000053"}});
    // Another token, or none: refused.
    app.send(app.post("/v1/notifications/mtn_momo/00000000000000000000000000000000").no_auth().json(&claim))
        .await
        .expect(401);
    // The right token, but MTN says the payment is still pending: nothing moves.
    app.send(app.post(&path).no_auth().json(&claim)).await.expect(200);
    assert_ne!(app.get_payment(&reference).await["statut"], "succes");
    assert_eq!(app.balance("XOF").await.0, 0);
    // MTN completes it: its callback is confirmed and applied.
    let id = uuid_of(&tx).expect("our id as a UUID");
    fake.complete(&id, "success", None).await;
    app.wait_payment(&reference, "succes").await;
    assert_eq!(app.balance("XOF").await.0, 985);
}

#[actix_web::test]
async fn payouts_and_refunds_go_through_disbursement_with_tokens_renewed() {
    let (fake, app) = start().await;
    let paid = pay(&app, 10_000, "+22997000001", "succes").await;
    // Tokens expire on MTN's clock: the next collection call gets a 401 and fetches a new one.
    fake.advance_clock(4_000).await;
    pay(&app, 1_000, "+22997000003", "succes").await;
    assert_eq!(fake.received("POST", "/collection/token/").await.len(), 2, "a fresh token after a 401");
    let payout = |phone: &str| json!({"montant": 1_000, "devise": "XOF", "fournisseur": "mtn_momo", "beneficiaire_telephone": phone});
    let sent = app.payout(&payout("+22997000002")).await;
    app.wait_payout(sent["id"].as_str().expect("an id"), "traite").await;
    let transfers = fake.received("POST", "/disbursement/v1_0/transfer").await;
    let transfer: Value = serde_json::from_str(transfers[0]["body"].as_str().expect("a body")).expect("JSON");
    assert_eq!(transfer["amount"], "985", "the beneficiary receives montant_net");
    assert_eq!(sent["montant_net"], 985);
    let refused = app.payout(&payout("+22997000057")).await;
    let refused = app.wait_payout(refused["id"].as_str().expect("an id"), "rejete").await;
    assert_eq!(refused["motif_rejet"], "payee_not_found");
    let reference = paid["reference"].as_str().expect("a reference");
    app.post_refund(reference, &json!({"montant": 2_000})).await.expect(200);
    app.wait_refund(reference, "succes").await;
    let refunds = fake.received("POST", "/disbursement/v2_0/refund").await;
    assert_eq!(refunds.len(), 1);
    let sent_refund: Value = serde_json::from_str(refunds[0]["body"].as_str().expect("a body")).expect("JSON");
    assert_eq!(
        sent_refund["referenceIdToRefund"].as_str(),
        uuid_of(paid["transaction_id"].as_str().expect("tx")).as_deref()
    );
    assert_eq!(sent_refund["amount"], "2000");
    assert_eq!(fake.received("POST", "/disbursement/token/").await.len(), 1, "the disbursement token is cached");
}
