//! The payment page, `{public_url}/payer/...` (docs/links.md), driven over HTTP as a browser without
//! JavaScript would: load the form, post it with its token and cookie, follow the 303, and read the waiting
//! page until the receipt. The same flow in Chromium, with screenshots, is in the browser suite.

use std::time::Duration;

use serde_json::{json, Value};

use super::liens::{create_link, link_body};
use crate::support::{eventually, int, spawn_app, text, Resp, TestApp};

/// A customer's browser: the cookie the page set. It does not follow redirects, so a test reads each 303.
struct Customer {
    cookie: Option<String>,
    client: Option<crate::support::Api>,
}

/// The value of the hidden form field `name`, as the page wrote it.
fn hidden(html: &str, name: &str) -> Option<String> {
    let at = html.find(&format!("name=\"{name}\" value=\""))?;
    let rest = &html[at + name.len() + 15..];
    Some(rest[..rest.find('"')?].to_owned())
}

fn body(resp: &Resp) -> String {
    String::from_utf8_lossy(&resp.body).into_owned()
}

impl Customer {
    fn new() -> Customer {
        Customer { cookie: None, client: None }
    }

    fn with_cookie(cookie: Option<String>) -> Customer {
        Customer { cookie, client: None }
    }

    fn browser(&self, app: &TestApp) -> crate::support::Api {
        match &self.client {
            Some(api) => api.clone(),
            None => {
                crate::support::Api { client: awc::Client::builder().disable_redirects().finish(), ..app.api.clone() }
            }
        }
    }

    async fn get(&mut self, app: &TestApp, path: &str) -> Resp {
        let mut req = app.get(path).no_auth();
        if let Some(cookie) = &self.cookie {
            req = req.header("cookie", cookie);
        }
        let resp = self.browser(app).fetch(req).await;
        if let Some(set) = resp.header("set-cookie") {
            self.cookie = set.split(';').next().map(str::to_owned);
        }
        resp
    }

    /// Loads the link's form and answers its token.
    async fn form(&mut self, app: &TestApp, link: &str) -> String {
        let page = self.get(app, &format!("/payer/{link}")).await;
        page.expect(200);
        hidden(&body(&page), "jeton").expect("the form's token")
    }

    async fn post(&self, app: &TestApp, link: &str, fields: &[(&str, &str)]) -> Resp {
        let form = serde_urlencoded::to_string(fields).expect("a form");
        let mut req =
            app.post(&format!("/payer/{link}")).no_auth().raw(Some("application/x-www-form-urlencoded"), form);
        if let Some(cookie) = &self.cookie {
            req = req.header("cookie", cookie);
        }
        self.browser(app).fetch(req).await
    }

    /// Loads the form and pays with a Beninese national number ending in `ending`; answers the 303.
    async fn pay(&mut self, app: &TestApp, link: &str, ending: &str) -> Resp {
        let token = self.form(app, link).await;
        let phone = format!("97 00 00 {ending}");
        self.post(app, link, &[("jeton", &token), ("fournisseur", "mtn_momo"), ("pays", "BJ"), ("telephone", &phone)])
            .await
    }
}

/// The payment page's stylesheet, checked to load nothing from another host; answers its weight.
async fn stylesheet(app: &TestApp) -> usize {
    let css = app.fetch(app.get("/assets/payer.css").no_auth()).await;
    css.expect(200);
    for target in targets(&body(&css)) {
        assert!(target.starts_with('/') && !target.starts_with("//") && !target.starts_with("/\\"), "{target}");
    }
    css.body.len()
}

/// The 303's target as a path of this server. The test servers set no `public_url`, so it is a path, which
/// keeps the customer on the address the link was opened at (`the_page_answers_under_the_public_url` has one).
#[track_caller]
fn location(resp: &Resp) -> String {
    resp.expect(303);
    let to = resp.header("location").expect("a Location");
    assert!(to.starts_with("/payer/"), "the 303 leaves this server: {to}");
    to.to_owned()
}

