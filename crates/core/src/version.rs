//! Version nodes: one allocation holding a header and the typed value after it.
//!
//! A committed version is never changed again, so readers may hold `&T` into it for as long as
//! the attempt that read it runs (see `slots`). The value stays typed (no encoding on the local
//! path); its type is checked by comparing `TypeId`s, with no virtual call.

use std::alloc::Layout;
use std::any::TypeId;
use std::cell::RefCell;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::atomic::AtomicPtr;

/// Type-specific operations of a version node.
struct VTable {
    type_id: TypeId,
    /// Whether nodes with this table hold a value (false: deletion markers).
    present: bool,
    drop: unsafe fn(*mut Version),
}

struct VTableFor<T>(PhantomData<T>);

impl<T: Send + Sync + 'static> VTableFor<T> {
    const PRESENT: VTable = VTable {
        type_id: TypeId::of::<T>(),
        present: true,
        drop: drop_typed::<T, true>,
    };
    const DELETED: VTable = VTable {
        type_id: TypeId::of::<T>(),
        present: false,
        drop: drop_typed::<T, false>,
    };
}

/// # Safety
/// `p` must come from [`OwnedVersion::new::<T>`] and be owned by the caller; `PRESENT` must
/// say whether its value was initialized.
unsafe fn drop_typed<T, const PRESENT: bool>(p: *mut Version) {
    let p = p as *mut Typed<T>;
    if PRESENT {
        (*p).value.assume_init_drop();
    }
    release_block(p as *mut u8, Layout::new::<Typed<T>>());
}

/// Blocks up to this size are recycled per thread; larger ones go straight to the allocator.
const POOLED_MAX: usize = 256;
const CLASS: usize = 16;
/// Free blocks kept per size class and thread.
const POOL_CAP: usize = 512;

thread_local! {
    /// Free version blocks of this thread, by size class. A version is usually freed by another
    /// thread than the one that made it (the next writer of its object retires it); recycling
    /// blocks where they are freed avoids the allocator's slow path for cross-thread frees.
    static POOL: RefCell<Pool> = const { RefCell::new(Pool([const { Vec::new() }; POOLED_MAX / CLASS])) };
}

/// Free blocks by size class; gives them back to the allocator when its thread ends.
struct Pool([Vec<NonNull<u8>>; POOLED_MAX / CLASS]);

impl Drop for Pool {
    fn drop(&mut self) {
        for (class, blocks) in self.0.iter_mut().enumerate() {
            // SAFETY: a valid power-of-two alignment and a small size.
            let layout = unsafe { Layout::from_size_align_unchecked((class + 1) * CLASS, CLASS) };
            for b in blocks.drain(..) {
                // SAFETY: every pooled block was allocated with its class layout.
                unsafe { std::alloc::dealloc(b.as_ptr(), layout) };
            }
        }
    }
}

/// The pooled layout for `layout`, if it is small enough to pool.
#[inline]
fn pool_class(layout: Layout) -> Option<(usize, Layout)> {
    if layout.size() > POOLED_MAX || layout.align() > CLASS {
        return None;
    }
    let class = layout.size().div_ceil(CLASS).max(1);
    // SAFETY: CLASS is a power of two and the size is a small multiple of it.
    Some((class - 1, unsafe {
        Layout::from_size_align_unchecked(class * CLASS, CLASS)
    }))
}

/// A block for a value of `layout`.
#[inline]
fn acquire_block(layout: Layout) -> *mut u8 {
    let Some((class, block)) = pool_class(layout) else {
        // SAFETY: version nodes have a non-zero size.
        return unsafe { std::alloc::alloc(layout) };
    };
    let recycled = POOL
        .try_with(|p| p.borrow_mut().0[class].pop())
        .ok()
        .flatten();
    match recycled {
        Some(b) => b.as_ptr(),
        // SAFETY: non-zero size.
        None => unsafe { std::alloc::alloc(block) },
    }
}

/// Returns a block obtained from [`acquire_block`] with the same `layout`.
#[inline]
unsafe fn release_block(p: *mut u8, layout: Layout) {
    let Some((class, block)) = pool_class(layout) else {
        std::alloc::dealloc(p, layout);
        return;
    };
    let kept = POOL
        .try_with(|pool| {
            let mut pool = pool.borrow_mut();
            if pool.0[class].len() < POOL_CAP {
                pool.0[class].push(NonNull::new_unchecked(p));
                true
            } else {
                false
            }
        })
        .unwrap_or(false);
    if !kept {
        std::alloc::dealloc(p, block);
    }
}

/// The header every version node starts with.
#[repr(C)]
pub(crate) struct Version {
    /// Commit timestamp; set before the node is published, never after.
    pub(crate) ts: u64,
    /// The next older version.
    pub(crate) prev: AtomicPtr<Version>,
    vtable: &'static VTable,
}

/// A node: the header, then the value (uninitialized in a deletion marker).
#[repr(C)]
struct Typed<T> {
    header: Version,
    value: MaybeUninit<T>,
}

impl Version {
    /// Whether this version holds a value (false: the object was deleted).
    #[inline]
    pub(crate) fn is_present(&self) -> bool {
        self.vtable.present
    }

    /// The value, if this version is present and holds a `T`; `Err` if it holds another type.
    #[inline]
    pub(crate) fn get<T: Send + Sync + 'static>(&self) -> Result<Option<&T>, ()> {
        // Fast path: the table's address identifies a present `T` without reading the table.
        // (A constant may have several addresses, so a mismatch proves nothing: compare ids.)
        let present_t = std::ptr::eq(self.vtable, &VTableFor::<T>::PRESENT)
            || (self.vtable.present && self.vtable.type_id == TypeId::of::<T>());
        if present_t {
            // SAFETY: this header starts a `Typed<T>` (`repr(C)`, header first) whose value is
            // initialized.
            let node = unsafe { &*(self as *const Version as *const Typed<T>) };
            return Ok(Some(unsafe { node.value.assume_init_ref() }));
        }
        if self.vtable.present {
            Err(())
        } else {
            Ok(None)
        }
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
        let layout = Layout::new::<Typed<T>>();
        let block = acquire_block(layout) as *mut Typed<T>;
        let Some(block) = NonNull::new(block) else {
            std::alloc::handle_alloc_error(layout);
        };
        // SAFETY: the block is fresh, sized and aligned for a `Typed<T>`.
        unsafe {
            block.as_ptr().write(Typed {
                header: Version {
                    ts: 0,
                    prev: AtomicPtr::new(std::ptr::null_mut()),
                    vtable: if value.is_some() {
                        &VTableFor::<T>::PRESENT
                    } else {
                        &VTableFor::<T>::DELETED
                    },
                },
                value: match value {
                    Some(v) => MaybeUninit::new(v),
                    None => MaybeUninit::uninit(),
                },
            });
        }
        OwnedVersion(block.cast())
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
