//! A merchant's webhook receiver on 127.0.0.1, living in the test process so it outlives every kill of the
//! server. It verifies each request as a merchant is told to (docs/api.md § Webhook signature), independently
//! of Caisse's own code:
//! `X-Service-Signature` must be `sha256=` + the lowercase hex HMAC-SHA256, under the merchant's secret key, of
//! `X-Service-Timestamp` + "." + the raw body, compared in constant time, with the timestamp within 300 s.
//! A request that fails is answered 401 and recorded as a failure of the test.
//!
//! To keep retries pending at the moments the server is killed, the first attempt of about one notification
//! in eight is answered 503 (chosen by a hash of its body, so each attempt of one notification is treated
//! alike).

use std::collections::hash_map::DefaultHasher;
use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use actix_web::dev::ServerHandle;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// The tolerance on `X-Service-Timestamp` recommended to merchants.
const TOLERANCE_S: u64 = 300;

/// One delivery that passed verification.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub event: String,
    pub reference: String,
    pub status: String,
    pub body: Vec<u8>,
    /// What the receiver answered: 200, or 503 for a deliberately refused first attempt.
    pub answered: u16,
}

#[derive(Default)]
struct Log {
    deliveries: Vec<Delivery>,
    /// Why each rejected request was rejected.
    invalid: Vec<String>,
    /// Bodies seen at least once, to refuse only first attempts.
    bodies: HashSet<Vec<u8>>,
    /// References whose `payment.succeeded` was acknowledged, in arrival order: the load refunds these.
    succeeded: Vec<String>,
}

struct Inbox {
    secret_key: String,
    log: Mutex<Log>,
}

pub struct Receiver {
    inbox: Arc<Inbox>,
    handle: ServerHandle,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        // The stop command is sent at once; its completion does not matter here.
        drop(self.handle.stop(false));
    }
}

fn unix_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// The signature check as a merchant would write it: the reason for refusing, or the parsed body.
fn verify(secret_key: &str, req: &HttpRequest, body: &[u8]) -> Result<Value, String> {
    let header = |name: &str| {
        req.headers().get(name).and_then(|v| v.to_str().ok()).ok_or_else(|| format!("no valid {name} header"))
    };
    if req.method() != actix_web::http::Method::POST {
        return Err(format!("method {}", req.method()));
    }
    let content_type = header("Content-Type")?;
    if content_type != "application/json" {
        return Err(format!("Content-Type {content_type}"));
    }
    let timestamp = header("X-Service-Timestamp")?;
    let signature = header("X-Service-Signature")?;
    let seconds: u64 = timestamp.parse().map_err(|_| format!("timestamp `{timestamp}` is not Unix seconds"))?;
    if seconds.abs_diff(unix_s()) > TOLERANCE_S {
        return Err(format!("timestamp {seconds} is more than {TOLERANCE_S} s away"));
    }
    let mut mac = Hmac::<Sha256>::new_from_slice(secret_key.as_bytes()).map_err(|e| e.to_string())?;
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    let expected = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
    if !bool::from(expected.as_bytes().ct_eq(signature.as_bytes())) {
        return Err(format!("signature {signature} does not verify"));
    }
    serde_json::from_slice(body).map_err(|e| format!("body is not JSON: {e}"))
}

fn refuse_first_attempt(body: &[u8]) -> bool {
    let mut hasher = DefaultHasher::new();
    body.hash(&mut hasher);
    // One in eight: the three low bits are zero.
    hasher.finish().trailing_zeros() >= 3
}

async fn receive(req: HttpRequest, body: web::Bytes, inbox: web::Data<Inbox>) -> HttpResponse {
    let parsed = verify(&inbox.secret_key, &req, &body);
    let mut log = inbox.log.lock().expect("receiver log");
    let value = match parsed {
        Ok(value) => value,
        Err(why) => {
            log.invalid.push(format!("{why}: {}", String::from_utf8_lossy(&body)));
            return HttpResponse::Unauthorized().finish();
        }
    };
    let text = |v: &Value| v.as_str().unwrap_or("").to_owned();
    let (event, reference, status) =
        (text(&value["event"]), text(&value["data"]["reference"]), text(&value["data"]["statut"]));
    let first = log.bodies.insert(body.to_vec());
    let answered = if first && refuse_first_attempt(&body) { 503 } else { 200 };
    if answered == 200 && event == "payment.succeeded" {
        log.succeeded.push(reference.clone());
    }
    log.deliveries.push(Delivery { event, reference, status, body: body.to_vec(), answered });
    if answered == 200 {
        HttpResponse::Ok().json(json!({"received": true}))
    } else {
        HttpResponse::ServiceUnavailable().finish()
    }
}

impl Receiver {
    /// A receiver on `listener` verifying signatures made with `secret_key`. The key is known only once the
    /// merchant exists, and the merchant needs the URL first, so the caller binds the listener beforehand.
    pub fn start(listener: TcpListener, secret_key: String) -> Receiver {
        let inbox = Arc::new(Inbox { secret_key, log: Mutex::new(Log::default()) });
        let data = web::Data::from(inbox.clone());
        let server = HttpServer::new(move || App::new().app_data(data.clone()).default_service(web::to(receive)))
            .workers(1)
            .disable_signals()
            .shutdown_timeout(1)
            .listen(listener)
            .expect("receiver listens")
            .run();
        let handle = server.handle();
        actix_web::rt::spawn(server);
        Receiver { inbox, handle }
    }

    /// Every verified delivery from position `from` on.
    pub fn deliveries_from(&self, from: usize) -> Vec<Delivery> {
        self.inbox
            .log
            .lock()
            .expect("receiver log")
            .deliveries
            .get(from..)
            .map(<[Delivery]>::to_vec)
            .unwrap_or_default()
    }

    pub fn delivery_count(&self) -> usize {
        self.inbox.log.lock().expect("receiver log").deliveries.len()
    }

    pub fn invalid(&self) -> Vec<String> {
        self.inbox.log.lock().expect("receiver log").invalid.clone()
    }

    /// References whose `payment.succeeded` was acknowledged, from position `from` on.
    pub fn succeeded_from(&self, from: usize) -> Vec<String> {
        self.inbox.log.lock().expect("receiver log").succeeded.get(from..).map(<[String]>::to_vec).unwrap_or_default()
    }
}
