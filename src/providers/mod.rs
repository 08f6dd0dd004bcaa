//! Payment providers: one adapter trait ([`Adapter`]) for everything Caisse asks of a provider or hears from
//! it, the catalogue of configured providers ([`Providers`]), and the sandbox simulator behind the same trait.
//!
//! Outbound calls (request to pay, status query, refund, payout) start work at the provider; answers come
//! back later as signed notices to `POST /v1/fournisseurs/{code}/notifications`, which the adapter
//! authenticates and parses. Caisse never moves money on a notice alone: it confirms with a status query
//! first, so a forged or replayed notice cannot credit anybody.
//!
//! In the sandbox the simulator ([`sandbox`]) plays every provider; [`chaos`] makes it misbehave on demand
//! (duplicate, late, out-of-order and contradicting notices) so integrations can be tested against it.
//!
//! Futures here are not `Send`: the HTTP client (awc) lives on the actix thread that calls it.

pub mod chaos;
pub mod cinetpay;
pub mod http;
pub mod mtn_momo;
pub mod orange_money;
pub mod pawapay;
pub mod rfc9421;
pub mod sandbox;
pub mod wave;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use actix_web::http::header::HeaderMap;
use caisse_engine::domain::money::{Amount, Currency};
use caisse_engine::domain::phone::Phone;
use caisse_engine::domain::provider::{ProviderReference, ReturnUrl};
use caisse_engine::domain::records::{Payment, Payout, Refund};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::{Operation, ProviderSettings, Settings};

pub type LocalFuture<T> = Pin<Box<dyn Future<Output = T>>>;

/// What a notice or a status query is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Subject {
    Payment,
    Refund,
    Payout,
}

/// A provider's view of one transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "statut", rename_all = "snake_case")]
pub enum ProviderStatus {
    /// The provider has not started, or does not know the transaction.
    Pending,
    /// Accepted, waiting for the customer.
    Processing,
    Succeeded,
    Failed {
        code: String,
    },
    /// The provider stopped waiting for the customer (Wave's checkout session passed its `when_expires`): the
    /// payment expires, as it would at Caisse's own TTL.
    Expired,
}

/// A provider's answer to a status query: the status, and the provider's own reference for the transaction
/// when the answer carries one (kept and shown on the dashboard, never decided on).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub status: ProviderStatus,
    pub reference: Option<ProviderReference>,
    /// Where the customer approves the payment, when the provider's answer says (Wave's launch URL): kept on a
    /// payment under way that lacks it, so a page lost on the way is found again by the next query.
    pub page: Option<ReturnUrl>,
    /// The amount and currency the answer says the transaction moved, when it says: a success is applied only
    /// if they are what Caisse asked ([`Stated::is`]).
    pub stated: Option<Stated>,
}

/// An amount as a provider's answer wrote it, in major units (`"1000"`, `"12.50"`, or a JSON integer), and
/// its currency when the answer gives one. Compared as text, never parsed into money: an answer that does not
/// read as an amount matches nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stated {
    amount: Option<String>,
    currency: Option<String>,
}

impl Stated {
    /// What the answer's `amount` and `currency` fields say; `None` when it has no amount.
    pub fn read(amount: &Value, currency: &Value) -> Option<Stated> {
        let amount = match amount {
            Value::Null => return None,
            Value::String(text) => decimal(text),
            // An integer, or a float with a fraction (`1000.0`) as some JSON writers give whole amounts.
            Value::Number(n) => decimal(&n.to_string()),
            _ => None,
        };
        Some(Stated { amount, currency: currency.as_str().map(str::to_owned) })
    }

    /// Whether this is `amount` of `currency` (a currency the answer does not name is not compared).
    pub fn is(&self, amount: Amount, currency: Currency) -> bool {
        let asked = decimal(&pawapay::amount_text(amount, currency));
        self.amount.is_some() && self.amount == asked && self.currency.as_deref().is_none_or(|c| c == currency.code())
    }
}

