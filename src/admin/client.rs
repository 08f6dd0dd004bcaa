//! The `caisse merchant ...`, `caisse backup` and `caisse audit` commands: through the running server's admin API when one answers at
//! `admin_listen`, else straight on the embedded store (which only one process may open, so a running server
//! without an admin token is reported with what to do).

use std::sync::Arc;
use std::time::Duration;

use caisse_engine::domain::ids::{random_base62, MerchantId};
use caisse_engine::domain::time::Timestamp;
use caisse_engine::store::{open_embedded, PgStore, Store, StoreError};
use serde_json::{json, Value};

use crate::config::{Settings, StoreLocation};
use crate::merchants::{self, NewMerchant};

/// What the operator asked for.
pub enum Command {
    Create(NewMerchant),
    List,
    Suspend(String),
    Resume(String),
    ResetPassword(String),
    /// A consistent copy of the store into this directory (absent or empty).
    Backup(std::path::PathBuf),
    /// The audit of the whole ledger.
    Audit,
}

/// How long one admin request may take (creation hashes a password).
const TIMEOUT: Duration = Duration::from_secs(30);
/// How long the audit of a whole ledger may take through the admin API: it grows with the ledger (about a
/// second per million events on two cores, docs/perf/README.md).
const AUDIT_TIMEOUT: Duration = Duration::from_secs(60 * 60);
/// Pages `list` reads at most (100 merchants each).
const MAX_PAGES: usize = 1_000;

/// Runs the command and answers what to print: one JSON value per merchant or result.
pub fn run(settings: &Settings, command: Command) -> Result<Vec<Value>, String> {
    // The server reads a backup's directory from its own working directory: send it absolute.
    let command = match command {
        Command::Backup(to) => Command::Backup(std::path::absolute(&to).map_err(|e| format!("{}: {e}", to.display()))?),
        other => other,
    };
    if let Some(token) = &settings.admin_token {
        let address = format!("http://{}", settings.admin_listen);
        match through_admin(&address, token.expose(), &command)? {
            Some(values) => return Ok(values),
            None => tracing::debug!(%address, "no server answers; using the store"),
        }
    }
    on_store(settings, command)
}

/// `None` when nothing listens at the admin address.
fn through_admin(address: &str, token: &str, command: &Command) -> Result<Option<Vec<Value>>, String> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (method, path, body) = match command {
        Command::Create(new) => (
            awc::http::Method::POST,
            "/admin/merchants".to_owned(),
            Some(
                json!({"name": new.name, "email": new.email, "password": new.password, "webhook_url": new.webhook_url}),
            ),
        ),
        Command::List => (awc::http::Method::GET, "/admin/merchants?limit=100".to_owned(), None),
        Command::Suspend(id) => (awc::http::Method::POST, format!("/admin/merchants/{id}/suspendre"), None),
        Command::Resume(id) => (awc::http::Method::POST, format!("/admin/merchants/{id}/reactiver"), None),
        Command::ResetPassword(id) => (awc::http::Method::POST, format!("/admin/merchants/{id}/mot-de-passe"), None),
        Command::Backup(to) => (awc::http::Method::POST, "/admin/backup".to_owned(), Some(json!({"to": to}))),
        Command::Audit => (awc::http::Method::POST, "/admin/audit".to_owned(), None),
    };
    let list = matches!(command, Command::List);
    let timeout = if matches!(command, Command::Audit) { AUDIT_TIMEOUT } else { TIMEOUT };
    let (address, token) = (address.to_owned(), token.to_owned());
    actix_web::rt::System::new().block_on(async move {
        let client = awc::Client::builder().timeout(timeout).disable_redirects().finish();
        let send = |path: String| {
            let request = client
                .request(method.clone(), format!("{address}{path}"))
                .insert_header(("Authorization", format!("Bearer {token}")));
            let body = body.clone();
            async move {
                let mut response = match body {
                    Some(body) => request.send_json(&body).await,
                    None => request.send().await,
                }?;
                let bytes = response.body().limit(1 << 20).await?;
                Ok::<_, Box<dyn std::error::Error>>((response.status(), bytes))
            }
        };
        let mut values = Vec::new();
        let mut next = path;
        for _ in 0..MAX_PAGES {
            let (status, bytes) = match send(next.clone()).await {
                Ok(answer) => answer,
                Err(e) if values.is_empty() && refused(&*e) => return Ok(None),
                Err(e) => return Err(format!("the admin API at {address}: {e}")),
            };
            let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            if !status.is_success() {
                let message = value["error"]["message"].as_str().unwrap_or("no message");
                return Err(format!("the admin API answered {status}: {message}"));
            }
            if !list {
                return Ok(Some(vec![value]));
            }
            values.extend(value["data"].as_array().cloned().unwrap_or_default());
            match value["next_cursor"].as_str() {
                Some(cursor) => next = format!("/admin/merchants?limit=100&starting_after={cursor}"),
                None => break,
            }
        }
        Ok(Some(values))
    })
}

