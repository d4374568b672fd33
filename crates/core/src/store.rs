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
}

impl Store {
    pub(crate) fn new() -> Store {
        Store {
            cells: DashMap::with_hasher(FxBuildHasher),
        }
    }

    /// The cell for `key`, made empty (absent object) if there was none. The pointer is valid
    /// for the store's lifetime.
    pub(crate) fn cell(&self, key: &Key) -> *const Cell {
        if let Some(c) = self.cells.get(key) {
            return &**c;
        }
        &**self
            .cells
            .entry(key.clone())
            .or_insert_with(|| Box::new(Cell::new(key.clone())))
    }

    /// Number of cells (objects that exist, existed, or were looked up).
    pub(crate) fn len(&self) -> usize {
        self.cells.len()
    }
}
