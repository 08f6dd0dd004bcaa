//! The Orange Money adapter (Web Payment): collection only, the customer approves on Orange's page
//! (`url_paiement`); no refund, no payout (Orange sells those under other contracts).
//!
//! Protocol only; what a status means is decided in `flow`. The rules that keep money safe:
//! - An OAuth2 client-credentials token (`expires_in` is a string or a number, depending on the version) is
//!   cached until shortly before it expires and fetched again after a 401.
//! - Our transaction id is the `order_id` (29 characters, within Orange's 30), fixed by the durable write that
//!   created the payment: Orange refuses a second webpayment under it, so a retry never makes a second one.
//! - `transactionstatus` decides, and needs the payment's `pay_token`, which is the last segment of the
//!   `payment_url` Orange answered (kept on the payment as `url_paiement`).
//! - Orange's notification is unsigned and never retried. Its URL ends with a token this server derives for
//!   the transaction (an HMAC of the transaction id, compared in constant time), which plays the part of
//!   Orange's `notif_token` without keeping a secret per transaction; the notification is only a hint, and a lost
//!   one changes nothing, since the sweeps query `transactionstatus` until the payment is final.
//! - Amounts are integers; `OUV` is the currency of Orange's `dev` environment only.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::http::header::HeaderMap;
use awc::http::{Method, StatusCode};
use caisse_engine::domain::money::{Amount, Currency};
use caisse_engine::domain::phone::Phone;
use caisse_engine::domain::provider::ReturnUrl;
use caisse_engine::domain::records::{Payment, Payout, Refund};
use serde_json::{json, Value};
use subtle::ConstantTimeEq;

use super::http::{Call, Outbound};
use super::{Adapter, LocalFuture, Notice, ProviderError, ProviderStatus, Report, Subject};
use crate::config::{Operation, OrangeSettings};

/// A token is fetched again this long before Orange says it expires.
const TOKEN_MARGIN: Duration = Duration::from_secs(60);
/// What the customer reads as the merchant on Orange's page (at most 30 characters).
const SHOP: &str = "Caisse";

/// The longest URL Orange takes in a web payment (`notif_url`, `return_url`, `cancel_url`).
pub const URL_LIMIT: usize = 120;
/// What a notification URL adds to `public_url`: `/v1/notifications/orange_money/tx_…-<16 hex>`. The
/// configuration refuses a `public_url` too long for it ([`URL_LIMIT`]), which Orange would refuse at every
/// payment.
pub const NOTIFY_URL_SUFFIX: usize = "/v1/notifications/orange_money/".len() + 29 + 1 + 16;

pub struct OrangeMoney {
    settings: OrangeSettings,
    notify_base: String,
    return_base: String,
    callback_key: Vec<u8>,
    token: Arc<Mutex<Option<(String, Instant)>>>,
    outbound: Arc<Outbound>,
}

impl OrangeMoney {
    pub fn new(settings: OrangeSettings, public_url: &str) -> OrangeMoney {
        let public_url = public_url.trim_end_matches('/');
        OrangeMoney {
            callback_key: super::callback_token_key(
                "caisse orange_money notification token",
                settings.client_secret.expose(),
            ),
            notify_base: format!("{public_url}/v1/notifications/orange_money"),
            return_base: format!("{public_url}/retour/"),
            settings,
            token: Arc::default(),
            outbound: Arc::new(Outbound::new("orange_money")),
        }
    }

    /// The last segment of a notification URL: the transaction id and its token, `tx_…-<16 hex>`. Half the
    /// usual token (64 bits of an HMAC still cannot be guessed) keeps the URL within Orange's 120 characters.
    fn path_token(&self, tx: &str) -> String {
        let token = super::callback_token(&self.callback_key, tx);
        format!("{tx}-{}", token.get(..16).unwrap_or(&token))
    }

