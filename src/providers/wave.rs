//! The Wave adapter: Checkout sessions for collection (the customer approves on Wave's page, `url_paiement`),
//! full refunds of a session, the Payout API, status queries and signed webhooks (docs.wave.com).
//!
//! Protocol only; what a status means is decided in `flow`. The rules that keep money safe:
//! - A session is created with our transaction id as `client_reference`, and found again by it
//!   (`/v1/checkout/sessions/search`): Wave has no idempotency header on creation, so after a timeout or a 5xx
//!   the search says whether the session exists before anything is created again.
//! - A session is final only when Wave says so: `complete` with a `succeeded` payment is a success, `expired`
//!   ends the payment `expire` at the session's own `when_expires`. A failed attempt leaves the session open
//!   (the customer may try again on the same page), so it fails nothing.
//! - When Caisse gives up on a payment (its TTL), the session is expired first ([`Adapter::close`]), so the
//!   customer cannot pay what Caisse no longer waits for; a session Wave completed just before wins.
//! - Payouts carry our transaction id as `idempotency-key` (and `client_reference`): a retry or a restart
//!   gets the same payout back, never a second one. A payout Wave reverses before Caisse saw it succeed is a
//!   rejected payout.
//! - Webhooks are authenticated with the webhook secret: `Wave-Signature: t=…,v1=…` (HMAC-SHA256 of the
//!   timestamp and the body, with or without a `.` between them, as integrators disagree; any of several
//!   `v1` during a rotation; at most five minutes old) or, in Wave's other mode, `Authorization: Bearer
//!   <secret>`. An event is taken once (by its `id`), and only as a hint: the session is always fetched.
//! - Wave refunds a whole session only: a refund of part of a payment goes to the payer as a Wave payout
//!   under the refund's transaction id, queried as a payout.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use actix_web::http::header::HeaderMap;
use awc::http::{Method, StatusCode};
use caisse_engine::domain::money::{Amount, Currency};
use caisse_engine::domain::provider::ReturnUrl;
use caisse_engine::domain::records::{Payment, Payout, Refund};
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;

use super::http::{Answer, Call, Outbound};
use super::pawapay::amount_text;
use super::{Adapter, LocalFuture, Notice, ProviderError, ProviderStatus, Report, Stated, Subject};
use crate::config::WaveSettings;

/// How old a signed webhook may be.
const SIGNATURE_TOLERANCE_S: u64 = 5 * 60;
/// Event ids remembered as taken; older ones may be taken again, which the status query makes harmless.
const SEEN_EVENTS_MAX: usize = 10_000;
/// The longest `Wave-Signature` header read.
const SIGNATURE_HEADER_MAX: usize = 2_048;

pub struct Wave {
    settings: WaveSettings,
    /// `{public_url}/retour/`: where Wave sends the customer's browser afterwards, followed by our transaction id.
    return_base: String,
    outbound: Arc<Outbound>,
    /// Webhook event ids already handled, oldest first.
    seen: Mutex<(VecDeque<String>, HashSet<String>)>,
}

impl Wave {
    pub fn new(settings: WaveSettings, public_url: &str) -> Wave {
        Wave {
            settings,
            return_base: format!("{}/retour/", public_url.trim_end_matches('/')),
            outbound: Arc::new(Outbound::new("wave")),
            seen: Mutex::new((VecDeque::new(), HashSet::new())),
        }
    }

    fn call(&self, method: Method, path: &str, body: Option<Value>, idempotent: bool) -> Call<'static> {
        api_call(&self.settings, method, path, body, idempotent)
    }

    /// The checkout session made for `payment` (our transaction id is its `client_reference`), if Wave has one.
    fn session_of(&self, payment: &Payment) -> LocalFuture<Result<Option<Value>, ProviderError>> {
        let outbound = self.outbound.clone();
        let tx = payment.transaction_id.clone();
        let call = self.call(Method::GET, &format!("/v1/checkout/sessions/search?client_reference={tx}"), None, true);
        let asked = (payment.amount, payment.currency);
        Box::pin(
            async move { read_search(&outbound.send(call).await?).map(|found| best_session(found, &tx, Some(asked))) },
        )
    }

    fn seen(&self, id: &str) -> bool {
        self.seen.lock().map(|s| s.1.contains(id)).unwrap_or(false)
    }
}

