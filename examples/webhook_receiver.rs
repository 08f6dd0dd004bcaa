//! A Caisse webhook receiver in Rust: actix-web, `caisse_engine::webhook::verify` and `verify_standard`.
//!
//! ```text
//! CAISSE_SECRET_KEY=sk_test_... cargo run --example webhook_receiver -- 8000
//! ```
//!
//! It answers every POST (any path):
//! - 401 when `X-Service-Signature` is not `sha256=` + hex(HMAC-SHA256(secret key, timestamp + "." + raw body)),
//!   or when `webhook-signature` (Standard Webhooks) holds no `v1,` + base64(HMAC-SHA256(secret key,
//!   webhook-id + "." + timestamp + "." + raw body));
//! - 400 when a timestamp is missing, not Unix seconds, or more than 300 s from now (either way), or
//!   `webhook-id` is missing;
//! - 400 when the (authentic) body is not the expected JSON;
//! - 200 `{"received": true}` otherwise, printing one line per new notification; a duplicate (the same
//!   `webhook-id`, which retries make normal) is acknowledged again and not processed twice.
//!
//! The secret key comes from `CAISSE_SECRET_KEY`; the port from the first argument, else `PORT`, else 8000;
//! the address from `HOST` (default 127.0.0.1). See `examples/README.md`.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use caisse_engine::webhook::{
    verify, verify_standard, VerifyError, SIGNATURE_HEADER, STANDARD_ID_HEADER, STANDARD_SIGNATURE_HEADER,
    STANDARD_TIMESTAMP_HEADER, TIMESTAMP_HEADER,
};
use serde_json::{json, Value};

/// The receiver's state: the secret key and the notifications already handled.
pub struct Receiver {
    secret_key: String,
    /// Handled notifications: their `webhook-id` (the notification's `evt_` id, the same on every attempt; a
    /// payment may send `payment.refunded` more than once, so event + reference is not a key), with the
    /// event and reference handled. Kept in memory for this example only: it is lost on restart and not shared
    /// between processes. A real receiver keeps the ids in its database (a unique key), written in the same
    /// transaction as the work the notification triggers.
    seen: Mutex<Seen>,
}

/// The ids handled, and what each was: (`event`, `data.reference`), in the order handled.
#[derive(Default)]
struct Seen {
    ids: HashSet<String>,
    handled: Vec<(String, String)>,
}

impl Receiver {
    pub fn new(secret_key: String) -> Receiver {
        Receiver { secret_key, seen: Mutex::new(Seen::default()) }
    }

    /// The notifications handled so far, as (`event`, `data.reference`), in the order handled.
    pub fn handled(&self) -> Vec<(String, String)> {
        self.seen.lock().map(|seen| seen.handled.clone()).unwrap_or_default()
    }
}

/// The webhook endpoint. `body` is the raw request body, exactly as received: the signature is checked over
/// these bytes, never over a re-serialised copy of the parsed JSON (whose bytes would differ).
pub async fn webhook(req: HttpRequest, body: web::Bytes, receiver: web::Data<Receiver>) -> HttpResponse {
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("");
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    // Both proofs: the spec's headers, then the Standard Webhooks ones, which also carry the id.
    if let Err(e) = verify(&receiver.secret_key, header(SIGNATURE_HEADER), header(TIMESTAMP_HEADER), &body, now) {
        return refused(e);
    }
    let id = header(STANDARD_ID_HEADER);
    if id.is_empty() {
        return HttpResponse::BadRequest().json(json!({"error": "webhook-id is missing"}));
    }
    let (signatures, timestamp) = (header(STANDARD_SIGNATURE_HEADER), header(STANDARD_TIMESTAMP_HEADER));
    if let Err(e) = verify_standard(&receiver.secret_key, id, signatures, timestamp, &body, now) {
        return refused(e);
    }

    // Authentic bytes: only now parse them.
    let Ok(notification) = serde_json::from_slice::<Value>(&body) else {
        return HttpResponse::BadRequest().json(json!({"error": "body is not JSON"}));
    };
    let data = &notification["data"];
    let (Some(event), Some(reference)) = (notification["event"].as_str(), data["reference"].as_str()) else {
        return HttpResponse::BadRequest().json(json!({"error": "missing event or data.reference"}));
    };

    let first_time = match receiver.seen.lock() {
        Ok(mut seen) => {
            let first = seen.ids.insert(id.to_owned());
            if first {
                seen.handled.push((event.to_owned(), reference.to_owned()));
            }
            first
        }
        Err(_) => return HttpResponse::InternalServerError().finish(),
    };
    if first_time {
        // The work goes here (mark the order paid, ...). Keep it short: Caisse waits 10 s for the 200, so
        // longer work belongs in a queue. If it fails, forget the event and answer 500 so Caisse retries.
        let text = |field: &str| data[field].as_str().map(str::to_owned).unwrap_or_else(|| data[field].to_string());
        println!(
            "{event} {reference} statut={} montant={} {} id={id}",
            text("statut"),
            data["montant"],
            text("devise")
        );
    }
    HttpResponse::Ok().json(json!({"received": true}))
}

/// 401 for a signature that does not match, 400 for a timestamp that is stale or not a number.
fn refused(e: VerifyError) -> HttpResponse {
    match e {
        VerifyError::BadSignature => HttpResponse::Unauthorized().json(json!({"error": "invalid signature"})),
        VerifyError::StaleTimestamp | VerifyError::MalformedTimestamp => {
            HttpResponse::BadRequest().json(json!({"error": e.to_string()}))
        }
    }
}

#[actix_web::main]
async fn main() -> std::io::Result<()> {
    let Some(secret_key) = std::env::var("CAISSE_SECRET_KEY").ok().filter(|k| !k.is_empty()) else {
        eprintln!("set CAISSE_SECRET_KEY to the merchant's secret key (sk_test_... or sk_live_...)");
        std::process::exit(2);
    };
    let port_text = std::env::args().nth(1).or_else(|| std::env::var("PORT").ok()).unwrap_or_else(|| "8000".into());
    let Ok(port) = port_text.parse::<u16>() else {
        eprintln!("the port must be a number, got `{port_text}`");
        std::process::exit(2);
    };
    let host = std::env::var("HOST").unwrap_or_else(|_| "127.0.0.1".into());
    let receiver = web::Data::new(Receiver::new(secret_key));
    let server = HttpServer::new(move || {
        App::new()
            .app_data(receiver.clone())
            .app_data(web::PayloadConfig::new(1024 * 1024))
            .route("/{path:.*}", web::post().to(webhook))
    })
    .bind((host.as_str(), port))?;
    eprintln!("webhook receiver listening on http://{host}:{port}/");
    server.run().await
}
