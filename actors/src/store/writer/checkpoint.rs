//! The checkpoint: making sled's own files durable (flush, a real `sync_data` of the data file, the blob files
//! sled never syncs), then deleting the write-ahead log files it covers.

use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::store::wal;
use crate::store::StoreError;

/// Makes sled's files durable, then deletes the log files that are no longer needed.
pub(super) struct Checkpoint {
    db: sled::Db,
    data_file: File,
    blobs: Blobs,
    wal_dir: PathBuf,
}

impl Checkpoint {
    pub(super) fn open(db: sled::Db, dir: &Path) -> Result<Checkpoint, StoreError> {
        let data_file = File::open(dir.join("db")).map_err(|e| StoreError::Io(format!("open sled data file: {e}")))?;
        Ok(Checkpoint { db, data_file, blobs: Blobs::new(dir.join("blobs")), wal_dir: wal::wal_dir(dir) })
    }

    /// Syncs everything sled holds, which includes every batch of log files numbered below `before`, then
    /// retires those files (no replay reads them again), keeps one as the spare the next log file overwrites,
    /// and deletes the others a few megabytes at a time.
    pub(super) fn run(&mut self, before: u64) -> Result<(), StoreError> {
        self.db.flush().map_err(|e| StoreError::Io(format!("flush: {e}")))?;
        self.data_file.sync_data().map_err(|e| StoreError::Io(format!("sync_data: {e}")))?;
        self.blobs.sync_new().map_err(|e| StoreError::Io(format!("sync blobs: {e}")))?;
        wal::retire(&self.wal_dir, before)?;
        wal::remove_retired(&self.wal_dir)?;
        Ok(())
    }
}

/// sled writes values larger than a quarter segment as separate blob files and never syncs them.
struct Blobs {
    dir: PathBuf,
    seen_mtime: Option<SystemTime>,
    synced: HashSet<std::ffi::OsString>,
}

impl Blobs {
    fn new(dir: PathBuf) -> Blobs {
        Blobs { dir, seen_mtime: None, synced: HashSet::new() }
    }

    /// Syncs blob files that appeared since the last call, and the directory that names them. A stat per
    /// batch finds out whether there is anything to do: the directory's mtime changes when a file is added.
    fn sync_new(&mut self) -> std::io::Result<()> {
        let mtime = match std::fs::metadata(&self.dir) {
            Ok(meta) => meta.modified()?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        if self.seen_mtime == Some(mtime) {
            return Ok(());
        }
        let mut present = HashSet::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let name = entry.file_name();
            if !self.synced.contains(&name) {
                File::open(entry.path())?.sync_data()?;
            }
            present.insert(name);
        }
        File::open(&self.dir)?.sync_all()?;
        self.synced = present;
        self.seen_mtime = Some(mtime);
        Ok(())
    }
}
