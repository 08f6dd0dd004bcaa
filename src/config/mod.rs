//! Configuration: the commented defaults compiled in (`caisse.default.toml`), then a TOML file, then
//! `CAISSE_*` environment variables, then command-line flags. Later sources win.
//!
//! Every source is parsed into the same [`Layer`] of optional values, so one function ([`Settings::resolve`])
//! checks every value once and names the setting when one is wrong. The default file is the documentation
//! of every setting; a test makes sure it parses.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use caisse_engine::domain::money::{Amount, Currency, FeeRule};
use caisse_engine::domain::records::ProviderCode;
use caisse_engine::domain::time::parse_duration_ms;
use caisse_engine::AuditSchedule;
use serde::Deserialize;

use crate::sandbox_modes::Chaos;

pub mod adapters;

use crate::client_address::Cidr;
pub use adapters::{
    AdapterSettings, CinetpaySettings, MtnProduct, MtnSettings, OrangeSettings, PawapaySettings, Route, Secret,
    WaveSettings,
};
pub use caisse_engine::store::sealing::MasterKey;

/// The compiled-in defaults: the commented file at the repository's root.
pub const DEFAULTS: &str = include_str!("../../caisse.default.toml");

/// Webhook attempts stop after this many waits, whatever the schedule says (the default has nine).
pub const MAX_RETRY_WAITS: usize = 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Environment {
    Sandbox,
    Production,
}

impl Environment {
    pub fn as_str(self) -> &'static str {
        match self {
            Environment::Sandbox => "sandbox",
            Environment::Production => "production",
        }
    }

    /// Secret keys of this environment start with this (docs/api.md § Environments and keys).
    pub fn key_prefix(self) -> &'static str {
        match self {
            Environment::Sandbox => "sk_test_",
            Environment::Production => "sk_live_",
        }
    }

    fn parse(text: &str) -> Option<Environment> {
        match text {
            "sandbox" => Some(Environment::Sandbox),
            "production" => Some(Environment::Production),
            _ => None,
        }
    }
}

/// What a provider can be asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    #[serde(rename = "paiement")]
    Payment,
    #[serde(rename = "remboursement")]
    Refund,
    #[serde(rename = "retrait")]
    Payout,
}

impl Operation {
    /// The operation as the API names it (`paiement`, `remboursement`, `retrait`).
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Payment => "paiement",
            Operation::Refund => "remboursement",
            Operation::Payout => "retrait",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderSettings {
    pub code: ProviderCode,
    pub name: String,
    pub countries: Vec<String>,
    pub currencies: Vec<Currency>,
    pub operations: Vec<Operation>,
    pub fee: FeeRule,
    /// Amount bounds per currency, in the smallest unit, inclusive.
    pub limits: BTreeMap<Currency, (Amount, Amount)>,
    /// The adapter this fournisseur goes to for the countries it serves (`pays`), unless a route says
    /// otherwise; `None`: the sandbox simulator in the sandbox environment, nothing (inactive) in production.
    pub adapter: Option<String>,
    /// Per-country overrides, first match wins.
    pub routes: Vec<Route>,
}

/// The resolved, checked settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    /// The store: embedded under `data_dir`, or PostgreSQL (`store`).
    pub store: StoreLocation,
    /// This node's name among the nodes of a cluster (`node_id`; default: the host name and the port).
    pub node_id: String,
    /// Where the other nodes of a cluster reach this one's API (`advertise_url`; default: the listen address).
    pub advertise_url: String,
    pub environment: Environment,
    pub webhook_retry_schedule_ms: Vec<u64>,
    pub webhook_extra_ca: Option<PathBuf>,
    pub payment_ttl_ms: u64,
    pub log: String,
    pub http_workers: usize,
    pub rate_limit_per_s: u32,
    /// The embedded store's cache, in bytes (`store_cache_mib`).
    pub store_cache_bytes: u64,
    pub sandbox_simulator: bool,
    pub sandbox_delay_ms: u64,
    pub sandbox_secret: String,
    /// Chaos modes of the simulator for records whose metadata does not choose (`sandbox.chaos`).
    pub sandbox_chaos: Chaos,
    pub providers: Vec<ProviderSettings>,
    /// Base of every URL given to a provider (callbacks, return pages); empty when not set.
    pub public_url: String,
    /// The adapters that have their credentials.
    pub adapters: AdapterSettings,
    pub log_format: LogFormat,
    /// Where the admin API listens; it starts only with a token.
    pub admin_listen: SocketAddr,
    pub admin_token: Option<Secret>,
    /// Seals the merchants' secret keys at rest; required in production.
    pub master_key: Option<MasterKey>,
    /// Proxies whose `X-Forwarded-For` names the client.
    pub trusted_proxies: Vec<Cidr>,
    /// How long a rolled secret key still authenticates API calls (0: it stops at once).
    pub key_roll_grace_ms: u64,
    /// API requests failing authentication one address may make per minute (0: no limit).
    pub failed_auth_per_minute: u32,
    /// When the ledger is audited in the background (`audit_checkpoint_every`, `audit_full_every`).
    pub audits: AuditSchedule,
    /// How long delivered notifications are kept (`notification_retention`); `None`: forever.
    pub notification_retention: Option<Duration>,
}

/// Where the service keeps its data (`store`).
#[derive(Debug, Clone)]
pub enum StoreLocation {
    /// The embedded store under `data_dir` (fjall).
    Embedded,
    /// A PostgreSQL database, by URL (which may carry a password, hence a secret).
    Postgres(Secret),
}

impl StoreLocation {
    fn parse(text: &str) -> Result<StoreLocation, ConfigError> {
        let text = text.trim();
        // "sled" is the embedded store's name in the service's contract, and was its engine before fjall: it
        // names the embedded store still. A data directory sled made is refused when the store opens, with the
        // way to move it (`caisse upgrade-store`).
        if text == "fjall" || text == "sled" {
            Ok(StoreLocation::Embedded)
        } else if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            Ok(StoreLocation::Postgres(Secret::new(text.to_owned())))
        } else {
            // The text may be a URL with a password typed wrong: not repeated.
            Err(bad("store", "neither \"fjall\" nor a postgres:// or postgresql:// URL"))
        }
    }
}

