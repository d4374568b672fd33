//! Typed references to shared objects.

use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};

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
/// that node's cell, so later accesses skip the object table; clones share what was remembered.
pub struct TRef<T> {
    key: Key,
    cache: OnceLock<CachedCell>,
    _type: PhantomData<fn() -> T>,
}

#[derive(Clone)]
pub(crate) struct CachedCell {
    pub(crate) engine: u64,
    pub(crate) cell: Arc<Cell>,
}

impl<T> TRef<T> {
    /// A reference to the object named `key`.
    pub fn new(key: impl Into<Key>) -> TRef<T> {
        TRef {
            key: key.into(),
            cache: OnceLock::new(),
            _type: PhantomData,
        }
    }

    /// The object's key.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The cell remembered for `engine`, if any.
    #[inline]
    pub(crate) fn cached(&self, engine: u64) -> Option<&Arc<Cell>> {
        match self.cache.get() {
            Some(c) if c.engine == engine => Some(&c.cell),
            _ => None,
        }
    }

    /// Remembers `cell` as this reference's cell on `engine` (first node wins).
    pub(crate) fn remember(&self, engine: u64, cell: Arc<Cell>) {
        let _ = self.cache.set(CachedCell { engine, cell });
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
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.key.serialize(s)
    }
}

impl<'de, T> Deserialize<'de> for TRef<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(TRef::new(Key::deserialize(d)?))
    }
}
