//! Replaying the write-ahead log into sled at start: the operations of each logged batch, tree by tree in an
//! order that keeps every index pointing at something already written, each one a plain sled insert or remove.
//! While running, batches reach sled through the overlay's layers instead (see [`crate::store::overlay`]).

use super::Op;
use crate::store::StoreError;

/// Applies operations to sled's trees, the trees in `order`, and within a tree in the order given, so a later
/// operation on the same key wins. Returns which trees changed, one bit per tree index.
///
/// Each operation is a plain `insert` or `remove`, not a `sled::Batch`. sled 0.34.7 seals its IO buffer at the
/// end of every batch and has one of its threads write it and wait on `sync_file_range` for it (counted with
/// `strace`: about 3,000 such small writes a second at 1,000 payments/s when the writer used batches). Nothing
/// relies on sled's batch atomicity: a crash is repaired by replaying the write-ahead log again, whatever part
/// of a batch sled kept (see [`crate::store::wal`]).
pub(super) fn apply<'a>(
    trees: &[sled::Tree],
    order: &[usize],
    ops: impl Iterator<Item = &'a Op>,
) -> Result<u64, StoreError> {
    let mut per_tree: Vec<Vec<&Op>> = trees.iter().map(|_| Vec::new()).collect();
    for op in ops {
        let tree = match op {
            Op::Insert(tree, ..) | Op::Remove(tree, _) => *tree,
        };
        per_tree.get_mut(tree).ok_or_else(|| StoreError::Corrupt(format!("no tree {tree}")))?.push(op);
    }
    // Checked before anything is applied, so that a mistake in the order never leaves a change half-written.
    if per_tree.iter().enumerate().any(|(index, ops)| !ops.is_empty() && !order.contains(&index)) {
        return Err(StoreError::Corrupt("a tree missing from the apply order".into()));
    }
    let mut touched = 0;
    for &index in order {
        let (Some(tree), Some(ops)) = (trees.get(index), per_tree.get_mut(index)) else {
            continue;
        };
        if ops.is_empty() {
            continue;
        }
        for op in std::mem::take(ops) {
            match op {
                Op::Insert(_, key, value) => tree.insert(key.as_slice(), value.as_slice()).map(drop),
                Op::Remove(_, key) => tree.remove(key.as_slice()).map(drop),
            }
            .map_err(|e| StoreError::Io(format!("apply to sled: {e}")))?;
        }
        touched |= 1u64.checked_shl(index as u32).unwrap_or(0);
    }
    Ok(touched)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trees(n: usize) -> (sled::Db, Vec<sled::Tree>) {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let trees = (0..n).map(|i| db.open_tree(format!("t{i}")).unwrap()).collect();
        (db, trees)
    }

    #[test]
    fn operations_land_in_order_and_report_the_trees_they_touched() {
        let (_db, trees) = trees(3);
        let ops = [
            Op::Insert(2, b"k".to_vec(), b"first".to_vec()),
            Op::Insert(0, b"a".to_vec(), b"1".to_vec()),
            Op::Insert(2, b"k".to_vec(), b"second".to_vec()),
            Op::Insert(2, b"gone".to_vec(), b"x".to_vec()),
            Op::Remove(2, b"gone".to_vec()),
        ];
        let touched = apply(&trees, &[0, 1, 2], ops.iter()).unwrap();
        assert_eq!(touched, 0b101);
        assert_eq!(trees[2].get(b"k").unwrap().as_deref(), Some(&b"second"[..]));
        assert_eq!(trees[2].get(b"gone").unwrap(), None);
        assert_eq!(trees[0].get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
    }

    #[test]
    fn a_tree_missing_from_the_order_is_refused_before_anything_is_written() {
        let (_db, trees) = trees(3);
        let ops = [Op::Insert(0, b"a".to_vec(), b"1".to_vec()), Op::Insert(2, b"b".to_vec(), b"2".to_vec())];
        assert!(matches!(apply(&trees, &[0, 1], ops.iter()), Err(StoreError::Corrupt(_))));
        assert!(matches!(apply(&trees, &[0, 1, 2], [Op::Remove(7, vec![])].iter()), Err(StoreError::Corrupt(_))));
        assert!(trees[0].is_empty() && trees[2].is_empty());
    }
}
