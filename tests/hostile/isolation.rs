//! Merchant isolation: merchant A, logged in or holding its key, never reaches merchant B's records.
//!
//! B gets one of everything (payments with customer details, a refund, a payout, webhook notifications) and
//! A a few records of its own, one under the same merchant reference as B's. Then A walks every route of the
//! API ([`caisse::http::ROUTES`]) and of the dashboard ([`caisse::dashboard::ROUTES`]), putting each of B's
//! identifiers where the route takes one: each is 404 (docs/api.md § Errors: also when it belongs to another
//! merchant), and no answer A gets, list or page, shows anything of B's. The walk fails on a route it does
//! not know, so a new route must say how it keeps merchants apart. Idempotency keys, webhooks, balances and
//! the dashboard's account changes (key roll, webhook URL) are checked to stay per merchant too.

use caisse::merchants::{self, Created, NewMerchant};
use serde_json::{json, Value};

use crate::api::{assert_error, payment_body, payout_body, spawn_app, text, TestApp};
use crate::dashboard::{eventually, Agent, Receiver};

async fn create(app: &TestApp, name: &str, receiver: &Receiver) -> Created {
    let new = NewMerchant {
        name: format!("{name} Shop"),
        email: format!("{}@example.com", name.to_lowercase()),
        password: Some(format!("{name} password of the dashboard")),
        webhook_url: Some(receiver.url.clone()),
    };
    merchants::create(&app.state.engine, app.state.settings.environment, new).await.expect("merchant created")
}

/// A payment that carries customer details only its merchant may see.
fn detailed_payment(montant: i64, who: &str) -> Value {
    let mut body = payment_body(montant, "55");
    body["client_email"] = json!(format!("{who}-client@example.com"));
    body["client_nom"] = json!(format!("Client {who}"));
    body["description"] = json!(format!("commande {who}"));
    body["metadata"] = json!({"marque": format!("{who}-secret-42")});
    body
}

