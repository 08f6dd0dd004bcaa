//! The pawaPay v2 adapter: deposits (collection), payouts, partial refunds, status queries and callbacks.
//!
//! Protocol only; what a status means for a payment is decided in `flow`. The rules that keep money safe:
//! - Every transaction's pawaPay id (`depositId`, `payoutId`, `refundId`) is our own transaction id written as
//!   a UUIDv4 ([`uuid_of`]), so it is fixed in the same durable write as the transaction, before any request
//!   leaves; a retry, a status query or a restart uses the same id, and pawaPay answers `DUPLICATE_IGNORED`
//!   instead of creating a second transaction.
//! - A 5xx, a timeout or an unclear answer never fails anything: the call is retried with the same id, and
//!   otherwise the status query decides later. Only `REJECTED` (or a 4xx for our request) is a refusal, and
//!   only a status query's `FAILED` is a failure. `NOT_FOUND` means the transaction was never created, so
//!   sending it again with the same id is safe.
//! - A callback is a hint: it is matched to our transaction (`clientReferenceId`, or for refunds the
//!   `caisseTransactionId` metadata we sent, which must map to the callback's own id) and the status is then
//!   asked of pawaPay before any money moves.
//!
//! Fournisseurs map to pawaPay provider codes per country ([`PROVIDER_CODES`]); a fournisseur pawaPay does not
//! carry in a country is refused before anything is created. pawaPay's Wave providers need the customer's
//! browser: their deposit carries `successfulUrl`/`failedUrl` (Caisse's return page) and answers `GET_AUTH_URL`,
//! and the `authorizationUrl` the status query then gives is the payment's `url_paiement`.

use actix_web::http::header::HeaderMap;
use awc::http::{Method, StatusCode};
use caisse_engine::domain::ids::uuid_of;
use caisse_engine::domain::money::{Amount, Currency};
use caisse_engine::domain::phone::Phone;
use caisse_engine::domain::provider::ReturnUrl;
use caisse_engine::domain::records::{Payment, Payout, Refund};
use serde_json::{json, Value};

use super::http::{Answer, Call, Outbound};
use super::{rfc9421, Adapter, Callback, LocalFuture, Notice, ProviderError, ProviderStatus, Report, Subject};
use crate::config::{Operation, PawapaySettings};
use std::time::Instant;

mod active_conf;
use p256::ecdsa::VerifyingKey;
use p256::pkcs8::DecodePublicKey;

/// (fournisseur, country, pawaPay provider code) for the countries pawaPay serves among Caisse's.
pub const PROVIDER_CODES: &[(&str, &str, &str)] = &[
    ("mtn_momo", "BJ", "MTN_MOMO_BEN"),
    ("moov_money", "BJ", "MOOV_BEN"),
    ("moov_money", "BF", "MOOV_BFA"),
    ("orange_money", "BF", "ORANGE_BFA"),
    ("mtn_momo", "CM", "MTN_MOMO_CMR"),
    ("orange_money", "CM", "ORANGE_CMR"),
    ("mtn_momo", "CI", "MTN_MOMO_CIV"),
    ("orange_money", "CI", "ORANGE_CIV"),
    ("orange_money", "SN", "ORANGE_SEN"),
    ("free_money", "SN", "FREE_SEN"),
    // Wave needs the customer's browser: the deposit's `authorizationUrl` is its `url_paiement`.
    ("wave", "CI", "WAVE_CIV"),
    ("wave", "SN", "WAVE_SEN"),
];

/// Status queries made for a Wave deposit's `authorizationUrl` right after it is accepted, and the first pause
/// between them, doubled each time up to [`AUTH_URL_PAUSE_MAX`]: about four seconds in all, inside the
/// initiation's ten-second budget. A payment without its page cannot be paid: the customer has nowhere to go.
const AUTH_URL_TRIES: u32 = 6;
const AUTH_URL_PAUSE: std::time::Duration = std::time::Duration::from_millis(200);
const AUTH_URL_PAUSE_MAX: std::time::Duration = std::time::Duration::from_millis(1_600);
/// The longest the queries for the page take together, whoever waits (a request's budget, or a resubmission).
const AUTH_URL_WAIT: std::time::Duration = std::time::Duration::from_secs(6);

