//! "Liens de paiement" in the dashboard: create a link by the API's rules (a double click makes one), list it
//! with its payments and amount collected, its URL and QR code, deactivate it.

use crate::agent::hidden;
use crate::support::spawn_app;

#[actix_web::test]
async fn a_link_is_created_listed_shown_with_its_qr_code_and_deactivated() {
    let app = spawn_app().await;
    let mut agent = app.logged_in().await;
    let page = agent.get("/links").await;
    page.expect(200).contains("Liens de paiement").contains("Aucun lien");
    let form = agent.get("/links/new").await;
    form.expect(200).contains("Nouveau lien de paiement");
    let csrf = form.csrf();
    let key = hidden(&form.body, "cle").expect("a one-time key");

    // The API's rules, in French, with what was typed kept.
    let refused = agent
        .post(
            "/links/new",
            &[("csrf", &csrf), ("cle", &key), ("description", ""), ("montant", "5000"), ("devise", "XOF")],
        )
        .await;
    refused.expect(400).contains("Description");
    let refused =
        agent.post("/links/new", &[("csrf", &csrf), ("cle", &key), ("description", "x"), ("montant", "cinq")]).await;
    refused.expect(400).contains("Montant");

    let fields = [
        ("csrf", csrf.as_str()),
        ("cle", key.as_str()),
        ("description", "Cotisation <b>annuelle</b>"),
        ("montant", "5000"),
        ("devise", "XOF"),
        ("fournisseurs", "mtn_momo"),
        ("fournisseurs", "wave"),
        ("usage", "multiple"),
    ];
    let created = agent.post("/links/new", &fields).await;
    let to = created.header("location").expect("to the link's page").to_owned();
    assert!(to.starts_with("/links/lnk_"), "{to}");
    agent.post("/links/new", &fields).await.expect_redirect(&to);
    let listed = app.get_ok("/v1/liens").await;
    assert_eq!(listed["data"].as_array().unwrap().len(), 1, "a double click makes one link");
    let link = &listed["data"][0];
    assert_eq!(link["fournisseurs"], serde_json::json!(["mtn_momo", "wave"]));
    assert_eq!(link["usage"], "multiple");

    let detail = agent.get(&to).await;
    detail.expect(200).contains(link["url"].as_str().unwrap()).contains("qr.svg").contains("Désactiver ce lien");
    assert!(detail.body.contains("Cotisation &lt;b&gt;annuelle&lt;/b&gt;"), "escaped");
    let qr = agent.get(&format!("{to}/qr.svg")).await;
    qr.expect(200);
    assert_eq!(qr.header("content-type"), Some("image/svg+xml"));
    assert!(qr.body.starts_with("<svg") && qr.body.contains("<path d=\"M4,4h1v1h-1z"));
    let download = agent.get(&format!("{to}/qr.svg?telecharger=1")).await;
    assert!(download.header("content-disposition").unwrap_or("").starts_with("attachment"));

    // A payment not made through the link is not listed on its page (checked below, once deactivated).
    app.pay(1_000, "55").await;
    let page = agent.get("/links").await;
    page.expect(200).contains("Cotisation");

    let deactivated = agent.post(&format!("{to}/deactivate"), &[("csrf", &csrf)]).await;
    deactivated.expect_redirect(&to);
    let detail = agent.get(&to).await;
    detail.expect(200).contains("desactive").contains("Aucun paiement par ce lien");
    assert!(!detail.body.contains("Désactiver ce lien"));
    assert_eq!(app.get_ok(&format!("/v1/liens/{}", link["id"].as_str().unwrap())).await["statut"], "desactive");

    // Another merchant's dashboard finds nothing of it; no CSRF, no deactivation.
    let other = app.create_merchant("Autre", None).await;
    let mut stranger = app.agent();
    stranger.login(&other.merchant.email, &other.password).await;
    assert_eq!(stranger.get(&to).await.status, 404);
    assert_eq!(stranger.get(&format!("{to}/qr.svg")).await.status, 404);
    assert_eq!(agent.post(&format!("{to}/deactivate"), &[]).await.status, 403);
}

/// Customers pay a `multiple` link on its page, one of them typing markup as a name: the list and the link's
/// page show the payments and the amount collected, and the merchant's pages show the name as text.
#[actix_web::test]
async fn a_links_payments_and_what_customers_typed_reach_the_dashboard_as_text() {
    use caisse_engine::domain::money::{format_major, Currency};

    let app = spawn_app().await;
    let body = serde_json::json!({"montant": 1_500, "devise": "XOF", "description": "Don", "usage": "multiple"});
    let created = app.send(app.post("/v1/liens").json(&body)).await;
    created.expect(201);
    let id = created.json["id"].as_str().expect("an id").to_owned();
    let script = "<script>alert(1)</script>\"><img src=x onerror=alert(2)>";
    let mut references = Vec::new();
    for name in [script, "Awa"] {
        let mut customer = app.agent();
        let form = customer.get(&format!("/payer/{id}")).await;
        let token = hidden(&form.expect(200).body, "jeton").expect("the form's token");
        let fields =
            [("jeton", token.as_str()), ("fournisseur", "mtn_momo"), ("pays", "BJ"), ("telephone", "97000055")];
        let sent = customer.post(&format!("/payer/{id}"), &[&fields[..], &[("nom", name)]].concat()).await;
        let to = sent.header("location").expect("the waiting page").to_owned();
        let page = to.split('?').next().unwrap_or_default();
        references.push(page.rsplit('/').next().unwrap_or_default().to_owned());
    }
    for reference in &references {
        app.wait_payment(reference, "succes").await;
    }

    let mut agent = app.logged_in().await;
    let collected = format_major(3_000, Currency::XOF);
    agent.get("/links").await.expect(200).contains(&collected);
    let detail = agent.get(&format!("/links/{id}")).await;
    detail.expect(200).contains(&collected);
    for reference in &references {
        detail.contains(reference);
    }
    let page = agent.get(&format!("/transactions/{}", references[0])).await;
    page.expect(200)
        .contains("&lt;script&gt;alert(1)&lt;/script&gt;")
        .contains(&format!("&quot;lien_id&quot;:&quot;{id}&quot;"));
    assert!(!page.body.contains("<script>") && !page.body.contains("<img src=x"), "{}", page.body);
}
