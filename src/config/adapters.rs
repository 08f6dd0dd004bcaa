//! The provider adapters' settings (an adapter is a provider API Caisse speaks) and the routes that send each
//! fournisseur, per country, to one of them. Secrets are kept in [`Secret`], which never prints its value.

use serde::Deserialize;

use super::{bad, ConfigError, Environment};

/// Every adapter a route may name. Those without an implementation yet are accepted so a configuration can
/// be written ahead, and their routes are listed inactive.
pub const ADAPTERS: [&str; 6] = ["sandbox", "pawapay", "mtn_momo", "wave", "cinetpay", "orange_money"];

/// A credential: readable by the code that sends it, never by a log line or a `{:?}`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Secret {
        Secret(value)
    }

    /// The value, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

/// `[adapters]` as written: each adapter's table, each key optional.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdaptersLayer {
    pub(super) pawapay: Option<PawapayLayer>,
    pub(super) mtn_momo: Option<MtnLayer>,
    pub(super) wave: Option<WaveLayer>,
    pub(super) cinetpay: Option<CinetpayLayer>,
    pub(super) orange_money: Option<OrangeLayer>,
}

/// `[adapters.orange_money]`: Orange Money Web Payment for one country (its client credentials and merchant key).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrangeLayer {
    pub(super) base_url: Option<String>,
    pub(super) token_url: Option<String>,
    pub(super) country: Option<String>,
    pub(super) client_id: Option<String>,
    pub(super) client_secret: Option<String>,
    pub(super) client_secret_file: Option<String>,
    pub(super) merchant_key: Option<String>,
    pub(super) merchant_key_file: Option<String>,
}

/// An adapter's layer, read and written key by key (its `*_KEYS`).
trait Keyed {
    fn slot(&mut self, key: &str) -> Option<&mut Option<String>>;
}

const ORANGE_KEYS: [&str; 8] = [
    "base_url",
    "token_url",
    "country",
    "client_id",
    "client_secret",
    "client_secret_file",
    "merchant_key",
    "merchant_key_file",
];

impl Keyed for OrangeLayer {
    fn slot(&mut self, key: &str) -> Option<&mut Option<String>> {
        Some(match key {
            "base_url" => &mut self.base_url,
            "token_url" => &mut self.token_url,
            "country" => &mut self.country,
            "client_id" => &mut self.client_id,
            "client_secret" => &mut self.client_secret,
            "client_secret_file" => &mut self.client_secret_file,
            "merchant_key" => &mut self.merchant_key,
            "merchant_key_file" => &mut self.merchant_key_file,
            _ => return None,
        })
    }
}

/// `[adapters.cinetpay]`: the checkout's API key, site id and secret key (which signs notifications), and the
/// Transfer API's login and password for payouts.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CinetpayLayer {
    pub(super) base_url: Option<String>,
    pub(super) transfer_base_url: Option<String>,
    pub(super) apikey: Option<String>,
    pub(super) apikey_file: Option<String>,
    pub(super) site_id: Option<String>,
    pub(super) secret_key: Option<String>,
    pub(super) secret_key_file: Option<String>,
    pub(super) transfer_login: Option<String>,
    pub(super) transfer_password: Option<String>,
    pub(super) transfer_password_file: Option<String>,
}

const CINETPAY_KEYS: [&str; 10] = [
    "base_url",
    "transfer_base_url",
    "apikey",
    "apikey_file",
    "site_id",
    "secret_key",
    "secret_key_file",
    "transfer_login",
    "transfer_password",
    "transfer_password_file",
];

impl Keyed for CinetpayLayer {
    fn slot(&mut self, key: &str) -> Option<&mut Option<String>> {
        Some(match key {
            "base_url" => &mut self.base_url,
            "transfer_base_url" => &mut self.transfer_base_url,
            "apikey" => &mut self.apikey,
            "apikey_file" => &mut self.apikey_file,
            "site_id" => &mut self.site_id,
            "secret_key" => &mut self.secret_key,
            "secret_key_file" => &mut self.secret_key_file,
            "transfer_login" => &mut self.transfer_login,
            "transfer_password" => &mut self.transfer_password,
            "transfer_password_file" => &mut self.transfer_password_file,
            _ => return None,
        })
    }
}

