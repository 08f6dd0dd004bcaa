//! The embedded engine's journal on a full disk: a batch whose journal write fails part-way is refused, never
//! acknowledged. fjall 2.11.2 discarded that error and acknowledged the batch, whose cut record the next recovery
//! then dropped with every batch after it; Caisse builds a copy with the error handled (vendor/README.md).
//!
//! The test mounts a small tmpfs of its own, so it needs root (as the server's storage fault tests do, which
//! `.ci/run` runs as root); run by another user it says so and checks nothing.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Unmounts the tmpfs when dropped, even when the test panics.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(point: &Path, size_mib: u64) -> Tmpfs {
        std::fs::create_dir_all(point).expect("mount point");
        let size = format!("size={size_mib}m");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &size, "tmpfs"])
            .arg(point)
            .status()
            .expect("`mount` runs");
        assert!(status.success(), "cannot mount a tmpfs at {}: run this test as root", point.display());
        Tmpfs(point.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

#[test]
fn a_batch_whose_journal_write_fails_part_way_is_refused() {
    if !is_root() {
        eprintln!("journal_full: skipped, mounting a tmpfs needs root");
        return;
    }
    let base = tempfile::tempdir().expect("tempdir");
    let point = base.path().join("small");
    let _mount = Tmpfs::mount(&point, 8);
    let keyspace = fjall::Config::new(point.join("keyspace")).open().expect("keyspace");
    let tree = keyspace.open_partition("records", Default::default()).expect("partition");
    let mut first = keyspace.batch().durability(Some(fjall::PersistMode::SyncData));
    first.insert(&tree, "small", "fits");
    first.commit().expect("a batch that fits is written");

    // The disk full but for 256 KiB; then a record of 1 MiB, larger than the journal's buffer, so it goes to
    // the file directly and stops part-way.
    let filler = point.join("filler");
    let mut file = OpenOptions::new().create(true).write(true).truncate(true).open(&filler).expect("filler");
    let chunk = vec![0u8; 64 << 10];
    let mut written = 0u64;
    while written < 64 << 20 {
        match file.write(&chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => written += n as u64,
        }
    }
    file.set_len(written.saturating_sub(256 << 10)).expect("room for part of the record");
    drop(file);

    let mut big = keyspace.batch().durability(Some(fjall::PersistMode::SyncData));
    big.insert(&tree, "big", vec![7u8; 1 << 20]);
    let committed = big.commit();
    assert!(committed.is_err(), "a batch cut short in the journal must not be acknowledged");
    // Nothing of it is readable, and the keyspace takes no more writes until it is opened again.
    assert_eq!(tree.get("big").expect("read"), None);
    let mut after = keyspace.batch().durability(Some(fjall::PersistMode::SyncData));
    after.insert(&tree, "after", "refused");
    assert!(after.commit().is_err(), "a keyspace whose journal holds a cut batch is poisoned");
    drop(tree);
    drop(keyspace);

    // Opened again once the disk has room: the cut record is gone, what was acknowledged is there, and writes
    // resume.
    std::fs::remove_file(&filler).expect("room again");
    let keyspace = fjall::Config::new(point.join("keyspace")).open().expect("keyspace opened again");
    let tree = keyspace.open_partition("records", Default::default()).expect("partition");
    assert_eq!(tree.get("small").expect("read").as_deref(), Some(&b"fits"[..]));
    assert_eq!(tree.get("big").expect("read"), None);
    let mut resumed = keyspace.batch().durability(Some(fjall::PersistMode::SyncData));
    resumed.insert(&tree, "resumed", "written");
    resumed.commit().expect("writes resume");
    assert_eq!(tree.get("resumed").expect("read").as_deref(), Some(&b"written"[..]));
}
