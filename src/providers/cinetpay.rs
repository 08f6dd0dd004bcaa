//! The CinetPay adapter: Checkout v2 for collection (cards and mobile money, the customer approves on
//! CinetPay's page, `url_paiement`), `/v2/payment/check` for status, signed notifications, and the Transfer API
//! for payouts (docs.cinetpay.com).
//!
//! Protocol only; what a status means is decided in `flow`. The rules that keep money safe:
//! - Our transaction id is CinetPay's `transaction_id` (unique per site) and the Transfer API's
//!   `client_transaction_id`: a retry or a restart reuses it, and CinetPay answers a payout sent twice with
//!   `805` (already sent under that id), which is "sent", not an error.
//! - A notification is authenticated by its `x-token` (HMAC-SHA256 under the site's secret key over the sixteen
//!   `cpm_*` fields in CinetPay's order), and only a hint: `/v2/payment/check` decides. CinetPay's GET ping of the
//!   notification URL is answered 200 by the HTTP layer. Transfer notifications are unsigned: their URL carries a
//!   per-transaction token only this server can make, and they too are only hints.
//! - Amounts are integers in the currency's unit, in multiples of 5 for the checkout (checked before anything is
//!   created). A card payment needs the customer's name and e-mail, which the API asks for (`carte`).
//! - The Transfer API's token lives five minutes; it is cached four and fetched again after an expired-token
//!   answer. A beneficiary is added as a contact before it is paid (already a contact is fine).
//! - CinetPay has no refund API (refunds go through its back office): a refund goes to the payer's phone through
//!   the Transfer API under the refund's transaction id, and is queried as a transfer; without the Transfer API
//!   configured, refunds are refused before they are accepted.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::http::header::HeaderMap;
use awc::http::Method;
use caisse_engine::domain::money::{Amount, Currency};
use caisse_engine::domain::phone::{calling_code, Phone};
use caisse_engine::domain::provider::ReturnUrl;
use caisse_engine::domain::records::{Payment, Payout, Refund};
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;

use super::http::{Call, Outbound};
use super::{Adapter, LocalFuture, Notice, ProviderError, ProviderStatus, Report, Subject};
use crate::config::{CinetpaySettings, Operation};

/// The fields a checkout notification's `x-token` covers, in the order CinetPay concatenates them.
pub const NOTIFICATION_FIELDS: [&str; 16] = [
    "cpm_site_id",
    "cpm_trans_id",
    "cpm_trans_date",
    "cpm_amount",
    "cpm_currency",
    "signature",
    "payment_method",
    "cel_phone_num",
    "cpm_phone_prefixe",
    "cpm_language",
    "cpm_version",
    "cpm_payment_config",
    "cpm_page_action",
    "cpm_custom",
    "cpm_designation",
    "cpm_error_message",
];
/// The Transfer API's token lives five minutes; it is used for four.
const TRANSFER_TOKEN_LIFE: Duration = Duration::from_secs(4 * 60);
/// What the customer reads on CinetPay's page (CinetPay refuses `# $ _ &` in it).
const DESCRIPTION: &str = "Paiement Caisse";

pub struct Cinetpay {
    settings: CinetpaySettings,
    /// `{public_url}/v1/notifications/cinetpay`, and `{public_url}/retour/`.
    notify_url: String,
    return_base: String,
    /// Key of the per-transaction tokens in transfer notification URLs.
    transfer_key: Vec<u8>,
    token: Arc<Mutex<Option<(String, Instant)>>>,
    outbound: Arc<Outbound>,
}

impl Cinetpay {
    pub fn new(settings: CinetpaySettings, public_url: &str) -> Cinetpay {
        let public_url = public_url.trim_end_matches('/');
        let transfer_key =
            super::callback_token_key("caisse cinetpay transfer notification token", settings.secret_key.expose());
        Cinetpay {
            notify_url: format!("{public_url}/v1/notifications/cinetpay"),
            return_base: format!("{public_url}/retour/"),
            settings,
            transfer_key,
            token: Arc::default(),
            outbound: Arc::new(Outbound::new("cinetpay")),
        }
    }