impl std::fmt::Display for Stated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let amount = self.amount.as_deref().unwrap_or("an unreadable amount");
        write!(f, "{amount} {}", self.currency.as_deref().unwrap_or("(no currency)"))
    }
}

/// A decimal amount in one spelling: digits, a fraction without trailing zeros, no leading zeros. `None` for
/// anything else (a sign, an exponent, a space), or over 32 characters.
fn decimal(text: &str) -> Option<String> {
    let text = text.trim();
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if text.len() > 32 || whole.is_empty() || !digits(whole) || !digits(fraction) {
        return None;
    }
    let whole = match whole.trim_start_matches('0') {
        "" => "0",
        w => w,
    };
    Some(match fraction.trim_end_matches('0') {
        "" => whole.to_owned(),
        f => format!("{whole}.{f}"),
    })
}

impl Report {
    /// A report with the provider's reference, when the answer's text is one (a malformed one is dropped with a
    /// warning: it is informative, and a provider's answer is untrusted input).
    pub fn with_reference(status: ProviderStatus, reference: Option<&str>) -> Report {
        let reference = reference.and_then(|text| {
            ProviderReference::parse(text)
                .inspect_err(|e| tracing::warn!(error = %e, "the provider's reference is not kept"))
                .ok()
        });
        Report { status, reference, page: None, stated: None }
    }

    /// This report with the amount and currency the answer states ([`Report::stated`]).
    pub fn stating(self, amount: &Value, currency: &Value) -> Report {
        Report { stated: Stated::read(amount, currency), ..self }
    }
}

impl From<ProviderStatus> for Report {
    fn from(status: ProviderStatus) -> Report {
        Report { status, reference: None, page: None, stated: None }
    }
}

/// An authenticated notice: which transaction it is about (our transaction id).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notice {
    pub subject: Subject,
    pub transaction_id: String,
    #[serde(flatten)]
    pub status: ProviderStatus,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    #[error("the notice is not authentic: {0}")]
    Unauthenticated(String),
    #[error("the notice is malformed: {0}")]
    Malformed(String),
    #[error("the provider could not be reached: {0}")]
    Unreachable(String),
    /// The provider refused the request for good (pawaPay `REJECTED`): the transaction fails with this code.
    #[error("the provider refused the request: {code}")]
    Rejected { code: String },
    /// An authentic-looking notice about a transaction Caisse did not create (answered 200, nothing changes).
    #[error("the notice is about a transaction that is not Caisse's: {0}")]
    NotOurs(String),
}

/// A callback as it arrived, for an adapter that authenticates signatures over the request itself.
#[derive(Clone)]
pub struct Callback {
    pub method: String,
    /// The request's path, as the provider addressed it.
    pub path: String,
    pub headers: HeaderMap,
    pub body: actix_web::web::Bytes,
}

/// Everything Caisse asks of one provider.
pub trait Adapter: Send + Sync {
    /// True while calls to this provider are paused after repeated failures (its circuit is open).
    fn degraded(&self) -> bool {
        false
    }

    /// Checks a callback's signature where the provider signs them (pawaPay's RFC 9421); runs before
    /// [`Adapter::parse_notice`]. Providers that do not sign accept everything here.
    fn authenticate(&self, _callback: Callback) -> LocalFuture<Result<(), ProviderError>> {
        Box::pin(std::future::ready(Ok(())))
    }

    /// Whether this adapter carries `fournisseur` for this phone's country; checked before anything is created.
    fn serves(&self, _fournisseur: &str, _phone: &Phone) -> bool {
        true
    }

    /// Whether the provider's own published limits take this amount (pawaPay's `active-conf`); checked before
    /// anything is created, so the merchant gets a clear refusal. `Err` says why, in words a merchant reads.
    fn check_amount(
        &self,
        _fournisseur: &str,
        _phone: &Phone,
        _operation: Operation,
        _currency: Currency,
        _amount: Amount,
    ) -> Result<(), String> {
        Ok(())
    }