/// `[adapters.wave]`: the API key of one Wave wallet (Checkout and Payout permissions), and the webhook secret
/// the Business Portal shows (a signing secret, or a shared secret sent as a bearer token).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaveLayer {
    pub(super) base_url: Option<String>,
    pub(super) api_key: Option<String>,
    pub(super) api_key_file: Option<String>,
    pub(super) webhook_secret: Option<String>,
    pub(super) webhook_secret_file: Option<String>,
}

const WAVE_KEYS: [&str; 5] = ["base_url", "api_key", "api_key_file", "webhook_secret", "webhook_secret_file"];

impl Keyed for WaveLayer {
    fn slot(&mut self, key: &str) -> Option<&mut Option<String>> {
        Some(match key {
            "base_url" => &mut self.base_url,
            "api_key" => &mut self.api_key,
            "api_key_file" => &mut self.api_key_file,
            "webhook_secret" => &mut self.webhook_secret,
            "webhook_secret_file" => &mut self.webhook_secret_file,
            _ => return None,
        })
    }
}

/// `[adapters.mtn_momo]`: each product (collection, disbursement) has its own subscription key and API user.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MtnLayer {
    pub(super) base_url: Option<String>,
    pub(super) target_environment: Option<String>,
    pub(super) collection_subscription_key: Option<String>,
    pub(super) collection_subscription_key_file: Option<String>,
    pub(super) collection_api_user: Option<String>,
    pub(super) collection_api_key: Option<String>,
    pub(super) collection_api_key_file: Option<String>,
    pub(super) disbursement_subscription_key: Option<String>,
    pub(super) disbursement_subscription_key_file: Option<String>,
    pub(super) disbursement_api_user: Option<String>,
    pub(super) disbursement_api_key: Option<String>,
    pub(super) disbursement_api_key_file: Option<String>,
}

/// The names of `MtnLayer`'s keys, for the environment variables.
const MTN_KEYS: [&str; 12] = [
    "base_url",
    "target_environment",
    "collection_subscription_key",
    "collection_subscription_key_file",
    "collection_api_user",
    "collection_api_key",
    "collection_api_key_file",
    "disbursement_subscription_key",
    "disbursement_subscription_key_file",
    "disbursement_api_user",
    "disbursement_api_key",
    "disbursement_api_key_file",
];

