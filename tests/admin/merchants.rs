//! Merchant accounts through the admin API, and what a suspension and a new password change for the API and
//! the dashboard.

use serde_json::{json, Value};

use crate::agent::Agent;
use crate::support::{spawn_app, Api};
use crate::{start, TOKEN};

async fn create(admin: &Api, body: &Value) -> crate::support::Resp {
    admin.fetch(admin.post("/admin/merchants").json(body)).await
}

#[actix_web::test]
async fn without_a_token_the_admin_api_does_not_run() {
    let app = spawn_app().await;
    assert_eq!(app.admin_port, None);
}

#[actix_web::test]
async fn every_admin_request_needs_the_token() {
    let (_app, admin) = start().await;
    for req in [admin.get("/admin/merchants").no_auth(), admin.get("/metrics").no_auth()] {
        let answer = admin.fetch(req).await;
        answer.expect(401);
        assert_eq!(answer.json["error"]["code"], "unauthorized");
    }
    let wrong = admin.with_key("admin-token-for-tests-0123456789abcdeX");
    wrong.fetch(wrong.get("/admin/merchants")).await.expect(401);
    let lower =
        admin.fetch(admin.get("/admin/merchants").no_auth().header("Authorization", &format!("bearer {TOKEN}")));
    lower.await.expect(200);
}

/// Admin answers carry a `Request-Id`, as the API's do, and a method an endpoint does not take is answered in
/// the API's error shape.
#[actix_web::test]
async fn admin_answers_have_a_request_id_and_the_apis_error_shape() {
    let (_app, admin) = start().await;
    let listed = admin.fetch(admin.get("/admin/merchants")).await;
    listed.expect(200);
    assert!(listed.header("request-id").is_some_and(|id| id.starts_with("req_")), "{:?}", listed.header("request-id"));
    for req in [admin.get("/admin/backup"), admin.get("/admin/nowhere")] {
        let answer = admin.fetch(req).await;
        answer.expect(404);
        assert_eq!(answer.json["error"]["code"], "not_found");
        assert!(answer.header("request-id").is_some());
    }
}

#[actix_web::test]
async fn merchants_are_created_listed_and_shown_while_the_server_runs() {
    let (app, admin) = start().await;
    let made = create(&admin, &json!({"name": "Boutique Awa", "email": "awa@example.com"})).await;
    made.expect(201);
    let m = &made.json;
    assert_eq!((m["statut"].as_str(), m["email"].as_str()), (Some("actif"), Some("awa@example.com")));
    let key = m["secret_key"].as_str().expect("the secret key, shown once");
    let password = m["password"].as_str().expect("a generated password, shown once");
    assert!(key.starts_with("sk_test_") && password.len() >= 16, "{m}");

    // The key works at once on the API, and the password on the dashboard.
    let api = app.with_key(key);
    api.pay(1_000, "00").await;
    let mut agent = Agent::new(&app.address);
    agent.login("awa@example.com", password).await.expect_redirect("/");

    let id = m["id"].as_str().expect("an id");
    let shown = admin.fetch(admin.get(&format!("/admin/merchants/{id}"))).await;
    shown.expect(200);
    assert_eq!(shown.json["name"], "Boutique Awa");
    assert!(shown.json.get("secret_key").is_none() && shown.json.get("password").is_none(), "no secret again");

    // Newest first, paged with the API's list shape.
    let listed = admin.fetch(admin.get("/admin/merchants?limit=1")).await;
    listed.expect(200);
    assert_eq!(listed.json["data"][0]["id"], id);
    assert_eq!(listed.json["has_more"], true);
    let next = listed.json["next_cursor"].as_str().expect("a cursor");
    let rest = admin.fetch(admin.get(&format!("/admin/merchants?limit=100&starting_after={next}"))).await;
    assert_eq!(rest.json["data"][0]["id"], app.demo.merchant.id.as_str());
    assert_eq!((rest.json["has_more"].as_bool(), rest.json["next_cursor"].is_null()), (Some(false), true));

    // Bad input is named; a second account on one e-mail is refused.
    let duplicate = create(&admin, &json!({"name": "Autre", "email": "AWA@example.com"})).await;
    duplicate.expect(409);
    assert_eq!(
        (duplicate.json["error"]["code"].as_str(), duplicate.json["error"]["field"].as_str()),
        (Some("duplicate_email"), Some("email"))
    );
    let bad = create(&admin, &json!({"name": "X", "email": "not-an-email"})).await;
    bad.expect(400);
    assert_eq!(bad.json["error"]["field"], "email");
    let unknown = create(&admin, &json!({"name": "X", "email": "x@example.com", "role": "admin"})).await;
    unknown.expect(400);
    admin.fetch(admin.get("/admin/merchants/mch_nope")).await.expect(404);
    admin.fetch(admin.get("/admin/merchants?limit=0")).await.expect(400);
}

