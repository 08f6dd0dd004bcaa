//! The merchant examples in `examples/` (Python, Node, Rust) accept real deliveries from Caisse, print each
//! event once, and refuse tampered, forged, stale and malformed ones with the statuses given in
//! docs/api.md § Webhook signature.

use std::net::TcpListener;
use std::process::Command;

use actix_web::{web, App, HttpServer};
use caisse_engine::domain::records::{DeliveryState, Merchant};
use caisse_engine::webhook::sign;
use serde_json::{json, Value};

use crate::rust_example;
use crate::support::*;

const PYTHON: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/webhook_receiver.py");
const NODE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/webhook_receiver.js");

fn have(interpreter: &str) -> bool {
    Command::new(interpreter).arg("--version").output().is_ok_and(|o| o.status.success())
}

/// Posts `body` with the given header values (None: header left out); returns the status and JSON answer.
async fn post(url: &str, body: &[u8], signature: Option<&str>, timestamp: Option<&str>) -> (u16, Value) {
    let mut request = api_client().post(url).insert_header(("Content-Type", "application/json"));
    if let Some(signature) = signature {
        request = request.insert_header(("X-Service-Signature", signature));
    }
    if let Some(timestamp) = timestamp {
        request = request.insert_header(("X-Service-Timestamp", timestamp));
    }
    let mut response = request.send_body(body.to_vec()).await.expect("the receiver answers");
    let bytes = response.body().await.expect("answer body");
    (response.status().as_u16(), serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// Runs Caisse's deliveries and a set of hostile requests against a receiver at `url` that has `merchant`'s
/// key; `accepted` reads what the receiver reported as handled (one line per event).
async fn exercise(app: &TestApp, merchant: &Merchant, url: &str, accepted: &dyn Fn() -> Vec<String>) {
    let key = merchant.secret_key.as_str();
    let reference = app.paid(key, 10_000).await;

    // Real deliveries: each acknowledged with a 200 and handled once.
    let log = app.wait_notifications(&merchant.id, 3, DEADLINE, |n| n.state == DeliveryState::Delivered).await;
    assert!(log.iter().all(|n| n.attempts.iter().all(|a| a.http_status == Some(200))), "{}", describe(&log));
    let lines = eventually("one line per event", DEADLINE, || {
        let lines = accepted();
        if lines.len() == 3 {
            Ok(lines)
        } else {
            Err(format!("{lines:?}"))
        }
    })
    .await;
    for event in ["payment.initiated", "payment.processing", "payment.succeeded"] {
        assert!(lines.iter().any(|l| l.contains(event) && l.contains(&reference)), "{event}: {lines:?}");
    }

    let succeeded = log.iter().find(|n| n.event.as_str() == "payment.succeeded").expect("succeeded");
    let body = succeeded.body.as_bytes();
    let now = unix_s();
    let ts = now.to_string();
    let genuine = sign(key, now, body);

    // A tampered copy under a header that is valid for the original: 401.
    let original = "\"montant\":10000,";
    assert!(succeeded.body.contains(original), "{}", succeeded.body);
    let tampered = succeeded.body.replace(original, "\"montant\":99999999,");
    assert_eq!(post(url, tampered.as_bytes(), Some(&genuine), Some(&ts)).await.0, 401, "tampered body");
    // Forged with another key, signed with the wrong prefix, not signed, or the timestamp changed: 401.
    let forged = sign("sk_test_not_the_merchants_key_000000", now, body);
    assert_eq!(post(url, body, Some(&forged), Some(&ts)).await.0, 401, "other key");
    assert_eq!(post(url, body, Some(&genuine.replacen("sha256=", "sha1=", 1)), Some(&ts)).await.0, 401, "prefix");
    assert_eq!(post(url, body, None, Some(&ts)).await.0, 401, "no signature");
    assert_eq!(post(url, body, Some(&genuine), Some(&(now + 1).to_string())).await.0, 401, "other timestamp");
    // Stale or malformed timestamps, correctly signed: 400.
    for stale in [now - 400, now + 400] {
        let (status, _) = post(url, body, Some(&sign(key, stale, body)), Some(&stale.to_string())).await;
        assert_eq!(status, 400, "timestamp {stale} vs now {now}");
    }
    assert_eq!(post(url, body, Some(&genuine), Some("soon")).await.0, 400, "malformed timestamp");
    assert_eq!(post(url, body, Some(&genuine), None).await.0, 400, "no timestamp");
    // Authentic but not a notification: 400.
    let junk = b"not json";
    assert_eq!(post(url, junk, Some(&sign(key, now, junk)), Some(&ts)).await.0, 400, "not JSON");
    assert_eq!(accepted().len(), 3, "nothing refused was handled: {:?}", accepted());

    // A genuine duplicate: acknowledged, not handled again.
    assert_eq!(post(url, body, Some(&genuine), Some(&ts)).await, (200, json!({"received": true})), "duplicate");
    // The same notification written with other whitespace, signed over its own raw bytes: accepted, which
    // a receiver verifying a re-serialised body would get wrong.
    let mut value: Value = serde_json::from_slice(body).expect("JSON");
    value["data"]["reference"] = json!("cmd-pretty");
    let pretty = serde_json::to_vec_pretty(&value).expect("JSON");
    assert_eq!(post(url, &pretty, Some(&sign(key, now, &pretty)), Some(&ts)).await, (200, json!({"received": true})));
    let lines = eventually("the pretty one handled", DEADLINE, || {
        let lines = accepted();
        if lines.len() == 4 {
            Ok(lines)
        } else {
            Err(format!("{lines:?}"))
        }
    })
    .await;
    assert!(lines.iter().any(|l| l.contains("payment.succeeded") && l.contains("cmd-pretty")), "{lines:?}");
}

/// Runs an interpreter's example on a free port with the key of a merchant whose webhooks go there.
async fn script_example(interpreter: &str, file: &str) {
    if !have(interpreter) {
        eprintln!("SKIPPED: `{interpreter}` is not installed, so {file} was not exercised");
        return;
    }
    let app = start_app(|_| {}).await;
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}/caisse/webhooks");
    let merchant = app.merchant(interpreter, &url).await;
    let mut command = Command::new(interpreter);
    command.arg(file).arg(port.to_string()).env("CAISSE_SECRET_KEY", &merchant.secret_key).env_remove("PORT");
    let mut child = ChildProcess::spawn(command).expect("the example starts");
    child.wait_listening(port, file).await;
    exercise(&app, &merchant, &url, &|| child.lines()).await;
    assert!(child.child.try_wait().expect("status").is_none(), "{file} is still running");
}

#[actix_web::test]
async fn the_python_example_accepts_real_deliveries_and_refuses_tampered_ones() {
    script_example("python3", PYTHON).await;
}

#[actix_web::test]
async fn the_node_example_accepts_real_deliveries_and_refuses_tampered_ones() {
    script_example("node", NODE).await;
}

#[actix_web::test]
async fn the_rust_example_accepts_real_deliveries_and_refuses_tampered_ones() {
    let app = start_app(|_| {}).await;
    let listener = TcpListener::bind("127.0.0.1:0").expect("binds");
    let url = format!("http://{}/caisse/webhooks", listener.local_addr().expect("address"));
    let merchant = app.merchant("Rustacean", &url).await;
    // The example's own handler and state, served as its `main` serves them.
    let receiver = web::Data::new(rust_example::Receiver::new(merchant.secret_key.clone()));
    let state = receiver.clone();
    let server = HttpServer::new(move || {
        App::new().app_data(state.clone()).route("/{path:.*}", web::post().to(rust_example::webhook))
    })
    .workers(1)
    .disable_signals()
    .listen(listener)
    .expect("listens")
    .run();
    let handle = server.handle();
    actix_web::rt::spawn(server);
    let handled = receiver.clone();
    exercise(&app, &merchant, &url, &|| handled.handled().into_iter().map(|(e, r)| format!("{e} {r}")).collect()).await;
    drop(handle.stop(false));
}