impl Keyed for MtnLayer {
    fn slot(&mut self, key: &str) -> Option<&mut Option<String>> {
        Some(match key {
            "base_url" => &mut self.base_url,
            "target_environment" => &mut self.target_environment,
            "collection_subscription_key" => &mut self.collection_subscription_key,
            "collection_subscription_key_file" => &mut self.collection_subscription_key_file,
            "collection_api_user" => &mut self.collection_api_user,
            "collection_api_key" => &mut self.collection_api_key,
            "collection_api_key_file" => &mut self.collection_api_key_file,
            "disbursement_subscription_key" => &mut self.disbursement_subscription_key,
            "disbursement_subscription_key_file" => &mut self.disbursement_subscription_key_file,
            "disbursement_api_user" => &mut self.disbursement_api_user,
            "disbursement_api_key" => &mut self.disbursement_api_key,
            "disbursement_api_key_file" => &mut self.disbursement_api_key_file,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PawapayLayer {
    pub(super) base_url: Option<String>,
    pub(super) api_token: Option<String>,
    pub(super) api_token_file: Option<String>,
    /// `true` in the file, or `true`/`1`/`false`/`0` from the environment; read when resolved.
    #[serde(default, deserialize_with = "flag_text")]
    pub(super) require_signatures: Option<String>,
}

/// A flag as the file writes it (`true`) or as the environment does (`"true"`), kept as text until resolved so
/// that a bad value is named with its setting.
fn flag_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Flag {
        Bool(bool),
        Text(String),
    }
    Ok(Option::<Flag>::deserialize(d)?.map(|flag| match flag {
        Flag::Bool(b) => b.to_string(),
        Flag::Text(text) => text,
    }))
}

/// A flag's text: `true`/`1` or `false`/`0` (empty: `false`).
fn flag(setting: &str, text: Option<String>) -> Result<bool, ConfigError> {
    match text.as_deref().map(str::trim) {
        None | Some("") | Some("false") | Some("0") => Ok(false),
        Some("true") | Some("1") => Ok(true),
        Some(other) => Err(bad(setting, format!("`{other}` is not true or false"))),
    }
}

impl AdaptersLayer {
    /// The `CAISSE_ADAPTERS_<ADAPTER>_<KEY>` variables.
    pub(super) fn from_env(get: &impl Fn(&str) -> Option<String>) -> Option<AdaptersLayer> {
        let pawapay = PawapayLayer {
            base_url: get("CAISSE_ADAPTERS_PAWAPAY_BASE_URL"),
            api_token: get("CAISSE_ADAPTERS_PAWAPAY_API_TOKEN"),
            api_token_file: get("CAISSE_ADAPTERS_PAWAPAY_API_TOKEN_FILE"),
            require_signatures: get("CAISSE_ADAPTERS_PAWAPAY_REQUIRE_SIGNATURES"),
        };
        let any_pawapay = pawapay.base_url.is_some()
            || pawapay.api_token.is_some()
            || pawapay.api_token_file.is_some()
            || pawapay.require_signatures.is_some();
        let mut mtn = MtnLayer::default();
        let mut any_mtn = false;
        for key in MTN_KEYS {
            if let (Some(value), Some(slot)) =
                (get(&format!("CAISSE_ADAPTERS_MTN_MOMO_{}", key.to_uppercase())), mtn.slot(key))
            {
                *slot = Some(value);
                any_mtn = true;
            }
        }
        let mut wave = WaveLayer::default();
        let mut any_wave = false;
        for key in WAVE_KEYS {
            if let (Some(value), Some(slot)) =
                (get(&format!("CAISSE_ADAPTERS_WAVE_{}", key.to_uppercase())), wave.slot(key))
            {
                *slot = Some(value);
                any_wave = true;
            }
        }
        let mut cinetpay = CinetpayLayer::default();
        let mut any_cinetpay = false;
        for key in CINETPAY_KEYS {
            if let (Some(value), Some(slot)) =
                (get(&format!("CAISSE_ADAPTERS_CINETPAY_{}", key.to_uppercase())), cinetpay.slot(key))
            {
                *slot = Some(value);
                any_cinetpay = true;
            }
        }
        let mut orange = OrangeLayer::default();
        let mut any_orange = false;
        for key in ORANGE_KEYS {
            if let (Some(value), Some(slot)) =
                (get(&format!("CAISSE_ADAPTERS_ORANGE_MONEY_{}", key.to_uppercase())), orange.slot(key))
            {
                *slot = Some(value);
                any_orange = true;
            }
        }
        (any_pawapay || any_mtn || any_wave || any_cinetpay || any_orange).then_some(AdaptersLayer {
            pawapay: any_pawapay.then_some(pawapay),
            mtn_momo: any_mtn.then_some(mtn),
            wave: any_wave.then_some(wave),
            cinetpay: any_cinetpay.then_some(cinetpay),
            orange_money: any_orange.then_some(orange),
        })
    }

    /// `other`'s keys win over `self`'s, key by key.
    pub(super) fn merge(mut self, other: AdaptersLayer) -> AdaptersLayer {
        let AdaptersLayer { pawapay, mtn_momo, wave, cinetpay, orange_money } = other;
        if let Some(theirs) = orange_money {
            merge_keys(self.orange_money.get_or_insert_with(OrangeLayer::default), theirs, &ORANGE_KEYS);
        }
        if let Some(theirs) = cinetpay {
            merge_keys(self.cinetpay.get_or_insert_with(CinetpayLayer::default), theirs, &CINETPAY_KEYS);
        }
        if let Some(theirs) = wave {
            merge_keys(self.wave.get_or_insert_with(WaveLayer::default), theirs, &WAVE_KEYS);
        }
        if let Some(theirs) = mtn_momo {
            merge_keys(self.mtn_momo.get_or_insert_with(MtnLayer::default), theirs, &MTN_KEYS);
        }
        if let Some(PawapayLayer { base_url, api_token, api_token_file, require_signatures }) = pawapay {
            let mine = self.pawapay.get_or_insert_with(PawapayLayer::default);
            mine.base_url = base_url.or(mine.base_url.take());
            // One secret given two ways: a later source's replaces an earlier one whichever way each gives it
            // (an empty value gives nothing).
            let (api_token, api_token_file) =
                (api_token.filter(|v| !v.is_empty()), api_token_file.filter(|v| !v.is_empty()));
            if api_token.is_some() || api_token_file.is_some() {
                mine.api_token = api_token;
                mine.api_token_file = api_token_file;
            }
            mine.require_signatures = require_signatures.or(mine.require_signatures.take());
        }
        self
    }
}

/// pawaPay v2: where it is and the API token of this environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PawapaySettings {
    pub base_url: String,
    pub api_token: Secret,
    /// Refuse (401) a callback without a signature: for an account whose callbacks pawaPay signs (signing is
    /// turned on in pawaPay's dashboard), an unsigned one is not pawaPay's.
    pub require_signatures: bool,
}

/// One MTN MoMo product's credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MtnProduct {
    pub subscription_key: Secret,
    pub api_user: String,
    pub api_key: Secret,
}

/// MTN MoMo Open API: where it is, the target environment (the country's, e.g. `mtnbenin`), and the products
/// this server has credentials for. Collection is needed to be active; disbursement for payouts and refunds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MtnSettings {
    pub base_url: String,
    pub target_environment: String,
    pub collection: MtnProduct,
    pub disbursement: Option<MtnProduct>,
}

