//! The real `caisse` binary in production: it starts without a demo merchant and prints no key, and the
//! `caisse merchant` commands manage accounts through the running server's admin API, or on the store once it
//! is stopped.

use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{free_port, sleep_ms, Api};
use crate::TOKEN;

const BIN: &str = env!("CARGO_BIN_EXE_caisse");

fn caisse(work: &Path, port: u16, admin_port: u16, token: Option<&str>) -> Command {
    let mut command = Command::new(BIN);
    command
        .current_dir(work)
        .env("CAISSE_ENVIRONMENT", "production")
        .env("CAISSE_MASTER_KEY", caisse::config::TEST_MASTER_KEY)
        .env("CAISSE_DATA_DIR", work.join("data"))
        .env("CAISSE_LISTEN", format!("127.0.0.1:{port}"))
        .env("CAISSE_ADMIN_LISTEN", format!("127.0.0.1:{admin_port}"))
        .env("CAISSE_LOG", "warn")
        .env("CAISSE_HTTP_WORKERS", "1")
        .env_remove("CAISSE_ADMIN_TOKEN")
        .stdin(Stdio::null());
    if let Some(token) = token {
        command.env("CAISSE_ADMIN_TOKEN", token);
    }
    command
}

/// A running `caisse serve`, killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn listening(server: &mut Server, port: u16) {
    let started = Instant::now();
    loop {
        assert!(server.0.try_wait().expect("the server's state").is_none(), "caisse serve exited at start");
        if TcpStream::connect_timeout(&SocketAddr::from(([127, 0, 0, 1], port)), Duration::from_millis(200)).is_ok() {
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "nothing listens on {port}");
        sleep_ms(20).await;
    }
}

fn run(command: &mut Command) -> Output {
    command.output().expect("caisse runs")
}

/// `caisse merchant create` of the merchant "Boutique", through `command` (the server's admin API or the store).
fn create_boutique(mut command: Command) -> Vec<Value> {
    let created = json_lines(&run(command.args([
        "merchant",
        "create",
        "--name",
        "Boutique",
        "--email",
        "b@example.com",
        "--json",
    ])));
    for value in &created {
        let mut fields: Vec<&str> =
            value.as_object().map(|o| o.keys().map(String::as_str).collect()).unwrap_or_default();
        fields.sort_unstable();
        assert_eq!(fields, ["email", "id", "password", "secret_key", "webhook_url"], "the contract's five: {value}");
    }
    created
}

fn json_lines(output: &Output) -> Vec<Value> {
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).lines().map(|l| serde_json::from_str(l).expect("one JSON object")).collect()
}

/// Walks the data directory: no file holds `key` (nor its random part) in clear, the directory is 0700 and
/// every file is its owner's only.
fn secrets_sealed_and_private(data: &Path, key: &str) {
    use std::os::unix::fs::PermissionsExt;
    let random = key.trim_start_matches("sk_live_").as_bytes();
    let mut files = 0;
    let mut pending = vec![data.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let mode = std::fs::metadata(&dir).expect("a directory").permissions().mode();
        assert_eq!(mode & 0o077, 0, "{} is {mode:o}", dir.display());
        for entry in std::fs::read_dir(&dir).expect("readable") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            let mode = std::fs::metadata(&path).expect("a file").permissions().mode();
            assert_eq!(mode & 0o077, 0, "{} is {mode:o}", path.display());
            let bytes = std::fs::read(&path).expect("readable");
            assert!(!bytes.windows(random.len()).any(|w| w == random), "{} holds the key in clear", path.display());
            files += 1;
        }
    }
    assert!(files > 3, "the store's files were read");
}

