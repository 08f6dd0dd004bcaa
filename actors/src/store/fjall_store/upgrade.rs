//! Moving a store sled made (the embedded engine of earlier releases) onto fjall, for `caisse upgrade-store`.
//! The new store holds the same keys in the same layout: every tree of sled's files copied key for key, then
//! the old write-ahead log replayed over them, which holds every batch acknowledged since sled's files were
//! last made durable ([`crate::store::sled_log`]). The server must be stopped: the copy is one moment only
//! while nothing writes. The old store's trees, log and stamp are left as they were (opening sled rewrites only
//! sled's own bookkeeping), so the release that made it still opens it.
//!
//! Both the copy and the replay write keys exactly as given ([`super::writer::Writer::submit_as_stored`]).
//! The writer otherwise joins a batch's lone journal events into runs under the last one's key: a copy that
//! joined sled's lone events 3 and 4 under key 4 would leave no key 3, and the log's replay of event 4 alone
//! over key 4 would then lose event 3.

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
/// left as it was (see the module's doc).
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
    let stored_trees = db.tree_names();
    let mut trees = Vec::with_capacity(TREE_NAMES.len());
    for name in TREE_NAMES {
        // A tree a release before it was added never made reads as empty; opening it would create it in the
        // old store, which is left as it was.
        let exists = stored_trees.iter().any(|stored| stored.as_ref() == name.as_bytes());
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
                "ignored the bytes after the last record of a write-ahead log file (a write never acknowledged, or \
                 what a reused file held before)"
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
    use crate::domain::money::Currency;
    use crate::domain::records::Merchant;
    use crate::domain::time::Timestamp;
    use crate::store::layout::tests::{credit_event, holding};
    use crate::store::layout::{
        encode, journal_key, journal_run, key_hash, JOURNAL, MERCHANTS, MERCHANT_EMAILS, MERCHANT_KEYS, SNAPSHOTS,
        UPGRADED_IN_PLACE,
    };
    use crate::store::op::Op;
    use crate::store::{Accounts, Audit, Commits, Records};

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

    fn put(m: &Merchant) -> Vec<Op> {
        vec![
            Op::Insert(MERCHANTS, m.id.as_bytes().to_vec(), encode(m).unwrap()),
            Op::Insert(MERCHANT_KEYS, key_hash(&m.secret_key), m.id.as_bytes().to_vec()),
            Op::Insert(MERCHANT_EMAILS, m.email.clone().into_bytes(), m.id.as_bytes().to_vec()),
        ]
    }

    /// Event `seq` of merchant `m`, crediting 100 XOF, as a run of one (as the old store's writer logged it,
    /// and as sled held an event alone in its layer).
    fn credit(m: &MerchantId, seq: u64) -> Op {
        Op::Insert(JOURNAL, journal_key(m, seq), journal_run([credit_event(seq, 100).as_slice()]).unwrap())
    }

    fn snapshot(m: &MerchantId, seq: u64) -> Op {
        Op::Insert(SNAPSHOTS, m.as_bytes().to_vec(), encode(&holding(seq, 100 * seq as i64)).unwrap())
    }

    /// A sled store as an earlier release left it after a crash, stamped with an older format this build
    /// reads: `in_sled` in sled's files (what its checkpoints and its own writes made durable), and `logged`
    /// in a log file written after them; a retired log file and the spare, which must never be read, hold
    /// a batch that would remove everything.
    fn old_store(dir: &Path, in_sled: Vec<Op>, logged: Vec<Vec<Op>>, everything: Vec<Op>) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(stamp::STAMP_FILE), format!("caisse-store {}\n", UPGRADED_IN_PLACE[0])).unwrap();
        let db = sled::open(dir).unwrap();
        for op in in_sled {
            let Op::Insert(tree, key, value) = op else { unreachable!("sled's files hold values") };
            db.open_tree(TREE_NAMES[tree]).unwrap().insert(key, value).unwrap();
        }
        db.flush().unwrap();
        drop(db);
        let log = sled_log::wal_dir(dir);
        std::fs::create_dir_all(&log).unwrap();
        std::fs::write(log.join("0000000000000004.wal"), sled_log::file(4, &logged)).unwrap();
        let removals: Vec<Op> = everything
            .into_iter()
            .map(|op| {
                let (tree, key, _) = op.into_entry();
                Op::Remove(tree, key)
            })
            .collect();
        std::fs::write(log.join("0000000000000003.retired"), sled_log::file(3, std::slice::from_ref(&removals)))
            .unwrap();
        std::fs::write(log.join("spare"), sled_log::file(2, &[removals])).unwrap();
    }

    /// What the upgrade must leave as it was: the stamp, the log, and sled's trees (sled rewrites its own
    /// bookkeeping files whenever it is opened).
    #[allow(clippy::type_complexity)]
    fn state(
        d: &Path,
    ) -> (Vec<u8>, Vec<(std::path::PathBuf, Vec<u8>)>, Vec<(sled::IVec, Vec<(sled::IVec, sled::IVec)>)>) {
        let mut log: Vec<_> = std::fs::read_dir(sled_log::wal_dir(d)).unwrap().map(|e| e.unwrap().path()).collect();
        log.sort();
        let log = log.into_iter().map(|p| (p.clone(), std::fs::read(&p).unwrap())).collect();
        let db = super::super::snapshots::open_when_unlocked(d, 1 << 20).unwrap();
        let trees = db
            .tree_names()
            .into_iter()
            .map(|name| (name.clone(), db.open_tree(name).unwrap().iter().map(Result::unwrap).collect::<Vec<_>>()))
            .collect();
        (std::fs::read(d.join(stamp::STAMP_FILE)).unwrap(), log, trees)
    }

    /// A quiet merchant's events 1 to 4 each alone under its own key in sled's files, and event 4 again in the
    /// log (sled wrote it out before the crash, the checkpoint that would have covered it never ran), after
    /// the merchant's snapshot at event 2. A second merchant only in sled's files, one only in the log, one
    /// the log removes.
    #[test]
    fn a_sled_store_and_its_log_read_the_same_on_fjall_and_the_old_one_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (from, to) = (dir.path().join("sled"), dir.path().join("fjall"));
        let (kept, logged, removed) = (merchant(1), merchant(2), merchant(3));
        let mut in_sled: Vec<Op> = [put(&kept), put(&removed)].concat();
        in_sled.extend((1..=4).map(|seq| credit(&kept.id, seq)));
        in_sled.push(snapshot(&kept.id, 2));
        let removal = vec![
            Op::Remove(MERCHANTS, removed.id.as_bytes().to_vec()),
            Op::Remove(MERCHANT_KEYS, key_hash(&removed.secret_key)),
            Op::Remove(MERCHANT_EMAILS, removed.email.clone().into_bytes()),
        ];
        let log = vec![vec![credit(&kept.id, 4)], put(&logged), removal];
        old_store(&from, in_sled.clone(), log, in_sled);
        let before = state(&from);

        let refused = FjallStore::open(&from).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(refused.contains("caisse upgrade-store"), "{refused}");
        assert_eq!(state(&from), before, "a refused store is not touched, nor restamped");
        assert!(!from.join("LOCK").exists() && !from.join("keyspace").exists());

        let report = from_sled(&from, &to).unwrap();
        assert_eq!(report.log_records, 3, "{report:?}");
        assert_eq!(report.keys, 11, "{report:?}");
        assert_eq!(state(&from), before, "the old store is not written");

        let upgraded = FjallStore::open(&to).unwrap();
        assert_eq!(upgraded.merchant_by_key("sk_test_upgrade1").unwrap(), Some(kept.clone()));
        assert_eq!(upgraded.merchant_by_key("sk_test_upgrade2").unwrap(), Some(logged), "replayed from the log");
        assert_eq!(upgraded.merchant_by_key("sk_test_upgrade3").unwrap(), None, "removed by the log");
        assert_eq!(upgraded.merchant_count().unwrap(), 2);
        let seqs: Vec<u64> = upgraded.journal(&kept.id, 1, 10).unwrap().iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [1, 2, 3, 4], "every event once, whatever the log replayed over");
        let recovered = upgraded.recover_merchant(&kept.id).unwrap();
        assert_eq!((recovered.seq, recovered.balances.get(Currency::XOF).available), (4, 400));
        let audit = upgraded.audit().unwrap();
        assert_eq!(audit.events, 4);
        drop(upgraded);
        assert!(matches!(from_sled(&from, &to), Err(StoreError::Conflict(_))), "never over a store");
    }
}
