//! Moving a store sled made (the embedded engine of earlier releases) onto fjall, for `caisse upgrade-store`.
//! The new store holds the same keys in the same layout: every tree of sled's files copied key for key, then
//! the old write-ahead log replayed over them, which holds every batch acknowledged since sled's files were
//! last made durable ([`crate::store::sled_log`]). The server must be stopped: the copy is one moment only
//! while nothing writes. The old store is read, never written, whatever it holds.

use std::path::Path;
use std::time::Instant;

use super::FjallStore;
use crate::store::kv::{Kv, Scan};
use crate::store::layout::TREE_NAMES;
use crate::store::{sled_log, stamp, StoreError};

/// sled's page cache while the old store is copied: it is read once, in key order.
const READ_CACHE_BYTES: u64 = 16 * 1024 * 1024;

/// Where `caisse upgrade-store` makes the new store, and where it keeps the old one: beside the data
/// directory `dir`, under its name followed by `.upgrading` and `.sled`.
pub fn beside(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let named = |suffix: &str| {
        let mut name = dir.file_name().map(|n| n.to_os_string()).unwrap_or_else(|| "data".into());
        name.push(suffix);
        dir.with_file_name(name)
    };
    (named(".upgrading"), named(".sled"))
}

/// What an upgrade copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpgradeReport {
    /// Keys copied from sled's files, every tree together.
    pub keys: u64,
    /// Batches replayed from the old write-ahead log (acknowledged after sled's files were last synced).
    pub log_records: u64,
    pub elapsed_ms: u64,
}