#[test]
fn production_refuses_to_start_without_a_master_key() {
    let work = tempfile::tempdir().expect("work dir");
    let output =
        caisse(work.path(), free_port(), free_port(), None).env_remove("CAISSE_MASTER_KEY").arg("serve").output();
    let output = output.expect("caisse runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("master_key") && stderr.contains("caisse keygen"), "{stderr}");
    assert!(!work.path().join("data").exists(), "nothing was created");
    let bad =
        caisse(work.path(), free_port(), free_port(), None).env("CAISSE_MASTER_KEY", "c2hvcnQ=").arg("serve").output();
    let stderr = String::from_utf8_lossy(&bad.expect("caisse runs").stderr).into_owned();
    assert!(stderr.contains("5 bytes; a master key is 32"), "{stderr}");
    let key = Command::new(BIN).arg("keygen").output().expect("caisse keygen runs");
    let printed = String::from_utf8_lossy(&key.stdout);
    assert_eq!(printed.trim().len(), 44, "32 bytes in base64: {printed}");
}

/// A master key other than the one the store was written with (a re-run `caisse keygen`, a mistyped key file)
/// stops the start with the reason, instead of a server whose every request fails.
#[test]
fn another_master_key_stops_the_start() {
    let work = tempfile::tempdir().expect("work dir");
    create_boutique(caisse(work.path(), free_port(), free_port(), None));
    let other = String::from_utf8_lossy(&run(Command::new(BIN).arg("keygen")).stdout).trim().to_owned();
    let mut command = caisse(work.path(), free_port(), free_port(), None);
    let child = command.env("CAISSE_MASTER_KEY", &other).arg("serve").stderr(Stdio::piped()).spawn();
    let mut server = Server(child.expect("caisse serve starts"));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = server.0.try_wait().expect("the server's state") {
            break status;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "caisse serve started with another master key");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success());
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut server.0.stderr.take().expect("stderr"), &mut stderr).expect("stderr");
    assert!(stderr.contains("does not open with this master key"), "{stderr}");
    // Nor does a command on the store make a merchant sealed under the other key.
    let mut create = caisse(work.path(), free_port(), free_port(), None);
    create.env("CAISSE_MASTER_KEY", &other).args(["merchant", "create", "--name", "Autre", "--email", "a@example.com"]);
    let refused = run(&mut create);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("does not open with this master key"));
}