/// Wave (Checkout and Payout APIs): where it is, the wallet's API key, and the webhook secret (without one,
/// every callback is refused and only status queries settle payments).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaveSettings {
    pub base_url: String,
    pub api_key: Secret,
    pub webhook_secret: Option<Secret>,
}

/// CinetPay: Checkout v2 for collection (cards and mobile money), and the Transfer API for payouts when its
/// login is given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CinetpaySettings {
    pub base_url: String,
    pub transfer_base_url: String,
    pub apikey: Secret,
    pub site_id: String,
    /// Signs notifications (`x-token`).
    pub secret_key: Secret,
    /// The Transfer API's login and password; without them, payouts through CinetPay are refused.
    pub transfer: Option<(String, Secret)>,
}

/// Orange Money Web Payment: one country's API (`country` is Orange's path segment: `ci`, `sn`, `ml`, ...; `dev`
/// for its sandbox), its OAuth client and the merchant key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrangeSettings {
    pub base_url: String,
    pub token_url: String,
    pub country: String,
    pub client_id: String,
    pub client_secret: Secret,
    pub merchant_key: Secret,
}

/// The adapters that have their credentials, hence can be active.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdapterSettings {
    pub pawapay: Option<PawapaySettings>,
    pub mtn_momo: Option<MtnSettings>,
    pub wave: Option<WaveSettings>,
    pub cinetpay: Option<CinetpaySettings>,
    pub orange_money: Option<OrangeSettings>,
}

/// One route of a fournisseur: these countries go to this adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub countries: Vec<String>,
    pub adapter: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteLayer {
    #[serde(rename = "pays")]
    pub(super) countries: Vec<String>,
    pub(super) adapter: String,
}

/// Checks an adapter name a setting gives.
pub(super) fn adapter_name(setting: &str, name: &str) -> Result<String, ConfigError> {
    if ADAPTERS.contains(&name) {
        Ok(name.to_owned())
    } else {
        Err(bad(setting, format!("`{name}` is not an adapter (one of {})", ADAPTERS.join(", "))))
    }
}

pub(super) fn resolve_routes(setting: &str, routes: Vec<RouteLayer>) -> Result<Vec<Route>, ConfigError> {
    routes
        .into_iter()
        .map(|r| {
            if r.countries.is_empty()
                || r.countries.iter().any(|c| c.len() != 2 || !c.bytes().all(|b| b.is_ascii_uppercase()))
            {
                return Err(bad(setting, "each route lists countries as ISO codes such as \"BJ\""));
            }
            Ok(Route { countries: r.countries, adapter: adapter_name(setting, &r.adapter)? })
        })
        .collect()
}

/// The other way of giving the same secret: `key_file` for `key`, and `key` for `key_file`.
fn other_way(key: &str) -> String {
    match key.strip_suffix("_file") {
        Some(inline) => inline.to_owned(),
        None => format!("{key}_file"),
    }
}

/// Lays `theirs`, a later source, over `mine`: each key it sets wins. A secret it gives, inline or in a file,
/// replaces the one `mine` gives either way; given both ways by one source, both stay, and `secret` refuses
/// them.
fn merge_keys<L: Keyed>(mine: &mut L, mut theirs: L, keys: &[&str]) {
    for key in keys {
        // An empty value (a variable set to nothing) gives nothing.
        if let Some(value) = theirs.slot(key) {
            if value.as_deref() == Some("") {
                *value = None;
            }
        }
        if theirs.slot(key).is_some_and(|value| value.is_some()) {
            for cleared in [key.to_string(), other_way(key)] {
                if let Some(slot) = mine.slot(&cleared) {
                    *slot = None;
                }
            }
        }
    }
    for key in keys {
        if let (Some(slot), Some(value)) = (mine.slot(key), theirs.slot(key).and_then(Option::take)) {
            *slot = Some(value);
        }
    }
}