/// Copies the sled store in `from` into a new fjall store in `to`, which must be absent or empty. `from` is
/// left as it was.
pub fn from_sled(from: &Path, to: &Path) -> Result<UpgradeReport, StoreError> {
    let started = Instant::now();
    if !crate::store::holds_sled_store(from) {
        return Err(StoreError::Format(format!("{} holds no store made on sled", from.display())));
    }
    if to.exists()
        && std::fs::read_dir(to).map_err(|e| StoreError::Io(format!("read {}: {e}", to.display())))?.next().is_some()
    {
        return Err(StoreError::Conflict(format!("{} is not empty; the upgrade writes a new directory", to.display())));
    }
    stamp::check_readable(from)?;
    // sled takes the directory's lock itself: a server still running on it is refused here.
    let db = super::snapshots::open_when_unlocked(from, READ_CACHE_BYTES)?;
    let mut trees = Vec::with_capacity(TREE_NAMES.len());
    for name in TREE_NAMES {
        // A tree a release before it was added never made reads as empty; opening it would create it in the
        // old store, which is left as it was.
        let exists = db.tree_names().iter().any(|stored| stored.as_ref() == name.as_bytes());
        trees.push(match exists {
            true => Some(db.open_tree(name).map_err(|e| StoreError::Io(format!("open sled's {name}: {e}")))?),
            false => None,
        });
    }
    let new = FjallStore::open(to)?;
    let keys = new.kv.copy_from(|tree| -> Result<Scan, StoreError> {
        match trees.get(tree).and_then(Option::as_ref) {
            Some(stored) => {
                let name = TREE_NAMES[tree];
                Ok(Box::new(
                    stored.iter().map(move |item| item.map_err(|e| StoreError::Io(format!("read sled's {name}: {e}")))),
                ))
            }
            None => Ok(Box::new(std::iter::empty())),
        }
    })?;
    // Every batch the old log holds, in order, each durable before the next: the ones sled's files already
    // hold change nothing, the others are the changes acknowledged since its last checkpoint.
    let mut log_records = 0u64;
    for (seq, path) in sled_log::list(&sled_log::wal_dir(from))? {
        let found = sled_log::replay(&path, seq, |ops| new.kv.write_now(ops))?;
        if found.discarded > 0 {
            tracing::info!(
                file = %path.display(),
                bytes = found.discarded,
                "ignored the bytes after the last record of a write-ahead log file (never acknowledged)"
            );
        }
        log_records += found.records;
    }
    new.kv.close()?;
    drop(db);
    let report = UpgradeReport { keys, log_records, elapsed_ms: started.elapsed().as_millis() as u64 };
    tracing::info!(from = %from.display(), to = %to.display(), keys, log_records, "copied a sled store onto fjall");
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ids::MerchantId;
    use crate::domain::records::Merchant;
    use crate::domain::time::Timestamp;
    use crate::store::layout::{encode, key_hash, FORMAT_VERSION, MERCHANTS, MERCHANT_EMAILS, MERCHANT_KEYS};
    use crate::store::op::Op;
    use crate::store::{Accounts, Audit};

    fn merchant(n: u32) -> Merchant {
        Merchant {
            id: MerchantId::new(),
            name: format!("Boutique {n}"),
            email: format!("b{n}@example.com"),
            password_hash: String::new(),
            secret_key: format!("sk_test_upgrade{n}"),
            webhook_url: None,
            created_at: Timestamp::now(),
        }
    }

    /// A sled store as an earlier release left it after a crash: `in_sled` in sled's files (its last
    /// checkpoint), and a log file whose batches came after: `logged` put, then `removed` taken out.
    fn old_store(dir: &Path, in_sled: &[&Merchant], logged: &Merchant, removed: &Merchant) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(stamp::STAMP_FILE), format!("caisse-store {FORMAT_VERSION}\n")).unwrap();
        let db = sled::open(dir).unwrap();
        let put = |m: &Merchant| {
            vec![
                Op::Insert(MERCHANTS, m.id.as_bytes().to_vec(), encode(m).unwrap()),
                Op::Insert(MERCHANT_KEYS, key_hash(&m.secret_key), m.id.as_bytes().to_vec()),
                Op::Insert(MERCHANT_EMAILS, m.email.clone().into_bytes(), m.id.as_bytes().to_vec()),
            ]
        };
        for m in in_sled {
            for op in put(m) {
                let Op::Insert(tree, key, value) = op else { unreachable!() };
                db.open_tree(TREE_NAMES[tree]).unwrap().insert(key, value).unwrap();
            }
        }
        db.flush().unwrap();
        drop(db);
        let removal = vec![
            Op::Remove(MERCHANTS, removed.id.as_bytes().to_vec()),
            Op::Remove(MERCHANT_KEYS, key_hash(&removed.secret_key)),
            Op::Remove(MERCHANT_EMAILS, removed.email.clone().into_bytes()),
        ];
        let log = sled_log::wal_dir(dir);
        std::fs::create_dir_all(&log).unwrap();
        std::fs::write(log.join("0000000000000004.wal"), sled_log::file(4, &[put(logged), removal])).unwrap();
    }

    #[test]
    fn a_sled_store_and_its_log_read_the_same_on_fjall_and_the_old_one_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (from, to) = (dir.path().join("sled"), dir.path().join("fjall"));
        let (kept, logged, removed) = (merchant(1), merchant(2), merchant(3));
        old_store(&from, &[&kept, &removed], &logged, &removed);
        // What the upgrade must leave as it was: the stamp, the log, and sled's trees (sled rewrites its own
        // bookkeeping files whenever it is opened).
        let state = |d: &Path| {
            let log = std::fs::read_dir(sled_log::wal_dir(d)).unwrap().map(|e| e.unwrap().path()).collect::<Vec<_>>();
            let log: Vec<_> = log.iter().map(|p| (p.clone(), std::fs::read(p).unwrap())).collect();
            let db = super::super::snapshots::open_when_unlocked(d, 1 << 20).unwrap();
            let trees: Vec<_> = db
                .tree_names()
                .into_iter()
                .map(|name| (name.clone(), db.open_tree(name).unwrap().iter().map(Result::unwrap).collect::<Vec<_>>()))
                .collect();
            (std::fs::read(d.join(stamp::STAMP_FILE)).unwrap(), log, trees)
        };
        let before = state(&from);

        let report = from_sled(&from, &to).unwrap();
        assert_eq!(report.log_records, 2, "{report:?}");
        assert_eq!(report.keys, 6, "{report:?}");
        assert_eq!(state(&from), before, "the old store is not written");
        let upgraded = FjallStore::open(&to).unwrap();
        assert_eq!(upgraded.merchant_by_key("sk_test_upgrade1").unwrap(), Some(kept));
        assert_eq!(upgraded.merchant_by_key("sk_test_upgrade2").unwrap(), Some(logged), "replayed from the log");
        assert_eq!(upgraded.merchant_by_key("sk_test_upgrade3").unwrap(), None, "removed by the log");
        assert_eq!(upgraded.merchant_count().unwrap(), 2);
        upgraded.audit().unwrap();
        drop(upgraded);
        assert!(matches!(from_sled(&from, &to), Err(StoreError::Conflict(_))), "never over a store");
        assert!(matches!(FjallStore::open(&from), Err(StoreError::Format(m)) if m.contains("caisse upgrade-store")));
    }
}
