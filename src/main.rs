//! The `caisse` command: `caisse serve` runs the service, `caisse merchant create` adds a merchant account
//! (docs/api.md § Dashboard and operator commands).

use std::path::PathBuf;
use std::process::ExitCode;

use caisse::admin::client;
use caisse::app::Application;
use caisse::config::{Layer, LogFormat, Settings, StoreLocation};
use caisse::merchants::{Created, NewMerchant};
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
    /// Write a consistent copy of the store into DIR (absent or empty): through the running server's admin
    /// API when it answers, else on the store with the server stopped.
    Backup {
        #[arg(long)]
        to: PathBuf,
    },
    /// Audit the whole ledger: every balance recomputed from every ledger event, every snapshot and audit
    /// checkpoint compared. Through the running server's admin API when it answers, else on the store. Exits
    /// with 1 when a balance disagrees.
    Audit,
    /// Copy a backup into the (empty) data directory and audit it. The server must be stopped.
    Restore {
        #[arg(long)]
        from: PathBuf,
    },
    /// Move the embedded store from sled (the engine of stores made by earlier releases) to fjall. The server
    /// must be stopped. The old store is kept beside the data directory, under the same name ending in `.sled`.
    UpgradeStore,
    /// Print a new random secret: 32 bytes from the operating system's generator, base64. Use one as the admin
    /// token.
    Keygen,
    /// Manage merchant accounts: through the running server's admin API when it answers (the same admin
    /// token and admin_listen), else on the store (the server stopped).
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
    /// List merchants, newest first.
    List {
        /// One JSON object per line instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Suspend a merchant: its key answers 403 and its dashboard is closed; work in flight finishes.
    Suspend { id: String },
    /// Lift a merchant's suspension.
    Resume { id: String },
    /// Give a merchant a new generated dashboard password, printed once.
    ResetPassword { id: String },
}

fn main() -> ExitCode {
    // Everything this process creates (the store's files, the stamp, the log files) is its user's only.
    // SAFETY: umask only sets the process's file-creation mask; it cannot fail and touches no memory.
    unsafe {
        libc::umask(0o077);
    }
    let cli = Cli::parse();
    let listen = match &cli.command {
        Commands::Serve { listen } => listen.clone(),
        Commands::Merchant { .. }
        | Commands::Keygen
        | Commands::Backup { .. }
        | Commands::Restore { .. }
        | Commands::Audit
        | Commands::UpgradeStore => None,
    };
    if let Commands::Keygen = cli.command {
        println!("{}", keygen());
        return ExitCode::SUCCESS;
    }
    let flags = Layer::from_flags(listen, cli.data_dir.clone(), cli.environment.clone());
    let settings = match Settings::load(cli.config.as_deref(), |k| std::env::var(k).ok(), flags) {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("caisse: bad configuration: {e}");
            return ExitCode::from(2);
        }
    };
    init_logs(&settings.log, settings.log_format);
    let result = match cli.command {
        Commands::Serve { .. } => serve(settings),
        Commands::Merchant { command } => merchant(&settings, command),
        Commands::Keygen => Ok(()),
        Commands::Backup { to } => client::run(&settings, client::Command::Backup(to)).map(|values| {
            for value in values {
                println!("{value}");
            }
        }),
        Commands::Restore { from } => client::restore(&settings, &from).map(|value| println!("{value}")),
        Commands::Audit => return audit(&settings),
        Commands::UpgradeStore => client::upgrade_store(&settings).map(|value| println!("{value}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("caisse: {message}");
            ExitCode::FAILURE
        }
    }
}

/// `caisse audit`: prints what the audit found; exits 0 when it passed, 1 when the ledger disagrees, 2 when it
/// could not run.
fn audit(settings: &Settings) -> ExitCode {
    let values = match client::run(settings, client::Command::Audit) {
        Ok(values) => values,
        Err(message) => {
            eprintln!("caisse: the ledger audit could not run: {message}");
            return ExitCode::from(2);
        }
    };
    for value in &values {
        println!("{value}");
    }
    let said = |v: &serde_json::Value| v["error"].as_str().unwrap_or("no reason given").to_owned();
    match values.iter().find(|v| v["audit"] != "passed") {
        None => ExitCode::SUCCESS,
        Some(v) if v["audit"] == "failed" => {
            eprintln!("caisse: the ledger audit FAILED: {}", said(v));
            ExitCode::FAILURE
        }
        Some(v) => {
            eprintln!("caisse: the ledger audit could not run: {}", said(v));
            ExitCode::from(2)
        }
    }
}

