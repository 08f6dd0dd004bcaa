//! The MTN MoMo Open API adapter: collection (requesttopay), disbursement (transfer) for payouts, v2 refunds,
//! status queries and callbacks.
//!
//! Protocol only; what a status means is decided in `flow`. The rules that keep money safe:
//! - Every request's `X-Reference-Id` is our transaction id written as a UUIDv4 ([`uuid_of`]), fixed by the
//!   durable write that created the transaction: a retry, a query or a restart reuses it, and MTN answers a
//!   repeated one with 409 `RESOURCE_ALREADY_EXIST`, which means "already created".
//! - A 5xx, a timeout or an unclear answer fails nothing (MTN reports some business errors as 500 too); the
//!   status query decides. A 404 on a status query means "not created yet": MTN answers it for a moment right
//!   after accepting a request, so it is read as pending, never as a failure.
//! - Callbacks are unsigned. Each request's `X-Callback-Url` carries a per-transaction token (an HMAC of the
//!   transaction id under a key only this server knows), so a callback for another id is refused; and a
//!   callback is only a hint: nothing moves before MTN's own status answer.
//! - Each product has its own subscription key and API user; a bearer token per product is cached until shortly
//!   before it expires and fetched again after a 401.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::http::header::HeaderMap;
use awc::http::{Method, StatusCode};
use caisse_engine::domain::ids::uuid_of;
use caisse_engine::domain::money::{Amount, Currency};
use caisse_engine::domain::provider::ReturnUrl;
use caisse_engine::domain::records::{Payment, Payout, Refund};
use serde_json::{json, Value};

use super::http::{Answer, Call, Outbound};
use super::pawapay::amount_text;
use super::{Adapter, LocalFuture, Notice, ProviderError, ProviderStatus, Report, Subject};
use crate::config::{MtnProduct, MtnSettings};

/// A token is fetched again this long before MTN says it expires.
const TOKEN_MARGIN: Duration = Duration::from_secs(60);
/// What the payer reads (MTN refuses some characters; plain words only).
const PAYER_MESSAGE: &str = "Paiement Caisse";
const PAYEE_NOTE: &str = "Caisse";

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Product {
    Collection,
    Disbursement,
}

impl Product {
    fn path(self) -> &'static str {
        match self {
            Product::Collection => "collection",
            Product::Disbursement => "disbursement",
        }
    }
}

pub struct MtnMomo {
    settings: MtnSettings,
    /// Where MTN sends callbacks: `{public_url}/v1/notifications/mtn_momo`; empty when no public URL is set.
    callback_base: String,
    /// Key of the per-transaction callback tokens, derived from the collection API key (a secret that outlives
    /// restarts), so a callback for a request made before a restart is still recognised.
    callback_key: Vec<u8>,
    tokens: Arc<Mutex<HashMap<Product, (String, Instant)>>>,
    outbound: Arc<Outbound>,
}

impl MtnMomo {
    pub fn new(settings: MtnSettings, public_url: &str) -> MtnMomo {
        let callback_base =
            if public_url.is_empty() { String::new() } else { format!("{public_url}/v1/notifications/mtn_momo") };
        let callback_key =
            super::callback_token_key("caisse mtn_momo callback token", settings.collection.api_key.expose());
        MtnMomo {
            settings,
            callback_base,
            callback_key,
            tokens: Arc::default(),
            outbound: Arc::new(Outbound::new("mtn_momo")),
        }
    }

    /// The unguessable path segment of a transaction's callback URL.
    fn callback_token(&self, transaction_id: &str) -> String {
        super::callback_token(&self.callback_key, transaction_id)
    }

    fn product(&self, product: Product) -> Result<&MtnProduct, ProviderError> {
        match product {
            Product::Collection => Ok(&self.settings.collection),
            Product::Disbursement => self
                .settings
                .disbursement
                .as_ref()
                .ok_or_else(|| ProviderError::Rejected { code: "disbursement_not_configured".into() }),
        }
    }

