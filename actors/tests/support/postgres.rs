//! A PostgreSQL database for each test (or benchmark) that needs one.
//!
//! With `CAISSE_TEST_DATABASE_URL` set, the databases are made on that server (its user must be allowed to
//! create databases). Otherwise the first test of a process starts a private cluster from the installed
//! PostgreSQL programs (`initdb` and `pg_ctl`, run as the `postgres` user when the tests run as root, since
//! `initdb` refuses root) in a temporary directory, on a free loopback port, without fsync: its durability is
//! not what the tests measure. A watchdog stops that cluster and removes its directory once the test process
//! has gone, however it ended. Each test gets a database of its own, dropped when the test is done.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// A database made for one test; dropped with it.
pub struct TestDatabase {
    pub url: String,
    name: String,
    admin_url: String,
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        // Best effort: a database left behind is gone with the private cluster anyway.
        let _ = psql(&self.admin_url, &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name));
    }
}

/// Restarts the private cluster of [`database`] at once, as a crash of the database server does
/// (`pg_ctl restart -m immediate`: no checkpoint, recovery from the WAL at start), and waits until it accepts
/// connections again. `false` when the server is `CAISSE_TEST_DATABASE_URL`'s, which a test may not restart.
/// Every database of the process is on it: only a test binary with one test using PostgreSQL may call it.
pub fn restart_immediately() -> bool {
    let Some(data) = server().data.as_ref() else { return false };
    // The server's output goes to its log, as at its first start: inherited, it would hold this pipe open.
    let log = data.with_file_name("server.log");
    let (data, log) = (data.to_str().unwrap_or_default(), log.to_str().unwrap_or_default());
    run(&mut as_owner(&bin("pg_ctl"), &["-D", data, "-l", log, "-m", "immediate", "-w", "-t", "60", "restart"]))
        .unwrap_or_else(|e| panic!("restart PostgreSQL: {e}"));
    true
}

impl TestDatabase {
    /// The server's address as the URL names it (`host:port`, the port 5432 when it names none).
    pub fn server_address(&self) -> String {
        let (_, host) = user_and_host(&self.url);
        if host.contains(':') {
            host.to_owned()
        } else {
            format!("{host}:5432")
        }
    }

    /// This database's URL through another address (a proxy on loopback, listening on `port`).
    pub fn url_via(&self, port: u16) -> String {
        let (start, end) = authority(&self.url);
        let (user, _) = user_and_host(&self.url);
        format!("{}{user}127.0.0.1:{port}{}", &self.url[..start], &self.url[end..])
    }