    fn transfer_token(&self, transaction_id: &str) -> String {
        super::callback_token(&self.transfer_key, transaction_id)
    }

    fn checkout(&self, path: &str, body: Value, idempotent: bool) -> Call<'static> {
        Call {
            method: Method::POST,
            url: format!("{}{path}", self.settings.base_url),
            headers: Vec::new(),
            body: Some(body),
            idempotent,
        }
    }

    /// Calls the Transfer API with a valid token, fetching one first if needed and once more after CinetPay
    /// says it expired. `form` is sent as `application/x-www-form-urlencoded`, as the Transfer API wants.
    fn transfer(
        &self,
        method: Method,
        path: &str,
        query: Vec<(&'static str, String)>,
        form: Option<Vec<(&'static str, String)>>,
    ) -> LocalFuture<Result<Value, ProviderError>> {
        let Some((login, password)) = self.settings.transfer.clone() else {
            return Box::pin(std::future::ready(Err(ProviderError::Rejected {
                code: "transfer_not_configured".into(),
            })));
        };
        let (base, path) = (self.settings.transfer_base_url.clone(), path.to_owned());
        let (tokens, outbound) = (self.token.clone(), self.outbound.clone());
        Box::pin(async move {
            for attempt in 0..2 {
                let token = transfer_login(&outbound, &tokens, &base, &login, password.expose()).await?;
                let mut pairs = vec![("token", token)];
                pairs.extend(query.iter().cloned());
                let url = format!("{base}{path}?{}", serde_urlencoded::to_string(&pairs).unwrap_or_default());
                let answer = outbound.send_form(method.clone(), url, Vec::new(), form.clone()).await?;
                let body = answer.json()?;
                if matches!(code(&body).as_str(), "705" | "706") && attempt == 0 {
                    tokens.lock().map(|mut t| t.take()).ok();
                    continue;
                }
                return Ok(body);
            }
            Err(ProviderError::Unreachable("CinetPay refused a fresh transfer token".into()))
        })
    }
}

/// A Transfer API token: the cached one while valid, else a new one.
async fn transfer_login(
    outbound: &Outbound,
    tokens: &Mutex<Option<(String, Instant)>>,
    base: &str,
    login: &str,
    password: &str,
) -> Result<String, ProviderError> {
    if let Some((token, until)) = tokens.lock().ok().and_then(|t| t.clone()) {
        if Instant::now() < until {
            return Ok(token);
        }
    }
    let form = vec![("apikey", login.to_owned()), ("password", password.to_owned())];
    let answer = outbound.send_form(Method::POST, format!("{base}/v1/auth/login"), Vec::new(), Some(form)).await?;
    let body = answer.json()?;
    let token = body["data"]["token"]
        .as_str()
        .filter(|t| code(&body) == "0" && !t.is_empty() && t.len() < 4096)
        .ok_or_else(|| {
            tracing::error!(code = %code(&body), "CinetPay refused our transfer login: check adapters.cinetpay.transfer_login");
            ProviderError::Unreachable(format!("CinetPay transfer login answered code {}", code(&body)))
        })?;
    if let Ok(mut cache) = tokens.lock() {
        *cache = Some((token.to_owned(), Instant::now() + TRANSFER_TOKEN_LIFE));
    }
    Ok(token.to_owned())
}

/// CinetPay's `code`, a string or a number depending on the API.
fn code(body: &Value) -> String {
    match &body["code"] {
        Value::String(s) => s.chars().take(16).collect(),
        Value::Number(n) => n.to_string(),
        _ => String::new(),
    }
}

/// A checkout or transfer code as a failure code Caisse shows.
fn failure(code: &str) -> String {
    match code {
        "600" => "payment_failed",
        "602" => "insufficient_balance",
        "604" => "otp_code_error",
        "606" => "incorrect_settings",
        "608" => "minimum_required_fields",
        "612" => "currency_not_valid",
        "627" => "transaction_cancel",
        "628" => "amount_format",
        "641" => "amount_too_low",
        "642" => "amount_too_high",
        "719" => "amount_too_small",
        "720" => "amount_too_large",
        "721" | "804" => "operator_unavailable",
        "801" => "invalid_amount",
        "802" => "invalid_phone",
        _ => "payment_failed",
    }
    .to_owned()
}

/// What `/v2/payment/check` says, as Caisse reads it. CinetPay out of service, or refusing our credentials, says
/// nothing of the payment: that is no answer, not a payment never made.
fn check_status(body: &Value) -> Result<Report, ProviderError> {
    let status = match code(body).as_str() {
        "603" | "609" | "613" => {
            return Err(ProviderError::Unreachable(format!("CinetPay's check answered code {}", code(body))))
        }
        "00" => match body["data"]["status"].as_str() {
            Some("ACCEPTED") => ProviderStatus::Succeeded,
            Some("REFUSED") | Some("CANCELED") | Some("CANCELLED") => {
                ProviderStatus::Failed { code: failure(body["data"]["code"].as_str().unwrap_or("600")) }
            }
            _ => ProviderStatus::Processing,
        },
        // Waiting for the customer, at CinetPay or at the operator.
        "623" | "662" | "663" | "664" => ProviderStatus::Processing,
        "600" | "602" | "604" | "606" | "627" => ProviderStatus::Failed { code: failure(&code(body)) },
        "625" => ProviderStatus::Expired,
        // Never initialised under this id (or not visible yet): nothing to decide on.
        _ => ProviderStatus::Pending,
    };
    let reference = body["data"]["operator_id"].as_str();
    Ok(Report::with_reference(status, reference).stating(&body["data"]["amount"], &body["data"]["currency"]))
}

/// The state of our transfer `ours` (its `client_transaction_id`), as Caisse reads it. An item of another
/// transfer is never read as ours; one that names none is taken as the answer to our query.
fn transfer_status(body: &Value, ours: &str) -> Report {
    let item = body["data"]
        .as_array()
        .and_then(|items| items.iter().find(|i| i["client_transaction_id"].as_str().is_none_or(|id| id == ours)))
        .cloned()
        .unwrap_or(Value::Null);
    let status = match (code(body).as_str(), item["treatment_status"].as_str()) {
        ("0", Some("VAL")) => ProviderStatus::Succeeded,
        ("0", Some("REJ")) => ProviderStatus::Failed { code: "rejected".into() },
        // `NEW`, `REC` and `NOS` are transitions in CinetPay's table of transfer states: `NOS` waits for a
        // confirmation or a rejection, so a payout read as failed on it could still be paid out.
        ("0", Some(_)) => ProviderStatus::Processing,
        ("723", _) | ("0", None) => ProviderStatus::Pending,
        (other, _) if !other.is_empty() => ProviderStatus::Processing,
        _ => ProviderStatus::Pending,
    };
    // The amount sent, in the currency of the payout (the Transfer API names none).
    Report::with_reference(status, item["transaction_id"].as_str()).stating(&item["amount"], &Value::Null)
}

/// Checks the `x-token` of a checkout notification.
fn token_valid(form: &[(String, String)], secret: &[u8], given: &str) -> bool {
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret) else { return false };
    for name in NOTIFICATION_FIELDS {
        let value = form.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str()).unwrap_or("");
        mac.update(value.as_bytes());
    }
    let expected = hex::encode(mac.finalize().into_bytes());
    !given.is_empty() && bool::from(subtle::ConstantTimeEq::ct_eq(expected.as_bytes(), given.as_bytes()))
}

