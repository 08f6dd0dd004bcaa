//! A production-mode server routed to pawaPay, against the local pawaPay fake: what the merchant sees through
//! the API, and what pawaPay received.

use caisse::config::{Environment, PawapaySettings, Secret};
use caisse_engine::domain::money::Amount;
use serde_json::{json, Value};

use crate::support::{eventually, free_port, spawn_app_with, text, until, Fake, TestApp, DEADLINE};
use crate::{pay, payment};

const TOKEN: &str = "pawapay-test-token";
/// MTN Benin test numbers of pawaPay's sandbox (the fake follows them).
const COMPLETES: &str = "+22951345789";
const PAYER_NOT_FOUND: &str = "+22951345029";
const STUCK: &str = "+22951345129";
const RECIPIENT_NOT_FOUND: &str = "+22951345089";

/// The fake, and a production server whose mtn_momo, moov_money and orange_money go to it.
pub async fn start() -> (Fake, TestApp) {
    start_with_ttl(crate::support::PAYMENT_TTL_MS).await
}

async fn start_with_ttl(ttl_ms: u64) -> (Fake, TestApp) {
    start_with(move |s| s.payment_ttl_ms = ttl_ms).await
}

/// The fake, and a production server routed to it with `tweak` applied to its settings last.
async fn start_with(tweak: impl FnOnce(&mut caisse::config::Settings) + 'static) -> (Fake, TestApp) {
    start_settling_after(200, tweak).await
}

/// [`start_with`], with the fake settling its transactions `settle_ms` after their creation (a long time
/// leaves each to the test's `complete`).
async fn start_settling_after(
    settle_ms: u64,
    tweak: impl FnOnce(&mut caisse::config::Settings) + 'static,
) -> (Fake, TestApp) {
    let port = free_port();
    let settle = settle_ms.to_string();
    let callback = format!("http://127.0.0.1:{port}/v1/notifications/pawapay");
    let fake = Fake::start(&[
        "pawapay",
        "--listen",
        "127.0.0.1:0",
        "--token",
        TOKEN,
        "--settle-ms",
        &settle,
        "--deposit-callback-url",
        &callback,
        "--payout-callback-url",
        &callback,
        "--refund-callback-url",
        &callback,
    ]);
    let base_url = fake.base.clone();
    let app = spawn_app_with(move |s| {
        s.environment = Environment::Production;
        s.payment_ttl_ms = crate::support::PAYMENT_TTL_MS;
        s.listen = format!("127.0.0.1:{port}").parse().expect("a loopback address");
        s.adapters.pawapay =
            Some(PawapaySettings { base_url, api_token: Secret::new(TOKEN.into()), require_signatures: false });
        for p in &mut s.providers {
            if ["mtn_momo", "moov_money", "orange_money"].contains(&p.code.as_str()) {
                p.adapter = Some("pawapay".into());
            }
        }
        tweak(s);
    })
    .await;
    (fake, app)
}

fn is_uuid_v4(text: &str) -> bool {
    let groups: Vec<&str> = text.split('-').collect();
    groups.iter().map(|g| g.len()).collect::<Vec<_>>() == [8, 4, 4, 4, 12]
        && text.bytes().all(|b| b == b'-' || b.is_ascii_hexdigit())
        && groups[2].starts_with('4')
}

fn body_of(request: &Value) -> Value {
    serde_json::from_str(request["body"].as_str().unwrap_or("null")).unwrap_or(Value::Null)
}

