//! What each tree holds, in keys and bytes: how the restart bench (and an operator reading it) says what the
//! store's disk is spent on.

use std::ops::Bound;

use crate::store::kv::Kv;
use crate::store::kv_store::KvStore;
use crate::store::layout::TREE_NAMES;
use crate::store::StoreError;

/// One tree's contents: its keys, and the bytes of its keys and values as stored. The engine's own overhead
/// (table indexes, space not yet reclaimed, compression's savings) is the data directory's size less the sum
/// of these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeSize {
    pub name: &'static str,
    pub keys: u64,
    pub key_bytes: u64,
    pub value_bytes: u64,
}

impl<K: Kv> KvStore<K> {
    /// Every tree's size: as long as reading the whole store once, so for a stopped store or a quiet moment.
    pub fn tree_sizes(&self) -> Result<Vec<TreeSize>, StoreError> {
        let mut sizes = Vec::with_capacity(TREE_NAMES.len());
        for (tree, name) in TREE_NAMES.iter().enumerate() {
            let mut size = TreeSize { name, keys: 0, key_bytes: 0, value_bytes: 0 };
            for item in self.kv.scan(tree, Bound::Unbounded, Bound::Unbounded, false)? {
                let (key, value) = item?;
                size.keys += 1;
                size.key_bytes += key.len() as u64;
                size.value_bytes += value.len() as u64;
            }
            sizes.push(size);
        }
        Ok(sizes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ids::MerchantId;
    use crate::domain::records::Merchant;
    use crate::domain::time::Timestamp;
    use crate::store::{Accounts, FjallStore};

    #[test]
    fn sizes_count_what_was_written() {
        let dir = tempfile::tempdir().unwrap();
        let store = FjallStore::open(dir.path()).unwrap();
        let before = store.tree_sizes().unwrap();
        assert_eq!(before.len(), TREE_NAMES.len());
        assert!(before.iter().all(|t| t.keys == 0));
        let merchant = Merchant {
            id: MerchantId::new(),
            name: "Taille".into(),
            email: "taille@example.com".into(),
            password_hash: String::new(),
            secret_key: "sk_test_taille".into(),
            webhook_url: None,
            created_at: Timestamp::now(),
        };
        store.put_merchant(merchant, None).unwrap().blocking_recv().unwrap().unwrap();
        let after = store.tree_sizes().unwrap();
        let merchants = after.iter().find(|t| t.name == "merchants").unwrap();
        assert_eq!((merchants.keys, merchants.key_bytes), (1, 30));
        assert!(merchants.value_bytes > 30);
        assert_eq!(after.iter().find(|t| t.name == "merchant_keys").unwrap().keys, 1);
    }
}