    /// Sends `body` to `{base}/orange-money-webpay/{country}/v1/{path}` with a valid token, once more after a 401.
    fn send(&self, path: &str, body: Value) -> LocalFuture<Result<(StatusCode, Value), ProviderError>> {
        let url = format!("{}/orange-money-webpay/{}/v1/{path}", self.settings.base_url, self.settings.country);
        let (settings, tokens, outbound) = (self.settings.clone(), self.token.clone(), self.outbound.clone());
        Box::pin(async move {
            for attempt in 0..2 {
                let token = bearer(&outbound, &tokens, &settings).await?;
                let call = Call {
                    method: Method::POST,
                    url: url.clone(),
                    headers: vec![("Authorization", format!("Bearer {token}")), ("Accept", "application/json".into())],
                    body: Some(body.clone()),
                    // Orange refuses an order_id it saw, so repeating a creation never makes a second one.
                    idempotent: true,
                };
                let answer = outbound.send(call).await?;
                if answer.status == StatusCode::UNAUTHORIZED && attempt == 0 {
                    tokens.lock().map(|mut t| t.take()).ok();
                    continue;
                }
                let json = answer.json().unwrap_or(Value::Null);
                return Ok((answer.status, json));
            }
            Err(ProviderError::Unreachable("Orange refused a fresh token".into()))
        })
    }
}

/// A bearer token: the cached one while valid, else a new one (client credentials, HTTP Basic).
async fn bearer(
    outbound: &Outbound,
    tokens: &Mutex<Option<(String, Instant)>>,
    settings: &OrangeSettings,
) -> Result<String, ProviderError> {
    if let Some((token, until)) = tokens.lock().ok().and_then(|t| t.clone()) {
        if Instant::now() < until {
            return Ok(token);
        }
    }
    let basic = super::basic_auth(&settings.client_id, settings.client_secret.expose());
    let headers = vec![("Authorization", basic), ("Accept", "application/json".into())];
    let form = Some(vec![("grant_type", "client_credentials".into())]);
    let answer = outbound.send_form(Method::POST, settings.token_url.clone(), headers, form).await?;
    if answer.status != StatusCode::OK {
        tracing::error!(status = %answer.status, "Orange refused our client credentials: check adapters.orange_money");
        return Err(ProviderError::Unreachable(format!("Orange token answered {}", answer.status)));
    }
    let (token, lifetime) = super::access_token("Orange", &answer.json()?, Duration::from_secs(90 * 86_400))?;
    if let Ok(mut cache) = tokens.lock() {
        *cache = Some((token.clone(), Instant::now() + lifetime.saturating_sub(TOKEN_MARGIN)));
    }
    Ok(token)
}

/// The `pay_token` in Orange's payment URL (`…/payment/pay_token/<token>`).
fn pay_token(payment_url: &str) -> Option<&str> {
    let token = payment_url.split('?').next()?.rsplit('/').next()?;
    (!token.is_empty() && token.len() <= 200 && token.bytes().all(url_safe)).then_some(token)
}

/// The page of a webpayment Orange created, from its answer.
fn created_page(body: &Value) -> Result<Option<ReturnUrl>, ProviderError> {
    let url = body["payment_url"]
        .as_str()
        .ok_or_else(|| ProviderError::Unreachable("an Orange answer without payment_url".into()))?;
    if pay_token(url).is_none() {
        return Err(ProviderError::Unreachable("Orange's payment_url carries no pay_token".into()));
    }
    // Each status query names the payment by the pay_token read back from its page's URL (the one thing Caisse
    // keeps of it). A page whose URL does not end with the pay_token Orange gave could never be followed: a
    // customer paying it would never be credited. It is refused before anyone pays.
    let named = |given: &str| pay_token(url).is_some_and(|t| bool::from(t.as_bytes().ct_eq(given.as_bytes())));
    if let Some(given) = body["pay_token"].as_str().filter(|given| !named(given)) {
        tracing::error!(
            pay_token = given,
            payment_url = url,
            "Orange's payment URL does not end with its pay_token: Caisse cannot follow such payments"
        );
        return Err(ProviderError::Rejected { code: "payment_url_unfollowable".into() });
    }
    ReturnUrl::parse(url, false).map(Some).map_err(|e| ProviderError::Unreachable(format!("Orange's payment URL: {e}")))
}

/// A byte of an identifier that may go in a URL as it is.
fn url_safe(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_')
}

/// A `transactionstatus` answer about our order `ours`, as Caisse reads it. An answer naming another order is no
/// answer about ours.
fn status_of(body: &Value, ours: &str) -> Result<Report, ProviderError> {
    if let Some(other) = body["order_id"].as_str().filter(|order| *order != ours) {
        return Err(ProviderError::Unreachable(format!("Orange answered about order {other:?}, not ours")));
    }
    let status = match body["status"].as_str() {
        Some("SUCCESS") => ProviderStatus::Succeeded,
        Some("FAILED") => ProviderStatus::Failed { code: "payment_failed".into() },
        Some("EXPIRED") => ProviderStatus::Expired,
        // INITIATED (waiting for the customer), PENDING (confirmed, under way), anything new.
        _ => ProviderStatus::Processing,
    };
    Ok(Report::with_reference(status, body["txnid"].as_str()))
}