/// A request to Wave's API with the wallet's key.
fn api_call(
    settings: &WaveSettings,
    method: Method,
    path: &str,
    body: Option<Value>,
    idempotent: bool,
) -> Call<'static> {
    Call {
        method,
        url: format!("{}{path}", settings.base_url),
        headers: vec![("Authorization", format!("Bearer {}", settings.api_key.expose()))],
        body,
        idempotent,
    }
}

/// The id of a session as it may go in a path (Wave's own are short and plain).
fn session_id(session: &Value) -> &str {
    session["id"].as_str().filter(|id| id.len() <= 64 && !id.contains(['/', '?', '#'])).unwrap_or_default()
}

/// Wave's error code (`insufficient-funds`), in lower snake case, as Caisse's `failure_code` and refusals say.
fn code_of(text: Option<&str>, default: &str) -> String {
    text.filter(|c| {
        !c.is_empty() && c.len() <= 64 && c.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    })
    .map_or_else(|| default.to_owned(), |c| c.replace('-', "_").to_ascii_lowercase())
}

/// The `result` list of a search answer.
fn read_search(answer: &Answer) -> Result<Vec<Value>, ProviderError> {
    match answer.status {
        StatusCode::OK => match answer.json()?.get("result").and_then(Value::as_array) {
            Some(found) => Ok(found.clone()),
            None => Err(ProviderError::Unreachable("a Wave search answer without result".into())),
        },
        StatusCode::NOT_FOUND => Ok(Vec::new()),
        status => Err(unreachable_or_refused(status, "search")),
    }
}

/// Of the sessions (or payouts) found for our transaction `tx`, the one that says the most: one of the amount
/// Caisse asked first (when `asked` is given: anyone holding the wallet's key could make another session under
/// our reference), then a success. Only those that carry `tx` as their reference count, whatever else the
/// search answered.
fn best_session(mut found: Vec<Value>, tx: &str, asked: Option<(Amount, Currency)>) -> Option<Value> {
    found.retain(|v| v["client_reference"].as_str() == Some(tx));
    let rank = |v: &Value| {
        let stated = Stated::read(&v["amount"], &v["currency"]);
        let other_amount = asked.is_some_and(|(a, c)| !stated.as_ref().is_some_and(|s| s.is(a, c)));
        let succeeded = matches!(
            (v["payment_status"].as_str(), v["status"].as_str()),
            (Some("succeeded"), _) | (_, Some("succeeded"))
        );
        (other_amount, !succeeded)
    };
    found.sort_by_key(rank);
    found.into_iter().next()
}

fn unreachable_or_refused(status: StatusCode, what: &str) -> ProviderError {
    if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
        tracing::error!(%status, "Wave refused our API key: check adapters.wave.api_key and its permissions");
    }
    ProviderError::Unreachable(format!("Wave {what} answered {status}"))
}

/// Whether a checkout can still be paid.
fn still_open(checkout: &Value) -> bool {
    checkout["checkout_status"].as_str() == Some("open")
}

/// A session as Caisse reads it.
fn session_status(session: &Value) -> Report {
    let status = match (session["checkout_status"].as_str(), session["payment_status"].as_str()) {
        (Some("complete"), Some("succeeded")) | (_, Some("succeeded")) => ProviderStatus::Succeeded,
        (Some("expired"), _) => ProviderStatus::Expired,
        // Open: the customer may still pay, whatever an earlier attempt gave.
        _ => ProviderStatus::Processing,
    };
    let page = session["wave_launch_url"].as_str().and_then(|url| ReturnUrl::parse(url, false).ok());
    let report = Report::with_reference(status, session["transaction_id"].as_str());
    Report { page, ..report.stating(&session["amount"], &session["currency"]) }
}