/// This machine's name, for the default node id.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty() && name.chars().all(|c| c.is_ascii_graphic()))
        .unwrap_or_else(|| "caisse".into())
}

/// How log lines are written (`log_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// Why a production server does not start without a master key, and what to do.
pub const MASTER_KEY_MISSING: &str = "production seals the merchants' secret keys under a master key: run `caisse \
     keygen` and give its output through master_key_file (CAISSE_MASTER_KEY_FILE) or CAISSE_MASTER_KEY";

/// The master key of [`Settings::for_tests`].
pub const TEST_MASTER_KEY: &str = "dGVzdHMtb25seS1tYXN0ZXIta2V5LTMyLWJ5dGVzISE=";

/// A master key as `caisse keygen` prints it: 32 bytes in standard base64.
fn parse_master_key(text: &str) -> Result<MasterKey, ConfigError> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|_| bad("master_key", "not base64 (`caisse keygen` prints one)"))?;
    let bytes: [u8; 32] = bytes
        .try_into()
        .map_err(|b: Vec<u8>| bad("master_key", format!("{} bytes; a master key is 32 (`caisse keygen`)", b.len())))?;
    Ok(MasterKey::from_bytes(bytes))
}

/// Shortest admin token accepted: a guessable one would open every merchant's account.
pub const ADMIN_TOKEN_MIN_LEN: usize = 32;

/// One source's values, each optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Layer {
    listen: Option<String>,
    data_dir: Option<String>,
    store: Option<String>,
    node_id: Option<String>,
    advertise_url: Option<String>,
    environment: Option<String>,
    webhook_retry_schedule: Option<String>,
    webhook_extra_ca: Option<String>,
    payment_ttl: Option<String>,
    log: Option<String>,
    http_workers: Option<i64>,
    rate_limit_per_s: Option<i64>,
    store_cache_mib: Option<i64>,
    sandbox: Option<SandboxLayer>,
    providers: Option<Vec<ProviderLayer>>,
    public_url: Option<String>,
    adapters: Option<adapters::AdaptersLayer>,
    log_format: Option<String>,
    admin_listen: Option<String>,
    /// Only from the environment (`CAISSE_ADMIN_TOKEN`): a token belongs in a file or the environment, not in
    /// a configuration file that is copied around.
    #[serde(skip)]
    admin_token: Option<String>,
    admin_token_file: Option<String>,
    /// Only from the environment (`CAISSE_MASTER_KEY`) or a file, for the same reason.
    #[serde(skip)]
    master_key: Option<String>,
    master_key_file: Option<String>,
    trusted_proxies: Option<Vec<String>>,
    key_roll_grace: Option<String>,
    failed_auth_per_minute: Option<i64>,
    audit_checkpoint_every: Option<String>,
    audit_full_every: Option<String>,
    notification_retention: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SandboxLayer {
    simulator: Option<bool>,
    delay_ms: Option<i64>,
    secret: Option<String>,
    chaos: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProviderLayer {
    code: String,
    #[serde(rename = "nom")]
    name: String,
    #[serde(rename = "pays")]
    countries: Vec<String>,
    #[serde(rename = "devises")]
    currencies: Vec<String>,
    operations: Vec<Operation>,
    #[serde(rename = "frais")]
    fee: FeeLayer,
    #[serde(rename = "limites")]
    limits: BTreeMap<String, (i64, i64)>,
    adapter: Option<String>,
    #[serde(default)]
    routes: Vec<adapters::RouteLayer>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
struct FeeLayer {
    #[serde(rename = "pourcentage_bps")]
    percentage_bps: u32,
    #[serde(rename = "fixe")]
    fixed: i64,
}

/// A setting with a bad value, named.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("setting `{setting}`: {reason}")]
pub struct ConfigError {
    pub setting: String,
    pub reason: String,
}

/// `public_url` is an origin, `scheme://host[:port]`: every path Caisse gives out (callbacks, return pages,
/// payment links and the pages' own links) starts at the root of that host, so a path in it would be dropped
/// by some and kept by others.
fn check_public_url(url: &str) -> Result<(), ConfigError> {
    if url.is_empty() {
        return Ok(());
    }
    let Some(rest) = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://")) else {
        return Err(bad("public_url", format!("`{url}` is not an http(s) URL (a lowercase http:// or https://)")));
    };
    let not_origin = || {
        bad(
            "public_url",
            format!("`{url}` is not an origin: give scheme://host[:port] only, Caisse is served at its host's root"),
        )
    };
    // Printable ASCII only, as every URL built on it must be (a provider's return URL, a link's address).
    if !url.bytes().all(|b| b.is_ascii_graphic()) || rest.contains(['/', '\\', '?', '#', '@']) {
        return Err(not_origin());
    }
    // `host`, `host:port` or `[v6]:port`, with a non-empty host and a port that is a port.
    let (host, port) = match rest.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(':') && (!host.starts_with('[') || host.ends_with(']')) => {
            (host, Some(port))
        }
        _ => (rest, None),
    };
    let port_ok = match port {
        None => true,
        Some(p) => p.bytes().all(|b| b.is_ascii_digit()) && p.parse::<u16>().is_ok(),
    };
    if host.is_empty() || !port_ok {
        return Err(not_origin());
    }
    Ok(())
}

fn bad(setting: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError { setting: setting.into(), reason: reason.into() }
}

impl Layer {
    /// Parses a TOML source; `origin` names it in errors.
    pub fn from_toml(text: &str, origin: &str) -> Result<Layer, ConfigError> {
        toml::from_str(text).map_err(|e| bad(origin, e.message().to_owned() + &span_hint(text, e.message(), e.span())))
    }

