//! A production-mode server routed to Orange Money Web Payment, against the local Orange fake (its `dev`
//! environment): a payment paid on Orange's page (the fake's), the unsigned notification behind a
//! per-transaction URL token, polling when it is lost, expiry, tokens renewed, and collection only.

use caisse::config::{Environment, OrangeSettings, Secret};
use serde_json::{json, Value};

use crate::support::{assert_error, free_port, spawn_app_with, Api, Fake, Resp, TestApp};

/// The fake, and a production server whose orange_money goes to it.
async fn start() -> (Fake, TestApp) {
    let port = free_port();
    let fake = Fake::start(&["orange-money", "--listen", "127.0.0.1:0"]);
    let base_url = fake.base.clone();
    let app = spawn_app_with(move |s| {
        s.environment = Environment::Production;
        s.listen = format!("127.0.0.1:{port}").parse().expect("a loopback address");
        s.public_url = format!("http://127.0.0.1:{port}");
        s.adapters.orange_money = Some(OrangeSettings {
            token_url: format!("{base_url}/oauth/v3/token"),
            base_url,
            country: "dev".into(),
            client_id: "fake-orange-client-id".into(),
            client_secret: Secret::new("fake-orange-client-secret".into()),
            merchant_key: Secret::new("fake-orange-merchant-key".into()),
        });
        for p in &mut s.providers {
            if p.code.as_str() == "orange_money" {
                p.adapter = Some("orange_money".into());
            }
        }
    })
    .await;
    (fake, app)
}

