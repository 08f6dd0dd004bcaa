//! The merchant examples in `examples/` (Python, Node, Rust) accept real deliveries from Caisse, verify both
//! the spec's signature and the Standard Webhooks one, handle each notification once by its `webhook-id`, and
//! refuse tampered, forged, stale and malformed ones with the statuses given in docs/api.md § Webhook signature.

use std::net::TcpListener;
use std::process::Command;
use std::time::Duration;

use actix_web::{web, App, HttpServer};
use caisse_engine::domain::records::{DeliveryState, Merchant, Notification};
use caisse_engine::webhook::{sign, sign_standard};
use serde_json::{json, Value};

use crate::process::ChildProcess;
use crate::rust_example;
use crate::support::*;

const PYTHON: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/webhook_receiver.py");
const NODE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/webhook_receiver.js");

fn have(interpreter: &str) -> bool {
    Command::new(interpreter).arg("--version").output().is_ok_and(|o| o.status.success())
}

/// The Standard Webhooks headers of one request: `webhook-id`, and `webhook-signature` (the timestamp is the
/// spec's, sent under both names).
struct Standard {
    id: String,
    signature: String,
}

impl Standard {
    /// The headers Caisse sends for notification `id`'s `body` at `now`.
    fn genuine(key: &str, id: &str, now: u64, body: &[u8]) -> Standard {
        Standard { id: id.to_owned(), signature: sign_standard(key, id, now, body) }
    }
}