/// A provider API's base URL: https, or http on the loopback interface (a local fake).
fn base_url(setting: &str, url: &str) -> Result<String, ConfigError> {
    let loopback = ["http://127.0.0.1", "http://localhost", "http://[::1]"].iter().any(|p| url.starts_with(p));
    if !(url.starts_with("https://") || loopback) || url.contains(char::is_whitespace) {
        return Err(bad(setting, format!("`{url}` is not an https URL (http is accepted on the loopback only)")));
    }
    Ok(url.trim_end_matches('/').to_owned())
}

/// A secret given inline or in a file named by `<key>_file` (surrounding whitespace dropped). Both at once, or
/// a file with nothing in it, is refused: which one was meant cannot be told, and an empty file would silently
/// turn off what the secret enables (the admin API, sealing).
pub(super) fn secret(
    setting: &str,
    inline: Option<String>,
    file: Option<String>,
) -> Result<Option<Secret>, ConfigError> {
    let inline = inline.filter(|v| !v.is_empty());
    let value = match file.filter(|f| !f.is_empty()) {
        Some(_) if inline.is_some() => {
            return Err(bad(setting, format!("set {setting} or {setting}_file, not both")));
        }
        Some(path) => {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| bad(format!("{setting}_file"), format!("cannot read {path}: {e}")))?;
            let text = text.trim().to_owned();
            if text.is_empty() {
                return Err(bad(format!("{setting}_file"), format!("{path} is empty")));
            }
            text
        }
        None => inline.unwrap_or_default(),
    };
    Ok(Some(value).filter(|v| !v.is_empty()).map(Secret::new))
}

pub(super) fn resolve(layer: Option<AdaptersLayer>, environment: Environment) -> Result<AdapterSettings, ConfigError> {
    let layer = layer.unwrap_or_default();
    let pawapay = match layer.pawapay {
        None => None,
        Some(p) => {
            let token = secret("adapters.pawapay.api_token", p.api_token, p.api_token_file)?;
            let default = match environment {
                Environment::Production => "https://api.pawapay.io",
                Environment::Sandbox => "https://api.sandbox.pawapay.io",
            };
            let url = p.base_url.filter(|u| !u.is_empty()).unwrap_or_else(|| default.to_owned());
            let base_url = base_url("adapters.pawapay.base_url", &url)?;
            let require_signatures = flag("adapters.pawapay.require_signatures", p.require_signatures)?;
            token.map(|api_token| PawapaySettings { base_url, api_token, require_signatures })
        }
    };
    let mtn_momo = match layer.mtn_momo {
        None => None,
        Some(m) => resolve_mtn(m, environment)?,
    };
    let wave = match layer.wave {
        None => None,
        Some(w) => {
            let api_key = secret("adapters.wave.api_key", w.api_key, w.api_key_file)?;
            let webhook_secret = secret("adapters.wave.webhook_secret", w.webhook_secret, w.webhook_secret_file)?;
            // Wave has no public sandbox: both environments speak to its one API unless told otherwise.
            let url = w.base_url.filter(|u| !u.is_empty()).unwrap_or_else(|| "https://api.wave.com".to_owned());
            let base_url = base_url("adapters.wave.base_url", &url)?;
            api_key.map(|api_key| WaveSettings { base_url, api_key, webhook_secret })
        }
    };
    let cinetpay = match layer.cinetpay {
        None => None,
        Some(c) => resolve_cinetpay(c)?,
    };
    let orange_money = match layer.orange_money {
        None => None,
        Some(o) => resolve_orange(o, environment)?,
    };
    Ok(AdapterSettings { pawapay, mtn_momo, wave, cinetpay, orange_money })
}

