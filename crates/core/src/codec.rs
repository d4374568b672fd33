//! How an object's value travels as bytes: a format byte, the tag of its type's stable
//! [`StoredName`](crate::StoredName), the keys of the objects it references (every
//! [`TRef`](crate::TRef) inside it, collected while it is serialized), then the value as
//! MessagePack with field names, so that a field added with a default reads older values. Values are encoded only when they leave the node (remote
//! commits, certification requests, snapshots); locally they stay typed.

use std::cell::RefCell;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::key::Key;
use crate::object::Object;

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

/// The format of an encoded value, its first byte. 1: the stored name's tag (8 bytes, little
/// endian), the referenced keys (postcard), then the value as MessagePack with field names.
pub(crate) const VALUE_FORMAT: u8 = 1;

/// Bytes before the referenced keys: the format and the tag.
const HEADER: usize = 9;

/// Why a value did not encode or decode.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CodecError {
    /// Two Rust types of this program declare the same stored name.
    #[error(
        "the stored name {name} is declared by two types, {first} and {second}: values of one \
         would be read as the other"
    )]
    NameClash {
        /// The canonical name.
        name: String,
        /// The type that used it first.
        first: &'static str,
        /// The type that used it second.
        second: &'static str,
    },
    /// The bytes hold a value of another stored name, or are not an encoded value.
    #[error("the bytes do not hold a {expected}")]
    OtherType {
        /// The name expected.
        expected: String,
    },
    /// The bytes are tagged with the right name but the value does not decode (its type
    /// changed in a way old values cannot follow, or the bytes are damaged).
    #[error("a {name} that does not decode: {reason}")]
    Undecodable {
        /// The name.
        name: String,
        /// The decoder's complaint.
        reason: String,
    },
    /// The value's `Serialize` failed.
    #[error("a {name} that does not encode: {reason}")]
    Unencodable {
        /// The name.
        name: String,
        /// The encoder's complaint.
        reason: String,
    },
}

/// The tag values of `T` are stored with.
#[inline]
pub(crate) fn type_tag<T: Object>() -> [u8; 8] {
    const { T::NAME.tag() }.to_le_bytes()
}

/// Replaces this thread's collected references, returning the previous ones.
#[inline(never)]
fn swap_refs(refs: Option<Vec<Key>>) -> Option<Vec<Key>> {
    REFS.with(|r| r.replace(refs))
}

/// The references collected while one value is serialized. Dropped without
/// [`Collecting::finish`] (the value's `Serialize` panicked), it still restores what was
/// collected around it.
struct Collecting {
    outer: Option<Option<Vec<Key>>>,
}

impl Collecting {
    fn start() -> Collecting {
        Collecting {
            outer: Some(swap_refs(Some(Vec::new()))),
        }
    }

    /// The references collected, the outer collection restored.
    fn finish(mut self) -> Vec<Key> {
        let outer = self.outer.take().flatten();
        swap_refs(outer).unwrap_or_default()
    }
}

impl Drop for Collecting {
    fn drop(&mut self) {
        if let Some(outer) = self.outer.take() {
            swap_refs(outer);
        }
    }
}

/// `value` as tagged bytes, with the keys it references.
pub(crate) fn encode<T: Object>(value: &T) -> Result<Vec<u8>, CodecError> {
    names::check::<T>()?;
    let collecting = Collecting::start();
    let payload = to_portable(value);
    let mut refs = collecting.finish();
    let payload = payload.map_err(|reason| CodecError::Unencodable {
        name: T::NAME.to_string(),
        reason,
    })?;
    refs.sort_unstable();
    refs.dedup();
    let mut out = Vec::with_capacity(HEADER + 1 + payload.len());
    out.push(VALUE_FORMAT);
    out.extend_from_slice(&type_tag::<T>());
    let mut out = postcard::to_extend(&refs, out).map_err(|e| CodecError::Unencodable {
        name: T::NAME.to_string(),
        reason: e.to_string(),
    })?;
    out.extend_from_slice(&payload);
    Ok(out)
}