/// The currency CinetPay's Transfer API pays a number of `country` in. The API names no currency: a transfer
/// is paid in the currency of the beneficiary's country, so the amount must be counted in it.
fn transfer_currency(country: &str) -> Option<Currency> {
    match country {
        "SN" | "ML" | "CI" | "BF" | "NE" | "TG" | "BJ" => Some(Currency::XOF),
        "CM" | "GA" | "CG" => Some(Currency::XAF),
        "GN" => Some(Currency::GNF),
        _ => None,
    }
}

/// Refuses a transfer (a payout, or a refund sent as one) whose currency is not the one CinetPay pays the
/// beneficiary in: 100,000 GNF asked for a Malian number would be paid as 100,000 XOF.
fn transfer_currency_holds(phone: &Phone, currency: Currency) -> Result<(), String> {
    match phone.country().map(|country| (country, transfer_currency(country))) {
        Some((_, Some(paid_in))) if paid_in == currency => Ok(()),
        Some((country, Some(paid_in))) => Err(format!(
            "CinetPay pays {country} numbers in {}, not {}: ask for the amount in {}",
            paid_in.code(),
            currency.code(),
            paid_in.code()
        )),
        Some((country, None)) => {
            Err(format!("CinetPay's Transfer API names no currency, and Caisse knows none for {country} numbers"))
        }
        None => Err("CinetPay's Transfer API names no currency, and Caisse knows none for this number".into()),
    }
}

