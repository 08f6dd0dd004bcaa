//! The HTTP front of either fake, the shared state behind it and the ticker that moves transactions along.
//!
//! Every request goes through [`handle`]: `/__fake/*` to the control API, anything else is recorded, then
//! passes the common knobs (429s, latency) before the provider module answers it. When the provider says it
//! created a transaction, the "500 although created" and "never answer" knobs may still replace its answer:
//! the transaction exists either way, which is exactly what an adapter must cope with.
//!
//! Provider modules return a [`Reply`] and never touch actix types, so their rules read as plain functions.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use actix_web::http::{Method, StatusCode};
use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::Value;

use crate::callbacks::{self, Outgoing};
use crate::common::{provider_reference, Clock, RecordedRequest, Stage, Store, Txn, REQUESTS_MAX};
use crate::knobs::Knobs;
use crate::{cinetpay, control, mtn, orange, pawapay, wave};

/// How long a "never answer" call is held before the fake gives up on it; the client has long gone by then.
const NEVER_ANSWER_HOLD: Duration = Duration::from_secs(600);
/// Request bodies larger than this are refused (413); provider requests are a few hundred bytes.
pub const BODY_MAX: usize = 64 * 1024;
/// The request log keeps at most this much of each body.
const RECORDED_BODY_MAX: usize = 16 * 1024;
/// How often the ticker looks for transactions due to move.
pub const TICK: Duration = Duration::from_millis(20);

/// Which provider this process fakes, with its fixed configuration.
pub enum Provider {
    Pawapay(pawapay::Config),
    Mtn(mtn::Config),
    Wave(wave::Config),
    Cinetpay(cinetpay::Config),
    Orange(orange::Config),
}

/// Everything a request may change, behind one lock that is never held across an await.
#[derive(Default)]
pub struct State {
    pub knobs: Knobs,
    pub requests: VecDeque<RecordedRequest>,
    pub txns: Store,
    pub tokens: mtn::Tokens,
    pub wave: wave::Book,
    pub cinetpay: cinetpay::Book,
    pub orange: orange::Book,
}

pub struct Fake {
    pub clock: Clock,
    /// How long a transaction takes to reach its final state on its own.
    pub settle_ms: u64,
    pub provider: Provider,
    pub state: Mutex<State>,
    pub callbacks: callbacks::Sender,
}

impl Fake {
    /// The state; a panic elsewhere while holding the lock does not make the fake unusable.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn is_pawapay(&self) -> bool {
        matches!(self.provider, Provider::Pawapay(_))
    }

    /// The provider's name for a transaction's status.
    pub fn status_name(&self, txn: &Txn) -> &'static str {
        match &self.provider {
            Provider::Pawapay(_) => pawapay::status_name(txn),
            Provider::Mtn(_) | Provider::Wave(_) | Provider::Cinetpay(_) | Provider::Orange(_) => mtn::status_name(txn),
        }
    }

    /// The callbacks a transaction that just became final sends, per the knobs.
    pub fn callbacks_for(&self, knobs: &Knobs, txn: &Txn) -> Vec<Outgoing> {
        match &self.provider {
            Provider::Pawapay(config) => pawapay::callbacks_for(config, knobs, txn),
            Provider::Mtn(_) => mtn::callbacks_for(knobs, txn),
            // Wave's webhooks leave when the customer acts on the hosted page, not from the transaction store.
            Provider::Wave(_) | Provider::Cinetpay(_) | Provider::Orange(_) => Vec::new(),
        }
    }
}

/// A request as the provider modules see it.
pub struct Call<'a> {
    pub method: &'a Method,
    pub path: &'a str,
    pub query: &'a str,
    pub headers: &'a actix_web::http::header::HeaderMap,
    pub body: &'a [u8],
}

impl Call<'_> {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// A provider's answer.
pub struct Reply {
    pub status: StatusCode,
    /// JSON body; `None` for an empty body (MTN's 202).
    pub body: Option<Value>,
    pub headers: Vec<(&'static str, String)>,
    /// True when this call created a transaction (the create-time knobs apply).
    pub created: bool,
    /// An HTML page instead of JSON (Wave's hosted payment page).
    pub html: Option<String>,
}

impl Reply {
    pub fn json(status: u16, body: Value) -> Reply {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        Reply { status, body: Some(body), headers: vec![], created: false, html: None }
    }

    pub fn empty(status: u16) -> Reply {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        Reply { status, body: None, headers: vec![], created: false, html: None }
    }

    /// Marks the reply as the answer to a creation.
    pub fn created(self) -> Reply {
        Reply { created: true, ..self }
    }

    /// Adds an `X-Fake-Reason` header: why the fake refused, where the real provider's body says nothing.
    pub fn because(mut self, why: impl Into<String>) -> Reply {
        self.headers.push(("X-Fake-Reason", why.into()));
        self
    }

    fn into_response(self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status);
        for (name, value) in self.headers {
            response.insert_header((name, value));
        }
        match (self.html, self.body) {
            (Some(page), _) => response.content_type("text/html; charset=utf-8").body(page),
            (None, Some(body)) => response.content_type("application/json").body(body.to_string()),
            (None, None) => response.finish(),
        }
    }
}

