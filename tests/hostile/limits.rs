//! Abuse limits: the per-key rate limit as configured, and requests too big or too slow to be served.
//!
//! The request head (request line and headers) is bounded by actix-web's HTTP/1 decoder, which this service
//! keeps: at most 96 headers and 128 KiB of head in all, else `431 Request Header Fields Too Large`; a
//! request target over 64 KiB is `400`; a head not complete within 5 s (the client request timeout) is `408`.
//! Those answers come from the protocol layer, before any route runs, and close the connection; they still have
//! the API's error shape (`invalid_request`, a message, a `Request-Id`). A head within the bounds is served as usual, and what it carries is
//! judged by the API (a 64 KiB bearer key is simply unknown). A body must arrive whole within
//! [`BODY_TIMEOUT_MS`] s, for the API and for the dashboard's forms alike.
//!
//! These tests speak raw HTTP/1.1 over TCP, because a proper client refuses to send most of this.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use caisse::config::{Layer, Settings};
use caisse::http::extract::BODY_TIMEOUT_MS;

use crate::support::{assert_error, spawn_app, spawn_app_with};

/// Sends `request` on a new connection and reads the answer until the server closes it or 20 s pass.
/// Returns the answer's text and how long it took.
fn exchange(port: u16, request: Vec<u8>) -> (String, Duration) {
    let started = Instant::now();
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(20))).expect("read timeout");
    // The server may answer and close before it has read everything; the answer is what counts.
    let _ = stream.write_all(&request);
    let mut answer = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                answer.extend_from_slice(&buf[..n]);
                // One answer is enough: stop at the end of a head without body, or of a short body.
                let text = String::from_utf8_lossy(&answer);
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let length = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned())
                        })
                        .and_then(|v| v.parse::<usize>().ok())
                        .unwrap_or(0);
                    if body.len() >= length {
                        break;
                    }
                }
            }
        }
    }
    (String::from_utf8_lossy(&answer).into_owned(), started.elapsed())
}

async fn exchange_async(port: u16, request: Vec<u8>) -> (String, Duration) {
    actix_web::rt::task::spawn_blocking(move || exchange(port, request)).await.expect("exchange finished")
}

fn get(path: &str, headers: &[(String, String)]) -> Vec<u8> {
    let mut head = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    head.into_bytes()
}

#[track_caller]
fn assert_status(answer: &str, status: u16) {
    let line = answer.lines().next().unwrap_or("");
    assert!(line.starts_with(&format!("HTTP/1.1 {status} ")), "expected {status}, got `{line}`:\n{answer:.300}");
}

/// The HTTP layer's own refusals have the API's shape too: the status, `invalid_request`, a message, a
/// `Request-Id`, and the connection closed.
#[track_caller]
fn assert_refused(answer: &str, status: u16) {
    assert_status(answer, status);
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((answer, ""));
    let head = head.to_ascii_lowercase();
    assert!(head.contains("\r\ncontent-type: application/json\r\n"), "{answer:.500}");
    assert!(head.contains("\r\nrequest-id: req_"), "{answer:.500}");
    assert!(head.contains("\r\nconnection: close"), "{answer:.500}");
    let body: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer:.500}"));
    assert_eq!(body["error"]["code"], "invalid_request", "{answer:.500}");
    assert!(body["error"]["message"].as_str().is_some_and(|m| m.len() > 20), "{answer:.500}");
}

