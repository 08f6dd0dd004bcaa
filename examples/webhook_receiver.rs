//! A Caisse webhook receiver in Rust: actix-web and `caisse_engine::webhook::verify`.
//!
//! ```text
//! CAISSE_SECRET_KEY=sk_test_... cargo run --example webhook_receiver -- 8000
//! ```
//!
//! It answers every POST (any path):
//! - 401 when `X-Service-Signature` is not `sha256=` + hex(HMAC-SHA256(secret key, timestamp + "." + raw body));
//! - 400 when `X-Service-Timestamp` is missing, not Unix seconds, or more than 300 s from now (either way);
//! - 400 when the (authentic) body is not the expected JSON;
//! - 200 `{"received": true}` otherwise, printing one line per new event; a duplicate (same `event` and
//!   `data.reference`, which retries make normal) is acknowledged again and not processed twice.
//!
//! The secret key comes from `CAISSE_SECRET_KEY`; the port from the first argument, else `PORT`, else 8000;
//! the address from `HOST` (default 127.0.0.1). See `examples/README.md`.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use caisse_engine::webhook::{verify, VerifyError, SIGNATURE_HEADER, TIMESTAMP_HEADER};
use serde_json::{json, Value};

/// The receiver's state: the secret key and the events already handled.
pub struct Receiver {
    secret_key: String,
    /// Handled events, by (`event`, `data.reference`). Kept in memory for this example only: it is lost on
    /// restart and not shared between processes. A real receiver keeps it in its database (a unique key on
    /// the pair), written in the same transaction as the work the event triggers.
    seen: Mutex<HashSet<(String, String)>>,
}

impl Receiver {
    pub fn new(secret_key: String) -> Receiver {
        Receiver { secret_key, seen: Mutex::new(HashSet::new()) }
    }

    /// The events handled so far, as (`event`, `data.reference`), sorted.
    pub fn handled(&self) -> Vec<(String, String)> {
        let mut handled: Vec<_> = self.seen.lock().map(|seen| seen.iter().cloned().collect()).unwrap_or_default();
        handled.sort();
        handled
    }
}

/// The webhook endpoint. `body` is the raw request body, exactly as received: the signature is checked over
/// these bytes, never over a re-serialised copy of the parsed JSON (whose bytes would differ).
pub async fn webhook(req: HttpRequest, body: web::Bytes, receiver: web::Data<Receiver>) -> HttpResponse {
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("");
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    match verify(&receiver.secret_key, header(SIGNATURE_HEADER), header(TIMESTAMP_HEADER), &body, now) {
        Ok(()) => {}
        Err(VerifyError::BadSignature) => {
            return HttpResponse::Unauthorized().json(json!({"error": "invalid signature"}));
        }
        Err(e @ (VerifyError::StaleTimestamp | VerifyError::MalformedTimestamp)) => {
            return HttpResponse::BadRequest().json(json!({"error": e.to_string()}));
        }
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
        Ok(mut seen) => seen.insert((event.to_owned(), reference.to_owned())),
        Err(_) => return HttpResponse::InternalServerError().finish(),
    };
    if first_time {
        // The work goes here (mark the order paid, ...). Keep it short: Caisse waits 10 s for the 200, so
        // longer work belongs in a queue. If it fails, forget the event and answer 500 so Caisse retries.
        let text = |field: &str| data[field].as_str().map(str::to_owned).unwrap_or_else(|| data[field].to_string());
        println!("{event} {reference} statut={} montant={} {}", text("statut"), data["montant"], text("devise"));
    }
    HttpResponse::Ok().json(json!({"received": true}))
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
