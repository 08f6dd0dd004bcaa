//! The error rows of docs/api.md § Errors that are not about one resource: authentication, unknown endpoints, body
//! size and type, malformed JSON, rate limiting, and the `Request-Id` header on every answer.

use std::collections::HashSet;

use actix_web::http::Method;
use serde_json::json;

use crate::support::{assert_error, payment_body, payout_body, spawn_app, spawn_app_with, TestApp};

/// Every merchant endpoint (all but ping), with a body where it takes one.
fn merchant_requests(app: &TestApp) -> Vec<crate::support::Req> {
    vec![
        app.post("/v1/paiement/initier").json(&payment_body(1000, "02")),
        app.get("/v1/paiement/pay_01ARZ3NDEKTSV4RRFFQ69G5FAV"),
        app.post("/v1/paiement/pay_01ARZ3NDEKTSV4RRFFQ69G5FAV/rembourser"),
        app.get("/v1/transactions"),
        app.get("/v1/transactions/pay_01ARZ3NDEKTSV4RRFFQ69G5FAV"),
        app.get("/v1/soldes"),
        app.post("/v1/retraits").json(&payout_body(1000, "99")),
        app.get("/v1/retraits"),
        app.get("/v1/retraits/ret_01ARZ3NDEKTSV4RRFFQ69G5FAV"),
        app.get("/v1/devises"),
        app.get("/v1/fournisseurs"),
    ]
}

#[actix_web::test]
async fn every_merchant_endpoint_needs_a_valid_key() {
    // A hundred wrong keys from one address: more than the per-address allowance (tested in hostile/limits).
    let app = spawn_app_with(|s| s.failed_auth_per_minute = 0).await;
    let live_key = format!("sk_live_{}", "aB3".repeat(10) + "xy"); // 32 alphanumerics
    let cases: Vec<(Option<String>, &str)> = vec![
        (None, "unauthorized"),
        (Some("Bearer".into()), "unauthorized"),
        (Some("Bearer ".into()), "unauthorized"),
        (Some(format!("Basic {}", app.key)), "unauthorized"),
        (Some(format!("bearer{}", app.key)), "unauthorized"),
        (Some("Bearer sk_test_00000000000000000000000000000000".into()), "unauthorized"),
        (Some(format!("Bearer {}x", app.key)), "unauthorized"),
        (Some(format!("Bearer {}", &app.key[..app.key.len() - 1])), "unauthorized"),
        (Some(format!("Bearer {}", app.key.replace("sk_test_", "sk_live_").to_uppercase())), "unauthorized"),
        (Some(format!("Bearer {live_key}")), "wrong_environment"),
        (Some(format!("Bearer {}", app.key.replace("sk_test_", "sk_live_"))), "wrong_environment"),
    ];
    for (header, code) in cases {
        for req in merchant_requests(&app) {
            let path = req.path.clone();
            let mut req = req.no_auth();
            if let Some(h) = &header {
                req = req.header("Authorization", h);
            }
            let resp = app.send(req).await;
            assert_error(&resp, 401, code, None);
            if code == "wrong_environment" {
                let message = resp.json["error"]["message"].as_str().unwrap_or("");
                assert!(message.contains("sandbox"), "{path}: says which environment this is: {message}");
            }
        }
    }
    // Nothing was created by any of these.
    assert_eq!(app.get_ok("/v1/transactions").await["data"], json!([]));
}

#[actix_web::test]
async fn unknown_endpoints_and_methods_are_404_in_the_contract_shape() {
    let app = spawn_app().await;
    for (method, path) in [
        (Method::GET, "/v1/nope"),
        (Method::GET, "/v1/paiement"),
        (Method::GET, "/v1/paiement/initier/extra/more"),
        (Method::DELETE, "/v1/paiement/pay_01ARZ3NDEKTSV4RRFFQ69G5FAV"),
        (Method::PUT, "/v1/soldes"),
        (Method::POST, "/v1/ping"),
        (Method::GET, "/v1/fournisseurs/mtn_momo/notifications"),
        (Method::GET, "/v1/"),
        (Method::GET, "/v1"),
    ] {
        let resp = app.send(app.req(method.clone(), path)).await;
        assert_eq!(resp.status, 404, "{method} {path}");
        assert_error(&resp, 404, "not_found", None);
    }
}

#[actix_web::test]
async fn bodies_over_64_kib_are_413() {
    let app = spawn_app().await;
    // Valid JSON, just too big (the description alone is far beyond the limit).
    let mut body = payment_body(1000, "02");
    body["description"] = json!("x".repeat(70 * 1024));
    let resp = app.send(app.post("/v1/paiement/initier").json(&body)).await;
    assert_error(&resp, 413, "payload_too_large", None);
    let resp = app.send(app.post("/v1/retraits").raw(Some("application/json"), vec![b' '; 64 * 1024 + 1])).await;
    assert_error(&resp, 413, "payload_too_large", None);
    let resp =
        app.send(app.post("/v1/paiement/x/rembourser").raw(Some("application/json"), vec![b' '; 100 * 1024])).await;
    assert_error(&resp, 413, "payload_too_large", None);
    // 64 KiB exactly is read (and then judged on its content).
    let mut exact = b"{}".to_vec();
    exact.resize(64 * 1024, b' ');
    let resp = app.send(app.post("/v1/paiement/initier").raw(Some("application/json"), exact)).await;
    assert_error(&resp, 400, "invalid_request", Some("montant"));
    // A chunked body without Content-Length is cut off too.
    let big = web_bytes(vec![b' '; 80 * 1024]);
    let resp = app
        .client
        .post(format!("{}/v1/paiement/initier", app.address))
        .insert_header(("Authorization", format!("Bearer {}", app.key)))
        .insert_header(("Content-Type", "application/json"))
        .send_stream(futures_util::stream::iter([Ok::<_, std::io::Error>(big)]))
        .await;
    let mut resp = resp.expect("answer");
    assert_eq!(resp.status().as_u16(), 413);
    assert!(resp.headers().contains_key("request-id"));
    let body: serde_json::Value = serde_json::from_slice(&resp.body().await.expect("body")).expect("json");
    assert_eq!(body["error"]["code"], "payload_too_large");
    assert_eq!(app.get_ok("/v1/transactions").await["data"], json!([]));
}