/// Several refunds of one deposit, one at a time, each its own pawaPay refund for its own amount: a part, one
/// pawaPay refuses (its part comes back to `disponible`), then the rest, which leaves the payment `rembourse`.
#[actix_web::test]
async fn several_refunds_of_one_deposit_each_go_to_pawapay() {
    let (fake, app) = start_settling_after(600_000, |_| {}).await;
    let settled = |kind: &'static str, count: usize| {
        let fake = &fake;
        eventually("pawaPay has the transaction", DEADLINE, move || async move {
            let found: Vec<Value> = fake.transactions().await.into_iter().filter(|t| t["kind"] == kind).collect();
            if found.len() == count {
                Ok(found)
            } else {
                Err(format!("{} {kind}s", found.len()))
            }
        })
    };
    let paid = app.initiate(&payment(10_000, COMPLETES)).await;
    let reference = paid["reference"].as_str().expect("a reference").to_owned();
    // A second payment pays for the fees, which a full refund does not return.
    let other = app.initiate(&payment(5_000, COMPLETES)).await;
    for deposit in settled("deposit", 2).await {
        fake.complete(deposit["id"].as_str().expect("an id"), "success", None).await;
    }
    app.wait_payment(&reference, "succes").await;
    app.wait_payment(other["reference"].as_str().expect("a reference"), "succes").await;

    let steps = [
        (Some(3_000), "success", "succes", "rembourse_partiellement"),
        (Some(2_000), "failure", "echec", "rembourse_partiellement"),
        (None, "success", "succes", "rembourse"),
    ];
    for (n, (amount, outcome, refund_status, payment_status)) in steps.into_iter().enumerate() {
        let body = amount.map_or_else(|| json!({}), |a| json!({"montant": a}));
        app.post_refund(&reference, &body).await.expect(200);
        let at_pawapay = settled("refund", n + 1).await;
        fake.complete(at_pawapay[n]["id"].as_str().expect("an id"), outcome, None).await;
        let p = app.wait_refund(&reference, refund_status).await;
        assert_eq!(p["statut"], payment_status, "{p}");
    }
    let p = app.get_ok(&format!("/v1/paiement/{reference}")).await;
    assert_eq!(p["montant_rembourse"], 10_000);
    let statuses: Vec<&str> =
        p["remboursements"].as_array().expect("a list").iter().map(|r| r["statut"].as_str().unwrap_or("")).collect();
    assert_eq!(statuses, ["succes", "echec", "succes"]);
    assert_eq!(app.balance("XOF").await, (9_850 + 4_925 - 10_000, 0, 4_775), "the refused refund's part came back");

    // What pawaPay received: three refunds of the one deposit, each its own id, for its own amount.
    let deposit_id = body_of(&fake.received("POST", "/v2/deposits").await[0])["depositId"].clone();
    let sent: Vec<Value> = fake.received("POST", "/v2/refunds").await.iter().map(body_of).collect();
    let amounts: Vec<&str> = sent.iter().map(|r| r["amount"].as_str().unwrap_or("")).collect();
    assert_eq!(amounts, ["3000", "2000", "7000"]);
    assert!(sent.iter().all(|r| r["depositId"] == deposit_id), "{sent:?}");
    let ids: std::collections::BTreeSet<&str> = sent.iter().map(|r| r["refundId"].as_str().unwrap_or("")).collect();
    assert_eq!(ids.len(), 3, "{sent:?}");
}

#[actix_web::test]
async fn a_payment_completes_and_credits_once_even_with_duplicated_callbacks() {
    let (fake, app) = start().await;
    fake.knobs(json!({"callbacks": "duplicate"})).await;
    let paid = pay(&app, 1_000, COMPLETES, "succes").await;
    assert_eq!((paid["montant"].as_i64(), paid["montant_net"].as_i64()), (Some(1_000), Some(985)));
    // Let the duplicated callbacks arrive, then check nothing moved twice.
    actix_web::rt::time::sleep(std::time::Duration::from_millis(700)).await;
    assert_eq!(app.balance("XOF").await, (985, 0, 985));

    // What pawaPay received: exactly the protocol's deposit.
    let deposits = fake.received("POST", "/v2/deposits").await;
    assert_eq!(deposits.len(), 1, "one request: {deposits:?}");
    let headers = &deposits[0]["headers"];
    assert_eq!(headers["authorization"], format!("Bearer {TOKEN}"));
    let sent = body_of(&deposits[0]);
    let deposit_id = sent["depositId"].as_str().expect("depositId");
    assert!(is_uuid_v4(deposit_id), "{deposit_id}");
    assert_eq!(sent["amount"], "1000", "a string without decimals for XOF");
    assert_eq!(sent["currency"], "XOF");
    assert_eq!(sent["payer"]["type"], "MMO");
    assert_eq!(sent["payer"]["accountDetails"]["phoneNumber"], "22951345789", "no '+'");
    assert_eq!(sent["payer"]["accountDetails"]["provider"], "MTN_MOMO_BEN", "the phone's country's provider");
    assert_eq!(sent["clientReferenceId"], paid["transaction_id"]);
    assert_eq!(fake.transactions().await.len(), 1);
}

