//! The overlay: changes that are durable in the write-ahead log and visible to every reader, but not yet
//! applied to sled.
//!
//! The writer thread appends a batch to the log, syncs it, records its operations here and only then answers.
//! Inserting into sled's trees is left to the applier thread, which takes the overlay one layer at a time: the
//! writer keeps one layer open, and closes it (opening a new one) once it holds [`super::writer`]'s bound of
//! operations or has been open long enough. A closed layer is applied to sled in key order, tree by tree, and
//! dropped from the read path only once all of it is in sled, so a reader always finds every acknowledged
//! change in one place or the other.
//!
//! Within a layer only the last operation on a key is kept. Most of what a payment life writes is short-lived
//! and never reaches sled at all: the `pending` entry a payment has while it waits for its provider, the due
//! entries of its webhooks, the record rewritten at each status change and each delivery attempt are written
//! once, or not at all, per layer. sled 0.34.7 appends a fragment to a page for every insert, rewrites the
//! whole leaf every few, and keeps bookkeeping in memory for every page and segment it ever wrote, so each
//! operation that never reaches it is CPU, disk and resident memory saved (docs/perf/history.md).
//!
//! Readers look in the layers newest first, then in sled. A removal is kept as a tombstone, which hides what
//! sled or an older layer holds. Range scans merge the layers' entries in the range with sled's iterator.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use super::StoreError;

/// What a layer knows of a key: its value, or `None` for a removal.
pub(crate) type Entry = Option<Vec<u8>>;

/// One tree's keys in a layer.
pub(crate) type TreeMap = BTreeMap<Vec<u8>, Entry>;

/// Turns a layer's keys of one tree into the keys and values sled stores for them (the journal's runs, see
/// `layout`). While the layer is in the read path, readers see its own entries beside what the rewrite put in
/// sled, so whatever it writes must read back, merged with them, as the layer's entries alone would.
pub(crate) type Rewrite = fn(&TreeMap) -> Result<Vec<(Vec<u8>, Entry)>, StoreError>;

/// One tree in the order a layer is applied, with the rewrite its keys go through, if any.
#[derive(Clone, Copy)]
pub(crate) struct ApplyStep {
    pub(crate) tree: usize,
    pub(crate) rewrite: Option<Rewrite>,
}

impl ApplyStep {
    /// A tree whose keys reach sled as the layer holds them.
    pub(crate) const fn plain(tree: usize) -> ApplyStep {
        ApplyStep { tree, rewrite: None }
    }
}

/// A tree's share of a layer's work: the layer's own keys, or what its rewrite made of them.
enum Keys<'a> {
    Layer(&'a TreeMap),
    Rewritten(Vec<(Vec<u8>, Entry)>),
}

impl Keys<'_> {
    fn len(&self) -> usize {
        match self {
            Keys::Layer(keys) => keys.len(),
            Keys::Rewritten(keys) => keys.len(),
        }
    }

    fn iter(&self) -> Box<dyn Iterator<Item = (&[u8], &Entry)> + '_> {
        match self {
            Keys::Layer(keys) => Box::new(keys.iter().map(|(key, entry)| (key.as_slice(), entry))),
            Keys::Rewritten(keys) => Box::new(keys.iter().map(|(key, entry)| (key.as_slice(), entry))),
        }
    }
}

/// One generation of changes: per tree, the last operation on each key made while the layer was open.
pub(crate) struct Layer {
    trees: RwLock<Vec<TreeMap>>,
    /// Operations recorded while open, overwritten ones included: what the writer's bound counts.
    recorded: AtomicUsize,
}

impl Layer {
    fn new(tree_count: usize) -> Layer {
        Layer { trees: RwLock::new(vec![TreeMap::new(); tree_count]), recorded: AtomicUsize::new(0) }
    }

    /// Operations recorded in this layer, overwritten ones included.
    pub(crate) fn recorded(&self) -> usize {
        self.recorded.load(Ordering::Relaxed)
    }

