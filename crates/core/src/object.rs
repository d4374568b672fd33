//! What a shared object's value is, and the stable name its values are stored under.
//!
//! Every value that leaves a node (a remote commit, a certification request, a log entry, a
//! snapshot) is tagged with its type's [`StoredName`], never with anything the compiler
//! chooses: a type can move to another module or crate, and the program can be built by
//! another compiler, and the data written before stays readable. Applications declare the
//! name with `#[derive(Object)]` and `#[atomos(name = "...")]`, or by implementing [`Object`]
//! by hand; atomos names the standard types itself.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::fmt;
use std::hash::{BuildHasher, Hash};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::key::Key;
use crate::tref::TRef;

/// What a shared object's value must be: cloneable, shareable between threads, encodable for
/// the day it crosses the network, and stored under a name that does not depend on the build.
///
/// Implement it with the derive, which also checks the name when the program is compiled:
///
/// ```
/// use atomos_core::{Object, TRef};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Clone, Serialize, Deserialize, Object)]
/// #[atomos(crate = "atomos_core", name = "inventory.Item")]
/// struct Item {
///     sku: String,
///     count: u32,
/// }
///
/// let item: TRef<Item> = TRef::new("item/1");
/// # let _ = item;
/// ```
///
/// (Through the `atomos` crate, `#[atomos(crate = ...)]` is not needed.) By hand, the same is
/// `const NAME: StoredName = StoredName::declared::<Self>("inventory.Item", &[]);`.
pub trait Object: Serialize + DeserializeOwned + Clone + Send + Sync + 'static {
    /// The name this type's values are stored under. A later build's type of the same name
    /// reads the values an earlier one stored; two different types of one program may not
    /// declare the same name (the first value encoded or decoded under the second one fails
    /// with a name clash).
    const NAME: StoredName;
}

/// The stable name of a stored type: a declared name (`inventory.Item`) or a standard one
/// (`u64`, `string`, `list<inventory.Item>`), with the names of its type parameters.
///
/// A value is tagged with [`StoredName::tag`], the FNV-1a hash (64 bits) of the canonical
/// form that [`fmt::Display`] prints: the base name, then the parameters between `<` and `>`
/// separated by `,`, then for arrays their length (`array<u8,32>`).
#[derive(Clone, Copy)]
pub struct StoredName {
    base: &'static str,
    params: &'static [StoredName],
    /// An array's length.
    len: Option<usize>,
    /// The Rust type that declared the name (`None` for standard names, which several Rust
    /// types share on purpose: `Vec` and `VecDeque` are both a `list`).
    declared_by: Option<RustType>,
}

/// The Rust type that declared a name, as far as the name-clash check needs it: its path
/// (`std::any::type_name`, used only inside one running program, never stored).
#[derive(Clone, Copy)]
struct RustType {
    path: fn() -> &'static str,
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0100_0000_01b3;

const fn fnv_byte(hash: u64, byte: u8) -> u64 {
    (hash ^ byte as u64).wrapping_mul(FNV_PRIME)
}

const fn fnv_bytes(mut hash: u64, bytes: &[u8]) -> u64 {
    let mut i = 0;
    while i < bytes.len() {
        hash = fnv_byte(hash, bytes[i]);
        i += 1;
    }
    hash
}

/// Hashes `n` in decimal, as `Display` prints it.
const fn fnv_decimal(mut hash: u64, n: usize) -> u64 {
    let mut digits = [0u8; 20];
    let mut count = 0;
    let mut rest = n;
    loop {
        digits[count] = b'0' + (rest % 10) as u8;
        count += 1;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    while count > 0 {
        count -= 1;
        hash = fnv_byte(hash, digits[count]);
    }
    hash
}

/// Whether `name` is a valid declared name: segments of ASCII letters, digits and `_`,
/// separated by single dots, with at least one dot (`inventory.Item`), at most 200 bytes.
pub(crate) const fn is_valid_declared_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() > 200 {
        return false;
    }
    let mut dots = 0;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'.' {
            // No empty segment: not first, not last, not after another dot.
            if i == 0 || i + 1 == bytes.len() || bytes[i - 1] == b'.' {
                return false;
            }
            dots += 1;
        } else if !(b.is_ascii_alphanumeric() || b == b'_') {
            return false;
        }
        i += 1;
    }
    dots > 0
}

