//! Opening the sled database: its page cache, waiting out a lock being released, creating the trees, and
//! starting the group-commit writer after it has replayed its write-ahead log.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use super::{io, SledKv, SledStore};
use crate::store::layout::{APPLY_ORDER, TREE_NAMES};
use crate::store::overlay::Overlay;
use crate::store::writer::Writer;
use crate::store::StoreError;

/// Notifications waiting for the dispatcher beyond this are found by its scan of the due index instead.
const FEED_CAPACITY: usize = 64 * 1024;

/// sled's page cache unless the operator sets `store_cache_mib`. sled's own default (1 GiB) would let a
/// long-running server grow far past the memory budget of a small machine, and sled's real use is above this
/// figure (it counts on-disk bytes, its in-memory nodes are larger); the hot data (recent payments, due
/// notifications) fits in much less, and a miss is a read from the OS page cache. 16 rather than 64 MiB keeps
/// the server's memory well within a small machine's budget after a million payments, for slightly fewer
/// engine events/s over many merchants and no change to the API's latency (docs/perf/history.md).
pub const DEFAULT_CACHE_BYTES: u64 = 16 * 1024 * 1024;

/// How long an open waits for a lock that is being released. sled 0.34 closes its files from its own IO
/// threads, which can finish a few milliseconds after the last `Db` handle is dropped; a process that closes
/// and reopens the same directory (a test, a supervised restart) would otherwise see its own old lock.
const LOCK_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Opens sled in `dir`, flushing in the background every `flush_every_ms` if set.
pub(in crate::store) fn open_when_unlocked(
    dir: &Path,
    cache_bytes: u64,
    flush_every_ms: Option<u64>,
) -> Result<sled::Db, StoreError> {
    let started = std::time::Instant::now();
    loop {
        match sled::Config::new().path(dir).flush_every_ms(flush_every_ms).cache_capacity(cache_bytes).open() {
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

impl SledStore {
    /// Opens (or creates) the store under `dir` with the default cache and starts its writer. Does not
    /// audit: call [`Audit::audit`](crate::store::Audit::audit).
    pub fn open(dir: &Path) -> Result<SledStore, StoreError> {
        SledStore::open_with_cache(dir, DEFAULT_CACHE_BYTES)
    }

    /// [`SledStore::open`] with sled's page cache set to `cache_bytes`.
    pub fn open_with_cache(dir: &Path, cache_bytes: u64) -> Result<SledStore, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| StoreError::Io(format!("create {}: {e}", dir.display())))?;
        // The directory holds the merchants' keys and the ledger: its owner only.
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| StoreError::Io(format!("chmod 0700 {}: {e}", dir.display())))?;
        }
        super::stamp::check_or_stamp(dir)?;
        let started = std::time::Instant::now();
        // No background flush: the write-ahead log makes changes durable, checkpoints flush sled when the disk
        // is known good, and a flush failing on its own would leave sled refusing everything until reopened.
        let db = open_when_unlocked(dir, cache_bytes, None)?;
        // After a crash this is most of a restart (sled replays everything written since its previous open),
        // so the operator sees it apart from the log replay and the audit, which log their own times.
        tracing::info!(elapsed_ms = started.elapsed().as_millis() as u64, "opened sled");
        let trees = TREE_NAMES
            .iter()
            .map(|name| db.open_tree(name))
            .collect::<Result<Vec<_>, _>>()
            .map_err(io("open trees"))?;
        // The files sled just created must be reachable after a power cut: sync their directory once.
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| StoreError::Io(format!("sync {}: {e}", dir.display())))?;
        let healthy = Arc::new(AtomicBool::new(true));
        let (feed_tx, feed_rx) = tokio::sync::mpsc::channel(FEED_CAPACITY);
        let next_log = crate::store::writer::recover(&db, &trees, &APPLY_ORDER, dir)?;
        let overlay = Arc::new(Overlay::new(trees.len()));
        let writer = Writer::spawn(
            db.clone(),
            trees.clone(),
            APPLY_ORDER.to_vec(),
            overlay.clone(),
            dir,
            next_log,
            healthy.clone(),
            feed_tx,
        )?;
        Ok(SledStore::new(SledKv { trees, overlay, writer, healthy }, feed_rx))
    }
}
