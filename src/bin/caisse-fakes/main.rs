//! `caisse-fakes`: local fake servers of pawaPay (Merchant API v2), MTN MoMo (Open API) and Wave (Checkout and
//! Payout), following their
//! published protocols, so Caisse's adapters can be tested and a production-mode Caisse tried without
//! credentials. docs/fakes.md is the user's guide.
//!
//! ```text
//! caisse-fakes pawapay  --listen 127.0.0.1:0 [--token T] [--settle-ms 200]
//!                       [--deposit-callback-url U] [--payout-callback-url U] [--refund-callback-url U]
//! caisse-fakes mtn-momo --listen 127.0.0.1:0 [--subscription-key-collection K] [--subscription-key-disbursement K]
//!                       [--api-user U --api-key K]... [--target-environment sandbox] [--settle-ms 200]
//! caisse-fakes wave     --listen 127.0.0.1:0 [--api-key K] [--webhook-secret S] [--webhook-url U] [--settle-ms 200]
//! caisse-fakes cinetpay --listen 127.0.0.1:0 [--apikey K] [--site-id S] [--secret-key K]
//!                       [--transfer-login L] [--transfer-password P] [--settle-ms 200]
//! caisse-fakes orange-money --listen 127.0.0.1:0 [--client-id I] [--client-secret S] [--merchant-key K]
//!                       [--country dev]
//! ```
//!
//! The first line on stdout is exactly `listening on http://127.0.0.1:PORT`; logs go to stderr. The process
//! serves until it is killed.
//!
//! # Layout
//! - `main.rs`: flags, defaults, startup.
//! - `server.rs`: the one request handler, the shared state, the ticker that settles transactions.
//! - `common.rs`: clock, request log, the bounded transaction store, validators.
//! - `knobs.rs`: the behaviour switches and their checks.
//! - `control.rs`: the `/__fake/*` control API (requests, transactions, knobs, complete, clock).
//! - `callbacks.rs`: the bounded callback sender and the callback modes.
//! - `pawapay/`: the pawaPay v2 fake. `mtn/`: the MTN MoMo fake. `wave.rs`: the Wave fake. `cinetpay.rs`: the
//!   CinetPay fake. `orange.rs`: the Orange Money Web Payment fake.

mod callbacks;
mod cinetpay;
mod common;
mod control;
mod knobs;
mod mtn;
mod orange;
mod pawapay;
mod server;
mod wave;

use std::io::Write;
use std::process::ExitCode;
use std::sync::Mutex;

use actix_web::{web, App, HttpServer};
use clap::{Args, Parser, Subcommand};

use common::Clock;
use knobs::Knobs;
use server::{Fake, Provider, State};

pub const DEFAULT_PAWAPAY_TOKEN: &str = "fake-pawapay-token";
pub const DEFAULT_COLLECTION_KEY: &str = "fake-collection-subscription-key";
pub const DEFAULT_DISBURSEMENT_KEY: &str = "fake-disbursement-subscription-key";
pub const DEFAULT_API_USER: &str = "5f1f1b8e-6f0c-4d2a-9a57-0c5b6d7e8f90";
pub const DEFAULT_API_KEY: &str = "fake-api-key";
pub const DEFAULT_WAVE_API_KEY: &str = "wave_sn_prod_fake-api-key";
pub const DEFAULT_WAVE_WEBHOOK_SECRET: &str = "wave_sn_WHS_fake-webhook-secret";
pub const DEFAULT_CINETPAY_APIKEY: &str = "fake-cinetpay-apikey";
pub const DEFAULT_ORANGE_CLIENT_ID: &str = "fake-orange-client-id";
pub const DEFAULT_ORANGE_CLIENT_SECRET: &str = "fake-orange-client-secret";
pub const DEFAULT_ORANGE_MERCHANT_KEY: &str = "fake-orange-merchant-key";
pub const DEFAULT_CINETPAY_SITE_ID: &str = "105000000";
pub const DEFAULT_CINETPAY_SECRET_KEY: &str = "fake-cinetpay-secret-key";
pub const DEFAULT_CINETPAY_TRANSFER_LOGIN: &str = "fake-cinetpay-transfer-apikey";
pub const DEFAULT_CINETPAY_TRANSFER_PASSWORD: &str = "fake-cinetpay-transfer-password";
/// A transaction left alone settles after at most an hour, even with a large --settle-ms.
const SETTLE_MS_MAX: u64 = 3_600_000;