/// Posts `body` with the given header values (None: header left out); returns the status and JSON answer.
async fn post(
    url: &str,
    body: &[u8],
    signature: Option<&str>,
    timestamp: Option<&str>,
    standard: Option<&Standard>,
) -> (u16, Value) {
    let client = awc::Client::builder().timeout(Duration::from_secs(10)).finish();
    let mut request = client.post(url).insert_header(("Content-Type", "application/json"));
    if let Some(signature) = signature {
        request = request.insert_header(("X-Service-Signature", signature));
    }
    if let Some(timestamp) = timestamp {
        request = request.insert_header(("X-Service-Timestamp", timestamp));
        request = request.insert_header(("webhook-timestamp", timestamp));
    }
    if let Some(standard) = standard {
        request = request.insert_header(("webhook-id", standard.id.as_str()));
        request = request.insert_header(("webhook-signature", standard.signature.as_str()));
    }
    let mut response = request.send_body(body.to_vec()).await.expect("the receiver answers");
    let bytes = response.body().await.expect("answer body");
    (response.status().as_u16(), serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// Runs Caisse's deliveries and a set of hostile requests against a receiver at `url` that has `merchant`'s
/// key; `accepted` reads what the receiver reported as handled (one line per event).
async fn exercise(app: &TestApp, merchant: &Merchant, url: &str, accepted: &dyn Fn() -> Vec<String>) {
    let key = merchant.secret_key.as_str();
    let succeeded = real_deliveries_are_handled_once(app, merchant, accepted).await;
    let now = unix_s();
    forged_tampered_and_stale_ones_are_refused(url, key, &succeeded, now).await;
    assert_eq!(accepted().len(), 3, "nothing refused was handled: {:?}", accepted());
    duplicates_are_acknowledged_and_raw_bytes_are_verified(url, key, &succeeded, now, accepted).await;
}

/// Lines the receiver reported, once there are `count` of them.
async fn handled(what: &str, count: usize, accepted: &dyn Fn() -> Vec<String>) -> Vec<String> {
    eventually(what, DEADLINE, || {
        let lines = accepted();
        std::future::ready(if lines.len() == count { Ok(lines) } else { Err(format!("{lines:?}")) })
    })
    .await
}

/// Real deliveries of a successful payment: each acknowledged with a 200 and handled once. Returns the
/// stored `payment.succeeded` notification.
async fn real_deliveries_are_handled_once(
    app: &TestApp,
    merchant: &Merchant,
    accepted: &dyn Fn() -> Vec<String>,
) -> Notification {
    let reference = reference_of(&app.with_key(&merchant.secret_key).fund(10_000).await);
    let log = app.wait_notifications(&merchant.id, 3, DEADLINE, |n| n.state == DeliveryState::Delivered).await;
    assert!(log.iter().all(|n| n.attempts.iter().all(|a| a.http_status == Some(200))), "{}", describe(&log));
    let lines = handled("one line per event", 3, accepted).await;
    for event in ["payment.initiated", "payment.processing", "payment.succeeded"] {
        assert!(lines.iter().any(|l| l.contains(event) && l.contains(&reference)), "{event}: {lines:?}");
    }
    log.into_iter().find(|n| n.event.as_str() == "payment.succeeded").expect("succeeded")
}

/// Copies of a genuine delivery (`n`, as Caisse signed it) that a receiver must refuse: tampered, forged or
/// unsigned under either scheme (401), stale or malformed timestamps or no `webhook-id` (400), authentic but
/// not a notification (400).
async fn forged_tampered_and_stale_ones_are_refused(url: &str, key: &str, n: &Notification, now: u64) {
    let stored = n.body.as_str();
    let body = stored.as_bytes();
    let ts = now.to_string();
    let genuine = sign(key, now, body);
    let standard = Standard::genuine(key, &n.id, now, body);
    let std = Some(&standard);
    // A tampered copy under a header that is valid for the original: 401.
    let original = "\"montant\":10000,";
    assert!(stored.contains(original), "{stored}");
    let tampered = stored.replace(original, "\"montant\":99999999,");
    assert_eq!(post(url, tampered.as_bytes(), Some(&genuine), Some(&ts), std).await.0, 401, "tampered body");
    // Forged with another key, signed with the wrong prefix, not signed, or the timestamp changed: 401.
    let forged = sign("sk_test_not_the_merchants_key_000000", now, body);
    assert_eq!(post(url, body, Some(&forged), Some(&ts), std).await.0, 401, "other key");
    assert_eq!(post(url, body, Some(&genuine.replacen("sha256=", "sha1=", 1)), Some(&ts), std).await.0, 401, "prefix");
    assert_eq!(post(url, body, None, Some(&ts), std).await.0, 401, "no signature");
    assert_eq!(post(url, body, Some(&genuine), Some(&(now + 1).to_string()), std).await.0, 401, "other timestamp");
    // The spec's signature genuine, the Standard Webhooks one forged, for another id, or absent: 401.
    let other_key = Standard::genuine("sk_test_not_the_merchants_key_000000", &n.id, now, body);
    assert_eq!(post(url, body, Some(&genuine), Some(&ts), Some(&other_key)).await.0, 401, "standard, other key");
    let other_id = Standard { id: "evt_01JD0000000000000000000000".into(), signature: standard.signature.clone() };
    assert_eq!(post(url, body, Some(&genuine), Some(&ts), Some(&other_id)).await.0, 401, "standard, another id");
    let unsigned = Standard { id: n.id.clone(), signature: String::new() };
    assert_eq!(post(url, body, Some(&genuine), Some(&ts), Some(&unsigned)).await.0, 401, "standard, not signed");
    assert_eq!(post(url, body, Some(&genuine), Some(&ts), None).await.0, 400, "no webhook-id");
    // Stale or malformed timestamps, correctly signed: 400.
    for stale in [now - 400, now + 400] {
        let fresh = Standard::genuine(key, &n.id, stale, body);
        let (status, _) = post(url, body, Some(&sign(key, stale, body)), Some(&stale.to_string()), Some(&fresh)).await;
        assert_eq!(status, 400, "timestamp {stale} vs now {now}");
    }
    assert_eq!(post(url, body, Some(&genuine), Some("soon"), std).await.0, 400, "malformed timestamp");
    assert_eq!(post(url, body, Some(&genuine), None, std).await.0, 400, "no timestamp");
    // Authentic but not a notification: 400.
    let junk = b"not json";
    let junk_standard = Standard::genuine(key, "evt_01JD0000000000000000000001", now, junk);
    assert_eq!(post(url, junk, Some(&sign(key, now, junk)), Some(&ts), Some(&junk_standard)).await.0, 400, "not JSON");
}

/// A genuine duplicate (the same `webhook-id`) is acknowledged, not handled again; the same event and
/// reference under another id is another notification (a payment sends `payment.refunded` once per refund),
/// so it is handled. The same notification written with other whitespace, signed over its own raw bytes, is
/// accepted, which a receiver verifying a re-serialised body would get wrong.
async fn duplicates_are_acknowledged_and_raw_bytes_are_verified(
    url: &str,
    key: &str,
    n: &Notification,
    now: u64,
    accepted: &dyn Fn() -> Vec<String>,
) {
    let body = n.body.as_bytes();
    let ts = now.to_string();
    let genuine = sign(key, now, body);
    let received = (200, json!({"received": true}));
    let standard = Standard::genuine(key, &n.id, now, body);
    assert_eq!(post(url, body, Some(&genuine), Some(&ts), Some(&standard)).await, received, "duplicate");
    sleep_ms(200).await;
    assert_eq!(accepted().len(), 3, "a duplicate is not handled again: {:?}", accepted());
    let another = Standard::genuine(key, "evt_01JD0000000000000000000002", now, body);
    assert_eq!(post(url, body, Some(&genuine), Some(&ts), Some(&another)).await, received, "another id");
    handled("another notification, same event and reference", 4, accepted).await;
    let mut value: Value = serde_json::from_slice(body).expect("JSON");
    value["data"]["reference"] = json!("cmd-pretty");
    let pretty = serde_json::to_vec_pretty(&value).expect("JSON");
    let pretty_standard = Standard::genuine(key, "evt_01JD0000000000000000000003", now, &pretty);
    assert_eq!(post(url, &pretty, Some(&sign(key, now, &pretty)), Some(&ts), Some(&pretty_standard)).await, received);
    let lines = handled("the pretty one handled", 5, accepted).await;
    assert!(lines.iter().any(|l| l.contains("payment.succeeded") && l.contains("cmd-pretty")), "{lines:?}");
}

/// Runs an interpreter's example on a free port with the key of a merchant whose webhooks go there.
async fn script_example(interpreter: &str, file: &str) {
    if !have(interpreter) {
        eprintln!("SKIPPED: `{interpreter}` is not installed, so {file} was not exercised");
        return;
    }
    let app = spawn_app().await;
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}/caisse/webhooks");
    let merchant = app.create_merchant(interpreter, Some(&url)).await.merchant;
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
    let app = spawn_app().await;
    let listener = TcpListener::bind("127.0.0.1:0").expect("binds");
    let url = format!("http://{}/caisse/webhooks", listener.local_addr().expect("address"));
    let merchant = app.create_merchant("Rustacean", Some(&url)).await.merchant;
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