    /// Sends a request of `product` with a valid bearer token, fetching one first if needed, and once more
    /// with a fresh token after a 401.
    fn send(
        &self,
        product: Product,
        method: Method,
        path: String,
        extra: Vec<(&'static str, String)>,
        body: Option<Value>,
    ) -> LocalFuture<Result<Answer, ProviderError>> {
        let credentials = match self.product(product) {
            Ok(p) => p.clone(),
            Err(e) => return Box::pin(std::future::ready(Err(e))),
        };
        let (base, target) = (self.settings.base_url.clone(), self.settings.target_environment.clone());
        let (tokens, outbound) = (self.tokens.clone(), self.outbound.clone());
        Box::pin(async move {
            for attempt in 0..2 {
                let token = bearer(&outbound, &tokens, &base, product, &credentials).await?;
                let mut headers = vec![
                    ("Authorization", format!("Bearer {token}")),
                    ("Ocp-Apim-Subscription-Key", credentials.subscription_key.expose().to_owned()),
                    ("X-Target-Environment", target.clone()),
                ];
                headers.extend(extra.iter().cloned());
                let call = Call {
                    method: method.clone(),
                    url: format!("{base}{path}"),
                    headers,
                    body: body.clone(),
                    idempotent: true,
                };
                let answer = outbound.send(call).await?;
                if answer.status == StatusCode::UNAUTHORIZED && attempt == 0 {
                    tokens.lock().map(|mut t| t.remove(&product)).ok();
                    continue;
                }
                return Ok(answer);
            }
            Err(ProviderError::Unreachable("MTN refused a fresh token".into()))
        })
    }

    /// Creates a transaction (`requesttopay`, `transfer`, `refund`) under its id.
    fn create(
        &self,
        subject: Subject,
        path: &str,
        transaction_id: &str,
        body: Value,
    ) -> LocalFuture<Result<(), ProviderError>> {
        let product = match subject {
            Subject::Payment => Product::Collection,
            Subject::Payout | Subject::Refund => Product::Disbursement,
        };
        let id = match uuid_of(transaction_id) {
            Some(id) => id,
            None => return Box::pin(std::future::ready(Err(ProviderError::Malformed(format!("`{transaction_id}`"))))),
        };
        let mut extra = vec![("X-Reference-Id", id)];
        if !self.callback_base.is_empty() {
            extra.push(("X-Callback-Url", format!("{}/{}", self.callback_base, self.callback_token(transaction_id))));
        }
        let sent = self.send(product, Method::POST, path.to_owned(), extra, Some(body));
        // Only polled when MTN answers a refusal with a 500 (below).
        let asked = self.status(subject, transaction_id, None);
        Box::pin(async move {
            let answer = sent.await?;
            let Some(code) = refusal(&answer) else { return read_creation(&answer) };
            // MTN answers some refusals of a request with a 500 and a code, the same status as its own failures.
            // The request was refused only if the transaction does not exist: a status query that finds none
            // makes it a refusal; one that finds it means it was created all the same.
            match asked.await? {
                Report { status: ProviderStatus::Pending, .. } => Err(ProviderError::Rejected { code }),
                _ => Ok(()),
            }
        })
    }
}

/// A bearer token of `product`: the cached one while valid, else a new one (Basic apiUser:apiKey).
async fn bearer(
    outbound: &Outbound,
    tokens: &Mutex<HashMap<Product, (String, Instant)>>,
    base: &str,
    product: Product,
    credentials: &MtnProduct,
) -> Result<String, ProviderError> {
    if let Some((token, until)) = tokens.lock().ok().and_then(|t| t.get(&product).cloned()) {
        if Instant::now() < until {
            return Ok(token);
        }
    }
    let call = Call {
        method: Method::POST,
        url: format!("{base}/{}/token/", product.path()),
        headers: vec![
            ("Authorization", super::basic_auth(&credentials.api_user, credentials.api_key.expose())),
            ("Ocp-Apim-Subscription-Key", credentials.subscription_key.expose().to_owned()),
        ],
        body: None,
        idempotent: true,
    };
    let answer = outbound.send(call).await?;
    if answer.status != StatusCode::OK {
        tracing::error!(status = %answer.status, product = product.path(), "MTN refused our credentials: check adapters.mtn_momo");
        return Err(ProviderError::Unreachable(format!("MTN token answered {}", answer.status)));
    }
    let (token, lifetime) = super::access_token("MTN", &answer.json()?, Duration::from_secs(86_400))?;
    let until = Instant::now() + lifetime.saturating_sub(TOKEN_MARGIN);
    if let Ok(mut cache) = tokens.lock() {
        cache.insert(product, (token.clone(), until));
    }
    Ok(token)
}

/// The body every MTN creation shares (amount as a string, currency, our id as `externalId`, the messages),
/// with the one field that differs: the payer, the payee, or the request to refund.
fn body(amount: Amount, currency: Currency, external_id: &str, (key, value): (&str, Value)) -> Value {
    let mut body = json!({
        "amount": amount_text(amount, currency),
        "currency": currency.code(),
        "externalId": external_id,
        "payerMessage": PAYER_MESSAGE,
        "payeeNote": PAYEE_NOTE,
    });
    body[key] = value;
    body
}

/// The codes MTN answers a refused creation with, under a 500, that say the request could not be made at all:
/// a configuration it refuses (the account's permissions, the target environment, the currency, the callback
/// host). A refusal about the parties (`NOT_ENOUGH_FUNDS`, `PAYEE_NOT_FOUND`, ...) is not among them: such a
/// transaction may have been created on an earlier attempt and not be visible yet, so only its status decides.
/// Nor are MTN's own failures (`INTERNAL_PROCESSING_ERROR`, `SERVICE_UNAVAILABLE`, ...).
const REFUSALS: &[&str] =
    &["NOT_ALLOWED", "NOT_ALLOWED_TARGET_ENVIRONMENT", "INVALID_CALLBACK_URL_HOST", "INVALID_CURRENCY"];

/// The code of a creation MTN refused under a 500 ([`REFUSALS`]), in lower snake case.
fn refusal(answer: &Answer) -> Option<String> {
    if answer.status != StatusCode::INTERNAL_SERVER_ERROR {
        return None;
    }
    let body: Value = serde_json::from_slice(&answer.body).ok()?;
    let code = body["code"].as_str()?;
    REFUSALS.contains(&code).then(|| code.to_ascii_lowercase())
}

fn read_creation(answer: &Answer) -> Result<(), ProviderError> {
    match answer.status {
        // 409: this X-Reference-Id was already used, by us, for this very transaction.
        StatusCode::ACCEPTED | StatusCode::OK | StatusCode::CREATED | StatusCode::CONFLICT => Ok(()),
        StatusCode::BAD_REQUEST => Err(ProviderError::Rejected { code: "invalid_request".into() }),
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
            tracing::error!(status = %answer.status, "MTN refused the request: check the credentials and IP allow-listing");
            Err(ProviderError::Unreachable(format!("MTN answered {}", answer.status)))
        }
        status => Err(ProviderError::Unreachable(format!("MTN answered {status}"))),
    }
}