#[actix_web::test]
async fn the_rate_limit_comes_from_configuration_and_is_per_key() {
    let dir = tempfile::TempDir::new().expect("temp dir");
    let file = dir.path().join("caisse.toml");
    std::fs::write(&file, "").expect("empty configuration file");
    let env = |name: &str| (name == "CAISSE_RATE_LIMIT_PER_S").then(|| "3".to_owned());
    let loaded = Settings::load(Some(&file), env, Layer::from_flags(None, None, None)).expect("settings");
    assert_eq!(loaded.rate_limit_per_s, 3, "CAISSE_RATE_LIMIT_PER_S reaches the settings");
    let app = spawn_app_with(|s| s.rate_limit_per_s = loaded.rate_limit_per_s).await;
    let other = app.create_merchant("Other Shop", None).await.merchant.secret_key;

    let started = Instant::now();
    let mut served = 0;
    let limited = loop {
        let resp = app.send(app.get("/v1/transactions")).await;
        if resp.status == 429 {
            break resp;
        }
        resp.expect(200);
        served += 1;
        assert!(served <= 30, "30 requests at once and no 429");
    };
    // A burst of twice the rate, plus what refilled while the requests ran.
    let refilled = (started.elapsed().as_secs_f64() * 3.0).ceil() as usize;
    assert!((6..=6 + refilled).contains(&served), "{served} requests served before the first 429");
    assert_error(&limited, 429, "rate_limited", None);
    let retry_after: u64 = limited.header("retry-after").expect("Retry-After").parse().expect("whole seconds");
    assert!((1..=2).contains(&retry_after), "Retry-After: {retry_after}");

    // Per key: another merchant, the health check and the dashboard are not held back.
    for _ in 0..3 {
        app.send(app.get("/v1/soldes").auth(&other)).await.expect(200);
        app.send(app.get("/v1/ping").no_auth()).await.expect(200);
    }
    let login = app.client.get(format!("{}/login", app.address)).send().await.expect("login page");
    assert_eq!(login.status().as_u16(), 200);
    // Waiting as told is enough.
    actix_web::rt::time::sleep(Duration::from_secs(retry_after)).await;
    app.send(app.get("/v1/soldes")).await.expect(200);
}

/// Guessing keys costs a bounded number of answers per address: past the allowance of requests that fail
/// authentication, the address gets 429 with Retry-After before any work, whatever key it then sends; the
/// dashboard and provider notices are not counted.
#[actix_web::test]
async fn an_address_that_keeps_failing_authentication_is_slowed_down() {
    let app = spawn_app().await;
    let guesser = app.with_key("sk_test_0000000000000000000000000000000X");
    for _ in 0..app.state.settings.failed_auth_per_minute {
        guesser.send(guesser.get("/v1/soldes")).await.expect(401);
    }
    let refused = guesser.send(guesser.get("/v1/soldes")).await;
    assert_error(&refused, 429, "rate_limited", None);
    assert!(refused.header("retry-after").is_some_and(|s| s.parse::<u64>().is_ok_and(|s| s >= 1)));
    app.send(app.get("/v1/soldes")).await.expect(429);
    // What needs no key is not refused: a health check from behind the same address keeps working.
    app.send(app.get("/v1/ping").no_auth()).await.expect(200);
    app.send(app.get("/v1/openapi.json").no_auth()).await.expect(200);
    // The dashboard is the login's business, with its own throttling.
    let login = app.fetch(app.get("/login").no_auth()).await;
    login.expect(200);
}