#[actix_web::test]
async fn production_starts_empty_and_merchants_are_managed_while_it_runs() {
    let work = tempfile::tempdir().expect("work dir");
    let (port, admin_port) = (free_port(), free_port());
    let stdout = work.path().join("stdout");
    let stderr = work.path().join("stderr");
    let mut server = Server(
        caisse(work.path(), port, admin_port, Some(TOKEN))
            .arg("serve")
            .env("CAISSE_LOG_FORMAT", "json")
            .env("CAISSE_LOG", "info")
            .stdout(std::fs::File::create(&stdout).expect("stdout file"))
            .stderr(std::fs::File::create(&stderr).expect("stderr file"))
            .spawn()
            .expect("caisse serve starts"),
    );
    listening(&mut server, port).await;
    listening(&mut server, admin_port).await;
    let admin = Api::new(&format!("http://127.0.0.1:{admin_port}"), TOKEN);
    let listed = admin.fetch(admin.get("/admin/merchants")).await;
    assert_eq!(listed.json["data"], serde_json::json!([]), "production starts without a demo merchant");

    let created = create_boutique(caisse(work.path(), port, admin_port, Some(TOKEN)));
    let key = created[0]["secret_key"].as_str().expect("a key");
    assert!(key.starts_with("sk_live_"));
    let id = created[0]["id"].as_str().expect("an id").to_owned();
    let api = Api::new(&format!("http://127.0.0.1:{port}"), key);
    api.send(api.get("/v1/soldes")).await.expect(200);

    let suspended = run(caisse(work.path(), port, admin_port, Some(TOKEN)).args(["merchant", "suspend", &id]));
    assert!(suspended.status.success(), "{}", String::from_utf8_lossy(&suspended.stderr));
    api.send(api.get("/v1/soldes")).await.expect(403);
    let listed =
        json_lines(&run(caisse(work.path(), port, admin_port, Some(TOKEN)).args(["merchant", "list", "--json"])));
    assert_eq!((listed.len(), listed[0]["statut"].as_str()), (1, Some("suspendu")));

    // Without the token the command cannot reach the server, and the store is the server's: it says what to do.
    let refused = run(caisse(work.path(), port, admin_port, None).args(["merchant", "list"]));
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("admin token"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );

    // The full audit, now, through the admin API: it passes, and the metrics count it.
    let audited = json_lines(&run(caisse(work.path(), port, admin_port, Some(TOKEN)).arg("audit")));
    assert_eq!((audited.len(), audited[0]["audit"].as_str()), (1, Some("passed")), "{audited:?}");
    assert_eq!(audited[0]["merchants"], 0, "no merchant has a ledger yet: {audited:?}");
    let metrics = String::from_utf8_lossy(&admin.fetch(admin.get("/metrics")).await.body).into_owned();
    assert!(metrics.contains("caisse_ledger_audits_total{kind=\"full\",result=\"passed\"} 1"), "{metrics}");
    assert!(metrics.contains("caisse_ledger_audit_failing{kind=\"since_checkpoints\"} 0"), "{metrics}");

    drop(server);
    // Stopped, the audit runs on the store.
    let audited = json_lines(&run(caisse(work.path(), port, admin_port, None).arg("audit")));
    assert_eq!(audited[0]["audit"], "passed", "{audited:?}");
    let printed = std::fs::read_to_string(&stdout).expect("stdout");
    assert!(!printed.contains(key) && !printed.contains("sk_live_"), "no key on stdout: {printed}");
    // log_format = "json": every line an object with the four fields, the request lines with theirs.
    let logs = std::fs::read_to_string(&stderr).expect("stderr");
    let lines: Vec<Value> =
        logs.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))).collect();
    assert!(lines.len() >= 3, "{logs}");
    for line in &lines {
        for field in ["timestamp", "level", "target", "message"] {
            assert!(line.get(field).is_some_and(Value::is_string), "{field} missing: {line}");
        }
    }
    let request =
        lines.iter().find(|l| l["message"] == "request" && l["path"] == "/v1/soldes").expect("a request line");
    assert!(request["request_id"].as_str().is_some_and(|id| id.starts_with("req_")), "{request}");
    assert!(!logs.contains(key), "no key in the logs");
    // What the embedded engine logs through the `log` crate reaches the same log, under its own target.
    assert!(lines.iter().any(|l| l["target"].as_str().is_some_and(|t| t.starts_with("fjall"))), "{logs}");

    // At rest: the key is nowhere in the data directory's bytes, which only the service's user can read.
    secrets_sealed_and_private(&work.path().join("data"), key);

    // Stopped: the same commands work on the store.
    let resumed = run(caisse(work.path(), port, admin_port, Some(TOKEN)).args(["merchant", "resume", &id]));
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
    let listed = json_lines(&run(caisse(work.path(), port, admin_port, None).args(["merchant", "list", "--json"])));
    assert_eq!(listed[0]["statut"], "actif");
}