/// What a page of the flow points at: every `src`, `href` and `action` attribute, the refresh's target, and the
/// `url(...)` and `@import` of a stylesheet.
fn targets(page: &str) -> Vec<String> {
    let mut found = Vec::new();
    for attr in ["src=\"", "href=\"", "action=\"", "url(", "@import", "url="] {
        for (at, _) in page.match_indices(attr) {
            let rest = page[at + attr.len()..].trim_start_matches([' ', '\'', '"']);
            let end = rest.find(['"', '\'', ')', ';', ' ']).unwrap_or(rest.len());
            found.push(rest[..end].to_owned());
        }
    }
    found
}

/// A page of the flow loads nothing from another host and links elsewhere only to `allowed` (the merchant's
/// `url_retour`, a provider's page), and weighs, with its stylesheet, at most 30 KB.
#[track_caller]
fn self_contained(page: &Resp, css: usize, allowed: &[&str]) {
    let html = body(page);
    let weight = page.body.len() + css;
    assert!(weight <= 30 * 1024, "a page weighs {weight} bytes with its stylesheet: {html}");
    for target in targets(&html) {
        // `//host` and `/\host` are other hosts to a browser.
        let local = (target.starts_with('/') && !target.starts_with("//") && !target.starts_with("/\\"))
            || target.starts_with('#');
        assert!(local || allowed.contains(&target.as_str()), "a page points to another host: {target}");
    }
    assert!(!html.contains("<script"), "no script: {html}");
    assert!(html.contains("lang=\"fr\""), "French: {html}");
    let csp = page.header("content-security-policy").unwrap_or("");
    assert!(csp.contains("default-src 'none'") && csp.contains("style-src 'self'"), "{csp}");
}

/// The waiting page until it shows a final screen.
async fn final_resp(app: &TestApp, path: &str) -> Resp {
    eventually("the payment page to show a final status", Duration::from_secs(15), || async {
        let page = app.fetch(app.get(path).no_auth()).await;
        page.expect(200);
        if body(&page).contains("http-equiv=\"refresh\"") {
            Err("still waiting".to_owned())
        } else {
            Ok(page)
        }
    })
    .await
}

/// The waiting page until it shows a final screen; answers its HTML.
async fn final_page(app: &TestApp, path: &str) -> String {
    body(&final_resp(app, path).await)
}

/// The payment's reference in its page's address (`/payer/{link}/{reference}?cle=…`).
fn reference_in(location: &str) -> String {
    let path = location.split('?').next().unwrap_or_default();
    path.rsplit('/').next().unwrap_or_default().to_owned()
}

#[actix_web::test]
async fn a_customer_pays_a_link_and_ends_on_a_receipt() {
    let app = spawn_app().await;
    let link = create_link(
        &app,
        &json!({"montant": 5_000, "devise": "XOF", "description": "Frais de scolarité",
        "url_retour": "https://ecole.example.com/merci", "metadata": {"classe": "CM2"}}),
    )
    .await;
    let id = text(&link["id"]);
    let mut customer = Customer::new();
    let page = customer.get(&app, &format!("/payer/{id}")).await;
    page.expect(200);
    let html = body(&page);
    assert!(html.contains("Boutique") || html.contains(&app.demo.merchant.name), "the merchant's name");
    assert!(html.contains("Frais de scolarité") && html.contains("5 000 FCFA"), "{html}");
    assert!(customer.cookie.is_some(), "the form sets its cookie");
    assert_eq!(page.header("cache-control"), Some("no-store"));

    let token = hidden(&html, "jeton").unwrap();
    let fields = [("jeton", token.as_str()), ("fournisseur", "mtn_momo"), ("pays", "BJ"), ("telephone", "97 00 00 55")];
    let to = location(&customer.post(&app, id, &fields).await);
    assert!(to.starts_with(&format!("/payer/{id}/pay_")), "{to}");
    assert!(format!("{}{to}", app.address).starts_with(&format!("{}/pay_", text(&link["url"]))), "{to}");
    let waiting = app.fetch(app.get(&to).no_auth()).await;
    assert!(body(&waiting).contains("Validez le paiement"), "the waiting screen first");
    let receipt = final_page(&app, &to).await;
    assert!(receipt.contains("Paiement réussi") && receipt.contains(&reference_in(&to)), "{receipt}");
    assert!(receipt.contains("https://ecole.example.com/merci"), "a way back to the merchant");
    assert!(!receipt.contains("97000055") && !receipt.contains("97 00 00 55"), "no phone number on the receipt");

    // The merchant sees an ordinary payment, with the link's metadata and lien_id, and the link is paid.
    let payment = app.get_payment(&reference_in(&to)).await;
    assert_eq!(payment["statut"], "succes");
    assert_eq!(payment["metadata"], json!({"classe": "CM2", "lien_id": id}));
    assert_eq!(payment["client_telephone"], "+22997000055", "the national number completed by the country");
    let link = app.get_ok(&format!("/v1/liens/{id}")).await;
    assert_eq!(
        (link["statut"].as_str(), int(&link["nombre_paiements"]), int(&link["montant_encaisse"])),
        (Some("paye"), 1, 5_000)
    );

    // A paid unique link answers 410 with no form.
    let gone = app.fetch(app.get(&format!("/payer/{id}")).no_auth()).await;
    assert_eq!(gone.status, 410);
    assert!(body(&gone).contains("déjà été payé") && !body(&gone).contains("<form"));
}

