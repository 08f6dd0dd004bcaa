//! Webhooks under a storage fault: a delivery whose outcome cannot be written is not repeated at once.
//!
//! Delivery is at least once, so an attempt that cannot be recorded will be made again, and that is fine; but
//! not in a loop. A merchant whose receiver is failing already gets one attempt per scheduled retry; while the
//! disk is full it must not get more than that, or every storage fault turns into a flood of duplicate
//! webhooks at every merchant with a delivery due.

use crate::rig::{Api, Caisse, DEADLINE};
use crate::support::{always, sleep_ms, Receiver};
use crate::volume::{self, Mount};

/// Every notification is retried each second while its receiver fails.
const RETRY_EVERY_S: u64 = 1;
/// How long the disk stays full while deliveries are counted.
const FAULT_S: u64 = 5;

#[actix_web::test]
async fn a_full_disk_does_not_make_webhook_deliveries_repeat_in_a_loop() {
    if !volume::is_root() {
        eprintln!("faults: SKIPPED the webhook test under a full disk: it needs root (CAP_SYS_ADMIN) to mount a tmpfs");
        return;
    }
    let workdir = tempfile::TempDir::new().expect("work dir");
    let mount = Mount::tmpfs(&workdir.path().join("vol"), 64);
    let mut caisse = Caisse::new(workdir.path(), mount.point.join("data"));
    caisse.set("CAISSE_WEBHOOK_RETRY_SCHEDULE", &vec![format!("{RETRY_EVERY_S}s"); 20].join(","));
    // A receiver that answers 500 to everything, so that every notification keeps being retried.
    let receiver = Receiver::start(always(500));
    let key = caisse.create_merchant(Some(&receiver.url()));
    let mut server = caisse.spawn();
    server.listening().await;
    let api = Api::new(&server, &key);

    let paid = api.pay("webhooks-1", 10_000).await;
    assert_eq!(paid.status, 201, "{paid}");
    // payment.initiated, payment.processing and payment.succeeded, each refused once at least.
    let notifications = 3;
    receiver.wait("each notification refused once", DEADLINE, |hits| hits.len() >= notifications).await;

    mount.fill();
    let at_fill = receiver.hits().len();
    sleep_ms(FAULT_S * 1_000).await;
    let during = receiver.hits().len() - at_fill;
    mount.unfill();
    let stopped = server.stop().await;
    eprintln!("faults: {during} webhook deliveries in the {FAULT_S} s the disk was full; the server {stopped}");

    // One attempt per notification per retry; jitter (±20 %, so waits from 0.8 s) and an attempt already under
    // way are allowed for.
    let allowed = notifications * (FAULT_S / RETRY_EVERY_S + 3) as usize;
    assert!(
        during <= allowed,
        "{during} webhook deliveries reached the receiver in the {FAULT_S} s the disk was full; its {notifications} \
         notifications are retried every {RETRY_EVERY_S} s, so at most {allowed} were due: an attempt whose outcome \
         could not be stored is made again at once, in a loop (see the server's 'attempt not persisted' errors)"
    );
}
