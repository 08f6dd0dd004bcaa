//! Webhooks under a storage fault: a delivery whose outcome cannot be written is not repeated.
//!
//! Delivery is at least once, so an attempt that cannot be recorded could be made again; but while the disk is
//! full every storage fault would then turn into a flood of duplicate webhooks at every merchant with a
//! delivery due, even to receivers that answered 200. The outcome is kept and saved again instead: one attempt
//! per notification while the disk is full, and the retries go on once it has room.

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
    // The outcomes kept are saved once there is room, and the retries go on.
    let after_fault = receiver.hits().len();
    receiver.wait("retries after the fault", DEADLINE, |hits| hits.len() >= after_fault + notifications).await;
    let stopped = server.stop().await;
    eprintln!("faults: {during} webhook deliveries in the {FAULT_S} s the disk was full; the server {stopped}");

    // The first attempt of each notification after the disk filled, whose outcome is then kept, and one already
    // under way.
    let allowed = 2 * notifications;
    assert!(
        during <= allowed,
        "{during} webhook deliveries reached the receiver in the {FAULT_S} s the disk was full, for {notifications} \
         notifications retried every {RETRY_EVERY_S} s; an attempt whose outcome could not be stored is made again \
         instead of its outcome being kept (see the server's 'not persisted' errors)"
    );
}