/// MTN's reason (a string, or an object with a code in some versions), in lower snake case.
fn reason_code(object: &Value) -> String {
    let reason = object["reason"].as_str().or_else(|| object["reason"]["code"].as_str());
    reason
        .filter(|c| !c.is_empty() && c.len() <= 64 && c.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
        .map_or_else(|| "unspecified_failure".to_owned(), str::to_ascii_lowercase)
}

fn status_of(object: &Value) -> ProviderStatus {
    match object["status"].as_str() {
        Some("SUCCESSFUL") => ProviderStatus::Succeeded,
        Some("FAILED") | Some("REJECTED") | Some("TIMEOUT") => ProviderStatus::Failed { code: reason_code(object) },
        // PENDING, CREATED, ONGOING, and anything new: not final.
        _ => ProviderStatus::Processing,
    }
}

fn read_status(answer: &Answer) -> Result<Report, ProviderError> {
    match answer.status {
        StatusCode::OK => {
            let object = answer.json()?;
            let report = Report::with_reference(status_of(&object), object["financialTransactionId"].as_str());
            Ok(report.stating(&object["amount"], &object["currency"]))
        }
        // Unknown, or not visible yet right after a 202: never a failure.
        StatusCode::NOT_FOUND => Ok(ProviderStatus::Pending.into()),
        status => Err(ProviderError::Unreachable(format!("MTN status query answered {status}"))),
    }
}

/// The country of an MTN target environment (`mtnbenin`: BJ), as MTN's partner portal names them; `None` for
/// `sandbox` and a target not listed here, which this server does not restrict.
fn target_country(target: &str) -> Option<&'static str> {
    Some(match target {
        "mtnbenin" => "BJ",
        "mtnivorycoast" => "CI",
        "mtncameroon" => "CM",
        "mtncongo" => "CG",
        "mtnguineaconakry" => "GN",
        "mtnghana" => "GH",
        "mtnuganda" => "UG",
        "mtnzambia" => "ZM",
        "mtnliberia" => "LR",
        "mtnswaziland" => "SZ",
        "mtnsouthafrica" => "ZA",
        "mtnrwanda" => "RW",
        _ => return None,
    })
}