    /// Runs `sql` on this database (as the server's administrator), failing the test if it fails.
    pub fn execute(&self, sql: &str) {
        psql(&self.url, sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

/// The first column of the first row `sql` answers on the database at `url`, as text (`psql`'s unaligned
/// output).
pub fn query_value(url: &str, sql: &str) -> String {
    let out = Command::new(bin("psql"))
        .args(["-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1", "-d", url, "-c", sql])
        .output()
        .unwrap_or_else(|e| panic!("run psql: {e}"));
    assert!(out.status.success(), "{sql}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or_default().trim().to_owned()
}

/// A fresh, empty database.
pub fn database() -> TestDatabase {
    database_on(server())
}

/// A fresh, empty database on a server that syncs its commits to disk, as production does (the tests' server
/// does not: its durability is not what they measure, but a benchmark's figures depend on it). With
/// `CAISSE_TEST_DATABASE_URL` set, that server.
pub fn durable_database() -> TestDatabase {
    static DURABLE: OnceLock<Server> = OnceLock::new();
    let server = DURABLE.get_or_init(|| match std::env::var("CAISSE_TEST_DATABASE_URL") {
        Ok(url) if !url.is_empty() => Server { admin_url: url, data: None },
        _ => start_private_cluster(true).unwrap_or_else(|e| panic!("start a private PostgreSQL: {e}")),
    });
    database_on(server)
}

fn database_on(server: &Server) -> TestDatabase {
    let name = format!("caisse_test_{:016x}", rand_u64());
    psql(&server.admin_url, &format!("CREATE DATABASE {name}")).unwrap_or_else(|e| panic!("create {name}: {e}"));
    TestDatabase { url: with_database(&server.admin_url, &name), name, admin_url: server.admin_url.clone() }
}

struct Server {
    admin_url: String,
    /// The data directory of a private cluster this process started; `None` for `CAISSE_TEST_DATABASE_URL`.
    data: Option<PathBuf>,
}

fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| match std::env::var("CAISSE_TEST_DATABASE_URL") {
        Ok(url) if !url.is_empty() => Server { admin_url: url, data: None },
        _ => start_private_cluster(false).unwrap_or_else(|e| panic!("start a private PostgreSQL: {e}")),
    })
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher
        .write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    hasher.finish()
}

/// A URL's user as it precedes the host (`user@`, or nothing), and its host (`host:port`, as written).
fn user_and_host(url: &str) -> (String, &str) {
    let (start, end) = authority(url);
    match url[start..end].rsplit_once('@') {
        Some((user, host)) => (format!("{user}@"), host),
        None => (String::new(), &url[start..end]),
    }
}

/// Where a URL's authority (`user@host:port`) starts and ends.
fn authority(url: &str) -> (usize, usize) {
    let start = url.find("://").map_or(0, |i| i + 3);
    let end = url[start..].find(['/', '?']).map_or(url.len(), |i| start + i);
    (start, end)
}

/// `url` naming database `name` instead of its own.
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, format!("?{query}")),
        None => (url, String::new()),
    };
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let base = match base[authority_start..].find('/') {
        Some(slash) => &base[..authority_start + slash],
        None => base,
    };
    format!("{base}/{name}{query}")
}

