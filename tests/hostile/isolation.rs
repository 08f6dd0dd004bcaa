//! Merchant isolation: merchant A, logged in or holding its key, never reaches merchant B's records.
//!
//! B gets one of everything (payments with customer details, a refund, a payout, a payment link, webhook notifications) and
//! A a few records of its own, one under the same merchant reference as B's. Then A walks every route of the
//! API ([`caisse::http::ROUTES`]) and of the dashboard ([`caisse::dashboard::ROUTES`]), putting each of B's
//! identifiers where the route takes one: each is 404 (docs/api.md § Errors: "also when it belongs to another
//! merchant"), and no answer A gets, list or page, shows anything of B's. The walk fails on a route it does
//! not know, so a new route must say how it keeps merchants apart. Idempotency keys, webhooks, balances and
//! the dashboard's account changes (key roll, webhook URL) are checked to stay per merchant too.

use caisse::merchants::Created;
use serde_json::{json, Value};

use crate::agent::Agent;
use crate::support::{
    always, assert_error, payment_body, payout_body, reference_of, spawn_app, text, until, Api, Receiver, TestApp,
};

/// A payment that carries customer details only its merchant may see.
fn detailed_payment(amount: i64, who: &str) -> Value {
    let mut body = payment_body(amount, "55");
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

/// B's records, one of everything.
struct Bravo {
    /// A succeeded payment with customer details, refunded in part.
    paid: String,
    refund: String,
    /// A processed payout.
    payout: String,
    /// A payment made with the idempotency key A uses too.
    idem: String,
    /// A payment link, under a merchant reference of B's.
    link: String,
}

/// Everything that names B or B's records: identifiers A may put in a route, and markers no answer to A may
/// show.
struct Markers {
    /// B's payments, refund, payout and transactions.
    ids: Vec<String>,
    /// B's webhook notifications.
    events: Vec<String>,
    /// The identifiers, B's key, merchant id, e-mail, name, webhook URL and customer details.
    all: Vec<String>,
    /// B's first transaction id, as a list cursor.
    tx: String,
}

#[actix_web::test]
async fn no_route_of_the_api_or_the_dashboard_shows_another_merchants_records() {
    let app = spawn_app().await;
    let (a_hooks, b_hooks) = (Receiver::start(always(200)), Receiver::start(always(200)));
    let a = app.create_merchant("Alpha Shop", Some(&a_hooks.url())).await;
    let b = app.create_merchant("Bravo Shop", Some(&b_hooks.url())).await;
    let (a_api, b_api) = (app.with_key(&a.merchant.secret_key), app.with_key(&b.merchant.secret_key));

    let bravo = bravo_gets_one_of_everything(&b_api, &a_api).await;
    let a_paid = alpha_gets_its_own_records(&a_api, &bravo).await;
    b_api.wait_payout(&bravo.payout, "traite").await;
    b_api.wait_refund(&bravo.paid, "succes").await;
    b_hooks.wait_for(&bravo.paid, "payment.succeeded").await;
    // Every webhook of B's records has come before the walk, which counts what B's receiver gets: the payment
    // under the shared reference succeeds, the one with the idempotency key (never answered) expires.
    b_hooks.wait_for("commun-1", "payment.succeeded").await;
    b_hooks.wait_for(&bravo.idem, "payment.failed").await;
    a_hooks.wait_for(&a_paid, "payment.succeeded").await;
    let b_balance = b_api.balance("XOF").await;

    let markers = what_names_bravo(&app, &b, &b_hooks, &bravo).await;
    the_api_walk_finds_nothing_of_bravo(&a_api, &markers).await;
    alphas_reference_and_lists_stay_its_own(&a_api, &markers, &bravo, &a_paid).await;
    let mut alpha = Agent::new(&app.address);
    alpha.login(&a.merchant.email, &a.password).await.expect(303);
    let account_changes = the_dashboard_walk_finds_nothing_of_bravo(&mut alpha, &a_api, &markers, &b_hooks).await;
    for path in [format!("/transactions?apres={}", markers.tx), format!("/payouts?apres={}", bravo.payout)] {
        let page = alpha.get(&path).await;
        assert_hidden(&format!("page {path}"), &page.body, &markers.all);
    }
    let overview = alpha.get("/transactions").await;
    overview.expect(200).contains(&a_paid);

    // A's account changes leave B's account alone.
    assert!(account_changes, "the dashboard routes changed: check the account changes below still apply");
    alphas_account_changes_leave_bravo_alone(&app, &mut alpha, &b, &b_hooks, b_balance).await;
    webhooks_go_to_their_own_merchant(&a_hooks, &b_hooks, &a_api, &b_api, &bravo, &a_paid).await;
}

/// B: a succeeded payment with customer details, a refund, a payout, a payment under a merchant reference A
/// uses too, and one made with an idempotency key. A, with no money of its own yet, cannot spend B's balance.
async fn bravo_gets_one_of_everything(b: &Api, a: &Api) -> Bravo {
    let paid = reference_of(&b.initiate(&detailed_payment(50_000, "bravo")).await);
    b.wait_payment(&paid, "succes").await;
    // A has no money of its own yet: B's balance is not A's to spend.
    let resp = a.post_payout(&payout_body(1000, "99")).await;
    assert_error(&resp, 409, "insufficient_balance", None);
    let resp = b.post_refund(&paid, &json!({"montant": 1000})).await;
    resp.expect(200);
    let refund = text(&resp.json["remboursement"]["reference"]).to_owned();
    let payout = text(&b.payout(&payout_body(1000, "99")).await["id"]).to_owned();
    let mut shared = detailed_payment(2222, "bravo");
    shared["reference"] = json!("commun-1");
    b.initiate(&shared).await;
    let resp = b.send(b.post("/v1/paiement/initier").idem("cle-partagee").json(&payment_body(3333, "02"))).await;
    resp.expect(201);
    let idem = reference_of(&resp.json);
    let resp = b
        .send(b.post("/v1/liens").json(&json!({"montant": 4444, "devise": "XOF", "description": "bravo-lien-secret",
            "reference": "lien-bravo", "metadata": {"marque": "bravo-secret-42"}})))
        .await;
    resp.expect(201);
    let link = text(&resp.json["id"]).to_owned();
    Bravo { paid, refund, payout, idem, link }
}

/// A: its own payment under B's merchant reference, a funded payment (returned), and the same idempotency
/// key and body as B's, which must make a new payment of A's rather than replay B's answer.
async fn alpha_gets_its_own_records(a: &Api, bravo: &Bravo) -> String {
    let mut mine = detailed_payment(1111, "alpha");
    mine["reference"] = json!("commun-1");
    a.initiate(&mine).await;
    let paid = reference_of(&a.fund(20_000).await);
    let resp = a.send(a.post("/v1/paiement/initier").idem("cle-partagee").json(&payment_body(3333, "02"))).await;
    resp.expect(201);
    assert!(resp.header("idempotent-replayed").is_none(), "B's answer replayed to A: {}", resp.json);
    assert_ne!(text(&resp.json["reference"]), bravo.idem);
    paid
}

/// Everything that identifies B or B's records, but the reference both merchants chose: from B's own list of
/// transactions and B's own webhooks page.
async fn what_names_bravo(app: &TestApp, b: &Created, b_hooks: &Receiver, bravo: &Bravo) -> Markers {
    let b_key = &b.merchant.secret_key;
    let b_list = app.with_key(b_key).get_ok("/v1/transactions?limit=100").await.to_string();
    let mut b_ids = vec![
        bravo.paid.clone(),
        bravo.refund.clone(),
        bravo.payout.clone(),
        bravo.idem.clone(),
        bravo.link.clone(),
        "lien-bravo".into(),
    ];
    b_ids.extend(ids(&b_list, "tx_"));
    b_ids.extend(ids(&b_list, "pay_"));
    let mut agent = Agent::new(&app.address);
    agent.login(&b.merchant.email, &b.password).await.expect(303);
    let b_events = ids(&agent.get("/webhooks").await.expect(200).body, "evt_");
    assert!(!b_events.is_empty(), "B has webhook notifications");
    b_ids.sort();
    b_ids.dedup();
    let mut all = b_ids.clone();
    all.extend(b_events.iter().cloned());
    all.extend([
        b_key.clone(),
        b_key["sk_test_".len()..].to_owned(),
        b.merchant.id.as_str().to_owned(),
        b.merchant.email.clone(),
        b.merchant.name.clone(),
        b_hooks.url(),
        "bravo-secret-42".into(),
        "bravo-client@example.com".into(),
        "Client bravo".into(),
        "bravo-lien-secret".into(),
    ]);
    Markers { ids: b_ids, events: b_events, all, tx: ids(&b_list, "tx_")[0].clone() }
}

/// The API, route by route, with A's key: every route that takes an identifier is 404 for each of B's, and
/// no answer shows anything of B's.
async fn the_api_walk_finds_nothing_of_bravo(a: &Api, markers: &Markers) {
    for (method, route) in caisse::http::ROUTES {
        match (*method, *route) {
            // Providers' door: no merchant key, no merchant records answered (see the notice tests).
            ("POST", "/v1/fournisseurs/{code}/notifications")
            | ("POST", "/v1/notifications/{adapter}")
            | (_, "/v1/notifications/{adapter}/{token}")
            | ("GET", "/v1/notifications/{adapter}") => {}
            // Creations: checked above (B's balance, B's idempotency key) and below (the shared reference).
            ("POST", "/v1/paiement/initier") | ("POST", "/v1/retraits") | ("POST", "/v1/liens") => {}
            ("GET", path) if !path.contains('{') => {
                let resp = a.send(a.get(path)).await;
                resp.expect(200);
                assert_hidden(&format!("GET {path}"), &String::from_utf8_lossy(&resp.body), &markers.all);
            }
            (method, path) if path.contains("{reference}") || path.contains("{id}") => {
                for id in &markers.ids {
                    let path = path.replace("{reference}", id).replace("{id}", id);
                    let mut requests = vec![a.req(method.parse().expect("method"), &path)];
                    if method == "POST" {
                        requests.push(a.post(&path).json(&json!({"montant": 100, "motif": "test"})));
                    }
                    for req in requests {
                        let resp = a.send(req).await;
                        assert_error(&resp, 404, "not_found", None);
                        assert_hidden(&format!("{method} {path}"), &String::from_utf8_lossy(&resp.body), &markers.all);
                    }
                }
            }
            other => panic!("the isolation walk does not know the API route {other:?}: add it"),
        }
    }
}

/// The shared merchant reference is A's own payment for A; B's records as list cursors show nothing of B's;
/// A's lists are not empty, so the checks looked at real lists.
async fn alphas_reference_and_lists_stay_its_own(a: &Api, markers: &Markers, bravo: &Bravo, a_paid: &str) {
    let own = a.get_ok("/v1/paiement/commun-1").await;
    assert_eq!(own["montant"], 1111);
    assert_hidden("A's payment commun-1", &own.to_string(), &markers.all);
    for path in [
        format!("/v1/transactions?starting_after={}", markers.tx),
        format!("/v1/retraits?starting_after={}", bravo.payout),
    ] {
        let resp = a.send(a.get(&path)).await;
        assert!(resp.status == 200 || resp.status == 400, "GET {path}: {}", resp.status);
        assert_hidden(&format!("GET {path}"), &String::from_utf8_lossy(&resp.body), &markers.all);
    }
    let a_list = a.get_ok("/v1/transactions?limit=100").await.to_string();
    assert!(a_list.contains(a_paid) && a_list.contains("commun-1"), "A's own transactions: {a_list}");
}

/// The replay progress page says every notification of the range was handed over and delivered (or no
/// replay ran yet).
fn replay_done(page: &str) -> bool {
    let attribute = |name: &str| {
        let marker = format!("{name}=\"");
        page.split(&marker).nth(1).and_then(|rest| rest.split('"').next()).map(str::to_owned)
    };
    match attribute("data-total") {
        None => !page.contains("Renvoi du"),
        Some(total) => attribute("data-handled") == Some(total.clone()) && attribute("data-delivered") == Some(total),
    }
}

/// A one-time confirmation key of the right shape.
const KEY: &str = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";

/// The dashboard, page by page, logged in as A. Returns whether the route table still has the account
/// changes (key roll, webhook URL), which are made last, by the caller.
async fn the_dashboard_walk_finds_nothing_of_bravo(
    alpha: &mut Agent,
    a: &Api,
    markers: &Markers,
    b_hooks: &Receiver,
) -> bool {
    let token = alpha.get("/keys").await.expect(200).csrf();
    let mut account_changes = false;
    for (method, route) in caisse::dashboard::ROUTES {
        match (*method, *route) {
            // Sessions only: no merchant record is named or shown.
            ("POST", "/login") | ("POST", "/logout") => {}
            // Changes to the logged-in account itself; done last.
            ("POST", "/keys/roll") | ("POST", "/keys/webhook") => account_changes = true,
            ("GET", path) if !path.contains('{') => {
                let page = alpha.get(path).await;
                assert!(page.status == 200 || page.status == 303, "GET {path}: {}", page.status);
                assert_hidden(&format!("page {path}"), &page.body, &markers.all);
            }
            ("GET", "/transactions/{reference}") => {
                for id in &markers.ids {
                    let page = alpha.get(&format!("/transactions/{id}")).await;
                    page.expect(404);
                    assert_hidden(&format!("page /transactions/{id}"), &page.body, &markers.all);
                }
                let page = alpha.get("/transactions/commun-1").await;
                page.expect(200).contains("alpha-client@example.com");
                assert_hidden("A's page of commun-1", &page.body, &markers.all);
                let amounts = squeezed(&page.body);
                assert!(amounts.contains("1111XOF") && !amounts.contains("2222XOF"), "{}", page.body);
            }
            ("POST", "/webhooks/{id}/resend") => {
                let before = b_hooks.hits().len();
                for id in &markers.events {
                    let page = alpha.post(&format!("/webhooks/{id}/resend"), &[("csrf", &token)]).await;
                    page.expect(404);
                    assert_hidden(&format!("resend {id}"), &page.body, &markers.all);
                }
                actix_web::rt::time::sleep(std::time::Duration::from_millis(300)).await;
                assert_eq!(b_hooks.hits().len(), before, "A's resend reached B's receiver");
            }
            ("POST", "/transactions/{reference}/refund") => {
                // B's payments, refunds and payouts cannot be refunded from A's session: not found, at review
                // and at confirmation alike.
                for id in &markers.ids {
                    for step in ["", "envoyer"] {
                        let fields = [("csrf", token.as_str()), ("montant", "1"), ("etape", step), ("cle", KEY)];
                        let page = alpha.post(&format!("/transactions/{id}/refund"), &fields).await;
                        page.expect(404);
                        assert_hidden(&format!("refund of {id}"), &page.body, &markers.all);
                    }
                }
            }
            ("POST", "/payouts/new") => {
                // A's own payout form, reviewed only (nothing moves): nothing of B's shows on it.
                let fields = [
                    ("csrf", token.as_str()),
                    ("montant", "100"),
                    ("devise", "XOF"),
                    ("fournisseur", "mtn_momo"),
                    ("beneficiaire_telephone", "+22996000099"),
                ];
                let page = alpha.post("/payouts/new", &fields).await;
                page.expect(200);
                assert_hidden("the payout review", &page.body, &markers.all);
            }
            ("POST", "/webhooks/test") | ("POST", "/webhooks/replay") => {
                // A's own receiver tools: a test event goes to A's URL, a replay sends A's notifications; B's
                // receiver hears of neither.
                let before = b_hooks.hits().len();
                let today = caisse_engine::domain::time::Timestamp::now().to_rfc3339()[..10].to_owned();
                let page = alpha.post(route, &[("csrf", token.as_str()), ("du", &today), ("au", &today)]).await;
                assert!([200, 303, 400, 502].contains(&page.status), "POST {route}: {}", page.status);
                assert_hidden(&format!("POST {route}"), &page.body, &markers.all);
                // The replay runs in the background: it is over, every notification delivered again, before
                // the walk goes on (A's key roll, later, must not race its deliveries).
                let mut progress = alpha.get("/webhooks/replay").await;
                let started = std::time::Instant::now();
                while !replay_done(&progress.body) {
                    assert!(started.elapsed() < std::time::Duration::from_secs(30), "{}", progress.body);
                    actix_web::rt::time::sleep(std::time::Duration::from_millis(100)).await;
                    progress = alpha.get("/webhooks/replay").await;
                }
                assert_hidden("the replay's progress", &progress.body, &markers.all);
                actix_web::rt::time::sleep(std::time::Duration::from_millis(300)).await;
                assert_eq!(b_hooks.hits().len(), before, "A's {route} reached B's receiver");
            }
            (method, route) if route.starts_with("/links/{id}") => {
                // B's link, by id (and by B's reference, which names nothing of A's): not found, shown nowhere.
                for id in [
                    markers.ids.iter().find(|i| i.starts_with("lnk_")).cloned().unwrap_or_default(),
                    "lien-bravo".into(),
                ] {
                    let path = route.replace("{id}", &id);
                    let page = match method {
                        "POST" => alpha.post(&path, &[("csrf", token.as_str())]).await,
                        _ => alpha.get(&path).await,
                    };
                    page.expect(404);
                    assert_hidden(&format!("{method} {path}"), &page.body, &markers.all);
                }
            }
            ("POST", "/links/new") => {
                // A's own link, made from A's session: nothing of B's on its page.
                let fields = [
                    ("csrf", token.as_str()),
                    ("cle", KEY),
                    ("description", "lien alpha"),
                    ("montant", "100"),
                    ("devise", "XOF"),
                ];
                let page = alpha.post("/links/new", &fields).await;
                assert_eq!(page.status, 303, "{}", page.body);
                assert_hidden("A's new link", &page.body, &markers.all);
            }
            ("POST", "/keys/reveal") => {
                let page = alpha.post("/keys/reveal", &[("csrf", &token)]).await;
                page.expect(200).contains(&a.key);
                assert_hidden("the revealed key", &page.body, &markers.all);
            }
            other => panic!("the isolation walk does not know the dashboard route {other:?}: add it"),
        }
    }
    account_changes
}

/// A rolls its key and changes its webhook URL: B's key, URL and balance stay as they were.
async fn alphas_account_changes_leave_bravo_alone(
    app: &TestApp,
    alpha: &mut Agent,
    b: &Created,
    b_hooks: &Receiver,
    b_balance: (i64, i64, i64),
) {
    let keys = alpha.get("/keys/roll").await;
    alpha.post("/keys/roll", &[("csrf", &keys.csrf()), ("confirmer", "oui")]).await.expect(303);
    let keys = alpha.get("/keys").await;
    alpha
        .post("/keys/webhook", &[("csrf", &keys.csrf()), ("webhook_url", "http://127.0.0.1:9/alpha")])
        .await
        .expect(303);
    let b_now = app.stored_merchant(&b.merchant.id);
    assert_eq!(b_now.secret_key, b.merchant.secret_key);
    assert_eq!(b_now.webhook_url, Some(b_hooks.url()));
    let b_api = app.with_key(&b.merchant.secret_key);
    b_api.send(b_api.get("/v1/soldes")).await.expect(200);
    assert_eq!(b_api.balance("XOF").await, b_balance, "B's balance moved");
}

/// Each merchant's notifications went to its own receiver, signed with its own key.
async fn webhooks_go_to_their_own_merchant(
    a_hooks: &Receiver,
    b_hooks: &Receiver,
    a: &Api,
    b: &Api,
    bravo: &Bravo,
    a_paid: &str,
) {
    let b_refs = [bravo.paid.as_str(), bravo.payout.as_str(), bravo.idem.as_str()];
    for hit in a_hooks.hits() {
        let body = hit.text();
        assert!(hit.signed_with(&a.key), "A's receiver got a webhook not signed with A's key: {body}");
        assert!(!b_refs.iter().any(|r| body.contains(r)), "A's receiver got B's webhook: {body}");
        assert!(!body.contains("bravo"), "A's receiver got B's webhook: {body}");
    }
    until("B's payout webhook", || async { b_hooks.hits().iter().any(|h| h.text().contains(&bravo.payout)) }).await;
    for hit in b_hooks.hits() {
        let body = hit.text();
        assert!(hit.signed_with(&b.key), "B's receiver got a webhook not signed with B's key: {body}");
        assert!(!body.contains(a_paid) && !body.contains("alpha"), "B's receiver got A's webhook: {body}");
    }
}