fn resolve_orange(o: OrangeLayer, environment: Environment) -> Result<Option<OrangeSettings>, ConfigError> {
    let client_secret = secret("adapters.orange_money.client_secret", o.client_secret, o.client_secret_file)?;
    let merchant_key = secret("adapters.orange_money.merchant_key", o.merchant_key, o.merchant_key_file)?;
    let client_id = o.client_id.filter(|c| !c.is_empty());
    let (client_id, client_secret, merchant_key) = match (client_id, client_secret, merchant_key) {
        (Some(i), Some(s), Some(k)) => (i, s, k),
        (None, None, None) => return Ok(None),
        _ => {
            return Err(bad(
                "adapters.orange_money.client_id",
                "Orange Money needs client_id, client_secret and merchant_key together",
            ))
        }
    };
    let country = match (o.country.filter(|c| !c.is_empty()), environment) {
        (Some(c), _) => c,
        (None, Environment::Sandbox) => "dev".to_owned(),
        (None, Environment::Production) => {
            return Err(bad("adapters.orange_money.country", "required in production (ci, sn, ml, ...)"))
        }
    };
    if !(2..=8).contains(&country.len()) || !country.bytes().all(|b| b.is_ascii_lowercase()) {
        return Err(bad("adapters.orange_money.country", format!("`{country}` is not one of Orange's country paths")));
    }
    let url = o.base_url.filter(|u| !u.is_empty()).unwrap_or_else(|| "https://api.orange.com".to_owned());
    let base = base_url("adapters.orange_money.base_url", &url)?;
    let token = o.token_url.filter(|u| !u.is_empty()).unwrap_or_else(|| format!("{base}/oauth/v3/token"));
    Ok(Some(OrangeSettings {
        token_url: base_url("adapters.orange_money.token_url", &token)?,
        base_url: base,
        country,
        client_id,
        client_secret,
        merchant_key,
    }))
}

fn resolve_cinetpay(c: CinetpayLayer) -> Result<Option<CinetpaySettings>, ConfigError> {
    let apikey = secret("adapters.cinetpay.apikey", c.apikey, c.apikey_file)?;
    let secret_key = secret("adapters.cinetpay.secret_key", c.secret_key, c.secret_key_file)?;
    let site_id = c.site_id.filter(|s| !s.is_empty());
    let (apikey, site_id, secret_key) = match (apikey, site_id, secret_key) {
        (Some(a), Some(s), Some(k)) => (a, s, k),
        (None, None, None) => return Ok(None),
        _ => {
            return Err(bad("adapters.cinetpay.site_id", "the checkout needs apikey, site_id and secret_key together"))
        }
    };
    let password = secret("adapters.cinetpay.transfer_password", c.transfer_password, c.transfer_password_file)?;
    let transfer = match (c.transfer_login.filter(|l| !l.is_empty()), password) {
        (Some(login), Some(password)) => Some((login, password)),
        (None, None) => None,
        _ => {
            return Err(bad(
                "adapters.cinetpay.transfer_login",
                "payouts need transfer_login and transfer_password together",
            ))
        }
    };
    // CinetPay's sandbox is its production API with test credentials: one default for both environments.
    let url = c.base_url.filter(|u| !u.is_empty()).unwrap_or_else(|| "https://api-checkout.cinetpay.com".to_owned());
    let transfer_url =
        c.transfer_base_url.filter(|u| !u.is_empty()).unwrap_or_else(|| "https://client.cinetpay.com".to_owned());
    Ok(Some(CinetpaySettings {
        base_url: base_url("adapters.cinetpay.base_url", &url)?,
        transfer_base_url: base_url("adapters.cinetpay.transfer_base_url", &transfer_url)?,
        apikey,
        site_id,
        secret_key,
        transfer,
    }))
}

