//! Moving a store sled made (the embedded engine before fjall) onto fjall: every tree copied key for key into
//! a new store, which then holds the same bytes in the same layout. For `caisse upgrade-store`; the server
//! must be stopped, since the copy is read as one moment only while nothing writes.

use std::path::Path;
use std::time::Instant;

use super::FjallStore;
use crate::store::kv::Kv;
use crate::store::{SledStore, StoreError};

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
    pub keys: u64,
    pub elapsed_ms: u64,
}

/// Copies the sled store in `from` (opened, so a log a crash left is replayed first) into a new fjall store in
/// `to`, which must be absent or empty. `from` is left as it was.
pub fn from_sled(from: &Path, to: &Path) -> Result<UpgradeReport, StoreError> {
    let started = Instant::now();
    if to.exists()
        && std::fs::read_dir(to).map_err(|e| StoreError::Io(format!("read {}: {e}", to.display())))?.next().is_some()
    {
        return Err(StoreError::Conflict(format!("{} is not empty; the upgrade writes a new directory", to.display())));
    }
    let old = SledStore::open(from)?;
    let new = FjallStore::open(to)?;
    let keys = new.kv.copy_from(&old.kv)?;
    new.kv.close()?;
    old.kv.close()?;
    Ok(UpgradeReport { keys, elapsed_ms: started.elapsed().as_millis() as u64 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ids::MerchantId;
    use crate::domain::records::Merchant;
    use crate::domain::time::Timestamp;
    use crate::store::{Accounts, Audit, Embedded};

    #[test]
    fn a_sled_store_reads_the_same_on_fjall_and_the_old_one_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (from, to) = (dir.path().join("sled"), dir.path().join("fjall"));
        let merchant = Merchant {
            id: MerchantId::new(),
            name: "Boutique".into(),
            email: "b@example.com".into(),
            password_hash: String::new(),
            secret_key: "sk_test_upgrade".into(),
            webhook_url: None,
            created_at: Timestamp::now(),
        };
        {
            let store = SledStore::open(&from).unwrap();
            store.put_merchant(merchant.clone(), None).unwrap().blocking_recv().unwrap().unwrap();
        }
        let report = from_sled(&from, &to).unwrap();
        assert!(report.keys >= 3, "{report:?}");
        assert_eq!(Embedded::in_dir(&to, Embedded::Sled), Embedded::Fjall);
        assert_eq!(Embedded::in_dir(&from, Embedded::Fjall), Embedded::Sled);
        let upgraded = FjallStore::open(&to).unwrap();
        assert_eq!(upgraded.merchant_by_key("sk_test_upgrade").unwrap(), Some(merchant));
        upgraded.audit().unwrap();
        assert!(matches!(from_sled(&from, &to), Err(StoreError::Conflict(_))), "never over a store");
    }
}