/// A payout as Caisse reads it.
fn payout_status(payout: &Value) -> Report {
    let status = match payout["status"].as_str() {
        Some("succeeded") => ProviderStatus::Succeeded,
        Some("failed") => {
            ProviderStatus::Failed { code: code_of(payout["payout_error"]["error_code"].as_str(), "payout_failed") }
        }
        // Reversed before Caisse saw it succeed (a pending payout is the only kind Caisse asks about).
        Some("reversed") => ProviderStatus::Failed { code: "reversed".into() },
        _ => ProviderStatus::Processing,
    };
    Report::with_reference(status, payout["id"].as_str()).stating(&payout["receive_amount"], &payout["currency"])
}

/// The page Wave answers for a session, checked as any URL from outside is.
fn launch_url(session: &Value) -> Result<ReturnUrl, ProviderError> {
    let url = session["wave_launch_url"]
        .as_str()
        .ok_or_else(|| ProviderError::Unreachable("a Wave session without wave_launch_url".into()))?;
    ReturnUrl::parse(url, false).map_err(|e| ProviderError::Unreachable(format!("Wave's launch URL: {e}")))
}

/// Checks `Wave-Signature: t=…,v1=…[,v1=…]` over `body` at `now_s`.
fn signature_valid(header: &str, secret: &[u8], body: &[u8], now_s: u64) -> Result<(), String> {
    if header.len() > SIGNATURE_HEADER_MAX {
        return Err("Wave-Signature is too long".into());
    }
    let mut timestamp = None;
    let mut signatures = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", t)) => timestamp = Some(t),
            Some(("v1", v)) => signatures.push(v),
            _ => {}
        }
    }
    let t = timestamp.ok_or("Wave-Signature has no t=")?;
    let at: u64 = t.parse().map_err(|_| "Wave-Signature's t is not a number".to_owned())?;
    if now_s.abs_diff(at) > SIGNATURE_TOLERANCE_S {
        return Err(format!("Wave-Signature's t is {}s away from now", now_s.abs_diff(at)));
    }
    // Wave's own example verifies with the timestamp and body joined as they are; other integrators put a `.`
    // between them. Either proves the sender holds the secret.
    for separator in [&b""[..], &b"."[..]] {
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret) else { return Err("no webhook secret".into()) };
        mac.update(t.as_bytes());
        mac.update(separator);
        mac.update(body);
        let expected = hex::encode(mac.finalize().into_bytes());
        if signatures.iter().any(|v| bool::from(subtle::ConstantTimeEq::ct_eq(expected.as_bytes(), v.as_bytes()))) {
            return Ok(());
        }
    }
    Err("no v1 signature matches".into())
}

