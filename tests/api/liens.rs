//! `POST /v1/liens`, `GET /v1/liens`, `GET /v1/liens/{id}`, `POST /v1/liens/{id}/desactiver`
//! (docs/api.md § Payment links): validation, statuses, isolation. The payments made through a link are in
//! `payer.rs`.

use serde_json::{json, Value};

use crate::support::{
    assert_error, assert_list_shape, int, spawn_app, spawn_app_with, spawn_production_app, text, TestApp,
};

const LINK_FIELDS: [&str; 16] = [
    "created_at",
    "description",
    "devise",
    "expire_at",
    "fournisseurs",
    "id",
    "metadata",
    "montant",
    "montant_encaisse",
    "nombre_paiements",
    "reference",
    "statut",
    "updated_at",
    "url",
    "url_retour",
    "usage",
];

pub fn link_body(amount: i64) -> Value {
    json!({"montant": amount, "devise": "XOF", "description": "Frais de scolarité"})
}

pub async fn create_link(app: &TestApp, body: &Value) -> Value {
    let resp = app.send(app.post("/v1/liens").json(body)).await;
    resp.expect(201);
    resp.json
}

#[track_caller]
fn assert_link_shape(l: &Value) {
    let mut keys: Vec<&str> = l.as_object().expect("link is an object").keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, LINK_FIELDS, "link fields: {l}");
    let id = text(&l["id"]);
    assert!(id.starts_with("lnk_") && id.len() == 30, "{id}");
}

#[actix_web::test]
async fn a_link_is_created_with_every_field_and_its_defaults() {
    let app = spawn_app().await;
    let link = create_link(&app, &link_body(5_000)).await;
    assert_link_shape(&link);
    let id = text(&link["id"]);
    assert_eq!(link["url"], format!("http://127.0.0.1:{}/payer/{id}", app.port), "the sandbox's own address");
    assert_eq!((link["statut"].as_str(), link["usage"].as_str()), (Some("actif"), Some("unique")));
    assert_eq!((int(&link["nombre_paiements"]), int(&link["montant_encaisse"])), (0, 0));
    assert!(link["reference"].is_null() && link["expire_at"].is_null() && link["url_retour"].is_null());
    let providers: Vec<&str> = link["fournisseurs"].as_array().unwrap().iter().map(text).collect();
    assert!(providers.contains(&"mtn_momo") && providers.contains(&"wave"), "every active fournisseur: {providers:?}");
    assert!(!providers.contains(&"carte") || providers.len() > 1);
    assert_eq!(app.get_ok(&format!("/v1/liens/{id}")).await, link);

    let full = create_link(
        &app,
        &json!({"montant": 2_500, "devise": "XOF", "description": "Cotisation", "fournisseurs": ["wave"],
                "reference": "cotisation-2026", "usage": "multiple", "expire_at": "2099-01-01T00:00:00Z",
                "url_retour": "https://ecole.example.com/merci", "metadata": {"classe": "CM2"}}),
    )
    .await;
    assert_eq!(full["fournisseurs"], json!(["wave"]));
    assert_eq!(
        (full["usage"].as_str(), full["expire_at"].as_str()),
        (Some("multiple"), Some("2099-01-01T00:00:00.000Z"))
    );
    assert_eq!(full["url_retour"], "https://ecole.example.com/merci");
    assert_eq!(full["metadata"], json!({"classe": "CM2"}));
    assert_eq!(app.get_ok("/v1/liens/cotisation-2026").await["id"], full["id"], "found by its reference");
}