    /// Applies the layer to sled, each tree in key order and through its step's rewrite if it has one, and
    /// returns the number of keys written to sled. The order between trees does not matter, because the layer
    /// stays in the read path until all of it is in sled. A removal of a key sled does not hold costs sled a
    /// lookup and nothing else (it short-circuits a no-op delete).
    ///
    /// With `parallel`, a large layer is applied on two threads, the trees split in two groups of about the
    /// same number of keys: sled's trees take inserts concurrently, and one thread applying is what limits the
    /// store's write rate once the applier is behind. `pace` is called every [`PACE_KEYS`] keys with the keys
    /// done and the total of the calling thread, and may sleep to spread the work.
    pub(crate) fn apply(
        &self,
        trees: &[sled::Tree],
        order: &[ApplyStep],
        parallel: bool,
        pace: &(dyn Fn(usize, usize) + Sync),
    ) -> Result<usize, StoreError> {
        let layer = self.trees.read().map_err(|_| poisoned())?;
        if layer.iter().enumerate().any(|(index, keys)| !keys.is_empty() && !order.iter().any(|s| s.tree == index)) {
            return Err(StoreError::Corrupt("a tree missing from the apply order".into()));
        }
        let mut work: Vec<(&sled::Tree, Keys)> = Vec::with_capacity(order.len());
        for step in order {
            let (Some(tree), Some(keys)) = (trees.get(step.tree), layer.get(step.tree)) else { continue };
            if keys.is_empty() {
                continue;
            }
            let keys = match step.rewrite {
                Some(rewrite) => Keys::Rewritten(rewrite(keys)?),
                None => Keys::Layer(keys),
            };
            work.push((tree, keys));
        }
        let total: usize = work.iter().map(|(_, keys)| keys.len()).sum();
        if !parallel || total < PARALLEL_APPLY_KEYS {
            return apply_trees(&work, pace);
        }
        // Largest first, each to the lighter group.
        work.sort_by_key(|(_, keys)| std::cmp::Reverse(keys.len()));
        let (mut left, mut right) = (Vec::new(), Vec::new());
        let (mut left_keys, mut right_keys) = (0, 0);
        for item in work {
            if left_keys <= right_keys {
                left_keys += item.1.len();
                left.push(item);
            } else {
                right_keys += item.1.len();
                right.push(item);
            }
        }
        std::thread::scope(|scope| {
            let other = scope.spawn(|| apply_trees(&right, pace));
            let mine = apply_trees(&left, pace);
            let other = other.join().unwrap_or_else(|_| Err(StoreError::Io("an apply thread panicked".into())));
            Ok(mine? + other?)
        })
    }
}

/// A layer with fewer keys than this is applied on one thread: starting a second costs more than it saves.
const PARALLEL_APPLY_KEYS: usize = 4096;
/// How many keys are applied between two calls of the pace function.
pub(crate) const PACE_KEYS: usize = 256;

fn apply_trees(work: &[(&sled::Tree, Keys)], pace: &(dyn Fn(usize, usize) + Sync)) -> Result<usize, StoreError> {
    let total: usize = work.iter().map(|(_, keys)| keys.len()).sum();
    let (mut applied, mut until_pace) = (0, PACE_KEYS);
    for (tree, keys) in work {
        for (key, entry) in keys.iter() {
            match entry {
                Some(value) => tree.insert(key, value.as_slice()).map(drop),
                None => tree.remove(key).map(drop),
            }
            .map_err(|e| StoreError::Io(format!("apply to sled: {e}")))?;
            applied += 1;
            until_pace -= 1;
            if until_pace == 0 {
                pace(applied, total);
                until_pace = PACE_KEYS;
            }
        }
    }
    Ok(applied)
}

fn poisoned() -> StoreError {
    StoreError::Io("the overlay's lock was poisoned by a panic".into())
}

