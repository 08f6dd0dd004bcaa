//! What the `--target` mode needs beside the load itself: a data directory prepared with merchants
//! (`--prepare`), the merchants file that carries their keys to the run, and the server's memory.
//!
//! A running `caisse serve` holds its store's lock, so merchants cannot be added behind its back, and
//! `caisse merchant create` hashes a password per merchant (argon2, deliberately slow), which makes ten
//! thousand merchants take many minutes (docs/perf/history.md). `--prepare` therefore writes them straight
//! into a new data directory with the library, one shared password hash, before the server starts on it, and
//! writes one line per merchant to the merchants file in the shape `caisse merchant create --json` prints, so
//! a file made with that command serves as well. The line number is the merchant's index: its webhook URL must
//! be `http://127.0.0.1:<port>/hook/<line number from 0>`, which is how the receiver finds the key to verify
//! a delivery with.
//!
//! The server's RSS is read from `/proc/<pid>/status`; its pid is given or found as the process that listens
//! on the target's port (`/proc/net/tcp*`, then the socket's inode among `/proc/*/fd`).

use std::collections::BTreeSet;
use std::io::{BufRead, BufWriter, Write};
use std::path::Path;
use std::sync::Arc;

use caisse::config::Environment;
use caisse::merchants;
use caisse_engine::domain::ids::MerchantId;
use caisse_engine::domain::records::Merchant;
use caisse_engine::domain::time::Timestamp;
use caisse_engine::store::{fjall_store, open_embedded, Accounts, PgStore, Store, Ticket};
use serde::Deserialize;
use serde_json::json;

/// The password every prepared merchant shares (dashboard login); the load never uses it.
const PREPARED_PASSWORD: &str = "load-test-password";

/// Tickets awaited at a time while preparing, well under the store writer's queue capacity.
const TICKETS_IN_FLIGHT_MAX: usize = 4_096;

/// Whether merchant `index` hangs in the `hanging` scenario; prepared stores give these merchants ports of
/// their own whatever the scenario, so one store serves every scenario.
pub fn hangs(index: usize) -> bool {
    index % 10 == 9
}

/// The receiver port slot of merchant `index`: healthy merchants share the first `ports_each` slots, hanging
/// ones the next `ports_each`, so a hanging receiver slows only its own hosts, as it would in production.
pub fn port_slot(index: usize, ports_each: usize, hanging: bool) -> usize {
    index % ports_each + if hanging { ports_each } else { 0 }
}

/// `--prepare`: creates `count` sandbox merchants in the new data directory `dir` (no server may hold it), or
/// in the PostgreSQL database `dir` names as a `postgres://` URL, and writes their lines to `file`.
pub async fn prepare(dir: &Path, file: &Path, count: usize, first_port: u16, ports_each: usize) -> Result<(), String> {
    if count == 0 || ports_each == 0 {
        return Err("--merchants and --receiver-ports must be above zero".into());
    }
    if usize::from(first_port) + 2 * ports_each - 1 > usize::from(u16::MAX) {
        return Err(format!("--receiver-port {first_port} leaves no room for {} ports", 2 * ports_each));
    }
    let text = dir.to_string_lossy();
    // A database's nodes see merchants written beside them; an embedded store is its server's alone.
    let store: Arc<dyn Accounts> = if text.starts_with("postgres://") || text.starts_with("postgresql://") {
        let store = PgStore::open(&text).map_err(|e| format!("cannot open the database: {e}"))?;
        // A database with merchants is someone's: it must not get accounts with a well-known password.
        let existing = store.merchant_count().map_err(|e| format!("cannot count the merchants: {e}"))?;
        if existing > 0 {
            return Err(format!("the database holds {existing} merchants: --prepare wants a new database"));
        }
        Arc::new(store)
    } else {
        // A data directory in use by anything else must not get a thousand extra merchants by mistake.
        if let Ok(mut entries) = std::fs::read_dir(dir) {
            if entries.next().is_some() {
                return Err(format!("{} is not empty: --prepare wants a new data directory", dir.display()));
            }
        }
        // Made on the engine a server makes a fresh store on.
        let store: Arc<dyn Store> = open_embedded(dir, fjall_store::DEFAULT_CACHE_BYTES, None)
            .map_err(|e| format!("cannot open the store in {}: {e}", dir.display()))?;
        store
    };
    let lines = std::fs::File::create(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let mut lines = BufWriter::new(lines);
    // One hash for all: the records look like real ones without an argon2 run per merchant.
    let password_hash = merchants::hash_password(PREPARED_PASSWORD).map_err(|e| e.to_string())?;
    let mut tickets = Vec::with_capacity(TICKETS_IN_FLIGHT_MAX);
    for i in 0..count {
        let port = usize::from(first_port) + port_slot(i, ports_each, hangs(i));
        let merchant = Merchant {
            id: MerchantId::new(),
            name: format!("Load {i}"),
            email: format!("load{i}@example.com"),
            password_hash: password_hash.clone(),
            secret_key: merchants::new_secret_key(Environment::Sandbox),
            webhook_url: Some(format!("http://127.0.0.1:{port}/hook/{i}")),
            created_at: Timestamp::now(),
        };
        let line = json!({
            "id": merchant.id.as_str(),
            "email": merchant.email,
            "password": PREPARED_PASSWORD,
            "secret_key": merchant.secret_key,
            "webhook_url": merchant.webhook_url,
        });
        writeln!(lines, "{line}").map_err(|e| format!("{}: {e}", file.display()))?;
        tickets.push(store.put_merchant(merchant, None).map_err(|e| format!("merchant {i}: {e}"))?);
        if tickets.len() == TICKETS_IN_FLIGHT_MAX {
            await_tickets(&mut tickets).await?;
        }
    }
    await_tickets(&mut tickets).await?;
    lines.flush().map_err(|e| format!("{}: {e}", file.display()))?;
    Ok(())
}

/// Waits until every queued merchant is durable.
pub async fn await_tickets(tickets: &mut Vec<Ticket>) -> Result<(), String> {
    for ticket in tickets.drain(..) {
        match ticket.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(format!("merchant not stored: {e}")),
            Err(_) => return Err("the store closed while creating merchants".into()),
        }
    }
    Ok(())
}

