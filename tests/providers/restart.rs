//! The real `caisse` binary in production mode against the pawaPay fake, killed with SIGKILL while a deposit
//! request is at pawaPay without an answer: the restart asks pawaPay about the same id, sends nothing twice,
//! and the payment ends `succes`, credited once. The restart comes with mtn_momo routed to MTN direct: the
//! waiting deposit keeps the route it was created with.

use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::{free_port, sleep_ms, Api, Fake};

const BIN: &str = env!("CARGO_BIN_EXE_caisse");
const TOKEN: &str = "pawapay-restart-token";

/// A configuration routing mtn_momo to pawaPay for Benin.
const CONFIG: &str = r#"
[[providers]]
code = "mtn_momo"
nom = "MTN Mobile Money"
pays = ["BJ"]
devises = ["XOF"]
operations = ["paiement", "remboursement", "retrait"]
frais = { pourcentage_bps = 150, fixe = 0 }
limites = { XOF = [100, 2000000] }
adapter = "pawapay"
"#;

/// The operator moves mtn_momo to MTN direct while the deposit waits at pawaPay.
fn rerouted() -> String {
    CONFIG.replace(r#"adapter = "pawapay""#, r#"adapter = "mtn_momo""#)
}

fn caisse(work: &Path, fake: &Fake, port: u16) -> Command {
    let mut command = Command::new(BIN);
    command
        .current_dir(work)
        .arg("--config")
        .arg(work.join("caisse.toml"))
        .env("CAISSE_ENVIRONMENT", "production")
        .env("CAISSE_MASTER_KEY", caisse::config::TEST_MASTER_KEY)
        .env("CAISSE_DATA_DIR", work.join("data"))
        .env("CAISSE_LISTEN", format!("127.0.0.1:{port}"))
        .env("CAISSE_LOG", "warn")
        .env("CAISSE_HTTP_WORKERS", "2")
        .env("CAISSE_ADAPTERS_PAWAPAY_BASE_URL", &fake.base)
        .env("CAISSE_ADAPTERS_PAWAPAY_API_TOKEN", TOKEN)
        // MTN direct, configured but unreachable: a query sent there would never settle the deposit.
        .env("CAISSE_ADAPTERS_MTN_MOMO_BASE_URL", format!("http://127.0.0.1:{}", free_port()))
        .env("CAISSE_ADAPTERS_MTN_MOMO_TARGET_ENVIRONMENT", "mtnbenin")
        .env("CAISSE_ADAPTERS_MTN_MOMO_COLLECTION_SUBSCRIPTION_KEY", "sub")
        .env("CAISSE_ADAPTERS_MTN_MOMO_COLLECTION_API_USER", "6f0a3c1e-9a55-4c1b-8d8e-0b1f2a3c4d5e")
        .env("CAISSE_ADAPTERS_MTN_MOMO_COLLECTION_API_KEY", "key")
        .stdin(Stdio::null());
    command
}

/// A running `caisse serve`, killed when dropped, so a failing test leaves no server behind.
struct Server(Child);

impl Server {
    fn kill(&mut self) {
        self.0.kill().expect("SIGKILL");
        self.0.wait().expect("reaped");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `caisse serve` and waits until it listens.
async fn serve(work: &Path, fake: &Fake, port: u16) -> Server {
    let child = caisse(work, fake, port).arg("serve").stdout(Stdio::null()).spawn().expect("caisse serve starts");
    let mut server = Server(child);
    let started = Instant::now();
    loop {
        assert!(server.0.try_wait().expect("the server's state").is_none(), "caisse serve exited at start");
        if TcpStream::connect_timeout(&SocketAddr::from(([127, 0, 0, 1], port)), Duration::from_millis(200)).is_ok() {
            return server;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "caisse serve is not listening");
        sleep_ms(20).await;
    }
}

#[actix_web::test]
async fn a_kill_9_while_a_deposit_is_at_pawapay_then_a_restart_creates_nothing_twice() {
    let work = tempfile::tempdir().expect("work dir");
    std::fs::write(work.path().join("caisse.toml"), CONFIG).expect("config");
    let port = free_port();
    let callback = format!("http://127.0.0.1:{port}/v1/notifications/pawapay");
    let fake =
        Fake::start(&["pawapay", "--listen", "127.0.0.1:0", "--token", TOKEN, "--deposit-callback-url", &callback]);
    let created = caisse(work.path(), &fake, port)
        .args(["merchant", "create", "--name", "Boutique", "--email", "b@example.com", "--json"])
        .output()
        .expect("merchant create runs");
    assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
    let merchant: serde_json::Value = serde_json::from_slice(&created.stdout).expect("one JSON object");
    let api = Api::new(&format!("http://127.0.0.1:{port}"), merchant["secret_key"].as_str().expect("a key"));

    // pawaPay takes the deposit but its answer never comes; the server dies while it waits.
    fake.knobs(json!({"never_answer": 1})).await;
    let mut server = serve(work.path(), &fake, port).await;
    let body = json!({"montant": 1000, "devise": "XOF", "fournisseur": "mtn_momo",
        "client_telephone": "+22951345789", "reference": "order-kill-1"});
    let request = api.post("/v1/paiement/initier").json(&body);
    let pending = actix_web::rt::spawn({
        let api = api.clone();
        async move { api.send(request).await }
    });
    let deadline = Instant::now() + Duration::from_secs(15);
    while !fake.requests().await.iter().any(|r| r["method"] == "POST" && r["path"] == "/v2/deposits") {
        assert!(Instant::now() < deadline, "the deposit never reached pawaPay");
        sleep_ms(20).await;
    }
    server.kill();
    pending.abort();

    // The restart, under the new routes, asks pawaPay about the payment it had sent and applies the answer.
    std::fs::write(work.path().join("caisse.toml"), rerouted()).expect("config");
    let mut server = serve(work.path(), &fake, port).await;
    let paid = api.wait_payment("order-kill-1", "succes").await;
    assert_eq!(paid["montant_net"], 985);
    assert_eq!(api.balance("XOF").await.0, 985);
    // Nothing created twice: pawaPay holds one deposit, and every request for it (the first, and any resend a
    // failed or slow exchange caused, as the adapter may make) carried the one depositId, which pawaPay
    // answers with DUPLICATE_IGNORED.
    let deposits: Vec<_> =
        fake.requests().await.into_iter().filter(|r| r["method"] == "POST" && r["path"] == "/v2/deposits").collect();
    let ids: std::collections::BTreeSet<String> = deposits
        .iter()
        .filter_map(|r| serde_json::from_str::<serde_json::Value>(r["body"].as_str()?).ok())
        .filter_map(|body| body["depositId"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(ids.len(), 1, "one depositId for the payment: {deposits:?}");
    assert_eq!(fake.transactions().await.len(), 1);
    server.kill();
}