/// The provider's reference and the route are kept with the transaction and shown on the dashboard; a change
/// of the routes afterwards does not move a waiting transaction's queries to another adapter.
#[actix_web::test]
async fn the_route_and_pawapays_reference_are_kept_and_shown() {
    let (fake, app) = start().await;
    let paid = pay(&app, 1_000, COMPLETES, "succes").await;
    let tx = paid["transaction_id"].as_str().expect("a transaction id");
    let at_pawapay = fake.transactions().await;
    let given = at_pawapay[0]["provider_reference"].as_str().expect("pawaPay gave a reference").to_owned();
    let trail = app.state.engine.provider_trail(tx).expect("readable");
    assert_eq!(trail.route.as_ref().map(|r| r.adapter.as_str()), Some("pawapay"));
    assert_eq!(trail.reference.as_ref().map(|r| r.as_str()), Some(given.as_str()));

    let reference = paid["reference"].as_str().expect("a reference");
    app.post_refund(reference, &json!({"montant": 400})).await.expect(200);
    let refunded = app.wait_refund(reference, "succes").await;
    let refund_tx = caisse_engine::domain::records::sibling_transaction_id(
        refunded["remboursement"]["reference"].as_str().expect("a refund reference"),
    );
    let refund_trail = app.state.engine.provider_trail(&refund_tx).expect("readable");
    assert_eq!(refund_trail.route.map(|r| r.adapter.as_str().to_owned()).as_deref(), Some("pawapay"));
    assert!(refund_trail.reference.is_some(), "the refund's reference is kept too");

    let mut agent = app.logged_in().await;
    let page = agent.get(&format!("/transactions/{reference}")).await;
    page.expect(200).contains("Côté fournisseur").contains("pawapay").contains(&given);
}

#[actix_web::test]
async fn a_return_url_is_checked_and_kept() {
    let (_fake, app) = start().await;
    let mut body = payment(1_000, COMPLETES);
    body["url_retour"] = json!("http://shop.example/merci");
    let refused = app.post_payment(&body).await;
    refused.expect(400);
    let error = &refused.json["error"];
    assert_eq!((error["code"].as_str(), error["field"].as_str()), (Some("invalid_request"), Some("url_retour")));
    body["url_retour"] = json!("https://shop.example/merci?commande=42");
    let created = app.initiate(&body).await;
    let trail = app.state.engine.provider_trail(created["transaction_id"].as_str().expect("tx")).expect("readable");
    let kept = trail.route.and_then(|r| r.return_url).map(|u| u.as_str().to_owned());
    assert_eq!(kept.as_deref(), Some("https://shop.example/merci?commande=42"));
    assert!(created.get("url_retour").is_none(), "not part of the payment object");
}

