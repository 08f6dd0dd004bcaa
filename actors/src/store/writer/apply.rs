//! Applying a batch to sled: the operations of many jobs grouped into one atomic sled batch per tree, the
//! trees in an order that keeps every index pointing at something already written.

use super::Op;
use crate::store::StoreError;

/// Applies operations to sled's trees, one atomic batch per tree, the trees in `order`. Within a tree a later
/// operation on the same key wins, as it would applied one by one. Returns which trees changed, one bit per
/// tree index.
///
/// The batches of different trees become visible one after the other, so a reader between two of them sees
/// part of a change. `order` puts the trees that hold records before the indexes that point at them, so what
/// a reader finds through an index is always there (a due entry never points at a notification whose body is
/// not yet written).
pub(super) fn apply<'a>(
    trees: &[sled::Tree],
    order: &[usize],
    ops: impl Iterator<Item = &'a Op>,
) -> Result<u64, StoreError> {
    let mut batches: Vec<Option<sled::Batch>> = trees.iter().map(|_| None).collect();
    for op in ops {
        let tree = match op {
            Op::Insert(tree, ..) | Op::Remove(tree, _) => *tree,
        };
        let batch = batches
            .get_mut(tree)
            .ok_or_else(|| StoreError::Corrupt(format!("no tree {tree}")))?
            .get_or_insert_with(sled::Batch::default);
        match op {
            Op::Insert(_, key, value) => batch.insert(key.as_slice(), value.as_slice()),
            Op::Remove(_, key) => batch.remove(key.as_slice()),
        }
    }
    let mut touched = 0;
    for &index in order {
        let (Some(tree), Some(batch)) = (trees.get(index), batches.get_mut(index).and_then(Option::take)) else {
            continue;
        };
        tree.apply_batch(batch).map_err(|e| StoreError::Io(format!("apply to sled: {e}")))?;
        touched |= 1u64.checked_shl(index as u32).unwrap_or(0);
    }
    if batches.iter().any(Option::is_some) {
        return Err(StoreError::Corrupt("a tree missing from the apply order".into()));
    }
    Ok(touched)
}