#[actix_web::test]
async fn request_heads_are_bounded_and_the_server_stays_up() {
    let app = spawn_app().await;
    let port = app.port;
    let big = |kib: usize| "a".repeat(kib * 1024);

    // Within the bounds: a 64 KiB header is read, and the API judges what it carries.
    let (answer, _) = exchange_async(port, get("/v1/ping", &[("X-Padding".into(), big(64))])).await;
    assert_status(&answer, 200);
    let (answer, _) =
        exchange_async(port, get("/v1/soldes", &[("Authorization".into(), format!("Bearer {}", big(64)))])).await;
    assert_status(&answer, 401);
    assert!(answer.contains("\"unauthorized\""), "{answer:.500}");
    // A key that is not ASCII is named as such, not as a missing header.
    let (answer, _) =
        exchange_async(port, get("/v1/soldes", &[("Authorization".into(), "Bearer sk_tést".to_owned())])).await;
    assert_status(&answer, 401);
    assert!(answer.contains("must be printable ASCII"), "{answer:.500}");
    let idempotency = get("/v1/ping", &[("Idempotency-Key".into(), big(64)), ("Cookie".into(), big(60))]);
    assert_status(&exchange_async(port, idempotency).await.0, 200);

    // Beyond them: a 130 KiB header, 100 headers, a 70 KiB request target.
    let (answer, _) = exchange_async(port, get("/v1/ping", &[("X-Padding".into(), big(130))])).await;
    assert_refused(&answer, 431);
    let many: Vec<(String, String)> = (0..100).map(|i| (format!("X-Header-{i}"), "1".to_owned())).collect();
    assert_refused(&exchange_async(port, get("/v1/ping", &many)).await.0, 431);
    let (answer, _) = exchange_async(port, get("/v1/ping", &many[..90])).await;
    assert_status(&answer, 200);
    assert_refused(&exchange_async(port, get(&format!("/v1/ping?{}", big(70)), &[])).await.0, 400);
    assert_refused(&exchange_async(port, get(&format!("/transactions?q={}", big(70)), &[])).await.0, 400);
    // Not HTTP at all, a header that is not one, a control character in a header's value.
    assert_refused(&exchange_async(port, b"HELLO\r\n\r\n".to_vec()).await.0, 400);
    assert_refused(&exchange_async(port, get("/v1/ping", &[("No colon here".into(), "x".into())])).await.0, 400);
    let control = b"GET /v1/ping HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Bad: a\x01b\r\n\r\n".to_vec();
    assert_refused(&exchange_async(port, control).await.0, 400);

    // A refusal pipelined behind a request that is served: both answers arrive whole and in order; the refusal
    // shares its write with the first answer, so it stays bare.
    let mut pipelined = get("/v1/ping", &[]);
    pipelined.extend_from_slice(b"HELLO\r\n\r\n");
    let answer = actix_web::rt::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        stream.set_read_timeout(Some(Duration::from_secs(20))).expect("read timeout");
        stream.write_all(&pipelined).expect("send");
        // The server closes the connection after its refusal.
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        String::from_utf8_lossy(&answer).into_owned()
    })
    .await
    .expect("exchange finished");
    let second = answer.rfind("HTTP/1.1 ").expect("two answers");
    assert!(second > 0, "{answer}");
    assert_status(&answer[..second], 200);
    assert_status(&answer[second..], 400);

    // Still serving, API and dashboard.
    app.get_ok("/v1/soldes").await;
    assert_status(&exchange_async(port, get("/login", &[])).await.0, 200);
}

#[actix_web::test]
async fn heads_and_bodies_that_never_finish_are_dropped() {
    let app = spawn_app().await;
    let port = app.port;

    // A head that never ends: actix-web's client request timeout (5 s) answers 408 and closes.
    let slow_head = exchange_async(port, b"GET /v1/soldes HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: 1\r\n".to_vec());
    // A body announced and never sent, to the API and to the dashboard's login form.
    let api_body = format!(
        "POST /v1/paiement/initier HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"montant\": ",
        app.key
    );
    let slow_api = exchange_async(port, api_body.into_bytes());
    let form_body = "POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\n\
                     Content-Length: 500\r\n\r\nemail=";
    let slow_form = exchange_async(port, form_body.as_bytes().to_vec());
    let ((head, head_s), (api, api_s), (form, form_s)) =
        futures_util::future::join3(slow_head, slow_api, slow_form).await;

    assert_refused(&head, 408);
    assert!(head_s < Duration::from_secs(8), "the slow head was held {head_s:?}");
    let bound = Duration::from_millis(BODY_TIMEOUT_MS);
    assert_status(&api, 400);
    assert!(api.contains("\"invalid_json\"") && api.to_ascii_lowercase().contains("request-id"), "{api}");
    assert!(api_s >= bound - Duration::from_secs(1) && api_s < bound + Duration::from_secs(5), "{api_s:?}");
    assert_status(&form, 400);
    assert!(form_s < bound + Duration::from_secs(5), "the slow form was held {form_s:?}");

    // Nothing was created, and the server serves.
    assert_eq!(app.get_ok("/v1/transactions").await["data"], serde_json::json!([]));
}