/// What the customer reads on the prompt (pawaPay takes 4 to 22 characters).
const DEPOSIT_MESSAGE: &str = "Paiement Caisse";
const PAYOUT_MESSAGE: &str = "Retrait Caisse";
/// The metadata key that carries our transaction id on a refund, which has no `clientReferenceId`.
const REFUND_METADATA_KEY: &str = "caisseTransactionId";

pub struct Pawapay {
    settings: PawapaySettings,
    /// `{public_url}/retour/`: where Wave sends the customer back after a deposit through pawaPay.
    return_base: String,
    /// pawaPay's limits per provider code and operation, refreshed in the background.
    conf: std::sync::Arc<std::sync::Mutex<active_conf::ActiveConf>>,
    outbound: std::sync::Arc<Outbound>,
    /// pawaPay's callback signing keys by id, from `GET /v2/public-key/http`, fetched when a callback names one
    /// not seen yet (a key rotation included).
    keys: std::sync::Arc<std::sync::RwLock<std::collections::HashMap<String, VerifyingKey>>>,
    /// When the keys were last fetched: a callback naming an unknown key fetches them again only
    /// [`KEYS_FETCHED_AT_MOST_EVERY`] after, so forged callbacks cannot turn into calls to pawaPay.
    keys_fetched: std::sync::Arc<std::sync::Mutex<Option<std::time::Instant>>>,
}

/// Keys one answer of `/v2/public-key/http` may hold; more is not an answer of pawaPay's.
const MAX_KEYS: usize = 16;

/// How often a callback naming an unknown key may fetch pawaPay's keys again (a key rotation is rare).
const KEYS_FETCHED_AT_MOST_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

impl Pawapay {
    pub fn new(settings: PawapaySettings, public_url: &str) -> Pawapay {
        Pawapay {
            settings,
            return_base: format!("{}/retour/", public_url.trim_end_matches('/')),
            conf: Default::default(),
            outbound: std::sync::Arc::new(Outbound::new("pawapay")),
            keys: Default::default(),
            keys_fetched: Default::default(),
        }
    }

    /// Whether the keys may be fetched now, noting the fetch when they may.
    fn may_fetch_keys(&self) -> bool {
        let Ok(mut last) = self.keys_fetched.lock() else { return false };
        let now = std::time::Instant::now();
        if last.is_some_and(|at| now.saturating_duration_since(at) < KEYS_FETCHED_AT_MOST_EVERY) {
            return false;
        }
        *last = Some(now);
        true
    }

    fn call(&self, method: Method, path: &str, body: Option<Value>, idempotent: bool) -> Call<'static> {
        Call {
            method,
            url: format!("{}{path}", self.settings.base_url),
            headers: vec![("Authorization", format!("Bearer {}", self.settings.api_token.expose()))],
            body,
            idempotent,
        }
    }

    /// Sends a creation (deposit, payout, refund) and reads pawaPay's answer to it.
    fn create(&self, path: &'static str, body: Value) -> LocalFuture<Result<(), ProviderError>> {
        let outbound = self.outbound.clone();
        let call = self.call(Method::POST, path, Some(body), true);
        Box::pin(async move { read_creation(&outbound.send(call).await?) })
    }
}

/// The pawaPay provider code of a fournisseur for a phone, `None` where pawaPay does not carry it.
pub fn provider_code(fournisseur: &str, phone: &Phone) -> Option<&'static str> {
    let country = phone.country()?;
    PROVIDER_CODES.iter().find(|(f, c, _)| *f == fournisseur && *c == country).map(|(_, _, code)| *code)
}

/// An amount as pawaPay writes it: a decimal string in the currency's major unit (`"1000"` for XOF).
pub fn amount_text(amount: Amount, currency: Currency) -> String {
    let decimals = u32::from(currency.info().decimals);
    let minor = amount.minor();
    if decimals == 0 {
        return minor.to_string();
    }
    let scale = 10i64.pow(decimals);
    format!("{}.{:0width$}", minor / scale, minor % scale, width = decimals as usize)
}

fn id_of(transaction_id: &str) -> Result<String, ProviderError> {
    uuid_of(transaction_id).ok_or_else(|| ProviderError::Malformed(format!("`{transaction_id}` is not one of our ids")))
}

