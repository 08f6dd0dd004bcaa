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

fn location(resp: &Resp) -> String {
    resp.expect(303);
    resp.header("location").expect("a Location").to_owned()
}

/// The waiting page until it shows a final screen; answers its HTML.
async fn final_page(app: &TestApp, path: &str) -> String {
    eventually("the payment page to show a final status", Duration::from_secs(15), || async {
        let page = app.fetch(app.get(path).no_auth()).await;
        page.expect(200);
        let html = body(&page);
        if html.contains("http-equiv=\"refresh\"") {
            Err("still waiting".to_owned())
        } else {
            Ok(html)
        }
    })
    .await
}

fn reference_in(location: &str) -> String {
    location.rsplit('/').next().unwrap_or_default().to_owned()
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
    let html = body(&page);
    let css = app.fetch(app.get("/assets/payer.css").no_auth()).await;
    css.expect(200);
    let weight = page.body.len() + css.body.len();
    assert!(weight <= 30 * 1024, "the page weighs {weight} bytes with its stylesheet");
    for attr in ["src=\"", "href=\""] {
        for (at, _) in html.match_indices(attr) {
            let target = &html[at + attr.len()..];
            assert!(
                target.starts_with('/') || target.starts_with('#'),
                "only this host: {}",
                &target[..40.min(target.len())]
            );
        }
    }
    assert!(!html.contains("<script"), "no script");
    assert!(html.contains("lang=\"fr\"") && html.contains("<label for=\"telephone\""), "French, labelled");
    let csp = page.header("content-security-policy").unwrap_or("");
    assert!(csp.contains("default-src 'none'"), "{csp}");

    // Ten posts a minute from one address, then 429.
    let token = customer.form(&app, id).await;
    let bad = [("jeton", token.as_str()), ("fournisseur", "mtn_momo"), ("pays", "BJ"), ("telephone", "x")];
    let mut statuses = Vec::new();
    for _ in 0..11 {
        statuses.push(customer.post(&app, id, &bad).await.status);
    }
    assert_eq!(&statuses[..10], &[400; 10]);
    assert_eq!(statuses[10], 429);

    // Unknown links, and payments not made through this link, are not found.
    assert_eq!(app.fetch(app.get("/payer/lnk_01JD0000000000000000000000").no_auth()).await.status, 404);
    assert_eq!(app.fetch(app.get("/payer/nimporte").no_auth()).await.status, 404);
    let other = app.pay(1_000, "55").await;
    let path = format!("/payer/{id}/{}", text(&other["reference"]));
    assert_eq!(app.fetch(app.get(&path).no_auth()).await.status, 404, "another payment of the merchant");
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
}