fn web_bytes(v: Vec<u8>) -> actix_web::web::Bytes {
    actix_web::web::Bytes::from(v)
}

#[actix_web::test]
async fn post_bodies_must_be_json() {
    let app = spawn_app().await;
    let json_text = serde_json::to_vec(&payment_body(1000, "02")).expect("json");
    for content_type in [None, Some("text/plain"), Some("application/x-www-form-urlencoded"), Some("application/jsonx")]
    {
        for path in ["/v1/paiement/initier", "/v1/retraits"] {
            let resp = app.send(app.post(path).raw(content_type, json_text.clone())).await;
            assert_error(&resp, 415, "unsupported_media_type", None);
        }
    }
    // Parameters after the media type are fine.
    let resp = app.send(app.post("/v1/paiement/initier").raw(Some("application/json; charset=utf-8"), json_text)).await;
    resp.expect(201);
}

#[actix_web::test]
async fn unparsable_bodies_are_invalid_json() {
    let app = spawn_app().await;
    for body in ["{", "{\"montant\": 1000,}", "not json", "{\"montant\": 1000} trailing", "\u{feff}{}", ""] {
        for path in ["/v1/paiement/initier", "/v1/retraits"] {
            let resp = app.send(app.post(path).raw(Some("application/json"), body)).await;
            assert_error(&resp, 400, "invalid_json", None);
        }
    }
    // Well-formed JSON of the wrong shape is invalid_request, said in plain words (no Rust type names).
    let wrong_types =
        [r#"{"montant": "mille", "devise": "XOF", "fournisseur": "mtn_momo", "client_telephone": "+22997000000"}"#];
    for body in ["[]", "42", "null", "\"text\"", wrong_types[0]] {
        let resp = app.send(app.post("/v1/paiement/initier").raw(Some("application/json"), body)).await;
        assert_eq!(resp.status, 400, "{body}");
        assert_eq!(resp.json["error"]["code"], "invalid_request", "{body}");
        let message = resp.json["error"]["message"].as_str().unwrap_or_default();
        for rust in ["i64", "u32", "struct", "sequence"] {
            assert!(!message.contains(rust), "{body}: {message}");
        }
    }
    let resp = app.send(app.post("/v1/paiement/initier").raw(Some("application/json"), vec![0xff, 0xfe, b'{'])).await;
    assert_error(&resp, 400, "invalid_json", None);
}

#[actix_web::test]
async fn too_many_requests_are_429_with_retry_after() {
    let app = spawn_app_with(|s| s.rate_limit_per_s = 1).await; // burst of 2
    let other = app.create_merchant("Other Shop", None).await.merchant.secret_key;
    let mut limited = None;
    for _ in 0..5 {
        let resp = app.send(app.get("/v1/soldes")).await;
        if resp.status == 429 {
            limited = Some(resp);
            break;
        }
        resp.expect(200);
    }
    let resp = limited.expect("the limit is reached within 5 requests");
    assert_error(&resp, 429, "rate_limited", None);
    let retry_after: u64 = resp.header("retry-after").expect("Retry-After").parse().expect("seconds");
    assert!((1..=2).contains(&retry_after), "{retry_after}");
    // The limit is per key: another merchant is not affected; ping is not limited.
    app.send(app.get("/v1/soldes").auth(&other)).await.expect(200);
    for _ in 0..5 {
        app.send(app.get("/v1/ping").no_auth()).await.expect(200);
    }
    // POSTs count too.
    let resp = app.send(app.post("/v1/paiement/initier").json(&payment_body(1000, "02"))).await;
    assert_error(&resp, 429, "rate_limited", None);
    // After Retry-After, the key works again.
    actix_web::rt::time::sleep(std::time::Duration::from_secs(retry_after)).await;
    app.send(app.get("/v1/soldes")).await.expect(200);
}

#[actix_web::test]
async fn every_answer_has_its_own_request_id() {
    let app = spawn_app().await;
    let mut seen = HashSet::new();
    let reqs = vec![
        app.get("/v1/ping").no_auth(),
        app.get("/v1/soldes"),
        app.get("/v1/soldes").no_auth(),
        app.get("/v1/nope"),
        app.post("/v1/paiement/initier").json(&payment_body(1000, "02")),
        app.post("/v1/paiement/initier").raw(Some("application/json"), "{"),
    ];
    for req in reqs {
        let resp = app.send(req).await; // `send` asserts the header is there
        assert!(seen.insert(resp.header("request-id").expect("Request-Id").to_owned()), "request ids are unique");
    }
}
