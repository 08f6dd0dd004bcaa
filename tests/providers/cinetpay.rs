//! A production-mode server routed to CinetPay, against the local CinetPay fake: a card payment paid on
//! CinetPay's page (the fake's) with the customer fields cards need, signed notifications and their GET ping,
//! polling when they are lost, payouts through the Transfer API (contacts, 805, token renewal), refunds refused.

use caisse::config::{CinetpaySettings, Environment, Secret};
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;

use crate::support::{assert_error, free_port, spawn_app_with, Api, Fake, Resp, TestApp};

const APIKEY: &str = "fake-cinetpay-apikey";
const SITE_ID: &str = "105000000";
const SECRET_KEY: &str = "fake-cinetpay-secret-key";

/// The fake, and a production server whose cards (and Orange Money in Mali) go to it.
async fn start() -> (Fake, TestApp) {
    start_with(true).await
}

/// As [`start`], with or without the Transfer API's credentials.
async fn start_with(transfer: bool) -> (Fake, TestApp) {
    let port = free_port();
    let fake = Fake::start(&["cinetpay", "--listen", "127.0.0.1:0", "--settle-ms", "200"]);
    let base_url = fake.base.clone();
    let app = spawn_app_with(move |s| {
        s.environment = Environment::Production;
        s.listen = format!("127.0.0.1:{port}").parse().expect("a loopback address");
        s.public_url = format!("http://127.0.0.1:{port}");
        s.adapters.cinetpay = Some(CinetpaySettings {
            base_url: base_url.clone(),
            transfer_base_url: base_url,
            apikey: Secret::new(APIKEY.into()),
            site_id: SITE_ID.into(),
            secret_key: Secret::new(SECRET_KEY.into()),
            transfer: transfer.then(|| {
                ("fake-cinetpay-transfer-apikey".into(), Secret::new("fake-cinetpay-transfer-password".into()))
            }),
        });
        for p in &mut s.providers {
            match p.code.as_str() {
                "carte" => p.adapter = Some("cinetpay".into()),
                "orange_money" => {
                    p.routes = vec![caisse::config::Route { countries: vec!["ML".into()], adapter: "cinetpay".into() }]
                }
                _ => {}
            }
        }
    })
    .await;
    (fake, app)
}

/// The requests the fake received for `path`, whatever their query string (the Transfer API's token).
async fn received(fake: &Fake, method: &str, path: &str) -> Vec<Value> {
    let prefix = format!("{path}?");
    fake.requests()
        .await
        .into_iter()
        .filter(|r| r["method"] == method && (r["path"] == path || text(&r["path"]).starts_with(&prefix)))
        .collect()
}

