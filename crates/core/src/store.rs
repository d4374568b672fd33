//! The node's object table: key to cell.

use dashmap::DashMap;
use rustc_hash::FxBuildHasher;

use crate::cell::Cell;
use crate::key::Key;

/// Maps keys to cells. A cell, once made, stays for the store's lifetime (an absent or deleted
/// object is a cell whose newest version says so), so a pointer to a cell is valid as long as the
/// store is.
pub(crate) struct Store {
    cells: DashMap<Key, Box<Cell>, FxBuildHasher>,
    /// Cell to key, kept only when the engine records histories (cells do not hold their key).
    names: Option<DashMap<usize, Key, FxBuildHasher>>,
}

impl Store {
    pub(crate) fn new(record_names: bool) -> Store {
        Store {
            cells: DashMap::with_hasher(FxBuildHasher),
            names: record_names.then(|| DashMap::with_hasher(FxBuildHasher)),
        }
    }

    /// The key of a cell of this store, if the store keeps names (else an empty key).
    pub(crate) fn key_of(&self, cell: *const Cell) -> Key {
        self.names
            .as_ref()
            .and_then(|n| n.get(&(cell as usize)).map(|k| k.clone()))
            .unwrap_or_else(|| Key::from_bytes(&[]))
    }

    /// The cell for `key`, made empty (absent object) if there was none. The pointer is valid
    /// for the store's lifetime.
    pub(crate) fn cell(&self, key: &Key) -> *const Cell {
        if let Some(c) = self.cells.get(key) {
            return &**c;
        }
        let cell: *const Cell = &**self
            .cells
            .entry(key.clone())
            .or_insert_with(|| Box::new(Cell::new()));
        if let Some(names) = &self.names {
            names.entry(cell as usize).or_insert_with(|| key.clone());
        }
        cell
    }

    /// Number of cells (objects that exist, existed, or were looked up).
    pub(crate) fn len(&self) -> usize {
        self.cells.len()
    }
}