#[actix_web::test]
async fn bad_links_are_refused_naming_the_field() {
    let app = spawn_app().await;
    let cases = [
        (json!({"devise": "XOF", "description": "x"}), 400, "invalid_request", Some("montant")),
        (json!({"montant": 0, "devise": "XOF", "description": "x"}), 400, "invalid_request", Some("montant")),
        (json!({"montant": 100, "devise": "ABC", "description": "x"}), 400, "unsupported_currency", Some("devise")),
        // XOF is offered, only no fournisseur takes 50 of it: the amount is what to change.
        (json!({"montant": 50, "devise": "XOF", "description": "x"}), 400, "invalid_request", Some("montant")),
        (json!({"montant": 100, "devise": "XOF", "description": ""}), 400, "invalid_request", Some("description")),
        (json!({"montant": 100, "devise": "XOF"}), 400, "invalid_request", Some("description")),
        (
            json!({"montant": 100, "devise": "XOF", "description": "x".repeat(501)}),
            400,
            "invalid_request",
            Some("description"),
        ),
        (
            json!({"montant": 100, "devise": "XOF", "description": "x", "fournisseurs": ["nope"]}),
            400,
            "unsupported_provider",
            Some("fournisseurs"),
        ),
        (
            json!({"montant": 100, "devise": "XOF", "description": "x", "fournisseurs": []}),
            400,
            "invalid_request",
            Some("fournisseurs"),
        ),
        (
            json!({"montant": 100, "devise": "XOF", "description": "x", "usage": "souvent"}),
            400,
            "invalid_request",
            Some("usage"),
        ),
        (
            json!({"montant": 100, "devise": "XOF", "description": "x", "expire_at": "2001-01-01T00:00:00Z"}),
            400,
            "invalid_request",
            Some("expire_at"),
        ),
        (
            json!({"montant": 100, "devise": "XOF", "description": "x", "expire_at": "demain"}),
            400,
            "invalid_request",
            Some("expire_at"),
        ),
        (
            json!({"montant": 100, "devise": "XOF", "description": "x", "url_retour": "ftp://x"}),
            400,
            "invalid_request",
            Some("url_retour"),
        ),
        (
            json!({"montant": 100, "devise": "XOF", "description": "x", "metadata": {"lien_id": "lnk_x"}}),
            400,
            "invalid_request",
            Some("metadata"),
        ),
        (
            json!({"montant": 100, "devise": "XOF", "description": "x", "reference": "a b"}),
            400,
            "invalid_request",
            Some("reference"),
        ),
        (json!({"montant": 100, "devise": "XOF", "description": "x", "couleur": "bleu"}), 400, "invalid_request", None),
    ];
    for (body, status, code, field) in cases {
        let resp = app.send(app.post("/v1/liens").json(&body)).await;
        if field.is_none() && resp.json["error"]["field"].is_string() {
            assert_error(&resp, status, code, resp.json["error"]["field"].as_str());
        } else {
            assert_error(&resp, status, code, field);
        }
    }
    create_link(&app, &json!({"montant": 100, "devise": "XOF", "description": "x", "reference": "unique-1"})).await;
    let again = app
        .send(
            app.post("/v1/liens")
                .json(&json!({"montant": 100, "devise": "XOF", "description": "y", "reference": "unique-1"})),
        )
        .await;
    assert_error(&again, 409, "duplicate_reference", Some("reference"));
    // A payment's metadata cannot claim a link.
    let mut payment = crate::support::payment_body(1_000, "55");
    payment["metadata"] = json!({"lien_id": "lnk_01JD0000000000000000000000"});
    assert_error(&app.post_payment(&payment).await, 400, "invalid_request", Some("metadata"));
}

/// A link nobody could pay is refused when it is made: here a fournisseur whose fee takes the whole amount.
/// Left to choose, the link gets the fournisseurs that can take it.
#[actix_web::test]
async fn a_link_no_customer_could_pay_is_refused() {
    let app = spawn_app_with(|s| {
        for p in &mut s.providers {
            if p.code.as_str() == "wave" {
                p.fee = caisse_engine::domain::money::FeeRule::new(
                    0,
                    caisse_engine::domain::money::Amount::new(500).unwrap(),
                )
                .unwrap();
            }
        }
    })
    .await;
    let body = json!({"montant": 500, "devise": "XOF", "description": "x", "fournisseurs": ["wave"]});
    let refused = app.send(app.post("/v1/liens").json(&body)).await;
    assert_error(&refused, 400, "invalid_request", Some("montant"));
    assert!(text(&refused.json["error"]["message"]).contains("fee"), "{:?}", refused.json);
    let chosen = create_link(&app, &json!({"montant": 500, "devise": "XOF", "description": "x"})).await;
    let providers: Vec<&str> = chosen["fournisseurs"].as_array().unwrap().iter().map(text).collect();
    assert!(!providers.is_empty() && !providers.contains(&"wave"), "{providers:?}");
    let kept =
        create_link(&app, &json!({"montant": 501, "devise": "XOF", "description": "x", "fournisseurs": ["wave"]}))
            .await;
    assert_eq!(kept["fournisseurs"], json!(["wave"]));
}

