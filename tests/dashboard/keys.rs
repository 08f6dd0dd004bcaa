//! The "API keys" section: the masked key and its reveal, the roll with its confirmation (the old key stops
//! working on the API at once, webhooks are signed with the new one), and the Webhook URL field validated as
//! docs/api.md § Webhook delivery says, with the reason shown next to the field.

use crate::support::{always, payment_body, reference_of, spawn_app, spawn_app_with, spawn_production_app, Receiver};

#[actix_web::test]
async fn the_key_is_masked_until_revealed() {
    let app = spawn_app().await;
    let key = app.demo.merchant.secret_key.clone();
    let mut agent = app.logged_in().await;
    let page = agent.get("/keys").await;
    page.expect(200).contains("<h1>API keys</h1>").contains("Webhook URL").contains("sk_test_");
    assert!(!page.body.contains(&key), "the full key is not in the page");
    assert!(page.body.contains(&key[key.len() - 4..]), "its last characters are");
    let revealed = agent.post("/keys/reveal", &[("csrf", &page.csrf())]).await;
    revealed.expect(200).contains(&key);
    assert_eq!(revealed.header("cache-control"), Some("no-store"));
}

/// With a grace (`key_roll_grace`), the old key keeps working for the API until it ends, then answers 401;
/// webhooks are signed with the new key from the roll on.
#[actix_web::test]
async fn a_rolled_key_keeps_working_for_its_grace_then_stops() {
    let app = spawn_app_with(|s| s.key_roll_grace_ms = 1_500).await;
    let old = app.demo.merchant.secret_key.clone();
    let receiver = Receiver::start(always(200));
    let mut agent = app.logged_in().await;
    let keys = agent.get("/keys").await;
    agent.post("/keys/webhook", &[("csrf", &keys.csrf()), ("webhook_url", &receiver.url())]).await;
    let confirm = agent.get("/keys/roll").await;
    confirm.expect(200).contains("reste valable pour l'API pendant").contains("1 s");
    agent.post("/keys/roll", &[("csrf", &confirm.csrf()), ("confirmer", "oui")]).await.expect(303);
    let new = app.demo_merchant().secret_key;
    assert_ne!(new, old);
    // The page after the roll says the same as the confirmation: the old key is not refused yet.
    agent.get("/keys?info=cle_changee").await.expect(200).contains("reste valable pour l'API pendant");

    // Within the grace both keys work; the webhook of a payment made with the old key is signed with the new.
    app.send(app.get("/v1/soldes").auth(&old)).await.expect(200);
    app.send(app.get("/v1/soldes").auth(&new)).await.expect(200);
    let reference = reference_of(&app.with_key(&old).pay(1000, "99").await);
    let hit = receiver.wait_for(&reference, "payment.succeeded").await;
    assert!(hit.signed_with(&new) && !hit.signed_with(&old));

    // After it, the old key is refused, saying why.
    crate::support::until("the grace ends", || async {
        app.send(app.get("/v1/soldes").auth(&old)).await.status == 401
    })
    .await;
    let refused = app.send(app.get("/v1/soldes").auth(&old)).await;
    assert!(refused.json["error"]["message"].as_str().unwrap_or_default().contains("replaced"), "{}", refused.json);
    app.send(app.get("/v1/soldes").auth(&new)).await.expect(200);
}