#[actix_web::test]
async fn a_declined_number_shows_the_failure_and_a_retry_succeeds() {
    let app = spawn_app().await;
    let link = create_link(&app, &link_body(3_000)).await;
    let id = text(&link["id"]);
    let mut customer = Customer::new();
    let to = location(&customer.pay(&app, id, "01").await);
    let failed = final_page(&app, &to).await;
    assert!(failed.contains("Paiement refusé") && failed.contains(&format!("href=\"/payer/{id}\"")), "{failed}");
    assert_eq!(int(&app.get_ok(&format!("/v1/liens/{id}")).await["nombre_paiements"]), 0);
    let to = location(&customer.pay(&app, id, "55").await);
    assert!(final_page(&app, &to).await.contains("Paiement réussi"));
    let link = app.get_ok(&format!("/v1/liens/{id}")).await;
    assert_eq!((int(&link["nombre_paiements"]), link["statut"].as_str()), (1, Some("paye")));
}

#[actix_web::test]
async fn a_double_submit_makes_one_payment() {
    let app = spawn_app().await;
    let link = create_link(&app, &link_body(2_000)).await;
    let id = text(&link["id"]);
    let mut customer = Customer::new();
    let token = customer.form(&app, id).await;
    let fields = [("jeton", token.as_str()), ("fournisseur", "mtn_momo"), ("pays", "BJ"), ("telephone", "97000055")];
    let (first, second) =
        futures_util::future::join(customer.post(&app, id, &fields), customer.post(&app, id, &fields)).await;
    assert_eq!(location(&first), location(&second), "both taps land on the same payment");
    let third = customer.post(&app, id, &fields).await;
    assert_eq!(location(&third), location(&first));
    let listed = app.list_all("/v1/transactions?type=paiement", 100).await;
    assert_eq!(listed.len(), 1, "one payment: {listed:?}");
    // The same form with another number is not a second payment either.
    let other = [("jeton", token.as_str()), ("fournisseur", "mtn_momo"), ("pays", "BJ"), ("telephone", "97000066")];
    assert_eq!(customer.post(&app, id, &other).await.status, 409);
}