/// A failure code as Caisse reports it: pawaPay's, in lower snake case (`PAYER_NOT_FOUND` → `payer_not_found`).
fn failure_code(object: &Value) -> String {
    let code = object["failureReason"]["failureCode"].as_str().or_else(|| object["failureCode"].as_str());
    code.filter(|c| !c.is_empty() && c.len() <= 64 && c.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
        .map_or_else(|| "unspecified_failure".to_owned(), str::to_ascii_lowercase)
}

fn read_creation(answer: &Answer) -> Result<(), ProviderError> {
    match answer.status {
        StatusCode::OK | StatusCode::CREATED | StatusCode::ACCEPTED => {
            let body = answer.json()?;
            match body["status"].as_str() {
                Some("ACCEPTED") | Some("DUPLICATE_IGNORED") | Some("ENQUEUED") => Ok(()),
                Some("REJECTED") => Err(ProviderError::Rejected { code: failure_code(&body) }),
                other => Err(ProviderError::Unreachable(format!("unexpected creation status {other:?}"))),
            }
        }
        // Our credentials: no transaction's fault, and nothing was created; the operator must act.
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
            tracing::error!(status = %answer.status, "pawaPay refused our credentials: check adapters.pawapay.api_token");
            Err(ProviderError::Unreachable(format!("pawaPay answered {}", answer.status)))
        }
        // Too many requests, or ours too slow to arrive: nothing says the transaction was refused.
        StatusCode::TOO_MANY_REQUESTS | StatusCode::REQUEST_TIMEOUT => {
            Err(ProviderError::Unreachable(format!("pawaPay answered {}", answer.status)))
        }
        status if status.is_client_error() => {
            let body = answer.json().unwrap_or(Value::Null);
            let code = body["failureReason"]["failureCode"].as_str().or_else(|| body["errorCode"].as_str());
            Err(ProviderError::Rejected {
                code: code.map_or_else(|| "invalid_request".to_owned(), str::to_ascii_lowercase),
            })
        }
        status => Err(ProviderError::Unreachable(format!("pawaPay answered {status}"))),
    }
}

/// What a transaction object's `status` says, with its failure code.
fn status_of(object: &Value) -> ProviderStatus {
    match object["status"].as_str() {
        Some("COMPLETED") => ProviderStatus::Succeeded,
        Some("FAILED") => ProviderStatus::Failed { code: failure_code(object) },
        // ACCEPTED, SUBMITTED, PROCESSING, ENQUEUED, IN_RECONCILIATION, and anything new: not final.
        _ => ProviderStatus::Processing,
    }
}

fn read_status(answer: &Answer) -> Result<Report, ProviderError> {
    if answer.status != StatusCode::OK {
        return Err(ProviderError::Unreachable(format!("status query answered {}", answer.status)));
    }
    let body = answer.json()?;
    match body["status"].as_str() {
        Some("FOUND") => {
            let data = &body["data"];
            let page = data["authorizationUrl"].as_str().and_then(|url| ReturnUrl::parse(url, false).ok());
            let report = Report::with_reference(status_of(data), data["providerTransactionId"].as_str());
            Ok(Report { page, ..report.stating(&data["amount"], &data["currency"]) })
        }
        // Never created: nothing happened at pawaPay, and the same id may be sent again.
        Some("NOT_FOUND") => Ok(ProviderStatus::Pending.into()),
        other => Err(ProviderError::Unreachable(format!("unexpected status answer {other:?}"))),
    }
}

fn path_of(subject: Subject) -> &'static str {
    match subject {
        Subject::Payment => "/v2/deposits",
        Subject::Payout => "/v2/payouts",
        Subject::Refund => "/v2/refunds",
    }
}

/// Our transaction id in a refund's metadata, which pawaPay writes as a list of objects or as one object.
fn refund_reference(object: &Value) -> Option<&str> {
    let metadata = &object["metadata"];
    match metadata {
        Value::Array(items) => items.iter().find_map(|item| item[REFUND_METADATA_KEY].as_str()),
        Value::Object(_) => metadata[REFUND_METADATA_KEY].as_str(),
        _ => None,
    }
}