    /// The part of [`Adapter::check_amount`] that holds whoever pays (CinetPay's multiples of 5): a payment
    /// link, made before its payer is known, is checked against it.
    fn check_amount_for_anyone(
        &self,
        _operation: Operation,
        _currency: Currency,
        _amount: Amount,
    ) -> Result<(), String> {
        Ok(())
    }

    /// Refreshes what the adapter keeps of the provider's published configuration, when it is due; the sweep
    /// calls it every pass.
    fn refresh(&self) -> LocalFuture<()> {
        Box::pin(std::future::ready(()))
    }
    /// Asks the provider to collect the payment. A provider that needs the customer's browser answers the page
    /// where the customer approves it (`url_paiement`); one that prompts the phone answers `None`.
    fn request_to_pay(&self, payment: &Payment) -> LocalFuture<Result<Option<ReturnUrl>, ProviderError>>;
    /// Stops a payment Caisse gives up on (its TTL passed with no final answer) from being paid later, where
    /// the provider allows it (Wave expires the checkout session). Answers whether it did anything, so the
    /// caller asks the status once more: a payment completed just before wins.
    fn close(&self, _payment: &Payment) -> LocalFuture<Result<bool, ProviderError>> {
        Box::pin(std::future::ready(Ok(false)))
    }
    /// Whether the provider's answer to a request of this kind is final at once or within moments (Wave's
    /// refunds and payouts), so the flow asks about it right after the request instead of at the next
    /// reconciliation.
    fn settles_at_once(&self, _subject: Subject) -> bool {
        false
    }
    /// Called once a callback was confirmed and applied, so an adapter that takes each event once (Wave, by
    /// event id) remembers it; a callback that failed on the way is taken again when the provider retries.
    fn notice_handled(&self, _headers: &HeaderMap, _body: &[u8]) {}
    /// The provider's view of a transaction. `payment` is the payment when `subject` is one, or the payment a
    /// refund belongs to (Wave finds a refund through the session it refunds, Orange queries a payment with the
    /// token in its page's address).
    fn status(
        &self,
        subject: Subject,
        transaction_id: &str,
        payment: Option<&Payment>,
    ) -> LocalFuture<Result<Report, ProviderError>>;
    /// Whether the provider can send back `amount` of this payment, its own way (a refund API, or a payout to the
    /// payer's phone); checked before a refund is accepted.
    fn can_refund(&self, _payment: &Payment, _amount: Amount) -> bool {
        true
    }
    /// True for an adapter that sends no refund at all, whatever its settings (Orange Web Payment collects only):
    /// a refund of its payments kept on it was never sent through it, and its status query cannot answer about
    /// one.
    fn refunds_nothing(&self) -> bool {
        false
    }
    /// Whether this adapter can pay `fournisseur`'s customers at this phone: what a refund another adapter cannot
    /// make needs from it. Each adapter answers for the wallets it reaches (pawaPay by its provider codes, Wave
    /// and MTN their own, CinetPay mobile money through its Transfer API, Orange Web Payment none); a card is
    /// never paid back to a phone.
    fn pays_out(&self, fournisseur: &str, phone: &Phone) -> bool {
        fournisseur != "carte" && self.serves(fournisseur, phone)
    }
    fn refund(&self, payment: &Payment, refund: &Refund) -> LocalFuture<Result<(), ProviderError>>;
    fn payout(&self, payout: &Payout) -> LocalFuture<Result<(), ProviderError>>;
    /// Authenticates and parses an inbound notice; anything unauthenticated is refused before parsing.
    /// `path_token` is the one path segment an adapter may append to its callback URL.
    fn parse_notice(&self, headers: &HeaderMap, path_token: Option<&str>, body: &[u8])
        -> Result<Notice, ProviderError>;
}