/// A phone as CinetPay's Transfer API wants it: the calling code and the rest.
fn prefixed(phone: &Phone) -> Result<(String, String), ProviderError> {
    let prefix = phone
        .country()
        .and_then(calling_code)
        .ok_or_else(|| ProviderError::Rejected { code: "invalid_phone".into() })?;
    let rest = phone.digits().strip_prefix(prefix).unwrap_or(phone.digits());
    Ok((prefix.to_owned(), rest.to_owned()))
}

impl Adapter for Cinetpay {
    fn degraded(&self) -> bool {
        self.outbound.degraded()
    }

    fn check_amount(
        &self,
        _fournisseur: &str,
        phone: &Phone,
        operation: Operation,
        currency: Currency,
        amount: Amount,
    ) -> Result<(), String> {
        self.check_amount_for_anyone(operation, currency, amount)?;
        if operation != Operation::Payment {
            transfer_currency_holds(phone, currency)?;
        }
        Ok(())
    }

    fn check_amount_for_anyone(&self, operation: Operation, currency: Currency, amount: Amount) -> Result<(), String> {
        // CinetPay counts in whole units of the currency: one with decimals (EUR, USD in cents here) would be
        // charged a hundred times over.
        if currency.decimals() != 0 {
            return Err(format!("CinetPay takes whole amounts only (XOF, XAF, GNF), not {}", currency.code()));
        }
        if operation == Operation::Payment && amount.minor() % 5 != 0 {
            return Err("CinetPay takes amounts in multiples of 5".into());
        }
        Ok(())
    }