fn now_s() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl Adapter for Wave {
    fn degraded(&self) -> bool {
        self.outbound.degraded()
    }

    fn request_to_pay(&self, payment: &Payment) -> LocalFuture<Result<Option<ReturnUrl>, ProviderError>> {
        let tx = payment.transaction_id.clone();
        let back = format!("{}{tx}", self.return_base);
        let body = json!({
            "amount": amount_text(payment.amount, payment.currency),
            "currency": payment.currency.code(),
            "success_url": back,
            "error_url": back,
            "client_reference": tx,
            "restrict_payer_mobile": payment.customer_phone.as_str(),
        });
        let outbound = self.outbound.clone();
        // Not repeated on its own: a second POST would make a second session. The search decides instead.
        let create = self.call(Method::POST, "/v1/checkout/sessions", Some(body), false);
        let search = self.session_of(payment);
        Box::pin(async move {
            match outbound.send(create).await {
                Ok(answer) if answer.status.is_success() => launch_url(&answer.json()?).map(Some),
                Ok(answer) if answer.status.is_client_error() && answer.status != StatusCode::TOO_MANY_REQUESTS => {
                    if answer.status == StatusCode::UNAUTHORIZED || answer.status == StatusCode::FORBIDDEN {
                        return Err(unreachable_or_refused(answer.status, "checkout"));
                    }
                    let code = answer.json().ok().and_then(|b| b["code"].as_str().map(str::to_owned));
                    Err(ProviderError::Rejected { code: code_of(code.as_deref(), "request_refused") })
                }
                // No answer, or a 5xx: the session may exist all the same.
                first => match search.await? {
                    Some(session) => launch_url(&session).map(Some),
                    None => Err(match first {
                        Ok(answer) => ProviderError::Unreachable(format!("Wave checkout answered {}", answer.status)),
                        Err(e) => e,
                    }),
                },
            }
        })
    }

    fn close(&self, payment: &Payment) -> LocalFuture<Result<bool, ProviderError>> {
        let outbound = self.outbound.clone();
        let search = self.session_of(payment);
        let settings = self.settings.clone();
        Box::pin(async move {
            let Some(session) = search.await? else { return Ok(false) };
            if !still_open(&session) {
                return Ok(true);
            }
            let path = format!("/v1/checkout/sessions/{}/expire", session_id(&session));
            let answer = outbound.send(api_call(&settings, Method::POST, &path, None, true)).await?;
            match answer.status {
                // 409: already complete or expired; the status query that follows says which.
                s if s.is_success() || s == StatusCode::CONFLICT || s == StatusCode::NOT_FOUND => Ok(true),
                status => Err(unreachable_or_refused(status, "expire")),
            }
        })
    }

    fn status(
        &self,
        subject: Subject,
        transaction_id: &str,
        payment: Option<&Payment>,
    ) -> LocalFuture<Result<Report, ProviderError>> {
        match subject {
            Subject::Payment => {
                let Some(payment) = payment.filter(|p| p.transaction_id == transaction_id) else {
                    return Box::pin(std::future::ready(Err(ProviderError::Malformed(
                        "a Wave payment is found through its payment".into(),
                    ))));
                };
                let search = self.session_of(payment);
                Box::pin(async move {
                    Ok(search.await?.map_or_else(|| ProviderStatus::Pending.into(), |s| session_status(&s)))
                })
            }
            Subject::Payout => self.payout_of(transaction_id),
            Subject::Refund => {
                let refund = payment
                    .and_then(|p| p.refunds.iter().find(|r| r.transaction_id() == transaction_id).map(|r| (p, r)));
                let Some((payment, refund)) = refund else {
                    return Box::pin(std::future::ready(Err(ProviderError::Malformed(
                        "a Wave refund is found through its payment".into(),
                    ))));
                };
                // A refund of part of a payment went as a payout to the payer.
                if refund.amount != payment.amount {
                    return self.payout_of(transaction_id);
                }
                // Wave has no refund to query: its refund of a whole session is idempotent, so asking it again is
                // the query (200: refunded; `checkout-refund-failed`: refused).
                let refund = self.refund_session(payment);
                Box::pin(async move {
                    Ok(match refund.await {
                        Ok(()) => ProviderStatus::Succeeded.into(),
                        // The refund was sent before, through this session: one the search does not show now is
                        // no answer about it, and failing the refund would give back money Wave may have sent.
                        Err(ProviderError::Rejected { code })
                            if matches!(code.as_str(), "checkout_session_not_found") =>
                        {
                            return Err(ProviderError::Unreachable("the payment's Wave session was not found".into()))
                        }
                        Err(ProviderError::Rejected { code }) => ProviderStatus::Failed { code }.into(),
                        Err(e) => return Err(e),
                    })
                })
            }
        }
    }

    /// Wave's own customers only.
    fn pays_out(&self, fournisseur: &str, _phone: &caisse_engine::domain::phone::Phone) -> bool {
        fournisseur == "wave"
    }

    /// When Wave answers a request, its answer is final at once (a refund), or soon (a payout): both are
    /// asked about right after the request rather than at the next reconciliation.
    fn settles_at_once(&self, subject: Subject) -> bool {
        matches!(subject, Subject::Refund | Subject::Payout)
    }

    /// Wave refunds whole sessions; a refund of part of a payment goes to the payer as a payout, under the
    /// refund's transaction id.
    fn refund(&self, payment: &Payment, refund: &Refund) -> LocalFuture<Result<(), ProviderError>> {
        if refund.amount == payment.amount {
            return self.refund_session(payment);
        }
        let name = payment.customer_name.as_ref().map(|n| n.as_str().to_owned());
        self.send_payout(&refund.transaction_id(), payment.currency, refund.amount, &payment.customer_phone, name)
    }

    fn payout(&self, payout: &Payout) -> LocalFuture<Result<(), ProviderError>> {
        let name = payout.beneficiary_name.as_ref().map(|n| n.as_str().to_owned());
        self.send_payout(&payout.transaction_id, payout.currency, payout.net_amount, &payout.beneficiary_phone, name)
    }

    /// A webhook: authenticated with the webhook secret, taken once per event id, about a checkout session
    /// whose `client_reference` is our transaction id. Other events (a payment to the wallet not made through
    /// Caisse, Wave's test event) are not ours.
    fn parse_notice(&self, headers: &HeaderMap, _token: Option<&str>, body: &[u8]) -> Result<Notice, ProviderError> {
        let Some(secret) = &self.settings.webhook_secret else {
            return Err(ProviderError::Unauthenticated("no adapters.wave.webhook_secret is configured".into()));
        };
        let secret = secret.expose().as_bytes();
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        match (header("wave-signature"), header("authorization")) {
            (Some(signature), _) => {
                signature_valid(signature, secret, body, now_s()).map_err(ProviderError::Unauthenticated)?
            }
            (None, Some(authorization)) => {
                let given = crate::http::extract::bearer_token(authorization).unwrap_or_default();
                if !bool::from(subtle::ConstantTimeEq::ct_eq(given.as_bytes(), secret)) {
                    return Err(ProviderError::Unauthenticated("the bearer secret is not the webhook secret".into()));
                }
            }
            (None, None) => return Err(ProviderError::Unauthenticated("no Wave-Signature nor Authorization".into())),
        }
        let event: Value = serde_json::from_slice(body).map_err(|e| ProviderError::Malformed(e.to_string()))?;
        let id = event["id"].as_str().filter(|id| !id.is_empty() && id.len() <= 128).unwrap_or_default();
        if id.is_empty() {
            return Err(ProviderError::Malformed("a Wave event without id".into()));
        }
        if self.seen(id) {
            return Err(ProviderError::NotOurs(format!("event {id} already taken")));
        }
        let kind = event["type"].as_str().unwrap_or_default();
        if !kind.starts_with("checkout.session.") {
            return Err(ProviderError::NotOurs(format!("a `{kind}` event")));
        }
        let ours = event["data"]["client_reference"]
            .as_str()
            .filter(|r| r.starts_with("tx_") && r.len() <= 64)
            .ok_or_else(|| ProviderError::NotOurs("a session Caisse did not make".into()))?;
        Ok(Notice { subject: Subject::Payment, transaction_id: ours.to_owned(), status: ProviderStatus::Processing })
    }

    fn notice_handled(&self, _headers: &HeaderMap, body: &[u8]) {
        let Ok(event) = serde_json::from_slice::<Value>(body) else { return };
        let Some(id) = event["id"].as_str().filter(|id| !id.is_empty() && id.len() <= 128) else { return };
        if let Ok(mut seen) = self.seen.lock() {
            let (order, set) = &mut *seen;
            if set.insert(id.to_owned()) {
                order.push_back(id.to_owned());
                if order.len() > SEEN_EVENTS_MAX {
                    if let Some(oldest) = order.pop_front() {
                        set.remove(&oldest);
                    }
                }
            }
        }
    }
}

