//! Typed references to shared objects.

use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::cell::Cell;
use crate::key::Key;

/// A typed reference to the shared object named by a key.
///
/// A `TRef` is only a name: it can be made before the object exists, stored inside other objects
/// (it encodes as its key), and used from any thread. After its first use on a node it remembers
/// that node's cell, so later accesses skip the object table; clones copy what was remembered.
pub struct TRef<T> {
    key: Key,
    cache: CellCache,
    _type: PhantomData<fn() -> T>,
}

/// The cell a `TRef` found on one engine, set at most once: one word holding the engine's id
/// in its top 16 bits and the cell's address in the low 48.
///
/// It holds an uncounted address, not a counted pointer, so cloning and dropping `TRef`s (which linked
/// structures do on every update) touches no shared counter. The pointer is used only by a
/// transaction of the engine whose id is stored with it: that engine is then alive, and an
/// engine keeps every cell it made until it is dropped. Engine ids are never reused; an engine
/// whose id or a cell whose address does not fit is simply not cached (looked up each time).
/// One word instead of two keeps `TRef`s, which linked structures store in every node, small.
struct CellCache(AtomicU64);

/// Bits of a cached cell's address.
const ADDRESS_BITS: u32 = 48;
/// The address part of the cache word.
const ADDRESS_MASK: u64 = (1 << ADDRESS_BITS) - 1;
/// Engine ids that fit beside the address (0 marks an empty cache).
const MAX_CACHED_ENGINE: u64 = (1 << (64 - ADDRESS_BITS)) - 1;

impl CellCache {
    const fn empty() -> CellCache {
        CellCache(AtomicU64::new(0))
    }

    #[inline]
    fn get(&self, engine: u64) -> Option<*const Cell> {
        // Engine ids start at 1: an empty cache (0) matches no engine.
        debug_assert!(engine != 0, "engine ids start at 1");
        let word = self.0.load(Ordering::Acquire);
        if word >> ADDRESS_BITS == engine {
            // The address was exposed by `set` (a pointer cast to an integer), so casting it
            // back yields a pointer to the same cell.
            Some((word & ADDRESS_MASK) as usize as *const Cell)
        } else {
            None
        }
    }

    fn set(&self, engine: u64, cell: *const Cell) {
        let address = cell as usize as u64;
        if engine == 0 || engine > MAX_CACHED_ENGINE || address > ADDRESS_MASK {
            return;
        }
        let word = (engine << ADDRESS_BITS) | address;
        let _ = self
            .0
            .compare_exchange(0, word, Ordering::Release, Ordering::Relaxed);
    }
}

impl Clone for CellCache {
    fn clone(&self) -> Self {
        CellCache(AtomicU64::new(self.0.load(Ordering::Acquire)))
    }
}

impl<T> TRef<T> {
    /// A reference to the object named `key`.
    pub fn new(key: impl Into<Key>) -> TRef<T> {
        TRef {
            key: key.into(),
            cache: CellCache::empty(),
            _type: PhantomData,
        }
    }

    /// The object's key.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The cell remembered for `engine`, if any. Dereference it only inside a transaction of
    /// that engine.
    #[inline]
    pub(crate) fn cached(&self, engine: u64) -> Option<*const Cell> {
        self.cache.get(engine)
    }

    /// Remembers `cell` as this reference's cell on `engine` (the first engine wins).
    pub(crate) fn remember(&self, engine: u64, cell: *const Cell) {
        self.cache.set(engine, cell);
    }
}

impl<T> Clone for TRef<T> {
    fn clone(&self) -> Self {
        TRef {
            key: self.key.clone(),
            cache: self.cache.clone(),
            _type: PhantomData,
        }
    }
}

impl<T> PartialEq for TRef<T> {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}
impl<T> Eq for TRef<T> {}

impl<T> std::hash::Hash for TRef<T> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.key.hash(state)
    }
}

impl<T> fmt::Debug for TRef<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TRef<{}>({})", std::any::type_name::<T>(), self.key)
    }
}

impl<T> Serialize for TRef<T> {
    /// Encodes as its key (and notes the key when a value's references are being collected,
    /// for the replicated store's garbage collection).
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        crate::codec::note_ref(&self.key);
        self.key.serialize(s)
    }
}

impl<'de, T> Deserialize<'de> for TRef<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(TRef::new(Key::deserialize(d)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_cell_is_found_only_by_its_engine() {
        let cell = Cell::new();
        let r: TRef<u64> = TRef::new("x");
        assert_eq!(r.cached(3), None);
        r.remember(3, &cell);
        assert_eq!(r.cached(3), Some(&cell as *const Cell));
        assert_eq!(r.cached(4), None);
        // The first engine wins; clones copy what was remembered.
        r.remember(4, &cell);
        assert_eq!(r.cached(4), None);
        assert_eq!(r.clone().cached(3), Some(&cell as *const Cell));
    }

    #[test]
    fn engines_past_the_packed_range_are_not_cached() {
        let cell = Cell::new();
        let r: TRef<u64> = TRef::new("x");
        r.remember(MAX_CACHED_ENGINE + 2, &cell);
        assert_eq!(r.cached(MAX_CACHED_ENGINE + 2), None);
        // Nor does the id it would truncate to.
        assert_eq!(r.cached(1), None);
        r.remember(MAX_CACHED_ENGINE, &cell);
        assert_eq!(r.cached(MAX_CACHED_ENGINE), Some(&cell as *const Cell));
    }

    #[cfg(target_pointer_width = "64")]
    #[test]
    fn an_address_past_48_bits_is_not_cached() {
        let r: TRef<u64> = TRef::new("x");
        // Never dereferenced.
        r.remember(1, (1usize << 48) as *const Cell);
        assert_eq!(r.cached(1), None);
    }

    #[cfg(target_pointer_width = "64")]
    #[test]
    fn a_reference_is_four_words() {
        assert_eq!(std::mem::size_of::<TRef<u64>>(), 32);
    }
}