impl StoredName {
    /// The name `name` declared by the Rust type `T`, with the names of `T`'s type parameters
    /// (`&[]` for a type without any). `name` must be dotted segments of ASCII letters, digits
    /// and `_` (`inventory.Item`); a bad name stops the build where the name is used.
    pub const fn declared<T: ?Sized + 'static>(
        name: &'static str,
        params: &'static [StoredName],
    ) -> StoredName {
        assert!(
            is_valid_declared_name(name),
            "a stored name is dotted segments of ASCII letters, digits and `_`, such as \
             `inventory.Item`"
        );
        StoredName {
            base: name,
            params,
            len: None,
            declared_by: Some(RustType {
                path: std::any::type_name::<T>,
            }),
        }
    }

    /// A standard name (no dot, so it never meets a declared one).
    pub(crate) const fn standard(base: &'static str, params: &'static [StoredName]) -> StoredName {
        StoredName {
            base,
            params,
            len: None,
            declared_by: None,
        }
    }

    /// The tag values of this type are stored with: the FNV-1a hash of the canonical name.
    pub const fn tag(&self) -> u64 {
        self.fold(FNV_OFFSET)
    }

    const fn fold(&self, hash: u64) -> u64 {
        let mut hash = fnv_bytes(hash, self.base.as_bytes());
        if self.params.is_empty() && self.len.is_none() {
            return hash;
        }
        hash = fnv_byte(hash, b'<');
        let mut i = 0;
        while i < self.params.len() {
            if i > 0 {
                hash = fnv_byte(hash, b',');
            }
            hash = self.params[i].fold(hash);
            i += 1;
        }
        if let Some(len) = self.len {
            hash = fnv_byte(hash, b',');
            hash = fnv_decimal(hash, len);
        }
        fnv_byte(hash, b'>')
    }

    /// Every declared name in this name (itself and its parameters', depth first), as (the
    /// declared name without parameters, the Rust path of the declaring type without its
    /// generic arguments) for the name-clash check: `shop.Page<u64>` and `shop.Page<usize>`
    /// are one declaration, by `Page`, whatever the arguments.
    pub(crate) fn declarations(&self, out: &mut Vec<(&'static str, &'static str)>) {
        if let Some(rust) = self.declared_by {
            let path = (rust.path)();
            let generic = path.find('<').map_or(path, |i| &path[..i]);
            out.push((self.base, generic));
        }
        for p in self.params {
            p.declarations(out);
        }
    }
}

impl fmt::Display for StoredName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.base)?;
        if self.params.is_empty() && self.len.is_none() {
            return Ok(());
        }
        f.write_str("<")?;
        for (i, p) in self.params.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{p}")?;
        }
        if let Some(len) = self.len {
            write!(f, ",{len}")?;
        }
        f.write_str(">")
    }
}

impl fmt::Debug for StoredName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StoredName({self})")
    }
}

impl PartialEq for StoredName {
    /// Names are equal when their canonical forms are (whoever declared them).
    fn eq(&self, other: &Self) -> bool {
        self.to_string() == other.to_string()
    }
}
impl Eq for StoredName {}

/// Standard names for types whose name is their own.
macro_rules! standard_names {
    ($($t:ty => $name:literal),* $(,)?) => {
        $(impl Object for $t {
            const NAME: StoredName = StoredName::standard($name, &[]);
        })*
    };
}

standard_names! {
    bool => "bool", char => "char", () => "unit",
    u8 => "u8", u16 => "u16", u32 => "u32", u64 => "u64", u128 => "u128",
    i8 => "i8", i16 => "i16", i32 => "i32", i64 => "i64", i128 => "i128",
    f32 => "f32", f64 => "f64", String => "string", Key => "key",
}

// `usize` and `isize` encode as 64-bit integers, and read 64-bit ones.
impl Object for usize {
    const NAME: StoredName = u64::NAME;
}
impl Object for isize {
    const NAME: StoredName = i64::NAME;
}

impl<T: Object> Object for Option<T> {
    const NAME: StoredName = StoredName::standard("option", &[T::NAME]);
}
/// A box is stored as what it holds.
impl<T: Object> Object for Box<T> {
    const NAME: StoredName = T::NAME;
}
impl<T: Object> Object for Vec<T> {
    const NAME: StoredName = StoredName::standard("list", &[T::NAME]);
}
impl<T: Object, const N: usize> Object for smallvec::SmallVec<[T; N]> {
    const NAME: StoredName = StoredName::standard("list", &[T::NAME]);
}
impl<T: Object> Object for VecDeque<T> {
    const NAME: StoredName = StoredName::standard("list", &[T::NAME]);
}
impl<T: Object + Ord> Object for BTreeSet<T> {
    const NAME: StoredName = StoredName::standard("set", &[T::NAME]);
}
impl<T, S> Object for HashSet<T, S>
where
    T: Object + Eq + Hash,
    S: BuildHasher + Default + Clone + Send + Sync + 'static,
{
    const NAME: StoredName = StoredName::standard("set", &[T::NAME]);
}
impl<K: Object + Ord, V: Object> Object for BTreeMap<K, V> {
    const NAME: StoredName = StoredName::standard("map", &[K::NAME, V::NAME]);
}
impl<K, V, S> Object for HashMap<K, V, S>
where
    K: Object + Eq + Hash,
    V: Object,
    S: BuildHasher + Default + Clone + Send + Sync + 'static,
{
    const NAME: StoredName = StoredName::standard("map", &[K::NAME, V::NAME]);
}
/// A reference to another object is stored as its key.
impl<T: 'static> Object for TRef<T> {
    const NAME: StoredName = StoredName::standard("ref", &[]);
}
impl<T: Object, const N: usize> Object for [T; N]
where
    [T; N]: Serialize + DeserializeOwned,
{
    const NAME: StoredName = StoredName {
        base: "array",
        params: &[T::NAME],
        len: Some(N),
        declared_by: None,
    };
}

