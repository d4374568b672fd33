//! The node's object table: key to cell.

use std::cell::RefCell;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use rustc_hash::FxBuildHasher;

use crate::cell::Cell;
use crate::key::Key;

/// Slots of each thread's cache of recent lookups (a power of two).
const RECENT_SLOTS: usize = 4096;
/// Shards of the key table. A shard grows by rehashing all its keys under its write lock, and
/// the transaction that made it grow waits for that with no safe point to preempt it at: many
/// small shards keep each stall short (a store of a million keys rehashes about 250 at a time).
/// With 256 shards, TPC-C's growing tables stalled transactions for 50-200 us, the tail of the
/// transaction service's preemption reaction time.
const SHARDS: usize = 4096;

static NEXT_STORE_ID: AtomicU64 = AtomicU64::new(1);

/// One remembered lookup: `key` of store `store` is `cell`.
struct Recent {
    store: u64,
    key: Key,
    cell: *const Cell,
}

thread_local! {
    /// Each thread's recent lookups, direct-mapped by key hash. Looking a key up in the shared
    /// table takes a shard's read lock, whose cache line then moves between the cores that
    /// look up keys at the same time; a hit here touches only this thread's memory. Entries
    /// name their store by an id never reused, and a store keeps every cell until it is dropped,
    /// so a hit for a live store is always valid.
    static RECENT: RefCell<Vec<Option<Recent>>> = const { RefCell::new(Vec::new()) };
}

/// Maps keys to cells. A cell, once made, stays for the store's lifetime (an absent or deleted
/// object is a cell whose newest version says so), so a pointer to a cell is valid as long as the
/// store is.
pub(crate) struct Store {
    id: u64,
    cells: DashMap<Key, Box<Cell>, FxBuildHasher>,
    /// Cell to key, kept only when the engine records histories (cells do not hold their key).
    names: Option<DashMap<usize, Key, FxBuildHasher>>,
}

impl Store {
    pub(crate) fn new(record_names: bool) -> Store {
        Store {
            id: NEXT_STORE_ID.fetch_add(1, Ordering::Relaxed),
            cells: DashMap::with_hasher_and_shard_amount(FxBuildHasher, SHARDS),
            names: record_names
                .then(|| DashMap::with_hasher_and_shard_amount(FxBuildHasher, SHARDS)),
        }
    }

    /// The key of a cell of this store, if the store keeps names (else an empty key).
    pub(crate) fn key_of(&self, cell: *const Cell) -> Key {
        self.name_of(cell).unwrap_or_else(|| Key::from_bytes(&[]))
    }

    /// The key of a cell of this store, if the store keeps names.
    pub(crate) fn name_of(&self, cell: *const Cell) -> Option<Key> {
        self.names
            .as_ref()
            .and_then(|n| n.get(&(cell as usize)).map(|k| k.clone()))
    }

    /// The cell for `key`, made empty (absent object) if there was none. The pointer is valid
    /// for the store's lifetime. Never inlined: it reads a thread-local, and transactions may
    /// move between threads (see `atomos_sched::task`).
    #[inline(never)]
    pub(crate) fn cell(&self, key: &Key) -> *const Cell {
        let slot = (FxBuildHasher.hash_one(key) as usize) & (RECENT_SLOTS - 1);
        let hit = RECENT.with(|recent| match recent.borrow().get(slot) {
            Some(Some(r)) if r.store == self.id && r.key == *key => Some(r.cell),
            _ => None,
        });
        if let Some(cell) = hit {
            return cell;
        }
        let cell = self.lookup(key);
        RECENT.with(|recent| {
            let mut recent = recent.borrow_mut();
            if recent.is_empty() {
                recent.resize_with(RECENT_SLOTS, || None);
            }
            recent[slot] = Some(Recent {
                store: self.id,
                key: key.clone(),
                cell,
            });
        });
        cell
    }

    /// The cell for `key` in the shared table, made if missing. A store that keeps names
    /// names a cell before publishing it, so no thread finds a cell without its key.
    fn lookup(&self, key: &Key) -> *const Cell {
        if let Some(c) = self.cells.get(key) {
            return &**c;
        }
        let Some(names) = &self.names else {
            return &**self
                .cells
                .entry(key.clone())
                .or_insert_with(|| Box::new(Cell::new()));
        };
        let fresh = Box::new(Cell::new());
        let at = &*fresh as *const Cell as usize;
        names.insert(at, key.clone());
        match self.cells.entry(key.clone()) {
            Entry::Occupied(o) => {
                // Another thread published one first: ours was never seen.
                let cell: *const Cell = &**o.get();
                drop(o);
                names.remove(&at);
                cell
            }
            Entry::Vacant(v) => &**v.insert(fresh),
        }
    }

    /// Calls `f` with every cell and its key (cells made meanwhile may be missed).
    pub(crate) fn for_each(&self, mut f: impl FnMut(&Key, &Cell)) {
        for entry in self.cells.iter() {
            f(entry.key(), entry.value());
        }
    }

    /// Number of cells (objects that exist, existed, or were looked up).
    pub(crate) fn len(&self) -> usize {
        self.cells.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recent_lookups_never_answer_for_another_store() {
        let key = Key::from("shared name");
        let a = Store::new(false);
        let b = Store::new(false);
        let in_a = a.cell(&key);
        let in_b = b.cell(&key);
        assert_ne!(in_a, in_b);
        // Hits of this thread's cache answer the right store, alternately.
        for _ in 0..3 {
            assert_eq!(a.cell(&key), in_a);
            assert_eq!(b.cell(&key), in_b);
        }
        // Another thread finds the same cells through the shared table.
        let (pa, pb) = (in_a as usize, in_b as usize);
        std::thread::scope(|s| {
            s.spawn(|| {
                assert_eq!(a.cell(&key) as usize, pa);
                assert_eq!(b.cell(&key) as usize, pb);
            });
        });
        // A store made after one is dropped gets cells of its own, whatever its address.
        drop(a);
        let c = Store::new(false);
        assert_eq!(c.len(), 0);
        let in_c = c.cell(&key);
        assert_eq!(c.len(), 1);
        assert_eq!(c.cell(&key), in_c);
    }

    #[test]
    fn keys_that_share_a_slot_each_find_their_own_cell() {
        let store = Store::new(false);
        // More keys than slots: many share a slot and evict each other.
        let keys: Vec<Key> = (0..3 * RECENT_SLOTS as u64)
            .map(|i| Key::with_index("k/", i))
            .collect();
        let cells: Vec<*const Cell> = keys.iter().map(|k| store.cell(k)).collect();
        for (k, c) in keys.iter().zip(&cells).rev() {
            assert_eq!(store.cell(k), *c);
        }
        assert_eq!(store.len(), keys.len());
    }
}
