//! A production-mode server routed to Wave, against the local Wave fake: a payment paid on Wave's page (the
//! fake's), signed webhooks in each form Wave sends them, polling when they are lost, expiry, payouts with
//! their idempotency key, full refunds.

use caisse::config::{Environment, Secret, WaveSettings};
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;

use crate::support::{free_port, spawn_app_with, Api, Fake, Resp, TestApp};

const API_KEY: &str = "wave_sn_prod_fake-api-key";
const SECRET: &str = "wave_sn_WHS_fake-webhook-secret";

/// The fake, and a production server whose `wave` goes to it, Wave's webhooks coming back to it.
async fn start() -> (Fake, TestApp) {
    let port = free_port();
    let webhook_url = format!("http://127.0.0.1:{port}/v1/notifications/wave");
    let fake = Fake::start(&["wave", "--listen", "127.0.0.1:0", "--settle-ms", "200", "--webhook-url", &webhook_url]);
    let base_url = fake.base.clone();
    let app = spawn_app_with(move |s| {
        s.environment = Environment::Production;
        s.listen = format!("127.0.0.1:{port}").parse().expect("a loopback address");
        s.public_url = format!("http://127.0.0.1:{port}");
        s.adapters.wave = Some(WaveSettings {
            base_url,
            api_key: Secret::new(API_KEY.into()),
            webhook_secret: Some(Secret::new(SECRET.into())),
        });
        for p in &mut s.providers {
            if p.code.as_str() == "wave" {
                p.adapter = Some("wave".into());
            }
        }
    })
    .await;
    (fake, app)
}

fn payment(amount: i64, phone: &str) -> Value {
    json!({"montant": amount, "devise": "XOF", "fournisseur": "wave", "client_telephone": phone})
}

/// A browser that does not follow redirects, so each 303 is read.
fn browser(app: &TestApp) -> Api {
    Api { client: awc::Client::builder().disable_redirects().finish(), ..app.api.clone() }
}

/// The customer's choice on Wave's page (`pay` or `decline`); answers the redirect back.
async fn on_waves_page(app: &TestApp, url: &str, outcome: &str) -> Resp {
    // The page's full URL is the path of a client with no address of its own.
    let page = Api { address: String::new(), ..browser(app) };
    let form = format!("outcome={outcome}");
    page.fetch(page.post(url).no_auth().raw(Some("application/x-www-form-urlencoded"), form)).await
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

#[actix_web::test]
async fn a_payment_is_paid_on_waves_page_credited_once_and_the_customer_comes_back() {
    let (fake, app) = start().await;
    fake.knobs(json!({"callbacks": "duplicate"})).await;
    let mut body = payment(1_000, "+221770000055");
    body["url_retour"] = json!("https://boutique.example.com/merci");
    let first = app.send(app.post("/v1/paiement/initier").idem("commande-17").json(&body)).await;
    first.expect(201);
    let created = first.json.clone();
    // A retry of the request (a timeout on the merchant's side) answers the same payment, with Wave's page.
    let replay = app.send(app.post("/v1/paiement/initier").idem("commande-17").json(&body)).await;
    replay.expect(201);
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(
        (replay.json["reference"].clone(), replay.json["url_paiement"].clone()),
        (created["reference"].clone(), created["url_paiement"].clone())
    );
    let (reference, tx) = (text(&created["reference"]).to_owned(), text(&created["transaction_id"]).to_owned());
    let url = text(&created["url_paiement"]).to_owned();
    assert!(url.starts_with(&format!("{}/c/cos-", fake.base)), "the merchant gets Wave's page: {created}");
    assert_eq!(created["statut"], "en_cours");

    let sessions = fake.received("POST", "/v1/checkout/sessions").await;
    assert_eq!(sessions.len(), 1);
    assert_eq!(sessions[0]["headers"]["authorization"], format!("Bearer {API_KEY}"));
    let sent: Value = serde_json::from_str(text(&sessions[0]["body"])).expect("JSON");
    assert_eq!((sent["amount"].as_str(), sent["currency"].as_str()), (Some("1000"), Some("XOF")));
    assert_eq!(sent["client_reference"], tx);
    assert_eq!(sent["restrict_payer_mobile"], "+221770000055");
    assert_eq!(sent["success_url"], format!("{}/retour/{tx}", app.address));

    // The customer pays on Wave's page and is sent back through Caisse's return page to the merchant's.
    let back = on_waves_page(&app, &url, "pay").await;
    assert_eq!(back.status, 303);
    let to_caisse = back.header("location").expect("back to Caisse").to_owned();
    assert_eq!(to_caisse, format!("{}/retour/{tx}", app.address));
    let forwarded = browser(&app).fetch(app.get(&format!("/retour/{tx}")).no_auth()).await;
    assert_eq!(forwarded.status, 303);
    assert_eq!(
        forwarded.header("location"),
        Some(format!("https://boutique.example.com/merci?reference={reference}").as_str())
    );

    let paid = app.wait_payment(&reference, "succes").await;
    assert!(paid["url_paiement"].as_str().is_some());
    assert_eq!(app.balance("XOF").await, (990, 0, 990), "credited once though Wave said it twice");
}

/// A webhook signed over `t + body` with `secret` at `t`.
fn signed(secret: &str, t: u64, body: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("a key");
    mac.update(format!("{t}{body}").as_bytes());
    format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()))
}