impl Adapter for MtnMomo {
    fn degraded(&self) -> bool {
        self.outbound.degraded()
    }

    /// MTN's own customers only, through disbursement, in the country of the target environment (an MTN
    /// account pays in its own country only).
    fn pays_out(&self, fournisseur: &str, phone: &caisse_engine::domain::phone::Phone) -> bool {
        fournisseur == "mtn_momo"
            && self.settings.disbursement.is_some()
            && target_country(&self.settings.target_environment).is_none_or(|country| phone.country() == Some(country))
    }

    fn request_to_pay(&self, payment: &Payment) -> LocalFuture<Result<Option<ReturnUrl>, ProviderError>> {
        let party = json!({"partyIdType": "MSISDN", "partyId": payment.customer_phone.digits()});
        let body = body(payment.amount, payment.currency, &payment.transaction_id, ("payer", party));
        let created = self.create(Subject::Payment, "/collection/v1_0/requesttopay", &payment.transaction_id, body);
        Box::pin(async move { created.await.map(|()| None) })
    }

    fn status(
        &self,
        subject: Subject,
        transaction_id: &str,
        _payment: Option<&Payment>,
    ) -> LocalFuture<Result<Report, ProviderError>> {
        let Some(id) = uuid_of(transaction_id) else {
            return Box::pin(std::future::ready(Err(ProviderError::Malformed(format!("`{transaction_id}`")))));
        };
        // A payout or refund may have left before disbursement was taken out of the configuration: without it
        // nothing can be asked, and nothing is decided until it is back.
        if subject != Subject::Payment && self.settings.disbursement.is_none() {
            return Box::pin(std::future::ready(Err(ProviderError::Unreachable(
                "adapters.mtn_momo has no disbursement settings: the transaction waits".into(),
            ))));
        }
        let (product, path) = match subject {
            Subject::Payment => (Product::Collection, format!("/collection/v1_0/requesttopay/{id}")),
            Subject::Payout => (Product::Disbursement, format!("/disbursement/v1_0/transfer/{id}")),
            Subject::Refund => (Product::Disbursement, format!("/disbursement/v1_0/refund/{id}")),
        };
        let sent = self.send(product, Method::GET, path, Vec::new(), None);
        Box::pin(async move { read_status(&sent.await?) })
    }

    fn refund(&self, payment: &Payment, refund: &Refund) -> LocalFuture<Result<(), ProviderError>> {
        let Some(original) = uuid_of(&payment.transaction_id) else {
            return Box::pin(std::future::ready(Err(ProviderError::Malformed(payment.transaction_id.clone()))));
        };
        let transaction_id = refund.transaction_id();
        let body = body(refund.amount, payment.currency, &transaction_id, ("referenceIdToRefund", json!(original)));
        self.create(Subject::Refund, "/disbursement/v2_0/refund", &transaction_id, body)
    }

    fn payout(&self, payout: &Payout) -> LocalFuture<Result<(), ProviderError>> {
        let party = json!({"partyIdType": "MSISDN", "partyId": payout.beneficiary_phone.digits()});
        // The beneficiary receives the amount net of Caisse's fee, which stays on the merchant's balance.
        let body = body(payout.net_amount, payout.currency, &payout.transaction_id, ("payee", party));
        self.create(Subject::Payout, "/disbursement/v1_0/transfer", &payout.transaction_id, body)
    }

