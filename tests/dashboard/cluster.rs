//! The dashboard on the nodes of a cluster: a session opened on one node is valid on the other, a logout on
//! either ends it on both, what a merchant does through one node (a payment) shows on the other's pages, and
//! failed logins spread over the nodes are counted as one node would count them.

use crate::agent::Agent;
use crate::support::postgres;
use crate::support::{caisse_beside, spawn_cluster_node, text};
use caisse::dashboard::auth::MAX_FAILURES;

#[actix_web::test]
async fn a_session_opened_on_one_node_is_valid_on_the_other_until_a_logout_on_either() {
    let db = postgres::database();
    let a = spawn_cluster_node(&db, "node-a").await;
    let b = spawn_cluster_node(&db, "node-b").await;
    let on_a = format!("http://127.0.0.1:{}", a.port);
    let on_b = format!("http://127.0.0.1:{}", b.port);

    let mut first = Agent::new(&on_a);
    let page = first.login(a.email(), a.password()).await;
    assert_eq!(page.status, 303, "logged in on node a: {}", page.body);
    let mut second = Agent::new(&on_b);
    second.cookies = first.cookies.clone();
    let home = second.get("/").await;
    assert_eq!(home.status, 200, "node b knows the session node a opened");

    // A payment through node b's API shows on node a's pages: one merchant, one ledger.
    let paid = a.api.with_base(&on_b).pay(12_500, "55").await;
    let reference = text(&paid["reference"]).to_owned();
    a.wait_payment(&reference, "succes").await;
    let list = first.get("/transactions").await;
    assert!(list.body.contains(&reference), "node a lists the payment made through node b");

    // The logout goes to node b; node a's next page asks for a login.
    let logout = second.post("/logout", &[("csrf", &home.csrf())]).await;
    assert_eq!(logout.status, 303);
    let after = first.get("/").await;
    assert_eq!(after.status, 303, "the session ended on node a too");
    assert_eq!(after.location.as_deref(), Some("/login"));
}

/// A guesser alternating between the nodes meets the limit one node sets: the attempts are counted in the
/// shared database. Sent in parallel to both nodes, at most the limit of passwords is checked; the merchant,
/// from its own address, still logs in on either node.
#[actix_web::test]
async fn failed_logins_spread_over_the_nodes_are_counted_once() {
    let db = postgres::database();
    let a = spawn_cluster_node(&db, "node-a").await;
    let b = spawn_cluster_node(&db, "node-b").await;
    let nodes = [format!("http://127.0.0.1:{}", a.port), format!("http://127.0.0.1:{}", b.port)];

    let guesser: std::net::IpAddr = "127.0.0.5".parse().expect("an address");
    for n in 0..MAX_FAILURES as usize {
        Agent::from_address(&nodes[n % 2], guesser).login(a.email(), "wrong password").await.expect(401);
    }
    for node in &nodes {
        let page = Agent::from_address(node, guesser).login(a.email(), a.password()).await;
        page.expect(429).contains("Trop de tentatives");
    }

    let parallel: std::net::IpAddr = "127.0.0.6".parse().expect("an address");
    let attempts = (0..4 * MAX_FAILURES as usize).map(|n| {
        let node = nodes[n % 2].clone();
        let email = a.email().to_owned();
        async move { Agent::from_address(&node, parallel).login(&email, "wrong password").await.status }
    });
    let statuses = futures_util::future::join_all(attempts).await;
    assert!(statuses.iter().all(|s| [401, 429, 503].contains(s)), "{statuses:?}");
    let checked = statuses.iter().filter(|s| **s == 401).count();
    assert!((1..=MAX_FAILURES as usize).contains(&checked), "{checked} passwords checked: {statuses:?}");

    let own: std::net::IpAddr = "127.0.0.7".parse().expect("an address");
    for node in &nodes {
        Agent::from_address(node, own).login(a.email(), a.password()).await.expect_redirect("/");
    }
}

/// `caisse merchant reset-password` run beside the nodes, on the shared database: the merchant's dashboard
/// sessions end on every node, as a reset of an account someone else got into must do.
#[actix_web::test]
async fn a_password_reset_made_on_the_database_ends_the_sessions_of_every_node() {
    let db = postgres::database();
    let a = spawn_cluster_node(&db, "node-a").await;
    let b = spawn_cluster_node(&db, "node-b").await;
    let mut on_a = Agent::new(&format!("http://127.0.0.1:{}", a.port));
    on_a.login(a.email(), a.password()).await.expect_redirect("/");
    let mut on_b = Agent::new(&format!("http://127.0.0.1:{}", b.port));
    on_b.cookies = on_a.cookies.clone();
    on_b.get("/").await.expect(200);

    let work = tempfile::tempdir().expect("work dir");
    let output = caisse_beside(&db, work.path())
        .args(["merchant", "reset-password", a.demo_merchant().id.as_str()])
        .output()
        .expect("caisse runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    for agent in [&mut on_a, &mut on_b] {
        agent.get("/").await.expect_redirect("/login");
    }
}

