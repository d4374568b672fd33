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
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::atomic::AtomicPtr;
use std::sync::OnceLock;

use crate::codec;
use crate::object::Object;
use crate::pool::{alloc_block, free_block, BlockPool, BlockSize};

/// Type-specific operations of a version node.
struct VTable {
    type_id: TypeId,
    /// Whether nodes with this table hold a value (false: deletion markers).
    present: bool,
    /// The node's block.
    block: BlockSize,
    /// Drops the value in place (see [`drop_value`]); `None` if there is nothing to drop.
    drop_value: Option<unsafe fn(*mut Version)>,
    /// The value as tagged bytes (see `codec`); only called on present nodes.
    encode: unsafe fn(*const Version) -> Result<Vec<u8>, codec::CodecError>,
}

struct VTableFor<T>(PhantomData<T>);

impl<T: Object> VTableFor<T> {
    const PRESENT: VTable = VTable {
        type_id: TypeId::of::<T>(),
        present: true,
        block: BlockSize::of(Layout::new::<Typed<T>>()),
        drop_value: dropper::<T, true>(),
        encode: encode_typed::<T>,
    };
    const DELETED: VTable = VTable {
        type_id: TypeId::of::<T>(),
        present: false,
        block: BlockSize::of(Layout::new::<Typed<T>>()),
        drop_value: None,
        encode: encode_nothing,
    };
}

/// A value that arrived as bytes, decoded on its first typed read. The bytes may be shared
/// with others (a slice of the snapshot the value was installed from).
struct Encoded {
    bytes: bytes::Bytes,
    /// The decoded value (`None`: the bytes carry the right tag but do not decode).
    decoded: OnceLock<Option<Box<dyn Any + Send + Sync>>>,
}

static ENCODED: VTable = VTable {
    type_id: TypeId::of::<Encoded>(),
    present: true,
    block: BlockSize::of(Layout::new::<Typed<Encoded>>()),
    drop_value: dropper::<Encoded, true>(),
    encode: encode_encoded,
};

/// A deletion marker that arrived without a type (every type reads it as deleted).
static TOMBSTONE: VTable = VTable {
    type_id: TypeId::of::<()>(),
    present: false,
    block: BlockSize::of(Layout::new::<Typed<()>>()),
    drop_value: None,
    encode: encode_nothing,
};

/// # Safety
/// `p` must start a live `Typed<T>` whose value is initialized.
unsafe fn encode_typed<T: Object>(p: *const Version) -> Result<Vec<u8>, codec::CodecError> {
    let node = &*(p as *const Typed<T>);
    codec::encode(node.value.assume_init_ref())
}

/// # Safety
/// `p` must start a live `Typed<Encoded>`.
unsafe fn encode_encoded(p: *const Version) -> Result<Vec<u8>, codec::CodecError> {
    let node = &*(p as *const Typed<Encoded>);
    Ok(node.value.assume_init_ref().bytes.to_vec())
}

unsafe fn encode_nothing(_: *const Version) -> Result<Vec<u8>, codec::CodecError> {
    Err(codec::CodecError::Unencodable {
        name: "a deletion marker".into(),
        reason: "it has no value".into(),
    })
}

/// Drops the value of a node in place; the block stays.
///
/// # Safety
/// `p` must start a live `Typed<T>` whose value is initialized.
unsafe fn drop_value<T>(p: *mut Version) {
    (*(p as *mut Typed<T>)).value.assume_init_drop();
}

