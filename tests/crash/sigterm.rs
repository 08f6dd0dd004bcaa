//! SIGTERM under load, again and again: `caisse serve` stops within its bound every time, whatever the store
//! is doing, and the next start passes its audit (or it would not start) and holds every payment it
//! acknowledged.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use serde_json::json;

use crate::server::{create_merchant, Server};
use crate::support::{free_port, sleep_ms, Api};

/// Stops under test; `CAISSE_SIGTERM_CYCLES` changes it.
const DEFAULT_CYCLES: u32 = 20;
/// What the server promises: requests in flight get 10 s, closing the store 10 s more. The test allows a
/// margin for a loaded machine on top.
const STOP_BOUND: Duration = Duration::from_secs(30);
const WORKERS: usize = 6;

#[actix_web::test]
async fn sigterm_under_load_stops_within_its_bound_and_loses_nothing() {
    let cycles: u32 =
        std::env::var("CAISSE_SIGTERM_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(DEFAULT_CYCLES);
    let dir = tempfile::TempDir::new().expect("temp dir");
    let data_dir = dir.path().join("data");
    let port = free_port();
    let merchant = create_merchant(dir.path(), &data_dir, "term", "http://127.0.0.1:9/hook");
    let api = Api::new(&format!("http://127.0.0.1:{port}"), &merchant.secret_key);
    let acknowledged: Rc<RefCell<Vec<String>>> = Rc::default();
    let mut slowest = Duration::ZERO;
    for cycle in 0..cycles {
        let server = Server::start(dir.path(), &data_dir, port).await;
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| {
                let (api, acknowledged) = (api.clone(), acknowledged.clone());
                actix_web::rt::spawn(async move {
                    for n in 0..10_000u32 {
                        let reference = format!("c{cycle}-w{w}-n{n}");
                        let body = json!({"montant": 1_000, "devise": "XOF", "fournisseur": "mtn_momo",
                            "client_telephone": "+22997000000", "reference": reference});
                        let url = format!("{}/v1/paiement/initier", api.address);
                        let sent = api
                            .client
                            .post(url)
                            .insert_header(("Authorization", format!("Bearer {}", api.key)))
                            .send_json(&body)
                            .await;
                        match sent {
                            Ok(answer) if answer.status().as_u16() == 201 => acknowledged.borrow_mut().push(reference),
                            Ok(_) => {}
                            Err(_) => return,
                        }
                    }
                })
            })
            .collect();
        sleep_ms(150 + 40 * u64::from(cycle % 8)).await;
        let (took, success) = actix_web::rt::task::spawn_blocking(move || server.terminate(STOP_BOUND))
            .await
            .expect("the wait ends")
            .unwrap_or_else(|e| panic!("cycle {cycle}: {e}"));
        assert!(success, "cycle {cycle}: caisse serve exited with a failure after SIGTERM");
        slowest = slowest.max(took);
        for worker in workers {
            worker.await.expect("a load worker ends");
        }
    }
    // The last start: its audit passed, and every acknowledged payment is there.
    let _server = Server::start(dir.path(), &data_dir, port).await;
    let acknowledged = acknowledged.borrow().clone();
    assert!(!acknowledged.is_empty(), "the load got answers");
    for reference in &acknowledged {
        api.send(api.get(&format!("/v1/paiement/{reference}"))).await.expect(200);
    }
    println!(
        "sigterm: {cycles} stops under load, slowest {slowest:?}, {} payments acknowledged and found",
        acknowledged.len()
    );
}