/// True when the connection was refused: no server listens there.
fn refused(error: &(dyn std::error::Error + 'static)) -> bool {
    use awc::error::{ConnectError, SendRequestError};
    matches!(
        error.downcast_ref::<SendRequestError>(),
        Some(SendRequestError::Connect(ConnectError::Io(io))) if io.kind() == std::io::ErrorKind::ConnectionRefused
    )
}

/// The store of `settings`, opened by this command. A PostgreSQL store is shared with the running nodes; the
/// embedded one only opens while no server holds it.
///
/// The merchants' keys must open with the configured master key, as at the server's start: a merchant made
/// with another key would be sealed under it, and the server would then start with neither.
fn open_store(settings: &Settings) -> Result<Arc<dyn Store>, String> {
    let store = opened_store(settings)?;
    caisse_engine::store::sealing::check_opens(store.as_ref()).map_err(|e| e.to_string())?;
    Ok(store)
}

fn opened_store(settings: &Settings) -> Result<Arc<dyn Store>, String> {
    if let StoreLocation::Postgres(url) = &settings.store {
        let store = PgStore::open(url.expose()).map_err(|e| format!("cannot open the PostgreSQL store: {e}"))?;
        return Ok(Arc::new(store.with_master_key(settings.master_key.clone())));
    }
    match open_embedded(&settings.data_dir, settings.store_cache_bytes, settings.master_key.clone()) {
        Ok(store) => Ok(store),
        Err(StoreError::Locked(_)) => Err(format!(
            "the store in {} is in use by a running `caisse serve`; set an admin token (CAISSE_ADMIN_TOKEN or \
                 admin_token_file) for both the server and this command to run it (merchant commands, backups) \
                 while the server runs, or stop the server",
            settings.data_dir.display()
        )),
        Err(e) => Err(format!("cannot open the store in {}: {e}", settings.data_dir.display())),
    }
}

/// Ends a merchant's dashboard sessions where the nodes of a cluster keep them, the database: a suspension or a
/// password reset (of an account someone else got into) logs out whoever holds one, as the admin API's do.
/// The embedded store's sessions live in a server's memory, and the server is stopped.
fn end_shared_sessions(settings: &Settings, merchant: &MerchantId, done: &str) -> Result<(), String> {
    if let StoreLocation::Postgres(url) = &settings.store {
        let sessions = PgStore::open(url.expose()).map_err(|e| format!("{done}, but cannot open the sessions: {e}"))?;
        caisse_engine::cluster::SharedSessions::remove_merchant(&sessions, merchant)
            .map_err(|e| format!("{done}, but its sessions could not be ended: {e}"))?;
    }
    Ok(())
}

fn on_store(settings: &Settings, command: Command) -> Result<Vec<Value>, String> {
    let store = open_store(settings)?;
    let runtime = tokio::runtime::Builder::new_current_thread().build().map_err(|e| e.to_string())?;
    let durable = |ticket: Result<caisse_engine::store::Ticket, StoreError>| -> Result<(), String> {
        match runtime.block_on(ticket.map_err(|e| e.to_string())?) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(StoreError::Closed.to_string()),
        }
    };
    let parse = |id: &str| MerchantId::parse(id).map_err(|_| format!("`{id}` is not a merchant id"));
    let find = |id: &str| -> Result<caisse_engine::domain::records::Merchant, String> {
        store.merchant(&parse(id)?).map_err(|e| e.to_string())?.ok_or_else(|| format!("no merchant {id}"))
    };
    let view = super::merchants::view;
    match command {
        Command::Create(new) => {
            if store.merchant_by_email(&new.email).map_err(|e| e.to_string())?.is_some() {
                return Err(format!("a merchant with e-mail {} already exists", new.email));
            }
            let created = merchants::prepare(settings.environment, new).map_err(|e| e.to_string())?;
            durable(store.put_merchant(created.merchant.clone(), None))?;
            let m = &created.merchant;
            Ok(vec![json!({
                "id": m.id.as_str(), "name": m.name, "email": m.email, "password": created.password,
                "secret_key": m.secret_key, "webhook_url": m.webhook_url, "statut": "actif",
            })])
        }
        Command::List => {
            let mut values = Vec::new();
            let mut before: Option<MerchantId> = None;
            for _ in 0..MAX_PAGES {
                let page = store.merchants(before.as_ref(), 100).map_err(|e| e.to_string())?;
                for m in &page {
                    values.push(view(m, store.suspended_since(&m.id).map_err(|e| e.to_string())?));
                }
                match page.last() {
                    Some(last) if page.len() == 100 => before = Some(last.id.clone()),
                    _ => break,
                }
            }
            Ok(values)
        }
        Command::Suspend(id) => {
            let m = find(&id)?;
            let since = match store.suspended_since(&m.id).map_err(|e| e.to_string())? {
                Some(since) => since,
                None => {
                    let now = Timestamp::now();
                    durable(store.set_suspended(&m.id, Some(now)))?;
                    now
                }
            };
            end_shared_sessions(settings, &m.id, "the merchant is suspended")?;
            Ok(vec![view(&m, Some(since))])
        }
        Command::Resume(id) => {
            let m = find(&id)?;
            durable(store.set_suspended(&m.id, None))?;
            Ok(vec![view(&m, None)])
        }
        Command::Audit => Ok(vec![match store.audit() {
            Ok(report) => json!({
                "audit": "passed", "merchants": report.merchants, "events": report.events,
                "elapsed_ms": report.elapsed_ms,
            }),
            Err(e) => super::audit_refused(&e),
        }]),
        Command::Backup(to) => {
            let report = store.backup(&to).map_err(|e| e.to_string())?;
            Ok(vec![json!({
                "to": to, "keys": report.keys, "paused_ms": report.paused_ms, "elapsed_ms": report.elapsed_ms,
            })])
        }
        Command::ResetPassword(id) => {
            let password = random_base62(16);
            let password_hash = merchants::hash_password(&password).map_err(|e| e.to_string())?;
            // Read and written under the account's lock: a node changing the account meanwhile (on a shared
            // PostgreSQL) keeps its change.
            let _locked = store.lock_account(&parse(&id)?).map_err(|e| e.to_string())?;
            let mut m = find(&id)?;
            m.password_hash = password_hash;
            durable(store.put_merchant(m.clone(), None))?;
            end_shared_sessions(settings, &m.id, "the password is reset")?;
            Ok(vec![json!({"id": m.id.as_str(), "email": m.email, "password": password})])
        }
    }
}