#[actix_web::test]
async fn forms_without_a_valid_token_or_cookie_make_nothing() {
    let app = spawn_app().await;
    let link = create_link(&app, &link_body(2_000)).await;
    let id = text(&link["id"]);
    let mut customer = Customer::new();
    let token = customer.form(&app, id).await;
    let fields = |token: &str| {
        vec![
            ("jeton".to_owned(), token.to_owned()),
            ("fournisseur".to_owned(), "mtn_momo".to_owned()),
            ("pays".to_owned(), "BJ".to_owned()),
            ("telephone".to_owned(), "97000055".to_owned()),
        ]
    };
    let as_refs = |f: &Vec<(String, String)>| f.iter().map(|(k, v)| (k.clone(), v.clone())).collect::<Vec<_>>();
    let forged = format!("{}x", &token[..token.len() - 1]);
    for (cookie, token) in [
        (customer.cookie.clone(), forged),
        (None, token.clone()),
        (Some("caisse_payer=AAAAAAAAAAAAAAAAAAAAAA".into()), token.clone()),
    ] {
        let stranger = Customer::with_cookie(cookie);
        let f = as_refs(&fields(&token));
        let f: Vec<(&str, &str)> = f.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let resp = stranger.post(&app, id, &f).await;
        assert_eq!(resp.status, 403, "{}", body(&resp));
        assert!(body(&resp).contains("<form"), "the form comes back to send again");
    }
    // Bad input comes back with the customer's entries and says what to fix.
    let bad = [("jeton", token.as_str()), ("fournisseur", "mtn_momo"), ("pays", "BJ"), ("telephone", "97 ab")];
    let resp = customer.post(&app, id, &bad).await;
    assert_eq!(resp.status, 400);
    assert!(body(&resp).contains("Numéro de téléphone invalide") && body(&resp).contains("value=\"97 ab\""));
    let unknown = [("jeton", token.as_str()), ("fournisseur", "wave_x"), ("pays", "BJ"), ("telephone", "97000055")];
    assert_eq!(customer.post(&app, id, &unknown).await.status, 400);
    assert!(app.list_all("/v1/transactions", 100).await.is_empty(), "nothing was created");
    // Forms over the size bound are refused.
    let huge = "x".repeat(8 * 1024);
    let big = [("jeton", token.as_str()), ("nom", huge.as_str())];
    assert_eq!(customer.post(&app, id, &big).await.status, 400);
}

#[actix_web::test]
async fn what_customers_and_merchants_type_is_escaped() {
    let app = spawn_app().await;
    let script = "<script>alert(1)</script>\"><img src=x onerror=alert(2)>";
    let link = create_link(&app, &json!({"montant": 1_000, "devise": "XOF", "description": script})).await;
    let id = text(&link["id"]);
    let mut customer = Customer::new();
    let token = customer.form(&app, id).await;
    let page = body(&customer.get(&app, &format!("/payer/{id}")).await);
    assert!(!page.contains("<script>") && !page.contains("<img src=x") && page.contains("&lt;script&gt;"), "{page}");
    let fields = [
        ("jeton", token.as_str()),
        ("fournisseur", "mtn_momo"),
        ("pays", "BJ"),
        ("telephone", script),
        ("nom", script),
    ];
    let resp = customer.post(&app, id, &fields).await;
    assert_eq!(resp.status, 400);
    assert!(!body(&resp).contains("<script>") && !body(&resp).contains("<img src=x"));
    // A name with markup goes through as text, and never reaches the page unescaped.
    let token = customer.form(&app, id).await;
    let fields = [
        ("jeton", token.as_str()),
        ("fournisseur", "mtn_momo"),
        ("pays", "BJ"),
        ("telephone", "97000055"),
        ("nom", script),
    ];
    let to = location(&customer.post(&app, id, &fields).await);
    let receipt = final_page(&app, &to).await;
    assert!(!receipt.contains("<script>") && !receipt.contains("<img src=x"));
    assert_eq!(app.get_payment(&reference_in(&to)).await["client_nom"], script, "kept as typed, as text");
}

#[actix_web::test]
async fn a_multiple_link_counts_every_success_exactly_under_concurrent_payments() {
    let app = spawn_app().await;
    let link =
        create_link(&app, &json!({"montant": 1_500, "devise": "XOF", "description": "Don", "usage": "multiple"})).await;
    let id = text(&link["id"]).to_owned();
    let mut customers = Vec::new();
    for _ in 0..8 {
        let mut customer = Customer::new();
        let token = customer.form(&app, &id).await;
        customers.push((customer, token));
    }
    // Six succeed, two are declined: only the six count.
    let posts = customers.iter().enumerate().map(|(n, (customer, token))| {
        let phone = if n < 2 { "97000001".to_owned() } else { format!("970000{:02}", 50 + n) };
        let (app, id, token) = (&app, id.clone(), token.clone());
        async move {
            let fields =
                [("jeton", token.as_str()), ("fournisseur", "mtn_momo"), ("pays", "BJ"), ("telephone", phone.as_str())];
            location(&customer.post(app, &id, &fields).await)
        }
    });
    let places = futures_util::future::join_all(posts).await;
    for place in &places {
        final_page(&app, place).await;
    }
    let link = app.get_ok(&format!("/v1/liens/{id}")).await;
    assert_eq!((int(&link["nombre_paiements"]), int(&link["montant_encaisse"])), (6, 9_000));
    assert_eq!(link["statut"], "actif", "a multiple link stays open");
}