    /// Reads the `CAISSE_*` variables through `get` (the process environment in production, a map in tests).
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Layer, ConfigError> {
        let int = |name: &str| -> Result<Option<i64>, ConfigError> {
            get(name)
                .map(|v| v.trim().parse::<i64>().map_err(|_| bad(name, format!("`{v}` is not a whole number"))))
                .transpose()
        };
        let simulator = match get("CAISSE_SANDBOX_SIMULATOR") {
            None => None,
            Some(v) => match v.as_str() {
                "true" | "1" => Some(true),
                "false" | "0" => Some(false),
                _ => return Err(bad("CAISSE_SANDBOX_SIMULATOR", format!("`{v}` is not true or false"))),
            },
        };
        let delay_ms = int("CAISSE_SANDBOX_DELAY_MS")?;
        let secret = get("CAISSE_SANDBOX_SECRET");
        let chaos = get("CAISSE_SANDBOX_CHAOS");
        let any = simulator.is_some() || delay_ms.is_some() || secret.is_some() || chaos.is_some();
        let sandbox = any.then_some(SandboxLayer { simulator, delay_ms, secret, chaos });
        Ok(Layer {
            listen: get("CAISSE_LISTEN"),
            data_dir: get("CAISSE_DATA_DIR"),
            store: get("CAISSE_STORE"),
            node_id: get("CAISSE_NODE_ID"),
            advertise_url: get("CAISSE_ADVERTISE_URL"),
            environment: get("CAISSE_ENVIRONMENT"),
            webhook_retry_schedule: get("CAISSE_WEBHOOK_RETRY_SCHEDULE"),
            webhook_extra_ca: get("CAISSE_WEBHOOK_EXTRA_CA"),
            payment_ttl: get("CAISSE_PAYMENT_TTL"),
            log: get("CAISSE_LOG"),
            http_workers: int("CAISSE_HTTP_WORKERS")?,
            rate_limit_per_s: int("CAISSE_RATE_LIMIT_PER_S")?,
            store_cache_mib: int("CAISSE_STORE_CACHE_MIB")?,
            sandbox,
            providers: None,
            public_url: get("CAISSE_PUBLIC_URL"),
            adapters: adapters::AdaptersLayer::from_env(&get),
            log_format: get("CAISSE_LOG_FORMAT"),
            admin_listen: get("CAISSE_ADMIN_LISTEN"),
            admin_token: get("CAISSE_ADMIN_TOKEN"),
            admin_token_file: get("CAISSE_ADMIN_TOKEN_FILE"),
            master_key: get("CAISSE_MASTER_KEY"),
            master_key_file: get("CAISSE_MASTER_KEY_FILE"),
            key_roll_grace: get("CAISSE_KEY_ROLL_GRACE"),
            failed_auth_per_minute: int("CAISSE_FAILED_AUTH_PER_MINUTE")?,
            audit_checkpoint_every: get("CAISSE_AUDIT_CHECKPOINT_EVERY"),
            audit_full_every: get("CAISSE_AUDIT_FULL_EVERY"),
            notification_retention: get("CAISSE_NOTIFICATION_RETENTION"),
            trusted_proxies: get("CAISSE_TRUSTED_PROXIES")
                .map(|v| v.split(',').map(str::trim).filter(|p| !p.is_empty()).map(str::to_owned).collect()),
        })
    }

    /// Command-line flags of `caisse serve`.
    pub fn from_flags(listen: Option<String>, data_dir: Option<PathBuf>, environment: Option<String>) -> Layer {
        Layer { listen, data_dir: data_dir.map(|d| d.to_string_lossy().into_owned()), environment, ..Layer::default() }
    }

    /// `other`'s values win over `self`'s. `other` is taken apart field by field, so a new setting that is
    /// not merged here does not compile.
    fn merge(mut self, other: Layer) -> Layer {
        let Layer {
            listen,
            data_dir,
            store,
            node_id,
            advertise_url,
            environment,
            webhook_retry_schedule,
            webhook_extra_ca,
            payment_ttl,
            log,
            http_workers,
            rate_limit_per_s,
            store_cache_mib,
            sandbox,
            providers,
            public_url,
            adapters,
            log_format,
            admin_listen,
            admin_token,
            admin_token_file,
            master_key,
            master_key_file,
            trusted_proxies,
            key_roll_grace,
            failed_auth_per_minute,
            audit_checkpoint_every,
            audit_full_every,
            notification_retention,
        } = other;
        fn win<T>(mine: &mut Option<T>, theirs: Option<T>) {
            if theirs.is_some() {
                *mine = theirs;
            }
        }
        win(&mut self.listen, listen);
        win(&mut self.data_dir, data_dir);
        win(&mut self.store, store);
        win(&mut self.node_id, node_id);
        win(&mut self.advertise_url, advertise_url);
        win(&mut self.environment, environment);
        win(&mut self.webhook_retry_schedule, webhook_retry_schedule);
        win(&mut self.webhook_extra_ca, webhook_extra_ca);
        win(&mut self.payment_ttl, payment_ttl);
        win(&mut self.log, log);
        win(&mut self.http_workers, http_workers);
        win(&mut self.rate_limit_per_s, rate_limit_per_s);
        win(&mut self.store_cache_mib, store_cache_mib);
        win(&mut self.providers, providers);
        win(&mut self.public_url, public_url);
        win(&mut self.log_format, log_format);
        win(&mut self.admin_listen, admin_listen);
        // A secret given by a later source replaces an earlier one whichever way each gives it, inline or in a
        // file: an environment's CAISSE_MASTER_KEY overrides the file's master_key_file.
        // An empty value (a variable set to nothing) gives nothing.
        fn win_secret(
            (mine, mine_file): (&mut Option<String>, &mut Option<String>),
            (theirs, theirs_file): (Option<String>, Option<String>),
        ) {
            let (theirs, theirs_file) = (theirs.filter(|v| !v.is_empty()), theirs_file.filter(|v| !v.is_empty()));
            if theirs.is_some() || theirs_file.is_some() {
                *mine = theirs;
                *mine_file = theirs_file;
            }
        }
        win_secret((&mut self.admin_token, &mut self.admin_token_file), (admin_token, admin_token_file));
        win_secret((&mut self.master_key, &mut self.master_key_file), (master_key, master_key_file));
        win(&mut self.trusted_proxies, trusted_proxies);
        win(&mut self.key_roll_grace, key_roll_grace);
        win(&mut self.failed_auth_per_minute, failed_auth_per_minute);
        win(&mut self.audit_checkpoint_every, audit_checkpoint_every);
        win(&mut self.audit_full_every, audit_full_every);
        win(&mut self.notification_retention, notification_retention);
        if let Some(theirs) = adapters {
            self.adapters = Some(self.adapters.take().unwrap_or_default().merge(theirs));
        }
        if let Some(SandboxLayer { simulator, delay_ms, secret, chaos }) = sandbox {
            let mine = self.sandbox.get_or_insert_with(SandboxLayer::default);
            win(&mut mine.simulator, simulator);
            win(&mut mine.delay_ms, delay_ms);
            win(&mut mine.secret, secret);
            win(&mut mine.chaos, chaos);
        }
        self
    }
}

