//! The `caisse` command: `caisse serve` runs the service, `caisse merchant create` adds a merchant account
//! (docs/api.md § Dashboard and operator commands).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use caisse::app::Application;
use caisse::config::{Layer, Settings};
use caisse::merchants::{self, Created, NewMerchant};
use caisse_engine::store::{SledStore, Store, StoreError};
use clap::{Parser, Subcommand};

/// mimalloc instead of glibc's malloc: the actor and HTTP threads allocate small, short-lived buffers all the
/// time, and glibc spent much of the webhook path's CPU consolidating and locking (docs/perf/history.md).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "caisse", version, about = "Payment collection and payout service")]
struct Cli {
    /// Configuration file (default: ./caisse.toml if it exists).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Where the embedded store keeps its files (CAISSE_DATA_DIR, default ./data).
    #[arg(long, global = true)]
    data_dir: Option<PathBuf>,
    /// sandbox or production (CAISSE_ENVIRONMENT, default sandbox).
    #[arg(long, global = true)]
    environment: Option<String>,
    #[command(subcommand)]
    command: Commands,
}

#[derive(Subcommand)]
enum Commands {
    /// Run the server.
    Serve {
        /// host:port to listen on (CAISSE_LISTEN, default 127.0.0.1:8080).
        #[arg(long)]
        listen: Option<String>,
    },
    /// Manage merchant accounts (the server must be stopped: the embedded store is single-process).
    Merchant {
        #[command(subcommand)]
        command: MerchantCommand,
    },
}

#[derive(Subcommand)]
enum MerchantCommand {
    /// Create a merchant and print its id, secret key and password.
    Create {
        #[arg(long)]
        name: String,
        #[arg(long)]
        email: String,
        /// Dashboard password (default: a random one, printed once).
        #[arg(long)]
        password: Option<String>,
        #[arg(long)]
        webhook_url: Option<String>,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let listen = match &cli.command {
        Commands::Serve { listen } => listen.clone(),
        Commands::Merchant { .. } => None,
    };
    let flags = Layer::from_flags(listen, cli.data_dir.clone(), cli.environment.clone());
    let settings = match Settings::load(cli.config.as_deref(), |k| std::env::var(k).ok(), flags) {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("caisse: bad configuration: {e}");
            return ExitCode::from(2);
        }
    };
    init_logs(&settings.log);
    let result = match cli.command {
        Commands::Serve { .. } => serve(settings),
        Commands::Merchant { command: MerchantCommand::Create { name, email, password, webhook_url, json } } => {
            create_merchant(settings, NewMerchant { name, email, password, webhook_url }, json)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("caisse: {message}");
            ExitCode::FAILURE
        }
    }
}

fn init_logs(filter: &str) {
    let filter =
        tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr).init();
}

fn serve(settings: Settings) -> Result<(), String> {
    actix_web::rt::System::new().block_on(async move {
        let env = settings.environment;
        let listen = settings.listen;
        let app = Application::build(settings).await.map_err(|e| e.to_string())?;
        if let Some(demo) = &app.demo {
            println!("First start: created a demo merchant. These are shown once; keep them.");
            print_created(demo, false);
        }
        tracing::info!(environment = env.as_str(), %listen, port = app.port(), "caisse is serving");
        app.run_until_stopped().await.map_err(|e| e.to_string())
    })
}

fn create_merchant(settings: Settings, new: NewMerchant, json: bool) -> Result<(), String> {
    let store: Arc<dyn Store> = match SledStore::open_with_cache(&settings.data_dir, settings.store_cache_bytes) {
        Ok(store) => Arc::new(store),
        Err(StoreError::Locked(_)) => {
            return Err(format!(
                "the store in {} is in use, most likely by a running `caisse serve`; stop it, then run this again",
                settings.data_dir.display()
            ))
        }
        Err(e) => return Err(format!("cannot open the store in {}: {e}", settings.data_dir.display())),
    };
    // No server runs (it would hold the store's lock), so the account goes straight to the store.
    let created = merchants::prepare(settings.environment, new).map_err(|e| e.to_string())?;
    let runtime = tokio::runtime::Builder::new_current_thread().build().map_err(|e| e.to_string())?;
    let ticket = store.put_merchant(created.merchant.clone(), None).map_err(|e| e.to_string())?;
    match runtime.block_on(ticket) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e.to_string()),
        Err(_) => return Err(StoreError::Closed.to_string()),
    }
    print_created(&created, json);
    Ok(())
}

fn print_created(created: &Created, json: bool) {
    let m = &created.merchant;
    if json {
        let value = serde_json::json!({
            "id": m.id.as_str(),
            "email": m.email,
            "password": created.password,
            "secret_key": m.secret_key,
            "webhook_url": m.webhook_url,
        });
        println!("{value}");
    } else {
        println!("merchant id:  {}", m.id);
        println!("e-mail:       {}", m.email);
        println!("password:     {}", created.password);
        println!("secret key:   {}", m.secret_key);
        if let Some(url) = &m.webhook_url {
            println!("webhook URL:  {url}");
        }
    }
}