/// The key of an adapter's per-transaction callback tokens, derived from one of its secrets (which outlives
/// restarts, so a callback for a request made before one is still recognised) under a label of its own.
pub(crate) fn callback_token_key(label: &str, secret: &str) -> Vec<u8> {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    hasher.update(label.as_bytes());
    hasher.update([0]);
    hasher.update(secret.as_bytes());
    hasher.finalize().to_vec()
}

/// The unguessable path segment of one transaction's callback URL, for providers that do not sign callbacks:
/// an HMAC of the transaction id, 32 hex characters.
pub(crate) fn callback_token(key: &[u8], transaction_id: &str) -> String {
    use hmac::Mac;
    let Ok(mut mac) = hmac::Hmac::<sha2::Sha256>::new_from_slice(key) else { return String::new() };
    mac.update(transaction_id.as_bytes());
    hex::encode(&mac.finalize().into_bytes()[..16])
}

/// `Basic base64(user:secret)`, as OAuth client credentials and MTN's token requests authenticate.
pub(crate) fn basic_auth(user: &str, secret: &str) -> String {
    use base64::Engine as _;
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{secret}")))
}

/// The bearer token of a token answer and how long it lives (`expires_in` as a number or a string of digits,
/// as providers' versions differ; an hour when unreadable, at most `max`). A provider's answer is untrusted:
/// a missing, empty or oversized token is no answer.
pub(crate) fn access_token(
    provider: &str,
    body: &serde_json::Value,
    max: std::time::Duration,
) -> Result<(String, std::time::Duration), ProviderError> {
    let token = body["access_token"]
        .as_str()
        .filter(|t| !t.is_empty() && t.len() < 8192)
        .ok_or_else(|| ProviderError::Unreachable(format!("{provider}'s token answer has no access_token")))?;
    let expires = &body["expires_in"];
    let seconds = expires.as_u64().or_else(|| expires.as_str().and_then(|s| s.trim().parse().ok())).unwrap_or(3600);
    Ok((token.to_owned(), std::time::Duration::from_secs(seconds).min(max)))
}

/// One route of a fournisseur: the countries it covers (`None`: any) and the adapter that carries them, which
/// is `None` when that adapter has no credentials (or is not built yet).
struct RouteTo {
    countries: Option<Vec<String>>,
    adapter_name: String,
    adapter: Option<Arc<dyn Adapter>>,
}

/// Where a transaction of one fournisseur in one country goes.
pub enum Routed {
    Active {
        adapter_name: String,
        adapter: Arc<dyn Adapter>,
    },
    /// A route exists, to an adapter without its credentials.
    Inactive {
        adapter_name: String,
    },
    /// No route serves this country.
    Unserved,
}

/// One configured fournisseur: its published settings and its routes, per-country ones first.
pub struct Provider {
    pub settings: ProviderSettings,
    routes: Vec<RouteTo>,
}

impl Provider {
    /// A fournisseur carried by `adapter` for every country (tests build one around an adapter of their own).
    pub fn with_adapter(settings: ProviderSettings, adapter: Arc<dyn Adapter>) -> Provider {
        let routes = vec![RouteTo { countries: None, adapter_name: "test".into(), adapter: Some(adapter) }];
        Provider { settings, routes }
    }

    /// The route for a phone's country (`None` when the number's country is not one Caisse knows).
    pub fn route(&self, country: Option<&str>) -> Routed {
        let covers = |r: &&RouteTo| match (&r.countries, country) {
            (None, _) => true,
            (Some(list), Some(c)) => list.iter().any(|l| l == c),
            (Some(_), None) => false,
        };
        match self.routes.iter().find(covers) {
            Some(RouteTo { adapter: Some(adapter), adapter_name, .. }) => {
                Routed::Active { adapter_name: adapter_name.clone(), adapter: adapter.clone() }
            }
            Some(r) => Routed::Inactive { adapter_name: r.adapter_name.clone() },
            None => Routed::Unserved,
        }
    }