/// A resend asked on a node that does not deliver the merchant's notifications goes to the node that does: while
/// it attempts that very notification the resend is answered "en cours", rather than saved and then overwritten
/// by the attempt's outcome; afterwards it is sent again.
#[actix_web::test]
async fn a_resend_on_another_node_during_the_holders_attempt_is_answered_in_flight() {
    use crate::support::receiver::{script, Receiver, Reply};
    use std::time::Duration;

    let db = postgres::database();
    let a = spawn_cluster_node(&db, "node-a").await;
    let b = spawn_cluster_node(&db, "node-b").await;
    let receiver = Receiver::start(script(|hit, earlier| {
        if hit.event() == "payment.initiated" && earlier == 0 {
            Reply::Hang(Duration::from_secs(6))
        } else {
            Reply::Status(200)
        }
    }));
    let mut on_a = Agent::new(&format!("http://127.0.0.1:{}", a.port));
    on_a.login(a.email(), a.password()).await.expect_redirect("/");
    let token = on_a.get("/keys").await.csrf();
    on_a.post("/keys/webhook", &[("csrf", &token), ("webhook_url", &receiver.url())]).await.expect(303);

    let merchant = a.demo.merchant.id.clone();
    let reference = text(&a.api.pay(4_000, "55").await["reference"]).to_owned();
    receiver.wait("the first attempt", Duration::from_secs(15), |hits| !hits.is_empty()).await;
    let initiated = a.notification(&merchant, &reference, "payment.initiated").expect("the notification");
    let elsewhere = if a.state.engine.holds(&merchant) { &b } else { &a };
    assert!(!elsewhere.state.engine.holds(&merchant), "one node holds the merchant");
    let mut agent = Agent::new(&format!("http://127.0.0.1:{}", elsewhere.port));
    agent.cookies = on_a.cookies.clone();
    let token = agent.get("/webhooks").await.csrf();
    let resend = format!("/webhooks/{}/resend", initiated.id);
    agent.post(&resend, &[("csrf", &token)]).await.expect_redirect("/webhooks?info=en_cours");
    // Once its attempts are over, a resend asked on that node is made by the node that delivers the merchant's
    // notifications (forwarded to it): answered "renvoye", and sent once more.
    let holder = if elsewhere.port == a.port { &b } else { &a };
    crate::support::until("the notification delivered", || {
        let n = holder.notification_by_id(&merchant, &initiated.id);
        std::future::ready(n.state == caisse_engine::domain::records::DeliveryState::Delivered)
    })
    .await;
    let sent = |hits: &[crate::support::receiver::Hit]| {
        hits.iter().filter(|h| h.event() == "payment.initiated" && h.reference() == reference).count()
    };
    let before = sent(&receiver.hits());
    let token = agent.get("/webhooks").await.csrf();
    agent.post(&resend, &[("csrf", &token)]).await.expect_redirect("/webhooks?info=renvoye");
    receiver.wait("the resend", Duration::from_secs(15), |hits| sent(hits) > before).await;
}

/// `caisse merchant suspend` run on the database ends the merchant's sessions on every node: a session held
/// through the suspension does not work again after `resume`.
#[actix_web::test]
async fn a_suspension_made_on_the_database_ends_the_sessions_for_good() {
    let db = postgres::database();
    let a = spawn_cluster_node(&db, "node-a").await;
    let mut agent = Agent::new(&format!("http://127.0.0.1:{}", a.port));
    agent.login(a.email(), a.password()).await.expect_redirect("/");
    let work = tempfile::tempdir().expect("work dir");
    let id = a.demo_merchant().id;
    for command in ["suspend", "resume"] {
        let output = caisse_beside(&db, work.path()).args(["merchant", command, id.as_str()]).output();
        let output = output.expect("caisse runs");
        assert!(output.status.success(), "{command}: {}", String::from_utf8_lossy(&output.stderr));
    }
    agent.get("/").await.expect_redirect("/login");
}