fn psql(url: &str, sql: &str) -> Result<(), String> {
    let out = Command::new(bin("psql"))
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url, "-c", sql])
        .output()
        .map_err(|e| format!("run psql: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// A PostgreSQL program: from the newest `/usr/lib/postgresql/<version>/bin` (where Debian installs them,
/// outside the `PATH`), else from the `PATH`.
fn bin(program: &str) -> PathBuf {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| Some((entry.file_name().to_str()?.parse().ok()?, entry.path().join("bin").join(program))))
        .filter(|(_, path)| path.exists())
        .collect();
    versions.sort();
    versions.pop().map_or_else(|| PathBuf::from(program), |(_, path)| path)
}

fn run(command: &mut Command) -> Result<(), String> {
    let out = command.output().map_err(|e| format!("run {command:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{command:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// `program` with `args`, as the `postgres` user when this process is root.
fn as_owner(program: &Path, args: &[&str]) -> Command {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program).args(args);
        command
    } else {
        let mut command = Command::new(program);
        command.args(args);
        command
    }
}

fn free_port() -> Result<u16, String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("find a free port: {e}"))?;
    listener.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

/// A fresh database on a private cluster of its own that accepts TLS connections only (`hostssl` in its
/// `pg_hba.conf`), presenting `cert_pem` (with its key `key_pem`). With `CAISSE_TEST_DATABASE_URL` set, `None`:
/// that server's TLS is not the test's to set.
pub fn tls_only_database(cert_pem: &str, key_pem: &str) -> Option<TestDatabase> {
    if std::env::var("CAISSE_TEST_DATABASE_URL").is_ok_and(|url| !url.is_empty()) {
        return None;
    }
    let server = start_cluster(false, Some((cert_pem, key_pem)))
        .unwrap_or_else(|e| panic!("start a private PostgreSQL with TLS: {e}"));
    Some(database_on(&server))
}

/// The address (`127.0.0.1:port`) of a server of its own that refuses writes, as a standby does, holding an
/// empty database named as `database` is (every session there is read-only). With `CAISSE_TEST_DATABASE_URL`
/// set, `None`: that server's programs may not be installed here.
pub fn read_only_twin(database: &TestDatabase) -> Option<String> {
    if std::env::var("CAISSE_TEST_DATABASE_URL").is_ok_and(|url| !url.is_empty()) {
        return None;
    }
    let server = start_private_cluster(false).unwrap_or_else(|e| panic!("start a second private PostgreSQL: {e}"));
    for sql in [
        format!("CREATE DATABASE {}", database.name),
        format!("ALTER DATABASE {} SET default_transaction_read_only = on", database.name),
    ] {
        psql(&server.admin_url, &sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    Some(user_and_host(&server.admin_url).1.to_owned())
}

impl TestDatabase {
    /// This database's URL naming `address` first, then its own server (as a URL lists a standby and its
    /// primary).
    pub fn url_with_first_host(&self, address: &str) -> String {
        let (start, end) = authority(&self.url);
        let (user, host) = user_and_host(&self.url);
        format!("{}{user}{address},{host}{}", &self.url[..start], &self.url[end..])
    }
}

/// A cluster of its own in a temporary directory; `durable`: fsync on, as PostgreSQL ships.
fn start_private_cluster(durable: bool) -> Result<Server, String> {
    start_cluster(durable, None)
}

/// [`start_private_cluster`], serving TLS with this certificate and key when given, and TCP over TLS only.
fn start_cluster(durable: bool, tls: Option<(&str, &str)>) -> Result<Server, String> {
    let dir = std::env::temp_dir().join(format!("caisse-pg-{}-{:08x}", std::process::id(), rand_u64() as u32));
    std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        run(Command::new("chown").args(["postgres:postgres"]).arg(&dir))?;
    }
    let data = dir.join("data");
    let data_arg = data.to_str().ok_or("a temporary path that is not UTF-8")?;
    let dir_arg = dir.to_str().ok_or("a temporary path that is not UTF-8")?;
    run(&mut as_owner(
        &bin("initdb"),
        &["-D", data_arg, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C", "--no-sync"],
    ))?;
    let port = free_port()?;
    let sync = if durable { "" } else { "-c fsync=off -c full_page_writes=off" };
    let mut options = format!(
        "-p {port} -k {dir_arg} -c listen_addresses=127.0.0.1 {sync} -c max_connections=300 -c shared_buffers=128MB"
    );
    if let Some((cert, key)) = tls {
        let write = |name: &str, text: &str| {
            let path = data.join(name);
            std::fs::write(&path, text).map_err(|e| format!("write {}: {e}", path.display()))
        };
        write("server.crt", cert)?;
        write("server.key", key)?;
        // TCP connections must be TLS; the socket in the directory stays for the server's own tools.
        write("pg_hba.conf", "local all all trust\nhostssl all all 127.0.0.1/32 trust\n")?;
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            run(Command::new("chown").args(["-R", "postgres:postgres"]).arg(&data))?;
        }
        run(Command::new("chmod").arg("600").arg(data.join("server.key")))?;
        options.push_str(" -c ssl=on");
    }
    let log = dir.join("server.log");
    let log_arg = log.to_str().ok_or("a temporary path that is not UTF-8")?;
    run(&mut as_owner(&bin("pg_ctl"), &["-D", data_arg, "-l", log_arg, "-o", &options, "-w", "-t", "60", "start"]))?;
    // The watchdog: once this process is gone, stop the cluster and remove its files.
    let pg_ctl = bin("pg_ctl");
    let stop = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 1; done; {owner}{pg_ctl} -D {data_arg} -m immediate stop >/dev/null 2>&1; rm -rf {dir_arg}",
        pid = std::process::id(),
        owner = if unsafe { libc::geteuid() } == 0 { "runuser -u postgres -- " } else { "" },
        pg_ctl = pg_ctl.display(),
    );
    Command::new("sh")
        .args(["-c", &stop])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("start the cluster's watchdog: {e}"))?;
    Ok(Server { admin_url: format!("postgres://postgres@127.0.0.1:{port}/postgres"), data: Some(data) })
}