/// pawaPay's own limits (its `active-conf`) refuse an amount the configuration would let through, before
/// anything is created, with a message naming them.
#[actix_web::test]
async fn pawapays_published_limits_refuse_an_amount_before_anything_is_created() {
    let (fake, app) = start_with(|s| {
        for p in &mut s.providers {
            let xof = caisse_engine::domain::money::Currency::parse("XOF").expect("XOF");
            let wide = (Amount::positive(1).expect("1"), Amount::positive(10_000_000).expect("10 M"));
            p.limits.insert(xof, wide);
        }
    })
    .await;
    until("pawaPay's active-conf is asked for", || async { !fake.received("GET", "/v2/active-conf").await.is_empty() })
        .await;
    // Its answer is read a moment after the fake saw the request.
    let refused = eventually("a payment below pawaPay's minimum is refused", DEADLINE, || async {
        let answer = app.post_payment(&payment(50, COMPLETES)).await;
        if answer.status == 400 {
            Ok(answer)
        } else {
            Err(format!("answered {}", answer.status))
        }
    })
    .await;
    let error = &refused.json["error"];
    assert_eq!((error["code"].as_str(), error["field"].as_str()), (Some("invalid_request"), Some("montant")));
    assert!(error["message"].as_str().unwrap_or_default().contains("at least 100"), "{error}");
    let payout =
        json!({"montant": 3_000_000, "devise": "XOF", "fournisseur": "mtn_momo", "beneficiaire_telephone": COMPLETES});
    let refused = app.post_payout(&payout).await;
    refused.expect(400);
    assert!(refused.json["error"]["message"].as_str().unwrap_or_default().contains("at most"), "{}", refused.json);
    assert!(fake.received("POST", "/v2/payouts").await.is_empty(), "nothing above the maximum reached pawaPay");
    pay(&app, 150, COMPLETES, "succes").await;
}

#[actix_web::test]
async fn a_500_from_pawapay_after_creating_still_ends_succes_with_one_transaction() {
    let (fake, app) = start().await;
    fake.knobs(json!({"create_500_but_created": 1})).await;
    pay(&app, 2_000, COMPLETES, "succes").await;
    let deposits = fake.received("POST", "/v2/deposits").await;
    assert!(deposits.len() >= 2, "the 500 was retried: {deposits:?}");
    let ids: std::collections::BTreeSet<String> =
        deposits.iter().map(|d| body_of(d)["depositId"].as_str().unwrap_or_default().to_owned()).collect();
    assert_eq!(ids.len(), 1, "always the same depositId");
    assert_eq!(fake.transactions().await.len(), 1, "one transaction at pawaPay");
    assert_eq!(app.balance("XOF").await.0, 1_970);
}

#[actix_web::test]
async fn a_payer_without_an_account_ends_echec_with_its_code() {
    let (_fake, app) = start().await;
    let failed = pay(&app, 1_000, PAYER_NOT_FOUND, "echec").await;
    assert_eq!(failed["failure_code"], "payer_not_found");
    assert_eq!(app.balance("XOF").await, (0, 0, 0));
}

#[actix_web::test]
async fn a_forged_callback_never_credits_and_unknown_ones_are_ignored() {
    let (fake, app) = start().await;
    let created = app.initiate(&payment(1_000, STUCK)).await;
    let reference = created["reference"].as_str().expect("a reference").to_owned();
    let tx = created["transaction_id"].as_str().expect("a transaction id").to_owned();
    let deposit_id = caisse_engine::domain::ids::uuid_of(&tx).expect("our id as a UUID");
    let callback = |body: Value| app.post("/v1/notifications/pawapay").no_auth().json(&body);

    // Claims success, but pawaPay's own status says otherwise: nothing moves.
    let forged = json!({"depositId": deposit_id, "clientReferenceId": tx, "status": "COMPLETED"});
    app.send(callback(forged)).await.expect(200);
    assert_ne!(app.get_payment(&reference).await["statut"], "succes");
    assert_eq!(app.balance("XOF").await.0, 0);
    // Names our transaction under another pawaPay id: refused.
    let other =
        json!({"depositId": "6f1c2a4e-0000-4000-8000-000000000000", "clientReferenceId": tx, "status": "COMPLETED"});
    app.send(callback(other)).await.expect(401);
    // About something that is not ours: acknowledged so pawaPay stops, and nothing changes.
    let foreign = json!({"depositId": "6f1c2a4e-0000-4000-8000-000000000001", "status": "COMPLETED"});
    app.send(callback(foreign)).await.expect(200);
    assert_eq!(app.balance("XOF").await, (0, 0, 0));
    assert_eq!(fake.transactions().await.len(), 1);
}