/// Every layer not yet applied to sled, oldest first; the last one is open for the writer.
pub(crate) struct Overlay {
    layers: RwLock<VecDeque<Arc<Layer>>>,
    tree_count: usize,
}

impl Overlay {
    pub(crate) fn new(tree_count: usize) -> Overlay {
        Overlay { layers: RwLock::new(VecDeque::from([Arc::new(Layer::new(tree_count))])), tree_count }
    }

    /// Records operations `(tree, key, entry)` in the open layer; the caller has made them durable. Returns
    /// which trees they touched, one bit per tree index.
    pub(crate) fn record(&self, ops: impl IntoIterator<Item = (usize, Vec<u8>, Entry)>) -> Result<u64, StoreError> {
        let open = self.layers.read().map_err(|_| poisoned())?.back().cloned().ok_or_else(poisoned)?;
        let mut trees = open.trees.write().map_err(|_| poisoned())?;
        let (mut touched, mut count) = (0u64, 0);
        for (tree, key, entry) in ops {
            let keys = trees.get_mut(tree).ok_or_else(|| StoreError::Corrupt(format!("no tree {tree}")))?;
            keys.insert(key, entry);
            touched |= 1u64.checked_shl(tree as u32).unwrap_or(0);
            count += 1;
        }
        open.recorded.fetch_add(count, Ordering::Relaxed);
        Ok(touched)
    }

    /// Operations recorded in the open layer.
    pub(crate) fn open_recorded(&self) -> usize {
        self.layers.read().ok().and_then(|layers| layers.back().map(|l| l.recorded())).unwrap_or(0)
    }

    /// Closes the open layer and opens a new one; the closed layer stays readable until [`Overlay::release`].
    /// Only the writer calls this, so nothing records into the layer once it is returned.
    pub(crate) fn freeze(&self) -> Result<Arc<Layer>, StoreError> {
        let mut layers = self.layers.write().map_err(|_| poisoned())?;
        let closed = layers.back().cloned().ok_or_else(poisoned)?;
        layers.push_back(Arc::new(Layer::new(self.tree_count)));
        Ok(closed)
    }

    /// Drops `layer`, now wholly in sled, from the read path. Layers are applied and released oldest first.
    pub(crate) fn release(&self, layer: &Arc<Layer>) -> Result<(), StoreError> {
        let mut layers = self.layers.write().map_err(|_| poisoned())?;
        match layers.front() {
            Some(oldest) if Arc::ptr_eq(oldest, layer) && layers.len() > 1 => {
                layers.pop_front();
                Ok(())
            }
            _ => Err(StoreError::Corrupt("released an overlay layer out of order".into())),
        }
    }

    /// Layers not yet released, the open one included.
    pub(crate) fn depth(&self) -> usize {
        self.layers.read().map_or(0, |layers| layers.len())
    }

    /// What the overlay says of `key`: `None` if no layer has it (ask sled), `Some(None)` if it was removed.
    pub(crate) fn get(&self, tree: usize, key: &[u8]) -> Result<Option<Entry>, StoreError> {
        let layers = self.layers.read().map_err(|_| poisoned())?;
        for layer in layers.iter().rev() {
            let trees = layer.trees.read().map_err(|_| poisoned())?;
            if let Some(entry) = trees.get(tree).and_then(|keys| keys.get(key)) {
                return Ok(Some(entry.clone()));
            }
        }
        Ok(None)
    }

    /// Every key the overlay has in the range, with the newest layer's entry for each, in key order.
    pub(crate) fn range(
        &self,
        tree: usize,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
    ) -> Result<Vec<(Vec<u8>, Entry)>, StoreError> {
        if is_empty_range(start, end) {
            // `BTreeMap::range` panics on these; sled's range is simply empty.
            return Ok(Vec::new());
        }
        let layers = self.layers.read().map_err(|_| poisoned())?;
        let mut merged: BTreeMap<Vec<u8>, Entry> = BTreeMap::new();
        // Oldest first, so a newer layer's entry replaces an older one's.
        for layer in layers.iter() {
            let trees = layer.trees.read().map_err(|_| poisoned())?;
            let Some(keys) = trees.get(tree) else { continue };
            for (key, entry) in keys.range::<[u8], _>((start, end)) {
                merged.insert(key.clone(), entry.clone());
            }
        }
        Ok(merged.into_iter().collect())
    }
}

