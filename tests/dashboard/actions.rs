//! Refunds and payouts started from the dashboard: the API's rules and refusals, a confirmation page before
//! anything moves, and a confirmation sent twice (a double click, a reload) moving money once.

use serde_json::Value;

use crate::agent::hidden;
use crate::support::{spawn_app, text};

#[actix_web::test]
async fn a_refund_is_reviewed_confirmed_and_sent_once() {
    let app = spawn_app().await;
    let paid = app.fund(20_000).await;
    app.fund(20_000).await; // the fees are not returned: other funds pay for them
    let reference = text(&paid["reference"]).to_owned();
    let mut agent = app.logged_in().await;
    let page = agent.get(&format!("/transactions/{reference}")).await;
    page.expect(200).contains("Rembourser").contains("Reste à rembourser");
    let csrf = page.csrf();
    let path = format!("/transactions/{reference}/refund");

    // Refused before any review, with the API's rules said in French; nothing reserved.
    let page = agent.post(&path, &[("csrf", &csrf), ("montant", "douze")]).await;
    page.expect(400).contains("Montant : un nombre entier positif");
    let page = agent.post(&path, &[("csrf", &csrf), ("montant", "3000"), ("etape", "envoyer")]).await;
    page.expect(400).contains("confirmation est incomplet");
    let page = agent.post(&path, &[("montant", "3000")]).await;
    assert_eq!(page.status, 403, "no CSRF token: {}", page.body);
    assert_eq!(app.balance("XOF").await, (39_400, 0, 39_400));

    // The review says what will move; only its confirmation sends it, and sending it twice moves money once.
    let review = agent.post(&path, &[("csrf", &csrf), ("montant", "3000"), ("motif", "colis abîmé")]).await;
    review.expect(200).contains("Confirmer le remboursement").contains("colis abîmé");
    let squeezed: String = review.body.split_whitespace().collect::<String>().replace('\u{202f}', "");
    assert!(squeezed.contains("17000"), "what will be left: {}", review.body);
    assert_eq!(app.balance("XOF").await, (39_400, 0, 39_400), "a review reserves nothing");
    let key = hidden(&review.body, "cle").expect("a one-time key");
    let confirm = [
        ("csrf", csrf.as_str()),
        ("montant", "3000"),
        ("motif", "colis abîmé"),
        ("etape", "envoyer"),
        ("cle", key.as_str()),
    ];
    agent.post(&path, &confirm).await.expect_redirect(&format!("/transactions/{reference}"));
    agent.post(&path, &confirm).await.expect_redirect(&format!("/transactions/{reference}"));
    let done = app.wait_payment(&reference, "rembourse_partiellement").await;
    let refunds = done["remboursements"].as_array().expect("a list").clone();
    assert_eq!(refunds.len(), 1, "sent once: {done}");
    assert_eq!((refunds[0]["montant"].as_i64(), refunds[0]["motif"].as_str()), (Some(3_000), Some("colis abîmé")));

    // Above what is left: the engine's refusal, in French, with the figure; the form is offered again.
    let review = agent.post(&path, &[("csrf", &csrf), ("montant", "17001")]).await;
    let key = hidden(&review.body, "cle").expect("a one-time key");
    let page = agent.post(&path, &[("csrf", &csrf), ("montant", "17001"), ("etape", "envoyer"), ("cle", &key)]).await;
    page.expect(400).contains("au plus 17000").contains("Reste à rembourser");

    // The rest, by default: the review fixes it as a figure, the payment is refunded in full, the form is gone.
    let review = agent.post(&path, &[("csrf", &csrf), ("montant", "")]).await;
    assert_eq!(hidden(&review.body, "montant").as_deref(), Some("17000"), "the amount shown is the one sent");
    let key = hidden(&review.body, "cle").expect("a one-time key");
    let sent = agent.post(&path, &[("csrf", &csrf), ("montant", "17000"), ("etape", "envoyer"), ("cle", &key)]).await;
    sent.expect_redirect(&format!("/transactions/{reference}"));
    let done = app.wait_payment(&reference, "rembourse").await;
    assert_eq!(done["montant_rembourse"], 20_000);
    let page = agent.get(&format!("/transactions/{reference}")).await;
    page.expect(200).contains("Remboursements");
    assert!(!page.body.contains("id=\"refund\""), "no refund form on a payment refunded in full");
    // Nothing to review any more: refused before any confirmation.
    let page = agent.post(&path, &[("csrf", &csrf), ("montant", "1")]).await;
    page.expect(409).contains("ne peut pas être remboursé");
    assert!(hidden(&page.body, "cle").is_none(), "no confirmation offered");
}