/// `caisse restore --from DIR`: copies a backup into the configured data directory, which must be absent or
/// empty (and no server may run on it), then opens it, which replays and audits it. Answers what the audit saw.
pub fn restore(settings: &Settings, from: &std::path::Path) -> Result<Value, String> {
    if let StoreLocation::Postgres(_) = settings.store {
        return Err("a PostgreSQL store is restored with PostgreSQL's own tools (pg_restore, or a base backup); \
                    see docs/cluster.md"
            .into());
    }
    use caisse_engine::store::fjall_store::BACKUP_UNFINISHED;
    let data = &settings.data_dir;
    if !from.join(caisse_engine::store::STAMP_FILE).is_file() {
        return Err(format!("{} is not a backup of a Caisse store (no format stamp)", from.display()));
    }
    if from.join(BACKUP_UNFINISHED).exists() {
        return Err(format!(
            "{} holds a backup that was not finished ({BACKUP_UNFINISHED}): take it again",
            from.display()
        ));
    }
    if std::fs::read_dir(data).is_ok_and(|mut entries| entries.next().is_some()) {
        return Err(format!("{} is not empty: restore into an empty data directory", data.display()));
    }
    // Marked unfinished while it is copied: a restore cut short (the machine down, the disk full) leaves a
    // directory no server starts on, rather than a store missing whole trees.
    let marker = data.join(BACKUP_UNFINISHED);
    let copied = std::fs::create_dir_all(data)
        .and_then(|()| std::fs::write(&marker, "a restore was being copied here and did not finish\n"))
        .and_then(|()| std::fs::File::open(&marker)?.sync_all())
        .and_then(|()| std::fs::File::open(data)?.sync_all())
        .and_then(|()| copy_tree(from, data))
        .and_then(|()| std::fs::remove_file(&marker))
        .and_then(|()| std::fs::File::open(data)?.sync_all())
        .and_then(|()| match data.parent().filter(|p| !p.as_os_str().is_empty()) {
            Some(parent) => std::fs::File::open(parent)?.sync_all(),
            None => Ok(()),
        });
    let restored =
        copied.map_err(|e| format!("copying {} to {}: {e}", from.display(), data.display())).and_then(|()| {
            let store = open_embedded(data, settings.store_cache_bytes, settings.master_key.clone())
                .map_err(|e| format!("the restored store does not open: {e}"))?;
            caisse_engine::store::sealing::check_opens(store.as_ref())
                .map_err(|e| format!("the restored store's keys do not open: {e}"))?;
            caisse_engine::store::Audit::audit(store.as_ref())
                .map_err(|e| format!("the restored store fails its audit: {e}"))
        });
    match restored {
        Ok(report) => {
            Ok(json!({"restored": data, "merchants": report.merchants, "events": report.events, "audit": "passed"}))
        }
        // A backup an earlier release made on sled: whole, but opened only once moved onto fjall.
        Err(why) if !data.join(BACKUP_UNFINISHED).exists() && caisse_engine::store::holds_sled_store_only(data) => {
            Err(format!(
                "{} now holds the backup, a store made on sled by an earlier release: run `caisse upgrade-store` \
                 (the server stopped), which moves it onto fjall and audits it ({why})",
                data.display()
            ))
        }
        Err(why) => {
            // The directory was empty before: what the restore put there goes, so that it can be run again
            // (with the right master key, say).
            // The mark of an unfinished copy goes last, so a directory left half emptied still carries it.
            let emptied = std::fs::read_dir(data).map(|entries| {
                entries
                    .flatten()
                    .filter(|entry| entry.file_name() != BACKUP_UNFINISHED)
                    .try_for_each(|entry| match entry.path().is_dir() {
                        true => std::fs::remove_dir_all(entry.path()),
                        false => std::fs::remove_file(entry.path()),
                    })
                    .and_then(|()| match marker.exists() {
                        true => std::fs::remove_file(&marker),
                        false => Ok(()),
                    })
            });
            match emptied {
                Ok(Ok(())) => Err(why),
                _ => Err(format!("{why}; {} still holds the copy: empty it before restoring again", data.display())),
            }
        }
    }
}