/// Reads `/v2/public-key/http`: `[{"id", "key": PEM}]`.
fn read_keys(answer: &Answer) -> Result<Vec<(String, VerifyingKey)>, ProviderError> {
    if answer.status != StatusCode::OK {
        return Err(ProviderError::Unreachable(format!("public keys answered {}", answer.status)));
    }
    let list = answer.json()?;
    let items = list.as_array().ok_or_else(|| ProviderError::Unreachable("public keys: not a list".into()))?;
    Ok(items
        .iter()
        .take(MAX_KEYS)
        .filter_map(|item| {
            let id = item["id"].as_str()?.to_owned();
            let key = VerifyingKey::from_public_key_pem(item["key"].as_str()?).ok()?;
            Some((id, key))
        })
        .collect())
}

impl Adapter for Pawapay {
    fn degraded(&self) -> bool {
        self.outbound.degraded()
    }

    /// Unsigned callbacks are accepted (nothing moves before the status query) unless the settings require
    /// signatures; a signed one must verify against pawaPay's key of that id, fetched when not known yet.
    fn authenticate(&self, callback: Callback) -> LocalFuture<Result<(), ProviderError>> {
        let header = |name: &str| callback.headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let Some(input) = header("signature-input") else {
            let unsigned = match self.settings.require_signatures {
                true => Err(ProviderError::Unauthenticated(
                    "an unsigned callback, and adapters.pawapay.require_signatures is set".into(),
                )),
                false => Ok(()),
            };
            return Box::pin(std::future::ready(unsigned));
        };
        let input = match rfc9421::parse_input(&input) {
            Ok(input) => input,
            Err(why) => return Box::pin(std::future::ready(Err(ProviderError::Unauthenticated(why)))),
        };
        let keyid = input.keyid.clone().unwrap_or_default();
        let known = self.keys.read().ok().and_then(|keys| keys.get(&keyid).copied());
        let fetch = (known.is_none() && self.may_fetch_keys())
            .then(|| self.call(Method::GET, "/v2/public-key/http", None, true));
        let (keys, outbound) = (self.keys.clone(), self.outbound.clone());
        Box::pin(async move {
            let key = match (known, fetch) {
                (Some(key), _) => key,
                (None, Some(fetch)) => {
                    let fetched = read_keys(&outbound.send(fetch).await?)?;
                    // pawaPay's list as it is now: a key it no longer publishes (rotated out, revoked) is no
                    // longer trusted. An empty answer changes nothing.
                    if let (false, Ok(mut cache)) = (fetched.is_empty(), keys.write()) {
                        *cache = fetched.iter().cloned().collect();
                    }
                    fetched
                        .into_iter()
                        .find(|(id, _)| *id == keyid)
                        .map(|(_, key)| key)
                        .ok_or_else(|| ProviderError::Unauthenticated(format!("no pawaPay key {keyid:?}")))?
                }
                (None, None) => {
                    return Err(ProviderError::Unauthenticated(format!(
                    "no pawaPay key {keyid:?}, and the keys were fetched less than {KEYS_FETCHED_AT_MOST_EVERY:?} ago"
                )))
                }
            };
            let header = |name: &str| callback.headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
            let authority = header("host").unwrap_or_default();
            let request = rfc9421::Received {
                method: &callback.method,
                authority: &authority,
                path: &callback.path,
                header: &header,
                body: &callback.body,
            };
            rfc9421::verify(&request, &input, &key).map_err(ProviderError::Unauthenticated)
        })
    }

    fn serves(&self, fournisseur: &str, phone: &Phone) -> bool {
        provider_code(fournisseur, phone).is_some()
    }

    fn check_amount(
        &self,
        fournisseur: &str,
        phone: &Phone,
        operation: Operation,
        currency: Currency,
        amount: Amount,
    ) -> Result<(), String> {
        let Some(code) = provider_code(fournisseur, phone) else { return Ok(()) };
        match self.conf.lock() {
            Ok(conf) => conf.check(code, currency, operation, amount),
            // A poisoned lock only loses the pre-check: pawaPay's own answer still decides.
            Err(_) => Ok(()),
        }
    }

    /// Fetches `active-conf` when the last answer is older than [`active_conf::REFRESH_EVERY`].
    fn refresh(&self) -> LocalFuture<()> {
        let due = self.conf.lock().map(|mut conf| conf.start_refresh(Instant::now())).unwrap_or(false);
        if !due {
            return Box::pin(std::future::ready(()));
        }
        let (conf, outbound) = (self.conf.clone(), self.outbound.clone());
        let call = self.call(Method::GET, "/v2/active-conf", None, true);
        Box::pin(async move {
            let answer = match outbound.send(call).await {
                Ok(answer) if answer.status == StatusCode::OK => {
                    answer.json().ok().and_then(|b| active_conf::parse(&b))
                }
                Ok(answer) => {
                    tracing::warn!(status = %answer.status, "pawaPay active-conf answered with an error");
                    None
                }
                Err(e) => {
                    tracing::warn!(error = %e, "pawaPay active-conf could not be read");
                    None
                }
            };
            if let Ok(mut conf) = conf.lock() {
                conf.finish_refresh(Instant::now(), answer);
            }
        })
    }