#[actix_web::test]
async fn the_page_is_small_self_contained_and_limits_posts() {
    let app = spawn_app().await;
    let link = create_link(&app, &link_body(1_000)).await;
    let id = text(&link["id"]);
    let mut customer = Customer::new();
    let page = customer.get(&app, &format!("/payer/{id}")).await;
    let css = stylesheet(&app).await;
    self_contained(&page, css, &[]);
    let html = body(&page);
    for field in ["fournisseur", "pays", "telephone", "nom", "email"] {
        assert!(html.contains(&format!("<label for=\"{field}\"")), "{field} has its label: {html}");
    }

    // Ten posts a minute from one address, then 429.
    let token = customer.form(&app, id).await;
    let bad = [("jeton", token.as_str()), ("fournisseur", "mtn_momo"), ("pays", "BJ"), ("telephone", "x")];
    let mut statuses = Vec::new();
    for _ in 0..11 {
        statuses.push(customer.post(&app, id, &bad).await.status);
    }
    assert_eq!(&statuses[..10], &[400; 10]);
    assert_eq!(statuses[10], 429);
    let refused = customer.post(&app, id, &bad).await;
    assert_eq!(refused.status, 429);
    assert!(refused.header("retry-after").is_some());
    self_contained(&refused, css, &[]);

    // Unknown links, and payments not made through this link, are not found.
    assert_eq!(app.fetch(app.get("/payer/lnk_01JD0000000000000000000000").no_auth()).await.status, 404);
    assert_eq!(app.fetch(app.get("/payer/nimporte").no_auth()).await.status, 404);
    let other = app.pay(1_000, "55").await;
    let path = format!("/payer/{id}/{}", text(&other["reference"]));
    assert_eq!(app.fetch(app.get(&path).no_auth()).await.status, 404, "another payment of the merchant");
}

/// A payment's page opens only with its own key: references are ordered ids, so a customer who knows theirs
/// could otherwise read the next customer's receipt on a `multiple` link.
#[actix_web::test]
async fn a_payments_page_needs_its_own_key() {
    let app = spawn_app().await;
    let link =
        create_link(&app, &json!({"montant": 1_500, "devise": "XOF", "description": "Don", "usage": "multiple"})).await;
    let id = text(&link["id"]);
    let mut first = Customer::new();
    let mine = location(&first.pay(&app, id, "55").await);
    let mut second = Customer::new();
    let theirs = location(&second.pay(&app, id, "55").await);
    assert!(mine.contains("?cle=") && theirs.contains("?cle="), "{mine} {theirs}");
    assert!(final_page(&app, &mine).await.contains("Paiement réussi"));
    let bare = theirs.split('?').next().unwrap_or_default().to_owned();
    let my_key = &mine[mine.find("?cle=").unwrap_or_default()..];
    for other in [bare.clone(), format!("{bare}?cle="), format!("{bare}{my_key}"), format!("{bare}?cle=x&cle=y")] {
        let page = app.fetch(app.get(&other).no_auth()).await;
        assert_eq!(page.status, 404, "{other}: {}", body(&page));
        assert!(!body(&page).contains(&reference_in(&theirs)), "nothing of the other payment");
    }
    assert!(final_page(&app, &theirs).await.contains("Paiement réussi"));
}