/// A callback about a payment that has ended asks pawaPay nothing: there is nothing to learn, and callbacks
/// anyone can send must not turn into queries that hold up everyone's payments.
#[actix_web::test]
async fn a_callback_about_a_payment_that_ended_asks_pawapay_nothing() {
    let (fake, app) = start().await;
    let paid = pay(&app, 1_000, COMPLETES, "succes").await;
    let tx = text(&paid["transaction_id"]).to_owned();
    let deposit_id = caisse_engine::domain::ids::uuid_of(&tx).expect("our id as a UUID");
    let status_path = format!("/v2/deposits/{deposit_id}");
    // Whatever confirmed the payment has settled before the count is taken.
    actix_web::rt::time::sleep(std::time::Duration::from_millis(300)).await;
    let asked = fake.received("GET", &status_path).await.len();
    let forged = json!({"depositId": deposit_id, "clientReferenceId": tx, "status": "FAILED"});
    for _ in 0..5 {
        app.send(app.post("/v1/notifications/pawapay").no_auth().json(&forged)).await.expect(200);
    }
    assert_eq!(fake.received("GET", &status_path).await.len(), asked, "no status query");
    assert_eq!(app.get_payment(text(&paid["reference"])).await["statut"], "succes");
    assert_eq!(app.balance("XOF").await.0, 985);
}

/// With signatures required, an unsigned callback is refused before anything is read, and signed ones still
/// complete payments.
#[actix_web::test]
async fn with_signatures_required_an_unsigned_callback_is_refused() {
    let (fake, app) = start_with(|s| {
        if let Some(pawapay) = s.adapters.pawapay.as_mut() {
            pawapay.require_signatures = true;
        }
    })
    .await;
    let unsigned = json!({"depositId": "6f1c2a4e-0000-4000-8000-000000000001", "status": "COMPLETED"});
    app.send(app.post("/v1/notifications/pawapay").no_auth().json(&unsigned)).await.expect(401);
    fake.knobs(json!({"signed": true})).await;
    pay(&app, 1_000, COMPLETES, "succes").await;
}

#[actix_web::test]
async fn without_callbacks_a_payment_completes_by_polling() {
    let (fake, app) = start().await;
    fake.knobs(json!({"callbacks": "never"})).await;
    pay(&app, 1_000, COMPLETES, "succes").await;
    assert_eq!(app.balance("XOF").await.0, 985);
}

#[actix_web::test]
async fn payouts_are_sent_and_refusals_come_back_with_their_reason() {
    let (fake, app) = start().await;
    pay(&app, 10_000, COMPLETES, "succes").await;
    let payout = |phone: &str| json!({"montant": 1_000, "devise": "XOF", "fournisseur": "mtn_momo", "beneficiaire_telephone": phone});
    let sent = app.payout(&payout(COMPLETES)).await;
    let sent = app.wait_payout(sent["id"].as_str().expect("an id"), "traite").await;
    assert_eq!(sent["statut"], "traite");
    let payouts = fake.received("POST", "/v2/payouts").await;
    assert_eq!(body_of(&payouts[0])["amount"], "985", "the beneficiary receives montant_net");
    let refused = app.payout(&payout(RECIPIENT_NOT_FOUND)).await;
    let refused = app.wait_payout(refused["id"].as_str().expect("an id"), "rejete").await;
    assert_eq!(refused["motif_rejet"], "recipient_not_found");
    // 9,850 credited, 1,000 + its fee paid out, the refused payout's reservation released.
    assert_eq!(app.balance("XOF").await, (9_850 - 1_000, 0, 9_850 - 1_000));
}

#[actix_web::test]
async fn a_partial_refund_goes_through_pawapay() {
    let (fake, app) = start().await;
    let paid = pay(&app, 5_000, COMPLETES, "succes").await;
    let reference = paid["reference"].as_str().expect("a reference");
    app.post_refund(reference, &json!({"montant": 2_000})).await.expect(200);
    app.wait_refund(reference, "succes").await;
    let refunds = fake.received("POST", "/v2/refunds").await;
    assert_eq!(refunds.len(), 1);
    let sent = body_of(&refunds[0]);
    assert_eq!(sent["amount"], "2000");
    let deposit_id = caisse_engine::domain::ids::uuid_of(paid["transaction_id"].as_str().expect("tx"));
    assert_eq!(sent["depositId"].as_str(), deposit_id.as_deref(), "the refund names the deposit");
    assert!(is_uuid_v4(sent["refundId"].as_str().expect("refundId")));
}