    fn request_to_pay(&self, payment: &Payment) -> LocalFuture<Result<Option<ReturnUrl>, ProviderError>> {
        let tx = &payment.transaction_id;
        let card = payment.provider.as_str() == "carte";
        let (first, last) = match payment.customer_name.as_ref().map(|n| n.as_str().trim()) {
            Some(name) => match name.split_once(' ') {
                Some((first, last)) => (first.to_owned(), last.trim().to_owned()),
                None => (name.to_owned(), name.to_owned()),
            },
            None => ("Client".to_owned(), "Caisse".to_owned()),
        };
        let mut body = json!({
            "apikey": self.settings.apikey.expose(),
            "site_id": self.settings.site_id,
            "transaction_id": tx,
            "amount": payment.amount.minor(),
            "currency": payment.currency.code(),
            "description": DESCRIPTION,
            "notify_url": self.notify_url,
            "return_url": format!("{}{tx}", self.return_base),
            "channels": if card { "CREDIT_CARD" } else { "MOBILE_MONEY" },
            "lang": "fr",
            "metadata": tx,
            "customer_phone_number": payment.customer_phone.as_str(),
            "customer_name": first,
            "customer_surname": last,
            "customer_country": payment.country.clone().unwrap_or_default(),
        });
        // Mobile money is paid from the number given, so a refund sent back to it reaches the payer.
        if !card {
            body["lock_phone_number"] = json!(true);
        }
        if let Some(email) = &payment.customer_email {
            body["customer_email"] = json!(email.as_str());
        }
        if card {
            // Cards want a postal address CinetPay does not check; Caisse does not collect one.
            for (field, value) in [
                ("customer_address", "-"),
                ("customer_city", "-"),
                ("customer_state", "-"),
                ("customer_zip_code", "00000"),
            ] {
                body[field] = json!(value);
            }
        }
        // Not repeated on its own: CinetPay refuses a second initialisation under the same id, and the sweeps'
        // status query decides what became of the first.
        let call = self.checkout("/v2/payment", body, false);
        let outbound = self.outbound.clone();
        Box::pin(async move {
            let answer = outbound.send(call).await?;
            let body = answer.json()?;
            match code(&body).as_str() {
                "201" => {
                    let url = body["data"]["payment_url"]
                        .as_str()
                        .ok_or_else(|| ProviderError::Unreachable("a CinetPay answer without payment_url".into()))?;
                    ReturnUrl::parse(url, false)
                        .map(Some)
                        .map_err(|e| ProviderError::Unreachable(format!("CinetPay's payment URL: {e}")))
                }
                "609" | "613" => {
                    tracing::error!(code = %code(&body), "CinetPay refused our credentials: check adapters.cinetpay");
                    Err(ProviderError::Unreachable(format!("CinetPay answered code {}", code(&body))))
                }
                // Our id was already initialised, or CinetPay is out of service (603) or failed unknowingly:
                // the status query says what became of it.
                "603" | "620" | "624" | "" => {
                    Err(ProviderError::Unreachable(format!("CinetPay answered code {:?}", code(&body))))
                }
                other => Err(ProviderError::Rejected { code: failure(other) }),
            }
        })
    }

    fn status(
        &self,
        subject: Subject,
        transaction_id: &str,
        _payment: Option<&Payment>,
    ) -> LocalFuture<Result<Report, ProviderError>> {
        match subject {
            Subject::Payment => {
                let body = json!({
                    "apikey": self.settings.apikey.expose(),
                    "site_id": self.settings.site_id,
                    "transaction_id": transaction_id,
                });
                let call = self.checkout("/v2/payment/check", body, true);
                let outbound = self.outbound.clone();
                Box::pin(async move { check_status(&outbound.send(call).await?.json()?) })
            }
            // A payout may have left before the Transfer API was taken out of the configuration: nothing is
            // decided until it is back.
            Subject::Payout | Subject::Refund if self.settings.transfer.is_none() => Box::pin(std::future::ready(Err(
                ProviderError::Unreachable("adapters.cinetpay has no transfer login: the transaction waits".into()),
            ))),
            Subject::Payout => {
                let asked = self.transfer(
                    Method::GET,
                    "/v1/transfer/check/money",
                    vec![("client_transaction_id", transaction_id.to_owned())],
                    None,
                );
                let ours = transaction_id.to_owned();
                Box::pin(async move { Ok(transfer_status(&asked.await?, &ours)) })
            }
            // A refund went to the payer as a transfer, under the refund's own transaction id.
            Subject::Refund => self.status(Subject::Payout, transaction_id, None),
        }
    }

    /// Mobile-money wallets through the Transfer API; never a card's money to a phone.
    fn pays_out(&self, fournisseur: &str, _phone: &Phone) -> bool {
        fournisseur != "carte" && self.settings.transfer.is_some()
    }