fn span_hint(text: &str, message: &str, span: Option<std::ops::Range<usize>>) -> String {
    // toml points an unknown key at its whole table; the key's own line is more useful.
    let unknown = message.strip_prefix("unknown field `").and_then(|rest| rest.split('`').next());
    let line = match (unknown, span) {
        (Some(key), _) => text.lines().position(|l| l.trim_start().starts_with(key)).map(|i| i + 1),
        (None, Some(range)) => Some(text[..range.start.min(text.len())].matches('\n').count() + 1),
        (None, None) => None,
    };
    line.map(|n| format!(" (line {n})")).unwrap_or_default()
}

/// Parses "5s,5m,30m" into milliseconds.
pub fn parse_schedule(text: &str) -> Result<Vec<u64>, String> {
    let waits: Vec<u64> = text
        .split(',')
        .map(|part| parse_duration_ms(part.trim()).map_err(|e| format!("`{}`: {e}", part.trim())))
        .collect::<Result<_, _>>()?;
    if waits.len() > MAX_RETRY_WAITS {
        return Err(format!("at most {MAX_RETRY_WAITS} waits"));
    }
    Ok(waits)
}

impl Settings {
    /// Defaults, then `file` (if any), then the environment, then flags.
    pub fn load(
        file: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
        flags: Layer,
    ) -> Result<Settings, ConfigError> {
        let mut layer = Layer::from_toml(DEFAULTS, "caisse.default.toml")?;
        let file = match file {
            Some(path) => Some(path.to_path_buf()),
            None => Some(PathBuf::from("caisse.toml")).filter(|p| p.exists()),
        };
        if let Some(path) = file {
            let origin = path.display().to_string();
            let text = std::fs::read_to_string(&path).map_err(|e| bad(&origin, format!("cannot read: {e}")))?;
            layer = layer.merge(Layer::from_toml(&text, &origin)?);
        }
        layer = layer.merge(Layer::from_env(env)?).merge(flags);
        Settings::resolve(layer)
    }