fn payment(amount: i64) -> Value {
    json!({"montant": amount, "devise": "XOF", "fournisseur": "orange_money", "client_telephone": "+2250700000055"})
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

/// The Orange page a payment's creation answered: its absence says what the answer held, not that a later
/// `POST` went nowhere.
fn page(created: &Value) -> String {
    let url = text(&created["url_paiement"]);
    assert!(!url.is_empty(), "the payment's answer carries Orange's page: {created}");
    url.to_owned()
}

async fn on_oranges_page(app: &TestApp, url: &str, outcome: &str) -> Resp {
    let page =
        Api { address: String::new(), client: awc::Client::builder().disable_redirects().finish(), ..app.api.clone() };
    page.fetch(page.post(url).no_auth().raw(Some("application/x-www-form-urlencoded"), format!("outcome={outcome}")))
        .await
}

#[actix_web::test]
async fn a_payment_is_paid_on_oranges_page_and_confirmed_by_transactionstatus() {
    let (fake, app) = start().await;
    let created = app.initiate(&payment(1_000)).await;
    let (reference, tx) = (text(&created["reference"]).to_owned(), text(&created["transaction_id"]).to_owned());
    let url = page(&created);
    assert!(url.starts_with(&format!("{}/payment/pay_token/", fake.base)), "{created}");

    let tokens = fake.received("POST", "/oauth/v3/token").await;
    assert_eq!(tokens.len(), 1);
    assert!(text(&tokens[0]["headers"]["authorization"]).starts_with("Basic "));
    assert_eq!(tokens[0]["body"], "grant_type=client_credentials");
    let created_at = fake.received("POST", "/orange-money-webpay/dev/v1/webpayment").await;
    let sent: Value = serde_json::from_str(text(&created_at[0]["body"])).expect("JSON");
    assert_eq!((sent["order_id"].as_str(), sent["amount"].as_i64()), (Some(tx.as_str()), Some(1_000)));
    assert_eq!(sent["currency"], "OUV", "Orange's dev environment counts in OUV");
    assert_eq!(sent["merchant_key"], "fake-orange-merchant-key");
    let notif_url = text(&sent["notif_url"]).to_owned();
    assert!(notif_url.starts_with(&format!("{}/v1/notifications/orange_money/{tx}-", app.address)), "{notif_url}");

    let back = on_oranges_page(&app, &url, "pay").await;
    assert_eq!(back.header("location"), Some(format!("{}/retour/{tx}", app.address).as_str()));
    let paid = app.wait_payment(&reference, "succes").await;
    assert_eq!(app.balance("XOF").await.0, 985, "credited once");
    assert!(paid["url_paiement"].is_string());
    let asked = fake.received("POST", "/orange-money-webpay/dev/v1/transactionstatus").await;
    assert!(!asked.is_empty(), "confirmed by transactionstatus");
    let status_body: Value = serde_json::from_str(text(&asked[0]["body"])).expect("JSON");
    assert_eq!(status_body["order_id"], tx);
    assert!(url.ends_with(text(&status_body["pay_token"])), "the pay_token of the payment's page");
}

#[actix_web::test]
async fn notifications_need_their_url_token_lost_ones_are_polled_and_unpaid_ones_expire() {
    let (fake, app) = start().await;
    fake.knobs(json!({"callbacks": "never"})).await;
    let created = app.initiate(&payment(1_000)).await;
    let tx = text(&created["transaction_id"]).to_owned();
    let claim = json!({"status": "SUCCESS", "notif_token": "whatever", "txnid": "MP1"});
    for path in [
        format!("/v1/notifications/orange_money/{tx}-0000000000000000"),
        format!("/v1/notifications/orange_money/{tx}"),
    ] {
        assert_eq!(app.send(app.post(&path).no_auth().json(&claim)).await.status, 401, "{path}");
    }
    // The right URL, but Orange says the payment waits: the notification is only a hint.
    let sent: Value =
        serde_json::from_str(text(&fake.received("POST", "/orange-money-webpay/dev/v1/webpayment").await[0]["body"]))
            .expect("JSON");
    let path = text(&sent["notif_url"]).trim_start_matches(&app.address).to_owned();
    assert_eq!(app.send(app.post(&path).no_auth().json(&claim)).await.status, 200);
    assert_eq!(app.get_payment(text(&created["reference"])).await["statut"], "en_cours");
    // Paid with its notification lost: the sweep's transactionstatus settles it.
    on_oranges_page(&app, &page(&created), "pay").await;
    app.wait_payment(text(&created["reference"]), "succes").await;
    // Declined on the page.
    let declined = app.initiate(&payment(1_000)).await;
    on_oranges_page(&app, &page(&declined), "decline").await;
    assert_eq!(app.wait_payment(text(&declined["reference"]), "echec").await["failure_code"], "payment_failed");
    // Left alone past Orange's time: EXPIRED at Orange, expire at Caisse.
    fake.knobs(json!({"session_ttl_s": 1})).await;
    let left = app.initiate(&payment(1_000)).await;
    let expired = app.wait_payment(text(&left["reference"]), "expire").await;
    assert_eq!(expired["failure_code"], "expired");
}

#[actix_web::test]
async fn collection_only_and_tokens_are_renewed() {
    let (fake, app) = start().await;
    fake.knobs(json!({"token_ttl_s": 600})).await;
    let created = app.initiate(&payment(2_000)).await;
    on_oranges_page(&app, &page(&created), "pay").await;
    app.wait_payment(text(&created["reference"]), "succes").await;
    // Orange Web Payment has no refund and no payout: both refused before anything is reserved.
    assert_error(
        &app.post_refund(text(&created["reference"]), &json!({"montant": 500})).await,
        400,
        "unsupported_provider",
        None,
    );
    let payout = json!({"montant": 1_000, "devise": "XOF", "fournisseur": "orange_money", "beneficiaire_telephone": "+2250700000099"});
    assert_error(&app.post_payout(&payout).await, 400, "invalid_request", Some("montant"));
    assert_eq!(app.balance("XOF").await.0, 1_970);
    // The token expires on Orange's clock: the next call is refused once, then a new token is fetched.
    fake.advance_clock(700).await;
    app.initiate(&payment(1_000)).await;
    assert_eq!(fake.received("POST", "/oauth/v3/token").await.len(), 2, "a fresh token after a 401");
}

/// A refund Orange cannot make goes to the payer as a payout of an adapter that pays Orange's customers in
/// that country (pawaPay here), under the refund's own id, and completes as any refund.
#[actix_web::test]
async fn a_refund_goes_back_through_another_adapters_payout() {
    let port = free_port();
    let orange = Fake::start(&["orange-money", "--listen", "127.0.0.1:0"]);
    let callback = format!("http://127.0.0.1:{port}/v1/notifications/pawapay");
    let pawapay = Fake::start(&[
        "pawapay",
        "--listen",
        "127.0.0.1:0",
        "--token",
        "pawapay-test-token",
        "--payout-callback-url",
        &callback,
    ]);
    let (orange_url, pawapay_url) = (orange.base.clone(), pawapay.base.clone());
    let app = spawn_app_with(move |s| {
        s.environment = Environment::Production;
        s.listen = format!("127.0.0.1:{port}").parse().expect("a loopback address");
        s.public_url = format!("http://127.0.0.1:{port}");
        s.adapters.orange_money = Some(OrangeSettings {
            token_url: format!("{orange_url}/oauth/v3/token"),
            base_url: orange_url,
            country: "dev".into(),
            client_id: "fake-orange-client-id".into(),
            client_secret: Secret::new("fake-orange-client-secret".into()),
            merchant_key: Secret::new("fake-orange-merchant-key".into()),
        });
        s.adapters.pawapay = Some(caisse::config::PawapaySettings {
            base_url: pawapay_url,
            api_token: Secret::new("pawapay-test-token".into()),
            require_signatures: false,
        });
        for p in &mut s.providers {
            if p.code.as_str() == "orange_money" {
                p.adapter = Some("orange_money".into());
            }
        }
    })
    .await;
    let created = app.initiate(&payment(3_000)).await;
    let reference = text(&created["reference"]).to_owned();
    on_oranges_page(&app, &page(&created), "pay").await;
    app.wait_payment(&reference, "succes").await;
    app.initiate(&payment(3_000)).await; // a second payment's page left alone; its funds are not needed
    app.post_refund(&reference, &json!({"montant": 1_000})).await.expect(200);
    let refunded = app.wait_refund(&reference, "succes").await;
    assert_eq!(
        (refunded["statut"].as_str(), refunded["montant_rembourse"].as_i64()),
        (Some("rembourse_partiellement"), Some(1_000))
    );
    let payouts = pawapay.received("POST", "/v2/payouts").await;
    assert_eq!(payouts.len(), 1, "one payout at pawaPay");
    let sent: Value = serde_json::from_str(text(&payouts[0]["body"])).expect("JSON");
    let refund_tx = format!("tx_{}", text(&refunded["remboursement"]["reference"]).trim_start_matches("rmb_"));
    assert_eq!(sent["clientReferenceId"], refund_tx.as_str());
    assert_eq!(sent["recipient"]["accountDetails"]["provider"], "ORANGE_CIV");
    assert_eq!(sent["recipient"]["accountDetails"]["phoneNumber"], "2250700000055");
    assert_eq!(sent["amount"], "1000");
    assert_eq!(app.balance("XOF").await.0, 2_955 - 1_000, "the refund left disponible, its fee kept");
}
