//! The read-only pages: overview balances, transactions (filters, pages, detail with history and
//! deliveries), payouts; every amount in major units with the currency's decimals.

use serde_json::json;

use crate::agent::Page;
use crate::support::{payout_body, reference_of, spawn_app, text, TestApp};

/// Rows of a list page: each row has exactly one cell labelled `label`.
fn rows(page: &Page, label: &str) -> usize {
    page.body.matches(&format!("data-label=\"{label}\"")).count()
}

/// The `href` of the "next page" link, unescaped.
fn next_link(page: &Page) -> Option<String> {
    let start = page.body.find("class=\"next\" href=\"")? + "class=\"next\" href=\"".len();
    let end = page.body[start..].find('"')?;
    Some(page.body[start..start + end].replace("&amp;", "&"))
}

async fn payout(app: &TestApp, amount: i64, ending: &str, status: &str) -> String {
    let id = text(&app.payout(&payout_body(amount, ending)).await["id"]).to_owned();
    app.wait_payout(&id, status).await;
    id
}

#[actix_web::test]
async fn overview_shows_balances_per_currency_in_major_units() {
    let app = spawn_app().await;
    let mut agent = app.logged_in().await;
    agent.get("/").await.expect(200).contains("Aucun solde");
    let reference = reference_of(&app.pay(5000, "99").await);
    app.wait_payment(&reference, "succes").await;
    let eur = reference_of(
        &app.initiate(
            &json!({"montant": 1050, "devise": "EUR", "fournisseur": "carte", "client_telephone": "+22997000099",
                "client_nom": "Awa Koné", "client_email": "awa@example.com"}),
        )
        .await,
    );
    app.wait_payment(&eur, "succes").await;
    // mtn_momo keeps 1.5 %: 5 000 XOF paid, 4 925 XOF available.
    let soldes = app.get_ok("/v1/soldes").await;
    let row =
        |currency: &str| soldes["data"].as_array().expect("rows").iter().find(|r| r["devise"] == currency).cloned();
    assert_eq!(row("XOF").expect("XOF")["disponible"], 4925);
    let eur_net = row("EUR").expect("EUR")["disponible"].as_i64().expect("EUR");
    let page = agent.get("/").await;
    page.expect(200).contains("Disponible").contains("En attente").contains("Total");
    page.contains("4 925 XOF").contains("0 XOF").contains(&format!("{},{:02} EUR", eur_net / 100, eur_net % 100));
    // The latest transactions, with their gross amounts.
    page.contains("5 000 XOF").contains("10,50 EUR").contains(&reference);
    // No webhook URL yet: the overview says where to set it.
    page.contains("Aucune Webhook URL");
}

#[actix_web::test]
async fn transactions_filter_page_and_open_with_history_and_deliveries() {
    let app = spawn_app().await;
    let mut references = Vec::new();
    for i in 0..24 {
        references.push((reference_of(&app.pay(1000 + i, "99").await), "succes"));
    }
    for _ in 0..3 {
        references.push((reference_of(&app.pay(700, "01").await), "echec"));
    }
    let eur = reference_of(
        &app.initiate(
            &json!({"montant": 1050, "devise": "EUR", "fournisseur": "carte", "client_telephone": "+22997000099",
                "client_nom": "Awa Koné", "client_email": "awa@example.com"}),
        )
        .await,
    );
    references.push((eur.clone(), "succes"));
    for (reference, status) in &references {
        app.wait_payment(reference, status).await;
    }
    let mut agent = app.logged_in().await;

    // 28 payments: a full page of 25 and a link to the 3 others.
    let first = agent.get("/transactions").await;
    first.expect(200).contains("Filtrer");
    assert_eq!(rows(&first, "Référence"), 25);
    let next = next_link(&first).expect("a next page");
    let second = agent.get(&next).await;
    second.expect(200).contains("Première page");
    assert_eq!(rows(&second, "Référence"), 3);
    assert!(next_link(&second).is_none());

    // Filters.
    let failed = agent.get("/transactions?statut=echec").await;
    assert_eq!(rows(&failed, "Référence"), 3);
    assert_eq!(failed.body.matches("badge bad").count(), 3);
    assert!(failed.body.contains("selected"), "the form keeps the filter");
    // Exactly 25 successes: one full page and no next link.
    let succeeded = agent.get("/transactions?statut=succes&type=paiement").await;
    assert_eq!(rows(&succeeded, "Référence"), 25);
    assert!(next_link(&succeeded).is_none());
    let euros = agent.get("/transactions?devise=EUR").await;
    assert_eq!(rows(&euros, "Référence"), 1);
    euros.contains("10,50 EUR").contains(&eur);
    assert_eq!(rows(&agent.get("/transactions?fournisseur=carte").await, "Référence"), 1);
    assert_eq!(rows(&agent.get("/transactions?fournisseur=mtn_momo&statut=succes").await, "Référence"), 24);
    agent.get("/transactions?type=retrait").await.expect(200).contains("Aucune transaction ne correspond.");
    let today = &caisse_engine::domain::time::Timestamp::now().to_rfc3339()[..10];
    assert_eq!(rows(&agent.get(&format!("/transactions?du={today}&au={today}")).await, "Référence"), 25);
    agent.get("/transactions?au=2000-01-01").await.expect(200).contains("Aucune transaction ne correspond.");
    agent.get("/transactions?statut=bogus").await.expect(400).contains("Statut inconnu.");
    agent.get("/transactions?du=2024-13-45").await.expect(400).contains("AAAA-MM-JJ");
    agent.get("/transactions?apres=not-a-cursor").await.expect(400);

    // A payment's detail: amounts, history from the journal, webhook deliveries.
    let (reference, _) = &references[0];
    let detail = agent.get(&format!("/transactions/{reference}")).await;
    detail.expect(200).contains("1 000 XOF").contains("15 XOF").contains("985 XOF");
    detail.contains("Historique").contains("Paiement initié").contains("Confirmé par le fournisseur");
    detail.contains("Livraisons webhook").contains("payment.succeeded");
    // Another merchant's transactions do not exist here.
    let other = app.create_merchant("Voisin", None).await;
    let theirs = reference_of(&app.with_key(&other.merchant.secret_key).pay(900, "99").await);
    agent.get(&format!("/transactions/{theirs}")).await.expect(404);
    agent.get("/transactions/no-such-ref").await.expect(404);
}

#[actix_web::test]
async fn payouts_are_listed_filtered_and_open_on_their_detail() {
    let app = spawn_app().await;
    let funded = reference_of(&app.pay(10_000, "99").await);
    app.wait_payment(&funded, "succes").await;
    let sent = payout(&app, 2000, "99", "traite").await;
    let rejected = payout(&app, 1000, "01", "rejete").await;
    let mut agent = app.logged_in().await;
    let page = agent.get("/payouts").await;
    page.expect(200).contains(&sent).contains(&rejected).contains("2 000 XOF").contains("rejete");
    assert_eq!(rows(&page, "Retrait"), 2);
    let only = agent.get("/payouts?statut=traite").await;
    assert_eq!(rows(&only, "Retrait"), 1);
    only.contains(&sent);
    assert_eq!(rows(&agent.get("/payouts?devise=EUR").await, "Retrait"), 0);
    agent.get("/payouts?statut=bogus").await.expect(400);
    let detail = agent.get(&format!("/transactions/{sent}")).await;
    detail.expect(200).contains("Retrait demandé").contains("Retrait envoyé").contains("payout.processed");
    // Balances moved: 9 850 XOF net in, 2 000 XOF out.
    agent.get("/").await.contains("7 850 XOF");
}
