//! The sled database beside the keyspace that holds the merchants' balance snapshots: opening it, waiting out
//! a lock being released, and syncing its files, which sled's own `flush` does not (in 0.34 it only asks the
//! kernel to start writing them back). The upgrade opens a store sled made the same way.

use std::path::Path;

use crate::store::StoreError;

/// How long an open waits for a lock that is being released. sled 0.34 closes its files from its own IO
/// threads, which can finish a few milliseconds after the last `Db` handle is dropped; a process that closes
/// and reopens the same directory (a test, a supervised restart) would otherwise see its own old lock.
const LOCK_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Opens sled in `dir` with `cache_bytes` of page cache and no background flush: one that fails on its own
/// leaves sled refusing every write until it is opened again, so the writer flushes it after its commits, and
/// [`sync_tree`] makes its files durable at a stop. A snapshot a crash loses only makes recovery replay the
/// journal from an older one.
pub(super) fn open_when_unlocked(dir: &Path, cache_bytes: u64) -> Result<sled::Db, StoreError> {
    let started = std::time::Instant::now();
    loop {
        match sled::Config::new().path(dir).flush_every_ms(None).cache_capacity(cache_bytes).open() {
            Ok(db) => return Ok(db),
            Err(e) => {
                let text = e.to_string();
                if !text.contains("lock") {
                    return Err(StoreError::Io(format!("open {}: {text}", dir.display())));
                }
                if started.elapsed() >= LOCK_GRACE {
                    return Err(StoreError::Locked(format!("{}: {text}", dir.display())));
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    }
}

/// `sync_all` on every file under `dir`, then on each directory, so what sled wrote survives a power cut.
pub(super) fn sync_tree(dir: &Path) -> Result<(), StoreError> {
    let io_error = |path: &Path, e: std::io::Error| StoreError::Io(format!("sync {}: {e}", path.display()));
    for entry in std::fs::read_dir(dir).map_err(|e| io_error(dir, e))? {
        let path = entry.map_err(|e| io_error(dir, e))?.path();
        if path.is_dir() {
            sync_tree(&path)?;
        } else {
            std::fs::File::open(&path).and_then(|f| f.sync_all()).map_err(|e| io_error(&path, e))?;
        }
    }
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io_error(dir, e))
}