#[derive(Parser)]
#[command(name = "caisse-fakes", about = "Local fakes of pawaPay v2 and MTN MoMo Open API for testing Caisse")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The pawaPay Merchant API v2.
    Pawapay(PawapayArgs),
    /// The MTN MoMo Open API (collection and disbursement).
    #[command(name = "mtn-momo")]
    MtnMomo(MtnArgs),
    /// Wave's Checkout and Payout APIs, with a hosted payment page and signed webhooks.
    Wave(WaveArgs),
    /// CinetPay's Checkout v2 and Transfer API, with a hosted payment page and signed notifications.
    Cinetpay(CinetpayArgs),
    /// Orange Money Web Payment, with a hosted payment page and its unsigned notification.
    #[command(name = "orange-money")]
    OrangeMoney(OrangeArgs),
}

#[derive(Args)]
struct OrangeArgs {
    #[command(flatten)]
    common: Common,
    #[arg(long, default_value = DEFAULT_ORANGE_CLIENT_ID)]
    client_id: String,
    #[arg(long, default_value = DEFAULT_ORANGE_CLIENT_SECRET)]
    client_secret: String,
    #[arg(long, default_value = DEFAULT_ORANGE_MERCHANT_KEY)]
    merchant_key: String,
    /// The country path served (`dev`: Orange's sandbox, where the currency is OUV).
    #[arg(long, default_value = "dev")]
    country: String,
}

#[derive(Args)]
struct CinetpayArgs {
    #[command(flatten)]
    common: Common,
    #[arg(long, default_value = DEFAULT_CINETPAY_APIKEY)]
    apikey: String,
    #[arg(long, default_value = DEFAULT_CINETPAY_SITE_ID)]
    site_id: String,
    /// The key notifications' x-token is computed with.
    #[arg(long, default_value = DEFAULT_CINETPAY_SECRET_KEY)]
    secret_key: String,
    #[arg(long, default_value = DEFAULT_CINETPAY_TRANSFER_LOGIN)]
    transfer_login: String,
    #[arg(long, default_value = DEFAULT_CINETPAY_TRANSFER_PASSWORD)]
    transfer_password: String,
}

#[derive(Args)]
struct WaveArgs {
    #[command(flatten)]
    common: Common,
    /// The API key clients must send as `Authorization: Bearer <key>`.
    #[arg(long, default_value = DEFAULT_WAVE_API_KEY)]
    api_key: String,
    /// The secret webhooks are signed with.
    #[arg(long, default_value = DEFAULT_WAVE_WEBHOOK_SECRET)]
    webhook_secret: String,
    /// Where webhooks are POSTed (also settable with the knobs).
    #[arg(long)]
    webhook_url: Option<String>,
}

#[derive(Args)]
struct Common {
    /// Address to listen on; port 0 picks a free one (printed on the first line of stdout).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// How long a transaction takes to reach its final state, in milliseconds of the fake clock.
    #[arg(long, default_value_t = 200)]
    settle_ms: u64,
}

#[derive(Args)]
struct PawapayArgs {
    #[command(flatten)]
    common: Common,
    /// The API token clients must send as `Authorization: Bearer <token>`.
    #[arg(long, default_value = DEFAULT_PAWAPAY_TOKEN)]
    token: String,
    /// Where final deposit callbacks are POSTed (also settable with the knobs).
    #[arg(long)]
    deposit_callback_url: Option<String>,
    #[arg(long)]
    payout_callback_url: Option<String>,
    #[arg(long)]
    refund_callback_url: Option<String>,
}