    /// Checks every value; the first bad one stops everything, named.
    pub fn resolve(layer: Layer) -> Result<Settings, ConfigError> {
        let need = |v: Option<String>, name: &str| v.ok_or_else(|| bad(name, "missing"));
        let listen_text = need(layer.listen, "listen")?;
        let listen: SocketAddr =
            listen_text.parse().map_err(|_| bad("listen", format!("`{listen_text}` is not host:port")))?;
        let data_dir = PathBuf::from(need(layer.data_dir, "data_dir")?);
        let store = StoreLocation::parse(&need(layer.store, "store")?)?;
        let node_id = match layer.node_id.map(|n| n.trim().to_owned()).filter(|n| !n.is_empty()) {
            Some(id) if id.len() <= 200 && id.chars().all(|c| c.is_ascii_graphic()) => id,
            Some(_) => return Err(bad("node_id", "at most 200 printable ASCII characters, no spaces")),
            None => format!("{}:{}", host_name(), listen.port()),
        };
        let advertise_url = match layer.advertise_url.map(|u| u.trim().trim_end_matches('/').to_owned()) {
            Some(url) if url.is_empty() => format!("http://{listen}"),
            Some(url) if url.starts_with("http://") || url.starts_with("https://") => url,
            Some(url) => return Err(bad("advertise_url", format!("`{url}` is not an http(s) URL"))),
            None => format!("http://{listen}"),
        };
        let env_text = need(layer.environment, "environment")?;
        let environment = Environment::parse(&env_text)
            .ok_or_else(|| bad("environment", format!("`{env_text}` is neither sandbox nor production")))?;
        let schedule = need(layer.webhook_retry_schedule, "webhook_retry_schedule")?;
        let webhook_retry_schedule_ms = parse_schedule(&schedule).map_err(|e| bad("webhook_retry_schedule", e))?;
        let webhook_extra_ca = layer.webhook_extra_ca.filter(|p| !p.is_empty()).map(PathBuf::from);
        if let Some(path) = &webhook_extra_ca {
            if !path.is_file() {
                return Err(bad("webhook_extra_ca", format!("{} is not a readable file", path.display())));
            }
        }
        let ttl = need(layer.payment_ttl, "payment_ttl")?;
        let payment_ttl_ms = parse_duration_ms(&ttl).map_err(|e| bad("payment_ttl", e.to_string()))?;
        if payment_ttl_ms == 0 {
            return Err(bad("payment_ttl", "must be longer than zero"));
        }
        let positive = |v: Option<i64>, name: &str, max: i64| -> Result<i64, ConfigError> {
            let v = v.ok_or_else(|| bad(name, "missing"))?;
            if (0..=max).contains(&v) {
                Ok(v)
            } else {
                Err(bad(name, format!("{v} is not between 0 and {max}")))
            }
        };
        let http_workers = positive(layer.http_workers, "http_workers", 256)? as usize;
        let rate_limit_per_s = positive(layer.rate_limit_per_s, "rate_limit_per_s", 1_000_000)? as u32;
        let store_cache_mib = positive(layer.store_cache_mib, "store_cache_mib", 65_536)? as u64;
        if store_cache_mib == 0 {
            return Err(bad("store_cache_mib", "must be at least 1"));
        }
        let sandbox = layer.sandbox.unwrap_or_default();
        let sandbox_delay_ms = positive(sandbox.delay_ms, "sandbox.delay_ms", 3_600_000)? as u64;
        let sandbox_simulator = environment == Environment::Sandbox || sandbox.simulator.unwrap_or(false);
        let sandbox_secret =
            sandbox.secret.filter(|s| !s.is_empty()).unwrap_or_else(|| caisse_engine::domain::ids::random_base62(40));
        let sandbox_chaos =
            Chaos::parse(sandbox.chaos.as_deref().unwrap_or("")).map_err(|e| bad("sandbox.chaos", e))?;
        let providers = layer
            .providers
            .unwrap_or_default()
            .into_iter()
            .enumerate()
            .map(|(i, p)| resolve_provider(i, p))
            .collect::<Result<Vec<_>, _>>()?;
        let mut seen = std::collections::HashSet::new();
        if let Some(dup) = providers.iter().find(|p| !seen.insert(p.code.clone())) {
            return Err(bad("providers", format!("`{}` is listed twice", dup.code)));
        }
        let public_url = layer.public_url.unwrap_or_default().trim_end_matches('/').to_owned();
        check_public_url(&public_url)?;
        let adapters = adapters::resolve(layer.adapters, environment)?;
        let orange_limit =
            crate::providers::orange_money::URL_LIMIT - crate::providers::orange_money::NOTIFY_URL_SUFFIX;
        if adapters.orange_money.is_some() && public_url.len() > orange_limit {
            return Err(bad(
                "public_url",
                format!(
                    "`{public_url}` is {} characters; with adapters.orange_money it may have at most {orange_limit}, \
                     since Orange refuses notification URLs over {} characters",
                    public_url.len(),
                    crate::providers::orange_money::URL_LIMIT
                ),
            ));
        }
        let log_format = match layer.log_format.as_deref().unwrap_or("text") {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            other => return Err(bad("log_format", format!("`{other}` is neither text nor json"))),
        };
        let admin_text = need(layer.admin_listen, "admin_listen")?;
        let admin_listen =
            admin_text.parse().map_err(|_| bad("admin_listen", format!("`{admin_text}` is not host:port")))?;
        let admin_token = adapters::secret("admin_token", layer.admin_token, layer.admin_token_file)?;
        if admin_token.as_ref().is_some_and(|t| t.expose().len() < ADMIN_TOKEN_MIN_LEN) {
            return Err(bad(
                "admin_token",
                format!("at least {ADMIN_TOKEN_MIN_LEN} characters (`caisse keygen` makes one)"),
            ));
        }
        let master_key = adapters::secret("master_key", layer.master_key, layer.master_key_file)?
            .map(|text| parse_master_key(text.expose()))
            .transpose()?;
        if environment == Environment::Production && master_key.is_none() {
            return Err(bad("master_key", MASTER_KEY_MISSING));
        }
        let trusted_proxies = layer
            .trusted_proxies
            .unwrap_or_default()
            .iter()
            .map(|p| Cidr::parse(p).map_err(|e| bad("trusted_proxies", e)))
            .collect::<Result<Vec<_>, _>>()?;
        let grace = need(layer.key_roll_grace, "key_roll_grace")?;
        let key_roll_grace_ms = match grace.trim() {
            "0" => 0,
            text => parse_duration_ms(text).map_err(|e| bad("key_roll_grace", e.to_string()))?,
        };
        let failed_auth_per_minute =
            positive(layer.failed_auth_per_minute, "failed_auth_per_minute", 1_000_000)? as u32;
        // Zero in any form turns an audit off; a few milliseconds would run audits back to back.
        let every = |v: Option<String>, name: &str| -> Result<Option<Duration>, ConfigError> {
            let text = need(v, name)?;
            let ms = match text.trim() {
                "0" => 0,
                text => parse_duration_ms(text).map_err(|e| bad(name, e.to_string()))?,
            };
            match ms {
                0 => Ok(None),
                1..=999 => Err(bad(name, format!("`{text}` is under a second; give at least 1s, or 0 for never"))),
                ms => Ok(Some(Duration::from_millis(ms))),
            }
        };
        let retention_text = need(layer.notification_retention, "notification_retention")?;
        let notification_retention = match retention_text.trim() {
            "0" => None,
            text => match parse_duration_ms(text).map_err(|e| bad("notification_retention", e.to_string()))? {
                0 => None,
                ms if ms < 60 * 60 * 1000 => {
                    return Err(bad(
                        "notification_retention",
                        format!(
                            "`{text}` is under an hour; merchants read their notifications for days (0 keeps them)"
                        ),
                    ))
                }
                ms => Some(Duration::from_millis(ms)),
            },
        };
        let audits = AuditSchedule {
            since_checkpoints_every: every(layer.audit_checkpoint_every, "audit_checkpoint_every")?,
            full_every: every(layer.audit_full_every, "audit_full_every")?,
        };
        Ok(Settings {
            listen,
            data_dir,
            store,
            node_id,
            advertise_url,
            environment,
            webhook_retry_schedule_ms,
            webhook_extra_ca,
            payment_ttl_ms,
            log: {
                // Its directives as the logger reads them (spaces around commas dropped), checked here, where a
                // bad value stops the start naming the setting, rather than replaced by `info` later.
                let log = need(layer.log, "log")?;
                let log = log.split(',').map(str::trim).filter(|d| !d.is_empty()).collect::<Vec<_>>().join(",");
                tracing_subscriber::EnvFilter::try_new(&log).map_err(|e| bad("log", e.to_string()))?;
                log
            },
            http_workers,
            rate_limit_per_s,
            store_cache_bytes: store_cache_mib * 1024 * 1024,
            sandbox_simulator,
            sandbox_delay_ms,
            sandbox_secret,
            sandbox_chaos,
            providers,
            public_url,
            adapters,
            log_format,
            admin_listen,
            admin_token,
            master_key,
            trusted_proxies,
            key_roll_grace_ms,
            failed_auth_per_minute,
            audits,
            notification_retention,
        })
    }