#[actix_web::test]
async fn signed_callbacks_are_verified_against_pawapays_key() {
    // A TTL far away, so that a payment completing quickly completed through its (verified) callback.
    let (fake, app) = start_with_ttl(30_000).await;
    for encoding in ["raw", "der"] {
        fake.knobs(json!({"signed": true, "signature_encoding": encoding})).await;
        pay(&app, 1_000, COMPLETES, "succes").await;
    }
    assert!(!fake.received("GET", "/v2/public-key/http").await.is_empty(), "the key was fetched");

    // A callback signed with another key is refused before anything is read.
    let body = json!({"depositId": "6f1c2a4e-0000-4000-8000-000000000002", "status": "COMPLETED"}).to_string();
    let digest = {
        use base64::Engine as _;
        use sha2::Digest as _;
        format!("sha-512=:{}:", base64::engine::general_purpose::STANDARD.encode(sha2::Sha512::digest(body.as_bytes())))
    };
    let input = r#"sig-pp=("@method" "@authority" "@path" "signature-date" "content-digest" "content-type" "content-length");alg="ecdsa-p256-sha256";keyid="HTTP_EC_P256_KEY:1""#;
    let forged = app
        .post("/v1/notifications/pawapay")
        .no_auth()
        .header("Signature-Date", "2026-11-25T10:00:00Z")
        .header("Content-Digest", &digest)
        .header("Signature-Input", input)
        .header("Signature", &format!("sig-pp=:{}:", "A".repeat(86) + "=="))
        .raw(Some("application/json"), body.clone());
    app.send(forged).await.expect(401);
    // Callbacks naming keys pawaPay never had are refused without asking pawaPay for its keys each time.
    let fetched = fake.received("GET", "/v2/public-key/http").await.len();
    for n in 0..3 {
        let unknown = input.replace("HTTP_EC_P256_KEY:1", &format!("NOT_A_KEY:{n}"));
        let forged = app
            .post("/v1/notifications/pawapay")
            .no_auth()
            .header("Signature-Date", "2026-11-25T10:00:00Z")
            .header("Content-Digest", &digest)
            .header("Signature-Input", &unknown)
            .header("Signature", &format!("sig-pp=:{}:", "A".repeat(86) + "=="))
            .raw(Some("application/json"), body.clone());
        app.send(forged).await.expect(401);
    }
    assert!(fake.received("GET", "/v2/public-key/http").await.len() <= fetched + 1, "at most one fetch a minute");
}

/// pawaPay's Wave providers need the customer's browser: the deposit carries Caisse's return page, and the
/// `authorizationUrl` pawaPay gives becomes the payment's `url_paiement`.
#[actix_web::test]
async fn a_wave_deposit_through_pawapay_answers_its_authorisation_url() {
    let (fake, app) = start_with(|s| {
        s.public_url = format!("http://{}", s.listen);
        for p in &mut s.providers {
            if p.code.as_str() == "wave" {
                p.adapter = Some("pawapay".into());
            }
        }
    })
    .await;
    let created = app
        .initiate(
            &json!({"montant": 1_000, "devise": "XOF", "fournisseur": "wave", "client_telephone": "+221773456789"}),
        )
        .await;
    let tx = created["transaction_id"].as_str().expect("a transaction id").to_owned();
    let url = created["url_paiement"].as_str().expect("an authorisation URL").to_owned();
    assert!(url.starts_with("https://pay.wave.example/fake/"), "{created}");
    assert_eq!(created["statut"], "en_cours");
    let deposits = fake.received("POST", "/v2/deposits").await;
    let sent = body_of(&deposits[0]);
    assert_eq!(sent["payer"]["accountDetails"]["provider"], "WAVE_SEN");
    assert_eq!(sent["successfulUrl"], format!("{}/retour/{tx}", app.address));
    assert_eq!(sent["failedUrl"], sent["successfulUrl"]);
    app.wait_payment(created["reference"].as_str().expect("a reference"), "succes").await;
}