/// The keys the value in tagged `bytes` references (`None`: the bytes are not an encoded
/// value).
pub fn value_refs(bytes: &[u8]) -> Option<Vec<Key>> {
    if bytes.first() != Some(&VALUE_FORMAT) {
        return None;
    }
    let rest = bytes.get(HEADER..)?;
    postcard::take_from_bytes::<Vec<Key>>(rest)
        .ok()
        .map(|(refs, _)| refs)
}

/// Whether `bytes` carry a value of type `T` (by its tag; the encoding is not checked).
pub(crate) fn is_tagged<T: Object>(bytes: &[u8]) -> bool {
    bytes.first() == Some(&VALUE_FORMAT) && bytes.get(1..HEADER) == Some(&type_tag::<T>()[..])
}

/// The `T` that `bytes` hold, if they are tagged as a `T` and decode whole.
pub(crate) fn decode<T: Object>(bytes: &[u8]) -> Result<T, CodecError> {
    names::check::<T>()?;
    if !is_tagged::<T>(bytes) {
        return Err(CodecError::OtherType {
            expected: T::NAME.to_string(),
        });
    }
    let undecodable = |reason: String| CodecError::Undecodable {
        name: T::NAME.to_string(),
        reason,
    };
    let (_, payload) = postcard::take_from_bytes::<Vec<Key>>(&bytes[HEADER..])
        .map_err(|e| undecodable(format!("its references: {e}")))?;
    from_portable(payload).map_err(undecodable)
}

/// `value` as MessagePack with field names and variant names: the encoding whose readers
/// accept a field added with a default, a field removed, and fields in another order.
pub(crate) fn to_portable<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    value
        .serialize(&mut rmp_serde::Serializer::new(&mut out).with_struct_map())
        .map_err(|e| e.to_string())?;
    Ok(out)
}

/// The `T` that [`to_portable`]'s `bytes` hold, all of them.
pub(crate) fn from_portable<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    let mut de = rmp_serde::Deserializer::new(std::io::Cursor::new(bytes));
    let value = T::deserialize(&mut de).map_err(|e| e.to_string())?;
    let rest = bytes.len() as u64 - de.position();
    if rest != 0 {
        return Err(format!("{rest} bytes follow the value"));
    }
    Ok(value)
}

/// The check that no two Rust types of this program declare one stored name.
pub(crate) mod names {
    use std::any::TypeId;
    use std::cell::RefCell;
    use std::collections::HashMap;
    use std::sync::Mutex;

    use rustc_hash::FxHashSet;

    use super::CodecError;
    use crate::object::Object;

    thread_local! {
        /// The types this thread has seen checked.
        static CHECKED: RefCell<FxHashSet<TypeId>> = RefCell::default();
    }

    /// Every declared name met so far, with the Rust path (generic arguments aside) of the
    /// type that declared it.
    static DECLARED: Mutex<Option<HashMap<&'static str, &'static str>>> = Mutex::new(None);

    /// Fails if a name in `T`'s stored name was declared by another type before (checked once
    /// per type and thread).
    #[inline(never)]
    pub(crate) fn check<T: Object>() -> Result<(), CodecError> {
        let id = TypeId::of::<T>();
        if CHECKED
            .try_with(|c| c.borrow().contains(&id))
            .unwrap_or(false)
        {
            return Ok(());
        }
        let mut names = Vec::new();
        T::NAME.declarations(&mut names);
        let mut declared = DECLARED.lock().unwrap_or_else(|e| e.into_inner());
        let declared = declared.get_or_insert_with(HashMap::new);
        for (name, path) in names {
            let first = *declared.entry(name).or_insert(path);
            if first != path {
                return Err(CodecError::NameClash {
                    name: name.to_string(),
                    first,
                    second: path,
                });
            }
        }
        let _ = CHECKED.try_with(|c| c.borrow_mut().insert(id));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TRef;

    #[derive(serde::Serialize, serde::Deserialize, Clone, Debug, PartialEq, crate::Object)]
    #[atomos(crate = "crate", name = "test.Node")]
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
        assert_eq!(decode::<Node>(&bytes), Ok(n));
        assert_eq!(value_refs(&encode(&5u64).unwrap()), Some(vec![]));
        // Outside an encoding nothing is collected.
        note_ref(&Key::from("z"));
        assert_eq!(value_refs(&encode(&1u8).unwrap()), Some(vec![]));
        assert_eq!(value_refs(&[1, 2]), None);
        assert_eq!(value_refs(&[9; 12]), None, "an unknown format");
    }

