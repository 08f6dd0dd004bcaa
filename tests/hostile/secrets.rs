//! Secrets stay secret: no log line carries a secret key, a password or a session cookie, and every place
//! that checks a secret a client sent compares it in constant time.
//!
//! The log test runs the real `caisse` binary, as an operator would, with `CAISSE_LOG=trace` (every crate at
//! every level, so a library that prints headers would show), its stdout and stderr in files. It then goes
//! through each path that handles a secret: a failed and a good dashboard login, the "API keys" page (webhook
//! URL, reveal, roll), API calls with the key, with a near miss of it and with the other environment's
//! prefix, a provider notice with a forged signature, webhook deliveries that fail and are retried, the same
//! with the rolled key, and a logout. Then it searches both outputs for every secret it saw. The only place a
//! key and a password may appear is the banner of the first start on stdout, which shows the demo merchant's
//! once by design (docs/api.md § Dashboard and operator commands); the rolled key must not appear there either.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::agent::Agent;
use crate::support::{always, payment_body, reference_of, until, Api, Receiver};

/// The sandbox simulator's notice secret for this run, so the test can look for it in the logs.
const SANDBOX_SECRET: &str = "sandbox-notice-secret-Qm7vX2pL9wR4";

/// The `caisse serve` process; killed when dropped, whatever happened to the test.
struct Server {
    child: Child,
    dir: tempfile::TempDir,
    address: String,
    key: String,
    password: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn stdout(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stdout.log")).unwrap_or_default()
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr.log")).unwrap_or_default()
    }

