//! Object keys: short byte strings stored inline, longer ones shared.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

const INLINE: usize = 22;

/// How anonymous objects' keys start (a zero byte: no string key starts like that by accident).
const ANON_PREFIX: &[u8] = b"\0anon/";

/// The name of a shared object: an immutable byte string.
///
/// Keys of up to 22 bytes live inline (no allocation); longer keys share one heap copy, so a
/// clone never copies the bytes. Strings convert to their UTF-8 bytes, integers to 8 big-endian
/// bytes (signed integers with the sign bit flipped, so byte order equals numeric order).
#[derive(Clone)]
pub struct Key(Repr);

#[derive(Clone)]
enum Repr {
    Inline { len: u8, bytes: [u8; INLINE] },
    Shared(Arc<[u8]>),
}

impl Key {
    /// A key holding a copy of `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> Key {
        if bytes.len() <= INLINE {
            let mut buf = [0u8; INLINE];
            buf[..bytes.len()].copy_from_slice(bytes);
            Key(Repr::Inline {
                len: bytes.len() as u8,
                bytes: buf,
            })
        } else {
            Key(Repr::Shared(Arc::from(bytes)))
        }
    }

    /// The key's bytes.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            Repr::Inline { len, bytes } => &bytes[..*len as usize],
            Repr::Shared(b) => b,
        }
    }

    /// The key of an anonymous object: one made by [`Tx::new_object`](crate::Tx::new_object),
    /// reachable only through references, and reclaimed by the replicated store's garbage
    /// collection once nothing named reaches it. `origin` tells creators apart, `n` counts.
    pub fn anonymous(origin: u64, n: u64) -> Key {
        let mut b = [0u8; ANON_PREFIX.len() + 16];
        b[..ANON_PREFIX.len()].copy_from_slice(ANON_PREFIX);
        b[ANON_PREFIX.len()..ANON_PREFIX.len() + 8].copy_from_slice(&origin.to_be_bytes());
        b[ANON_PREFIX.len() + 8..].copy_from_slice(&n.to_be_bytes());
        Key::from_bytes(&b)
    }

    /// Whether this is an anonymous object's key (see [`Key::anonymous`]); every other key
    /// names a root.
    pub fn is_anonymous(&self) -> bool {
        let b = self.as_bytes();
        b.len() == ANON_PREFIX.len() + 16 && b.starts_with(ANON_PREFIX)
    }

    /// A key made of `prefix` followed by the 8 big-endian bytes of `n`: handy for namespaced
    /// integer keys such as `("account", 17)`.
    pub fn with_index(prefix: &str, n: u64) -> Key {
        let len = prefix.len() + 8;
        if len <= INLINE {
            // Built in place: no allocation for the common short prefix.
            let mut bytes = [0u8; INLINE];
            bytes[..prefix.len()].copy_from_slice(prefix.as_bytes());
            bytes[prefix.len()..len].copy_from_slice(&n.to_be_bytes());
            return Key(Repr::Inline {
                len: len as u8,
                bytes,
            });
        }
        let mut v = Vec::with_capacity(len);
        v.extend_from_slice(prefix.as_bytes());
        v.extend_from_slice(&n.to_be_bytes());
        Key::from_bytes(&v)
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}
impl Eq for Key {}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state)
    }
}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Key {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.as_bytes();
        match std::str::from_utf8(b) {
            Ok(s) if s.chars().all(|c| !c.is_control()) => write!(f, "{s:?}"),
            _ => {
                // A readable prefix (as `Key::with_index` makes) stays readable.
                let readable = b
                    .iter()
                    .take_while(|c| c.is_ascii_graphic() || **c == b' ')
                    .count();
                let (prefix, rest) = b.split_at(readable);
                if !prefix.is_empty() {
                    write!(f, "{:?}+", String::from_utf8_lossy(prefix))?;
                }
                write!(f, "0x")?;
                for byte in rest {
                    write!(f, "{byte:02x}")?;
                }
                Ok(())
            }
        }
    }
}

impl From<&str> for Key {
    fn from(s: &str) -> Key {
        Key::from_bytes(s.as_bytes())
    }
}
impl From<String> for Key {
    fn from(s: String) -> Key {
        Key::from_bytes(s.as_bytes())
    }
}
impl From<&String> for Key {
    fn from(s: &String) -> Key {
        Key::from_bytes(s.as_bytes())
    }
}
impl From<&[u8]> for Key {
    fn from(b: &[u8]) -> Key {
        Key::from_bytes(b)
    }
}
impl From<Vec<u8>> for Key {
    fn from(b: Vec<u8>) -> Key {
        Key::from_bytes(&b)
    }
}

macro_rules! unsigned_key {
    ($($t:ty),*) => {$(
        impl From<$t> for Key {
            fn from(n: $t) -> Key {
                Key::from_bytes(&(n as u64).to_be_bytes())
            }
        }
    )*};
}
macro_rules! signed_key {
    ($($t:ty),*) => {$(
        impl From<$t> for Key {
            fn from(n: $t) -> Key {
                Key::from_bytes(&((n as i64 as u64) ^ (1 << 63)).to_be_bytes())
            }
        }
    )*};
}
unsigned_key!(u8, u16, u32, u64, usize);
signed_key!(i8, i16, i32, i64, isize);

impl Serialize for Key {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.as_bytes())
    }
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Key, D::Error> {
        let bytes: Vec<u8> = serde::de::Deserialize::deserialize(d)?;
        Ok(Key::from_bytes(&bytes))
    }
}

#[cfg(feature = "arbitrary")]
impl<'a> arbitrary::Arbitrary<'a> for Key {
    fn arbitrary(u: &mut arbitrary::Unstructured<'a>) -> arbitrary::Result<Key> {
        let bytes: &[u8] = u.arbitrary()?;
        Ok(Key::from(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_display_readably() {
        assert_eq!(Key::from("acct/7").to_string(), "\"acct/7\"");
        assert_eq!(
            Key::with_index("counter/", 1).to_string(),
            "\"counter/\"+0x0000000000000001"
        );
        assert_eq!(Key::from_bytes(&[0, 255]).to_string(), "0x00ff");
    }

    #[test]
    fn indexed_keys_are_their_prefix_then_the_index_big_endian() {
        for prefix in ["", "acct/", "a prefix longer than the inline room"] {
            for n in [0, 1, 255, 1 << 40, u64::MAX] {
                let mut bytes = prefix.as_bytes().to_vec();
                bytes.extend_from_slice(&n.to_be_bytes());
                let key = Key::with_index(prefix, n);
                assert_eq!(key.as_bytes(), &bytes[..]);
                assert_eq!(key, Key::from_bytes(&bytes));
            }
        }
    }

    #[test]
    fn inline_and_shared_keys_compare_by_bytes() {
        let short = Key::from("abc");
        let long = Key::from("a key that is longer than twenty-two bytes");
        assert_eq!(short.as_bytes(), b"abc");
        assert_eq!(
            long,
            Key::from("a key that is longer than twenty-two bytes".to_string())
        );
        assert_ne!(short, long);
        assert_eq!(std::mem::size_of::<Key>(), 24);
    }

    #[test]
    fn signed_integers_keep_numeric_order() {
        let keys: Vec<Key> = [-5i64, -1, 0, 3, 1 << 40]
            .iter()
            .map(|&n| Key::from(n))
            .collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]));
    }
}