impl Adapter for OrangeMoney {
    fn degraded(&self) -> bool {
        self.outbound.degraded()
    }

    fn check_amount(
        &self,
        _f: &str,
        _phone: &Phone,
        operation: Operation,
        currency: Currency,
        _amount: Amount,
    ) -> Result<(), String> {
        if operation != Operation::Payment {
            return Err("Orange Money Web Payment collects only: route payouts to another adapter".into());
        }
        if currency.decimals() != 0 {
            return Err(format!("Orange Money takes whole amounts only, not {}", currency.code()));
        }
        Ok(())
    }

    fn can_refund(&self, _payment: &Payment, _amount: Amount) -> bool {
        false
    }

    fn refunds_nothing(&self) -> bool {
        true
    }

    fn pays_out(&self, _fournisseur: &str, _phone: &Phone) -> bool {
        false
    }

    fn request_to_pay(&self, payment: &Payment) -> LocalFuture<Result<Option<ReturnUrl>, ProviderError>> {
        let tx = &payment.transaction_id;
        let currency = if self.settings.country == "dev" { "OUV" } else { payment.currency.code() };
        let back = format!("{}{tx}", self.return_base);
        let body = json!({
            "merchant_key": self.settings.merchant_key.expose(),
            "currency": currency,
            "order_id": tx,
            "amount": payment.amount.minor(),
            "return_url": back,
            "cancel_url": back,
            "notif_url": format!("{}/{}", self.notify_base, self.path_token(tx)),
            "lang": "fr",
            "reference": SHOP,
        });
        let sent = self.send("webpayment", body);
        Box::pin(async move {
            let (status, body) = sent.await?;
            match status {
                StatusCode::CREATED | StatusCode::OK => created_page(&body),
                // Our order_id was already used: the first request reached Orange; its status decides.
                StatusCode::FORBIDDEN if body.to_string().contains("order") => {
                    Err(ProviderError::Unreachable("Orange already has this order_id".into()))
                }
                s if s.is_client_error() && s != StatusCode::TOO_MANY_REQUESTS => {
                    Err(ProviderError::Rejected { code: "invalid_request".into() })
                }
                s => Err(ProviderError::Unreachable(format!("Orange webpayment answered {s}"))),
            }
        })
    }

    fn status(
        &self,
        subject: Subject,
        transaction_id: &str,
        payment: Option<&Payment>,
    ) -> LocalFuture<Result<Report, ProviderError>> {
        let Some(payment) = payment.filter(|p| subject == Subject::Payment && p.transaction_id == transaction_id)
        else {
            return Box::pin(std::future::ready(Err(ProviderError::Malformed("Orange Money collects only".into()))));
        };
        // No page yet: Orange never answered the creation, so nothing exists there to query.
        let Some(token) = payment.payment_url.as_deref().and_then(pay_token) else {
            return Box::pin(std::future::ready(Ok(ProviderStatus::Pending.into())));
        };
        let body = json!({"order_id": transaction_id, "amount": payment.amount.minor(), "pay_token": token});
        let sent = self.send("transactionstatus", body);
        let ours = transaction_id.to_owned();
        Box::pin(async move {
            let (status, body) = sent.await?;
            match status {
                s if s.is_success() => status_of(&body, &ours),
                s => Err(ProviderError::Unreachable(format!("Orange transactionstatus answered {s}"))),
            }
        })
    }

    fn refund(&self, _payment: &Payment, _refund: &Refund) -> LocalFuture<Result<(), ProviderError>> {
        Box::pin(std::future::ready(Err(ProviderError::Rejected { code: "refund_unsupported".into() })))
    }

    fn payout(&self, _payout: &Payout) -> LocalFuture<Result<(), ProviderError>> {
        Box::pin(std::future::ready(Err(ProviderError::Rejected { code: "payout_unsupported".into() })))
    }