/// The one handler: every path of the fake lands here.
pub async fn handle(req: HttpRequest, body: web::Bytes, fake: web::Data<Fake>) -> HttpResponse {
    if req.path().starts_with("/__fake/") {
        return control::handle(&fake, &req, &body).into_response();
    }
    let (latency_ms, throttled) = {
        let mut state = fake.lock();
        let throttled = state.knobs.too_many_requests > 0;
        if throttled {
            state.knobs.too_many_requests -= 1;
        }
        (state.knobs.latency_ms, throttled)
    };
    if latency_ms > 0 {
        tokio::time::sleep(Duration::from_millis(latency_ms)).await;
    }
    if throttled {
        record(&mut fake.lock(), &req, &body);
        let body = match fake.provider {
            Provider::Pawapay(_) => pawapay::too_many_requests(),
            Provider::Mtn(_) => mtn::too_many_requests(),
            Provider::Wave(_) => wave::too_many_requests(),
            Provider::Cinetpay(_) => serde_json::json!({"code": "429", "message": "TOO_MANY_REQUESTS"}),
            Provider::Orange(_) => serde_json::json!({"status": 429, "message": "too many requests"}),
        };
        let mut reply = Reply::json(429, body);
        reply.headers.push(("Retry-After", "1".into()));
        return reply.into_response();
    }
    let call =
        Call { method: req.method(), path: req.path(), query: req.query_string(), headers: req.headers(), body: &body };
    let reply = match &fake.provider {
        Provider::Pawapay(config) => pawapay::handle(&fake, config, &call),
        Provider::Mtn(config) => mtn::handle(&fake, config, &call),
        Provider::Wave(config) => wave::handle(&fake, config, &call),
        Provider::Cinetpay(config) => cinetpay::handle(&fake, config, &call),
        Provider::Orange(config) => orange::handle(&fake, config, &call),
    };
    // Recorded once handled: whoever sees a request in the log also sees what it created, so a test that
    // acts on "the request reached the provider" never races the creation.
    record(&mut fake.lock(), &req, &body);
    if !reply.created {
        return reply.into_response();
    }
    let (fail, hang) = {
        let mut state = fake.lock();
        if state.knobs.create_500_but_created > 0 {
            state.knobs.create_500_but_created -= 1;
            (true, false)
        } else if state.knobs.never_answer > 0 {
            state.knobs.never_answer -= 1;
            (false, true)
        } else {
            (false, false)
        }
    };
    if fail {
        let body = match fake.provider {
            Provider::Pawapay(_) => pawapay::unknown_error(),
            Provider::Mtn(_) => mtn::internal_error(),
            Provider::Wave(_) => wave::internal_error(),
            Provider::Cinetpay(_) => serde_json::json!({"code": "624", "message": "UNKNOWN_ERROR"}),
            Provider::Orange(_) => serde_json::json!({"status": 500, "message": "internal error"}),
        };
        return Reply::json(500, body).into_response();
    }
    if hang {
        // The client gives up first and actix drops this future; the hold only bounds a client that never does.
        tokio::time::sleep(NEVER_ANSWER_HOLD).await;
    }
    reply.into_response()
}

fn record(state: &mut State, req: &HttpRequest, body: &[u8]) {
    let mut headers = serde_json::Map::new();
    for (name, value) in req.headers() {
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        let entry = headers.entry(name.as_str().to_ascii_lowercase()).or_insert_with(|| Value::from(""));
        *entry = match entry.as_str() {
            Some("") | None => Value::from(value),
            Some(earlier) => Value::from(format!("{earlier}, {value}")),
        };
    }
    let path = match req.query_string() {
        "" => req.path().to_owned(),
        query => format!("{}?{query}", req.path()),
    };
    if state.requests.len() >= REQUESTS_MAX {
        state.requests.pop_front();
    }
    let mut body = String::from_utf8_lossy(&body[..body.len().min(RECORDED_BODY_MAX)]).into_owned();
    if body.len() > RECORDED_BODY_MAX {
        body.push_str("…[truncated]");
    }
    state.requests.push_back(RecordedRequest { method: req.method().to_string(), path, headers, body });
}

/// Moves every open transaction that is due; returns the callbacks to send.
pub fn tick(fake: &Fake) -> Vec<Outgoing> {
    let now = fake.clock.now_ms();
    let mut state = fake.lock();
    let state = &mut *state;
    let mut outgoing = vec![];
    for id in state.txns.open_ids() {
        let Some(txn) = state.txns.get_mut(&id) else { continue };
        if txn.stage == Stage::Created && now >= txn.created_ms.saturating_add(fake.settle_ms / 2) {
            txn.stage = Stage::Processing;
        }
        let Some(due) = txn.settle_at_ms.filter(|&due| now >= due) else { continue };
        txn.settle_at_ms = None;
        match txn.plan.clone() {
            crate::common::Plan::Stuck => {}
            _ if txn.kind == "deposit" && state.knobs.in_reconciliation => txn.stage = Stage::Held,
            crate::common::Plan::Succeed => finish(txn, true, None),
            crate::common::Plan::Fail(reason) => finish(txn, false, reason),
        }
        tracing::debug!(id = %txn.id, due, stage = ?txn.stage, "transaction moved");
        if txn.stage.is_final() {
            outgoing.extend(fake.callbacks_for(&state.knobs, txn));
        }
    }
    outgoing
}

/// Makes a transaction final.
pub fn finish(txn: &mut Txn, success: bool, reason: Option<String>) {
    txn.settle_at_ms = None;
    if success {
        txn.stage = Stage::Succeeded;
        txn.reason = None;
        txn.provider_txn_id = Some(provider_reference());
    } else {
        txn.stage = Stage::Failed;
        txn.reason = reason;
    }
}

/// Runs the ticker forever on the current arbiter.
pub async fn run_ticker(fake: web::Data<Fake>) {
    let mut interval = tokio::time::interval(TICK);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        if matches!(fake.provider, Provider::Wave(_)) {
            wave::tick(&fake);
        }
        if matches!(fake.provider, Provider::Orange(_)) {
            orange::tick(&fake);
        }
        if matches!(fake.provider, Provider::Cinetpay(_)) {
            fake.callbacks.send_all(cinetpay::tick(&fake));
        }
        let outgoing = tick(&fake);
        fake.callbacks.send_all(outgoing);
    }
}
