//! What a node keeps in memory of the trees written once (`layout::WRITTEN_ONCE`): the owner of a transaction
//! and its route never change and are never removed, so a value read from the database, or committed by this
//! node's writer, is served from memory afterwards instead of by another round trip. The provider's notice
//! about a transaction, and each webhook about it, look these up on whichever node they reach.

use dashmap::DashMap;

use crate::store::layout::{TREE_NAMES, WRITTEN_ONCE};

/// Keys kept per tree at most; a full tree's map is emptied and fills again with what is read next, which
/// bounds the memory (a few megabytes) without bookkeeping on every read.
const MAX_KEPT: usize = 32_768;

pub(super) struct Kept {
    /// Indexed by tree number; `None` for the trees whose values change.
    trees: Vec<Option<DashMap<Vec<u8>, sled::IVec>>>,
}

impl Kept {
    pub(super) fn new() -> Kept {
        let trees = (0..TREE_NAMES.len()).map(|tree| WRITTEN_ONCE.contains(&tree).then(DashMap::new)).collect();
        Kept { trees }
    }

    pub(super) fn get(&self, tree: usize, key: &[u8]) -> Option<sled::IVec> {
        self.trees.get(tree)?.as_ref()?.get(key).map(|value| value.clone())
    }

    /// Keeps `value`, read or committed, when `tree` is written once.
    pub(super) fn keep(&self, tree: usize, key: &[u8], value: &[u8]) {
        let Some(Some(map)) = self.trees.get(tree) else { return };
        if map.len() >= MAX_KEPT {
            map.clear();
        }
        map.insert(key.to_vec(), sled::IVec::from(value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::layout::{PAYMENTS, TX_OWNER};

    #[test]
    fn only_trees_written_once_are_kept_and_a_full_tree_starts_over() {
        let kept = Kept::new();
        kept.keep(PAYMENTS, b"k", b"v");
        assert_eq!(kept.get(PAYMENTS, b"k"), None, "a payment changes: never kept");
        kept.keep(TX_OWNER, b"k", b"v");
        assert_eq!(kept.get(TX_OWNER, b"k").as_deref(), Some(&b"v"[..]));
        for n in 0..MAX_KEPT as u32 {
            kept.keep(TX_OWNER, &n.to_be_bytes(), b"v");
        }
        assert!(kept.get(TX_OWNER, b"k").is_none(), "the tree filled up and started over");
        assert_eq!(kept.get(TX_OWNER, &(MAX_KEPT as u32 - 1).to_be_bytes()).as_deref(), Some(&b"v"[..]));
    }
}