    fn settles_at_once(&self, subject: Subject) -> bool {
        matches!(subject, Subject::Payout | Subject::Refund)
    }

    /// CinetPay has no refund API: a refund goes to the payer's phone through the Transfer API, when it is
    /// configured.
    /// Only a mobile-money payment in whole units: a card refund sent as mobile money would go to a phone
    /// number nobody checked against the card, and the Transfer API counts in whole units.
    fn can_refund(&self, payment: &Payment, _amount: Amount) -> bool {
        // A refund is a transfer to the payer, paid in the currency of the payer's country.
        self.settings.transfer.is_some()
            && payment.provider.as_str() != "carte"
            && payment.currency.decimals() == 0
            && transfer_currency_holds(&payment.customer_phone, payment.currency).is_ok()
    }

    fn refund(&self, payment: &Payment, refund: &Refund) -> LocalFuture<Result<(), ProviderError>> {
        if self.settings.transfer.is_none() {
            return Box::pin(std::future::ready(Err(ProviderError::Rejected { code: "refund_unsupported".into() })));
        }
        // Checked again here, not only when the refund was accepted: one accepted before the check existed
        // and sent again must not be paid in another currency either.
        if let Err(why) = transfer_currency_holds(&payment.customer_phone, payment.currency) {
            tracing::warn!(reference = %payment.reference, why, "a refund CinetPay would pay in another currency");
            return Box::pin(std::future::ready(Err(ProviderError::Rejected { code: "currency_not_valid".into() })));
        }
        let name = payment.customer_name.as_ref().map_or("Client", |n| n.as_str());
        self.send_transfer(&refund.transaction_id(), &payment.customer_phone, name, refund.amount)
    }

    fn payout(&self, payout: &Payout) -> LocalFuture<Result<(), ProviderError>> {
        let name = payout.beneficiary_name.as_ref().map_or("Beneficiaire", |n| n.as_str());
        self.send_transfer(&payout.transaction_id, &payout.beneficiary_phone, name, payout.net_amount)
    }

    /// A checkout notification (form POST, `x-token`), or a transfer notification at a URL ending in the
    /// transaction's token. Either is a hint only.
    fn parse_notice(
        &self,
        headers: &HeaderMap,
        path_token: Option<&str>,
        body: &[u8],
    ) -> Result<Notice, ProviderError> {
        let form: Vec<(String, String)> =
            serde_urlencoded::from_bytes(body).map_err(|e| ProviderError::Malformed(e.to_string()))?;
        let field = |name: &str| form.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        if let Some(ours) = field("client_transaction_id") {
            let expected = self.transfer_token(ours);
            let given = path_token.unwrap_or_default();
            if expected.is_empty() || !bool::from(subtle::ConstantTimeEq::ct_eq(expected.as_bytes(), given.as_bytes()))
            {
                return Err(ProviderError::Unauthenticated(
                    "the notification URL's token is not this transfer's".into(),
                ));
            }
            return Ok(Notice {
                subject: Subject::Payout,
                transaction_id: ours.to_owned(),
                status: ProviderStatus::Processing,
            });
        }
        let given = headers.get("x-token").and_then(|v| v.to_str().ok()).unwrap_or_default();
        if !token_valid(&form, self.settings.secret_key.expose().as_bytes(), given) {
            return Err(ProviderError::Unauthenticated("the x-token does not match the notification".into()));
        }
        if field("cpm_site_id") != Some(self.settings.site_id.as_str()) {
            return Err(ProviderError::NotOurs("a notification of another site".into()));
        }
        let ours = field("cpm_trans_id")
            .filter(|t| t.starts_with("tx_") && t.len() <= 64)
            .ok_or_else(|| ProviderError::NotOurs("a transaction Caisse did not make".into()))?;
        Ok(Notice { subject: Subject::Payment, transaction_id: ours.to_owned(), status: ProviderStatus::Processing })
    }
}