fn card(amount: i64) -> Value {
    json!({"montant": amount, "devise": "XOF", "fournisseur": "carte", "client_telephone": "+22890000055",
        "client_nom": "Awa Koné", "client_email": "awa@example.com"})
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

/// The customer's choice on CinetPay's page; answers the page that sends the browser back.
async fn on_cinetpays_page(app: &TestApp, url: &str, outcome: &str) -> Resp {
    let page =
        Api { address: String::new(), client: awc::Client::builder().disable_redirects().finish(), ..app.api.clone() };
    page.fetch(page.post(url).no_auth().raw(Some("application/x-www-form-urlencoded"), format!("outcome={outcome}")))
        .await
}

#[actix_web::test]
async fn a_card_payment_is_paid_on_cinetpays_page_and_credited_once() {
    let (fake, app) = start().await;
    fake.knobs(json!({"callbacks": "duplicate"})).await;
    let created = app.initiate(&card(5_000)).await;
    let (reference, tx) = (text(&created["reference"]).to_owned(), text(&created["transaction_id"]).to_owned());
    let url = text(&created["url_paiement"]).to_owned();
    assert!(url.starts_with(&format!("{}/pay/", fake.base)), "{created}");
    assert_eq!(created["statut"], "en_cours");

    let inits = fake.received("POST", "/v2/payment").await;
    assert_eq!(inits.len(), 1);
    let sent: Value = serde_json::from_str(text(&inits[0]["body"])).expect("JSON");
    assert_eq!((sent["amount"].as_i64(), sent["transaction_id"].as_str()), (Some(5_000), Some(tx.as_str())));
    assert_eq!(sent["channels"], "CREDIT_CARD");
    assert_eq!((sent["customer_name"].as_str(), sent["customer_surname"].as_str()), (Some("Awa"), Some("Koné")));
    assert_eq!(sent["customer_email"], "awa@example.com");
    assert_eq!(sent["notify_url"], format!("{}/v1/notifications/cinetpay", app.address));
    assert_eq!(sent["return_url"], format!("{}/retour/{tx}", app.address));

    let back = on_cinetpays_page(&app, &url, "pay").await;
    assert!(String::from_utf8_lossy(&back.body).contains(&format!("/retour/{tx}")), "the page posts the browser back");
    let paid = app.wait_payment(&reference, "succes").await;
    assert!(paid["url_paiement"].is_string());
    assert_eq!(app.balance("XOF").await.0, 5_000 - 145, "credited once though notified twice");
    // CinetPay brings the browser back with a POST; without url_retour the page shows the payment.
    let returned = app
        .fetch(
            app.post(&format!("/retour/{tx}"))
                .no_auth()
                .raw(Some("application/x-www-form-urlencoded"), format!("transaction_id={tx}")),
        )
        .await;
    assert_eq!(returned.status, 200);
    assert!(String::from_utf8_lossy(&returned.body).contains("Paiement réussi"));
    // Its notification URL answers CinetPay's GET ping.
    app.send(app.get("/v1/notifications/cinetpay").no_auth()).await.expect(200);
    assert!(!fake.received("POST", "/v2/payment/check").await.is_empty(), "confirmed by /v2/payment/check");
}

#[actix_web::test]
async fn cards_need_a_holder_and_amounts_are_multiples_of_five() {
    let (fake, app) = start().await;
    let mut nameless = card(5_000);
    nameless.as_object_mut().expect("an object").remove("client_nom");
    assert_error(&app.post_payment(&nameless).await, 400, "invalid_request", Some("client_nom"));
    let mut no_email = card(5_000);
    no_email.as_object_mut().expect("an object").remove("client_email");
    assert_error(&app.post_payment(&no_email).await, 400, "invalid_request", Some("client_email"));
    assert_error(&app.post_payment(&card(5_002)).await, 400, "invalid_request", Some("montant"));
    // CinetPay counts in whole units: a card payment in cents (EUR) is refused rather than charged 100 times.
    let mut euros = card(1_050);
    euros["devise"] = json!("EUR");
    assert_error(&app.post_payment(&euros).await, 400, "invalid_request", Some("montant"));
    assert!(fake.received("POST", "/v2/payment").await.is_empty(), "nothing reached CinetPay");
}

fn x_token(fields: &[(&str, String)]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET_KEY.as_bytes()).expect("a key");
    for (_, v) in fields {
        mac.update(v.as_bytes());
    }
    hex::encode(mac.finalize().into_bytes())
}