#[actix_web::test]
async fn webhooks_are_authenticated_and_only_hints() {
    let (fake, app) = start().await;
    // Every form Wave signs in is taken: the documented concatenation, with a dot, during a rotation, a bearer.
    for mode in ["concatenated", "dot", "rotated", "bearer"] {
        fake.knobs(json!({"wave_signature": mode, "callbacks": "once"})).await;
        let created = app.initiate(&payment(1_000, "+221770000055")).await;
        let reference = text(&created["reference"]).to_owned();
        on_waves_page(&app, text(&created["url_paiement"]), "pay").await;
        app.wait_payment(&reference, "succes").await;
    }
    // A forged or stale webhook is refused and changes nothing.
    let created = app.initiate(&payment(2_000, "+221770000055")).await;
    let reference = text(&created["reference"]).to_owned();
    let tx = text(&created["transaction_id"]).to_owned();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("time").as_secs();
    let event = json!({"id": "EV_forged", "type": "checkout.session.completed",
        "data": {"client_reference": tx, "checkout_status": "complete", "payment_status": "succeeded"}})
    .to_string();
    for header in [signed("not the secret", now, &event), signed(SECRET, now - 600, &event)] {
        let resp = app
            .send(
                app.post("/v1/notifications/wave")
                    .no_auth()
                    .header("Wave-Signature", &header)
                    .raw(Some("application/json"), event.clone()),
            )
            .await;
        assert_eq!(resp.status, 401, "{header}");
    }
    let resp = app
        .send(
            app.post("/v1/notifications/wave")
                .no_auth()
                .header("Authorization", "Bearer nope")
                .raw(Some("application/json"), event.clone()),
        )
        .await;
    assert_eq!(resp.status, 401);
    // Signed right, but Wave's session is not paid: the webhook is a hint, the session says "open".
    let resp = app
        .send(
            app.post("/v1/notifications/wave")
                .no_auth()
                .header("Wave-Signature", &signed(SECRET, now, &event))
                .raw(Some("application/json"), event.clone()),
        )
        .await;
    assert_eq!(resp.status, 200);
    assert_eq!(app.get_payment(&reference).await["statut"], "en_cours");
    assert_eq!(app.balance("XOF").await.0, 3_960, "four payments of 1 000 less 1 %, nothing of the forged one");
}

#[actix_web::test]
async fn a_lost_webhook_completes_by_polling_and_an_unpaid_session_expires_at_wave_too() {
    let (fake, app) = start().await;
    fake.knobs(json!({"callbacks": "never"})).await;
    let paid = app.initiate(&payment(1_000, "+221770000055")).await;
    let unpaid = app.initiate(&payment(1_000, "+221770000056")).await;
    on_waves_page(&app, text(&paid["url_paiement"]), "pay").await;
    // A declined attempt leaves the session open: the customer may try again.
    on_waves_page(&app, text(&unpaid["url_paiement"]), "decline").await;
    app.wait_payment(text(&paid["reference"]), "succes").await;
    let expired = app.wait_payment(text(&unpaid["reference"]), "expire").await;
    assert_eq!(expired["failure_code"], "expired");
    let search = format!("/v1/checkout/sessions/search?client_reference={}", text(&unpaid["transaction_id"]));
    let api = fake.api(API_KEY);
    let sessions = api.fetch(api.get(&search)).await;
    assert_eq!(sessions.json["result"][0]["checkout_status"], "expired", "Caisse expired the session at Wave");
    assert!(!fake
        .received(
            "POST",
            &format!("/v1/checkout/sessions/{}/expire", sessions.json["result"][0]["id"].as_str().unwrap_or_default())
        )
        .await
        .is_empty());
    // The expired session cannot be paid any more.
    let late = on_waves_page(&app, text(&unpaid["url_paiement"]), "pay").await;
    assert_eq!(late.status, 409);
    assert_eq!(app.balance("XOF").await.0, 990);
}