/// Whether no key can lie between `start` and `end`: the start after the end, or both the same and excluded.
fn is_empty_range(start: Bound<&[u8]>, end: Bound<&[u8]>) -> bool {
    match (start, end) {
        (Bound::Included(a), Bound::Included(b)) => a > b,
        (Bound::Included(a), Bound::Excluded(b))
        | (Bound::Excluded(a), Bound::Included(b))
        | (Bound::Excluded(a), Bound::Excluded(b)) => a >= b,
        _ => false,
    }
}

/// Merges a sled iterator with the overlay's entries of the same range, both in the same direction: an
/// overlay entry replaces sled's value for its key, and a tombstone hides it.
pub(crate) struct Merged<I: Iterator> {
    sled: std::iter::Peekable<I>,
    overlay: std::iter::Peekable<std::vec::IntoIter<(Vec<u8>, Entry)>>,
    reverse: bool,
}

impl<I> Merged<I>
where
    I: Iterator<Item = sled::Result<(sled::IVec, sled::IVec)>>,
{
    /// `overlay` is in key order; with `reverse` the sled iterator runs from the end and so does the merge.
    pub(crate) fn new(sled: I, mut overlay: Vec<(Vec<u8>, Entry)>, reverse: bool) -> Merged<I> {
        if reverse {
            overlay.reverse();
        }
        Merged { sled: sled.peekable(), overlay: overlay.into_iter().peekable(), reverse }
    }
}