    fn request_to_pay(&self, payment: &Payment) -> LocalFuture<Result<Option<ReturnUrl>, ProviderError>> {
        let Some(code) = provider_code(payment.provider.as_str(), &payment.customer_phone) else {
            return Box::pin(std::future::ready(Err(ProviderError::Rejected { code: "unsupported_provider".into() })));
        };
        let id = match id_of(&payment.transaction_id) {
            Ok(id) => id,
            Err(e) => return Box::pin(std::future::ready(Err(e))),
        };
        let mut body = json!({
            "depositId": id,
            "amount": amount_text(payment.amount, payment.currency),
            "currency": payment.currency.code(),
            "payer": {"type": "MMO", "accountDetails": {"phoneNumber": payment.customer_phone.digits(), "provider": code}},
            "clientReferenceId": payment.transaction_id,
            "customerMessage": DEPOSIT_MESSAGE,
        });
        let redirect = code.starts_with("WAVE_");
        if redirect {
            let back = format!("{}{}", self.return_base, payment.transaction_id);
            body["successfulUrl"] = json!(back);
            body["failedUrl"] = json!(back);
        }
        let created = self.create("/v2/deposits", body);
        let outbound = self.outbound.clone();
        let ask = self.call(Method::GET, &format!("/v2/deposits/{id}"), None, true);
        Box::pin(async move {
            created.await?;
            if !redirect {
                return Ok(None);
            }
            // The authorisation URL comes with the status, a moment after the deposit is accepted; without it
            // the payment waits all the same, and a later status query that carries it keeps it.
            let look = async {
                let mut pause = AUTH_URL_PAUSE;
                for attempt in 0..AUTH_URL_TRIES {
                    if attempt > 0 {
                        actix_web::rt::time::sleep(pause).await;
                        pause = (pause * 2).min(AUTH_URL_PAUSE_MAX);
                    }
                    // The deposit is made: a query that fails is only asked again.
                    match outbound.send(ask.clone()).await.and_then(|answer| read_status(&answer)) {
                        Ok(report) if report.page.is_some() => return report.page,
                        Ok(_) => {}
                        Err(e) => tracing::debug!(error = %e, "a Wave deposit's status, for its page, not read"),
                    }
                }
                None
            };
            let page = actix_web::rt::time::timeout(AUTH_URL_WAIT, look).await.ok().flatten();
            if page.is_none() {
                tracing::warn!(
                    "pawaPay gave no authorizationUrl for a Wave deposit in time: the payment waits without its page"
                );
            }
            Ok(page)
        })
    }

    fn status(
        &self,
        subject: Subject,
        transaction_id: &str,
        _payment: Option<&Payment>,
    ) -> LocalFuture<Result<Report, ProviderError>> {
        let id = match id_of(transaction_id) {
            Ok(id) => id,
            Err(e) => return Box::pin(std::future::ready(Err(e))),
        };
        let outbound = self.outbound.clone();
        let call = self.call(Method::GET, &format!("{}/{id}", path_of(subject)), None, true);
        Box::pin(async move { read_status(&outbound.send(call).await?) })
    }

    fn refund(&self, payment: &Payment, refund: &Refund) -> LocalFuture<Result<(), ProviderError>> {
        let refund_tx = refund.transaction_id();
        let ids = id_of(&refund_tx).and_then(|r| Ok((r, id_of(&payment.transaction_id)?)));
        let (refund_id, deposit_id) = match ids {
            Ok(ids) => ids,
            Err(e) => return Box::pin(std::future::ready(Err(e))),
        };
        let body = json!({
            "refundId": refund_id,
            "depositId": deposit_id,
            "amount": amount_text(refund.amount, payment.currency),
            "currency": payment.currency.code(),
            "metadata": [{REFUND_METADATA_KEY: refund_tx}],
        });
        self.create("/v2/refunds", body)
    }