macro_rules! tuple_names {
    ($(($($p:ident),+)),* $(,)?) => {
        $(impl<$($p: Object),+> Object for ($($p,)+) {
            const NAME: StoredName = StoredName::standard("tuple", &[$($p::NAME),+]);
        })*
    };
}

tuple_names! {
    (A), (A, B), (A, B, C), (A, B, C, D), (A, B, C, D, E), (A, B, C, D, E, F),
    (A, B, C, D, E, F, G), (A, B, C, D, E, F, G, H),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fnv(s: &str) -> u64 {
        fnv_bytes(FNV_OFFSET, s.as_bytes())
    }

    #[derive(Clone, serde::Serialize, serde::Deserialize)]
    struct Item;
    impl Object for Item {
        const NAME: StoredName = StoredName::declared::<Self>("inventory.Item", &[]);
    }

    #[test]
    fn the_tag_is_the_hash_of_the_canonical_name() {
        type Nested = (
            u64,
            Vec<Option<Item>>,
            [u8; 32],
            BTreeMap<String, TRef<Item>>,
        );
        let name = <Nested as Object>::NAME;
        assert_eq!(
            name.to_string(),
            "tuple<u64,list<option<inventory.Item>>,array<u8,32>,map<string,ref>>"
        );
        assert_eq!(name.tag(), fnv(&name.to_string()));
        assert_eq!(<[u8; 0]>::NAME.tag(), fnv("array<u8,0>"));
        assert_eq!(fnv_decimal(FNV_OFFSET, 1207), fnv("1207"));
        assert_eq!(fnv_decimal(FNV_OFFSET, 0), fnv("0"));
    }

    #[test]
    fn containers_with_one_encoding_share_a_name() {
        assert_eq!(<Vec<u8>>::NAME, <VecDeque<u8>>::NAME);
        assert_eq!(<HashMap<u8, u8>>::NAME, <BTreeMap<u8, u8>>::NAME);
        assert_eq!(<Box<Item>>::NAME, Item::NAME);
        assert_eq!(usize::NAME, u64::NAME);
        assert_ne!(<Vec<u8>>::NAME, <Vec<u16>>::NAME);
    }

    #[test]
    fn a_declared_name_is_dotted_segments() {
        for good in ["inventory.Item", "a.b.c", "x_1.Y2"] {
            assert!(is_valid_declared_name(good), "{good}");
        }
        let long = format!("a.{}", "b".repeat(199));
        for bad in [
            "Item", "", ".a", "a.", "a..b", "a.b<c>", "a.b c", "a,b.c", &long,
        ] {
            assert!(!is_valid_declared_name(bad), "{bad}");
        }
    }

    #[derive(Clone, serde::Serialize, serde::Deserialize)]
    struct Page<T>(Vec<T>);
    impl<T: Object> Object for Page<T> {
        const NAME: StoredName = StoredName::declared::<Self>("shop.Page", &[T::NAME]);
    }

    #[test]
    fn declarations_name_the_rust_types_that_declared_them() {
        let mut out = Vec::new();
        <(u8, Vec<Item>)>::NAME.declarations(&mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0, "inventory.Item");
        assert!(out[0].1.ends_with("tests::Item"), "{}", out[0].1);
        // A generic type declares its name once, whatever its arguments.
        let (mut a, mut b) = (Vec::new(), Vec::new());
        <Page<u64>>::NAME.declarations(&mut a);
        <Page<Page<Item>>>::NAME.declarations(&mut b);
        assert_eq!(a[0], b[0]);
        assert!(a[0].1.ends_with("tests::Page"), "{}", a[0].1);
        assert_eq!(b[2].0, "inventory.Item");
    }
}