/// `caisse upgrade-store`: moves the embedded store sled made onto fjall, the server stopped. The copy is made
/// beside the data directory, audited, and then takes its place; the sled store is kept beside it under
/// `<data_dir>.sled` until the operator deletes it.
pub fn upgrade_store(settings: &Settings) -> Result<Value, String> {
    if let StoreLocation::Postgres(_) = settings.store {
        return Err("the store is PostgreSQL: only the embedded store has an engine to upgrade".into());
    }
    let data = settings.data_dir.as_path();
    let (fresh, kept) = caisse_engine::store::fjall_store::upgrade::beside(data);
    let moved = |from: &std::path::Path, to: &std::path::Path| {
        std::fs::rename(from, to).map_err(|e| format!("moving {} to {}: {e}", from.display(), to.display()))
    };
    if !data.exists() && fresh.exists() && kept.exists() {
        // Stopped between its two renames: the copy was audited before the first.
        moved(&fresh, data)?;
        return Ok(json!({"upgraded": data, "engine": "fjall", "finished": "an interrupted upgrade",
            "sled_store_kept_in": kept}));
    }
    if !caisse_engine::store::holds_sled_store(data) {
        return Err(format!("{} holds no sled store: nothing to upgrade", data.display()));
    }
    for path in [&fresh, &kept] {
        if path.exists() {
            return Err(format!("{} exists: move it aside or delete it, then run the upgrade again", path.display()));
        }
    }
    let report = match caisse_engine::store::fjall_store::upgrade::from_sled(data, &fresh) {
        Ok(report) => report,
        Err(StoreError::Locked(_)) => {
            return Err(format!("the store in {} is in use by a running `caisse serve`: stop it first", data.display()))
        }
        Err(e) => {
            // Nothing was changed in the data directory; the half-made copy goes.
            let _ = std::fs::remove_dir_all(&fresh);
            return Err(format!("the upgrade failed, the store is unchanged: {e}"));
        }
    };
    let audit = open_embedded(&fresh, settings.store_cache_bytes, settings.master_key.clone())
        .and_then(|store| caisse_engine::store::Audit::audit(store.as_ref()))
        .map_err(|e| {
            format!("the upgraded copy in {} fails its audit, the store is unchanged: {e}", fresh.display())
        })?;
    moved(data, &kept)?;
    moved(&fresh, data)?;
    if let Some(parent) = data.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::File::open(parent)
            .and_then(|d| d.sync_all())
            .map_err(|e| format!("sync {}: {e}", parent.display()))?;
    }
    Ok(json!({
        "upgraded": data, "engine": "fjall", "keys": report.keys, "log_records": report.log_records,
        "elapsed_ms": report.elapsed_ms,
        "merchants": audit.merchants, "events": audit.events, "audit": "passed", "sled_store_kept_in": kept,
    }))
}

/// Copies `from` into `to` file by file, each file synced, then the directories.
fn copy_tree(from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
            std::fs::File::open(&target)?.sync_all()?;
        }
    }
    std::fs::File::open(to)?.sync_all()
}