#[actix_web::test]
async fn every_page_of_the_flow_is_small_french_and_self_contained() {
    let app = spawn_app().await;
    let css = stylesheet(&app).await;
    let back = "https://ecole.example.com/merci";
    let body_of_link = json!({"montant": 1_000, "devise": "XOF", "description": "Cahiers", "url_retour": back});
    let link = create_link(&app, &body_of_link).await;
    let id = text(&link["id"]);
    let mut customer = Customer::new();

    // The form sent back with what to fix.
    let token = customer.form(&app, id).await;
    let bad = [("jeton", token.as_str()), ("fournisseur", "mtn_momo"), ("pays", "BJ"), ("telephone", "x")];
    let refused = customer.post(&app, id, &bad).await;
    assert_eq!(refused.status, 400);
    self_contained(&refused, css, &[]);

    // The waiting screen (a number ending in 02 is never approved), then the expired payment.
    let to = location(&customer.pay(&app, id, "02").await);
    let waiting = app.fetch(app.get(&to).no_auth()).await;
    assert!(body(&waiting).contains("Validez le paiement"), "{}", body(&waiting));
    self_contained(&waiting, css, &[]);
    let expired = final_resp(&app, &to).await;
    assert!(body(&expired).contains("Paiement expiré") && body(&expired).contains(&format!("href=\"/payer/{id}\"")));
    self_contained(&expired, css, &[]);

    // The failure, then the receipt with its way back to the merchant.
    let to = location(&customer.pay(&app, id, "01").await);
    let failed = final_resp(&app, &to).await;
    assert!(body(&failed).contains("Paiement refusé"));
    self_contained(&failed, css, &[]);
    let to = location(&customer.pay(&app, id, "55").await);
    let receipt = final_resp(&app, &to).await;
    assert!(body(&receipt).contains("Paiement réussi") && body(&receipt).contains(back));
    self_contained(&receipt, css, &[back]);

    // The paid link, an unknown link, an unknown payment.
    let gone = app.fetch(app.get(&format!("/payer/{id}")).no_auth()).await;
    assert_eq!(gone.status, 410);
    self_contained(&gone, css, &[]);
    let unknown = app.fetch(app.get("/payer/lnk_01JD0000000000000000000000").no_auth()).await;
    assert_eq!(unknown.status, 404);
    self_contained(&unknown, css, &[]);
    let missing = app.fetch(app.get(&format!("/payer/{id}/pay_inconnu")).no_auth()).await;
    assert_eq!(missing.status, 404);
    self_contained(&missing, css, &[]);

    // A paid link is final: it cannot be deactivated.
    let off = app.send(app.post(&format!("/v1/liens/{id}/desactiver"))).await;
    crate::support::assert_error(&off, 409, "invalid_state", None);
}

/// With a `public_url` set, the link's address and every redirect of the page are under it, whatever address the
/// request came in on (the operator's proxy forwards to the listen address).
#[actix_web::test]
async fn the_page_answers_under_the_public_url() {
    let app = crate::support::spawn_app_with(|s| s.public_url = "https://pay.example.com".into()).await;
    let link = create_link(&app, &link_body(1_000)).await;
    let id = text(&link["id"]);
    assert_eq!(link["url"], format!("https://pay.example.com/payer/{id}"));
    let mut customer = Customer::new();
    let answer = customer.pay(&app, id, "55").await;
    answer.expect(303);
    let to = answer.header("location").expect("a Location");
    assert!(to.starts_with(&format!("https://pay.example.com/payer/{id}/pay_")), "{to}");
    let path = to.strip_prefix("https://pay.example.com").unwrap_or_default();
    assert!(final_page(&app, path).await.contains("Paiement réussi"));
}