    /// A callback: MTN's status object at our per-transaction URL. Refused unless the path's token is the one
    /// this server gave that transaction; the subject is read from the object (`payer` for a payment, `payee`
    /// for a payout, neither for a refund) and only steers the status query that follows.
    fn parse_notice(
        &self,
        _headers: &HeaderMap,
        path_token: Option<&str>,
        body: &[u8],
    ) -> Result<Notice, ProviderError> {
        let object: Value = serde_json::from_slice(body).map_err(|e| ProviderError::Malformed(e.to_string()))?;
        let Some(ours) = object["externalId"].as_str().filter(|t| t.len() <= 64) else {
            return Err(ProviderError::NotOurs("a callback without externalId".into()));
        };
        let expected = self.callback_token(ours);
        let given = path_token.unwrap_or_default();
        if expected.is_empty() || !bool::from(subtle::ConstantTimeEq::ct_eq(expected.as_bytes(), given.as_bytes())) {
            return Err(ProviderError::Unauthenticated("the callback URL's token is not this transaction's".into()));
        }
        let subject = if object.get("payer").is_some() {
            Subject::Payment
        } else if object.get("payee").is_some() {
            Subject::Payout
        } else {
            Subject::Refund
        };
        Ok(Notice { subject, transaction_id: ours.to_owned(), status: status_of(&object) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;

    fn adapter() -> MtnMomo {
        let product = MtnProduct {
            subscription_key: Secret::new("k".into()),
            api_user: "u".into(),
            api_key: Secret::new("s".into()),
        };
        let settings = MtnSettings {
            base_url: "http://127.0.0.1:1".into(),
            target_environment: "sandbox".into(),
            collection: product.clone(),
            disbursement: Some(product),
        };
        MtnMomo::new(settings, "https://pay.example.com")
    }

    /// An account pays out in its target's country only; the sandbox's, and a target not listed, anywhere.
    #[test]
    fn payouts_only_in_the_targets_country() {
        let phone = |text: &str| caisse_engine::domain::phone::Phone::parse(text).unwrap();
        let (benin, cameroon) = (phone("+22997000001"), phone("+237670000001"));
        let mut mtn = adapter();
        assert!(mtn.pays_out("mtn_momo", &benin) && mtn.pays_out("mtn_momo", &cameroon), "sandbox");
        mtn.settings.target_environment = "mtnbenin".into();
        assert!(mtn.pays_out("mtn_momo", &benin));
        assert!(!mtn.pays_out("mtn_momo", &cameroon), "a Beninese account does not pay Cameroon");
        assert!(!mtn.pays_out("orange_money", &benin), "MTN's own customers only");
        mtn.settings.target_environment = "mtnelsewhere".into();
        assert!(mtn.pays_out("mtn_momo", &cameroon), "a target not listed is not restricted");
    }

    #[test]
    fn statuses_reasons_and_creation_answers() {
        assert_eq!(status_of(&json!({"status": "SUCCESSFUL"})), ProviderStatus::Succeeded);
        assert_eq!(status_of(&json!({"status": "PENDING"})), ProviderStatus::Processing);
        let failed = json!({"status": "FAILED", "reason": "PAYER_NOT_FOUND"});
        assert_eq!(status_of(&failed), ProviderStatus::Failed { code: "payer_not_found".into() });
        let object = json!({"status": "FAILED", "reason": {"code": "APPROVAL_REJECTED", "message": "x"}});
        assert_eq!(status_of(&object), ProviderStatus::Failed { code: "approval_rejected".into() });
        let answer = |status: u16| Answer { status: StatusCode::from_u16(status).unwrap(), body: Vec::new() };
        assert!(read_creation(&answer(202)).is_ok());
        assert!(read_creation(&answer(409)).is_ok(), "a repeated reference id is our own earlier request");
        assert!(matches!(read_creation(&answer(500)), Err(ProviderError::Unreachable(_))), "a 500 fails nothing");
        assert_eq!(
            read_status(&answer(404)).unwrap().status,
            ProviderStatus::Pending,
            "404 right after 202 is pending"
        );
        let done = Answer {
            status: StatusCode::OK,
            body: json!({"status": "SUCCESSFUL", "financialTransactionId": "1234567890"}).to_string().into_bytes(),
        };
        let report = read_status(&done).unwrap();
        assert_eq!((report.status, report.reference.unwrap().as_str()), (ProviderStatus::Succeeded, "1234567890"));
    }

    #[test]
    fn a_callback_needs_its_transactions_token() {
        let mtn = adapter();
        let tx = caisse_engine::domain::ids::new_id(caisse_engine::domain::ids::IdKind::Transaction);
        let body =
            json!({"externalId": tx, "status": "SUCCESSFUL", "payer": {"partyIdType": "MSISDN", "partyId": "229"}});
        let body = body.to_string();
        let token = mtn.callback_token(&tx);
        let notice = mtn.parse_notice(&HeaderMap::new(), Some(&token), body.as_bytes()).unwrap();
        assert_eq!((notice.subject, notice.transaction_id.as_str()), (Subject::Payment, tx.as_str()));
        let other = mtn.callback_token("tx_01JD0000000000000000000000");
        assert!(matches!(
            mtn.parse_notice(&HeaderMap::new(), Some(&other), body.as_bytes()),
            Err(ProviderError::Unauthenticated(_))
        ));
        assert!(matches!(
            mtn.parse_notice(&HeaderMap::new(), None, body.as_bytes()),
            Err(ProviderError::Unauthenticated(_))
        ));
        assert_eq!(token.len(), 32);
    }
}