#[actix_web::test]
async fn payouts_carry_their_idempotency_key_and_refunds_are_whole() {
    let (fake, app) = start().await;
    let paid = app.initiate(&payment(20_000, "+221770000055")).await;
    on_waves_page(&app, text(&paid["url_paiement"]), "pay").await;
    app.wait_payment(text(&paid["reference"]), "succes").await;
    let other = app.initiate(&payment(10_000, "+221770000057")).await;
    on_waves_page(&app, text(&other["url_paiement"]), "pay").await;
    app.wait_payment(text(&other["reference"]), "succes").await;

    let payout = |phone: &str| json!({"montant": 1_000, "devise": "XOF", "fournisseur": "wave", "beneficiaire_telephone": phone});
    let sent = app.payout(&payout("+221770000099")).await;
    let sent = app.wait_payout(text(&sent["id"]), "traite").await;
    let refused = app.payout(&payout("+221770000001")).await;
    assert_eq!(app.wait_payout(text(&refused["id"]), "rejete").await["motif_rejet"], "insufficient_funds");
    let reversed = app.payout(&payout("+221770000004")).await;
    assert_eq!(app.wait_payout(text(&reversed["id"]), "rejete").await["motif_rejet"], "reversed");

    let posted = fake.received("POST", "/v1/payout").await;
    assert_eq!(posted.len(), 3);
    assert_eq!(posted[0]["headers"]["idempotency-key"], sent["transaction_id"]);
    let body: Value = serde_json::from_str(text(&posted[0]["body"])).expect("JSON");
    assert_eq!((body["receive_amount"].as_str(), body["mobile"].as_str()), (Some("990"), Some("+221770000099")));
    // The same key again is the same payout at Wave; with another body it is refused.
    let api = fake.api(API_KEY);
    let again = |b: &Value| api.post("/v1/payout").header("idempotency-key", text(&sent["transaction_id"])).json(b);
    let replay = api.fetch(again(&body)).await;
    assert_eq!(replay.status, 200);
    assert_eq!(replay.json["client_reference"], sent["transaction_id"]);
    let mut changed = body.clone();
    changed["receive_amount"] = json!("5000");
    assert_eq!(api.fetch(again(&changed)).await.status, 409);

    // A whole refund goes through Wave at once; a refund of part of a payment is refused by Wave's rules.
    let reference = text(&paid["reference"]);
    app.post_refund(reference, &json!({})).await.expect(200);
    app.wait_payment(reference, "rembourse").await;
    // Sent once, then once more as its status query (Wave has no refund to query; its refund is idempotent).
    let refunds =
        fake.received("POST", &format!("/v1/checkout/sessions/{}/refund", session_id(&fake, &paid).await)).await;
    assert_eq!(refunds.len(), 2);
    // 19 800 + 9 900 net collected, 1 000 paid out (the refused payouts gave theirs back), 20 000 refunded.
    assert_eq!(app.balance("XOF").await.0, 29_700 - 1_000 - 20_000, "refunded out of disponible");
    // Part of a payment goes back to the payer as a Wave payout under the refund's own id.
    let other_reference = text(&other["reference"]);
    app.post_refund(other_reference, &json!({"montant": 4_000})).await.expect(200);
    let refunded = app.wait_refund(other_reference, "succes").await;
    assert_eq!(
        (refunded["statut"].as_str(), refunded["montant_rembourse"].as_i64()),
        (Some("rembourse_partiellement"), Some(4_000))
    );
    let refund_tx = format!("tx_{}", text(&refunded["remboursement"]["reference"]).trim_start_matches("rmb_"));
    let payouts = fake.received("POST", "/v1/payout").await;
    let as_payout = payouts
        .iter()
        .find(|p| p["headers"]["idempotency-key"] == refund_tx.as_str())
        .expect("a payout for the refund");
    let body: Value = serde_json::from_str(text(&as_payout["body"])).expect("JSON");
    assert_eq!((body["receive_amount"].as_str(), body["mobile"].as_str()), (Some("4000"), Some("+221770000057")));
}

async fn session_id(fake: &Fake, payment: &Value) -> String {
    let api = fake.api(API_KEY);
    let found = api
        .fetch(api.get(&format!("/v1/checkout/sessions/search?client_reference={}", text(&payment["transaction_id"]))))
        .await;
    text(&found.json["result"][0]["id"]).to_owned()
}