fn resolve_mtn(m: MtnLayer, environment: Environment) -> Result<Option<MtnSettings>, ConfigError> {
    let product = |name: &str, key: Option<String>, key_file, user: Option<String>, api_key, api_key_file| {
        let setting = |k: &str| format!("adapters.mtn_momo.{name}_{k}");
        let subscription_key = secret(&setting("subscription_key"), key, key_file)?;
        let api_key = secret(&setting("api_key"), api_key, api_key_file)?;
        let api_user = user.filter(|u| !u.is_empty());
        match (subscription_key, api_user, api_key) {
            (Some(subscription_key), Some(api_user), Some(api_key)) => {
                Ok(Some(MtnProduct { subscription_key, api_user, api_key }))
            }
            (None, None, None) => Ok(None),
            _ => Err(bad(setting("api_user"), "a product needs its subscription key, API user and API key together")),
        }
    };
    let collection = product(
        "collection",
        m.collection_subscription_key,
        m.collection_subscription_key_file,
        m.collection_api_user,
        m.collection_api_key,
        m.collection_api_key_file,
    )?;
    let disbursement = product(
        "disbursement",
        m.disbursement_subscription_key,
        m.disbursement_subscription_key_file,
        m.disbursement_api_user,
        m.disbursement_api_key,
        m.disbursement_api_key_file,
    )?;
    let Some(collection) = collection else { return Ok(None) };
    let (default_url, default_target) = match environment {
        Environment::Production => ("https://proxy.momoapi.mtn.com", None),
        Environment::Sandbox => ("https://sandbox.momodeveloper.mtn.com", Some("sandbox")),
    };
    let url = m.base_url.filter(|u| !u.is_empty()).unwrap_or_else(|| default_url.to_owned());
    let target_environment = m
        .target_environment
        .filter(|t| !t.is_empty())
        .or(default_target.map(str::to_owned))
        .ok_or_else(|| bad("adapters.mtn_momo.target_environment", "required in production (e.g. mtnbenin)"))?;
    if !target_environment.bytes().all(|b| b.is_ascii_lowercase()) {
        return Err(bad(
            "adapters.mtn_momo.target_environment",
            format!("`{target_environment}` is not a target name"),
        ));
    }
    Ok(Some(MtnSettings {
        base_url: base_url("adapters.mtn_momo.base_url", &url)?,
        target_environment,
        collection,
        disbursement,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_never_prints() {
        let s = Secret::new("tok_live_123".into());
        assert!(!format!("{s:?}").contains("tok_live"));
        let settings =
            PawapaySettings { base_url: "https://api.pawapay.io".into(), api_token: s, require_signatures: false };
        assert!(!format!("{settings:?}").contains("tok_live"));
    }

    #[test]
    fn an_adapter_without_its_token_is_inactive_and_urls_are_checked() {
        let layer = |url: Option<&str>, token: Option<&str>| AdaptersLayer {
            pawapay: Some(PawapayLayer {
                base_url: url.map(str::to_owned),
                api_token: token.map(str::to_owned),
                api_token_file: None,
                require_signatures: None,
            }),
            mtn_momo: None,
            wave: None,
            cinetpay: None,
            orange_money: None,
        };
        assert_eq!(resolve(Some(layer(None, None)), Environment::Production).unwrap().pawapay, None);
        let active = resolve(Some(layer(None, Some("t"))), Environment::Production).unwrap().pawapay.unwrap();
        assert_eq!(active.base_url, "https://api.pawapay.io");
        let fake = resolve(Some(layer(Some("http://127.0.0.1:9000/"), Some("t"))), Environment::Production).unwrap();
        assert_eq!(fake.pawapay.unwrap().base_url, "http://127.0.0.1:9000");
        let refused = resolve(Some(layer(Some("http://pawapay.example"), Some("t"))), Environment::Production);
        assert!(refused.unwrap_err().to_string().contains("adapters.pawapay.base_url"));
        assert!(!active.require_signatures, "unsigned callbacks are accepted unless required");
    }

    /// The environment's key wins over the file's key file, and the other way round; one source giving a key
    /// both ways is refused.
    #[test]
    fn an_adapter_secret_from_a_later_source_wins_however_each_gives_it() {
        let dir = tempfile::tempdir().unwrap();
        let key_file = dir.path().join("wave_api_key");
        std::fs::write(&key_file, "from-the-file\n").unwrap();
        let file: AdaptersLayer =
            toml::from_str(&format!("[wave]\napi_key_file = {:?}\n", key_file.display().to_string()))
                .expect("a file layer");
        let env = |vars: &[(&str, &str)]| {
            let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            AdaptersLayer::from_env(&|name: &str| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
        };
        let api_key = |layer: AdaptersLayer| {
            resolve(Some(layer), Environment::Production).map(|a| a.wave.unwrap().api_key.expose().to_owned())
        };
        assert_eq!(api_key(file.clone().merge(AdaptersLayer::default())).unwrap(), "from-the-file");
        let over = env(&[("CAISSE_ADAPTERS_WAVE_API_KEY", "from-the-environment")]).unwrap();
        assert_eq!(api_key(file.clone().merge(over)).unwrap(), "from-the-environment");
        let inline: AdaptersLayer = toml::from_str("[wave]\napi_key = \"inline\"\n").expect("a file layer");
        let path = key_file.display().to_string();
        let over = env(&[("CAISSE_ADAPTERS_WAVE_API_KEY_FILE", &path)]).unwrap();
        assert_eq!(api_key(inline.merge(over)).unwrap(), "from-the-file");
        let both = env(&[("CAISSE_ADAPTERS_WAVE_API_KEY", "x"), ("CAISSE_ADAPTERS_WAVE_API_KEY_FILE", &path)]).unwrap();
        assert!(api_key(file.merge(both)).unwrap_err().to_string().contains("not both"));
    }

    #[test]
    fn pawapay_signatures_are_required_from_the_file_or_the_environment() {
        let from_env = |value: &str| {
            let vars =
                [("CAISSE_ADAPTERS_PAWAPAY_API_TOKEN", "t"), ("CAISSE_ADAPTERS_PAWAPAY_REQUIRE_SIGNATURES", value)];
            let get = |name: &str| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string());
            resolve(AdaptersLayer::from_env(&get), Environment::Production)
                .map(|a| a.pawapay.unwrap().require_signatures)
        };
        assert!(from_env("true").unwrap() && from_env("1").unwrap());
        assert!(!from_env("false").unwrap() && !from_env("0").unwrap());
        assert!(from_env("yes").unwrap_err().to_string().contains("adapters.pawapay.require_signatures"));
        let file: AdaptersLayer =
            toml::from_str("[pawapay]\napi_token = \"t\"\nrequire_signatures = true\n").expect("a file layer");
        assert!(resolve(Some(file), Environment::Production).unwrap().pawapay.unwrap().require_signatures);
    }
}

#[cfg(test)]
mod mtn_tests {
    use super::*;

    #[test]
    fn mtn_needs_a_whole_collection_product_and_a_target_in_production() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| (*v).to_owned())
        };
        let collection: &[(&str, &str)] = &[
            ("CAISSE_ADAPTERS_MTN_MOMO_COLLECTION_SUBSCRIPTION_KEY", "k"),
            ("CAISSE_ADAPTERS_MTN_MOMO_COLLECTION_API_USER", "u"),
            ("CAISSE_ADAPTERS_MTN_MOMO_COLLECTION_API_KEY", "s"),
        ];
        let layer = AdaptersLayer::from_env(&env(collection));
        let sandbox = resolve(layer.clone(), Environment::Sandbox).unwrap().mtn_momo.unwrap();
        assert_eq!((sandbox.target_environment.as_str(), sandbox.disbursement.is_none()), ("sandbox", true));
        assert!(resolve(layer, Environment::Production).unwrap_err().to_string().contains("target_environment"));
        let half: &[(&str, &str)] = &[("CAISSE_ADAPTERS_MTN_MOMO_COLLECTION_API_USER", "u")];
        assert!(resolve(AdaptersLayer::from_env(&env(half)), Environment::Sandbox).is_err());
        assert!(!format!("{sandbox:?}").contains("\"s\""), "secrets never print");
    }
}