#[actix_web::test]
async fn deactivation_is_final_and_lists_filter_by_status() {
    let app = spawn_app().await;
    let first = create_link(&app, &link_body(1_000)).await;
    let second =
        create_link(&app, &json!({"montant": 900, "devise": "XOF", "description": "b", "reference": "b-1"})).await;
    let id = text(&first["id"]);
    let off = app.send(app.post(&format!("/v1/liens/{id}/desactiver"))).await;
    off.expect(200);
    assert_eq!(off.json["statut"], "desactive");
    let again = app.send(app.post(&format!("/v1/liens/{id}/desactiver"))).await;
    assert_error(&again, 409, "invalid_state", None);
    // By reference too.
    let off = app.send(app.post("/v1/liens/b-1/desactiver").json(&json!({}))).await;
    off.expect(200);
    assert_eq!(off.json["id"], second["id"]);
    assert_error(
        &app.send(app.post("/v1/liens/lnk_01JD0000000000000000000000/desactiver")).await,
        404,
        "not_found",
        None,
    );

    let third = create_link(&app, &link_body(700)).await;
    let all = app.get_ok("/v1/liens").await;
    assert_list_shape(&all);
    let ids: Vec<&str> = all["data"].as_array().unwrap().iter().map(|l| text(&l["id"])).collect();
    assert_eq!(ids, [text(&third["id"]), text(&second["id"]), id], "newest first");
    let active = app.get_ok("/v1/liens?statut=actif").await;
    assert_eq!(active["data"].as_array().unwrap().len(), 1);
    let page = app.get_ok("/v1/liens?limit=1").await;
    assert_eq!(page["has_more"], true);
    let next = app.get_ok(&format!("/v1/liens?limit=2&starting_after={}", text(&page["next_cursor"]))).await;
    assert_eq!(next["data"].as_array().unwrap().len(), 2);
    assert_eq!(next["has_more"], false);
    assert_error(&app.send(app.get("/v1/liens?statut=perdu")).await, 400, "invalid_request", Some("statut"));
    assert_error(
        &app.send(app.get("/v1/liens?starting_after=ret_1")).await,
        400,
        "invalid_request",
        Some("starting_after"),
    );
}

#[actix_web::test]
async fn a_link_expires_at_its_expire_at() {
    let app = spawn_app().await;
    let soon = caisse_engine::domain::time::Timestamp::now().plus_ms(1_200).to_rfc3339();
    let link =
        create_link(&app, &json!({"montant": 1_000, "devise": "XOF", "description": "x", "expire_at": soon})).await;
    let id = text(&link["id"]);
    assert_eq!(link["statut"], "actif");
    let expired = crate::support::eventually("the link to expire", std::time::Duration::from_secs(10), || async {
        let l = app.get_ok(&format!("/v1/liens/{id}")).await;
        if l["statut"] == "expire" {
            Ok(l)
        } else {
            Err(format!("still {}", l["statut"]))
        }
    })
    .await;
    assert_eq!(expired["statut"], "expire");
    assert_eq!(app.get_ok("/v1/liens?statut=expire").await["data"][0]["id"], link["id"]);
    assert_error(&app.send(app.post(&format!("/v1/liens/{id}/desactiver"))).await, 409, "invalid_state", None);
}

#[actix_web::test]
async fn links_belong_to_their_merchant() {
    let app = spawn_app().await;
    let link =
        create_link(&app, &json!({"montant": 1_000, "devise": "XOF", "description": "x", "reference": "mine"})).await;
    let other = app.create_merchant("Autre Boutique", None).await;
    let api = app.with_key(&other.merchant.secret_key);
    let id = text(&link["id"]);
    assert_error(&api.send(api.get(&format!("/v1/liens/{id}"))).await, 404, "not_found", None);
    assert_error(&api.send(api.get("/v1/liens/mine")).await, 404, "not_found", None);
    assert_error(&api.send(api.post(&format!("/v1/liens/{id}/desactiver"))).await, 404, "not_found", None);
    assert!(api.get_ok("/v1/liens").await["data"].as_array().unwrap().is_empty());
    // The other merchant may use the same reference for its own link.
    let resp = api
        .send(
            api.post("/v1/liens")
                .json(&json!({"montant": 1_000, "devise": "XOF", "description": "y", "reference": "mine"})),
        )
        .await;
    resp.expect(201);
    assert_error(&app.send(app.get("/v1/liens/pas%20un%20id")).await, 404, "not_found", None);
}