    /// Starts the binary on a free loopback port with a fresh data directory and waits until it serves.
    async fn start() -> Server {
        let dir = tempfile::TempDir::new().expect("temp dir");
        let out = File::create(dir.path().join("stdout.log")).expect("stdout file");
        let err = File::create(dir.path().join("stderr.log")).expect("stderr file");
        let mut command = Command::new(env!("CARGO_BIN_EXE_caisse"));
        // The developer's own CAISSE_* settings and caisse.toml must not change the run.
        for (name, _) in std::env::vars().filter(|(name, _)| name.starts_with("CAISSE_")) {
            command.env_remove(name);
        }
        command
            .arg("serve")
            .current_dir(dir.path())
            .env("CAISSE_DATA_DIR", dir.path().join("data"))
            .env("CAISSE_LISTEN", "127.0.0.1:0")
            .env("CAISSE_LOG", "trace")
            // The rolled key must stop at once for the test's last check.
            .env("CAISSE_KEY_ROLL_GRACE", "0")
            .env("CAISSE_HTTP_WORKERS", "2")
            .env("CAISSE_SANDBOX_DELAY_MS", "100")
            .env("CAISSE_WEBHOOK_RETRY_SCHEDULE", "500ms,500ms,500ms")
            .env("CAISSE_SANDBOX_SECRET", SANDBOX_SECRET)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let child = command.spawn().expect("caisse starts");
        let mut server = Server { child, dir, address: String::new(), key: String::new(), password: String::new() };
        let started = Instant::now();
        loop {
            let (stdout, stderr) = (server.stdout(), server.stderr());
            let banner = |label: &str| {
                stdout.lines().find_map(|l| l.strip_prefix(label)).map(|v| v.trim().to_owned()).unwrap_or_default()
            };
            let port = stderr
                .lines()
                .filter(|l| l.contains("caisse is serving"))
                .find_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("port=")).map(str::to_owned));
            if let Some(port) = port {
                server.address = format!("http://127.0.0.1:{port}");
                server.key = banner("secret key:");
                server.password = banner("password:");
                assert!(server.key.starts_with("sk_test_") && !server.password.is_empty(), "banner:\n{stdout}");
                return server;
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("caisse exited with {status}:\n{stdout}\n{stderr}");
            }
            assert!(started.elapsed() < Duration::from_secs(30), "caisse did not start:\n{stdout}\n{stderr}");
            actix_web::rt::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Pays 5 000 XOF from a phone ending in `ending`, under an Idempotency-Key of its own: idempotency keys pass
/// through the same code as the body.
async fn pay(api: &Api, ending: &str) -> Value {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or_default();
    let resp =
        api.send(api.post("/v1/paiement/initier").idem(&format!("k-{nanos}")).json(&payment_body(5000, ending))).await;
    resp.expect(201);
    resp.json
}

/// The status of `GET /v1/soldes` sent with this `Authorization` header, whatever it holds.
async fn soldes_with(api: &Api, authorization: &str) -> u16 {
    api.send(api.get("/v1/soldes").no_auth().header("Authorization", authorization)).await.status
}

/// The cookie values the agent holds now.
fn cookies(agent: &Agent, seen: &mut BTreeSet<String>) {
    seen.extend(agent.cookies.values().filter(|v| !v.is_empty()).cloned());
}

/// The `sk_test_…` key shown in a page.
fn key_in(page: &str) -> String {
    let at = page.find("sk_test_").unwrap_or_else(|| panic!("no key in the page:\n{page}"));
    page[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect()
}

/// Every secret the test went through, to look for in the logs.
#[derive(Default)]
struct Seen {
    /// Keys' near misses, CSRF tokens, and at the end every key, password and cookie.
    secrets: BTreeSet<String>,
    /// The values of the login and session cookies.
    cookies: BTreeSet<String>,
}

#[actix_web::test]
async fn no_log_line_carries_a_key_a_password_or_a_session_cookie() {
    let server = Server::start().await;
    let (old_key, password) = (server.key.clone(), server.password.clone());
    let api = Api::new(&server.address, &old_key);
    let mut seen = Seen::default();
    let wrong_password = format!("not-{password}-at-all");

    // The dashboard: a failed login, a good one, the webhook URL, the key revealed.
    let receiver = Receiver::start(always(500));
    let mut agent = log_in_and_reveal_the_key(&server, &wrong_password, &receiver, &mut seen).await;
    // The API: the key, a near miss of it, the other environment's prefix, a malformed header.
    let paid = pay(&api, "55").await;
    call_with_the_key_and_near_misses(&api, &mut seen).await;
    a_provider_notice_with_a_forged_signature(&server.address, &paid).await;
    // Webhooks: the first attempts fail, the retries are accepted.
    failed_deliveries_are_retried(&receiver, &reference_of(&paid), &old_key).await;
    let (new_key, token) = roll_the_key_and_pay_with_the_new_one(&mut agent, &api, &receiver, &mut seen).await;
    cookies(&agent, &mut seen.cookies);
    agent.post("/logout", &[("csrf", &token)]).await.expect(303);
    seen.secrets.insert(token);

    let (stdout, stderr) = (server.stdout(), server.stderr());
    drop(server);
    for key in [&old_key, &new_key] {
        seen.secrets.insert(key.clone());
        // Without its prefix too: a log that cut `sk_test_` off would still hold the key.
        seen.secrets.insert(key["sk_test_".len()..].to_owned());
    }
    seen.secrets.extend([password.clone(), wrong_password, SANDBOX_SECRET.to_owned()]);
    seen.secrets.extend(seen.cookies.iter().cloned());
    assert!(seen.cookies.len() >= 2, "the login and session cookies were seen: {:?}", seen.cookies);
    no_log_line_holds_a_secret(&stderr, &seen.secrets);
    stdout_holds_only_the_first_banner(&stdout, &seen.secrets, &old_key, &password, &new_key);
}

/// A failed and a good dashboard login, the webhook URL set to `receiver`, the key revealed (and checked to
/// be the banner's). Returns the logged-in agent.
async fn log_in_and_reveal_the_key(
    server: &Server,
    wrong_password: &str,
    receiver: &Receiver,
    seen: &mut Seen,
) -> Agent {
    let email = "demo@caisse.local";
    let mut agent = Agent::new(&server.address);
    agent.login(email, wrong_password).await.expect(401);
    cookies(&agent, &mut seen.cookies);
    agent.login(email, &server.password).await.expect(303);
    cookies(&agent, &mut seen.cookies);
    assert!(agent.cookies.contains_key("caisse_session"), "logged in: {:?}", agent.cookies.keys());
    let keys = agent.get("/keys").await;
    seen.secrets.insert(keys.csrf());
    agent.post("/keys/webhook", &[("csrf", &keys.csrf()), ("webhook_url", &receiver.url())]).await.expect(303);
    let revealed = agent.post("/keys/reveal", &[("csrf", &keys.csrf())]).await;
    assert_eq!(key_in(&revealed.expect(200).body), server.key);
    agent
}

/// The key works; a near miss of it, the other environment's prefix and malformed headers do not.
async fn call_with_the_key_and_near_misses(api: &Api, seen: &mut Seen) {
    let key = &api.key;
    let near_miss = format!("{}{}", &key[..key.len() - 1], if key.ends_with('A') { 'B' } else { 'A' });
    let live = key.replacen("sk_test_", "sk_live_", 1);
    for (authorization, expected) in [
        (format!("Bearer {key}"), 200),
        (format!("Bearer {near_miss}"), 401),
        (format!("Bearer {live}"), 401),
        (format!("Bearer  {key}x"), 401),
        (key.clone(), 401),
    ] {
        assert_eq!(soldes_with(api, &authorization).await, expected, "{authorization}");
    }
    seen.secrets.extend([near_miss, live]);
}

/// A provider notice about `paid` with a forged signature is refused.
async fn a_provider_notice_with_a_forged_signature(address: &str, paid: &Value) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_secs().to_string();
    let client = awc::Client::default();
    let resp = client
        .post(format!("{address}/v1/fournisseurs/mtn_momo/notifications"))
        .insert_header(("X-Sandbox-Signature", format!("sha256={}", "0".repeat(64))))
        .insert_header(("X-Sandbox-Timestamp", now))
        .send_json(&json!({"transaction_id": paid["transaction_id"], "statut": "succes"}))
        .await
        .expect("notice answered");
    assert_eq!(resp.status().as_u16(), 401);
}

/// The receiver refuses the first deliveries (500), then accepts: a retried delivery, all signed with `key`.
async fn failed_deliveries_are_retried(receiver: &Receiver, reference: &str, key: &str) {
    receiver.wait_for(reference, "payment.initiated").await;
    receiver.answer(200);
    receiver.wait_for(reference, "payment.succeeded").await;
    until("a retried delivery", || async {
        receiver.hits().iter().filter(|h| h.text().contains("payment.initiated")).count() >= 2
    })
    .await;
    assert!(receiver.hits().iter().all(|h| h.signed_with(key)));
}

/// The key roll through its confirmation, then the new key at work (and the old one refused). Returns the
/// new key and the CSRF token of the last page.
async fn roll_the_key_and_pay_with_the_new_one(
    agent: &mut Agent,
    api: &Api,
    receiver: &Receiver,
    seen: &mut Seen,
) -> (String, String) {
    let confirm = agent.get("/keys/roll").await;
    seen.secrets.insert(confirm.csrf());
    agent.post("/keys/roll", &[("csrf", &confirm.csrf()), ("confirmer", "oui")]).await.expect(303);
    let keys = agent.get("/keys").await;
    let new_key = key_in(&agent.post("/keys/reveal", &[("csrf", &keys.csrf())]).await.expect(200).body);
    assert_ne!(new_key, api.key);
    assert_eq!(soldes_with(api, &format!("Bearer {}", api.key)).await, 401);
    let paid = pay(&api.with_key(&new_key), "66").await;
    let hit = receiver.wait_for(&reference_of(&paid), "payment.succeeded").await;
    assert!(hit.signed_with(&new_key));
    (new_key, keys.csrf())
}

/// The log was at trace level and logged requests and logins, and not one line holds a secret.
fn no_log_line_holds_a_secret(stderr: &str, secrets: &BTreeSet<String>) {
    assert!(stderr.contains("TRACE"), "the log was not at trace level:\n{stderr}");
    assert!(stderr.contains("caisse::http"), "no request was logged:\n{stderr}");
    assert!(stderr.contains("caisse::dashboard"), "no dashboard login was logged:\n{stderr}");
    for secret in secrets {
        let lines: Vec<&str> = stderr.lines().filter(|l| l.contains(secret.as_str())).collect();
        assert!(lines.is_empty(), "a log line holds the secret `{secret}`:\n{}", lines.join("\n"));
    }
}

/// Stdout: only the first start's banner, and there only the demo merchant's original key and password; the
/// rolled key never.
fn stdout_holds_only_the_first_banner(
    stdout: &str,
    secrets: &BTreeSet<String>,
    old_key: &str,
    password: &str,
    new_key: &str,
) {
    for secret in secrets {
        for line in stdout.lines().filter(|l| l.contains(secret.as_str())) {
            let the_key = *secret == old_key || *secret == old_key["sk_test_".len()..];
            let allowed =
                (the_key && line.starts_with("secret key:")) || (*secret == password && line.starts_with("password:"));
            assert!(allowed, "stdout holds the secret `{secret}`: {line}");
        }
    }
    assert!(!stdout.contains(new_key), "the rolled key reached stdout");
}

/// Where a client's secret meets the server's: the API key, the webhook and provider-notice signatures, the
/// dashboard's CSRF tokens. Each uses `subtle::ConstantTimeEq`, and no code that handles requests compares a
/// secret with `==` or `!=`, whose time depends on how many leading bytes match. A source check, because a
/// timing difference of a few nanoseconds is not measurable reliably in a test.
#[test]
fn secrets_are_compared_in_constant_time() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |path: &str| std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    let extract = read("src/http/extract.rs");
    assert!(
        extract.contains("merchant_by_key(") && extract.contains("secret_key.as_bytes().ct_eq("),
        "the API key is looked up by its hash, then compared whole in constant time (src/http/extract.rs)"
    );
    for (path, what, at_least) in [
        ("actors/src/webhook/signature.rs", "webhook signatures", 1),
        ("src/providers/sandbox.rs", "provider notice signatures", 1),
        ("src/dashboard/auth.rs", "the session's and the login form's CSRF tokens", 2),
    ] {
        let uses = read(path).matches(".ct_eq(").count();
        assert!(uses >= at_least, "{what} are compared with ct_eq in {path} ({uses} uses)");
    }
    assert!(
        read("src/dashboard/auth.rs").contains("Sha256::digest"),
        "sessions are kept under the SHA-256 of their id"
    );

    const SENSITIVE: [&str; 6] = ["secret", "signature", "csrf", "password", "token", "session"];
    let mut found = Vec::new();
    for dir in ["src/http", "src/dashboard", "src/payer", "src/providers", "actors/src/webhook"] {
        for path in rust_files(&root.join(dir)) {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            // Unit tests compare known values on purpose.
            let code = text.split("#[cfg(test)]").next().unwrap_or("");
            for (n, line) in code.lines().enumerate() {
                let line = line.split("//").next().unwrap_or("").to_lowercase();
                let compares = line.contains("==") || line.contains("!=");
                let sizes_only = line.contains(".len()") || line.contains("is_empty()");
                if compares && !sizes_only && SENSITIVE.iter().any(|w| line.contains(w)) {
                    found.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
                }
            }
        }
    }
    assert!(found.is_empty(), "secrets compared with == or != (use subtle::ConstantTimeEq):\n{}", found.join("\n"));
}

fn rust_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}
