//! Version nodes: one allocation holding a header and the typed value after it.
//!
//! A committed version is never changed again, so readers may hold `&T` into it for as long as
//! the epoch guard they read it under lives. The value stays typed (no encoding on the local
//! path); its type is checked by comparing `TypeId`s, with no virtual call.

use std::any::TypeId;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::AtomicPtr;

/// Type-specific operations of a version node.
struct VTable {
    type_id: TypeId,
    drop: unsafe fn(*mut Version),
}

struct VTableFor<T>(PhantomData<T>);

impl<T: Send + Sync + 'static> VTableFor<T> {
    const VTABLE: VTable = VTable {
        type_id: TypeId::of::<T>(),
        drop: drop_typed::<T>,
    };
}

/// # Safety
/// `p` must come from [`OwnedVersion::new::<T>`] and be owned by the caller.
unsafe fn drop_typed<T>(p: *mut Version) {
    drop(Box::from_raw(p as *mut Typed<T>));
}

/// The header every version node starts with.
#[repr(C)]
pub(crate) struct Version {
    /// Commit timestamp; set before the node is published, never after.
    pub(crate) ts: u64,
    /// The next older version.
    pub(crate) prev: AtomicPtr<Version>,
    vtable: &'static VTable,
    /// False for a deletion marker.
    present: bool,
}

#[repr(C)]
struct Typed<T> {
    header: Version,
    value: Option<T>,
}

impl Version {
    /// Whether this version holds a value (false: the object was deleted).
    #[inline]
    pub(crate) fn is_present(&self) -> bool {
        self.present
    }

    /// The value, if this version is present and holds a `T`; `Err` if it holds another type.
    #[inline]
    pub(crate) fn get<T: 'static>(&self) -> Result<Option<&T>, ()> {
        if self.vtable.type_id != TypeId::of::<T>() {
            return if self.present { Err(()) } else { Ok(None) };
        }
        // SAFETY: the type id says this header starts a `Typed<T>` (`repr(C)`, header first).
        Ok(unsafe { &*(self as *const Version as *const Typed<T>) }
            .value
            .as_ref())
    }
}

/// An owned version node not reachable from any cell (being built, buffered in a write set, or
/// unlinked for good). Dropping it frees it.
pub(crate) struct OwnedVersion(NonNull<Version>);

// SAFETY: nodes are made only from `T: Send + Sync` values.
unsafe impl Send for OwnedVersion {}
unsafe impl Sync for OwnedVersion {}

impl OwnedVersion {
    /// A node holding `value` (`None`: a deletion marker for an object of type `T`).
    pub(crate) fn new<T: Send + Sync + 'static>(value: Option<T>) -> OwnedVersion {
        let node = Box::new(Typed {
            header: Version {
                ts: 0,
                prev: AtomicPtr::new(std::ptr::null_mut()),
                vtable: &VTableFor::<T>::VTABLE,
                present: value.is_some(),
            },
            value,
        });
        OwnedVersion(NonNull::from(Box::leak(node)).cast())
    }

    /// The node, for reading while it is owned here.
    #[inline]
    pub(crate) fn as_ptr(&self) -> *const Version {
        self.0.as_ptr()
    }

    /// Header access while the node is still private.
    #[inline]
    pub(crate) fn header_mut(&mut self) -> &mut Version {
        // SAFETY: we own the node exclusively.
        unsafe { self.0.as_mut() }
    }

    /// Gives up ownership (the node is being published).
    #[inline]
    pub(crate) fn into_raw(self) -> *mut Version {
        let p = self.0.as_ptr();
        std::mem::forget(self);
        p
    }

    /// Takes ownership of a node that is no longer reachable.
    ///
    /// # Safety
    /// `p` must come from [`OwnedVersion::into_raw`] and nothing else may own or reach it.
    #[inline]
    pub(crate) unsafe fn from_raw(p: *mut Version) -> OwnedVersion {
        OwnedVersion(NonNull::new_unchecked(p))
    }
}

impl Drop for OwnedVersion {
    fn drop(&mut self) {
        // SAFETY: we own the node; its vtable matches the type it was made with.
        unsafe { (self.0.as_ref().vtable.drop)(self.0.as_ptr()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn typed_access_checks_the_type() {
        let v = OwnedVersion::new(Some(String::from("hi")));
        let h = unsafe { &*v.as_ptr() };
        assert_eq!(h.get::<String>().unwrap().map(String::as_str), Some("hi"));
        assert!(h.get::<u64>().is_err());
        let d = OwnedVersion::new::<u64>(None);
        let h = unsafe { &*d.as_ptr() };
        assert!(!h.is_present());
        assert_eq!(h.get::<String>(), Ok(None));
    }

    #[test]
    fn dropping_a_node_drops_its_value() {
        let shared = Arc::new(5);
        let v = OwnedVersion::new(Some(shared.clone()));
        assert_eq!(Arc::strong_count(&shared), 2);
        drop(v);
        assert_eq!(Arc::strong_count(&shared), 1);
        let raw = OwnedVersion::new(Some(shared.clone())).into_raw();
        drop(unsafe { OwnedVersion::from_raw(raw) });
        assert_eq!(Arc::strong_count(&shared), 1);
    }
}
