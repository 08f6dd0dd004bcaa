//! Disk full: the data directory on a 64 MiB tmpfs, filled to ENOSPC under a running server, then emptied.

use crate::rig::{Api, Caisse, Findings};
use crate::scenario::{self, Acknowledged};
use crate::volume::{self, Mount};

#[actix_web::test]
async fn a_full_disk_refuses_writes_with_503_loses_nothing_and_the_server_recovers_when_space_returns() {
    if !volume::is_root() {
        eprintln!(
            "faults: SKIPPED the disk-full test: it needs root (CAP_SYS_ADMIN) to mount a small tmpfs to fill; \
             there is no unprivileged way to fill a filesystem of its own without filling the machine's"
        );
        return;
    }
    let workdir = tempfile::TempDir::new().expect("work dir");
    let mount = Mount::tmpfs(&workdir.path().join("vol"), 64);
    let mut caisse = Caisse::new(workdir.path(), mount.point.join("data"));
    let key = caisse.create_merchant(None);
    let mut findings = Findings::default();
    let mut acknowledged = Acknowledged::default();
    let fault = "disk full";

    let mut server = caisse.spawn();
    findings.quote_log(&server.log);
    server.listening().await;
    let api = Api::new(&server, &key);
    let before = scenario::before_fault(&api, &mut acknowledged, &mut findings).await;

    let filled = mount.fill();
    eprintln!("faults: {} MiB filler written; the tmpfs is full", filled >> 20);
    let refused = scenario::refused_write(&api, &mut acknowledged, &mut findings, fault).await;
    scenario::while_faulty(&api, &mut acknowledged, &mut findings, fault, &before, refused.as_ref()).await;

    scenario::hold(&api, &mut acknowledged, &mut findings, fault, &before).await;
    mount.unfill();
    scenario::recovered(&api, &mut acknowledged, &mut findings, fault, refused.as_ref()).await;
    acknowledged.pay(&api, &mut findings, "apres-2", 30_002, "after the disk-full fault").await;

    let stopped = server.stop().await;
    eprintln!("faults: first server {stopped}");
    let mut server = caisse.spawn();
    findings.quote_log(&server.log);
    // Refusing to start here would mean the fault broke what is stored (the startup audit refuses any ledger
    // disagreement): nothing else can be checked then.
    server.listening().await;
    let api = Api::new(&server, &key);
    scenario::verify_after_restart(&api, &mut acknowledged, &mut findings).await;
    findings.finish();
}