#[cfg(test)]
mod orange_tests {
    use super::*;

    #[test]
    fn orange_needs_its_three_credentials_and_a_country_in_production() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| (*v).to_owned())
        };
        let whole: &[(&str, &str)] = &[
            ("CAISSE_ADAPTERS_ORANGE_MONEY_CLIENT_ID", "i"),
            ("CAISSE_ADAPTERS_ORANGE_MONEY_CLIENT_SECRET", "s"),
            ("CAISSE_ADAPTERS_ORANGE_MONEY_MERCHANT_KEY", "k"),
        ];
        let layer = AdaptersLayer::from_env(&env(whole));
        let sandbox = resolve(layer.clone(), Environment::Sandbox).unwrap().orange_money.unwrap();
        assert_eq!(
            (sandbox.country.as_str(), sandbox.token_url.as_str()),
            ("dev", "https://api.orange.com/oauth/v3/token")
        );
        assert!(resolve(layer, Environment::Production).unwrap_err().to_string().contains("country"));
        let half: &[(&str, &str)] = &[("CAISSE_ADAPTERS_ORANGE_MONEY_CLIENT_ID", "i")];
        assert!(resolve(AdaptersLayer::from_env(&env(half)), Environment::Sandbox).is_err());
        assert!(!format!("{sandbox:?}").contains("\"s\""), "secrets never print");
    }
}
