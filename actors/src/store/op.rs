//! The store's unit of writing: one absolute operation on one key of one tree.
//!
//! It sits on the ground floor because everything above speaks it: the layout turns a change into
//! operations, the write-ahead log encodes them, the overlay records them and the writer moves them to sled.
//! An operation is absolute (the value to hold, or the key's removal), never relative to what the key held,
//! which is what lets the log be replayed any number of times and lets the overlay keep only the last
//! operation on each key.

use super::overlay::Entry;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Sets `key` of tree number `tree` to `value`.
    Insert(usize, Vec<u8>, Vec<u8>),
    /// Removes `key` from tree number `tree`.
    Remove(usize, Vec<u8>),
}

impl Op {
    /// The operation as the overlay records it: tree, key, and the value or `None` for a removal.
    pub(crate) fn into_entry(self) -> (usize, Vec<u8>, Entry) {
        match self {
            Op::Insert(tree, key, value) => (tree, key, Some(value)),
            Op::Remove(tree, key) => (tree, key, None),
        }
    }
}