    /// Settings for tests: defaults with the data under `data_dir`, on a free loopback port.
    pub fn for_tests(data_dir: &Path) -> Result<Settings, ConfigError> {
        let mut layer = Layer::from_toml(DEFAULTS, "caisse.default.toml")?;
        layer.listen = Some("127.0.0.1:0".into());
        layer.data_dir = Some(data_dir.to_string_lossy().into_owned());
        layer.log = Some("warn".into());
        layer.admin_listen = Some("127.0.0.1:0".into());
        // Tests seal keys like production does (a fixed key: what it protects lives in a temporary directory).
        layer.master_key = Some(TEST_MASTER_KEY.into());
        Settings::resolve(layer)
    }

    pub fn provider(&self, code: &str) -> Option<&ProviderSettings> {
        self.providers.iter().find(|p| p.code.as_str() == code)
    }
}

fn resolve_provider(index: usize, p: ProviderLayer) -> Result<ProviderSettings, ConfigError> {
    let name = |field: &str| format!("providers[{index}].{field}");
    let code = ProviderCode::parse(&p.code).map_err(|e| bad(name("code"), e.to_string()))?;
    let currencies = p
        .currencies
        .iter()
        .map(|d| Currency::parse(d).map_err(|e| bad(name("devises"), e.to_string())))
        .collect::<Result<Vec<_>, _>>()?;
    if currencies.is_empty() {
        return Err(bad(name("devises"), "at least one currency"));
    }
    let fixed = Amount::new(p.fee.fixed).map_err(|e| bad(name("frais.fixe"), e.to_string()))?;
    let fee = FeeRule::new(p.fee.percentage_bps, fixed).map_err(|e| bad(name("frais"), e.to_string()))?;
    let mut limits = BTreeMap::new();
    for (code_text, (min, max)) in &p.limits {
        let currency = Currency::parse(code_text).map_err(|e| bad(name("limites"), e.to_string()))?;
        let min_amount = Amount::positive(*min).map_err(|e| bad(name("limites"), format!("{code_text} min: {e}")))?;
        let max_amount = Amount::positive(*max).map_err(|e| bad(name("limites"), format!("{code_text} max: {e}")))?;
        if min_amount > max_amount {
            return Err(bad(name("limites"), format!("{code_text}: min {min} is above max {max}")));
        }
        limits.insert(currency, (min_amount, max_amount));
    }
    if let Some(missing) = currencies.iter().find(|d| !limits.contains_key(d)) {
        return Err(bad(name("limites"), format!("no bounds for {missing}")));
    }
    Ok(ProviderSettings {
        code,
        name: p.name,
        countries: p.countries,
        currencies,
        operations: p.operations,
        fee,
        limits,
        adapter: p.adapter.map(|a| adapters::adapter_name(&name("adapter"), &a)).transpose()?,
        routes: adapters::resolve_routes(&name("routes"), p.routes)?,
    })
}

/// Time between two passes of the TTL sweep: a tenth of the TTL, between 100 ms and 5 s. A payment therefore
/// expires at most one pass after its TTL, which the sandbox simulator's `04` story waits for.
pub fn sweep_every_ms(ttl_ms: u64) -> u64 {
    (ttl_ms / 10).clamp(100, 5_000)
}

/// Sweep passes between two reconciliation passes: providers are asked about a stuck refund or payout at
/// most every ten passes (50 s with the default 30-minute TTL), not every five seconds.
pub const RECONCILE_EVERY_PASSES: u64 = 10;