#[actix_web::test]
async fn notifications_are_authenticated_hints_and_lost_ones_are_polled() {
    let (fake, app) = start().await;
    fake.knobs(json!({"callbacks": "never"})).await;
    let created = app.initiate(&card(1_000)).await;
    let tx = text(&created["transaction_id"]).to_owned();
    // A forged x-token is refused; a right one for an unpaid checkout changes nothing.
    let fields: Vec<(&str, String)> = caisse::providers::cinetpay::NOTIFICATION_FIELDS
        .iter()
        .map(|f| {
            (
                *f,
                match *f {
                    "cpm_site_id" => SITE_ID.to_owned(),
                    "cpm_trans_id" => tx.clone(),
                    _ => String::new(),
                },
            )
        })
        .collect();
    let form = serde_urlencoded::to_string(&fields).expect("a form");
    let post = |token: String| {
        app.post("/v1/notifications/cinetpay")
            .no_auth()
            .header("x-token", &token)
            .raw(Some("application/x-www-form-urlencoded"), form.clone())
    };
    assert_eq!(app.send(post("00".repeat(32))).await.status, 401);
    assert_eq!(app.send(post(x_token(&fields))).await.status, 200);
    assert_eq!(app.get_payment(text(&created["reference"])).await["statut"], "en_cours");
    // Paid with no notification at all: the sweep's status query settles it.
    on_cinetpays_page(&app, text(&created["url_paiement"]), "pay").await;
    app.wait_payment(text(&created["reference"]), "succes").await;
    // Refused on the page: echec with CinetPay's reason.
    let refused = app.initiate(&card(1_000)).await;
    on_cinetpays_page(&app, text(&refused["url_paiement"]), "decline").await;
    let failed = app.wait_payment(text(&refused["reference"]), "echec").await;
    assert_eq!(failed["failure_code"], "payment_failed");
    // A card is not refunded as mobile money to a number nobody checked against the card: refused at once.
    let card_refund = app.post_refund(text(&created["reference"]), &json!({})).await;
    assert_error(&card_refund, 400, "unsupported_provider", None);
    // A refund the engine refuses anyway says why, whatever the way back: a payment not paid is 409, more than
    // the payment is 400 on montant.
    assert_error(&app.post_refund(text(&refused["reference"]), &json!({})).await, 409, "invalid_state", None);
    let above = app.post_refund(text(&created["reference"]), &json!({"montant": 1_000_000})).await;
    assert_error(&above, 400, "invalid_request", Some("montant"));
    // CinetPay has no refund API: a mobile-money payment's refund goes to the payer's phone (the number CinetPay
    // was told to take the money from) through the Transfer API.
    let mobile = app.initiate(&orange_money(1_000)).await;
    let sent: Value =
        serde_json::from_str(text(&received(&fake, "POST", "/v2/payment").await.last().expect("an init")["body"]))
            .expect("JSON");
    assert_eq!((sent["channels"].as_str(), sent["lock_phone_number"].as_bool()), (Some("MOBILE_MONEY"), Some(true)));
    on_cinetpays_page(&app, text(&mobile["url_paiement"]), "pay").await;
    app.wait_payment(text(&mobile["reference"]), "succes").await;
    app.post_refund(text(&mobile["reference"]), &json!({"montant": 500})).await.expect(200);
    let payment = app.wait_refund(text(&mobile["reference"]), "succes").await;
    assert_eq!(payment["statut"], "rembourse_partiellement");
    let sends = received(&fake, "POST", "/v1/transfer/money/send/contact").await;
    let form: Vec<(String, String)> = serde_urlencoded::from_str(text(&sends[0]["body"])).expect("a form");
    let data: Value = serde_json::from_str(&form[0].1).expect("JSON data");
    assert_eq!(
        (data[0]["prefix"].as_str(), data[0]["phone"].as_str(), data[0]["amount"].as_i64()),
        (Some("223"), Some("70000055"), Some(500))
    );
}

/// An Orange Money payment from Mali, which this server routes to CinetPay.
fn orange_money(amount: i64) -> Value {
    json!({"montant": amount, "devise": "XOF", "fournisseur": "orange_money", "client_telephone": "+22370000055"})
}

#[actix_web::test]
async fn without_the_transfer_api_a_refund_is_refused_before_anything_moves() {
    let (fake, app) = start_with(false).await;
    let created = app.initiate(&orange_money(1_000)).await;
    on_cinetpays_page(&app, text(&created["url_paiement"]), "pay").await;
    app.wait_payment(text(&created["reference"]), "succes").await;
    let resp = app.post_refund(text(&created["reference"]), &json!({"montant": 500})).await;
    assert_error(&resp, 400, "unsupported_provider", None);
    assert_eq!(app.get_payment(text(&created["reference"])).await["remboursements"], json!([]));
    assert!(received(&fake, "POST", "/v1/auth/login").await.is_empty());
}