/// A payment link's page offers the link's fournisseurs that are active now. After a restart in which one has
/// lost its adapter (its route goes to an adapter without credentials), the page leaves it out, and a link with
/// no fournisseur left says payment is impossible for now, with no form.
#[actix_web::test]
async fn a_links_page_offers_only_the_fournisseurs_active_now() {
    let work = tempfile::tempdir().expect("work dir");
    let (port, admin_port) = (free_port(), free_port());
    let defaults = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/caisse.default.toml"))
        .expect("the default configuration");
    std::fs::write(work.path().join("caisse.toml"), &defaults).expect("caisse.toml");
    let serve = || {
        let mut command = caisse(work.path(), port, admin_port, None);
        command
            .arg("serve")
            .env("CAISSE_SANDBOX_SIMULATOR", "true")
            .env("CAISSE_PUBLIC_URL", "https://pay.example.com")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        Server(command.spawn().expect("caisse serve starts"))
    };
    let created = create_boutique(caisse(work.path(), port, admin_port, None));
    let api = Api::new(&format!("http://127.0.0.1:{port}"), created[0]["secret_key"].as_str().expect("a key"));
    let mut server = serve();
    listening(&mut server, port).await;
    let mut links = Vec::new();
    for providers in [serde_json::json!(["mtn_momo", "moov_money"]), serde_json::json!(["moov_money"])] {
        let body =
            serde_json::json!({"montant": 1_000, "devise": "XOF", "description": "x", "fournisseurs": providers});
        let link = api.send(api.post("/v1/liens").json(&body)).await;
        link.expect(201);
        links.push(link.json["id"].as_str().expect("an id").to_owned());
    }
    let page = api.fetch(api.get(&format!("/payer/{}", links[0])).no_auth()).await;
    let html = String::from_utf8_lossy(&page.body).into_owned();
    assert!(html.contains("value=\"mtn_momo\"") && html.contains("value=\"moov_money\""), "{html}");
    drop(server);

    let moov_without_adapter =
        defaults.replace("code = \"moov_money\"\n", "code = \"moov_money\"\nadapter = \"wave\"\n");
    assert_ne!(moov_without_adapter, defaults, "the configuration names moov_money");
    std::fs::write(work.path().join("caisse.toml"), moov_without_adapter).expect("caisse.toml");
    let mut server = serve();
    listening(&mut server, port).await;
    let page = api.fetch(api.get(&format!("/payer/{}", links[0])).no_auth()).await;
    page.expect(200);
    let html = String::from_utf8_lossy(&page.body).into_owned();
    assert!(html.contains("value=\"mtn_momo\"") && !html.contains("value=\"moov_money\""), "{html}");
    let none_left = api.fetch(api.get(&format!("/payer/{}", links[1])).no_auth()).await;
    assert_eq!(none_left.status, 503);
    let html = String::from_utf8_lossy(&none_left.body).into_owned();
    assert!(html.contains("Aucun moyen de paiement") && !html.contains("<form"), "{html}");
}

/// The secret key of the merchant in `tests/fixtures/sled-store.tar.gz`.
const FIXTURE_KEY: &str = "sk_test_luqpTDTtcBFckMR5RLQ3ARHqaOVtBWHk";