    /// Orange's notification `{status, notif_token, txnid}`, at a URL ending in the transaction's token.
    fn parse_notice(
        &self,
        _headers: &HeaderMap,
        path_token: Option<&str>,
        body: &[u8],
    ) -> Result<Notice, ProviderError> {
        let given = path_token.unwrap_or_default();
        let Some((tx, _)) = given.rsplit_once('-') else {
            return Err(ProviderError::Unauthenticated("the notification URL carries no transaction token".into()));
        };
        let expected = self.path_token(tx);
        if !bool::from(subtle::ConstantTimeEq::ct_eq(expected.as_bytes(), given.as_bytes())) {
            return Err(ProviderError::Unauthenticated(
                "the notification URL's token is not this transaction's".into(),
            ));
        }
        let _: Value = serde_json::from_slice(body).map_err(|e| ProviderError::Malformed(e.to_string()))?;
        Ok(Notice { subject: Subject::Payment, transaction_id: tx.to_owned(), status: ProviderStatus::Processing })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_is_kept_only_when_its_url_names_the_pay_token_orange_gave() {
        let url = "https://webpayment.orange-money.com/payment/pay_token/abc123";
        let page = created_page(&json!({"status": 201, "pay_token": "abc123", "payment_url": url})).unwrap();
        assert_eq!(page.map(|p| p.as_str().to_owned()).as_deref(), Some(url));
        // Another shape of URL: the status queries would name a token Orange does not know.
        let other = json!({"pay_token": "abc123", "payment_url": "https://mpayment.orange-money.com/gn/mpayment/xyz"});
        assert_eq!(created_page(&other), Err(ProviderError::Rejected { code: "payment_url_unfollowable".into() }));
        // No pay_token in the answer: the URL's, as before.
        assert!(created_page(&json!({"payment_url": url})).is_ok());
    }

    #[test]
    fn a_notification_url_is_public_url_and_its_known_suffix() {
        let settings = OrangeSettings {
            base_url: "http://127.0.0.1:1".into(),
            token_url: "http://127.0.0.1:1/oauth/v3/token".into(),
            country: "dev".into(),
            client_id: "id".into(),
            client_secret: crate::config::Secret::new("secret".into()),
            merchant_key: crate::config::Secret::new("key".into()),
        };
        let public_url = "https://pay.example.com";
        let adapter = OrangeMoney::new(settings, public_url);
        let tx = caisse_engine::domain::ids::new_id(caisse_engine::domain::ids::IdKind::Transaction);
        let url = format!("{}/{}", adapter.notify_base, adapter.path_token(&tx));
        assert_eq!(url.len(), public_url.len() + NOTIFY_URL_SUFFIX);
        assert!(format!("{}{tx}", adapter.return_base).len() < url.len(), "the return URL is shorter");
    }

    #[test]
    fn tokens_lifetimes_and_statuses() {
        let max = Duration::from_secs(90 * 86_400);
        let lifetime = |expires: Value| {
            super::super::access_token("Orange", &json!({"access_token": "t", "expires_in": expires}), max).unwrap().1
        };
        assert_eq!(lifetime(json!("7776000")), Duration::from_secs(7_776_000));
        assert_eq!(lifetime(json!(3600)), Duration::from_secs(3600));
        assert_eq!(lifetime(json!(null)), Duration::from_secs(3600));
        assert!(super::super::access_token("Orange", &json!({"expires_in": 10}), max).is_err(), "no token, no answer");
        assert_eq!(pay_token("https://webpayment-sb.orange-money.com/payment/pay_token/ab12CD"), Some("ab12CD"));
        assert_eq!(pay_token("https://x/payment/pay_token/<script>"), None);
        let read = |body: Value| status_of(&body, "tx_1").map(|report| report.status);
        let success = json!({"status": "SUCCESS", "order_id": "tx_1", "txnid": "MP150709.1341.A00073"});
        assert_eq!(read(success), Ok(ProviderStatus::Succeeded));
        assert_eq!(read(json!({"status": "INITIATED"})), Ok(ProviderStatus::Processing));
        assert_eq!(read(json!({"status": "EXPIRED"})), Ok(ProviderStatus::Expired));
        assert_eq!(read(json!({"status": "FAILED"})), Ok(ProviderStatus::Failed { code: "payment_failed".into() }));
        // Another order's success is not ours.
        assert!(read(json!({"status": "SUCCESS", "order_id": "tx_2"})).is_err());
    }
}
