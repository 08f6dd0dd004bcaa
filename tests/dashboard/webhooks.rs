//! Webhook deliveries in the dashboard: a URL saved through the form is where the next webhook goes; the
//! webhooks page lists every notification with its attempts, failed ones first; resend sends one again.

use caisse_engine::domain::records::{DeliveryState, Notification};

use crate::agent::Agent;
use crate::support::{always, reference_of, spawn_app, until, Receiver, TestApp};

async fn save_url(app: &TestApp, agent: &mut Agent, url: &str) {
    let token = agent.get("/keys").await.csrf();
    agent.post("/keys/webhook", &[("csrf", &token), ("webhook_url", url)]).await.expect(303);
    assert_eq!(app.demo_merchant().webhook_url.as_deref(), Some(url));
}

/// The demo merchant's notification about `reference` with `event`.
fn notification(app: &TestApp, reference: &str, event: &str) -> Option<Notification> {
    app.notification(&app.demo.merchant.id, reference, event)
}

#[actix_web::test]
async fn a_saved_webhook_url_receives_the_next_delivery() {
    let app = spawn_app().await;
    let key = app.demo.merchant.secret_key.clone();
    let first = Receiver::start(always(200));
    let second = Receiver::start(always(200));
    let mut agent = app.logged_in().await;
    save_url(&app, &mut agent, &first.url()).await;
    let reference = reference_of(&app.pay(2500, "99").await);
    let hit = first.wait_for(&reference, "payment.succeeded").await;
    assert!(hit.signed_with(&key));
    assert_eq!(hit.json()["data"]["montant"], 2500);

    // Change the URL: the next payment's webhooks go to the new receiver only.
    save_url(&app, &mut agent, &second.url()).await;
    let before = first.hits().len();
    let reference = reference_of(&app.pay(3000, "99").await);
    second.wait_for(&reference, "payment.succeeded").await;
    assert_eq!(first.hits().len(), before, "nothing more went to the old URL");
    // The receiver sees the delivery a moment before the attempt's outcome is stored.
    let stored = || notification(&app, &reference, "payment.succeeded").is_some_and(|n| !n.attempts.is_empty());
    until("the attempt is stored", || std::future::ready(stored())).await;

    // The deliveries show on the payment's page and on the webhooks page, with their attempts.
    let detail = agent.get(&format!("/transactions/{reference}")).await;
    detail.expect(200).contains("payment.succeeded").contains("livré");
    let page = agent.get("/webhooks").await;
    page.expect(200).contains(&reference).contains("payment.succeeded").contains(&second.url());
    page.contains("Statut HTTP").contains("Latence").contains("Chaîne signée (début)");
    let n = notification(&app, &reference, "payment.succeeded").expect("notification");
    let attempt = n.attempts.last().expect("an attempt");
    // The start of the signed string: `timestamp.body` (docs/api.md § Webhook signature), HTML-escaped in the page.
    let signed = format!("{}.{{&quot;event&quot;:&quot;payment.succeeded&quot;", attempt.at.unix_s());
    page.contains(&signed);
}

#[actix_web::test]
async fn failed_deliveries_come_first_and_can_be_resent() {
    let app = spawn_app().await;
    let key = app.demo.merchant.secret_key.clone();
    let receiver = Receiver::start(always(500));
    let mut agent = app.logged_in().await;
    save_url(&app, &mut agent, &receiver.url()).await;
    let reference = reference_of(&app.pay(4000, "99").await);
    // Two attempts (the test schedule has one retry after 100 ms), both answered 500: the notification ends failed.
    until("payment.succeeded failed", || async {
        notification(&app, &reference, "payment.succeeded").is_some_and(|n| n.state == DeliveryState::Failed)
    })
    .await;
    let failed = notification(&app, &reference, "payment.succeeded").expect("notification");
    assert_eq!(failed.total_attempts, 2);

    let page = agent.get("/webhooks").await;
    page.expect(200).contains("En échec (");
    let failed_section = page.body.find("id=\"failed\"").expect("failed section");
    let others = page.body.find("id=\"notifications\"").expect("other section");
    let card = page.body.find(&format!("id=\"{}\"", failed.id)).expect("the failed card");
    assert!(failed_section < card && card < others, "failed notifications come first");
    page.contains("en échec").contains(">500<").contains(" ms");
    agent.get("/").await.contains("id=\"failed-count\">");

    // Resend: refused without the token, and for a notification of another merchant.
    let token = page.csrf();
    let resend = format!("/webhooks/{}/resend", failed.id);
    agent.post(&resend, &[]).await.expect(403);
    let other = app.create_merchant("Autre", None).await;
    let mut intruder = app.agent();
    intruder.login(&other.merchant.email, &other.password).await.expect(303);
    let their_token = intruder.get("/webhooks").await.csrf();
    intruder.post(&resend, &[("csrf", &their_token)]).await.expect(404);
    agent.post("/webhooks/evt_01JD0000000000000000000000/resend", &[("csrf", &token)]).await.expect(404);
    agent.post("/webhooks/not-an-id/resend", &[("csrf", &token)]).await.expect(404);

    // The receiver is fixed; resend delivers.
    receiver.answer(200);
    let before = receiver.hits().len();
    agent.post(&resend, &[("csrf", &token)]).await.expect_redirect("/webhooks?info=renvoye");
    until("resent notification delivered", || async {
        notification(&app, &reference, "payment.succeeded").is_some_and(|n| n.state == DeliveryState::Delivered)
    })
    .await;
    let hits = receiver.hits();
    assert!(hits.len() > before);
    let last = hits.last().expect("a hit");
    assert_eq!(last.json()["data"]["reference"], reference.as_str());
    assert!(last.signed_with(&key));
    let page = agent.get("/webhooks?info=renvoye").await;
    page.contains("Notification renvoyée");
    let others = page.body.find("id=\"notifications\"").expect("other section");
    let card = page.body.find(&format!("id=\"{}\"", failed.id)).expect("the card");
    assert!(card > others, "a delivered notification leaves the failed section");
    assert_eq!(notification(&app, &reference, "payment.succeeded").expect("n").total_attempts, 3);
}