/// What drops the value of a `T` node (`None`: nothing to drop, as for plain numbers or a
/// deletion marker).
const fn dropper<T, const PRESENT: bool>() -> Option<unsafe fn(*mut Version)> {
    if PRESENT && std::mem::needs_drop::<T>() {
        Some(drop_value::<T>)
    } else {
        None
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
    pub(crate) fn encode(&self) -> Result<Option<Vec<u8>>, codec::CodecError> {
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

    /// The value as tagged bytes, borrowed where the node holds them (it arrived as bytes) and
    /// encoded otherwise; `None` for a deletion marker. Fails only if the value's type cannot
    /// be encoded.
    pub(crate) fn encoded(&self) -> Result<Option<std::borrow::Cow<'_, [u8]>>, codec::CodecError> {
        if std::ptr::eq(self.vtable, &ENCODED) {
            // SAFETY: the table says this header starts a `Typed<Encoded>`, initialized.
            let node = unsafe { &*(self as *const Version as *const Typed<Encoded>) };
            let enc = unsafe { node.value.assume_init_ref() };
            return Ok(Some(std::borrow::Cow::Borrowed(&enc.bytes)));
        }
        Ok(self.encode()?.map(std::borrow::Cow::Owned))
    }

    /// The value of a node that arrived as bytes, decoded as a `T` on first use.
    #[cold]
    fn get_encoded<T: Object>(&self) -> Result<Option<&T>, ()> {
        // SAFETY: the table says this header starts a `Typed<Encoded>`, initialized.
        let node = unsafe { &*(self as *const Version as *const Typed<Encoded>) };
        let enc = unsafe { node.value.assume_init_ref() };
        // Checked before decoding, so that a read as the wrong type, or as a type whose name
        // another type declared first, decides nothing.
        if !codec::is_tagged::<T>(&enc.bytes) || codec::names::check::<T>().is_err() {
            return Err(());
        }
        let decoded = enc.decoded.get_or_init(|| {
            codec::decode::<T>(&enc.bytes)
                .ok()
                .map(|v| Box::new(v) as Box<dyn Any + Send + Sync>)
        });
        match decoded.as_ref().and_then(|v| v.downcast_ref::<T>()) {
            Some(v) => Ok(Some(v)),
            None => Err(()),
        }
    }

    /// Why [`Version::get`] refused to show this version as a `T`.
    #[cold]
    pub(crate) fn mismatch<T: Object>(&self) -> codec::CodecError {
        if std::ptr::eq(self.vtable, &ENCODED) {
            // SAFETY: the table says this header starts a `Typed<Encoded>`, initialized.
            let node = unsafe { &*(self as *const Version as *const Typed<Encoded>) };
            let enc = unsafe { node.value.assume_init_ref() };
            if let Err(e) = codec::decode::<T>(&enc.bytes) {
                return e;
            }
        }
        codec::CodecError::OtherType {
            expected: T::NAME.to_string(),
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
    #[cfg(test)]
    pub(crate) fn new<T: Object>(value: Option<T>) -> OwnedVersion {
        let table = Self::table_of::<T>(value.is_some());
        OwnedVersion::with_table(value, table, None)
    }

    /// As [`OwnedVersion::new`], in a block from `pool` (the update path: no allocator call
    /// once the pool is warm).
    #[inline]
    pub(crate) fn new_in<T: Object>(value: Option<T>, pool: &mut BlockPool) -> OwnedVersion {
        let table = Self::table_of::<T>(value.is_some());
        OwnedVersion::with_table(value, table, Some(pool))
    }

    #[inline]
    fn table_of<T: Object>(present: bool) -> &'static VTable {
        if present {
            &VTableFor::<T>::PRESENT
        } else {
            &VTableFor::<T>::DELETED
        }
    }

    /// A node holding a value that arrived as tagged bytes (`None`: a deletion marker of no
    /// particular type). The value is decoded on its first typed read.
    pub(crate) fn from_bytes(bytes: Option<impl Into<bytes::Bytes>>) -> OwnedVersion {
        match bytes {
            Some(bytes) => OwnedVersion::with_table(
                Some(Encoded {
                    bytes: bytes.into(),
                    decoded: OnceLock::new(),
                }),
                &ENCODED,
                None,
            ),
            None => OwnedVersion::with_table::<()>(None, &TOMBSTONE, None),
        }
    }

    #[inline]
    fn with_table<T: Send + Sync + 'static>(
        value: Option<T>,
        vtable: &'static VTable,
        pool: Option<&mut BlockPool>,
    ) -> OwnedVersion {
        debug_assert_eq!(vtable.block, BlockSize::of(Layout::new::<Typed<T>>()));
        let block = match pool {
            Some(pool) => pool.take(vtable.block),
            None => alloc_block(vtable.block),
        }
        .cast::<Typed<T>>();
        // SAFETY: the block is free, sized and aligned for a `Typed<T>`.
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

    /// Drops the node's value and keeps its block in `pool` for the next node.
    #[inline]
    pub(crate) fn recycle(self, pool: &mut BlockPool) {
        // SAFETY: we owned the node; the block is free once its value is dropped.
        unsafe {
            let (block, size) = empty_block(NonNull::new_unchecked(self.into_raw()));
            pool.give(block, size);
        }
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
        // SAFETY: we own the node; the block is free once its value is dropped.
        unsafe {
            let (block, size) = empty_block(self.0);
            free_block(block, size);
        }
    }
}

/// Drops a node's value in place and returns its block, now free, with the block's size.
///
/// # Safety
/// The caller owns the node and uses it no more.
#[inline]
unsafe fn empty_block(p: NonNull<Version>) -> (NonNull<u8>, BlockSize) {
    // The table matches the type the node was made with.
    let vtable = p.as_ref().vtable;
    if let Some(drop_value) = vtable.drop_value {
        drop_value(p.as_ptr());
    }
    (p.cast(), vtable.block)
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
    #[derive(Clone, Default, serde::Serialize, serde::Deserialize, crate::Object)]
    #[atomos(crate = "crate", name = "test.Counted")]
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
        let mut broken = vec![crate::codec::VALUE_FORMAT];
        broken.extend_from_slice(&crate::codec::type_tag::<Vec<u32>>());
        broken.push(200);
        let b = OwnedVersion::from_bytes(Some(broken));
        let b = unsafe { &*b.as_ptr() };
        assert!(b.get::<Vec<u32>>().is_err());
        assert!(matches!(
            b.mismatch::<Vec<u32>>(),
            crate::codec::CodecError::Undecodable { .. }
        ));
        assert!(matches!(
            h.mismatch::<String>(),
            crate::codec::CodecError::OtherType { .. }
        ));
        // A deletion marker from bytes reads as deleted whatever the type.
        let t = OwnedVersion::from_bytes(None::<Vec<u8>>);
        let h = unsafe { &*t.as_ptr() };
        assert_eq!(h.get::<u64>(), Ok(None));
        assert_eq!(h.encode(), Ok(None));
    }
}