impl Cinetpay {
    /// Sends `amount` to `to` under our transaction id `tx` (`client_transaction_id`), the contact added first.
    fn send_transfer(
        &self,
        tx: &str,
        to: &Phone,
        name: &str,
        amount: Amount,
    ) -> LocalFuture<Result<(), ProviderError>> {
        let (prefix, phone) = match prefixed(to) {
            Ok(parts) => parts,
            Err(e) => return Box::pin(std::future::ready(Err(e))),
        };
        let contact =
            json!([{"prefix": prefix, "phone": phone, "name": name, "surname": name, "email": "noreply@caisse.local"}]);
        let notify = format!("{}/{}", self.notify_url, self.transfer_token(tx));
        let money = json!([{
            "prefix": prefix,
            "phone": phone,
            "amount": amount.minor(),
            "client_transaction_id": tx,
            "notify_url": notify,
        }]);
        let add =
            self.transfer(Method::POST, "/v1/transfer/contact", Vec::new(), Some(vec![("data", contact.to_string())]));
        let send = self.transfer(
            Method::POST,
            "/v1/transfer/money/send/contact",
            Vec::new(),
            Some(vec![("data", money.to_string())]),
        );
        Box::pin(async move {
            // 726: already a contact, which is what was asked.
            match code(&add.await?).as_str() {
                "0" | "726" => {}
                other => return Err(transfer_refusal(other, "adding the beneficiary as a contact")),
            }
            match code(&send.await?).as_str() {
                // 805: already sent under this client_transaction_id: the first request reached CinetPay.
                "0" | "805" => Ok(()),
                other => Err(transfer_refusal(other, "a transfer")),
            }
        })
    }
}

/// Transfer API codes that refuse the request itself: the money did not move (the annexe of CinetPay's Transfer
/// API: balance, amounts, operator, phone, data, rights).
const TRANSFER_REFUSALS: [&str; 11] = ["602", "708", "716", "719", "720", "721", "724", "725", "801", "802", "804"];

