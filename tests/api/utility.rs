//! `GET /v1/ping`, `GET /v1/devises`, `GET /v1/fournisseurs` (docs/api.md § Utility endpoints).

use serde_json::Value;

use crate::support::{assert_error, int, spawn_app, text};

#[actix_web::test]
async fn ping_needs_no_key() {
    let app = spawn_app().await;
    assert!(app.port != 0 && app.address == format!("http://127.0.0.1:{}", app.port), "a random loopback port");
    for req in [app.get("/v1/ping").no_auth(), app.get("/v1/ping"), app.get("/v1/ping").auth("sk_test_wrong")] {
        let resp = app.send(req).await;
        resp.expect(200);
        let body = &resp.json;
        let mut keys: Vec<&str> = body.as_object().expect("object").keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["environment", "status", "time", "version"], "{body}");
        assert_eq!(body["status"], "ok");
        assert_eq!(body["environment"], "sandbox");
        assert!(!text(&body["version"]).is_empty());
        assert!(text(&body["time"]).ends_with('Z'));
    }
}

#[actix_web::test]
async fn devises_lists_codes_names_and_decimals() {
    let app = spawn_app().await;
    let body = app.get_ok("/v1/devises").await;
    assert_eq!(body.as_object().expect("object").keys().collect::<Vec<_>>(), ["data"]);
    let rows = body["data"].as_array().expect("data");
    for row in rows {
        let mut keys: Vec<&str> = row.as_object().expect("row").keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["code", "decimales", "nom"], "{row}");
        assert!(!text(&row["nom"]).is_empty());
    }
    let decimals = |code: &str| rows.iter().find(|r| r["code"] == code).map(|r| int(&r["decimales"]));
    for (code, d) in [("XOF", 0), ("XAF", 0), ("GNF", 0), ("EUR", 2), ("USD", 2)] {
        assert_eq!(decimals(code), Some(d), "{code}");
    }
    let resp = app.send(app.get("/v1/devises").no_auth()).await;
    assert_error(&resp, 401, "unauthorized", None);
}

#[actix_web::test]
async fn fournisseurs_lists_every_provider() {
    let app = spawn_app().await;
    let body = app.get_ok("/v1/fournisseurs").await;
    let rows = body["data"].as_array().expect("data");
    for code in ["mtn_momo", "orange_money", "moov_money", "wave"] {
        let p = rows.iter().find(|r| r["code"] == code).unwrap_or_else(|| panic!("{code} listed: {body}"));
        for f in ["code", "nom", "pays", "devises", "operations", "frais", "montant_min", "montant_max", "actif"] {
            assert!(p.get(f).is_some(), "{code} has {f}: {p}");
        }
        assert!(!text(&p["nom"]).is_empty());
        assert!(p["pays"].as_array().is_some_and(|a| !a.is_empty() && a.iter().all(Value::is_string)), "{p}");
        assert!(p["devises"].as_array().is_some_and(|a| a.iter().any(|d| d == "XOF")), "{p}");
        assert_eq!(p["operations"], serde_json::json!(["paiement", "remboursement", "retrait"]), "{p}");
        let fee = p["frais"].as_object().expect("frais");
        assert!(fee["pourcentage_bps"].is_u64() && fee["fixe"].is_i64(), "{p}");
        assert!(int(&p["montant_min"]) > 0 && int(&p["montant_min"]) <= int(&p["montant_max"]), "{p}");
        assert_eq!(p["actif"], true, "sandbox providers are all active");
    }
    assert_eq!(rows.iter().find(|r| r["code"] == "mtn_momo").expect("mtn")["frais"]["pourcentage_bps"], 150);
    let resp = app.send(app.get("/v1/fournisseurs").no_auth()).await;
    assert_error(&resp, 401, "unauthorized", None);
}
