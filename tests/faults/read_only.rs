//! Read-only: as root, the data directory on an ext4 image that the kernel turns read-only under the running
//! server (its emergency read-only state, as after a filesystem error); not as root, `chmod -R a-w` on the
//! stopped server's data directory. Both end with a start on the read-only directory, which must be refused
//! cleanly, then a restart once writable again, which must find everything acknowledged.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::rig::{log_tail, Api, Caisse, Findings, Started, DEADLINE};
use crate::scenario::{self, Acknowledged};
use crate::volume::{self, Mount};

#[actix_web::test]
async fn a_read_only_data_directory_refuses_writes_with_503_loses_nothing_and_a_restart_recovers() {
    if volume::is_root() {
        emergency_read_only().await;
    } else {
        eprintln!(
            "faults: not root, so the read-only test cannot mount a filesystem to turn read-only under the \
             server; it checks a start on a data directory made read-only by chmod instead"
        );
        chmod_read_only().await;
    }
}

async fn emergency_read_only() {
    let workdir = tempfile::TempDir::new().expect("work dir");
    let mount = Mount::ext4_image(&workdir.path().join("ext4.img"), 64, &workdir.path().join("vol"));
    let mut caisse = Caisse::new(workdir.path(), mount.point.join("data"));
    let key = caisse.create_merchant(None);
    let mut findings = Findings::default();
    let mut acknowledged = Acknowledged::default();
    let fault = "filesystem read-only";

    let mut server = caisse.spawn();
    findings.quote_log(&server.log);
    server.listening().await;
    let api = Api::new(&server, &key);
    let before = scenario::before_fault(&api, &mut acknowledged, &mut findings).await;

    mount.make_read_only();
    let refused = scenario::refused_write(&api, &mut acknowledged, &mut findings, fault).await;
    scenario::while_faulty(&api, &mut acknowledged, &mut findings, fault, &before, refused.as_ref()).await;
    // The kernel keeps this filesystem read-only until it is unmounted, so the fault outlasts the server:
    // ping must keep saying so, and a restart is how it ends.
    scenario::hold(&api, &mut acknowledged, &mut findings, fault, &before).await;

    let stopped = server.stop().await;
    eprintln!("faults: server on the read-only filesystem {stopped}");
    refused_start(&mut caisse, &key, &mut findings, fault).await;

    mount.mount_again();
    let mut server = caisse.spawn();
    findings.quote_log(&server.log);
    server.listening().await;
    let api = Api::new(&server, &key);
    if let Some((reference, amount)) = &refused {
        acknowledged.pay(&api, &mut findings, reference, *amount, "when retried once writable again").await;
    }
    scenario::verify_after_restart(&api, &mut acknowledged, &mut findings).await;
    findings.finish();
}

async fn chmod_read_only() {
    let workdir = tempfile::TempDir::new().expect("work dir");
    let mut caisse = Caisse::new(workdir.path(), workdir.path().join("data"));
    let key = caisse.create_merchant(None);
    let mut findings = Findings::default();
    let mut acknowledged = Acknowledged::default();

    let mut server = caisse.spawn();
    findings.quote_log(&server.log);
    server.listening().await;
    let api = Api::new(&server, &key);
    scenario::before_fault(&api, &mut acknowledged, &mut findings).await;
    let stopped = server.stop().await;
    eprintln!("faults: first server {stopped}");

    {
        let _read_only = ReadOnlyTree::new(&caisse.data_dir);
        refused_start(&mut caisse, &key, &mut findings, "data directory chmod a-w").await;
    }
    let mut server = caisse.spawn();
    findings.quote_log(&server.log);
    server.listening().await;
    let api = Api::new(&server, &key);
    scenario::verify_after_restart(&api, &mut acknowledged, &mut findings).await;
    findings.finish();
}

/// A server started on a read-only data directory must either refuse to start, saying which directory, or
/// serve with writes and ping answering 503; never accept a write, never hang.
async fn refused_start(caisse: &mut Caisse, key: &str, findings: &mut Findings, fault: &str) {
    let mut server = caisse.spawn();
    findings.quote_log(&server.log);
    match server.started(DEADLINE).await {
        Started::Exited(status) => {
            let log = log_tail(&server.log, 10);
            eprintln!("faults: the start with the {fault} was refused ({status}): {log}");
            findings.check(!status.success(), || format!("start with the {fault}: exited with {status}"));
            let dir = caisse.data_dir.to_string_lossy();
            findings.check(log.contains(dir.as_ref()), || {
                format!("start with the {fault}: the refusal does not name the data directory {dir}: {log}")
            });
        }
        Started::Listening => {
            let api = Api::new(&server, key);
            let ping = api.ping().await;
            findings.check(ping.unavailable(), || format!("started with the {fault}, GET /v1/ping answered {ping}"));
            let write = api.pay("demarrage-lecture-seule", 50_001).await;
            findings.check(write.unavailable(), || format!("started with the {fault}, a payment answered {write}"));
            let stopped = server.stop().await;
            eprintln!("faults: server started with the {fault} {stopped}");
        }
        Started::Neither => {
            findings.fail(format!("start with the {fault}: neither refused nor listening after {DEADLINE:?}"))
        }
    }
}

/// `chmod -R a-w` on a directory tree while it lives; write permission comes back when dropped, so that a
/// failed test can still delete its temporary directory.
struct ReadOnlyTree {
    paths: Vec<PathBuf>,
}

impl ReadOnlyTree {
    fn new(root: &Path) -> ReadOnlyTree {
        let mut paths = Vec::new();
        collect(root, &mut paths);
        // Children first, so a directory loses its write permission after its content did.
        for path in paths.iter().rev() {
            set_mode(path, |mode| mode & !0o222);
        }
        ReadOnlyTree { paths }
    }
}

impl Drop for ReadOnlyTree {
    fn drop(&mut self) {
        for path in &self.paths {
            set_mode(path, |mode| mode | 0o200);
        }
    }
}

fn collect(path: &Path, paths: &mut Vec<PathBuf>) {
    paths.push(path.to_owned());
    if path.is_dir() {
        for entry in std::fs::read_dir(path).expect("read data dir").map_while(Result::ok) {
            collect(&entry.path(), paths);
        }
    }
}

fn set_mode(path: &Path, change: impl Fn(u32) -> u32) {
    let mode = std::fs::metadata(path).expect("metadata").permissions().mode();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(change(mode))).expect("chmod");
}