/// Every `prefix` identifier in `text` (a prefix followed by its ULID).
fn ids(text: &str, prefix: &str) -> Vec<String> {
    let mut found: Vec<String> = text
        .match_indices(prefix)
        .map(|(at, _)| text[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect::<String>())
        .filter(|id| id.len() == prefix.len() + 26)
        .collect();
    found.sort();
    found.dedup();
    found
}

#[track_caller]
fn assert_hidden(what: &str, body: &str, markers: &[String]) {
    for marker in markers {
        assert!(!body.contains(marker.as_str()), "{what} shows `{marker}` of the other merchant:\n{body}");
    }
}

/// Amounts without their thousands separators (spaces, no-break spaces), so `1 111 XOF` reads `1111XOF`.
fn squeezed(html: &str) -> String {
    html.chars().filter(|c| !c.is_whitespace()).collect()
}

#[actix_web::test]
async fn no_route_of_the_api_or_the_dashboard_shows_another_merchants_records() {
    let app = spawn_app().await;
    let (a_hooks, b_hooks) = (Receiver::start(200).await, Receiver::start(200).await);
    let a = create(&app, "Alpha", &a_hooks).await;
    let b = create(&app, "Bravo", &b_hooks).await;
    let (a_key, b_key) = (a.merchant.secret_key.clone(), b.merchant.secret_key.clone());

    // B: a succeeded payment with customer details, a refund, a payout, a payment under a shared reference,
    // and one made with an idempotency key.
    let b_paid = app.initiate_as(&b_key, &detailed_payment(50_000, "bravo")).await;
    let b_paid = text(&b_paid["reference"]).to_owned();
    app.wait_payment_as(&b_key, &b_paid, "succes").await;
    // A has no money of its own yet: B's balance is not A's to spend.
    let resp = app.send(app.post("/v1/retraits").auth(&a_key).json(&payout_body(1000, "99"))).await;
    assert_error(&resp, 409, "insufficient_balance", None);
    let resp = app
        .send(app.post(&format!("/v1/paiement/{b_paid}/rembourser")).auth(&b_key).json(&json!({"montant": 1000})))
        .await;
    resp.expect(200);
    let b_refund = text(&resp.json["remboursement"]["reference"]).to_owned();
    let resp = app.send(app.post("/v1/retraits").auth(&b_key).json(&payout_body(1000, "99"))).await;
    resp.expect(201);
    let b_payout = text(&resp.json["id"]).to_owned();
    let mut shared = detailed_payment(2222, "bravo");
    shared["reference"] = json!("commun-1");
    app.initiate_as(&b_key, &shared).await;
    let resp = app
        .send(app.post("/v1/paiement/initier").auth(&b_key).idem("cle-partagee").json(&payment_body(3333, "02")))
        .await;
    resp.expect(201);
    let b_idem = text(&resp.json["reference"]).to_owned();

    // A: its own payment under the same reference, a funded payment, and the same idempotency key and body
    // as B's, which must make a new payment of A's rather than replay B's answer.
    let mut mine = detailed_payment(1111, "alpha");
    mine["reference"] = json!("commun-1");
    app.initiate_as(&a_key, &mine).await;
    let a_paid = text(&app.fund_as(&a_key, 20_000).await["reference"]).to_owned();
    let resp = app
        .send(app.post("/v1/paiement/initier").auth(&a_key).idem("cle-partagee").json(&payment_body(3333, "02")))
        .await;
    resp.expect(201);
    assert!(resp.header("idempotent-replayed").is_none(), "B's answer replayed to A: {}", resp.json);
    assert_ne!(text(&resp.json["reference"]), b_idem);
    app.wait_payout_as(&b_key, &b_payout, "traite").await;
    app.poll(&b_key, &format!("/v1/paiement/{b_paid}"), "refunded", |p| p["remboursement"]["statut"] == "succes").await;
    b_hooks.wait_for(&b_paid, "payment.succeeded").await;
    a_hooks.wait_for(&a_paid, "payment.succeeded").await;
    let b_balance = app.balance_as(&b_key, "XOF").await;

    // Everything that identifies B or B's records, but the reference both merchants chose.
    let b_list = app.get_ok_as(&b_key, "/v1/transactions?limit=100").await;
    let b_list_text = b_list.to_string();
    let mut b_ids: Vec<String> = vec![b_paid.clone(), b_refund.clone(), b_payout.clone(), b_idem.clone()];
    b_ids.extend(ids(&b_list_text, "tx_"));
    b_ids.extend(ids(&b_list_text, "pay_"));
    let mut bravo = Agent::new(&app.address);
    bravo.login(&b.merchant.email, &b.password).await.expect(303);
    let b_events = ids(&bravo.get("/webhooks").await.expect(200).body, "evt_");
    assert!(!b_events.is_empty(), "B has webhook notifications");
    b_ids.sort();
    b_ids.dedup();
    let mut markers = b_ids.clone();
    markers.extend(b_events.iter().cloned());
    markers.extend([
        b_key.clone(),
        b_key["sk_test_".len()..].to_owned(),
        b.merchant.id.as_str().to_owned(),
        b.merchant.email.clone(),
        b.merchant.name.clone(),
        b_hooks.url.clone(),
        "bravo-secret-42".into(),
        "bravo-client@example.com".into(),
        "Client bravo".into(),
    ]);

    // The API, route by route.
    for (method, route) in caisse::http::ROUTES {
        match (*method, *route) {
            // Providers' door: no merchant key, no merchant records answered (see the notice tests).
            ("POST", "/v1/fournisseurs/{code}/notifications") => {}
            // Creations: checked above (B's balance, B's idempotency key) and below (the shared reference).
            ("POST", "/v1/paiement/initier") | ("POST", "/v1/retraits") => {}
            ("GET", path) if !path.contains('{') => {
                let resp = app.send(app.get(path).auth(&a_key)).await;
                resp.expect(200);
                assert_hidden(&format!("GET {path}"), &String::from_utf8_lossy(&resp.body), &markers);
            }
            (method, path) if path.contains("{reference}") || path.contains("{id}") => {
                for id in &b_ids {
                    let path = path.replace("{reference}", id).replace("{id}", id);
                    let mut requests = vec![app.req(method.parse().expect("method"), &path).auth(&a_key)];
                    if method == "POST" {
                        requests.push(app.post(&path).auth(&a_key).json(&json!({"montant": 100, "motif": "test"})));
                    }
                    for req in requests {
                        let resp = app.send(req).await;
                        assert_error(&resp, 404, "not_found", None);
                        assert_hidden(&format!("{method} {path}"), &String::from_utf8_lossy(&resp.body), &markers);
                    }
                }
            }
            other => panic!("the isolation walk does not know the API route {other:?}: add it"),
        }
    }
    // The shared merchant reference is A's own payment for A.
    let own = app.get_ok_as(&a_key, "/v1/paiement/commun-1").await;
    assert_eq!(own["montant"], 1111);
    assert_hidden("A's payment commun-1", &own.to_string(), &markers);
    // B's records as list cursors show nothing of B's.
    for path in [
        format!("/v1/transactions?starting_after={}", ids(&b_list_text, "tx_")[0]),
        format!("/v1/retraits?starting_after={b_payout}"),
    ] {
        let resp = app.send(app.get(&path).auth(&a_key)).await;
        assert!(resp.status == 200 || resp.status == 400, "GET {path}: {}", resp.status);
        assert_hidden(&format!("GET {path}"), &String::from_utf8_lossy(&resp.body), &markers);
    }
    // A's lists are not empty, so the checks above looked at real lists.
    let a_list = app.get_ok_as(&a_key, "/v1/transactions?limit=100").await.to_string();
    assert!(a_list.contains(&a_paid) && a_list.contains("commun-1"), "A's own transactions: {a_list}");

    // The dashboard, page by page, logged in as A.
    let mut alpha = Agent::new(&app.address);
    alpha.login(&a.merchant.email, &a.password).await.expect(303);
    let token = alpha.get("/keys").await.expect(200).csrf();
    let mut account_changes = false;
    for (method, route) in caisse::dashboard::ROUTES {
        match (*method, *route) {
            // Sessions only: no merchant record is named or shown.
            ("POST", "/login") | ("POST", "/logout") => {}
            // Changes to the logged-in account itself; done last, below.
            ("POST", "/keys/roll") | ("POST", "/keys/webhook") => account_changes = true,
            ("GET", path) if !path.contains('{') => {
                let page = alpha.get(path).await;
                assert!(page.status == 200 || page.status == 303, "GET {path}: {}", page.status);
                assert_hidden(&format!("page {path}"), &page.body, &markers);
            }
            ("GET", "/transactions/{reference}") => {
                for id in &b_ids {
                    let page = alpha.get(&format!("/transactions/{id}")).await;
                    page.expect(404);
                    assert_hidden(&format!("page /transactions/{id}"), &page.body, &markers);
                }
                let page = alpha.get("/transactions/commun-1").await;
                page.expect(200).contains("alpha-client@example.com");
                assert_hidden("A's page of commun-1", &page.body, &markers);
                let amounts = squeezed(&page.body);
                assert!(amounts.contains("1111XOF") && !amounts.contains("2222XOF"), "{}", page.body);
            }
            ("POST", "/webhooks/{id}/resend") => {
                let before = b_hooks.hits().len();
                for id in &b_events {
                    let page = alpha.post(&format!("/webhooks/{id}/resend"), &[("csrf", &token)]).await;
                    page.expect(404);
                    assert_hidden(&format!("resend {id}"), &page.body, &markers);
                }
                actix_web::rt::time::sleep(std::time::Duration::from_millis(300)).await;
                assert_eq!(b_hooks.hits().len(), before, "A's resend reached B's receiver");
            }
            ("POST", "/keys/reveal") => {
                let page = alpha.post("/keys/reveal", &[("csrf", &token)]).await;
                page.expect(200).contains(&a_key);
                assert_hidden("the revealed key", &page.body, &markers);
            }
            other => panic!("the isolation walk does not know the dashboard route {other:?}: add it"),
        }
    }
    for path in [format!("/transactions?apres={}", ids(&b_list_text, "tx_")[0]), format!("/payouts?apres={b_payout}")] {
        let page = alpha.get(&path).await;
        assert_hidden(&format!("page {path}"), &page.body, &markers);
    }
    let overview = alpha.get("/transactions").await;
    overview.expect(200).contains(&a_paid);

    // A's account changes leave B's account alone.
    assert!(account_changes, "the dashboard routes changed: check the account changes below still apply");
    let keys = alpha.get("/keys/roll").await;
    alpha.post("/keys/roll", &[("csrf", &keys.csrf()), ("confirmer", "oui")]).await.expect(303);
    let keys = alpha.get("/keys").await;
    alpha
        .post("/keys/webhook", &[("csrf", &keys.csrf()), ("webhook_url", "http://127.0.0.1:9/alpha")])
        .await
        .expect(303);
    let b_now = app.state.engine.merchant(&b.merchant.id).expect("store").expect("B exists");
    assert_eq!(b_now.secret_key, b_key);
    assert_eq!(b_now.webhook_url.as_deref(), Some(b_hooks.url.as_str()));
    app.send(app.get("/v1/soldes").auth(&b_key)).await.expect(200);
    assert_eq!(app.balance_as(&b_key, "XOF").await, b_balance, "B's balance moved");

    // Webhooks: each merchant's notifications went to its own receiver, signed with its own key.
    let b_refs = [b_paid.as_str(), b_payout.as_str(), b_idem.as_str()];
    for hit in a_hooks.hits() {
        assert!(hit.signed_with(&a_key), "A's receiver got a webhook not signed with A's key: {}", hit.body);
        assert!(!b_refs.iter().any(|r| hit.body.contains(r)), "A's receiver got B's webhook: {}", hit.body);
        assert!(!hit.body.contains("bravo"), "A's receiver got B's webhook: {}", hit.body);
    }
    eventually("B's payout webhook", || async { b_hooks.hits().iter().any(|h| h.body.contains(&b_payout)) }).await;
    for hit in b_hooks.hits() {
        assert!(hit.signed_with(&b_key), "B's receiver got a webhook not signed with B's key: {}", hit.body);
        assert!(
            !hit.body.contains(&a_paid) && !hit.body.contains("alpha"),
            "B's receiver got A's webhook: {}",
            hit.body
        );
    }
}