/// A test notification goes to the saved URL now, signed by both schemes, and its attempt is shown; a
/// receiver that does not answer 200 is said so, and without a URL there is nothing to test.
#[actix_web::test]
async fn a_test_event_is_signed_sent_and_its_attempt_shown() {
    let app = spawn_app().await;
    let key = app.demo.merchant.secret_key.clone();
    let mut agent = app.logged_in().await;
    let token = agent.get("/webhooks").await.expect(200).contains("Envoyer un événement de test").csrf();
    agent.post("/webhooks/test", &[("csrf", &token)]).await.expect(400).contains("Aucune Webhook URL");

    let receiver = Receiver::start(always(200));
    save_url(&app, &mut agent, &receiver.url()).await;
    let page = agent.post("/webhooks/test", &[("csrf", &token)]).await;
    page.expect(200).contains("répondu 200").contains("webhook.test").contains(&receiver.url());
    let hits = receiver.hits();
    assert_eq!(hits.len(), 1, "one attempt, never retried");
    let hit = &hits[0];
    assert_eq!(hit.event(), "webhook.test");
    assert!(hit.signed_with(&key), "both signatures: {:?}", hit.headers);
    assert!(hit.webhook_id().starts_with("evt_") && page.body.contains(hit.webhook_id()), "{}", page.body);
    let data = hit.json()["data"].clone();
    assert_eq!(data.as_object().map(|d| d.len()), Some(11), "the usual eleven fields: {data}");
    assert_eq!((data["montant"].as_i64(), data["statut"].as_str()), (Some(0), Some("test")));
    assert!(app.notifications(&app.demo.merchant.id).is_empty(), "a test notification is not stored");

    receiver.answer(500);
    let page = agent.post("/webhooks/test", &[("csrf", &token)]).await;
    page.expect(502).contains("n'a pas répondu 200").contains("500");
    assert_eq!(receiver.hits().len(), 2);
}

/// Every notification of a range is sent again, each attempt logged on its notification, with the webhook-id
/// it had; the progress page counts them; bad ranges are refused.
#[actix_web::test]
async fn a_range_is_replayed_notification_by_notification() {
    let app = spawn_app().await;
    let key = app.demo.merchant.secret_key.clone();
    let receiver = Receiver::start(always(200));
    let mut agent = app.logged_in().await;
    save_url(&app, &mut agent, &receiver.url()).await;
    for amount in [2_500, 3_000] {
        app.pay(amount, "99").await;
    }
    let merchant = app.demo.merchant.id.clone();
    let delivered = |n: &Notification| n.state == DeliveryState::Delivered && n.total_attempts == 1;
    until("six notifications delivered", || {
        std::future::ready(app.notifications(&merchant).iter().filter(|n| delivered(n)).count() == 6)
    })
    .await;
    let token = agent.get("/webhooks").await.csrf();
    for (from, to, says) in [("hier", "2026-01-01", "AAAA-MM-JJ"), ("2026-02-02", "2026-02-01", "finit avant")] {
        agent.post("/webhooks/replay", &[("csrf", &token), ("du", from), ("au", to)]).await.expect(400).contains(says);
    }

    let today = caisse_engine::domain::time::Timestamp::now().to_rfc3339()[..10].to_owned();
    let started = agent.post("/webhooks/replay", &[("csrf", &token), ("du", &today), ("au", &today)]).await;
    started.expect_redirect("/webhooks/replay");
    until("every notification delivered twice", || {
        std::future::ready(app.notifications(&merchant).iter().all(|n| n.total_attempts == 2))
    })
    .await;
    let page = agent.get("/webhooks/replay").await;
    page.expect(200).contains("data-total=\"6\"").contains("data-handled=\"6\"");
    let hits = receiver.hits();
    assert_eq!(hits.len(), 12, "each notification twice");
    for n in app.notifications(&merchant) {
        let mine: Vec<_> = hits.iter().filter(|h| h.webhook_id() == n.id).collect();
        assert_eq!(mine.len(), 2, "{}: sent again under its own id", n.id);
        assert!(mine.iter().all(|h| h.signed_with(&key) && h.body == n.body.as_bytes()));
        assert!(n.attempts.iter().all(|a| a.http_status == Some(200)), "each attempt logged: {:?}", n.attempts);
    }
}