impl Wave {
    /// The payout made under our transaction id `tx`, as Caisse reads it (pending while Wave has none).
    fn payout_of(&self, tx: &str) -> LocalFuture<Result<Report, ProviderError>> {
        let outbound = self.outbound.clone();
        let call = self.call(Method::GET, &format!("/v1/payouts/search?client_reference={tx}"), None, true);
        let tx = tx.to_owned();
        Box::pin(async move {
            let found = best_session(read_search(&outbound.send(call).await?)?, &tx, None);
            Ok(found.map_or_else(|| ProviderStatus::Pending.into(), |p| payout_status(&p)))
        })
    }

    /// Sends `amount` to `mobile` under our transaction id `tx` (`idempotency-key` and `client_reference`).
    fn send_payout(
        &self,
        tx: &str,
        currency: Currency,
        amount: Amount,
        mobile: &caisse_engine::domain::phone::Phone,
        name: Option<String>,
    ) -> LocalFuture<Result<(), ProviderError>> {
        let mut body = json!({
            "currency": currency.code(),
            "receive_amount": amount_text(amount, currency),
            "mobile": mobile.as_str(),
            "client_reference": tx,
        });
        if let Some(name) = name {
            body["name"] = json!(name);
        }
        let mut call = self.call(Method::POST, "/v1/payout", Some(body), true);
        call.headers.push(("idempotency-key", tx.to_owned()));
        let outbound = self.outbound.clone();
        Box::pin(async move { sent(&outbound.send(call).await?, "payout", "payout_refused") })
    }