#[actix_web::test]
async fn a_payout_is_checked_by_the_apis_rules_reviewed_and_sent_once() {
    let app = spawn_app().await;
    app.fund(50_000).await; // 49 250 available
    let mut agent = app.logged_in().await;
    agent.get("/payouts").await.expect(200).contains("href=\"/payouts/new\"");
    let form = agent.get("/payouts/new").await;
    form.expect(200).contains("name=\"beneficiaire_telephone\"").contains("mtn_momo");
    let csrf = form.csrf();
    let fields = |phone: &'static str, reference: &'static str| {
        vec![
            ("montant", "2000"),
            ("devise", "XOF"),
            ("fournisseur", "mtn_momo"),
            ("beneficiaire_telephone", phone),
            ("beneficiaire_nom", "Awa"),
            ("description", ""),
            ("reference", reference),
        ]
    };
    let post = |extra: Vec<(&'static str, String)>, base: Vec<(&'static str, &'static str)>| {
        let mut all: Vec<(String, String)> = base.into_iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
        all.extend(extra.into_iter().map(|(k, v)| (k.to_owned(), v)));
        all
    };

    // The API's refusals, naming the field, and the form kept as typed.
    let bad = post(vec![("csrf", csrf.clone())], fields("96 00 00 99", ""));
    let bad: Vec<(&str, &str)> = bad.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let page = agent.post("/payouts/new", &bad).await;
    page.expect(400).contains("Téléphone du bénéficiaire").contains("value=\"96 00 00 99\"");

    // Reviewed (the fee and what the beneficiary receives), then confirmed twice: one payout.
    let good = post(vec![("csrf", csrf.clone())], fields("+229 96 00 00 99", "paie-juin"));
    let good: Vec<(&str, &str)> = good.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let review = agent.post("/payouts/new", &good).await;
    review.expect(200).contains("Confirmer le retrait").contains("Le bénéficiaire reçoit").contains("paie-juin");
    assert_eq!(app.balance("XOF").await.0, 49_250, "a review reserves nothing");
    let key = hidden(&review.body, "cle").expect("a one-time key");
    let mut confirm = good.clone();
    confirm.extend([("etape", "envoyer"), ("cle", key.as_str())]);
    let sent = agent.post("/payouts/new", &confirm).await;
    assert_eq!(sent.status, 303, "{}", sent.body);
    let location = sent.location.clone().expect("a location");
    assert!(location.starts_with("/transactions/ret_"), "{location}");
    let again = agent.post("/payouts/new", &confirm).await;
    assert_eq!(again.location.as_deref(), Some(location.as_str()), "the replay names the same payout");
    let payouts: Vec<Value> = app.get_ok("/v1/retraits").await["data"].as_array().expect("a list").clone();
    assert_eq!(payouts.len(), 1, "sent once: {payouts:?}");
    assert_eq!(payouts[0]["reference"], "paie-juin");
    assert_eq!(payouts[0]["beneficiaire_telephone"], "+22996000099", "the number as written, normalised");
    agent.get(&location).await.expect(200).contains("paie-juin");

    // The same reference again: the engine's refusal, in French.
    let review = agent.post("/payouts/new", &good).await;
    let key = hidden(&review.body, "cle").expect("a one-time key");
    let mut confirm = good.clone();
    confirm.extend([("etape", "envoyer"), ("cle", key.as_str())]);
    agent.post("/payouts/new", &confirm).await.expect(409).contains("déjà prise");
    assert_eq!(app.get_ok("/v1/retraits").await["data"].as_array().map(Vec::len), Some(1));
}