#[derive(Args)]
struct MtnArgs {
    #[command(flatten)]
    common: Common,
    /// The collection product's Ocp-Apim-Subscription-Key.
    #[arg(long, default_value = DEFAULT_COLLECTION_KEY)]
    subscription_key_collection: String,
    /// The disbursement product's Ocp-Apim-Subscription-Key.
    #[arg(long, default_value = DEFAULT_DISBURSEMENT_KEY)]
    subscription_key_disbursement: String,
    /// API user (a UUID). Once: for both products; twice: collection's, then disbursement's.
    #[arg(long, num_args = 1)]
    api_user: Vec<String>,
    /// API key, paired with --api-user in the same order.
    #[arg(long, num_args = 1)]
    api_key: Vec<String>,
    /// The X-Target-Environment clients must send.
    #[arg(long, default_value = "sandbox")]
    target_environment: String,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let (common, provider, knobs) = match build(cli.command) {
        Ok(built) => built,
        Err(e) => {
            eprintln!("caisse-fakes: {e}");
            return ExitCode::from(2);
        }
    };
    match actix_web::rt::System::new().block_on(run(common, provider, knobs)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("caisse-fakes: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The provider's configuration and the knobs it starts with, from the flags.
fn build(command: Command) -> Result<(Common, Provider, Knobs), String> {
    let mut knobs = Knobs::default();
    let (common, provider) = match command {
        Command::Pawapay(args) => {
            let patch = serde_json::json!({
                "deposit_callback_url": args.deposit_callback_url,
                "payout_callback_url": args.payout_callback_url,
                "refund_callback_url": args.refund_callback_url,
            });
            let patch = serde_json::from_value(patch).map_err(|e| e.to_string())?;
            knobs.apply(patch)?;
            let signer = pawapay::signing::Signer::generate()?;
            (args.common, Provider::Pawapay(pawapay::Config { token: args.token, signer }))
        }
        Command::OrangeMoney(args) => {
            let config = orange::Config {
                client_id: args.client_id,
                client_secret: args.client_secret,
                merchant_key: args.merchant_key,
                country: args.country,
            };
            (args.common, Provider::Orange(config))
        }
        Command::Cinetpay(args) => {
            let config = cinetpay::Config {
                apikey: args.apikey,
                site_id: args.site_id,
                secret_key: args.secret_key,
                transfer_login: args.transfer_login,
                transfer_password: args.transfer_password,
            };
            (args.common, Provider::Cinetpay(config))
        }
        Command::Wave(args) => {
            let patch = serde_json::json!({ "webhook_url": args.webhook_url });
            knobs.apply(serde_json::from_value(patch).map_err(|e| e.to_string())?)?;
            (args.common, Provider::Wave(wave::Config { api_key: args.api_key, webhook_secret: args.webhook_secret }))
        }
        Command::MtnMomo(args) => {
            let users = pairs(&args.api_user, &args.api_key)?;
            let product = |key: String, user: &(String, String)| mtn::Product {
                subscription_key: key,
                users: vec![user.clone()],
            };
            let config = mtn::Config {
                collection: product(args.subscription_key_collection, &users.0),
                disbursement: product(args.subscription_key_disbursement, &users.1),
                target_environment: args.target_environment,
            };
            (args.common, Provider::Mtn(config))
        }
    };
    if common.settle_ms > SETTLE_MS_MAX {
        return Err(format!("--settle-ms must be at most {SETTLE_MS_MAX}"));
    }
    Ok((common, provider, knobs))
}

/// An API user and its key.
type Credentials = (String, String);

/// (collection's, disbursement's) API user and key from the repeated flags.
fn pairs(users: &[String], keys: &[String]) -> Result<(Credentials, Credentials), String> {
    if users.len() != keys.len() || users.len() > 2 {
        return Err("give --api-user and --api-key the same number of times: once (both products) or twice".into());
    }
    let pair = |i: usize| (users[i].clone(), keys[i].clone());
    Ok(match users.len() {
        0 => {
            let default = (DEFAULT_API_USER.to_owned(), DEFAULT_API_KEY.to_owned());
            (default.clone(), default)
        }
        1 => (pair(0), pair(0)),
        _ => (pair(0), pair(1)),
    })
}

async fn run(common: Common, provider: Provider, knobs: Knobs) -> std::io::Result<()> {
    let (sender, queue) = callbacks::channel();
    let state = State { knobs, ..State::default() };
    let fake = web::Data::new(Fake {
        clock: Clock::new(),
        settle_ms: common.settle_ms,
        provider,
        state: Mutex::new(state),
        callbacks: sender,
    });
    let app_fake = fake.clone();
    let server = HttpServer::new(move || {
        App::new()
            .app_data(app_fake.clone())
            .app_data(web::PayloadConfig::new(server::BODY_MAX))
            .default_service(web::to(server::handle))
    })
    .workers(2)
    .shutdown_timeout(1)
    .bind(&common.listen)?;
    let address = server
        .addrs()
        .first()
        .copied()
        .ok_or_else(|| std::io::Error::other(format!("could not listen on {}", common.listen)))?;
    let mut stdout = std::io::stdout();
    writeln!(stdout, "listening on http://{address}")?;
    stdout.flush()?;
    let name = match fake.provider {
        Provider::Pawapay(_) => "pawapay",
        Provider::Mtn(_) => "mtn-momo",
        Provider::Wave(_) => "wave",
        Provider::Cinetpay(_) => "cinetpay",
        Provider::Orange(_) => "orange-money",
    };
    tracing::info!(%address, settle_ms = common.settle_ms, "{name} fake serving");
    actix_web::rt::spawn(callbacks::run(queue));
    actix_web::rt::spawn(server::run_ticker(fake));
    server.run().await
}
