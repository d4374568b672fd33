//! How an object's value travels as bytes: a fingerprint of its type, the keys of the objects
//! it references (every [`TRef`](crate::TRef) inside it, collected while it is serialized),
//! then its postcard encoding. Values are encoded only when they leave the node (remote
//! commits, certification requests, snapshots); locally they stay typed.

use std::cell::RefCell;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::key::Key;

thread_local! {
    /// The references met while this thread serializes a value (`None`: not collecting).
    static REFS: RefCell<Option<Vec<Key>>> = const { RefCell::new(None) };
}

/// Called by a `TRef` being serialized: notes its key if a value's references are being
/// collected. (This module's thread-local accesses are never inlined: transactions may move
/// between threads at safe points, see `atomos_sched::task`.)
#[inline(never)]
pub(crate) fn note_ref(key: &Key) {
    let _ = REFS.try_with(|r| {
        if let Some(refs) = r.borrow_mut().as_mut() {
            refs.push(key.clone());
        }
    });
}

/// A fingerprint of `T`'s name (FNV-1a), stored before each encoded value so that a value is
/// never decoded as another type whose encoding happens to parse. Nodes of one cluster must run
/// the same build (type names are not stable across compiler versions).
pub(crate) fn type_tag<T>() -> [u8; 8] {
    use std::hash::Hasher;
    let mut hasher = fnv::FnvHasher::default();
    hasher.write(std::any::type_name::<T>().as_bytes());
    hasher.finish().to_le_bytes()
}

/// Replaces this thread's collected references, returning the previous ones.
#[inline(never)]
fn swap_refs(refs: Option<Vec<Key>>) -> Option<Vec<Key>> {
    REFS.with(|r| r.replace(refs))
}

/// `value` as tagged bytes, with the keys it references.
pub(crate) fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, postcard::Error> {
    let outer = swap_refs(Some(Vec::new()));
    let payload = postcard::to_stdvec(value);
    let mut refs = swap_refs(outer).unwrap_or_default();
    let payload = payload?;
    refs.sort_unstable();
    refs.dedup();
    let mut out = postcard::to_extend(&refs, type_tag::<T>().to_vec())?;
    out.extend_from_slice(&payload);
    Ok(out)
}

/// The keys the value in tagged `bytes` references (`None`: the bytes are not an encoded
/// value).
pub fn value_refs(bytes: &[u8]) -> Option<Vec<Key>> {
    let rest = bytes.get(8..)?;
    postcard::take_from_bytes::<Vec<Key>>(rest)
        .ok()
        .map(|(refs, _)| refs)
}

/// Whether `bytes` carry a value of type `T` (by its tag; the encoding is not checked).
pub(crate) fn is_tagged<T>(bytes: &[u8]) -> bool {
    bytes.starts_with(&type_tag::<T>())
}

/// The `T` that `bytes` hold, if they are tagged as a `T` and decode whole.
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Option<T> {
    let rest = bytes.strip_prefix(&type_tag::<T>())?;
    let (_, payload) = postcard::take_from_bytes::<Vec<Key>>(rest).ok()?;
    match postcard::take_from_bytes::<T>(payload) {
        Ok((v, [])) => Some(v),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TRef;

    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Node {
        value: u32,
        next: Option<TRef<Node>>,
        others: Vec<TRef<u8>>,
    }

    #[test]
    fn a_value_carries_the_keys_it_references() {
        let n = Node {
            value: 7,
            next: Some(TRef::new("b")),
            others: vec![TRef::new("c"), TRef::new("a"), TRef::new("c")],
        };
        let bytes = encode(&n).unwrap();
        let keys: Vec<Key> = ["a", "b", "c"].into_iter().map(Key::from).collect();
        assert_eq!(value_refs(&bytes), Some(keys));
        assert_eq!(decode::<Node>(&bytes), Some(n));
        assert_eq!(value_refs(&encode(&5u64).unwrap()), Some(vec![]));
        // Outside an encoding nothing is collected.
        note_ref(&Key::from("z"));
        assert_eq!(value_refs(&encode(&1u8).unwrap()), Some(vec![]));
        assert_eq!(value_refs(&[1, 2]), None);
    }
}