#[actix_web::test]
async fn rolling_the_key_stops_the_old_one_and_signs_webhooks_with_the_new_one() {
    let app = spawn_app().await;
    let old = app.demo.merchant.secret_key.clone();
    let receiver = Receiver::start(always(200));
    let mut agent = app.logged_in().await;
    let keys = agent.get("/keys").await;
    agent.post("/keys/webhook", &[("csrf", &keys.csrf()), ("webhook_url", &receiver.url())]).await;
    app.send(app.get("/v1/soldes").auth(&old)).await.expect(200);

    // The roll asks first; without the confirmation nothing changes.
    let confirm = agent.get("/keys/roll").await;
    confirm.expect(200).contains("l'ancienne cesse de fonctionner immédiatement").contains("confirmer");
    let token = confirm.csrf();
    agent.post("/keys/roll", &[("csrf", &token)]).await.expect(400);
    assert_eq!(app.demo_merchant().secret_key, old);

    agent.post("/keys/roll", &[("csrf", &token), ("confirmer", "oui")]).await.expect_redirect("/keys?info=cle_changee");
    let new = app.demo_merchant().secret_key;
    assert_ne!(new, old);
    assert!(new.starts_with("sk_test_") && new.len() == old.len());
    let page = agent.get("/keys?info=cle_changee").await;
    page.expect(200).contains("Nouvelle clé secrète active").contains("l'ancienne est refusée");
    agent.post("/keys/reveal", &[("csrf", &page.csrf())]).await.contains(&new);

    // The API: the old key is unknown from now on, the new one works.
    let resp = app.send(app.get("/v1/soldes").auth(&old)).await;
    resp.expect(401);
    assert_eq!(resp.json["error"]["code"], "unauthorized");
    app.with_key(&old).post_payment(&payment_body(1000, "99")).await.expect(401);
    app.send(app.get("/v1/soldes").auth(&new)).await.expect(200);

    // The next webhook is signed with the new key.
    let reference = reference_of(&app.with_key(&new).pay(1000, "99").await);
    let hit = receiver.wait_for(&reference, "payment.succeeded").await;
    assert!(hit.signed_with(&new), "signed with the new key");
    assert!(!hit.signed_with(&old));
}

#[actix_web::test]
async fn the_webhook_url_is_validated_with_the_reason_next_to_the_field() {
    let app = spawn_app().await;
    let mut agent = app.logged_in().await;
    let token = agent.get("/keys").await.csrf();
    let cases = [
        ("not a url", "n'est pas une URL absolue valide"),
        ("example.com/hook", "n'est pas une URL absolue valide"),
        ("ftp://example.com/hook", "doit commencer par https://"),
    ];
    for (url, reason) in cases {
        let page = agent.post("/keys/webhook", &[("csrf", &token), ("webhook_url", url)]).await;
        page.expect(400).contains(reason).contains("id=\"webhook_url_error\"").contains("aria-invalid=\"true\"");
        assert!(page.body.contains(&format!("value=\"{url}\"")), "the field keeps what was typed");
    }
    let long = format!("https://example.com/{}", "a".repeat(2100));
    agent.post("/keys/webhook", &[("csrf", &token), ("webhook_url", &long)]).await.expect(400).contains("2048");
    assert_eq!(app.demo_merchant().webhook_url, None, "nothing refused was saved");

    // The sandbox accepts http and loopback; an empty field removes the URL.
    let url = "http://127.0.0.1:9/hook";
    agent
        .post("/keys/webhook", &[("csrf", &token), ("webhook_url", url)])
        .await
        .expect_redirect("/keys?info=webhook_enregistre");
    assert_eq!(app.demo_merchant().webhook_url.as_deref(), Some(url));
    agent.get("/keys?info=webhook_enregistre").await.contains("Webhook URL enregistrée.").contains(url);
    agent.post("/keys/webhook", &[("csrf", &token), ("webhook_url", "  ")]).await.expect(303);
    assert_eq!(app.demo_merchant().webhook_url, None);
}

#[actix_web::test]
async fn production_refuses_http_loopback_and_private_webhook_urls() {
    let app = spawn_production_app().await;
    let mut agent = app.logged_in().await;
    let page = agent.get("/keys").await;
    page.contains("https:// uniquement");
    let token = page.csrf();
    let cases = [
        ("http://example.com/hook", "http:// est refusé"),
        ("https://127.0.0.1/hook", "L'hôte 127.0.0.1 est ou désigne une adresse non publique"),
        ("https://[::1]:8443/hook", "bouclage, privée"),
        ("https://192.0.2.10/hook", "réservée"),
        ("https://10.1.2.3/hook", "L'hôte 10.1.2.3"),
        ("https://192.168.1.10/hook", "privée"),
        ("https://169.254.169.254/latest", "link-local"),
        ("https://0.0.0.0/hook", "non spécifiée"),
    ];
    for (url, reason) in cases {
        let page = agent.post("/keys/webhook", &[("csrf", &token), ("webhook_url", url)]).await;
        page.expect(400).contains(reason).contains("webhook_url_error");
    }
    assert_eq!(app.demo_merchant().webhook_url, None);
    // A public https address is accepted: an address literal, so the check needs no DNS, and this server has no
    // payment that could send anything there.
    let url = "https://9.9.9.9/hook";
    agent.post("/keys/webhook", &[("csrf", &token), ("webhook_url", url)]).await.expect(303);
    assert_eq!(app.demo_merchant().webhook_url.as_deref(), Some(url));
}