/// 32 random bytes of the operating system's generator, in standard base64.
fn keygen() -> String {
    use base64::Engine as _;
    use rand::RngCore as _;
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Logs to stderr: readable lines, or one JSON object per line (`timestamp`, `level`, `target`, `message` and
/// the event's fields at the top level) for a log collector.
///
/// Libraries that log through the `log` crate are logged too (`init` installs the bridge): fjall says there
/// when it slows or halts commits and when a compaction fails, on threads of its own whose errors reach the
/// service no other way.
fn init_logs(filter: &str, format: LogFormat) {
    // The setting was checked when it was read (`Settings`), and the libraries' levels added to it are valid.
    let filter = tracing_subscriber::EnvFilter::try_new(log_filter(filter))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => {
            let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
            builder.with_ansi(ansi).init();
        }
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(false).with_span_list(false).init(),
    }
}

/// Libraries held to a level unless the filter names them: lsm-tree, under fjall, logs a line per tree at every
/// open; tokio-postgres logs every statement's parameters at `debug`, which hold what the store keeps
/// (notification bodies, sealed keys) and so must not follow a plain `debug`.
const LIBRARY_LEVELS: [(&str, &str); 2] = [("lsm_tree", "warn"), ("tokio_postgres", "info")];

/// The filter given (`log`, `CAISSE_LOG`), with [`LIBRARY_LEVELS`] added for the libraries it does not name.
fn log_filter(given: &str) -> String {
    let mut directives: Vec<String> =
        given.split(',').map(str::trim).filter(|d| !d.is_empty()).map(String::from).collect();
    for (target, level) in LIBRARY_LEVELS {
        if !given.contains(target) {
            directives.push(format!("{target}={level}"));
        }
    }
    directives.join(",")
}

fn serve(settings: Settings) -> Result<(), String> {
    actix_web::rt::System::new().block_on(async move {
        let env = settings.environment;
        let listen = settings.listen;
        let close_bound = match settings.store {
            StoreLocation::Embedded => STORE_CLOSE_BOUND,
            StoreLocation::Postgres(_) => CLUSTER_CLOSE_BOUND,
        };
        let app = Application::build(settings).await.map_err(|e| e.to_string())?;
        if let Some(demo) = &app.demo {
            println!("First start: created a demo merchant. These are shown once; keep them.");
            print_created(demo, false);
        }
        tracing::info!(environment = env.as_str(), %listen, port = app.port(), "caisse is serving");
        let engine = app.state().engine.clone();
        let served = app.run_until_stopped().await.map_err(|e| e.to_string());
        // The servers have stopped (a signal, requests in flight answered); what is left is closing the
        // store: the embedded store's journal and tables, or in a cluster the writers' last commits and the
        // shards given back. Everything acknowledged is durable already, so past a bound the process leaves
        // without waiting, saying so by its status: the next start replays the journal, and in a cluster the
        // other nodes take the shards once their leases run out.
        std::thread::spawn(move || {
            std::thread::sleep(close_bound);
            tracing::warn!("the store did not close within {close_bound:?}; exiting without closing it");
            std::process::exit(1);
        });
        tracing::info!("stopped serving; closing the store");
        // Closed now rather than when the last handle goes (the webhook actors hold one until the process
        // ends), so that the next start has no log to replay.
        let started = std::time::Instant::now();
        match engine.close() {
            Ok(()) => tracing::info!(elapsed_ms = started.elapsed().as_millis() as u64, "store closed"),
            Err(e) => tracing::warn!(error = %e, "the store did not close cleanly; the next start replays its journal"),
        }
        served
    })
}

/// How long closing the store may take after the servers stopped, before the process exits anyway.
const STORE_CLOSE_BOUND: std::time::Duration = std::time::Duration::from_secs(10);

/// The same in a cluster: the writers' queued commits, then giving the shards back (up to 10 s of rounds), so
/// that other nodes take them at once rather than when their leases run out.
const CLUSTER_CLOSE_BOUND: std::time::Duration = std::time::Duration::from_secs(25);

fn merchant(settings: &Settings, command: MerchantCommand) -> Result<(), String> {
    let (command, json) = match command {
        MerchantCommand::Create { name, email, password, webhook_url, json } => {
            (client::Command::Create(NewMerchant { name, email, password, webhook_url }), json)
        }
        MerchantCommand::List { json } => (client::Command::List, json),
        MerchantCommand::Suspend { id } => (client::Command::Suspend(id), false),
        MerchantCommand::Resume { id } => (client::Command::Resume(id), false),
        MerchantCommand::ResetPassword { id } => (client::Command::ResetPassword(id), false),
    };
    let creating = matches!(command, client::Command::Create(_));
    for value in client::run(settings, command)? {
        match (json, creating) {
            // The contract's five fields, whichever way the merchant was made (the admin API also answers its
            // name and status).
            (true, true) => println!(
                "{}",
                serde_json::json!({
                    "id": value["id"], "email": value["email"], "password": value["password"],
                    "secret_key": value["secret_key"], "webhook_url": value["webhook_url"],
                })
            ),
            (true, false) => println!("{value}"),
            (false, _) => print_fields(&value),
        }
    }
    Ok(())
}

/// A merchant or a result as `field: value` lines, then a blank line.
fn print_fields(value: &serde_json::Value) {
    if let Some(object) = value.as_object() {
        for (field, v) in object {
            let text = v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string());
            println!("{:<14}{text}", format!("{field}:"));
        }
        println!();
    }
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

#[cfg(test)]
mod tests {
    use super::log_filter;

    #[test]
    fn libraries_are_held_to_their_level_unless_the_filter_names_them() {
        assert_eq!(log_filter("info"), "info,lsm_tree=warn,tokio_postgres=info");
        assert_eq!(log_filter("debug"), "debug,lsm_tree=warn,tokio_postgres=info");
        assert_eq!(log_filter(""), "lsm_tree=warn,tokio_postgres=info");
        assert_eq!(
            log_filter(" caisse=debug, tokio_postgres=debug "),
            "caisse=debug,tokio_postgres=debug,lsm_tree=warn"
        );
        assert_eq!(log_filter("lsm_tree=info"), "lsm_tree=info,tokio_postgres=info");
        // What it makes is a filter tracing accepts.
        assert!(tracing_subscriber::EnvFilter::try_new(log_filter("caisse=debug,actix_web=warn")).is_ok());
    }
}