/// One line of the merchants file; other fields (`id`, `email`, `password`) are ignored.
#[derive(Deserialize)]
struct Line {
    secret_key: String,
    webhook_url: Option<String>,
}

/// The merchants of a `--target` run.
pub struct Targeted {
    pub keys: Vec<String>,
    /// Every port the webhook URLs name, each once: the receiver listens on all of them.
    pub ports: Vec<u16>,
}

/// Reads the first `limit` merchants (all when `None`) of the merchants file.
pub fn read_merchants(file: &Path, limit: Option<usize>) -> Result<Targeted, String> {
    let opened = std::fs::File::open(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let mut keys = Vec::new();
    let mut ports = BTreeSet::new();
    for (i, text) in std::io::BufReader::new(opened).lines().enumerate() {
        if limit.is_some_and(|n| keys.len() >= n) {
            break;
        }
        let text = text.map_err(|e| format!("{}: {e}", file.display()))?;
        let at = || format!("{} line {}", file.display(), i + 1);
        let line: Line = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", at()))?;
        let url = line.webhook_url.ok_or_else(|| format!("{}: no webhook_url", at()))?;
        let port = url
            .strip_prefix("http://127.0.0.1:")
            .and_then(|rest| rest.strip_suffix(&format!("/hook/{i}")))
            .and_then(|port| port.parse::<u16>().ok())
            .ok_or_else(|| format!("{}: webhook_url must be http://127.0.0.1:<port>/hook/{i}, not {url}", at()))?;
        ports.insert(port);
        keys.push(line.secret_key);
    }
    if keys.is_empty() {
        return Err(format!("{} has no merchants", file.display()));
    }
    if let Some(n) = limit.filter(|n| *n > keys.len()) {
        return Err(format!("--merchants {n}, but {} has only {}", file.display(), keys.len()));
    }
    Ok(Targeted { keys, ports: ports.into_iter().collect() })
}

/// The port of an `http://host:port[/...]` URL (80 when it has none).
pub fn url_port(url: &str) -> Result<u16, String> {
    let rest = url.strip_prefix("http://").ok_or_else(|| format!("--target {url}: only http:// is supported"))?;
    let authority = rest.split('/').next().unwrap_or_default();
    match authority.rsplit_once(':') {
        Some((_, port)) => port.parse().map_err(|_| format!("--target {url}: bad port")),
        None => Ok(80),
    }
}

/// The pid of the process listening on TCP `port`, when this user may see it.
pub fn listening_pid(port: u16) -> Option<u32> {
    let mut inodes = BTreeSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for row in text.lines().skip(1) {
            let fields: Vec<&str> = row.split_whitespace().collect();
            // local_address is HEXIP:HEXPORT, st 0A is LISTEN, the inode is the tenth column.
            let (Some(local), Some(state), Some(inode)) = (fields.get(1), fields.get(3), fields.get(9)) else {
                continue;
            };
            let local_port = local.rsplit_once(':').and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            if *state == "0A" && local_port == Some(port) {
                inodes.insert(format!("socket:[{inode}]"));
            }
        }
    }
    if inodes.is_empty() {
        return None;
    }
    let me = std::process::id();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        if pid == me {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else { continue };
        for fd in fds.flatten() {
            let link = std::fs::read_link(fd.path()).ok();
            if link.as_ref().and_then(|l| l.to_str()).is_some_and(|l| inodes.contains(l)) {
                return Some(pid);
            }
        }
    }
    None
}

/// A `/proc/<pid>/status` figure (`VmRSS:`, `VmHWM:`) in MiB, rounded to a tenth; `None` for this process.
pub fn status_mib(pid: Option<u32>, field: &str) -> Option<f64> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/status"),
        None => "/proc/self/status".to_owned(),
    };
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| (kb / 1024.0 * 10.0).round() / 10.0)
}