#[actix_web::test]
async fn payouts_add_the_contact_send_once_and_renew_the_token() {
    let (fake, app) = start().await;
    // Funds: a card payment paid on the page.
    let created = app.initiate(&card(20_000)).await;
    on_cinetpays_page(&app, text(&created["url_paiement"]), "pay").await;
    app.wait_payment(text(&created["reference"]), "succes").await;
    let payout = |phone: &str| json!({"montant": 1_000, "devise": "XOF", "fournisseur": "orange_money", "beneficiaire_telephone": phone});
    let sent = app.payout(&payout("+22370000055")).await;
    let sent = app.wait_payout(text(&sent["id"]), "traite").await;
    let contacts = received(&fake, "POST", "/v1/transfer/contact").await;
    assert_eq!(contacts.len(), 1, "the beneficiary is a contact before it is paid");
    let sends = received(&fake, "POST", "/v1/transfer/money/send/contact").await;
    let body: Vec<(String, String)> = serde_urlencoded::from_str(text(&sends[0]["body"])).expect("a form");
    let data: Value = serde_json::from_str(&body[0].1).expect("JSON data");
    assert_eq!(data[0]["client_transaction_id"], sent["transaction_id"]);
    assert_eq!((data[0]["prefix"].as_str(), data[0]["phone"].as_str()), (Some("223"), Some("70000055")));
    assert_eq!(data[0]["amount"], 985, "the beneficiary receives montant_net");
    // CinetPay asks that a transfer's notification URL answer a GET as well.
    let notify = text(&data[0]["notify_url"]).trim_start_matches(&app.address).to_owned();
    assert!(notify.starts_with("/v1/notifications/cinetpay/"), "{notify}");
    app.send(app.get(&notify).no_auth()).await.expect(200);

    // The same client_transaction_id again is 805 at CinetPay: already sent.
    let logins = received(&fake, "POST", "/v1/auth/login").await;
    assert_eq!(logins.len(), 1, "the token is cached");
    // The token lives five minutes: after that a new one is fetched.
    fake.advance_clock(6 * 60).await;
    let rejected = app.payout(&payout("+22370000001")).await;
    let rejected = app.wait_payout(text(&rejected["id"]), "rejete").await;
    assert_eq!(rejected["motif_rejet"], "rejected");
    assert_eq!(received(&fake, "POST", "/v1/auth/login").await.len(), 2, "a fresh token after it expired");
    let token_of = |r: &Value| {
        let path = text(&r["path"]).to_owned();
        path.split("token=").nth(1).map(|t| t.split('&').next().unwrap_or_default().to_owned()).unwrap_or_default()
    };
    let last = received(&fake, "POST", "/v1/transfer/money/send/contact").await.last().cloned().expect("a send");
    let again = fake.api("");
    let replay = again
        .fetch(
            again
                .post(&format!("/v1/transfer/money/send/contact?token={}", token_of(&last)))
                .no_auth()
                .raw(Some("application/x-www-form-urlencoded"), text(&sends[0]["body"]).to_owned()),
        )
        .await;
    assert_eq!(replay.json["code"], 805, "{}", replay.json);
}

/// CinetPay's Transfer API names no currency: it pays in the beneficiary country's. A payout counted in another
/// currency is refused before anything is reserved or sent.
#[actix_web::test]
async fn a_payout_in_another_currency_than_the_beneficiarys_country_is_refused() {
    let (fake, app) = start().await;
    let payout = json!({"montant": 100_000, "devise": "GNF", "fournisseur": "orange_money", "beneficiaire_telephone": "+22370000055"});
    let resp = app.post_payout(&payout).await;
    assert_error(&resp, 400, "invalid_request", Some("montant"));
    assert!(text(&resp.json["error"]["message"]).contains("ML numbers in XOF"), "{}", resp.json);
    assert!(received(&fake, "POST", "/v1/transfer/money/send/contact").await.is_empty());
}

#[actix_web::test]
async fn a_transfer_waiting_for_confirmation_is_still_under_way() {
    let (fake, app) = start().await;
    let created = app.initiate(&card(20_000)).await;
    on_cinetpays_page(&app, text(&created["url_paiement"]), "pay").await;
    app.wait_payment(text(&created["reference"]), "succes").await;
    let (available, ..) = app.balance("XOF").await;
    // The fake's transfer to a phone ending in 02 goes NOS (waiting for confirmation) when it settles, then VAL
    // as long again after, each step notified. Read as a failure, NOS would end the payout `rejete` and give the
    // money back while CinetPay may still send it; the VAL that follows could then change nothing.
    let payout = json!({"montant": 1_000, "devise": "XOF", "fournisseur": "orange_money", "beneficiaire_telephone": "+22370000002"});
    let sent = app.payout(&payout).await;
    let done = app.wait_payout(text(&sent["id"]), "traite").await;
    assert_eq!(done["motif_rejet"], Value::Null, "{done}");
    let checks = received(&fake, "GET", "/v1/transfer/check/money").await;
    assert!(checks.len() >= 2, "the NOS step was checked before the VAL one: {checks:?}");
    assert_eq!(app.balance("XOF").await.0, available - 1_000, "the payout left the balance once");
}
