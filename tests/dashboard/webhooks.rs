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