/// What a Transfer API code other than a success says of `what`. Only a code that refuses the request refuses
/// the payout: `-1` (OPERATION_ERROR), a token error, a code CinetPay adds later or none at all say nothing of
/// whether the money moved, so the transfer's status (by `client_transaction_id`) decides.
fn transfer_refusal(code: &str, what: &str) -> ProviderError {
    match TRANSFER_REFUSALS.contains(&code) {
        true => ProviderError::Rejected { code: failure(code) },
        false => ProviderError::Unreachable(format!("CinetPay answered code `{code}` to {what}; its status decides")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_code_that_refuses_the_request_refuses_a_transfer() {
        let refused = |code| matches!(transfer_refusal(code, "a transfer"), ProviderError::Rejected { .. });
        for code in ["602", "719", "720", "721", "802", "804"] {
            assert!(refused(code), "{code}");
        }
        assert_eq!(transfer_refusal("802", "a transfer"), ProviderError::Rejected { code: "invalid_phone".into() },);
        for code in ["-1", "705", "999", ""] {
            assert!(!refused(code), "{code}: the status decides");
        }
    }

    #[test]
    fn a_transfer_is_counted_in_the_currency_of_the_beneficiarys_country() {
        let mali = Phone::parse("+22370000055").unwrap();
        let guinea = Phone::parse("+224620000055").unwrap();
        let ghana = Phone::parse("+233240000055").unwrap();
        assert_eq!(transfer_currency_holds(&mali, Currency::XOF), Ok(()));
        assert_eq!(transfer_currency_holds(&guinea, Currency::GNF), Ok(()));
        let refused = transfer_currency_holds(&mali, Currency::GNF).unwrap_err();
        assert!(refused.contains("ML numbers in XOF, not GNF"), "{refused}");
        assert!(transfer_currency_holds(&guinea, Currency::XOF).is_err());
        assert!(transfer_currency_holds(&ghana, Currency::XOF).is_err(), "no currency known for GH");
    }

    #[test]
    fn checks_and_transfers_read_as_caisse_reads_them() {
        let accepted = json!({"code": "00", "data": {"status": "ACCEPTED", "operator_id": "MP2411.1234"}});
        let report = check_status(&accepted).unwrap();
        assert_eq!((report.status, report.reference.unwrap().as_str()), (ProviderStatus::Succeeded, "MP2411.1234"));
        assert_eq!(check_status(&json!({"code": "662"})).unwrap().status, ProviderStatus::Processing);
        assert_eq!(
            check_status(&json!({"code": "627"})).unwrap().status,
            ProviderStatus::Failed { code: "transaction_cancel".into() }
        );
        assert_eq!(
            check_status(&json!({"code": "00", "data": {"status": "REFUSED"}})).unwrap().status,
            ProviderStatus::Failed { code: "payment_failed".into() }
        );
        assert_eq!(check_status(&json!({"code": "624"})).unwrap().status, ProviderStatus::Pending);
        // Out of service: no answer at all, so nothing expires or is initialised again on it.
        assert!(check_status(&json!({"code": "603"})).is_err());
        assert_eq!(
            transfer_status(
                &json!({"code": 0, "data": [{"treatment_status": "VAL", "transaction_id": "TR1"}]}),
                "tx_1"
            )
            .status,
            ProviderStatus::Succeeded
        );
        assert_eq!(
            transfer_status(&json!({"code": 0, "data": [{"treatment_status": "REC"}]}), "tx_1").status,
            ProviderStatus::Processing
        );
        assert_eq!(transfer_status(&json!({"code": 723}), "tx_1").status, ProviderStatus::Pending);
        assert_eq!(
            transfer_status(&json!({"code": 0, "data": [{"treatment_status": "REJ"}]}), "tx_1").status,
            ProviderStatus::Failed { code: "rejected".into() }
        );
        // Another transfer's state is not ours: nothing is read from it.
        let other = json!({"code": 0, "data": [{"treatment_status": "REJ", "client_transaction_id": "tx_2"}]});
        assert_eq!(transfer_status(&other, "tx_1").status, ProviderStatus::Pending);
        let ours = json!({"code": 0, "data": [{"treatment_status": "VAL", "client_transaction_id": "tx_1"}]});
        assert_eq!(transfer_status(&ours, "tx_1").status, ProviderStatus::Succeeded);
        // Not final: the transfer may still be confirmed, and the money sent.
        assert_eq!(
            transfer_status(&json!({"code": 0, "data": [{"treatment_status": "NOS"}]}), "tx_1").status,
            ProviderStatus::Processing
        );
    }

    #[test]
    fn the_x_token_covers_the_sixteen_fields_in_order() {
        let form: Vec<(String, String)> =
            NOTIFICATION_FIELDS.iter().map(|f| (f.to_string(), format!("v-{f}"))).collect();
        let mut mac = Hmac::<Sha256>::new_from_slice(b"secret").unwrap();
        for f in NOTIFICATION_FIELDS {
            mac.update(format!("v-{f}").as_bytes());
        }
        let token = hex::encode(mac.finalize().into_bytes());
        assert!(token_valid(&form, b"secret", &token));
        assert!(!token_valid(&form, b"other", &token));
        let mut swapped = form.clone();
        swapped[3].1 = "1".into();
        assert!(!token_valid(&swapped, b"secret", &token));
        assert!(!token_valid(&form, b"secret", ""));
    }

    #[test]
    fn beneficiaries_are_split_into_prefix_and_number() {
        let phone = Phone::parse("+22890000001").unwrap();
        assert_eq!(prefixed(&phone).unwrap(), ("228".to_owned(), "90000001".to_owned()));
    }
}