#[actix_web::test]
async fn production_serves_links_only_under_an_https_public_url() {
    let app = spawn_production_app().await;
    let resp = app.send(app.post("/v1/liens").json(&link_body(1_000))).await;
    assert_error(&resp, 503, "unavailable", None);
    assert!(text(&resp.json["error"]["message"]).contains("public_url"));
    // Under an https public_url, links are made there, and their url_retour must be https too. (The test
    // server keeps the simulator on in production, so its fournisseurs are active.)
    let app = crate::support::spawn_app_with(|s| {
        s.environment = caisse::config::Environment::Production;
        s.public_url = "https://pay.example.com".into();
    })
    .await;
    let body = json!({"montant": 1_000, "devise": "XOF", "description": "x", "fournisseurs": ["mtn_momo"]});
    let link = create_link(&app, &body).await;
    assert_eq!(link["url"], format!("https://pay.example.com/payer/{}", text(&link["id"])));
    let plain =
        json!({"montant": 1_000, "devise": "XOF", "description": "x", "url_retour": "http://shop.example.com/"});
    assert_error(&app.send(app.post("/v1/liens").json(&plain)).await, 400, "invalid_request", Some("url_retour"));
    // An http public_url is not enough in production.
    let app = crate::support::spawn_app_with(|s| {
        s.environment = caisse::config::Environment::Production;
        s.public_url = "http://pay.example.com".into();
    })
    .await;
    assert_error(&app.send(app.post("/v1/liens").json(&link_body(1_000))).await, 503, "unavailable", None);
}

/// A retry the checks would now refuse is answered from what the first request did: a link whose `expire_at`
/// has passed since is still the first answer, and another request under the key, even one the checks refuse,
/// is 409 `idempotency_key_reused`.
#[actix_web::test]
async fn a_retry_after_its_expire_at_passed_is_the_first_answer_again() {
    let app = spawn_app().await;
    let soon = caisse_engine::domain::time::Timestamp::now().plus_ms(1_200).to_rfc3339();
    let body = json!({"montant": 1_000, "devise": "XOF", "description": "x", "expire_at": soon});
    let first = app.send(app.post("/v1/liens").idem("lien-court").json(&body)).await;
    first.expect(201);
    actix_web::rt::time::sleep(std::time::Duration::from_millis(1_500)).await;
    let again = app.send(app.post("/v1/liens").idem("lien-court").json(&body)).await;
    again.expect(201);
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.json["id"], first.json["id"]);
    let other = json!({"montant": 1_000, "devise": "ZZZ", "description": "x"});
    assert_error(
        &app.send(app.post("/v1/liens").idem("lien-court").json(&other)).await,
        409,
        "idempotency_key_reused",
        None,
    );
    // Without a key the same body is checked, and refused.
    let fresh = app.send(app.post("/v1/liens").json(&body)).await;
    assert_error(&fresh, 400, "invalid_request", Some("expire_at"));
}

#[actix_web::test]
async fn a_link_request_replayed_with_its_idempotency_key_makes_one_link() {
    let app = spawn_app().await;
    let first = app.send(app.post("/v1/liens").idem("lien-1").json(&link_body(1_000))).await;
    first.expect(201);
    let again = app.send(app.post("/v1/liens").idem("lien-1").json(&link_body(1_000))).await;
    again.expect(201);
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.json["id"], first.json["id"]);
    let other = app.send(app.post("/v1/liens").idem("lien-1").json(&link_body(2_000))).await;
    assert_error(&other, 409, "idempotency_key_reused", None);
    assert_eq!(app.get_ok("/v1/liens").await["data"].as_array().map(Vec::len), Some(1));
    // Deactivation takes a key too, and its replay is the first answer.
    let path = format!("/v1/liens/{}/desactiver", text(&first.json["id"]));
    let off = app.send(app.post(&path).idem("off-1")).await;
    off.expect(200);
    let replay = app.send(app.post(&path).idem("off-1")).await;
    replay.expect(200);
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(replay.json, off.json);
}