/// A store an earlier release made on sled moves to fjall with `caisse upgrade-store`, the server stopped.
///
/// The fixture is a sandbox store the last release with sled wrote through its API: a merchant, three
/// payments (one declined) and a partial refund, then a graceful stop, which left them in sled's files; then
/// two more payments and a payout, all final, and a SIGKILL, which left those in its write-ahead log only. This
/// release refuses to open it and says what to do; the upgrade copies both parts, audits the copy, which takes
/// the data directory's place, and keeps the sled store beside it; the server then answers for every payment
/// and the balance as the old one did; a second run finds nothing to upgrade.
#[actix_web::test]
async fn a_sled_store_is_upgraded_to_fjall_and_kept_beside() {
    let work = tempfile::tempdir().expect("work dir");
    let data = work.path().join("data");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sled-store.tar.gz");
    let untar = Command::new("tar").arg("xzf").arg(&fixture).current_dir(work.path()).status().expect("tar runs");
    assert!(untar.success() && data.join("db").exists() && data.join("wal").join("0000000000000003.wal").exists());
    let sandbox = |command: &mut Command| -> Output { run(command.env("CAISSE_ENVIRONMENT", "sandbox")) };

    let refused = sandbox(caisse(work.path(), 0, 0, None).args(["merchant", "list", "--json"]));
    assert!(!refused.status.success(), "a sled store is not opened");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("caisse upgrade-store"), "{refused:?}");

    let upgraded = sandbox(caisse(work.path(), 0, 0, None).arg("upgrade-store"));
    let report = &json_lines(&upgraded)[0];
    assert_eq!(report["audit"], "passed", "{report}");
    assert_eq!(report["engine"], "fjall", "{report}");
    assert!(report["log_records"].as_u64().unwrap_or(0) > 0, "the write-ahead log was replayed: {report}");
    assert!(data.join("keyspace").is_dir() && !data.join("db").exists(), "the data directory is fjall's now");
    assert!(work.path().join("data.sled").join("db").exists(), "the sled store is kept beside");

    let listed = json_lines(&sandbox(caisse(work.path(), 0, 0, None).args(["merchant", "list", "--json"])));
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["email"], "ancienne@example.com");
    let port = free_port();
    let mut server = Server(
        caisse(work.path(), port, free_port(), None)
            .env("CAISSE_ENVIRONMENT", "sandbox")
            .arg("serve")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("caisse serve starts"),
    );
    listening(&mut server, port).await;
    let api = Api::new(&format!("http://127.0.0.1:{port}"), FIXTURE_KEY);
    for (reference, status) in [
        ("order-1", "rembourse_partiellement"),
        ("order-2", "echec"),
        ("order-3", "succes"),
        ("order-4", "succes"),
        ("order-5", "succes"),
    ] {
        let payment = api.get_ok(&format!("/v1/paiement/{reference}")).await;
        assert_eq!(payment["statut"], status, "{payment}");
    }
    let transactions = api.get_ok("/v1/transactions?limit=100").await;
    let kinds: Vec<(&str, &str)> = transactions["data"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|t| (t["type"].as_str().unwrap_or(""), t["statut"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(kinds.len(), 7, "{transactions}");
    assert!(kinds.contains(&("retrait", "traite")) && kinds.contains(&("remboursement", "succes")), "{kinds:?}");
    let balances = api.get_ok("/v1/soldes").await;
    assert_eq!(balances["data"][0]["disponible"], 18_670, "{balances}");
    drop(server);

    let again = sandbox(caisse(work.path(), 0, 0, None).arg("upgrade-store"));
    assert!(!again.status.success(), "nothing left to upgrade");
    assert!(String::from_utf8_lossy(&again.stderr).contains("nothing to upgrade"));
}

/// A backup an earlier release made on sled restores as that release's store: the copy stays in the data
/// directory, refused as any sled store with what to do, and `caisse upgrade-store` then moves it onto fjall.
#[test]
fn a_backup_made_on_sled_is_kept_by_restore_for_the_upgrade() {
    let work = tempfile::tempdir().expect("work dir");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sled-store.tar.gz");
    let untar = Command::new("tar").arg("xzf").arg(&fixture).current_dir(work.path()).status().expect("tar runs");
    assert!(untar.success());
    let backup = work.path().join("backup");
    std::fs::rename(work.path().join("data"), &backup).expect("the fixture as a backup");
    let data = work.path().join("data");
    let sandbox = |command: &mut Command| -> Output { run(command.env("CAISSE_ENVIRONMENT", "sandbox")) };

    let restored = sandbox(caisse(work.path(), 0, 0, None).args(["restore", "--from"]).arg(&backup));
    assert!(!restored.status.success(), "a sled store is not opened");
    assert!(String::from_utf8_lossy(&restored.stderr).contains("caisse upgrade-store"), "{restored:?}");
    assert!(data.join("db").exists(), "the copy stays for the upgrade");

    let upgraded = sandbox(caisse(work.path(), 0, 0, None).arg("upgrade-store"));
    assert_eq!(json_lines(&upgraded)[0]["audit"], "passed");
    let listed = json_lines(&sandbox(caisse(work.path(), 0, 0, None).args(["merchant", "list", "--json"])));
    assert_eq!(listed.len(), 1, "{listed:?}");
}
