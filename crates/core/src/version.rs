//! Version nodes: one allocation holding a header and the typed value after it.
//!
//! A committed version is never changed again, so readers may hold `&T` into it for as long as
//! the attempt that read it runs (see `slots`). The value stays typed (no encoding on the local
//! path); its type is checked by comparing `TypeId`s, with no virtual call.
//!
//! Replicated protocols also install versions that arrived as bytes (certified writes, state
//! transfer): such a node holds the encoded value and decodes it once, on its first typed read,
//! into a value kept beside the bytes for every later reader. Deletion markers that arrived as
//! bytes carry no type at all.

use std::alloc::Layout;
use std::any::{Any, TypeId};
use std::cell::RefCell;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::atomic::AtomicPtr;
use std::sync::OnceLock;

use crate::codec;
use crate::tref::Object;

/// Type-specific operations of a version node.
struct VTable {
    type_id: TypeId,
    /// Whether nodes with this table hold a value (false: deletion markers).
    present: bool,
    drop: unsafe fn(*mut Version),
    /// The value as tagged bytes (see `codec`); only called on present nodes.
    encode: unsafe fn(*const Version) -> Result<Vec<u8>, String>,
}

struct VTableFor<T>(PhantomData<T>);

impl<T: Object> VTableFor<T> {
    const PRESENT: VTable = VTable {
        type_id: TypeId::of::<T>(),
        present: true,
        drop: drop_typed::<T, true>,
        encode: encode_typed::<T>,
    };
    const DELETED: VTable = VTable {
        type_id: TypeId::of::<T>(),
        present: false,
        drop: drop_typed::<T, false>,
        encode: encode_nothing,
    };
}

/// A value that arrived as bytes, decoded on its first typed read.
struct Encoded {
    bytes: Vec<u8>,
    /// The decoded value (`None`: the bytes carry the right tag but do not decode).
    decoded: OnceLock<Option<Box<dyn Any + Send + Sync>>>,
}

static ENCODED: VTable = VTable {
    type_id: TypeId::of::<Encoded>(),
    present: true,
    drop: drop_typed::<Encoded, true>,
    encode: encode_encoded,
};

/// A deletion marker that arrived without a type (every type reads it as deleted).
static TOMBSTONE: VTable = VTable {
    type_id: TypeId::of::<()>(),
    present: false,
    drop: drop_typed::<(), false>,
    encode: encode_nothing,
};

/// # Safety
/// `p` must start a live `Typed<T>` whose value is initialized.
unsafe fn encode_typed<T: Object>(p: *const Version) -> Result<Vec<u8>, String> {
    let node = &*(p as *const Typed<T>);
    codec::encode(node.value.assume_init_ref()).map_err(|e| e.to_string())
}

/// # Safety
/// `p` must start a live `Typed<Encoded>`.
unsafe fn encode_encoded(p: *const Version) -> Result<Vec<u8>, String> {
    let node = &*(p as *const Typed<Encoded>);
    Ok(node.value.assume_init_ref().bytes.clone())
}