impl<I> Iterator for Merged<I>
where
    I: Iterator<Item = sled::Result<(sled::IVec, sled::IVec)>>,
{
    type Item = sled::Result<(sled::IVec, sled::IVec)>;

    fn next(&mut self) -> Option<Self::Item> {
        enum Pick {
            Sled,
            Overlay,
            /// Both have the key: the overlay is newer, so sled's value is dropped.
            Both,
        }
        let reverse = self.reverse;
        loop {
            let pick = match (self.sled.peek(), self.overlay.peek()) {
                (None, None) => return None,
                // An error is handed on as soon as it is met.
                (Some(Err(_)), _) | (Some(Ok(_)), None) => Pick::Sled,
                (None, Some(_)) => Pick::Overlay,
                (Some(Ok((sled_key, _))), Some((overlay_key, _))) => {
                    let (a, b) = (sled_key.as_ref(), overlay_key.as_slice());
                    if a == b {
                        Pick::Both
                    } else if (a < b) != reverse {
                        Pick::Sled
                    } else {
                        Pick::Overlay
                    }
                }
            };
            match pick {
                Pick::Sled => return self.sled.next(),
                Pick::Both => {
                    self.sled.next();
                }
                Pick::Overlay => {}
            }
            match self.overlay.next() {
                Some((key, Some(value))) => return Some(Ok((sled::IVec::from(key), sled::IVec::from(value)))),
                // A tombstone: the key is gone.
                Some((_, None)) => continue,
                None => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, value: &str) -> (usize, Vec<u8>, Entry) {
        (0, key.as_bytes().to_vec(), Some(value.as_bytes().to_vec()))
    }

    fn del(key: &str) -> (usize, Vec<u8>, Entry) {
        (0, key.as_bytes().to_vec(), None)
    }

    fn text(item: sled::Result<(sled::IVec, sled::IVec)>) -> (String, String) {
        let (k, v) = item.unwrap();
        (String::from_utf8(k.to_vec()).unwrap(), String::from_utf8(v.to_vec()).unwrap())
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn the_newest_layer_decides_and_a_tombstone_hides_older_values() {
        let overlay = Overlay::new(2);
        overlay.record([put("a", "1"), put("b", "1")]).unwrap();
        overlay.freeze().unwrap();
        overlay.record([put("a", "2"), del("b")]).unwrap();
        assert_eq!(overlay.get(0, b"a").unwrap(), Some(Some(b"2".to_vec())));
        assert_eq!(overlay.get(0, b"b").unwrap(), Some(None));
        assert_eq!(overlay.get(0, b"c").unwrap(), None);
        assert_eq!(overlay.get(1, b"a").unwrap(), None);
        assert_eq!(overlay.depth(), 2);
    }

    #[test]
    fn a_layer_keeps_the_last_operation_on_each_key_and_counts_them_all() {
        let overlay = Overlay::new(1);
        let touched = overlay.record([put("k", "1"), put("k", "2"), del("gone"), put("gone", "x")]).unwrap();
        overlay.record([del("k")]).unwrap();
        assert_eq!(touched, 1);
        assert_eq!(overlay.open_recorded(), 5);
        let db = sled::Config::new().temporary(true).open().unwrap();
        let tree = db.open_tree("t").unwrap();
        tree.insert(b"k", b"old").unwrap();
        let layer = overlay.freeze().unwrap();
        assert_eq!(layer.apply(std::slice::from_ref(&tree), &[ApplyStep::plain(0)], false, &|_, _| {}).unwrap(), 2);
        assert_eq!(tree.get(b"k").unwrap(), None);
        assert_eq!(tree.get(b"gone").unwrap().as_deref(), Some(&b"x"[..]));
    }

    #[test]
    fn a_large_layer_is_applied_whole_on_two_threads() {
        let overlay = Overlay::new(3);
        let keys = |tree: usize, n: u32| (0..n).map(move |i| (tree, i.to_be_bytes().to_vec(), Some(vec![tree as u8])));
        overlay.record(keys(0, 3000).chain(keys(1, 2000)).chain(keys(2, 1000))).unwrap();
        overlay.record([(2, 7u32.to_be_bytes().to_vec(), None)]).unwrap();
        let db = sled::Config::new().temporary(true).open().unwrap();
        let trees: Vec<_> = (0..3).map(|i| db.open_tree(format!("t{i}")).unwrap()).collect();
        const { assert!(3000 + 2000 + 1000 >= PARALLEL_APPLY_KEYS) };
        let paced = AtomicUsize::new(0);
        let pace = |done: usize, total: usize| {
            assert!(done <= total);
            assert_eq!(done % PACE_KEYS, 0);
            paced.fetch_add(1, Ordering::Relaxed);
        };
        assert_eq!(
            overlay.freeze().unwrap().apply(&trees, &[2, 0, 1].map(ApplyStep::plain), true, &pace).unwrap(),
            6000
        );
        // Two threads of about 3,000 keys each: 11 calls each, not 23 as one thread would make.
        assert_eq!(paced.load(Ordering::Relaxed), 2 * (3000 / PACE_KEYS));
        assert_eq!((trees[0].len(), trees[1].len(), trees[2].len()), (3000, 2000, 999));
        assert_eq!(trees[1].get(1999u32.to_be_bytes()).unwrap().as_deref(), Some(&[1u8][..]));
        assert_eq!(trees[2].get(7u32.to_be_bytes()).unwrap(), None);
    }

    #[test]
    fn layers_are_released_oldest_first_and_the_open_one_never() {
        let overlay = Overlay::new(1);
        let first = overlay.freeze().unwrap();
        let second = overlay.freeze().unwrap();
        assert!(overlay.release(&second).is_err());
        overlay.release(&first).unwrap();
        overlay.release(&second).unwrap();
        let open = overlay.layers.read().unwrap().back().cloned().unwrap();
        assert!(overlay.release(&open).is_err());
        assert_eq!(overlay.depth(), 1);
    }

    #[test]
    fn a_record_for_a_tree_that_does_not_exist_is_refused() {
        let overlay = Overlay::new(1);
        assert!(matches!(overlay.record([(3, b"k".to_vec(), None)]), Err(StoreError::Corrupt(_))));
    }

    #[test]
    fn a_layer_with_a_tree_missing_from_the_order_is_refused_before_anything_is_applied() {
        let overlay = Overlay::new(2);
        overlay.record([put("a", "1"), (1, b"b".to_vec(), Some(b"2".to_vec()))]).unwrap();
        let db = sled::Config::new().temporary(true).open().unwrap();
        let trees = [db.open_tree("t0").unwrap(), db.open_tree("t1").unwrap()];
        assert!(matches!(
            overlay.freeze().unwrap().apply(&trees, &[ApplyStep::plain(0)], false, &|_, _| {}),
            Err(StoreError::Corrupt(_))
        ));
        assert!(trees[0].is_empty() && trees[1].is_empty());
    }

    #[test]
    fn ranges_merge_with_sled_in_both_directions() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let tree = db.open_tree("t").unwrap();
        for (k, v) in [("a", "sled"), ("c", "sled"), ("e", "sled"), ("g", "sled")] {
            tree.insert(k, v).unwrap();
        }
        let overlay = Overlay::new(1);
        overlay.record([put("b", "old"), put("c", "old")]).unwrap();
        overlay.freeze().unwrap();
        overlay.record([put("b", "new"), del("e"), put("f", "new"), put("z", "out")]).unwrap();
        let (start, end) = (Bound::Included(&b"a"[..]), Bound::Excluded(&b"h"[..]));
        let entries = overlay.range(0, start, end).unwrap();
        let forward: Vec<_> =
            Merged::new(tree.range::<&[u8], _>((start, end)), entries.clone(), false).map(text).collect();
        let expected = pairs(&[("a", "sled"), ("b", "new"), ("c", "old"), ("f", "new"), ("g", "sled")]);
        assert_eq!(forward, expected);
        let backward: Vec<_> =
            Merged::new(tree.range::<&[u8], _>((start, end)).rev(), entries, true).map(text).collect();
        assert_eq!(backward, expected.into_iter().rev().collect::<Vec<_>>());
    }

    #[test]
    fn an_inverted_or_empty_range_is_empty_not_a_panic() {
        let overlay = Overlay::new(1);
        overlay.record([put("a", "1"), put("b", "2")]).unwrap();
        let (a, b) = (&b"a"[..], &b"b"[..]);
        assert!(overlay.range(0, Bound::Included(b), Bound::Excluded(a)).unwrap().is_empty());
        assert!(overlay.range(0, Bound::Excluded(a), Bound::Excluded(a)).unwrap().is_empty());
        assert!(overlay.range(0, Bound::Included(a), Bound::Excluded(a)).unwrap().is_empty());
        assert_eq!(overlay.range(0, Bound::Included(a), Bound::Included(a)).unwrap().len(), 1);
    }

    #[test]
    fn a_range_with_only_overlay_entries_or_only_sled_entries_is_whole() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let tree = db.open_tree("t").unwrap();
        let overlay = Overlay::new(1);
        overlay.record([put("x", "1"), put("y", "2"), del("w")]).unwrap();
        let all = overlay.range(0, Bound::Unbounded, Bound::Unbounded).unwrap();
        let merged: Vec<_> = Merged::new(tree.iter(), all, false).map(text).collect();
        assert_eq!(merged, pairs(&[("x", "1"), ("y", "2")]));
        tree.insert("m", "s").unwrap();
        let merged: Vec<_> = Merged::new(tree.iter(), Vec::new(), false).map(text).collect();
        assert_eq!(merged, pairs(&[("m", "s")]));
    }
}