    /// The adapter for a phone, when its route is active.
    pub fn adapter_for(&self, phone: &Phone) -> Option<Arc<dyn Adapter>> {
        match self.route(phone.country()) {
            Routed::Active { adapter, .. } => Some(adapter),
            _ => None,
        }
    }

    /// True when at least one of its routes is active: what `GET /v1/fournisseurs` calls `actif`.
    pub fn active(&self) -> bool {
        self.routes.iter().any(|r| r.adapter.is_some())
    }

    /// The countries `GET /v1/fournisseurs` lists: those its active routes serve, or every configured one
    /// (`pays`) when a route serves any country (the simulator) or none is active.
    pub fn published_countries(&self) -> Vec<String> {
        let any_country = self.routes.iter().any(|r| r.adapter.is_some() && r.countries.is_none());
        let served = self.active_countries();
        if any_country || served.is_empty() {
            self.settings.countries.clone()
        } else {
            served
        }
    }

    /// The countries its active routes serve (empty: any country).
    pub fn active_countries(&self) -> Vec<String> {
        let mut countries: Vec<String> = self
            .routes
            .iter()
            .filter(|r| r.adapter.is_some())
            .flat_map(|r| r.countries.clone().unwrap_or_default())
            .collect();
        countries.sort();
        countries.dedup();
        countries
    }

    /// Whether a payment of `amount` can be paid through this fournisseur by someone: its fee leaves the
    /// merchant something, and the rules of one of its active adapters that hold whoever pays take it. `Err`
    /// says why, in words a merchant reads.
    pub fn takes_anyone(&self, currency: Currency, amount: Amount) -> Result<(), String> {
        let code = self.settings.code.as_str();
        match self.settings.fee.fee(amount) {
            Ok(fee) if fee < amount => {}
            Ok(fee) => return Err(format!("{code}'s fee is {fee} {currency}: the amount must be greater")),
            Err(e) => return Err(e.to_string()),
        }
        let mut why = None;
        for adapter in self.routes.iter().filter_map(|r| r.adapter.as_ref()) {
            match adapter.check_amount_for_anyone(Operation::Payment, currency, amount) {
                Ok(()) => return Ok(()),
                Err(e) => why = Some(e),
            }
        }
        why.map_or(Ok(()), Err)
    }

    pub fn supports(&self, operation: Operation, currency: Currency) -> bool {
        self.active() && self.settings.operations.contains(&operation) && self.settings.currencies.contains(&currency)
    }

    pub fn bounds(&self, currency: Currency) -> Option<(Amount, Amount)> {
        self.settings.limits.get(&currency).copied()
    }
}

/// The configured fournisseurs, by code, and the adapters by name.
#[derive(Clone)]
pub struct Providers {
    by_code: Arc<BTreeMap<String, Provider>>,
    adapters: Arc<BTreeMap<String, Arc<dyn Adapter>>>,
    pub simulator: Option<Arc<sandbox::Simulator>>,
}

