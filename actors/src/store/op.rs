//! The store's unit of writing: one absolute operation on one key of one tree.
//!
//! It sits on the ground floor because everything above speaks it: the layout turns a change into
//! operations and each engine's writer commits them. An operation is absolute (the value to hold, or the key's
//! removal), never relative to what the key held, which is what lets a batch keep only the last operation on
//! each key, and lets the upgrade from sled replay that engine's old log over what sled already held.

use std::collections::BTreeMap;

/// What a batch does to a key: gives it a value, or removes it (`None`).
pub(crate) type Entry = Option<Vec<u8>>;

/// One tree's keys in a batch, in key order.
pub(crate) type TreeMap = BTreeMap<Vec<u8>, Entry>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Sets `key` of tree number `tree` to `value`.
    Insert(usize, Vec<u8>, Vec<u8>),
    /// Sets `key` of tree number `tree` to `value`, a key the change itself makes (its journal sequence number,
    /// a new transaction's or notification's id): no value is held there before. It means what `Insert` means;
    /// an engine may write it more cheaply (PostgreSQL inserts it without first looking for a row to update;
    /// should the key be held all the same, it writes the batch again as `Insert`s, except that a journal
    /// position held with another event refuses its merchant's change).
    Create(usize, Vec<u8>, Vec<u8>),
    /// Removes `key` from tree number `tree`.
    Remove(usize, Vec<u8>),
}

impl Op {
    /// The operation as a batch keeps it: tree, key, and the value or `None` for a removal.
    pub(crate) fn into_entry(self) -> (usize, Vec<u8>, Entry) {
        match self {
            Op::Insert(tree, key, value) | Op::Create(tree, key, value) => (tree, key, Some(value)),
            Op::Remove(tree, key) => (tree, key, None),
        }
    }

    /// The tree the operation writes.
    pub(crate) fn tree(&self) -> usize {
        match self {
            Op::Insert(tree, ..) | Op::Create(tree, ..) | Op::Remove(tree, _) => *tree,
        }
    }

    /// The key set and its value; `None` for a removal.
    pub(crate) fn set(&self) -> Option<(usize, &[u8], &[u8])> {
        match self {
            Op::Insert(tree, key, value) | Op::Create(tree, key, value) => Some((*tree, key, value)),
            Op::Remove(..) => None,
        }
    }
}