    fn payout(&self, payout: &Payout) -> LocalFuture<Result<(), ProviderError>> {
        let Some(code) = provider_code(payout.provider.as_str(), &payout.beneficiary_phone) else {
            return Box::pin(std::future::ready(Err(ProviderError::Rejected { code: "unsupported_provider".into() })));
        };
        let id = match id_of(&payout.transaction_id) {
            Ok(id) => id,
            Err(e) => return Box::pin(std::future::ready(Err(e))),
        };
        let body = json!({
            "payoutId": id,
            // The beneficiary receives the amount net of Caisse's fee, which stays on the merchant's balance.
            "amount": amount_text(payout.net_amount, payout.currency),
            "currency": payout.currency.code(),
            "recipient": {"type": "MMO", "accountDetails": {"phoneNumber": payout.beneficiary_phone.digits(), "provider": code}},
            "clientReferenceId": payout.transaction_id,
            "customerMessage": PAYOUT_MESSAGE,
        });
        self.create("/v2/payouts", body)
    }

    /// A callback: the final transaction object (its signature, when it has one, was checked by
    /// `authenticate`). The check here is that the transaction it names is ours and that its pawaPay id is the
    /// one our id maps to; nothing is applied before pawaPay's own status answer confirms it.
    fn parse_notice(
        &self,
        _headers: &HeaderMap,
        _path_token: Option<&str>,
        body: &[u8],
    ) -> Result<Notice, ProviderError> {
        let object: Value = serde_json::from_slice(body).map_err(|e| ProviderError::Malformed(e.to_string()))?;
        // A refund's object also names the deposit it refunds (`depositId`): its own id is read first.
        let (subject, their_id, ours) = if let Some(id) = object["refundId"].as_str() {
            (Subject::Refund, id, refund_reference(&object))
        } else if let Some(id) = object["payoutId"].as_str() {
            (Subject::Payout, id, object["clientReferenceId"].as_str())
        } else if let Some(id) = object["depositId"].as_str() {
            (Subject::Payment, id, object["clientReferenceId"].as_str())
        } else {
            return Err(ProviderError::Malformed("no depositId, payoutId or refundId".into()));
        };
        let Some(ours) = ours.filter(|t| t.len() <= 64) else {
            return Err(ProviderError::NotOurs(their_id.chars().take(64).collect()));
        };
        if uuid_of(ours).as_deref() != Some(their_id) {
            return Err(ProviderError::Unauthenticated(format!(
                "{ours} is not pawaPay's {}",
                their_id.chars().take(64).collect::<String>()
            )));
        }
        Ok(Notice { subject, transaction_id: ours.to_owned(), status: status_of(&object) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_are_major_unit_strings() {
        let amount = |minor| Amount::new(minor).unwrap();
        assert_eq!(amount_text(amount(1000), Currency::XOF), "1000");
        assert_eq!(amount_text(amount(1234), Currency::EUR), "12.34");
        assert_eq!(amount_text(amount(5), Currency::EUR), "0.05");
    }

    #[test]
    fn provider_codes_follow_the_phone_country() {
        let phone = |n: &str| Phone::parse(n).unwrap();
        assert_eq!(provider_code("mtn_momo", &phone("+22951345789")), Some("MTN_MOMO_BEN"));
        assert_eq!(provider_code("mtn_momo", &phone("+2250503456789")), Some("MTN_MOMO_CIV"));
        assert_eq!(provider_code("orange_money", &phone("+221773456789")), Some("ORANGE_SEN"));
        assert_eq!(provider_code("mtn_momo", &phone("+22890000000")), None, "Togo is not carried");
        assert_eq!(provider_code("wave", &phone("+221773456789")), Some("WAVE_SEN"), "through its authorisation URL");
        assert_eq!(provider_code("wave", &phone("+22951345789")), None, "no Wave in Benin");
    }

    #[test]
    fn statuses_and_failure_codes() {
        assert_eq!(status_of(&json!({"status": "COMPLETED"})), ProviderStatus::Succeeded);
        assert_eq!(status_of(&json!({"status": "IN_RECONCILIATION"})), ProviderStatus::Processing);
        let failed = json!({"status": "FAILED", "failureReason": {"failureCode": "PAYER_NOT_FOUND"}});
        assert_eq!(status_of(&failed), ProviderStatus::Failed { code: "payer_not_found".into() });
        let odd = json!({"status": "FAILED", "failureReason": {"failureCode": "<script>"}});
        assert_eq!(status_of(&odd), ProviderStatus::Failed { code: "unspecified_failure".into() });
        let answer = |status: u16, body: Value| Answer {
            status: StatusCode::from_u16(status).unwrap(),
            body: serde_json::to_vec(&body).unwrap(),
        };
        assert_eq!(read_status(&answer(200, json!({"status": "NOT_FOUND"}))).unwrap().status, ProviderStatus::Pending);
        let found = json!({"status": "FOUND", "data": {"status": "COMPLETED", "providerTransactionId": "MP1.2"}});
        let report = read_status(&answer(200, found)).unwrap();
        assert_eq!((report.status, report.reference.unwrap().as_str()), (ProviderStatus::Succeeded, "MP1.2"));
        let hostile = json!({"status": "FOUND", "data": {"status": "COMPLETED", "providerTransactionId": "a b\n"}});
        assert_eq!(read_status(&answer(200, hostile)).unwrap().reference, None, "a malformed reference is dropped");
        assert!(read_status(&answer(500, json!({}))).is_err(), "a 500 decides nothing");
        assert!(read_creation(&answer(200, json!({"status": "DUPLICATE_IGNORED"}))).is_ok());
        let rejected =
            answer(200, json!({"status": "REJECTED", "failureReason": {"failureCode": "INVALID_PHONE_NUMBER"}}));
        assert!(
            matches!(read_creation(&rejected), Err(ProviderError::Rejected { code }) if code == "invalid_phone_number")
        );
        assert!(matches!(read_creation(&answer(500, json!({}))), Err(ProviderError::Unreachable(_))));
        let busy = answer(429, json!({"errorCode": "TOO_MANY_REQUESTS"}));
        assert!(matches!(read_creation(&busy), Err(ProviderError::Unreachable(_))), "a 429 refuses nothing");
    }

    #[test]
    fn a_callback_is_matched_to_our_transaction_or_refused() {
        let settings = PawapaySettings {
            base_url: "http://127.0.0.1:1".into(),
            api_token: crate::config::Secret::new("t".into()),
            require_signatures: false,
        };
        let adapter = Pawapay::new(settings, "https://pay.example.com");
        let tx = caisse_engine::domain::ids::new_id(caisse_engine::domain::ids::IdKind::Transaction);
        let uuid = uuid_of(&tx).unwrap();
        let headers = HeaderMap::new();
        let body = json!({"depositId": uuid, "clientReferenceId": tx, "status": "COMPLETED"}).to_string();
        let notice = adapter.parse_notice(&headers, None, body.as_bytes()).unwrap();
        assert_eq!((notice.subject, notice.transaction_id.as_str()), (Subject::Payment, tx.as_str()));
        let refund = json!({"refundId": uuid, "metadata": [{REFUND_METADATA_KEY: tx}], "status": "FAILED"}).to_string();
        assert_eq!(adapter.parse_notice(&headers, None, refund.as_bytes()).unwrap().subject, Subject::Refund);
        // A refund's object names the deposit it refunds too; it is still about the refund.
        let deposit = caisse_engine::domain::ids::new_id(caisse_engine::domain::ids::IdKind::Transaction);
        let refund = json!({"refundId": uuid, "depositId": uuid_of(&deposit), "metadata": [{REFUND_METADATA_KEY: tx}],
            "status": "COMPLETED"})
        .to_string();
        let notice = adapter.parse_notice(&headers, None, refund.as_bytes()).unwrap();
        assert_eq!((notice.subject, notice.transaction_id.as_str()), (Subject::Refund, tx.as_str()));
        let other = caisse_engine::domain::ids::new_id(caisse_engine::domain::ids::IdKind::Transaction);
        let forged = json!({"depositId": uuid, "clientReferenceId": other, "status": "COMPLETED"}).to_string();
        assert!(matches!(
            adapter.parse_notice(&headers, None, forged.as_bytes()),
            Err(ProviderError::Unauthenticated(_))
        ));
        let foreign = json!({"depositId": uuid, "status": "COMPLETED"}).to_string();
        assert!(matches!(adapter.parse_notice(&headers, None, foreign.as_bytes()), Err(ProviderError::NotOurs(_))));
    }
}
