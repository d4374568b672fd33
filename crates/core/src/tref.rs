//! Typed references to shared objects.

use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::cell::Cell;
use crate::key::Key;

/// What a shared object's value must be: cloneable, shareable between threads, and encodable for
/// the day it crosses the network.
pub trait Object: Serialize + DeserializeOwned + Clone + Send + Sync + 'static {}
impl<T: Serialize + DeserializeOwned + Clone + Send + Sync + 'static> Object for T {}

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

/// The cell a `TRef` found on one engine, set at most once.
///
/// It holds a plain pointer, not a counted one, so cloning and dropping `TRef`s (which linked
/// structures do on every update) touches no shared counter. The pointer is used only by a
/// transaction of the engine whose id is stored next to it: that engine is then alive, and an
/// engine keeps every cell it made until it is dropped. Engine ids are never reused.
struct CellCache {
    /// 0: empty; `SETTING`: being set; else the engine's id.
    engine: AtomicU64,
    cell: AtomicPtr<Cell>,
}

const SETTING: u64 = u64::MAX;

impl CellCache {
    const fn empty() -> CellCache {
        CellCache {
            engine: AtomicU64::new(0),
            cell: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    #[inline]
    fn get(&self, engine: u64) -> Option<*const Cell> {
        if self.engine.load(Ordering::Acquire) == engine {
            Some(self.cell.load(Ordering::Relaxed))
        } else {
            None
        }
    }

    fn set(&self, engine: u64, cell: *const Cell) {
        if self
            .engine
            .compare_exchange(0, SETTING, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            self.cell.store(cell as *mut Cell, Ordering::Relaxed);
            self.engine.store(engine, Ordering::Release);
        }
    }
}

impl Clone for CellCache {
    fn clone(&self) -> Self {
        let engine = self.engine.load(Ordering::Acquire);
        if engine == 0 || engine == SETTING {
            return CellCache::empty();
        }
        CellCache {
            engine: AtomicU64::new(engine),
            cell: AtomicPtr::new(self.cell.load(Ordering::Relaxed)),
        }
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