#[actix_web::test]
async fn deactivated_and_expired_links_answer_410() {
    let app = spawn_app().await;
    let link = create_link(&app, &link_body(1_000)).await;
    let id = text(&link["id"]);
    let mut customer = Customer::new();
    let token = customer.form(&app, id).await;
    app.send(app.post(&format!("/v1/liens/{id}/desactiver"))).await.expect(200);
    let gone = app.fetch(app.get(&format!("/payer/{id}")).no_auth()).await;
    assert_eq!(gone.status, 410);
    assert!(body(&gone).contains("plus actif"));
    // A form loaded before is refused too.
    let fields = [("jeton", token.as_str()), ("fournisseur", "mtn_momo"), ("pays", "BJ"), ("telephone", "97000055")];
    assert_eq!(customer.post(&app, id, &fields).await.status, 410);
    assert!(app.list_all("/v1/transactions", 100).await.is_empty());
    let _: Value = app.get_ok(&format!("/v1/liens/{id}")).await;

    // A link past its expire_at: its page says so, and a form loaded before it expired makes nothing.
    let soon = caisse_engine::domain::time::Timestamp::now().plus_ms(4_000).to_rfc3339();
    let link =
        create_link(&app, &json!({"montant": 1_000, "devise": "XOF", "description": "x", "expire_at": soon})).await;
    let id = text(&link["id"]);
    let mut customer = Customer::new();
    let token = customer.form(&app, id).await;
    let gone = eventually("the link's page to say it expired", Duration::from_secs(15), || async {
        let page = app.fetch(app.get(&format!("/payer/{id}")).no_auth()).await;
        match page.status {
            410 => Ok(page),
            other => Err(format!("still {other}")),
        }
    })
    .await;
    assert!(body(&gone).contains("a expiré") && !body(&gone).contains("<form"), "{}", body(&gone));
    let fields = [("jeton", token.as_str()), ("fournisseur", "mtn_momo"), ("pays", "BJ"), ("telephone", "97000055")];
    let late = customer.post(&app, id, &fields).await;
    assert_eq!(late.status, 410);
    assert!(body(&late).contains("a expiré"));
    assert!(app.list_all("/v1/transactions", 100).await.is_empty(), "nothing was created");
}

/// Customers who all started paying a `unique` link before it was paid all complete and are counted: the link
/// closes at its first success, and what was already under way is credited, not lost.
#[actix_web::test]
async fn a_unique_link_paid_by_concurrent_customers_counts_every_success_and_then_closes() {
    // The sandbox approves after 2 s, so every post is in before the first success, and nothing expires.
    let app = crate::support::spawn_app_with(|s| {
        s.sandbox_delay_ms = 2_000;
        s.payment_ttl_ms = 30_000;
    })
    .await;
    let id = text(&create_link(&app, &link_body(2_000)).await["id"]).to_owned();
    let mut customers = Vec::new();
    for _ in 0..3 {
        let mut customer = Customer::new();
        let token = customer.form(&app, &id).await;
        customers.push((customer, token));
    }
    let posts = customers.iter().map(|(customer, token)| {
        let (app, id) = (&app, id.as_str());
        async move {
            let fields =
                [("jeton", token.as_str()), ("fournisseur", "mtn_momo"), ("pays", "BJ"), ("telephone", "97000055")];
            location(&customer.post(app, id, &fields).await)
        }
    });
    let places = futures_util::future::join_all(posts).await;
    for place in &places {
        assert!(final_page(&app, place).await.contains("Paiement réussi"));
    }
    let link = app.get_ok(&format!("/v1/liens/{id}")).await;
    assert_eq!(
        (link["statut"].as_str(), int(&link["nombre_paiements"]), int(&link["montant_encaisse"])),
        (Some("paye"), 3, 6_000)
    );
    assert_eq!(app.fetch(app.get(&format!("/payer/{id}")).no_auth()).await.status, 410);
    let mut late = Customer::new();
    assert_eq!(late.get(&app, &format!("/payer/{id}")).await.status, 410, "no form once paid");
}

/// A merchant suspended while its customer's payment is under way: the link takes no new payment (403), but
/// the payment completes and its page still shows the customer how it ended.
#[actix_web::test]
async fn a_payment_under_way_when_its_merchant_is_suspended_still_shows_its_end() {
    let app = spawn_app().await;
    let link = create_link(&app, &json!({"montant": 5_000, "devise": "XOF", "description": "Cotisation"})).await;
    let id = text(&link["id"]);
    let mut customer = Customer::new();
    let to = location(&customer.pay(&app, id, "55").await);
    let merchant = app.demo.merchant.id.clone();
    app.state.engine.set_suspended(&merchant, Some(caisse_engine::domain::time::Timestamp::now())).await.unwrap();
    let form = app.fetch(app.get(&format!("/payer/{id}")).no_auth()).await;
    assert_eq!(form.status, 403, "{}", body(&form));
    let receipt = final_page(&app, &to).await;
    assert!(receipt.contains("Paiement réussi") && receipt.contains(&reference_in(&to)), "{receipt}");
}