unsafe fn encode_nothing(_: *const Version) -> Result<Vec<u8>, String> {
    Err("a deletion marker has no value".into())
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

// The pool is a thread-local: these two are never inlined, because a transaction suspended at
// a safe point may resume on another thread (see `atomos_sched::task`).

/// A free block of size class `class` from this thread's pool.
#[inline(never)]
fn pool_pop(class: usize) -> Option<NonNull<u8>> {
    POOL.try_with(|p| p.borrow_mut().0[class].pop())
        .ok()
        .flatten()
}

/// Keeps a free block of size class `class` in this thread's pool; `false` if the pool is full.
#[inline(never)]
fn pool_push(class: usize, block: NonNull<u8>) -> bool {
    POOL.try_with(|pool| {
        let mut pool = pool.borrow_mut();
        if pool.0[class].len() < POOL_CAP {
            pool.0[class].push(block);
            true
        } else {
            false
        }
    })
    .unwrap_or(false)
}

/// A block for a value of `layout`.
#[inline]
fn acquire_block(layout: Layout) -> *mut u8 {
    let Some((class, block)) = pool_class(layout) else {
        // SAFETY: version nodes have a non-zero size.
        return unsafe { std::alloc::alloc(layout) };
    };
    match pool_pop(class) {
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
    if !pool_push(class, NonNull::new_unchecked(p)) {
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

    /// The value as tagged bytes (`None`: a deletion marker). Fails only if the value's type
    /// cannot be encoded.
    pub(crate) fn encode(&self) -> Result<Option<Vec<u8>>, String> {
        if !self.vtable.present {
            return Ok(None);
        }
        // SAFETY: the table belongs to this node and it is present.
        unsafe { (self.vtable.encode)(self) }.map(Some)
    }

    /// The value, if this version is present and holds a `T`; `Err` if it holds another type.
    #[inline]
    pub(crate) fn get<T: Object>(&self) -> Result<Option<&T>, ()> {
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
        if std::ptr::eq(self.vtable, &ENCODED) {
            return self.get_encoded();
        }
        if self.vtable.present {
            Err(())
        } else {
            Ok(None)
        }
    }

    /// The value of a node that arrived as bytes, decoded as a `T` on first use.
    #[cold]
    fn get_encoded<T: Object>(&self) -> Result<Option<&T>, ()> {
        // SAFETY: the table says this header starts a `Typed<Encoded>`, initialized.
        let node = unsafe { &*(self as *const Version as *const Typed<Encoded>) };
        let enc = unsafe { node.value.assume_init_ref() };
        // Checked before decoding, so that a read as the wrong type decides nothing.
        if !codec::is_tagged::<T>(&enc.bytes) {
            return Err(());
        }
        let decoded = enc.decoded.get_or_init(|| {
            codec::decode::<T>(&enc.bytes).map(|v| Box::new(v) as Box<dyn Any + Send + Sync>)
        });
        match decoded.as_ref().and_then(|v| v.downcast_ref::<T>()) {
            Some(v) => Ok(Some(v)),
            None => Err(()),
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
    pub(crate) fn new<T: Object>(value: Option<T>) -> OwnedVersion {
        let vtable = if value.is_some() {
            &VTableFor::<T>::PRESENT
        } else {
            &VTableFor::<T>::DELETED
        };
        OwnedVersion::with_table(value, vtable)
    }

    /// A node holding a value that arrived as tagged bytes (`None`: a deletion marker of no
    /// particular type). The value is decoded on its first typed read.
    pub(crate) fn from_bytes(bytes: Option<Vec<u8>>) -> OwnedVersion {
        match bytes {
            Some(bytes) => OwnedVersion::with_table(
                Some(Encoded {
                    bytes,
                    decoded: OnceLock::new(),
                }),
                &ENCODED,
            ),
            None => OwnedVersion::with_table::<()>(None, &TOMBSTONE),
        }
    }

    fn with_table<T: Send + Sync + 'static>(
        value: Option<T>,
        vtable: &'static VTable,
    ) -> OwnedVersion {
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
                    vtable,
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

    /// A value whose clones can be counted.
    #[derive(Clone, Default, serde::Serialize, serde::Deserialize)]
    struct Counted {
        #[serde(skip)]
        shared: Arc<u8>,
    }

    #[test]
    fn dropping_a_node_drops_its_value() {
        let c = Counted::default();
        let v = OwnedVersion::new(Some(c.clone()));
        assert_eq!(Arc::strong_count(&c.shared), 2);
        drop(v);
        assert_eq!(Arc::strong_count(&c.shared), 1);
        let raw = OwnedVersion::new(Some(c.clone())).into_raw();
        drop(unsafe { OwnedVersion::from_raw(raw) });
        assert_eq!(Arc::strong_count(&c.shared), 1);
    }

    #[test]
    fn a_value_that_arrived_as_bytes_decodes_once_as_its_own_type() {
        let typed = OwnedVersion::new(Some(vec![1u32, 2, 3]));
        let bytes = unsafe { &*typed.as_ptr() }.encode().unwrap();
        let v = OwnedVersion::from_bytes(bytes);
        let h = unsafe { &*v.as_ptr() };
        // The wrong type first: refused, and it does not spoil the right one.
        assert!(h.get::<String>().is_err());
        let first = h.get::<Vec<u32>>().unwrap().unwrap() as *const Vec<u32>;
        let again = h.get::<Vec<u32>>().unwrap().unwrap();
        assert_eq!(again, &vec![1, 2, 3]);
        assert!(std::ptr::eq(first, again), "decoded once");
        assert_eq!(
            h.encode().unwrap(),
            unsafe { &*typed.as_ptr() }.encode().unwrap()
        );
        // Bytes tagged right that do not decode read as the wrong type, never as garbage.
        let mut broken = crate::codec::type_tag::<Vec<u32>>().to_vec();
        broken.push(200);
        let b = OwnedVersion::from_bytes(Some(broken));
        assert!(unsafe { &*b.as_ptr() }.get::<Vec<u32>>().is_err());
        // A deletion marker from bytes reads as deleted whatever the type.
        let t = OwnedVersion::from_bytes(None);
        let h = unsafe { &*t.as_ptr() };
        assert_eq!(h.get::<u64>(), Ok(None));
        assert_eq!(h.encode(), Ok(None));
    }
}