impl Providers {
    /// Builds every adapter that has its credentials, then each fournisseur's routes: its per-country routes,
    /// then its default adapter for the countries it lists (`pays`). Without a default, a fournisseur goes to
    /// the simulator when it runs (the sandbox), for any country, so integrations can use any test number.
    ///
    /// `public_url` is where this server is reached from outside (the setting, or in the sandbox the address it
    /// listens on): the base of the pages providers send customers back to.
    pub fn from_settings(settings: &Settings, public_url: &str) -> Providers {
        let simulator = settings.sandbox_simulator.then(|| {
            Arc::new(
                sandbox::Simulator::new(
                    settings.sandbox_secret.clone(),
                    settings.sandbox_delay_ms,
                    settings.payment_ttl_ms,
                )
                .with_chaos(settings.sandbox_chaos),
            )
        });
        let mut adapters: BTreeMap<String, Arc<dyn Adapter>> = BTreeMap::new();
        if let Some(sim) = &simulator {
            adapters.insert("sandbox".into(), sim.clone());
        }
        if let Some(pawapay) = &settings.adapters.pawapay {
            adapters.insert("pawapay".into(), Arc::new(pawapay::Pawapay::new(pawapay.clone(), public_url)));
        }
        if let Some(mtn) = &settings.adapters.mtn_momo {
            if settings.public_url.is_empty() {
                tracing::warn!(
                    "public_url is not set: MTN MoMo will not call back, and only status queries settle payments"
                );
            }
            adapters.insert("mtn_momo".into(), Arc::new(mtn_momo::MtnMomo::new(mtn.clone(), &settings.public_url)));
        }
        if let Some(wave) = &settings.adapters.wave {
            if wave.webhook_secret.is_none() {
                tracing::warn!("adapters.wave.webhook_secret is not set: Wave's webhooks are refused, and only status queries settle payments");
            }
            adapters.insert("wave".into(), Arc::new(wave::Wave::new(wave.clone(), public_url)));
        }
        if let Some(orange) = &settings.adapters.orange_money {
            adapters
                .insert("orange_money".into(), Arc::new(orange_money::OrangeMoney::new(orange.clone(), public_url)));
        }
        if let Some(cinetpay) = &settings.adapters.cinetpay {
            adapters.insert("cinetpay".into(), Arc::new(cinetpay::Cinetpay::new(cinetpay.clone(), public_url)));
        }
        let by_code = settings
            .providers
            .iter()
            .map(|p| {
                let mut routes: Vec<RouteTo> = p
                    .routes
                    .iter()
                    .map(|r| RouteTo {
                        countries: Some(r.countries.clone()),
                        adapter_name: r.adapter.clone(),
                        adapter: adapters.get(&r.adapter).cloned(),
                    })
                    .collect();
                let default = p.adapter.clone().or_else(|| simulator.as_ref().map(|_| "sandbox".to_owned()));
                if let Some(name) = default {
                    let countries = (name != "sandbox").then(|| p.countries.clone());
                    routes.push(RouteTo { countries, adapter: adapters.get(&name).cloned(), adapter_name: name });
                }
                for route in routes.iter().filter(|r| r.adapter.is_none()) {
                    tracing::warn!(provider = %p.code, adapter = %route.adapter_name, "route to an adapter without credentials: inactive");
                }
                (p.code.as_str().to_owned(), Provider { settings: p.clone(), routes })
            })
            .collect();
        Providers { by_code: Arc::new(by_code), adapters: Arc::new(adapters), simulator }
    }

    /// A catalogue of exactly these providers (the tests build one around a provider of their own).
    pub fn new(providers: impl IntoIterator<Item = Provider>, simulator: Option<Arc<sandbox::Simulator>>) -> Providers {
        let by_code: BTreeMap<String, Provider> =
            providers.into_iter().map(|p| (p.settings.code.as_str().to_owned(), p)).collect();
        let adapters = by_code
            .values()
            .flat_map(|p| &p.routes)
            .filter_map(|r| Some((r.adapter_name.clone(), r.adapter.clone()?)))
            .collect();
        Providers { by_code: Arc::new(by_code), adapters: Arc::new(adapters), simulator }
    }

    /// The adapters whose calls are paused after repeated failures, by name: what the dashboard warns about.
    pub fn degraded(&self) -> Vec<String> {
        self.adapters.iter().filter(|(_, a)| a.degraded()).map(|(name, _)| name.clone()).collect()
    }

    /// Every active adapter.
    pub fn adapters(&self) -> impl Iterator<Item = &Arc<dyn Adapter>> {
        self.adapters.values()
    }