#[actix_web::test]
async fn a_suspended_merchant_is_refused_and_its_work_in_flight_finishes() {
    let (app, admin) = start().await;
    let id = app.demo.merchant.id.as_str().to_owned();
    // A payment the simulator settles after the suspension.
    let pending = app.pay(2_000, "00").await;
    let reference = pending["reference"].as_str().expect("a reference").to_owned();
    let mut agent = app.logged_in().await;

    let suspended = admin.fetch(admin.post(&format!("/admin/merchants/{id}/suspendre"))).await;
    suspended.expect(200);
    assert_eq!(suspended.json["statut"], "suspendu");
    let refused = app.send(app.get("/v1/soldes")).await;
    refused.expect(403);
    assert_eq!(refused.json["error"]["code"], "merchant_suspended");
    let document = app.send(app.get("/v1/openapi.json").no_auth()).await;
    assert!(document.json["paths"]["/v1/soldes"]["get"]["responses"]["403"].is_object(), "the 403 is documented");
    // Its open dashboard session ended, and a new login is refused.
    assert_eq!(agent.get("/").await.status, 303);
    let page = Agent::new(&app.address).login(app.email(), app.password()).await;
    page.expect(403).contains("suspendu");

    // In flight: the payment still completes and credits.
    let engine = &app.state.engine;
    crate::support::until("the payment started before the suspension completes", || async {
        engine
            .payment(&app.demo.merchant.id, &reference)
            .await
            .ok()
            .flatten()
            .is_some_and(|p| p.status.as_str() == "succes")
    })
    .await;

    let resumed = admin.fetch(admin.post(&format!("/admin/merchants/{id}/reactiver"))).await;
    resumed.expect(200);
    assert_eq!(resumed.json["statut"], "actif");
    app.send(app.get("/v1/soldes")).await.expect(200);
    Agent::new(&app.address).login(app.email(), app.password()).await.expect_redirect("/");
}

#[actix_web::test]
async fn a_new_password_replaces_the_old_and_ends_sessions() {
    let (app, admin) = start().await;
    let id = app.demo.merchant.id.as_str().to_owned();
    let mut agent = app.logged_in().await;
    let reset = admin.fetch(admin.post(&format!("/admin/merchants/{id}/mot-de-passe"))).await;
    reset.expect(200);
    let password = reset.json["password"].as_str().expect("a new password").to_owned();
    assert_ne!(password, app.password());
    assert_eq!(agent.get("/").await.status, 303, "the old session ended");
    Agent::new(&app.address).login(app.email(), app.password()).await.expect(401);
    Agent::new(&app.address).login(app.email(), &password).await.expect_redirect("/");
}

/// A key rolled in the dashboard while the admin API hashes a new password stays rolled: the reset reads the
/// account again, under the dashboard's lock on account changes, before it writes.
#[actix_web::test]
async fn a_key_rolled_while_a_password_is_reset_stays_rolled() {
    let (app, admin) = start().await;
    let id = app.demo.merchant.id.clone();
    let old_key = app.demo.merchant.secret_key.clone();
    let mut agent = app.logged_in().await;
    let confirm = agent.get("/keys/roll").await;
    let reset = admin.fetch(admin.post(&format!("/admin/merchants/{}/mot-de-passe", id.as_str())));
    let roll = async {
        // Sent while the reset hashes its password (argon2: tens of milliseconds, far more in a debug build).
        actix_web::rt::time::sleep(std::time::Duration::from_millis(10)).await;
        agent.post("/keys/roll", &[("csrf", &confirm.csrf()), ("confirmer", "oui")]).await
    };
    let (reset, rolled) = futures_util::future::join(reset, roll).await;
    reset.expect(200);
    let stored = app.state.engine.merchant(&id).expect("read").expect("the merchant");
    let password = reset.json["password"].as_str().expect("a new password");
    Agent::new(&app.address).login(app.email(), password).await.expect_redirect("/");
    // The roll either came in time (its session still open) and its key is kept, or found its session ended.
    if rolled.location.as_deref() == Some("/keys?info=cle_changee") {
        assert_ne!(stored.secret_key, old_key, "the rolled key was overwritten by the reset");
    } else {
        assert_eq!(rolled.location.as_deref(), Some("/login"), "status {}", rolled.status);
    }
}
