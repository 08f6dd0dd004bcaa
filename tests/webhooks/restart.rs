//! A crash loses no notification: the real binary is killed (SIGKILL) with retries pending, restarted on
//! the same data directory, and delivers every notification exactly as stored.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Stdio};

use caisse_engine::domain::ids::MerchantId;
use caisse_engine::domain::records::{DeliveryState, Notification};
use caisse_engine::store::fjall_store::DEFAULT_CACHE_BYTES;
use caisse_engine::store::open_embedded;
use serde_json::Value;

use crate::delivery::assert_signed;
use crate::process::ChildProcess;
use crate::support::app::SANDBOX_DELAY_MS;
use crate::support::*;

const BIN: &str = env!("CARGO_BIN_EXE_caisse");

fn caisse(data_dir: &Path) -> Command {
    let mut command = Command::new(BIN);
    command
        .current_dir(data_dir)
        .env("CAISSE_DATA_DIR", data_dir.join("data"))
        .env("CAISSE_LOG", "warn")
        .env("CAISSE_HTTP_WORKERS", "1")
        // Twenty quick retries: plenty still pending when the process is killed.
        .env("CAISSE_WEBHOOK_RETRY_SCHEDULE", vec!["300ms"; 20].join(","))
        .env("CAISSE_SANDBOX_DELAY_MS", SANDBOX_DELAY_MS.to_string());
    command
}

/// `caisse serve` on `port`, answering `/v1/ping`.
async fn serve(data_dir: &Path, port: u16) -> ChildProcess {
    let mut command = caisse(data_dir);
    command.arg("serve").env("CAISSE_LISTEN", format!("127.0.0.1:{port}")).stderr(Stdio::inherit());
    let mut child = ChildProcess::spawn(command).expect("caisse serve starts");
    child.wait_listening(port, "caisse serve").await;
    child
}

const EVENTS: [&str; 3] = ["payment.initiated", "payment.processing", "payment.succeeded"];

#[actix_web::test]
async fn a_kill_9_with_retries_pending_then_a_restart_delivers_every_notification_as_stored() {
    let dir = tempfile::TempDir::new().expect("temp dir");
    let receiver = Receiver::start(always(503));
    let (merchant, key) = create_merchant(dir.path(), &format!("{}/hook", receiver.base));
    let port = free_port();
    let reference = kill_with_retries_pending(dir.path(), port, &key, &receiver).await;

    receiver.set_script(always(200));
    let mut second = serve(dir.path(), port).await;
    let hits = receiver
        .wait("each event acknowledged after the restart", DEADLINE, |hits| {
            let acknowledged: BTreeSet<String> = hits.iter().filter(|h| h.answered == 200).map(|h| h.event()).collect();
            EVENTS.iter().all(|e| acknowledged.contains(*e))
        })
        .await;
    // Let the last attempts be written, then stop the server (again the hard way) to read its store.
    sleep_ms(300).await;
    second.child.kill().expect("SIGKILL");
    second.child.wait().expect("reaped");
    let store = eventually("the store opens", DEADLINE, || {
        std::future::ready(
            open_embedded(&dir.path().join("data"), DEFAULT_CACHE_BYTES, None).map_err(|e| e.to_string()),
        )
    })
    .await;
    let stored = store.notifications(&merchant, None, 100, &mut |_| true).expect("notifications").data;
    check_delivered_as_stored(&stored, &reference, &hits, &key);
}

/// `caisse merchant create` with webhooks to `webhook_url`: the merchant's id and secret key.
fn create_merchant(dir: &Path, webhook_url: &str) -> (MerchantId, String) {
    let created = caisse(dir)
        .args(["merchant", "create", "--name", "Crashy", "--email", "crash@example.com", "--json"])
        .args(["--webhook-url", webhook_url])
        .output()
        .expect("caisse merchant create runs");
    assert!(created.status.success(), "merchant create: {}", String::from_utf8_lossy(&created.stderr));
    let created: Value = serde_json::from_slice(&created.stdout).expect("one JSON object");
    let key = created["secret_key"].as_str().expect("secret_key").to_owned();
    let merchant = MerchantId::parse(created["id"].as_str().expect("id")).expect("a merchant id");
    (merchant, key)
}

/// Serves on `port`, pays, waits until the receiver (answering 503) has refused every event twice, so each
/// notification is pending with retries to come, and kills the server with SIGKILL. Returns the payment.
async fn kill_with_retries_pending(dir: &Path, port: u16, key: &str, receiver: &Receiver) -> String {
    let mut first = serve(dir, port).await;
    let api = Api::new(&format!("http://127.0.0.1:{port}"), key);
    let reference = reference_of(&api.pay(10_000, "99").await);
    api.wait_payment(&reference, "succes").await;
    receiver
        .wait("each event refused twice", DEADLINE, |hits| {
            EVENTS.iter().all(|e| hits.iter().filter(|h| h.event() == *e).count() >= 2)
        })
        .await;
    first.child.kill().expect("SIGKILL");
    let killed = first.child.wait().expect("reaped");
    assert!(!killed.success(), "killed, not exited: {killed}");
    reference
}

/// Each of the payment's notifications is delivered, after at least one logged refusal, and every attempt
/// (before and after the crash) sent the stored bytes.
fn check_delivered_as_stored(stored: &[Notification], reference: &str, hits: &[Hit], key: &str) {
    let mine: Vec<_> = stored.iter().filter(|n| n.reference == reference).collect();
    assert_eq!(mine.len(), 3, "{}", describe(stored));
    for n in mine {
        assert_eq!(n.state, DeliveryState::Delivered, "{}", describe(std::slice::from_ref(n)));
        // Two refusals seen means the first was persisted before the second was sent (the last one may have
        // been in flight when the process died): at least one logged 503 before the 200.
        assert!(n.total_attempts >= 2, "refused, then acknowledged: {}", describe(std::slice::from_ref(n)));
        assert!(n.attempts.iter().rev().skip(1).all(|a| a.http_status == Some(503)), "{:?}", n.attempts);
        assert_eq!(n.attempts.last().and_then(|a| a.http_status), Some(200));
        let acknowledged: Vec<&Hit> =
            hits.iter().filter(|h| h.answered == 200 && h.event() == n.event.as_str()).collect();
        assert!(!acknowledged.is_empty());
        for hit in acknowledged {
            assert_eq!(hit.body, n.body.as_bytes(), "delivered exactly as stored");
            assert_signed(hit, key);
        }
        for hit in hits.iter().filter(|h| h.event() == n.event.as_str()) {
            assert_eq!(hit.body, n.body.as_bytes(), "every attempt, before and after the crash, sends the same bytes");
        }
    }
}
