//! A consistent copy of a running store, for `caisse backup`.
//!
//! The writer is paused at a point where everything acknowledged before it is committed (its batch is in the
//! log and the overlay); while it waits, every tree is read through the overlay, which then shows one moment
//! of the store, and written into a fresh sled database in the target directory. The writer resumes as soon
//! as the reading is done; the copy is then made durable on its own (sled's flush, then a real sync of every
//! file, as the checkpoint does, since sled's flush stops at `sync_file_range`). The target gets the format
//! stamp first, so a half-made copy is never taken for a store of another build.
//!
//! Writes that arrive during the pause queue behind it (and are refused once the queue is full), so the pause
//! is the price: about the time to read the store once.

use std::ops::Bound;
use std::path::Path;
use std::time::Instant;

use super::{io, SledKv};
use crate::store::kv::Kv;
use crate::store::{BackupReport, StoreError};

// The layout's trees, keys and encodings are this file's vocabulary.
use crate::store::layout::*;

/// Keys inserted into the copy per sled batch.
const BATCH_KEYS: usize = 10_000;

impl SledKv {
    pub(super) fn copy_to(&self, to: &Path) -> Result<BackupReport, StoreError> {
        let started = Instant::now();
        let io_error = |what: &str, e: std::io::Error| StoreError::Io(format!("{what} {}: {e}", to.display()));
        if to.exists() && std::fs::read_dir(to).map_err(|e| io_error("read", e))?.next().is_some() {
            return Err(StoreError::Conflict(format!(
                "{} is not empty; a backup goes to a new directory",
                to.display()
            )));
        }
        std::fs::create_dir_all(to).map_err(|e| io_error("create", e))?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o700)).map_err(|e| io_error("chmod", e))?;
        }
        super::stamp::check_or_stamp(to)?;
        let db = sled::Config::new().path(to).flush_every_ms(None).open().map_err(io("open the copy"))?;

        let (ticket, release) = self.writer.pause()?;
        match ticket.blocking_recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(StoreError::Closed),
        }
        let paused = Instant::now();
        let mut keys = 0u64;
        for (index, name) in TREE_NAMES.iter().enumerate() {
            let tree = db.open_tree(name).map_err(io("open a tree of the copy"))?;
            let mut batch = sled::Batch::default();
            let mut in_batch = 0;
            for item in self.scan(index, Bound::Unbounded, Bound::Unbounded, false)? {
                let (key, value) = item?;
                batch.insert(key, value);
                in_batch += 1;
                if in_batch == BATCH_KEYS {
                    tree.apply_batch(std::mem::take(&mut batch)).map_err(io("write the copy"))?;
                    keys += in_batch as u64;
                    in_batch = 0;
                }
            }
            tree.apply_batch(batch).map_err(io("write the copy"))?;
            keys += in_batch as u64;
        }
        drop(release);
        let paused_ms = paused.elapsed().as_millis() as u64;

        db.flush().map_err(io("flush the copy"))?;
        drop(db);
        sync_tree(to)?;
        let report = BackupReport { keys, paused_ms, elapsed_ms: started.elapsed().as_millis() as u64 };
        tracing::info!(to = %to.display(), keys, paused_ms, elapsed_ms = report.elapsed_ms, "backup written");
        Ok(report)
    }
}

/// `sync_all` on every file under `dir`, then on each directory, so the copy survives a power cut.
pub(in crate::store) fn sync_tree(dir: &Path) -> Result<(), StoreError> {
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

#[cfg(test)]
mod tests {
    use crate::domain::ids::MerchantId;
    use crate::domain::records::Merchant;
    use crate::domain::time::Timestamp;
    use crate::store::{Accounts, Audit, SledStore, StoreError};

    fn merchant(n: u32) -> Merchant {
        Merchant {
            id: MerchantId::new(),
            name: format!("Boutique {n}"),
            email: format!("b{n}@example.com"),
            password_hash: String::new(),
            secret_key: format!("sk_test_backup{n}"),
            webhook_url: None,
            created_at: Timestamp::now(),
        }
    }

    #[test]
    fn a_copy_opens_as_the_store_it_was_taken_from() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&dir.path().join("data")).unwrap();
        let first = merchant(1);
        store.put_merchant(first.clone(), None).unwrap().blocking_recv().unwrap().unwrap();
        let to = dir.path().join("backup");
        let report = store.backup(&to).unwrap();
        assert!(report.keys >= 3, "{report:?}");
        // Written after the copy: not in it.
        store.put_merchant(merchant(2), None).unwrap().blocking_recv().unwrap().unwrap();
        assert!(matches!(store.backup(&to), Err(StoreError::Conflict(_))), "never over an existing copy");
        drop(store);
        let copy = SledStore::open(&to).unwrap();
        assert_eq!(copy.merchant_by_key("sk_test_backup1").unwrap(), Some(first));
        assert_eq!(copy.merchant_count().unwrap(), 1);
        copy.audit().unwrap();
    }
}