    /// Refunds the whole session of the payment `tx` (idempotent at Wave).
    fn refund_session(&self, payment: &Payment) -> LocalFuture<Result<(), ProviderError>> {
        let outbound = self.outbound.clone();
        let search = self.session_of(payment);
        let settings = self.settings.clone();
        Box::pin(async move {
            let Some(session) = search.await? else {
                return Err(ProviderError::Rejected { code: "checkout_session_not_found".into() });
            };
            let path = format!("/v1/checkout/sessions/{}/refund", session_id(&session));
            let call = api_call(&settings, Method::POST, &path, None, true);
            sent(&outbound.send(call).await?, "refund", "checkout_refund_failed")
        })
    }
}

/// What Wave's answer to a request that moves money (`POST /v1/payout`, a session's refund) says of it: `what`
/// names it in errors, and `refused` is the failure code when Wave's refusal gives none.
fn sent(answer: &Answer, what: &str, refused: &str) -> Result<(), ProviderError> {
    match answer.status {
        s if s.is_success() => Ok(()),
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Err(unreachable_or_refused(answer.status, what)),
        // A repeat (after a time-out, a resubmission, or a refund asked again as its own status query) that met
        // the first request still at work, or done, or a payout's key under another body. The first may pay, so
        // this refuses nothing: the payout found under our `client_reference`, or the next query, decides.
        StatusCode::CONFLICT => Err(ProviderError::Unreachable(format!("Wave answered 409 to a {what}"))),
        s if s.is_client_error() && s != StatusCode::TOO_MANY_REQUESTS => {
            let code = answer.json().ok().and_then(|b| b["code"].as_str().map(str::to_owned));
            Err(ProviderError::Rejected { code: code_of(code.as_deref(), refused) })
        }
        status => Err(unreachable_or_refused(status, what)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payout_or_refund_answered_409_is_not_refused() {
        let answer = |status: u16, body: &str| Answer {
            status: StatusCode::from_u16(status).unwrap(),
            body: body.as_bytes().to_vec(),
        };
        let payout_sent = |answer: &Answer| sent(answer, "payout", "payout_refused");
        assert!(payout_sent(&answer(200, "{}")).is_ok());
        let conflict = answer(409, r#"{"code":"idempotency-key-reused"}"#);
        assert!(matches!(payout_sent(&conflict), Err(ProviderError::Unreachable(_))), "the status decides");
        let invalid = answer(400, r#"{"code":"request-validation-error"}"#);
        assert!(
            matches!(payout_sent(&invalid), Err(ProviderError::Rejected { code }) if code == "request_validation_error")
        );
        assert!(matches!(payout_sent(&answer(503, "")), Err(ProviderError::Unreachable(_))));
        let refunded = sent(&answer(409, "{}"), "refund", "checkout_refund_failed");
        assert!(matches!(refunded, Err(ProviderError::Unreachable(_))));
    }

    fn sign(secret: &str, t: u64, body: &str, separator: &str) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
        mac.update(format!("{t}{separator}{body}").as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }

    #[test]
    fn signatures_of_either_form_within_five_minutes_and_any_rotated_key() {
        let (secret, body, t) = ("wave_sn_WHS_secret", r#"{"id":"EV_1"}"#, 1_700_000_000u64);
        for separator in ["", "."] {
            let header = format!("t={t},v1={}", sign(secret, t, body, separator));
            assert!(signature_valid(&header, secret.as_bytes(), body.as_bytes(), t + 10).is_ok(), "{separator:?}");
        }
        let rotated = format!("t={t},v1={},v1={}", "ab".repeat(32), sign(secret, t, body, ""));
        assert!(signature_valid(&rotated, secret.as_bytes(), body.as_bytes(), t).is_ok());
        let header = format!("t={t},v1={}", sign(secret, t, body, ""));
        assert!(signature_valid(&header, secret.as_bytes(), body.as_bytes(), t + 301).is_err(), "too old");
        assert!(signature_valid(&header, b"another secret", body.as_bytes(), t).is_err());
        assert!(signature_valid(&header, secret.as_bytes(), br#"{"id":"EV_2"}"#, t).is_err(), "another body");
        assert!(signature_valid("v1=00", secret.as_bytes(), body.as_bytes(), t).is_err(), "no t");
    }

    #[test]
    fn sessions_and_payouts_read_as_caisse_reads_them() {
        let open = json!({"checkout_status": "open", "payment_status": "cancelled", "last_payment_error": {"code": "insufficient-funds"}});
        assert_eq!(session_status(&open).status, ProviderStatus::Processing, "the customer may try again");
        let paid = json!({"checkout_status": "complete", "payment_status": "succeeded", "transaction_id": "T_ABC"});
        let report = session_status(&paid);
        assert_eq!((report.status, report.reference.unwrap().as_str()), (ProviderStatus::Succeeded, "T_ABC"));
        assert_eq!(session_status(&json!({"checkout_status": "expired"})).status, ProviderStatus::Expired);
        let failed =
            json!({"id": "pt-1", "status": "failed", "payout_error": {"error_code": "recipient-limit-exceeded"}});
        assert_eq!(payout_status(&failed).status, ProviderStatus::Failed { code: "recipient_limit_exceeded".into() });
        assert_eq!(
            payout_status(&json!({"status": "reversed"})).status,
            ProviderStatus::Failed { code: "reversed".into() }
        );
        assert_eq!(code_of(Some("<script>"), "x"), "x", "a provider's code is untrusted");
        let ours = |status: &str| json!({"payment_status": status, "client_reference": "tx_1"});
        let two = vec![ours("processing"), ours("succeeded")];
        assert_eq!(best_session(two, "tx_1", None).unwrap()["payment_status"], "succeeded");
        let foreign = json!({"payment_status": "succeeded", "client_reference": "tx_2"});
        let found = best_session(vec![ours("processing"), foreign], "tx_1", None).unwrap();
        assert_eq!(found["payment_status"], "processing", "a session of another reference says nothing of ours");
        // Another session under our reference, of another amount, succeeded: ours is read first all the same.
        let session = |amount: &str, status: &str| json!({"payment_status": status, "client_reference": "tx_1", "amount": amount, "currency": "XOF"});
        let asked = (Amount::new(1_000).unwrap(), Currency::XOF);
        let found =
            best_session(vec![session("10", "succeeded"), session("1000", "processing")], "tx_1", Some(asked)).unwrap();
        assert_eq!(found["amount"], "1000");
    }
}