/// Time between two reconciliation passes.
pub fn reconcile_every_ms(ttl_ms: u64) -> u64 {
    sweep_every_ms(ttl_ms) * RECONCILE_EVERY_PASSES
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: BTreeMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn the_default_file_resolves_to_the_documented_defaults() {
        let s = Settings::load(Some(Path::new("caisse.default.toml")), env(&[]), Layer::default()).unwrap();
        assert_eq!(s.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(s.data_dir, PathBuf::from("./data"));
        assert_eq!(s.environment, Environment::Sandbox);
        assert_eq!(s.webhook_retry_schedule_ms.len(), 9);
        assert_eq!(s.webhook_retry_schedule_ms[0], 5_000);
        assert_eq!(s.payment_ttl_ms, 30 * 60 * 1000);
        assert_eq!(s.sandbox_delay_ms, 2_000);
        assert!(s.sandbox_simulator);
        assert_eq!(s.sandbox_chaos, Chaos::OFF);
        assert_eq!(s.store_cache_bytes, 16 * 1024 * 1024);
        for code in ["mtn_momo", "orange_money", "moov_money", "wave"] {
            assert!(s.provider(code).is_some(), "{code}");
        }
    }

    #[test]
    fn environment_wins_over_file_and_flags_win_over_environment() {
        let s = Settings::load(
            None,
            env(&[
                ("CAISSE_LISTEN", "127.0.0.1:9000"),
                ("CAISSE_PAYMENT_TTL", "2s"),
                ("CAISSE_SANDBOX_DELAY_MS", "10"),
                ("CAISSE_STORE_CACHE_MIB", "16"),
            ]),
            Layer::from_flags(Some("127.0.0.1:9100".into()), None, None),
        )
        .unwrap();
        assert_eq!(s.listen.to_string(), "127.0.0.1:9100");
        assert_eq!(s.payment_ttl_ms, 2_000);
        assert_eq!(s.sandbox_delay_ms, 10);
        assert_eq!(s.store_cache_bytes, 16 * 1024 * 1024);
        let s = Settings::load(None, env(&[("CAISSE_LOG", " info, caisse=debug ,")]), Layer::default()).unwrap();
        assert_eq!(s.log, "info,caisse=debug", "directives as the logger reads them");
    }

    #[test]
    fn the_store_is_an_embedded_engine_or_a_postgres_url_and_a_bad_value_is_not_echoed() {
        let s = Settings::load(None, env(&[]), Layer::default()).unwrap();
        assert!(matches!(s.store, StoreLocation::Embedded));
        let s = Settings::load(None, env(&[("CAISSE_STORE", "sled")]), Layer::default()).unwrap();
        assert!(matches!(s.store, StoreLocation::Embedded), "the contract's name of the embedded store");
        let url = "postgres://caisse:s3cret@db.internal:5432/caisse";
        let s = Settings::load(None, env(&[("CAISSE_STORE", url)]), Layer::default()).unwrap();
        assert!(matches!(&s.store, StoreLocation::Postgres(u) if u.expose() == url));
        assert!(!format!("{:?}", s.store).contains("s3cret"));
        let err = Settings::load(None, env(&[("CAISSE_STORE", "mysql://root:s3cret@db/caisse")]), Layer::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("store") && !err.contains("s3cret"), "{err}");
    }

    #[test]
    fn sandbox_chaos_comes_from_the_file_or_the_environment() {
        let dir = tempfile::TempDir::new().unwrap();
        let file = dir.path().join("caisse.toml");
        std::fs::write(&file, "[sandbox]\nchaos = \"duplicate,late\"\n").unwrap();
        let s = Settings::load(Some(&file), env(&[]), Layer::default()).unwrap();
        assert_eq!(s.sandbox_chaos, Chaos::parse("late,duplicate").unwrap());
        let s = Settings::load(Some(&file), env(&[("CAISSE_SANDBOX_CHAOS", "all")]), Layer::default()).unwrap();
        assert_eq!(s.sandbox_chaos, Chaos::ALL);
    }

    #[test]
    fn a_bad_value_names_its_setting() {
        let cases = [
            ("CAISSE_ENVIRONMENT", "staging", "environment"),
            ("CAISSE_LISTEN", "nowhere", "listen"),
            ("CAISSE_WEBHOOK_RETRY_SCHEDULE", "5s,soon", "webhook_retry_schedule"),
            ("CAISSE_PAYMENT_TTL", "0s", "payment_ttl"),
            ("CAISSE_LOG", "caisse=verbose", "log"),
            ("CAISSE_LOG", "info, caisse=nonsense", "log"),
            ("CAISSE_SANDBOX_DELAY_MS", "-1", "sandbox.delay_ms"),
            ("CAISSE_SANDBOX_DELAY_MS", "abc", "CAISSE_SANDBOX_DELAY_MS"),
            ("CAISSE_SANDBOX_SIMULATOR", "maybe", "CAISSE_SANDBOX_SIMULATOR"),
            ("CAISSE_SANDBOX_CHAOS", "late,sometimes", "sandbox.chaos"),
            ("CAISSE_WEBHOOK_EXTRA_CA", "/nonexistent/ca.pem", "webhook_extra_ca"),
            ("CAISSE_STORE_CACHE_MIB", "0", "store_cache_mib"),
            ("CAISSE_STORE_CACHE_MIB", "100000", "store_cache_mib"),
            ("CAISSE_AUDIT_CHECKPOINT_EVERY", "often", "audit_checkpoint_every"),
            ("CAISSE_AUDIT_FULL_EVERY", "-1h", "audit_full_every"),
            ("CAISSE_AUDIT_CHECKPOINT_EVERY", "10ms", "audit_checkpoint_every"),
            ("CAISSE_NOTIFICATION_RETENTION", "5m", "notification_retention"),
            ("CAISSE_PUBLIC_URL", "pay.example.com", "public_url"),
            ("CAISSE_PUBLIC_URL", "https://example.com/caisse", "public_url"),
            ("CAISSE_PUBLIC_URL", "https://example.com?x=1", "public_url"),
            ("CAISSE_PUBLIC_URL", "https://user@example.com", "public_url"),
            ("CAISSE_PUBLIC_URL", "https://café.example", "public_url"),
            ("CAISSE_PUBLIC_URL", "https://:8443", "public_url"),
            ("CAISSE_PUBLIC_URL", "https://pay.example.com:99999", "public_url"),
            ("CAISSE_PUBLIC_URL", "https://pay.example.com:abc", "public_url"),
            ("CAISSE_PUBLIC_URL", "https://pay.example.com\\x", "public_url"),
            ("CAISSE_PUBLIC_URL", "HTTPS://pay.example.com", "public_url"),
        ];
        for (var, value, setting) in cases {
            let err = Settings::load(None, env(&[(var, value)]), Layer::default()).unwrap_err();
            assert_eq!(err.setting, setting, "{var}={value}: {err}");
        }
    }

    #[test]
    fn a_public_url_too_long_for_oranges_notification_urls_is_refused_with_orange_only() {
        let orange = [
            ("CAISSE_ADAPTERS_ORANGE_MONEY_CLIENT_ID", "id"),
            ("CAISSE_ADAPTERS_ORANGE_MONEY_CLIENT_SECRET", "secret"),
            ("CAISSE_ADAPTERS_ORANGE_MONEY_MERCHANT_KEY", "key"),
        ];
        let long = format!("https://{}.example.com", "a".repeat(40));
        let with = |url: &str, orange_too: bool| {
            let mut vars = vec![("CAISSE_PUBLIC_URL", url)];
            if orange_too {
                vars.extend(orange);
            }
            Settings::load(None, env(&vars), Layer::default())
        };
        let err = with(&long, true).unwrap_err();
        assert_eq!(err.setting, "public_url", "{err}");
        assert!(err.reason.contains("120"), "{err}");
        assert!(with(&long, false).is_ok(), "without Orange any origin will do");
        assert!(with("https://pay.example.com", true).is_ok());
    }

    #[test]
    fn public_url_is_an_origin_and_a_trailing_slash_is_dropped() {
        let s = Settings::load(None, env(&[("CAISSE_PUBLIC_URL", "https://pay.example.com:8443/")]), Layer::default());
        assert_eq!(s.unwrap().public_url, "https://pay.example.com:8443");
        for origin in ["http://[::1]:8080", "http://127.0.0.1:8080", "https://pay.example.com"] {
            let s = Settings::load(None, env(&[("CAISSE_PUBLIC_URL", origin)]), Layer::default());
            assert_eq!(s.map(|s| s.public_url).ok().as_deref(), Some(origin));
        }
        let err = Settings::load(None, env(&[("CAISSE_PUBLIC_URL", "https://example.com/caisse")]), Layer::default());
        assert!(err.unwrap_err().reason.contains("scheme://host[:port]"));
    }

    #[test]
    fn the_background_audits_default_to_a_minute_and_a_day_and_zero_turns_them_off() {
        let defaults = Settings::load(None, env(&[]), Layer::default()).unwrap();
        assert_eq!(defaults.audits, AuditSchedule::default());
        assert_eq!(defaults.audits.since_checkpoints_every, Some(Duration::from_secs(60)));
        let off = env(&[("CAISSE_AUDIT_CHECKPOINT_EVERY", "0"), ("CAISSE_AUDIT_FULL_EVERY", "0s")]);
        let off = Settings::load(None, off, Layer::default()).unwrap();
        assert_eq!(off.audits, AuditSchedule { since_checkpoints_every: None, full_every: None });
        assert_eq!(defaults.notification_retention, Some(Duration::from_secs(30 * 24 * 60 * 60)));
        let forever = Settings::load(None, env(&[("CAISSE_NOTIFICATION_RETENTION", "0")]), Layer::default());
        assert_eq!(forever.unwrap().notification_retention, None);
    }

    #[test]
    fn a_bad_file_names_the_file_and_the_line() {
        let err = Layer::from_toml("listen = \"a\"\nnope = 1\n", "caisse.toml").unwrap_err();
        assert_eq!(err.setting, "caisse.toml");
        assert!(err.reason.contains("nope") && err.reason.contains("line 2"), "{err}");
    }

    #[test]
    fn production_turns_the_simulator_off_unless_asked() {
        let production = ("CAISSE_ENVIRONMENT", "production");
        let key = ("CAISSE_MASTER_KEY", TEST_MASTER_KEY);
        let s = Settings::load(None, env(&[production, key]), Layer::default()).unwrap();
        assert!(!s.sandbox_simulator);
        let s = Settings::load(None, env(&[production, key, ("CAISSE_SANDBOX_SIMULATOR", "true")]), Layer::default())
            .unwrap();
        assert!(s.sandbox_simulator);
    }

    /// A secret from a later source wins whichever way each source gives it; both ways in one source, or an
    /// empty file, are refused rather than one of them picked or the secret silently off.
    #[test]
    fn a_secret_from_a_later_source_wins_and_an_empty_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (from_file, from_env) = ("a-token-read-from-its-file-0123456789", "a-token-set-in-the-environment-012345");
        let token_file = dir.path().join("admin_token");
        std::fs::write(&token_file, format!("{from_file}\n")).unwrap();
        let config = dir.path().join("caisse.toml");
        std::fs::write(&config, format!("admin_token_file = {:?}\n", token_file.display().to_string())).unwrap();
        let s = Settings::load(Some(&config), env(&[]), Layer::default()).unwrap();
        assert_eq!(s.admin_token.as_ref().map(Secret::expose), Some(from_file));
        let s = Settings::load(Some(&config), env(&[("CAISSE_ADMIN_TOKEN", from_env)]), Layer::default()).unwrap();
        assert_eq!(s.admin_token.as_ref().map(Secret::expose), Some(from_env), "the environment wins over the file");
        let s = Settings::load(Some(&config), env(&[("CAISSE_ADMIN_TOKEN", "")]), Layer::default()).unwrap();
        assert_eq!(
            s.admin_token.as_ref().map(Secret::expose),
            Some(from_file),
            "a variable set to nothing gives nothing"
        );
        let path = token_file.display().to_string();
        let both = env(&[("CAISSE_ADMIN_TOKEN", from_env), ("CAISSE_ADMIN_TOKEN_FILE", &path)]);
        assert_eq!(Settings::load(None, both, Layer::default()).unwrap_err().setting, "admin_token");
        std::fs::write(&token_file, "\n").unwrap();
        let err = Settings::load(Some(&config), env(&[]), Layer::default()).unwrap_err();
        assert_eq!(err.setting, "admin_token_file");
        assert!(err.reason.contains("empty"), "{err}");
    }

    #[test]
    fn production_needs_a_master_key_of_32_bytes_and_proxies_are_cidr_blocks() {
        let production = ("CAISSE_ENVIRONMENT", "production");
        let err = Settings::load(None, env(&[production]), Layer::default()).unwrap_err();
        assert_eq!(err.setting, "master_key");
        assert!(err.reason.contains("caisse keygen"), "{err}");
        let err = Settings::load(None, env(&[production, ("CAISSE_MASTER_KEY", "c2hvcnQ=")]), Layer::default());
        assert!(err.unwrap_err().reason.contains("5 bytes"));
        let sandbox = Settings::load(None, env(&[]), Layer::default()).unwrap();
        assert!(sandbox.master_key.is_none() && sandbox.trusted_proxies.is_empty(), "optional in the sandbox");
        let proxies = env(&[("CAISSE_TRUSTED_PROXIES", "127.0.0.1, 10.0.0.0/8")]);
        assert_eq!(Settings::load(None, proxies, Layer::default()).unwrap().trusted_proxies.len(), 2);
        let bad = Settings::load(None, env(&[("CAISSE_TRUSTED_PROXIES", "10.0.0.0/40")]), Layer::default());
        assert_eq!(bad.unwrap_err().setting, "trusted_proxies");
        let short = Settings::load(None, env(&[("CAISSE_ADMIN_TOKEN", "short")]), Layer::default());
        assert_eq!(short.unwrap_err().setting, "admin_token");
    }
}