    /// The version of a stored type an older build wrote.
    mod before {
        #[derive(serde::Serialize, serde::Deserialize, Clone, Debug, PartialEq, crate::Object)]
        #[atomos(crate = "crate", name = "test.Account")]
        pub struct Account {
            pub owner: String,
            pub balance: i64,
            pub retired: bool,
        }
    }

    /// The same stored type in a later build: a field added with a default, one removed, the
    /// others reordered.
    mod after {
        #[derive(serde::Serialize, serde::Deserialize, Clone, Debug, PartialEq, crate::Object)]
        #[atomos(crate = "crate", name = "test.Account2")]
        pub struct Account {
            pub balance: i64,
            pub owner: String,
            #[serde(default)]
            pub limit: u32,
        }
    }

    /// Re-tags `bytes` as `T` (a later build's type of the same declared name: in one process
    /// two types cannot share a name).
    fn retag<T: Object>(mut bytes: Vec<u8>) -> Vec<u8> {
        bytes[1..HEADER].copy_from_slice(&type_tag::<T>());
        bytes
    }

    #[test]
    fn a_field_added_with_a_default_reads_older_values() {
        let old = before::Account {
            owner: "ada".into(),
            balance: -12,
            retired: true,
        };
        let bytes = retag::<after::Account>(encode(&old).unwrap());
        let new: after::Account = decode(&bytes).unwrap();
        assert_eq!(
            new,
            after::Account {
                balance: -12,
                owner: "ada".into(),
                limit: 0,
            }
        );
        // And back: the older build ignores the field it does not know, and finds none of
        // its own missing except the one that had no default.
        let back = retag::<before::Account>(encode(&new).unwrap());
        match decode::<before::Account>(&back) {
            Err(CodecError::Undecodable { name, reason }) => {
                assert_eq!(name, "test.Account");
                assert!(reason.contains("retired"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bytes_of_another_type_or_damaged_are_refused_with_the_reason() {
        let bytes = encode(&7u64).unwrap();
        assert_eq!(
            decode::<u32>(&bytes),
            Err(CodecError::OtherType {
                expected: "u32".into()
            })
        );
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert!(matches!(
            decode::<u64>(&trailing),
            Err(CodecError::Undecodable { .. })
        ));
        let cut = &bytes[..HEADER];
        assert!(matches!(
            decode::<u64>(cut),
            Err(CodecError::Undecodable { .. })
        ));
        let mut other_format = bytes;
        other_format[0] = VALUE_FORMAT + 1;
        assert!(matches!(
            decode::<u64>(&other_format),
            Err(CodecError::OtherType { .. })
        ));
    }

    mod clash_a {
        #[derive(serde::Serialize, serde::Deserialize, Clone, crate::Object)]
        #[atomos(crate = "crate", name = "test.Clash")]
        pub struct Thing(pub u8);
    }

    mod clash_b {
        #[derive(serde::Serialize, serde::Deserialize, Clone, crate::Object)]
        #[atomos(crate = "crate", name = "test.Clash")]
        pub struct Thing(pub u8);
    }

    #[test]
    fn two_types_of_one_program_cannot_declare_one_name() {
        let bytes = encode(&vec![clash_a::Thing(1)]).unwrap();
        // The second type fails wherever it meets the codec, even inside another name.
        for result in [
            encode(&clash_b::Thing(1)).map(drop),
            decode::<clash_b::Thing>(&bytes).map(drop),
            encode(&Some(clash_b::Thing(1))).map(drop),
        ] {
            match result {
                Err(CodecError::NameClash {
                    name,
                    first,
                    second,
                }) => {
                    assert_eq!(name, "test.Clash");
                    assert!(first.contains("clash_a"), "{first}");
                    assert!(second.contains("clash_b"), "{second}");
                }
                other => panic!("{other:?}"),
            }
        }
        // The first keeps working.
        assert!(decode::<Vec<clash_a::Thing>>(&bytes).is_ok());
    }

    proptest::proptest! {
        /// Bytes from a peer: a valid header for the type followed by anything, or a valid
        /// value with a byte changed, decode or fail; they never panic.
        #[test]
        fn any_bytes_after_a_valid_header_decode_or_fail(
            tail in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
            flip in proptest::prelude::any::<(usize, u8)>(),
        ) {
            let mut bytes = vec![VALUE_FORMAT];
            bytes.extend_from_slice(&type_tag::<Node>());
            bytes.extend_from_slice(&tail);
            let _ = decode::<Node>(&bytes);
            let _ = value_refs(&bytes);
            let mut valid = encode(&Node {
                value: 9,
                next: Some(TRef::new("n")),
                others: vec![TRef::new("o")],
            })
            .unwrap();
            let at = flip.0 % valid.len();
            valid[at] ^= flip.1.max(1);
            let _ = decode::<Node>(&valid);
            let _ = decode::<Vec<Option<(String, i64)>>>(&valid);
            let _ = value_refs(&valid);
        }
    }

    #[derive(Clone, serde::Deserialize, crate::Object)]
    #[atomos(crate = "crate", name = "test.Explodes")]
    struct Explodes(TRef<u8>);

    impl serde::Serialize for Explodes {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            self.0.serialize(s)?;
            panic!("a Serialize that panics");
        }
    }

    #[test]
    fn a_panicking_serialize_leaves_no_collection_switched_on() {
        let caught = std::panic::catch_unwind(|| encode(&Explodes(TRef::new("x"))));
        assert!(caught.is_err());
        // Outside an encoding nothing is collected, and the next value's keys are its own.
        note_ref(&Key::from("stray"));
        let bytes = encode(&vec![TRef::<u8>::new("mine")]).unwrap();
        assert_eq!(value_refs(&bytes), Some(vec![Key::from("mine")]));
        assert!(REFS.with(|r| r.borrow().is_none()));
    }

    /// What docs/guide/stored-types.md warns of: MessagePack has no "some" marker.
    #[test]
    fn a_some_of_nothing_reads_back_as_none() {
        let bytes = encode(&Some(None::<u8>)).unwrap();
        assert_eq!(decode::<Option<Option<u8>>>(&bytes), Ok(None));
        let bytes = encode(&Some(())).unwrap();
        assert_eq!(decode::<Option<()>>(&bytes), Ok(None));
        let bytes = encode(&Some(Some(3u8))).unwrap();
        assert_eq!(decode::<Option<Option<u8>>>(&bytes), Ok(Some(Some(3))));
    }

    #[test]
    fn enums_travel_by_variant_name() {
        #[derive(serde::Serialize, serde::Deserialize, Clone, Debug, PartialEq, crate::Object)]
        #[atomos(crate = "crate", name = "test.Shape")]
        enum Shape {
            Dot,
            Circle { r: u32 },
        }
        let bytes = encode(&vec![Shape::Dot, Shape::Circle { r: 3 }]).unwrap();
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains("Circle") && text.contains("Dot"), "{text}");
        assert_eq!(
            decode::<Vec<Shape>>(&bytes).unwrap(),
            vec![Shape::Dot, Shape::Circle { r: 3 }]
        );
    }
}