    /// Every active adapter with its name, in name order.
    pub fn named_adapters(&self) -> impl Iterator<Item = (&String, &Arc<dyn Adapter>)> {
        self.adapters.iter()
    }

    /// An active adapter by name (`pawapay`, `sandbox`, ...), for its callbacks.
    pub fn adapter(&self, name: &str) -> Option<Arc<dyn Adapter>> {
        self.adapters.get(name).cloned()
    }

    pub fn get(&self, code: &str) -> Option<&Provider> {
        self.by_code.get(code)
    }

    pub fn all(&self) -> impl Iterator<Item = &Provider> {
        self.by_code.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_stated_amount_is_compared_in_one_spelling() {
        let xof = |minor| (Amount::new(minor).unwrap(), Currency::XOF);
        let eur = |minor| (Amount::new(minor).unwrap(), Currency::EUR);
        let stated = |amount: Value, currency: Value| Stated::read(&amount, &currency).unwrap();
        let is = |s: &Stated, (a, c): (Amount, Currency)| s.is(a, c);
        assert!(is(&stated(json!("1000"), json!("XOF")), xof(1000)));
        assert!(is(&stated(json!(1000), json!("XOF")), xof(1000)));
        assert!(is(&stated(json!("01000.00"), json!("XOF")), xof(1000)));
        assert!(is(&stated(json!("1000"), Value::Null), xof(1000)), "a currency not named is not compared");
        assert!(is(&stated(json!(1000.0), json!("XOF")), xof(1000)), "a whole float");
        assert!(is(&stated(json!(12.5), json!("EUR")), eur(1250)));
        assert!(is(&stated(json!("12.50"), json!("EUR")), eur(1250)));
        assert!(!is(&stated(json!("12.5"), json!("EUR")), eur(125)));
        assert!(!is(&stated(json!("1000"), json!("XAF")), xof(1000)));
        assert!(!is(&stated(json!("999"), json!("XOF")), xof(1000)));
        for odd in
            [json!("-1000"), json!("1e3"), json!(" "), json!(""), json!("."), json!(-1000), json!(1e300), json!(true)]
        {
            assert!(!is(&stated(odd.clone(), json!("XOF")), xof(1000)), "{odd}");
        }
        assert_eq!(Stated::read(&Value::Null, &json!("XOF")), None, "no amount, nothing to compare");
    }

    /// A link's amount is checked without a payer: the fee must leave the merchant something, and CinetPay's
    /// rules that hold whoever pays (multiples of 5) apply.
    #[test]
    fn a_fournisseur_takes_an_amount_from_anyone_only_within_its_fee_and_its_adapters_rules() {
        use crate::config::adapters::CinetpaySettings;
        use crate::config::Secret;
        let dir = tempfile::tempdir().unwrap();
        let settings = crate::config::Settings::for_tests(dir.path()).unwrap();
        let mut card = settings.provider("carte").unwrap().clone();
        card.fee = caisse_engine::domain::money::FeeRule::new(0, Amount::new(300).unwrap()).unwrap();
        let cinetpay = cinetpay::Cinetpay::new(
            CinetpaySettings {
                base_url: "http://127.0.0.1:9".into(),
                transfer_base_url: "http://127.0.0.1:9".into(),
                apikey: Secret::new("k".into()),
                site_id: "1".into(),
                secret_key: Secret::new("s".into()),
                transfer: None,
            },
            "https://caisse.example",
        );
        let provider = Provider::with_adapter(card, Arc::new(cinetpay));
        let xof = |minor| Amount::new(minor).unwrap();
        assert!(provider.takes_anyone(Currency::XOF, xof(1_000)).is_ok());
        assert!(provider.takes_anyone(Currency::XOF, xof(300)).is_err_and(|why| why.contains("fee")));
        assert!(provider.takes_anyone(Currency::XOF, xof(1_002)).is_err_and(|why| why.contains("multiples of 5")));
    }
}
